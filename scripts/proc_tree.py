"""Peak memory and CPU of a process tree (a spark-submit job: launcher, JVM, Python driver,
Python workers; or a reference's process), sampled from /proc, for the benchmarks.

Every ``interval`` seconds the tree's VmRSS is read: the peak of the tree's sum (a short peak
between samples can be missed), each process's peak (its VmHWM, the kernel's exact high-water
mark, so no peak of a process alive at a sample is missed; grouped by role: jvm, python driver,
python workers, launcher, reference), and the tree's proportional set size (PSS: a page shared
after fork or a library mapped by several processes divided among them), whose peak is what
the tree costs the machine. ``os.wait4``'s ru_maxrss covers only the processes the launcher
reaped (not a Spark job's Python workers): the largest process is the larger of the two.
"""

from __future__ import annotations

import os
import threading


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        if stat := _read(f"/proc/{d}/stat"):  # "pid (comm) state ppid ..."
            kids.setdefault(int(stat[stat.rfind(b")") + 2:].split()[1]), []).append(int(d))
    return kids


def _role(pid: int) -> str:
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        exe = ""
    cmd = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode("utf-8", "replace")
    if exe == "java":
        return "jvm"
    if "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
        return "python workers"
    if "python" in exe:
        return "python driver" if "jobs/" in cmd else "reference"
    return "launcher"


def _cpu_ticks(pid: int) -> int:
    """utime + stime of one process so far, in clock ticks (0 when it is gone)."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[11]) + int(fields[12]) if len(fields) > 12 else 0


def _pss(pid: int) -> int | None:
    """Proportional set size of one process in kB (None when it is gone or unreadable)."""
    for line in _read(f"/proc/{pid}/smaps_rollup").splitlines():
        if line.startswith(b"Pss:"):
            return int(line.split()[1])
    return None


class TreeSampler(threading.Thread):
    """Peak VmRSS of a process tree: of the sum, and of each process (grouped by role); and
    the CPU time of every process in it, as last sampled (the Python workers of a Spark job are
    not the launcher's waited-for children, so ``wait4``'s figure leaves them out)."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.done = threading.Event()
        self.peak_total = 0
        self.peak_pss = 0
        self.samples = 0
        self.pss_unread = 0  # samples of a live process whose PSS could not be read
        self.peak: dict[int, int] = {}
        self.cpu_ticks: dict[int, int] = {}
        self.role: dict[int, str] = {}
        self.peak_role_sum: dict[str, int] = {}

    def run(self) -> None:
        while True:
            self.sample()
            if self.done.wait(self.interval):
                return

    def sample(self) -> None:
        kids, todo, total, pss, sums = _children(), [self.root], 0, 0, {}
        while todo:
            pid = todo.pop()
            todo += kids.get(pid, [])
            rss = hwm = 0
            for line in _read(f"/proc/{pid}/status").splitlines():
                if line.startswith(b"VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith(b"VmHWM:"):
                    hwm = int(line.split()[1])
            if not rss:
                continue
            self.cpu_ticks[pid] = max(self.cpu_ticks.get(pid, 0), _cpu_ticks(pid))
            role = self.role[pid] = _role(pid)  # the latest: bash exec's java
            self.peak[pid] = max(self.peak.get(pid, 0), rss, hwm)
            sums[role] = sums.get(role, 0) + rss
            total += rss
            kb = _pss(pid)
            if kb is None:  # (counted, so that a tree PSS missing a process is seen)
                self.pss_unread += 1
            pss += kb or 0
        self.samples += 1
        self.peak_total = max(self.peak_total, total)
        self.peak_pss = max(self.peak_pss, pss)
        for role, v in sums.items():
            self.peak_role_sum[role] = max(self.peak_role_sum.get(role, 0), v)

    def summary(self) -> dict:
        roles: dict[str, dict] = {}
        for pid, kb in self.peak.items():
            r = roles.setdefault(self.role[pid], {"processes": 0, "per_process_mb": []})
            r["processes"] += 1
            r["per_process_mb"].append(round(kb / 1024, 1))
        for name, r in roles.items():
            r["per_process_mb"].sort(reverse=True)
            r["peak_process_mb"] = r["per_process_mb"][0]
            r["peak_sum_mb"] = round(self.peak_role_sum.get(name, 0) / 1024, 1)
        tick = os.sysconf("SC_CLK_TCK")
        return {"peak_tree_mb": round(self.peak_total / 1024, 1),
                "peak_process_mb": round(max(self.peak.values(), default=0) / 1024, 1),
                "peak_tree_pss_mb": round(self.peak_pss / 1024, 1), "samples": self.samples,
                "pss_unread": self.pss_unread,
                "cpu_tree_seconds": round(sum(self.cpu_ticks.values()) / tick, 1),
                "roles": roles}
