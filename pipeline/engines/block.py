"""Merge rounds on one partition of the working set (numpy, no Spark).

A *block* holds the words of one partition, sorted by ``first_seen``: their current tokens laid
end to end (``tok``), the initial-symbol offset where each token starts (``sp``; tie keys use it,
so a pair's key never moves when tokens before it merge), per-word lengths, counts and
``first_seen``. A round replays a batch of merges, in order, on the words that contain one of
them, and reports per pair: the count delta and the smallest position left in this block.

Positions are ``first_seen << POS_BITS | symbol offset``: the same order as the corpus.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.engines.local import group_sum

POS_BITS = 24
MAX_WORD_SYMBOLS = 1 << POS_BITS
NO_POS = np.int64(1) << np.int64(62)  # "this block has no occurrence left"


@dataclass
class Block:
    tok: np.ndarray  # int32, current tokens of all words, end to end
    sp: np.ndarray  # int32, initial-symbol offset of each token inside its word
    lengths: np.ndarray  # int64, tokens per word
    counts: np.ndarray  # int64
    first_seen: np.ndarray  # int64, ascending

    @property
    def num_tokens(self) -> int:
        return int(self.tok.shape[0])

    @classmethod
    def from_symbols(cls, flat: np.ndarray, lengths: np.ndarray, counts: np.ndarray,
                     first_seen: np.ndarray) -> Block:
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(lengths) and int(lengths.max()) >= MAX_WORD_SYMBOLS:
            raise ValueError(
                f"a word has {int(lengths.max())} symbols; the limit is {MAX_WORD_SYMBOLS - 1} "
                "(use a split pattern instead of 'none' for such long rows)"
            )
        starts = np.cumsum(lengths) - lengths
        sp = (np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths))
        keep = lengths >= 2
        blk = cls(np.asarray(flat, dtype=np.int32), sp.astype(np.int32), lengths,
                  np.asarray(counts, dtype=np.int64), np.asarray(first_seen, dtype=np.int64))
        return blk.select_words(keep) if not keep.all() else blk

    def renumbered(self, first: int) -> Block:
        """The same words with first_seen = first, first + 1, ... (order kept)."""
        fs = np.arange(first, first + len(self.lengths), dtype=np.int64)
        return Block(self.tok, self.sp, self.lengths, self.counts, fs)

    def word_ids(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.lengths), dtype=np.int64), self.lengths)

    def select_words(self, mask: np.ndarray) -> Block:
        pos_mask = np.repeat(mask, self.lengths)
        return Block(self.tok[pos_mask], self.sp[pos_mask], self.lengths[mask],
                     self.counts[mask], self.first_seen[mask])

    def pair_positions(self) -> np.ndarray:
        """Indices i such that tokens i and i+1 are in the same word."""
        ends = np.cumsum(self.lengths) - 1
        valid = np.ones(max(self.num_tokens - 1, 0), dtype=bool)
        valid[ends[:-1]] = False
        return np.flatnonzero(valid)

    def pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pair keys, weights, positions) of every adjacent pair."""
        i = self.pair_positions()
        keys = (self.tok[i].astype(np.int64) << 32) | self.tok[i + 1].astype(np.int64)
        wid = self.word_ids()[i]
        pos = (self.first_seen[wid] << POS_BITS) | self.sp[i].astype(np.int64)
        return keys, self.counts[wid], pos


def merge_in_block(blk: Block, a: int, b: int, t: int) -> tuple[Block, int]:
    """Merge (a, b) -> t in every word of ``blk`` (left to right). Returns the new block and the
    number of corpus tokens removed (weighted by word counts)."""
    i = blk.pair_positions()
    hit = i[(blk.tok[i] == a) & (blk.tok[i + 1] == b)]
    if len(hit) == 0:
        return blk, 0
    if a == b and len(hit) > 1:
        overlap = np.zeros(len(hit), dtype=bool)
        overlap[1:] = hit[1:] == hit[:-1] + 1
        if overlap.any():
            idx = np.arange(len(hit))
            run_start = np.maximum.accumulate(np.where(overlap, 0, idx))
            hit = hit[((idx - run_start) & 1) == 0]
    wid = blk.word_ids()
    tok = blk.tok.copy()
    tok[hit] = t
    keep = np.ones(len(tok), dtype=bool)
    keep[hit + 1] = False
    lost = np.bincount(wid[hit], minlength=len(blk.lengths))
    removed = int(blk.counts[wid[hit]].sum())
    return Block(tok[keep], blk.sp[keep], blk.lengths - lost, blk.counts, blk.first_seen), removed


@dataclass
class Report:
    """What a round did in one block: per pair (sorted by key) the count delta, this block's
    index, and the smallest position the pair still has here (NO_POS if none)."""

    keys: np.ndarray
    deltas: np.ndarray
    part: np.ndarray
    min_pos: np.ndarray
    removed: np.ndarray  # tokens removed by each merge of the batch
    tokens: int  # tokens left in this block's working set
    words: int


def min_pos_of(keys: np.ndarray, pos: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """For each key in sorted ``wanted``: the smallest ``pos`` with that key (NO_POS if none)."""
    out = np.full(len(wanted), NO_POS, dtype=np.int64)
    if len(wanted) == 0 or len(keys) == 0:
        return out
    sel = np.isin(keys, wanted)
    k, p = keys[sel], pos[sel]
    if len(k):
        order = np.lexsort((p, k))
        k, p = k[order], p[order]
        first = np.r_[True, k[1:] != k[:-1]]
        out[np.searchsorted(wanted, k[first])] = p[first]
    return out


def apply_round(blk: Block, batch: list[tuple[int, int, int]], part: int) -> tuple[Block, Report]:
    """Replay ``batch`` (a, b, t) in order on the words containing one of its pairs."""
    keys, weights, pos = blk.pairs()
    batch_keys = np.array([(a << 32) | b for a, b, _ in batch], dtype=np.int64)
    removed = np.zeros(len(batch), dtype=np.int64)
    i = blk.pair_positions()
    hit_words = np.zeros(len(blk.lengths), dtype=bool)
    if len(i):
        hit_words[blk.word_ids()[i[np.isin(keys, batch_keys)]]] = True
    if not hit_words.any():
        empty = np.zeros(0, dtype=np.int64)
        return blk, Report(empty, empty, empty.astype(np.int32), empty, removed,
                           blk.num_tokens, len(blk.lengths))
    sub = blk.select_words(hit_words)
    k0, w0, _ = sub.pairs()
    for j, (a, b, t) in enumerate(batch):
        sub, removed[j] = merge_in_block(sub, a, b, t)
    k1, w1, p1 = sub.pairs()
    uk, sums, _, _ = group_sum(np.concatenate([k0, k1]), np.concatenate([-w0, w1]))
    nz = sums != 0
    uk, sums = uk[nz], sums[nz]
    # smallest positions after the round: untouched words keep theirs, hit words have new ones
    untouched = ~np.repeat(hit_words, blk.lengths)[i]
    all_keys = np.concatenate([keys[untouched], k1])
    all_pos = np.concatenate([pos[untouched], p1])
    mins = min_pos_of(all_keys, all_pos, uk)
    # splice: hit words replaced by their new tokens, single-token words leave
    out = _splice(blk, hit_words, sub)
    rep = Report(uk, sums, np.full(len(uk), part, dtype=np.int32), mins, removed,
                 out.num_tokens, len(out.lengths))
    return out, rep


def _splice(blk: Block, hit_words: np.ndarray, sub: Block) -> Block:
    """Put the rewritten words back in place (single-token words then leave)."""
    lengths = blk.lengths.copy()
    lengths[hit_words] = sub.lengths
    new_starts = np.cumsum(lengths) - lengths
    old_starts = np.cumsum(blk.lengths) - blk.lengths
    wid = blk.word_ids()
    idx_old = np.flatnonzero(~hit_words[wid])
    w_old = wid[idx_old]
    dest_old = new_starts[w_old] + (idx_old - old_starts[w_old])
    sw = sub.word_ids()
    sub_starts = np.cumsum(sub.lengths) - sub.lengths
    hit_idx = np.flatnonzero(hit_words)
    dest_sub = new_starts[hit_idx[sw]] + (np.arange(sub.num_tokens) - sub_starts[sw])
    total = int(lengths.sum())
    tok = np.empty(total, dtype=np.int32)
    sp = np.empty(total, dtype=np.int32)
    tok[dest_old], sp[dest_old] = blk.tok[idx_old], blk.sp[idx_old]
    tok[dest_sub], sp[dest_sub] = sub.tok, sub.sp
    out = Block(tok, sp, lengths, blk.counts, blk.first_seen)
    keep = lengths >= 2
    return out if keep.all() else out.select_words(keep)


def combine_reports(x: Report, y: Report) -> Report:
    """Merge two reports: deltas add up; the position reported by the lowest block wins."""
    keys = np.concatenate([x.keys, y.keys])
    part = np.concatenate([x.part, y.part])
    order = np.lexsort((part, keys))
    keys, part = keys[order], part[order]
    deltas = np.concatenate([x.deltas, y.deltas])[order]
    mins = np.concatenate([x.min_pos, y.min_pos])[order]
    first = np.r_[True, keys[1:] != keys[:-1]] if len(keys) else np.zeros(0, dtype=bool)
    starts = np.flatnonzero(first)
    sums = np.add.reduceat(deltas, starts) if len(starts) else deltas[:0]
    return Report(keys[starts], sums, part[starts], mins[starts], x.removed + y.removed,
                  x.tokens + y.tokens, x.words + y.words)


def initial_report(blk: Block, part: int, batch_len: int = 0) -> Report:
    """Counts and smallest positions of every pair in the block."""
    keys, weights, pos = blk.pairs()
    uk, sums, _, _ = group_sum(keys, weights)
    mins = min_pos_of(keys, pos, uk)
    return Report(uk, sums, np.full(len(uk), part, dtype=np.int32), mins,
                  np.zeros(batch_len, dtype=np.int64), blk.num_tokens, len(blk.lengths))


def min_positions(blk: Block, wanted: np.ndarray, part: int) -> Report:
    """Exact smallest positions of the ``wanted`` pairs (sorted keys) in this block."""
    keys, _, pos = blk.pairs()
    mins = min_pos_of(keys, pos, wanted)
    present = mins != NO_POS
    z = np.zeros(int(present.sum()), dtype=np.int64)
    return Report(wanted[present], z, np.full(len(z), part, dtype=np.int32), mins[present],
                  np.zeros(0, dtype=np.int64), 0, 0)


def replay_block(blk: Block, merges: list[tuple[int, int, int]]) -> Block:
    """Apply known merges (a, b, t), in order, to a block of initial symbols (resume)."""
    from pipeline.engines.local import FlatMergeState

    if not merges or len(blk.lengths) == 0:
        return blk
    st = FlatMergeState(blk.tok, blk.lengths, blk.counts)
    st.initial_counts()
    for a, b, t in merges:
        st.apply_merge(a, b, t)
    tok, sp, lengths = st.current()
    out = Block(tok, sp, lengths, blk.counts, blk.first_seen)
    keep = lengths >= 2
    return out if keep.all() else out.select_words(keep)
