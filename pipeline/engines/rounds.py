"""The merge-round loop (pure Python): plan a batch on the driver, run it on the partitions,
apply the reports. ``PartitionSet`` is the seam between this loop and where the partitions
live: on Spark executors (``engines.spark.SparkPartitions``) or in this process
(``InProcessPartitions``, used by the property tests so thousands of random cases need no JVM).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pipeline.bpe import Merge
from pipeline.engines.deltas import PairDeltas, combine_all
from pipeline.engines.local import FlatMergeState
from pipeline.engines.partition import (
    Batch,
    apply_batch,
    catch_up,
    current_pairs,
    min_positions,
)
from pipeline.engines.planner import PairBook

log = logging.getLogger(__name__)

Words = tuple[np.ndarray, np.ndarray, np.ndarray]  # (flat tokens, tokens per word, counts)


class PartitionSet(Protocol):
    def partitions(self) -> tuple[list[int], list[int]]:
        """(partition ids, global position of each one's first symbol), non-empty partitions,
        ascending."""

    def initial_counts(self, min_count: int = 1) -> PairDeltas:
        """Every pair's count and smallest position (at least those counted ``min_count``
        times or more: a pair below it is never merged, and only a merge that makes one of
        its tokens adds occurrences of a pair, so it never reaches ``min_count`` later)."""

    def run_round(self, batch: Batch) -> PairDeltas: ...

    def min_positions(self, keys: np.ndarray) -> PairDeltas: ...

    def collect(self) -> list[Words]: ...


class InProcessPartitions:
    """Partitions as states in this process: ``words`` split into ``parts`` consecutive ranges
    (the words in first-seen order, as initial symbols), each with ``replay`` applied."""

    def __init__(self, words: list[Words], base_size: int,
                 replay: list[tuple[int, int]] | None = None):
        self.states: list[FlatMergeState] = []
        self.offsets: list[int] = []
        at = 0
        for flat, lengths, counts in words:
            if len(lengths) == 0:
                continue
            st = FlatMergeState.build(flat, lengths, counts, base_size)
            history = np.array(replay or [], dtype=np.int64).reshape(-1, 2)
            catch_up(st, history, 0, len(history))
            self.states.append(st)
            self.offsets.append(at)
            at += st.n

    def partitions(self) -> tuple[list[int], list[int]]:
        return list(range(len(self.states))), list(self.offsets)

    def initial_counts(self, min_count: int = 1) -> PairDeltas:
        return combine_all([current_pairs(s, p, o) for p, (s, o)
                            in enumerate(zip(self.states, self.offsets))])

    def run_round(self, batch: Batch) -> PairDeltas:
        return combine_all([apply_batch(s, batch, p, o) for p, (s, o)
                            in enumerate(zip(self.states, self.offsets))], len(batch))

    def min_positions(self, keys: np.ndarray) -> PairDeltas:
        return combine_all([min_positions(s, keys, p, o) for p, (s, o)
                            in enumerate(zip(self.states, self.offsets))])

    def collect(self) -> list[Words]:
        return [w for w in (s.words() for s in self.states) if len(w[1])]


@dataclass
class RoundStats:
    rounds: int = 0
    merges_per_round: list[int] = field(default_factory=list)
    seconds_per_round: list[float] = field(default_factory=list)
    job_seconds: list[float] = field(default_factory=list)  # the round's Spark job, wall
    work_seconds: list[float] = field(default_factory=list)  # its slowest partition's work
    working_set_tokens: list[int] = field(default_factory=list)
    refresh_jobs: int = 0


@dataclass
class RoundResult:
    merges: list[Merge]
    removed: list[int]  # corpus tokens removed by each merge
    stats: RoundStats
    finished: bool  # no pair qualifies any more (as opposed to: stopped to hand off)


def run_rounds(
    parts: PartitionSet,
    token_len: list[int],
    target_merges: int,
    min_pair_count: int,
    max_token_bytes: int | None,
    max_batch: int,
    stop_when: Callable[[int], bool] = lambda tokens: False,
    on_round: Callable[[list[Merge], list[int], RoundStats], None] | None = None,
) -> RoundResult:
    """Make up to ``target_merges`` merges, stopping early when no pair qualifies or when
    ``stop_when`` (given the working set's size in tokens) says to hand the rest to the
    driver. New ids continue after ``token_len`` (the lengths of the tokens that exist)."""
    part_ids, starts = parts.partitions()
    book = PairBook(part_ids, starts, token_len, max_token_bytes, min_pair_count)
    init = parts.initial_counts(book.min_count)
    book.apply(init)
    stats = RoundStats()
    merges: list[Merge] = []
    removed: list[int] = []
    tokens = init.tokens
    finished = False
    while len(merges) < target_merges:
        if stop_when(tokens):
            break
        t0 = time.monotonic()
        batch = book.select_batch(max_batch, target_merges - len(merges), min_pair_count,
                                  parts.min_positions)
        if not batch:
            finished = True
            break
        plan = [(m.left, m.right, m.new_id) for m in batch]
        t_job = time.monotonic()
        rep = parts.run_round(plan)
        stats.job_seconds.append(time.monotonic() - t_job)
        stats.work_seconds.append(rep.work)
        book.apply(rep)
        new = batch
        new_removed = [int(x) for x in rep.removed]
        merges.extend(new)
        removed.extend(new_removed)
        tokens = rep.tokens
        stats.rounds += 1
        stats.merges_per_round.append(len(batch))
        stats.seconds_per_round.append(time.monotonic() - t0)
        stats.working_set_tokens.append(rep.tokens)
        stats.refresh_jobs = book.refreshes
        if on_round is not None:
            on_round(new, new_removed, stats)
    return RoundResult(merges, removed, stats, finished)
