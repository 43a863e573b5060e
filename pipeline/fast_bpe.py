"""Vectorized incremental BPE trainer (numpy, no Spark), exact to the oracle in ``bpe.py``.

Layout (DESIGN.md section 3): all distinct words end to end in first-seen order in one flat
array; ``tok[i]`` is the token that starts at position i (-1 if i is inside a longer token),
``nxt``/``prv`` link the token starts of a word. A pair's tie key is its smallest live position.

Every occurrence of a pair containing token t is created by the merge that creates t, so the
positions of each pair are written once, already sorted, into an append-only store; entries go
stale when a later merge destroys the occurrence and are skipped on read. Pair counts are exact
(a dict updated with grouped deltas); the heap holds (count upper bound, position lower bound)
and is fixed lazily when an entry reaches the top.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.bpe import Merge

SHIFT = np.int64(32)
SMALL = 12  # pairs with at most this many stored positions are merged in plain Python


def pair_key(a: int, b: int) -> int:
    return (a << 32) | b


def split_key(key: int) -> tuple[int, int]:
    return key >> 32, key & 0xFFFFFFFF


def group_sum(
    keys: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Group ``keys`` with a stable sort: (unique keys, int64 weight sums, sort order, group
    starts in sorted order). Positions sorted before grouping stay sorted inside each group."""
    order = np.argsort(keys, kind="stable")
    ks = keys[order]
    if len(ks) == 0:
        return ks, np.zeros(0, dtype=np.int64), order, np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(_first_of_runs(ks))
    sums = np.add.reduceat(weights[order], starts)
    return ks[starts], sums, order, starts


def _first_of_runs(sorted_values: np.ndarray) -> np.ndarray:
    mask = np.empty(len(sorted_values), dtype=bool)
    mask[:1] = True
    np.not_equal(sorted_values[1:], sorted_values[:-1], out=mask[1:])
    return mask


def sorted_unique(values: np.ndarray) -> np.ndarray:
    values.sort()
    return values[_first_of_runs(values)]


@dataclass
class PairDeltas:
    """What one merge took from pre-existing pairs (new pairs are registered separately)."""

    removed_keys: list[int]  # pairs that lost occurrences
    removed_counts: list[int]  # how much they lost (> 0)
    tokens_removed: int


class FlatMergeState:
    """Words laid end to end, with linked token starts and the append-only pair store."""

    def __init__(self, flat_tokens: np.ndarray, lengths: np.ndarray, counts: np.ndarray):
        n = int(flat_tokens.shape[0])
        lengths = np.asarray(lengths, dtype=np.int64)
        if np.any(lengths <= 0):
            raise ValueError("every word needs at least one token")
        idx = np.int64 if n >= 2**31 - 1 else np.int32
        self.tok = np.asarray(flat_tokens, dtype=np.int64).astype(np.int32, copy=True)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        self.nxt = np.arange(1, n + 1, dtype=idx)
        self.nxt[ends - 1] = -1
        self.prv = np.arange(-1, n - 1, dtype=idx)
        self.prv[starts] = -1
        self.w = np.repeat(np.asarray(counts, dtype=np.int64), lengths)
        self.word_start = starts
        self.occ: dict[int, list] = {}  # pair -> [sorted positions, read pointer, end]
        self.total_tokens = int(self.w.sum())

    # -- pair store -------------------------------------------------------------------------
    def _keys_at(self, pos: np.ndarray) -> np.ndarray:
        return (self.tok[pos].astype(np.int64) << SHIFT) | self.tok[self.nxt[pos]].astype(np.int64)

    def initial_counts(self) -> dict[int, tuple[int, int]]:
        """Register every pair of the initial layout; returns key -> (count, first position)."""
        keys, sums, firsts = self._register(np.flatnonzero(self.nxt >= 0))
        return {k: (c, f) for k, c, f in zip(keys, sums, firsts)}

    def _register(self, pos: np.ndarray) -> tuple[list[int], list[int], list[int]]:
        """Store sorted positions ``pos`` of new pairs: (keys, counts, first positions)."""
        uniq, sums, order, starts = group_sum(self._keys_at(pos), self.w[pos])
        spos = pos[order]
        keys = uniq.tolist()
        b = starts.tolist()
        b.append(len(pos))
        # occurrences of pair k: spos[lo:hi], lo advancing past stale entries
        self.occ.update({k: [spos, lo, hi] for k, lo, hi in zip(keys, b, b[1:])})
        return keys, sums.tolist(), spos[starts].tolist()

    def is_live(self, p: int, a: int, b: int) -> bool:
        if self.tok[p] != a:
            return False
        q = self.nxt[p]
        return q >= 0 and self.tok[q] == b

    def first_live(self, key: int) -> int:
        """Smallest live position of a pair (advancing its read pointer past stale entries)."""
        a, b = split_key(key)
        entry = self.occ[key]
        arr, i, hi = entry
        if i < hi and self.is_live(int(arr[i]), a, b):
            return int(arr[i])
        rest = arr[i:hi]
        live = np.flatnonzero(self._live_mask(rest, a, b))
        if len(live) == 0:
            entry[1] = hi
            return -1
        entry[1] = i + int(live[0])
        return int(rest[live[0]])

    def _live_mask(self, pos: np.ndarray, a: int, b: int) -> np.ndarray:
        nx = self.nxt[pos]
        return (self.tok[pos] == a) & (nx >= 0) & (self.tok[nx] == b)

    def live_positions(self, key: int) -> np.ndarray:
        a, b = split_key(key)
        entry = self.occ.get(key)
        if entry is None:
            return np.empty(0, dtype=np.int64)
        arr = entry[0][entry[1] : entry[2]]
        return arr[self._live_mask(arr, a, b)]

    # -- one merge --------------------------------------------------------------------------
    def apply_merge(
        self, a: int, b: int, t: int
    ) -> tuple[PairDeltas, tuple[list[int], list[int], list[int]]]:
        """Merge every live occurrence of (a, b) into token t (left to right within a word).

        Returns the count deltas of pre-existing pairs and the new pairs (keys, counts, first
        positions).
        """
        key = pair_key(a, b)
        entry = self.occ.get(key)
        if entry is not None and entry[2] - entry[1] <= SMALL:
            return self._apply_small(key, a, b, t, entry)
        P = self.live_positions(key)
        nxt, prv, tok = self.nxt, self.prv, self.tok
        if a == b and len(P) > 1:
            # runs of overlapping occurrences (a a a ...): keep the 1st, 3rd, ... of each run
            overlap = np.zeros(len(P), dtype=bool)
            overlap[1:] = nxt[P[:-1]] == P[1:]
            if overlap.any():
                idx = np.arange(len(P))
                run_start = np.maximum.accumulate(np.where(overlap, 0, idx))
                P = P[((idx - run_start) & 1) == 0]
        J = nxt[P]
        L = prv[P]
        R = nxt[J]
        has_r = R >= 0
        old = sorted_unique(np.concatenate([L[L >= 0], P, J[has_r]]))
        old_keys = self._keys_at(old)
        rk, rc, _, _ = group_sum(old_keys, self.w[old])
        removed = int(self.w[P].sum())
        self.total_tokens -= removed
        # relink
        tok[P] = t
        tok[J] = -1
        nxt[P] = R
        prv[R[has_r]] = P[has_r]
        Lnew = prv[P]
        new = sorted_unique(np.concatenate([Lnew[Lnew >= 0], P[has_r]]))
        registered = self._register(new)
        self.occ.pop(key, None)
        deltas = PairDeltas(rk.tolist(), rc.tolist(), removed)
        return deltas, registered

    def _apply_small(self, key: int, a: int, b: int, t: int, entry: list
                     ) -> tuple[PairDeltas, tuple[list[int], list[int], list[int]]]:
        """``apply_merge`` for a pair with few stored positions, in plain Python: the same steps
        without the fixed cost of a dozen numpy calls (most late merges are like this)."""
        tok, nxt, prv, w = self.tok, self.nxt, self.prv, self.w
        kept: list[int] = []
        for p in entry[0][entry[1]:entry[2]].tolist():
            if tok[p] != a:
                continue
            j = int(nxt[p])
            if j < 0 or tok[j] != b:
                continue
            if kept and int(nxt[kept[-1]]) == p:  # overlaps the kept a a: left to right
                continue
            kept.append(p)
        old: set[int] = set()
        removed = 0
        for p in kept:
            j = int(nxt[p])
            left = int(prv[p])
            if left >= 0:
                old.add(left)
            old.add(p)
            if nxt[j] >= 0:
                old.add(j)
            removed += int(w[p])
        lost: dict[int, int] = {}
        for q in old:
            k = (int(tok[q]) << 32) | int(tok[nxt[q]])
            lost[k] = lost.get(k, 0) + int(w[q])
        self.total_tokens -= removed
        for p in kept:  # relink
            j = int(nxt[p])
            r = int(nxt[j])
            tok[p] = t
            tok[j] = -1
            nxt[p] = r
            if r >= 0:
                prv[r] = p
        new: set[int] = set()
        for p in kept:
            left = int(prv[p])
            if left >= 0:
                new.add(left)
            if nxt[p] >= 0:
                new.add(p)
        groups: dict[int, list[int]] = {}
        for q in sorted(new):
            groups.setdefault((int(tok[q]) << 32) | int(tok[nxt[q]]), []).append(q)
        keys, sums, firsts = [], [], []
        occ = self.occ
        for k in sorted(groups):
            qs = groups[k]
            keys.append(k)
            sums.append(sum(int(w[q]) for q in qs))
            firsts.append(qs[0])
            occ[k] = [np.array(qs, dtype=np.int64), 0, len(qs)]
        occ.pop(key, None)
        rk = sorted(lost)
        return PairDeltas(rk, [lost[k] for k in rk], removed), (keys, sums, firsts)

    # -- the working set, for hand-off and checks ------------------------------------------------
    def current(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, symbol offset of each token in its word, tokens per word), all words."""
        live = np.flatnonzero(self.tok >= 0)
        wid = np.searchsorted(self.word_start, live, side="right") - 1
        lengths = np.bincount(wid, minlength=len(self.word_start)).astype(np.int64)
        return self.tok[live], (live - self.word_start[wid]).astype(np.int32), lengths


@dataclass
class TrainProgress:
    merges_done: int
    merge: Merge
    tokens_left: int


class LocalTrainer:
    """Exact incremental trainer on one process: the ``local`` engine."""

    def __init__(
        self,
        flat_tokens: np.ndarray,
        lengths: np.ndarray,
        counts: np.ndarray,
        token_bytes: Sequence[bytes],
    ):
        self.state = FlatMergeState(flat_tokens, lengths, counts)
        self.token_len = [len(t) for t in token_bytes]
        self.counts: dict[int, int] = {}
        self.heap: list[tuple[int, int, int]] = []
        for k, (c, first) in self.state.initial_counts().items():
            self.counts[k] = c
            self.heap.append((-c, first, k))
        heapq.heapify(self.heap)
        self.merges: list[Merge] = []
        self.removed: list[int] = []  # corpus tokens removed by each merge
        self.min_count = 1  # new pairs below this count are not pushed (set by train)

    @classmethod
    def from_words(
        cls, words: Sequence[Sequence[int]], counts: Sequence[int], token_bytes: Sequence[bytes]
    ) -> LocalTrainer:
        lengths = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
        flat = np.fromiter((t for w in words for t in w), dtype=np.int64, count=int(lengths.sum()))
        return cls(flat, lengths, np.asarray(counts, dtype=np.int64), token_bytes)

    @property
    def next_id(self) -> int:
        return len(self.token_len)

    def _apply(self, a: int, b: int, count: int) -> Merge:
        t = self.next_id
        deltas, new = self.state.apply_merge(a, b, t)
        counts = self.counts
        for k, d in zip(deltas.removed_keys, deltas.removed_counts):
            counts[k] -= d  # a pair at 0 stays until its heap entry is popped
        keys, sums, firsts = new
        counts.update(zip(keys, sums))
        push = heapq.heappush
        heap = self.heap
        floor = self.min_count  # a pair below it can never be merged: keep it off the heap
        for c, first, k in zip(sums, firsts, keys):
            if c >= floor:
                push(heap, (-c, first, k))
        self.token_len.append(self.token_len[a] + self.token_len[b])
        m = Merge(a, b, t, count)
        self.merges.append(m)
        self.removed.append(deltas.tokens_removed)
        return m

    def best_pair(self, max_token_bytes: int | None = None) -> tuple[int, int] | None:
        """(key, count) of the pair the sequential trainer merges next, or None."""
        heap, counts, state = self.heap, self.counts, self.state
        tl = self.token_len
        while heap:
            negc, pos, k = heap[0]
            c = counts.get(k, 0)
            if c != -negc:
                if c:
                    heapq.heapreplace(heap, (-c, pos, k))
                else:
                    heapq.heappop(heap)
                continue
            if max_token_bytes is not None and tl[k >> 32] + tl[k & 0xFFFFFFFF] > max_token_bytes:
                heapq.heappop(heap)  # never mergeable; its count only falls from here
                continue
            real = state.first_live(k)
            if real != pos:
                heapq.heapreplace(heap, (negc, real, k))
                continue
            return k, c
        return None

    def train(
        self,
        num_merges: int,
        min_pair_count: int = 2,
        max_token_bytes: int | None = None,
        on_merge: Callable[[TrainProgress], None] | None = None,
    ) -> list[Merge]:
        """Run until ``num_merges`` merges in total have been made (or no pair qualifies)."""
        if min_pair_count < self.min_count:
            raise ValueError("min_pair_count cannot go below an earlier train() call's")
        self.min_count = min_pair_count
        while len(self.merges) < num_merges:
            best = self.best_pair(max_token_bytes)
            if best is None or best[1] < min_pair_count:
                break
            k, c = best
            m = self._apply(k >> 32, k & 0xFFFFFFFF, c)
            if on_merge is not None:
                on_merge(TrainProgress(len(self.merges), m, self.state.total_tokens))
        return self.merges

    def replay(self, merges: Sequence[Merge]) -> None:
        """Apply known merges (resume); each must be the next id."""
        for m in merges:
            if m.new_id != self.next_id:
                raise ValueError(f"merge {m} does not continue at id {self.next_id}")
            self._apply(m.left, m.right, m.count)
