"""Shared entry-point plumbing for the jobs: config, logging, one-line errors, exit codes."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from pipeline.config import Config, ConfigError, resolve, validate


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)


def run_job(job: str, description: str, body: Callable[[Config], int | None],
            argv: list[str] | None = None) -> int:
    """Parse + validate config (before Spark), run ``body``; a bad input is one line, exit 2."""
    try:
        cfg = validate(resolve(argv, description), job)
        setup_logging(cfg.log_level)
        return int(body(cfg) or 0)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
