"""Junk rows and junk settings: counted, skipped or refused, never a stall or a crash."""

from __future__ import annotations

import json
import random
import re
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config import Config, ConfigError, resolve, validate
from pipeline.count.word_count import count_words
from pipeline.encode_corpus import BatchEncoder, load_plan
from pipeline.encoder import Tokenizer
from pipeline.pretokenize import Pretokenizer, PretokenizerSpec, WordCounter
from pipeline.train import train

from .conftest import SAMPLE
from .naive_count import assert_word_table, naive_count
from .sparkjobs import ENCODE, job_env, oracle_merges, process_groups, submit

procs = pytest.fixture(name="procs")(process_groups)

BAD_ROWS = {
    "spaces": " " * 2_000_000 + "x",
    "letters": "a" * 20_000_000,
    "digits": "7" * 5_000_000,
    "punct": "".join(random.Random(0).choices("!?.,;:-_()[]{}", k=5_000_000)),
}


def normal_rows(n: int = 50) -> list[str]:
    return pq.read_table(SAMPLE / "part-00000.parquet").column("text").to_pylist()[:n]


def test_over_long_words_are_left_out_and_counted():
    pre = Pretokenizer(PretokenizerSpec("cl100k"))
    wc = WordCounter(pre, max_word_bytes=8)
    wc.add_row(0, "short words and averyveryverylongword here, then short again")
    wc.add_row(1, "averyveryverylongword again and " + "é" * 5)  # é is 2 bytes: 10 > 8
    wc.add_row(2, "fine")
    assert " averyveryverylongword" not in wc.counts and " " + "é" * 5 not in wc.counts
    assert wc.stats.long_words == 3 and wc.stats.rows_with_long_words == 2
    assert wc.stats.long_word_bytes == len(" averyveryverylongword") + 21 + len(" ééééé".encode())
    kept = pre.words("short words and averyveryverylongword here, then short again")
    # first occurrences stay aligned with the words that were kept
    first = dict(zip(wc.counts, zip(wc.first_row, wc.first_rank)))
    assert first[" here"] == (0, kept.index(" here"))
    assert first[" again"] == (0, kept.index(" again")) and first["fine"] == (2, 0)
    assert wc.stats.words == sum(wc.counts.values())


@pytest.mark.spark
def test_pathological_rows_count_train_and_encode_in_seconds(spark, tmp_path):
    """2 M spaces, 20 M letters, 5 M digits, 5 M punctuation among normal rows: the count
    leaves the over-long words out (and says so), training and encoding take seconds."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = normal_rows()
    pq.write_table(pa.table({"text": rows[:25] + list(BAD_ROWS.values()) + rows[25:]}),
                   corpus / "part-0.parquet")
    t0 = time.time()
    run = train(spark, Config(input=str(corpus), output=str(tmp_path / "run"), vocab_size=600,
                              special_tokens=["<|endoftext|>"], progress_bar=False))
    assert time.time() - t0 < 60
    stats = json.loads((tmp_path / "run" / "stats.json").read_text())
    left = stats["left_out_of_training"]
    assert left["rows_with_long_words"] == 3  # spaces, letters, punctuation; digits split
    assert left["long_word_bytes"] == 1_999_999 + 20_000_000 + 5_000_000
    assert max(len(t) for t in run.merges and Tokenizer.load(str(tmp_path / "run")).vocab) \
        <= 1024
    # linear time: seconds (a quadratic path on these rows takes hours; 11 s seen under load)
    assert stats["stage_seconds"]["merges"] < 10 and stats["stage_seconds"]["report"] < 20
    # encode and decode back, each row in seconds: 0.5 s for the letters here; 18 s once on a
    # fresh CI machine, whose first touch of memory is slow, when decode took 1.7 GB for them
    tok = Tokenizer.load(str(tmp_path / "run"))
    for name, row in BAD_ROWS.items():
        t0 = time.time()
        ids = tok.encode(row)
        assert tok.decode(ids) == row, name
        assert time.time() - t0 < 25, f"{name}: {time.time() - t0:.1f} s"


@pytest.mark.spark
def test_pathological_rows_kept_whole_still_train_and_report_in_seconds(spark, tmp_path):
    """``max_word_bytes = 0`` keeps the 20 M-letter and 5 M-punctuation words: the merges and
    the report (which encodes its sample, these rows included) stay near linear in them."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = normal_rows()
    pq.write_table(pa.table({"text": rows[:25] + list(BAD_ROWS.values()) + rows[25:]}),
                   corpus / "part-0.parquet")
    train(spark, Config(input=str(corpus), output=str(tmp_path / "run"), vocab_size=600,
                        max_word_bytes=0, progress_bar=False))
    stats = json.loads((tmp_path / "run" / "stats.json").read_text())
    assert stats["left_out_of_training"]["long_words"] == 0
    # measured 13 s and 10 s under load; the report took 243 s when it encoded with a heap
    assert stats["stage_seconds"]["merges"] < 40 and stats["stage_seconds"]["report"] < 40


@pytest.mark.spark
def test_a_truncated_shard_next_to_a_good_one(spark, tmp_path):
    """By default one line naming the file and nothing written; with ``ignore_corrupt_files``
    the run finishes on the good shard, lists the bad one in stats.json, and the report's
    sample leaves it out too."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = normal_rows()
    pq.write_table(pa.table({"text": rows}), corpus / "part-0.parquet")
    pq.write_table(pa.table({"text": rows}), corpus / "part-1.parquet")
    whole = (corpus / "part-1.parquet").read_bytes()
    (corpus / "part-1.parquet").write_bytes(whole[: len(whole) // 2])  # a cut-off upload
    cfg = Config(input=str(corpus), output=str(tmp_path / "run"), vocab_size=300,
                 progress_bar=False)
    with pytest.raises(ConfigError, match=r"part-1\.parquet is not a readable Parquet file"):
        train(spark, cfg)
    # nothing half-written: only the progress record of the attempt (for dashboards)
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["progress.jsonl"]
    cfg.ignore_corrupt_files = True
    train(spark, cfg)
    stats = json.loads((tmp_path / "run" / "stats.json").read_text())
    assert [p.rsplit("/", 1)[1] for p in stats["left_out_of_training"]["unreadable_files"]] \
        == ["part-1.parquet"]
    report = (tmp_path / "run" / "report.html").read_text()
    assert f"{len(rows)} rows of the training input" in report
    assert "no sample in this report" not in report


def test_the_arrow_readers_read_long_rows_a_few_at_a_time(tmp_path, monkeypatch):
    """The count's and the encode's tasks read a row group in batches of about a fixed amount
    of decoded text: rows of 1 MB a few dozen at a time (4096 of them would be 4 GB in
    memory), short rows 4096 at a time, and a long text repeated (one dictionary entry in the
    file, which makes the file's sizes understate it) no more than the others; every row once,
    in order, and the count reports every row and byte."""
    from pipeline.count import word_count as wc
    from pipeline.count.corpus import plan_slices, read_slice_batches

    seen = []
    real = read_slice_batches

    def recorded(*args, **kwargs):
        for batch in real(*args, **kwargs):
            seen.append(batch)
            yield batch

    monkeypatch.setattr(wc, "read_slice_batches", recorded)
    spec = PretokenizerSpec("cl100k")
    repeated = "x" * (256 << 10)
    cases = {  # name -> (texts as an Arrow array, rows per row group)
        "long": (pa.array([f"w{i:05d} " + "x" * ((1 << 20) - 7) for i in range(40)]), 20),
        "short": (pa.array([f"w{i:05d} " + "x" * 43 for i in range(5000)]), 5000),
        "repeated": (pa.DictionaryArray.from_arrays(pa.array([0] * 1000, pa.int32()),
                                                    pa.array([repeated])), 1000),
    }
    for name, (texts, group) in cases.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"text": texts}), path, row_group_size=group,
                       store_schema=False)  # (read back as plain strings)
        (task,) = plan_slices([str(path)], "text", 1)
        if name == "repeated":  # the file's sizes make its rows look a few bytes long
            assert task[0].nbytes < 2 * len(repeated)
        seen.clear()
        done = []

        class Report:
            def update(self, rows: int, nbytes: int) -> None:
                pass

            def finish(self, rows: int, nbytes: int) -> None:
                done.append((rows, nbytes))

        list(wc._count_slices(spec, "text", task, report=Report()))
        read = [t for b in seen for t in b.column(0).to_pylist()]
        expected = texts.dictionary_decode() if name == "repeated" else texts
        assert read == expected.to_pylist()  # every row once, in order
        assert done == [(len(read), sum(len(t) for t in read))]
        biggest = max(b.nbytes for b in seen)
        assert biggest <= 1.5 * wc.BATCH_BYTES, (name, biggest)
        if name == "short":  # (the first batch after the probe lacks the probe's rows)
            assert wc.BATCH_ROWS - 32 <= max(b.num_rows for b in seen) <= wc.BATCH_ROWS


@pytest.mark.parametrize("error", [pa.ArrowMemoryError("malloc of size 4294967296 failed"),
                                   MemoryError(),
                                   pa.ArrowCapacityError("array cannot contain more than "
                                                         "2147483646 bytes")])
def test_a_task_out_of_memory_names_its_file_and_is_never_skipped(tmp_path, monkeypatch, error):
    """Reading a file that needs more memory than a task's Python has (or more than one
    Arrow array holds) is not a corrupt file: --ignore-corrupt-files does not skip it, and
    the job's last line names the file and the setting to change, for the count's and the
    encode's Arrow readers alike."""
    from pipeline import cli, encode_local
    from pipeline.count import word_count as wc
    from pipeline.count.corpus import plan_slices

    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"text": ["one row", "another"]}), path)
    (task,) = plan_slices([str(path)], "text", 1)

    def out_of_memory(*args, **kwargs):
        raise error
        yield  # (a generator, as the real one)

    monkeypatch.setattr(wc, "read_slice_batches", out_of_memory)
    monkeypatch.setattr(encode_local, "read_slice_batches", out_of_memory)
    spec = PretokenizerSpec("cl100k")
    failures = []
    for ignore_corrupt in (False, True):
        with pytest.raises(RuntimeError) as caught:
            list(wc._count_slices(spec, "text", task, ignore_corrupt=ignore_corrupt))
        failures.append(caught.value)
    with pytest.raises(RuntimeError) as caught:
        list(encode_local._read(task[0], ["text"], {}))
    failures.append(caught.value)
    for failure in failures:  # as the driver sees it: the task's error inside Spark's
        line = cli.memory.task_memory_failure(f"Py4JJavaError: ...\n{failure}\n  at ...")
        assert line.startswith(f"a task ran out of memory reading {task[0].path} "
                               f"({type(error).__name__}"), line
        assert ("smaller row groups" in line and ("spark.executor.memoryOverhead" in line)
                == (not isinstance(error, pa.ArrowCapacityError))), line
    assert cli.memory.task_memory_failure("RuntimeError: something else") == ""


def test_a_file_removed_while_the_input_is_listed_is_one_line(tmp_path):
    """The driver lists the files, then takes each one's size and time for the input
    fingerprint: a file gone in between (a compaction running on the lake) is one line."""
    from pipeline.count.corpus import input_fingerprint

    here = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": ["a row"]}), here)
    assert input_fingerprint(None, [f"file://{here}"])["files"] == 1
    with pytest.raises(ConfigError, match=r"^config key 'input': file://\S+/gone\.parquet was "
                                          r"removed while the input was listed"):
        input_fingerprint(None, [f"file://{here}", f"file://{tmp_path / 'gone.parquet'}"])


@pytest.mark.spark
def test_a_file_the_count_tasks_do_not_find_is_not_skipped_as_corrupt(spark, tmp_path,
                                                                      monkeypatch):
    """A local file listed by the driver that a task does not find (removed since, or a local
    path on a cluster without a shared filesystem) ends the count with one line saying so,
    even with ``ignore_corrupt_files``: it is not a corrupt file to leave out silently (as
    Spark keeps ignoreMissingFiles apart from ignoreCorruptFiles)."""
    import socket

    import pipeline.count.word_count as wc

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("part-0.parquet", "part-1.parquet"):
        pq.write_table(pa.table({"text": normal_rows()}), corpus / name)
    tasks = wc._count_partials

    def gone_before_the_tasks(*args, **kwargs):  # (listed, footers read, fingerprinted)
        (corpus / "part-1.parquet").unlink()
        return tasks(*args, **kwargs)

    monkeypatch.setattr(wc, "_count_partials", gone_before_the_tasks)
    host = re.escape(socket.gethostname())
    for reader, ignore in (("arrow", False), ("arrow", True), ("spark", False), ("spark", True)):
        # (Spark's reader names no host: its ignoreMissingFiles is not ignoreCorruptFiles)
        by = f"for the executor on {host} " if reader == "arrow" else "for the task that read it "
        with pytest.raises(ConfigError, match=r"^config key 'input': \S+/part-1\.parquet was "
                                              rf"listed (by this driver )?but is not there {by}"):
            count_words(spark, Config(input=str(corpus), output=str(tmp_path / "words"),
                                      ignore_corrupt_files=ignore, count_reader=reader))
        pq.write_table(pa.table({"text": normal_rows()}), corpus / "part-1.parquet")
    assert not (tmp_path / "words").exists()
    # removed while the driver reads the footers: not an unreadable file to skip either
    import pipeline.count.corpus as corpus_module

    from_disk = pq.ParquetFile

    def footer(path, *args, **kwargs):
        if str(path).endswith("part-1.parquet"):
            raise FileNotFoundError(2, "No such file or directory")
        return from_disk(path, *args, **kwargs)

    monkeypatch.setattr(corpus_module.pq, "ParquetFile", footer)
    skipped: list[str] = []
    with pytest.raises(ConfigError, match=r"part-1\.parquet was removed while the input was "
                                          "listed"):
        corpus_module.list_local_corpus(str(corpus), "text", {}, skipped)
    assert skipped == []


@pytest.mark.spark
def test_a_truncated_json_file_is_named_as_json(spark, tmp_path):
    """A cut-off .json.gz among JSON lines: the one line names the file and its format."""
    import gzip

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = "".join(json.dumps({"text": r}) + "\n" for r in normal_rows()).encode()
    (corpus / "a.json.gz").write_bytes(gzip.compress(lines))
    (corpus / "b.json.gz").write_bytes(gzip.compress(lines)[:40])
    cfg = Config(input=str(corpus), input_format="json", output=str(tmp_path / "words"))
    with pytest.raises(ConfigError, match=r"b\.json\.gz is not a readable JSON lines file "
                                          r"\(.+\); fix or remove it"):
        count_words(spark, cfg)


@pytest.mark.spark
def test_json_lines_lose_no_row_silently(spark, tmp_path):
    """A plain .json file cut off mid-record is an error naming it (Spark would read the cut
    line as a null row), with or without --ignore-corrupt-files; a row longer than Jackson's
    default 20 M characters is read whole, and its word left out and counted (Spark would
    read it as a null row too)."""
    rows = normal_rows()
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "a.json").write_text("".join(json.dumps({"text": r}) + "\n" for r in rows[:5])
                                + '{"text": "cut off mid')
    for skip in (False, True):
        cfg = Config(input=str(cut), input_format="json", output=str(tmp_path / f"w{skip}"),
                     ignore_corrupt_files=skip)
        with pytest.raises(ConfigError, match=r"a\.json is not a readable JSON lines file "
                                              r"\(a malformed record.*\); fix or remove it"):
            count_words(spark, cfg)
        assert not (tmp_path / f"w{skip}").exists()
    long = tmp_path / "long"
    long.mkdir()
    big = [*rows[:25], "a" * 25_000_000, *rows[25:]]
    (long / "a.json").write_text("".join(json.dumps({"text": r}) + "\n" for r in big))
    wt = count_words(spark, Config(input=str(long), input_format="json",
                                   output=str(tmp_path / "words")))
    stats = json.loads((tmp_path / "words" / "stats.json").read_text())
    assert stats["rows"] == 51 and stats["null_rows"] == 0, stats
    left = wt.meta["left_out"]
    assert (left["long_words"], left["long_word_bytes"], left["rows_with_long_words"]) == \
        (1, 25_000_000, 1)
    assert_word_table(tmp_path / "words", naive_count([big], max_word_bytes=1024))


@pytest.mark.spark
def test_a_json_array_says_the_input_must_be_json_lines(spark, tmp_path):
    """A pretty-printed JSON file (an array of objects): Spark's reader makes one column,
    _corrupt_record; the error said the text column was missing, not what to do."""
    (tmp_path / "in").mkdir()  # a manifest first by name, then good JSON lines
    (tmp_path / "in" / "a.json").write_text(json.dumps([{"text": r} for r in normal_rows(3)],
                                                      indent=2))
    (tmp_path / "in" / "b.json").write_text(
        "".join(json.dumps({"text": r}) + "\n" for r in normal_rows(3)))
    with pytest.raises(ConfigError, match=r"^config key 'input': \S*in/a\.json has no record "
                                          r"Spark's JSON reader could read .*: JSON input must "
                                          r"be JSON lines, one object per line.*move it out"):
        count_words(spark, Config(input=str(tmp_path / "in"), input_format="json",
                                  output=str(tmp_path / "w")))


@pytest.mark.spark
def test_a_session_that_skips_corrupt_files_does_not_drop_one_silently(spark, tmp_path,
                                                                        caplog):
    """A session with spark.sql.files.ignoreCorruptFiles=true (a cluster default, --conf):
    it skipped a damaged file's rows with nothing listed and the run succeeded. The count
    and the encode read by ignore_corrupt_files alone (warned once), and the session's
    setting is its own again after."""
    import gzip
    import logging

    from pipeline.count import corpus as corpus_module
    from pipeline.encode_corpus import encode_corpus

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = "".join(json.dumps({"text": r}) + "\n" for r in normal_rows()).encode()
    (corpus / "a.json.gz").write_bytes(gzip.compress(lines))
    (corpus / "b.json.gz").write_bytes(b"not gzip at all!")
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "a.json.gz").write_bytes(gzip.compress(lines))
    key = "spark.sql.files.ignoreCorruptFiles"
    caplog.set_level(logging.WARNING, logger="pipeline")
    spark.conf.set(key, "true")
    try:
        cfg = Config(input=str(corpus), input_format="json", output=str(tmp_path / "words"))
        with pytest.raises(ConfigError, match=r"b\.json\.gz is not a readable JSON lines"):
            count_words(spark, cfg)
        assert spark.conf.get(key) == "true"
        assert caplog.text.count(f"{key} is true in this Spark session: not for the "
                                 "corpus") == 1
        cfg.ignore_corrupt_files = True
        left_out = count_words(spark, cfg).meta["left_out"]["unreadable_files"]
        assert [f.rsplit("/", 1)[1] for f in left_out] == ["b.json.gz"]
        run = tmp_path / "run"
        train(spark, Config(input=str(tmp_path / "good"), input_format="json",
                            output=str(run), vocab_size=270, progress_bar=False))
        with pytest.raises(ConfigError, match=r"b\.json\.gz is not a readable JSON lines"):
            encode_corpus(spark, Config(input=str(corpus), input_format="json",
                                        tokenizer=str(run), output=str(tmp_path / "enc"),
                                        progress_bar=False))
        assert spark.conf.get(key) == "true"
        assert caplog.text.count(f"{key} is true in this Spark session") == 1
        corpus_module._TOLD.clear()  # (once per application: as if the encode came first)
        caplog.clear()
        with pytest.raises(ConfigError, match=r"b\.json\.gz is not a readable JSON lines"):
            encode_corpus(spark, Config(input=str(corpus), input_format="json",
                                        tokenizer=str(run), output=str(tmp_path / "enc"),
                                        progress_bar=False))
        assert "(the encode job reads every row: fix or remove them)" in caplog.text
        assert "--ignore-corrupt-files" not in caplog.text  # (not a flag of the encode's)
        # a word table read through Spark (remote tables, the Spark engine): not skipped
        from pipeline.spark_session import file_reader

        words = tmp_path / "words-data"
        words.mkdir()
        for name in ("a", "b"):
            pq.write_table(pa.table({"word": [b"x"], "count": [1]}), words / f"{name}.parquet")
        whole = (words / "b.parquet").read_bytes()
        (words / "b.parquet").write_bytes(whole[: len(whole) // 2])
        assert spark.read.parquet(str(words)).count() == 1  # (what the session does)
        with pytest.raises(Exception, match="b.parquet"):
            file_reader(spark).parquet(str(words)).count()
    finally:
        spark.conf.unset(key)


@pytest.mark.spark
def test_bad_shards_in_partitioned_or_globbed_inputs_and_bad_folders(spark, tmp_path):
    """The input Spark lists (nested lang=xx folders, a glob) is read by pyarrow too: a
    truncated shard there is one line naming it, or skipped with ignore_corrupt_files; a
    shard whose text column is not text is named; an empty or unreadable folder is one line
    before any Spark work."""
    rows = normal_rows()
    nested = tmp_path / "nested"
    for lang in ("en", "fr"):
        (nested / f"lang={lang}").mkdir(parents=True)
        pq.write_table(pa.table({"text": rows}), nested / f"lang={lang}" / "part-0.parquet")
    bad = nested / "lang=fr" / "part-0.parquet"
    bad.write_bytes(bad.read_bytes()[:200])
    for source in (nested, f"{nested}/*/*.parquet"):
        cfg = Config(input=str(source), output=str(tmp_path / "run"), vocab_size=300,
                     progress_bar=False)
        with pytest.raises(ConfigError, match=r"lang=fr/part-0\.parquet is not a readable "
                                              r"Parquet file \(.*magic bytes"):
            train(spark, cfg)
    cfg.ignore_corrupt_files = True
    train(spark, cfg)
    stats = json.loads((tmp_path / "run" / "stats.json").read_text())
    assert [f.rsplit("/", 2)[1] for f in stats["left_out_of_training"]["unreadable_files"]] \
        == ["lang=fr"]
    assert json.loads((tmp_path / "run" / "words" / "stats.json").read_text())["rows"] \
        == len(rows)
    # a shard whose text column holds numbers, next to a good one (Spark lists them: nested)
    mixed = tmp_path / "mixed"
    (mixed / "lang=en").mkdir(parents=True)
    pq.write_table(pa.table({"text": rows}), mixed / "lang=en" / "part-0.parquet")
    pq.write_table(pa.table({"text": list(range(5))}), mixed / "lang=en" / "part-1.parquet")
    with pytest.raises(ConfigError, match=r"column 'text' is int64 in \S*lang=en/part-1\.parquet, "
                                          r"not string or binary"):
        train(spark, Config(input=str(mixed), output=str(tmp_path / "r2"), vocab_size=300,
                            progress_bar=False))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no Parquet files under \S*empty \(an empty "):
        train(spark, Config(input=str(tmp_path / "empty"), output=str(tmp_path / "r3"),
                            vocab_size=300, progress_bar=False))


def test_the_first_shard_corrupt_where_spark_reads_the_schema(spark, tmp_path):
    """Spark takes a Parquet schema from one file's footer: with ignore_corrupt_files and that
    file corrupt, it had none (UNABLE_TO_INFER_SCHEMA), and the job said the partitions were
    "subfolders that are not partitions". Now the file is skipped and listed, whichever file
    it is, through a glob, partition folders or Spark's reader; with every file corrupt, and
    with partition folders of different keys, one line that says so."""
    rows = normal_rows()
    lake = tmp_path / "lake"
    for lang in ("de", "en"):  # the bad one sorts first
        (lake / f"lang={lang}").mkdir(parents=True)
        pq.write_table(pa.table({"text": rows}), lake / f"lang={lang}" / "part-0.parquet")
    bad = lake / "lang=de" / "part-0.parquet"
    bad.write_bytes(bad.read_bytes()[:200])
    for i, (source, reader) in enumerate([(lake, "auto"), (f"{lake}/*/*.parquet", "auto"),
                                          (lake, "spark")]):
        run = tmp_path / f"run{i}"
        train(spark, Config(input=str(source), output=str(run), vocab_size=300,
                            count_reader=reader, ignore_corrupt_files=True, progress_bar=False))
        stats = json.loads((run / "stats.json").read_text())
        assert [f.rsplit("/", 2)[1] for f in stats["left_out_of_training"]["unreadable_files"]] \
            == ["lang=de"], (source, reader)
        assert json.loads((run / "words" / "stats.json").read_text())["rows"] == len(rows)
    good = lake / "lang=en" / "part-0.parquet"
    good.write_bytes(good.read_bytes()[:200])
    with pytest.raises(ConfigError, match=r"^config key 'input': no file of \S+lake could be "
                                          r"read: each was skipped as corrupt"):
        train(spark, Config(input=str(lake), output=str(tmp_path / "none"), vocab_size=300,
                            count_reader="spark", ignore_corrupt_files=True, progress_bar=False))
    keys = tmp_path / "keys"
    for sub in ("lang=en", "year=2020"):
        (keys / sub).mkdir(parents=True)
        pq.write_table(pa.table({"text": rows}), keys / sub / "part-0.parquet")
    with pytest.raises(ConfigError, match=r"^config key 'input': the partition folders under "
                                          r"\S+keys are named after different columns"):
        train(spark, Config(input=str(keys), output=str(tmp_path / "k"), vocab_size=300,
                            progress_bar=False))
    # a partition folder beside a plain one: Spark's CONFLICTING_DIRECTORY_STRUCTURES is our
    # line naming the plain one's file; an empty folder under Spark's reader is not "corrupt"
    (keys / "misc").mkdir()
    pq.write_table(pa.table({"text": rows}), keys / "misc" / "part-0.parquet")
    (keys / "year=2020" / "part-0.parquet").unlink()
    with pytest.raises(ConfigError, match=r"^config key 'input': 1 files under \S+keys would not "
                                          r"be read, in subfolders that are not partitions "
                                          r"\(key=value\), e\.g\. \S+/keys/misc/part-0\.parquet"):
        train(spark, Config(input=str(keys), output=str(tmp_path / "k2"), vocab_size=300,
                            count_reader="spark", progress_bar=False))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "_SUCCESS").write_text("")
    with pytest.raises(ConfigError, match=r"^config key 'input': no Parquet files under "
                                          r"\S+empty \(an empty folder"):
        train(spark, Config(input=str(tmp_path / "empty"), output=str(tmp_path / "e"),
                            vocab_size=300, count_reader="spark", ignore_corrupt_files=True,
                            progress_bar=False))


def lake_with_a_file_damaged_part_way(folder, damaged_first: bool = False) -> None:
    """part-0.parquet: good rows; part-1.parquet: 200 rows in 4 row groups, the second one's
    data damaged (its footer reads). ``damaged_first``: the other way round (the good rows'
    first keys are then packed with the row numbers' width, which the damaged file must not
    set)."""
    folder.mkdir()
    good, bad = ("part-1", "part-0") if damaged_first else ("part-0", "part-1")
    pq.write_table(pa.table({"text": normal_rows()}), folder / f"{good}.parquet")
    bad = folder / f"{bad}.parquet"
    pq.write_table(pa.table({"text": [f"qzqz vxvx {i}" for i in range(200)]}), bad,
                   row_group_size=50)
    damage_row_group(bad, 1)


def damage_row_group(path, group: int) -> None:
    """Overwrite one row group's data pages: the footer still reads, that data does not."""
    chunk = pq.read_metadata(path).row_group(group).column(0)
    data = bytearray(path.read_bytes())
    start = chunk.data_page_offset
    data[start:start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    path.write_bytes(bytes(data))


@pytest.mark.spark
def test_a_failed_recount_leaves_the_earlier_run_complete(spark, tmp_path, caplog):
    """A scheduled rerun whose recount fails (a damaged shard was added; the same holds for a
    kill or an out-of-memory error while counting) leaves yesterday's tokenizer as it was:
    its run.json goes only when the new word table replaces the old one. A rerun over other
    paths says why it recounts."""
    lake = tmp_path / "lake"
    lake.mkdir()
    pq.write_table(pa.table({"text": normal_rows()}), lake / "part-0.parquet")
    run = tmp_path / "run"
    cfg = Config(input=str(lake), output=str(run), vocab_size=300, progress_bar=False)
    train(spark, cfg)
    before = {n: (run / n).read_bytes() for n in ("run.json", "merges.txt", "tokenizer.json")}
    bad = lake / "part-1.parquet"
    pq.write_table(pa.table({"text": [f"qzqz vxvx {i}" for i in range(200)]}), bad,
                   row_group_size=50)
    damage_row_group(bad, 1)
    with pytest.raises(ConfigError, match=r"part-1\.parquet is not a readable Parquet file"):
        train(spark, cfg)
    assert {n: (run / n).read_bytes() for n in before} == before
    assert Tokenizer.load(str(run)).encode("hello world")  # still a complete run
    bad.unlink()
    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(pa.table({"text": normal_rows(30)}), other / "part-0.parquet")
    caplog.set_level("INFO", logger="pipeline")
    train(spark, Config(input=str(other), output=str(run), vocab_size=300,
                        progress_bar=False))
    assert re.search(r"recounting: the word table at \S+ was counted with another input "
                     r"\(input '\S*lake' then, '\S*other' now\)", caplog.text), caplog.text


@pytest.mark.spark
@pytest.mark.parametrize("merge", ["driver", "spark"])
def test_a_file_damaged_part_way_is_left_out_whole_whatever_the_partitioning(spark, tmp_path,
                                                                             merge):
    """Its footer reads, one row group's data does not: by default one error naming the file;
    with ignore_corrupt_files every row
    of the file is left out, also the row groups other tasks read, so that the word table is
    the same for any number of tasks (it counted 50 or 150 of its rows before), first keys
    included (the rows other tasks read of it set how wide the good file's were packed)."""
    from pipeline.count.word_count import count_words

    lake_with_a_file_damaged_part_way(tmp_path / "in", damaged_first=True)
    tables = []
    for parts in (1, 4):
        out = tmp_path / f"w{parts}"
        # by default: one line naming the file and what is wrong, nothing written
        with pytest.raises(ConfigError, match=r"^config key 'input': \S*/part-0\.parquet is "
                                              r"not a readable Parquet file \(.+\); fix or "
                                              r"remove it, or pass --ignore-corrupt-files"):
            count_words(spark, Config(input=str(tmp_path / "in"), output=str(out),
                                      num_partitions=parts, count_merge=merge))
        assert not [f.name for f in tmp_path.iterdir()  # no table, staging or lease left
                    if f.name.startswith((out.name, f".{out.name}"))]
        count_words(spark, Config(input=str(tmp_path / "in"), output=str(out),
                                  num_partitions=parts, ignore_corrupt_files=True,
                                  count_merge=merge))
        table = pq.read_table(out / "data").sort_by("first_seen")
        tables.append(table.to_pylist())
        stats = json.loads((out / "stats.json").read_text())
        assert [f.rsplit("/", 1)[1] for f in stats["skipped_files"]] == ["part-0.parquet"]
        assert b"qzqz" not in {r["word"].strip() for r in tables[-1]}
        # the statistics leave out what was read of it too: the good file's rows and words
        good = normal_rows()
        assert stats["rows"] == len(good), stats
        assert stats["bytes"] == sum(len(t.encode()) for t in good), stats
        assert stats["words"] == sum(r["count"] for r in tables[-1]), stats
    assert tables[0] == tables[1]


@pytest.mark.spark
def test_a_task_error_ends_the_job_without_waiting_for_the_other_tasks(spark):
    """A task that reports an error no retry mends (TaskErrors) ends normally; the driver
    cancels the job at once and raises that error, though another task would run a minute."""
    from pipeline.count.corpus import UnreadableFile
    from pipeline.spark_session import TaskErrors, job_group

    sc = spark.sparkContext
    errors = TaskErrors(sc)

    def task(ids):
        for i in ids:
            if i == 1:
                errors.report(i, UnreadableFile.at("/lake/b.parquet", "bad page"))
            else:
                time.sleep(60)
            yield i

    t0 = time.time()
    expected = r"^spark-bpe: unreadable input file /lake/b\.parquet :: bad page$"
    with job_group(sc, "test"), pytest.raises(UnreadableFile, match=expected), \
            errors.raising(sc, UnreadableFile):
        sc.parallelize([0, 1], 2).mapPartitions(task).count()
    assert time.time() - t0 < 20
    # no report: the job's own result or error, untouched
    with job_group(sc, "test"), TaskErrors(sc).raising(sc, UnreadableFile):
        assert sc.parallelize([0, 1], 2).count() == 2



def test_an_interrupt_during_a_job_with_a_task_error_stays_an_interrupt():
    """A task's reported error replaced whatever the job ended with, a Ctrl-C or a SIGTERM's
    SystemExit too: the run then ended with exit 2 (a bad input) instead of 130/143."""
    from pipeline.count.corpus import UnreadableFile
    from pipeline.spark_session import TaskErrors

    class Accumulator:
        value: dict = {}

        def add(self, found: dict) -> None:
            self.value = {**self.value, **found}

    class Context:  # no job group: nothing to cancel or wait for
        def accumulator(self, value, param):
            return Accumulator()

        def getLocalProperty(self, key):
            return None

    sc = Context()
    errors = TaskErrors(sc)
    errors.report(3, UnreadableFile.at("/lake/b.parquet", "bad page"))
    for interrupt in (KeyboardInterrupt(), SystemExit(143)):
        with pytest.raises(type(interrupt)), errors.raising(sc, UnreadableFile):
            raise interrupt
    with pytest.raises(UnreadableFile, match="b.parquet"), errors.raising(sc, UnreadableFile):
        raise RuntimeError("the job failed: a task was cancelled")


@pytest.mark.spark
@pytest.mark.slow
def test_a_damaged_file_is_one_attempt_and_one_line_where_spark_retries_tasks(tmp_path, procs):
    """On a cluster Spark runs a failed task again (spark.task.maxFailures = 4), each time
    with a Python traceback in the log. A file whose data cannot be read fails the same way
    every time: the count's and the encode's tasks report it instead of failing, and the job
    ends after one attempt with one line naming the file (local[2,4]: 4 attempts per task, as
    on a cluster)."""
    lake = tmp_path / "lake"
    lake_with_a_file_damaged_part_way(lake)

    def quiet_failure(p, name: str) -> None:
        assert p.wait(120) == 2, p.tail()
        log = p.log()
        assert re.search(rf"error: config key 'input': \S+/{name} is not a readable Parquet "
                         rf"file", log), log[-3000:]
        assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
        # no task failed (tasks still running when the job ended were cancelled)
        assert all("TaskKilled" in line for line in log.splitlines()
                   if "Lost task" in line), log[-3000:]

    p = submit(["--input", str(lake), "--output", str(tmp_path / "run"), "--vocab-size", "300"],
               tmp_path, "count", master="local[2,4]", env=job_env())
    procs.append(p)
    quiet_failure(p, "part-1.parquet")
    good = tmp_path / "good"
    good.mkdir()
    (lake / "part-0.parquet").rename(good / "part-0.parquet")
    p = submit(["--input", str(good), "--output", str(tmp_path / "run"), "--vocab-size", "300"],
               tmp_path, "train", env=job_env())
    procs.append(p)
    assert p.wait(120) == 0, p.tail()
    p = submit(["--tokenizer", str(tmp_path / "run"), "--input", str(lake), "--output",
                str(tmp_path / "encoded"), "--encode-io", "arrow"], tmp_path, "encode",
               master="local[2,4]", env=job_env(), job=ENCODE)
    procs.append(p)
    quiet_failure(p, "part-1.parquet")
    assert not (tmp_path / "encoded").exists()


@pytest.mark.spark
def test_a_table_that_skipped_a_file_is_not_reused_by_a_run_that_does_not_skip(spark, tmp_path,
                                                                             caplog):
    """A run with --ignore-corrupt-files left a damaged file out (its footer reads: the input
    fingerprint is the same); the same run without the flag counts again and stops on that
    file, as it would have with no earlier table, and the earlier run stays complete."""
    lake_with_a_file_damaged_part_way(tmp_path / "in")
    run = tmp_path / "run"
    caplog.set_level("INFO", logger="pipeline")

    def config(skip: bool) -> Config:
        return Config(input=str(tmp_path / "in"), output=str(run), vocab_size=300,
                      progress_bar=False, ignore_corrupt_files=skip)

    train(spark, config(True))
    merges = (run / "merges.txt").read_text()
    with pytest.raises(ConfigError, match=r"part-1\.parquet is not a readable Parquet file"):
        train(spark, config(False))
    assert "left out 1 unreadable files (--ignore-corrupt-files), which this run does not " \
           "skip" in caplog.text
    caplog.clear()
    train(spark, config(True))  # skipping again: the table and the run stand
    assert "reusing the word table already counted" in caplog.text
    assert "is already complete" in caplog.text and (run / "merges.txt").read_text() == merges


@pytest.mark.spark
def test_a_corrupt_shard_arriving_before_a_skipping_rerun_is_listed_not_hidden(spark, tmp_path,
                                                                               caplog):
    """A nightly run with --ignore-corrupt-files: a truncated shard that arrived since is left
    out of the listing, so the input's fingerprint was unchanged and the table was reused, the
    file in no stats.json and no log line. Now the run counts again and lists it; the next
    night, with nothing new, reuses the table."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    lake, run = tmp_path / "lake", tmp_path / "run"
    lake.mkdir()
    pq.write_table(pa.table({"text": ["the good rows of a lake"] * 40}), lake / "part-0.parquet")
    caplog.set_level("INFO", logger="pipeline")
    cfg = Config(input=str(lake), output=str(run), vocab_size=280, progress_bar=False,
                 ignore_corrupt_files=True)
    train(spark, cfg)
    merges = (run / "merges.txt").read_text()
    (lake / "part-1.parquet").write_bytes((lake / "part-0.parquet").read_bytes()[:200])
    caplog.clear()
    train(spark, cfg)
    assert "recounting: 1 unreadable input files that the word table" in caplog.text
    skipped = json.loads((run / "stats.json").read_text())["left_out_of_training"]
    assert [f.rsplit("/", 1)[-1] for f in skipped["unreadable_files"]] == ["part-1.parquet"]
    assert (run / "merges.txt").read_text() == merges
    caplog.clear()
    train(spark, cfg)
    assert "reusing the word table already counted" in caplog.text


@pytest.mark.spark
def test_spark_s_reader_lists_unreadable_files_not_empty_ones(spark, tmp_path):
    """Under --count-reader spark, Spark skips an unreadable file silently: the files that
    gave no rows are the skipped ones, but for a valid Parquet file with no rows (an empty
    shard a writer left), which is not listed as unreadable."""
    from pipeline.count.word_count import count_words

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": normal_rows()}), tmp_path / "in" / "part-0.parquet")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}),
                   tmp_path / "in" / "part-1.parquet")
    whole = (tmp_path / "in" / "part-0.parquet").read_bytes()
    (tmp_path / "in" / "part-2.parquet").write_bytes(whole[: len(whole) // 2])
    wt = count_words(spark, Config(input=str(tmp_path / "in"), output=str(tmp_path / "w"),
                                   count_reader="spark", ignore_corrupt_files=True))
    assert [f.rsplit("/", 1)[1] for f in wt.meta["left_out"]["unreadable_files"]] == \
        ["part-2.parquet"]


@pytest.mark.spark
def test_files_in_plain_subfolders_are_an_error_not_a_corpus_read_in_part(spark, tmp_path):
    """Spark's readers leave out files in subfolders that are not key=value partitions: next
    to a file, the run trained on that file alone (and a later subfolder changed nothing);
    alone, the error was Spark's UNABLE_TO_INFER_SCHEMA. Now one line names a file left out,
    for train (either reader) and encode; a glob reads them all."""
    from pipeline.encode_corpus import encode_corpus

    rows = normal_rows()
    lake = tmp_path / "lake"
    (lake / "sub").mkdir(parents=True)
    (lake / "_hidden").mkdir()
    pq.write_table(pa.table({"text": rows[:25]}), lake / "top.parquet")
    pq.write_table(pa.table({"text": rows[25:]}), lake / "sub" / "nested.parquet")
    pq.write_table(pa.table({"text": ["never read"]}), lake / "_hidden" / "x.parquet")
    message = (r"^config key 'input': 1 files under \S+ would not be read, in subfolders that "
               r"are not partitions \(key=value\), e.g. \S+/lake/sub/nested\.parquet; give "
               r"each folder as an input \(--input \S+/sub,\.\.\.\) or a glob")
    for reader in ("auto", "spark"):
        with pytest.raises(ConfigError, match=message):
            train(spark, Config(input=str(lake), output=str(tmp_path / f"r-{reader}"),
                                vocab_size=300, count_reader=reader, progress_bar=False))
    run = tmp_path / "ok"
    train(spark, Config(input=f"{lake}/*.parquet,{lake}/sub", output=str(run), vocab_size=300,
                        progress_bar=False))
    assert json.loads((run / "words" / "stats.json").read_text())["rows"] == len(rows)
    with pytest.raises(ConfigError, match=message):
        encode_corpus(spark, Config(input=str(lake), tokenizer=str(run),
                                    output=str(tmp_path / "enc")))
    (lake / "top.parquet").unlink()  # subfolders alone: the same line, not Spark's error
    with pytest.raises(ConfigError, match=message):
        train(spark, Config(input=str(lake), output=str(tmp_path / "r-alone"), vocab_size=300,
                            progress_bar=False))


def test_files_in_a_linked_subfolder_are_found_left_out_too(tmp_path):
    """A subfolder that is a symbolic link (to shards kept elsewhere) is listed by Hadoop as
    a folder, whose files Spark's reader leaves out as it does a real one's: the check walked
    past the link, and the run trained on the top file alone, saying nothing. A link back up
    the tree is walked once."""
    from pipeline.count.corpus import _refuse_files_left_out, normalize_path

    lake, shards = tmp_path / "lake", tmp_path / "shards"
    lake.mkdir()
    shards.mkdir()
    pq.write_table(pa.table({"text": ["top"]}), lake / "top.parquet")
    pq.write_table(pa.table({"text": ["nested"]}), shards / "nested.parquet")
    (lake / "sub").symlink_to(shards, target_is_directory=True)
    (shards / "up").symlink_to(lake, target_is_directory=True)  # a loop
    read = [normalize_path(f"file://{lake}/top.parquet")]
    with pytest.raises(ConfigError, match=r"1 files under \S+ would not be read, in subfolders "
                                          r"that are not partitions \(key=value\), e.g. "
                                          r"\S+/lake/sub/nested\.parquet"):
        _refuse_files_left_out(None, "config key 'input'", str(lake), read)


def test_an_unreadable_input_folder_is_a_config_error(tmp_path, monkeypatch):
    from pipeline.count import corpus

    (tmp_path / "locked").mkdir()

    def denied(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(corpus.os, "scandir", denied)  # (chmod 000 does not stop root)
    with pytest.raises(ConfigError, match=r"^config key 'input': cannot read \S*locked: "
                                          r"permission denied"):
        corpus.list_local_corpus(str(tmp_path / "locked"), "text")


@pytest.mark.spark
def test_invalid_utf8_in_a_string_column_is_kept_byte_exact(spark, tmp_path):
    """A Parquet string column written without UTF-8 checks (lone surrogates, stray bytes):
    counted, trained and encoded like a binary column's bytes, not a crash."""
    from pipeline.encode_corpus import encode_corpus

    bad = [b"\xed\xa0\x80 lone surrogate", b"bad \xff\xfe utf8 \xc3"]
    values = [r.encode() for r in normal_rows()] + bad
    offsets = pa.array([0, *__import__("itertools").accumulate(map(len, values))], pa.int32())
    column = pa.Array.from_buffers(pa.string(), len(values),
                                   [None, offsets.buffers()[1], pa.py_buffer(b"".join(values))])
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": column}), tmp_path / "in" / "part-0.parquet")
    run = tmp_path / "run"
    cfg = Config(input=str(tmp_path / "in"), output=str(run), vocab_size=300,
                 progress_bar=False)
    train(spark, cfg)
    assert json.loads((run / "words" / "stats.json").read_text())["invalid_utf8_rows"] == 2
    assert_word_table(run / "words", naive_count([values], cfg.pattern, cfg.special_tokens,
                                                 max_word_bytes=cfg.max_word_bytes))
    res = encode_corpus(spark, Config(input=str(tmp_path / "in"), tokenizer=str(run),
                                      output=str(tmp_path / "enc")))
    assert res.stats["stats"]["invalid_utf8_rows"] == 2
    ids = pq.read_table(tmp_path / "enc").sort_by("row").column("ids").to_pylist()
    tok = Tokenizer.load(str(run))
    assert [tok.decode_bytes(i) for i in ids] == values


@pytest.mark.spark
@pytest.mark.slow
def test_bad_rows_end_a_real_job_within_a_minute(tmp_path, procs):
    """All of them, and 4 MB of base64, among normal rows under spark-submit (each one alone
    through count, train and encode: the test above)."""
    import base64
    import os

    bad = [*BAD_ROWS.values(), base64.b64encode(os.urandom(4_000_000)).decode()]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = normal_rows()
    pq.write_table(pa.table({"text": rows[:25] + bad + rows[25:]}), corpus / "part-0.parquet")
    t0 = time.time()  # (from the submit: the JVM's start counts)
    p = submit(["--input", str(corpus), "--output", str(tmp_path / "run"),
                "--vocab-size", "600"], tmp_path, "bad-rows", env=job_env())
    procs.append(p)
    assert p.wait(60) == 0, p.tail()
    assert time.time() - t0 < 60
    left = json.loads((tmp_path / "run" / "stats.json").read_text())["left_out_of_training"]
    assert left["long_words"] == 3  # spaces, letters, punctuation; digits and base64 split


# random text and random bytes, end to end ----------------------------------------------------

@pytest.mark.spark
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.text(max_size=200) | st.binary(max_size=200).map(
    lambda b: b.decode("utf-8", "surrogateescape")), min_size=1, max_size=30),
       st.sampled_from(["cl100k", "gpt2", "o200k"]))
def test_any_text_or_bytes_count_train_encode_and_decode_back(spark, tmp_path_factory, rows,
                                                              pattern):
    """Random Unicode and random bytes (a binary column: invalid UTF-8 kept byte-exact) go
    through count -> train -> encode -> decode without an exception, byte for byte; the word
    table is the naive count's and the merges are the oracle's."""
    d = tmp_path_factory.mktemp("fuzz")
    data = [r.encode("utf-8", "surrogateescape") for r in rows]
    (d / "in").mkdir()  # (an output inside the input is refused: validate, not used here)
    pq.write_table(pa.table({"text": pa.array(data, pa.binary())}), d / "in" / "part-0.parquet")
    cfg = Config(input=str(d / "in"), output=str(d / "run"), vocab_size=300, pattern=pattern,
                 special_tokens=[], progress_bar=False, min_pair_count=1)
    naive = naive_count([data], pattern, max_word_bytes=cfg.max_word_bytes)
    try:
        merges = train(spark, cfg).merges
    except ConfigError as exc:  # nothing to train on is the one acceptable refusal
        assert "has no words" in str(exc) and not naive.counts
        return
    assert_word_table(d / "run" / "words", naive)
    assert merges == oracle_merges(d / "in", cfg)
    tok = Tokenizer.load(str(d / "run"))
    # the encode job's encoder too: tiktoken where it takes the row, else the reference
    plan = load_plan(None, Config(tokenizer=str(d / "run"), output=str(d / "enc")))
    assert plan.engine == "tiktoken"
    job_encoder = BatchEncoder(plan)
    for raw, text in zip(data, rows):
        ids = tok.encode(text, disallowed_special=())
        assert tok.decode_bytes(ids) == raw
        valid = raw.decode("utf-8", "replace").encode() == raw
        assert job_encoder.encode(text, valid)[0] == ids


@pytest.mark.parametrize("args,message", [
    (["--special-tokens", "<|a|>,<|a|>"], "config key 'special_tokens' has duplicates"),
    # an empty item is an error, as in a config file (--special-tokens "$A,$B" with B unset
    # would train without B, silently)
    (["--special-tokens", "<x>,"], "config key 'special_tokens' has an empty token"),
    (["--special-tokens", "<|a,<|a|>"], "config key 'special_tokens': '<|a' is a prefix of "
                                        "'<|a|>'"),
    (["--special-tokens", "<|a|>,e"], "config key 'special_tokens': 'e' is also the token of "
                                      "a byte"),
    (["--special-tokens", "e", "--alphabet", "chars"], None),
    (["--alphabet", "chars", "--vocab-size", "2"], "config key 'vocab_size' = 2 leaves no "
     "merges: it must be more than 1 character + 1 special tokens = 2"),  # (before counting)
    (["--pattern", "(?P<x"], "config key 'pattern': pattern '(?P<x' does not compile"),
    (["--pattern", "[a-"], "does not compile"),
    (["--pattern", "x*"], "config key 'pattern': pattern 'x*' matches the empty string"),
    (["--pattern", r"\b"], "matches the empty string (at 0 in 'a')"),
    (["--pattern", r"(?=\w)|\w+"], "matches the empty string"),
    (["--max-word-bytes", "-1"], "config key 'max_word_bytes' must be >= 0"),
    # a name in another case or with a space was a regex matching only itself: next to no
    # words, the rest of the corpus dropped in silence (found by review)
    (["--pattern", "CL100K"], "config key 'pattern': pattern 'CL100K' is not a name"),
    (["--pattern", "gpt2 "], "pattern 'gpt2 ' is not a name (the names are 'gpt2'"),
    (["--pattern", "None"], "pattern 'None' is not a name"),
    (["--pattern", " "], "pattern ' ' matches no letter of"),
    (["--pattern", r"\w+|[^\w\s]+"], None),  # (whitespace dropped: a choice, not an accident)
    # a thread's wait overflows past ~1e10 s (the lease was never renewed), spins near 0
    (["--heartbeat-seconds", "4e10"], "config key 'heartbeat_seconds' must be a number of "
                                      "seconds from 0.01 to 1e+07"),
    (["--lease-timeout-seconds", "1e-300"], "config key 'lease_timeout_seconds' must be"),
    (["--checkpoint-every-seconds", "nan"], "config key 'checkpoint_every_seconds' must be"),
    (["--shuffle-partitions", "99999999999999999999"],  # (a Java int in Spark)
     "config key 'shuffle_partitions' must be at most 2147483647"),
    (["--num-partitions", "3000000000"], "config key 'num_partitions' must be at most"),
    (["--special-tokens", " "], "config key 'special_tokens' has a token of whitespace only"),
    (["--text-column", " "], "config key 'text_column' is only whitespace (' ')"),
    (["--checkpoint-dir", " "], "config key 'checkpoint_dir' is only whitespace"),
    (["--vocab-size", "nope"], "config key 'vocab_size': expected int"),
])
def test_bad_settings_are_one_config_error(tmp_path, args, message):
    vocab = [] if "--vocab-size" in args else ["--vocab-size", "300"]  # (a flag goes once)
    argv = ["--input", str(SAMPLE), "--output", str(tmp_path / "o"), *vocab, *args]
    if message is None:
        validate(resolve(argv), "train")
        return
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(resolve(argv), "train")


def test_comma_lists_on_the_command_line_take_no_spaces_around_their_items(tmp_path):
    """``--special-tokens '<|a|>, <|b|>'`` made the token ' <|b|>' (found by review)."""
    argv = ["--input", str(SAMPLE), "--output", str(tmp_path / "o"), "--vocab-size", "300",
            "--special-tokens", "<|endoftext|>, <|pad|>"]
    assert validate(resolve(argv), "train").special_tokens == ["<|endoftext|>", "<|pad|>"]
    enc = ["--tokenizer", str(tmp_path), "--input", str(SAMPLE), "--output", str(tmp_path / "e")]
    assert resolve([*enc, "--key-columns", "id, lang"], job="encode").key_columns == \
        ["id", "lang"]
    with pytest.raises(ConfigError, match="'text' is the text column"):
        validate(resolve([*enc, "--key-columns", "text"], job="encode"), "encode")


def test_a_saved_config_loads_back_in_a_directory_whose_name_has_a_comma(tmp_path,
                                                                      monkeypatch):
    """Made absolute, a relative source under ``/x/a,b`` became two sources on loading back
    (the Python API failed there: "path does not exist: /x/a"); it stays relative instead."""
    import shutil

    where = tmp_path / "a,b"
    shutil.copytree(SAMPLE, where / "sample")
    monkeypatch.chdir(where)
    cfg = validate(resolve(["--input", "sample", "--output", "o", "--vocab-size", "300"]),
                   "train")
    saved = json.loads(cfg.to_json("train"))
    assert saved["input"] == "sample" and saved["output"] == str(where / "o")
    assert validate(Config(**saved), "train").inputs == ["sample"]


_SETTING_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.lists(_SETTING_TEXT, max_size=4),
       pattern=st.one_of(st.sampled_from(["gpt2", "cl100k", "o200k"]), _SETTING_TEXT),
       alphabet=st.sampled_from(["bytes", "chars"]))
def test_any_special_tokens_or_pattern_are_accepted_or_one_config_error_line(
        tmp_path, tokens, pattern, alphabet):
    """Random special tokens and split patterns through a job's command line, as a scheduler
    passes them: each setting is either taken (the job's body runs) or refused with one
    `error: config key ...` line and exit 2 before the body; never a traceback or exit 1."""
    import contextlib
    import io

    from pipeline import cli

    argv = ["--input", str(SAMPLE), "--output", str(tmp_path / "o"), "--vocab-size", "600",
            "--alphabet", alphabet, f"--special-tokens={','.join(tokens)}",
            f"--pattern={pattern}"]
    ran = []
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli._run("train", "test", lambda cfg: ran.append(cfg) or 0, argv)
    lines = [ln for ln in err.getvalue().splitlines() if ln.startswith("error:")]
    assert "Traceback" not in err.getvalue()
    if code == 0:
        assert len(ran) == 1 and not lines
    else:
        assert code == 2 and not ran, err.getvalue()
        assert len(lines) == 1 and lines[0].startswith("error: config key '"), err.getvalue()
    assert not (tmp_path / "o").exists()


def test_a_text_column_in_no_local_parquet_file_is_an_error_before_any_spark_job(tmp_path):
    """Found from the footers the driver reads anyway (no Spark job, no task): named with the
    columns there are. In some files only, an error naming one of them (Spark's reader would
    give their rows as nulls: a shard written with another column name would be lost)."""
    from pipeline.count.corpus import list_local_corpus

    lake = tmp_path / "lake"
    lake.mkdir()
    for i in range(2):
        pq.write_table(pa.table({"doc": [f"a {i}"], "lang": ["en"]}), lake / f"p{i}.parquet")
    with pytest.raises(ConfigError, match=re.escape(
            f"config key 'text_column': column 'text' not in {lake} (columns: doc, lang)")):
        list_local_corpus(str(lake), "text", {})
    pq.write_table(pa.table({"text": ["b"]}), lake / "p2.parquet")
    with pytest.raises(ConfigError, match=re.escape(
            f"column 'text' is missing from 2 of the 3 files of {lake}, e.g. {lake}/p0.parquet "
            "(columns: doc, lang); their rows would be read as nulls and left out")):
        list_local_corpus(str(lake), "text", {})
    assert len(list_local_corpus(str(lake / "p2.parquet"), "text", {})) == 1
    for i in range(2):  # empty placeholders of another schema lose nothing: left out
        pq.write_table(pa.table({"id": pa.array([], pa.int64())}), lake / f"p{i}.parquet")
    assert [f.rsplit("/", 1)[1] for f in list_local_corpus(str(lake), "text", {})] == \
        ["p2.parquet"]
    (lake / "p2.parquet").unlink()
    with pytest.raises(ConfigError, match="column 'text' not in .* \\(columns: id\\)"):
        list_local_corpus(str(lake), "text", {})


@pytest.mark.spark
def test_a_shard_without_the_text_column_is_named_by_every_reader(spark, tmp_path):
    """Next to good shards, one written with another column name: the count (either reader,
    and with the folder nested so that Spark lists it) and the encode job (either path) stop
    with one error naming it, where they read its rows as nulls and left them out."""
    lake = tmp_path / "lake" / "year=2026"
    lake.mkdir(parents=True)
    pq.write_table(pa.table({"text": ["the cat sat on the mat"] * 20}), lake / "a.parquet")
    pq.write_table(pa.table({"body": ["words lost if read as nulls"] * 20}), lake / "b.parquet")
    good = lake / "a.parquet"
    train(spark, Config(input=str(good), output=str(tmp_path / "tok"), vocab_size=270,
                        progress_bar=False))
    missing = r"column 'text' is missing from 1 of the 2 files of .*b\.parquet \(columns: body\)"
    for source in (lake, tmp_path / "lake"):
        for reader in ("auto", "spark"):
            with pytest.raises(ConfigError, match=missing):
                count_words(spark, Config(input=str(source), output=str(tmp_path / "w"),
                                          count_reader=reader))
    from pipeline.encode_corpus import encode_corpus

    for io in ("arrow", "spark"):
        with pytest.raises(ConfigError, match=missing):
            encode_corpus(spark, Config(tokenizer=str(tmp_path / "tok"), input=str(lake),
                                        output=str(tmp_path / "enc"), encode_io=io))
    assert not (tmp_path / "w").exists() and not (tmp_path / "enc").exists()


@pytest.mark.parametrize("kind", ["dictionary", "string_view", "binary_view"])
def test_text_columns_spark_reads_as_text_are_counted_by_the_default_reader(spark, tmp_path,
                                                                            kind):
    """A pandas Categorical (dictionary-encoded) or a view-typed text column: Spark's reader
    and the encode job take them, so the count's own pyarrow reader does too (it refused
    them), with the word table of the plain column; invalid UTF-8 in a dictionary too."""
    rows = ["the cat sat", None, "the dog", "the cat sat", "dog days"] * 40
    plain = pa.array(rows, pa.string())
    column = {"dictionary": plain.dictionary_encode(),
              "string_view": plain.cast(pa.string_view()),
              "binary_view": plain.cast(pa.binary()).cast(pa.binary_view())}[kind]
    lake = tmp_path / "lake"
    lake.mkdir()
    pq.write_table(pa.table({"text": column}), lake / "p.parquet")
    assert str(pq.read_schema(lake / "p.parquet").field("text").type).startswith(kind)
    count_words(spark, Config(input=str(lake), output=str(tmp_path / "w"), count_reader="arrow"))
    assert_word_table(tmp_path / "w", naive_count([rows]))
    bad = pa.array([b"ok \xff", b"ok"] * 3, pa.binary()).view(pa.string())  # (not checked)
    pq.write_table(pa.table({"text": bad.dictionary_encode()}), lake / "p.parquet")
    count_words(spark, Config(input=str(lake), output=str(tmp_path / "w2")))
    assert_word_table(tmp_path / "w2", naive_count([[b"ok \xff", b"ok"] * 3]))


def test_a_file_of_another_format_read_as_parquet_says_which_flag_reads_it(tmp_path):
    """JSON lines given without --input-format: the error said only to fix, remove or skip
    the file (and skipping it left no file to read); its name says what it is, and so does
    the error."""
    from pipeline.count.corpus import list_local_corpus

    (tmp_path / "a.jsonl").write_text('{"text": "hello"}\n')
    with pytest.raises(ConfigError, match=r"a\.jsonl is not a readable Parquet file .*if the "
                                          r"input is json files, pass --input-format json"):
        list_local_corpus(str(tmp_path), "text")
