"""Shared fixtures: one local[2] SparkSession bound to 127.0.0.1, and the shared corpora."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Test JVMs (this process's session and every job a test starts) spend most of their CPU in
# the JIT compiler; C1 only and the serial GC make them start and finish much faster on a
# small, shared machine (test tuning, not advice): about 8% of the suite's time.
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_SUBMIT_OPTS", FAST_JVM)

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SPARK_BPE_SHARED", REPO.parent / "shared"))
EN_DOCS = SHARED / "corpora" / "en-docs"
MULTILINGUAL = SHARED / "corpora" / "multilingual"
SAMPLE = REPO / "data" / "sample"


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need(ok: bool, reason: str) -> None:
    """Skip a test whose requirement (a shared corpus, Chromium, transformers) is missing;
    under CI (``CI=true``) fail instead: CI must run what matters."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"missing under CI (CI=true): {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)  # (also where a module imports)


def need_module(name: str):
    """``pytest.importorskip`` that fails under CI."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        need(False, f"could not import {name!r} (pip install -e '.[test]')")


def need_corpus(path: Path) -> Path:
    need(path.exists(), f"corpus not available: {path} (set SPARK_BPE_SHARED)")
    return path


@pytest.fixture(scope="session")
def spark():
    from pipeline.config import Config
    from pipeline.spark_session import build_session

    session = build_session(Config(master="local[2]", shuffle_partitions=4), "spark-bpe tests",
                            {"spark.ui.enabled": "false"})
    yield session
    session.stop()
