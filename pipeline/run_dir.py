"""A run directory's state between runs: whether the complete run it holds is still what a
command asks for (same merges, same publish-only settings, files unchanged), its summary and
saved config, the tokenizer's name, and marking it incomplete before it is rewritten
(docs/DESIGN.md section 7)."""

from __future__ import annotations

import json
import logging
import os
import re
from typing import TYPE_CHECKING

from pipeline import fsutil
from pipeline.config import Config
from pipeline.outputs import EXPORT_FILES, IncompleteRun, check_run

if TYPE_CHECKING:  # (the module itself needs no pyspark)
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def complete_run_still_valid(spark: SparkSession, cfg: Config, done: dict) -> bool:
    """Whether a complete run's files are still the ones it wrote, under the tokenizer name
    asked for now; else (logged) its outputs are written again from its checkpoint."""
    name = tokenizer_name(cfg)
    if cfg.name and done.get("name", name) != name:  # (a moved run keeps its default name)
        log.info("run at %s is complete but its tokenizer is named %r: writing its outputs "
                 "again as %r", cfg.output, done["name"], name)
        return False
    saved = saved_config(spark, cfg.output)
    if not saved:  # (gone or damaged: the output settings it was published with are unknown)
        log.info("run at %s is complete but its config.json is missing or unreadable: writing "
                 "its outputs again", cfg.output)
        return False
    changed = [f"{k} {saved[k]!r} then, {getattr(cfg, k)!r} now" for k in PUBLISH_KEYS
               if k in saved and published_as(cfg, k, saved[k])
               != published_as(cfg, k, getattr(cfg, k))]
    if changed:  # (merges unchanged: the outputs, report and config.json written again)
        log.info("run at %s is complete but was published with other output settings (%s): "
                 "writing its outputs again", cfg.output, "; ".join(changed))
        return False
    try:
        check_run(cfg.output, list(done.get("files") or ()), spark)
    except IncompleteRun as exc:
        log.info("run at %s is complete but its outputs changed (%s): writing them again",
                 cfg.output, str(exc).split("; rerun")[0])
        return False
    return True


# settings that shape a run's outputs but not its merges: a complete run asked for with other
# values is published again (from its checkpoint), not left as it was
PUBLISH_KEYS = ("name", "report_sample", "report_sample_rows")


def published_as(cfg: Config, key: str, value):
    """What a publish-only setting comes to in ``cfg``'s run: the name (the default one for
    "", as a moved run is named), the report sample's absolute path (one file spelled two
    ways, by the CLI and by pipeline.api, is one file)."""
    if key == "name":
        return value or tokenizer_name(Config(output=cfg.output))
    if key == "report_sample":
        return fsutil.absolute_local(value)
    return value


def saved_config(spark: SparkSession, run_dir: str) -> dict:
    """The resolved config a run saved next to its outputs ({} if none or unreadable)."""
    try:
        saved = json.loads(fsutil.read_text(spark, fsutil.join(run_dir, "config.json")))
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def run_summary(run_dir: str, spark: SparkSession) -> dict | None:
    path = fsutil.join(run_dir, "run.json")
    if not fsutil.exists(spark, path):
        return None
    try:
        summary = json.loads(fsutil.read_text(spark, path))
    except ValueError:
        summary = None
    if not isinstance(summary, dict):  # (damaged: the run is not complete; trained again)
        log.warning("%s cannot be read as a run summary: the run counts as incomplete", path)
        return None
    return summary


def tokenizer_name(cfg: Config) -> str:
    """``name``, or spark-bpe-<run directory name> (tiktoken wants distinct encodings to have
    distinct names: two runs with other special tokens must not share one)."""
    if cfg.name:
        return cfg.name
    path = cfg.output
    if fsutil.is_local(path):  # ".", "out/run/." and "out/.." name the directory they mean
        path = os.path.abspath(fsutil.local_path(path))
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", path.rstrip("/").rsplit("/", 1)[-1]).strip("-.")
    return "spark-bpe-" + (base or "run")


def invalidate_run(spark: SparkSession, run_dir: str) -> None:
    """A run about to rewrite a run directory first removes its ``run.json``: until the new
    one is written, the directory does not claim to hold a complete run. The earlier run's
    exports go too, so that none this run does not write (a chars run writes no tiktoken
    files) stays beside its run.json."""
    path = fsutil.join(run_dir, "run.json")
    if fsutil.exists(spark, path):
        log.info("%s holds an earlier run; it is marked incomplete until this one is "
                 "published", run_dir)
        fsutil.delete(spark, path)
    for name in EXPORT_FILES:
        if fsutil.exists(spark, fsutil.join(run_dir, name)):
            fsutil.delete(spark, fsutil.join(run_dir, name))
