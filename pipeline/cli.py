"""Shared entry-point plumbing for the jobs: config, logging, one-line errors, exit codes.

Exit codes a scheduler can rely on:

- 0: the output is complete (the job's body returned normally);
- 2: bad configuration or input (``ConfigError``): one line ``error: ...``, nothing written;
- 1: anything else (a Spark job failed, the cluster went away, a bug): the traceback goes to
  the log, then the last line printed is ``error: ...`` with a one-line reason;
- 130 / 143: interrupted (SIGINT / SIGTERM, e.g. a scheduler cancelling the job).

Errors go to stderr; under ``spark-submit`` the Python driver's stderr is merged into the
driver's stdout (Spark's PythonRunner), so a scheduler should read the last line of the two.
Checkpoints make a failed or cancelled training run resumable: run the same command again.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable

from pipeline.config import Config, ConfigError, resolve, validate

log = logging.getLogger("pipeline.cli")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143
_MAX_REASON = 400


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)


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


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so the job unwinds (stops Spark) and says so."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


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
    try:
        return _run(job, description, body, argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run(job: str, description: str, body: Callable[[Config], int | None],
         argv: list[str] | None) -> int:
    try:
        cfg = validate(resolve(argv, description), job)
        setup_logging(cfg.log_level)
        return int(body(cfg) or 0)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except Terminated:
        print(f"error: {job} terminated (SIGTERM); rerun the same command to resume",
              file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print(f"error: {job} interrupted; rerun the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        log.error("%s job failed", job, exc_info=True)
        sys.stderr.flush()
        print(f"error: {job} failed: {one_line_reason(exc)} (traceback above)",
              file=sys.stderr)
        return EXIT_FAILED
