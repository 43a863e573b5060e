"""Stage 1 (Spark): Parquet corpus -> word table ``(word, count, first_seen)``.

Text reaches Python in Arrow batches (``mapInArrow``). Each task counts the words of its rows
per input file and remembers each word's first occurrence as (file index, row, index of the
word's first match in the row). The partial counts are then merged: counts summed, the smallest
key kept per word, and the key packed into an order-preserving int64 ``first_seen`` (or, when it
needs more than 63 bits, replaced by its dense rank). The partials are kept (local Arrow files
with a local master, else the executors' disks) while the merge is chosen from their measured
size (``count_merge``, ``memory.py``):
when they fit the driver's memory they come to the driver as Arrow and numpy merges them
(no shuffle, none of a fresh JVM's warm-up), else a Spark aggregation does. Either way the
word table does not depend on partitioning (docs/DESIGN.md section 1).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import heapq
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark import RDD, Accumulator, AccumulatorParam, SparkContext, StorageLevel, TaskContext
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.utils import AnalysisException

from pipeline import fsutil
from pipeline.config import Config, ConfigError
from pipeline.memory import choose_count_merge, driver_budget, driver_fetch_limit
from pipeline.pretokenize import (
    FirstSeenLayout,
    Pretokenizer,
    PretokenizerSpec,
    RowStats,
    WordCounter,
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

WORD_TABLE_VERSION = 2  # v2: max_word_bytes, input_fingerprint (v1 is read as "no cap")
READABLE_VERSIONS = (1, 2)
WORD_TABLE_SCHEMA = T.StructType(
    [
        T.StructField("word", T.BinaryType(), False),
        T.StructField("count", T.LongType(), False),
        T.StructField("first_seen", T.LongType(), False),
    ]
)
_PARTIAL_SCHEMA = (
    "kind byte, word binary, count long, file int, block long, row long, rank int"
)
KIND_WORD, KIND_STAT, KIND_MAX = 0, 1, 2  # a word; a summed statistic; a maximum
BLOB_ROWS = 1 << 16  # words per partial-count batch: about 3 MB of Arrow
UNREADABLE = "spark-bpe: unreadable input file"  # a task's error naming a corrupt file


def normalize_path(path: str) -> str:
    """One spelling per file: Spark writes ``file:/x`` in one place and ``file:///x`` in another."""
    u = urlparse(path)
    scheme = u.scheme or "file"
    return f"{scheme}://{u.netloc}{unquote(u.path)}"


def read_corpus(spark: SparkSession, path: str, text_column: str,
                ignore_corrupt: bool = False) -> tuple[DataFrame, list[str]]:
    """One Parquet corpus as a DataFrame, and its files in corpus (path) order (the encode
    job's input). ``ignore_corrupt``: Spark's own ``spark.sql.files.ignoreCorruptFiles``."""
    if ignore_corrupt:
        spark.conf.set("spark.sql.files.ignoreCorruptFiles", "true")
    cfg = Config(input=path, text_column=text_column)
    df, files, _, _ = _read_source(spark, cfg, path, None)
    if not files:
        raise ConfigError(f"config key 'input': no Parquet files under {path} (empty corpus)")
    return df, files


_TEXT_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
               pa.types.is_large_binary)


def corrupt_file_error(path: str, reason: str, can_skip: bool = True) -> ConfigError:
    """``can_skip``: the job takes --ignore-corrupt-files (the count does, encode does not:
    every row of its input gets its ids)."""
    what = ("or pass --ignore-corrupt-files to skip unreadable files" if can_skip
            else "then rerun")
    return ConfigError(f"config key 'input': {path} is not a readable Parquet file ({reason}); "
                       f"fix or remove it, {what}")


def list_local_corpus(path: str, text_column: str,
                      footers: dict[str, pq.FileMetaData] | None = None,
                      skipped: list[str] | None = None) -> list[str] | None:
    """The files of a local corpus listed without the JVM (as :func:`read_corpus` lists them),
    when that is unambiguous: one Parquet file, or a directory that holds only files (names
    starting with ``_`` or ``.`` skipped, as Spark does). None lets Spark list and validate:
    globs, nested or partitioned directories, other filesystems, a missing column or one that
    is not text. A file whose Parquet footer cannot be read is an error naming it, or, with
    ``skipped`` given (``ignore_corrupt_files``), left out and added to ``skipped``.
    ``footers``, if given, receives each listed file's Parquet metadata (read once, for
    :func:`plan_slices`)."""
    if not fsutil.is_local(path) or any(c in path for c in "*?[{"):
        return None
    local = os.path.abspath(fsutil.local_path(path))
    if os.path.isfile(local):
        candidates = [local]
    elif os.path.isdir(local):
        entries = [e for e in os.scandir(local) if not e.name.startswith(("_", "."))]
        if not entries or not all(e.is_file() for e in entries):
            return None
        candidates = [e.path for e in entries]
    else:
        return None
    read: dict[str, pq.FileMetaData] = {}
    for f in candidates:
        try:
            meta = pq.ParquetFile(f).metadata
            schema = meta.schema.to_arrow_schema()
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds
            if skipped is None:
                raise corrupt_file_error(f, _first_line(exc)) from None
            skipped.append(normalize_path("file://" + f))
            continue
        i = schema.get_field_index(text_column)
        if i < 0 or not any(is_text(schema.field(i).type) for is_text in _TEXT_TYPES):
            return None
        read[normalize_path("file://" + f)] = meta
    if footers is not None:
        footers.update(read)
    if not read:
        raise ConfigError(f"config key 'input': no readable Parquet files under {path} "
                          f"({len(skipped or [])} unreadable ones skipped)")
    return sorted(read)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _count_partition_fn(spec: PretokenizerSpec, file_index: dict[tuple[int, str], int],
                        weights: list[int], max_word_bytes: int, counts: TaskCounts):
    """The Spark-reader task: rows arrive from Spark's scan as Arrow batches of (text, source,
    path, block, row). Parquet gives each row's index in its file (block 0); other formats
    only the byte offset where the file's split starts, so a row is numbered within its split,
    which one task reads in order: (file, block, row) is then still the corpus order."""

    def count_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pre = Pretokenizer(spec)
        counters: dict[tuple[int, int], WordCounter] = {}
        report = counts.reporter(TaskContext.get().partitionId())
        rows_read = bytes_read = 0
        for batch in batches:
            texts = batch.column(0).to_pylist()
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


@dataclass(frozen=True)
class ReadSlice:
    """Consecutive row groups of one local Parquet file, read in a task with pyarrow."""

    file_index: int
    path: str  # a local path
    row_groups: tuple[int, ...]
    first_row: int  # index in the file of the first row of the first row group
    nbytes: int
    num_rows: int = 0


def plan_slices(files: list[str], text_column: str, tasks: int,
                footers: dict[str, pq.FileMetaData] | None = None
                ) -> list[list[ReadSlice]] | None:
    """Row groups of local ``files`` dealt to ``tasks`` tasks of about equal size (largest
    first, each to the least loaded task), each task's slices in corpus order. None when a file
    lacks ``text_column`` as a top-level column (Spark's reader then handles it, e.g. with
    nulls for files that miss the column). ``footers``: metadata already read, by file."""
    slices: list[ReadSlice] = []
    for fidx, f in enumerate(files):
        path = fsutil.local_path(f)
        meta = (footers or {}).get(f) or pq.ParquetFile(path).metadata
        if text_column not in meta.schema.to_arrow_schema().names:
            return None
        first = 0
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            slices.append(ReadSlice(fidx, path, (rg,), first, group.total_byte_size,
                                    group.num_rows))
            first += group.num_rows
    n = max(1, min(tasks, len(slices)))
    loads = [(0, t) for t in range(n)]
    plan: list[list[ReadSlice]] = [[] for _ in range(n)]
    for s in sorted(slices, key=lambda s: (-s.nbytes, s.file_index, s.first_row)):
        load, t = heapq.heappop(loads)
        plan[t].append(s)
        heapq.heappush(loads, (load + s.nbytes, t))
    for task in plan:
        task.sort(key=lambda s: (s.file_index, s.first_row))
    return plan


def _count_slices(spec: PretokenizerSpec, text_column: str, slices: list[ReadSlice],
                  max_word_bytes: int = 0, ignore_corrupt: bool = False,
                  weights: list[int] | None = None, report: TaskReporter | None = None
                  ) -> Iterator[pa.RecordBatch]:
    """The Arrow-reader task: read these row groups with pyarrow and count their words. One
    counter per source weight (the slices come in corpus order). ``report``: told the rows
    and bytes read so far after every batch."""
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
                for text in batch.column(0).to_pylist():
                    add(row, text)
                    row += 1
                rows_read += batch.num_rows
                bytes_read += wc.stats.bytes - before
                if report is not None:
                    report.update(rows_read, bytes_read)
        except (OSError, pa.ArrowException) as exc:
            if not ignore_corrupt:  # the driver turns this into one line naming the file
                raise RuntimeError(f"{UNREADABLE} {s.path} :: {_first_line(exc)}") from None
            unreadable.add(s.file_index)  # what was read is kept, as Spark does
    if report is not None:
        report.finish(rows_read, bytes_read)
    yield from _partial_batches([(wc, 0, w) for w, wc in counters.items()],
                                {f"skipped_file:{i}": 1 for i in unreadable})


# where special tokens are found: tables without this key cut them after normalization and
# lowercasing, which differs when those make or unmake a special-token string
SPECIAL_TOKENS_CUT = "before normalization"

PARTIAL_ARROW_SCHEMA = pa.schema([("kind", pa.int8()), ("word", pa.binary()),
                                  ("count", pa.int64()), ("file", pa.int32()),
                                  ("block", pa.int64()), ("row", pa.int64()),
                                  ("rank", pa.int32())])


def _arrow_ipc(batches: Iterable[pa.RecordBatch], schema: pa.Schema = PARTIAL_ARROW_SCHEMA
               ) -> bytes:
    """Record batches as one Arrow IPC stream (bytes the JVM passes through untouched)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return sink.getvalue().to_pybytes()


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
                schema=pa.schema(
                    [("word", pa.binary(), False), ("count", pa.int64(), False),
                     ("first_seen", pa.int64(), False)]
                ),
            )
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
    if layout is not None:  # pack (file, row, rank): order-preserving, no global sort needed
        table = words.select(
            "word", "count",
            (F.shiftleft(F.col("first.file").cast("long"), layout.row_bits + layout.rank_bits)
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
    ids = pc.dictionary_encode(words.column("word").combine_chunks())  # one dictionary
    word_id = ids.indices.to_numpy(zero_copy_only=False)
    n = len(ids.dictionary)
    totals = np.zeros(n, dtype=np.int64)  # exact int64 sums (np.bincount goes through float64)
    np.add.at(totals, word_id, words.column("count").to_numpy())
    file = words.column("file").to_numpy().astype(np.int64)
    row = words.column("row").to_numpy()
    rank = words.column("rank").to_numpy().astype(np.int64)
    if layout is not None:  # the packed key preserves (file, row, rank) order: its minimum
        key = (file << (layout.row_bits + layout.rank_bits)) | (row << layout.rank_bits) | rank
        first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, word_id, key)
    else:  # each word's row with the smallest (file, block, row, rank)
        block = words.column("block").to_numpy()
        by_key = np.lexsort((rank, row, block, file))
        _, first_at = np.unique(word_id[by_key], return_index=True)
        rep = by_key[first_at]
        first = np.stack([file[rep], block[rep], row[rep], rank[rep]])
    return ids.dictionary.cast(pa.binary()), totals, first


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
        schema=pa.schema([pa.field(f.name, pa.binary() if f.name == "word" else pa.int64(),
                                   nullable=False) for f in WORD_TABLE_SCHEMA.fields]),
    )
    return table.sort_by("first_seen"), stats


def table_digest(table: pa.Table) -> str:
    """A content digest of a word table: the XOR over rows of
    ``crc32(word) << 32 ^ count ^ first_seen << 16`` (64-bit), and the row count. The same
    value comes from Spark with :func:`spark_table_digest` (tests hold them equal)."""
    words = table.column("word").to_pylist()
    crc = np.fromiter(map(zlib.crc32, words), dtype=np.uint64, count=len(words))
    h = ((crc << np.uint64(32)) ^ table.column("count").to_numpy().astype(np.uint64)
         ^ (table.column("first_seen").to_numpy().astype(np.uint64) << np.uint64(16)))
    return format_digest(int(np.bitwise_xor.reduce(h)) if len(h) else 0, len(words))


def spark_table_digest() -> tuple[Column, Column]:
    """The aggregate columns of :func:`table_digest` for a word-table DataFrame: (xor, rows);
    format them with :func:`format_digest`."""
    h = (F.shiftleft(F.crc32("word"), 32).bitwiseXOR(F.col("count"))
         .bitwiseXOR(F.shiftleft(F.col("first_seen"), 16)))
    return F.bit_xor(h), F.count(F.lit(1))


def format_digest(xor: int | None, rows: int) -> str:
    return f"c{(int(xor or 0)) & (2**64 - 1):016x}-{int(rows)}"


def _write_table(spark: SparkSession, table: pa.Table, path: str) -> None:
    """Write a word table made on the driver: directly when local, through Spark otherwise."""
    if fsutil.is_local(path):
        local = fsutil.local_path(path)
        os.makedirs(local, exist_ok=True)
        pq.write_table(table, os.path.join(local, "part-00000.parquet"))
    else:
        spark.createDataFrame(table).write.parquet(path)


def iter_arrow(df: DataFrame) -> Iterator[pa.RecordBatch]:
    """``df``'s rows on the driver as Arrow batches, brought over one partition at a time: the
    driver JVM holds one partition's rows at once, never the whole table (``toArrow`` and
    ``collect`` gather every partition in the JVM heap first, which is what ran a 1 GB default
    driver out of memory on a 6 M-word table)."""

    def to_ipc(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            if b.num_rows:
                yield pa.RecordBatch.from_arrays([pa.array([_arrow_ipc([b], b.schema)],
                                                           pa.binary())], ["ipc"])

    for row in df.mapInArrow(to_ipc, "ipc binary").toLocalIterator(prefetchPartitions=True):
        yield from pa.ipc.open_stream(row["ipc"])


def collect_arrow(df: DataFrame) -> pa.Table:
    """``df`` on the driver as one Arrow table (:func:`iter_arrow`)."""
    batches = list(iter_arrow(df))
    return pa.Table.from_batches(batches) if batches else df.limit(0).toArrow()


def read_word_table(spark: SparkSession, wt: WordTable,
                    columns: Sequence[str] = ("word", "count", "first_seen")) -> pa.Table:
    """The word table's rows on the driver, sorted by first_seen: read with pyarrow when it is
    on a local filesystem (no JVM involved), else through Spark a partition at a time."""
    if fsutil.is_local(wt.data_path):
        local = fsutil.local_path(wt.data_path)
        files = sorted(os.path.join(local, f) for f in os.listdir(local)
                       if f.endswith(".parquet") and not f.startswith((".", "_")))
        table = pa.concat_tables([pq.read_table(f, columns=list(columns)) for f in files]) \
            if files else collect_arrow(spark.read.parquet(wt.data_path).select(*columns))
    else:
        table = collect_arrow(spark.read.parquet(wt.data_path).select(*columns))
    return table.sort_by("first_seen") if "first_seen" in columns else table


@dataclass
class WordTable:
    """A word table on disk: ``<dir>/data`` (Parquet) + ``word_table.json`` + ``stats.json``.

    ``table``: the same rows in memory (sorted by first_seen) when the count was merged on the
    driver in this process, so training need not read them back through Spark."""

    path: str
    meta: dict
    table: pa.Table | None = None

    @property
    def data_path(self) -> str:
        return fsutil.join(self.path, "data")


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


@dataclass
class Corpus:
    """What the count reads, in corpus order: the sources in the order given (``input``
    split at commas, or the one table or DataFrame), the files of each source by path.
    ``keys[i]`` is file i's (source index, path); ``weights[i]`` its source's weight."""

    files: list[str]
    keys: list[tuple[int, str]]
    weights: list[int]
    df: DataFrame | None = None  # Spark's reader: (text, source, path, block, row)
    footers: dict[str, pq.FileMetaData] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def _source_weights(cfg: Config, n: int) -> list[int]:
    return list(cfg.input_weights) if cfg.input_weights else [1] * n


def list_local_sources(cfg: Config, footers: dict[str, pq.FileMetaData],
                       skipped: list[str] | None) -> Corpus | None:
    """The corpus listed without the JVM: local Parquet sources only (else None)."""
    if cfg.count_reader == "spark" or cfg.input_format != "parquet" or cfg.input_table:
        return None
    weights = _source_weights(cfg, len(cfg.inputs))
    corpus = Corpus([], [], [], footers=footers, skipped=skipped or [])
    for i, source in enumerate(cfg.inputs):
        files = list_local_corpus(source, cfg.text_column, footers, skipped)
        if files is None:
            return None
        corpus.files += files
        corpus.keys += [(i, f) for f in files]
        corpus.weights += [weights[i]] * len(files)
    return corpus


def read_sources(spark: SparkSession, cfg: Config, frame: DataFrame | None = None) -> Corpus:
    """The corpus through Spark's readers (any format, a catalog table, or a DataFrame)."""
    if cfg.ignore_corrupt_files:
        spark.conf.set("spark.sql.files.ignoreCorruptFiles", "true")
    if frame is not None:
        names = ["a DataFrame"]
    else:
        names = [cfg.input_table] if cfg.input_table else cfg.inputs
    weights = _source_weights(cfg, len(names))
    corpus = Corpus([], [], [])
    frames = []
    for i, name in enumerate(names):
        df, files, block, row = _read_source(spark, cfg, name, frame)
        frames.append(df.select(F.col(cfg.text_column).alias("text"),
                                F.lit(i).cast("int").alias("source"),
                                (F.col("_metadata.file_path") if frame is None and files != [name]
                                 else F.lit(name)).alias("path"),
                                block.cast("long").alias("block"),
                                row.cast("long").alias("row")))
        corpus.files += files
        corpus.keys += [(i, normalize_path(f)) for f in files]
        corpus.weights += [weights[i]] * len(files)
    corpus.df = functools.reduce(DataFrame.unionByName, frames)
    return corpus


def _read_source(spark: SparkSession, cfg: Config, name: str, frame: DataFrame | None
                 ) -> tuple[DataFrame, list[str], Column, Column]:
    """One source: its DataFrame, its files in path order, and the columns that order its
    rows: (block, row) = (0, row index in the file) for Parquet; (split start, None: numbered
    in the task) for other file formats; (Spark partition, None) for a DataFrame or a table
    without files."""
    what = "config key 'input_table'" if cfg.input_table else "config key 'input'"
    try:
        if frame is not None:
            df = frame
        elif cfg.input_table:
            df = spark.table(name)
        elif cfg.input_format == "csv":
            df = spark.read.option("header", True).option("multiLine", True).csv(name)
        elif cfg.input_format == "text":
            df = spark.read.text(name).withColumnRenamed("value", cfg.text_column)
        else:
            df = spark.read.format(cfg.input_format).load(name)
    except AnalysisException as exc:
        msg = _first_line(exc)
        if "PATH_NOT_FOUND" in msg or "does not exist" in msg:
            raise ConfigError(f"{what}: path does not exist: {name}") from None
        if "DATA_SOURCE_NOT_FOUND" in msg or "Failed to find data source" in msg:
            raise ConfigError(f"config key 'input_format': Spark has no {cfg.input_format!r} "
                              "reader here (delta needs the delta-spark package: spark-submit "
                              "--packages io.delta:delta-spark_2.13:<version>)") from None
        if "TABLE_OR_VIEW_NOT_FOUND" in msg:
            raise ConfigError(f"{what}: no table {name!r} in the catalog") from None
        raise ConfigError(f"{what}: cannot read {name}: {msg}") from None
    except Exception as exc:  # noqa: BLE001 - py4j errors for unreadable files
        named = unreadable_file_error(exc)
        if named is not None:
            raise named from None
        raise ConfigError(f"{what}: cannot read {name}: {_first_line(exc)}") from None
    _check_text_column(df, cfg.text_column, name)
    files = [] if frame is not None else sorted({normalize_path(f) for f in df.inputFiles()})
    if frame is not None or not files:  # no files to order by: Spark's partitions, in order
        if frame is None and cfg.input_table:
            raise ConfigError(f"{what}: table {name!r} has no files (empty, or not a file "
                              "table); read it into a DataFrame and use pipeline.api")
        return df, [name], F.spark_partition_id(), F.lit(None)
    parquet = cfg.input_format == "parquet" and not cfg.input_table
    if not parquet:
        try:  # a catalog table stored as Parquet still has row indices
            df.select("_metadata.row_index").schema  # noqa: B018 - resolves the column
            parquet = True
        except AnalysisException:
            parquet = False
    if parquet:
        return df, files, F.lit(0), F.col("_metadata.row_index")
    return df, files, F.col("_metadata.file_block_start"), F.lit(None)


def _check_text_column(df: DataFrame, text_column: str, name: str) -> None:
    if text_column not in df.columns:
        raise ConfigError(
            f"config key 'text_column': column {text_column!r} not in {name} "
            f"(columns: {', '.join(df.columns)})"
        )
    dtype = df.schema[text_column].dataType
    if not isinstance(dtype, (T.StringType, T.BinaryType)):
        raise ConfigError(
            f"config key 'text_column': column {text_column!r} is {dtype.simpleString()}, "
            "not string or binary"
        )


def _arrow_plan(spark: SparkSession, cfg: Config, files: list[str],
                footers: dict[str, pq.FileMetaData] | None = None
                ) -> list[list[ReadSlice]] | None:
    """The tasks of the Arrow reader, or None to let Spark's Parquet scan feed the tasks.

    ``count_reader = auto`` reads local files with pyarrow inside the tasks: the JVM then only
    schedules them, instead of decoding Parquet and converting rows to Arrow (work a fresh JVM
    does slowly until its JIT has warmed up). Other filesystems go through Spark."""
    if cfg.count_reader == "spark":
        return None
    local = all(fsutil.is_local(f) for f in files)
    if not local:
        if cfg.count_reader == "arrow":
            raise ConfigError("config key 'count_reader' = 'arrow' reads local files only; "
                              f"{cfg.input} is not local: use 'auto' or 'spark'")
        return None
    tasks = cfg.num_partitions or 2 * spark.sparkContext.defaultParallelism
    plan = plan_slices(files, cfg.text_column, tasks, footers)
    if plan is None and cfg.count_reader == "arrow":
        raise ConfigError(f"config key 'count_reader' = 'arrow': some files under {cfg.input} "
                          f"have no top-level column {cfg.text_column!r}; use 'spark'")
    return plan


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
                    blob = _arrow_ipc([b])
                    task_bytes += len(blob)
                    yield blob
            size.add((task_bytes, task_bytes))

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
                frame: DataFrame | None = None) -> WordTable:
    """Run the word-count stage and write the word table to ``cfg.output`` atomically, with
    heartbeats while it runs (rows and bytes the tasks have read, see
    :class:`pipeline.spark_session.TaskCounts`; tasks done from Spark's status tracker). ``frame``:
    count this DataFrame's ``text_column`` instead of ``cfg.input`` (corpus order: its
    partitions in order, rows in partition order)."""
    t0 = time.time()
    progress = progress or Progress("count_words", every=cfg.heartbeat_seconds,
                                    bar=cfg.progress_bar)
    sc = spark.sparkContext
    counts = TaskCounts.create(sc)
    try:
        with job_group(sc, "count") as group, progress.stage(
                "count", unit="tasks", poll=read_progress(sc, group, counts)) as stage:
            wt = _count(spark, cfg, cfg.pretokenizer_spec(), t0, counts, frame)
            counts.phase = ""
            st = wt.meta["stats"]
            stage.update(note=f"{st['unique_words']:,} distinct words, {st['words']:,} words")
    finally:
        counts.close()
    return wt


def _count(spark: SparkSession, cfg: Config, spec: PretokenizerSpec, t0: float,
           counts: TaskCounts, frame: DataFrame | None = None) -> WordTable:
    footers: dict[str, pq.FileMetaData] = {}
    skipped: list[str] | None = [] if cfg.ignore_corrupt_files else None
    corpus = None if frame is not None else list_local_sources(cfg, footers, skipped)
    plan = None if corpus is None else _arrow_plan(spark, cfg, corpus.files, footers)
    warming = None
    if plan is None:  # Spark's reader: start the Python workers while Spark plans the scan
        start_session(spark)
        warming = _warm_workers(spark, spec)
        corpus = read_sources(spark, cfg, frame)
        if frame is None and cfg.input_format == "parquet" and not cfg.input_table:
            plan = _arrow_plan(spark, cfg, corpus.files)  # listed by Spark, read by pyarrow
    assert corpus is not None
    try:
        fingerprint = input_fingerprint(spark, corpus.files, footers) if frame is None \
            else {"files": 0, "bytes": 0, "digest": "a DataFrame: never reused"}
        return _count_and_write(spark, cfg, spec, t0, corpus, plan, fingerprint,
                                skipped or [], counts)
    except Exception as exc:
        named = unreadable_file_error(exc)
        if named is None:
            raise
        raise named from None
    finally:
        if warming is not None:
            warming.join()


def unreadable_file_error(exc: BaseException, can_skip: bool = True) -> ConfigError | None:
    """A read (count, encode) that failed on a corrupt input file, as one line naming the
    file (exit 2); None for any other failure."""
    text = str(exc)
    m = re.search(re.escape(UNREADABLE) + r" (.+?) :: ([^\n]*)", text)
    if m:
        return corrupt_file_error(m.group(1), m.group(2).strip(), can_skip)
    m = re.search(r"FAILED_READ_FILE\.?(\w*)\][^\n]*?reading file (\S+?)\.?(?:\s|$)", text)
    if m:
        cause = (re.search(r"\S+ (is not a Parquet file[^\n]*)", text)
                 or re.search(r"Caused by: java\.[\w.$]+: ([^\n]+)", text))
        why = cause.group(1) if cause else m.group(1).replace("_", " ").lower()
        return corrupt_file_error(m.group(2), why.strip(), can_skip)
    return None


def list_input(spark: SparkSession, cfg: Config) -> tuple[list[str], dict[str, pq.FileMetaData]]:
    """The input's files in corpus order, listed as the count lists them (without the JVM for
    local Parquet), and the Parquet footers read on the way."""
    footers: dict[str, pq.FileMetaData] = {}
    corpus = list_local_sources(cfg, footers, [] if cfg.ignore_corrupt_files else None)
    if corpus is None:
        start_session(spark)
        corpus = read_sources(spark, cfg)
    return corpus.files, footers


def input_fingerprint(spark: SparkSession, files: list[str],
                      footers: dict[str, pq.FileMetaData] | None = None) -> dict:
    """What the count read, summarised: every file's path, size and modification time (and,
    for local files, its Parquet footer's row count). Two listings with the same digest are the
    same input as far as anything short of reading every byte can tell; a shard added, removed,
    rewritten or touched changes it."""
    statuses = _file_statuses(spark, files)
    entries = []
    for f, (size, mtime) in zip(files, statuses):
        rows = None
        if fsutil.is_local(f):
            meta = (footers or {}).get(f)
            with contextlib.suppress(Exception):  # an unreadable footer: size and time only
                meta = meta or pq.ParquetFile(fsutil.local_path(f)).metadata
            rows = None if meta is None else meta.num_rows
        entries.append(f"{f}\t{size}\t{mtime}\t{'' if rows is None else rows}")
    return {
        "files": len(files),
        "bytes": sum(size for size, _ in statuses),
        "digest": hashlib.sha256("\n".join(entries).encode()).hexdigest()[:32],
    }


def _file_statuses(spark: SparkSession, files: list[str]) -> list[tuple[int, int]]:
    """(size in bytes, modification time) of each file: os.stat for local files; for others
    one Hadoop listing per parent directory (an object store answers a listing with the
    sizes and times of all its keys, instead of one request per file)."""
    out: dict[str, tuple[int, int]] = {}
    remote: dict[str, list[str]] = {}
    for f in files:
        if fsutil.is_local(f):
            st = os.stat(fsutil.local_path(f))
            out[f] = (st.st_size, st.st_mtime_ns)
        else:
            remote.setdefault(f.rsplit("/", 1)[0], []).append(f)
    for parent, members in remote.items():
        fs, p = fsutil._fs(spark, parent)
        listed = {normalize_path(s.getPath().toString()): (int(s.getLen()),
                                                           int(s.getModificationTime()))
                  for s in fs.listStatus(p)}
        for f in members:
            out[f] = listed.get(f, (-1, -1))
    return [out[f] for f in files]


def describe_input_change(old: dict | None, new: dict) -> str:
    """Why a word table's input fingerprint does not match (one clause for a log line)."""
    if not old:
        return "the word table was counted without an input fingerprint (an older spark-bpe)"
    return (f"the input changed since the word table was counted ({old.get('files')} files, "
            f"{old.get('bytes')} bytes then; {new['files']} files, {new['bytes']} bytes now)")


def _count_and_write(spark: SparkSession, cfg: Config, spec: PretokenizerSpec, t0: float,
                     corpus: Corpus, plan: list[list[ReadSlice]] | None, fingerprint: dict,
                     skipped: list[str], counts: TaskCounts) -> WordTable:
    tmp = fsutil.staging_dir(spark, cfg.output, "word_table.json")
    try:
        return _count_into(spark, cfg, spec, t0, corpus, plan, fingerprint, skipped, tmp,
                           counts)
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
                        "instead (set count_merge = spark)", _first_line(exc))
            counts.phase = "merging the partial counts (spark)"
        else:
            merged, stats = merge_partials(collected, n_files)
            del collected
            t_count = time.time()
            log.info("merged the partial counts on the driver in %.1f s", t_count - t_counted)
            _write_table(spark, merged, fsutil.join(tmp, "data"))
            return merged, stats, merged.num_rows, t_count
    stats, unique_words, t_count = _merge_with_spark(partials.as_frame(), n_files, tmp,
                                                     t_counted)
    return None, stats, unique_words, t_count


def _count_into(spark: SparkSession, cfg: Config, spec: PretokenizerSpec, t0: float,
                corpus: Corpus, plan: list[list[ReadSlice]] | None, fingerprint: dict,
                skipped: list[str], tmp: str, counts: TaskCounts) -> WordTable:
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
    stats["skipped_files"] = _skipped_files(stats, files, skipped, plan is None,
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
    meta = {
        "format": "spark-bpe word table",
        "version": WORD_TABLE_VERSION,
        "input": cfg.input,
        "input_format": cfg.input_format,
        "input_table": cfg.input_table,
        "input_weights": list(cfg.input_weights),
        "input_fingerprint": fingerprint,
        "text_column": cfg.text_column,
        "files": len(files),
        "pretokenizer": {
            "pattern": spec.pattern,
            "special_tokens": list(spec.special_tokens),
            "lowercase": spec.lowercase,
            "normalization": spec.normalization,
        },
        "max_word_bytes": cfg.max_word_bytes,
        "special_tokens_cut": SPECIAL_TOKENS_CUT,
        "unique_words": stats["unique_words"],
        "stats": {k: stats[k] for k in ("rows", "words", "bytes", "unique_words")},
        "left_out": {**{k: stats.get(k, 0) for k in ("long_words", "long_word_bytes",
                                                      "rows_with_long_words")},
                     "unreadable_files": stats["skipped_files"]},
    }
    if merged is not None:
        meta["digest"] = table_digest(merged)
    fsutil.write_text(spark, fsutil.join(tmp, "stats.json"), json.dumps(stats, indent=2))
    fsutil.write_text(spark, fsutil.join(tmp, "word_table.json"), json.dumps(meta, indent=2))
    fsutil.write_text(spark, fsutil.join(tmp, "config.json"), cfg.to_json())
    fsutil.replace_dir(spark, tmp, cfg.output)
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


def open_word_table(spark: SparkSession, path: str) -> WordTable:
    """Open a word table written by :func:`count_words`, checking its version."""
    meta_path = fsutil.join(path, "word_table.json")
    if not fsutil.exists(spark, meta_path):
        raise ConfigError(
            f"config key 'words': {path} is not a word table (no word_table.json); "
            "make one with jobs/count_words.py"
        )
    try:
        meta = json.loads(fsutil.read_text(spark, meta_path))
    except ValueError:
        raise ConfigError(
            f"config key 'words': {meta_path} is corrupt; recreate the table with "
            "jobs/count_words.py"
        ) from None
    if (meta.get("format") != "spark-bpe word table"
            or meta.get("version") not in READABLE_VERSIONS):
        raise ConfigError(
            f"config key 'words': {path} has format {meta.get('format')!r} version "
            f"{meta.get('version')!r}; this build reads versions {READABLE_VERSIONS}. "
            "Recreate it with jobs/count_words.py"
        )
    meta.setdefault("max_word_bytes", 0)  # v1 tables were counted without a cap
    return WordTable(path, meta)
