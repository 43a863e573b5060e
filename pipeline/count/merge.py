"""Merging the count tasks' partial counts into the word table: counts summed, the smallest
first key kept per word and packed into ``first_seen`` (or ranked), on the driver (numpy,
one hash bucket at a time) or with a Spark aggregation; the same table either way
(docs/DESIGN.md section 1)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline import fsutil
from pipeline.count.partials import (
    KIND_STAT,
    KIND_WORD,
    PARTIAL_ARROW_SCHEMA,
    SPLIT_LAST_ROW,
    SPLIT_ROWS,
    BucketedPartials,
)
from pipeline.count.word_table import (
    WORD_TABLE_ARROW_SCHEMA,
    WORD_TABLE_SCHEMA,
    first_in_order,
    sum_duplicates,
)
from pipeline.order import CORPUS_KEY, FirstSeenLayout, corpus_order
from pipeline.spark_session import file_reader

log = logging.getLogger(__name__)


class SplitOffsets:
    """Where each (file, split) of Spark's reader starts in its file: the rows of the file's
    earlier splits. Such a reader's tasks number rows within their split (a split is read in
    order by one task, and only its start is known), so ``offset + row`` is the row's index
    in its file, whatever the splitting: the same (file, row, rank) key as Parquet's row
    indices, packed with the same :class:`FirstSeenLayout`, without a global sort."""

    def __init__(self, rows: dict[tuple[int, int], int]):
        keys = sorted(rows)
        self.files = np.array([f for f, _ in keys], dtype=np.int64)
        self.blocks = np.array([b for _, b in keys], dtype=np.int64)
        counts = np.array([rows[k] for k in keys], dtype=np.int64)
        ends = np.cumsum(counts)
        firsts = np.flatnonzero(np.r_[True, self.files[1:] != self.files[:-1]])
        # rows before each split in the whole listing, less those before its file's first
        before = ends - counts
        self.offsets = before - np.repeat(before[firsts], np.diff(np.r_[firsts, len(keys)]))
        self._block_values = np.unique(self.blocks)
        self._keys = self._key(self.files, self.blocks)  # ascending: keys are sorted

    def _key(self, files: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """(file, block) as one int64 that sorts the same: file, then the block's rank among
        the splits' blocks (-1 for a block no split has)."""
        values = self._block_values
        at = np.minimum(np.searchsorted(values, blocks), max(len(values) - 1, 0))
        known = values[at] == blocks if len(values) else np.zeros(len(blocks), dtype=bool)
        return np.where(known, files * len(values) + at, -1)

    def of(self, files: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """The offset of each row's split (numpy arrays of the rows' file and block)."""
        if not len(files):
            return np.zeros(0, dtype=np.int64)
        keys = self._key(files.astype(np.int64), blocks.astype(np.int64))
        at = np.minimum(np.searchsorted(self._keys, keys), max(len(self._keys) - 1, 0))
        if not len(self._keys) or np.any((keys < 0) | (self._keys[at] != keys)):
            raise RuntimeError("a split's words came without its row count (internal error)")
        return self.offsets[at]

    def frame(self, spark) -> DataFrame:
        """(s_file, s_block, s_offset) as a small DataFrame, to join on."""
        return spark.createDataFrame(
            list(zip(self.files.tolist(), self.blocks.tolist(), self.offsets.tolist())),
            "s_file int, s_block long, s_offset long")


def _dense_rank(sorted_df: DataFrame, held: list[Callable[[], None]] | None = None
                ) -> DataFrame:
    """Add ``first_seen`` = 0, 1, 2, ... in the (already globally sorted) row order.

    The sorted frame is cached first so both passes see the same partitions (adaptive
    execution may otherwise cut the sort output differently in each job). ``held``: given
    what releases the cache and the broadcast once the table is written."""
    spark = sorted_df.sparkSession
    sorted_df = sorted_df.persist()

    def sizes(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:

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
    if held is not None:
        held += [lambda: sorted_df.unpersist(blocking=False), lambda: bc.destroy(blocking=False)]

    def number(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:

        i = bc.value[TaskContext.get().partitionId()]
        for b in batches:
            n = b.num_rows
            yield pa.RecordBatch.from_arrays(
                [b.column(0), b.column(1), pa.array(range(i, i + n), pa.int64())],
                schema=WORD_TABLE_ARROW_SCHEMA)
            i += n

    return sorted_df.mapInArrow(number, WORD_TABLE_SCHEMA)


def merge_with_spark(partial: DataFrame, side: list[pa.RecordBatch], n_files: int, tmp: str,
                     t0: float) -> tuple[dict[str, int], int, float]:
    """Sum counts and keep the smallest first key per word with a Spark aggregation, and write
    the word table under ``tmp``; returns (statistics, distinct words, time done). ``side``:
    the statistics rows of the partial counts (:meth:`Partials.side`), which give the totals,
    the files a task could not read to the end (their rows are left out) and the first_seen
    layout before the words are aggregated: each row's first key is packed into one int64
    first, as :func:`merge_partials` does, so that Spark aggregates with a hash map (the
    minimum of a struct would make it sort every partial row: merging and writing the 1 GB
    corpus's 784 MB of partial counts took 77-80 s that way, 29-34 s this way, BENCHMARKS.md)."""
    stats = _side_stats(side)
    drop = skipped_file_indices(stats)
    layout, splits = _layout(stats, n_files, drop)
    held: list[Callable[[], None]] = []  # (dense ranks: a cached frame and a broadcast)
    table = spark_word_table(partial, layout, splits, drop, held)
    path = fsutil.spark_path(fsutil.join(tmp, "data"))
    try:
        table.write.parquet(path)
    finally:
        for release in held:
            release()
    unique_words = file_reader(table.sparkSession).parquet(path).count()  # (the footers)
    t_done = time.monotonic()
    log.info("merged the partial counts with Spark and wrote them in %.1f s", t_done - t0)
    return stats, unique_words, t_done


def spark_word_table(partial: DataFrame, layout: FirstSeenLayout | None,
                     splits: SplitOffsets | None, drop: list[int],
                     held: list[Callable[[], None]] | None = None) -> DataFrame:
    """The word table (``WORD_TABLE_SCHEMA``) of the partial counts' word rows, those of the
    files in ``drop`` left out: keys packed with ``layout`` before the aggregation (a hash
    aggregation), or dense ranks of the struct of the first key when there is no layout."""
    words = partial.filter(F.col("kind") == KIND_WORD)
    if drop:
        words = words.filter(~F.col("file").isin(drop))
    if layout is not None:  # layout.pack in SQL: order-preserving, no global sort needed
        row = F.col("row")
        if splits is not None:  # rows numbered within splits: add the split's offset
            words = words.join(F.broadcast(splits.frame(words.sparkSession)),
                               (F.col("file") == F.col("s_file"))
                               & (F.col("block") == F.col("s_block")))
            row = row + F.col("s_offset")
        packed = layout.pack_by(F.col("file").cast("long"), row, F.col("rank").cast("long"),
                                F.shiftleft, Column.bitwiseOR)
        return (words.select("word", "count", packed.alias("first_seen")).groupBy("word")
                .agg(F.sum("count").alias("count"), F.min("first_seen").alias("first_seen")))
    # too many files/rows for 63 bits: dense ranks of the first occurrence
    first = (words.groupBy("word")
             .agg(F.sum("count").alias("count"),
                  F.min(F.struct(*CORPUS_KEY)).alias("first")))
    return _dense_rank(first.orderBy("first").select("word", "count"), held)


def _layout(stats: dict[str, int], n_files: int, drop: Iterable[int] = ()
            ) -> tuple[FirstSeenLayout | None, SplitOffsets | None]:
    """The packing of first keys, and the splits' offsets when rows were numbered within
    file splits (Spark's reader on formats other than Parquet); pops the maxima and the
    splits' statistics from ``stats``. The layout is None (dense ranks) when it needs more
    than 63 bits. ``drop``: files left out (their splits do not widen the layout)."""
    max_row, max_rank = stats.pop("max_row", 0), stats.pop("max_rank", 0)
    rows: dict[tuple[int, int], int] = {}
    last: dict[tuple[int, int], int] = {}
    for name in [k for k in stats if k.startswith((SPLIT_ROWS, SPLIT_LAST_ROW))]:
        kind, file, block = name.rsplit(":", 2)
        (rows if f"{kind}:" == SPLIT_ROWS else last)[int(file), int(block)] = stats.pop(name)
    if not stats.pop("max_block", 0):  # rows numbered within their files
        return FirstSeenLayout.fit(n_files, max_row, max_rank), None
    if not rows:  # (no split statistics: dense ranks of (file, block, row, rank))
        return None, None
    splits = SplitOffsets(rows)
    offset = dict(zip(zip(splits.files.tolist(), splits.blocks.tolist()),
                      splits.offsets.tolist()))
    dropped = set(drop)
    max_row = max((offset[k] + r for k, r in last.items() if k[0] not in dropped), default=0)
    layout = FirstSeenLayout.fit(n_files, max_row, max_rank)
    return layout, (splits if layout is not None else None)


def _side_stats(side: list[pa.RecordBatch]) -> dict[str, int]:
    """The tasks' statistics, summed or maximal, without those of the files a task could not
    read to the end (``partial_batches`` gives them under the file's index)."""
    rows = [(kind, bytes(name).decode(), value, file) for b in side
            for kind, name, value, file in zip(*(b.column(i).to_pylist() for i in range(4)))]
    drop = set(skipped_file_indices({name: 1 for _, name, _, _ in rows}))
    stats: dict[str, int] = {}
    for kind, key, value, file in rows:
        if file in drop:
            continue
        if kind == KIND_STAT:  # summed over tasks
            stats[key] = stats.get(key, 0) + value
        else:  # KIND_MAX: the largest over tasks
            stats[key] = max(stats.get(key, 0), value)
    return stats


def skipped_file_indices(stats: dict[str, int]) -> list[int]:
    """The files a task could not read to the end (``ignore_corrupt_files``): every word row
    of theirs is left out of the merge, also what other tasks read of them, so that the word
    table does not depend on how the files were cut into tasks (with ignore_corrupt_files the
    tasks count each file apart, so a word row belongs to one file)."""
    return sorted(int(k.split(":", 1)[1]) for k in stats if k.startswith("skipped_file:"))


def _merge_bucket(batches: list[pa.RecordBatch], layout: FirstSeenLayout | None,
                  drop: list[int] | None = None, splits: SplitOffsets | None = None
                  ) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """One bucket's distinct words, their summed counts and their first keys: packed
    (``layout``; rows numbered within their split moved by ``splits``) or, for dense ranks,
    the (file, block, row, rank) columns stacked. ``drop``: file indices whose rows are left
    out."""
    words = pa.Table.from_batches(batches, schema=PARTIAL_ARROW_SCHEMA)
    if drop:
        keep = ~np.isin(words.column("file").to_numpy(), np.asarray(drop, dtype=np.int32))
        words = words.filter(pa.array(keep))
    distinct, word_id, totals = sum_duplicates(words.column("word").combine_chunks(),
                                               words.column("count").to_numpy())
    n = len(distinct)
    file = words.column("file").to_numpy().astype(np.int64)
    row = words.column("row").to_numpy()
    rank = words.column("rank").to_numpy().astype(np.int64)
    if layout is not None:  # the packed key preserves (file, row, rank) order: its minimum
        if splits is not None:
            row = row + splits.of(file, words.column("block").to_numpy())
        key = layout.pack(file, row, rank)
        first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, word_id, key)
    else:  # each word's row with the smallest (file, block, row, rank)
        block = words.column("block").to_numpy()
        by_key = corpus_order(file, block, row, rank)
        rep = by_key[first_in_order(word_id, by_key)]
        first = np.stack([file[rep], block[rep], row[rep], rank[rep]])
    return distinct, totals, first


def merge_partials(partial: pa.Table | BucketedPartials, n_files: int
                   ) -> tuple[pa.Table, dict[str, int]]:
    """The driver-side merge of the tasks' partial output (``PARTIAL_SCHEMA``), one hash
    bucket at a time: the word table (same rows as :func:`merge_with_spark` writes, sorted by
    first_seen) and the statistics."""
    if isinstance(partial, pa.Table):
        partial = BucketedPartials.of(partial.to_batches(), 1)
    stats = _side_stats(partial.side)
    drop = skipped_file_indices(stats)
    layout, splits = _layout(stats, n_files, drop)
    words, totals, firsts = [], [], []
    while partial.buckets:
        w, t, f = _merge_bucket(partial.buckets.pop(), layout, drop, splits)
        words.append(w)
        totals.append(t)
        firsts.append(f)
    if layout is not None:
        first_seen = np.concatenate(firsts) if firsts else np.zeros(0, dtype=np.int64)
    else:  # dense ranks of the first keys
        file, block, row, rank = np.concatenate(firsts, axis=1) if firsts \
            else np.zeros((4, 0), dtype=np.int64)
        first_seen = np.empty(len(file), dtype=np.int64)
        first_seen[corpus_order(file, block, row, rank)] = np.arange(len(file), dtype=np.int64)
    table = pa.Table.from_arrays(
        [pa.chunked_array(words, pa.binary()),
         pa.array(np.concatenate(totals) if totals else np.zeros(0, np.int64), pa.int64()),
         pa.array(first_seen, pa.int64())],
        schema=WORD_TABLE_ARROW_SCHEMA,
    )
    return table.sort_by("first_seen"), stats

