"""Merging the count tasks' partial counts into the word table: counts summed, the smallest
first key kept per word and packed into ``first_seen`` (or ranked), on the driver (numpy,
one hash bucket at a time) or with a Spark aggregation; the same table either way
(docs/DESIGN.md section 1)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline import fsutil
from pipeline.count.partials import (
    KIND_STAT,
    KIND_WORD,
    PARTIAL_ARROW_SCHEMA,
    BucketedPartials,
)
from pipeline.count.word_table import (
    WORD_TABLE_ARROW_SCHEMA,
    WORD_TABLE_SCHEMA,
    first_in_order,
    sum_duplicates,
)
from pipeline.order import FirstSeenLayout

log = logging.getLogger(__name__)

def _dense_rank(sorted_df: DataFrame) -> DataFrame:
    """Add ``first_seen`` = 0, 1, 2, ... in the (already globally sorted) row order.

    The sorted frame is cached first so both passes see the same partitions (adaptive
    execution may otherwise cut the sort output differently in each job)."""
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

    def number(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:

        i = bc.value[TaskContext.get().partitionId()]
        for b in batches:
            n = b.num_rows
            yield pa.RecordBatch.from_arrays(
                [b.column(0), b.column(1), pa.array(range(i, i + n), pa.int64())],
                schema=WORD_TABLE_ARROW_SCHEMA)
            i += n

    return sorted_df.mapInArrow(number, WORD_TABLE_SCHEMA)


def merge_with_spark(partial: DataFrame, n_files: int, tmp: str, t0: float,
                      ignore_corrupt: bool = False) -> tuple[dict[str, int], int, float]:
    """Sum counts and keep the smallest first key per word with a Spark aggregation, and write
    the word table under ``tmp``; returns (statistics, distinct words, time counted).
    ``ignore_corrupt``: first look for files a task could not read to the end (one more pass
    over the partial counts, which are small next to the corpus), and leave their rows out."""
    if ignore_corrupt:
        marks = partial.filter((F.col("kind") == KIND_STAT)
                               & F.col("word").cast("string").startswith("skipped_file:"))
        drop = skipped_file_indices({bytes(r["word"]).decode(): 1 for r in marks.collect()})
        if drop:
            partial = partial.filter(~F.col("file").isin(drop))  # words and statistics
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
                  drop: list[int] | None = None) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """One bucket's distinct words, their summed counts and their first keys: packed
    (``layout``) or, for dense ranks, the (file, block, row, rank) columns stacked. ``drop``:
    file indices whose rows are left out."""
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
    """The driver-side merge of the tasks' partial output (``PARTIAL_SCHEMA``), one hash
    bucket at a time: the word table (same rows as :func:`merge_with_spark` writes, sorted by
    first_seen) and the statistics."""
    if isinstance(partial, pa.Table):
        partial = BucketedPartials.of(partial.to_batches(), 1)
    stats = _side_stats(partial.side)
    layout = _layout(stats, n_files)
    drop = skipped_file_indices(stats)
    words, totals, firsts = [], [], []
    while partial.buckets:
        w, t, f = _merge_bucket(partial.buckets.pop(), layout, drop)
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

