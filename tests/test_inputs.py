"""Inputs beyond one Parquet corpus: other formats, catalog tables, weighted sources. Each
gives the same word table (counts and first-seen order) and the same merges as Parquet."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.config import Config, ConfigError
from pipeline.count.word_count import count_words
from pipeline.encode_corpus import encode_corpus
from pipeline.train import train

from .conftest import SAMPLE
from .naive_count import assert_word_table, naive_count

pytestmark = pytest.mark.spark


def sample_lines(n: int = 400) -> list[str]:
    """Lines of the sample (a line per row, so that the text format sees the same rows)."""
    text = "\n".join(pq.read_table(SAMPLE / "part-00000.parquet").column("text").to_pylist()[:8])
    return [ln for ln in text.split("\n") if ln.strip() and '"' not in ln][:n]


def table_rows(path) -> list[tuple[bytes, int, int]]:
    """(word, count, rank of first_seen): first_seen is packed for Parquet and a dense rank
    for formats without row indices; its order is what the merges depend on."""
    t = pq.read_table(path / "data")
    order = pc.sort_indices(t, [("first_seen", "ascending")]).to_pylist()
    words, counts = t.column("word").to_pylist(), t.column("count").to_pylist()
    return [(words[i], counts[i], r) for r, i in enumerate(order)]


@pytest.fixture(scope="module")
def formats(spark, tmp_path_factory):
    """The same rows as Parquet, JSON lines, CSV, ORC and text (two files each)."""
    root = tmp_path_factory.mktemp("formats")
    lines = sample_lines()
    df = spark.createDataFrame([(t,) for t in lines], "text string").coalesce(1)
    half = len(lines) // 2
    paths = {}
    for fmt in ("parquet", "json", "csv", "orc", "text"):
        d = root / fmt
        for part, rows in (("a", lines[:half]), ("b", lines[half:])):
            frame = spark.createDataFrame([(t,) for t in rows], "text string").coalesce(1)
            writer = frame.write.mode("overwrite")
            if fmt == "csv":
                writer = writer.option("header", True)
            writer.format(fmt).save(str(d / part))
        paths[fmt] = d
    del df
    return paths


@pytest.mark.parametrize("fmt", ["json", "csv", "orc", "text"])
def test_other_formats_give_the_parquet_word_table_and_merges(spark, formats, tmp_path, fmt,
                                                             capfd, caplog):
    ref = count_words(spark, Config(input=f"{formats['parquet']}/*/*.parquet",
                                    output=str(tmp_path / "ref")))
    capfd.readouterr()
    got = count_words(spark, Config(input=f"{formats[fmt]}/*/part-*", input_format=fmt,
                                    output=str(tmp_path / fmt)))
    said = "".join(capfd.readouterr()) + caplog.text  # no ERROR from a probe of the reader
    assert "FIELD_NOT_FOUND" not in said and '"level": "ERROR"' not in said, said[:500]
    assert table_rows(tmp_path / fmt) == table_rows(tmp_path / "ref")
    assert got.meta["input_format"] == fmt
    a = train(spark, Config(words=str(tmp_path / "ref"), output=str(tmp_path / "ra"),
                            vocab_size=500, progress_bar=False))
    b = train(spark, Config(words=str(tmp_path / fmt), output=str(tmp_path / "rb"),
                            vocab_size=500, progress_bar=False))
    assert a.merges == b.merges and len(a.merges) == 500 - 257
    del ref


def test_csv_as_python_and_pandas_write_it(spark, tmp_path):
    """Quotes doubled inside quoted fields (RFC 4180), backslashes and line breaks in a field:
    the rows Python's csv module wrote are the rows counted (the Parquet table's words)."""
    import csv

    rows = ['He said "hi" to me', 'a path C:\\temp\\x and \\"odd\\"', "two\nlines, one row",
            '"quoted", then more', "plain"] * 3
    (tmp_path / "csv").mkdir()
    with open(tmp_path / "csv" / "a.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text"])
        writer.writerows([r] for r in rows)
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"text": rows}), tmp_path / "pq" / "a.parquet")
    count_words(spark, Config(input=str(tmp_path / "pq"), output=str(tmp_path / "ref")))
    count_words(spark, Config(input=str(tmp_path / "csv"), input_format="csv",
                              output=str(tmp_path / "got")))
    assert table_rows(tmp_path / "got") == table_rows(tmp_path / "ref")
    # a file whose header differs from the first file's: Spark matched columns by position,
    # so its 'body' was counted as the text, silently; now one line naming it
    for header, why in [("body", r"Header: body Schema: text Expected: text but found: body"),
                        ("body,text", r"Header length: 2, schema size: 1")]:
        (tmp_path / "csv" / "b.csv").write_text(f"{header}\nnot the text,the text\n")
        with pytest.raises(ConfigError, match=rf"^config key 'input': \S+/b\.csv has another "
                                              rf"CSV header than the first file \({why}\)"):
            count_words(spark, Config(input=str(tmp_path / "csv"), input_format="csv",
                                      output=str(tmp_path / "got2")))


@pytest.mark.parametrize("merge", ["driver", "spark"])
@pytest.mark.parametrize("fmt", ["json", "text"])
def test_files_split_across_tasks_keep_the_corpus_order(spark, formats, tmp_path, fmt, merge):
    """A JSON-lines or text file larger than spark.sql.files.maxPartitionBytes is read by
    several tasks, each numbering the rows of its split: the word table is the whole files'
    one against the naive count, first_seen values included (each split's rows moved by the
    rows of the file's earlier splits: (file, row in file, rank) packed as for Parquet), with
    either merge."""
    spark.conf.set("spark.sql.files.maxPartitionBytes", "2048")
    try:
        files = list(formats[fmt].glob("*/part-*"))
        splits = spark.read.format(fmt).load([str(f) for f in files]).rdd.getNumPartitions()
        assert splits > 2 * len(files), splits  # each file is cut in several pieces
        count_words(spark, Config(input=f"{formats[fmt]}/*/part-*", input_format=fmt,
                                  output=str(tmp_path / fmt), count_merge=merge))
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    lines = sample_lines()
    half = len(lines) // 2  # the fixture's two files, in path order
    naive = naive_count([lines[:half], lines[half:]], special_tokens=["<|endoftext|>"])
    assert_word_table(tmp_path / fmt, naive, dense=False)


def test_the_report_samples_every_input_kind(spark, formats, tmp_path):
    """report.html's sample comes from the training input whatever it is (JSON lines, several
    sources); a report_sample that is not Parquet is a config error before the count."""
    from pipeline.config import ConfigError

    def report(out: str, **kw) -> str:
        train(spark, Config(output=str(tmp_path / out), vocab_size=300, progress_bar=False,
                            report_sample_rows=40, **kw))
        return (tmp_path / out / "report.html").read_text()

    page = report("js", input=f"{formats['json']}/*/part-*", input_format="json")
    assert "40 rows of the training input" in page and "no sample in" not in page
    two = f"{formats['parquet']}/a,{formats['parquet']}/b"
    page = report("two", input=two, input_weights=[3, 1])
    assert f"40 rows of the training input {two}" in page and "no sample in" not in page
    with pytest.raises(ConfigError, match=f"^config key 'report_sample': {formats['json']}/a "
                                          "is not a Parquet sample of held-out text: "):
        report("held", input=str(formats["parquet"] / "a"),
               report_sample=str(formats["json"] / "a"))
    assert not (tmp_path / "held" / "words").exists()  # said before the count


def test_a_reader_spark_does_not_have_is_one_config_error(spark, tmp_path):
    with pytest.raises(ConfigError, match=r"config key 'input_format': Spark has no 'delta' "
                                          r"reader here \(delta needs the delta-spark package"):
        count_words(spark, Config(input=str(SAMPLE), input_format="delta",
                                  output=str(tmp_path / "w")))
    assert not (tmp_path / "w").exists()


def test_parquet_files_given_to_a_text_reader_are_one_config_error(spark, tmp_path):
    """Parquet read as text, JSON lines or CSV would train on compressed bytes: refused, by
    the file's name or, without the .parquet suffix, by its magic bytes."""
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    shutil.copy(SAMPLE / "part-00000.parquet", renamed / "part-00000")
    for fmt, corpus in [("text", SAMPLE), ("json", SAMPLE), ("csv", renamed), ("text", renamed)]:
        with pytest.raises(ConfigError, match=rf"config key 'input_format': \S+part-00000"
                                              rf"(\.parquet)? is a Parquet file, which the "
                                              rf"'{fmt}' reader would count as text"):
            count_words(spark, Config(input=str(corpus), input_format=fmt,
                                      output=str(tmp_path / "w")))
    assert not (tmp_path / "w").exists()


def test_files_that_give_only_null_text_are_named(spark, tmp_path, caplog):
    """A file without the text column (JSON lines without the key; on HDFS or S3, where no
    footer is read before, a Parquet file of other columns) reads as null rows through Spark's
    reader: the count names such files in the log and in stats.json instead of counting
    them silently as nulls. A file with some null rows is not one of them."""
    import json

    lines = sample_lines(40)
    d = tmp_path / "js"
    d.mkdir()
    (d / "a.json").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines[:20]))
    (d / "b.json").write_text("".join(json.dumps({"body": t}) + "\n" for t in lines[20:30]))
    (d / "c.json").write_text("".join(json.dumps({"text": t if i % 2 else None}) + "\n"
                                      for i, t in enumerate(lines[30:])))
    with caplog.at_level(logging.WARNING, logger="pipeline.count.word_count"):
        count_words(spark, Config(input=str(d), input_format="json", output=str(tmp_path / "w")))
    stats = json.loads((tmp_path / "w" / "stats.json").read_text())
    assert [f.rsplit("/", 1)[1] for f in stats["files_of_null_text"]] == ["b.json"]
    assert stats["null_rows"] == 15 and not any(k.startswith("file_null_rows") for k in stats)
    assert "1 input files gave only null text (listed in stats.json), e.g. " in caplog.text
    assert "b.json: a file without the 'text' column reads that way" in caplog.text


def test_a_catalog_table_gives_the_parquet_merges(spark, formats, tmp_path, capfd):
    spark.sql(f"CREATE TABLE IF NOT EXISTS corpus_t USING parquet LOCATION "
              f"'{formats['parquet']}/a'")
    try:
        by_table = train(spark, Config(input_table="corpus_t", output=str(tmp_path / "t"),
                                       vocab_size=400, progress_bar=False))
        by_path = train(spark, Config(input=str(formats["parquet"] / "a"),
                                      output=str(tmp_path / "p"), vocab_size=400,
                                      progress_bar=False))
        # a temporary view over the same file has no file metadata: its partitions, in order
        spark.read.parquet(str(formats["parquet"] / "a")).createOrReplaceTempView("corpus_v")
        capfd.readouterr()
        by_view = train(spark, Config(input_table="corpus_v", output=str(tmp_path / "v"),
                                      vocab_size=400, progress_bar=False))
        # (asking the view for _metadata had PySpark log ERROR blobs with Java traces)
        assert "UNRESOLVED_COLUMN" not in capfd.readouterr().err
        # with --ignore-corrupt-files, no file of a view is taken for unreadable (its rows
        # are not attributed to their files)
        spark.read.parquet(f"{formats['parquet']}/*/*.parquet").createOrReplaceTempView(
            "corpus_v2")
        wt = count_words(spark, Config(input_table="corpus_v2", output=str(tmp_path / "wv"),
                                       ignore_corrupt_files=True))
    finally:
        spark.sql("DROP TABLE IF EXISTS corpus_t")
        spark.catalog.dropTempView("corpus_v")
        spark.catalog.dropTempView("corpus_v2")
    assert by_table.merges == by_path.merges == by_view.merges
    assert wt.meta["left_out"]["unreadable_files"] == [] and wt.meta["files"] == 2
    # the session's own setting is back (it may be the user's): other reads do not skip
    assert spark.conf.get("spark.sql.files.ignoreCorruptFiles", None) in (None, "false")


def test_weighted_sources_equal_repeated_rows(spark, tmp_path):
    """--input A,B --input-weights 3,1 trains exactly as a corpus whose first file holds A's
    rows three times (counts tripled, first occurrences unchanged) and whose second holds B."""
    lines = sample_lines(300)
    a, b = lines[:120], lines[120:]
    for name, rows in (("A", a), ("B", b), ("mix/0", a * 3), ("mix/1", b)):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": rows}), tmp_path / f"{name}.parquet")
    weighted = train(spark, Config(input=f"{tmp_path}/A.parquet,{tmp_path}/B.parquet",
                                   input_weights=[3, 1], output=str(tmp_path / "w"),
                                   vocab_size=450, progress_bar=False))
    repeated = train(spark, Config(input=str(tmp_path / "mix"), output=str(tmp_path / "r"),
                                   vocab_size=450, progress_bar=False))
    assert weighted.merges == repeated.merges
    # and through Spark's reader as well as pyarrow's
    spark_read = train(spark, Config(input=f"{tmp_path}/A.parquet,{tmp_path}/B.parquet",
                                     input_weights=[3, 1], count_reader="spark",
                                     output=str(tmp_path / "s"), vocab_size=450,
                                     progress_bar=False))
    assert spark_read.merges == weighted.merges
    unweighted = train(spark, Config(input=f"{tmp_path}/A.parquet,{tmp_path}/B.parquet",
                                     output=str(tmp_path / "u"), vocab_size=450,
                                     progress_bar=False))
    assert unweighted.merges != weighted.merges


def test_overlapping_sources_are_counted_once_each_and_said(spark, tmp_path, caplog):
    """A folder and a file in it as two sources: the file's rows count once per source (as
    a weight would), with a warning naming it (the encode job refuses the same input)."""
    (tmp_path / "in").mkdir()
    rows = sample_lines(40)
    pq.write_table(pa.table({"text": rows}), tmp_path / "in" / "a.parquet")
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        meta = count_words(spark, Config(input=f"{tmp_path / 'in'},{tmp_path / 'in'}/a.parquet",
                                         output=str(tmp_path / "w"))).meta
    assert meta["stats"]["rows"] == 2 * len(rows)
    assert re.search(r"1 input files are in more than one of the input sources, e\.g\. \S*"
                     r"in/a\.parquet: their rows are counted once per source", caplog.text)


def test_an_external_word_table_trains_as_the_counted_one(spark, tmp_path, caplog):
    """(word, count) tables made elsewhere, as TSV (SentencePiece's word<TAB>count, words
    escaped) or Parquet, with or without first_seen: the same merges as our own table when
    they list the same words in the same first-seen order."""
    from pipeline.count.external import escape

    rows = pq.read_table(SAMPLE / "part-00000.parquet").column("text").to_pylist()[:6]
    pq.write_table(pa.table({"text": rows}), tmp_path / "c.parquet")
    ours = count_words(spark, Config(input=str(tmp_path / "c.parquet"),
                                     output=str(tmp_path / "w")))
    t = pq.read_table(tmp_path / "w" / "data").sort_by("first_seen")
    words = [w.decode("utf-8", "surrogateescape") for w in t.column("word").to_pylist()]
    counts = t.column("count").to_pylist()
    assert any("\n" in w for w in words)  # the escapes are exercised
    (tmp_path / "words.tsv").write_text("".join(f"{escape(w)}\t{c}\n"
                                                for w, c in zip(words, counts)))
    # a Parquet table with first_seen, rows shuffled: first_seen decides the order
    perm = list(range(len(words)))[::-1]
    pq.write_table(pa.table({"word": [words[i] for i in perm], "count": [counts[i] for i in perm],
                             "first_seen": [i * 10 for i in perm]}),
                   tmp_path / "with_first.parquet")
    pq.write_table(pa.table({"word": words, "count": counts}), tmp_path / "no_first.parquet")

    def merges(words_arg: str, out: str):
        return train(spark, Config(words=words_arg, output=str(tmp_path / out),
                                   vocab_size=420, progress_bar=False)).merges

    ref = merges(str(tmp_path / "w"), "ref")
    caplog.set_level("INFO", logger="pipeline")
    caplog.clear()
    assert merges(str(tmp_path / "words.tsv"), "tsv") == ref
    assert "words are used as given" in caplog.text  # no warning about a cap nobody set
    assert "the word table was made with" not in caplog.text
    assert merges(str(tmp_path / "with_first.parquet"), "pq1") == ref
    assert merges(str(tmp_path / "no_first.parquet"), "pq2") == ref
    assert ours.meta["unique_words"] == len(words)


def test_a_tsv_table_on_another_filesystem_is_read_through_spark(spark, tmp_path,
                                                                 monkeypatch):
    """Off the local disk (hdfs:, s3a:, ...) TSV tables go through Spark's text reader: the
    same table as the local read, files in path order (.gz too), other files ignored; a
    malformed line is still one error naming its file and line."""
    import gzip

    from pipeline import fsutil
    from pipeline.config import ConfigError
    from pipeline.count import external

    d = tmp_path / "tsv"
    d.mkdir()
    (d / "b.tsv").write_text("two\\tabs\t5\nline\\nbreak\t3\r\n\nlast\t1")  # no final newline
    with gzip.open(d / "a.tsv.gz", "wt") as fh:
        fh.write("the\t12\n of\t7\n")
    (d / "_SUCCESS").write_text("")
    (d / "notes.md").write_text("not a table\n")
    local = external.read_tsv(str(d))
    assert local.column("word").to_pylist() == [b"the", b" of", b"two\tabs", b"line\nbreak",
                                               b"last"]
    monkeypatch.setattr(fsutil, "is_local", lambda path: False)  # as if it were on hdfs:
    assert external.read_tsv(str(d), spark).equals(local)
    assert fsutil.list_dir(spark, str(d)) == ["_SUCCESS", "a.tsv.gz", "b.tsv", "notes.md"]
    (d / "c.tsv").write_text("fine\t1\nbroken\n")
    with pytest.raises(ConfigError, match=r"c\.tsv line 2 is not 'word<TAB>count"):
        external.read_tsv(str(d), spark)


def test_an_external_parquet_table_elsewhere_keeps_the_local_row_order(spark, tmp_path,
                                                                        monkeypatch):
    """A Parquet (word, count) table without first_seen, off the local disk, is read through
    Spark in the local read's order (files by path, rows in file order), although Spark
    reads the larger file first: its rows' order is their first_seen."""
    from pipeline import fsutil
    from pipeline.count import external

    d = tmp_path / "pq"
    d.mkdir()
    pq.write_table(pa.table({"word": ["a", "b"], "count": [1, 1]}), d / "a.parquet")
    pq.write_table(pa.table({"word": [f"w{i:04d}" for i in range(3000)],
                             "count": list(range(1, 3001))}), d / "b.parquet")
    local = external.read_parquet(None, str(d))
    assert local.column("word").to_pylist()[:3] == [b"a", b"b", b"w0000"]
    monkeypatch.setattr(fsutil, "is_local", lambda path: False)  # as if it were on hdfs:
    assert external.read_parquet(spark, str(d)).equals(local)


def test_a_malformed_external_table_is_one_config_error(tmp_path, caplog):
    from pipeline.config import ConfigError
    from pipeline.count.external import read_parquet, read_tsv

    spark_tsv = tmp_path / "spark-tsv"  # df.write.option("sep", "\t").csv(...)
    spark_tsv.mkdir()
    (spark_tsv / "part-00000-abc.csv").write_text("the\t12\n")
    (spark_tsv / "_SUCCESS").write_text("")
    with pytest.raises(ConfigError, match=r"spark-tsv holds no word table: no word_table\.json "
                                          r"\(one of ours\), no \.parquet files and no TSV "
                                          r"files \(names ending \.tsv, \.txt, \.tsv\.gz\); it "
                                          r"holds part-00000-abc\.csv \(TSV that Spark wrote"):
        read_parquet(None, str(spark_tsv))

    (tmp_path / "bad.tsv").write_text("the\t12\nbroken line without a count\n")
    with pytest.raises(ConfigError, match=r"bad\.tsv line 2 is not 'word<TAB>count"):
        read_tsv(str(tmp_path / "bad.tsv"))
    from pipeline.count.external import canonical, read_parquet

    for name, table, why in [
            ("floats", {"word": ["ab", "cd"], "count": [2.5, 3.0]}, "'count' is double, not "
                                                                   "integers"),
            ("ints", {"word": [1, 2], "count": [2, 3]}, "'word' is int64, not string or binary"),
            ("seen", {"word": ["ab"], "count": [2], "first_seen": ["x"]},
             "'first_seen' is string, not integers")]:
        pq.write_table(pa.table(table), tmp_path / f"{name}.parquet")
        with pytest.raises(ConfigError, match=f"^config key 'words': .*{name}.parquet column "
                                              f"{why}$"):
            read_parquet(None, str(tmp_path / f"{name}.parquet"))
    # rows without a usable count or word are left out, and said so
    # (and a null count costs the other counts nothing: 2**60 + 1 stays exact, not a float)
    pq.write_table(pa.table({"word": ["ab", None, "", "cd", "ef", "gh"],
                             "count": [2, 5, 5, None, -1, 2**60 + 1]}),
                   tmp_path / "holes.parquet")
    with caplog.at_level(logging.WARNING, logger="pipeline.count.external"):
        kept = canonical(read_parquet(None, str(tmp_path / "holes.parquet")))
    assert kept.column("word").to_pylist() == [b"ab", b"gh"]
    assert kept.column("count").to_pylist() == [2, 2**60 + 1]
    assert "left out 4 of 6 rows (a count below 1 or null, or an empty or null word)" \
        in caplog.text
    # first_seen for some rows only (nulls, or files with and without it): positions and row
    # numbers do not mix, so refused; the same for TSV lines with and without a third column
    (tmp_path / "mixed").mkdir()
    pq.write_table(pa.table({"word": ["b", "a"], "count": [5, 5], "first_seen": [10, 0]}),
                   tmp_path / "mixed" / "p0.parquet")
    pq.write_table(pa.table({"word": ["c"], "count": [5]}), tmp_path / "mixed" / "p1.parquet")
    with pytest.raises(ConfigError, match="mixed: first_seen is missing for 1 of 3 rows"):
        read_parquet(None, str(tmp_path / "mixed"))
    (tmp_path / "mixed.tsv").write_text("b\t5\t10\na\t5\t0\nc\t5\n")
    with pytest.raises(ConfigError, match=r"mixed\.tsv line 3 has no first_seen column, unlike "
                                          "the lines before it"):
        read_tsv(str(tmp_path / "mixed.tsv"))
    # where the order came from, as the import logs it
    from pipeline.count.external import first_seen_origin

    assert first_seen_origin(read_parquet(None, str(tmp_path / "mixed" / "p0.parquet"))) \
        == "its first_seen column"
    assert first_seen_origin(read_parquet(None, str(tmp_path / "mixed" / "p1.parquet"))) \
        == "its row order"
    (tmp_path / "t3.tsv").write_text("b\t5\t10\na\t5\t0\n")
    assert first_seen_origin(read_tsv(str(tmp_path / "t3.tsv"))) == "its first_seen column"
    (tmp_path / "t2.tsv").write_text("b\t5\na\t5\n")
    assert first_seen_origin(read_tsv(str(tmp_path / "t2.tsv"))) == "its row order"
    # a run directory given where its word table belongs: said so
    from pipeline.count.external import import_word_table

    (tmp_path / "run" / "words").mkdir(parents=True)
    (tmp_path / "run" / "words" / "word_table.json").write_text("{}")
    (tmp_path / "run" / "merges.txt").write_text("#version: 0.2\n")
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=f"^config key 'words': {run} is a run directory; its "
                                          f"word table is {run}/words$"):
        import_word_table(None, Config(), str(tmp_path / "run"), str(tmp_path / "out" / "words"))


def test_an_external_table_past_64_bits_or_unreadable_is_one_config_error(tmp_path):
    """Counts over int64 (a line, a uint64 column, a repeated word's sum: they wrapped to
    negative counts that were kept or dropped), a truncated .gz (EOFError) and an unknown
    escape (taken as it was) are each one ConfigError naming the file (and line)."""
    import gzip

    from pipeline.count.external import canonical, read_parquet, read_tsv

    cases = {"big.tsv": ("the\t3\nhello\t99999999999999999999\n",
                         r"big\.tsv line 2: a count or first_seen over the 64-bit"),
             "seen.tsv": ("a\t1\t-9223372036854775809\n", r"seen\.tsv line 1: a count"),
             "esc.tsv": ("ok\\\\x\t1\nhe\\qllo\t5\n",
                         r"esc\.tsv line 2: an unknown escape '\\\\q' .*write a backslash"),
             "tail.tsv": ("end\\\t1\n", r"tail\.tsv line 1: an unknown escape '\\\\'")}
    for name, (text, why) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError, match=f"^config key 'words': .*{why}"):
            read_tsv(str(tmp_path / name))
    (tmp_path / "ok.tsv").write_text("a\\tb\\\\\t9223372036854775807\n")
    assert read_tsv(str(tmp_path / "ok.tsv")).to_pylist() == [
        {"word": b"a\tb\\", "count": 2**63 - 1, "first_seen": 0}]
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "c.tsv.gz").write_bytes(gzip.compress(b"hello\t5\n" * 1000)[:40])
    with pytest.raises(ConfigError, match=r"c\.tsv\.gz cannot be read after line \d+: EOFError"):
        read_tsv(str(tmp_path / "gz"))
    pq.write_table(pa.table({"word": ["a"], "count": pa.array([2**64 - 1], pa.uint64())}),
                   tmp_path / "u.parquet")
    with pytest.raises(ConfigError, match=r"u\.parquet: a count or first_seen over the 64-bit"):
        read_parquet(None, str(tmp_path / "u.parquet"))
    (tmp_path / "twice.tsv").write_text("hello\t9223372036854775807\n" * 2 + "x\t1\n")
    with pytest.raises(ConfigError, match="repeated words sum up too far: a word's count is "
                                          "2\\*\\*63 or more"):
        canonical(read_tsv(str(tmp_path / "twice.tsv")))


@pytest.mark.spark
def test_a_table_whose_pair_counts_would_pass_64_bits_is_refused(spark, tmp_path):
    """Each count fits in int64 but count x symbols does not: the pair counts would wrap
    (the first merge came out wrong and tokens_left negative, exit 0). One ConfigError before
    training, for both alphabets; a table just under the limit trains."""
    (tmp_path / "big.tsv").write_text(f"abab\t{2**63 - 1}\nxy\t5\n")
    for alphabet in ("bytes", "chars"):
        with pytest.raises(ConfigError, match=r"^config key 'words': \S*big\.tsv holds "
                                              r"36893488147419103238 tokens .*pair counts "
                                              r"would overflow"):  # (it named the copy)
            train(spark, Config(words=str(tmp_path / "big.tsv"), alphabet=alphabet,
                                output=str(tmp_path / f"out-{alphabet}"), vocab_size=259,
                                progress_bar=False))
    (tmp_path / "fits.tsv").write_text(f"abab\t{2**61}\nxy\t5\n")  # 2**63 + 10 bytes: no
    with pytest.raises(ConfigError, match="pair counts would overflow"):
        train(spark, Config(words=str(tmp_path / "fits.tsv"), output=str(tmp_path / "f"),
                            vocab_size=259, progress_bar=False))
    (tmp_path / "ok.tsv").write_text(f"abab\t{2**61 - 3}\nxy\t5\n")  # 2**63 - 2 bytes
    got = train(spark, Config(words=str(tmp_path / "ok.tsv"), output=str(tmp_path / "ok"),
                              vocab_size=260, progress_bar=False)).merges
    assert [(m.left, m.right, m.count) for m in got] == [
        (97, 98, 2 * (2**61 - 3)), (256, 256, 2**61 - 3), (120, 121, 5)]


def test_weighted_totals_are_exact_past_64_bits():
    import numpy as np

    from pipeline.count.word_table import weighted_total

    lengths, counts = np.array([4, 2]), np.array([2**63 - 1, 5])
    assert weighted_total(lengths, counts) == 4 * (2**63 - 1) + 10
    assert weighted_total(np.array([3, 1]), np.array([7, 9])) == 30
    # in chunks (here of 3 rows): some summed as int64, some in Python integers
    from pipeline.count import word_table

    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 30, 20)
    counts = rng.integers(1, 1000, 20)
    counts[[4, 11]] = [2**62, 2**63 - 1]
    exact = sum(int(a) * int(b) for a, b in zip(lengths.tolist(), counts.tolist()))
    for chunk in (3, 1 << 20):
        word_table._EXACT_CHUNK = chunk
        try:
            assert weighted_total(lengths, counts) == exact
        finally:
            word_table._EXACT_CHUNK = 1 << 20


def test_tsv_counts_are_plain_integers_and_a_byte_order_mark_is_not_a_word(tmp_path):
    """``int()`` took "1_000", " 50 ", "+7" and other scripts' digits as counts; the first
    word kept a UTF-8 byte-order mark (as Windows tools write it)."""
    from pipeline.count.external import read_tsv

    for n, bad in enumerate(["1_000", " 50", "50 ", "+7", "\u0663", "0x10", "7\t1_0"]):
        (tmp_path / f"c{n}.tsv").write_text(f"the\t3\nof\t{bad}\n")
        with pytest.raises(ConfigError, match=f"c{n}\\.tsv line 2 is not 'word<TAB>count"):
            read_tsv(str(tmp_path / f"c{n}.tsv"))
    (tmp_path / "bom.tsv").write_bytes("\ufeffthe\t3\nof\t-2\n".encode())
    assert read_tsv(str(tmp_path / "bom.tsv")).to_pylist() == [
        {"word": b"the", "count": 3, "first_seen": 0},
        {"word": b"of", "count": -2, "first_seen": 1}]


@pytest.mark.spark
def test_an_external_table_is_one_format_and_learns_no_special_token(spark, tmp_path, caplog):
    """A folder of TSV and Parquet files was read as its TSV only: an error now. Words that
    hold a special token's text are left out (a count cuts specials out of text; learned,
    they made an ordinary token spelled as the special one, which the tokenizers export
    gave another id than tiktoken's), with one warning."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.tsv").write_text("the\t3\n")
    pq.write_table(pa.table({"word": ["of"], "count": [2]}), mixed / "b.parquet")
    with pytest.raises(ConfigError, match=r"holds both TSV \(a\.tsv\) and Parquet "
                                          r"\(b\.parquet\) files"):
        train(spark, Config(words=str(mixed), output=str(tmp_path / "m"), vocab_size=300,
                            progress_bar=False))
    (tmp_path / "sp.tsv").write_text("<|endoftext|>\t1000\nx<|endoftext|>y\t7\nhello\t5\n"
                                     "<|end\t4\n")
    caplog.set_level(logging.WARNING, logger="pipeline.count.external")
    run = tmp_path / "run"
    train(spark, Config(words=str(tmp_path / "sp.tsv"), output=str(run), vocab_size=300,
                        progress_bar=False))
    assert "left out 2 rows (1007 occurrences) whose word holds a special token " \
        "(<|endoftext|>)" in caplog.text
    words = pq.read_table(run / "words" / "data").column("word").to_pylist()
    assert sorted(words) == [b"<|end", b"hello"]
    import json

    vocab = json.loads((run / "tokenizer.json").read_text())["model"]["vocab"]
    assert "<|endoftext|>" not in vocab  # (only among the added, special tokens)
    from tokenizers import Tokenizer as HFTokenizer

    from pipeline.encoder import Tokenizer

    hf = HFTokenizer.from_file(str(run / "tokenizer.json"))
    text = "hello<|endoftext|><|end"
    assert hf.encode(text).ids == Tokenizer.load(str(run)).encode(text,
                                                                   allowed_special="all")


def test_a_repeated_word_s_sum_is_checked_exactly_against_64_bits():
    """Summed in floats, 2**63 - 2048 + 5 x 511 rounds to under 2**63 and 2**62 + (2**62 - 1)
    rounds to 2**63: the check must say overflow for the first and not for the second."""
    import numpy as np

    from pipeline.count.word_table import CountOverflow, sum_duplicates

    words = pa.array([b"a"] * 6)
    with pytest.raises(CountOverflow):
        sum_duplicates(words, np.array([2**63 - 2048] + [511] * 5, dtype=np.int64))
    _, _, totals = sum_duplicates(pa.array([b"a", b"b", b"a"]),
                                  np.array([2**62, 7, 2**62 - 1], dtype=np.int64))
    assert totals.tolist() == [2**63 - 1, 7]


@pytest.mark.parametrize("settings, words, said", [
    ({"lowercase": True}, "hello\t5\nHELLO\t100\nWorld\t50\n",
     r"config key 'lowercase': .* 2 of its 3 words are not as lowercase = true makes text "
     r"\(e\.g\. 'HELLO' -> 'hello'\)"),
    ({"normalization": "NFKC"}, "fine\t5\n\ufb01ne\t30\n",
     r"config key 'normalization': .* 1 of its 2 words are not as normalization = 'NFKC' "
     r"makes text \(e\.g\. '\ufb01ne' -> 'fine'\)"),
    ({"lowercase": True}, "hello\t5\nworld\t3\n", None),
    ({}, "HELLO\t5\n\ufb01ne\t3\n", None)])
def test_an_external_table_must_hold_words_as_the_split_settings_make_them(tmp_path, settings,
                                                                          words, said):
    """lowercase / normalization are recorded with the tokenizer and its encoders apply them
    to their input; an external table's words are used as given, so a word they change
    (HELLO) is one no encoded text holds: its merges never applied (encode("HELLO") gave the
    five bytes). Refused, naming one; words already so are taken."""
    from pipeline.config import Config, ConfigError
    from pipeline.count.external import import_word_table

    (tmp_path / "w.tsv").write_text(words, encoding="utf-8")
    cfg = Config(words=str(tmp_path / "w.tsv"), output=str(tmp_path / "run"), **settings)
    dest = str(tmp_path / "run" / "words")
    if said is None:
        assert import_word_table(None, cfg, str(tmp_path / "w.tsv"), dest)["stats"]["rows"]
    else:
        with pytest.raises(ConfigError, match=said):
            import_word_table(None, cfg, str(tmp_path / "w.tsv"), dest)
        assert not (tmp_path / "run" / "words").exists()


def test_an_external_table_sums_repeated_words_and_keeps_their_first_position(tmp_path):
    """README: a word listed twice has its counts summed; first_seen (given, or the row order
    without it) becomes a dense rank; a word keeps its earliest position."""
    from pipeline.count.external import canonical, read_parquet, read_tsv

    (tmp_path / "t.tsv").write_text("the\t3\nof\t1\nthe\t4\n\t5\nand\t2\n")
    got = canonical(read_tsv(str(tmp_path / "t.tsv")))  # (an empty word is left out)
    assert got.to_pylist() == [{"word": b"the", "count": 7, "first_seen": 0},
                               {"word": b"of", "count": 1, "first_seen": 1},
                               {"word": b"and", "count": 2, "first_seen": 2}]
    pq.write_table(pa.table({"word": ["of", "the", "of", "x"], "count": [1, 2, 5, 1],
                             "first_seen": [40, 7, 3, 9]}), tmp_path / "t.parquet")
    got = canonical(read_parquet(None, str(tmp_path / "t.parquet")))
    assert got.to_pylist() == [{"word": b"of", "count": 6, "first_seen": 0},
                               {"word": b"the", "count": 2, "first_seen": 1},
                               {"word": b"x", "count": 1, "first_seen": 2}]


def test_the_python_api_from_a_thread_of_its_own_uses_the_session_and_leaves_it_up(spark,
                                                                                  tmp_path):
    """The active session is per thread: a call from a worker thread (a notebook's executor, a
    pipeline's thread pool) saw none, took the existing one as one it made and stopped it at
    the end: the caller's session was gone."""
    import threading

    from pipeline import api

    result: dict = {}

    def call() -> None:
        try:
            result["meta"] = api.count_words(str(SAMPLE), output=str(tmp_path / "words"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            result["error"] = exc

    worker = threading.Thread(target=call)
    worker.start()
    worker.join(300)
    assert "error" not in result, result.get("error")
    assert result["meta"]["unique_words"] > 0
    assert spark.range(3).count() == 3  # still up


def test_the_python_api_as_the_readme_shows_it(spark, tmp_path):
    """pipeline.api with a path, a DataFrame and a word table: the same merges as the job
    (which are the oracle's: no code in common with the pipeline's count or engines);
    encode with a path, a list of paths and a DataFrame: the same ids."""
    from pipeline import api
    from pipeline.config import ConfigError

    from .sparkjobs import oracle_merges, oracle_merges_txt

    run = api.train(str(SAMPLE), output=str(tmp_path / "run"), vocab_size=500)
    assert run.merges == 500 - 257 and not run.already_done
    ids = run.tokenizer().encode("In the beginning God created the heaven")
    assert run.tokenizer().decode(ids) == "In the beginning God created the heaven"
    assert run.tiktoken().encode("In the beginning") == run.tokenizer().encode(
        "In the beginning")
    assert run.tiktoken().name == "spark-bpe-run"  # named after the run directory
    on_disk = sorted(f.name for f in (tmp_path / "run").iterdir()
                     if f.is_file() and not f.name.startswith("."))
    assert sorted(os.path.basename(f) for f in run.files) == on_disk
    assert "run.json" in on_disk and "tokenizer_meta.json" in on_disk
    frame = spark.read.parquet(str(SAMPLE))  # its files' order (test below)
    by_frame = api.train(frame, output=str(tmp_path / "frame"), vocab_size=500)
    assert by_frame.stats["merges"] == 243
    ours = [line for line in (tmp_path / "run" / "merges.txt").read_text().splitlines()]
    assert ours == oracle_merges_txt(oracle_merges(SAMPLE, Config(vocab_size=500))).splitlines()
    assert (tmp_path / "frame" / "merges.txt").read_text().splitlines() == ours
    meta = api.count_words(str(SAMPLE), output=str(tmp_path / "words"))
    assert meta["unique_words"] == run.stats["words_in_table"]
    again = api.train(words=str(tmp_path / "words"), output=str(tmp_path / "w"), vocab_size=500,
                      name="bible-500")
    assert again.tiktoken().name == "bible-500"
    assert (tmp_path / "w" / "merges.txt").read_text().splitlines() == ours
    summary = api.encode(str(SAMPLE), tokenizer=run.dir, output=str(tmp_path / "ids"))
    assert summary["stats"]["rows"] == 564 and summary["stats"]["tokens"] > 0
    # encode alike: a list of paths and a DataFrame give the same ids as the path
    by_path = pq.read_table(tmp_path / "ids").sort_by([("file", "ascending"),
                                                       ("row", "ascending")])
    expected = [run.tokenizer().encode(t) for f in sorted(SAMPLE.glob("*.parquet"))
                for t in pq.read_table(f).column("text").to_pylist()]
    assert by_path.column("ids").to_pylist() == expected
    files = [str(f) for f in sorted(SAMPLE.glob("*.parquet"))]
    listed = api.encode(files, tokenizer=run.dir, output=str(tmp_path / "ids-list"))
    assert listed["stats"]["tokens"] == summary["stats"]["tokens"]
    assert listed["input"] == ",".join(files)
    by_list = pq.read_table(tmp_path / "ids-list").sort_by([("file", "ascending"),
                                                            ("row", "ascending")])
    assert by_list.column("ids").to_pylist() == expected
    framed = api.encode(frame.select("text"), tokenizer=run.dir,
                        output=str(tmp_path / "ids-frame"))
    assert framed["input"] == "a DataFrame" and framed["key_columns"] == ["row"]
    by_frame_ids = pq.read_table(tmp_path / "ids-frame").sort_by("row")
    assert by_frame_ids.column("ids").to_pylist() == expected
    with pytest.raises(ConfigError, match="unknown config key 'vocab_sise'"):
        api.train(str(SAMPLE), output=str(tmp_path / "x"), vocab_sise=500)
    with pytest.raises(ConfigError, match=r"'vocab_size' is not a setting of count_words\(\)"):
        api.count_words(str(SAMPLE), output=str(tmp_path / "y"), vocab_size=500)
    with pytest.raises(ConfigError, match=r"'engine' is not a setting of encode\(\)"):
        api.encode(str(SAMPLE), tokenizer=run.dir, output=str(tmp_path / "z"), engine="spark")
    assert not (tmp_path / "y").exists() and not (tmp_path / "z").exists()


def test_another_dataframe_on_the_same_output_trains_afresh(spark, tmp_path):
    """A DataFrame is counted on every run, as a changed input is recounted: another one on the
    same output deletes the stale checkpoints and trains (it was refused, advising a CLI
    flag); the same one again resumes and changes nothing."""
    from pipeline import api

    one = spark.createDataFrame([("ab ab ab cd cd",)] * 20, "text string")
    two = spark.createDataFrame([("ef ef ef gh gh",)] * 20, "text string")
    kw = dict(num_merges=3, min_pair_count=1)
    api.train(one, output=str(tmp_path / "run"), **kw)
    second = api.train(two, output=str(tmp_path / "run"), **kw)
    fresh = api.train(two, output=str(tmp_path / "fresh"), **kw)
    assert second.stats["resumed_from_merge"] == 0
    assert (tmp_path / "run" / "merges.txt").read_text() == (
        tmp_path / "fresh" / "merges.txt").read_text() and fresh.merges == 3
    again = api.train(two, output=str(tmp_path / "run"), **kw)
    assert again.already_done  # the same table: the run is complete


def test_a_rerun_on_another_corpus_trains_afresh_whatever_made_it_differ(spark, tmp_path,
                                                                         caplog):
    """The same command on an output whose corpus changed deletes the stale checkpoints and
    trains afresh, and its merges equal a fresh run's: a new character under the chars
    alphabet (the base vocabulary changes too), other input weights, another input path, an
    edited external table, and a rerun after one killed between publishing the recounted
    table and deleting the old checkpoints (the rerun does not know the input changed)."""
    caplog.set_level(logging.INFO, logger="pipeline.checkpoint")
    rows = pq.read_table(SAMPLE / "part-00000.parquet").column("text").to_pylist()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    pq.write_table(pa.table({"text": rows[:3]}), tmp_path / "a" / "part-0.parquet")
    pq.write_table(pa.table({"text": rows[3:6]}), tmp_path / "b" / "part-0.parquet")
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    runs = iter(range(100))

    def merges(out: str | None = None, **kw):
        out = out or str(tmp_path / f"fresh-{next(runs)}")
        return train(spark, Config(output=out, vocab_size=420, progress_bar=False,
                                   checkpoint_every_merges=20, **kw)).merges

    run = str(tmp_path / "chars")
    merges(run, input=a, alphabet="chars")
    pq.write_table(pa.table({"text": ["naïve café — résumé ü"] * 5}),
                   tmp_path / "a" / "part-1.parquet")
    assert merges(run, input=a, alphabet="chars") == merges(input=a, alphabet="chars")

    run = str(tmp_path / "weights")
    merges(run, input=f"{a},{b}", input_weights=[1, 1])
    assert merges(run, input=f"{a},{b}", input_weights=[3, 1]) == merges(
        input=f"{a},{b}", input_weights=[3, 1])
    assert merges(run, input=b) == merges(input=b)  # another path (e.g. a dated folder)

    run = str(tmp_path / "tsv")
    tsv = tmp_path / "words.tsv"
    tsv.write_text("".join(f"{w}\t{c}\n" for w, c in [("hello", 20), (" world", 9),
                                                       ("yellow", 20), (" hello", 4)]))
    merges(run, words=str(tsv))
    tsv.write_text(tsv.read_text().replace("yellow\t20", "yellow\t25"))
    assert merges(run, words=str(tsv)) == merges(words=str(tsv))
    again = train(spark, Config(output=run, vocab_size=420, progress_bar=False,
                                checkpoint_every_merges=20, words=str(tsv)))
    assert again.already_done  # the same table again: a no-op

    # killed after the recount was published: RUN/words is new, the checkpoints are old
    run, other = tmp_path / "killed", tmp_path / "other"
    merges(str(run), input=a)
    merges(str(other), input=b)
    shutil.rmtree(run / "words")
    (run / "run.json").unlink()
    shutil.copytree(other / "words", run / "words")
    assert list((run / "checkpoints").glob("merges-*.txt"))
    assert merges(str(run), input=b) == merges(input=b)
    assert caplog.text.count("deleting the checkpoints of the previous input") == 5


def test_the_readme_python_api_example_runs(spark, tmp_path, monkeypatch):
    """The README's first ``python`` block under "Python API", run as written (its relative
    paths in a scratch directory holding data/sample)."""
    import re

    from .conftest import REPO

    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### Python API"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sample").symlink_to(SAMPLE)
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md", "exec"), {})  # noqa: S102 - our own README
    assert (tmp_path / "out" / "api-run" / "run.json").exists()
    assert (tmp_path / "out" / "api-ids" / "_encode.json").exists()
    # the encoded rows too: Spark's JVM, started elsewhere, resolves a relative path against
    # its own working directory, not this one
    assert list((tmp_path / "out" / "api-ids").glob("*.parquet"))


def test_the_api_checks_before_any_spark_work(tmp_path, monkeypatch):
    """api.encode's own checks (tokenizer, ids column) run before a session is made, as the
    CLI's do; another job's key is refused in either spelling."""
    from pipeline import api

    def no_spark(*args, **kwargs):
        raise AssertionError("a Spark session was asked for")

    monkeypatch.setattr(api, "_session", no_spark)
    with pytest.raises(ConfigError, match="config key 'tokenizer'"):
        api.encode(str(SAMPLE), tokenizer="", output=str(tmp_path / "ids"))
    with pytest.raises(ConfigError, match="'vocab_size' is not a setting of count_words"):
        api.count_words(str(SAMPLE), output=str(tmp_path / "w"), **{"vocab-size": 1000})
    with pytest.raises(ConfigError, match="report_sample': path does not exist: /"):
        api.train(str(SAMPLE), output=str(tmp_path / "r"), vocab_size=300,
                  report_sample="no/such/held-out")  # made absolute, then checked


class _Reached(Exception):
    """Raised by a stand-in for ``api._session``: the call got as far as asking for Spark."""


def test_the_api_takes_keys_in_either_spelling_once(tmp_path, monkeypatch):
    """A key spelled with hyphens is the same key everywhere (the bar, the log level, the
    settings an existing session keeps); both spellings at once are refused, as in a config
    file; count_words takes input_table= as its corpus; an empty path in a list, or a file
    format for a DataFrame (already read), is refused with what to do."""
    from pipeline import api

    asked = {}

    def record(cfg, spark, app, options):
        asked.update(cfg=cfg, options=options)
        raise _Reached

    monkeypatch.setattr(api, "_session", record)
    out = str(tmp_path / "w")
    with pytest.raises(ConfigError, match="'text_column' is given twice"):
        api.count_words(str(SAMPLE), output=out, **{"text-column": "a"}, text_column="b")
    with pytest.raises(_Reached):
        api.train(str(SAMPLE), output=out, vocab_size=300, **{"progress-bar": True})
    assert asked["cfg"].progress_bar is True
    with pytest.raises(_Reached):
        api.count_words(str(SAMPLE), output=out, **{"spark-ui": "on"})
    assert "spark_ui" in asked["options"]  # (what an existing session is warned it keeps)
    ours = logging.getLogger("pipeline")
    level = ours.level
    try:
        with pytest.raises(_Reached):
            api.count_words(str(SAMPLE), output=out, **{"log-level": "DEBUG"})
        assert ours.level == logging.DEBUG
    finally:
        ours.setLevel(level)
    with pytest.raises(_Reached):
        api.count_words(input_table="db.docs", output=out)
    assert asked["cfg"].input_table == "db.docs"
    with pytest.raises(ConfigError, match="has an empty source"):
        api.count_words([str(SAMPLE), ""], output=out)

    class Frame:  # (what the API takes for a DataFrame)
        sparkSession = schema = None

    with pytest.raises(ConfigError, match="'input_format' = 'json': a DataFrame corpus"):
        api.train(Frame(), output=out, vocab_size=300, input_format="json")


def test_the_api_finds_the_programs_live_session_and_only_that(monkeypatch):
    """A session whose context the program stopped is not used (a new one is made); a bare
    SparkContext (older RDD code) is used through a session on it, never stopped."""
    from types import SimpleNamespace

    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from pipeline import api

    stopped = SimpleNamespace(sparkContext=SimpleNamespace(_jsc=None))
    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: stopped))
    monkeypatch.setattr(SparkSession, "_instantiatedSession", stopped)
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    assert api._existing_session() is None
    made = []
    monkeypatch.setattr(SparkSession, "__init__", lambda self, sc: made.append(sc))
    bare = SimpleNamespace(_jsc=object())
    monkeypatch.setattr(SparkContext, "_active_spark_context", bare)
    assert isinstance(api._existing_session(), SparkSession) and made == [bare]


def test_calls_overlapping_on_one_session_give_back_its_shuffle_partitions():
    """Two calls on one session with their own shuffle_partitions, the first ending while the
    second runs: the session's own value is back when both have ended."""
    from types import SimpleNamespace

    from pipeline import api

    conf = {"spark.sql.shuffle.partitions": "200"}
    session = SimpleNamespace(sparkContext=SimpleNamespace(master="local[2]"),
                              conf=SimpleNamespace(get=conf.__getitem__, set=conf.__setitem__))
    first = api._session(Config(shuffle_partitions=11), session, "a", {})
    second = api._session(Config(shuffle_partitions=7), session, "b", {})
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert conf["spark.sql.shuffle.partitions"] == "7"  # (the second call's, while it runs)
    second.__exit__(None, None, None)
    assert conf["spark.sql.shuffle.partitions"] == "200"


@pytest.mark.parametrize("reader", ["auto", "spark"])
def test_file_names_with_url_characters_are_names(spark, tmp_path, reader, caplog):
    """``#``, ``?``, ``%`` and spaces in a file's name are part of the name, never a URL's
    fragment, query or escape: every file is counted, in path order, by either reader (Spark
    gives its paths percent-encoded, the local listing as they are), and a rerun sees the
    input unchanged."""
    names = ["a%41 b.parquet", "part#1.parquet", "plain.parquet", "q?.parquet"]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = sample_lines(40)
    files = [lines[i::4] for i in range(4)]
    for name, rows in zip(names, files):
        pq.write_table(pa.table({"text": rows}), corpus / name)
    cfg = Config(input=str(corpus), output=str(tmp_path / "run"), vocab_size=300,
                 count_reader=reader, progress_bar=False)
    first = train(spark, cfg)
    assert_word_table(tmp_path / "run" / "words",
                      naive_count(files, special_tokens=["<|endoftext|>"]))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline"):
        train(spark, cfg)
    assert "reusing the word table" in caplog.text
    assert f"is already complete ({len(first.merges)} merges)" in caplog.text
    encoded = tmp_path / "encoded"
    encode_corpus(spark, Config(tokenizer=str(tmp_path / "run"), input=str(corpus),
                                output=str(encoded)))
    table = pq.read_table(encoded)  # every row, keyed by its file as Spark names it
    assert table.num_rows == sum(map(len, files))
    assert sorted({unquote(f).rsplit("/", 1)[1] for f in table.column("file").to_pylist()}) \
        == names


def test_a_word_table_edited_after_it_was_written_is_not_taken_for_the_one_trained(
        spark, tmp_path, caplog):
    """--words given one of our tables whose data files were edited (word_table.json left as
    it was): the digest is computed again from the data, so the rerun trains the edited table
    (it said "already complete" and kept the old merges); a copy (other file times, same
    rows) still resumes as the same table."""
    import numpy as np

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": sample_lines(60)}), corpus)
    table = tmp_path / "words"
    count_words(spark, Config(input=str(corpus), output=str(table)))
    cfg = Config(words=str(table), output=str(tmp_path / "run"), vocab_size=300,
                 progress_bar=False)
    first = train(spark, cfg).merges
    (data_file,) = (table / "data").glob("*.parquet")
    t = pq.read_table(data_file)
    counts = t.column("count").to_numpy().copy()
    top = int(np.argmax(pc.binary_length(t.column("word")).to_numpy()))
    counts[top] += 10**6  # one long word made very common: other merges win
    edited = t.set_column(1, "count", pa.array(counts, pa.int64()))
    pq.write_table(edited, data_file)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline"):
        second = train(spark, cfg).merges
    assert "is already complete" not in caplog.text
    assert "are not the ones its word_table.json lists" in caplog.text
    fresh = train(spark, Config(words=str(table), output=str(tmp_path / "fresh"),
                                vocab_size=300, progress_bar=False)).merges
    assert second == fresh != first
    copy = tmp_path / "copy"
    shutil.copytree(table, copy, copy_function=shutil.copy)  # (new modification times)
    merges_txt = (tmp_path / "fresh" / "merges.txt").read_text()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline"):
        train(spark, Config(words=str(copy), output=str(tmp_path / "fresh"), vocab_size=300,
                            progress_bar=False))
    assert "is already complete" in caplog.text
    assert (tmp_path / "fresh" / "merges.txt").read_text() == merges_txt


def test_a_dataframe_of_files_is_counted_in_path_order(spark, tmp_path):
    """A DataFrame that selects, filters or repartitions the rows of files trains as the
    files given as --input do (path order, rows in file order), although Spark schedules
    the larger file first; JSON lines (no row index: split start, then row in the split)
    too. A DataFrame of in-memory rows is counted in the order of its partitions."""
    lines = sample_lines(120)
    small, large = lines[:15], lines[15:]  # "a" sorts first, "b" is the larger file
    parquet, jsonl = tmp_path / "parquet", tmp_path / "json"
    parquet.mkdir()
    pq.write_table(pa.table({"text": small}), parquet / "a.parquet")
    pq.write_table(pa.table({"text": large}), parquet / "b.parquet")
    for name, rows in (("a", small), ("b", large)):
        spark.createDataFrame([(t,) for t in rows], "text string").coalesce(1) \
            .write.json(str(jsonl / name))

    def merges(name, frame=None, **kw):
        out = tmp_path / "runs" / name
        train(spark, Config(output=str(out), vocab_size=320, progress_bar=False, **kw),
              frame=frame)
        return (out / "merges.txt").read_text()

    ref = merges("ref", input=str(parquet))
    frames = {
        "read": spark.read.parquet(str(parquet)),
        "select": spark.read.parquet(str(parquet)).where("length(text) > 0").select("text"),
        "repartition": spark.read.parquet(str(parquet)).repartition(3),
        "json": spark.read.json(str(jsonl / "*" / "*.json")),
    }
    assert frames["read"].rdd.glom().map(len).collect()[0] == len(large)  # b's rows first
    for name, frame in frames.items():
        assert merges(name, frame) == ref, name
    reversed_rows = spark.createDataFrame([(t,) for t in large + small], "text string")
    b_then_a = f"{parquet / 'b.parquet'},{parquet / 'a.parquet'}"
    assert merges("memory", reversed_rows.coalesce(1)) == merges("b-a", input=b_then_a)
    assert merges("b-a", input=b_then_a) != ref  # (the order matters on this text)
    # sorted last (orderBy): the order asked for, not the files' (which it undid); a sort
    # that a repartition follows leaves no order to keep: the files'
    from pyspark.sql import functions as F

    by_text = sorted(lines, key=lambda t: t.encode("utf-8"))  # (Spark compares UTF-8 bytes)
    (tmp_path / "sorted").mkdir()
    pq.write_table(pa.table({"text": by_text}), tmp_path / "sorted" / "a.parquet")
    in_order = merges("sorted-file", input=str(tmp_path / "sorted"))
    assert in_order != ref
    assert merges("orderBy", spark.read.parquet(str(parquet)).orderBy("text")) == in_order
    assert merges("orderBy-coalesce", spark.read.parquet(str(parquet)).orderBy("text")
                  .coalesce(1)) == in_order  # (a coalesce joins the sorted partitions)
    assert merges("orderBy-desc", spark.read.parquet(str(parquet)).repartition(3)
                  .orderBy(F.desc("text"))) != in_order
    assert merges("orderBy-repartition", spark.read.parquet(str(parquet)).orderBy("text")
                  .repartition(3)) == ref


def test_the_api_on_an_existing_session_keeps_its_settings(spark, tmp_path, caplog,
                                                          monkeypatch):
    """Given a session (a notebook's), a call says which of its settings it cannot apply,
    applies shuffle_partitions for the call only, and leaves the session's job group and
    description as they were."""
    import pipeline.count.word_count as word_count
    from pipeline import api

    sc = spark.sparkContext
    shuffle = spark.conf.get("spark.sql.shuffle.partitions")
    assert shuffle != "11"
    seen = []  # the setting while the count runs
    count = word_count.count_words
    monkeypatch.setattr(word_count, "count_words", lambda session, *a, **k: (
        seen.append(session.conf.get("spark.sql.shuffle.partitions")), count(session, *a, **k)
    )[1])
    sc.setJobGroup("notebook-cell-7", "my analysis")
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.api"):
            api.count_words(str(SAMPLE), output=str(tmp_path / "w"), spark=spark,
                            shuffle_partitions=11, master="local[1]", count_merge="spark")
        assert seen == ["11"]
        assert f"master not applied: the Spark session already exists (its master is " \
               f"{sc.master})" in caplog.text
        assert spark.conf.get("spark.sql.shuffle.partitions") == shuffle
        assert sc.getLocalProperty("spark.jobGroup.id") == "notebook-cell-7"
        assert sc.getLocalProperty("spark.job.description") == "my analysis"
        assert api.count_words([str(SAMPLE / "part-0000{0,1}.parquet")],
                               output=str(tmp_path / "w2"))["unique_words"] > 0
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
        sc.setLocalProperty("spark.job.interruptOnCancel", None)


@pytest.mark.spark
@pytest.mark.parametrize("source", ["frame", "words"])
def test_a_new_table_from_a_dataframe_or_words_marks_the_run_incomplete_first(
        spark, tmp_path, monkeypatch, source):
    """A DataFrame or an external word table is read again on every run: when it now gives
    another table, the run's run.json goes before that table replaces RUN/words (a run
    killed after that leaves no "complete" run beside a word table it was not trained on);
    when it gives the same table, the run stays complete (and the rerun has nothing to do)."""
    import pipeline.train as train_module

    def corpus(rows: list[str]):
        if source == "frame":
            return {"frame": spark.createDataFrame([(r,) for r in rows], "text string")}
        path = tmp_path / f"words-{len(rows)}.tsv"
        counts: dict[str, int] = {}
        for r in rows:
            for w in r.split():
                counts[" " + w] = counts.get(" " + w, 0) + 1
        path.write_text("".join(f"{w}\t{c}\n" for w, c in counts.items()))
        return {"words": str(path)}

    first, second = ["some words here"] * 50, ["other words there and here"] * 40
    run = tmp_path / "run"

    def train_on(rows: list[str]):
        given = corpus(rows)
        cfg = Config(output=str(run), vocab_size=262, progress_bar=False,
                     words=given.get("words", ""))
        return train(spark, cfg, frame=given.get("frame"))

    train_on(first)
    assert (run / "run.json").exists()

    def killed(*args, **kwargs):  # the run stops right after its word table is in place
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "adopt_table_settings", killed)
    with pytest.raises(KeyboardInterrupt):
        train_on(first)  # the same table again: the run stays complete
    assert (run / "run.json").exists()
    with pytest.raises(KeyboardInterrupt):
        train_on(second)  # another table: no run.json beside it
    assert (run / "words" / "word_table.json").exists() and not (run / "run.json").exists()
    monkeypatch.undo()
    assert len(train_on(second).merges) == 5 and (run / "run.json").exists()


@pytest.mark.spark
def test_a_view_redefined_over_the_same_files_is_counted_again(spark, formats, tmp_path,
                                                               caplog):
    """--input-table naming a view: its files do not change when it is redefined (another
    filter), its definition does: the rerun counts again and trains as a fresh run on the new
    view would; the same definition again is reused."""
    caplog.set_level(logging.INFO, logger="pipeline")
    src = str(formats["parquet"] / "a")

    def define(cond: str) -> None:
        spark.read.parquet(src).where(cond).createOrReplaceTempView("corpus_redefined")

    def run(out: str):
        return train(spark, Config(input_table="corpus_redefined", output=str(tmp_path / out),
                                   vocab_size=300, progress_bar=False))

    try:
        define("length(text) % 2 = 0")
        run("run")
        define("length(text) % 2 = 1")
        caplog.clear()
        again = run("run")
        assert "recounting: the input changed" in caplog.text
        assert again.merges == run("fresh").merges
        caplog.clear()
        run("run")
        assert "reusing the word table already counted" in caplog.text
    finally:
        spark.catalog.dropTempView("corpus_redefined")


def test_a_delta_table_s_version_is_its_newest_commit(tmp_path):
    """Part of the input fingerprint of --input-format delta: a commit that adds no data
    file (a DELETE with deletion vectors) still changes the version."""
    from pipeline.count.corpus import delta_version

    log = tmp_path / "t" / "_delta_log"
    assert delta_version(None, str(tmp_path / "t")) == -1
    log.mkdir(parents=True)
    for name in ("00000000000000000000.json", "00000000000000000010.checkpoint.parquet",
                 "00000000000000000011.json", "_last_checkpoint", ".00000000000000000012.json"
                 ".tmp", "00000000000000000011.crc"):
        (log / name).write_text("{}")
    assert delta_version(None, str(tmp_path / "t")) == 11


@pytest.mark.spark
def test_a_view_s_definition_in_the_fingerprint_is_the_same_on_every_analysis(spark):
    """The analyzed plan numbers expressions and common table expressions afresh each time
    it is made (a view with WITH): what the fingerprint keeps of it does not change, so such
    a view is not counted again on every run; another definition still differs."""
    from pipeline.count.corpus import stable_plan

    spark.read.parquet(str(SAMPLE)).createOrReplaceTempView("fp_s")
    try:
        def plan(view: str) -> str:
            return spark.table(view)._jdf.queryExecution().analyzed().toString()

        for cond in (10, 20):
            spark.sql(f"CREATE OR REPLACE TEMP VIEW fp_v{cond} AS WITH c AS (SELECT text FROM "
                      f"fp_s WHERE length(text) > {cond}) SELECT * FROM c UNION ALL "
                      "SELECT * FROM c")
        first, second = plan("fp_v10"), plan("fp_v10")
        assert first != second and "CTERelationDef" in first  # (numbered afresh)
        assert stable_plan(first) == stable_plan(second) != stable_plan(plan("fp_v20"))
    finally:
        for view in ("fp_s", "fp_v10", "fp_v20"):
            spark.catalog.dropTempView(view)


def test_json_lines_under_url_and_glob_characters_and_a_first_file_without_rows(
        spark, tmp_path, caplog):
    """JSON lines in a folder with a space, files named with ``#``, ``%`` and glob characters,
    the first without a row: the schema is taken from the first file with rows, named as a
    file, not as a URI (``%20`` read as three characters: 'path does not exist') or a glob;
    counted in path order as a naive count does, and a rerun reuses the table."""
    corpus = tmp_path / "my corpus"
    corpus.mkdir()
    (corpus / "a empty.json").write_text("\n")
    lines = sample_lines(45)
    files = [lines[i::3] for i in range(3)]
    for name, rows in zip(["b#1%20.json", "c{x}.json", "d[1].json"], files):
        (corpus / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    cfg = Config(input=str(corpus), input_format="json", output=str(tmp_path / "run"),
                 vocab_size=300, progress_bar=False)
    first = train(spark, cfg)
    assert_word_table(tmp_path / "run" / "words",
                      naive_count([[], *files], special_tokens=["<|endoftext|>"]))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline"):
        train(spark, cfg)
    assert "reusing the word table" in caplog.text
    assert f"is already complete ({len(first.merges)} merges)" in caplog.text


def test_a_view_over_files_with_url_characters_in_their_names(spark, tmp_path):
    """A view's rows are attributed to its first file, named in the tasks as Spark names
    files (percent-encoded): its name with ``#`` was cut at the '#' there, and the count
    failed with a KeyError traceback."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    lines = sample_lines(40)
    files = [lines[:20], lines[20:]]
    for name, rows in zip(["a#1 %41.parquet", "b.parquet"], files):
        pq.write_table(pa.table({"text": rows}), corpus / name)
    spark.read.parquet(str(corpus)).createOrReplaceTempView("corpus_url_names")
    try:
        count_words(spark, Config(input_table="corpus_url_names", output=str(tmp_path / "w")))
    finally:
        spark.catalog.dropTempView("corpus_url_names")
    t = pq.read_table(tmp_path / "w" / "data")
    got = dict(zip(t.column("word").to_pylist(), t.column("count").to_pylist()))
    assert got == naive_count(files, special_tokens=["<|endoftext|>"]).counts


def test_a_rerun_that_skips_corrupt_files_lists_the_input_as_the_count_did(
        spark, tmp_path, caplog):
    """--ignore-corrupt-files with Spark's reader and a corrupt first file (the one Spark
    takes the schema from): the rerun's check of the input read it without skipping and
    failed ('cannot read'), on every later run of the unchanged corpus; it reuses now."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.parquet").write_bytes(b"not a parquet file\n" * 20)
    pq.write_table(pa.table({"text": sample_lines(40)}), corpus / "b.parquet")
    cfg = Config(input=str(corpus), output=str(tmp_path / "run"), vocab_size=300,
                 count_reader="spark", ignore_corrupt_files=True, progress_bar=False)
    first = train(spark, cfg)
    assert [f.rsplit("/", 1)[1] for f in first.stats["left_out_of_training"][
        "unreadable_files"]] == ["a.parquet"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline"):
        train(spark, cfg)
    assert "reusing the word table" in caplog.text


def test_num_partitions_does_not_move_a_dataframes_rows(spark, tmp_path, monkeypatch):
    """num_partitions repartitions Parquet files' rows by file, then sorts each file's rows by
    row index; a DataFrame counted by its own partitions has neither (its path is one
    literal, its row index null), so all its rows were hashed to one task and sorted on
    equal keys (in order only until the sort spilled). Its partitions are kept, and the
    count equals the one without num_partitions."""
    from pipeline import api

    moved = []
    df = spark.createDataFrame([(t,) for t in sample_lines(60)], "text string").repartition(3)
    frame_class = type(df)  # (Spark 4's classic DataFrame, which defines its own)
    real = frame_class.repartition

    def spy(self, *args, **kwargs):
        moved.append(args)
        return real(self, *args, **kwargs)

    plain = api.count_words(df, output=str(tmp_path / "a"), spark=spark)
    monkeypatch.setattr(frame_class, "repartition", spy)
    api.count_words(df, output=str(tmp_path / "b"), spark=spark, num_partitions=5)
    assert not [a for a in moved if "path" in a], moved
    assert table_rows(tmp_path / "b") == table_rows(tmp_path / "a") and plain["files"] == 1


def test_the_same_input_written_another_way_reuses_the_word_table(spark, tmp_path, monkeypatch,
                                                                  caplog):
    """A run given its input relative to where it ran, then absolute (a scheduler's command
    run from elsewhere, a trailing slash): the word table recorded the path as typed, so the
    second run recounted the whole corpus ("counted with another input"); it records the
    sources as absolute paths, compares them so, and reuses the table."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    pq.write_table(pa.table({"text": sample_lines(40)}), corpus / "part-0.parquet")
    monkeypatch.chdir(tmp_path)
    run = str(tmp_path / "run")
    first = train(spark, Config(input="c", output=run, vocab_size=300, progress_bar=False))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline"):
        again = train(spark, Config(input=f"{corpus}/", output=run, vocab_size=300,
                                    progress_bar=False))
    assert "reusing the word table" in caplog.text and "recounting" not in caplog.text
    assert again.already_done and f"is already complete ({len(first.merges)} merges)" \
        in caplog.text
