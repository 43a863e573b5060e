"""A real Spark standalone cluster on 127.0.0.1: a master and two workers started with
``spark-class``, ``spark-submit --master spark://127.0.0.1:PORT jobs/train.py`` with the
``pipeline`` package shipped as a ``--py-files`` zip (scripts/build_pyfiles.sh), and the
result compared with local mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.config import Config
from pipeline.encode_corpus import encode_corpus

from .conftest import REPO
from .sparkjobs import (
    ENCODE,
    SPARK_CLASS,
    ProcGroup,
    free_port,
    job_env,
    merges_txt,
    process_groups,
    reference_run,
    shared_corpus,
    stats,
    submit,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """(master URL, directory): a master and two 1-core workers, all bound to 127.0.0.1.
    Every daemon (and the executors its worker starts) is SIGKILLed at the end."""
    d = tmp_path_factory.mktemp("standalone")
    env = job_env(SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")  # no fixed port 6066
    env.pop("SPARK_CONF_DIR", None)  # the daemons' INFO lines, waited on here (a quiet conf
    # directory, as README suggests exporting for the jobs, would hide them)
    url = f"spark://127.0.0.1:{free_port()}"
    started: list[ProcGroup] = []
    try:
        master = ProcGroup([str(SPARK_CLASS), "org.apache.spark.deploy.master.Master",
                            "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1],
                            "--webui-port", str(free_port())], d, "master", env=env)
        started.append(master)
        master.wait_until(lambda: "I have been elected leader" in master.err(), 90,
                          "the master to start")
        for i in range(2):
            started.append(ProcGroup(
                [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", "--host",
                 "127.0.0.1", "--port", str(free_port()), "--webui-port", str(free_port()),
                 "--cores", "1", "--memory", "1g", "--work-dir", str(d / f"work{i}"), url],
                d, f"worker{i}", env=env))
        master.wait_until(lambda: master.err().count("Registering worker 127.0.0.1:") >= 2,
                          90, "two workers to register")
        yield url, d
    finally:
        for p in reversed(started):
            p.kill()


procs = pytest.fixture(name="procs")(process_groups)  # SIGKILLs what a test started


def python_without_our_package(path: Path) -> Path:
    """The venv's Python without site-packages' .pth hooks (so not the editable install of
    this checkout): on the executors ``pipeline`` can then only come from --py-files, as on a
    real cluster. numpy/pyarrow/pandas/regex stay importable (the packed venv's job)."""
    site = sysconfig.get_paths()["purelib"]
    path.write_text("#!/bin/sh\n"
                    f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}" '
                    f'exec "{sys.executable}" -S "$@"\n')
    path.chmod(0o755)
    return path


@pytest.mark.spark
def test_standalone_cluster_run_equals_local_mode(spark, standalone, tmp_path_factory,
                                                  tmp_path, procs):
    url, cluster_dir = standalone
    corpus = shared_corpus(tmp_path_factory)
    vocab = 257 + 100
    ref = reference_run(spark, corpus, vocab)
    pyfiles = tmp_path / "spark_bpe_pyfiles.zip"
    subprocess.run(["bash", str(REPO / "scripts" / "build_pyfiles.sh"), str(pyfiles)],
                   check=True, capture_output=True)
    run = tmp_path / "run"
    p = submit(["--input", str(corpus), "--output", str(run), "--vocab-size", str(vocab),
                "--engine", "spark", "--num-partitions", "4",
                "--config", str(REPO / "conf" / "cluster.toml")],
               tmp_path, "standalone", master=url,
               conf={"spark.executor.cores": "1", "spark.executor.memory": "768m"},
               submit_args=["--py-files", str(pyfiles)],
               env=job_env(PYSPARK_PYTHON=str(python_without_our_package(tmp_path / "py"))))
    procs.append(p)
    assert p.wait(300) == 0, p.tail()
    assert p.last_line() == f"trained {vocab - 257} merges: tokenizer written to {run}"
    assert merges_txt(run) == merges_txt(ref)
    assert stats(run)["spark_rounds"] > 0 and stats(run)["stage_seconds"]["count_words"] > 0
    # the work ran in executors of both workers, each of which fetched the --py-files zip
    for i in range(2):
        apps = list((cluster_dir / f"work{i}").glob("app-*/*"))
        assert apps, f"worker {i} ran no executor"
        assert any((a / pyfiles.name).exists() for a in apps), os.listdir(apps[0])
    # the encode job on the cluster: its executors read and write the local files with
    # pyarrow (encode_io auto), and give what Spark's reader and writer give in local mode
    enc = tmp_path / "enc"
    p = submit(["--tokenizer", str(run), "--input", str(corpus), "--output", str(enc)],
               tmp_path, "standalone-encode", master=url,
               conf={"spark.executor.cores": "1", "spark.executor.memory": "768m"},
               submit_args=["--py-files", str(pyfiles)],
               env=job_env(PYSPARK_PYTHON=str(python_without_our_package(tmp_path / "py"))),
               job=ENCODE)
    procs.append(p)
    assert p.wait(300) == 0, p.tail()
    got = json.loads((enc / "_encode.json").read_text())["stats"]
    assert got["io"] == "arrow" and got["partitions"] >= 2, got
    local = encode_corpus(spark, Config(input=str(corpus), tokenizer=str(run),
                                        output=str(tmp_path / "enc-local"), encode_io="spark"))
    assert local.stats["stats"]["io"] == "spark"
    order = [("file", "ascending"), ("row", "ascending")]
    assert pq.read_table(enc).sort_by(order).equals(
        pq.read_table(tmp_path / "enc-local").sort_by(order))
