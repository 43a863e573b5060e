"""Merge rounds on Spark: each partition of the working set is a :class:`FlatMergeState`
kept in the scratch directory of the executor that built it (``engines/partition.py``).

- The word table is range-partitioned by ``first_seen`` and cut into Arrow chunks of about
  ``CHUNK_BYTES`` of rows (a chunk closes once it reaches that size, so it passes it by at most
  one slice of rows, itself sized to about ``CHUNK_BYTES``), persisted on disk: the recovery
  path.
- A *holder* task per partition builds the partition's state from its chunks, on the
  executor that runs it, and leaves a one-row record in Spark's cache. Later tasks over the
  holders run where those records are (Spark's locality), open the state there and ship only
  what a round changed. Nothing of the working set crosses between the JVM and Python after
  the build, and a round costs the occurrences it merges plus one Spark job.
- Initial pair counts are aggregated with ``reduceByKey``; each round's batch goes out in the
  task closure and the count deltas come back through ``treeReduce``.
- An executor lost with its states: Spark recomputes the lost holders from the chunks, and the
  next task replays the merges the state missed from the merge history, which each round ships
  (as a broadcast renewed every ``HISTORY_EVERY`` rounds, and the merges since). A state that a
  killed task left half-changed is reported as lost; the driver then rebuilds every unusable
  partition from its chunks and runs the round again.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from pipeline.bpe import BaseVocab
from pipeline.count.word_table import arrow_ipc
from pipeline.engines.deltas import PairDeltas, combine, combine_entry
from pipeline.engines.local import initial_symbols
from pipeline.engines.partition import (
    Batch,
    PartitionLost,
    PartitionStore,
    current_pairs,
    min_positions,
)

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 << 20  # word bytes per chunk record
HANDOFF_TOKENS = 1 << 20  # tokens per record of the hand-off to the driver (about 4-6 MB)
HISTORY_EVERY = 25  # rounds between broadcasts of the whole merge history


def _chunker(chunk_bytes: int):
    """Rows of one range partition (sorted by first_seen) -> Arrow IPC chunks of about
    ``chunk_bytes`` of rows (words, counts and first_seen) each."""
    return lambda batches: _chunk_partition(batches, chunk_bytes)


def _chunk_partition(batches: Iterator[pa.RecordBatch], chunk_bytes: int
                     ) -> Iterator[pa.RecordBatch]:
    rows: list[pa.RecordBatch] = []
    size = 0

    def flush() -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"blob": pa.array([arrow_ipc(rows, rows[0].schema)],
                                                            pa.binary())})

    for batch in batches:
        step = max(1, min(8192, batch.num_rows * chunk_bytes // max(batch.nbytes, 1)))
        for start in range(0, batch.num_rows, step):
            piece = batch.slice(start, step)
            rows.append(piece)
            size += piece.nbytes
            if size >= chunk_bytes:
                yield flush()
                rows, size = [], 0
    if rows:
        yield flush()


def _read_chunks(blobs: Iterator[bytes]) -> pa.Table | None:
    batches = [b for blob in blobs for b in pa.ipc.open_stream(blob)]
    return pa.Table.from_batches(batches) if batches else None


def cut_words(flat: np.ndarray, lengths: np.ndarray, counts: np.ndarray, per: int
              ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Words (flat tokens, tokens per word, counts) in consecutive pieces of at most ``per``
    tokens each (a longer word alone); none for no words."""
    ends = np.cumsum(lengths)
    w = 0
    while w < len(lengths):
        start = int(ends[w - 1]) if w else 0
        stop = max(w + 1, int(np.searchsorted(ends, start + per, side="right")))
        yield flat[start:int(ends[stop - 1])], lengths[w:stop], counts[w:stop]
        w = stop


def gather(rdd) -> list:
    """An RDD's elements on the driver one partition at a time (the next one fetched while
    this one is unpickled): the driver JVM holds one partition's results at once, where
    ``collect`` holds all of them (a 1 GB default driver heap is far smaller than the
    driver's Python memory the hand-off is sized by)."""
    return list(rdd.toLocalIterator(prefetchPartitions=True))


class SparkPartitions:
    """The working set as partition states on the executors (see the module docstring)."""

    def __init__(self, spark: SparkSession, words: DataFrame, num_partitions: int,
                 base: BaseVocab,
                 replay: list[tuple[int, int]] | None = None, chunk_bytes: int = CHUNK_BYTES):
        self.sc = spark.sparkContext
        self.run = uuid.uuid4().hex[:12]
        self.base_size = base.size
        self.history = np.asarray(replay or [], dtype=np.int64).reshape(-1, 2)
        self.gen = len(self.history)
        self.rounds = 0
        self.rebuilds = 0
        self.chunk_count = 0
        self._base = self.sc.broadcast(base)
        self._built = self.sc.accumulator(0)  # partition states built from chunks, all told
        parts = num_partitions or self.sc.defaultParallelism
        chunks = (words.select("word", "count", "first_seen")
                  .repartitionByRange(parts, "first_seen").sortWithinPartitions("first_seen")
                  .mapInArrow(_chunker(chunk_bytes), "blob binary"))
        self.chunks = chunks.rdd.map(lambda r: bytes(r[0])).persist(StorageLevel.DISK_ONLY)
        self._hist_bc = self.sc.broadcast(self.history)
        self._hist_at = self.gen  # merges in the history broadcast
        # the broadcast the holders were built with (a holder Spark computes again reads it)
        self._holders_bc = self._hist_bc
        self._old_bcs: list = []
        built = False
        try:
            self.chunk_count = self.chunks.count()
            built = True  # (from here on, tasks may have left states)
            self.holders = self._build_holders(self._hist_bc)
            sizes = dict(self.holders.collect())
        except BaseException:  # (a failed task, a full disk, a SIGTERM) the states built so
            if built:  # far go: nothing else would remove them
                self._wait_for_tasks_to_end()
                self._remove_states(self.chunks)
            self.chunks.unpersist(blocking=False)
            for b in (self._hist_bc, self._base):
                b.destroy(blocking=False)
            raise
        self._sizes = sizes
        self.handoff_tokens = HANDOFF_TOKENS
        self.parts = sorted(sizes)
        self.offsets: dict[int, int] = {}
        acc = 0
        for p in self.parts:  # range partitions: ids ascend with first_seen
            self.offsets[p] = acc
            acc += sizes[p]

    def _wait_for_tasks_to_end(self, timeout: float = 15.0) -> None:
        """After a failed job, until Spark has stopped its other tasks (a task still building
        a state would write it after the states are removed), at most ``timeout`` seconds;
        then as long as a killed task's Python worker may still run before Spark kills it
        (``spark.python.task.killTimeout``: the JVM reports the task killed at once)."""
        tracker = self.sc.statusTracker()
        end = time.monotonic() + timeout
        while time.monotonic() < end and any(
                (info := tracker.getStageInfo(s)) is not None and info.numActiveTasks
                for s in tracker.getActiveStageIds()):
            time.sleep(0.2)
        kill = self.sc.getConf().get("spark.python.task.killTimeout", "2s").strip().lower()
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|m|min)?", kill)
        seconds = 2.0 if m is None else float(m.group(1)) * {
            "ms": 0.001, "m": 60, "min": 60}.get(m.group(2) or "s", 1)
        time.sleep(min(seconds, timeout) + 0.5)

    def _remove_states(self, rdd) -> None:
        """Remove this run's partition states: one task per partition of ``rdd``, a cached RDD
        whose blocks are where the states were built (the holders; or, when building them
        failed, the chunks they were built from, which are not computed again)."""
        run = self.run

        def remove(index: int, recs: Iterator) -> Iterator[int]:
            PartitionStore(run, index).remove()
            yield index

        try:
            rdd.mapPartitionsWithIndex(remove).count()
        except Exception as exc:  # noqa: BLE001 - leftovers go with the application's dirs
            log.warning("could not remove the partition states: %s", str(exc).splitlines()[0])

    # -- holders -------------------------------------------------------------------------------
    def _build_holders(self, hist_bc):
        run, base, vocab_bc, built = self.run, self.base_size, self._base, self._built

        def build(index: int, blobs: Iterator[bytes]) -> Iterator[tuple[int, int]]:
            store = PartitionStore(run, index)
            history = hist_bc.value
            meta = store.read_meta()
            if meta and not meta.get("dirty"):  # still here (a recomputed holder): keep it
                for _ in blobs:
                    pass
                yield index, int(meta["scalars"]["n"])
                return
            table = _read_chunks(blobs)
            if table is None:
                return
            flat, lengths = initial_symbols(vocab_bc.value, table.column("word"))
            st = store.build(flat, lengths, table.column("count").to_numpy(), base, history)
            built.add(1)
            yield index, st.n

        holders = self.chunks.mapPartitionsWithIndex(build).persist(StorageLevel.MEMORY_ONLY)
        holders.count()
        return holders

    @property
    def states_built(self) -> int:
        """Partition states built from the chunks so far: one per partition, and one more for
        each state rebuilt (a lost executor's, recomputed by Spark or by :meth:`_rebuild`)."""
        return int(self._built.value)

    def _history_fn(self):
        """What a task needs to replay missed merges: the broadcast plus the merges since."""
        bc, tail = self._hist_bc, self.history[self._hist_at:].copy()
        return lambda: np.concatenate([bc.value, tail]) if len(tail) else bc.value

    def _renew_history(self) -> None:
        self._old_bcs.append(self._hist_bc)
        self._hist_bc = self.sc.broadcast(self.history)
        self._hist_at = len(self.history)

    def _drop_old_histories(self) -> None:
        """Destroy the history broadcasts no task reads any more (all but the holders' and
        the current one): ``unpersist`` would leave each one's file in the driver's temp
        directory until the context stops, 16 bytes per merge each, renewed every
        ``HISTORY_EVERY`` rounds (hundreds of MB over a long run, kept by a notebook's
        session from run to run)."""
        keep = [b for b in self._old_bcs if b is self._holders_bc]
        for b in self._old_bcs:
            if b is not self._holders_bc:
                b.destroy(blocking=False)
        self._old_bcs = keep

    def _rebuild(self) -> None:
        """Rebuild every partition whose state is missing or half-changed, from its chunks,
        with the whole history replayed (after a task reported :class:`PartitionLost`)."""
        self.rebuilds += 1
        log.warning("rebuilding lost partition states from the word table (%d merges to "
                    "replay)", self.gen)
        self._renew_history()
        old = self.holders
        self.holders = self._build_holders(self._hist_bc)
        self._holders_bc = self._hist_bc
        old.unpersist(blocking=False)

    def _job(self, fn):
        """Run ``fn(store, index)`` on every non-empty partition, rebuilding once if a state
        was lost; returns the reports combined."""
        run = self.run

        def task(index: int, recs: Iterator) -> Iterator:
            if sum(1 for _ in recs):
                yield fn(PartitionStore(run, index), index)

        def job():
            rdd = self.holders.mapPartitionsWithIndex(task)
            return rdd.treeReduce(combine)

        return self._rebuilding(job)

    def _rebuilding(self, job):
        """``job()``, after rebuilding the lost partitions if it reports one (at most twice)."""
        for attempt in range(3):
            try:
                return job()
            except Exception as exc:  # noqa: BLE001 - py4j wraps the task's exception
                if PartitionLost.MARK not in str(exc) or attempt == 2:
                    raise
                self._wait_for_tasks_to_end()  # (the failed job's other tasks end first)
                self._rebuild()
        raise AssertionError("unreachable")

    # -- the PartitionSet protocol (engines/rounds.py) --------------------------------------------
    def partitions(self) -> tuple[list[int], list[int]]:
        return list(self.parts), [self.offsets[p] for p in self.parts]

    def initial_counts(self, min_count: int = 1) -> PairDeltas:
        """Pair counts and smallest positions, aggregated with reduceByKey; the pairs counted
        fewer than ``min_count`` times stay on the executors (most of the distinct pairs,
        about 240 bytes each on the driver, which the hand-off's estimate leaves out)."""
        gen, offsets, history = self.gen, self.offsets, self._history_fn()
        run = self.run

        def pairs_of(index: int, recs: Iterator) -> Iterator:
            if not sum(1 for _ in recs):
                return
            st = PartitionStore(run, index).at_gen(gen, history)
            r = current_pairs(st, index, offsets[index])
            yield (-1 - index, (r.tokens, 0, 0))  # one size entry per partition
            yield from zip(r.keys.tolist(), zip(r.deltas.tolist(), r.part.tolist(),
                                                r.min_pos.tolist()))

        def by_pair():  # self.holders: the rebuilt ones after a loss
            return (self.holders.mapPartitionsWithIndex(pairs_of).reduceByKey(combine_entry)
                    .filter(lambda kv: kv[0] < 0 or kv[1][0] >= min_count))

        rows = self._rebuilding(lambda: gather(by_pair()))
        tokens = sum(v[0] for k, v in rows if k < 0)
        rows = sorted((k, v) for k, v in rows if k >= 0)
        keys = np.array([k for k, _ in rows], dtype=np.int64)
        vals = np.array([v for _, v in rows], dtype=np.int64).reshape(-1, 3)
        return PairDeltas(keys, vals[:, 0], vals[:, 1].astype(np.int32), vals[:, 2],
                          np.zeros(0, dtype=np.int64), tokens)

    def run_round(self, batch: Batch) -> PairDeltas:
        if self.rounds and self.rounds % HISTORY_EVERY == 0:
            self._renew_history()
            self._drop_old_histories()
        round_no, gen, offsets = self.rounds, self.gen, self.offsets
        history, plan = self._history_fn(), list(batch)
        rep = self._job(lambda store, i: store.run_round(round_no, gen, plan, offsets[i],
                                                         history))
        self.history = np.concatenate([self.history,
                                       np.array([(a, b) for a, b, _ in plan], np.int64)
                                       .reshape(-1, 2)])
        self.gen += len(plan)
        self.rounds += 1
        return rep

    def min_positions(self, keys: np.ndarray) -> PairDeltas:
        gen, offsets, history = self.gen, self.offsets, self._history_fn()
        return self._job(lambda store, i: min_positions(store.at_gen(gen, history), keys, i,
                                                        offsets[i]))

    def collect(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The current words with two or more tokens, in corpus order, as pieces of at most
        ``handoff_tokens`` tokens (a word longer than that is a piece of its own): (flat
        tokens, tokens per word, counts). The pieces are spread over as many Spark partitions
        as it takes to hold about one each, so the driver JVM holds a piece or two at a time
        (fetching a holder partition whole would put its share of the working set, hundreds
        of MB on a large table, in the driver's heap at once)."""
        gen, history, run, per = self.gen, self._history_fn(), self.run, self.handoff_tokens
        # piece k of partition p goes to Spark partition first_piece[p] + k: distinct numbers
        # (a partition of n tokens has at most n // per + 1 pieces), under spread
        first_piece = {p: self.offsets[p] // per + i for i, p in enumerate(self.parts)}
        spread = self._symbols() // per + len(self.parts) + 1

        def pieces(index: int, recs: Iterator) -> Iterator:
            if not sum(1 for _ in recs):
                return
            flat, lengths, counts = PartitionStore(run, index).at_gen(gen, history).words()
            for k, piece in enumerate(cut_words(flat, lengths, counts, per)):
                yield (index, k), piece

        def job() -> list:
            rdd = self.holders.mapPartitionsWithIndex(pieces).partitionBy(
                spread, lambda key: (first_piece[key[0]] + key[1]) % spread)
            return gather(rdd)

        out = sorted(self._rebuilding(job), key=lambda kv: kv[0])
        log.info("handing the working set to the driver: %d words, %d tokens, in %d pieces",
                 sum(len(p[1]) for _, p in out), sum(len(p[0]) for _, p in out), len(out))
        return [piece for _, piece in out]

    def _symbols(self) -> int:
        """Tokens of all partitions when they were built (an upper bound of today's)."""
        last = self.parts[-1] if self.parts else None
        return 0 if last is None else self.offsets[last] + self._sizes[last]

    def close(self) -> None:
        """Remove the partition states and drop what Spark cached for them."""
        self._remove_states(self.holders)
        self.holders.unpersist(blocking=False)
        self.chunks.unpersist(blocking=False)
        for b in {id(b): b for b in [*self._old_bcs, self._hist_bc, self._base]}.values():
            b.destroy(blocking=False)


__all__ = ["SparkPartitions", "CHUNK_BYTES"]
