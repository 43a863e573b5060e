"""The merge order (pipeline.order), stated on tiny examples: the highest count wins; a tie goes
to the pair seen first in corpus order, not to the smaller pair. Every engine and the oracle
follow it; the pair-key packing sorts like the pairs it packs."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from pipeline.bpe import initial_words, tokens_after, train_oracle
from pipeline.engines.local import LocalTrainer
from pipeline.engines.rounds import InProcessPartitions, run_rounds
from pipeline.order import (
    CORPUS_KEY,
    NO_POSITION,
    FirstSeenLayout,
    corpus_order,
    heap_entry,
    left_to_right,
    left_to_right_few,
    pack_pair,
    pack_pairs,
    priority,
    unpack_entry,
    unpack_pair,
)


def test_the_rule():
    assert priority(3, 10) < priority(2, 0)  # a higher count wins wherever it was first seen
    assert priority(2, 4) < priority(2, 5)  # equal counts: the earlier first occurrence wins
    assert priority(1, 10**12) < priority(1, NO_POSITION)
    heap = [heap_entry(2, 5, 7), heap_entry(1, 0, 8), heap_entry(2, 4, 9)]
    heapq.heapify(heap)
    assert unpack_entry(heapq.heappop(heap)) == (2, 4, 9)
    # a heap entry orders as its priority does: the rule is priority, the entry only carries it
    for count, position in [(3, 10), (2, 0), (2, 4), (1, NO_POSITION)]:
        assert heap_entry(count, position, 0)[:2] == priority(count, position)


def test_overlapping_occurrences_merge_left_to_right():
    # "a a a a a b a a": (a, a) starts at 0, 1, 2, 3 (one chain) and at 6
    nxt = np.array([1, 2, 3, 4, 5, 6, 7, -1])
    assert left_to_right(np.array([0, 1, 2, 3, 6]), nxt).tolist() == [0, 2, 6]
    # with merged-away positions (nxt skips them): 0 -> 2 -> 4 is one chain of three
    nxt = np.array([2, -1, 4, -1, 5, -1])
    assert left_to_right(np.array([0, 2, 4]), nxt).tolist() == [0, 4]
    assert left_to_right(np.array([3]), nxt).tolist() == [3]
    # a chain that begins at an odd index of ``first`` (0 alone, then 2 3 4): 2 and 4
    nxt = np.array([1, 2, 3, 4, 5, -1])
    assert left_to_right(np.array([0, 2, 3, 4]), nxt).tolist() == [0, 2, 4]
    # the plain-Python form (few positions) keeps the same ones, on every chain shape
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 12))
        nxt = np.r_[np.arange(1, n), -1]
        first = np.flatnonzero(rng.random(n - 1) < 0.7) if n > 1 else np.array([], int)
        assert left_to_right_few(first.tolist(), nxt) == left_to_right(first, nxt).tolist()
    # the oracle agrees: "aaaaa" with one merge of (a, a) is aa aa a
    ids, base = initial_words([b"aaaaa"])
    merges = train_oracle(ids, [1], base.tokens, 1, min_pair_count=1)
    assert tokens_after(ids, [1], merges) == [3]


def test_first_seen_packing_keeps_corpus_order():
    layout = FirstSeenLayout.fit(files=3, max_row=1000, max_rank=70)
    keys = [(0, 0, 5), (0, 1, 0), (0, 1000, 70), (1, 0, 0), (2, 999, 1)]
    packed = [layout.pack(*k) for k in keys]
    assert packed == sorted(packed) and len(set(packed)) == len(keys)
    f, r, k = (np.array(c, dtype=np.int64) for c in zip(*keys))
    assert layout.pack(f, r, k).tolist() == packed  # the numpy form is the same packing
    assert FirstSeenLayout.fit(files=2**20, max_row=2**30, max_rank=2**20) is None
    # spelled with other operators (Spark SQL's), the same packing: here with Python's own
    assert [layout.pack_by(*k, lambda x, n: x * 2**n, lambda x, y: x + y) for k in keys] == packed


def test_corpus_order_is_file_block_row_rank():
    assert CORPUS_KEY == ("file", "block", "row", "rank")
    rng = np.random.default_rng(3)
    places = rng.integers(0, 3, size=(40, 4))
    by_order = places[corpus_order(*places.T)]
    assert [tuple(p) for p in by_order] == sorted(tuple(p) for p in places)


def _first_merge(words: list[bytes], counts: list[int], engine: str) -> tuple[bytes, bytes]:
    ids, base = initial_words(words)
    if engine == "oracle":
        merges = train_oracle(ids, counts, base.tokens, 1)
    elif engine == "local":
        merges = LocalTrainer.from_words(ids, counts, base.tokens).train(1, 2, None)
    else:  # the round engine, one word per partition
        parts = InProcessPartitions([(np.array(w), np.array([len(w)]), np.array([c]))
                                     for w, c in zip(ids, counts)], 256)
        merges = run_rounds(parts, [1] * 256, 1, 2, None, 4).merges
    m = merges[0]
    return bytes([m.left]), bytes([m.right])


@pytest.mark.parametrize("engine", ["oracle", "local", "rounds"])
def test_every_engine_breaks_a_tie_by_first_occurrence(engine):
    # "cd" and "ab" both occur twice: the pair seen first wins, whichever sorts first
    assert _first_merge([b"cd", b"ab"], [2, 2], engine) == (b"c", b"d")
    assert _first_merge([b"ab", b"cd"], [2, 2], engine) == (b"a", b"b")
    # inside one word: "zy" comes before "xw" in "zyxw"
    assert _first_merge([b"zyxw"], [2], engine) == (b"z", b"y")
    # a count beats an earlier first occurrence
    assert _first_merge([b"cd", b"ab"], [2, 3], engine) == (b"a", b"b")


def test_pair_keys_sort_like_pairs():
    # token ids stay below 2**31 (the left one is shifted into an int64)
    pairs = [(0, 1), (0, 0xFFFFFFFF), (1, 0), (5, 3), (70000, 2), (2**31 - 1, 2**32 - 1)]
    keys = [pack_pair(a, b) for a, b in pairs]
    assert [unpack_pair(k) for k in keys] == pairs
    assert sorted(keys) == [pack_pair(a, b) for a, b in sorted(pairs)]
    left, right = np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
    packed = pack_pairs(left, right)
    assert packed.tolist() == keys
    back_left, back_right = unpack_pair(packed)
    assert back_left.tolist() == left.tolist() and back_right.tolist() == right.tolist()
