"""The count stage (Spark): a corpus (Parquet, or any input format ``corpus.py`` reads) -> word
table ``(word, count, first_seen)``.

Text reaches Python in Arrow batches (``mapInArrow``). Each task counts the words of its rows
per input file and remembers each word's first occurrence as (file index, block, row, index of
the word's first match in the row); ``block`` is the start of the file split a Spark reader
gave the task (0 for Parquet, whose rows are numbered in the file). The partial counts are
then merged: counts summed, the smallest key kept per word, and the key packed into an
order-preserving int64 ``first_seen`` (``order.FirstSeenLayout``; or, when it needs more than
63 bits, replaced by its dense rank). The partials are kept (local Arrow files with a local
master, else the executors' disks) while the merge is chosen from their measured size
(``count_merge``, ``memory.py``): when they fit the driver's memory they come to the driver as
Arrow and numpy merges them (no shuffle, none of a fresh JVM's warm-up), else a Spark
aggregation does. Either way the word table does not depend on partitioning (docs/DESIGN.md
section 1).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark import RDD, Accumulator, AccumulatorParam, SparkContext, StorageLevel, TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline import faults, fsutil
from pipeline.config import Config, ConfigError
from pipeline.count.corpus import (
    UNREADABLE,
    Corpus,
    ReadSlice,
    arrow_plan,
    first_line,
    input_fingerprint,
    list_local_sources,
    normalize_path,
    read_sources,
    skipping_corrupt_files,
    unreadable_file_error,
)
from pipeline.count.word_table import (
    WORD_TABLE_ARROW_SCHEMA,
    WORD_TABLE_SCHEMA,
    WordTable,
    arrow_ipc,
    check_replaceable,
    first_in_order,
    iter_arrow,
    publish_word_table,
    source_meta,
    sum_duplicates,
    table_summary,
    word_table_meta,
    write_table_data,
)
from pipeline.lease import Lease
from pipeline.memory import (
    choose_count_merge,
    driver_budget,
    driver_fetch_limit,
    release_freed_memory,
)
from pipeline.order import FirstSeenLayout
from pipeline.pretokenize import (
    Pretokenizer,
    PretokenizerSpec,
    RowStats,
    WordCounter,
    text_values,
)
from pipeline.progress import Progress
from pipeline.spark_session import (
    TaskCounts,
    TaskReporter,
    job_group,
    read_progress,
    start_session,
)

log = logging.getLogger(__name__)

_PARTIAL_SCHEMA = (
    "kind byte, word binary, count long, file int, block long, row long, rank int"
)
KIND_WORD, KIND_STAT, KIND_MAX = 0, 1, 2  # a word; a summed statistic; a maximum
BLOB_ROWS = 1 << 16  # words per partial-count batch: about 3 MB of Arrow


def _count_partition_fn(spec: PretokenizerSpec, file_index: dict[tuple[int, str], int],
                        weights: list[int], max_word_bytes: int, counts: TaskCounts):
    """The Spark-reader task: rows arrive from Spark's scan as Arrow batches of (text, source,
    path, block, row). Parquet gives each row's index in its file (block 0); other formats
    only the byte offset where the file's split starts, so a row is numbered within its split,
    which one task reads in order: (file, block, row) is then still the corpus order."""

    def count_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        faults.at("count_task")  # tests: heartbeats while the tasks run
        pre = Pretokenizer(spec)
        counters: dict[tuple[int, int], WordCounter] = {}
        report = counts.reporter(TaskContext.get().partitionId())
        rows_read = bytes_read = 0
        for batch in batches:
            texts = text_values(batch.column(0))
            sources = batch.column(1).to_pylist()
            paths = batch.column(2)
            blocks = batch.column(3).to_pylist()
            rows = batch.column(4).to_pylist()
            # (source, path, block) come in long runs: resolve each run once
            ends = sorted(set(_run_ends(batch.column(1))) | set(_run_ends(paths))
                          | set(_run_ends(batch.column(3))))
            start = 0
            for end in ends:
                fidx = file_index[(sources[start], normalize_path(paths[start].as_py()))]
                block = blocks[start] or 0
                wc = counters.get((fidx, block))
                if wc is None:
                    wc = counters[(fidx, block)] = WordCounter(pre, fidx,
                                                               max_word_bytes=max_word_bytes)
                add = wc.add_row
                before = wc.stats.bytes
                for i in range(start, end):
                    row = rows[i]
                    add(wc.stats.rows if row is None else row, texts[i])
                bytes_read += wc.stats.bytes - before
                start = end
            rows_read += batch.num_rows
            report.update(rows_read, bytes_read)
        report.finish(rows_read, bytes_read)
        # rows per file: with ignore_corrupt_files, a file that gave none was skipped by Spark
        file_rows: dict[str, int] = {}
        for (fidx, _), wc in counters.items():
            key = f"file_rows:{fidx}"
            file_rows[key] = file_rows.get(key, 0) + wc.stats.rows
        yield from _partial_batches([(wc, block, weights[fidx])
                                     for (fidx, block), wc in counters.items()], file_rows)

    return count_partition


def _count_slices(spec: PretokenizerSpec, text_column: str, slices: list[ReadSlice],
                  max_word_bytes: int = 0, ignore_corrupt: bool = False,
                  weights: list[int] | None = None, report: TaskReporter | None = None
                  ) -> Iterator[pa.RecordBatch]:
    """The Arrow-reader task: read these row groups with pyarrow and count their words. One
    counter per source weight (the slices come in corpus order). ``report``: told the rows
    and bytes read so far after every batch."""
    faults.at("count_task")  # tests: heartbeats while the tasks run
    pre = Pretokenizer(spec)
    counters: dict[int, WordCounter] = {}
    unreadable: set[int] = set()
    rows_read = bytes_read = 0
    for s in slices:
        if s.file_index in unreadable:
            continue
        weight = weights[s.file_index] if weights else 1
        wc = counters.get(weight)
        if wc is None:
            wc = counters[weight] = WordCounter(pre, max_word_bytes=max_word_bytes)
        add = wc.add_row
        wc.file_index = s.file_index
        row = s.first_row
        try:
            parquet = pq.ParquetFile(s.path)
            for batch in parquet.iter_batches(batch_size=4096, row_groups=list(s.row_groups),
                                              columns=[text_column], use_threads=False):
                before = wc.stats.bytes
                for text in text_values(batch.column(0)):
                    add(row, text)
                    row += 1
                rows_read += batch.num_rows
                bytes_read += wc.stats.bytes - before
                if report is not None:
                    report.update(rows_read, bytes_read)
        except (OSError, pa.ArrowException) as exc:
            if not ignore_corrupt:  # the driver turns this into one line naming the file
                raise RuntimeError(f"{UNREADABLE} {s.path} :: {first_line(exc)}") from None
            unreadable.add(s.file_index)  # what was read is kept, as Spark does
    if report is not None:
        report.finish(rows_read, bytes_read)
    yield from _partial_batches([(wc, 0, w) for w, wc in counters.items()],
                                {f"skipped_file:{i}": 1 for i in unreadable})


PARTIAL_ARROW_SCHEMA = pa.schema([("kind", pa.int8()), ("word", pa.binary()),
                                  ("count", pa.int64()), ("file", pa.int32()),
                                  ("block", pa.int64()), ("row", pa.int64()),
                                  ("rank", pa.int32())])


Counted = tuple[WordCounter, int, int]  # a counter, its block (0: rows indexed per file), weight


def _partial_batches(counters: Iterable[Counted], extra: dict[str, int] | None = None
                     ) -> Iterator[pa.RecordBatch]:
    """A task's output: each counter's words (counts times their source's weight; first
    occurrences keyed (file, block, row, rank)), then one batch of summed and maximal
    statistics (``extra``: more summed statistics, by name)."""
    total = RowStats()
    maxima = {"max_row": 0, "max_rank": 0, "max_block": 0}
    for wc, block, weight in counters:
        if wc.counts:
            batch = _word_batch(wc, block, weight)
            for at in range(0, batch.num_rows, BLOB_ROWS):  # no record over a few MB
                yield batch.slice(at, BLOB_ROWS)
        for k, v in wc.stats.as_dict().items():
            setattr(total, k, getattr(total, k) + v)
        maxima["max_row"] = max(maxima["max_row"], wc.max_row)
        maxima["max_rank"] = max(maxima["max_rank"], wc.max_rank)
        maxima["max_block"] = max(maxima["max_block"], block)
    stats = {**total.as_dict(), **(extra or {})}
    kinds = [KIND_STAT] * len(stats) + [KIND_MAX] * len(maxima)
    names = list(stats) + list(maxima)
    values = list(stats.values()) + list(maxima.values())
    n = len(names)
    yield pa.RecordBatch.from_arrays(
        [pa.array(kinds, pa.int8()), pa.array([k.encode() for k in names], pa.binary()),
         pa.array(values, pa.int64()), pa.array([0] * n, pa.int32()),
         pa.array([0] * n, pa.int64()), pa.array([0] * n, pa.int64()),
         pa.array([0] * n, pa.int32())],
        schema=PARTIAL_ARROW_SCHEMA,
    )


def _run_ends(values: pa.Array) -> list[int]:
    n = len(values)
    if n == 0:
        return []
    ree = pc.run_end_encode(values)
    return ree.run_ends.to_pylist()


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


def _dense_rank(sorted_df: DataFrame) -> DataFrame:
    """Add ``first_seen`` = 0, 1, 2, ... in the (already globally sorted) row order.

    The sorted frame is cached first so both passes see the same partitions (adaptive
    execution may otherwise cut the sort output differently in each job)."""
    spark = sorted_df.sparkSession
    sorted_df = sorted_df.persist()

    def sizes(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        n = sum(b.num_rows for b in batches)
        pid = TaskContext.get().partitionId()
        yield pa.RecordBatch.from_pydict(
            {"pid": pa.array([pid], pa.int32()), "n": pa.array([n], pa.int64())}
        )

    counts = dict(sorted_df.mapInArrow(sizes, "pid int, n long").collect())
    offsets, acc = {}, 0
    for pid in sorted(counts):
        offsets[pid] = acc
        acc += counts[pid]
    bc = spark.sparkContext.broadcast(offsets)

    def number(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        i = bc.value[TaskContext.get().partitionId()]
        for b in batches:
            n = b.num_rows
            yield pa.RecordBatch.from_arrays(
                [b.column(0), b.column(1), pa.array(range(i, i + n), pa.int64())],
                schema=WORD_TABLE_ARROW_SCHEMA)
            i += n

    return sorted_df.mapInArrow(number, WORD_TABLE_SCHEMA)


def _merge_with_spark(partial: DataFrame, n_files: int, tmp: str, t0: float
                      ) -> tuple[dict[str, int], int, float]:
    """Sum counts and keep the smallest first key per word with a Spark aggregation, and write
    the word table under ``tmp``; returns (statistics, distinct words, time counted)."""
    agg = (
        partial.groupBy("kind", "word")
        .agg(
            F.sum("count").alias("count"),
            F.max("count").alias("max"),
            F.min(F.struct("file", "block", "row", "rank")).alias("first"),
        )
        .persist()
    )
    # one job: the statistics rows, and all word rows folded into one row counting them
    is_word = F.col("kind") == KIND_WORD
    summary = agg.groupBy(
        "kind", F.when(is_word, F.lit(b"")).otherwise(F.col("word")).alias("name")
    ).agg(F.sum("count").alias("count"), F.max("max").alias("max"),
          F.count(F.lit(1)).alias("rows")).collect()
    t_count = time.time()
    log.info("merged the partial counts with Spark in %.1f s", t_count - t0)
    stats = {bytes(r["name"]).decode(): int(r["count"] if r["kind"] == KIND_STAT else r["max"])
             for r in summary if r["kind"] != KIND_WORD}
    unique_words = sum(int(r["rows"]) for r in summary if r["kind"] == KIND_WORD)
    words = agg.filter(F.col("kind") == KIND_WORD).select("word", "count", "first")
    layout = _layout(stats, n_files)
    if layout is not None:  # layout.pack in SQL: order-preserving, no global sort needed
        table = words.select(
            "word", "count",
            (F.shiftleft(F.col("first.file").cast("long"), layout.file_shift)
             .bitwiseOR(F.shiftleft(F.col("first.row"), layout.rank_bits))
             .bitwiseOR(F.col("first.rank").cast("long"))).alias("first_seen"),
        )
    else:  # too many files/rows for 63 bits: dense ranks of the first occurrence
        table = _dense_rank(words.orderBy("first").select("word", "count"))
    table.write.parquet(fsutil.join(tmp, "data"))
    agg.unpersist()
    return stats, unique_words, t_count


def _layout(stats: dict[str, int], n_files: int) -> FirstSeenLayout | None:
    """The packing of first keys (pops the maxima from ``stats``); None (dense ranks) when it
    needs more than 63 bits, or when rows are numbered within file splits (not Parquet)."""
    max_row, max_rank = stats.pop("max_row", 0), stats.pop("max_rank", 0)
    if stats.pop("max_block", 0):
        return None
    return FirstSeenLayout.fit(n_files, max_row, max_rank)


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


def _side_stats(side: list[pa.RecordBatch]) -> dict[str, int]:
    stats: dict[str, int] = {}
    for b in side:
        for k, name, value in zip(b.column(0).to_pylist(), b.column(1).to_pylist(),
                                  b.column(2).to_pylist()):
            key = bytes(name).decode()
            if k == KIND_STAT:  # summed over tasks
                stats[key] = stats.get(key, 0) + value
            else:  # KIND_MAX: the largest over tasks
                stats[key] = max(stats.get(key, 0), value)
    return stats


def _merge_bucket(batches: list[pa.RecordBatch], layout: FirstSeenLayout | None
                  ) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """One bucket's distinct words, their summed counts and their first keys: packed
    (``layout``) or, for dense ranks, the (file, block, row, rank) columns stacked."""
    words = pa.Table.from_batches(batches, schema=PARTIAL_ARROW_SCHEMA)
    distinct, word_id, totals = sum_duplicates(words.column("word").combine_chunks(),
                                               words.column("count").to_numpy())
    n = len(distinct)
    file = words.column("file").to_numpy().astype(np.int64)
    row = words.column("row").to_numpy()
    rank = words.column("rank").to_numpy().astype(np.int64)
    if layout is not None:  # the packed key preserves (file, row, rank) order: its minimum
        key = layout.pack(file, row, rank)
        first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, word_id, key)
    else:  # each word's row with the smallest (file, block, row, rank)
        block = words.column("block").to_numpy()
        by_key = np.lexsort((rank, row, block, file))
        rep = by_key[first_in_order(word_id, by_key)]
        first = np.stack([file[rep], block[rep], row[rep], rank[rep]])
    return distinct, totals, first


def merge_partials(partial: pa.Table | BucketedPartials, n_files: int
                   ) -> tuple[pa.Table, dict[str, int]]:
    """The driver-side merge of the tasks' partial output (``_PARTIAL_SCHEMA``), one hash
    bucket at a time: the word table (same rows as :func:`_merge_with_spark` writes, sorted by
    first_seen) and the statistics."""
    if isinstance(partial, pa.Table):
        partial = BucketedPartials.of(partial.to_batches(), 1)
    stats = _side_stats(partial.side)
    layout = _layout(stats, n_files)
    words, totals, firsts = [], [], []
    while partial.buckets:
        w, t, f = _merge_bucket(partial.buckets.pop(), layout)
        words.append(w)
        totals.append(t)
        firsts.append(f)
    if layout is not None:
        first_seen = np.concatenate(firsts) if firsts else np.zeros(0, dtype=np.int64)
    else:  # dense ranks of the first keys
        file, block, row, rank = np.concatenate(firsts, axis=1) if firsts \
            else np.zeros((4, 0), dtype=np.int64)
        first_seen = np.empty(len(file), dtype=np.int64)
        first_seen[np.lexsort((rank, row, block, file))] = np.arange(len(file), dtype=np.int64)
    table = pa.Table.from_arrays(
        [pa.chunked_array(words, pa.binary()),
         pa.array(np.concatenate(totals) if totals else np.zeros(0, np.int64), pa.int64()),
         pa.array(first_seen, pa.int64())],
        schema=WORD_TABLE_ARROW_SCHEMA,
    )
    return table.sort_by("first_seen"), stats


def _warm_workers(spark: SparkSession, spec: PretokenizerSpec) -> threading.Thread:
    """Start the executors' Python workers (and compile the split pattern in them) in a
    background job while the driver lists and plans the corpus: in a fresh application that
    start-up takes seconds, and the counting job reuses the workers."""

    def warm(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        Pretokenizer(spec)
        for b in batches:
            yield pa.RecordBatch.from_pydict({"n": pa.array([b.num_rows], pa.int64())})

    def run() -> None:
        with contextlib.suppress(Exception):  # only an optimisation: never fail the stage
            n = spark.sparkContext.defaultParallelism
            spark.range(0, n, numPartitions=n).mapInArrow(warm, "n long").collect()

    thread = threading.Thread(target=run, name="spark-bpe-warm-workers", daemon=True)
    thread.start()
    return thread


def _partial_frame(corpus: Corpus, cfg: Config, spec: PretokenizerSpec,
                   size: Accumulator, counts: TaskCounts) -> DataFrame:
    """Spark's reader: the tasks' partial counts as a DataFrame (``_PARTIAL_SCHEMA``); the
    bytes of each task's Arrow output are added to ``size`` (:class:`_OutputSize`)."""
    assert corpus.df is not None
    file_index = {(src, f): i for i, (src, f) in enumerate(corpus.keys)}
    src = corpus.df
    if cfg.num_partitions and cfg.input_format == "parquet" and not cfg.input_table:
        # keep each file's rows in order inside a partition: repartition by file, sort rows
        src = src.repartition(cfg.num_partitions, "source", "path").sortWithinPartitions(
            "source", "path", "row")
    count = _count_partition_fn(spec, file_index, corpus.weights, cfg.max_word_bytes, counts)

    def measured(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task_bytes = 0
        for b in count(batches):
            task_bytes += b.nbytes
            yield b
        size.add((task_bytes, task_bytes))
        release_freed_memory()  # the worker idles while the driver trains

    return src.mapInArrow(measured, _PARTIAL_SCHEMA)


def _decode_blobs(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for b in batches:
        for blob in b.column(0).to_pylist():
            yield from pa.ipc.open_stream(blob)


@dataclass
class Partials:
    """The count tasks' partial counts, kept until they are merged: where to merge them is
    chosen from their measured size, and neither choice counts again. With a local master and
    the pyarrow reader each task writes its output to one Arrow IPC file in ``spill_dir`` (on
    this machine: the driver memory-maps them, no JVM in between); otherwise they stay on the
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
                return BucketedPartials.of(iter_arrow(self.frame), buckets)
            assert self.blobs is not None
            return BucketedPartials.of(
                (b for blob in self.blobs.toLocalIterator(prefetchPartitions=False)
                 for b in pa.ipc.open_stream(blob)), buckets)

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
            return self.spark.range(0, n, 1, max(n, 1)).mapInArrow(read, _PARTIAL_SCHEMA)
        assert self.blobs is not None
        rows = self.spark.createDataFrame(self.blobs.map(lambda blob: (blob,)), "ipc binary")
        return rows.mapInArrow(_decode_blobs, _PARTIAL_SCHEMA)

    def release(self) -> None:
        with contextlib.suppress(Exception):
            if self.spill_dir is not None:
                shutil.rmtree(self.spill_dir, ignore_errors=True)
            else:
                (self.frame if self.frame is not None else self.blobs).unpersist()


class _OutputSize(AccumulatorParam):
    """(total bytes, largest task's bytes) of the count tasks' output. Retried or speculative
    tasks may add twice: the sizes can only be overstated, which errs towards Spark."""

    def zero(self, value: tuple[int, int]) -> tuple[int, int]:
        return (0, 0)

    def addInPlace(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], max(a[1], b[1]))


def _spill_dir(sc: SparkContext) -> str | None:
    """Where the count tasks write their output for the driver to read directly: a temporary
    directory when every executor runs on this machine (local masters), else None."""
    return tempfile.mkdtemp(prefix="spark-bpe-partials-") if sc.master.startswith("local") \
        else None


def _count_partials(spark: SparkSession, corpus: Corpus, cfg: Config, spec: PretokenizerSpec,
                    plan: list[list[ReadSlice]] | None, counts: TaskCounts) -> Partials:
    """Run the count tasks. All run at once and keep their output on the executors' disks,
    measured by an accumulator; they report what they have read to ``counts``."""
    sc = spark.sparkContext
    size = sc.accumulator((0, 0), _OutputSize())
    if plan is None:
        frame = _partial_frame(corpus, cfg, spec, size, counts).persist(StorageLevel.DISK_ONLY)
        return _measured(Partials(spark, 0, 0, frame=frame), frame.count, size)
    text_column, cap, ignore = cfg.text_column, cfg.max_word_bytes, cfg.ignore_corrupt_files
    weights = corpus.weights
    n = len(plan)
    spill = _spill_dir(sc)
    counts.total_rows = sum(s.num_rows for task in plan for s in task)

    def count_task(ids: Iterator[int]) -> Iterator[bytes]:
        for i in ids:
            batches = _count_slices(spec, text_column, plan[i], cap, ignore, weights,
                                    counts.reporter(i))
            if spill is not None:  # one Arrow stream per task, written whole, then renamed
                path = os.path.join(spill, f"task-{i:05d}.arrow")
                tmp = f"{path}.{os.getpid()}.tmp"  # a retried or speculative attempt: its own
                with pa.OSFile(tmp, "wb") as sink, \
                        pa.ipc.new_stream(sink, PARTIAL_ARROW_SCHEMA) as writer:
                    for b in batches:
                        writer.write_batch(b)
                os.replace(tmp, path)
                task_bytes = os.path.getsize(path)
            else:
                task_bytes = 0
                for b in batches:
                    blob = arrow_ipc([b], PARTIAL_ARROW_SCHEMA)
                    task_bytes += len(blob)
                    yield blob
            size.add((task_bytes, task_bytes))
            release_freed_memory()  # the worker idles while the driver trains

    blobs = sc.parallelize(range(n), n).mapPartitions(count_task)
    if spill is None:
        blobs.persist(StorageLevel.DISK_ONLY)
    partials = Partials(spark, 0, 0, blobs=None if spill else blobs, spill_dir=spill,
                        files=[os.path.join(spill, f"task-{i:05d}.arrow") for i in range(n)]
                        if spill else [])
    return _measured(partials, blobs.count, size)


def _measured(partials: Partials, run: Callable[[], object], size: Accumulator) -> Partials:
    """Run the count tasks (``run``) and record their output's size; if they fail, nothing
    of theirs is kept."""
    try:
        run()
    except BaseException:
        partials.release()
        raise
    partials.nbytes, partials.largest = size.value
    return partials


def count_words(spark: SparkSession, cfg: Config, progress: Progress | None = None,
                frame: DataFrame | None = None, lease: Lease | None = None) -> WordTable:
    """Run the word-count stage and write the word table to ``cfg.output`` atomically, holding
    the output's lease (:meth:`pipeline.lease.Lease.beside`; ``lease``: already held by the
    caller) throughout, with heartbeats while it runs (rows and bytes the tasks have read, see
    :class:`pipeline.spark_session.TaskCounts`; tasks done from Spark's status tracker). ``frame``:
    count this DataFrame's ``text_column`` instead of ``cfg.input`` (corpus order: its
    partitions in order, rows in partition order)."""
    t0 = time.time()
    check_replaceable(spark, cfg.output)
    progress = progress or Progress("count_words", every=cfg.heartbeat_seconds,
                                    bar=cfg.progress_bar)
    sc = spark.sparkContext
    with contextlib.ExitStack() as stack:
        if lease is None:
            lease = stack.enter_context(Lease.beside(spark, cfg.output,
                                                     cfg.lease_timeout_seconds, "word count"))
        for path in fsutil.remove_stale_temps(spark, cfg.output):
            log.info("removed %s, left by an interrupted count", path)
        counts = TaskCounts.create(sc)
        try:
            with job_group(sc, "count") as group, progress.stage(
                    "count", unit="tasks", poll=read_progress(sc, group, counts)) as stage:
                with skipping_corrupt_files(spark, cfg.ignore_corrupt_files):
                    wt = _count(spark, cfg, cfg.pretokenizer_spec(), t0, counts, lease.check,
                                frame)
                counts.phase = ""
                st = wt.meta["stats"]
                stage.update(note=f"{st['unique_words']:,} distinct words, "
                                  f"{st['words']:,} words")
        finally:
            counts.close()
    return wt


def _count(spark: SparkSession, cfg: Config, spec: PretokenizerSpec, t0: float,
           counts: TaskCounts, check: Callable[[], None],
           frame: DataFrame | None = None) -> WordTable:
    footers: dict[str, pq.FileMetaData] = {}
    skipped: list[str] | None = [] if cfg.ignore_corrupt_files else None
    corpus = None if frame is not None else list_local_sources(cfg, footers, skipped)
    plan = None if corpus is None else arrow_plan(spark, cfg, corpus.files, footers)
    warming = None
    if plan is None:  # Spark's reader: start the Python workers while Spark plans the scan
        start_session(spark)
        warming = _warm_workers(spark, spec)
        try:
            corpus = read_sources(spark, cfg, frame)
            if frame is None and cfg.input_format == "parquet" and not cfg.input_table:
                # listed by Spark (a glob, nested directories), read by pyarrow
                plan = arrow_plan(spark, cfg, corpus.files, skipped=skipped)
        except BaseException:  # (a missing column, say) let the warm-up job end first: Spark
            warming.join(60)  # stopped under it logs errors after the job's error line
            raise
    assert corpus is not None
    try:
        fingerprint = input_fingerprint(spark, corpus.files, footers) if frame is None \
            else {"files": 0, "bytes": 0, "digest": "a DataFrame: never reused"}
        return _count_and_write(spark, cfg, spec, t0, corpus, plan, fingerprint,
                                skipped or [], counts, check)
    except Exception as exc:
        named = unreadable_file_error(exc)
        if named is None:
            raise
        raise named from None
    finally:
        if warming is not None:
            warming.join()


def _count_and_write(spark: SparkSession, cfg: Config, spec: PretokenizerSpec, t0: float,
                     corpus: Corpus, plan: list[list[ReadSlice]] | None, fingerprint: dict,
                     skipped: list[str], counts: TaskCounts, check: Callable[[], None]
                     ) -> WordTable:
    tmp = fsutil.staging_dir(spark, cfg.output, "word_table.json")
    try:
        return _count_into(spark, cfg, spec, t0, corpus, plan, fingerprint, skipped, tmp,
                           counts, check)
    except BaseException:
        with contextlib.suppress(Exception):  # nothing half-written is left behind
            fsutil.delete(spark, tmp)  # (on an object store: the output, without its marker)
        raise


def _skipped_files(stats: dict[str, int], files: list[str], listed_skipped: list[str],
                   spark_read: bool, ignore: bool) -> list[str]:
    """The unreadable input files left out (``ignore_corrupt_files``), from the listing and
    the tasks' statistics (which this removes from ``stats``)."""
    skipped = list(listed_skipped)
    with_rows: set[int] = set()
    for key in [k for k in stats if k.startswith(("skipped_file:", "file_rows:"))]:
        value = stats.pop(key)
        index = int(key.split(":", 1)[1])
        if key.startswith("skipped_file:"):
            skipped.append(files[index])
        elif value:
            with_rows.add(index)
    if spark_read and ignore:  # Spark skips unreadable files silently: they gave no rows
        skipped += [f for i, f in enumerate(files) if i not in with_rows]
    return sorted(set(skipped))


def _merge(spark: SparkSession, cfg: Config, partials: Partials, n_files: int, tmp: str,
           t0: float, reader: str, counts: TaskCounts
           ) -> tuple[pa.Table | None, dict[str, int], int, float]:
    """Merge the partial counts where ``count_merge`` and the driver's memory say, and write
    the word table under ``tmp``. Returns (the table when merged on the driver, statistics,
    distinct words, time counted)."""
    conf = dict(spark.sparkContext.getConf().getAll())
    where, buckets, why = choose_count_merge(
        cfg.count_merge, partials.nbytes, driver_budget(cfg.driver_budget_mb, conf),
        partials.largest, driver_fetch_limit(conf) if partials.through_jvm else None)
    t_counted = time.time()
    log.info("counted in %.1f s (%s); %s", t_counted - t0, reader, why)
    counts.phase = f"merging the partial counts ({where})"
    if where == "driver":
        try:
            collected = partials.fetch(buckets)
        except Exception as exc:  # noqa: BLE001 - only a result too big for the driver
            if not isinstance(exc, MemoryError) and "maxResultSize" not in str(exc) \
                    and "OutOfMemory" not in str(exc):
                raise
            log.warning("partial counts too big for the driver (%s); merging with Spark "
                        "instead (set count_merge = spark)", first_line(exc))
            counts.phase = "merging the partial counts (spark)"
        else:
            merged, stats = merge_partials(collected, n_files)
            del collected
            t_count = time.time()
            log.info("merged the partial counts on the driver in %.1f s", t_count - t_counted)
            write_table_data(spark, merged, fsutil.join(tmp, "data"))
            return merged, stats, merged.num_rows, t_count
    stats, unique_words, t_count = _merge_with_spark(partials.as_frame(), n_files, tmp,
                                                     t_counted)
    return None, stats, unique_words, t_count


def _count_into(spark: SparkSession, cfg: Config, spec: PretokenizerSpec, t0: float,
                corpus: Corpus, plan: list[list[ReadSlice]] | None, fingerprint: dict,
                skipped: list[str], tmp: str, counts: TaskCounts, check: Callable[[], None]
                ) -> WordTable:
    files = corpus.files
    reader = "pyarrow in the tasks" if plan is not None else "Spark's reader"
    partials = _count_partials(spark, corpus, cfg, spec, plan, counts)
    try:
        merged, stats, unique_words, t_count = _merge(spark, cfg, partials, len(files), tmp,
                                                      t0, reader, counts)
    finally:
        partials.release()
    t_write = time.time()
    log.info("wrote the word table in %.1f s", t_write - t_count)
    stats["unique_words"] = unique_words
    stats["skipped_files"] = _skipped_files(stats, files, skipped,
                                            plan is None and corpus.by_file,
                                            cfg.ignore_corrupt_files)
    if stats["skipped_files"]:
        log.warning("ignore_corrupt_files: left out %d unreadable input files (listed in "
                    "stats.json): %s", len(stats["skipped_files"]),
                    ", ".join(stats["skipped_files"][:5])
                    + (" ..." if len(stats["skipped_files"]) > 5 else ""))
    if stats.get("words", 0) == 0:
        fsutil.delete(spark, tmp)
        raise ConfigError(
            f"config key 'input': the corpus at {cfg.input} has no words "
            f"({stats.get('rows', 0)} rows, {stats.get('null_rows', 0)} null, "
            f"{stats.get('empty_rows', 0)} empty): nothing to train on"
        )
    stats["seconds"] = round(time.time() - t0, 3)
    stats["files"] = len(files)
    source = {**source_meta(cfg), "input_fingerprint": fingerprint, "files": len(files)}
    left_out = {**{k: stats.get(k, 0) for k in ("long_words", "long_word_bytes",
                                                "rows_with_long_words")},
                "unreadable_files": stats["skipped_files"]}
    meta = word_table_meta(spec, cfg.text_column, cfg.max_word_bytes, stats, source, left_out,
                           None if merged is None else table_summary(merged))
    publish_word_table(spark, tmp, cfg.output, meta, stats, cfg.to_json(), check)
    log.info(
        "word table: %d unique words, %d words, %d rows (%d null, %d empty) in %.1f s -> %s",
        stats["unique_words"], stats["words"], stats["rows"], stats["null_rows"],
        stats["empty_rows"], stats["seconds"], cfg.output,
    )
    if stats.get("long_words"):
        log.warning("left out %d occurrences of words longer than max_word_bytes = %d "
                    "(%d bytes in %d rows; counted in stats.json)", stats["long_words"],
                    cfg.max_word_bytes, stats["long_word_bytes"],
                    stats["rows_with_long_words"])
    return WordTable(cfg.output, meta, merged)


