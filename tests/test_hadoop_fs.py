"""fsutil's Hadoop branch (hdfs://, s3a://, ... through the JVM), run against ``file:`` URIs
with the local shortcut switched off, so every py4j call in it is exercised."""

from __future__ import annotations

import json

import pytest

from pipeline import fsutil
from pipeline.config import Config
from pipeline.train import train

from .conftest import SAMPLE

pytestmark = pytest.mark.spark


@pytest.fixture
def via_hadoop(monkeypatch):
    monkeypatch.setattr(fsutil, "is_local", lambda path: False)


def names(spark, uri: str) -> list[str]:
    """What list_dir sees, without the .crc files Hadoop's checksummed local FS adds."""
    return [n for n in fsutil.list_dir(spark, uri) or [] if not n.endswith(".crc")]


def test_file_operations_through_hadoop(spark, tmp_path, via_hadoop):
    root = f"file://{tmp_path}"
    run = fsutil.join(root, "run")
    fsutil.mkdirs(spark, run)
    assert fsutil.list_dir(spark, run) == [] and fsutil.list_dir(spark, run + "/x") is None
    f = fsutil.join(run, "run.json")
    fsutil.write_text(spark, f, "first\n")
    fsutil.write_text(spark, f, "second\nline\n")  # over an existing file, in one rename
    assert fsutil.read_text(spark, f) == "second\nline\n"
    assert (tmp_path / "run" / "run.json").read_text() == "second\nline\n"
    assert names(spark, run) == ["run.json"]  # no temp file left
    assert fsutil._FILE_CONTEXTS[(id(spark.sparkContext), "file://")] is not None  # one step
    (tmp_path / "run" / "mixed.txt").write_bytes("a\r\nb\rc\n\nd é".encode())
    assert fsutil.read_text(spark, fsutil.join(run, "mixed.txt")) == "a\nb\nc\n\nd é\n"
    with pytest.raises(FileNotFoundError):  # as a local read says it, not py4j's Java error
        fsutil.read_text(spark, fsutil.join(run, "missing.json"))
    (tmp_path / "run" / "empty.txt").write_bytes(b"")
    assert fsutil.read_text(spark, fsutil.join(run, "empty.txt")) == ""
    lease = fsutil.join(run, "_lease.json")
    assert fsutil.create_exclusive(spark, lease, "mine\n")
    assert not fsutil.create_exclusive(spark, lease, "theirs\n")
    assert fsutil.read_text(spark, lease) == "mine\n"
    staged = fsutil.join(root, "words.tmp-1234abcd")
    fsutil.write_text(spark, fsutil.join(staged, "word_table.json"), "{}\n")
    fsutil.replace_dir(spark, staged, fsutil.join(root, "words"))
    assert names(spark, fsutil.join(root, "words")) == ["word_table.json"]
    # a move into place that fails leaves the old one (it was deleted first)
    with pytest.raises(fsutil.WriteFailed):
        fsutil.replace_dir(spark, fsutil.join(root, "words.tmp-gone"), fsutil.join(root, "words"))
    assert names(spark, fsutil.join(root, "words")) == ["word_table.json"]
    assert not [p.name for p in tmp_path.iterdir() if ".old-" in p.name]
    fsutil.write_text(spark, fsutil.join(root, "words.old-99999999", "x"), "")
    assert fsutil.remove_stale_temps(spark, fsutil.join(root, "words")) == [
        fsutil.join(root, "words.old-99999999")]
    fsutil.delete(spark, run)
    assert not fsutil.exists(spark, run) and not (tmp_path / "run").exists()


def test_a_run_written_through_hadoop_equals_the_local_run(spark, tmp_path, monkeypatch,
                                                           caplog):
    """Count, train, checkpoint, lease, publish and a resumed rerun, all through the Hadoop
    branch (as on hdfs://): the merges of the local run, the word table reused (and its data
    files found as word_table.json lists them), the run resumed from its checkpoint."""
    kw = dict(progress_bar=False)
    ref = train(spark, Config(input=str(SAMPLE), output=str(tmp_path / "ref"),
                              vocab_size=450, **kw)).merges
    monkeypatch.setattr(fsutil, "is_local", lambda path: False)
    run = f"file://{tmp_path}/run"
    first = train(spark, Config(input=f"file://{SAMPLE}", output=run, vocab_size=400, **kw))
    assert first.merges == ref[:400 - 257]
    caplog.clear()
    again = train(spark, Config(input=f"file://{SAMPLE}", output=run, vocab_size=450, **kw))
    assert again.merges == ref and again.stats["resumed_from_merge"] == 400 - 257
    assert "are not the ones its word_table.json lists" not in caplog.text
    listed = json.loads((tmp_path / "run" / "words" / "word_table.json").read_text())
    assert listed["data_files"] and all(
        name.endswith(".parquet") and "/" not in name for name in listed["data_files"])
    assert again.stats["stage_seconds"].get("count_words", 0) == 0  # the table was reused
    assert (tmp_path / "run" / "run.json").exists()
    assert (tmp_path / "run" / "merges.txt").read_text() == (
        tmp_path / "ref" / "merges.txt").read_text()
    # progress.jsonl, written whole through Hadoop: both attempts, each to its last stage
    events = [json.loads(x) for x in (tmp_path / "run" / "progress.jsonl").read_text()
              .splitlines()]
    ends = [(e["stage"], e["event"]) for e in events if e["event"] in ("start", "end")]
    assert ends.count(("prepare", "start")) == 2 and ends[-1] == ("report", "end"), ends
    assert ends.count(("report", "end")) == 2


def test_a_failed_write_through_hadoop_is_one_line_naming_the_file(spark, tmp_path, via_hadoop,
                                                                   monkeypatch, capsys):
    """A write that the filesystem refuses (here: the parent is a file) raises WriteFailed
    with the path and the Java exception's first line, no temp file is left, and the job ends
    with one `error:` line naming the file, exit 1 (made to fail by leaving the Java exception
    as it was: the job said "train failed ... Py4JJavaError ... (traceback above)")."""
    import re

    from pipeline import cli

    (tmp_path / "afile").write_text("not a directory\n")
    target = f"file://{tmp_path}/afile/checkpoints/merges-000000060.txt"
    with pytest.raises(fsutil.WriteFailed) as info:
        fsutil.write_text(spark, target, "merges\n")
    assert info.value.filename == target and info.value.strerror
    assert "\n" not in info.value.strerror and "afile" in info.value.strerror
    assert (tmp_path / "afile").read_text() == "not a directory\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    # refused after the temp file was written (the rename onto a directory that is not
    # empty): the temp file is removed
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir" / "x").write_text("x")
    with pytest.raises(fsutil.WriteFailed) as info:
        fsutil.write_text(spark, f"file://{tmp_path}/adir", "merges\n")
    assert info.value.filename == f"file://{tmp_path}/adir" and info.value.strerror
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".crc")) == [
        "adir", "afile"]

    # a Java error that is not an IOException (an OutOfMemoryError, say) is left as it is
    from py4j.protocol import Py4JJavaError

    with pytest.raises(Py4JJavaError, match="NullPointerException"), \
            fsutil._writing(spark, target):
        spark.sparkContext._jvm.java.util.Objects.requireNonNull(None)

    monkeypatch.setattr(cli, "setup_logging", lambda level: None)  # (pytest's logging stays)
    code = cli._run("train", "train", lambda cfg: fsutil.write_text(spark, target, "x"), [])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == cli.EXIT_FAILED
    assert re.match(rf"error: train could not write {re.escape(target)} in stage '\w+': "
                    r"[^\n]+; what was written before \(the word table, the checkpoints\) is "
                    r"intact: .+, then rerun the same command to resume$", last), last


def test_plain_paths_are_local_whatever_the_default_filesystem(spark, tmp_path, monkeypatch):
    """On a cluster whose default filesystem is another one (fs.defaultFS = hdfs://..., here
    a scheme with no filesystem at all), Spark resolves a plain path there, and the JVM
    resolves a relative one against its own working directory; the jobs mean this machine's
    files (their checks and small files are local), so every path they hand Spark is an
    absolute file: URI: the count's Spark reader and merge, the run, and the encode's Spark
    reader and writer all find and write the same local files."""
    from pipeline.encode_corpus import encode_corpus

    kw = dict(progress_bar=False, count_reader="spark", count_merge="spark")
    ref = train(spark, Config(input=str(SAMPLE), output=str(tmp_path / "ref"), vocab_size=300,
                              **kw))
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    before = hadoop.get("fs.defaultFS")
    monkeypatch.chdir(tmp_path)  # (not the JVM's working directory)
    hadoop.set("fs.defaultFS", "nofs://cluster/")
    try:
        run = train(spark, Config(input=str(SAMPLE), output="run", vocab_size=300, **kw))
        encoded = encode_corpus(spark, Config(tokenizer="run", input=str(SAMPLE),
                                              output="encoded", encode_io="spark",
                                              progress_bar=False))
    finally:
        hadoop.set("fs.defaultFS", before)
    assert run.merges == ref.merges
    assert (tmp_path / "run" / "words" / "data").is_dir()
    assert encoded.stats["stats"]["rows"] > 0 and list((tmp_path / "encoded").glob("*.parquet"))


def test_a_run_on_another_filesystem_loads_through_spark_never_as_a_local_file(
        spark, tmp_path, via_hadoop, monkeypatch):
    """The encoders of a run on hdfs:// or s3a:// (here file: URIs through the Hadoop branch)
    load through the active Spark session; with none there is one error saying so (not "no
    run directory", which looking for a local file of that name said); a Run the Python API
    returns holds what its encoders need, read while its session was up, so they load after
    the call has stopped a session it made."""
    from pyspark.sql import SparkSession

    from pipeline import api
    from pipeline.encoder import Tokenizer

    run = api.train(str(SAMPLE), output=f"file://{tmp_path}/run", vocab_size=300, spark=spark)
    text = "the remote tokenizer, 2024"
    ids = Tokenizer.load(run.dir).encode(text)  # (the active session: the fixture's)
    assert run.meta is not None and run.export is not None
    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    monkeypatch.setattr(SparkSession, "_instantiatedSession", None)
    with pytest.raises(fsutil.NeedsSpark, match=rf"^file://{tmp_path}/run\S* is not on the "
                                                r"local filesystem: reading or writing it "
                                                r"takes a Spark session"):
        Tokenizer.load(run.dir)
    assert run.tokenizer().encode(text) == ids == run.tiktoken().encode(text)


def test_the_input_fingerprint_through_hadoop_names_a_file_removed_while_listed(
        spark, tmp_path, via_hadoop):
    """On hdfs:// or an object store the sizes and times come from one listing per folder; a
    file listed for the count but gone by then is one line naming it, as for local files
    (it counted as size -1 before, a fingerprint that matched nothing and said nothing), and
    so is one whose folder is gone."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.config import ConfigError
    from pipeline.count.corpus import input_fingerprint

    for name in ("a b.parquet", "c%d.parquet"):
        pq.write_table(pa.table({"text": ["a row"]}), tmp_path / name)
    files = sorted(f.getPath().toString() for f in fsutil._fs(spark, f"file://{tmp_path}")[0]
                   .listStatus(fsutil._fs(spark, f"file://{tmp_path}")[1]))
    fp = input_fingerprint(spark, files)
    assert fp["files"] == 2 and fp["bytes"] == sum(
        (tmp_path / n).stat().st_size for n in ("a b.parquet", "c%d.parquet"))
    with pytest.raises(ConfigError, match=r"gone\.parquet was removed while the input was "
                                          r"listed"):
        input_fingerprint(spark, [*files, f"file:{tmp_path}/gone.parquet"])
    # its folder too (a date partition a retention job removed): the same line, not a
    # Java traceback
    with pytest.raises(ConfigError, match=r"day=1/a\.parquet was removed while the input "
                                          r"was listed"):
        input_fingerprint(spark, [*files, f"file:{tmp_path}/day=1/a.parquet"])


def test_a_store_that_uploads_on_close_is_written_in_place(spark, tmp_path, via_hadoop,
                                                           monkeypatch):
    """On S3 or GCS (an object appears whole when its upload closes) a file is written in
    place: no temp object, no rename (a copy and a delete there); elsewhere through a temp
    file renamed over it. (Here file: URIs stand for such a store.)"""
    renamed = []
    real = fsutil._rename_over
    monkeypatch.setattr(fsutil, "_rename_over", lambda *a: renamed.append(a[-1]) or real(*a))
    f = f"file://{tmp_path}/run/stats.json"
    fsutil.write_text(spark, f, "renamed\n")
    assert renamed == [f] and (tmp_path / "run" / "stats.json").read_text() == "renamed\n"
    monkeypatch.setattr(fsutil, "WHOLE_ON_CLOSE", frozenset({"file"}))
    fsutil.write_text(spark, f, "in place\n")
    fsutil.write_text(spark, f"file://{tmp_path}/run/new.json", "{}\n")
    assert renamed == [f] and (tmp_path / "run" / "stats.json").read_text() == "in place\n"
    assert names(spark, f"file://{tmp_path}/run") == ["new.json", "stats.json"]


def test_files_left_out_are_found_under_a_path_hadoop_spells_otherwise(spark, tmp_path,
                                                                      via_hadoop):
    """Hadoop lists the files under ``hdfs:///lake`` as ``hdfs://namenode:8020/lake/...``
    (here: ``file:{tmp}/lake/sub/..`` as ``file:{tmp}/lake/...``): the check compared them
    with the path as typed, found none under it, and a subfolder's files were left out of
    the run silently."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.config import ConfigError
    from pipeline.count.corpus import _refuse_files_left_out, normalize_path

    lake = tmp_path / "lake"
    (lake / "sub").mkdir(parents=True)
    pq.write_table(pa.table({"text": ["top"]}), lake / "top.parquet")
    pq.write_table(pa.table({"text": ["nested"]}), lake / "sub" / "nested.parquet")
    read = [normalize_path(f"file://{lake}/top.parquet")]
    with pytest.raises(ConfigError, match=r"1 files under \S+ would not be read, in subfolders "
                                          r"that are not partitions \(key=value\), e.g. "
                                          r"\S+/lake/sub/nested\.parquet"):
        _refuse_files_left_out(spark, "config key 'input'", f"file://{lake}/sub/..", read)
