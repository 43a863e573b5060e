"""Small file operations on any Hadoop filesystem (local, hdfs://, s3a://) via the JVM.

Local paths are handled with plain Python so the pure-Python parts (and tests) need no JVM.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

from pyspark.sql import SparkSession


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file:")


def local_path(path: str) -> str:
    if path.startswith("file://"):
        return path[len("file://"):]
    if path.startswith("file:"):
        return path[len("file:"):]
    return path


def _fs(spark: SparkSession, path: str):
    jvm = spark.sparkContext._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    return p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), p


def exists(spark: SparkSession | None, path: str) -> bool:
    if is_local(path) or spark is None:
        return os.path.exists(local_path(path))
    fs, p = _fs(spark, path)
    return bool(fs.exists(p))


def delete(spark: SparkSession | None, path: str) -> None:
    if is_local(path) or spark is None:
        lp = local_path(path)
        if os.path.isdir(lp):
            shutil.rmtree(lp, ignore_errors=True)
        elif os.path.exists(lp):
            os.remove(lp)
        return
    fs, p = _fs(spark, path)
    fs.delete(p, True)


def mkdirs(spark: SparkSession | None, path: str) -> None:
    if is_local(path) or spark is None:
        os.makedirs(local_path(path), exist_ok=True)
        return
    fs, p = _fs(spark, path)
    fs.mkdirs(p)


def read_text(spark: SparkSession | None, path: str) -> str:
    if is_local(path) or spark is None:
        with open(local_path(path), encoding="utf-8") as fh:
            return fh.read()
    fs, p = _fs(spark, path)
    jvm = spark.sparkContext._jvm
    stream = fs.open(p)
    try:
        reader = jvm.java.io.BufferedReader(jvm.java.io.InputStreamReader(stream, "UTF-8"))
        lines = []
        line = reader.readLine()
        while line is not None:
            lines.append(line)
            line = reader.readLine()
        return "\n".join(lines) + ("\n" if lines else "")
    finally:
        stream.close()


def write_text(spark: SparkSession | None, path: str, text: str) -> None:
    """Write a whole file atomically: a temp file beside it, then rename over it."""
    if is_local(path) or spark is None:
        lp = local_path(path)
        d = os.path.dirname(lp) or "."
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, lp)
        return
    fs, p = _fs(spark, path)
    jvm = spark.sparkContext._jvm
    tmp = jvm.org.apache.hadoop.fs.Path(p.getParent(), f".tmp-{uuid.uuid4().hex[:8]}")
    out = fs.create(tmp, True)
    try:
        out.write(bytearray(text.encode("utf-8")))
        out.hflush()
    finally:
        out.close()
    if fs.exists(p):
        fs.delete(p, False)
    if not fs.rename(tmp, p):
        raise OSError(f"could not rename {tmp} to {path}")


def replace_dir(spark: SparkSession | None, tmp: str, final: str) -> None:
    """Move a finished temp directory into place, replacing an older one."""
    if is_local(final) or spark is None:
        lt, lf = local_path(tmp), local_path(final)
        if os.path.exists(lf):
            old = f"{lf}.old-{uuid.uuid4().hex[:8]}"
            os.replace(lf, old)
            os.replace(lt, lf)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.makedirs(os.path.dirname(os.path.abspath(lf)), exist_ok=True)
            os.replace(lt, lf)
        return
    fs, pf = _fs(spark, final)
    _, pt = _fs(spark, tmp)
    if fs.exists(pf):
        fs.delete(pf, True)
    if not fs.rename(pt, pf):
        raise OSError(f"could not rename {tmp} to {final}")
