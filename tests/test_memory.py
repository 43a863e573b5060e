"""Sizing a run: the driver budget and the engine ``auto`` picks from it (no JVM)."""

from __future__ import annotations

import pytest

from pipeline.memory import (
    COUNT_MERGE_BYTES_PER_BYTE,
    DRIVER_BASE_BYTES,
    LOCAL_BYTES_PER_SYMBOL,
    MB,
    Budget,
    available_bytes,
    choose_count_merge,
    choose_engine,
    count_merge_bytes,
    driver_budget,
    driver_fetch_limit,
    fits_driver,
    local_engine_bytes,
    parse_size,
)

GB = 1 << 30


def test_auto_takes_the_driver_only_when_the_budget_holds_the_table():
    symbols = 29_215_599  # the 1 GB scale corpus
    need = DRIVER_BASE_BYTES + LOCAL_BYTES_PER_SYMBOL * symbols
    assert local_engine_bytes(symbols) == need
    engine, why = choose_engine("auto", symbols, Budget(need, "test"))
    assert engine == "local" and why.startswith("engine auto -> local: the driver engine needs")
    engine, why = choose_engine("auto", symbols, Budget(need - 1, "test"))
    assert engine == "spark" and "29,215,599 symbols" in why and "(test)" in why
    # an explicit engine is kept whatever the numbers say, and the numbers are still logged
    engine, why = choose_engine("local", symbols, Budget(1, "test"))
    assert engine == "local" and why.startswith("engine local (as configured): the driver "
                                                "engine needs about ")
    assert "29,215,599 symbols" in why and "driver budget 0.00 GB (test)" in why
    engine, why = choose_engine("spark", 10, Budget(100 * GB, "test"))
    assert engine == "spark" and "10 symbols" in why and "budget 100.00 GB (test)" in why
    # the hand-off from Spark rounds: once the working set fits
    assert fits_driver(symbols, Budget(need, "t")) and not fits_driver(symbols + 1,
                                                                       Budget(need, "t"))


def test_the_count_merges_on_the_driver_only_when_the_budget_holds_the_partials():
    partial = 270 * MB  # the 1 GB scale corpus's four tasks
    need = DRIVER_BASE_BYTES + COUNT_MERGE_BYTES_PER_BYTE * partial
    assert count_merge_bytes(partial) == int(need)
    where, buckets, why = choose_count_merge("auto", partial, Budget(need, "test"))
    assert (where, buckets) == ("driver", 1)
    assert why.startswith("count merge auto -> driver: merging 270.0 MB")
    # a tighter budget: the fewest hash buckets that fit (each bucket merged on its own)
    where, buckets, why = choose_count_merge("auto", partial, Budget(need - 1, "test"))
    assert where == "driver" and buckets == 2 and "in 2 hash buckets" in why
    assert count_merge_bytes(partial, 2) <= need - 1 < count_merge_bytes(partial)
    tight = count_merge_bytes(partial, 16)
    assert choose_count_merge("auto", partial, Budget(tight, "t"))[:2] == ("driver", 16)
    assert choose_count_merge("auto", partial, Budget(tight - 1, "t"))[:2] == ("driver", 32)
    # the partials alone do not fit: Spark merges them
    where, _, why = choose_count_merge("auto", partial, Budget(partial, "test"))
    assert where == "spark" and "(test)" in why
    assert choose_count_merge("driver", partial, Budget(1, "t"))[0] == "driver"
    assert choose_count_merge("spark", 1, Budget(100 * GB, "t"))[0] == "spark"
    # each task's output passes through the driver JVM: too big a task -> Spark
    big = Budget(100 * GB, "t")
    assert choose_count_merge("auto", partial, big, 256 * MB, 256 * MB)[0] == "driver"
    where, _, why = choose_count_merge("auto", partial, big, 256 * MB + 1, 256 * MB)
    assert where == "spark" and "one task's partial counts (256 MB)" in why


def test_the_fetch_limit_is_an_eighth_of_the_heap_within_max_result_size():
    assert driver_fetch_limit({}) == 128 * MB  # 1 GB default heap
    assert driver_fetch_limit({"spark.driver.memory": "16g"}) == 1 * GB  # maxResultSize 1g
    assert driver_fetch_limit({"spark.driver.memory": "16g",
                               "spark.driver.maxResultSize": "0"}) == 2 * GB  # unlimited
    assert driver_fetch_limit({"spark.driver.memory": "2g",
                               "spark.driver.maxResultSize": "100m"}) == 100 * MB
    # rows of Spark's reader: a thirty-second (a ~100 MB task output ran 1 GB out of memory)
    assert driver_fetch_limit({}, rows=True) == 32 * MB
    assert driver_fetch_limit({"spark.driver.memory": "8g"}, rows=True) == 256 * MB


def test_the_budget_comes_from_the_driver_memory_that_exists():
    conf = {"spark.driver.memory": "2g"}
    # local and client mode: what this machine has, less the driver JVM's heap, 80% of it
    b = driver_budget(0, conf, available=(12 * GB, "available on this machine"))
    assert b.bytes == int(0.8 * 10 * GB) and "available on this machine" in b.source
    # cluster mode: the container's overhead (Python lives there, the heap is the JVM's)
    cluster = {**conf, "spark.submit.deployMode": "cluster"}
    b = driver_budget(0, {**cluster, "spark.driver.memoryOverhead": "3g"},
                      available=(64 * GB, "x"))
    assert b.bytes == int(0.8 * 3 * GB) and "memoryOverhead" in b.source
    b = driver_budget(0, cluster, available=(64 * GB, "x"))  # default overhead: 10%, >= 384m
    assert b.bytes == int(0.8 * 384 * MB)
    b = driver_budget(0, {**cluster, "spark.driver.memory": "20g"}, available=(64 * GB, "x"))
    assert b.bytes == int(0.8 * 2 * GB)
    b = driver_budget(0, {**cluster, "spark.driver.minMemoryOverhead": "1g"},
                      available=(64 * GB, "x"))  # Spark 4's floor, when set
    assert b.bytes == int(0.8 * GB) and "at least 1024 MB" in b.source
    # so with Spark's defaults in cluster mode (1g heap: 384 MB of overhead) the driver engine
    # is never chosen (its base alone is 0.4 GB): the merges run as Spark rounds
    b = driver_budget(0, cluster, available=(64 * GB, "x"))
    assert choose_engine("auto", 1000, b)[0] == "spark"
    assert choose_engine("auto", 10_000_000, driver_budget(
        0, {**cluster, "spark.driver.memoryOverhead": "2g"}, available=(64 * GB, "x")))[0] \
        == "local"  # 0.4 GB + 42 B x 10 M = 0.79 GB, within 80% of 2 GB
    # a configured budget wins
    assert driver_budget(1500, cluster, available=(1, "x")) == Budget(1500 * MB,
                                                                       "driver_budget_mb")


@pytest.mark.parametrize("text,expected", [("512m", 512 * MB), ("2g", 2 * GB), ("1536", 1536 * MB),
                                           ("1.5g", int(1.5 * GB)), ("300k", 300 * 1024),
                                           ("2gb", 2 * GB), ("1073741824b", GB), ("100B", 100),
                                           ("", None), ("lots", None)])
def test_spark_memory_strings(text, expected):
    """Spark's size strings; "b" is bytes (it read as MiB: '2147483648b' for the driver's
    heap made a 2 PiB heap and a budget of 0)."""
    assert parse_size(text) == expected


def test_max_result_size_in_plain_bytes_is_read_as_bytes():
    """spark.driver.maxResultSize is in bytes when it has no unit (the memory keys in MiB):
    268435456 was read as 256 TiB, so task outputs over it were fetched and Spark failed."""
    conf = {"spark.driver.memory": "8g"}
    assert driver_fetch_limit({**conf, "spark.driver.maxResultSize": "268435456"}) == 256 * MB
    assert driver_fetch_limit({**conf, "spark.driver.maxResultSize": "256m"}) == 256 * MB
    assert driver_budget(0, {"spark.driver.memory": "2147483648b"},
                         available=(16 * GB, "x")).bytes == int(0.8 * 14 * GB)


def cgroup_v2(tmp_path, available_kb: int, limit: int, usage: int):
    """A /proc/meminfo with MemAvailable and a cgroup v2 directory with that limit and usage
    (files under ``tmp_path``): (meminfo, cgroup directory)."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemAvailable: {available_kb} kB\n")
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.max").write_text(f"{limit}\n")
    (cg / "memory.current").write_text(f"{usage}\n")
    return meminfo, cg


def test_the_page_cache_a_container_can_reclaim_is_not_counted_as_used(tmp_path):
    """A cgroup's usage counts its page cache: after the count read the corpus, an 8 GiB
    container using 7.75 GiB, 6 GiB of it inactive file pages, left a budget of 0 and every
    merge went to Spark; the inactive page cache is memory the driver can have (v2's
    inactive_file, v1's hierarchical total_inactive_file)."""
    meminfo, cg = cgroup_v2(tmp_path, 25000000, 8 * GB, 7 * GB + 768 * MB)
    (cg / "memory.stat").write_text(f"anon 1000\nfile {7 * GB}\nactive_file {GB}\n"
                                    f"inactive_file {6 * GB}\n")
    assert available_bytes(str(meminfo), str(cg), str(tmp_path / "none")) == (
        6 * GB + 256 * MB, "left under the container's memory limit")
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{8 * GB}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{7 * GB}\n")
    (v1 / "memory.stat").write_text(f"inactive_file {GB}\ntotal_inactive_file {5 * GB}\n")
    assert available_bytes(str(meminfo), str(tmp_path / "v1"), str(tmp_path / "none"))[0] \
        == 6 * GB


def test_available_memory_reads_meminfo_and_the_cgroup_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 25000000 kB\nMemAvailable: 20000000 kB\n")
    cg = tmp_path / "cg"
    cg.mkdir()
    assert available_bytes(str(meminfo), str(cg), str(tmp_path / "none")) == (20000000 * 1024,
                                                      "available on this machine")
    (cg / "memory.max").write_text("max\n")
    (cg / "memory.current").write_text("123\n")
    no_limit = available_bytes(str(meminfo), str(cg), str(tmp_path / "none"))
    assert no_limit[0] == 20000000 * 1024
    (cg / "memory.max").write_text(f"{4 * GB}\n")
    (cg / "memory.current").write_text(f"{1 * GB}\n")
    assert available_bytes(str(meminfo), str(cg), str(tmp_path / "none")) == (
        3 * GB, "left under the container's memory limit")


def test_the_limit_of_the_process_own_cgroup_and_its_parents_counts(tmp_path):
    """Without a cgroup namespace the limit is not at the mount's root but on the process's
    own cgroup (/proc/self/cgroup) or one above it (a systemd slice): the tightest counts,
    for cgroup v2 and for v1's memory controller."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable: 20000000 kB\n")
    cg = tmp_path / "cg"
    slice_ = cg / "system.slice"
    scope = slice_ / "spark.scope"
    scope.mkdir(parents=True)
    (scope / "memory.max").write_text("max\n")
    (scope / "memory.current").write_text(f"{GB}\n")
    (slice_ / "memory.max").write_text(f"{6 * GB}\n")
    (slice_ / "memory.current").write_text(f"{2 * GB}\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/system.slice/spark.scope\n")
    assert available_bytes(str(meminfo), str(cg), str(proc)) == (
        4 * GB, "left under the container's memory limit")
    (scope / "memory.max").write_text(f"{3 * GB}\n")  # tighter than its slice's
    assert available_bytes(str(meminfo), str(cg), str(proc))[0] == 2 * GB
    v1 = cg / "memory" / "docker" / "abc"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{GB + 5}\n")
    (v1 / "memory.usage_in_bytes").write_text("5\n")
    proc.write_text("4:memory:/docker/abc\n1:cpu:/docker/abc\n")
    assert available_bytes(str(meminfo), str(cg), str(proc))[0] == GB


def test_the_count_merge_never_puts_over_a_gib_of_partial_counts_in_one_bucket():
    """A bucket's words become one Arrow binary array, whose 32-bit offsets stop at 2 GiB:
    a driver with memory for one bucket of 13 GB of partial counts took them whole and
    failed in pyarrow (offset overflow). The buckets are sized by bytes as well as memory."""
    from pipeline.memory import choose_count_merge

    huge = Budget(1 << 50, "x")
    assert choose_count_merge("auto", 900 * MB, huge)[:2] == ("driver", 1)
    where, buckets, _ = choose_count_merge("auto", 13 * GB, huge)
    assert where == "driver" and buckets == 16  # 13 GB in buckets of at most 1 GiB
    assert choose_count_merge("driver", 3 * GB, huge)[1] == 4


def test_budget_edges_found_by_review(tmp_path, monkeypatch):
    """Past 64 buckets of 1 GiB (partial counts over 64 GiB, on a driver with a budget for
    them) a bucket went over Arrow's 2 GiB: auto merges with Spark then, and driver falls
    back to Spark as a failed fetch does; a cgroup at or over its limit gave a negative
    budget; with no free-memory figure (not Linux) the budget was 80% of the JVM heap, which
    is not Python's memory."""
    from pipeline.memory import MAX_MERGE_BUCKETS, choose_count_merge

    huge = Budget(1 << 50, "x")
    over = (MAX_MERGE_BUCKETS + 8) * GB
    assert choose_count_merge("auto", over, huge)[0] == "spark"
    assert choose_count_merge("auto", MAX_MERGE_BUCKETS * GB, huge)[:2] == \
        ("driver", MAX_MERGE_BUCKETS)
    where, _, why = choose_count_merge("driver", over, huge)  # (found after the count:
    assert where == "spark" and "driver (as configured) -> spark" in why  # not thrown away)

    meminfo, cg = cgroup_v2(tmp_path, 20000000, 1 * GB, 2 * GB)
    assert available_bytes(str(meminfo), str(cg), str(tmp_path / "none"))[0] == 0

    monkeypatch.setattr("os.sysconf", lambda name: {"SC_PHYS_PAGES": 8 * GB // 4096,
                                                    "SC_PAGE_SIZE": 4096}[name])
    b = driver_budget(0, {"spark.driver.memory": "1g"}, available=(None, ""))
    assert b.bytes == int(0.8 * 3 * GB) and "half of this machine's memory" in b.source
