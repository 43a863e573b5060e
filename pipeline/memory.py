"""Sizing a run (pure Python, no Spark): what the driver engine needs for a word table and the
count's merge for its partial counts, what the driver has, and what ``auto`` picks from them.

The driver engine (``engines/local.py``) holds, per symbol of the word table (a byte of a
distinct word, bytes alphabet), about 18 bytes of token/link/weight arrays, 5-6 bytes of
stored positions and a few bytes of per-pair arrays; with what the load and the process itself
take, the peak RSS of the whole driver process was 34.9-36.8 bytes per symbol on the 1 GB
scale corpus (29.2 M symbols) and 28.2-32.7 on the 4 GB one (66.7 M), in the BENCHMARKS.md
sections that give it per symbol. :data:`LOCAL_BYTES_PER_SYMBOL` rounds the largest up, with
a margin.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import re
from dataclasses import dataclass

LOCAL_BYTES_PER_SYMBOL = 42  # measured 28.2-36.8 (BENCHMARKS.md), plus a margin
DRIVER_BASE_BYTES = 400 << 20  # interpreter, numpy/pyarrow, py4j, outputs and report
COUNT_MERGE_BYTES_PER_BYTE = 3.5  # driver peak per byte of partial counts (Arrow), with a margin
HELD_BYTES_PER_BYTE = 1.6  # partial counts held split into hash buckets
MAX_MERGE_BUCKETS = 64
BUDGET_SHARE = 0.8  # of the memory found, leave a fifth for everything else
MB = 1 << 20


@dataclass(frozen=True)
class Budget:
    bytes: int
    source: str  # how it was found, for the log


def local_engine_bytes(symbols: int) -> int:
    """Peak memory of the driver process training ``symbols`` symbols on the driver."""
    return DRIVER_BASE_BYTES + LOCAL_BYTES_PER_SYMBOL * int(symbols)


def parse_size(text: str | None, default_unit: str = "m") -> int | None:
    """Spark's size strings in bytes: ``512m``, ``2g``, ``2gb``, ``100b``; a bare number is in
    ``default_unit``, the key's own (MiB for the memory keys, bytes for
    ``spark.driver.maxResultSize``)."""
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(b?)\s*", text.lower())
    if not m:
        return None
    unit = m.group(2) or (" " if m.group(3) else default_unit)
    return int(float(m.group(1)) * 1024 ** " kmgtp".index(unit))


def available_bytes(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup",
                    proc_cgroup: str = "/proc/self/cgroup") -> tuple[int | None, str]:
    """Memory this process could still use: the machine's MemAvailable, lowered to what is left
    under a container's cgroup limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``), the
    tightest of the process's own cgroup and each one above it (a systemd slice, a
    container without its own cgroup namespace) up to the mount's root."""
    avail, what = None, ""
    try:
        with open(meminfo, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail, what = int(line.split()[1]) * 1024, "available on this machine"
    except OSError:
        pass
    for directory, limit_file, usage_file in _cgroup_memory_files(cgroup, proc_cgroup):
        try:
            with open(os.path.join(directory, limit_file), encoding="ascii") as fh:
                limit = fh.read().strip()
            with open(os.path.join(directory, usage_file), encoding="ascii") as fh:
                usage = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        usage -= _reclaimable(directory)
        if limit.isdigit() and int(limit) < (1 << 60):
            left = max(int(limit) - usage, 0)  # (at or over its limit: nothing left)
            if avail is None or left < avail:
                avail, what = left, "left under the container's memory limit"
    return avail, what


def _reclaimable(directory: str) -> int:
    """The cgroup's inactive page cache (``inactive_file`` in v2's ``memory.stat``,
    ``total_inactive_file`` in v1's), which its usage counts but the kernel reclaims before
    it kills anything: the count's reading of the corpus fills it (kubelet leaves it out of
    a container's working set the same way)."""
    found = {}
    try:
        with open(os.path.join(directory, "memory.stat"), encoding="ascii") as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if key in ("inactive_file", "total_inactive_file"):
                    found[key] = int(value)
    except (OSError, ValueError):
        return 0
    # (v1 has both: its usage is the hierarchy's, as total_ is)
    return found.get("total_inactive_file", found.get("inactive_file", 0))


def _cgroup_memory_files(cgroup: str, proc_cgroup: str) -> list[tuple[str, str, str]]:
    """(directory, limit file, usage file) of each cgroup whose memory limit binds this
    process: v2 (``0::/path``, under ``cgroup``) and v1 (the ``memory`` controller's path,
    under ``cgroup/memory``), the process's own and every ancestor, the root included."""
    paths = {"v2": "/", "v1": "/"}
    try:
        with open(proc_cgroup, encoding="ascii") as fh:
            for line in fh:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    paths["v2"] = path or "/"
                elif "memory" in controllers.split(","):
                    paths["v1"] = path or "/"
    except (OSError, ValueError):
        pass
    found = []
    for version, root, limit_file, usage_file in (
            ("v2", cgroup, "memory.max", "memory.current"),
            ("v1", os.path.join(cgroup, "memory"), "memory.limit_in_bytes",
             "memory.usage_in_bytes")):
        parts = [p for p in paths[version].split("/") if p and p not in (".", "..")]
        for depth in range(len(parts), -1, -1):
            found.append((os.path.join(root, *parts[:depth]), limit_file, usage_file))
    return found


def driver_budget(configured_mb: int, conf: dict[str, str],
                  available: tuple[int | None, str] | None = None) -> Budget:
    """What the driver engine may use: ``driver_budget_mb`` when set; else, in cluster deploy
    mode, the driver container's memory overhead (the JVM heap is ``spark.driver.memory``,
    Python lives in the overhead); in local and client mode the memory available here less
    the driver JVM's heap. A share of it is kept free."""
    if configured_mb:
        return Budget(configured_mb * MB, "driver_budget_mb")
    avail, what = available if available is not None else available_bytes()
    heap = parse_size(conf.get("spark.driver.memory")) or 1024 * MB
    if conf.get("spark.submit.deployMode") == "cluster":
        overhead = parse_size(conf.get("spark.driver.memoryOverhead"))
        source = "spark.driver.memoryOverhead"
        if overhead is None:  # Spark's default: a share of the heap, at least a floor
            factor = float(conf.get("spark.driver.memoryOverheadFactor", "0.1"))
            floor = parse_size(conf.get("spark.driver.minMemoryOverhead")) or 384 * MB
            overhead = max(floor, int(factor * heap))
            source = (f"the driver's default memory overhead ({factor:g} x spark.driver.memory, "
                      f"at least {floor / MB:.0f} MB)")
        found = overhead if avail is None else min(overhead, avail)
        return Budget(int(BUDGET_SHARE * found),
                      f"{BUDGET_SHARE:.0%} of {found / 2**30:.1f} GB: {source}")
    if avail is None:  # (no /proc/meminfo: not Linux) the machine's memory, less the heap
        try:
            avail = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
            what = "half of this machine's memory (free memory unknown)"
        except (AttributeError, OSError, ValueError):
            return Budget(int(BUDGET_SHARE * heap),
                          f"{BUDGET_SHARE:.0%} of spark.driver.memory (free memory unknown)")
    found = max(avail - heap, 0)
    return Budget(int(BUDGET_SHARE * found),
                  f"{BUDGET_SHARE:.0%} of {found / 2**30:.1f} GB: {avail / 2**30:.1f} GB {what} "
                  f"less the driver JVM's heap ({heap / 2**30:.1f} GB)")


def choose_engine(requested: str, symbols: int, budget: Budget) -> tuple[str, str]:
    """The engine to run and why (one log line's worth)."""
    need = local_engine_bytes(symbols)
    numbers = (f"the driver engine needs about {need / 2**30:.2f} GB for {symbols:,} symbols "
               f"({LOCAL_BYTES_PER_SYMBOL} B/symbol + {DRIVER_BASE_BYTES / 2**30:.1f} GB); "
               f"driver budget {budget.bytes / 2**30:.2f} GB ({budget.source})")
    if requested != "auto":
        return requested, f"engine {requested} (as configured): {numbers}"
    engine = "local" if need <= budget.bytes else "spark"
    return engine, f"engine auto -> {engine}: {numbers}"


def count_merge_bytes(partial_bytes: int, buckets: int = 1) -> int:
    """Peak memory of the driver process merging ``partial_bytes`` of the count tasks'
    partial counts (Arrow) with numpy: in one piece, the partials, their word dictionary and
    the sums and minima; in hash buckets, the partials held once (split) plus one bucket's
    merge (less memory, some more time). The constants are an earlier session's measurement
    on the 1 GB scale corpus's partials, rounded up; the driver's peak in every benchmark run
    (``driver_peak_rss_mb`` in stats.json) is the check that they still hold."""
    if buckets == 1:
        return DRIVER_BASE_BYTES + int(COUNT_MERGE_BYTES_PER_BYTE * partial_bytes)
    return DRIVER_BASE_BYTES + int(partial_bytes * (HELD_BYTES_PER_BYTE
                                                    + COUNT_MERGE_BYTES_PER_BYTE / buckets))


def driver_fetch_limit(conf: dict[str, str], rows: bool = False) -> int:
    """The largest task output the driver may fetch through its JVM: an eighth of the heap (a
    fetch holds a task's whole output there about twice, as the task result and as its copy
    on the way to Python; two 126 MB outputs in flight ran a 1 GB heap out of memory), within
    ``spark.driver.maxResultSize``. ``rows``: the output is rows of Spark's reader path, not
    byte records, and a fetch holds more copies of it (Java-deserialized rows, then their
    Python form): a thirty-second of the heap (one ~100 MB task output ran a 1 GB heap out of
    memory in the thread that takes task results, and the job then hung)."""
    heap = parse_size(conf.get("spark.driver.memory")) or 1024 * MB
    share = heap // 32 if rows else heap // 8
    max_result = conf.get("spark.driver.maxResultSize", "1g")
    limit = parse_size(max_result, " ") if max_result.strip() != "0" else None  # (bytes)
    return min(share, limit) if limit else share


# a bucket's words are one Arrow binary array (32-bit offsets: under 2 GiB of bytes); the
# partial counts' bytes bound their words' bytes, so a bucket of at most 1 GiB of them is safe
# with room for an uneven hash
MAX_BUCKET_BYTES = 1 << 30


def choose_count_merge(requested: str, partial_bytes: int, budget: Budget,
                       largest_task: int = 0, fetch_limit: int | None = None
                       ) -> tuple[str, int, str]:
    """Where the count's partial counts are merged (``driver`` or ``spark``), in how many hash
    buckets on the driver (the fewest powers of two that fit the budget: one is fastest), and
    why. ``auto`` also needs each task's output (``largest_task``) to pass through the driver
    JVM (``fetch_limit``, :func:`driver_fetch_limit`)."""
    buckets = 1
    while (count_merge_bytes(partial_bytes, buckets) > budget.bytes
           or partial_bytes > buckets * MAX_BUCKET_BYTES) and buckets < MAX_MERGE_BUCKETS:
        buckets *= 2
    need = count_merge_bytes(partial_bytes, buckets)
    split = f" in {buckets} hash buckets" if buckets > 1 else ""
    numbers = (f"merging {partial_bytes / 2**20:,.1f} MB of partial counts on the driver"
               f"{split} needs about {need / 2**30:.2f} GB; driver budget "
               f"{budget.bytes / 2**30:.2f} GB ({budget.source})")
    too_big = partial_bytes > buckets * MAX_BUCKET_BYTES  # (even in the most buckets)
    if requested == "driver" and too_big:  # (found after the count: not thrown away)
        return "spark", buckets, (
            f"count merge driver (as configured) -> spark: {partial_bytes / 2**30:,.1f} GB of "
            f"partial counts make buckets over {MAX_BUCKET_BYTES / 2**30:.0f} GB even in "
            f"{MAX_MERGE_BUCKETS} (one Arrow array each holds under 2 GB); {numbers}")
    if requested != "auto":
        return requested, buckets, f"count merge {requested} (as configured): {numbers}"
    if need > budget.bytes or too_big:
        return "spark", buckets, f"count merge auto -> spark: {numbers}" + (
            f"; over {MAX_MERGE_BUCKETS} buckets of {MAX_BUCKET_BYTES / 2**30:.0f} GB"
            if too_big else "")
    if fetch_limit is not None and largest_task > fetch_limit:
        return "spark", buckets, (
            f"count merge auto -> spark: one task's partial counts ({largest_task / 2**20:,.0f}"
            f" MB) are over what a fetch may bring through the driver JVM ("
            f"{fetch_limit / 2**20:,.0f} MB: a share of spark.driver.memory, within "
            f"spark.driver.maxResultSize; more tasks make them smaller); {numbers}")
    return "driver", buckets, f"count merge auto -> driver: {numbers}"


def fits_driver(tokens: int, budget: Budget) -> bool:
    """Whether a working set of ``tokens`` tokens can be finished on the driver."""
    return local_engine_bytes(tokens) <= budget.bytes


def release_freed_memory() -> None:
    """Give memory this process has freed back to the OS: a Python worker after its count task
    (its counting dict is gone, but the allocators keep the pages, and an idle worker would
    hold them while the driver trains), the driver between the count and the engine. Collects
    cycles, empties Arrow's pool and asks glibc to trim (skipped where there is no
    ``malloc_trim``). Measured on a quarter of the 1 GB corpus: 324 MB -> 168 MB RSS."""
    gc.collect()
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except Exception:  # noqa: BLE001 - only memory hygiene
        pass
    try:
        trim = _malloc_trim()
        if trim is not None:
            trim(0)
    except Exception:  # noqa: BLE001 - only memory hygiene: never fail a finished task
        pass


_TRIM: list = []


def _malloc_trim():
    if not _TRIM:
        name = ctypes.util.find_library("c")
        lib = ctypes.CDLL(name) if name else None
        _TRIM.append(getattr(lib, "malloc_trim", None))
    return _TRIM[0]


TASK_OUT_OF_MEMORY = "spark-bpe: out of memory reading"  # a task's error naming its file


def task_out_of_memory(path: str, exc: BaseException) -> RuntimeError:
    """What a task raises when reading ``path`` ran out of memory (MemoryError,
    ArrowMemoryError) or past Arrow's capacity (ArrowCapacityError: one array over 2 GB): the
    file named, for :func:`task_memory_failure` on the driver. Never a corrupt file's error:
    ``--ignore-corrupt-files`` does not skip it."""
    text = str(exc).strip()
    why = f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
    return RuntimeError(f"{TASK_OUT_OF_MEMORY} {path} :: {why}")


def task_memory_failure(text: str) -> str:
    """One line saying which file a task ran out of memory on and what to change, when
    ``text`` (a failed job's error) carries :func:`task_out_of_memory`'s message; else ''."""
    m = re.search(re.escape(TASK_OUT_OF_MEMORY) + r" (.+?) :: ([^\n]*)", text)
    if not m:
        return ""
    path, why = m.group(1), m.group(2).strip()
    if why.startswith("ArrowCapacityError"):
        fix = ("one of its row groups holds more text than one Arrow array can (2 GB): rewrite "
               "the file with smaller row groups")
    else:
        fix = ("give the executors' Python processes more memory (spark.executor.memoryOverhead"
               ", or spark.executor.pyspark.memory where it is set; in local mode, the "
               "machine's free memory) or run fewer tasks per executor (spark.executor.cores), "
               "or rewrite the file with smaller row groups")
    return f"a task ran out of memory reading {path} ({why}): {fix}"
