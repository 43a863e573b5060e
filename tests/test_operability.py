"""What a data team sees when it runs the jobs: a quiet start, Spark's settings kept."""

from __future__ import annotations

import gzip
import re

import pytest

from .conftest import REPO
from .sparkjobs import job_env, process_groups, submit

procs = pytest.fixture(name="procs")(process_groups)


@pytest.mark.spark
def test_the_quick_start_is_quiet_and_spark_submit_settings_win(tmp_path, procs):
    """As scripts/quickstart.sh runs it (SPARK_CONF_DIR=conf/spark): no JVM INFO lines before
    the job's first line; --name and --conf settings are the application's, not ours (the
    shuffle partitions as the SQL session that read the corpus had them), also when the job
    is given its own --master or --spark-ui on|off (which then override spark-submit's, and
    only those)."""
    run = tmp_path / "run"
    p = submit(["--output", str(run), "--vocab-size", "300", "--master", "local[2]",
                "--count-reader", "spark",  # Spark SQL reads: the session is made
                "--spark-ui", "on"],  # explicit: wins over the --conf spark.ui.enabled=false
               tmp_path, "quick", master="local[1]",
               submit_args=["--name", "nightly-tokenizer",
                            "--conf", "spark.sql.shuffle.partitions=7"],
               env=job_env(SPARK_CONF_DIR=str(REPO / "conf" / "spark")))
    procs.append(p)
    assert p.wait(180) == 0, p.tail()
    lines = p.log().splitlines()
    first = next(i for i, ln in enumerate(lines) if " pipeline." in ln)
    assert not [ln for ln in lines[:first] if " INFO " in ln], lines[:first]
    assert not [ln for ln in lines if re.match(r"\d\d/\d\d/\d\d .* INFO ", ln)]
    assert re.search(r"INFO pipeline\.spark_session: Spark application 'nightly-tokenizer' "
                     r"\(local-\d+\), master local\[2\], 2 cores, web UI "
                     r"http://127\.0\.0\.1:\d+", p.log())
    assert '"shuffle_partitions": 0' in p.log()  # the resolved config is logged, one line
    assert "spark.sql.shuffle.partitions = 7 (spark-submit)" in p.log()
    assert p.last_line() == f"trained 43 merges: tokenizer written to {run}"


@pytest.mark.spark
@pytest.mark.parametrize("master", ["bogus", "local[0]"])
def test_a_master_url_spark_cannot_parse_is_a_one_line_config_error(tmp_path, procs, master):
    """--master bogus (or local[0], which Spark parses and then cannot run: it was a stack
    trace, exit 1): exit 2 and one line naming the key, no Java stack trace."""
    p = submit(["--output", str(tmp_path / "run"), "--vocab-size", "300", "--master",
                master], tmp_path, "bogus")
    procs.append(p)
    assert p.wait(120) == 2, p.tail()
    assert p.last_line().startswith("error: config key 'master': Spark cannot use the master "
                                    f"URL '{master}' (local[N], "), p.tail()
    assert "Py4JJavaError" not in p.err() and not (tmp_path / "run").exists()


@pytest.mark.spark
def test_a_failed_task_under_the_shipped_log_config_shows_its_causes_not_its_frames(
        tmp_path, procs):
    """conf/spark/log4j2.properties (the README's SPARK_CONF_DIR) leaves Java stack frames
    out of Spark's task-failure lines: a cut-off JSON file is Spark's error and its cause, a
    few lines, then our one line; not 60 lines of frames per failure."""
    corpus = tmp_path / "in"
    corpus.mkdir()
    rows = "".join(f'{{"text": "row {i} of a few words"}}\n' for i in range(50)).encode()
    (corpus / "a.json.gz").write_bytes(gzip.compress(rows))
    (corpus / "b.json.gz").write_bytes(gzip.compress(rows)[:40])
    p = submit(["--input", str(corpus), "--input-format", "json", "--output",
                str(tmp_path / "run"), "--vocab-size", "300"], tmp_path, "cut",
               env=job_env(SPARK_CONF_DIR=str(REPO / "conf" / "spark")))
    procs.append(p)
    assert p.wait(120) == 2, p.tail()
    log = p.log()
    assert re.search(r"error: config key 'input': \S+/b\.json\.gz is not a readable JSON lines "
                     r"file", p.last_line()), p.tail()
    assert re.search(r"(?m)^Caused by: java\.io\.EOFException", log), log[-3000:]
    assert not re.search(r"(?m)^\s+(at |\.\.\. \d+ more)", log), log[-3000:]
    assert len(log.splitlines()) < 40, log
