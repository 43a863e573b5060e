"""What merge rounds report back to the driver: per pair, the count delta and the smallest
position left (pure numpy, no Spark)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.engines.local import group_sum


@dataclass
class PairDeltas:
    """What one round (or the initial count) did in one or more partitions: per pair key
    (sorted) the count delta, the lowest partition that reported it, and the smallest position
    the pair still has in that partition (NO_POSITION if none). Positions are global: words of
    all partitions end to end, in first-seen order."""

    keys: np.ndarray  # int64 pair keys, ascending
    deltas: np.ndarray  # int64
    part: np.ndarray  # int32 partition index
    min_pos: np.ndarray  # int64
    removed: np.ndarray  # corpus tokens removed by each merge of the batch
    tokens: int  # tokens left in the working set (unweighted)
    work: float = 0.0  # seconds the slowest partition spent on it (the rest is overhead)

    @classmethod
    def empty(cls, batch_len: int = 0) -> PairDeltas:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, z.astype(np.int32), z, np.zeros(batch_len, dtype=np.int64), 0)


def combine(x: PairDeltas, y: PairDeltas) -> PairDeltas:
    """Merge two reports: deltas add up; the position reported by the lowest partition wins
    (:func:`combine_entry` for one pair)."""
    keys = np.concatenate([x.keys, y.keys])
    part = np.concatenate([x.part, y.part])
    keys, sums, order, starts = group_sum(keys, np.concatenate([x.deltas, y.deltas]),
                                          np.lexsort((part, keys)))  # lowest partition first
    first = order[starts]
    mins = np.concatenate([x.min_pos, y.min_pos])
    return PairDeltas(keys, sums, part[first], mins[first], x.removed + y.removed,
                      x.tokens + y.tokens, max(x.work, y.work))


def combine_entry(x: tuple[int, int, int], y: tuple[int, int, int]) -> tuple[int, int, int]:
    """:func:`combine` for one pair's (delta, partition, smallest position): a reduceByKey
    function."""
    return (x[0] + y[0], *min(x[1:], y[1:]))


def combine_all(reports: list[PairDeltas], batch_len: int = 0) -> PairDeltas:
    out = PairDeltas.empty(batch_len)
    for r in reports:
        out = combine(out, r)
    return out


__all__ = ["PairDeltas", "combine", "combine_all"]
