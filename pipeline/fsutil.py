"""Small file operations on any Hadoop filesystem (local, hdfs://, s3a://) via the JVM.

Local paths are handled with plain Python so the pure-Python parts (and tests) need no JVM.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # this module works without pyspark for local paths
    from collections.abc import Callable

    from pyspark.sql import SparkSession


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")  # two letters or more: "C:" is a path
# filesystems whose "directories" are key prefixes: a rename copies every object, and a
# directory rename is not atomic, so outputs are written in place with a completion marker
OBJECT_STORES = frozenset({"s3", "s3a", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs", "adl",
                           "oss", "cos", "cosn", "obs", "dbfs", "r2"})


def scheme(path: str) -> str:
    """The URI scheme of a path, lower case ('' for a plain path): ``file:/x``,
    ``file:///x``, ``hdfs:/x``, ``hdfs://nn/x``, ``s3a://b/x``, ``dbfs:/x`` all have one."""
    m = _SCHEME.match(path)
    return m.group(1).lower() if m else ""


HADOOP_GLOB = "*?[{"  # what makes a path a glob to Spark's readers (Hadoop globs)
PYTHON_GLOB = "*?["  # ... and to Python's glob module (no braces)


def has_glob(path: str, chars: str = HADOOP_GLOB) -> bool:
    """Whether ``path`` is a glob pattern (for Spark's readers; ``PYTHON_GLOB`` for ours)."""
    return any(c in path for c in chars)


def is_local(path: str) -> bool:
    return scheme(path) in ("", "file")


def spark_path(path: str) -> str:
    """``path`` as handed to Spark's readers and writers: a plain path is a local one in this
    pipeline (its checks and small files are local), so it goes to Spark as a ``file:`` URI;
    Spark would resolve a plain path on the cluster's default filesystem (``fs.defaultFS``,
    HDFS on most clusters), and one job would read or write two filesystems under one name.
    (Relative to the working directory, as the JVM's own, which is the driver's at start.)"""
    return "file:" + os.path.abspath(path) if scheme(path) == "" else path


def is_object_store(path: str) -> bool:
    return scheme(path) in OBJECT_STORES


def local_path(path: str) -> str:
    """The local filesystem path of a local path or ``file:`` URI."""
    if scheme(path) != "file":
        return path
    rest = path[len("file:"):]
    if rest.startswith("//"):  # file://host/x or file:///x
        rest = rest[2:]
        rest = rest[rest.index("/"):] if "/" in rest else "/"
    return rest


def absolute_local(path: str) -> str:
    """A local path (or ``file:`` URI) as an absolute, normalised path; others as given."""
    if not path or not is_local(path):
        return path
    return os.path.normpath(os.path.abspath(local_path(path)))


class NeedsSpark(RuntimeError):
    """A path on another filesystem (hdfs://, s3a://, ...) with no Spark session to reach it."""


def _session_for(spark: SparkSession | None, path: str) -> SparkSession | None:
    """The session that reaches ``path``: ``spark``, else (for a path that is not local) the
    active one; without any, :class:`NeedsSpark` (never the local file of that name)."""
    if spark is not None or is_local(path):
        return spark
    try:
        from pyspark.sql import SparkSession
    except ImportError:  # (pipeline.encoder without pyspark)
        active = None
    else:
        active = SparkSession.getActiveSession() or SparkSession._instantiatedSession
    if active is None:
        raise NeedsSpark(f"{path} is not on the local filesystem: reading or writing it takes "
                         "a Spark session (start one first, or copy it to a local path)")
    return active


def _fs(spark: SparkSession, path: str):
    jvm = spark.sparkContext._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    try:
        return p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), p
    except Exception as exc:  # noqa: BLE001 - py4j wraps the Java exception
        java = getattr(exc, "java_exception", None)
        text = str(java.toString()) if java is not None else str(exc)
        if "FileSystem for scheme" not in text:
            raise
        from pipeline.config import ConfigError  # (config imports this module)

        reason = text.strip().splitlines()[0].split(": ", 1)[-1]
        raise ConfigError(f"{path}: this Spark has no filesystem for its scheme ({reason}); "
                          "check the path, or add the connector for that store to the "
                          "cluster") from None


def qualified(spark: SparkSession, path: str) -> str:
    """``path`` as Hadoop names the files under it (scheme, authority, ``.`` and ``..``
    resolved): ``hdfs:///data`` is ``hdfs://namenode:8020/data`` in a listing."""
    fs, p = _fs(spark, path)
    return str(fs.makeQualified(p))


def exists(spark: SparkSession | None, path: str) -> bool:
    spark = _session_for(spark, path)
    if is_local(path):
        return os.path.exists(local_path(path))
    fs, p = _fs(spark, path)
    return bool(fs.exists(p))


def delete(spark: SparkSession | None, path: str) -> None:
    spark = _session_for(spark, path)
    if is_local(path):
        lp = local_path(path)
        if os.path.isdir(lp):
            shutil.rmtree(lp, ignore_errors=True)
        elif os.path.exists(lp):
            os.remove(lp)
        return
    fs, p = _fs(spark, path)
    fs.delete(p, True)


class WriteFailed(OSError):
    """A write on a Hadoop filesystem (hdfs://, s3a://, ...) failed: the Java exception's first
    line, the path, and an errno where one fits (as a local write's ``OSError`` would have)."""


_JAVA_ERRNOS = (("AccessControlException", errno.EACCES), ("AccessDenied", errno.EACCES),
                ("Permission denied", errno.EACCES), ("QuotaExceeded", errno.EDQUOT),
                ("No space left", errno.ENOSPC), ("Read-only file system", errno.EROFS),
                ("ParentNotDirectory", errno.ENOTDIR), ("not a directory", errno.ENOTDIR))


def _java_io_error(spark: SparkSession, exc: BaseException) -> str | None:
    """The text of a ``java.io.IOException`` (any subclass) behind a py4j error, else None
    (another Java error, such as an OutOfMemoryError, a lost JVM, a Python error)."""
    java = getattr(exc, "java_exception", None)  # py4j.protocol.Py4JJavaError
    if java is None or isinstance(exc, OSError):
        return None
    try:
        from py4j.java_gateway import is_instance_of

        if not is_instance_of(spark.sparkContext._gateway, java, "java.io.IOException"):
            return None
        return str(java.toString()).strip()
    except Exception:  # noqa: BLE001 - the JVM went away meanwhile
        return None


_TASK_WRITE = re.compile(r"\[TASK_WRITE_FAILED\][^\n]*? writing rows to (\S+?)\.?(?:\s|$)")
_IO_CAUSE = re.compile(r"Caused by: java\.io\.\w+(?:Exception|Error): ([^\n]+)")


def task_write_failure(exc: BaseException) -> WriteFailed | None:
    """A Spark job that failed writing its output files (Spark's ``TASK_WRITE_FAILED``)
    because of the filesystem (a full disk, a quota, permissions, a read-only mount) as
    :class:`WriteFailed` naming the path and the reason; None for any other failure (a task's
    own error, a crashed worker: their I/O exceptions name no such reason)."""
    text = str(exc)
    m = _TASK_WRITE.search(text)
    if m is None:
        return None
    for reason in reversed(_IO_CAUSE.findall(text)):  # the innermost cause first
        code = next((e for key, e in _JAVA_ERRNOS if key.lower() in reason.lower()), None)
        if code is not None:
            return WriteFailed(code, reason.strip(), m.group(1))
    return None


@contextlib.contextmanager
def _writing(spark: SparkSession, path: str):
    """Hadoop write calls on ``path``: a Java IOException from them becomes
    :class:`WriteFailed` (anything else is left as it is)."""
    try:
        yield
    except Exception as exc:
        text = _java_io_error(spark, exc)
        if text is None:
            raise
        first = text.splitlines()[0] if text else type(exc).__name__
        code = next((e for key, e in _JAVA_ERRNOS if key.lower() in text.lower()), errno.EIO)
        raise WriteFailed(code, first, path) from exc


def mkdirs(spark: SparkSession | None, path: str) -> None:
    spark = _session_for(spark, path)
    if is_local(path):
        os.makedirs(local_path(path), exist_ok=True)
        return
    fs, p = _fs(spark, path)
    with _writing(spark, path):
        fs.mkdirs(p)


def list_dir(spark: SparkSession | None, path: str) -> list[str] | None:
    """The names in a directory, or None when ``path`` is not a directory."""
    spark = _session_for(spark, path)
    if is_local(path):
        lp = local_path(path)
        return sorted(os.listdir(lp)) if os.path.isdir(lp) else None
    fs, p = _fs(spark, path)
    if not fs.exists(p) or not fs.getFileStatus(p).isDirectory():
        return None
    return sorted(str(st.getPath().getName()) for st in fs.listStatus(p))


# the names of the temp files this process is writing now (random: a name is the key), and a
# lock that makes creating one and naming it here one step, against removing it
_IN_FLIGHT: set[str] = set()
_IN_FLIGHT_LOCK = threading.Lock()


def _local_temp(directory: str) -> tuple[int, str]:
    """A new temp file in ``directory`` (fd, path), named in :data:`_IN_FLIGHT`."""
    with _IN_FLIGHT_LOCK:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
        _IN_FLIGHT.add(os.path.basename(tmp))
    return fd, tmp


def remove_temp_files(spark: SparkSession | None, directory: str) -> None:
    """Remove the temp files of :func:`write_text` that a killed writer (SIGKILL, a lost
    machine) left in ``directory``, but not those this process is writing now (a renewal of
    the lease that sits in the same directory); call it holding the directory's lease."""
    for name in list_dir(spark, directory) or []:
        if not name.startswith(".tmp-"):
            continue
        with _IN_FLIGHT_LOCK:
            if name not in _IN_FLIGHT:
                delete(spark, join(directory, name))


def data_files_under(spark: SparkSession | None, path: str) -> list[str] | None:
    """Every file under the directory ``path`` at any depth, skipping names that start with
    ``_`` or ``.`` at any level (as Spark's readers do), as URIs; None when ``path`` is not a
    directory."""
    found = _walk_data_files(spark, path, stat=False)
    return None if found is None else sorted(uri for uri, _, _ in found)


def data_file_statuses(spark: SparkSession | None, path: str
                       ) -> dict[str, tuple[int, int]] | None:
    """:func:`data_files_under` as {path below ``path``: (size, modification time)}, from
    the one listing (no request per file); None when ``path`` is not a directory."""
    found = _walk_data_files(spark, path)
    return None if found is None else {below: status for _, below, status in found}


def _walk_data_files(spark: SparkSession | None, path: str, stat: bool = True
                     ) -> list[tuple[str, str, tuple[int, int]]] | None:
    """(URI, path below ``path``, (size, modification time)) of each data file (local files
    are not stat'ed unless ``stat``: (0, 0))."""
    hidden = ("_", ".")
    spark = _session_for(spark, path)
    if is_local(path):
        lp = os.path.abspath(local_path(path))
        if not os.path.isdir(lp):
            return None
        found = []
        seen: set[str] = set()  # (folders by their real path: a link back up is walked once)
        for top, dirs, files in os.walk(lp, followlinks=True):  # (as Hadoop's listing does)
            real = os.path.realpath(top)
            if real in seen:
                dirs[:] = []
                continue
            seen.add(real)
            dirs[:] = [d for d in dirs if not d.startswith(hidden)]
            for f in files:
                if not f.startswith(hidden):
                    full = os.path.join(top, f)
                    st = os.stat(full) if stat else None
                    found.append(("file://" + full, os.path.relpath(full, lp),
                                  (st.st_size, st.st_mtime_ns) if st else (0, 0)))
        return found
    fs, p = _fs(spark, path)
    if not fs.exists(p) or not fs.getFileStatus(p).isDirectory():
        return None
    root = str(fs.getFileStatus(p).getPath()).rstrip("/")
    found, it = [], fs.listFiles(p, True)
    while it.hasNext():
        status = it.next()
        name = str(status.getPath())
        below = name[len(root):].lstrip("/")
        if not any(part.startswith(hidden) for part in below.split("/") if part):
            found.append((name, below, (int(status.getLen()),
                                        int(status.getModificationTime()))))
    return found


def read_text(spark: SparkSession | None, path: str) -> str:
    spark = _session_for(spark, path)
    if is_local(path):
        with open(local_path(path), encoding="utf-8") as fh:
            return fh.read()
    fs, p = _fs(spark, path)
    with _not_found_as_python(path):
        stream = fs.open(p)
    try:  # the whole file in one call (a py4j call per line cost ~0.1 ms each)
        text = str(spark.sparkContext._jvm.org.apache.commons.io.IOUtils.toString(stream,
                                                                                 "UTF-8"))
    finally:
        stream.close()
    # lines as Java's readLine cuts them (\n, \r or \r\n), each ending in \n: what this
    # function always returned here, so digests recorded by earlier runs still match
    lines = re.split(r"\r\n|\r|\n", text)
    if lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + ("\n" if lines else "")


# object stores whose connectors upload an object on close: a reader sees the old object or
# the new one, never part of it, so a file there is written in place (a rename would be a
# copy and a delete, with a moment of no file at all between them)
WHOLE_ON_CLOSE = frozenset({"s3", "s3a", "s3n", "gs", "oss", "cos", "cosn", "obs", "r2"})


@contextlib.contextmanager
def _not_found_as_python(path: str) -> Iterator[None]:
    """A Hadoop call whose missing file (py4j's Java FileNotFoundException) raises the
    ``FileNotFoundError`` a local call would."""
    try:
        yield
    except Exception as exc:
        if "FileNotFoundException" in str(exc):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path) from None
        raise


def file_status(spark: SparkSession | None, path: str) -> tuple[int, int]:
    """A file's size in bytes and modification time (ns locally, ms on Hadoop filesystems,
    as each reports it); ``FileNotFoundError`` when it is not there."""
    spark = _session_for(spark, path)
    if is_local(path):
        st = os.stat(local_path(path))
        return st.st_size, st.st_mtime_ns
    fs, p = _fs(spark, path)
    with _not_found_as_python(path):
        s = fs.getFileStatus(p)
    return int(s.getLen()), int(s.getModificationTime())


def write_text(spark: SparkSession | None, path: str, text: str) -> None:
    """Write a whole file atomically: a temp file beside it, then rename over it (on an object
    store that uploads on close, :data:`WHOLE_ON_CLOSE`, the file itself)."""
    spark = _session_for(spark, path)
    if is_local(path):
        lp = local_path(path)
        d = os.path.dirname(lp) or "."
        os.makedirs(d, exist_ok=True)
        fd, tmp = _local_temp(d)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                os.fchmod(fh.fileno(), 0o666 & ~umask())  # as any file the user writes
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, lp)
        except BaseException as exc:  # (a SIGTERM's exception too: no temp file left behind)
            with contextlib.suppress(OSError):
                os.remove(tmp)
            if isinstance(exc, OSError):  # a full disk or a read-only directory: name the file
                raise OSError(exc.errno, exc.strerror, lp) from exc
            raise
        finally:
            _IN_FLIGHT.discard(os.path.basename(tmp))
        return
    fs, p = _fs(spark, path)
    if scheme(path) in WHOLE_ON_CLOSE:
        data = bytearray(text.encode("utf-8"))
        with _writing(spark, path):
            out = fs.create(p, True)
            try:
                out.write(data)
            except BaseException:  # never close (upload) a part: abort it where the stream can
                with contextlib.suppress(Exception):
                    out.abort()
                raise
            out.close()  # (the upload: the object appears whole, or the old one stays)
        return
    jvm = spark.sparkContext._jvm
    tmp_name = f".tmp-{uuid.uuid4().hex[:8]}"
    tmp = jvm.org.apache.hadoop.fs.Path(p.getParent(), tmp_name)
    _IN_FLIGHT.add(tmp_name)  # (before the file exists: a random name)
    with contextlib.ExitStack() as done, _writing(spark, path):
        done.callback(_IN_FLIGHT.discard, tmp_name)
        try:
            out = fs.create(tmp, True)
            try:
                out.write(bytearray(text.encode("utf-8")))
                out.hflush()
            finally:
                out.close()
            _rename_over(spark, fs, tmp, p, path)
        except BaseException:
            with contextlib.suppress(Exception):  # (a temp left over is removed on rerun)
                fs.delete(tmp, False)
            raise


# by (SparkContext, filesystem URI): one AbstractFileSystem each, or None where there is none
_FILE_CONTEXTS: dict[tuple[int, str], object] = {}


def _rename_over(spark: SparkSession, fs, tmp, p, path: str) -> None:
    """Rename the file ``tmp`` over ``p`` in one step where the filesystem can: Hadoop's
    ``FileContext.rename`` with ``OVERWRITE`` (atomic on HDFS, so a reader or another run's
    ``create_exclusive`` never finds the file missing). A filesystem without a FileContext
    binding gets delete, then rename."""
    jvm = spark.sparkContext._jvm
    src, dst = fs.makeQualified(tmp), fs.makeQualified(p)  # hdfs:///x -> hdfs://namenode/x
    uri = dst.toUri()
    key = (id(spark.sparkContext), f"{uri.getScheme()}://{uri.getAuthority() or ''}")
    if key not in _FILE_CONTEXTS:
        try:
            _FILE_CONTEXTS[key] = jvm.org.apache.hadoop.fs.FileContext.getFileContext(
                uri, spark.sparkContext._jsc.hadoopConfiguration())
        except Exception as exc:  # noqa: BLE001 - UnsupportedFileSystemException, via py4j
            log.info("%s has no Hadoop FileContext (%s): files there are replaced by delete, "
                     "then rename", key[1], str(exc).strip().splitlines()[0] if str(exc).strip()
                     else type(exc).__name__)
            _FILE_CONTEXTS[key] = None
    fc = _FILE_CONTEXTS[key]
    if fc is not None:
        rename = getattr(jvm.org.apache.hadoop.fs, "Options$Rename")
        options = spark.sparkContext._gateway.new_array(rename, 1)
        options[0] = rename.OVERWRITE
        fc.rename(src, dst, options)
        return
    if fs.exists(p):
        fs.delete(p, False)
    if not fs.rename(tmp, p):
        raise WriteFailed(errno.EIO, f"could not rename {tmp} to it", path)


def umask() -> int:
    """This process's umask, read without changing it (Linux), else by setting it back."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def create_exclusive(spark: SparkSession | None, path: str, text: str) -> bool:
    """Create ``path`` holding ``text`` only if it does not exist (atomically where the
    filesystem can: locally a whole temp file hard-linked to the name, so that nobody sees
    it empty, even after a crash or a full disk mid-write; O_EXCL where hard links are not
    supported; createNewFile on HDFS); False if it exists."""
    spark = _session_for(spark, path)
    if is_local(path):
        lp = local_path(path)
        d = os.path.dirname(lp) or "."
        os.makedirs(d, exist_ok=True)
        fd, tmp = _local_temp(d)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                os.fchmod(fh.fileno(), 0o666 & ~umask())
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, lp)
            except FileExistsError:
                return False
            except FileNotFoundError:
                if os.path.exists(tmp) or not os.path.isdir(d):
                    raise
                # its temp file removed under it (a run holding the directory cleaning up
                # what killed writers left): look again
                return create_exclusive(spark, path, text)
            except OSError as exc:  # (a filesystem without hard links)
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV,
                                     errno.ENOSYS, errno.EMLINK):  # (FUSE mounts: ENOSYS)
                    raise
                return _create_exclusive_local(lp, text)
            return True
        finally:
            _IN_FLIGHT.discard(os.path.basename(tmp))
            with contextlib.suppress(OSError):
                os.remove(tmp)
    fs, p = _fs(spark, path)
    try:
        with _writing(spark, path):
            if not fs.createNewFile(p):
                return False
    except WriteFailed as exc:  # a store that says so with an exception: another run won
        if "FileAlreadyExistsException" in exc.strerror:
            return False
        raise
    try:
        write_text(spark, path, text)
    except BaseException:  # no empty file that would hold the name for good
        with contextlib.suppress(Exception):
            delete(spark, path)
        raise
    return True


def _create_exclusive_local(lp: str, text: str) -> bool:
    try:
        fd = os.open(lp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
    except BaseException:  # (a full disk) no empty file that would hold the name for good
        with contextlib.suppress(OSError):
            os.remove(lp)
        raise
    return True


def split_parent(path: str) -> tuple[str, str]:
    """(parent directory, name) of a path on any filesystem: ``out/x`` -> (``out``, ``x``),
    ``x`` -> (``.``, ``x``), ``/x`` -> (``/``, ``x``), ``hdfs://nn:8020/x`` ->
    (``hdfs://nn:8020/``, ``x``); a trailing slash is ignored."""
    trimmed = path.rstrip("/")
    cut = trimmed.rfind("/")
    parent = trimmed[:cut]
    if cut <= 0 or trimmed[cut - 1] in ":/" or re.fullmatch(r"[A-Za-z][\w+.-]*://[^/]*",
                                                             parent):
        parent = trimmed[:cut + 1]  # keep the root's slash
    return parent or ".", trimmed[cut + 1:]


def remove_stale_temps(spark: SparkSession | None, final: str) -> list[str]:
    """Remove ``final.tmp-*`` / ``final.old-*``, left by a writer killed while it replaced
    ``final`` (:func:`staging_dir`, :func:`replace_dir`); call it holding ``final``'s lease.
    Returns what was removed."""
    parent, name = split_parent(final)
    removed = [join(parent, e) for e in list_dir(spark, parent) or ()
               if e.startswith((f"{name}.tmp-", f"{name}.old-"))]
    for path in removed:
        delete(spark, path)
    return removed


def staging_dir(spark: SparkSession | None, final: str, marker: str) -> str:
    """Where to write an output directory that readers must see whole: a temporary sibling,
    renamed over ``final`` by :func:`replace_dir`; on an object store, where a rename copies
    everything and is not atomic, ``final`` itself, emptied first, with ``marker`` (the file
    readers check) written last by the caller."""
    if not is_object_store(final):
        return f"{final.rstrip('/')}.tmp-{uuid.uuid4().hex[:8]}"
    delete(spark, join(final, marker))  # readers stop trusting it before anything changes
    delete(spark, final)
    return final


def check_before_publish(spark: SparkSession | None, check: Callable[[], None], tmp: str,
                         final: str) -> None:
    """Run ``check`` (the output's lease: another job may have taken it) before ``tmp`` is
    published as ``final``; when it refuses, the staging directory is removed (unless it is
    ``final`` itself, written in place on an object store, whose marker is then never written)
    and the refusal raised: nothing is published."""
    try:
        check()
    except BaseException:
        if tmp.rstrip("/") != final.rstrip("/"):
            delete(spark, tmp)
        raise


def replace_dir(spark: SparkSession | None, tmp: str, final: str) -> None:
    """Move a finished temp directory into place, replacing an older one (nothing to do when
    :func:`staging_dir` wrote in place)."""
    if tmp.rstrip("/") == final.rstrip("/"):
        return
    spark = _session_for(spark, final)
    if is_local(final):  # (a trailing slash would put the old one's name inside it)
        lt, lf = (os.path.abspath(local_path(p)) for p in (tmp, final))
        if os.path.exists(lf):
            old = f"{lf}.old-{uuid.uuid4().hex[:8]}"
            os.replace(lf, old)
            try:
                os.replace(lt, lf)
            except BaseException:  # the old one back: never neither of them in place
                if not os.path.exists(lf):  # (a SIGTERM just after the move: it is in place)
                    os.replace(old, lf)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.makedirs(os.path.dirname(os.path.abspath(lf)), exist_ok=True)
            os.replace(lt, lf)
        return
    fs, pf = _fs(spark, final)
    _, pt = _fs(spark, tmp)
    with _writing(spark, final):  # (as locally: the old one aside first, back if the move fails)
        old = None
        if fs.exists(pf):
            old = _fs(spark, f"{final.rstrip('/')}.old-{uuid.uuid4().hex[:8]}")[1]
            if not fs.rename(pf, old):
                raise WriteFailed(errno.EIO, "could not move the old one aside", final)
        why = ""
        try:
            moved = fs.rename(pt, pf)
        except Exception as exc:
            moved, why = False, f" ({str(exc).strip().splitlines()[0][:300]})"
            if old is None:
                raise
        if not moved:
            if old is not None:
                fs.rename(old, pf)
            raise WriteFailed(errno.EIO, f"could not rename {tmp} to it{why}", final)
        if old is not None:
            fs.delete(old, True)
