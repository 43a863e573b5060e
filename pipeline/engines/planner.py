"""The driver's side of distributed merge rounds (pure Python, no Spark).

Holds the exact pair counts, a tie key per pair (its smallest position in corpus order, exact
or a lower bound), and picks each round's batch of merges: best-first, accepting the next
candidate ``(a, b)`` with count ``c`` only while it is not touched by an accepted merge ``m_i``
(``b`` is no ``m_i``'s left token, ``a`` no ``m_i``'s right token) and
``c > max_i min(c_i, largest pre-round count of the pairs m_i touches)``, and stopping after an
``(a, a)`` merge (docs/DESIGN.md section 3, where the bound is argued). Those merges are
exactly the ones the sequential trainer would make next.

Words are range-partitioned by ``first_seen`` and positions are global (the words of all
partitions end to end), so a pair's smallest position lies in the lowest partition that has
it. Each round every partition reports, for the pairs whose count changed there, its smallest
position left; the report of the lowest partition wins. A key only becomes
inexact when a pair vanishes from the partition that held its smallest position; such a key is
refreshed only when it reaches the top of the heap, where it may decide a tie: one Spark job
for the inexact entries of its count up to the first exact one.

A pair is kept only while its count reaches ``min_pair_count``: after the round that creates
it, a pair only loses occurrences, so one below the floor can never be merged, and leaving it
out never changes a batch (a candidate must beat the touched pairs' counts, and it is at least
the floor itself). Most pairs of a real corpus are that rare.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable, Sequence

import numpy as np

from pipeline.bpe import Merge
from pipeline.engines.deltas import PairDeltas
from pipeline.order import NO_POSITION, heap_entry, unpack_entry, unpack_pair

Refresh = Callable[[np.ndarray], PairDeltas]


class PairBook:
    def __init__(
        self,
        part_ids: Sequence[int],
        part_starts: Sequence[int],
        token_len: list[int],
        max_token_bytes: int | None = None,
        min_pair_count: int = 1,
    ):
        self.part_ids = list(part_ids)  # non-empty partitions, ascending first_seen
        self.part_start = [int(s) for s in part_starts]  # global position of each one's start
        self.min_count = max(min_pair_count, 1)
        self.token_len = token_len
        self.max_token_bytes = max_token_bytes
        self.counts: dict[int, int] = {}
        self.pos: dict[int, int] = {}
        self.inexact: set[int] = set()
        self.by_left: dict[int, set[int]] = {}
        self.by_right: dict[int, set[int]] = {}
        self.heap: list[tuple[int, int, int]] = []
        self.refreshes = 0

    # -- partitions ----------------------------------------------------------------------------
    def _slot_of(self, pos: int) -> int:
        return max(bisect_right(self.part_start, pos) - 1, 0)

    def _after_slot(self, slot: int) -> int:
        return self.part_start[slot + 1] if slot + 1 < len(self.part_start) else NO_POSITION

    # -- applying reports ------------------------------------------------------------------------
    def apply(self, rep: PairDeltas) -> None:
        counts, pos, inexact, floor = self.counts, self.pos, self.inexact, self.min_count
        slot_of_part = {p: i for i, p in enumerate(self.part_ids)}
        push = heapq.heappush
        for k, d, rp, rm in zip(rep.keys.tolist(), rep.deltas.tolist(), rep.part.tolist(),
                                rep.min_pos.tolist()):
            old = counts.get(k, 0)
            c = old + d
            if c < floor:  # never mergeable (or left out for that reason before: c <= 0)
                if old:
                    if c < 0:
                        raise AssertionError(f"pair {k} count went negative")
                    self._forget(k)
                continue
            counts[k] = c
            rslot = slot_of_part[rp]
            if old == 0:
                a, b = unpack_pair(k)
                self.by_left.setdefault(a, set()).add(k)
                self.by_right.setdefault(b, set()).add(k)
                if rm != NO_POSITION:
                    pos[k] = rm
                else:  # cannot happen for a pair that gained occurrences; stay safe
                    pos[k] = self._after_slot(rslot)
                    inexact.add(k)
                push(self.heap, heap_entry(c, pos[k], k))
            elif rslot == self._slot_of(pos[k]):
                if rm != NO_POSITION:
                    pos[k] = rm
                    inexact.discard(k)
                else:
                    pos[k] = self._after_slot(rslot)
                    inexact.add(k)

    def _forget(self, k: int) -> None:
        del self.counts[k]
        self.pos.pop(k, None)
        self.inexact.discard(k)
        a, b = unpack_pair(k)
        self.by_left[a].discard(k)
        self.by_right[b].discard(k)

    # -- choosing merges -----------------------------------------------------------------------
    def _banned(self, k: int) -> bool:
        m = self.max_token_bytes
        if m is None:
            return False
        a, b = unpack_pair(k)
        return self.token_len[a] + self.token_len[b] > m

    def _clean_top(self) -> bool:
        heap, counts, pos = self.heap, self.counts, self.pos
        while heap:
            top, p, k = unpack_entry(heap[0])
            c = counts.get(k, 0)
            if c == 0:
                heapq.heappop(heap)
            elif c != top or p != pos[k]:
                heapq.heapreplace(heap, heap_entry(c, pos[k], k))
            elif self._banned(k):
                heapq.heappop(heap)  # never mergeable; it is not pushed again
            else:
                return True
        return False

    def _next(self, refresh: Refresh) -> tuple[int, int] | None:
        """The best pair (key, count) with an exact tie key; stays on top of the heap."""
        heap = self.heap
        while self._clean_top():
            top, _, k = unpack_entry(heap[0])
            if k not in self.inexact:
                return k, top
            # entries of this count up to the first exact one may be the winner: refresh them
            popped: list[int] = []
            while self._clean_top() and unpack_entry(heap[0])[0] == top:
                kk = unpack_entry(heapq.heappop(heap))[2]
                popped.append(kk)
                if kk not in self.inexact:
                    break
            need = np.array(sorted(kk for kk in popped if kk in self.inexact), dtype=np.int64)
            self.refreshes += 1
            rep = refresh(need)
            found = dict(zip(rep.keys.tolist(), rep.min_pos.tolist()))
            for kk in need.tolist():
                if kk not in found:
                    raise AssertionError(f"pair {kk} has a count but no occurrence")
                self.pos[kk] = found[kk]
                self.inexact.discard(kk)
            for kk in popped:  # all counted ``top`` times (_clean_top made them current)
                heapq.heappush(heap, heap_entry(top, self.pos[kk], kk))
        return None

    def _touched_max(self, a: int, b: int, own: int) -> int:
        counts = self.counts
        best = 0
        for group in (self.by_right.get(a, ()), self.by_left.get(b, ())):
            for k in group:
                if k != own:
                    c = counts[k]
                    if c > best:
                        best = c
        return best

    def select_batch(
        self, max_batch: int, remaining: int, min_pair_count: int, refresh: Refresh
    ) -> list[Merge]:
        """The next merges, provably those the sequential trainer makes next; their new ids
        continue after the tokens that exist (``token_len``, which grows with them).

        After accepting merge j = (a, b) with count c_j, only pairs (x, a), (b, y) and (a, b)
        change (they lose occurrences), and every new pair (x, ab) / (ab, y) occurs at most
        min(c_j, pre-round count of (x, a) / (b, y)) times. So the next candidate (best-first,
        exact tie keys) is exactly the sequential trainer's next merge when it is not one of
        the changed pairs and its count is strictly above every such bound.
        """
        batch: list[Merge] = []
        bound = -1  # largest count a pair created by the accepted merges can have
        rights: set[int] = set()  # a pair (x, a) changed: a is in rights
        lefts: set[int] = set()  # a pair (b, y) changed: b is in lefts
        while len(batch) < min(max_batch, remaining):
            cand = self._next(refresh)
            if cand is None:
                break
            k, c = cand
            a, b = unpack_pair(k)
            if c < min_pair_count or (batch and (c <= bound or b in rights or a in lefts)):
                break
            heapq.heappop(self.heap)
            batch.append(Merge(a, b, len(self.token_len), c))
            self.token_len.append(self.token_len[a] + self.token_len[b])
            if a == b:
                break
            bound = max(bound, min(c, self._touched_max(a, b, k)))
            rights.add(a)
            lefts.add(b)
        return batch
