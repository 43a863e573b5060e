"""Vectorized incremental BPE trainer (numpy, no Spark), exact to the oracle in ``bpe.py``.

Layout (DESIGN.md section 3): all distinct words end to end in first-seen order in one flat
array; ``tok[i]`` is the token that starts at position i (-1 if i is inside a longer token),
``nxt``/``prv`` link the token starts of a word. A pair's tie key is its smallest live position.

Every occurrence of a pair containing token t is created by the merge that creates t, so each
pair is registered once: it gets a dense id, and its positions are written, already sorted, into
an append-only buffer. ``pid[p]`` is the id of the pair starting at position p now, so a stored
position is live exactly when it still carries the pair's id; dead entries are skipped on read.
Pair counts are exact (a numpy array lowered with one vectorized call per merge); the heap holds
(count upper bound, position lower bound, id) and is fixed lazily when an entry reaches the top.
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


class FlatMergeState:
    """Words laid end to end, with linked token starts and the append-only pair store.

    Every pair gets a dense id when it is registered; ``pid[p]`` is the id of the pair that
    starts at position p now (-1 if none), so an occurrence is live exactly when its position
    still carries the pair's id. Per id: exact count ``cnt``, tokens ``pa``/``pb``, and its
    stored positions ``buf[lo:hi]`` (sorted; ``lo`` advances past dead entries).
    """

    def __init__(self, flat_tokens: np.ndarray, lengths: np.ndarray, counts: np.ndarray):
        n = int(flat_tokens.shape[0])
        lengths = np.asarray(lengths, dtype=np.int64)
        if np.any(lengths <= 0):
            raise ValueError("every word needs at least one token")
        self.tok = np.asarray(flat_tokens, dtype=np.int64).astype(np.int32, copy=True)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        self.nxt = np.arange(1, n + 1, dtype=np.int64)
        self.nxt[ends - 1] = -1
        self.prv = np.arange(-1, n - 1, dtype=np.int64)
        self.prv[starts] = -1
        self.w = np.repeat(np.asarray(counts, dtype=np.int64), lengths)
        self.word_start = starts
        self.total_tokens = int(self.w.sum())
        self.pid = np.full(n, -1, dtype=np.int64)
        self.n_ids = 0
        cap = 1024
        self.cnt = np.zeros(cap, dtype=np.int64)
        self.lo = np.zeros(cap, dtype=np.int64)
        self.hi = np.zeros(cap, dtype=np.int64)
        self.pa = np.zeros(cap, dtype=np.int64)
        self.pb = np.zeros(cap, dtype=np.int64)
        self.buf = np.zeros(max(2 * n, 1024), dtype=np.int64)
        self.buf_len = 0
        # pair key -> id, kept only while merges are applied by pair (replay): see key_index
        self.id_of: dict[int, int] = {}
        self.track_keys = False

    # -- pair store -------------------------------------------------------------------------
    def _reserve(self, ids: int, positions: int) -> None:
        if ids > len(self.cnt):
            cap = max(ids, 2 * len(self.cnt))
            for name in ("cnt", "lo", "hi", "pa", "pb"):
                old = getattr(self, name)
                grown = np.zeros(cap, dtype=np.int64)
                grown[: len(old)] = old
                setattr(self, name, grown)
        if positions > len(self.buf):
            grown = np.zeros(max(positions, 2 * len(self.buf)), dtype=np.int64)
            grown[: self.buf_len] = self.buf[: self.buf_len]
            self.buf = grown

    def initial_counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Register every pair of the initial layout: (ids, counts, first positions)."""
        return self._register(np.flatnonzero(self.nxt >= 0))

    def _register(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Give the pairs at sorted positions ``pos`` (all new pairs) ids and store their
        positions; returns (ids, counts, first positions)."""
        left, right = self.tok[pos].astype(np.int64), self.tok[self.nxt[pos]]
        keys = (left << SHIFT) | right
        if len(pos) > 4096 and int(left.max()) < 256 and int(right.max()) < 256:
            # byte pairs (the initial layout): a 16-bit key sorts by radix, ~8x faster
            order = np.argsort(((left << 8) | right).astype(np.uint16), kind="stable")
        else:
            order = np.argsort(keys, kind="stable")
        ks = keys[order]
        spos = pos[order]
        if len(ks) == 0:
            z = np.zeros(0, dtype=np.int64)
            return z, z, z
        starts = np.flatnonzero(_first_of_runs(ks))
        m = len(starts)
        first_id, base = self.n_ids, self.buf_len
        self._reserve(first_id + m, base + len(spos))
        ids = np.arange(first_id, first_id + m, dtype=np.int64)
        sizes = np.diff(np.append(starts, len(spos)))
        sums = np.add.reduceat(self.w[spos], starts)
        uniq = ks[starts]
        self.buf[base : base + len(spos)] = spos
        self.buf_len = base + len(spos)
        self.lo[first_id : first_id + m] = base + starts
        self.hi[first_id : first_id + m] = base + starts + sizes
        self.cnt[first_id : first_id + m] = sums
        self.pa[first_id : first_id + m] = uniq >> SHIFT
        self.pb[first_id : first_id + m] = uniq & 0xFFFFFFFF
        self.pid[spos] = np.repeat(ids, sizes)
        self.n_ids = first_id + m
        if self.track_keys:
            self.id_of.update(zip(uniq.tolist(), ids.tolist()))
        return ids, sums, spos[starts]

    def key_index(self) -> dict[int, int]:
        """The pair key -> id map, built now if it is not being kept, and kept from now on."""
        if not self.track_keys:
            n = self.n_ids
            keys = (self.pa[:n] << SHIFT) | self.pb[:n]
            self.id_of = dict(zip(keys.tolist(), range(n)))
            self.track_keys = True
        return self.id_of

    def stop_key_index(self) -> None:
        """Stop keeping the key map (training picks pairs by id)."""
        self.track_keys = False
        self.id_of = {}

    def first_live(self, i: int) -> int:
        """Smallest live position of pair ``i`` (advancing its read pointer), or -1."""
        lo, hi = int(self.lo[i]), int(self.hi[i])
        if lo < hi and self.pid[self.buf[lo]] == i:
            return int(self.buf[lo])
        rest = self.buf[lo:hi]
        live = np.flatnonzero(self.pid[rest] == i)
        if len(live) == 0:
            self.lo[i] = hi
            return -1
        self.lo[i] = lo + int(live[0])
        return int(rest[live[0]])

    # -- one merge --------------------------------------------------------------------------
    def apply_merge(self, a: int, b: int, t: int) -> int:
        """Merge every live occurrence of (a, b) into token t; returns the corpus tokens
        removed (0 when the pair does not occur)."""
        i = self.key_index().get(pair_key(a, b))
        return 0 if i is None else self.apply_id(i, t)[0]

    def apply_id(self, i: int, t: int) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Merge every live occurrence of pair ``i`` into token t (left to right within a
        word). Counts of the pairs that lose occurrences are lowered in ``cnt``; returns the
        corpus tokens removed and the new pairs (ids, counts, first positions)."""
        lo, hi = int(self.lo[i]), int(self.hi[i])
        if hi - lo <= SMALL:
            return self._apply_small(i, t, lo, hi)
        nxt, prv, tok, pid, w = self.nxt, self.prv, self.tok, self.pid, self.w
        arr = self.buf[lo:hi]
        P = arr[pid[arr] == i]
        if len(P) > 1 and self.pa[i] == self.pb[i]:
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
        np.subtract.at(self.cnt, pid[old], w[old])
        removed = int(w[P].sum())
        self.total_tokens -= removed
        # relink
        tok[P] = t
        tok[J] = -1
        pid[J] = -1
        pid[P] = -1
        nxt[P] = R
        prv[R[has_r]] = P[has_r]
        Lnew = prv[P]
        new = sorted_unique(np.concatenate([Lnew[Lnew >= 0], P[has_r]]))
        self.lo[i] = hi
        return removed, self._register(new)

    def _apply_small(self, i: int, t: int, lo: int, hi: int
                     ) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``apply_id`` for a pair with few stored positions, in plain Python: the same steps
        without the fixed cost of a dozen numpy calls (most late merges are like this)."""
        tok, nxt, prv, w, pid, cnt = self.tok, self.nxt, self.prv, self.w, self.pid, self.cnt
        kept: list[int] = []
        for p in self.buf[lo:hi].tolist():
            if pid[p] != i:
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
        for q in old:
            cnt[pid[q]] -= w[q]
        self.total_tokens -= removed
        for p in kept:  # relink
            j = int(nxt[p])
            r = int(nxt[j])
            tok[p] = t
            tok[j] = -1
            pid[j] = -1
            pid[p] = -1
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
        self.lo[i] = hi
        return removed, self._register_small(sorted(new))

    def _register_small(self, pos: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``_register`` for a few positions, in plain Python."""
        tok, nxt, w = self.tok, self.nxt, self.w
        groups: dict[int, list[int]] = {}
        for q in pos:
            groups.setdefault((int(tok[q]) << 32) | int(tok[nxt[q]]), []).append(q)
        first_id, base = self.n_ids, self.buf_len
        self._reserve(first_id + len(groups), base + len(pos))
        ids, sums, firsts = [], [], []
        buf, pid, id_of, track = self.buf, self.pid, self.id_of, self.track_keys
        at = base
        for n, k in enumerate(sorted(groups)):
            qs = groups[k]
            i = first_id + n
            c = sum(int(w[q]) for q in qs)
            buf[at : at + len(qs)] = qs
            pid[qs] = i
            self.lo[i], self.hi[i] = at, at + len(qs)
            self.cnt[i], self.pa[i], self.pb[i] = c, k >> 32, k & 0xFFFFFFFF
            if track:
                id_of[k] = i
            at += len(qs)
            ids.append(i)
            sums.append(c)
            firsts.append(qs[0])
        self.n_ids = first_id + len(groups)
        self.buf_len = at
        return ids, sums, firsts  # type: ignore[return-value]

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
        ids, sums, firsts = self.state.initial_counts()
        # heap of (-count upper bound, position lower bound, pair id), fixed lazily at the top
        self.heap: list[tuple[int, int, int]] = list(
            zip((-sums).tolist(), firsts.tolist(), ids.tolist()))
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

    def _record(self, a: int, b: int, count: int, removed: int) -> Merge:
        t = self.next_id
        self.token_len.append(self.token_len[a] + self.token_len[b])
        m = Merge(a, b, t, count)
        self.merges.append(m)
        self.removed.append(removed)
        return m

    def _apply(self, i: int, count: int) -> Merge:
        st = self.state
        a, b = int(st.pa[i]), int(st.pb[i])
        removed, (ids, sums, firsts) = st.apply_id(i, self.next_id)
        floor = self.min_count  # a pair below it can never be merged: keep it off the heap
        push, heap = heapq.heappush, self.heap
        if isinstance(sums, np.ndarray):
            keep = sums >= floor
            for c, first, k in zip(sums[keep].tolist(), firsts[keep].tolist(),
                                   ids[keep].tolist()):
                push(heap, (-c, first, k))
        else:
            for c, first, k in zip(sums, firsts, ids):
                if c >= floor:
                    push(heap, (-c, first, k))
        return self._record(a, b, count, removed)

    def best_pair(self, max_token_bytes: int | None = None) -> tuple[int, int] | None:
        """(pair id, count) of the pair the sequential trainer merges next, or None."""
        heap, state = self.heap, self.state
        cnt, pa, pb = state.cnt, state.pa, state.pb
        tl = self.token_len
        while heap:
            negc, pos, i = heap[0]
            c = int(cnt[i])
            if c != -negc:
                if c:
                    heapq.heapreplace(heap, (-c, pos, i))
                else:
                    heapq.heappop(heap)
                continue
            if max_token_bytes is not None and tl[pa[i]] + tl[pb[i]] > max_token_bytes:
                heapq.heappop(heap)  # never mergeable; its count only falls from here
                continue
            real = state.first_live(i)
            if real != pos:
                heapq.heapreplace(heap, (negc, real, i))
                continue
            return i, c
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
        self.state.stop_key_index()
        while len(self.merges) < num_merges:
            best = self.best_pair(max_token_bytes)
            if best is None or best[1] < min_pair_count:
                break
            m = self._apply(*best)
            if on_merge is not None:
                on_merge(TrainProgress(len(self.merges), m, self.state.total_tokens))
        return self.merges

    def replay(self, merges: Sequence[Merge]) -> None:
        """Apply known merges (resume, or another text); each must be the next id."""
        id_of = self.state.key_index()
        for m in merges:
            if m.new_id != self.next_id:
                raise ValueError(f"merge {m} does not continue at id {self.next_id}")
            i = id_of.get(pair_key(m.left, m.right))
            if i is None:  # the pair does not occur here
                self._record(m.left, m.right, m.count, 0)
            else:
                self._apply(i, m.count)
