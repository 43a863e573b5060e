"""Merge rounds on Spark: the working set is an RDD of blocks, one per range partition of the
word table (by ``first_seen``). Each round broadcasts the batch, rewrites only the words that
contain a merged pair, and tree-aggregates the per-pair reports back to the driver. Initial
pair counts are aggregated with ``reduceByKey``. Lineage is cut every few rounds.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from pipeline import fsutil
from pipeline.engines.block import (
    NO_POS,
    Block,
    Report,
    apply_round,
    combine_reports,
    initial_report,
    min_positions,
    replay_block,
)

log = logging.getLogger(__name__)

_ARRAYS = ("tok", "sp", "lengths", "counts", "first_seen")


def _pack(blk: Block) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: getattr(blk, k) for k in _ARRAYS})
    return buf.getvalue()


def _unpack(data: bytes) -> Block:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return Block(*(z[k] for k in _ARRAYS))


def symbols_of(words: pa.Array, char_ids: dict[str, int] | None, suffix_id: int | None
               ) -> tuple[np.ndarray, np.ndarray]:
    """Initial symbols of a binary Arrow array of words: (flat ids, lengths)."""
    words = words.combine_chunks() if isinstance(words, pa.ChunkedArray) else words
    if char_ids is None:
        offsets = np.frombuffer(words.buffers()[1], dtype=np.int32)[
            words.offset : words.offset + len(words) + 1
        ]
        data = np.frombuffer(words.buffers()[2], dtype=np.uint8)
        flat = data[offsets[0] : offsets[-1]].astype(np.int32)
        return flat, np.diff(offsets).astype(np.int64)
    seqs = []
    for w in words.to_pylist():
        s = [char_ids[ch] for ch in w.decode("utf-8", "surrogateescape")]
        if suffix_id is not None:
            s.append(suffix_id)
        seqs.append(s)
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    flat = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(lengths.sum()))
    return flat, lengths


class SparkBlocks:
    """The working set as a cached RDD of (partition id, Block)."""

    def __init__(self, spark: SparkSession, words: DataFrame, num_partitions: int,
                 char_ids: dict[str, int] | None, suffix_id: int | None,
                 lineage_every_rounds: int = 25, rdd_checkpoint_dir: str | None = None,
                 replay: list[tuple[int, int, int]] | None = None):
        """``rdd_checkpoint_dir``: where lineage cuts are written on a cluster (a directory
        every executor and the driver can reach: HDFS, S3A, or a shared/local path when all
        executors run on one machine). Without it, or in ``local[...]`` mode where there is
        no executor to lose, lineage is cut with ``localCheckpoint`` (in executor storage)."""
        self.spark = spark
        self.sc = spark.sparkContext
        self.lineage_every = lineage_every_rounds
        self.rounds = 0
        self._ckpt_root: str | None = None
        self.reliable = bool(rdd_checkpoint_dir) and not is_local_master(self.sc.master)
        if self.reliable:
            self.sc.setCheckpointDir(rdd_checkpoint_dir)
            self._ckpt_root = self.sc.getCheckpointDir()
        ids_bc = self.sc.broadcast((char_ids, suffix_id))

        def build(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            from pyspark import TaskContext

            batches = [b for b in batches if b.num_rows]
            if not batches:
                return
            table = pa.Table.from_batches(batches)
            table = table.sort_by("first_seen")
            cids, sid = ids_bc.value
            flat, lengths = symbols_of(table.column("word"), cids, sid)
            blk = Block.from_symbols(flat, lengths, table.column("count").to_numpy(),
                                     table.column("first_seen").to_numpy())
            if len(blk.lengths) == 0:
                return
            yield pa.RecordBatch.from_pydict(
                {"pid": pa.array([TaskContext.get().partitionId()], pa.int32()),
                 "blob": pa.array([_pack(blk)], pa.binary())}
            )

        parts = num_partitions or self.sc.defaultParallelism
        packed = words.select("word", "count", "first_seen").repartitionByRange(
            parts, "first_seen").mapInArrow(
            build, "pid int, blob binary"
        )
        raw = packed.rdd.map(lambda r: (r["pid"], _unpack(r["blob"]))).persist(
            StorageLevel.MEMORY_AND_DISK)
        sizes = dict(raw.map(lambda r: (r[0], len(r[1].lengths))).collect())
        # first_seen is any order-preserving int64 (e.g. packed file/row/rank); blocks use the
        # dense rank instead, so a position (first_seen << POS_BITS | offset) fits in 64 bits
        self._parts, self._starts, offsets, acc = [], [], {}, 0
        for p in sorted(sizes):  # range partitions: ids ascend with first_seen
            offsets[p] = acc
            self._parts.append(p)
            self._starts.append(acc)
            acc += sizes[p]
        off_bc = self.sc.broadcast(offsets)
        state = raw.map(lambda r: (r[0], r[1].renumbered(off_bc.value[r[0]])))
        if replay:  # resume: replay the checkpointed merges in one pass
            replay_bc = self.sc.broadcast(replay)
            state = state.map(lambda r: (r[0], replay_block(r[1], replay_bc.value)))
        self.state = state.persist(StorageLevel.MEMORY_AND_DISK)
        self._raw = raw  # dropped once the state is materialized (initial_counts)
        self._previous: list = []
        self._round_bcs: list = []  # broadcasts of the rounds since the last lineage cut

    def partitions(self) -> tuple[list[int], list[int]]:
        return list(self._parts), list(self._starts)

    def initial_counts(self) -> Report:
        """Pair counts and smallest positions, aggregated with reduceByKey."""

        def pairs_of(rec):
            pid, blk = rec
            r = initial_report(blk, pid)
            yield (-1 - pid, (r.tokens, len(blk.lengths), 0))  # one size entry per partition
            yield from zip(r.keys.tolist(), zip(r.deltas.tolist(), r.part.tolist(),
                                                r.min_pos.tolist()))

        def combine(x, y):  # counts add up; the lowest partition's smallest position wins
            return (x[0] + y[0], *min(x[1:], y[1:]))

        rows = self.state.flatMap(pairs_of).reduceByKey(combine).collect()
        self._raw.unpersist(blocking=False)
        sizes = [v for k, v in rows if k < 0]
        rows = sorted((k, v) for k, v in rows if k >= 0)
        keys = np.array([k for k, _ in rows], dtype=np.int64)
        vals = np.array([v for _, v in rows], dtype=np.int64).reshape(-1, 3)
        return Report(keys, vals[:, 0], vals[:, 1].astype(np.int32), vals[:, 2],
                      np.zeros(0, dtype=np.int64), sum(s[0] for s in sizes),
                      sum(s[1] for s in sizes))

    def run_round(self, batch: list[tuple[int, int, int]]) -> Report:
        bc = self.sc.broadcast(batch)
        out = self.state.map(lambda rec: (rec[0], *apply_round(rec[1], bc.value, rec[0])))
        out = out.persist(StorageLevel.MEMORY_AND_DISK)
        rep = out.map(lambda x: x[2]).treeReduce(combine_reports)
        # the next state is derived from the cached output; cut lineage every few rounds.
        # Until the cut, a lost executor's blocks are recomputed through this round's map, so
        # its broadcast must stay alive: a Python worker that already saw it keeps reading the
        # executor's file of it, which unpersist deletes (FileNotFoundError on recompute).
        self._round_bcs.append(bc)
        state = out.map(lambda x: (x[0], x[1]))
        self.rounds += 1
        if self.rounds % self.lineage_every == 0:
            state = state.persist(StorageLevel.MEMORY_AND_DISK)
            if self.reliable:  # written to the checkpoint dir: survives executor loss
                state.checkpoint()
            else:  # local mode: executor storage (there is no executor to lose on its own)
                state.localCheckpoint()
            state.count()
            self._drop_previous()
            out.unpersist(blocking=False)
            self._drop_broadcasts()
        else:
            self._previous.append(out)
            if len(self._previous) > 2:
                self._previous.pop(0).unpersist(blocking=False)
        old = self.state
        self.state = state
        if old.is_cached and old is not state:
            old.unpersist(blocking=False)
        return rep

    def _drop_broadcasts(self) -> None:
        for b in self._round_bcs:
            b.unpersist(blocking=False)
        self._round_bcs.clear()

    def _drop_previous(self) -> None:
        for r in self._previous:
            r.unpersist(blocking=False)
        self._previous.clear()

    def min_positions(self, keys: np.ndarray) -> Report:
        bc = self.sc.broadcast(keys)
        rep = self.state.map(lambda rec: min_positions(rec[1], bc.value, rec[0])).treeReduce(
            combine_reports
        )
        bc.unpersist(blocking=False)
        return rep

    def collect(self) -> list[Block]:
        recs = self.state.collect()
        order = {p: i for i, p in enumerate(self._parts)}
        return [b for _, b in sorted(recs, key=lambda x: order.get(x[0], len(order)))
                if len(b.lengths)]

    def close(self) -> None:
        self._drop_previous()
        self._drop_broadcasts()
        self.state.unpersist(blocking=False)
        if self._ckpt_root:  # this run's RDD checkpoints (setCheckpointDir made a fresh subdir)
            try:
                fsutil.delete(self.spark, self._ckpt_root)
            except Exception as exc:  # leftover files are harmless; never fail the run on it
                log.warning("could not remove RDD checkpoints %s: %s", self._ckpt_root, exc)
            self._ckpt_root = None


def is_local_master(master: str) -> bool:
    """``local``/``local[N]``: driver and executor are one process, so no executor can be lost
    on its own (``local-cluster[...]`` has separate executor JVMs and is not local here)."""
    return master == "local" or master.startswith("local[")


__all__ = ["SparkBlocks", "symbols_of", "is_local_master", "NO_POS"]
