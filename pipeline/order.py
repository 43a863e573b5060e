"""The merge order, stated once: which pair the sequential trainer merges next.

1. The pair with the highest count wins.
2. Ties go to the pair seen first: the pair whose first occurrence in the corpus, as currently
   tokenized, comes earliest (corpus order: files by path, rows in file order, words in text
   order; docs/DESIGN.md section 2).

Every engine lays the distinct words end to end in first-seen order and numbers their symbol
positions, so "first occurrence" is a pair's smallest live *position* and the rule is one
tuple comparison: :func:`priority` (smaller wins). The oracle in ``bpe.py`` gets the same order
from a dict's insertion order; the engines keep heaps of :func:`heap_entry` tuples.

Pairs of token ids are packed into one int64 key, ``left << 32 | right`` (:func:`pack_pair`),
so that sorting keys sorts pairs by (left, right) and a pair is one number in numpy arrays,
dicts and Spark records.
"""

from __future__ import annotations

from typing import overload

import numpy as np

NO_POSITION = 1 << 62  # "no occurrence": after every real position
_LOW = 0xFFFFFFFF


def priority(count: int, position: int) -> tuple[int, int]:
    """The order of candidates: higher count first, then the earlier first occurrence."""
    return (-count, position)


def heap_entry(count: int, position: int, ident: int) -> tuple[int, int, int]:
    """A heap entry for a pair (``ident``: its id or key); heapq pops the winner first."""
    return (-count, position, ident)


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
