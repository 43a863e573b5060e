"""Training through Spark: engines equal the oracle; the job end to end."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.bpe import bytes_vocab, initial_words, train_oracle
from pipeline.config import Config
from pipeline.count.word_table import WORD_TABLE_SCHEMA
from pipeline.encoder import Tokenizer
from pipeline.engines.rounds import run_rounds
from pipeline.engines.spark import SparkPartitions
from pipeline.train import train

from .conftest import EN_DOCS, REPO, need_corpus

pytestmark = pytest.mark.spark


def word_df(spark, words: list[bytes], counts: list[int]):
    rows = [(w, c, i * 5 + 1) for i, (w, c) in enumerate(zip(words, counts))]
    return spark.createDataFrame(rows, WORD_TABLE_SCHEMA)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.text(alphabet="ab ", min_size=1, max_size=10), min_size=2, max_size=25,
                unique=True),
       st.sampled_from([1, 2, 7]), st.sampled_from([1, 256]), st.sampled_from([1, 64]),
       st.data())
def test_spark_rounds_equal_oracle(spark, texts, parts, max_batch, chunk_bytes, data):
    words = [t.encode() for t in texts]
    counts = data.draw(st.lists(st.integers(1, 5), min_size=len(words), max_size=len(words)))
    ids, base = initial_words(words)
    expected = train_oracle(ids, counts, base.tokens, 25, 1)
    # one word per chunk record (1 byte), or a few words per record (64): either way a
    # partition's words span many records
    blocks = SparkPartitions(spark, word_df(spark, words, counts), parts, base,
                             chunk_bytes=chunk_bytes)
    try:
        res = run_rounds(blocks, [1] * 256, 25, 1, None, max_batch)
        if chunk_bytes == 1:
            assert blocks.chunk_count == len(words)
        else:
            assert blocks.chunk_count < len(words) or len(words) <= parts
    finally:
        blocks.close()
    assert res.merges == expected


def test_partition_states_go_when_building_them_fails(spark, monkeypatch):
    """A partition whose state cannot be built (here a character the chars vocabulary does
    not have; a full disk or a SIGTERM alike) fails the build: the states the other tasks
    had built stayed on the executors' disks (the engine's close() was never reached)."""
    import uuid

    from pipeline.engines import spark as spark_engine
    from pipeline.engines.partition import scratch_root

    good = [f"ab{i % 7}ba".encode() for i in range(3)]
    _, base = initial_words(good, alphabet="chars")
    # the range partitions split the words in first-seen order: short words first (a state
    # built at once), long ones after, the one that fails at their end
    short = [("ab" * (i % 2 + 1)).encode() for i in range(75_000)]
    long = [("ab" * (i % 20 + 40)).encode() for i in range(75_000)] + [b"abz"]  # z: unknown
    words = good + short + long
    def left(run: str):
        def states(_):
            root = os.path.join(scratch_root(), f"spark-bpe-{run}")
            yield sorted(os.listdir(root)) if os.path.isdir(root) else []
        return spark.sparkContext.parallelize([0], 1).mapPartitions(states).collect()[0]

    for removed in (False, True):  # without the removal first: states were built, and left
        fixed = uuid.UUID(int=0xB0B + removed)
        monkeypatch.setattr(spark_engine.uuid, "uuid4", lambda fixed=fixed: fixed)
        if not removed:
            monkeypatch.setattr(SparkPartitions, "_remove_states", lambda self, rdd: None)
        with pytest.raises(Exception, match=r"KeyError: .*'z'|'z'.*KeyError"):
            SparkPartitions(spark, word_df(spark, words, [1] * len(words)), 2, base)
        monkeypatch.undo()
        assert (left(fixed.hex[:12]) == []) == removed, removed


def test_a_half_changed_partition_state_is_rebuilt_from_the_word_table(spark):
    """A task killed while it changes a partition's arrays leaves the state dirty: the next
    round reports the partition lost, the driver rebuilds it from its chunks with the merges
    so far replayed, runs the round again, and the merges stay the oracle's."""
    from pipeline.engines.partition import PartitionStore

    words = [b"ab", b"ba", b"aab", b"abb", b"bab", b"aa", b"bb", b"abab", b"baba", b"abc", b"bca",
             b"cab", b"cc"]
    counts = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9]
    ids, base = initial_words(words)
    expected = train_oracle(ids, counts, base.tokens, 12, 1)
    parts = SparkPartitions(spark, word_df(spark, words, counts), 2, bytes_vocab())
    run = parts.run

    def spoil(new, removed, stats) -> None:
        if stats.rounds != 4:
            return
        dirs = parts.holders.mapPartitionsWithIndex(
            lambda i, it: [PartitionStore(run, i).dir] if sum(1 for _ in it) else []).collect()
        state = dirs[-1] + "/state.json"
        with open(state) as fh:
            meta = json.load(fh)
        with open(state, "w") as fh:
            json.dump({**meta, "dirty": True}, fh)

    try:
        res = run_rounds(parts, [1] * 256, 12, 1, None, 1, on_round=spoil)
        assert parts.rebuilds == 1 and res.stats.rounds == 12
    finally:
        parts.close()
    assert res.merges == expected


def test_the_engine_leaves_no_broadcast_behind_and_keeps_rare_pairs_on_the_executors(
        spark, monkeypatch):
    """The merge history is broadcast again every HISTORY_EVERY rounds: the copies no task
    reads any more are destroyed (their files in the driver's temp directory went only when
    the context stopped), the holders' own kept while they live, all of them at close, with
    a rebuild on the way and the merges the oracle's. The initial counts bring the driver
    only the pairs counted at least min_pair_count times."""
    from pipeline.engines import spark as spark_engine
    from pipeline.engines.partition import PartitionStore
    from pipeline.engines.rounds import InProcessPartitions

    words = [b"ab", b"ba", b"aab", b"abb", b"bab", b"aa", b"bb", b"abab", b"baba", b"abc", b"bca",
             b"cab", b"cc", b"xyz"]
    counts = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 1]
    ids, base = initial_words(words)
    expected = train_oracle(ids, counts, base.tokens, 12, 1)
    made = []
    broadcast = type(spark.sparkContext).broadcast
    monkeypatch.setattr(type(spark.sparkContext), "broadcast",
                        lambda sc, value: made.append(broadcast(sc, value)) or made[-1])
    monkeypatch.setattr(spark_engine, "HISTORY_EVERY", 2)
    parts = SparkPartitions(spark, word_df(spark, words, counts), 2, bytes_vocab())
    run, alive = parts.run, []

    def spoil(new, removed, stats) -> None:
        alive.append(sum(os.path.exists(b._path) for b in made))
        if stats.rounds == 5:  # (a rebuild: the holders' broadcast changes)
            dirs = parts.holders.mapPartitionsWithIndex(
                lambda i, it: [PartitionStore(run, i).dir] if sum(1 for _ in it) else []
            ).collect()
            with open(dirs[0] + "/state.json") as fh:
                meta = json.load(fh)
            with open(dirs[0] + "/state.json", "w") as fh:
                json.dump({**meta, "dirty": True}, fh)

    try:
        rare = parts.initial_counts(2)
        every = InProcessPartitions([(*initial_symbols_of(words), np.array(counts))],
                                    256).initial_counts()
        often = {k for k, d in zip(every.keys.tolist(), every.deltas.tolist()) if d >= 2}
        assert set(rare.keys.tolist()) == often and len(often) < len(every.keys)
        res = run_rounds(parts, [1] * 256, 12, 1, None, 1, on_round=spoil)
        assert parts.rebuilds == 1 and res.stats.rounds == 12
    finally:
        parts.close()
    assert res.merges == expected
    assert len(made) >= 7 and max(alive) <= 4, alive  # base, holders', current, one replaced
    assert not [b._path for b in made if os.path.exists(b._path)]


def initial_symbols_of(words: list[bytes]):
    lengths = np.array([len(w) for w in words], dtype=np.int64)
    return np.frombuffer(b"".join(words), dtype=np.uint8).astype(np.int32), lengths


@pytest.fixture(scope="module")
def en_slice(tmp_path_factory):
    """About 250 KB of en-docs, in corpus order, as two shards."""
    src = need_corpus(EN_DOCS)
    texts = pq.read_table(src / "part-00000.parquet").column("text").to_pylist()
    picked, size = [], 0
    for t in texts:
        if size > 250_000:
            break
        picked.append(t)
        size += len(t.encode())
    d = tmp_path_factory.mktemp("enslice")
    half = len(picked) // 2
    pq.write_table(pa.table({"text": picked[:half]}), d / "part-0.parquet")
    pq.write_table(pa.table({"text": picked[half:]}), d / "part-1.parquet")
    return d


def test_en_docs_slice_spark_and_local_equal_oracle(spark, en_slice, tmp_path, monkeypatch,
                                                    caplog):
    from pipeline import memory
    from pipeline.engines import spark as spark_engine

    caplog.set_level(logging.INFO, logger="pipeline.engines.spark")
    from pipeline.count.word_count import count_words

    # auto: a driver budget of 1 MB per symbol, so that ``driver_budget_mb`` = 3/4 of the
    # table's symbols means Spark rounds until the working set shrinks to that, then the driver
    monkeypatch.setattr(memory, "LOCAL_BYTES_PER_SYMBOL", 1 << 20)
    monkeypatch.setattr(memory, "DRIVER_BASE_BYTES", 0)
    # the hand-off in pieces of at most 997 tokens: many per partition, reassembled in order
    monkeypatch.setattr(spark_engine, "HANDOFF_TOKENS", 997)

    wt = count_words(spark, Config(input=str(en_slice), output=str(tmp_path / "w")))
    table = pq.read_table(wt.data_path).sort_by("first_seen")
    words = table.column("word").to_pylist()
    counts = table.column("count").to_pylist()
    ids, base = initial_words(words)
    n = 500
    expected = train_oracle(ids, counts, base.tokens, n)
    runs = {}
    symbols = sum(len(w) for w in words)
    for engine in ("spark", "local", "auto"):
        cfg = Config(words=str(tmp_path / "w"), output=str(tmp_path / engine), num_merges=n,
                     engine=engine, num_partitions=3, progress_bar=False,
                     driver_budget_mb=symbols * 3 // 4)
        runs[engine] = train(spark, cfg).merges
    assert runs["local"] == expected
    assert runs["spark"] == expected
    assert runs["auto"] == expected
    stats = json.loads((tmp_path / "spark" / "stats.json").read_text())
    assert stats["spark_rounds"] < n / 4
    auto = json.loads((tmp_path / "auto" / "stats.json").read_text())
    assert auto["engine"] == "spark" and 0 < auto["handoff_to_driver_at_merge"] < n
    assert auto["engine_decision"].startswith("engine auto -> spark: the driver engine needs")
    pieces = re.findall(r"handing the working set to the driver: \d+ words, (\d+) tokens, "
                        r"in (\d+) pieces", caplog.text)
    assert len(pieces) == 1 and int(pieces[0][1]) >= int(pieces[0][0]) // 997 > 3, pieces


def run_job(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "jobs" / "train.py"), "--master",
                           "local[2]", *args], capture_output=True, text=True, cwd=cwd)


def test_seed_examples_through_the_pipeline(spark, tmp_path):
    """The seeds' worked examples, from command-line flags through count, train and the
    trace (in this process; the job's own entry point is run by the fault and job tests)."""
    from pipeline.config import resolve, validate

    def run(*args: str) -> list[list[str]]:
        train(spark, validate(resolve([*args, "--no-progress-bar"]), "train"))
        out = Path(args[args.index("--output") + 1])
        lines = (out / "trace.tsv").read_text(encoding="utf-8").splitlines()
        return [line.split("\t") for line in lines[1:]]

    src = tmp_path / "seed"
    src.mkdir()
    pq.write_table(pa.table({"text": ["aaabdaaabac"]}), src / "a.parquet")
    rows = run("--input", str(src), "--output", str(tmp_path / "run"), "--pattern", "none",
               "--num-merges", "3", "--special-tokens", "", "--min-pair-count", "1")
    assert [x[1:] for x in rows] == [
        ["a", "a", "aa", "4", "9"], ["aa", "a", "aaa", "2", "7"], ["aaa", "b", "aaab", "2", "5"]]
    # the review, character start, seed 000's split
    src2 = tmp_path / "review"
    src2.mkdir()
    pq.write_table(pa.table({"text": ["the café baker bakes cakes, the café bakes soufflé"]}),
                   src2 / "a.parquet")
    rows = run("--input", str(src2), "--output", str(tmp_path / "run2"), "--pattern",
               r" ?\w+|[^\w\s]", "--alphabet", "chars", "--num-merges", "5",
               "--special-tokens", "", "--engine", "spark")
    assert [(x[1], x[2], x[4], x[5]) for x in rows] == [
        ("a", "k", "4", "46"), ("ak", "e", "4", "42"), (" ", "c", "3", "39"),
        (" ", "b", "3", "36"), (" b", "ake", "3", "33")]
    # its report counts the corpus in UTF-8 bytes and in symbols (characters) apart
    text = "the café baker bakes cakes, the café bakes soufflé"
    page = (tmp_path / "run2" / "report.html").read_text(encoding="utf-8")
    assert f"{len(text.encode()):,} bytes in words; {len(text):,} → 33 tokens" in page


def test_job_config_errors_are_one_line_and_write_nothing(tmp_path):
    """(Reruns: test_faults.test_vocab_size_changes_reuse_the_run_and_reruns_are_no_ops.)"""
    for args, expected in [(["--input", str(tmp_path / "nope")], "path does not exist: "
                            f"{tmp_path / 'nope'} (a path without a scheme is a local one: "
                            "write hdfs://"),
                           (["--vocab-size", "100"], "vocab_size"),
                           (["--engine", "fast"], "'engine'")]:
        r = run_job(*args, "--output", str(tmp_path / "x"))
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("error: config key") and expected in last, last
    assert not (tmp_path / "x").exists()


def test_deferred_session_is_created_only_when_used(spark, tmp_path):
    """A run that reads a local corpus with pyarrow and trains on the driver never creates the
    SparkSession (2.7 s in a fresh JVM); Spark SQL work creates it on first use, and the merge
    list is the same as with a real session."""
    from pyspark.sql import SparkSession

    from pipeline.spark_session import DeferredSession, start_session

    from .conftest import SAMPLE

    lazy = DeferredSession(SparkSession.builder, spark.sparkContext, lambda s: None)
    assert lazy.sparkContext.parallelize(range(3), 2).sum() == 3 and not lazy.created
    cfg = Config(input=str(SAMPLE), output=str(tmp_path / "lazy"), vocab_size=400,
                 special_tokens=["<|endoftext|>"], progress_bar=False)
    old_mask = os.umask(0o022)
    try:
        lazy_run = train(lazy, cfg)
    finally:
        os.umask(old_mask)
    assert not lazy.created, "the fast path must not need a SparkSession"
    for name in ("merges.txt", "run.json", "tokenizer.json", "words/word_table.json"):
        assert stat.S_IMODE((tmp_path / "lazy" / name).stat().st_mode) == 0o644, name
    # a run on a local word table of ours (--words) needs no session either (it started one
    # in the background, seconds of JVM work beside the driver's merges)
    again = DeferredSession(SparkSession.builder, spark.sparkContext, lambda s: None)
    words_run = train(again, Config(**{**cfg.__dict__, "input": "", "output": str(
        tmp_path / "from-words"), "words": str(tmp_path / "lazy" / "words")}))
    assert not again.created and words_run.merges == lazy_run.merges
    eager_run = train(spark, Config(**{**cfg.__dict__, "output": str(tmp_path / "eager")}))
    assert lazy_run.merges == eager_run.merges and len(lazy_run.merges) == 400 - 257
    assert lazy.range(4).count() == 4 and lazy.created and lazy.session() is spark
    early = DeferredSession(SparkSession.builder, spark.sparkContext, lambda s: None)
    start_session(early)
    assert early.created and early.session() is spark


def test_a_deferred_sessions_hooks_have_run_for_every_thread_that_uses_it():
    """The thread that uses the session first runs the hooks; another thread using it at the
    same time waits until they have run (the warm-up thread must not let the reading thread
    read before its setting is made); a hook that raises leaves the next ones queued; a
    hook whose block has ended never runs."""
    import threading
    import time
    from types import SimpleNamespace

    from pipeline.spark_session import DeferredSession

    made = SimpleNamespace(conf={})
    builder = SimpleNamespace(getOrCreate=lambda: made)
    lazy = DeferredSession(builder, None, lambda s: None)
    in_hook = threading.Event()

    def slow_setting(session) -> None:
        in_hook.set()
        time.sleep(0.5)
        session.conf["k"] = "set"

    seen: dict = {}
    with lazy.when_created(lambda s: None), lazy.when_created(slow_setting):
        first = threading.Thread(target=lazy.session)
        first.start()
        assert in_hook.wait(5)
        seen["other"] = dict(lazy.session().conf)  # the hook runs in the other thread
        first.join()
    assert seen["other"] == {"k": "set"}

    failing = DeferredSession(builder, None, lambda s: None)
    calls: list[str] = []

    def boom(session) -> None:
        calls.append("boom")
        raise RuntimeError("boom")

    with failing.when_created(boom), failing.when_created(lambda s: calls.append("next")):
        with pytest.raises(RuntimeError):
            failing.session()
        failing.session()
    assert calls == ["boom", "next"]
    ended = DeferredSession(builder, None, lambda s: None)
    with ended.when_created(lambda s: calls.append("late")):
        pass
    ended.session()
    assert calls == ["boom", "next"]


def test_corrupt_file_setting_reaches_a_session_created_while_reading(spark):
    """skipping_corrupt_files does not create a deferred session, but when Spark SQL creates
    it inside the block the setting holds there, and the session's own value comes back
    after; outside any block nothing is set."""
    from pyspark.sql import SparkSession

    from pipeline.count.corpus import IGNORE_CORRUPT_KEY, skipping_corrupt_files
    from pipeline.spark_session import DeferredSession

    spark.conf.set(IGNORE_CORRUPT_KEY, "false")
    try:
        unused = DeferredSession(SparkSession.builder, spark.sparkContext, lambda s: None)
        with skipping_corrupt_files(unused, True):
            pass
        assert not unused.created
        assert unused.conf.get(IGNORE_CORRUPT_KEY) == "false"  # (the hook went with the block)
        lazy = DeferredSession(SparkSession.builder, spark.sparkContext, lambda s: None)
        with skipping_corrupt_files(lazy, True):
            assert not lazy.created
            assert lazy.conf.get(IGNORE_CORRUPT_KEY) == "true"  # created here, set for the read
        assert lazy.conf.get(IGNORE_CORRUPT_KEY) == "false"
    finally:
        spark.conf.unset(IGNORE_CORRUPT_KEY)


def test_a_table_that_cut_special_tokens_after_normalization_is_recounted(spark, tmp_path,
                                                                          caplog):
    """Tables from before special tokens were found in the raw text are recounted when
    lowercasing or normalization could make the difference, and reused otherwise."""
    import logging

    src = tmp_path / "c"
    src.mkdir()
    pq.write_table(pa.table({"text": ["Ab<|ENDOFTEXT|>cd ab<|endoftext|>ab cd"] * 3}),
                   src / "a.parquet")
    caplog.set_level(logging.INFO, logger="pipeline")
    for lowercase in (True, False):
        run = tmp_path / f"run-{lowercase}"
        cfg = Config(input=str(src), output=str(run), num_merges=3, lowercase=lowercase,
                     min_pair_count=1, progress_bar=False)
        first = train(spark, cfg).merges
        meta_path = run / "words" / "word_table.json"
        meta = json.loads(meta_path.read_text())
        assert meta["special_tokens_cut"] == "before normalization"
        del meta["special_tokens_cut"]  # as an older version wrote it
        meta_path.write_text(json.dumps(meta))
        (run / "run.json").unlink()
        caplog.clear()
        assert train(spark, cfg).merges == first
        recounted = "cut special tokens after normalization" in caplog.text
        assert recounted == lowercase, caplog.text
        assert ("reusing the word table" in caplog.text) == (not lowercase)


def test_a_recount_marks_the_run_incomplete_when_its_table_replaces_the_old(spark, tmp_path,
                                                                           monkeypatch):
    """A rerun over a grown input recounts into RUN/words. Killed while it counts, the earlier
    run stays complete (its run.json beside its own table); killed once the new table has
    replaced the old one, no run.json is left beside the new table."""
    import pipeline.count.run_table as run_table  # where train calls the count

    src = tmp_path / "lake"
    src.mkdir()
    pq.write_table(pa.table({"text": ["ab ab cd cd ab"] * 3}), src / "a.parquet")
    run = tmp_path / "run"
    cfg = Config(input=str(src), output=str(run), num_merges=3, min_pair_count=1,
                 progress_bar=False)
    train(spark, cfg)
    table = (run / "words" / "word_table.json").read_bytes()
    pq.write_table(pa.table({"text": ["ef ef gh"] * 3}), src / "b.parquet")
    real_count_words = run_table.count_words

    def killed_while_counting(*args, **kwargs):
        raise KeyboardInterrupt  # as a kill during the count would end it

    monkeypatch.setattr(run_table, "count_words", killed_while_counting)
    with pytest.raises(KeyboardInterrupt):
        train(spark, cfg)
    assert (run / "run.json").exists()
    assert (run / "words" / "word_table.json").read_bytes() == table
    assert Tokenizer.load(str(run)).encode("ab cd")

    def killed_after_publishing(*args, **kwargs):
        real_count_words(*args, **kwargs)
        raise KeyboardInterrupt  # a kill right after the new table replaced the old one

    monkeypatch.setattr(run_table, "count_words", killed_after_publishing)
    with pytest.raises(KeyboardInterrupt):
        train(spark, cfg)
    assert (run / "words" / "word_table.json").read_bytes() != table
    assert not (run / "run.json").exists()


# one occurrence of "cd" (count 3, odd) becomes "ab" (count 2, even): the same length
MOVED_BEFORE = ["ab", "cd", "cd", "cd", "ab", "xy", "xy", "xy", "xy"]
MOVED_AFTER = ["ab", "cd", "cd", "ab", "ab", "xy", "xy", "xy", "xy"]


def train_rows(spark, src: Path, rows: list[str], out: Path) -> list:
    """Two merges of ``rows`` (each a word), written as src/part-0.parquet, into ``out``
    (a checkpoint after each merge)."""
    pq.write_table(pa.table({"text": rows}), src / "part-0.parquet")
    return train(spark, Config(input=str(src), output=str(out), vocab_size=258,
                               pattern="none", special_tokens=[], min_pair_count=1,
                               checkpoint_every_merges=1, progress_bar=False)).merges


def test_an_edit_that_moves_one_count_is_not_served_the_old_merges(spark, tmp_path):
    """One occurrence of "cd" (count 3, odd) becomes "ab" (count 2, even), the same length:
    the old table digest (a linear hash combined by XOR) did not change, so the rerun
    resumed the old corpus's checkpoint and trained (c, d) first instead of (a, b)."""
    src = tmp_path / "in"
    src.mkdir()
    train_rows(spark, src, MOVED_BEFORE, tmp_path / "run")
    os.utime(src / "part-0.parquet", ns=(1, 1))  # the listing changes: a recount
    again = train_rows(spark, src, MOVED_AFTER, tmp_path / "run")
    assert again == train_rows(spark, src, MOVED_AFTER, tmp_path / "fresh")
    assert [(m.left, m.right) for m in again] == [(ord("x"), ord("y")), (ord("a"), ord("b"))]


def test_large_arrow_types_from_spark_change_nothing(spark, tmp_path):
    """With spark.sql.execution.arrow.useLargeVarTypes on, Spark's Arrow batches carry int64
    offsets (large_binary): the Spark engine and Spark's reader give the same merges."""
    sample = REPO / "data" / "sample"
    kw = dict(input=str(sample), vocab_size=300, progress_bar=False)
    ref = train(spark, Config(output=str(tmp_path / "ref"), engine="local", **kw)).merges
    spark.conf.set("spark.sql.execution.arrow.useLargeVarTypes", "true")
    try:
        got = train(spark, Config(output=str(tmp_path / "large"), engine="spark",
                                  count_reader="spark", **kw)).merges
    finally:
        spark.conf.unset("spark.sql.execution.arrow.useLargeVarTypes")
    assert got == ref and len(ref) == 300 - 257


def test_a_complete_run_with_a_new_name_or_a_lost_file_is_published_again(spark, tmp_path,
                                                                           caplog):
    """'Already complete' only while the run's files are the ones it wrote, under the name
    asked for: a rerun with another --name, or after an export was deleted, writes the
    outputs again from the checkpoint (no training); an unchanged rerun does nothing."""
    caplog.set_level(logging.INFO, logger="pipeline")
    run = tmp_path / "run"
    kw = dict(input=str(REPO / "data" / "sample"), output=str(run), vocab_size=300,
              progress_bar=False)
    first = train(spark, Config(**kw))
    assert train(spark, Config(**kw)).already_done
    renamed = train(spark, Config(name="team-bpe", **kw))
    assert not renamed.already_done and renamed.merges == first.merges
    assert renamed.stats["resumed_from_merge"] == len(first.merges)  # served, not trained
    assert json.loads((run / "tiktoken.json").read_text())["name"] == "team-bpe"
    assert "named 'spark-bpe-run': writing its outputs again as 'team-bpe'" in caplog.text
    assert train(spark, Config(name="team-bpe", **kw)).already_done
    (run / "vocab.json").unlink()
    again = train(spark, Config(name="team-bpe", **kw))
    assert not again.already_done and (run / "vocab.json").exists()
    assert "vocab.json is missing" in caplog.text
    # the temp files of a writer killed with SIGKILL go with the next run, complete or not
    for leftover in (run / ".tmp-k1ll3d", run / "checkpoints" / ".tmp-k1ll3d"):
        leftover.write_text("half a file")
    assert train(spark, Config(name="team-bpe", **kw)).already_done
    assert not (run / ".tmp-k1ll3d").exists()
    (run / ".tmp-k1ll3d").write_text("half a file")
    assert not train(spark, Config(name="team-bpe", **{**kw, "vocab_size": 310})).already_done
    assert not any(p.name.startswith(".tmp-") for p in run.rglob("*"))


def test_a_complete_run_asked_for_with_other_output_settings_is_published_again(
        spark, tmp_path, caplog):
    """Back to the default name, another report sample or sample size: the outputs, report
    and config.json are written again from the checkpoint (they stayed as they were, with a
    config.json that did not say what the command asked for, exit 0)."""
    caplog.set_level(logging.INFO, logger="pipeline")
    run = tmp_path / "run"
    kw = dict(input=str(REPO / "data" / "sample"), output=str(run), vocab_size=300,
              progress_bar=False)
    first = train(spark, Config(report_sample_rows=3, **kw))
    saved = lambda: json.loads((run / "config.json").read_text())  # noqa: E731
    assert saved()["report_sample_rows"] == 3
    other = "published with other output settings ("
    steps = [({"report_sample_rows": 50}, other + "report_sample_rows 3 then, 50 now)"),
             ({"report_sample_rows": 50, "name": "team-bpe"}, "writing its outputs again as "
                                                              "'team-bpe'"),
             ({"report_sample_rows": 50}, other + "name 'team-bpe' then, '' now)"),
             ({"report_sample_rows": 50, "report_sample": os.path.relpath(
                 REPO / "data" / "sample" / "part-00001.parquet")},
              other + "report_sample '' then, ")]
    for change, said in steps:
        caplog.clear()
        again = train(spark, Config(**change, **kw))
        assert not again.already_done and again.merges == first.merges, change
        assert again.stats["resumed_from_merge"] == len(first.merges)  # served, not trained
        assert said in caplog.text, change
        assert {k: saved()[k] for k in change} == {
            k: os.path.abspath(v) if k == "report_sample" else v for k, v in change.items()}
        assert train(spark, Config(**change, **kw)).already_done  # and then it is complete
    assert json.loads((run / "tiktoken.json").read_text())["name"] == "spark-bpe-run"
    assert "held-out" in (run / "report.html").read_text()
    # the same settings spelled otherwise are the same: no publishing again
    sample = str(REPO / "data" / "sample" / "part-00001.parquet")
    same = {"report_sample_rows": 50, "name": "spark-bpe-run",
            "report_sample": os.path.relpath(sample)}
    assert train(spark, Config(**same, **kw)).already_done
    assert train(spark, Config(**{**same, "report_sample": "file://" + sample}, **kw)
                 ).already_done
    assert saved()["report_sample"] == sample  # (saved absolute: a relative one is ambiguous)
    (run / "config.json").unlink()  # what it was published with is unknown: published again
    caplog.clear()
    assert not train(spark, Config(report_sample_rows=7, **kw)).already_done
    assert saved()["report_sample_rows"] == 7


def test_other_split_settings_are_refused_before_the_word_table_is_replaced(spark, tmp_path,
                                                                           caplog):
    """A rerun with --lowercase over a finished run: refused (its checkpoints do not fit)
    before the count, so RUN/words is still the table the run trained on, with no
    "recounting" line before the refusal; --resume never starts fresh."""
    from pipeline.config import ConfigError

    run = tmp_path / "run"
    kw = dict(input=str(REPO / "data" / "sample"), output=str(run), vocab_size=300,
              progress_bar=False)
    train(spark, Config(**kw))
    table = (run / "words" / "word_table.json").read_text()
    caplog.set_level(logging.INFO, logger="pipeline")
    caplog.clear()
    with pytest.raises(ConfigError, match=r"was trained with other split settings \(lowercase "
                                          r"False then, True now\): its checkpoints in "):
        train(spark, Config(lowercase=True, **kw))
    assert "recounting" not in caplog.text
    assert (run / "words" / "word_table.json").read_text() == table
    assert (run / "run.json").exists()
    # an external table (imported with no max_word_bytes cap) over the same run: refused
    # before the import replaces RUN/words; the original command is still complete
    (tmp_path / "ext.tsv").write_text("hello\t5\nworld\t3\n")
    ext = {k: v for k, v in kw.items() if k != "input"}
    with pytest.raises(ConfigError, match=r"other split settings \(max_word_bytes 1024 then, 0 "
                                          r"now\)"):
        train(spark, Config(words=str(tmp_path / "ext.tsv"), **ext))
    assert (run / "words" / "word_table.json").read_text() == table
    assert train(spark, Config(**kw)).already_done
    fresh = train(spark, Config(lowercase=True, resume="never", **kw))
    assert json.loads((run / "words" / "word_table.json").read_text())["pretokenizer"][
        "lowercase"] is True and len(fresh.merges) == 300 - 257


def test_two_runs_sharing_a_checkpoint_dir_do_not_delete_each_others_checkpoints(spark,
                                                                                tmp_path):
    """Run A and run B (another corpus) given the same --checkpoint-dir: B refuses A's
    checkpoints, naming run A, instead of deleting them as its own stale ones; A's rerun
    still resumes from them; B with --resume never starts fresh. The same with other split
    settings, refused before B's table is counted."""
    from pipeline.config import ConfigError

    (tmp_path / "other").mkdir()
    pq.write_table(pa.table({"text": ["quite other words"] * 40}),
                   tmp_path / "other" / "a.parquet")
    shared = tmp_path / "shared"
    a = dict(input=str(REPO / "data" / "sample"), output=str(tmp_path / "a"), vocab_size=300,
             progress_bar=False, checkpoint_dir=str(shared), checkpoint_every_merges=10)
    b = {**a, "input": str(tmp_path / "other"), "output": str(tmp_path / "b")}
    first = train(spark, Config(**a))
    kept = sorted(p.name for p in shared.iterdir())
    assert kept
    with pytest.raises(ConfigError, match=f"written by another run, {tmp_path / 'a'}, whose "
                                          "config or corpus differs .*--checkpoint-dir"):
        train(spark, Config(**b))
    with pytest.raises(ConfigError, match=f"written by another run, {tmp_path / 'a'}, with "
                                          r"other split settings \(lowercase False then"):
        train(spark, Config(lowercase=True, **b))
    assert sorted(p.name for p in shared.iterdir()) == kept
    (tmp_path / "a" / "run.json").unlink()  # (else the rerun is served as complete)
    again = train(spark, Config(**a))
    assert again.merges == first.merges and again.stats["resumed_from_merge"] == 43
    fresh = train(spark, Config(resume="never", **b))  # (runs out of pairs before 43)
    assert fresh.merges and fresh.merges[0] != first.merges[0]
    assert all(f"#run {tmp_path / 'b'}\n" in p.read_text() for p in shared.iterdir())


def test_checkpoints_of_an_older_digest_are_resumed_when_the_table_is_the_same(spark, tmp_path,
                                                                               caplog):
    """A run made before the word-table digest changed (its checkpoints and run.json record
    the older ``c...`` digest): the same command resumes from its checkpoint (the table's older
    digest is computed and matches) instead of refusing it as another corpus's."""
    from pipeline.checkpoint import fingerprint_of, parse, render
    from pipeline.count.word_table import legacy_digest

    caplog.set_level(logging.INFO, logger="pipeline.checkpoint")
    run = tmp_path / "run"
    cfg = dict(input=str(REPO / "data" / "sample"), output=str(run), vocab_size=300,
               progress_bar=False, checkpoint_every_merges=10)
    first = train(spark, Config(**cfg))
    table = pq.read_table(run / "words" / "data")
    old_fp = None
    for path in sorted((run / "checkpoints").glob("merges-*.txt")):  # as the older code wrote
        _, settings, merges, removed = parse(path.read_text(), 256)
        settings["word_table"]["digest"] = legacy_digest(table)
        old_fp = fingerprint_of(settings)
        path.write_text(render(merges, removed, old_fp, settings))
    summary = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**summary, "fingerprint": old_fp}))
    meta = json.loads((run / "words" / "word_table.json").read_text())
    for key in ("digest", "data_files"):  # (the older code's table: neither recorded)
        meta.pop(key)
    (run / "words" / "word_table.json").write_text(json.dumps(meta))
    again = train(spark, Config(**cfg))
    assert again.merges == first.merges and not again.already_done
    assert again.stats["resumed_from_merge"] == len(first.merges)  # served, not trained
    assert "written by an older spark-bpe (another word-table digest)" in caplog.text
    assert train(spark, Config(**cfg)).already_done


def test_checkpoints_of_an_older_digest_are_not_taken_for_a_table_counted_since(spark,
                                                                                tmp_path):
    """The older digest cannot tell one occurrence moved between same-length words of odd and
    even count: checkpoints an older spark-bpe wrote for the corpus before such an edit were
    resumed for the table recounted after it (the older digest of the new table matched), and
    the old corpus's merges served. A table counted by this spark-bpe is never an older one's."""
    from pipeline.checkpoint import fingerprint_of, parse, render
    from pipeline.count.word_table import legacy_digest

    src = tmp_path / "in"
    src.mkdir()
    run = tmp_path / "run"
    train_rows(spark, src, MOVED_BEFORE, run)
    old = pq.read_table(run / "words" / "data")
    for path in sorted((run / "checkpoints").glob("merges-*.txt")):  # as the older code wrote
        _, settings, merges, removed = parse(path.read_text(), 256)
        settings["word_table"]["digest"] = legacy_digest(old)
        path.write_text(render(merges, removed, fingerprint_of(settings), settings))
    os.utime(src / "part-0.parquet", ns=(1, 1))  # the listing changes: a recount
    again = train_rows(spark, src, MOVED_AFTER, run)
    assert legacy_digest(pq.read_table(run / "words" / "data")) == legacy_digest(old)
    assert again == train_rows(spark, src, MOVED_AFTER, tmp_path / "fresh")
    assert [(m.left, m.right) for m in again] == [(ord("x"), ord("y")), (ord("a"), ord("b"))]


def test_spark_console_bar_stays_out_of_a_log_file(spark):
    """Under pytest stderr is not a terminal, as in a scheduler's log: the session was built
    with Spark's \\r progress bar off (a plain `python jobs/...` is a "shell" to Spark, which
    would otherwise draw it into the log)."""
    import sys

    assert not sys.stderr.isatty()
    assert spark.sparkContext.getConf().get("spark.ui.showConsoleProgress") == "false"


def test_a_plain_python_job_draws_no_spark_bar_into_its_log(tmp_path):
    """`python jobs/count_words.py ... 2> log`: Spark marks the application a shell and turns
    its bar on; that is Spark's default, not the user's, so it is off when stderr is not a
    terminal (the count's tasks pause 1.5 s, long enough for the bar to be drawn)."""
    from .sparkjobs import job_env

    r = subprocess.run([sys.executable, str(REPO / "jobs" / "count_words.py"), "--input",
                        str(REPO / "data" / "sample"), "--output", str(tmp_path / "w"),
                        "--count-reader", "spark"], capture_output=True, text=True,
                       env=job_env(SPARK_BPE_INJECT="count_task=pause:1.5"), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "[Stage" not in r.stderr + r.stdout and "\r" not in r.stderr, r.stderr[-2000:]
    # a column missing from a JSON corpus (found by Spark's reader while the workers warm up):
    # the error is the last line, with no Spark error from the stop after it
    (tmp_path / "js").mkdir()
    (tmp_path / "js" / "a.json").write_text('{"text": "some words"}\n' * 50)
    r = subprocess.run([sys.executable, str(REPO / "jobs" / "count_words.py"), "--input",
                        str(tmp_path / "js"), "--input-format", "json", "--text-column", "body",
                        "--output", str(tmp_path / "w2")], capture_output=True, text=True,
                       env=job_env(), timeout=300)
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        f"error: config key 'text_column': column 'body' not in {tmp_path / 'js'} (columns: "
        "text)"), r.stderr[-2000:]
    assert " ERROR " not in r.stderr, r.stderr[-2000:]


def test_files_spark_writes_follow_the_umask_unless_hadoop_has_one(spark, tmp_path):
    """Under umask 077 every file and directory of a run (the word table's Parquet, written
    by Spark, included) and of an encoded corpus is the owner's alone, as merges.txt is;
    Hadoop's fs.permissions.umask-mode, when the user set it, wins."""
    from pipeline.spark_session import UMASK_KEY, hadoop_umask_from_process

    run, encoded = tmp_path / "run", tmp_path / "encoded"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_CONF_DIR": str(REPO / "conf" / "spark")}
    for job, args in (("train", ["--input", str(REPO / "data" / "sample"), "--output",
                                 str(run), "--vocab-size", "260", "--count-merge", "spark"]),
                      ("encode", ["--tokenizer", str(run), "--input",
                                  str(REPO / "data" / "sample"), "--output", str(encoded)])):
        done = subprocess.run([sys.executable, str(REPO / "jobs" / f"{job}.py"), *args,
                               "--master", "local[1]"], env=env, capture_output=True,
                              text=True, timeout=300, preexec_fn=lambda: os.umask(0o077))
        assert done.returncode == 0, done.stderr[-2000:]
    written = [p for d in (run, encoded) for p in [d, *d.rglob("*")]]
    assert any(p.suffix == ".parquet" for p in run.rglob("*"))
    assert any(p.suffix == ".parquet" for p in encoded.rglob("*"))
    assert {oct(stat.S_IMODE(p.stat().st_mode) & 0o077) for p in written} == {"0o0"}
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    before = conf.get(UMASK_KEY)
    try:
        conf.set(UMASK_KEY, "027")  # the user's, as from spark.hadoop.* or core-site.xml
        hadoop_umask_from_process(spark.sparkContext)
        assert conf.get(UMASK_KEY) == "027"
    finally:
        conf.set(UMASK_KEY, before)


def test_a_damaged_word_table_of_the_run_is_counted_again(spark, tmp_path, caplog):
    """RUN/words with a data file truncated (a disk error, a bad copy): the same command
    counts the words again, saying why; the table counted again is the one the run was
    trained on (the same digest), so the run stays complete with the same merges (a table
    that came out otherwise would have marked it incomplete and trained again)."""
    caplog.set_level(logging.INFO, logger="pipeline")
    run = tmp_path / "run"
    kw = dict(input=str(REPO / "data" / "sample"), output=str(run), vocab_size=280,
              progress_bar=False)
    first = train(spark, Config(**kw))
    data = sorted((run / "words" / "data").glob("*.parquet"))[0]
    data.write_bytes(data.read_bytes()[:100])
    merges = (run / "merges.txt").read_text()
    again = train(spark, Config(**kw))
    assert f"recounting: {data} is not a readable Parquet file" in caplog.text
    assert again.already_done and "is already complete" in caplog.text
    assert (run / "merges.txt").read_text() == merges and len(first.merges) == 23
    assert train(spark, Config(**kw, resume="never")).merges == first.merges  # (readable)


def test_local_places_are_refused_before_spark_starts(tmp_path):
    """An output holding other files and a report sample that is not Parquet are config
    errors (exit 2) found before the job starts Spark: with no Java to be found, the job
    still says what is wrong with its settings (it started the JVM first, and failed on it)."""
    from .conftest import SAMPLE

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("someone's file")
    (tmp_path / "held.txt").write_text("not parquet")
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java"),
           "PATH": os.path.dirname(sys.executable)}  # (no java, no bash)
    env.pop("SPARK_HOME", None)
    for args, said in ((["--output", str(busy)], f"{busy} exists and is not a run directory"),
                       (["--output", str(tmp_path / "run"), "--report-sample",
                         str(tmp_path / "held.txt")], "is not a Parquet sample of held-out")):
        job = subprocess.run([sys.executable, str(REPO / "jobs" / "train.py"), "--master",
                              "local[2]", "--input", str(SAMPLE), "--vocab-size", "300", *args],
                             capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
        last = job.stderr.strip().splitlines()[-1]
        assert job.returncode == 2 and last.startswith("error: ") and said in last, job.stderr
