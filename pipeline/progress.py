"""Progress a scheduler's log can show: heartbeats of every long stage.

A job runs its stages inside :meth:`Progress.stage`. Each stage writes a line into the log when
it starts and ends, and a heartbeat at most every ``every`` seconds while it runs (a
background ticker makes sure one comes at least that often even when the stage's code is busy
in one long call): what is done out of what, the rate, the time elapsed and left. The same
events go to ``progress.jsonl`` in the output directory, one JSON object per line, for
dashboards (appended locally; on HDFS and object stores, which cannot append, the whole file
is written again at most every ``WholeFileJsonl.every`` seconds and at each stage's end). On
a real terminal a progress bar is drawn too; it is cleared before every log line and redrawn
after it, so the two never mix. Under spark-submit or a scheduler there is no terminal: the
log is the progress.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone

from pipeline import fsutil

log = logging.getLogger("pipeline.progress")

HEARTBEAT_SECONDS = 5.0
_current_stage = "start"  # for error messages (cli.py)


def current_stage() -> str:
    return _current_stage


on_stage_change: Callable[[], None] | None = None  # set by pipeline.cli while a job runs
# set by pipeline.cli while a job runs: True while a SIGTERM stops it (a stage's error is then
# the termination, whatever the call it interrupted raised: a cancelled Spark job, say)
terminating: Callable[[], bool] | None = None


def _stage_changed() -> None:
    if on_stage_change is not None:
        with contextlib.suppress(Exception):  # an observer never fails a stage
            on_stage_change()


def _fmt_seconds(s: float) -> str:
    return f"{s:,.0f} s" if s >= 10 else f"{s:.1f} s"


def _fmt_bytes(n: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} TB"


def _render(key: str, value: object) -> str:
    """One field of a heartbeat line: ``note`` as it is, ``bytes_read`` = 1,234 as "1.2 kB
    read", ``bytes_per_s`` as "1.2 kB/s", a number with thousands separators."""
    if key == "note":
        return str(value)
    if key == "bytes_per_s" and isinstance(value, int):
        return f"{_fmt_bytes(value)}/s"
    if key.startswith("bytes_") and isinstance(value, int):
        return f"{_fmt_bytes(value)} {key[6:].replace('_', ' ')}"
    if isinstance(value, int) and not isinstance(value, bool):
        value = f"{value:,}"
    return f"{key.replace('_', ' ')} {value}"


class TerminalBar:
    """One status line at the bottom of a terminal (stderr), below the log. A write that
    fails (the terminal closed under a job left running: EIO; a closed stream) ends the bar,
    never the job: it draws nothing more."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.text = ""
        self.lock = threading.RLock()
        self.broken = False

    def _write(self, text: str) -> None:
        if self.broken:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # (ValueError: I/O operation on a closed file)
            self.broken = True
            self.text = ""

    def show(self, text: str) -> None:
        with self.lock:
            self.text = text
            self._write("\r\x1b[K" + text)

    def clear(self) -> None:
        with self.lock:
            if self.text:
                self._write("\r\x1b[K")

    def redraw(self) -> None:
        with self.lock:
            if self.text:
                self._write(self.text)

    def close(self) -> None:
        with self.lock:
            self.clear()
            self.text = ""


def stderr_reaches_a_terminal() -> bool:
    """Whether what this process writes to stderr shows on a terminal: stderr is one, or,
    under spark-submit (``PYSPARK_GATEWAY_PORT`` set: this driver is the JVM's child, its
    stderr merged into a pipe the JVM copies to its own stdout), the JVM's stdout is one."""
    try:
        if sys.stderr.isatty():
            return True
    except (AttributeError, ValueError):  # (replaced by an object without it, or closed)
        return False
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return False
    try:
        jvm_out = os.path.realpath(f"/proc/{os.getppid()}/fd/1")
    except OSError:  # (no /proc: not Linux; the JVM's stdout cannot be looked at)
        return False
    return jvm_out.startswith(("/dev/pts/", "/dev/tty"))


_bar: TerminalBar | None = None


class BarAwareHandler(logging.StreamHandler):
    """A log handler that clears the terminal bar before a record and redraws it after."""

    def emit(self, record: logging.LogRecord) -> None:
        bar = _bar
        if bar is None:
            super().emit(record)
            return
        with bar.lock:
            bar.clear()
            super().emit(record)
            bar.redraw()


ETA_WINDOW_SECONDS = 60.0


def _recent_point(points: list[tuple[float, float]], now: float, since: float, base: float
                  ) -> tuple[float, float] | None:
    """The (time, done) a recent rate is measured from: of the points since ``since`` with
    work done (above ``base``), the newest a quarter of the time since ``since`` old (at
    least a second, at most ``ETA_WINDOW_SECONDS``), else the oldest a second old; None when
    there is none."""
    window = min(ETA_WINDOW_SECONDS, max(1.0, 0.25 * (now - since)))
    usable = [p for p in points if p[0] >= since and p[1] > base and now - p[0] >= 1]
    old_enough = [p for p in usable if now - p[0] >= window]
    return old_enough[-1] if old_enough else (usable[0] if usable else None)


POLL_WAIT_SECONDS = 5.0  # how long a stage's end waits for a heartbeat's poll in progress


class Stage:
    """A running stage: ``update`` it with what is done; heartbeats are throttled."""

    def __init__(self, progress: Progress, name: str, total: float | None, unit: str,
                 poll: Callable[[], dict] | None, start: float = 0, recent_eta: bool = False):
        self.progress, self.name, self.total, self.unit, self.poll = (progress, name, total,
                                                                      unit, poll)
        # the ETA at the recent rate, not the average: for work that gets cheaper as it goes
        # (the first merges rewrite the most words); none until a heartbeat after the first
        # one with work done since the rate (re)started, whose rate is that of the heaviest
        # work alone (1 GB table: ETAs from the first merges said 313 s for 16 s left,
        # BENCHMARKS.md thirteenth session). "Recent": the last quarter of the stage's time so
        # far, at least a second, at most ETA_WINDOW_SECONDS (Spark rounds of 3 merges and of
        # 100 alternate: a rate over the last heartbeat alone made the ETA swing 2x each beat)
        self.recent_eta = recent_eta
        # (time, done) of the recent beats, those the recent rate may be measured from
        self.points: list[tuple[float, float]] = []
        self.t0 = time.monotonic()
        # (time, done) the rate is measured from; ``start`` was done before this attempt
        # (merges from a checkpoint): not in the rate
        self.rate_from: tuple[float, float] = (self.t0, start)
        self.done: float | None = start if total else None
        self.fields: dict = {}
        self.last_beat = self.t0
        self.lock = threading.Lock()
        self.closed = False  # ended or failed: no heartbeat may follow its last event

    def update(self, done: float | None = None, force: bool = False, **fields) -> None:
        with self.lock:
            if done is not None:
                self.done = done
            self.fields.update(fields)
        if force:
            self.beat()
        else:
            self.beat_if_due()

    def beat_if_due(self) -> None:
        """A heartbeat if ``every`` seconds have passed since the last one, claimed under the
        lock (the ticker and ``update`` must not both beat for the same interval)."""
        with self.lock:
            now = time.monotonic()
            if now - self.last_beat < self.progress.every:
                return
            self.last_beat = now
        self.beat()

    def restart_rate(self) -> None:
        """Measure the rate (and the ETA) from now: what came before was set-up."""
        with self.lock:
            self.rate_from = (time.monotonic(), self.done or 0)
            self.points = []

    def beat(self, event: str = "beat", poll: bool = True) -> None:
        if self.poll is not None and event != "start" and poll:
            with contextlib.suppress(Exception):  # progress must never fail the job
                fresh = dict(self.poll())
                with self.lock:
                    self.done = fresh.pop("done", self.done)
                    unit = fresh.pop("unit", self.unit)
                    if unit != self.unit:  # (a recent rate of rows is no rate of tasks)
                        self.unit, self.points = unit, []
                    self.total = fresh.pop("total", self.total)
                    self.rate_from = fresh.pop("rate_from", self.rate_from)
                    self.fields.update(fresh)
        with self.lock:
            self.last_beat = now = time.monotonic()
            elapsed = now - self.t0
            rec: dict = {"stage": self.name, "event": event, "elapsed": round(elapsed, 1)}
            parts = []
            done, total = self.done, self.total
            if done is not None:
                rec["done"] = done
                if self.unit:
                    rec["unit"] = self.unit  # (what done counts may change within a stage)
                count = f"{done:,.0f}" + (f"/{total:,.0f}" if total else "")
                if done or total or self.unit != "tasks":  # ("0 tasks" of no known total
                    parts.append(f"{count} {self.unit}".strip())  # says nothing: the
                    # count's merge on the driver runs no Spark task)
                if total:
                    rec["total"] = total
                    if event == "beat":
                        parts[-1] += f" ({100 * done / total:.0f}%)"
                since, base = self.rate_from
                new = done - base
                if now > since and new > 0:
                    rate = new / (now - since)
                    rec["rate"] = round(rate, 2)
                    if self.unit and event == "beat" and rate >= 1:
                        parts.append(f"{rate:,.0f} {self.unit}/s")
                    if total and event == "beat":
                        eta_rate = rate
                        if self.recent_eta:  # no ETA before a second point with work done
                            last = _recent_point(self.points, now, since, base)
                            recent = last is not None and done > last[1]
                            eta_rate = (done - last[1]) / (now - last[0]) if recent else 0
                        if eta_rate > 0:  # (past the total: 0, never negative)
                            rec["eta"] = round(max(total - done, 0) / eta_rate, 1)
                if event == "beat":
                    old = [i for i, p in enumerate(self.points)
                           if now - p[0] >= ETA_WINDOW_SECONDS]
                    self.points = self.points[old[-1] if old else 0:] + [(now, done)]
            rec.update((k, v) for k, v in self.fields.items() if v not in (None, ""))
            parts += [_render(k, v) for k, v in self.fields.items() if v not in (None, 0, "")]
            detail = ", ".join(parts)
        if event == "start":
            text = f"{self.name}: started" + (f" ({detail})" if detail else "")
        elif event == "error":
            text = f"{self.name}: failed after {_fmt_seconds(elapsed)} ({detail})"
        elif event == "end":
            text = f"{self.name}: done in {_fmt_seconds(elapsed)}" + (
                f"; {detail}" if detail else "")
        else:
            when = f"{_fmt_seconds(elapsed)} elapsed" + (
                f", ETA {_fmt_seconds(rec['eta'])}" if "eta" in rec else "")
            text = f"{self.name}: {detail}{', ' if detail else ''}{when}"
        with self.lock:  # (a heartbeat of the ticker that lost the race to the end is dropped)
            if event == "beat" and self.closed:
                return
            self.progress.emit(rec, text)


class WholeFileJsonl:
    """``progress.jsonl`` where a file cannot be appended to (HDFS, object stores): the lines
    are kept in memory and a writer thread puts the whole file (the earlier attempts' lines,
    read before its first write, then these) at most every ``every`` seconds, and as soon as
    it can when ``add`` is told to flush (a stage's end or error). The job never waits for a
    write (a store that hangs delays the file, not the run), but :meth:`close`, at the end,
    waits for the last one up to ``close_timeout`` seconds. At most ``max_lines`` lines are
    kept: past that the oldest heartbeats go first; starts, ends and errors stay. A failed
    write is a warning (once) and the next one comes at the same pace. ``allowed``: False
    once this process must not write there (its run lost the directory's lease)."""

    def __init__(self, write: Callable[[str], None], read: Callable[[], str],
                 every: float = 30.0, max_lines: int = 10_000, where: str = "progress.jsonl",
                 allowed: Callable[[], bool] = lambda: True, close_timeout: float = 30.0):
        self.write, self.read, self.every, self.max_lines = write, read, every, max_lines
        self.where, self.allowed, self.close_timeout = where, allowed, close_timeout
        self.earlier: list[tuple[str, bool]] | None = None  # read before the first write
        self.lines: list[tuple[str, bool]] = []  # (line, is a heartbeat)
        self.asked_at: float | None = None  # when a write was last asked for
        self.warned = False
        self.lock = threading.Lock()  # the lines
        self.writing = threading.Lock()  # one write at a time, each of the newest lines
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.version = self.written_version = 0
        self.closing = False  # set by close(): the writer thread ends

    def add(self, line: str, heartbeat: bool, flush: bool) -> None:
        with self.lock:
            self.lines.append((line, heartbeat))
            self.version += 1
            self._trim()
        now = time.monotonic()
        if flush or self.asked_at is None or now - self.asked_at >= self.every:
            self.asked_at = now  # (a write asked for and failed counts: the pace stays)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, daemon=True,
                                               name="spark-bpe-progress-file")
                self.thread.start()
            self.wake.set()

    def _trim(self) -> None:
        earlier = self.earlier if self.earlier is not None else []
        while len(earlier) + len(self.lines) > self.max_lines:
            for part in (earlier, self.lines):  # the oldest heartbeat first, else the oldest
                at = next((i for i, (_, beat) in enumerate(part) if beat), None)
                if at is not None:
                    del part[at]
                    break
            else:
                del (earlier or self.lines)[0]

    def _run(self) -> None:
        while not self.closing:
            self.wake.wait()
            self.wake.clear()
            self.flush()

    def flush(self) -> None:
        """Write the newest lines now (unless they are written already)."""
        with self.writing:
            if self.version == self.written_version or not self.allowed():
                return
            if self.earlier is None:
                self.earlier = self._read_earlier()
            with self.lock:
                self._trim()
                version = self.version
                text = "".join(x + "\n" for x, _ in self.earlier + self.lines)
            try:
                self.write(text)
                self.written_version = version
            except Exception as exc:  # noqa: BLE001 - a dashboard file must not fail the job
                if not self.warned:
                    log.warning("cannot write %s (%s); heartbeats stay in the log until a "
                                "later write succeeds", self.where, exc)
                    self.warned = True

    def _read_earlier(self) -> list[tuple[str, bool]]:
        try:
            text = self.read()
        except Exception as exc:  # noqa: BLE001 - unreadable: start afresh, say so
            log.warning("cannot read %s (%s); it is written afresh", self.where, exc)
            return []
        out = []
        for x in text.splitlines():
            if x.strip():
                try:
                    beat = json.loads(x).get("event") == "beat"
                except (ValueError, AttributeError):
                    beat = False
                out.append((x, beat))
        return out

    def close(self) -> None:
        """Write the last lines, waiting at most ``close_timeout`` seconds; the writer thread
        ends (it held the write function, and with it the Spark session)."""
        self.closing = True
        self.wake.set()
        done = threading.Thread(target=self.flush, daemon=True)
        done.start()
        done.join(self.close_timeout)


def jsonl_at(spark, path: str, allowed: Callable[[], bool] = lambda: True
             ) -> str | WholeFileJsonl | None:
    """Where :class:`Progress` writes the JSON lines of ``path`` ('' = nowhere): appended to
    when local, written whole now and then on HDFS or an object store (which cannot append),
    while ``allowed`` (a run that lost its directory's lease must not write over the new
    holder's file)."""
    if not path:
        return None
    if fsutil.is_local(path):
        return fsutil.local_path(path)

    def earlier() -> str:
        return fsutil.read_text(spark, path) if fsutil.exists(spark, path) else ""

    return WholeFileJsonl(lambda text: fsutil.write_text(spark, path, text), earlier,
                          where=path, allowed=allowed)


class Progress:
    """The heartbeats of one job (see the module docstring). ``jsonl``: a local path for
    ``progress.jsonl`` (None: log only), or a :class:`WholeFileJsonl` for a file that cannot
    be appended to; ``bar``: draw a bar when stderr is a terminal; ``allowed``: False once
    this process must not write the local file any more (its run lost the lease)."""

    def __init__(self, job: str, jsonl: str | WholeFileJsonl | None = None,
                 every: float = HEARTBEAT_SECONDS, bar: bool = True,
                 allowed: Callable[[], bool] = lambda: True):
        global _bar
        self.job, self.every, self.allowed = job, every, allowed
        self.whole_file = jsonl if isinstance(jsonl, WholeFileJsonl) else None
        jsonl = None if self.whole_file is not None else jsonl
        self.jsonl = jsonl
        self.stages: list[Stage] = []  # running, outermost first
        self.lock = threading.Lock()
        if jsonl:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(jsonl)), exist_ok=True)
                with open(jsonl, "ab+") as fh:  # each attempt appends: a rerun that finds
                    # nothing to do keeps the record of the run that did the work
                    end = fh.seek(0, os.SEEK_END)
                    if end:
                        fh.seek(end - 1)
                        if fh.read(1) != b"\n":  # an attempt killed mid-line (or a full
                            fh.write(b"\n")  # disk): its line ends before this one's
            except OSError as exc:
                log.warning("cannot write %s (%s); heartbeats go to the log only", jsonl,
                            exc.strerror)
                self.jsonl = None
        self.bar = TerminalBar() if bar and stderr_reaches_a_terminal() else None
        if self.bar is not None:
            _bar = self.bar

    def emit(self, rec: dict, text: str) -> None:
        rec = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "job": self.job, **rec}
        with self.lock:
            if self.bar is not None and rec["event"] in ("end", "error"):
                self.bar.close()  # (not redrawn under the stage's last line)
            log.info(text)
            if self.whole_file is not None:
                self.whole_file.add(json.dumps(rec, default=str), rec["event"] == "beat",
                                    flush=rec["event"] in ("end", "error"))
            if self.jsonl and self.allowed():
                try:
                    with open(self.jsonl, "a", encoding="utf-8") as fh:
                        fh.write(json.dumps(rec, default=str) + "\n")
                except OSError as exc:  # a full disk must not fail the job from here
                    log.warning("cannot append to %s (%s); heartbeats stay in the log only",
                                self.jsonl, exc.strerror)
                    self.jsonl = None
            if self.bar is not None and rec["event"] not in ("end", "error") \
                    and rec.get("total"):
                frac = min(1.0, rec["done"] / rec["total"])
                fill = int(30 * frac)
                self.bar.show(f"[{'#' * fill}{'.' * (30 - fill)}] {rec['stage']} "
                              f"{100 * frac:.0f}%")

    @contextlib.contextmanager
    def stage(self, name: str, total: float | None = None, unit: str = "",
              poll: Callable[[], dict] | None = None, start: float = 0,
              recent_eta: bool = False, **fields) -> Iterator[Stage]:
        """Run a stage: a start line, heartbeats (from ``update`` and from a ticker that calls
        ``poll`` for fresh fields), and an end line (or an error event). ``start``: what was
        done before (merges from a checkpoint): counted as done, not in the rate."""
        global _current_stage
        st = Stage(self, name, total, unit, poll, start, recent_eta)
        st.fields.update(fields)
        previous, _current_stage = _current_stage, name
        _stage_changed()
        self.stages.append(st)
        stop = threading.Event()

        def tick() -> None:  # only the innermost running stage beats
            # wake when the next beat is due (a forced beat moves it), at least every/2
            while not stop.wait(min(self.every / 2,
                                    max(0.01, st.last_beat + self.every - time.monotonic()))):
                stages = self.stages  # (a failed stage is removed without a join)
                if stages and stages[-1] is st:
                    st.beat_if_due()

        ticker = threading.Thread(target=tick, name=f"spark-bpe-progress-{name}", daemon=True)
        try:
            st.beat("start")
            ticker.start()
            yield st
        except BaseException as exc:  # the stage stays current: error messages name it
            stop.set()
            with st.lock:
                st.closed = True
                st.fields["error"] = ("Terminated" if terminating is not None and terminating()
                                      else type(exc).__name__)
            with contextlib.suppress(Exception):  # (no poll: one stuck in a call to the
                st.beat("error", poll=False)       # JVM must not hold the failure's exit)
            raise
        else:
            stop.set()
            ticker.join(POLL_WAIT_SECONDS)  # (a poll stuck in a call to the JVM must not keep
            st.closed = True                # the stage from ending: its beat is dropped)
            st.beat("end", poll=not ticker.is_alive())
            _current_stage = previous
            _stage_changed()
        finally:
            stop.set()
            self.stages.remove(st)
            if self.bar is not None:
                self.bar.close()

    def close(self) -> None:
        global _bar
        if self.whole_file is not None:
            self.whole_file.close()
        if self.bar is not None:
            self.bar.close()
            _bar = None
