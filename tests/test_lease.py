"""One run per run directory: the lease (no JVM; the real-process test is in test_faults)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from pipeline.lease import NAME, Lease, LeaseHeld


def test_a_held_lease_is_refused_with_the_holder_named(tmp_path):
    first = Lease(None, str(tmp_path), timeout=60).acquire()
    try:
        with pytest.raises(LeaseHeld) as err:
            Lease(None, str(tmp_path), timeout=60).acquire()
        msg = str(err.value)
        assert f"pid {os.getpid()}" in msg and "is in use by another run" in msg
        assert "delete" in msg and NAME in msg
    finally:
        first.release()
    assert not (tmp_path / NAME).exists()
    Lease(None, str(tmp_path), timeout=60).acquire().release()  # free again


def test_a_gone_holder_is_taken_over_with_a_log_line(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="pipeline.lease")
    # a process on this host that has exited
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (tmp_path / NAME).write_text(json.dumps({
        "host": os.uname().nodename, "pid": int(dead), "started": "x", "id": "old",
        "renewed": __import__("time").time()}))
    lease = Lease(None, str(tmp_path), timeout=60).acquire()
    assert "its process no longer exists" in caplog.text
    assert json.loads((tmp_path / NAME).read_text())["id"] == lease.me["id"]
    lease.release()
    # another host that stopped renewing
    (tmp_path / NAME).write_text(json.dumps({
        "host": "elsewhere", "pid": 1, "started": "x", "id": "old", "renewed": 0}))
    Lease(None, str(tmp_path), timeout=60).acquire().release()
    assert "its last renewal was" in caplog.text
    # another host that still renews: refused
    (tmp_path / NAME).write_text(json.dumps({
        "host": "elsewhere", "pid": 1, "started": "x", "id": "old",
        "renewed": __import__("time").time()}))
    with pytest.raises(LeaseHeld, match="host elsewhere, pid 1"):
        Lease(None, str(tmp_path), timeout=60).acquire()


def test_a_lease_taken_away_stops_the_run_before_it_publishes(tmp_path):
    lease = Lease(None, str(tmp_path), timeout=0.2).acquire()
    (tmp_path / NAME).write_text(json.dumps({"host": "other", "pid": 1, "id": "thief",
                                             "renewed": 1e12}))
    import time

    time.sleep(0.3)
    with pytest.raises(LeaseHeld, match="took over"):
        lease.check()
    lease.release()
    assert json.loads((tmp_path / NAME).read_text())["id"] == "thief"  # not removed
