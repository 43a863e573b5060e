"""The merge engines: given the word table, produce the merge sequence of the oracle
(``pipeline/bpe.py``) under the order of ``pipeline/order.py``. docs/DESIGN.md sections 3-6.

- ``local.py``: the ``local`` engine, on the driver. All distinct words end to end in one flat
  array of positions; each pair's occurrences are stored, so a merge visits only them; a heap
  of (count, first position) picks the next pair. Exact because it applies the oracle's rule to
  exact counts and exact first positions, one merge at a time.
- ``planner.py`` + ``rounds.py`` + ``partition.py`` + ``deltas.py``: distributed merge rounds.
  The driver (planner) holds exact pair counts and tie keys and picks a batch of merges that
  the sequential trainer would make in that order (proof in DESIGN.md section 3); every
  partition (a ``local.FlatMergeState`` over one ``first_seen`` range) replays the batch on the
  occurrences of the merged pairs only and reports count deltas and smallest positions
  (``deltas.PairDeltas``), which the driver sums.
- ``spark.py``: where those partitions live on Spark (executors' scratch directories, the
  persisted word chunks as the recovery path) and how a round runs as one job.

Which engine runs (``engine = auto``) is decided by memory in ``pipeline/memory.py``: the
driver engine when its estimated peak fits the driver budget, else Spark rounds until the
working set fits, then the driver finishes.
"""
