"""Fault injection for the tests that run real jobs (no effect unless the variable is set).

``SPARK_BPE_INJECT="point=action;point=action"``, where action is ``pause:SECONDS`` (sleep
there, so that a test can kill the job at that point), ``wait:PATH`` (sleep there until the
file PATH exists, at most two minutes: the test says when the job may go on), ``memory:MB``
(cap this process's address space at its current size plus MB, so that the next large
allocation fails as it would on a driver without enough memory), ``fsize:BYTES`` (no file
this process writes may grow past BYTES, so that writes fail as on a full disk) or
``jvm_oom:N`` (a Spark task allocates an array of N longs: past the heap, the JVM's own
OutOfMemoryError; in local mode Spark then exits the driver JVM). The points
are named where :func:`at` is called.
"""

from __future__ import annotations

import os
import resource
import time

_lifted: dict[int, tuple[int, int]] = {}


# every point :func:`at` is called with (a test checks the calls against it), and the actions
POINTS = frozenset({"start", "count_task", "merges", "spark_rounds", "outputs", "report"})
KINDS = frozenset({"pause", "wait", "memory", "fsize", "jvm_oom"})


def _actions() -> dict[str, str]:
    """The variable's point=action pairs; a point or an action that does not exist is an
    error (a misspelled injection did nothing, and its test could pass without its fault)."""
    spec = os.environ.get("SPARK_BPE_INJECT", "")
    actions = dict(item.split("=", 1) for item in spec.split(";") if item.strip())
    for point, action in actions.items():
        if point not in POINTS or action.partition(":")[0] not in KINDS:
            raise ValueError(f"SPARK_BPE_INJECT: {point}={action} is not a fault point "
                             f"({', '.join(sorted(POINTS))}) with an action "
                             f"({', '.join(sorted(KINDS))})")
    return actions


def at(point: str) -> None:
    action = _actions().get(point)
    if not action:
        return
    kind, _, value = action.partition(":")
    if kind == "pause":
        time.sleep(float(value))
    elif kind == "wait":
        deadline = time.monotonic() + 120
        while not os.path.exists(value) and time.monotonic() < deadline:
            time.sleep(0.05)
    elif kind == "memory":
        with open("/proc/self/statm", encoding="ascii") as fh:
            size = int(fh.read().split()[0]) * resource.getpagesize()
        _cap(resource.RLIMIT_AS, size + int(float(value) * 2**20))
    elif kind == "fsize":
        _cap(resource.RLIMIT_FSIZE, int(value))
    elif kind == "jvm_oom":  # a task that asks the JVM heap for VALUE longs at once
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.getOrCreate()
        spark.range(1).selectExpr(f"size(sequence(1L, id + {int(value)}L))").collect()


def _cap(which: int, soft: int) -> None:
    old = resource.getrlimit(which)
    _lifted.setdefault(which, old)
    resource.setrlimit(which, (soft, old[1]))


def lift() -> None:
    """Undo the caps (so that the error can still be reported)."""
    for which, old in list(_lifted.items()):
        resource.setrlimit(which, old)
        del _lifted[which]
