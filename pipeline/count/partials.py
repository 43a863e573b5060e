"""The count tasks' output: partial word counts as Arrow record batches (a word's count and
first key per task, then the task's statistics), and where they wait for the merge (local
Arrow files, the executors' disks, or Spark's rows) until ``merge.py`` merges them."""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyspark import RDD, AccumulatorParam, SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.count.word_table import (
    iter_arrow,
)
from pipeline.pretokenize import (
    RowStats,
    WordCounter,
)
from pipeline.spark_session import (
    job_group,
)

log = logging.getLogger(__name__)

KIND_WORD, KIND_STAT, KIND_MAX = 0, 1, 2  # a word; a summed statistic; a maximum
# per (file, split) of Spark's reader: the rows it holds (summed), and the largest row index
# (within the split) that has words (a maximum); names end in ":<file>:<block>"
SPLIT_ROWS, SPLIT_LAST_ROW = "split_rows:", "split_last_row:"
NULL_ROWS_OF = "file_null_rows:"  # a Spark-reader task's statistic: null rows of file i


BLOB_ROWS = 1 << 16  # words per partial-count batch: about 3 MB of Arrow


PARTIAL_ARROW_SCHEMA = pa.schema([("kind", pa.int8()), ("word", pa.binary()),
                                  ("count", pa.int64()), ("file", pa.int32()),
                                  ("block", pa.int64()), ("row", pa.int64()),
                                  ("rank", pa.int32())])
_SQL_TYPES = {pa.int8(): "byte", pa.int32(): "int", pa.int64(): "long", pa.binary(): "binary"}
PARTIAL_SCHEMA = ", ".join(f"{f.name} {_SQL_TYPES[f.type]}"  # the same, as Spark SQL DDL
                           for f in PARTIAL_ARROW_SCHEMA)


Counted = tuple[WordCounter, int, int]  # a counter, its block (0: rows indexed per file), weight


def partial_batches(counters: Iterable[Counted], extra: dict[str, int] | None = None,
                    per_file: bool = False, extra_max: dict[str, int] | None = None
                    ) -> Iterator[pa.RecordBatch]:
    """A task's output: each counter's words (counts times their source's weight; first
    occurrences keyed (file, block, row, rank)), then one batch of summed and maximal
    statistics (``extra``: more summed statistics, by name). ``per_file``: each counter
    counted one file (``ignore_corrupt_files``), and its statistics go out under that file's
    index, so that the merge leaves them out with the words of a file found unreadable; other
    statistics have file -1. ``extra_max``: more maximal statistics, by name (read after the
    counters, which may fill it as they go)."""
    totals: dict[int, RowStats] = {} if per_file else {-1: RowStats()}
    # (per file too: the maxima of a file found unreadable must not shape the layout of the
    # others' first keys, which would then depend on how far each task read it)
    maxima = {-1: {"max_row": 0, "max_rank": 0, "max_block": 0}}
    for wc, block, weight in counters:
        if wc.counts:
            batch = _word_batch(wc, block, weight)
            for at in range(0, batch.num_rows, BLOB_ROWS):  # no record over a few MB
                yield batch.slice(at, BLOB_ROWS)
        total = totals.setdefault(wc.file_index if per_file else -1, RowStats())
        for k, v in wc.stats.as_dict().items():
            setattr(total, k, getattr(total, k) + v)
        most = maxima.setdefault(wc.file_index if per_file else -1,
                                 {"max_row": 0, "max_rank": 0, "max_block": 0})
        most["max_row"] = max(most["max_row"], wc.max_row)
        most["max_rank"] = max(most["max_rank"], wc.max_rank)
        most["max_block"] = max(most["max_block"], block)
        wc = batch = None  # (a lazy ``counters`` frees each counter before making the next)
    rows = [(KIND_STAT, name, value, file) for file, total in totals.items()
            for name, value in total.as_dict().items()]
    rows += [(KIND_STAT, name, value, -1) for name, value in (extra or {}).items()]
    rows += [(KIND_MAX, name, value, file) for file, most in maxima.items()
             for name, value in most.items()]
    rows += [(KIND_MAX, name, value, -1) for name, value in (extra_max or {}).items()]
    kinds, names, values, files = zip(*rows)
    n = len(rows)
    yield pa.RecordBatch.from_arrays(
        [pa.array(kinds, pa.int8()), pa.array([k.encode() for k in names], pa.binary()),
         pa.array(values, pa.int64()), pa.array(files, pa.int32()),
         pa.array([0] * n, pa.int64()), pa.array([0] * n, pa.int64()),
         pa.array([0] * n, pa.int32())],
        schema=PARTIAL_ARROW_SCHEMA,
    )


def _word_batch(wc: WordCounter, block: int = 0, weight: int = 1) -> pa.RecordBatch:
    words = list(wc.counts)
    n = len(words)
    counts = np.fromiter(wc.counts.values(), dtype=np.int64, count=n)
    if weight != 1:
        counts *= weight
    if wc.stats.invalid_utf8_rows:  # lone surrogates stand for raw bytes: encode in Python
        word_col = pa.array([w.encode("utf-8", "surrogateescape") for w in words], pa.binary())
    else:  # Arrow encodes the UTF-8 in C; a string buffer is already the binary layout
        word_col = pa.array(words, pa.string()).view(pa.binary())
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(n, KIND_WORD, dtype=np.int8)),
            word_col,
            pa.array(counts, pa.int64()),
            pa.array(wc.first_file, pa.int32()),
            pa.array(np.full(n, block, dtype=np.int64)),
            pa.array(wc.first_row, pa.int64()),
            pa.array(wc.first_rank, pa.int32()),
        ],
        schema=PARTIAL_ARROW_SCHEMA,
    )


def word_buckets(words: pa.Array, k: int) -> np.ndarray:
    """A bucket in [0, k) per word, from its bytes alone (CRC-32): a word lands in the same
    bucket whichever task or batch it comes from."""
    crc = np.fromiter(map(zlib.crc32, words.to_pylist()), dtype=np.uint32, count=len(words))
    return (crc % k).astype(np.intp)


@dataclass
class BucketedPartials:
    """The tasks' partial counts on the driver, word rows split into hash buckets so that each
    bucket is merged on its own (peak memory: the partials once, plus one bucket's merge)."""

    buckets: list[list[pa.RecordBatch]]
    side: list[pa.RecordBatch]

    @classmethod
    def of(cls, batches: Iterable[pa.RecordBatch], k: int) -> BucketedPartials:
        out = cls([[] for _ in range(k)], [])
        for b in batches:  # a task's batches hold words, or statistics
            if b.schema != PARTIAL_ARROW_SCHEMA:  # e.g. Spark's large Arrow types
                b = b.cast(PARTIAL_ARROW_SCHEMA)
            is_word = b.column(0).to_numpy() == KIND_WORD
            if not is_word.all():
                out.side.append(b.filter(pa.array(~is_word)))
                b = b.filter(pa.array(is_word))
            if not b.num_rows:
                continue
            if k == 1:
                out.buckets[0].append(b)
                continue
            bucket = word_buckets(b.column(1), k)
            order = np.argsort(bucket, kind="stable")
            b = b.take(pa.array(order))  # a copy: the fetched Arrow stream can be let go
            at = 0
            for i, n in enumerate(np.bincount(bucket, minlength=k)):
                if n:
                    out.buckets[i].append(b.slice(at, n))
                at += n
        return out


def _decode_blobs(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for b in batches:
        for blob in b.column(0).to_pylist():
            yield from pa.ipc.open_stream(blob)


@dataclass
class Partials:
    """The count tasks' partial counts, kept until they are merged: where to merge them is
    chosen from their measured size, and neither choice counts again. With a local master
    each task writes its output to one Arrow IPC file in ``spill_dir`` (on this machine: the
    driver memory-maps them, no JVM in between); otherwise they stay on the
    executors' disks (``DISK_ONLY``) as Arrow IPC records of at most ``BLOB_ROWS`` rows (the
    JVM passes them through untouched), or as rows from Spark's reader."""

    spark: SparkSession
    nbytes: int  # Arrow bytes of all the tasks' output
    largest: int  # of one task's output: a fetch holds it in the driver JVM's heap
    blobs: RDD | None = None
    frame: DataFrame | None = None
    spill_dir: str | None = None
    files: list[str] = field(default_factory=list)

    @property
    def through_jvm(self) -> bool:
        """Whether fetching them passes each task's output through the driver JVM."""
        return self.spill_dir is None

    def fetch(self, buckets: int = 1) -> BucketedPartials:
        """All partial counts on the driver, split into ``buckets`` hash buckets as they
        arrive, one task's output at a time (``collect`` would hold them all in the driver
        JVM's heap; a spilled file is memory-mapped)."""
        if self.spill_dir is not None:
            return BucketedPartials.of(
                (b for f in self.files for b in pa.ipc.open_stream(pa.memory_map(f))), buckets)
        with job_group(self.spark.sparkContext, "count-fetch"):  # not counted as count tasks
            if self.frame is not None:
                # one task's output at a time, as for blobs (driver_fetch_limit)
                return BucketedPartials.of(iter_arrow(self.frame, prefetch=False), buckets)
            assert self.blobs is not None
            return BucketedPartials.of(
                (b for blob in self.blobs.toLocalIterator(prefetchPartitions=False)
                 for b in pa.ipc.open_stream(blob)), buckets)

    def side(self) -> list[pa.RecordBatch]:
        """The statistics rows of every task's output (not its words), for a Spark merge to
        know the totals and the first_seen layout before it aggregates the words. A spilled
        file's are found in its memory-mapped batches (their ``kind`` column alone is
        read); otherwise they are filtered out of the kept output by one Spark job, in the JVM
        for the rows of Spark's reader."""
        if self.spill_dir is not None:
            out = []
            for f in self.files:
                for b in pa.ipc.open_stream(pa.memory_map(f)):
                    is_side = b.column(0).to_numpy() != KIND_WORD
                    if is_side.any():
                        out.append(b.filter(pa.array(is_side)))
            return out
        with job_group(self.spark.sparkContext, "count-side"):
            rows = self.as_frame().filter(F.col("kind") != KIND_WORD).collect()
        columns = PARTIAL_ARROW_SCHEMA.names
        return [pa.RecordBatch.from_arrays(
            [pa.array([bytes(r[c]) if c == "word" else r[c] for r in rows],
                      PARTIAL_ARROW_SCHEMA.field(c).type) for c in columns],
            schema=PARTIAL_ARROW_SCHEMA)] if rows else []

    def as_frame(self) -> DataFrame:
        """The partial counts as rows for a Spark aggregation."""
        if self.frame is not None:
            return self.frame
        if self.spill_dir is not None:
            files = self.files

            def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                for b in batches:
                    for i in b.column(0).to_pylist():
                        yield from pa.ipc.open_stream(pa.memory_map(files[i]))

            n = len(files)
            return self.spark.range(0, n, 1, max(n, 1)).mapInArrow(read, PARTIAL_SCHEMA)
        assert self.blobs is not None
        rows = self.spark.createDataFrame(self.blobs.map(lambda blob: (blob,)), "ipc binary")
        return rows.mapInArrow(_decode_blobs, PARTIAL_SCHEMA)

    def release(self) -> None:
        with contextlib.suppress(Exception):
            if self.spill_dir is not None:
                shutil.rmtree(self.spill_dir, ignore_errors=True)
            else:
                (self.frame if self.frame is not None else self.blobs).unpersist()


class OutputSize(AccumulatorParam):
    """(total bytes, largest task's bytes) of the count tasks' output. Retried or speculative
    tasks may add twice: the sizes can only be overstated, which errs towards Spark."""

    def zero(self, value: tuple[int, int]) -> tuple[int, int]:
        return (0, 0)

    def addInPlace(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], max(a[1], b[1]))


def partials_spill_dir(sc: SparkContext) -> str | None:
    """Where the count tasks write their output for the driver to read directly: a temporary
    directory when every executor runs on this machine (local masters), else None."""
    return tempfile.mkdtemp(prefix="spark-bpe-partials-") if sc.master.startswith("local") \
        else None

