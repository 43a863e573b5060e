"""The merge order, stated once: which pair the sequential trainer merges next.

1. The pair with the highest count wins.
2. Ties go to the pair seen first: the pair whose first occurrence in the corpus, as currently
   tokenized, comes earliest (corpus order: files by path, rows in file order, words in text
   order; docs/DESIGN.md section 2).

Every engine lays the distinct words end to end in first-seen order and numbers their symbol
positions, so "first occurrence" is a pair's smallest live *position* and the rule is one
tuple comparison: :func:`priority` (smaller wins). The oracle in ``bpe.py`` gets the same order
from a dict's insertion order; the engines keep heaps of :func:`heap_entry` tuples (read back
with :func:`unpack_entry`). The count stage records each word's first occurrence as one
order-preserving int64 (:class:`FirstSeenLayout`), the order the engines lay words out in.

Inside one word, overlapping occurrences of a pair ``(a, a)`` (a run ``a a a``) merge left to
right: :func:`left_to_right`.

Pairs of token ids are packed into one int64 key, ``left << 32 | right`` (:func:`pack_pair`),
so that sorting keys sorts pairs by (left, right) and a pair is one number in numpy arrays,
dicts and Spark records. Token ids are below 2**31, so a key is never negative: the Spark
engine sends side information under negative keys in the same records.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import overload

import numpy as np

NO_POSITION = 1 << 62  # "no occurrence": after every real position
_LOW = 0xFFFFFFFF


def priority(count: int, position: int) -> tuple[int, int]:
    """The order of candidates: higher count first, then the earlier first occurrence."""
    return (-count, position)


def heap_entry(count: int, position: int, ident: int) -> tuple[int, int, int]:
    """A heap entry for a pair (``ident``: its id or key); heapq pops the winner first.

    Its first two fields are :func:`priority` (spelled out here: the engines push one per
    count change); the local engine's hot loop reads them inline."""
    return (-count, position, ident)


def unpack_entry(entry: tuple[int, int, int]) -> tuple[int, int, int]:
    """(count, position, ident) of a :func:`heap_entry`."""
    negc, position, ident = entry
    return -negc, position, ident


def pack_pair(left: int, right: int) -> int:
    return (left << 32) | right


def pack_pairs(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    return (np.asarray(left, dtype=np.int64) << np.int64(32)) | np.asarray(right, dtype=np.int64)


@overload
def unpack_pair(key: int) -> tuple[int, int]: ...
@overload
def unpack_pair(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...
def unpack_pair(key):
    return key >> 32, key & _LOW


def left_to_right(first: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    """Of the occurrences of one pair at increasing positions ``first`` (``nxt``: each
    position's next live position), those that merge: where occurrences overlap (a pair
    ``(a, a)`` in a run ``a a a ...``), the 1st, 3rd, ... of each chain, as a left-to-right
    scan takes them."""
    if len(first) < 2:
        return first
    chained = nxt[first[:-1]] == first[1:]  # this occurrence's right symbol starts the next
    if not chained.any():
        return first
    # chains begin at 0 and after each break; keep the even offsets in each: the even
    # indices, flipped along the chains that begin at an odd index (a few byte-wide passes;
    # a running maximum over int64 indices needs 0.6 GB of temporaries on a 20 M-letter run)
    n = len(first)
    starts = np.concatenate(([0], np.flatnonzero(~chained) + 1))
    keep = np.zeros(n, dtype=bool)
    keep[::2] = True
    odd = (starts & 1).astype(bool)
    if odd.any():
        keep ^= np.repeat(odd, np.diff(np.append(starts, n)))
    return first[keep]


def left_to_right_few(first: list[int], nxt) -> list[int]:
    """:func:`left_to_right` for a few positions, in plain Python (no fixed cost of numpy
    calls: most late merges touch a handful of positions): the same rule, one at a time."""
    kept: list[int] = []
    for p in first:
        if not kept or int(nxt[kept[-1]]) != p:  # not the right half of the kept a a
            kept.append(p)
    return kept


CORPUS_KEY = ("file", "block", "row", "rank")
"""The fields of an occurrence's place in corpus order, most significant first: the file's
index in path order, the block (split) of the file it was read in, the row in that block, the
word's rank in its row."""


def corpus_order(file: np.ndarray, block: np.ndarray, row: np.ndarray, rank: np.ndarray
                 ) -> np.ndarray:
    """The indices that sort occurrences into corpus order (:data:`CORPUS_KEY`)."""
    return np.lexsort((rank, row, block, file))


@dataclass(frozen=True)
class FirstSeenLayout:
    """Bit layout packing a first occurrence (file, row, rank in row) into one int64 whose
    order is the corpus order. ``pack`` works on ints and on numpy int64 arrays;
    :meth:`pack_by` spells the same packing with other operators (the count's Spark SQL)."""

    row_bits: int
    rank_bits: int

    @classmethod
    def fit(cls, files: int, max_row: int, max_rank: int) -> FirstSeenLayout | None:
        """The layout for these maxima, or None when they need more than 63 bits."""
        fb, rb, kb = (max(files - 1, 0).bit_length(), max_row.bit_length(),
                      max_rank.bit_length())
        return cls(rb, kb) if fb + rb + kb <= 63 else None

    @property
    def file_shift(self) -> int:
        return self.row_bits + self.rank_bits

    def pack(self, file, row, rank):
        return self.pack_by(file, row, rank, operator.lshift, operator.or_)

    def pack_by(self, file, row, rank, shift_left, bit_or):
        """:meth:`pack` with the given shift and or (e.g. Spark's ``shiftleft`` and
        ``Column.bitwiseOR`` on int64 columns)."""
        return bit_or(bit_or(shift_left(file, self.file_shift), shift_left(row, self.rank_bits)),
                      rank)
