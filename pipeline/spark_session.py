"""Building the SparkSession the jobs and tests use."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from pipeline.config import Config


def build_session(cfg: Config, app_name: str, extra_conf: dict[str, str] | None = None
                  ) -> SparkSession:
    """A session for a job. ``cfg.master`` wins; else spark-submit's master; else local[*].

    The web UI follows ``cfg.spark_ui``: ``auto`` starts it on a cluster master and not in local
    modes, where starting it costs about 1.5 s per job. Under spark-submit without the job's own
    ``--master``, an explicit ``--conf spark.ui.enabled=...`` wins.

    With ``SPARK_LOCAL_IP=127.0.0.1`` (tests, CI, the quick start) the driver binds to loopback.
    """
    # local modes: Python workers use this interpreter (the one with our dependencies)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    submitted = {} if cfg.master else _submit_conf()  # (asking starts the JVM: only if needed)
    master = cfg.master or submitted.get("spark.master", "local[*]")
    if cfg.master or "spark.master" not in submitted:
        builder = builder.master(master)
    if "spark.ui.enabled" not in submitted:  # an explicit --conf wins
        builder = builder.config("spark.ui.enabled",
                                 str(web_ui_enabled(cfg.spark_ui, master)).lower())
    local_ip = os.environ.get("SPARK_LOCAL_IP")
    if local_ip:
        builder = builder.config("spark.driver.host", local_ip).config(
            "spark.driver.bindAddress", local_ip
        )
    builder = (
        builder.config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
    )
    for k, v in (extra_conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    shuffle = cfg.shuffle_partitions or max(2, 2 * spark.sparkContext.defaultParallelism)
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle))
    return spark


def web_ui_enabled(mode: str, master: str) -> bool:
    """``spark_ui``: on, off, or auto = on for a cluster master, off for local modes."""
    return mode == "on" or (mode == "auto" and not master.startswith("local"))


def _submit_conf() -> dict[str, str]:
    """Settings spark-submit passed to this driver (``--master``, ``--conf``).

    They live in the JVM's system properties, so connect to the JVM first: a ``SparkConf()``
    made before that is an empty Python-side dict, and every job would silently run in
    ``local[*]`` whatever ``--master`` said. (Under plain ``python`` this starts the gateway
    that ``getOrCreate`` would start anyway.)"""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())
