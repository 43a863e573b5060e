"""Shared fixtures: one local[2] SparkSession bound to 127.0.0.1, and the shared corpora."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SPARK_BPE_SHARED", REPO.parent / "shared"))
EN_DOCS = SHARED / "corpora" / "en-docs"
MULTILINGUAL = SHARED / "corpora" / "multilingual"
SAMPLE = REPO / "data" / "sample"


def need_corpus(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"corpus not available: {path} (set SPARK_BPE_SHARED)")
    return path


@pytest.fixture(scope="session")
def spark():
    from pipeline.config import Config
    from pipeline.spark_session import build_session

    session = build_session(Config(master="local[2]", shuffle_partitions=4), "spark-bpe tests",
                            {"spark.ui.enabled": "false"})
    yield session
    session.stop()
