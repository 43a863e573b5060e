"""End-to-end training: word table -> merges -> run directory, in three stages.

1. :func:`prepare`: the word table (counted, or reused while its input is unchanged), the base
   vocabulary, the fingerprint that ties checkpoints and a finished run to the settings and
   the table, the merges already checkpointed, and the engine (decided by memory);
2. :func:`make_merges`: the engines make the merges; a :class:`MergeLog` appends them, keeps
   the vocabulary, reports progress and writes checkpoints;
3. :func:`publish`: exports, trace, report, stats and config, then ``run.json`` last.

Engines (all give the identical merge list; docs/DESIGN.md):
- ``local``: the vectorized incremental trainer on the driver (``engines.local``);
- ``spark``: distributed merge rounds (``engines.spark`` + ``engines.rounds``);
- ``auto``: the driver from the start when its memory budget holds the word table
  (``memory.py``), else Spark rounds until the working set fits, then the driver.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline import faults, fsutil, spark_session
from pipeline.bpe import BaseVocab, Merge, bytes_vocab, extend_vocab, vocab_bytes
from pipeline.checkpoint import Checkpointer, fingerprint_of, fingerprint_settings
from pipeline.config import TRAIN, Config, ConfigError, same_or_inside
from pipeline.count.run_table import adopt_table_settings, word_table_for
from pipeline.count.word_table import (
    WordTable,
    legacy_digest,
    read_word_table,
    spark_table_summary,
)
from pipeline.engines.local import LocalTrainer, initial_symbols
from pipeline.engines.rounds import RoundStats, run_rounds
from pipeline.engines.spark import SparkPartitions
from pipeline.lease import Lease
from pipeline.memory import (
    Budget,
    choose_engine,
    driver_budget,
    fits_driver,
    release_freed_memory,
)
from pipeline.outputs import (
    TrainedTokenizer,
    check_run_place,
    write_exports,
    write_run_json,
    write_trace,
)
from pipeline.progress import Progress, Stage, jsonl_at
from pipeline.report import check_report_sample, write_report
from pipeline.run_dir import (
    complete_run_still_valid,
    invalidate_run,
    run_summary,
    tokenizer_name,
)
from pipeline.spark_session import start_session

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    run_dir: str
    merges: list[Merge]
    stats: dict
    notes: list[str] = field(default_factory=list)
    already_done: bool = False


def _char_vocab(words: DataFrame, suffix: str) -> BaseVocab:
    """chars alphabet: the distinct characters in order of first appearance (word's
    first_seen, then offset in the word), computed by Spark over the word table: the
    distributed form of :func:`pipeline.bpe.initial_words`' rule, kept apart from it as the
    oracle is kept apart from the engines (the chars tests hold the two equal)."""

    def firsts(batches):
        seen: dict[str, tuple[int, int]] = {}
        for b in batches:
            for w, fs in zip(b.column(0).to_pylist(), b.column(1).to_pylist()):
                for i, ch in enumerate(w.decode("utf-8", "surrogateescape")):
                    k = (fs, i)
                    if ch not in seen or k < seen[ch]:
                        seen[ch] = k
        chars = list(seen)
        yield pa.RecordBatch.from_pydict({
            "ch": pa.array([c.encode("utf-8", "surrogateescape") for c in chars], pa.binary()),
            "fs": pa.array([seen[c][0] for c in chars], pa.int64()),
            "off": pa.array([seen[c][1] for c in chars], pa.int64()),
        })

    rows = (words.select("word", "first_seen").mapInArrow(firsts, "ch binary, fs long, off long")
            .groupBy("ch").agg(F.min(F.struct("fs", "off")).alias("k")).orderBy("k").collect())
    tokens = [bytes(r["ch"]) for r in rows]
    if suffix:
        tokens.append(suffix.encode())
    return BaseVocab("chars", tokens, suffix)


def _load_local(spark: SparkSession, wt: WordTable, base: BaseVocab
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The whole word table on the driver, as initial symbols in first-seen order."""
    table, wt.table = wt.table, None  # counted in this process: in memory, sorted
    if table is None:
        table = read_word_table(spark, wt)
    flat, lengths = initial_symbols(base, table.column("word"))
    flat = flat.astype(np.int32)  # the engine's token array (taken over, not copied again)
    counts = np.array(table.column("count").to_numpy(), dtype=np.int64)  # not a view
    del table  # the driver engine's peak comes later: give the table's memory back first
    release_freed_memory()
    return flat, lengths, counts


def _table_summary(wt: WordTable, words: Callable[[], DataFrame], base: BaseVocab
                   ) -> tuple[int, int, int, str]:
    """(corpus tokens, distinct-word symbols, corpus bytes, content digest of the word table):
    from its word_table.json when the table was in memory when written (bytes alphabet), else
    in Spark jobs. A word's symbols are its bytes, or its characters plus the end-of-word
    suffix."""
    if base.alphabet == "bytes" and all(k in wt.meta for k in ("digest", "byte_tokens",
                                                                "byte_symbols")) \
            and wt.meta["byte_tokens"] >= 0:  # (an older spark-bpe's sum could wrap)
        meta = wt.meta
        return meta["byte_tokens"], meta["byte_symbols"], meta["byte_tokens"], meta["digest"]
    summary = spark_table_summary(words())  # one pass: digest and byte sums
    corpus_bytes = summary["byte_tokens"]
    if base.alphabet == "bytes":
        return corpus_bytes, summary["byte_symbols"], corpus_bytes, summary["digest"]
    suffix = int(bool(base.end_of_word_suffix))
    text = F.col("word").cast("string")
    valid = F.is_valid_utf8(text)
    word_len = F.when(valid, F.length(text) + suffix)  # (invalid UTF-8: null here, below)
    big = "decimal(38,0)"  # (a long product or sum would wrap, or fail under ANSI mode)
    row = words().select(F.sum(word_len.cast(big) * F.col("count").cast(big)),
                         F.sum(word_len.cast(big)), F.count_if(~valid)).first()
    tokens, symbols = int(row[0] or 0), int(row[1] or 0)
    if row[2]:  # words of invalid UTF-8: one symbol per byte of each invalid sequence, as the
        # engines decode them (surrogateescape), where Spark's length counts a lead byte's
        # whole sequence as one character
        def lengths(rows: Iterator) -> Iterator[tuple[int, int]]:
            for word, count in rows:
                n = len(bytes(word).decode("utf-8", "surrogateescape")) + suffix
                yield n * count, n

        t, n = words().filter(~valid).select("word", "count").rdd.mapPartitions(
            lengths).fold((0, 0), lambda a, b: (a[0] + b[0], a[1] + b[1]))
        tokens, symbols = tokens + t, symbols + n
    return tokens, symbols, corpus_bytes, summary["digest"]


def _will_use_spark_sql(cfg: Config) -> bool:
    """Whether the run needs a SparkSession whatever the count finds: a given word table that
    Spark reads (:func:`_words_need_spark`), the chars alphabet, the Spark engine, or files only
    Spark's own readers and writers reach."""
    return (_words_need_spark(cfg.words) or cfg.alphabet != "bytes" or cfg.engine == "spark"
            or cfg.count_reader == "spark" or cfg.input_format != "parquet"
            or bool(cfg.input_table) or not all(fsutil.is_local(i) for i in cfg.inputs)
            or not fsutil.is_local(cfg.output))


def _words_need_spark(words: str) -> bool:
    """Whether a given ``--words`` table is read through Spark: an external table (imported
    by a Spark job) or one on another filesystem; a local table of ours is read with pyarrow."""
    if not words:
        return False
    if not fsutil.is_local(words):
        return True
    return not os.path.isfile(os.path.join(fsutil.local_path(words), "word_table.json"))


@dataclass
class Prepared:
    """Everything the merges and the outputs depend on, decided before training."""

    cfg: Config
    table: WordTable
    words: Callable[[], DataFrame]  # the table through Spark, read only when needed
    base: BaseVocab
    target: int  # merges wanted
    total_tokens: int  # corpus tokens before merging
    corpus_bytes: int  # UTF-8 bytes of the corpus's words (= total_tokens for bytes)
    symbols: int  # symbols of the distinct words
    fingerprint: str
    checkpointer: Checkpointer
    prior: list[Merge]  # from the checkpoint (at most ``target``)
    prior_removed: list[int]
    engine: str
    engine_decision: str
    budget: Budget
    stages: dict[str, float]
    done: dict | None = None  # run.json of an identical finished run: nothing to do


def prepare(spark: SparkSession, cfg: Config, progress: Progress,
            session_seconds: float = 0.0, frame: DataFrame | None = None,
            guard: Callable[[], None] = lambda: None) -> Prepared:
    """Stage 1: the word table, the settings fingerprint, the checkpoint, the engine.
    ``guard`` raises when the run lost its lease: called before the checkpoints are touched."""
    check_report_sample(cfg)
    if frame is not None or _will_use_spark_sql(cfg):
        start_session(spark)
    stages: dict[str, float] = {"spark_session": round(session_seconds, 3)}
    choice = word_table_for(spark, cfg, progress, frame,
                            lambda: invalidate_run(spark, cfg.output))
    wt = choice.table
    stages["count_words"] = round(choice.count_seconds, 3)
    adopt_table_settings(cfg, wt)
    words: Callable[[], DataFrame] = functools.cache(
        lambda: spark_session.file_reader(spark).parquet(fsutil.spark_path(wt.data_path)))
    base = bytes_vocab() if cfg.alphabet == "bytes" else _char_vocab(words(),
                                                                      cfg.end_of_word_suffix)
    target = cfg.merges_wanted(base.size)
    if target <= 0:
        raise ConfigError(
            f"config key 'vocab_size' = {cfg.vocab_size} leaves no merges: the base vocabulary "
            f"has {base.size} symbols and there are {len(cfg.special_tokens)} special tokens"
        )
    total_tokens, symbols, corpus_bytes, digest = _table_summary(wt, words, base)
    if max(total_tokens, corpus_bytes) >= 2**63:
        what = (f"config key 'words': {cfg.words}" if cfg.words  # (the user's, not the copy)
                else f"the word table {wt.data_path}")
        raise ConfigError(
            f"{what} holds {max(total_tokens, corpus_bytes)} "
            f"{'tokens' if total_tokens >= corpus_bytes else 'bytes'} (each word's count times "
            "its length): pair counts would overflow the 64-bit counters training keeps; "
            "scale its counts down (or give smaller input weights)")
    settings = fingerprint_settings(cfg, wt.meta, base.size, digest)
    fp = fingerprint_of(settings)
    ckpt = Checkpointer(spark, cfg.checkpoint_dir or fsutil.join(cfg.output, "checkpoints"),
                        fp, base.size, settings, run=cfg.with_absolute_paths().output)
    budget = driver_budget(cfg.driver_budget_mb, dict(spark.sparkContext.getConf().getAll()))
    engine, why = choose_engine(cfg.engine, symbols, budget)
    prep = Prepared(cfg=cfg, table=wt, words=words, base=base, target=target,
                    total_tokens=total_tokens, corpus_bytes=corpus_bytes, symbols=symbols,
                    fingerprint=fp,
                    checkpointer=ckpt, prior=[], prior_removed=[], engine=engine,
                    engine_decision=why, budget=budget, stages=stages)
    guard()  # (the count may have taken long: the directory may be another run's by now)
    fsutil.remove_temp_files(spark, cfg.output)  # (a killed run's)
    prep.done = _already_done(spark, prep)
    if prep.done is not None:
        return prep
    _resume_from_checkpoint(prep)
    log.info(why)
    if len(prep.prior) < target:  # (else served from the checkpoint, as logged: no training)
        log.info("training %d merges (%d from checkpoint) on %d words / %d symbols, engine %s",
                 target, len(prep.prior), wt.meta.get("unique_words", -1), symbols, engine)
    return prep


def _already_done(spark: SparkSession, prep: Prepared) -> dict | None:
    """run.json of the complete run in the output that this command would make again (same
    fingerprint and merges, outputs still as published), else None."""
    cfg, done = prep.cfg, run_summary(prep.cfg.output, spark)
    if (done and done.get("fingerprint") == prep.fingerprint
            and done.get("merges_wanted") == prep.target and cfg.resume != "never"
            and complete_run_still_valid(spark, cfg, done)):
        return done
    return None


def _may_be_an_older_table(meta: dict) -> bool:
    """Whether a word table may have been counted by a spark-bpe older than the current
    digest (``h...``), whose checkpoints record the older ``c...`` digest: not when its
    word_table.json records the current digest, or lists its data files (which only tables
    counted since do; an edited one's digest was dropped). The older digest cannot tell some
    edits apart, so it only ever recognises the table it was computed for, never one counted
    since."""
    digest = str(meta.get("digest", ""))
    return not digest.startswith("h") and not ("data_files" in meta and not digest)


def _resume_from_checkpoint(prep: Prepared) -> None:
    """The merges already checkpointed (at most the target) into ``prep``; with resume =
    never, the checkpoints cleared instead."""
    ckpt, wt = prep.checkpointer, prep.table
    ckpt.clean_temp()
    if prep.cfg.resume == "never":
        ckpt.clear()
        return
    older = None
    if _may_be_an_older_table(wt.meta):
        older = functools.cache(lambda: legacy_digest(
            wt.table if wt.table is not None else prep.words()))
    loaded = ckpt.load(legacy_digest=older)
    if loaded:
        prep.prior, prep.prior_removed = loaded[0][:prep.target], loaded[1][:prep.target]
        if len(loaded[0]) >= prep.target:
            log.info("the checkpoint already holds %d merges: serving the first %d without "
                     "training", len(loaded[0]), prep.target)


class MergeLog:
    """The growing merge list: appends the vocabulary, reports progress (``stage``) and writes
    a checkpoint every ``checkpoint_every_merges`` merges or ``checkpoint_every_seconds``."""

    def __init__(self, prep: Prepared, stage: Stage, guard: Callable[[], None] = lambda: None):
        self.cfg, self.ckpt, self.stage = prep.cfg, prep.checkpointer, stage
        self.guard = guard  # raises when this run lost its lease: it must stop writing
        self.target = prep.target
        self.merges: list[Merge] = list(prep.prior)
        self.removed: list[int] = list(prep.prior_removed)
        self.vocab = vocab_bytes(prep.base, self.merges)
        self.last_checkpoint = time.monotonic()

    def __len__(self) -> int:
        return len(self.merges)

    @property
    def wanted(self) -> int:
        return self.target - len(self.merges)

    def extend(self, new: list[Merge], removed: list[int]) -> None:
        extend_vocab(self.vocab, new)
        self.merges.extend(new)
        self.removed.extend(removed)
        if new:
            last = new[-1]
            self.stage.update(len(self.merges),
                              last=f"{self.vocab[last.left]!r}+{self.vocab[last.right]!r}",
                              count=last.count, note="")
        self.checkpoint()

    def due_in(self) -> int:
        """Merges until a checkpoint is due by count (at least 1)."""
        return max(1, self.cfg.checkpoint_every_merges
                   - (len(self.merges) - max(self.ckpt.last_written, 0)))

    def checkpoint(self, force: bool = False) -> None:
        self.guard()  # a run that lost its lease writes no checkpoint (nor prunes the holder's)
        since = len(self.merges) - max(self.ckpt.last_written, 0)
        if force or since >= self.cfg.checkpoint_every_merges or (
                since > 0
                and time.monotonic() - self.last_checkpoint >= self.cfg.checkpoint_every_seconds):
            self.ckpt.save(self.merges, self.removed)
            self.last_checkpoint = time.monotonic()


@dataclass
class MergeOutcome:
    merges: list[Merge]
    removed: list[int]
    rounds: RoundStats
    handoff_at: int | None
    seconds: float


def make_merges(spark: SparkSession, prep: Prepared, progress: Progress,
                guard: Callable[[], None] = lambda: None) -> MergeOutcome:
    """Stage 2: the merges, by the chosen engine (Spark rounds may hand off to the driver).
    ``guard`` is called before every checkpoint: it raises when the run lost its lease."""
    cfg, t0 = prep.cfg, time.monotonic()
    rounds, handoff_at = RoundStats(), None
    with progress.stage("merges", total=prep.target, unit="merges", start=len(prep.prior),
                        recent_eta=True, engine=prep.engine) as stage:
        mlog = MergeLog(prep, stage, guard)
        faults.at("merges")
        if mlog.wanted > 0 and prep.engine == "spark":
            rounds, rest = _spark_rounds(spark, prep, mlog)
            if rest is not None:
                handoff_at = len(mlog)
                stage.update(engine="local (handed off)", force=True)
                if rest:
                    flat, lengths, counts = (np.concatenate(x) for x in zip(*rest))
                    del rest
                    _train_local(LocalTrainer(flat, lengths, counts, mlog.vocab), mlog, cfg)
        elif mlog.wanted > 0:
            stage.update(note="reading the word table and counting its pairs")
            lt = LocalTrainer(*_load_local(spark, prep.table, prep.base),
                              prep.base.tokens)
            if mlog.merges:
                lt.replay(mlog.merges)
            _train_local(lt, mlog, cfg)
        mlog.checkpoint(force=True)
    return MergeOutcome(mlog.merges, mlog.removed, rounds, handoff_at, time.monotonic() - t0)


def _spark_rounds(spark: SparkSession, prep: Prepared, mlog: MergeLog
                  ) -> tuple[RoundStats, list | None]:
    """Spark rounds; with ``auto``, until the working set fits the driver budget. Returns the
    round statistics and, after a hand-off, the remaining words (else None)."""
    cfg = prep.cfg
    mlog.stage.update(note="building the partitions' state and counting the pairs")
    parts = SparkPartitions(spark, prep.words(), cfg.num_partitions, prep.base,
                            replay=[(m.left, m.right) for m in mlog.merges])
    mlog.stage.restart_rate()
    mlog.stage.update(note="")  # rounds now
    t0 = time.monotonic()
    try:
        faults.at("spark_rounds")  # tests: a kill while the executors hold partition states
        res = run_rounds(
            parts, [len(t) for t in mlog.vocab], mlog.wanted, cfg.min_pair_count,
            cfg.max_token_bytes or None, cfg.max_batch if cfg.batch_merges else 1,
            stop_when=lambda tok: cfg.engine == "auto" and fits_driver(tok, prep.budget),
            on_round=lambda new, removed, _: mlog.extend(new, removed),
        )
        log.info("spark rounds: %d rounds, %d merges in %.1f s; %d partition states built "
                 "for %d partitions", res.stats.rounds, len(res.merges), time.monotonic() - t0,
                 parts.states_built, len(parts.parts))
        rest = parts.collect() if not res.finished and mlog.wanted > 0 else None
    finally:
        parts.close()
    return res.stats, rest


def _train_local(lt: LocalTrainer, mlog: MergeLog, cfg: Config) -> None:
    """Continue on the driver; ``lt`` holds the working set after ``mlog``'s merges.
    Bookkeeping (progress, checkpoints) runs between chunks of merges, not after each one: a
    chunk is at most 256 merges, and ends where a checkpoint is due by count."""
    mlog.stage.restart_rate()  # the rate and ETA of the merges, not of loading the words
    mlog.stage.update(note="")  # merging now (the first merges can take a while)
    offset = len(mlog) - len(lt.merges)
    while mlog.wanted > 0:
        before = len(lt.merges)
        lt.train(min(before + min(256, mlog.due_in()), mlog.target - offset), cfg.min_pair_count,
                 cfg.max_token_bytes or None)
        if len(lt.merges) == before:
            break
        mlog.extend(lt.merges[before:], lt.removed[before:])


def publish(spark: SparkSession, prep: Prepared, out: MergeOutcome, progress: Progress,
            t_start: float, guard: Callable[[], None] = lambda: None) -> RunResult:
    """Stage 3: every output file, then ``run.json`` (the run is complete only once it is
    there; the previous one was removed before training)."""
    cfg, base, stages = prep.cfg, prep.base, prep.stages
    stages["merges"] = round(out.seconds, 3)
    tokens_left = (prep.total_tokens
                   - np.cumsum(np.asarray(out.removed, dtype=np.int64))).tolist()
    t_out = time.monotonic()
    tok = TrainedTokenizer(base, out.merges, list(cfg.special_tokens), cfg.pattern,
                           cfg.lowercase, cfg.normalization, tokenizer_name(cfg))
    # guard() before each write: a run stalled past its lease (a VM pause, SIGSTOP) while
    # making one file writes no more over the run that took the directory meanwhile (its
    # report, stats and config are not hashed in run.json, as the exports are)
    with progress.stage("outputs"):
        guard()
        notes = write_exports(cfg.output, tok, spark)
        faults.at("outputs")  # tests: a kill here leaves new exports and no run.json
        guard()
        write_trace(fsutil.join(cfg.output, "trace.tsv"), tok, tokens_left, spark)
    t_report = time.monotonic()
    with progress.stage("report"):
        faults.at("report")  # tests: heartbeats while the report is made
        write_report(spark, cfg, tok, tokens_left, prep.corpus_bytes, prep.total_tokens,
                     before_write=guard)
    stages["report"] = round(time.monotonic() - t_report, 3)
    stats = _run_stats(prep, out, tokens_left)
    stages["outputs"] = round(time.monotonic() - t_out, 3)
    stages["total_after_session"] = round(time.monotonic() - t_start, 3)
    guard()
    fsutil.write_text(spark, fsutil.join(cfg.output, "config.json"), cfg.to_json(TRAIN))
    guard()
    fsutil.write_text(spark, fsutil.join(cfg.output, "stats.json"), json.dumps(stats, indent=2))
    guard()  # (a run that lost its lease, or whose spark-submit was killed, publishes nothing)
    spark_session.stop_if_jvm_gone()
    write_run_json(cfg.output, {
        "fingerprint": prep.fingerprint, "name": tokenizer_name(cfg), "merges": len(out.merges),
        "merges_wanted": prep.target, "stats": stats, "notes": notes,
    }, spark)
    for n in notes:
        log.warning(n)
    return RunResult(cfg.output, out.merges, stats, notes)


def _run_stats(prep: Prepared, out: MergeOutcome, tokens_left: list[int]) -> dict:
    cfg, rs = prep.cfg, out.rounds
    mpr = rs.merges_per_round

    def median(xs: list[float]) -> float | None:
        return round(statistics.median(xs), 4) if xs else None

    return {
        "engine": prep.engine,
        "engine_decision": prep.engine_decision,
        "driver_budget_mb": round(prep.budget.bytes / 2**20),
        "handoff_to_driver_at_merge": out.handoff_at,
        "merges": len(out.merges),
        "merges_wanted": prep.target,
        "stopped_early": len(out.merges) < prep.target,
        "resumed_from_merge": len(prep.prior),
        "vocab_size": prep.base.size + len(out.merges) + len(cfg.special_tokens),
        "base_vocab_size": prep.base.size,
        "special_tokens": len(cfg.special_tokens),
        "words_in_table": prep.table.meta.get("unique_words"),
        "max_word_bytes": prep.table.meta.get("max_word_bytes", 0),
        "left_out_of_training": prep.table.meta.get("left_out"),
        "symbols_in_table": prep.symbols,
        "corpus_tokens_before": prep.total_tokens,
        "corpus_tokens_after": tokens_left[-1] if tokens_left else prep.total_tokens,
        "spark_rounds": rs.rounds,
        "spark_merges_per_round": (
            {"min": min(mpr), "median": statistics.median(mpr), "max": max(mpr),
             "mean": round(sum(mpr) / len(mpr), 2)} if mpr else None),
        "spark_seconds_per_round_median": median(rs.seconds_per_round),
        "spark_job_seconds_per_round_median": median(rs.job_seconds),
        "spark_task_work_seconds_per_round_median": median(rs.work_seconds),
        "spark_seconds_in_rounds": round(sum(rs.seconds_per_round), 2),
        "spark_job_seconds_in_rounds": round(sum(rs.job_seconds), 2),
        "spark_task_work_seconds_in_rounds": round(sum(rs.work_seconds), 2),
        "spark_refresh_jobs": rs.refresh_jobs,
        "working_set_tokens_by_round": rs.working_set_tokens[:: max(1, len(mpr) // 50)],
        "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "stage_seconds": prep.stages,
    }


def check_train_config(cfg: Config) -> None:
    """What can be refused without Spark about a run's local places, before the job starts
    Spark (a one-line config error, exit 2, and no JVM started for it): an output that holds
    other files, a report sample that is not Parquet text. :func:`train` checks them again
    (the API, and places on other filesystems)."""
    if fsutil.is_local(cfg.output):
        check_run_place(None, cfg.output, _checkpoint_dir_inside(cfg))
    check_report_sample(cfg)


def _checkpoint_dir_inside(cfg: Config) -> tuple[str, ...]:
    """The name of a checkpoint directory configured inside the run directory (one of the
    run's entries), if it is."""
    inside = same_or_inside(cfg.checkpoint_dir, cfg.output) if cfg.checkpoint_dir else None
    return (inside.split("/")[0],) if inside else ()


def train(spark: SparkSession, cfg: Config, session_seconds: float = 0.0,
          progress: Progress | None = None, frame: DataFrame | None = None) -> RunResult:
    """Train end to end: :func:`prepare`, :func:`make_merges`, :func:`publish`, holding the
    lease of the run directory (and of the checkpoint directory) throughout. ``spark`` may be
    a :class:`DeferredSession`: runs that need Spark SQL start creating it at once, in the
    background; others may never create it. ``frame``: train on this DataFrame's
    ``text_column`` instead of ``cfg.input`` (``pipeline.api``)."""
    t_start = time.monotonic()
    # saved absolute in config.json: a rerun from another directory must tell its file apart
    cfg.report_sample = fsutil.absolute_local(cfg.report_sample)
    check_run_place(spark, cfg.output, _checkpoint_dir_inside(cfg))
    with contextlib.ExitStack() as stack:
        timeout = cfg.lease_timeout_seconds
        leases = [stack.enter_context(Lease(spark, cfg.output, timeout))] + [
            stack.enter_context(Lease.beside(spark, d, timeout, "run"))
            for d in _checkpoint_dir_leased(cfg)]
        own_progress = progress is None

        def holding() -> bool:  # no more progress.jsonl once another run took the directory
            return all(lease.holds() for lease in leases)

        jsonl = cfg.progress_file or fsutil.join(cfg.output, "progress.jsonl")
        progress = progress or Progress("train", jsonl_at(spark, jsonl, holding),
                                        cfg.heartbeat_seconds, bar=cfg.progress_bar,
                                        allowed=holding)
        stack.callback(lambda: own_progress and progress.close())  # (the file's last write)

        def still_ours() -> None:  # never write over a run that took the directory meanwhile
            for lease in leases:
                lease.check()

        with progress.stage("prepare"):
            prep = prepare(spark, cfg, progress, session_seconds, frame, still_ours)
        if prep.done is not None:
            log.info("run at %s is already complete (%d merges); nothing to do",
                     cfg.output, prep.done.get("merges"))
            return RunResult(cfg.output, [], prep.done.get("stats", {}), already_done=True)
        still_ours()
        invalidate_run(spark, cfg.output)
        out = make_merges(spark, prep, progress, still_ours)
        still_ours()
        return publish(spark, prep, out, progress, t_start, still_ours)


def summary(merges: int, stats: dict) -> str:
    """What a run did, for the job's last line: how many merges, how many of them came from a
    checkpoint, and whether training stopped before the target."""
    resumed = stats.get("resumed_from_merge", 0)
    if merges and resumed >= merges:
        text = f"served {merges} merges from the checkpoint, none trained"
    elif resumed:
        text = f"trained {merges} merges ({resumed} from the checkpoint, {merges - resumed} new)"
    else:
        text = f"trained {merges} merges"
    return text + (" (stopped early: no pair qualifies)" if stats.get("stopped_early") else "")


def _checkpoint_dir_leased(cfg: Config) -> list[str]:
    """The checkpoint directory, leased beside it (unless it is the run directory): also when
    it lies inside the run directory, where another run given it as its --checkpoint-dir may
    hold it (a lease is looked for in the directories above the one taken, not below). Beside
    it, so that nothing is made inside it before a checkpoint is (a full disk there is the
    checkpoint's to report) and a killed run leaves no directory behind."""
    ckdir = cfg.checkpoint_dir or fsutil.join(cfg.output, "checkpoints")
    return [ckdir] if same_or_inside(ckdir, cfg.output) != "" else []
