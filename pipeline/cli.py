"""Shared entry-point plumbing for the jobs: config, logging, one-line errors, exit codes.

Exit codes a scheduler can rely on:

- 0: the output is complete (the job's body returned normally);
- 2: bad configuration or input (``ConfigError``): one line ``error: ...``; no output is
  published (a run directory may keep the progress.jsonl of the attempt);
- 1: anything else (a Spark job failed, the cluster went away, a bug): the traceback goes to
  the log, then the last line printed is ``error: ...`` with a one-line reason;
- 130 / 143: interrupted (SIGINT / SIGTERM, e.g. a scheduler cancelling the job).

Errors go to stderr; under ``spark-submit`` the Python driver's stderr is merged into the
driver's stdout (Spark's PythonRunner), so a scheduler should read the last line of the two.
Checkpoints make a failed or cancelled training run resumable: run the same command again.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable

from pipeline import faults, memory, progress, spark_session
from pipeline.config import COUNT, TRAIN, Config, ConfigError, resolve_with_notes, validate
from pipeline.fsutil import WriteFailed, task_write_failure
from pipeline.progress import BarAwareHandler, current_stage

log = logging.getLogger("pipeline.cli")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143
WRITE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM,
                errno.EDQUOT}
_MAX_REASON = 400


def setup_logging(level: str) -> None:
    """Our log on stderr (a progress bar, drawn only on a terminal, is cleared around each
    line: pipeline/progress.py)."""
    handler = BarAwareHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                           datefmt="%H:%M:%S"))
    handler.addFilter(_not_py4j_interrupt)
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        handlers=[handler])
    logging.getLogger("py4j").setLevel(logging.WARNING)


def _not_py4j_interrupt(record: logging.LogRecord) -> bool:
    """py4j logs an interrupted call (our SIGTERM or Ctrl-C) with a traceback through the root
    logger, and, while a SIGTERM stops the job, each call the stopping JVM fails (about 60
    lines of traceback before the job's last line); that last line says what happened."""
    if not record.pathname.replace("\\", "/").endswith("py4j/java_gateway.py"):
        return True
    message = record.getMessage()
    return not (message.startswith("KeyboardInterrupt while sending command")
                or (_terminating.is_set()
                    and message.startswith("Exception while sending command")))


def one_line_reason(exc: BaseException) -> str:
    """A short, single-line reason for an unexpected failure (Spark's messages are long)."""
    text = ""
    java = getattr(exc, "java_exception", None)  # py4j.protocol.Py4JJavaError
    if java is not None:
        try:
            text = str(java.toString())
        except Exception:  # the JVM may be gone
            text = ""
    if not text:
        text = str(exc) or ""
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    name = type(exc).__name__
    reason = f"{name}: {first}" if first else name
    if len(reason) > _MAX_REASON:
        reason = reason[: _MAX_REASON - 3] + "..."
    return reason


def driver_memory_advice() -> str:
    """What the driver had and what to change, after a MemoryError in this process."""
    from pipeline.spark_session import spark_settings

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    conf = spark_settings()
    where = ("spark.driver.memoryOverhead (cluster deploy mode: Python lives there)"
             if conf.get("spark.submit.deployMode") == "cluster" else "the driver machine")
    return (f"the driver's Python process reached {peak:.2f} GB (peak RSS); give it more memory "
            f"({where}), or set --driver-budget-mb below that so that engine auto trains with "
            "Spark rounds instead (README: Sizing a run); the checkpoints are intact: rerun "
            "the same command to resume")


def killed_driver_line(job: str) -> str:
    """The line the JVM prints for this job if its Python driver dies without a word (see
    ``spark_session.set_last_words``): a SIGKILL, most often the OOM killer's."""
    from pipeline.spark_session import spark_settings

    conf = spark_settings()
    more = ("raise spark.driver.memoryOverhead (cluster deploy mode: Python lives there)"
            if conf.get("spark.submit.deployMode") == "cluster"
            else "give the driver machine more free memory")
    avail, what = memory.available_bytes()
    had = f"{avail / 2**30:.1f} GB {what} as the stage began" if avail is not None else \
        "free memory unknown"
    budget = ("; or set --driver-budget-mb lower so that auto uses Spark instead (README: "
              "Sizing a run)" if job == COUNT or (job == TRAIN and _engine[0] != "spark")
              else "")  # (a run that trains with Spark already: the budget changes nothing)
    return (f"error: {job} stopped in stage '{current_stage()}': its Python driver died without "
            f"a word (killed: SIGKILL, exit code 137, is most likely the kernel's or a "
            f"container's out-of-memory killer; {had}); {more}{budget}; {_rerun(job)}")


def jvm_memory_failure(exc: BaseException, job: str = "train") -> str:
    """A one-line explanation when ``exc`` says a JVM ran out of memory or the driver's JVM
    is gone (it usually dies of that), else ''. ``job``: says what a rerun does."""
    text = f"{type(exc).__name__}: {exc}"
    java = getattr(exc, "java_exception", None)
    if java is not None:
        with contextlib.suppress(Exception):  # the JVM may be gone
            text += str(java.toString())
    from pipeline.spark_session import spark_settings

    conf = spark_settings()
    resume = ("; the checkpoints are intact: rerun the same command to resume" if job == "train"
              else f"; {_rerun(job)}")
    if "OutOfMemoryError" in text:
        executor = "executor" in text.lower() and "driver" not in text.lower()
        key = "spark.executor.memory" if executor else "spark.driver.memory"
        flag = "--executor-memory" if executor else "--driver-memory"
        return (f"a JVM ran out of memory (java.lang.OutOfMemoryError; {key} = "
                f"{conf.get(key, '1g (default)')}): raise it with spark-submit {flag}{resume}")
    if "TaskResultLost" in text:  # the driver JVM could not take a task's result (its heap)
        return ("the driver JVM lost a task's result while fetching it (TaskResultLost: "
                "usually a java.lang.OutOfMemoryError in its log, else an executor that held "
                "it was lost; spark.driver.memory = "
                f"{conf.get('spark.driver.memory', '1g (default)')}): raise it with "
                f"spark-submit --driver-memory{resume}")
    gone = ("Py4JNetworkError", "Answer from Java side is empty", "Connection refused",
            "Error while sending or receiving")
    if any(g in text for g in gone):
        return ("the driver's JVM exited (spark.driver.memory = "
                f"{conf.get('spark.driver.memory', '1g (default)')}; an OutOfMemoryError in "
                "its log means: raise spark-submit --driver-memory)" + resume)
    return ""


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so the job unwinds (stops Spark) and says so."""


_terminating = threading.Event()  # SIGTERM seen (here, or by the JVM that runs us)
_unwound = threading.Event()  # the job has said its last line
_from_jvm = threading.Event()  # the signal reached the JVM (SIGTERM or SIGINT: it cannot tell)
_jvm_died = threading.Event()  # ... or Spark exited the JVM on a task's uncaught error
_jvm_gone = threading.Event()  # the JVM that ran us died without a word (SIGKILL, OOM killer)
_finished = threading.Event()  # the job's body has returned or raised: a signal stops nothing
PARENT_POLL_SECONDS = 1.0


def _on_sigterm(signum: int, frame: object) -> None:
    _terminating.set()
    if not _finished.is_set():  # (past the body: its last line stands, nothing to stop)
        raise Terminated()


_engine = [""]  # the running job's engine setting, for its messages

JVM_HOLD_SECONDS = 30.0


def watch_parent_jvm() -> None:
    """Under spark-submit this Python driver is the JVM's child (``PYSPARK_GATEWAY_PORT`` set):
    if the JVM dies without a shutdown (SIGKILL, the OOM killer), stop as SIGTERM would (the
    lease released, nothing published) instead of running on as an orphan that holds the
    run directory and blocks the scheduler's retry."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return
    parent = os.getppid()
    once = threading.Lock()

    def gone() -> bool:
        with once:  # (the watcher and the main thread: one SIGTERM)
            if _jvm_gone.is_set():
                return True
            if os.getppid() == parent:
                return False
            _jvm_gone.set()
            _terminating.set()
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        return True

    def watch() -> None:
        while not _unwound.wait(PARENT_POLL_SECONDS) and not gone():
            pass

    spark_session.stop_if_jvm_gone = gone  # (from the main thread: the handler raises there)
    threading.Thread(target=watch, name="spark-bpe-parent-jvm", daemon=True).start()


def on_jvm_shutdown() -> None:
    """Called from the JVM's shutdown (spark-submit got SIGTERM; it runs this Python driver as
    its child, which the signal does not reach): stop the job as SIGTERM would, and hold the
    JVM until the job has unwound (at most ``JVM_HOLD_SECONDS``), so that its last line still
    gets out through the JVM, the lease is released and no orphan keeps running."""
    if _unwound.is_set():
        return
    if spark_session.jvm_exit_by_uncaught_error():
        _jvm_died.set()  # not a signal: a task's error (out of heap) made Spark exit the JVM
    _from_jvm.set()
    if not _finished.is_set():  # (a job that has ended only has its last line to get out)
        _terminating.set()
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)  # wakes a sleep
    _unwound.wait(JVM_HOLD_SECONDS)


def _wait_for_pipes_read(timeout: float = 2.0) -> None:
    """Under spark-submit this driver's stdout and stderr are pipes a JVM thread copies to the
    JVM's own stdout; the JVM does not wait for that thread when it exits. Before the shutdown
    hook lets the JVM go on, wait (at most ``timeout``) until the JVM has read all we wrote,
    so that the job's last line is not cut off (called by the main thread: this process must
    not exit while the JVM's shutdown hook still waits in it)."""
    import fcntl
    import stat
    import struct
    import termios
    import time

    deadline = time.monotonic() + timeout
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                continue
            while time.monotonic() < deadline:  # FIONREAD: bytes not read from the pipe yet
                if not struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]:
                    break
                time.sleep(0.01)
    time.sleep(0.05)  # (read, and now being written out by the JVM's thread)


def prefer_installed_pyspark() -> None:
    """Import PySpark from its installed package rather than from the zips spark-submit puts
    first on ``sys.path`` when both are the same installation (a pip-installed pyspark ships
    its own ``pyspark.zip``): a zip import compiles every module afresh, about 0.6 s per job.
    Zips of a separate Spark distribution are left alone (their version is the cluster's)."""
    if "pyspark" in sys.modules:
        return
    zips = [p for p in sys.path
            if p.endswith(".zip") and os.sep.join(("pyspark", "python", "lib")) in p]
    if not zips:
        return
    package_dir = zips[0].split(os.sep.join(("pyspark", "python", "lib")))[0]
    installed = [p for p in sys.path if p not in zips and os.path.isdir(p)
                 and os.path.samefile(p, package_dir or os.curdir)
                 and os.path.isdir(os.path.join(p, "py4j"))]
    if installed:
        sys.path[:] = [p for p in sys.path if p not in zips] + zips


def run_job(job: str, description: str, body: Callable[[Config], int | None],
            argv: list[str] | None = None) -> int:
    """Parse + validate config (before Spark), run ``body``; a bad input is one line, exit 2;
    any other failure is a logged traceback plus one line, exit 1."""
    prefer_installed_pyspark()
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (e.g. called from a test harness)
        previous = None
    _terminating.clear()
    _unwound.clear()
    _from_jvm.clear()
    _jvm_gone.clear()
    _jvm_died.clear()
    _finished.clear()
    if previous is not None:
        spark_session.on_jvm_shutdown = on_jvm_shutdown
        spark_session.last_words = lambda: killed_driver_line(job)
        progress.terminating = _terminating.is_set
        progress.on_stage_change = lambda: _terminating.is_set() or \
            spark_session.set_last_words(killed_driver_line(job))
        watch_parent_jvm()
        # under spark-submit: a SIGTERM is this job's from now on, not seconds later when
        # its SparkContext has started
        spark_session.hold_jvm_shutdown()
    try:
        return _run(job, description, body, argv)
    finally:
        _finished.set()
        spark_session.on_jvm_shutdown = None
        spark_session.last_words = None
        spark_session.stop_if_jvm_gone = spark_session.no_jvm_check
        progress.on_stage_change = None
        progress.terminating = None
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        try:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            if _from_jvm.is_set():  # the JVM is exiting: our last line must reach it first
                _wait_for_pipes_read()
        finally:  # (a second Ctrl-C in the wait must not keep the JVM's hook waiting)
            spark_session.silence_last_words()  # (a hook failing from now on: no OOM line)
            _unwound.set()
            spark_session.release_jvm_shutdown_hook()


def _run(job: str, description: str, body: Callable[[Config], int | None],
         argv: list[str] | None) -> int:
    try:
        cfg, notes = resolve_with_notes(argv, description, job)
        cfg = validate(cfg, job)
        _engine[0] = cfg.engine
        setup_logging(cfg.log_level)
        for note in notes:  # (settings ignored, a corpus not given: seen at --log-level WARNING)
            log.warning("%s", note)
        log.info("%s config: %s", job, cfg.to_json(job, indent=None))
        faults.at("start")  # tests: a SIGTERM before the job's SparkContext exists
        code = int(body(cfg) or 0)
        _finished.set()  # (a SIGTERM from here on changes nothing: the job is done)
        return code
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except Terminated:
        return _terminated(job)
    except KeyboardInterrupt:
        print(f"error: {job} interrupted; {_rerun(job)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except MemoryError:
        return _out_of_memory(job)
    except OSError as exc:
        if _terminating.is_set():  # e.g. the JVM, killed with us, refused the connection
            return _terminated_under(job, exc)
        if exc.errno not in WRITE_ERRNOS and not isinstance(exc, WriteFailed):
            return _failed(job, exc)
        if _unreadable(exc):
            print(f"error: {job} could not read {exc.filename}: {exc.strerror}; fix its "
                  f"permissions, then {_rerun(job)}", file=sys.stderr)
            return EXIT_CONFIG
        return _could_not_write(job, exc, exc)
    except Exception as exc:
        if _terminating.is_set():  # Spark stopped under a running call: that was the SIGTERM
            return _terminated_under(job, exc)
        if _no_room_for_a_thread(exc):
            return _out_of_memory(job)
        failed_write = task_write_failure(exc)  # Spark's tasks writing the output files
        if failed_write is not None:
            return _could_not_write(job, failed_write, exc)
        return _failed(job, exc)


def _unreadable(exc: OSError) -> bool:
    """A permission error on a file that is there and that this process may not read (a
    run directory's file, say): a read that failed, not a write."""
    name = exc.filename
    return (exc.errno in (errno.EACCES, errno.EPERM) and not isinstance(exc, WriteFailed)
            and isinstance(name, str) and os.path.isfile(name) and not os.access(name, os.R_OK))


def _no_room_for_a_thread(exc: BaseException) -> bool:
    """A native library (Arrow) that could not start a thread because the process has no
    address space left for its stack: the same out-of-memory as a MemoryError."""
    return "Failed to launch worker thread: Resource temporarily unavailable" in str(exc)


def _out_of_memory(job: str) -> int:
    """The driver's Python process ran out of memory: one line with what it had and the
    setting to change (the details in the log above it)."""
    faults.lift()
    log.error("%s job ran out of memory", job, exc_info=True)
    sys.stderr.flush()
    print(f"error: {job} ran out of memory in stage '{current_stage()}': "
          f"{driver_memory_advice()}", file=sys.stderr)
    return EXIT_FAILED


def _could_not_write(job: str, err: OSError, exc: BaseException) -> int:
    """A write that failed (a full disk, a read-only directory, a quota): one line naming
    the file or directory, the stage and the reason; the details in the log above it."""
    faults.lift()
    log.error("%s job could not write", job, exc_info=exc)
    sys.stderr.flush()
    kept = ("what was written before (the word table, the checkpoints) is intact: "
            if job == "train" else "")
    fix = ("make room or fix the permissions" if err.errno in WRITE_ERRNOS
           else "check the path and its filesystem")
    print(f"error: {job} could not write {err.filename or 'a file'} in stage "
          f"'{current_stage()}': {err.strerror}; {kept}{fix}, then {_rerun(job)}",
          file=sys.stderr)
    return EXIT_FAILED


def _terminated_under(job: str, exc: BaseException) -> int:
    """An error raised while a SIGTERM was being handled is its consequence, not a failure."""
    log.info("%s: %s while terminating", job, type(exc).__name__)
    return _terminated(job)


def _terminated(job: str) -> int:
    """(spark-submit's exit code says which signal it got: 143 SIGTERM, 130 SIGINT.)"""
    if _jvm_died.is_set():
        return _jvm_out_of_memory(job)
    which = ("its JVM (spark-submit) is gone" if _jvm_gone.is_set()
             else "SIGTERM or SIGINT to spark-submit" if _from_jvm.is_set() else "SIGTERM")
    with contextlib.suppress(OSError):  # (with the JVM gone, nobody may read it)
        print(f"error: {job} terminated ({which}); {_rerun(job)}", file=sys.stderr)
    return EXIT_TERMINATED


def _jvm_out_of_memory(job: str) -> int:
    """Spark exited the driver JVM because a task thread died of an uncaught error: in local
    mode that is an executor task out of heap (the JVM's exit code, 52, is spark-submit's)."""
    from pipeline.spark_session import spark_settings

    heap = spark_settings().get("spark.driver.memory", "1g (default)")
    resume = ("; the checkpoints are intact: rerun the same command to resume"
              if job == "train" else f"; {_rerun(job)}")
    with contextlib.suppress(OSError):
        print(f"error: {job} failed in stage '{current_stage()}': a task ran out of the driver "
              f"JVM's memory and Spark stopped the JVM (java.lang.OutOfMemoryError in the log "
              f"above; spark.driver.memory = {heap}): raise it with spark-submit "
              f"--driver-memory{resume}", file=sys.stderr)
    return EXIT_FAILED


def _rerun(job: str) -> str:
    """What to do after an interruption: train resumes from its checkpoint; a count or an
    encode starts over (nothing of it was published)."""
    return ("rerun the same command to resume" if job == "train"
            else f"rerun the same command (the {job} starts over)")


def _failed(job: str, exc: BaseException) -> int:
    """Anything else: the traceback in the log, then one line (exit 1)."""
    log.error("%s job failed", job, exc_info=True)
    sys.stderr.flush()
    task = memory.task_memory_failure(str(exc))
    jvm = f"{task}; then {_rerun(job)}" if task else jvm_memory_failure(exc, job)
    jvm = jvm or spark_session.worker_python_failure(exc)
    where = f" in stage '{current_stage()}'" if current_stage() != "start" else ""
    if jvm:
        print(f"error: {job} failed{where}: {jvm}", file=sys.stderr)
    else:
        print(f"error: {job} failed{where}: {one_line_reason(exc)} (traceback above)",
              file=sys.stderr)
    return EXIT_FAILED
