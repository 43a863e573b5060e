"""End-to-end training: word table -> merges -> run directory.

Engines (all give the identical merge list):
- ``local``: the vectorized incremental trainer on the driver (``engines.local``);
- ``spark``: distributed merge rounds (``engines.spark`` + ``engines.rounds``);
- ``auto``: the driver from the start when its memory budget holds the word table
  (``memory.py``), else Spark rounds until the working set fits, then the driver.
"""

from __future__ import annotations

import functools
import json
import logging
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline import fsutil
from pipeline.bpe import BaseVocab, Merge, bytes_vocab
from pipeline.checkpoint import Checkpointer, fingerprint_of, fingerprint_settings, list_names
from pipeline.config import Config, ConfigError
from pipeline.count.word_count import (
    WordTable,
    count_words,
    describe_input_change,
    format_digest,
    input_fingerprint,
    list_input,
    open_word_table,
    spark_table_digest,
)
from pipeline.engines.local import LocalTrainer
from pipeline.engines.rounds import RoundStats, run_rounds
from pipeline.engines.spark import SparkPartitions, symbols_of
from pipeline.memory import choose_engine, driver_budget, fits_driver
from pipeline.outputs import TrainedTokenizer, write_exports, write_trace
from pipeline.report import write_report
from pipeline.spark_session import start_session

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    run_dir: str
    merges: list[Merge]
    stats: dict
    notes: list[str] = field(default_factory=list)
    already_done: bool = False


class Progress:
    """One log line per round (throttled to one a second for the driver engine) and a progress
    bar on a terminal."""

    def __init__(self, total: int, bar: bool):
        self.total = max(total, 1)
        self.t0 = time.time()
        self.last_log = 0.0
        self.done0 = 0
        self.bar = bar and sys.stderr.isatty()

    def update(self, done: int, last: Merge, vocab: list[bytes] | None, engine: str,
               force: bool = False) -> None:
        now = time.time()
        if not force and engine == "local" and now - self.last_log < 1.0:
            return
        self.last_log = now
        rate = (done - self.done0) / max(now - self.t0, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        pair = ""
        if vocab is not None:
            pair = f"{vocab[last.left]!r}+{vocab[last.right]!r}"
        if self.bar:
            width = 30
            fill = int(width * done / self.total)
            sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} "
                             f"{rate:,.0f} merges/s ETA {eta:,.0f}s ")
            sys.stderr.flush()
        log.info("[%s] merges %d/%d  last %s count %d  %.0f merges/s  ETA %.0f s",
                 engine, done, self.total, pair, last.count, rate, eta)

    def close(self) -> None:
        if self.bar:
            sys.stderr.write("\n")


@dataclass
class WordTableChoice:
    table: WordTable
    count_seconds: float  # 0 when an existing table was used
    input_changed: bool  # the run's own table was recounted because its input changed


def _word_table_for(spark: SparkSession, cfg: Config) -> WordTableChoice:
    """The word table: the one given (--words, trusted as given), or the run's own, counted
    from --input and reused by a later run only while the input's fingerprint (file listing,
    sizes, modification times, footer row counts) and the split settings still match."""
    t0 = time.time()
    if cfg.words:
        return WordTableChoice(open_word_table(spark, cfg.words), 0.0, False)
    own = fsutil.join(cfg.output, "words")
    _remove_stale_temp(spark, cfg.output, "words")
    changed = False
    if fsutil.exists(spark, fsutil.join(own, "word_table.json")):
        wt = open_word_table(spark, own)
        spec = cfg.pretokenizer_spec()
        if wt.meta.get("input") == cfg.input and wt.meta.get("pretokenizer") == {
            "pattern": spec.pattern, "special_tokens": list(spec.special_tokens),
            "lowercase": spec.lowercase, "normalization": spec.normalization,
        } and wt.meta.get("text_column") == cfg.text_column:
            files, footers = list_input(spark, cfg)
            now = input_fingerprint(spark, files, footers)
            then = wt.meta.get("input_fingerprint")
            if then and then.get("digest") == now["digest"]:
                start_session(spark)  # the table is read back through Spark
                log.info("reusing the word table already counted at %s (input unchanged: "
                         "%d files, %d bytes)", own, now["files"], now["bytes"])
                return WordTableChoice(wt, 0.0, False)
            changed = True
            log.info("recounting: %s", describe_input_change(then, now))
    sub = Config(**{**cfg.__dict__, "output": own})
    log.info("counting the words of %s into %s", cfg.input, own)
    wt = count_words(spark, sub)
    return WordTableChoice(wt, time.time() - t0, changed)


def _adopt_table_settings(cfg: Config, wt: WordTable) -> None:
    pre = wt.meta["pretokenizer"]
    for key in ("pattern", "special_tokens", "lowercase", "normalization"):
        if getattr(cfg, key) != pre[key]:
            log.warning("the word table was made with %s = %r; using that (config said %r)",
                        key, pre[key], getattr(cfg, key))
            setattr(cfg, key, pre[key])


def _char_vocab(words: DataFrame, suffix: str) -> BaseVocab:
    """chars alphabet: the distinct characters in order of first appearance."""

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


def _load_local(wt: WordTable, words: Callable[[], DataFrame], base: BaseVocab
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The whole word table on the driver, as initial symbols in first-seen order."""
    table, wt.table = wt.table, None  # counted in this process: in memory, sorted
    if table is None:
        table = words().select("word", "count", "first_seen").toArrow().sort_by("first_seen")
    char_ids, suffix_id = _char_ids(base)
    flat, lengths = symbols_of(table.column("word"), char_ids, suffix_id)
    flat = flat.astype(np.int32)  # the engine's token array (taken over, not copied again)
    counts = np.array(table.column("count").to_numpy(), dtype=np.int64)  # not a view
    del table  # the driver engine's peak comes later: give the table's memory back first
    pa.default_memory_pool().release_unused()
    return flat, lengths, counts


def _char_ids(base: BaseVocab) -> tuple[dict[str, int] | None, int | None]:
    if base.alphabet == "bytes":
        return None, None
    n = len(base.tokens) - (1 if base.end_of_word_suffix else 0)
    ids = {base.tokens[i].decode("utf-8", "surrogateescape"): i for i in range(n)}
    return ids, (n if base.end_of_word_suffix else None)


def _remove_stale_temp(spark: SparkSession, parent: str, name: str) -> None:
    """A run killed while writing ``parent/name`` leaves ``name.tmp-*`` / ``name.old-*``."""
    for entry in list_names(spark, parent):
        if entry.startswith((f"{name}.tmp-", f"{name}.old-")):
            log.info("removing %s left by an interrupted run", fsutil.join(parent, entry))
            fsutil.delete(spark, fsutil.join(parent, entry))


def _table_summary(wt: WordTable, words: Callable[[], DataFrame], base: BaseVocab
                   ) -> tuple[int, int, str]:
    """(corpus tokens, distinct-word symbols, content digest of the word table): from memory
    when the table was just counted here (bytes alphabet), else in one Spark job."""
    if wt.table is not None and base.alphabet == "bytes" and "digest" in wt.meta:
        lengths = pc.binary_length(wt.table.column("word")).to_numpy().astype(np.int64)
        total = int(np.dot(lengths, wt.table.column("count").to_numpy()))
        return total, int(lengths.sum()), wt.meta["digest"]
    word_len = F.length("word")  # bytes
    if base.alphabet == "chars":
        word_len = F.length(F.col("word").cast("string")) + int(bool(base.end_of_word_suffix))
    row = words().select(F.sum(word_len * F.col("count")), F.sum(word_len),
                         *spark_table_digest()).first()
    return int(row[0] or 0), int(row[1] or 0), format_digest(row[2], row[3])


def _run_summary(run_dir: str, spark: SparkSession) -> dict | None:
    path = fsutil.join(run_dir, "run.json")
    if not fsutil.exists(spark, path):
        return None
    try:
        return json.loads(fsutil.read_text(spark, path))
    except ValueError:
        return None


def _will_use_spark_sql(cfg: Config) -> bool:
    """Whether the run needs a SparkSession whatever the count finds: a given word table, the
    chars alphabet, the Spark engine, or files only Spark's own readers and writers reach."""
    return (bool(cfg.words) or cfg.alphabet != "bytes" or cfg.engine == "spark"
            or cfg.count_reader == "spark" or not fsutil.is_local(cfg.input)
            or not fsutil.is_local(cfg.output))


def train(spark: SparkSession, cfg: Config, session_seconds: float = 0.0) -> RunResult:
    """Train end to end. ``spark`` may be a :class:`DeferredSession`: runs that need Spark
    SQL start creating it at once, in the background; others may never create it."""
    t_start = time.time()
    if _will_use_spark_sql(cfg):
        start_session(spark)
    stages: dict[str, float] = {"spark_session": round(session_seconds, 3)}
    choice = _word_table_for(spark, cfg)
    wt = choice.table
    stages["count_words"] = round(choice.count_seconds, 3)
    _adopt_table_settings(cfg, wt)
    # the table as a DataFrame, read through Spark only when something needs it
    words: Callable[[], DataFrame] = functools.cache(lambda: spark.read.parquet(wt.data_path))
    base = bytes_vocab() if cfg.alphabet == "bytes" else _char_vocab(words(),
                                                                      cfg.end_of_word_suffix)
    target = cfg.merges_wanted(base.size)
    if target <= 0:
        raise ConfigError(
            f"config key 'vocab_size' = {cfg.vocab_size} leaves no merges: the base vocabulary "
            f"has {base.size} symbols and there are {len(cfg.special_tokens)} special tokens"
        )
    total_tokens, symbols, digest = _table_summary(wt, words, base)
    settings = fingerprint_settings(cfg, wt.meta, base.size, digest)
    fp = fingerprint_of(settings)
    done = _run_summary(cfg.output, spark)
    if (done and done.get("fingerprint") == fp and done.get("merges_wanted") == target
            and cfg.resume != "never"):
        log.info("run at %s is already complete (%d merges); nothing to do",
                 cfg.output, done.get("merges"))
        return RunResult(cfg.output, [], done.get("stats", {}), already_done=True)

    ckpt_dir = cfg.checkpoint_dir or fsutil.join(cfg.output, "checkpoints")
    ckpt = Checkpointer(spark, ckpt_dir, fp, base.size, settings)
    ckpt.clean_temp()
    prior: list[Merge] = []
    prior_removed: list[int] = []
    if cfg.resume == "never":
        ckpt.clear()
    else:
        loaded = ckpt.load(discard_other_table=choice.input_changed)
        if loaded:
            prior, prior_removed = loaded
    budget = driver_budget(cfg.driver_budget_mb, dict(spark.sparkContext.getConf().getAll()))
    engine, why = choose_engine(cfg.engine, symbols, budget)
    log.info(why)
    log.info("training %d merges (%d from checkpoint) on %d words / %d symbols, engine %s",
             target, min(len(prior), target), wt.meta.get("unique_words", -1), symbols, engine)
    if len(prior) >= target:
        log.info("the checkpoint already holds %d merges: serving the first %d without "
                 "training", len(prior), target)

    progress = Progress(target, cfg.progress_bar)
    merges: list[Merge] = list(prior[:target])
    removed: list[int] = list(prior_removed[:target])
    vocab_now: list[bytes] = list(base.tokens)
    for m in merges:
        vocab_now.append(vocab_now[m.left] + vocab_now[m.right])
    last_ckpt = time.time()

    def maybe_checkpoint(force: bool = False) -> None:
        nonlocal last_ckpt
        since = len(merges) - max(ckpt.last_written, 0)
        if force or since >= cfg.checkpoint_every_merges or (
                since > 0 and time.time() - last_ckpt >= cfg.checkpoint_every_seconds):
            ckpt.save(merges, removed)
            last_ckpt = time.time()

    round_stats = RoundStats()
    handoff_at = None
    t_merge = time.time()
    max_bytes = cfg.max_token_bytes or None
    if len(merges) < target:
        if engine == "spark":
            parts = SparkPartitions(spark, words(), cfg.num_partitions, *_char_ids(base),
                                    base.size, replay=[(m.left, m.right) for m in merges])
            stats_t = time.time()

            def on_round(new: list[Merge], new_removed: list[int], st: RoundStats) -> None:
                for m in new:
                    vocab_now.append(vocab_now[m.left] + vocab_now[m.right])
                merges.extend(new)
                removed.extend(new_removed)
                progress.update(len(merges), new[-1], vocab_now, "spark")
                maybe_checkpoint()

            try:
                res = run_rounds(
                    parts, [len(t) for t in vocab_now], target - len(merges),
                    cfg.min_pair_count, max_bytes, cfg.max_batch if cfg.batch_merges else 1,
                    stop_when=lambda tok: cfg.engine == "auto" and fits_driver(tok, budget),
                    on_round=on_round,
                )
                round_stats = res.stats
                log.info("spark rounds: %d rounds, %d merges in %.1f s", res.stats.rounds,
                         len(res.merges), time.time() - stats_t)
                collected = (parts.collect() if not res.finished and len(merges) < target
                             else None)
            finally:
                parts.close()
            if collected is not None:
                handoff_at = len(merges)
                if collected:
                    flat, lengths, counts = (np.concatenate(x) for x in zip(*collected))
                    _train_local(LocalTrainer(flat, lengths, counts, vocab_now), target, cfg,
                                 merges, removed, vocab_now, progress, maybe_checkpoint)
        else:
            lt = LocalTrainer(*_load_local(wt, words, base), base.tokens)
            if merges:
                lt.replay(merges)
            _train_local(lt, target, cfg, merges, removed, vocab_now, progress,
                         maybe_checkpoint)
    progress.close()
    maybe_checkpoint(force=True)
    stages["merges"] = round(time.time() - t_merge, 3)
    tokens_left = (total_tokens - np.cumsum(np.asarray(removed, dtype=np.int64))).tolist()

    t_out = time.time()
    tok = TrainedTokenizer(base, merges, list(cfg.special_tokens), cfg.pattern, cfg.lowercase,
                           cfg.normalization)
    notes = write_exports(cfg.output, tok, spark)
    write_trace(fsutil.join(cfg.output, "trace.tsv"), tok, tokens_left, spark)
    t_report = time.time()
    write_report(spark, cfg, tok, tokens_left,
                 words() if base.alphabet != "bytes" else None, total_tokens)
    stages["report"] = round(time.time() - t_report, 3)
    mpr = round_stats.merges_per_round
    stats = {
        "engine": engine,
        "engine_decision": why,
        "driver_budget_mb": round(budget.bytes / 2**20),
        "handoff_to_driver_at_merge": handoff_at,
        "merges": len(merges),
        "merges_wanted": target,
        "stopped_early": len(merges) < target,
        "resumed_from_merge": len(prior[:target]),
        "vocab_size": base.size + len(merges) + len(cfg.special_tokens),
        "base_vocab_size": base.size,
        "special_tokens": len(cfg.special_tokens),
        "words_in_table": wt.meta.get("unique_words"),
        "symbols_in_table": symbols,
        "corpus_tokens_before": total_tokens,
        "corpus_tokens_after": tokens_left[-1] if tokens_left else total_tokens,
        "spark_rounds": round_stats.rounds,
        "spark_merges_per_round": (
            {"min": min(mpr), "median": statistics.median(mpr), "max": max(mpr),
             "mean": round(sum(mpr) / len(mpr), 2)} if mpr else None),
        "spark_seconds_per_round_median": (
            round(statistics.median(round_stats.seconds_per_round), 4) if mpr else None),
        "spark_refresh_jobs": round_stats.refresh_jobs,
        "working_set_tokens_by_round": round_stats.working_set_tokens[:: max(1, len(mpr) // 50)]
        if mpr else [],
        "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "stage_seconds": stages,
    }
    stages["outputs"] = round(time.time() - t_out, 3)
    stages["total_after_session"] = round(time.time() - t_start, 3)
    fsutil.write_text(spark, fsutil.join(cfg.output, "config.json"), cfg.to_json())
    fsutil.write_text(spark, fsutil.join(cfg.output, "stats.json"), json.dumps(stats, indent=2))
    fsutil.write_text(spark, fsutil.join(cfg.output, "run.json"), json.dumps({
        "format": "spark-bpe run", "version": 1, "fingerprint": fp, "merges": len(merges),
        "merges_wanted": target, "stats": stats, "notes": notes,
    }, indent=2))
    for n in notes:
        log.warning(n)
    return RunResult(cfg.output, merges, stats, notes)


def _train_local(lt: LocalTrainer, target: int, cfg: Config, merges: list[Merge],
                 removed: list[int], vocab_now: list[bytes], progress: Progress,
                 maybe_checkpoint) -> None:
    """Continue on the driver; ``lt`` holds the working set after ``merges``. Bookkeeping
    (progress, checkpoints) runs between chunks of merges, not after each one."""
    offset = len(merges) - len(lt.merges)
    chunk = 256
    while len(merges) < target:
        before = len(lt.merges)
        lt.train(min(before + chunk, target - offset), cfg.min_pair_count,
                 cfg.max_token_bytes or None)
        new = lt.merges[before:]
        if not new:
            break
        for m in new:
            vocab_now.append(vocab_now[m.left] + vocab_now[m.right])
        merges.extend(new)
        removed.extend(lt.removed[before:])
        progress.update(len(merges), new[-1], vocab_now, "local")
        maybe_checkpoint()
    if merges:
        progress.update(len(merges), merges[-1], vocab_now, "local", force=True)
