"""The merge-round loop (pure Python): plan a batch on the driver, run it on the blocks, apply
the reports. ``BlockSet`` is the seam between this loop and where the blocks live: Spark
partitions (``engines.spark.SparkBlocks``) or a list in this process (``InProcessBlocks``, used
by the property tests so thousands of random cases need no JVM).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pipeline.bpe import Merge
from pipeline.engines.block import Block, Report, apply_round, combine_reports, initial_report
from pipeline.engines.block import min_positions as block_min_positions
from pipeline.engines.planner import PairBook

log = logging.getLogger(__name__)


class BlockSet(Protocol):
    def partitions(self) -> tuple[list[int], list[int]]:
        """(partition ids, first first_seen of each), non-empty partitions, ascending."""

    def initial_counts(self) -> Report: ...

    def run_round(self, batch: list[tuple[int, int, int]]) -> Report: ...

    def min_positions(self, keys: np.ndarray) -> Report: ...

    def collect(self) -> list[Block]: ...


@dataclass
class InProcessBlocks:
    blocks: list[Block]  # ascending first_seen ranges, none empty

    def partitions(self) -> tuple[list[int], list[int]]:
        return list(range(len(self.blocks))), [int(b.first_seen[0]) for b in self.blocks]

    def initial_counts(self) -> Report:
        return _reduce([initial_report(b, p) for p, b in enumerate(self.blocks)])

    def run_round(self, batch: list[tuple[int, int, int]]) -> Report:
        reps = []
        for p, b in enumerate(self.blocks):
            self.blocks[p], r = apply_round(b, batch, p)
            reps.append(r)
        return _reduce(reps)

    def min_positions(self, keys: np.ndarray) -> Report:
        return _reduce([block_min_positions(b, keys, p) for p, b in enumerate(self.blocks)])

    def collect(self) -> list[Block]:
        return list(self.blocks)


def _reduce(reports: Sequence[Report]) -> Report:
    out = reports[0]
    for r in reports[1:]:
        out = combine_reports(out, r)
    return out


@dataclass
class RoundStats:
    rounds: int = 0
    merges_per_round: list[int] = field(default_factory=list)
    seconds_per_round: list[float] = field(default_factory=list)
    working_set_tokens: list[int] = field(default_factory=list)
    working_set_words: list[int] = field(default_factory=list)
    refresh_jobs: int = 0


@dataclass
class RoundResult:
    merges: list[Merge]
    removed: list[int]  # corpus tokens removed by each merge
    stats: RoundStats
    finished: bool  # no pair qualifies any more (as opposed to: stopped to hand off)


def run_rounds(
    blocks: BlockSet,
    token_len: list[int],
    target_merges: int,
    min_pair_count: int,
    max_token_bytes: int | None,
    max_batch: int,
    stop_when: Callable[[int], bool] = lambda tokens: False,
    on_round: Callable[[list[Merge], list[int], RoundStats], None] | None = None,
) -> RoundResult:
    """Make up to ``target_merges`` merges, stopping early when no pair qualifies or when
    ``stop_when`` (given the working-set size in tokens) says to hand the rest to the driver.
    New ids continue after ``token_len`` (the lengths of the tokens that exist already)."""
    part_ids, starts = blocks.partitions()
    book = PairBook(part_ids, starts, token_len, max_token_bytes)
    init = blocks.initial_counts()
    book.apply(init)
    stats = RoundStats()
    merges: list[Merge] = []
    removed: list[int] = []
    tokens = init.tokens
    finished = False
    while len(merges) < target_merges:
        if stop_when(tokens):
            break
        t0 = time.time()
        batch = book.select_batch(max_batch, target_merges - len(merges), min_pair_count,
                                  blocks.min_positions)
        if not batch:
            finished = True
            break
        first_id = len(token_len) - len(batch)
        plan = [(a, b, first_id + i) for i, (a, b, _) in enumerate(batch)]
        rep = blocks.run_round(plan)
        book.apply(rep)
        new = [Merge(a, b, first_id + i, c) for i, (a, b, c) in enumerate(batch)]
        new_removed = [int(x) for x in rep.removed]
        merges.extend(new)
        removed.extend(new_removed)
        tokens = rep.tokens
        stats.rounds += 1
        stats.merges_per_round.append(len(batch))
        stats.seconds_per_round.append(time.time() - t0)
        stats.working_set_tokens.append(rep.tokens)
        stats.working_set_words.append(rep.words)
        stats.refresh_jobs = book.refreshes
        if on_round is not None:
            on_round(new, new_removed, stats)
    return RoundResult(merges, removed, stats, finished)
