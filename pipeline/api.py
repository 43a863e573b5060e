"""The Python API: train, count and encode from a notebook, an Airflow ``PythonOperator`` or
any program, without the command line.

    from pipeline import api

    run = api.train("s3a://lake/corpus/", output="s3a://lake/tok/en-32k", vocab_size=32768)
    run = api.train(["data/a", "data/b"], output="out/mix", vocab_size=8192,
                    input_weights=[3, 1])                      # a weighted mixture
    run = api.train(spark.table("docs").select("body"), output="out/docs",
                    vocab_size=8192, text_column="body")       # a DataFrame
    ids = run.tokenizer().encode("hello world")
    words = api.count_words("data/sample", output="out/words")
    api.encode("data/sample", tokenizer=run.dir, output="out/ids")
    api.encode(spark.table("docs"), tokenizer=run.dir, output="out/doc-ids", text_column="body")

Every keyword is a config key (``spark-submit jobs/train.py --help`` lists them, with their
defaults); a wrong key or value raises :class:`pipeline.config.ConfigError` before any Spark
work. ``spark``: the session to use (default: the active one, else one is started in local
mode). A DataFrame that selects, filters, samples or repartitions the rows of one file source
(``spark.read.parquet(...)``, ``spark.table(...)``) is read in the order of its files (path
order, rows in file order; repartitioned, only Parquet, whose rows have an index), so it
trains as the same files given as paths do; one sorted last (``orderBy``) in the sorted
order; any other DataFrame (rows made in memory, joins, unions, exploded rows) in its
partitions' order, rows in partition order: sort it for a result that does not depend on
partitioning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline import fsutil
from pipeline.config import (
    CORPUS_KEYS,
    COUNT,
    ENCODE,
    PATH_KEYS,
    TRAIN,
    Config,
    ConfigError,
    _apply,
    job_keys,
    validate,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipeline.encoder import Tokenizer

log = logging.getLogger(__name__)

PathArg = str | os.PathLike  # a path: a string (a URI too) or a pathlib.Path


@dataclass
class Run:
    """A finished training run: where it is, and what it says about itself."""

    dir: str
    merges: int
    stats: dict = field(repr=False)
    already_done: bool = False
    names: tuple[str, ...] = field(default=(), repr=False)  # what the run directory holds
    # a run on another filesystem: what the encoders need, read while the session was up
    # (the call may stop the session it made)
    meta: dict | None = field(default=None, repr=False)
    export: Any = field(default=None, repr=False)

    def tokenizer(self) -> Tokenizer:
        """The reference encoder for this run (``pipeline.encoder.Tokenizer``)."""
        from pipeline.encoder import Tokenizer

        if self.meta is not None:
            return Tokenizer.from_meta(self.meta, fsutil.join(self.dir, "tokenizer_meta.json"))
        return Tokenizer.load(self.dir)

    def tiktoken(self, ignore_normalization: bool = False):
        """A ``tiktoken.Encoding`` built from the run's export (see
        ``pipeline.outputs.load_tiktoken``)."""
        from pipeline.outputs import NO_EXPORT_BECAUSE, load_tiktoken

        if self.meta is not None and self.export is None:  # (read when the run ended)
            raise FileNotFoundError(f"{self.dir} has no tiktoken export: {NO_EXPORT_BECAUSE}")
        return load_tiktoken(self.dir, ignore_normalization=ignore_normalization,
                             export=self.export)

    @property
    def files(self) -> list[str]:
        """The paths of the run's files that exist (a ``chars`` run, or one whose custom
        pattern tiktoken cannot split as training did, has no tiktoken export;
        ``words`` and ``checkpoints`` are directories and not listed)."""
        return [fsutil.join(self.dir, n) for n in self.names]


_API_NAMES = {TRAIN: "train", COUNT: "count_words", ENCODE: "encode"}


def _config(job: str, corpus: Any, options: dict[str, Any]) -> tuple[Config, Any]:
    """The config for ``job`` from the built-in defaults and ``options`` (the sample run's
    settings in conf/default.toml do not apply here), and the DataFrame corpus, if any."""
    cfg = Config()
    frame = None
    corpus = _fspath(corpus)
    options = {k: _fspath(v) for k, v in options.items()}
    if corpus is not None:
        given = sorted(k for k in options
                       if k in CORPUS_KEYS and k in job_keys(job))  # (others: not its keys)
        if given:  # (the keyword would win over the positional corpus, unsaid)
            raise ConfigError(f"config key {given[0]!r}: the corpus is given twice, as the "
                              f"first argument and as {given[0]}=; give it once")
        if isinstance(corpus, str):
            options = {"input": corpus, **options}
        elif isinstance(corpus, (list, tuple)) and all(isinstance(c, str) for c in corpus):
            if not corpus or any(not c.strip() for c in corpus):
                raise ConfigError("config key 'input': the list of paths has an empty source "
                                  f"({list(corpus)!r})")
            if any(len(Config(input=c).inputs) != 1 for c in corpus):
                raise ConfigError("config key 'input': a path with a comma (outside a glob's "
                                  "braces) cannot be one of several sources")
            options = {"input": ",".join(corpus), **options}
        elif hasattr(corpus, "sparkSession") and hasattr(corpus, "schema"):
            frame = corpus
        else:
            raise ConfigError("the corpus must be a path, a list of paths or a Spark DataFrame, "
                              f"not {type(corpus).__name__}")
    foreign = sorted(k for k in options
                     if k in Config.__dataclass_fields__ and k not in job_keys(job))
    if foreign:  # e.g. vocab_size given to count_words: an error, not silently ignored
        raise ConfigError(f"config key {foreign[0]!r} is not a setting of "
                          f"{_API_NAMES[job]}() (its keys: `jobs/{_API_NAMES[job]}.py --help`)")
    _apply(options, cfg, "api")
    _absolute_paths(cfg)
    cfg = validate(cfg, job, frame=frame is not None)
    _log_where_seen(cfg, explicit="log_level" in options)
    log.info("%s config: %s", job, cfg.to_json(job, indent=None))  # as the jobs log it
    return cfg, frame


def _keys(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with each key spelled with underscores (``vocab-size`` is ``vocab_size``,
    as on the command line); a key given in both spellings is refused, as in a config file."""
    keys: dict[str, Any] = {}
    for name, value in options.items():
        key = name.replace("-", "_")
        if key in keys:
            raise ConfigError(f"config key {key!r} is given twice ({key!r} and "
                              f"{key.replace('_', '-')!r}); give it once")
        keys[key] = value
    return keys


def _fspath(value: Any) -> Any:
    """A ``pathlib.Path`` (any path-like) as its string; in a list or tuple too."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_fspath(v) for v in value)
    return value


def _log_where_seen(cfg: Config, explicit: bool) -> None:
    """Our log lines (heartbeats included) on stderr at ``log_level`` when the program has not
    configured logging (a notebook, a bare script): Python would show only warnings. A
    program that configured its own logging keeps it; ``log_level`` given here still sets
    the level of ours."""
    from pipeline.progress import BarAwareHandler

    ours = logging.getLogger("pipeline")
    if explicit:
        ours.setLevel(cfg.log_level.upper())
    theirs = logging.getLogger().handlers + ours.handlers
    if theirs:  # a handler writing to the terminal that knows nothing of the bar: no bar
        if cfg.progress_bar and any(
                isinstance(h, logging.StreamHandler) and not isinstance(h, BarAwareHandler)
                and getattr(h, "stream", None) in (sys.stderr, sys.__stderr__) for h in theirs):
            cfg.progress_bar = False
        return
    handler = BarAwareHandler(sys.stderr)  # (clears a bar on a terminal around each line)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                           datefmt="%H:%M:%S"))
    ours.addHandler(handler)
    if ours.level == logging.NOTSET:  # (a level the program set on ours is theirs)
        ours.setLevel(cfg.log_level.upper())


def _absolute_paths(cfg: Config) -> None:
    """Relative local paths made absolute against this process's working directory, which a
    notebook may have changed since Spark started: the JVM would resolve them against its own
    and write some files elsewhere."""
    fixed = cfg.with_absolute_paths()
    for key in ("input", *PATH_KEYS):
        setattr(cfg, key, getattr(fixed, key))


# settings that make a Spark session: an existing one (``spark=``, or the notebook's active
# session) keeps its own
_SESSION_KEYS = ("master", "spark_ui")


@contextlib.contextmanager
def _session(cfg: Config, spark: SparkSession | None, app: str, options: dict[str, Any]
             ) -> Iterator[Any]:
    """The session for one call: ``spark``, else the active session, else one made (and
    stopped) here. An existing session keeps its settings: ``master`` or ``spark_ui`` given
    to the call are logged as not applied; ``shuffle_partitions`` applies for the call only."""
    session = spark
    if session is not None and not hasattr(session, "sparkContext"):
        raise ConfigError(f"spark= must be a SparkSession (or None: the active one, else one "
                          f"started here), not {session!r}")
    if session is None:
        session = _existing_session()
    if session is None:
        from pipeline.spark_session import build_session

        made = build_session(cfg, app)
        try:
            with _worker_python_explained():
                yield made
        finally:
            made.stop()
        return
    ignored = [k for k in _SESSION_KEYS if k in options]
    if ignored:
        log.warning("%s not applied: the Spark session already exists (its master is %s); "
                    "they apply when the call starts its own session",
                    ", ".join(ignored), session.sparkContext.master)
    with _shuffle_partitions(session, cfg.shuffle_partitions), _worker_python_explained():
        yield session


# per session: [calls that set spark.sql.shuffle.partitions, the session's own value]
_shuffle_set: dict[int, list] = {}
_shuffle_lock = threading.Lock()


@contextlib.contextmanager
def _shuffle_partitions(session: SparkSession, partitions: int) -> Iterator[None]:
    """``spark.sql.shuffle.partitions`` = ``partitions`` (0: left alone) for the call; the
    session's own value back when the last of the calls that set it ends (calls from several
    threads share the session's setting: the last one set is theirs while they overlap)."""
    if not partitions:
        yield
        return
    key = "spark.sql.shuffle.partitions"
    with _shuffle_lock:
        held = _shuffle_set.setdefault(id(session), [0, session.conf.get(key)])
        held[0] += 1
        session.conf.set(key, str(partitions))
    try:
        yield
    finally:
        with _shuffle_lock:
            held[0] -= 1
            if not held[0]:
                del _shuffle_set[id(session)]
                session.conf.set(key, held[1])


def _existing_session() -> SparkSession | None:
    """The program's live session, if it has one: the active session, else the one made
    first (the active session is per thread: from a thread of its own a call sees none, and
    stopping the one it then "made", the caller's, would end the caller's work), else a
    session on a SparkContext the program made without one (older RDD code). A session
    whose context was stopped is none: a new one is made."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    for session in (SparkSession.getActiveSession(), SparkSession._instantiatedSession):
        if session is not None and session.sparkContext._jsc is not None:
            return session
    context = SparkContext._active_spark_context
    if context is not None and context._jsc is not None:
        return SparkSession(context)  # (not stopped here: the context is the program's)
    return None


@contextlib.contextmanager
def _worker_python_explained() -> Iterator[None]:
    """A task that failed to import what the job needs (a session built without
    PYSPARK_PYTHON runs the system's python3): one ConfigError saying what to set."""
    try:
        yield
    except Exception as exc:
        from pipeline.spark_session import worker_python_failure

        why = worker_python_failure(exc)
        if not why:
            raise
        raise ConfigError(why) from None


def train(corpus: PathArg | list[PathArg] | DataFrame | None = None, *, output: PathArg,
          vocab_size: int | None = None, spark: SparkSession | None = None,
          **options: Any) -> Run:
    """Train a tokenizer into ``output`` (a run directory) and return the :class:`Run`.
    ``corpus``: a path, paths, or a DataFrame; or ``words=`` a word table instead."""
    from pipeline.train import train as train_run

    options = _keys({"output": output, **options})
    if vocab_size is not None:
        options["vocab_size"] = vocab_size
    options.setdefault("progress_bar", False)
    cfg, frame = _config(TRAIN, corpus, options)
    with _session(cfg, spark, "spark-bpe api train", options) as session:
        result = train_run(session, cfg, frame=frame)
        names = _run_files(session, result.run_dir)
        meta = export = None
        if not fsutil.is_local(result.run_dir):
            meta, export = _encoder_files(session, result.run_dir, names)
    return Run(result.run_dir, int(result.stats.get("merges", len(result.merges))),
               result.stats, result.already_done, names, meta, export)


def _encoder_files(spark: SparkSession, run_dir: str, names: tuple[str, ...]
                   ) -> tuple[dict, Any]:
    """A run's ``tokenizer_meta.json`` and tiktoken export (None for a chars run), read
    through ``spark``."""
    import json

    from pipeline.outputs import read_tiktoken_export

    meta = json.loads(fsutil.read_text(spark, fsutil.join(run_dir, "tokenizer_meta.json")))
    export = (read_tiktoken_export(run_dir, spark) if "tokenizer.tiktoken" in names
              else None)
    return meta, export


def _run_files(spark: SparkSession, run_dir: str) -> tuple[str, ...]:
    """The files a finished run directory holds, of those a run writes."""
    from pipeline.outputs import RUN_ENTRIES

    present = set(fsutil.list_dir(spark, run_dir) or ())
    return tuple(n for n in RUN_ENTRIES if n in present and n not in ("words", "checkpoints"))


def count_words(corpus: PathArg | list[PathArg] | DataFrame | None = None, *,
                output: PathArg, spark: SparkSession | None = None, **options: Any) -> dict:
    """Count ``corpus`` into a word table at ``output``; returns its metadata (the contents of
    ``word_table.json``: statistics, settings, input fingerprint). ``corpus``: a path, paths,
    or a DataFrame; or ``input_table=`` a catalog table instead."""
    from pipeline.count.word_count import count_words as count

    options = _keys({"output": output, **options})
    options.setdefault("progress_bar", False)
    cfg, frame = _config(COUNT, corpus, options)
    with _session(cfg, spark, "spark-bpe api count_words", options) as session:
        return count(session, cfg, frame=frame).meta


def encode(corpus: PathArg | list[PathArg] | DataFrame | None = None, *, tokenizer: PathArg,
           output: PathArg, spark: SparkSession | None = None, **options: Any) -> dict:
    """Encode ``corpus`` (a Parquet path, several, or a DataFrame with ``text_column``) with a
    trained run into ``output``; returns the summary that ``_encode.json`` holds (rows, bytes,
    tokens, bytes per token, ...). The other columns are carried as keys (``key_columns``);
    without any, the file and row of a Parquet row, or a DataFrame row's Spark id."""
    from pipeline.encode_corpus import check_encode_config, encode_corpus

    options = _keys({"output": output, "tokenizer": tokenizer, **options})
    options.setdefault("progress_bar", False)  # (as train and count_words: the log only)
    cfg, frame = _config(ENCODE, corpus, options)
    check_encode_config(cfg, frame=frame is not None)  # before any Spark work, as the CLI does
    with _session(cfg, spark, "spark-bpe api encode", options) as session:
        return encode_corpus(session, cfg, frame).stats
