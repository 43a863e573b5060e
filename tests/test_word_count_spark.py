"""The Spark word-count stage against a naive counter (tests/naive_count.py: no code in common
with the pipeline's counting), and its error handling."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import Config, ConfigError, resolve
from pipeline.count import corpus, partials, word_count, word_table
from pipeline.count import merge as merge_stage
from pipeline.count.word_count import count_words
from pipeline.order import FirstSeenLayout
from pipeline.pretokenize import Pretokenizer, PretokenizerSpec, WordCounter

from .conftest import REPO, SAMPLE
from .naive_count import NaiveTable, assert_word_table, naive_count, word_table_differences

pytestmark = pytest.mark.spark


def naive_count_of(corpus, column: str = "text", **settings) -> NaiveTable:
    """The naive count of a corpus directory: its Parquet files sorted by path."""
    files = sorted(str(p) for p in corpus.glob("*.parquet"))
    return naive_count([pq.read_table(f).column(column).to_pylist() for f in files], **settings)


@pytest.fixture(scope="module")
def mixed_corpus(tmp_path_factory):
    """Three shards with small row groups (so Spark can split files), nulls, empty strings,
    special tokens and repeated words across files."""
    d = tmp_path_factory.mktemp("mixed")
    texts = pq.read_table(SAMPLE / "part-00000.parquet").column("text").to_pylist()[:90]
    lines = [line for t in texts for line in t.split("\n")][:1500]
    for i in range(3):
        chunk = lines[i * 500:(i + 1) * 500]
        chunk = [None if j % 37 == 0 else "" if j % 41 == 0 else
                 (s + " <|endoftext|> café 😀 naïve" if j % 13 == 0 else s)
                 for j, s in enumerate(chunk)]
        pq.write_table(pa.table({"text": pa.array(chunk, pa.string())}),
                       d / f"shard-{2 - i}.parquet", row_group_size=64)
    return d


@pytest.fixture(scope="module")
def naive_mixed(mixed_corpus) -> NaiveTable:
    table = naive_count_of(mixed_corpus, pattern="cl100k", special_tokens=["<|endoftext|>"])
    assert table.bit_widths() == (2, 9, 7)  # 3 files, rows 0..499, up to 98 words in a row
    return table


# count_merge: the tasks' partial counts merged on the driver (numpy) or by a Spark
# aggregation; count_reader: pyarrow in the tasks, or Spark's scan
@pytest.mark.parametrize("reader", ["arrow", "spark"])
@pytest.mark.parametrize("merge", ["driver", "spark"])
@pytest.mark.parametrize("partitions", [1, 3, 17])
def test_word_table_equals_the_naive_count(spark, mixed_corpus, naive_mixed, tmp_path,
                                           partitions, merge, reader):
    out = tmp_path / "words"
    cfg = Config(input=str(mixed_corpus), output=str(out), special_tokens=["<|endoftext|>"],
                 num_partitions=partitions, count_merge=merge,
                 count_reader=reader)
    count_words(spark, cfg)
    assert_word_table(out, naive_mixed)
    saved = json.loads((out / "stats.json").read_text())
    assert {k: saved[k] for k in naive_mixed.stats} == naive_mixed.stats
    assert saved["null_rows"] > 0 and saved["empty_rows"] > 0 and saved["special_tokens"] > 0


@pytest.mark.parametrize("merge", ["driver", "spark"])
def test_word_table_with_split_files(spark, mixed_corpus, naive_mixed, tmp_path, merge):
    """Spark's own file splitting (row groups of one file in different tasks) changes nothing.
    (Spark's reader: the Arrow reader plans its own slices, see plan_slices.)"""
    spark.conf.set("spark.sql.files.maxPartitionBytes", "4096")
    try:
        splits = spark.read.parquet(str(mixed_corpus)).rdd.getNumPartitions()
        assert splits > len(list(mixed_corpus.glob("*.parquet"))), splits  # files are split
        out = tmp_path / "words"
        count_words(spark, Config(input=str(mixed_corpus), output=str(out),
                                  special_tokens=["<|endoftext|>"],
                                  count_merge=merge, count_reader="spark"))
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert_word_table(out, naive_mixed)


@pytest.mark.parametrize(("merge", "reader"), [("driver", "arrow"), ("spark", "arrow"),
                                             ("spark", "spark")])
def test_dense_first_seen_when_the_packed_key_does_not_fit(spark, mixed_corpus, naive_mixed,
                                                           tmp_path, monkeypatch, merge,
                                                           reader):
    """Past 63 bits of (file, row, rank), first_seen is the dense rank: same order. The
    Spark merge's sorted frame, cached for its two passes, is released once written (it
    stayed cached for the rest of the application, beside the training's own caches)."""
    monkeypatch.setattr(FirstSeenLayout, "fit", classmethod(lambda cls, *a: None))
    out = tmp_path / "words"
    cached = spark.sparkContext._jsc.getPersistentRDDs().size()
    count_words(spark, Config(input=str(mixed_corpus), output=str(out),
                              special_tokens=["<|endoftext|>"],
                              count_merge=merge, count_reader=reader))
    assert_word_table(out, naive_mixed, dense=True)
    assert spark.sparkContext._jsc.getPersistentRDDs().size() == cached


@pytest.mark.parametrize("merge", ["driver", "spark"])
def test_long_words_are_left_out_in_their_places(spark, mixed_corpus, tmp_path, merge):
    """Words over max_word_bytes are not in the table but keep their ranks: first_seen of the
    others, and the bit widths, are as if they were there."""
    out = tmp_path / "words"
    count_words(spark, Config(input=str(mixed_corpus), output=str(out),
                              special_tokens=["<|endoftext|>"], max_word_bytes=6,
                              count_merge=merge))
    naive = naive_count_of(mixed_corpus, special_tokens=["<|endoftext|>"], max_word_bytes=6)
    assert naive.stats["long_words"] > 1000
    assert_word_table(out, naive)
    saved = json.loads((out / "stats.json").read_text())
    assert {k: saved[k] for k in naive.stats} == naive.stats


@pytest.mark.parametrize("reader", ["arrow", "spark"])
def test_binary_column_with_invalid_utf8(spark, tmp_path, reader):
    src = tmp_path / "bin"
    src.mkdir()
    values = [b"hello world", b"caf\xc3\xa9 \xff\xfe broken", None, b"", b"hello again \xff"]
    pq.write_table(pa.table({"body": pa.array(values, pa.binary())}), src / "a.parquet")
    out = tmp_path / "words"
    count_words(spark, Config(input=str(src), output=str(out), text_column="body",
                              count_reader=reader))
    stats = json.loads((out / "stats.json").read_text())
    assert stats["invalid_utf8_rows"] == 2 and stats["null_rows"] == 1 and stats["empty_rows"] == 1
    words = {bytes(r["word"]): r["count"] for r in spark.read.parquet(str(out / "data")).collect()}
    assert words[b" \xff\xfe"] == 1  # kept byte-exact, not replaced
    assert sum(len(w) * c for w, c in words.items()) == sum(len(v or b"") for v in values)
    naive = naive_count([values])
    assert_word_table(out, naive)
    assert {k: stats[k] for k in naive.stats} == naive.stats


def test_bad_inputs_fail_clearly(spark, tmp_path):
    (tmp_path / "num").mkdir()
    pq.write_table(pa.table({"text": pa.array([1, 2])}), tmp_path / "num" / "a.parquet")
    (tmp_path / "empty").mkdir()
    pq.write_table(pa.table({"text": pa.array([None, ""], pa.string())}),
                   tmp_path / "empty" / "a.parquet")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.parquet").write_bytes(b"this is not parquet at all")
    cases = [
        (Config(input=str(tmp_path / "missing"), output=str(tmp_path / "o1")), "does not exist"),
        (Config(input=str(tmp_path / "num"), output=str(tmp_path / "o2")), "not string or binary"),
        (Config(input=str(tmp_path / "num"), output=str(tmp_path / "o3"), text_column="body"),
         "not in"),
        (Config(input=str(tmp_path / "empty"), output=str(tmp_path / "o4")), "no words"),
        (Config(input=str(tmp_path / "junk"), output=str(tmp_path / "o5")),
         r"junk/a\.parquet is not a readable Parquet file \(Parquet magic bytes not found.*"
         r"--ignore-corrupt-files"),
        (Config(input=str(tmp_path / "junk"), output=str(tmp_path / "o6"), count_reader="spark"),
         r"junk/a\.parquet is not a readable Parquet file"),
        (Config(input=str(tmp_path / "junk"), output=str(tmp_path / "o7"),
                ignore_corrupt_files=True), "no readable Parquet files .*1 unreadable"),
    ]
    for cfg, msg in cases:
        with pytest.raises(ConfigError, match=msg):
            count_words(spark, cfg)
        assert not any(p.name.startswith(cfg.output.rsplit("/", 1)[1])
                       for p in tmp_path.iterdir()), "nothing half-written"


def test_count_job_exit_codes(tmp_path):
    env_cmd = [sys.executable, str(REPO / "jobs" / "count_words.py"), "--master", "local[1]"]
    bad = subprocess.run(env_cmd + ["--input", str(tmp_path / "nope"), "--output",
                                    str(tmp_path / "w")], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("error: config key 'input'")
    bad = subprocess.run(env_cmd + ["--input", str(SAMPLE), "--output", str(tmp_path / "w"),
                                    "--pattern", "(unclosed"], capture_output=True, text=True)
    assert bad.returncode == 2 and "does not compile" in bad.stderr


def test_driver_merge_falls_back_to_spark_when_the_result_is_too_big(spark, mixed_corpus,
                                                                      naive_mixed, tmp_path,
                                                                      monkeypatch, caplog):
    fetched = []

    def too_big(self, buckets=1):  # noqa: ARG001
        fetched.append(buckets)
        raise RuntimeError("Total size of serialized results is bigger than "
                           "spark.driver.maxResultSize (1024.0 MiB)")

    monkeypatch.setattr(partials.Partials, "fetch", too_big)
    out = tmp_path / "words"
    caplog.set_level(logging.WARNING, logger="pipeline")
    count_words(spark, Config(input=str(mixed_corpus), output=str(out),
                              special_tokens=["<|endoftext|>"], count_merge="driver"))
    assert fetched and "merging with Spark instead" in caplog.text  # (the fallback ran)
    assert_word_table(out, naive_mixed)


@pytest.mark.parametrize("reader", ["arrow", "spark"])
def test_auto_merges_where_the_measured_partials_fit(spark, mixed_corpus, naive_mixed, tmp_path,
                                                     caplog, reader):
    """count_merge = auto: the partial counts are measured, then merged on the driver when the
    driver budget holds them, else by Spark (from the same partials: nothing counted twice)."""
    for budget_mb, where in ((4096, "driver"), (1, "spark")):
        out = tmp_path / f"words-{budget_mb}"
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pipeline.count.word_count"):
            wt = count_words(spark, Config(input=str(mixed_corpus), output=str(out),
                                           special_tokens=["<|endoftext|>"], count_reader=reader,
                                           driver_budget_mb=budget_mb))
        line = next(r.getMessage() for r in caplog.records
                    if "count merge auto" in r.getMessage())
        assert f"count merge auto -> {where}" in line
        size = float(re.search(r"merging ([\d,.]+) MB of partial counts", line).group(1))
        assert 0 < size < 10  # measured: a few hundred kB of Arrow for this corpus
        assert (wt.table is not None) == (where == "driver")  # kept in memory when merged here
        assert_word_table(out, naive_mixed)


def test_local_listing_matches_sparks(spark, mixed_corpus, tmp_path):
    """Listing a local corpus without the JVM gives Spark's file list, and hands everything it
    cannot list exactly (globs, nested directories, bad files or columns) back to Spark."""
    d = tmp_path / "corpus"
    d.mkdir()
    for p in mixed_corpus.glob("*.parquet"):
        (d / p.name).write_bytes(p.read_bytes())
    (d / "_README.md").write_text("not data")
    (d / ".part.crc").write_bytes(b"x")
    _, spark_files = corpus.read_corpus(spark, str(d), "text")
    footers: dict = {}
    assert corpus.list_local_corpus(str(d), "text", footers) == spark_files
    assert sorted(footers) == spark_files  # read once, reused by the task plan
    assert corpus.list_local_corpus(f"file://{d}", "text") == spark_files
    one = sorted(d.glob("*.parquet"))[0]
    assert corpus.list_local_corpus(str(one), "text") == [f"file://{one}"]
    assert corpus.list_local_corpus(str(d / "*.parquet"), "text") is None  # glob
    with pytest.raises(ConfigError, match="column 'body' not in"):  # in no file: said now
        corpus.list_local_corpus(str(d), "body")
    assert corpus.list_local_corpus(str(d), "TEXT") is None  # Spark may match another case
    assert corpus.list_local_corpus(str(tmp_path / "missing"), "text") is None
    (d / "sub").mkdir()
    assert corpus.list_local_corpus(str(d), "text") is None  # nested: Spark decides


def test_arrow_reader_errors(spark, tmp_path):
    (tmp_path / "mixed").mkdir()
    pq.write_table(pa.table({"text": ["a b"]}), tmp_path / "mixed" / "a.parquet")
    pq.write_table(pa.table({"other": ["c d"]}), tmp_path / "mixed" / "b.parquet")
    # a file without the column is named (Spark's reader would give its rows as nulls)
    for reader in ("arrow", "auto"):
        with pytest.raises(ConfigError, match=r"'text' is missing from 1 of the 2 files .*"
                                              r"b\.parquet \(columns: other\)"):
            count_words(spark, Config(input=str(tmp_path / "mixed"),
                                      output=str(tmp_path / "o"), count_reader=reader))


def test_driver_digest_equals_sparks(spark, mixed_corpus, tmp_path):
    """The digest of a table counted in memory equals the one Spark computes from its files
    (a resumed run reads the table back and must find the same fingerprint)."""
    out = tmp_path / "words"
    wt = count_words(spark, Config(input=str(mixed_corpus), output=str(out),
                                   special_tokens=["<|endoftext|>"]))
    assert wt.table is not None  # (its digest, word_table.table_digest: meta["digest"])
    assert word_table.spark_table_summary(spark.read.parquet(str(out / "data"))
                                          .repartition(5))["digest"] == wt.meta["digest"]
    assert json.loads((out / "word_table.json").read_text())["digest"] == wt.meta["digest"]
    # the tokens and symbols a reused table is trusted with, against Spark's own sums
    row = spark.read.parquet(str(out / "data")).selectExpr(
        "sum(length(word) * count)", "sum(length(word))").first()
    on_disk = json.loads((out / "word_table.json").read_text())
    assert (on_disk["byte_tokens"], on_disk["byte_symbols"]) == (row[0], row[1])
    in_spark = word_table.spark_table_summary(spark.read.parquet(str(out / "data"))
                                              .repartition(3))
    assert in_spark == {k: on_disk[k] for k in ("digest", "byte_tokens", "byte_symbols")}
    changed = wt.table.set_column(1, "count", pc.add(wt.table.column("count"), 1))
    assert word_table.table_digest(changed) != wt.meta["digest"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=1, max_size=6), st.integers(1, 2**40)),
                min_size=2, max_size=30, unique_by=lambda r: r[0]),
       st.data())
def test_any_edit_of_a_word_table_changes_its_digest(rows, data):
    """Moving counts between rows (a typo fixed in the corpus), a word or a first_seen changed:
    each changes the digest; the rows' order does not."""
    words = [w for w, _ in rows]
    counts = [c for _, c in rows]
    seen = list(range(0, 3 * len(rows), 3))

    def digest(w, c, f):
        return word_table.table_digest(pa.table({"word": pa.array(w, pa.binary()),
                                                 "count": pa.array(c, pa.int64()),
                                                 "first_seen": pa.array(f, pa.int64())}))

    before = digest(words, counts, seen)
    assert digest(words[::-1], counts[::-1], seen[::-1]) == before
    i, j = data.draw(st.lists(st.integers(0, len(rows) - 1), min_size=2, max_size=2,
                              unique=True))
    moved = data.draw(st.integers(1, counts[i] - 1)) if counts[i] > 1 else 0
    if moved:
        c2 = list(counts)
        c2[i] -= moved
        c2[j] += moved
        assert digest(words, c2, seen) != before
    f2 = list(seen)
    f2[i], f2[j] = f2[j], f2[i]
    assert digest(words, counts, f2) != before
    w2 = list(words)
    w2[i] = w2[i] + b"\x00"
    if w2[i] not in words:
        assert digest(w2, counts, seen) != before


def test_the_digest_sees_a_count_moved_between_same_length_words():
    """The case the first digest missed: "cd" 3 -> 2 and "ab" 2 -> 3 (odd to even and back)."""
    def digest(c):
        return word_table.table_digest(pa.table({
            "word": pa.array([b"ab", b"cd", b"xy"], pa.binary()),
            "count": pa.array(c, pa.int64()), "first_seen": pa.array([0, 1, 5], pa.int64())}))

    assert digest([2, 3, 4]) != digest([3, 2, 4])


def test_collect_arrow_brings_every_row_in_partition_order(spark):
    """The driver's partition-at-a-time reader (used off local disk): the same rows, in the
    same order, as Spark's own collect; an empty frame keeps its schema."""
    df = spark.range(0, 5000, 1, 7).selectExpr("id", "cast(id * 3 as string) as w")
    got = word_table.collect_arrow(df)
    assert got.column("id").to_pylist() == list(range(5000))
    assert got.column("w").to_pylist() == [r["w"] for r in df.collect()]
    empty = word_table.collect_arrow(df.where("id < 0"))
    assert empty.num_rows == 0 and empty.column_names == ["id", "w"]


def test_an_ignore_corrupt_task_sends_each_file_off_before_the_next(tmp_path):
    """With ignore_corrupt_files a task counts each file apart (so that a file found damaged
    part way is left out whole): a file's counts go out as soon as the task reaches the next
    file, so that one file's words are in memory at a time; merged, they are the words of a
    task that counts all its files together, and so are the statistics."""
    from pipeline.count.corpus import ReadSlice
    from pipeline.count.word_count import _count_slices

    texts = [["one two three", "two three"], ["three four", "four five five"], ["six one"]]
    slices = []
    for i, rows in enumerate(texts):
        path = tmp_path / f"f{i}.parquet"
        pq.write_table(pa.table({"text": rows}), path)
        slices.append(ReadSlice(i, str(path), (0,), 0, path.stat().st_size, len(rows)))
    spec = PretokenizerSpec()
    stream = _count_slices(spec, "text", slices, ignore_corrupt=True)
    seen: list[set[int]] = []
    for batch in stream:
        files = set(batch.column("file").to_pylist())
        seen.append(files)
        if batch.column("kind")[0].as_py() == partials.KIND_STAT:
            break  # the first file's statistics, before the task opened the next file
    assert seen[-1] == {0, -1} and all(f <= {0, -1} for f in seen)
    apart = list(_count_slices(spec, "text", slices, ignore_corrupt=True))
    together = list(_count_slices(spec, "text", slices))
    table_apart, stats_apart = merge_stage.merge_partials(pa.Table.from_batches(apart), 3)
    table_together, stats_together = merge_stage.merge_partials(
        pa.Table.from_batches(together), 3)
    assert table_apart.sort_by("first_seen").equals(table_together.sort_by("first_seen"))
    assert stats_apart == stats_together and stats_apart["rows"] == 5


class _NoReport:
    def update(self, rows: int, nbytes: int) -> None:
        pass

    def finish(self, rows: int, nbytes: int) -> None:
        pass


def test_a_spark_reader_task_sends_each_split_off_before_the_next():
    """A Spark-reader task (JSON, text, ORC, remote Parquet) counts each (file, split) apart:
    a split's counts go out when the task reaches the next one, so one split's words are in
    memory at a time. Splits in no corpus order (Spark packs them by size), and one that comes
    back, give the word table and statistics of the same rows read in corpus order."""
    from pipeline.count.word_count import count_scanned_batches

    def scan(pieces, opened):  # pieces: (file, block, texts); rows numbered per split
        for f, block, texts in pieces:
            opened.append((f, block))
            yield pa.RecordBatch.from_pydict({
                "text": texts, "source": [0] * len(texts),
                "path": [f"file:///lake/f{f}.json"] * len(texts),
                "block": [block] * len(texts), "row": pa.array([None] * len(texts), pa.int64())})

    files = {(0, f"file:///lake/f{f}.json"): f for f in range(3)}
    rows = {(1, 0): ["one two two", "three"], (0, 0): ["two three", "one four"],
            (0, 4096): ["four four", "five"], (2, 0): ["six two", "one"]}
    packed = [(1, 0, rows[1, 0]), (0, 4096, rows[0, 4096][:1]), (0, 0, rows[0, 0]),
              (0, 4096, rows[0, 4096][1:]), (2, 0, rows[2, 0])]
    opened: list = []
    out = count_scanned_batches(PretokenizerSpec(), scan(packed, opened), files, [1, 1, 1],
                                0, _NoReport())
    first = next(out)
    assert opened == [(1, 0), (0, 4096)]  # sent once the task met the next split
    assert set(first.column("file").to_pylist()) == {1}
    batches = [first, *out]
    ordered = [(f, b, rows[f, b]) for f, b in sorted(rows)]
    expected = list(count_scanned_batches(PretokenizerSpec(), scan(ordered, []), files, [1, 1, 1],
                                          0, _NoReport()))
    got_table, got_stats = merge_stage.merge_partials(pa.Table.from_batches(batches), 3)
    want_table, want_stats = merge_stage.merge_partials(pa.Table.from_batches(expected), 3)
    assert got_table.sort_by("first_seen").equals(want_table.sort_by("first_seen"))
    assert got_stats == want_stats and got_stats["rows"] == 8

    def keys(batches):  # each word's first occurrence (file, block, row, rank) as sent
        t = pa.Table.from_batches(batches)
        t = t.filter(pc.equal(t.column("kind"), partials.KIND_WORD))
        return sorted(zip(*(t.column(c).to_pylist() for c in ("word", "count", "file",
                                                               "block", "row", "rank"))))

    assert keys(batches) == keys(expected)  # the split that came back went on numbering rows
    counted = dict(zip(got_table.column("word").to_pylist(),
                       got_table.column("count").to_pylist()))
    assert counted == {b"one": 3, b" two": 3, b"two": 1, b"three": 1, b" three": 1,
                       b" four": 2, b"four": 1, b"five": 1, b"six": 1}
    # rows numbered within their split, moved by the rows of the file's earlier splits: the
    # first_seen values of the files read whole (file 0's second split starts at its row 2)
    whole = naive_count([rows[0, 0] + rows[0, 4096], rows[1, 0], rows[2, 0]])
    assert not word_table_differences(zip(*(got_table.column(c).to_pylist() for c in
                                            ("word", "count", "first_seen"))), whole, False)


@settings(max_examples=40, deadline=None)
@given(tasks=st.lists(st.lists(st.text(alphabet="ab c\n1é", max_size=30), max_size=12),
                      min_size=1, max_size=5),
       buckets=st.sampled_from([2, 3, 8]), dense=st.booleans())
def test_a_merge_in_hash_buckets_equals_the_merge_in_one_piece(tasks, buckets, dense):
    """The driver merge split into hash buckets (for a tight driver budget) gives the same
    word table, row for row, as the merge in one piece, and the counts of all rows; with the
    packed first_seen layout and (``dense``) without it (patched for this example only: the
    fixture's monkeypatch lasts the whole test, all examples)."""
    with pytest.MonkeyPatch.context() as patch:
        if dense:
            patch.setattr(FirstSeenLayout, "fit", classmethod(lambda cls, *a: None))
        assert (FirstSeenLayout.fit(3, 10, 10) is None) == dense
        _merge_in_buckets_equals_one_piece(tasks, buckets)


def _merge_in_buckets_equals_one_piece(tasks: list[list[str]], buckets: int) -> None:
    pre = Pretokenizer(PretokenizerSpec())
    batches = []
    for file_index, rows in enumerate(tasks):  # task i counts file i
        wc = WordCounter(pre, file_index)
        for row, text in enumerate(rows):
            wc.add_row(row, text)
        batches += list(partials.partial_batches([(wc, 0, 1)]))
    one, stats = merge_stage.merge_partials(partials.BucketedPartials.of(batches, 1),
                                           len(tasks))
    split, split_stats = merge_stage.merge_partials(
        partials.BucketedPartials.of(batches, buckets), len(tasks))
    assert split.equals(one) and split_stats == stats
    every = Counter(w.encode() for rows in tasks for text in rows for w in pre.words(text))
    assert dict(zip(one.column("word").to_pylist(), one.column("count").to_pylist())) == every
    bucket_of = partials.word_buckets(one.column("word").combine_chunks(), buckets)
    assert bucket_of.min(initial=0) >= 0 and bucket_of.max(initial=0) < buckets


@pytest.mark.parametrize(("reader", "dense"), [("arrow", False), ("spark", False),
                                               ("spark", True)])
def test_count_merged_in_hash_buckets_on_the_driver(spark, mixed_corpus, naive_mixed, tmp_path,
                                                    monkeypatch, reader, dense):
    """A driver budget too tight for one piece: the count is merged in hash buckets, with the
    same word table (Spark's reader gives batches mixing words and statistics)."""
    if dense:
        monkeypatch.setattr(FirstSeenLayout, "fit", classmethod(lambda cls, *a: None))
    chosen = []

    def tight(requested, partial_bytes, budget, *args):
        chosen.append(partial_bytes)
        return "driver", 4, "count merge auto -> driver: in 4 hash buckets (test)"

    monkeypatch.setattr(word_count, "choose_count_merge", tight)
    split = partials.BucketedPartials.of
    sizes = []

    def of(batches, k):
        out = split(batches, k)
        sizes.append([sum(b.num_rows for b in bucket) for bucket in out.buckets])
        return out

    monkeypatch.setattr(partials.BucketedPartials, "of", staticmethod(of))
    out = tmp_path / "words"
    count_words(spark, Config(input=str(mixed_corpus), output=str(out),
                              special_tokens=["<|endoftext|>"], count_reader=reader))
    assert chosen and chosen[0] > 0
    assert len(sizes) == 1 and len(sizes[0]) == 4 and min(sizes[0]) > 0  # 4 real buckets
    assert_word_table(out, naive_mixed, dense=dense)


def test_the_old_count_merge_key_says_what_replaced_it(tmp_path):
    conf = tmp_path / "old.toml"
    conf.write_text("count_on_driver_max_mb = 128\n")
    with pytest.raises(ConfigError, match="unknown config key 'count_on_driver_max_mb' "
                                          r"\(replaced by count_merge"):
        resolve(["--config", str(conf), "--output", str(tmp_path / "w")])


@pytest.mark.parametrize("reader", ["arrow", "spark"])
@pytest.mark.parametrize("merge", ["driver", "spark"])
def test_partials_through_the_executors_disks_as_on_a_cluster(spark, mixed_corpus, naive_mixed,
                                                              tmp_path, monkeypatch, merge,
                                                              reader):
    """Off a local master the tasks' output stays on the executors' disks (DISK_ONLY Arrow
    records, or rows from Spark's reader) and is fetched through the driver JVM or merged by
    Spark: same word table."""
    monkeypatch.setattr(word_count, "partials_spill_dir", lambda sc: None)
    fetched = []
    iter_arrow = partials.iter_arrow
    monkeypatch.setattr(partials, "iter_arrow",
                        lambda df, **kw: fetched.append(kw) or iter_arrow(df, **kw))
    out = tmp_path / "words"
    count_words(spark, Config(input=str(mixed_corpus), output=str(out),
                              special_tokens=["<|endoftext|>"], count_merge=merge,
                              count_reader=reader))
    assert_word_table(out, naive_mixed)
    # Spark's reader's rows come to the driver one task's output at a time, never two
    assert fetched == ([{"prefetch": False}] if (reader, merge) == ("spark", "driver") else [])


@pytest.mark.parametrize("reader", ["arrow", "spark"])
def test_spilled_partials_are_removed(spark, mixed_corpus, tmp_path, monkeypatch, reader):
    """With a local master the tasks' Arrow files (whichever reader) are read by the driver
    and then deleted; nothing of them is cached in Spark."""
    made = []
    spill_dir = word_count.partials_spill_dir

    def recorded(sc):
        made.append(spill_dir(sc))
        return made[-1]

    monkeypatch.setattr(word_count, "partials_spill_dir", recorded)
    cached = set(spark.sparkContext._jsc.getPersistentRDDs())  # (other tests' fixtures)
    count_words(spark, Config(input=str(mixed_corpus), output=str(tmp_path / "words"),
                              special_tokens=["<|endoftext|>"], count_reader=reader,
                              num_partitions=3))
    assert len(made) == 1 and made[0] is not None and not os.path.exists(made[0])
    assert set(spark.sparkContext._jsc.getPersistentRDDs()) == cached


@pytest.mark.parametrize("reader", ["arrow", "spark"])
def test_the_count_heartbeat_says_rows_and_bytes_read(spark, mixed_corpus, naive_mixed,
                                                      tmp_path, reader):
    """The count stage's heartbeats carry the rows and bytes the tasks have read (and, with
    the pyarrow reader, which knows the rows from the footers, progress in rows)."""
    jsonl = tmp_path / "progress.jsonl"  # (--progress-file: count_words writes it too)
    cfg = Config(input=str(mixed_corpus), output=str(tmp_path / "words"),
                 special_tokens=["<|endoftext|>"], count_reader=reader, num_partitions=3,
                 progress_file=str(jsonl), heartbeat_seconds=60)
    count_words(spark, cfg)
    events = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert {e["job"] for e in events} == {"count_words"}
    assert events[0] == {**events[0], "stage": "count", "event": "start"}
    assert all(None not in e.values() for e in events), events  # (no nulls for a dashboard)
    assert {e.get("unit") for e in events if "done" in e} <= {"rows", "tasks"}
    end = events[-1]
    assert end["unit"] == "rows"
    rows, nbytes = naive_mixed.stats["rows"], naive_mixed.stats["bytes"]
    assert end["event"] == "end" and end["bytes_read"] == nbytes and end["bytes_per_s"] > 0
    if reader == "arrow":
        assert end["done"] == end["total"] == rows and end["tasks"] == "3/3"
    else:  # rows read (no total known before), and the reading's tasks, all done
        done, total = end["tasks"].split("/")
        assert end["done"] == rows and "total" not in end and done == total != "0"


@pytest.mark.parametrize("local", [True, False])
def test_tasks_report_what_they_have_read_while_they_run(spark, tmp_path, local):
    """With a local master a task's running totals reach the driver while it still runs
    (each task here waits until the driver has seen them); on a cluster they arrive when
    the task ends."""
    import threading
    import time

    from pyspark import TaskContext

    from pipeline.spark_session import TaskCounts

    sc = spark.sparkContext
    counts = TaskCounts.create(sc, local=local)
    go = tmp_path / "go"

    def task(_):
        report = counts.reporter(TaskContext.get().partitionId())
        report.update(5, 50)
        deadline = time.time() + 60
        while local and not go.exists() and time.time() < deadline:
            time.sleep(0.05)
        report.finish(7, 70)
        yield go.exists() or not local

    result: dict = {}
    job = threading.Thread(target=lambda: result.update(
        ok=sc.parallelize([0, 1], 2).mapPartitions(task).collect()))
    job.start()
    if local:
        deadline = time.time() + 60
        while counts.totals() != (10, 100):
            assert time.time() < deadline, counts.totals()
            time.sleep(0.05)
        assert counts.progress()[2] == 2  # (both started; Spark's tracker may still say 1)
        go.touch()
    job.join(120)
    assert result["ok"] == [True, True]
    assert counts.totals() == (14, 140)  # the end's totals replace the running ones
    assert counts.progress()[2] == (0 if local else None)
    counts.close()
    assert counts.directory is None or not os.path.exists(counts.directory)


def test_a_count_heartbeat_counts_the_tasks_of_its_phase_only(spark):
    """The share done never goes backwards when a phase starts new jobs: the reading's
    tasks exclude a warm-up job's, the merge's exclude the reading's and have no total (on
    the 1 GB cluster run the count said 80%, then 56% and 69% as the merge's jobs were added
    to the total)."""
    import time

    from pipeline.spark_session import TaskCounts, job_group, read_progress

    sc = spark.sparkContext
    counts = TaskCounts.create(sc, local=False)

    def settled(poll, want: dict) -> dict:  # the status tracker hears of jobs a bit later
        deadline = time.time() + 30
        while True:
            out = poll()
            if all(out.get(k) == v for k, v in want.items()) or time.time() > deadline:
                return out
            time.sleep(0.05)

    with job_group(sc, "phases") as group:
        poll = read_progress(sc, group, counts)
        sc.parallelize(range(4), 4).count()  # a warm-up job, before the reading
        before = settled(poll, {"done": 4})
        read_from = time.monotonic()
        counts.begin("")
        sc.parallelize(range(3), 3).count()  # the reading
        reading = settled(poll, {"done": 3})
        counts.begin("merging the partial counts (spark)")
        read_seconds = time.monotonic() - read_from
        merge_started = poll()
        sc.parallelize(range(2), 2).count()
        merging = settled(poll, {"done": 2})
        time.sleep(1.5)
        counts.phase = ""
        end = poll()
        end_span = time.monotonic() - end["rate_from"][0]  # the rate of the end line is over it
    assert (before["done"], before["total"]) == (4, None)  # not the reading: no share of all
    assert (reading["unit"], reading["done"], reading["total"]) == ("tasks", 3, 3)
    assert (merge_started["done"], merge_started["total"]) == (0, None)  # no share of all
    assert merge_started["note"] == "merging the partial counts (spark)"
    assert (merging["unit"], merging["done"], merging["total"]) == ("tasks", 2, None)
    assert merging["rate_from"][0] >= reading["rate_from"][0] and merging["tasks"] is None
    assert (end["unit"], end["tasks"], end["running"]) == ("rows", "3/3", None)  # the reading's
    assert abs(end_span - read_seconds) < 0.5, (end_span, read_seconds)  # not since the merge
    counts.close()


def _tracker_that_has_not_heard(tasks: int = 3, active: int = 3, directory: str | None = None):
    """A SparkContext stand-in whose status tracker has not heard of any of a job's ``tasks``
    ending and counts ``active`` running (its jobs: the list returned), and TaskCounts whose
    tasks read 367 rows (a cluster's), or those the tasks report in ``directory``."""
    from types import SimpleNamespace

    from pipeline.spark_session import TaskCounts

    stage = SimpleNamespace(numTasks=tasks, numCompletedTasks=0, numActiveTasks=active)
    jobs: list[int] = []
    tracker = SimpleNamespace(
        getJobIdsForGroup=lambda group: list(jobs),
        getJobInfo=lambda job: SimpleNamespace(status="RUNNING", stageIds=[7]),
        getStageInfo=lambda stage_id: stage)
    counts = TaskCounts(directory, SimpleNamespace(
        value={} if directory else {0: (367, 125_900)}))
    return SimpleNamespace(statusTracker=lambda: tracker), jobs, counts


def test_the_end_line_counts_the_readings_tasks_done_before_spark_s_tracker_does():
    """Spark's status tracker hears of tasks ending through its listener bus, a little late:
    an encode whose job took 0.1 s ended with "tasks 0/3" (once in a suite run). The reading
    has ended when the next phase begins, so the end line says all its tasks are done."""
    from pipeline.spark_session import read_progress

    sc, jobs, counts = _tracker_that_has_not_heard()
    poll = read_progress(sc, "g", counts)
    counts.begin("")
    jobs.append(1)  # the reading's job
    running = poll()  # while it runs: what the tracker says
    assert (running["unit"], running["done"], running["total"]) == ("tasks", 0, 3)
    counts.begin("merging")  # the count: the phase after the reading
    counts.phase = ""  # the stage's end line
    end = poll()
    assert (end["unit"], end["done"], end["tasks"]) == ("rows", 367, "3/3")


def test_the_encodes_end_line_counts_its_tasks_done_before_spark_s_tracker_does():
    """The encode has no phase after its reading: its end line took the tracker's figures,
    which may not have heard of the tasks' ends ("tasks 0/3" after a 0.1 s job, once in a
    suite run); it marks the reading's end, and the end line says 3/3."""
    from pipeline.spark_session import read_progress

    sc, jobs, counts = _tracker_that_has_not_heard()
    counts.total_rows = 367
    poll = read_progress(sc, "g", counts)
    counts.begin("")
    jobs.append(1)  # the encode's job
    assert poll()["tasks"] == "0/3"  # while it runs: what the tracker says
    counts.end_reading()  # as _encode_into does once its write has returned
    end = poll()
    assert (end["unit"], end["done"], end["tasks"]) == ("rows", 367, "3/3")


def test_running_tasks_are_those_that_started_not_what_the_tracker_heard(tmp_path):
    """Spark's tracker throttles its live updates: on the 1 GB count it said 'running 1' for
    15 s while both tasks ran. With a local master a task counts as running from its start
    (before it has read a row) until it ends."""
    from pipeline.spark_session import read_progress

    sc, jobs, counts = _tracker_that_has_not_heard(tasks=4, active=1, directory=str(tmp_path))
    poll = read_progress(sc, "g", counts)
    counts.begin("")
    jobs.append(1)  # the reading's job
    assert poll()["running"] == 1  # no task has reported: the tracker's figure
    first, second = counts.reporter(0), counts.reporter(1)  # both started, none read yet
    assert poll()["running"] == 2
    first.update(10, 100)
    assert poll()["running"] == 2 and counts.totals() == (10, 100)
    first.finish(12, 120)
    second.finish(3, 30)
    assert counts.totals() == (15, 150)
    assert poll()["running"] == 1  # none left by the tasks: the tracker's again


def test_a_word_table_replaces_only_a_word_table(spark, tmp_path):
    """count_words over a directory of other files, or over a file, is refused before any work
    and nothing is lost; over an earlier word table (or an empty directory) it is replaced."""
    out = tmp_path / "victim"
    out.mkdir()
    (out / "keep.txt").write_text("important")
    cfg = Config(input=str(SAMPLE), output=str(out))
    with pytest.raises(ConfigError, match=f"^config key 'output': {out} exists and is not a "
                                          r"word table \(it holds keep.txt\): refusing"):
        count_words(spark, cfg)
    assert (out / "keep.txt").read_text() == "important"
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match="afile is a file, not a directory: refusing"):
        count_words(spark, Config(input=str(SAMPLE), output=str(tmp_path / "afile")))
    assert (tmp_path / "afile").read_text() == "x"
    (tmp_path / "empty").mkdir()
    first = count_words(spark, Config(input=str(SAMPLE), output=str(tmp_path / "empty")))
    again = count_words(spark, Config(input=str(SAMPLE), output=str(tmp_path / "empty")))
    assert again.meta["digest"] == first.meta["digest"]
    r = subprocess.run([sys.executable, str(REPO / "jobs" / "count_words.py"), "--input",
                        str(tmp_path / "empty"), "--output", str(tmp_path / "empty")],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and r.stderr.splitlines()[-1].startswith(
        f"error: config key 'output': {tmp_path / 'empty'} overlaps --input "), r.stderr[-500:]
    assert (tmp_path / "empty" / "word_table.json").exists()


@pytest.mark.parametrize("split", [False, True])
def test_the_spark_merge_aggregates_packed_keys_with_a_hash_map(spark, split):
    """The Spark merge packs each partial row's first key before grouping, so Spark plans a
    hash aggregation (the minimum of a struct makes it sort every partial row: about 2.5x the
    time on the 1 GB corpus), and its table equals the driver merge's on the same partial counts
    (rows numbered within file splits too, whose offsets are added before the minimum)."""
    pre = Pretokenizer(PretokenizerSpec())
    texts = [["the cat", "a dog and the cat"], ["dog dog", "the end"], ["cat and a bird"]]
    counted = []
    for i, rows in enumerate(texts):  # split: file 0 in two splits (blocks 0 and 100)
        file, block = (0, 100 * i) if split and i < 2 else (i, 0)
        wc = WordCounter(pre, file)
        for row, text in enumerate(rows):
            wc.add_row(row, text)
        extra = {f"{partials.SPLIT_ROWS}{file}:{block}": len(rows)} if split else {}
        last = {f"{partials.SPLIT_LAST_ROW}{file}:{block}": wc.max_row} if split else {}
        counted += list(partials.partial_batches([(wc, block, 1)], extra, extra_max=last))
    expected, expected_stats = merge_stage.merge_partials(pa.Table.from_batches(counted), 3)
    frame = spark.createDataFrame(pa.Table.from_batches(counted).to_pandas(),
                                  partials.PARTIAL_SCHEMA)
    side = [b.filter(pc.not_equal(b.column(0), partials.KIND_WORD)) for b in counted]
    stats = merge_stage._side_stats(side)
    layout, splits = merge_stage._layout(stats, 3)
    assert layout is not None and (splits is not None) == split
    # the statistics of these rows, spelled out (5 rows, 52 bytes, 2+5+2+2+4 words), as the
    # Spark merge's side and as the driver merge's
    spelled = {"rows": 5, "bytes": 52, "words": 15, "null_rows": 0, "empty_rows": 0}
    assert {k: stats[k] for k in spelled} == spelled
    assert {k: expected_stats[k] for k in spelled} == spelled
    table = merge_stage.spark_word_table(frame, layout, splits, [])
    plan = table._jdf.queryExecution().executedPlan().toString()
    assert "HashAggregate" in plan and "SortAggregate" not in plan, plan
    got = pa.Table.from_pylist([r.asDict() for r in table.collect()]).sort_by("first_seen")
    assert got.column("word").to_pylist() == expected.column("word").to_pylist()
    assert got.column("count").to_pylist() == expected.column("count").to_pylist()
    assert got.column("first_seen").to_pylist() == expected.column("first_seen").to_pylist()


def test_a_word_table_write_that_fails_names_its_file(tmp_path):
    """pyarrow's error on a full disk names no file: the word table's writer adds it, so the
    job's one line says which file could not be written."""
    import resource
    import signal

    data = tmp_path / "words.tmp-1" / "data"
    table = pa.table({"word": [b"w%d" % i for i in range(20000)],
                      "count": list(range(20000)), "first_seen": list(range(20000))})
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, old[1]))
    try:
        with pytest.raises(OSError) as err:
            word_table.write_table_data(None, table, str(data))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert err.value.filename == str(data / "part-00000.parquet") and err.value.errno == 27
