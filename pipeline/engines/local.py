"""The vectorized incremental trainer (numpy, no Spark): the ``local`` engine, and the data
structure each partition of the ``spark`` engine keeps. Exact to the oracle in ``bpe.py``.

Layout (docs/DESIGN.md): all distinct words end to end in first-seen order in one flat array of
symbol positions; ``tok[p]`` is the token that starts at position p (-1 inside a longer token),
``nxt``/``prv`` link the token starts of a word and ``w[p]`` is the count of p's word (2 bytes;
``BIG`` means "look it up in ``big_count``"). A pair's
tie key is its smallest live position (``order.py``).

Every occurrence of a pair that contains token t is created by the merge that creates t (or is
there from the start), so a pair is registered exactly once: it gets a dense id and its
positions are written, already sorted, into an append-only buffer. The ids a merge registers
form one *segment* with sorted pair keys, and the segment of pair (a, b) is known from
max(a, b) alone, so a pair is found by a binary search in its segment, with no hash map.
``pid[p]`` is the id of the pair starting at position p now, so a stored position is live
exactly when it still carries the pair's id; dead entries are skipped on read. Counts are
exact (an int64 array lowered with one vectorized call per merge); the heap holds (count
upper bound, position lower bound, id) and is fixed lazily when an entry reaches the top.

Memory, per symbol of the word table: tok, nxt, prv and pid are 4 bytes each (nxt, prv, pid
and the buffer's entries 8 past 2**31 symbols; tok stays int32), w 2 bytes, and the position
buffer holds about 1-2 entries of 4 bytes; per
registered pair 32 bytes (count, buffer range lo/hi: int64; its tokens pair_left/pair_right:
int32). The arrays come from an :class:`Arrays` allocator: in memory on the driver,
memory-mapped files in an executor's scratch directory for the Spark engine
(``engines/partition.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from pipeline.bpe import BaseVocab, Merge
from pipeline.order import (
    NO_POSITION,
    heap_entry,
    left_to_right,
    left_to_right_few,
    pack_pair,
    pack_pairs,
    unpack_pair,
)

SMALL = 12  # pairs with at most this many stored positions are merged in plain Python
HEAP_START = 4096  # the heap starts with the pairs counted at least as often as this many
MIN_CAPACITY = 1024  # smallest position buffer and pair arrays
BIG = 0xFFFF  # w[p] == BIG: the word's count is at least BIG, kept in big_count
_CHUNK = 1 << 20  # positions (or words) per step of the initial passes (bounds temporaries)
LARGE_BINARY_FROM = 1 << 31  # bytes of words from which they are joined with 64-bit offsets


def joined(words: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column of words as one array: with 64-bit offsets (large_binary) from
    ``LARGE_BINARY_FROM`` bytes on, as one binary array's offsets are 32-bit."""
    if not isinstance(words, pa.ChunkedArray):
        return words
    if words.nbytes >= LARGE_BINARY_FROM:
        words = words.cast(pa.large_binary())
    return words.combine_chunks()


def initial_symbols(base: BaseVocab, words: pa.Array | pa.ChunkedArray,
                    unknown: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The initial symbols of a binary Arrow array of words, flat: (ids, lengths). For the
    ``bytes`` alphabet the ids are a uint8 view of the words' bytes (no copy); for ``chars``
    int32 ids from :meth:`BaseVocab.symbols` (``unknown``: the id of a character not in it,
    else KeyError)."""
    words = joined(words)
    if base.alphabet == "bytes":
        wide = pa.types.is_large_binary(words.type)  # (Spark's with useLargeVarTypes, too)
        offsets = np.frombuffer(words.buffers()[1], dtype=np.int64 if wide else np.int32)[
            words.offset : words.offset + len(words) + 1]
        data = np.frombuffer(words.buffers()[2], dtype=np.uint8)
        return data[offsets[0] : offsets[-1]], np.diff(offsets).astype(np.int64)
    seqs = [base.symbols(w.decode("utf-8", "surrogateescape"), unknown)
            for w in words.to_pylist()]
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(lengths.sum()))
    return flat, lengths


def group_sum(
    keys: np.ndarray, weights: np.ndarray, order: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Group ``keys`` with a stable sort (or ``order``, one that sorts ``keys``): (unique keys,
    int64 weight sums, sort order, group starts in sorted order). Positions sorted before
    grouping stay sorted inside each group."""
    if order is None:
        order = np.argsort(keys, kind="stable")
    ks = keys[order]
    if len(ks) == 0:
        return ks, np.zeros(0, dtype=np.int64), order, np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(first_of_runs(ks))
    sums = np.add.reduceat(weights[order], starts, dtype=np.int64)
    return ks[starts], sums, order, starts


def first_of_runs(sorted_values: np.ndarray) -> np.ndarray:
    mask = np.empty(len(sorted_values), dtype=bool)
    mask[:1] = True
    np.not_equal(sorted_values[1:], sorted_values[:-1], out=mask[1:])
    return mask


def sorted_unique(values: np.ndarray) -> np.ndarray:
    values.sort()
    return values[first_of_runs(values)]


class Arrays:
    """Allocates a state's arrays. This one: plain numpy arrays in this process."""

    def empty(self, name: str, dtype: type, size: int) -> np.ndarray:
        return np.empty(size, dtype=dtype)

    def resize(self, name: str, arr: np.ndarray, used: int, size: int) -> np.ndarray:
        out = self.empty(name, arr.dtype, size)
        out[:used] = arr[:used]
        return out

    def adopt(self, name: str, values: np.ndarray, dtype: type) -> np.ndarray:
        """``values`` as an array of ``dtype``: the array itself when it already is one (it is
        then changed in place), else a copy."""
        if (type(self) is Arrays and isinstance(values, np.ndarray) and values.dtype == dtype
                and values.flags.c_contiguous and values.flags.writeable):
            return values
        out = self.empty(name, dtype, len(values))
        out[:] = values
        return out


POSITION_ARRAYS = ("tok", "nxt", "prv", "pid", "w")
WORD_ARRAYS = ("big_start", "big_count")  # words counted BIG times or more
PAIR_ARRAYS = ("cnt", "lo", "hi", "pair_left", "pair_right")
SCALARS = ("n", "base_size", "n_ids", "buf_len", "n_segments", "total_tokens", "live_tokens",
           "n_big", "n_words")


class FlatMergeState:
    """Words laid end to end, with linked token starts and the append-only pair store.

    Per pair id: exact count ``cnt``, tokens ``pair_left``/``pair_right``, and its stored positions
    ``buf[lo:hi]`` (sorted; ``lo`` advances past dead entries). ``seg[j]`` is the first id
    registered by the j-th registration: 0 is the initial layout, j + 1 the merge that
    created token ``base_size + j``.
    """

    def __init__(self, arrays: dict[str, np.ndarray], scalars: dict[str, int],
                 alloc: Arrays | None = None):
        self.alloc = alloc or Arrays()
        for name, arr in arrays.items():
            setattr(self, name, arr)
        for name in SCALARS:
            setattr(self, name, int(scalars[name]))
        self.journal: list[tuple[np.ndarray, np.ndarray]] | None = None  # see record_deltas
        self._seg0_keys: np.ndarray | None = None

    # -- building -------------------------------------------------------------------------------
    @classmethod
    def build(cls, flat_tokens: np.ndarray, lengths: np.ndarray, counts: np.ndarray,
              base_size: int, alloc: Arrays | None = None) -> FlatMergeState:
        """The state of words given as initial tokens (``flat_tokens``, all < ``base_size``,
        words of ``lengths`` tokens with ``counts``), with every pair registered. An int32
        ``flat_tokens`` becomes the state's token array (no copy; it is changed)."""
        alloc = alloc or Arrays()
        lengths = np.asarray(lengths, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        if np.any(lengths <= 0):
            raise ValueError("every word needs at least one token")
        n = int(lengths.sum())
        ix = np.int32 if n < 2**31 - 1 else np.int64
        a: dict[str, np.ndarray] = {"tok": alloc.adopt("tok", flat_tokens, np.int32)}
        ends = np.cumsum(lengths)
        a["nxt"] = alloc.empty("nxt", ix, n)
        a["prv"] = alloc.empty("prv", ix, n)
        for s in range(0, n, _CHUNK):  # links in place, without an n-sized temporary
            e = min(s + _CHUNK, n)
            a["nxt"][s:e] = np.arange(s + 1, e + 1, dtype=ix)
            a["prv"][s:e] = np.arange(s - 1, e - 1, dtype=ix)
        a["nxt"][ends - 1] = -1
        a["prv"][ends - lengths] = -1
        # word counts per position in 2 bytes; the few words counted BIG times or more keep
        # their count aside, found from the position by a binary search over their starts
        a["w"] = alloc.empty("w", np.uint16, n)
        for s in range(0, len(lengths), _CHUNK):
            e = min(s + _CHUNK, len(lengths))
            p0 = int(ends[s] - lengths[s])
            p1 = int(ends[e - 1])
            a["w"][p0:p1] = np.repeat(np.minimum(counts[s:e], BIG).astype(np.uint16),
                                      lengths[s:e])
        big = np.flatnonzero(counts >= BIG)
        a["big_start"] = alloc.empty("big_start", np.int64, max(len(big), 1))
        a["big_start"][: len(big)] = (ends - lengths)[big]
        a["big_count"] = alloc.empty("big_count", np.int64, max(len(big), 1))
        a["big_count"][: len(big)] = counts[big]
        del ends
        a["pid"] = alloc.empty("pid", ix, n)
        a["pid"].fill(-1)
        pairs = n - len(lengths)
        cap = max(pairs + pairs // 2, MIN_CAPACITY)
        a["buf"] = alloc.empty("buf", ix, cap)
        ids_cap = MIN_CAPACITY
        for name, dt in zip(PAIR_ARRAYS, (np.int64, np.int64, np.int64, np.int32, np.int32)):
            a[name] = alloc.empty(name, dt, ids_cap)
        a["seg"] = alloc.empty("seg", np.int64, 1024)
        a["seg"][0] = 0
        total = int(np.dot(lengths, counts)) if len(lengths) else 0
        scalars = {"n": n, "base_size": base_size, "n_ids": 0, "buf_len": 0, "n_segments": 0,
                   "total_tokens": total, "live_tokens": n, "n_big": len(big),
                   "n_words": len(lengths)}
        st = cls(a, scalars, alloc)
        st._register_initial()
        return st

    def _register_initial(self) -> None:
        """Register every pair of the initial layout as segment 0. For small alphabets
        (bytes) a counting sort in chunks keeps the temporaries to a few bytes per symbol."""
        base = self.base_size
        if base > 256:
            pos = np.flatnonzero(self.nxt >= 0).astype(self.nxt.dtype)
            self._register(pos)
            self._end_segment()
            return
        n = self.n
        nk = base * base
        per_key = np.zeros(nk, dtype=np.int64)
        for s in range(0, max(n - 1, 0), _CHUNK):
            keys, _ = self._byte_keys(s, min(s + _CHUNK, n - 1))
            per_key += np.bincount(keys, minlength=nk)
        present = np.flatnonzero(per_key)
        m = len(present)
        sizes = per_key[present]
        start = np.zeros(nk, dtype=np.int64)
        start[present] = np.cumsum(sizes) - sizes
        total = int(sizes.sum())
        self._reserve(m, total)
        cursor = start.copy()
        buf = self.buf
        for s in range(0, max(n - 1, 0), _CHUNK):
            keys, pos = self._byte_keys(s, min(s + _CHUNK, n - 1))
            order = np.argsort(keys, kind="stable")
            ks = keys[order]
            runs = np.flatnonzero(first_of_runs(ks)) if len(ks) else np.zeros(0, np.int64)
            run_len = np.diff(np.append(runs, len(ks)))
            rank = np.arange(len(ks)) - np.repeat(runs, run_len)
            buf[cursor[ks] + rank] = pos[order]
            cursor[ks[runs]] += run_len
        ids = np.arange(m, dtype=np.int64)
        lo = start[present]
        self.lo[:m] = lo
        self.hi[:m] = lo + sizes
        self.pair_left[:m] = present // base
        self.pair_right[:m] = present % base
        # counts and pid, _CHUNK stored positions at a time (a pair may span several steps)
        owner_end = lo + sizes
        self.cnt[:m] = 0
        for b0 in range(0, total, _CHUNK):
            b1 = min(b0 + _CHUNK, total)
            chunk = buf[b0:b1]
            s = int(np.searchsorted(owner_end, b0, side="right"))
            e = int(np.searchsorted(owner_end, b1 - 1, side="right")) + 1
            cut = np.clip(lo[s:e], b0, b1) - b0  # where each pair's positions start here
            self.cnt[s:e] += np.add.reduceat(self.weights(chunk), cut)
            self.pid[chunk] = np.repeat(ids[s:e], np.diff(np.append(cut, b1 - b0)))
        self.n_ids = m
        self.buf_len = total
        self._end_segment()

    def weights(self, pos: np.ndarray) -> np.ndarray:
        """The counts of the words of positions ``pos`` (int64)."""
        wv = self.w[pos].astype(np.int64)
        if self.n_big:
            big = np.flatnonzero(wv == BIG)
            if len(big):
                k = np.searchsorted(self.big_start[: self.n_big], pos[big], side="right") - 1
                wv[big] = self.big_count[k]
        return wv

    def weight(self, p: int) -> int:
        v = int(self.w[p])
        if v == BIG and self.n_big:
            k = int(np.searchsorted(self.big_start[: self.n_big], p, side="right")) - 1
            v = int(self.big_count[k])
        return v

    def _byte_keys(self, s: int, e: int) -> tuple[np.ndarray, np.ndarray]:
        """Pair keys ``a * base + b`` and positions of the initial pairs starting in [s, e).

        Dense for the base alphabet (b < base), these sort by (a, b) as ``order.pack_pair``
        keys do: segment 0 is laid out in this order and :meth:`find_pair` searches it with
        ``pack_pair`` keys."""
        pos = np.flatnonzero(self.nxt[s:e] >= 0)
        pos += s
        keys = self.tok[pos].astype(np.int32) * self.base_size + self.tok[pos + 1]
        return keys, pos.astype(self.nxt.dtype)

    def initial_pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, counts, first positions) of the pairs of segment 0."""
        m = int(self.seg[1])
        ids = np.arange(m, dtype=np.int64)
        return ids, self.cnt[:m].copy(), self.buf[self.lo[:m]].astype(np.int64)

    # -- pair store -------------------------------------------------------------------------
    def _reserve(self, ids: int, positions: int) -> None:
        """Room for ``ids`` more pair ids and ``positions`` more stored positions."""
        need = self.n_ids + ids
        if need > len(self.cnt):
            cap = max(need, len(self.cnt) + len(self.cnt) // 2)
            for name in PAIR_ARRAYS:
                setattr(self, name, self.alloc.resize(name, getattr(self, name), self.n_ids,
                                                      cap))
        need = self.buf_len + positions
        if need > len(self.buf):
            live = self.live_tokens - self.n_words  # stored positions still live
            if self.buf_len - live >= self.buf_len // 3:
                self._compact()
                need = self.buf_len + positions
        if need > len(self.buf):
            cap = max(need, len(self.buf) + len(self.buf) // 2)
            self.buf = self.alloc.resize("buf", self.buf, self.buf_len, cap)

    def _compact(self) -> None:
        """Drop the dead entries of the position buffer, in place: each pair's live positions
        move down, still sorted. Ranges are in id order, so a write never passes a read."""
        buf, pid, lo, hi = self.buf, self.pid, self.lo, self.hi
        n, write, s = self.n_ids, 0, 0
        sizes = hi[:n] - lo[:n]
        ends = np.cumsum(sizes)
        while s < n:  # ids in slices of about _CHUNK stored entries
            e = max(int(np.searchsorted(ends, ends[s] - sizes[s] + _CHUNK, side="right")),
                    s + 1)
            ids = np.arange(s, e)
            k = sizes[s:e]
            total = int(k.sum())
            first = np.repeat(lo[s:e] - (np.cumsum(k) - k), k)
            entries = buf[first + np.arange(total)].astype(np.intp)
            owner = np.repeat(ids, k)
            live = pid[entries] == owner
            kept = np.bincount(owner[live] - s, minlength=e - s)
            buf[write : write + int(kept.sum())] = entries[live]
            lo[s:e] = write + np.cumsum(kept) - kept
            hi[s:e] = lo[s:e] + kept
            write += int(kept.sum())
            s = e
        self.buf_len = write

    def _end_segment(self) -> None:
        """Close the registration of one merge (or of the initial layout)."""
        self.n_segments += 1
        if self.n_segments >= len(self.seg):
            self.seg = self.alloc.resize("seg", self.seg, self.n_segments,
                                         2 * len(self.seg))
        self.seg[self.n_segments] = self.n_ids

    def _register(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Give the pairs at sorted positions ``pos`` (all new pairs) ids and store their
        positions; returns (ids, counts, first positions)."""
        # group_sum's steps, with the weights looked up after the sort: one position-sized
        # array less at the peak (about 30 MB on the 1 GB table)
        keys = pack_pairs(self.tok[pos], self.tok[self.nxt[pos]])
        order = np.argsort(keys, kind="stable")
        ks = keys[order]
        spos = pos[order]
        del keys, order
        if len(ks) == 0:
            z = np.zeros(0, dtype=np.int64)
            return z, z, z
        starts = np.flatnonzero(first_of_runs(ks))
        m = len(starts)
        self._reserve(m, len(spos))
        first_id, base = self.n_ids, self.buf_len
        ids = np.arange(first_id, first_id + m, dtype=np.int64)
        sizes = np.diff(np.append(starts, len(spos)))
        sums = np.add.reduceat(self.weights(spos), starts)
        uniq = ks[starts]
        self.buf[base : base + len(spos)] = spos
        self.buf_len = base + len(spos)
        self.lo[first_id : first_id + m] = base + starts
        self.hi[first_id : first_id + m] = base + starts + sizes
        self.cnt[first_id : first_id + m] = sums
        new = slice(first_id, first_id + m)
        self.pair_left[new], self.pair_right[new] = unpack_pair(uniq)
        self.pid[spos] = np.repeat(ids, sizes)
        self.n_ids = first_id + m
        if self.journal is not None:
            self.journal.append((ids, sums))
        return ids, sums, spos[starts].astype(np.int64)

    def find_pair(self, a: int, b: int) -> int | None:
        """The id of pair (a, b), or None if it never occurred here: a binary search in the
        segment of the merge that created max(a, b)."""
        top = max(a, b)
        j = 0 if top < self.base_size else top - self.base_size + 1
        if j >= self.n_segments:
            return None
        lo, hi = int(self.seg[j]), int(self.seg[j + 1])
        if j == 0:
            if self._seg0_keys is None:
                self._seg0_keys = pack_pairs(self.pair_left[lo:hi], self.pair_right[lo:hi])
            keys = self._seg0_keys
        else:
            keys = pack_pairs(self.pair_left[lo:hi], self.pair_right[lo:hi])
        k = pack_pair(a, b)
        at = int(np.searchsorted(keys, k))
        return lo + at if at < len(keys) and int(keys[at]) == k else None

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

    def first_live_many(self, ids: np.ndarray) -> np.ndarray:
        """``first_live`` of many ids (NO_POSITION where none is left)."""
        out = np.full(len(ids), NO_POSITION, dtype=np.int64)
        if len(ids) == 0:
            return out
        lo, hi = self.lo[ids], self.hi[ids]
        has = lo < hi
        cand = np.full(len(ids), -1, dtype=np.int64)
        cand[has] = self.buf[lo[has]]
        ok = has & (self.pid[np.maximum(cand, 0)] == ids)
        out[ok] = cand[ok]
        for k in np.flatnonzero(~ok).tolist():
            p = self.first_live(int(ids[k]))
            if p >= 0:
                out[k] = p
        return out

    # -- one merge --------------------------------------------------------------------------
    def apply_merge(self, a: int, b: int, t: int) -> int:
        """Merge every live occurrence of (a, b) into token t (which must be the next token);
        returns the corpus tokens removed (0 when the pair does not occur here)."""
        i = self.find_pair(a, b)
        if i is None:
            self._end_segment()
            return 0
        return self.apply_id(i, t)[0]

    def apply_id(self, i: int, t: int) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Merge every live occurrence of pair ``i`` into token t (left to right within a
        word). Counts of the pairs that lose occurrences are lowered in ``cnt``; returns the
        corpus tokens removed and the new pairs (ids, counts, first positions)."""
        lo, hi = int(self.lo[i]), int(self.hi[i])
        if hi - lo <= SMALL:
            out = self._apply_small(i, t, lo, hi)
        else:
            out = self._apply_vectorized(i, t, lo, hi)
        self._end_segment()
        return out

    def _apply_vectorized(self, i: int, t: int, lo: int, hi: int
                          ) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        nxt, prv, tok, pid = self.nxt, self.prv, self.tok, self.pid
        # index arrays as intp once (numpy would convert int32 indices on every use)
        stored = self.buf[lo:hi].astype(np.intp)
        first = stored[pid[stored] == i]  # live occurrences, ascending
        if len(first) > 1 and self.pair_left[i] == self.pair_right[i]:
            first = left_to_right(first, nxt)
        second = nxt[first].astype(np.intp)
        left = prv[first].astype(np.intp)
        right = nxt[second].astype(np.intp)
        has_right = right >= 0
        lost = sorted_unique(np.concatenate([left[left >= 0], first, second[has_right]]))
        lost_ids, lost_w = pid[lost].astype(np.intp), self.weights(lost)
        np.subtract.at(self.cnt, lost_ids, lost_w)
        if self.journal is not None:
            self.journal.append((lost_ids.astype(np.int64), -lost_w))
        removed = int(self.weights(first).sum())
        self.total_tokens -= removed
        self.live_tokens -= len(first)
        # relink
        tok[first] = t
        tok[second] = -1
        pid[second] = -1
        pid[first] = -1
        nxt[first] = right
        prv[right[has_right]] = first[has_right]
        new_left = prv[first].astype(np.intp)
        new = sorted_unique(np.concatenate([new_left[new_left >= 0], first[has_right]]))
        self.lo[i] = hi
        return removed, self._register(new)

    def _apply_small(self, i: int, t: int, lo: int, hi: int
                     ) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``_apply_vectorized`` for a pair with few stored positions, in plain Python: the
        same steps without the fixed cost of a dozen numpy calls (most late merges)."""
        tok, nxt, prv, pid, cnt, weight = self.tok, self.nxt, self.prv, self.pid, self.cnt, \
            self.weight
        kept = left_to_right_few([p for p in self.buf[lo:hi].tolist() if pid[p] == i], nxt)
        lost: set[int] = set()
        removed = 0
        for p in kept:
            j = int(nxt[p])
            left = int(prv[p])
            if left >= 0:
                lost.add(left)
            lost.add(p)
            if nxt[j] >= 0:
                lost.add(j)
            removed += weight(p)
        journal_ids, journal_w = [], []
        for q in lost:
            k, c = int(pid[q]), weight(q)
            cnt[k] -= c
            journal_ids.append(k)
            journal_w.append(-c)
        if self.journal is not None:
            self.journal.append((np.array(journal_ids, dtype=np.int64),
                                 np.array(journal_w, dtype=np.int64)))
        self.total_tokens -= removed
        self.live_tokens -= len(kept)
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
        tok, nxt, weight = self.tok, self.nxt, self.weight
        groups: dict[int, list[int]] = {}
        for q in pos:
            groups.setdefault(pack_pair(int(tok[q]), int(tok[nxt[q]])), []).append(q)
        self._reserve(len(groups), len(pos))
        first_id, at = self.n_ids, self.buf_len
        ids, sums, firsts = [], [], []
        buf, pid = self.buf, self.pid
        for n, k in enumerate(sorted(groups)):
            qs = groups[k]
            i = first_id + n
            c = sum(weight(q) for q in qs)
            buf[at : at + len(qs)] = qs
            pid[qs] = i
            self.lo[i], self.hi[i] = at, at + len(qs)
            self.cnt[i] = c
            self.pair_left[i], self.pair_right[i] = unpack_pair(k)
            at += len(qs)
            ids.append(i)
            sums.append(c)
            firsts.append(qs[0])
        self.n_ids = first_id + len(groups)
        self.buf_len = at
        out = (np.array(ids, dtype=np.int64), np.array(sums, dtype=np.int64),
               np.array(firsts, dtype=np.int64))
        if self.journal is not None:
            self.journal.append(out[:2])
        return out

    # -- the working set, for hand-off and checks ------------------------------------------------
    def words(self, min_tokens: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The current words with at least ``min_tokens`` tokens (by default those that can
        still change), in first-seen order: (flat tokens, tokens per word, word counts)."""
        live = np.flatnonzero(self.tok >= 0)
        starts = live[self.prv[live] < 0]  # first token of each word
        wid = np.cumsum(self.prv[live] < 0) - 1
        lengths = np.bincount(wid, minlength=len(starts)).astype(np.int64)
        keep = lengths >= min_tokens
        sel = keep[wid]
        return self.tok[live[sel]], lengths[keep], self.weights(starts[keep])


class LocalTrainer:
    """Exact incremental trainer on one process: the ``local`` engine.

    The heap holds only pairs counted at least ``floor`` times (plus stale entries, fixed
    lazily); the exact counts of all pairs are in the state's ``cnt`` array. Counts only fall
    after a pair's creation, so while the heap's best count is at least ``floor``, no pair
    outside it can win or tie. When it drops below, the floor is halved and the pairs that
    reach it are pushed. Most pairs are rare, so the heap stays a small fraction of them.
    """

    def __init__(
        self,
        flat_tokens: np.ndarray,
        lengths: np.ndarray,
        counts: np.ndarray,
        token_bytes: Sequence[bytes],
    ):
        """``flat_tokens`` may use any token that exists already (``token_bytes``: the bytes
        of every token so far); new ids continue after them."""
        self.state = FlatMergeState.build(flat_tokens, lengths, counts, len(token_bytes))
        self.token_len = [len(t) for t in token_bytes]
        self.merges: list[Merge] = []
        self.removed: list[int] = []  # corpus tokens removed by each merge
        self.min_count = 1  # never push pairs below this (set by train)
        self.in_heap = np.zeros(max(self.state.n_ids, MIN_CAPACITY), dtype=bool)
        self.heap: list[tuple[int, int, int]] = []
        ids, sums, firsts = self.state.initial_pairs()
        top = np.sort(sums)[::-1]
        self.floor = int(top[min(len(top), HEAP_START) - 1]) if len(top) else 1
        self._push(ids, sums, firsts)
        heapq.heapify(self.heap)

    @classmethod
    def from_words(
        cls, words: Sequence[Sequence[int]], counts: Sequence[int], token_bytes: Sequence[bytes]
    ) -> LocalTrainer:
        """A trainer of words given as lists of token ids (small inputs: tests, examples)."""
        lengths = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
        flat = np.fromiter((t for w in words for t in w), dtype=np.int64, count=int(lengths.sum()))
        return cls(flat, lengths, np.asarray(counts, dtype=np.int64), token_bytes)

    @property
    def next_id(self) -> int:
        return len(self.token_len)

    def _push(self, ids: np.ndarray, sums: np.ndarray, firsts: np.ndarray) -> None:
        """Push the pairs counted at least ``floor`` (and ``min_count``) times."""
        keep = sums >= max(self.floor, self.min_count)
        if not keep.any():
            return
        ids = ids[keep]
        self._cover(int(ids.max()) + 1)
        self.in_heap[ids] = True
        push, heap = heapq.heappush, self.heap
        for c, first, k in zip(sums[keep].tolist(), firsts[keep].tolist(), ids.tolist()):
            push(heap, heap_entry(c, first, k))

    def _cover(self, n: int) -> None:
        """Grow ``in_heap`` to hold pair ids below ``n`` (pairs made since it last grew)."""
        if n > len(self.in_heap):
            grown = np.zeros(max(n, 2 * len(self.in_heap)), dtype=bool)
            grown[: len(self.in_heap)] = self.in_heap
            self.in_heap = grown

    def _lower_floor(self) -> bool:
        """Halve the floor and push the pairs that reach it; False when nothing is left."""
        if self.floor <= self.min_count:
            return False
        self.floor = max(self.floor // 2, self.min_count)
        st = self.state
        n = st.n_ids
        cnt = st.cnt[:n]
        self._cover(n)  # (pairs made since the last push that grew it: none reached the floor)
        ids = np.flatnonzero((cnt >= self.floor) & ~self.in_heap[:n])
        self._push(ids, cnt[ids], st.buf[st.lo[ids]].astype(np.int64))
        return True

    def _record(self, a: int, b: int, count: int, removed: int) -> Merge:
        t = self.next_id
        self.token_len.append(self.token_len[a] + self.token_len[b])
        m = Merge(a, b, t, count)
        self.merges.append(m)
        self.removed.append(removed)
        return m

    def _apply(self, i: int, count: int) -> Merge:
        st = self.state
        a, b = int(st.pair_left[i]), int(st.pair_right[i])
        removed, (ids, sums, firsts) = st.apply_id(i, self.next_id)
        self._push(ids, sums, firsts)
        return self._record(a, b, count, removed)

    def _pop(self) -> None:
        self.in_heap[heapq.heappop(self.heap)[2]] = False  # (-count, position, id)

    def best_pair(self, max_token_bytes: int | None = None) -> tuple[int, int] | None:
        """(pair id, count) of the pair the sequential trainer merges next, or None."""
        heap, state = self.heap, self.state
        cnt, lefts, rights = state.cnt, state.pair_left, state.pair_right
        tl = self.token_len
        while True:
            # heap entries are order.heap_entry tuples (-count, position, id), read inline here
            # (order.unpack_entry elsewhere): this loop runs once per merge and once more for
            # every stale entry it pops
            if not heap or -heap[0][0] < self.floor:
                if self._lower_floor():
                    continue
                if not heap:
                    return None
            negc, pos, i = heap[0]
            c = int(cnt[i])
            if c != -negc:
                if c:
                    heapq.heapreplace(heap, heap_entry(c, pos, i))
                else:
                    self._pop()
                continue
            if max_token_bytes is not None and tl[lefts[i]] + tl[rights[i]] > max_token_bytes:
                # never mergeable: it stays marked as in the heap, so that a lower floor does
                # not push it again (a push by a count change is popped here again)
                heapq.heappop(heap)
                continue
            real = state.first_live(i)
            if real != pos:
                heapq.heapreplace(heap, heap_entry(c, real, i))
                continue
            return i, c

    def train(self, num_merges: int, min_pair_count: int = 2,
              max_token_bytes: int | None = None) -> list[Merge]:
        """Run until ``num_merges`` merges in total have been made (or no pair qualifies)."""
        if min_pair_count < self.min_count:
            raise ValueError("min_pair_count cannot go below an earlier train() call's")
        self.min_count = min_pair_count
        while len(self.merges) < num_merges:
            best = self.best_pair(max_token_bytes)
            if best is None or best[1] < min_pair_count:
                break
            self._apply(*best)
        return self.merges

    def replay(self, merges: Sequence[Merge]) -> None:
        """Apply known merges (resume, or another text); each must be the next id."""
        for m in merges:
            if m.new_id != self.next_id:
                raise ValueError(f"merge {m} does not continue at id {self.next_id}")
            i = self.state.find_pair(m.left, m.right)
            if i is None:  # the pair does not occur here
                self.state._end_segment()
                self._record(m.left, m.right, m.count, 0)
            else:
                self._apply(i, m.count)
