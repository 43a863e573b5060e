"""Heartbeats (no JVM): throttled lines, progress.jsonl, and a bar that never mixes with the
log (the real-process test is in test_faults)."""

from __future__ import annotations

import io
import json
import logging
import threading
import time

import pytest

from pipeline import progress as progress_mod
from pipeline.progress import (
    BarAwareHandler,
    Progress,
    TerminalBar,
    WholeFileJsonl,
    current_stage,
)


def test_a_stage_beats_at_most_every_interval_and_ends_with_a_summary(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pipeline.progress")
    jsonl = tmp_path / "progress.jsonl"
    prog = Progress("test", str(jsonl), every=0.2, bar=False)
    with prog.stage("merges", total=100, unit="merges") as st:
        for i in range(1, 101):
            st.update(i, last="a+b", note="", rows=0, eta_x=None)
            time.sleep(0.005)  # 0.5 s in all: about 2 beats, not 100
    events = [json.loads(x) for x in jsonl.read_text().splitlines()]
    # a field with no value is left out (not null, not ""); a zero is a value
    assert all("note" not in e and "eta_x" not in e and e["rows"] == 0 for e in events[1:])
    beats = [e for e in events if e["event"] == "beat"]
    assert 1 <= len(beats) <= 5
    assert events[0]["event"] == "start" and events[-1]["event"] == "end"
    assert events[-1]["done"] == events[-1]["total"] == 100
    assert all(0 <= b["done"] <= 100 and b["eta"] >= 0 for b in beats)
    assert "merges: done in" in caplog.text and "100/100 merges" in caplog.text


def test_a_second_attempt_appends_to_progress_jsonl(tmp_path):
    jsonl = tmp_path / "progress.jsonl"
    for job in ("first", "second"):
        with Progress(job, str(jsonl), every=10, bar=False).stage("prepare"):
            pass
    events = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert [(e["job"], e["event"]) for e in events] == [
        ("first", "start"), ("first", "end"), ("second", "start"), ("second", "end")]



def test_an_attempt_after_one_cut_short_mid_line_starts_a_line_of_its_own(tmp_path):
    """A killed attempt (or a full disk) can leave a last line without its newline: the next
    attempt's first event was glued onto it, one line that is not JSON, the event lost."""
    jsonl = tmp_path / "progress.jsonl"
    jsonl.write_text('{"time": "x", "job": "first", "event": "start"}\n{"time": "y", "ev')
    with Progress("second", str(jsonl), every=10, bar=False).stage("prepare"):
        pass
    lines = jsonl.read_text().splitlines()
    assert lines[1] == '{"time": "y", "ev'  # the cut line stays, as it was
    events = [json.loads(x) for x in lines[2:]]
    assert [(e["job"], e["event"]) for e in events] == [("second", "start"), ("second", "end")]


class Store:
    """A file on a filesystem that cannot append (HDFS, S3): whole writes only; ``fail``
    writes fail first, each write takes ``delay`` seconds."""

    def __init__(self, text: str = "", fail: int = 0, delay: float = 0.0):
        self.text, self.writes, self.fail, self.delay = text, 0, fail, delay

    def write(self, text: str) -> None:
        time.sleep(self.delay)
        if self.fail:
            self.fail -= 1
            raise OSError("store unavailable")
        self.text, self.writes = text, self.writes + 1

    def events(self) -> list[tuple[str, str]]:
        return [(e["job"], e["event"]) for e in map(json.loads, self.text.splitlines())]


def until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_progress_jsonl_where_appending_is_impossible_is_written_whole(caplog):
    """On HDFS or an object store: the earlier attempts' lines kept, the first event written
    at once, heartbeats at most every ``every`` seconds, every stage's end at once; a failed
    write is one warning, and the next write (at the same pace) catches up."""
    earlier = json.dumps({"job": "first", "event": "end"}) + "\n"
    store = Store(earlier, fail=1)
    sink = WholeFileJsonl(store.write, lambda: store.text, every=60, where="s3a://b/run/p")
    prog = Progress("second", sink, every=0.05, bar=False)
    assert prog.jsonl is None
    with prog.stage("merges"):  # start: written at once, and that write fails (warned)
        time.sleep(0.4)  # several beats, none written: the next write is 60 s away
        assert store.writes == 0 and store.text == earlier
    assert until(lambda: store.writes == 1)  # the stage's end, with everything before it
    events = store.events()
    assert events[0] == ("first", "end") and events[1] == ("second", "start")
    assert events[-1] == ("second", "end") and events.count(("second", "beat")) >= 3
    assert caplog.text.count("cannot write s3a://b/run/p (store unavailable)") == 1
    with pytest.raises(RuntimeError), prog.stage("report"):
        raise RuntimeError("boom")
    assert until(lambda: store.writes == 2) and store.events()[-1] == ("second", "error")


def test_a_store_that_hangs_delays_the_file_not_the_job():
    """Writes happen in a thread of their own: a store that takes 1 s per write does not
    slow the stage down; close() waits for the last write (at most close_timeout)."""
    store = Store(delay=1.0)
    sink = WholeFileJsonl(store.write, lambda: "", every=0)
    prog = Progress("train", sink, every=0.01, bar=False)
    t0 = time.monotonic()
    with prog.stage("merges", total=1000) as st:
        for i in range(1000):
            st.update(i + 1)
    assert time.monotonic() - t0 < 0.5 and store.writes <= 1
    prog.close()
    assert store.events()[-1] == ("train", "end")
    late = WholeFileJsonl(Store(delay=5.0).write, lambda: "", close_timeout=0.2)
    late.add('{"job": "x", "event": "start"}', heartbeat=False, flush=False)
    t0 = time.monotonic()
    late.close()
    assert time.monotonic() - t0 < 1.0


def test_a_long_run_keeps_its_starts_and_ends_and_the_newest_heartbeats():
    """Past max_lines the oldest heartbeats give way, the earlier attempts' first."""
    earlier = "".join(json.dumps({"job": "first", "event": e}) + "\n"
                      for e in ("start", "beat", "beat", "end"))
    store = Store(earlier)
    sink = WholeFileJsonl(store.write, lambda: store.text, every=0, max_lines=8)
    prog = Progress("train", sink, every=0.02, bar=False)
    with prog.stage("count"):
        time.sleep(0.3)
    prog.close()
    kinds = store.events()
    assert len(kinds) == 8 and kinds[:2] == [("first", "start"), ("first", "end")]
    assert kinds[2] == ("train", "start") and kinds[-1] == ("train", "end")
    assert kinds[3:-1] == [("train", "beat")] * 4  # the newest four of many


def test_a_run_that_lost_its_lease_stops_writing_progress_jsonl():
    store = Store()
    lost = []
    sink = WholeFileJsonl(store.write, lambda: "", every=0, allowed=lambda: not lost)
    prog = Progress("train", sink, every=10, bar=False)
    with prog.stage("prepare"):
        pass
    assert until(lambda: store.text and store.events()[-1] == ("train", "end"))
    written = store.writes
    lost.append(True)
    with pytest.raises(RuntimeError), prog.stage("merges"):
        raise RuntimeError("the lease was taken")
    prog.close()
    assert store.writes == written and store.events()[-1] == ("train", "end")


def test_a_run_that_lost_its_lease_stops_appending_to_a_local_progress_jsonl(tmp_path):
    jsonl = tmp_path / "progress.jsonl"
    lost = []
    prog = Progress("train", str(jsonl), every=10, bar=False, allowed=lambda: not lost)
    with prog.stage("prepare"):
        pass
    lost.append(True)
    with pytest.raises(RuntimeError), prog.stage("merges"):
        raise RuntimeError("the lease was taken")
    assert [json.loads(x)["event"] for x in jsonl.read_text().splitlines()] == ["start", "end"]


def test_a_file_on_a_store_gets_a_whole_file_progress_jsonl(tmp_path):
    from pipeline.progress import jsonl_at

    assert isinstance(jsonl_at(None, "s3a://lake/runs/r1/progress.jsonl"), WholeFileJsonl)
    assert jsonl_at(None, str(tmp_path / "r" / "progress.jsonl")) == str(
        tmp_path / "r" / "progress.jsonl")
    assert jsonl_at(None, f"file://{tmp_path}/p.jsonl") == f"{tmp_path}/p.jsonl"
    assert jsonl_at(None, "") is None


def test_a_busy_stage_still_beats_and_a_failure_is_recorded(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pipeline.progress")
    jsonl = tmp_path / "progress.jsonl"
    prog = Progress("test", str(jsonl), every=0.1, bar=False)
    with pytest.raises(RuntimeError), prog.stage("report"):
        time.sleep(0.45)  # one long call: the ticker speaks for it
        raise RuntimeError("boom")
    events = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert sum(e["event"] == "beat" for e in events) >= 2
    assert events[-1]["event"] == "error" and events[-1]["error"] == "RuntimeError"
    assert current_stage() == "report"  # an error message names the stage that failed
    assert "report: failed after" in caplog.text


def test_merges_from_a_checkpoint_count_as_done_but_not_in_the_rate(tmp_path):
    jsonl = tmp_path / "progress.jsonl"
    prog = Progress("test", str(jsonl), every=10, bar=False)
    with prog.stage("merges", total=1000, unit="merges", start=600) as st:
        time.sleep(0.5)
        st.update(610, force=True)  # 10 new merges in about 0.5 s
    served = Progress("test", str(tmp_path / "p2.jsonl"), every=10, bar=False)
    with served.stage("merges", total=600, unit="merges", start=600):
        pass  # all from the checkpoint
    beat, end = [json.loads(x) for x in jsonl.read_text().splitlines()][1:]
    assert beat["done"] == 610 and 10 <= beat["rate"] <= 25  # not 610 / 0.5 s
    assert beat["eta"] > 15  # 390 left at about 20 merges/s
    last = json.loads((tmp_path / "p2.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "end" and last["done"] == last["total"] == 600


def test_the_rate_restarts_after_set_up_and_a_poll_can_restart_it(tmp_path):
    """Loading the words before the first merge is not in the merges' rate (an ETA from it
    said 461 s for a stage that ended 10 s later); a poll's ``rate_from`` moves it too."""
    jsonl = tmp_path / "progress.jsonl"
    prog = Progress("test", str(jsonl), every=10, bar=False)
    with prog.stage("merges", total=1000, unit="merges") as st:
        time.sleep(0.6)  # set-up, nothing done
        st.restart_rate()
        time.sleep(0.2)
        st.update(100, force=True)  # 100 merges in about 0.2 s
    beat = [json.loads(x) for x in jsonl.read_text().splitlines()][1]
    assert beat["rate"] >= 300 and beat["eta"] <= 3  # not 100 / 0.8 s, ETA 7 s
    phases = iter([{"done": 50, "total": 100},  # the reading, since the stage began
                   {"done": 5, "total": 10, "rate_from": (time.monotonic() + 0.3, 0)}])
    polled = Progress("test", str(tmp_path / "p2.jsonl"), every=10, bar=False)
    with polled.stage("count", unit="tasks", poll=lambda: next(phases)) as st:
        time.sleep(0.3)
        st.beat()
        time.sleep(0.3)
        st.beat()
    first, second = [json.loads(x) for x in (tmp_path / "p2.jsonl").read_text().splitlines()][1:3]
    assert 100 <= first["rate"] <= 170 and first["eta"] <= 1.1  # 50 tasks in 0.3 s
    assert second["done"] == 5 and 10 <= second["rate"] <= 34 and second["eta"] >= 0.14


def test_the_merges_eta_follows_the_recent_rate(tmp_path):
    """Merges get cheaper as they go: their ETA is at the rate since the previous heartbeat
    (the rate shown stays the average), and the first heartbeat, with no earlier one to measure
    from, has none (its rate is the first, heaviest merges'); other stages' ETA is at the
    average from the first heartbeat on."""
    def beats(recent: bool) -> list[dict]:
        jsonl = tmp_path / f"{recent}.jsonl"
        prog = Progress("test", str(jsonl), every=10, bar=False)
        with prog.stage("merges", total=1000, unit="merges", recent_eta=recent) as st:
            st.update(0, force=True)  # a heartbeat before the first merge: not a point
            time.sleep(1.0)
            st.update(100, force=True)  # 100 merges/s
            time.sleep(1.0)
            st.update(500, force=True)  # then 400/s: 250/s on average
        return [e for e in map(json.loads, jsonl.read_text().splitlines())
                if e["event"] == "beat"][1:]

    first, second = beats(recent=True)
    assert "eta" not in first and first["rate"] >= 80  # no earlier beat: a rate, no ETA
    assert second["rate"] <= 260 and second["eta"] <= 1.7  # 500 left at about 400/s
    average = beats(recent=False)
    assert average[0]["eta"] >= 7  # 900 left at the average 100/s
    assert average[1]["eta"] >= 1.9  # at the average: 500 / 250


def fake_clocks(monkeypatch, wall: list[float], steady: list[float]) -> None:
    """progress.py's clocks read from the lists: ``wall`` (time.time) and ``steady``
    (time.monotonic); sleeping stays real."""
    fake = type("FakeTime", (), {"time": staticmethod(lambda: wall[0]),
                                 "monotonic": staticmethod(lambda: steady[0]),
                                 "sleep": staticmethod(time.sleep)})
    monkeypatch.setattr(progress_mod, "time", fake)


def test_the_merges_eta_holds_steady_when_rounds_alternate_small_and_large(tmp_path,
                                                                            monkeypatch):
    """Spark rounds that merge 3 and then 100 (heartbeats 5 s apart, about 10 merges/s all
    along): the ETA is measured over the recent quarter of the stage (at most a minute), not
    from the previous heartbeat alone, which made it swing 30x from one line to the next."""
    clock = [1000.0]
    fake_clocks(monkeypatch, clock, clock)
    jsonl = tmp_path / "progress.jsonl"
    prog = Progress("test", str(jsonl), every=1000, bar=False)
    with prog.stage("merges", total=20_000, unit="merges", recent_eta=True) as st:
        done = 0
        for beat in range(60):
            clock[0] += 5
            done += 3 if beat % 2 else 100
            st.update(done, force=True)
    beats = [e for e in map(json.loads, jsonl.read_text().splitlines())
             if e["event"] == "beat" and e["elapsed"] >= 120]
    for b in beats:  # the true ETA: what is left at the average 10.3 merges/s
        true = (20_000 - b["done"]) / (103 / 10)
        assert 0.8 * true <= b["eta"] <= 1.25 * true, (b, true)


def test_a_recent_eta_is_not_measured_across_a_change_of_unit(tmp_path, monkeypatch):
    """The count's heartbeat counts rows while its tasks read, tasks while the driver merges,
    rows again at the end: a point of 2 tasks is no point of rows (it made the ETA of a beat
    of 900 rows out of 1,000 say 0.1 s)."""
    clock = [1000.0]
    fake_clocks(monkeypatch, clock, clock)
    polled = [{"unit": "rows", "done": 100, "total": 1000},
              {"unit": "tasks", "done": 2, "total": None},
              {"unit": "rows", "done": 900, "total": 1000},
              {"unit": "rows", "done": 950, "total": 1000}]
    jsonl = tmp_path / "progress.jsonl"
    prog = Progress("test", str(jsonl), every=1000, bar=False)
    with prog.stage("count", unit="rows", poll=lambda: polled.pop(0),
                    recent_eta=True) as st:
        for _ in range(4):
            clock[0] += 10
            st.update(force=True)
        polled.append({"unit": "rows", "done": 1000, "total": 1000})  # (the end's poll)
    beats = [e for e in map(json.loads, jsonl.read_text().splitlines()) if e["event"] == "beat"]
    assert [b["unit"] for b in beats] == ["rows", "tasks", "rows", "rows"]
    assert "eta" not in beats[2], beats[2]  # no earlier point of rows since the change
    assert beats[3]["eta"] == 10.0, beats[3]  # 50 left at 50 rows in 10 s


def test_the_merges_eta_shows_with_heartbeats_under_a_second_apart(tmp_path):
    """With ``heartbeat_seconds`` below 1 the recent rate is still measured over a second or
    more (it was measured from the previous heartbeat only, never a second back: no ETA)."""
    jsonl = tmp_path / "progress.jsonl"
    prog = Progress("test", str(jsonl), every=10, bar=False)
    with prog.stage("merges", total=1000, unit="merges", recent_eta=True) as st:
        for done in (0, 100, 200, 300, 400, 500):
            st.update(done, force=True)
            time.sleep(0.4)
    beats = [e for e in map(json.loads, jsonl.read_text().splitlines()) if e["event"] == "beat"]
    assert "eta" in beats[-1] and beats[-1]["eta"] <= 4, beats  # 500 left at about 250/s


def test_no_heartbeat_follows_a_failed_stage(tmp_path):
    """A heartbeat whose poll was still running when the stage failed is dropped: a dashboard
    reading the last event of a stage sees the error."""
    jsonl = tmp_path / "progress.jsonl"
    prog = Progress("test", str(jsonl), every=0.1, bar=False)

    def slow_poll() -> dict:
        time.sleep(0.4)  # a status-tracker call to a JVM that is going away
        return {"rows": 1}

    with pytest.raises(RuntimeError), prog.stage("count", poll=slow_poll):
        time.sleep(0.2)  # the ticker is inside slow_poll now
        raise RuntimeError("boom")
    time.sleep(0.6)  # the ticker's beat has finished its poll
    events = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert events[-1]["event"] == "error", events
    assert not [e for e in events if e["event"] == "beat" and "error" in e]


def test_a_poll_that_hangs_does_not_keep_the_stage_from_ending(tmp_path, monkeypatch):
    """A heartbeat's poll stuck in a call (a JVM that does not answer) delays the stage's end
    by at most POLL_WAIT_SECONDS; the end line comes without a poll, and the stuck beat,
    when its poll returns, is dropped."""
    monkeypatch.setattr(progress_mod, "POLL_WAIT_SECONDS", 0.3)
    jsonl = tmp_path / "progress.jsonl"
    prog = Progress("test", str(jsonl), every=0.05, bar=False)
    release, entered = threading.Event(), threading.Event()
    polls = []

    def hanging_poll() -> dict:
        polls.append(threading.current_thread().name)
        entered.set()
        release.wait(30)
        return {"rows": 7}

    t0 = time.monotonic()
    with prog.stage("count", poll=hanging_poll):
        assert entered.wait(5)  # the ticker is inside the poll now
    took = time.monotonic() - t0
    release.set()
    time.sleep(0.3)  # the stuck beat's poll has returned
    events = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert took < 2.0, took
    assert events[-1]["event"] == "end" and "rows" not in events[-1], events
    assert len(polls) == 1  # (the end did not poll again)


def test_no_tasks_yet_of_no_known_total_is_not_a_figure(caplog):
    """The count's merge on the driver runs no Spark task: its heartbeat says what it does,
    not '0 tasks'; tasks it does run are counted; progress.jsonl keeps done = 0."""
    caplog.set_level(logging.INFO, logger="pipeline.progress")
    sink = io.StringIO()
    seen = {"done": 0}
    prog = Progress("test", None, every=10, bar=False)
    prog.emit = lambda rec, text: sink.write(f"{json.dumps(rec)}\t{text}\n")
    with prog.stage("count", unit="tasks",
                    poll=lambda: {**seen, "note": "merging the partial counts (driver)"}) as st:
        st.update(force=True)
        seen["done"] = 3
        st.update(force=True)
    lines = [line.split("\t") for line in sink.getvalue().splitlines()]
    beats = [(json.loads(rec), text) for rec, text in lines if json.loads(rec)["event"] == "beat"]
    assert beats[0][0]["done"] == 0 and "0 tasks" not in beats[0][1], beats[0]
    assert beats[0][1].startswith("count: merging the partial counts (driver), "), beats[0]
    assert "3 tasks" in beats[1][1], beats[1]


def test_the_bar_is_cleared_before_each_log_line_and_redrawn_after(monkeypatch):
    term = io.StringIO()
    bar = TerminalBar(term)
    monkeypatch.setattr(progress_mod, "_bar", bar)
    handler = BarAwareHandler(io.StringIO())
    out = handler.stream
    bar.show("[###...] merges 10%")
    record = logging.LogRecord("x", logging.INFO, "f", 1, "a log line", None, None)
    handler.emit(record)
    assert out.getvalue() == "a log line\n"
    assert term.getvalue() == "\r\x1b[K[###...] merges 10%" + "\r\x1b[K" + "[###...] merges 10%"


def test_a_stage_stopped_by_a_sigterm_says_so_whatever_the_call_raised(tmp_path, monkeypatch):
    """A SIGTERM during the count cancels Spark's job, and the call that was waiting raises
    Py4JJavaError: progress.jsonl said the stage failed with that, while the job's last line
    said terminated (a dashboard counted a failure)."""
    from pipeline import progress as progress_module

    jsonl = tmp_path / "progress.jsonl"
    monkeypatch.setattr(progress_module, "terminating", lambda: True)
    with pytest.raises(RuntimeError), \
            Progress("train", str(jsonl), every=10, bar=False).stage("count"):
        raise RuntimeError("Job 3 cancelled because SparkContext was shut down")
    events = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert events[-1]["event"] == "error" and events[-1]["error"] == "Terminated"
    monkeypatch.setattr(progress_module, "terminating", lambda: False)
    with pytest.raises(RuntimeError), \
            Progress("train", str(jsonl), every=10, bar=False).stage("count"):
        raise RuntimeError("a real failure")
    assert json.loads(jsonl.read_text().splitlines()[-1])["error"] == "RuntimeError"


def test_a_failed_stage_whose_poll_hangs_ends_at_once(tmp_path):
    """The error line polled again, with no time limit: a poll stuck in a call to the JVM
    held the failing job's exit for as long as it hung (found by review)."""
    jsonl = tmp_path / "progress.jsonl"
    prog = Progress("test", str(jsonl), every=0.05, bar=False)
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError), prog.stage("count", poll=lambda: release.wait(5) and {}):
        time.sleep(0.2)
        raise RuntimeError("boom")
    took = time.monotonic() - t0
    release.set()
    assert took < 1.5, took
    assert json.loads(jsonl.read_text().splitlines()[-1])["event"] == "error"


def test_heartbeats_come_once_per_interval_and_no_later_than_it(tmp_path, monkeypatch):
    """``update`` and the ticker each decided to beat with no lock (the same line twice, two
    beats 0.2 s apart with every=1), and the ticker looked only every every/2 from the
    stage's start, so after a forced beat the next came up to 1.5x the interval later. Now
    each interval's beat is claimed once, and the ticker wakes when the next one is due
    (found by review)."""
    beats: list[float] = []
    real = progress_mod.Stage.beat

    def recording(self, event="beat", poll=True):
        if event == "beat":
            beats.append(time.monotonic())
        return real(self, event, poll)

    monkeypatch.setattr(progress_mod.Stage, "beat", recording)
    every = 0.4  # updates every 10 ms racing the ticker, a poll of 50 ms in each beat
    prog = Progress("test", str(tmp_path / "p.jsonl"), every=every, bar=False)
    with prog.stage("merges", total=10**6, poll=lambda: time.sleep(0.05) or {}) as st:
        t_end, i = time.monotonic() + 3.0, 1
        while time.monotonic() < t_end:
            i += 1
            st.update(i)
            time.sleep(0.01)
    gaps = [b - a for a, b in zip(beats, beats[1:])]
    assert len(gaps) >= 4 and min(gaps) >= every * 0.9, gaps  # once per interval
    beats.clear()
    every = 2.0  # the ticker alone after a forced beat off its rhythm (0.5 s in)
    prog = Progress("test", str(tmp_path / "q.jsonl"), every=every, bar=False)
    with prog.stage("merges") as st:
        time.sleep(0.5)
        st.update(force=True)
        time.sleep(2.6)
    assert len(beats) >= 2 and beats[1] - beats[0] <= every + 0.3, beats  # (was 2.5 s)


def test_an_eta_past_the_total_is_zero_not_negative(tmp_path):
    jsonl = tmp_path / "progress.jsonl"
    prog = Progress("test", str(jsonl), every=0.05, bar=False)
    with prog.stage("count", total=1000, unit="rows") as st:
        time.sleep(0.6)  # (the negative ETA was -elapsed x (done - total) / done: -0.5 s)
        st.update(10_000, force=True)
    beats = [json.loads(x) for x in jsonl.read_text().splitlines() if '"beat"' in x]
    assert beats and all(b["eta"] == 0 for b in beats if "eta" in b)
    assert any("eta" in b for b in beats)


def test_a_closed_whole_file_sink_ends_its_writer_thread():
    """Each WholeFileJsonl's writer thread looped for ever after close(), holding its write
    function (and with it the Spark session): 20 closed sinks left 20 threads (review)."""
    before = {t for t in threading.enumerate() if t.name == "spark-bpe-progress-file"}
    for _ in range(5):
        store = Store()
        sink = WholeFileJsonl(store.write, lambda: "", every=0)
        with Progress("train", sink, every=10, bar=False).stage("prepare"):
            pass
        sink.close()
        assert store.events()[-1] == ("train", "end")
    assert until(lambda: {t for t in threading.enumerate()
                          if t.name == "spark-bpe-progress-file"} <= before)


class _DeadTerminal(io.StringIO):
    """A terminal closed under a job left running: every write fails with EIO."""

    def write(self, text: str) -> int:
        raise OSError(5, "Input/output error")


def test_a_terminal_that_fails_ends_the_bar_not_the_stage(tmp_path, monkeypatch, caplog):
    """A job started on a terminal, then left running when the terminal closed: the bar's
    writes fail (EIO). The stage goes on, ends, and a stage's own error stays its error."""
    dead = _DeadTerminal()
    monkeypatch.setattr(progress_mod, "_bar", None)  # (restored whatever happens)
    monkeypatch.setattr(progress_mod.sys, "stderr", type("Tty", (), {
        "isatty": staticmethod(lambda: True), "write": dead.write, "flush": dead.flush})())
    prog = Progress("test", str(tmp_path / "progress.jsonl"), every=10, bar=True)
    assert prog.bar is not None
    handler = BarAwareHandler(io.StringIO())
    logging.getLogger().addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="pipeline.progress"):
            with prog.stage("merges", total=10, unit="merges") as st:
                st.update(5, force=True)
                log_line = logging.getLogger("pipeline.test")
                log_line.warning("a log line while the bar is up")
            with pytest.raises(KeyError), prog.stage("count", total=4, unit="tasks") as st:
                st.update(1, force=True)
                raise KeyError("the stage's own error")
        prog.close()
    finally:
        logging.getLogger().removeHandler(handler)
    assert "merges: done in" in caplog.text and "count: failed after" in caplog.text
    assert prog.bar.broken


def test_heartbeats_and_times_follow_a_steady_clock_not_the_wall_clock(tmp_path, monkeypatch):
    """The wall clock stepped back an hour (NTP) mid-stage: heartbeats keep coming every
    interval (they stopped for the hour) and the stage's time is not negative."""
    steady, wall = [1000.0], [5000.0]
    fake_clocks(monkeypatch, wall, steady)
    jsonl = tmp_path / "progress.jsonl"
    prog = Progress("test", str(jsonl), every=5, bar=False)
    with prog.stage("merges", total=100, unit="merges") as st:
        for done in range(1, 11):
            steady[0] += 6
            wall[0] += 6 if done != 5 else -3600
            st.update(done)
    events = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert sum(e["event"] == "beat" for e in events) == 10
    assert events[-1]["event"] == "end" and events[-1]["elapsed"] == 60


@pytest.mark.parametrize("jvm_stdout", ["terminal", "pipe"])
def test_under_spark_submit_the_bar_follows_the_jvms_stdout(monkeypatch, jvm_stdout):
    """Under spark-submit the driver's stderr is a pipe the JVM copies to its own stdout: the
    bar is drawn when that is a terminal (it never was), not when it is a pipe or a file."""
    import os
    import subprocess

    master, slave = os.openpty()
    out = slave if jvm_stdout == "terminal" else subprocess.PIPE
    jvm = subprocess.Popen(["sleep", "30"], stdout=out)  # stands in for the parent JVM
    try:
        monkeypatch.setattr(progress_mod.sys, "stderr", io.StringIO())  # a pipe: no tty
        monkeypatch.setattr(progress_mod.os, "getppid", lambda: jvm.pid)
        monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
        assert not progress_mod.stderr_reaches_a_terminal()  # not under spark-submit
        monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "12345")
        assert progress_mod.stderr_reaches_a_terminal() == (jvm_stdout == "terminal")
        monkeypatch.setattr(progress_mod, "_bar", None)
        prog = Progress("test", None, bar=True)
        assert (prog.bar is not None) == (jvm_stdout == "terminal")
        prog.close()
    finally:
        jvm.kill()
        jvm.wait()
        os.close(master)
        os.close(slave)


def test_a_finished_stage_leaves_no_bar_behind_its_last_line(monkeypatch, caplog):
    """The end line of a stage clears its bar for good: it was redrawn, stale, under it."""
    term = io.StringIO()
    monkeypatch.setattr(progress_mod, "_bar", None)
    monkeypatch.setattr(progress_mod.sys, "stderr", type("Tty", (), {
        "isatty": staticmethod(lambda: True), "write": term.write, "flush": term.flush})())
    handler = BarAwareHandler(io.StringIO())
    logging.getLogger("pipeline.progress").addHandler(handler)
    try:
        prog = Progress("test", None, every=10, bar=True)
        with caplog.at_level(logging.INFO, logger="pipeline.progress"), \
                prog.stage("merges", total=10, unit="merges") as st:
            st.update(5, force=True)
        shown = term.getvalue()
        prog.close()
    finally:
        logging.getLogger("pipeline.progress").removeHandler(handler)
    assert shown.count("] merges 50%") == 1, repr(shown)  # shown once, not redrawn stale
