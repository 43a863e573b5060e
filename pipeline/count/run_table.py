"""The training run's word table (``RUN_DIR/words``): the one given with ``--words``, or the
run's own, reused while its input and split settings match, else counted again (pure
plumbing around the count stage; ``train.prepare`` calls :func:`word_table_for`)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from pipeline import fsutil
from pipeline.checkpoint import Checkpointer
from pipeline.config import Config, ConfigError, unused_with_words
from pipeline.count.corpus import describe_input_change, input_fingerprint, list_input
from pipeline.count.external import import_word_table, is_ours
from pipeline.count.word_count import count_words
from pipeline.count.word_table import (
    SPECIAL_TOKENS_CUT,
    DamagedWordTable,
    WordTable,
    open_word_table,
    setting_changes,
    source_changes,
    split_settings,
)
from pipeline.lease import Lease
from pipeline.progress import Progress
from pipeline.spark_session import start_session

log = logging.getLogger(__name__)


@dataclass
class WordTableChoice:
    table: WordTable
    count_seconds: float  # 0 when an existing table was used


def word_table_for(spark: SparkSession, cfg: Config, progress: Progress,
                   frame: DataFrame | None = None,
                   invalidate_run: Callable[[], None] = lambda: None) -> WordTableChoice:
    """The word table: the one given (--words, trusted as given), or the run's own, counted
    from --input and reused by a later run only while the input's fingerprint (file listing,
    sizes, modification times, footer row counts) and the split settings still match."""
    t0 = time.monotonic()
    unused = unused_with_words(cfg)
    if unused:
        log.warning("%s not used: --words gives a word table, already counted (they apply to "
                    "reading a corpus)", ", ".join(unused))
    if cfg.words and is_ours(spark, cfg.words):
        return WordTableChoice(open_word_table(spark, cfg.words), 0.0)
    own = fsutil.join(cfg.output, "words")
    # RUN/words is written as the word count writes any output: under its own lease too (a
    # count_words job pointed at it must not interleave), held here for the whole step
    with Lease.beside(spark, own, cfg.lease_timeout_seconds, "word count") as lease:
        for path in fsutil.remove_stale_temps(spark, own):
            log.info("removed %s, left by an interrupted run", path)
        if cfg.words:  # made elsewhere: imported into the run directory, taken as given
            _refuse_other_settings(spark, cfg, 0)
            import_word_table(spark, cfg, cfg.words, own, lease.check,
                              _unless_the_same(spark, own, invalidate_run))
            return WordTableChoice(open_word_table(spark, own), 0.0)
        return _own_word_table(spark, cfg, progress, frame, own, lease, t0, invalidate_run)


def _own_word_table(spark: SparkSession, cfg: Config, progress: Progress,
                    frame: DataFrame | None, own: str, lease: Lease, t0: float,
                    invalidate_run: Callable[[], None]) -> WordTableChoice:
    """The run's own table at ``own``: reused while its input and settings match, else
    counted (holding ``lease``)."""
    wt = None
    republish = False  # the run is published again even if the new table's words are the same
    if frame is None and fsutil.exists(spark, fsutil.join(own, "word_table.json")):
        wt = _reusable_table(spark, own)  # (None when damaged: counted again)
    if wt is not None:
        changed_input = source_changes(wt.meta, cfg)
        made_with = split_settings(wt.meta)
        changed_split = setting_changes(made_with, {k: getattr(cfg, k) for k in made_with})
        if changed_input or changed_split:
            if changed_split:  # (a refusal first: no "recounting" line before it)
                _refuse_other_settings(spark, cfg, cfg.max_word_bytes)
            log.info("recounting: the word table at %s was counted with another %s (%s)", own,
                     "input" if changed_input else "split",
                     "; ".join(changed_input + changed_split))
        elif _skipped_files(wt) and not cfg.ignore_corrupt_files:
            log.info("recounting: the word table at %s left out %d unreadable files "
                     "(--ignore-corrupt-files), which this run does not skip", own,
                     len(_skipped_files(wt)))
        elif _cut_elsewhere(wt, cfg):
            log.info("recounting: the word table at %s was counted by an older version that "
                     "cut special tokens after normalization and lowercasing", own)
        else:
            files, footers, skipped = list_input(spark, cfg)
            now = input_fingerprint(spark, files, footers, cfg)
            then = wt.meta.get("input_fingerprint")
            newly = sorted(set(skipped or ()) - set(_skipped_files(wt)))
            if newly:  # (left out of the listing, so not in the digest: stats must name them)
                republish = True  # (the run's stats.json too, whatever the words)
                log.info("recounting: %d unreadable input files that the word table at %s "
                         "did not leave out, e.g. %s", len(newly), own, newly[0])
            elif then and then.get("digest") == now["digest"]:
                if not fsutil.is_local(own) or "byte_symbols" not in wt.meta:
                    start_session(spark)  # the table will be read or summed through Spark
                log.info("reusing the word table already counted at %s (input unchanged: "
                         "%d files, %d bytes)", own, now["files"], now["bytes"])
                return WordTableChoice(wt, 0.0)
            else:
                log.info("recounting: %s", describe_input_change(then, now))
    _refuse_other_settings(spark, cfg, cfg.max_word_bytes)
    sub = Config(**{**cfg.__dict__, "output": own})
    # a recount (a changed input, other weights or paths) must not leave the earlier run.json
    # beside a new table: it goes when the new table replaces the old one, not before (a
    # count that fails leaves the earlier run complete). A DataFrame is counted on every run:
    # the same one gives the same table, and the run stays complete.
    log.info("counting the words of %s into %s", cfg.input or cfg.input_table or "a DataFrame",
             own)
    wt = count_words(spark, sub, progress, frame, lease,
                     (lambda new: invalidate_run()) if republish
                     else _unless_the_same(spark, own, invalidate_run))
    return WordTableChoice(wt, time.monotonic() - t0)


def _unless_the_same(spark: SparkSession, own: str, invalidate_run: Callable[[], None]
                     ) -> Callable[[dict | None], None]:
    """What to do just before a new table replaces the run's own: mark the run incomplete
    (``invalidate_run``) unless the new table is the one there now (the same digest: a
    DataFrame or an external table counted again), whose run stays complete."""
    try:
        before = json.loads(fsutil.read_text(spark, fsutil.join(own, "word_table.json")))
    except Exception:  # noqa: BLE001 - none there, or unreadable: nothing to compare with
        before = {}

    def replacing(new: dict | None) -> None:
        old_digest = before.get("digest")
        if new is None or old_digest is None or new.get("digest") != old_digest:
            invalidate_run()

    return replacing


def _reusable_table(spark: SparkSession, own: str) -> WordTable | None:
    """The run's own word table, or None when its data files are damaged (then it is counted
    again, as for a changed input; a damaged ``--words`` table is an error instead)."""
    try:
        return open_word_table(spark, own)
    except DamagedWordTable as exc:
        log.warning("recounting: %s", str(exc).removeprefix("config key 'words': "))
        return None


def _skipped_files(wt: WordTable) -> list:
    """The files the table's count left out as unreadable (``--ignore-corrupt-files``)."""
    return (wt.meta.get("left_out") or {}).get("unreadable_files") or []


def _cut_elsewhere(wt: WordTable, cfg: Config) -> bool:
    """Whether the table's special tokens were cut where this version no longer cuts them, in
    a way that can matter (normalization or lowercasing with special tokens)."""
    return (wt.meta.get("special_tokens_cut") != SPECIAL_TOKENS_CUT and bool(cfg.special_tokens)
            and (cfg.lowercase or cfg.normalization != "none"))


def _refuse_other_settings(spark: SparkSession, cfg: Config, max_word_bytes: int) -> None:
    """Called before RUN/words is replaced (counted, or imported with ``max_word_bytes`` 0):
    when the run's newest checkpoint was made with other split settings, the run would refuse
    it once the table is written; refuse now, leaving the table the checkpoints were made
    from in place (a later --words run, or the original command, still finds it)."""
    if cfg.resume == "never":
        return
    ckdir = cfg.checkpoint_dir or fsutil.join(cfg.output, "checkpoints")
    run = cfg.with_absolute_paths().output
    checkpoints = Checkpointer(spark, ckdir, "", 0, run=run)
    then, writer = checkpoints.newest_settings()
    if not then:
        return
    now = {**cfg.pretokenizer_spec().as_meta(), "max_word_bytes": max_word_bytes}
    differ = setting_changes(split_settings(then), now)
    if not differ:
        return
    said = ", ".join(differ)
    if checkpoints.another_run(writer):
        raise checkpoints.shared_with(writer, f"with other split settings ({said})")
    raise ConfigError(
        f"{cfg.output} was trained with other split settings ({said}): its checkpoints in "
        f"{ckdir} do not fit this run. Use another --output, or start fresh with "
        "--resume never (resume='never' in pipeline.api; deletes these checkpoints)")


def adopt_table_settings(cfg: Config, wt: WordTable) -> None:
    for key, value in split_settings(wt.meta).items():
        if getattr(cfg, key) != value:
            if key == "max_word_bytes" and wt.meta.get("external"):  # nothing to warn about
                log.info("an external word table: its words are used as given (no "
                         "max_word_bytes cap)")
            else:
                log.warning("the word table was made with %s = %r; using that (config said "
                            "%r)", key, value, getattr(cfg, key))
            setattr(cfg, key, value)
