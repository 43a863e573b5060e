"""One run per run directory or output: the lease (no JVM, but for the last test; the
spark-submit test of overlapping training runs is in test_faults)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
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
    # another host that stopped renewing (its stamp and its file both old)
    (tmp_path / NAME).write_text(json.dumps({
        "host": "elsewhere", "pid": 1, "started": "x", "id": "old", "renewed": 0}))
    os.utime(tmp_path / NAME, (1, 1))
    Lease(None, str(tmp_path), timeout=60).acquire().release()
    assert "its last renewal was" in caplog.text
    # another host that still renews: refused
    (tmp_path / NAME).write_text(json.dumps({
        "host": "elsewhere", "pid": 1, "started": "x", "id": "old",
        "renewed": __import__("time").time()}))
    with pytest.raises(LeaseHeld, match="host elsewhere, pid 1"):
        Lease(None, str(tmp_path), timeout=60).acquire()
    # a container with this host name (host networking) but its own process ids, whose pid
    # is not one here: alive as far as this process can tell, refused until its lease times
    # out; the same namespace and boot with that pid gone: taken over at once
    me = Lease(None, str(tmp_path), timeout=60).me
    assert me["pid_ns"] and me["boot_id"]  # (Linux: what the lease records)
    for other, refused in [({"pid_ns": "pid:[1]"}, True), ({"boot_id": "another-boot"}, True),
                           ({}, False)]:
        (tmp_path / NAME).write_text(json.dumps({
            "host": os.uname().nodename, "pid": int(dead), "started": "x", "id": "old",
            "renewed": __import__("time").time(), "pid_ns": me["pid_ns"],
            "boot_id": me["boot_id"], **other}))
        if refused:
            with pytest.raises(LeaseHeld, match=f"pid {dead}"):
                Lease(None, str(tmp_path), timeout=60).acquire()
        else:
            Lease(None, str(tmp_path), timeout=60).acquire().release()


def test_a_live_run_renews_its_lease_so_another_host_cannot_take_it(tmp_path, monkeypatch):
    """The holder renews its lease every timeout / 4: after several timeouts a run on another
    host (which cannot see whether the holder's process lives) still finds it fresh."""
    import time

    lease = Lease(None, str(tmp_path), timeout=1.0).acquire()
    try:
        first = json.loads((tmp_path / NAME).read_text())["renewed"]
        time.sleep(2.5)
        assert json.loads((tmp_path / NAME).read_text())["renewed"] > first + 1.5
        monkeypatch.setattr("pipeline.lease.socket.gethostname", lambda: "elsewhere")
        with pytest.raises(LeaseHeld, match="is in use by another run"):
            Lease(None, str(tmp_path), timeout=1.0).acquire()
    finally:
        lease.release()


def test_a_renewal_written_slowly_is_not_left_behind_by_the_release(tmp_path, monkeypatch):
    """A renewal whose write is slow (an fsync on a busy disk: a run terminated while its
    executors shut down) is waited for by the release: written after the delete, it left a
    live-looking lease that refused the scheduler's retry."""
    import threading
    import time

    from pipeline import fsutil

    writing, real_write = threading.Event(), fsutil.write_text

    def slow_renewal(spark, path, text):
        if threading.current_thread().name == "spark-bpe-lease":
            writing.set()
            time.sleep(6.0)  # longer than the release once waited for the renewal thread
        real_write(spark, path, text)

    monkeypatch.setattr("pipeline.lease.fsutil.write_text", slow_renewal)
    lease = Lease(None, str(tmp_path), timeout=0.4).acquire()
    assert writing.wait(10)
    lease.release()
    lease._thread.join(10)
    assert not lease._thread.is_alive()
    assert not (tmp_path / NAME).exists()


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


def test_a_stalled_run_whose_lease_was_taken_and_released_does_not_publish(tmp_path, caplog):
    """A run stalled past the timeout (a VM pause, SIGSTOP): another run takes the lease over,
    finishes and releases it. When the first one wakes, its check before publishing reads the
    lease file (its renewal thread has not looked yet) and stops it; it never re-creates the
    file. The same when the file names the other run, still holding it."""
    stalled = Lease(None, str(tmp_path), timeout=3600).acquire()  # renewal: in 15 minutes
    try:
        (tmp_path / NAME).unlink()  # taken over, then released, while this run slept
        with pytest.raises(LeaseHeld, match="took over"):
            stalled.check()
        assert "lease file of" in caplog.text and "is gone" in caplog.text
    finally:
        stalled.release()
    assert not (tmp_path / NAME).exists()
    stalled = Lease(None, str(tmp_path), timeout=3600).acquire()
    try:
        (tmp_path / NAME).write_text(json.dumps({"host": "other", "pid": 1, "id": "newer",
                                                 "renewed": 1e12}))
        with pytest.raises(LeaseHeld, match="took over"):
            stalled.check()
    finally:
        stalled.release()
    assert json.loads((tmp_path / NAME).read_text())["id"] == "newer"


def test_a_stalled_run_writes_no_heartbeat_into_the_new_holder_s_progress(tmp_path):
    """A run stopped past its lease's timeout (SIGSTOP) and resumed: its heartbeat thread
    wrote one more line into progress.jsonl, which the run that took the directory over now
    writes, before its renewal thread had looked at the lease (what train's heartbeats asked).
    ``holds`` reads the lease file at each event."""
    from pipeline.progress import Progress

    stalled = Lease(None, str(tmp_path), timeout=3600).acquire()  # renewal: in 15 minutes
    jsonl = tmp_path / "progress.jsonl"
    try:
        progress = Progress("train", str(jsonl), every=10, bar=False, allowed=stalled.holds)
        with progress.stage("merges"):
            pass
        lines = jsonl.read_text()
        (tmp_path / NAME).write_text(json.dumps({"host": "other", "pid": 1, "id": "newer",
                                                 "renewed": 1e12}))
        with progress.stage("outputs"):
            pass
        assert jsonl.read_text() == lines and stalled.lost
    finally:
        stalled.release()


def test_an_output_replaced_whole_has_its_lease_beside_it(tmp_path):
    """Word tables and encoded corpora are written elsewhere and moved into place: their lease
    is ``.<name>.lease.json`` next to them, so replacing the directory cannot remove it."""
    out = tmp_path / "words"
    lease = Lease.beside(None, str(out), timeout=60, purpose="word count").acquire()
    assert lease.path == str(tmp_path / ".words.lease.json") and os.path.exists(lease.path)
    try:
        with pytest.raises(LeaseHeld, match=f"^{out}/ is in use by another word count "):
            Lease.beside(None, f"{out}/", timeout=60, purpose="word count").acquire()
        Lease(None, str(out), timeout=60).acquire().release()  # a different lease
    finally:
        lease.release()
    assert not os.path.exists(lease.path)
    for output, path in [("x", "./.x.lease.json"), ("/a/b", "/a/.b.lease.json"),
                         ("/x", "/.x.lease.json"), ("file:/a/b", "file:/a/.b.lease.json"),
                         ("s3a://bucket/x", "s3a://bucket/.x.lease.json"),
                         ("hdfs://nn:8020/p/q/", "hdfs://nn:8020/p/.q.lease.json"),
                         ("hdfs://nn:8020/q", "hdfs://nn:8020/.q.lease.json"),
                         ("s3a://bucket/q", "s3a://bucket/.q.lease.json")]:
        assert Lease.beside(None, output, 60, "t").path == path


HOLDER = """
import sys
from pipeline.lease import Lease
kind = sys.argv[2]  # run: a run directory; else beside it (checkpoints: a run's checkpoints)
lease = (Lease(None, sys.argv[1], 60) if kind == "run"
         else Lease.beside(None, sys.argv[1], 60, "run" if kind == "checkpoints" else kind)
         ).acquire()
print("held", flush=True)
sys.stdin.read()  # until the test closes stdin
lease.release()
"""


@contextlib.contextmanager
def held_by_another_process(output: Path, purpose: str):
    """A live process on this host that holds ``output``'s lease: yields its pid."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(output), purpose],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        yield p.pid
    finally:
        assert p.stdin is not None
        p.stdin.close()
        assert p.wait(30) == 0


def test_nothing_is_leased_inside_a_directory_another_run_holds(tmp_path):
    """Two real processes: while one holds a run directory, the other may not lease a
    checkpoint directory or a word table inside it (the two would interleave writes there);
    a process's own run lease does not block its own word table; once the run is gone, both
    are free."""
    run = tmp_path / "run-a"
    inner = [Lease(None, str(run / "checkpoints"), 60),
             Lease.beside(None, str(run / "words"), 60, "word count")]
    with held_by_another_process(run, "run") as pid:
        for lease in inner:
            with pytest.raises(LeaseHeld, match=rf"^{re.escape(lease.held)} is inside "
                                                rf"{re.escape(str(run))}, which is in use by "
                                                rf"another run \(host [^,]+, pid {pid}, "):
                lease.acquire()
        assert not (run / "checkpoints").exists() and not (run / ".words.lease.json").exists()
    own = Lease(None, str(tmp_path / "run-b"), 60).acquire()
    try:
        Lease.beside(None, str(tmp_path / "run-b" / "words"), 60, "word count").acquire().release()
    finally:
        own.release()
    for lease in inner:
        lease.acquire().release()


def test_an_enclosing_lease_is_judged_by_its_own_timeout_and_walked_from_the_real_path(
        tmp_path, monkeypatch):
    """The enclosing run's lease is alive by the timeout it recorded, not by ours; a relative
    path is walked up from where it really is; an ancestor that cannot be looked at (a store
    that refuses outside the job's prefix) holds no lease for this check."""
    import time

    from pipeline import fsutil

    outer = tmp_path / "outer"
    outer.mkdir()
    (outer / NAME).write_text(json.dumps({
        "host": "elsewhere", "pid": 1, "started": "x", "id": "other",
        "renewed": time.time() - 200, "timeout": 1000}))  # stale by our 60 s, not by its own
    monkeypatch.chdir(outer)
    with pytest.raises(LeaseHeld, match=r"^checkpoints is inside \S*outer, which is in use by "
                                        r"another run \(host elsewhere, pid 1"):
        Lease(None, "checkpoints", 60).acquire()
    real_exists = fsutil.exists

    def refusing(spark, path):
        if path.endswith("outer/" + NAME):
            raise PermissionError("403 Forbidden")
        return real_exists(spark, path)

    monkeypatch.setattr(fsutil, "exists", refusing)
    Lease(None, str(outer / "checkpoints"), 60).acquire().release()


@pytest.mark.spark
def test_count_and_encode_refuse_an_output_another_process_holds(spark, tmp_path):
    """Two real processes: while one holds the output of a word count or an encode job, the
    other refuses, naming the holder's pid, and writes nothing; once it is gone, both run."""
    from pipeline.config import Config
    from pipeline.count.word_count import count_words
    from pipeline.encode_corpus import encode_corpus

    from .test_exports import train_in_memory

    texts = [f"row {i} of some text, and more text" for i in range(200)]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": texts}), tmp_path / "in" / "part-0.parquet")
    words = tmp_path / "words"
    count_cfg = Config(input=str(tmp_path / "in"), output=str(words))
    with held_by_another_process(words, "word count") as pid:
        with pytest.raises(LeaseHeld, match=f"^{words} is in use by another word count "
                                            f"\\(host [^,]+, pid {pid}, started "):
            count_words(spark, count_cfg)
        assert not words.exists()
    count_words(spark, count_cfg)
    assert (words / "word_table.json").exists()
    assert not (tmp_path / ".words.lease.json").exists()

    train_in_memory(texts, tmp_path / "run", vocab_size=300)
    enc = tmp_path / "enc"
    encode_cfg = Config(input=str(tmp_path / "in"), tokenizer=str(tmp_path / "run"),
                        output=str(enc))
    with held_by_another_process(enc, "encode job") as pid:
        with pytest.raises(LeaseHeld, match=f"^{enc} is in use by another encode job "
                                            f"\\(host [^,]+, pid {pid}, "):
            encode_corpus(spark, encode_cfg)
        assert not enc.exists() and not list(tmp_path.glob("enc.tmp-*"))
    assert encode_corpus(spark, encode_cfg).stats["stats"]["rows"] == len(texts)
    assert not (tmp_path / ".enc.lease.json").exists()


@pytest.mark.spark
def test_a_lease_lost_before_publishing_publishes_nothing(spark, tmp_path, monkeypatch):
    """A count or an encode whose lease was taken over while it ran: its staging directory is
    removed and the output is not touched (the check comes before anything is published)."""
    from pipeline import encode_corpus as ec
    from pipeline.config import Config
    from pipeline.count.word_count import count_words

    from .test_exports import train_in_memory

    class Lost:
        def check(self) -> None:
            raise LeaseHeld("another run took over the output while this one ran")

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

    texts = [f"row {i} of some text" for i in range(100)]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": texts}), tmp_path / "in" / "part-0.parquet")
    words = tmp_path / "words"
    with pytest.raises(LeaseHeld, match="took over"):
        count_words(spark, Config(input=str(tmp_path / "in"), output=str(words)), lease=Lost())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # no table, no staging

    train_in_memory(texts, tmp_path / "run", vocab_size=300)
    monkeypatch.setattr(ec.Lease, "beside", classmethod(lambda cls, *a: Lost()))
    with pytest.raises(LeaseHeld, match="took over"):
        ec.encode_corpus(spark, Config(input=str(tmp_path / "in"), output=str(tmp_path / "enc"),
                                       tokenizer=str(tmp_path / "run")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "run"]


@pytest.mark.spark
def test_a_run_that_lost_its_lease_while_making_its_report_writes_nothing_more(
        spark, tmp_path, monkeypatch):
    """A run stalled past its lease while it made its report (a VM pause): another run took
    the directory over. The stalled one wrote its report, config.json and stats.json over the
    new holder's before its check; now it stops at the next file."""
    from pipeline import report
    from pipeline import train as train_module
    from pipeline.config import Config

    run = tmp_path / "run"
    real = report.render_report

    def stalled(*args, **kwargs):
        (run / NAME).write_text(json.dumps({"host": "other", "pid": 1, "id": "newer",
                                            "renewed": 1e12}))  # taken over meanwhile
        return real(*args, **kwargs)

    monkeypatch.setattr(report, "render_report", stalled)
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": [f"row {i} of some text" for i in range(100)]}),
                   tmp_path / "in" / "part-0.parquet")
    with pytest.raises(LeaseHeld, match="took over"):
        train_module.train(spark, Config(input=str(tmp_path / "in"), output=str(run),
                                         vocab_size=300, progress_bar=False))
    written = {p.name for p in run.iterdir()}
    assert not written & {"report.html", "config.json", "stats.json", "run.json"}, written
    assert json.loads((run / NAME).read_text())["id"] == "newer"


def test_train_counts_its_words_under_their_own_lease(spark, tmp_path):
    """A count_words job writing RUN/words while a training run on RUN starts: the run refuses
    to count into it (naming the holder) and leaves the job's staging directory alone."""
    from pipeline.config import Config
    from pipeline.train import train

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["some words here"] * 50}), tmp_path / "in" / "a.parquet")
    run = tmp_path / "run"
    run.mkdir()
    staging = run / "words.tmp-0000abcd"  # the other job's table, being written
    staging.mkdir()
    cfg = Config(input=str(tmp_path / "in"), output=str(run), vocab_size=260,
                 progress_bar=False)
    with held_by_another_process(run / "words", "word count") as pid:
        with pytest.raises(LeaseHeld, match=f"^{run / 'words'} is in use by another word "
                                            f"count \\(host [^,]+, pid {pid}, "):
            train(spark, cfg)
        assert staging.exists() and not (run / "words").exists()
    staging.rmdir()
    assert len(train(spark, cfg).merges) == 3


@pytest.mark.spark
def test_a_run_refuses_its_checkpoints_while_another_run_checkpoints_there(spark, tmp_path):
    """Another live run was given RUN/checkpoints as its --checkpoint-dir (and holds its
    lease, RUN/.checkpoints.lease.json): a run on RUN refuses, naming that holder, and
    touches neither those checkpoints nor its own directory's lease; once that run is gone it
    trains. A run leases its checkpoint directory beside it: a run that fails makes no
    checkpoints directory."""
    from pipeline.config import Config, ConfigError
    from pipeline.train import train

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["some words here"] * 50}), tmp_path / "in" / "a.parquet")
    run = tmp_path / "run"
    ckdir = run / "checkpoints"
    ckdir.mkdir(parents=True)
    theirs = ckdir / "merges-000000001-0123456789abcdef.txt"  # the other run's checkpoint
    theirs.write_text("theirs\n")
    cfg = Config(input=str(tmp_path / "in"), output=str(run), vocab_size=260,
                 progress_bar=False)
    with held_by_another_process(ckdir, "checkpoints") as pid:
        with pytest.raises(LeaseHeld, match=f"^{ckdir} is in use by another run \\(host "
                                            f"[^,]+, pid {pid}, "):
            train(spark, cfg)
        assert theirs.read_text() == "theirs\n" and not (run / NAME).exists()
    theirs.unlink()
    assert len(train(spark, cfg).merges) == 3
    assert list(ckdir.glob("merges-*.txt")) and not list(run.glob(".*lease.json"))

    fresh = tmp_path / "fresh"  # fails at once (vocab too small): no directory left behind
    with pytest.raises(ConfigError, match="'vocab_size' = 10 leaves no merges"):
        train(spark, Config(input=str(tmp_path / "in"), output=str(fresh), vocab_size=10,
                            progress_bar=False))
    assert not (fresh / "checkpoints").exists()


@pytest.mark.spark
@pytest.mark.parametrize("same", ["run", "run/", "./run/../run"])
def test_a_checkpoint_dir_equal_to_the_output_is_leased_once(spark, tmp_path, monkeypatch,
                                                             same):
    """--checkpoint-dir naming the run directory itself (in any spelling) is one directory,
    one lease: the run must not find its own lease and refuse itself."""
    from pipeline.config import Config
    from pipeline.train import train

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["some words here"] * 50}), tmp_path / "in" / "a.parquet")
    cfg = Config(input=str(tmp_path / "in"), output=str(tmp_path / "run"), vocab_size=260,
                 checkpoint_dir=same if same.startswith(".") else f"{tmp_path}/{same}",
                 progress_bar=False)
    assert len(train(spark, cfg).merges) == 3
    assert list((tmp_path / "run").glob("merges-*.txt"))  # the checkpoints went there


@pytest.mark.spark
def test_a_run_that_lost_its_lease_writes_no_checkpoint(spark, tmp_path, monkeypatch):
    """A run whose lease another run took while it counted or trained touches no checkpoint:
    it neither cleans, writes nor prunes the new holder's (made to fail by calling MergeLog
    without the guard: the run wrote merges-*.txt, then stopped only before publishing; and
    by calling prepare without it: the holder's temp file was cleaned away)."""
    from pipeline import train as train_module
    from pipeline.config import Config

    class TakenAtOnce(Lease):
        def acquire(self) -> Lease:
            super().acquire()
            if self.purpose == "run":  # the run directory's (its words are counted under theirs)
                self.lost = True  # as the renewal thread sets it when another id holds it
            return self

    monkeypatch.setattr(train_module, "Lease", TakenAtOnce)
    (tmp_path / "in").mkdir()
    texts = [f"row {i}: some words, and more words {i * 7}" for i in range(300)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "in" / "a.parquet")
    cfg = Config(input=str(tmp_path / "in"), output=str(tmp_path / "run"), vocab_size=600,
                 checkpoint_every_merges=1, progress_bar=False)
    holders = tmp_path / "run" / "checkpoints" / ".tmp-holder"  # the new holder's, half-written
    holders.parent.mkdir(parents=True)
    holders.write_text("#spark-bpe merges checkpoint v2\n")
    with pytest.raises(LeaseHeld, match="took over"):
        train_module.train(spark, cfg)
    assert (tmp_path / "run" / "words" / "word_table.json").exists()  # it got that far
    assert holders.exists()  # not cleaned away: the checkpoints are not this run's any more
    assert not list((tmp_path / "run").rglob("merges*.txt"))
    assert not (tmp_path / "run" / "run.json").exists()


def test_an_enclosing_lease_is_this_process_s_own_only_if_it_took_it(tmp_path):
    """A lease on the enclosing run directory with this host name and this pid, but not
    taken by this process (another container with the same host name, whose process has the
    same small pid): a lease inside it is refused, not taken for this process's own."""
    import time

    run = tmp_path / "run"
    run.mkdir()
    me = Lease(None, str(run), 60).me
    (run / NAME).write_text(json.dumps({**me, "id": "another-container", "pid_ns": "pid:[1]",
                                        "renewed": time.time()}))
    with pytest.raises(LeaseHeld, match=r"is inside \S*run, which is in use by another run"):
        Lease(None, str(run / "checkpoints"), 60).acquire()
    (run / NAME).unlink()
    own = Lease(None, str(run), 60).acquire()  # this process's own: nested leases are fine
    try:
        Lease.beside(None, str(run / "checkpoints"), 60, "run").acquire().release()
    finally:
        own.release()


def test_a_lease_file_left_unreadable_is_taken_over_after_the_timeout(tmp_path, caplog):
    """A writer that died between creating the lease file and writing it (a full disk, a
    kill) left it empty: it held the directory for good ("could not take the lease"); now
    it is refused while it may still be being written, and taken over once it has not
    changed for the timeout."""
    caplog.set_level(logging.WARNING, logger="pipeline.lease")
    lease_file = tmp_path / NAME
    lease_file.write_text("")
    with pytest.raises(LeaseHeld, match=r"cannot be read \(empty or not JSON.*taken over "
                                        r"once 60 s \(lease_timeout_seconds\) old, or delete"):
        Lease(None, str(tmp_path), timeout=60).acquire()
    old = lease_file.stat().st_mtime - 61
    os.utime(lease_file, (old, old))
    taken = Lease(None, str(tmp_path), timeout=60).acquire()
    try:
        assert json.loads(lease_file.read_text())["id"] == taken.me["id"]
        assert "taking over the lease of" in caplog.text
        assert "its file cannot be read (0 bytes" in caplog.text
    finally:
        taken.release()


@pytest.mark.parametrize("record", [[], "x", {"renewed": "abc"}, {"renewed": None},
                                    {"renewed": float("nan"), "host": "other", "pid": 1},
                                    {"renewed": 1.0e12, "pid": "x"}, {"host": "h"},
                                    {"renewed": 1.0e9, "pid": 1, "timeout": "60"}])
def test_a_lease_file_of_another_shape_counts_as_unreadable(tmp_path, record):
    """JSON that is not a lease record raised AttributeError, KeyError, ValueError or
    TypeError (in the renewal thread too, which then died without a word): it is unreadable,
    refused while fresh, taken over once unchanged for the timeout (found by review)."""
    lease_file = tmp_path / NAME
    lease_file.write_text(json.dumps(record))
    with pytest.raises(LeaseHeld, match=r"cannot be read"):
        Lease(None, str(tmp_path), timeout=60).acquire()
    old = lease_file.stat().st_mtime - 61
    os.utime(lease_file, (old, old))
    Lease(None, str(tmp_path), timeout=60).acquire().release()


@pytest.mark.parametrize("offset,refusal,taken", [
    (1e9, r"last renewed by a clock 1,000,000,\d+ s ahead", "stamped 1,000,000,"),
    (-3600, r"last renewed by a clock 3,6\d\d s behind", "its last renewal was 3,6"),
])
def test_a_lease_stamped_by_a_clock_far_off_is_judged_by_its_file(tmp_path, caplog, offset,
                                                                  refusal, taken):
    """A renewal time in the future (another host's clock far ahead) was never out of date:
    the directory was held for good ("last seen -1,000,000,000 s ago"); one more than a
    timeout in the past (a holder whose clock is behind, or after this host's clock stepped
    forward) was taken over at once though the holder renews its file. Beyond a timeout
    either way, the file's own age decides too: refused while it changes, taken over once
    not."""
    caplog.set_level(logging.WARNING, logger="pipeline.lease")
    lease_file = tmp_path / NAME
    lease_file.write_text(json.dumps({"renewed": time.time() + offset, "host": "other-host",
                                      "pid": 1, "started": "then"}))
    with pytest.raises(LeaseHeld, match=refusal):
        Lease(None, str(tmp_path), timeout=60).acquire()
    old = lease_file.stat().st_mtime - 61
    os.utime(lease_file, (old, old))
    Lease(None, str(tmp_path), timeout=60).acquire().release()
    assert taken in caplog.text
    if offset > 0:
        assert "has not changed for 6" in caplog.text


def test_a_lease_file_is_never_left_half_written(tmp_path):
    """The lease file appears whole or not at all: a write that fails (here a file size
    limit, as a full disk would) leaves no file holding the name (O_EXCL then write left
    one, empty or cut, that no later run could read or take)."""
    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (8, 8))\n"
        "from pipeline.fsutil import create_exclusive\n"
        "try:\n"
        "    create_exclusive(None, sys.argv[1], 'x' * 4096)\n"
        "except OSError as exc:\n"
        "    print('failed:', exc.errno)\n")
    target = tmp_path / NAME
    out = subprocess.run([sys.executable, "-c", script, str(target)], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parent.parent, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("failed:"), out.stdout
    assert not target.exists()
    assert os.listdir(tmp_path) == []  # nor its temp file
    Lease(None, str(tmp_path), timeout=60).acquire().release()


def test_a_failed_read_of_the_lease_file_is_no_lost_lease(tmp_path, monkeypatch, caplog):
    """The storage failing to read the lease file (a store's 503, EIO) says nothing about who
    holds it: the run keeps its lease (it stopped with 'another run took over' on one failed
    read); a lease file that is gone, or names another run, is still a lost lease."""
    from pipeline import lease as lease_mod

    caplog.set_level(logging.WARNING, logger="pipeline.lease")
    lease = Lease(None, str(tmp_path), timeout=60).acquire()
    real_read = lease_mod.fsutil.read_text
    try:
        def failing(spark, path):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(lease_mod.fsutil, "read_text", failing)
        assert lease.holds() and not lease.lost
        lease.check()
        assert "could not read the lease file" in caplog.text
        # a run stalled past its timeout (a VM pause) whose read then fails: its lease may
        # have been taken meanwhile, so it counts as lost (it renewed over the new holder's)
        lease.confirmed -= 61
        assert not lease.holds() and lease.lost
        lease.lost, lease.confirmed = False, time.monotonic()
        monkeypatch.setattr(lease_mod.fsutil, "read_text", real_read)
        assert lease.holds()
        record = json.loads((tmp_path / NAME).read_text())
        (tmp_path / NAME).write_text(json.dumps({**record, "id": "another run"}))
        assert not lease.holds() and lease.lost
    finally:
        monkeypatch.setattr(lease_mod.fsutil, "read_text", real_read)
        lease.release()


def test_on_a_store_a_create_both_runs_won_is_looked_at_again(tmp_path, monkeypatch):
    """An object store's "create if absent" is a look then a write: two runs starting at once
    can both be told they created the lease; the one whose write was overwritten now sees it
    and stops (it went on, both writing in place into one output)."""
    from pipeline import lease as lease_mod

    monkeypatch.setattr(Lease, "_create_is_atomic", lambda self: False)
    other = {"host": "elsewhere", "pid": 1, "started": "x", "id": "the other run",
             "timeout": 60}

    def both_won(spark, path, text):  # ours written, then the other run's over it
        if Path(path).exists():
            return False
        Path(path).write_text(text)
        Path(path).write_text(json.dumps({**other, "renewed": time.time()}))
        return True

    monkeypatch.setattr(lease_mod.fsutil, "create_exclusive", both_won)
    with pytest.raises(LeaseHeld, match="host elsewhere, pid 1"):
        Lease(None, str(tmp_path / "a"), timeout=60).acquire()
    monkeypatch.undo()
    lease = Lease(None, str(tmp_path / "b"), timeout=60).acquire()  # (the usual path)
    lease.release()


def test_on_a_store_a_late_read_back_of_the_own_lease_is_no_refusal(tmp_path, monkeypatch):
    """The read-back after creating the lease on a store came back empty (a late read): the
    next look found this run's own record, and the run refused itself as "another run"."""
    from pipeline import lease as lease_mod

    monkeypatch.setattr(Lease, "_create_is_atomic", lambda self: False)

    def create(spark, path, text):
        if Path(path).exists():
            return False
        Path(path).write_text(text)
        return True

    monkeypatch.setattr(lease_mod.fsutil, "create_exclusive", create)
    real_read, late = Lease._read, [True]

    def read(self):
        if late:
            late.pop()
            return None
        return real_read(self)

    monkeypatch.setattr(Lease, "_read", read)
    lease = Lease(None, str(tmp_path), timeout=60).acquire()
    assert json.loads((tmp_path / NAME).read_text())["id"] == lease.me["id"]
    lease.release()
