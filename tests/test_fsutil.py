"""Local file operations (no JVM): atomic writes that name the file when they fail, and
permissions that follow the umask."""

from __future__ import annotations

import os
import stat

import pytest

from pipeline import fsutil


@pytest.fixture
def umask():
    def set_mask(mask: int) -> None:
        os.umask(mask)

    old = os.umask(0o022)
    yield set_mask
    os.umask(old)


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_follow_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    path = tmp_path / "run" / "merges.txt"
    fsutil.write_text(None, str(path), "#version: 0.2\n")
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert fsutil.create_exclusive(None, str(tmp_path / "lease"), "x")
    assert stat.S_IMODE((tmp_path / "lease").stat().st_mode) == mode
    assert not fsutil.create_exclusive(None, str(tmp_path / "lease"), "y")
    assert (tmp_path / "lease").read_text() == "x"


def test_a_failed_write_names_the_file_and_leaves_no_temp(tmp_path):
    import resource

    target = tmp_path / "big.txt"
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, old[1]))
    try:
        with pytest.raises(OSError) as err:
            fsutil.write_text(None, str(target), "x" * 5000)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
    assert err.value.filename == str(target) and err.value.strerror == "File too large"
    assert os.listdir(tmp_path) == []


def test_a_write_interrupted_by_a_signal_leaves_no_temp(tmp_path, monkeypatch):
    """SIGTERM's handler raises an exception that is no OSError (a KeyboardInterrupt, as
    Ctrl-C's): the temp file goes all the same, and the old file stays whole."""
    target = tmp_path / "merges.txt"
    target.write_text("old\n")

    def killed(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        fsutil.write_text(None, str(target), "new\n" * 1000)
    assert os.listdir(tmp_path) == ["merges.txt"] and target.read_text() == "old\n"


@pytest.mark.parametrize("path,scheme,local,object_store,local_path", [
    ("/data/corpus", "", True, False, "/data/corpus"),
    ("data/corpus", "", True, False, "data/corpus"),
    ("file:/data/x", "file", True, False, "/data/x"),
    ("file:///data/x", "file", True, False, "/data/x"),
    ("file://localhost/data/x", "file", True, False, "/data/x"),
    ("hdfs:/data/x", "hdfs", False, False, None),
    ("hdfs://nn:8020/data/x", "hdfs", False, False, None),
    ("s3a://bucket/x", "s3a", False, True, None),
    ("S3://bucket/x", "s3", False, True, None),
    ("gs://bucket/x", "gs", False, True, None),
    ("abfss://c@acct.dfs.core.windows.net/x", "abfss", False, True, None),
    ("dbfs:/mnt/x", "dbfs", False, True, None),
    ("viewfs://cluster/x", "viewfs", False, False, None),
    ("weird:name/file", "weird", False, False, None),
])
def test_uri_schemes(path, scheme, local, object_store, local_path):
    assert fsutil.scheme(path) == scheme
    assert fsutil.is_local(path) is local
    assert fsutil.is_object_store(path) is object_store
    if local_path is not None:
        assert fsutil.local_path(path) == local_path


def test_outputs_are_staged_beside_except_on_object_stores(tmp_path, monkeypatch):
    final = str(tmp_path / "words")
    staged = fsutil.staging_dir(None, final, "word_table.json")
    assert staged.startswith(final + ".tmp-")  # renamed into place when complete
    (tmp_path / "staged").mkdir()
    fsutil.replace_dir(None, str(tmp_path / "staged"), final)
    assert (tmp_path / "words").is_dir() and not (tmp_path / "staged").exists()
    fsutil.replace_dir(None, final, final)  # written in place (object store): nothing to do
    assert (tmp_path / "words").is_dir()
    # an output given with a trailing slash, replaced by a rerun (the old one's name was put
    # inside it: os.replace refused, after the whole encode)
    for n in range(2):
        (tmp_path / f"again{n}").mkdir()
        (tmp_path / f"again{n}" / "n").write_text(str(n))
        fsutil.replace_dir(None, str(tmp_path / f"again{n}"), final + "/")
    assert (tmp_path / "words" / "n").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["words"]
    # on an object store the output is written in place (marker last), never renamed: the
    # marker goes first, so that readers stop trusting the old output before it changes
    deleted: list[str] = []
    monkeypatch.setattr(fsutil, "delete", lambda spark, path: deleted.append(path))
    assert fsutil.staging_dir(None, "s3a://bucket/run/words", "word_table.json") == \
        "s3a://bucket/run/words"
    assert deleted == ["s3a://bucket/run/words/word_table.json", "s3a://bucket/run/words"]


@pytest.mark.spark
def test_a_scheme_spark_cannot_open_is_a_config_error(spark):
    """--output dbfs:/x (or --words) on a cluster without that filesystem: one line, exit 2,
    not a Java traceback and exit 1 (which a scheduler would retry)."""
    from pipeline.config import ConfigError

    for call in (lambda: fsutil.exists(spark, "dbfs:/tmp/x"),
                 lambda: fsutil.list_dir(spark, "nosuchfs://host/tmp/x")):
        with pytest.raises(ConfigError, match=r"^\S+: this Spark has no filesystem for its "
                                              r"scheme \(No FileSystem for scheme \"\w+\"\)"):
            call()


# what a Spark write task that hit a full disk raises (trimmed from a real run: an encode job
# whose output was on a 300 kB tmpfs)
_TASK_WRITE_FULL = """An error occurred while calling o87.parquet.
: org.apache.spark.SparkException: [TASK_WRITE_FAILED] Task failed while writing rows to \
file:/mnt/small/enc.tmp-65d51533. SQLSTATE: 58030
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.taskFailedWhileWritingRowsError(Q.scala:1)
Caused by: org.apache.hadoop.fs.FSError: java.io.IOException: No space left on device
\tat org.apache.hadoop.fs.RawLocalFileSystem$LocalFSFileOutputStream.write(R.java:1)
\t... 29 more
Caused by: java.io.IOException: No space left on device
\tat java.base/java.io.FileOutputStream.writeBytes(Native Method)
\t... 41 more
"""


def test_a_spark_write_task_that_hit_a_full_disk_is_a_write_failure():
    import errno

    err = fsutil.task_write_failure(RuntimeError(_TASK_WRITE_FULL))
    assert isinstance(err, fsutil.WriteFailed) and err.errno == errno.ENOSPC
    assert err.filename == "file:/mnt/small/enc.tmp-65d51533"
    assert err.strerror == "No space left on device"
    crashed = _TASK_WRITE_FULL.replace("No space left on device", "Stream closed") \
        + "Caused by: java.io.EOFException\n"  # a Python worker that died: not the disk
    assert fsutil.task_write_failure(RuntimeError(crashed)) is None
    assert fsutil.task_write_failure(RuntimeError("Caused by: java.io.IOException: "
                                                  "No space left on device")) is None


def test_cleaning_up_killed_writers_temps_spares_a_write_in_flight(tmp_path, monkeypatch):
    """A run removes the temp files killed writers left in its directory; the renewal of its
    own lease, written beside them at that moment, lost its temp file ("could not renew")."""
    import threading

    from pipeline import fsutil

    (tmp_path / ".tmp-killed").write_text("half a file")
    syncing, go = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd):
        syncing.set()
        go.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(fsutil.os, "fsync", slow_fsync)
    errors: list[BaseException] = []

    def renew():
        try:
            fsutil.write_text(None, str(tmp_path / ".lease.json"), "{}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    writer = threading.Thread(target=renew)
    writer.start()
    assert syncing.wait(10)
    fsutil.remove_temp_files(None, str(tmp_path))
    go.set()
    writer.join(10)
    assert not errors and (tmp_path / ".lease.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lease.json"]  # the killed one gone


def test_a_local_replace_that_fails_puts_the_old_one_back(tmp_path, monkeypatch):
    """The new directory's move into place failing left neither in place (the old one aside
    as .old-*, removed by the next run with the new one inside it, found by review)."""
    from pipeline import fsutil

    final, tmp = tmp_path / "words", tmp_path / "words.tmp-1"
    final.mkdir()
    (final / "old").write_text("old")
    tmp.mkdir()
    real_replace, calls = os.replace, []

    def failing(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(fsutil.os, "replace", failing)
    with pytest.raises(OSError, match="No space"):
        fsutil.replace_dir(None, str(tmp), str(final))
    assert (final / "old").read_text() == "old"


def test_exclusive_create_without_hard_links_or_with_its_temp_removed(tmp_path, monkeypatch):
    """A FUSE mount without hard links says ENOSYS (it was an error, not the O_EXCL way);
    a temp file removed under it by a run cleaning up is made again, not an error."""
    import errno

    from pipeline import fsutil

    real_link = os.link
    monkeypatch.setattr(fsutil.os, "link", lambda a, b: (_ for _ in ()).throw(
        OSError(errno.ENOSYS, "Function not implemented")))
    assert fsutil.create_exclusive(None, str(tmp_path / "a.json"), "{}")
    assert (tmp_path / "a.json").read_text() == "{}"
    assert not fsutil.create_exclusive(None, str(tmp_path / "a.json"), "{}")
    removed = []

    def link_after_cleanup(src, dst):
        if not removed:
            removed.append(src)
            os.remove(src)
        return real_link(src, dst)

    monkeypatch.setattr(fsutil.os, "link", link_after_cleanup)
    assert fsutil.create_exclusive(None, str(tmp_path / "b.json"), "{}")
    assert removed and (tmp_path / "b.json").read_text() == "{}"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
