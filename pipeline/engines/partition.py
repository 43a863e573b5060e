"""One partition of the Spark engine's working set (numpy, no Spark): the words of one
``first_seen`` range as a :class:`FlatMergeState`, the same structure the local engine uses.

A round replays a batch of merges, in order, on the partition: only the occurrences of the
merged pairs are visited (their positions are stored per pair), and the round reports per pair
whose count changed here its count delta and smallest position left. The cost is that of the
words the batch touches, never of the whole partition.

Between rounds the state stays where it was built, in the executor's scratch directory (one of
``SPARK_LOCAL_DIRS``), as memory-mapped ``.npy`` files plus ``state.json``; a task of the next
round opens it in microseconds instead of receiving it from the JVM. The rules that keep it
exact when tasks are retried, duplicated or moved (:class:`PartitionStore`):

- ``state.json`` says how many merges the arrays hold (``gen``), which round wrote them last,
  and ``dirty`` while a task is changing them. A lock file serializes tasks of one partition.
- A task whose state is behind replays the missing merges from the history it is given; one
  that finds its round already applied returns the saved report of that round; a missing or
  dirty state raises :class:`PartitionLost`, and the driver rebuilds the partition from the
  word table (``engines/spark.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from pipeline.engines.deltas import PairDeltas
from pipeline.engines.local import (
    PAIR_ARRAYS,
    POSITION_ARRAYS,
    SCALARS,
    WORD_ARRAYS,
    Arrays,
    FlatMergeState,
    group_sum,
)
from pipeline.order import NO_POSITION, pack_pairs, unpack_pair

Batch = Sequence[tuple[int, int, int]]  # (left, right, new id), in order
History = Callable[[], np.ndarray]  # all merges so far as an (n, 2) array of (left, right)


class PartitionLost(RuntimeError):
    """The state of a partition is missing or unusable here; the driver rebuilds it."""

    MARK = "spark-bpe: partition state lost"

    def __init__(self, part: int, why: str):
        super().__init__(f"{self.MARK} (partition {part}: {why})")
        self.part = part


# -- rounds on a state (wherever it lives) -----------------------------------------------------

def current_pairs(st: FlatMergeState, part: int, offset: int) -> PairDeltas:
    """Every pair the partition has now, as deltas from nothing (the initial count)."""
    ids = np.flatnonzero(st.cnt[: st.n_ids] > 0)
    keys = pack_pairs(st.pair_left[ids], st.pair_right[ids])
    order = np.argsort(keys, kind="stable")
    ids, keys = ids[order], keys[order]
    pos = st.first_live_many(ids) + offset
    return PairDeltas(keys, st.cnt[ids].astype(np.int64), np.full(len(ids), part, np.int32),
                      pos, np.zeros(0, dtype=np.int64), st.live_tokens)


def apply_batch(st: FlatMergeState, batch: Batch, part: int, offset: int) -> PairDeltas:
    """Replay ``batch`` in order; report the pairs whose count changed here."""
    removed = np.zeros(len(batch), dtype=np.int64)
    st.journal = []
    try:
        for j, (a, b, t) in enumerate(batch):
            removed[j] = st.apply_merge(a, b, t)
        journal = st.journal
    finally:
        st.journal = None
    if not journal:
        return _empty_with(removed, st.live_tokens)
    ids = np.concatenate([j[0] for j in journal])
    d = np.concatenate([j[1] for j in journal])
    uid, sums, _, _ = group_sum(ids, d)
    changed = sums != 0
    uid, sums = uid[changed], sums[changed]
    keys = pack_pairs(st.pair_left[uid], st.pair_right[uid])
    order = np.argsort(keys, kind="stable")
    uid, keys, sums = uid[order], keys[order], sums[order]
    pos = np.full(len(uid), NO_POSITION, dtype=np.int64)
    alive = st.cnt[uid] > 0
    pos[alive] = st.first_live_many(uid[alive]) + offset
    return PairDeltas(keys, sums, np.full(len(uid), part, np.int32), pos, removed,
                      st.live_tokens)


def _empty_with(removed: np.ndarray, tokens: int) -> PairDeltas:
    out = PairDeltas.empty(len(removed))
    out.removed = removed
    out.tokens = tokens
    return out


def min_positions(st: FlatMergeState, keys: np.ndarray, part: int, offset: int) -> PairDeltas:
    """Exact smallest positions of the pairs ``keys`` (sorted) that occur here."""
    ids = np.array([-1 if (i := st.find_pair(*unpack_pair(k))) is None else i
                    for k in keys.tolist()], dtype=np.int64)
    found = ids >= 0
    pos = np.full(len(keys), NO_POSITION, dtype=np.int64)
    pos[found] = st.first_live_many(ids[found])
    present = pos != NO_POSITION
    z = np.zeros(int(present.sum()), dtype=np.int64)
    return PairDeltas(keys[present], z, np.full(len(z), part, np.int32),
                      pos[present] + offset, np.zeros(0, dtype=np.int64), 0)


def catch_up(st: FlatMergeState, history: np.ndarray, gen: int, upto: int) -> None:
    """Apply merges ``history[gen:upto]`` (a state that missed rounds)."""
    for j in range(gen, upto):
        a, b = int(history[j, 0]), int(history[j, 1])
        st.apply_merge(a, b, st.base_size + st.n_segments - 1)


# -- the state in an executor's scratch directory ------------------------------------------------

class FileArrays(Arrays):
    """Arrays as memory-mapped ``.npy`` files of a directory (sparse until written)."""

    def __init__(self, directory: str):
        self.dir = directory

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name + ".npy")

    def empty(self, name: str, dtype: type, size: int) -> np.ndarray:
        tmp = self.path(name) + ".tmp"
        arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(max(size, 1),))
        os.replace(tmp, self.path(name))
        return arr[:size]

    def open(self, name: str) -> np.ndarray:
        return np.load(self.path(name), mmap_mode="r+")


ARRAYS = (*POSITION_ARRAYS, *WORD_ARRAYS, *PAIR_ARRAYS, "buf", "seg")


def scratch_root() -> str:
    """Where this executor keeps partition states: its first Spark local directory."""
    dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    root = dirs.split(",")[0] if dirs else ""
    return root or os.path.join(os.environ.get("TMPDIR", "/tmp"))


class PartitionStore:
    """The directory of one partition's state: ``<root>/spark-bpe-<run>/part-<n>``."""

    def __init__(self, run: str, part: int, root: str | None = None):
        self.part = part
        self.dir = os.path.join(root or scratch_root(), f"spark-bpe-{run}", f"part-{part:05d}")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The partition's lock: a file beside its directory, not in it, so that a rebuild,
        which removes the directory, still waits for a task of the failed round that is
        running on (a killed task's Python runs up to spark.python.task.killTimeout)."""
        os.makedirs(os.path.dirname(self.dir), exist_ok=True)
        with open(self.dir + ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # -- state.json ----------------------------------------------------------------------------
    def _meta_path(self) -> str:
        return os.path.join(self.dir, "state.json")

    def read_meta(self) -> dict | None:
        try:
            with open(self._meta_path(), encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None

    def _write_meta(self, meta: dict) -> None:
        tmp = self._meta_path() + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(meta, fh)
        os.replace(tmp, self._meta_path())

    # -- opening, building -----------------------------------------------------------------------
    def open(self) -> tuple[FlatMergeState, dict]:
        meta = self.read_meta()
        if meta is None:
            raise PartitionLost(self.part, "no state on this executor")
        if meta.get("dirty"):
            raise PartitionLost(self.part, "a task was interrupted while changing it")
        alloc = FileArrays(self.dir)
        try:
            arrays = {name: alloc.open(name) for name in ARRAYS}
        except (OSError, ValueError) as exc:
            raise PartitionLost(self.part, f"unreadable state ({exc})") from None
        return FlatMergeState(arrays, meta["scalars"], alloc), meta

    def build(self, flat: np.ndarray, lengths: np.ndarray, counts: np.ndarray,
              base_size: int, history: np.ndarray) -> FlatMergeState:
        """A fresh state from initial symbols, with the merges of ``history`` replayed."""
        with self.locked():
            shutil.rmtree(self.dir, ignore_errors=True)
            os.makedirs(self.dir, exist_ok=True)
            self._write_meta({"dirty": True})
            st = FlatMergeState.build(flat, lengths, counts, base_size, FileArrays(self.dir))
            catch_up(st, history, 0, len(history))
            self.save(st, gen=len(history), round_no=-1)
        return st

    def save(self, st: FlatMergeState, gen: int, round_no: int) -> None:
        self._write_meta({"dirty": False, "gen": gen, "round": round_no,
                          "scalars": {k: getattr(st, k) for k in SCALARS}})

    # -- one round ------------------------------------------------------------------------------
    def run_round(self, round_no: int, gen: int, batch: Batch, offset: int,
                  history: History) -> PairDeltas:
        """Apply round ``round_no`` (``batch``, the merges after the first ``gen``) and
        report; idempotent: a retried task gets the saved report of its round."""
        t0 = time.perf_counter()
        with self.locked():
            st, meta = self.open()
            done = meta["gen"]
            if meta["round"] == round_no and done == gen + len(batch):
                return self._load_report(round_no)
            if done > gen:
                raise PartitionLost(self.part, f"holds {done} merges, the round starts at {gen}")
            self._write_meta({**meta, "dirty": True})
            if done < gen:
                catch_up(st, history(), done, gen)
            rep = apply_batch(st, batch, self.part, offset)
            rep.work = time.perf_counter() - t0
            self._save_report(round_no, rep)
            self.save(st, gen=gen + len(batch), round_no=round_no)
            return rep

    def at_gen(self, gen: int, history: History) -> FlatMergeState:
        """The state caught up to ``gen`` merges (for refreshes and the hand-off)."""
        with self.locked():
            st, meta = self.open()
            if meta["gen"] > gen:
                raise PartitionLost(self.part, f"holds {meta['gen']} merges, wanted {gen}")
            if meta["gen"] < gen:
                self._write_meta({**meta, "dirty": True})
                catch_up(st, history(), meta["gen"], gen)
                self.save(st, gen=gen, round_no=meta["round"])
            return st

    def _report_path(self) -> str:
        return os.path.join(self.dir, "report.npz")

    def _save_report(self, round_no: int, rep: PairDeltas) -> None:
        tmp = self._report_path() + ".tmp.npz"
        np.savez(tmp, round=np.array([round_no]), keys=rep.keys, deltas=rep.deltas,
                 part=rep.part, min_pos=rep.min_pos, removed=rep.removed,
                 tokens=np.array([rep.tokens]))
        os.replace(tmp, self._report_path())

    def _load_report(self, round_no: int) -> PairDeltas:
        with np.load(self._report_path(), allow_pickle=False) as z:
            if int(z["round"][0]) != round_no:
                raise PartitionLost(self.part, "the saved report is of another round")
            return PairDeltas(z["keys"], z["deltas"], z["part"], z["min_pos"], z["removed"],
                              int(z["tokens"][0]))

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.remove(self.dir + ".lock")
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(self.dir))  # the run's directory, once empty
