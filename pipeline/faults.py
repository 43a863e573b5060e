"""Fault injection for the tests that run real jobs (no effect unless the variable is set).

``SPARK_BPE_INJECT="point=action;point=action"``, where action is ``pause:SECONDS`` (sleep
there, so that a test can kill the job at that point) or ``memory:MB`` (cap this process's
address space at its current size plus MB, so that the next large allocation fails as it would
on a driver without enough memory). The points are named where :func:`at` is called.
"""

from __future__ import annotations

import os
import resource
import time

_lifted: tuple[int, int] | None = None


def _actions() -> dict[str, str]:
    spec = os.environ.get("SPARK_BPE_INJECT", "")
    return dict(item.split("=", 1) for item in spec.split(";") if "=" in item)


def at(point: str) -> None:
    action = _actions().get(point)
    if not action:
        return
    kind, _, value = action.partition(":")
    if kind == "pause":
        time.sleep(float(value))
    elif kind == "memory":
        global _lifted
        with open("/proc/self/statm", encoding="ascii") as fh:
            size = int(fh.read().split()[0]) * resource.getpagesize()
        _lifted = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (size + int(float(value) * 2**20), _lifted[1]))


def lift() -> None:
    """Undo a ``memory`` cap (so that the error can still be reported)."""
    global _lifted
    if _lifted is not None:
        resource.setrlimit(resource.RLIMIT_AS, _lifted)
        _lifted = None
