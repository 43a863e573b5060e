"""What the count reads: a corpus's sources listed in corpus order (without the JVM for local
Parquet, else through Spark's readers), its files' fingerprint, the Arrow reader's slices, and
the one-line errors for unreadable files. Corpus order (sources in the order given, files by
path, rows in file order) is what ``first_seen`` records (docs/DESIGN.md section 1)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import heapq
import logging
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.utils import AnalysisException

from pipeline import fsutil
from pipeline.config import Config, ConfigError
from pipeline.spark_session import DeferredSession, start_session

log = logging.getLogger(__name__)

UNREADABLE = "spark-bpe: unreadable input file"  # a task's error naming a corrupt file
NOT_HERE = "spark-bpe: not on this executor"  # a task's error: a local path it does not see
SHARED_FS = ("a local path must be on a filesystem that the driver and every executor share "
             "(the same path on every machine, as with NFS), or give an hdfs://, s3a://, ... "
             "URI")


def not_here(path: str, what: str = "input") -> RuntimeError:
    """Raised in a task for a local ``path`` the driver listed (``what`` = input) or made
    (output) and this executor does not find (see :func:`unreadable_file_error`): never
    skipped as a corrupt file. The path comes last, whole to the end of the line."""
    return RuntimeError(f"{NOT_HERE} {what} {socket.gethostname()} :: {path}")


class UnreadableFile(RuntimeError):
    """Raised in a task for an input file it cannot read (corrupt, truncated): the driver
    makes it one line naming the file (see :func:`unreadable_file_error`). A task may report
    it instead of failing (:class:`pipeline.spark_session.TaskErrors`): no retry mends it."""

    @classmethod
    def at(cls, path: str, reason: str) -> UnreadableFile:
        return cls(f"{UNREADABLE} {path} :: {reason}")


def parse_not_here(text: str, what: str) -> tuple[str, str] | None:
    """(host, path) of a task's :func:`not_here` error about ``what`` in Spark's message."""
    m = re.search(re.escape(f"{NOT_HERE} {what} ") + r"(\S+) :: ([^\n]+)", text)
    return (m.group(1), m.group(2).rstrip()) if m else None


def removed_while_listed(path: str) -> ConfigError:
    return ConfigError(f"config key 'input': {path} was removed while the input was listed "
                       "(another process changing the corpus?); rerun when it is stable")


def normalize_uri(uri: str) -> str:
    """One spelling per file (see :func:`normalize_path`) of a URI as Spark gives it:
    ``inputFiles()`` and ``_metadata.file_path`` percent-encode it (``part%231.parquet``)."""
    u = urlparse(uri)
    return f"{u.scheme or 'file'}://{u.netloc}{unquote(u.path)}"


def as_uri(path: str) -> str:
    """The URI Spark would give for a path spelled as :func:`normalize_path` spells it (its
    name percent-encoded): ``normalize_uri(as_uri(p)) == p``."""
    u = normalize_path(path)
    s, _, rest = u.partition("://")
    netloc, slash, name = rest.partition("/")
    return f"{s}://{netloc}{quote(slash + name, safe='/')}"


GLOB_CHARACTERS = re.compile(r"([\\{}\[\]*?])")


def literal_path(uri: str) -> str:
    """A file named by Spark's URI (``inputFiles()``) as its readers take one file: its name
    decoded (a reader reads ``%20`` as three characters) and glob characters escaped (a reader
    reads ``[ab]`` as a pattern)."""
    return GLOB_CHARACTERS.sub(r"\\\1", normalize_uri(uri))


def normalize_path(path: str) -> str:
    """One spelling per file, ``scheme://authority/path`` with the path as the filesystem
    names it, of a path as it is written: a local path, ``file:/x`` or ``file:///x``, a
    Hadoop ``Path``'s string. Nothing in it is an escape, a query or a fragment: ``#``, ``?``
    and ``%`` are characters of the file's name. Idempotent."""
    s = fsutil.scheme(path)
    if not s:  # (an absolute path; or a name that stands for a source without files)
        return "file://" + path
    rest, netloc = path[len(s) + 1:], ""
    if rest.startswith("//"):
        netloc, slash, rest = rest[2:].partition("/")
        rest = slash + rest or "/"
    return f"{s}://{netloc}{rest}"


def read_corpus(spark: SparkSession, path: str, text_column: str,
                input_format: str = "parquet") -> tuple[DataFrame, list[str]]:
    """One corpus (``input_format``, read as the count reads it) as a DataFrame, and its files
    in corpus (path) order (the encode job's input: every row gets its ids, so an unreadable
    file is never skipped)."""
    cfg = Config(input=path, text_column=text_column, input_format=input_format)
    df, files, *_ = read_source(spark, cfg, path, None, can_skip=False, all_columns=True)
    if not files:
        raise ConfigError(f"config key 'input': no {format_name(cfg)} files under {path} "
                          "(empty corpus)")
    return df, files


_TEXT_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
               pa.types.is_large_binary)


_FORMAT_NAMES = {"parquet": "Parquet", "json": "JSON lines", "csv": "CSV", "orc": "ORC",
                 "text": "text", "delta": "Delta (Parquet)"}


def format_name(cfg: Config) -> str:
    """What the input's files are, for errors: "Parquet", "JSON lines", ... ("data" for a
    catalog table, whatever it is stored as)."""
    return "data" if cfg.input_table else _FORMAT_NAMES.get(cfg.input_format, "input")


def corrupt_file_error(path: str, reason: str, can_skip: bool = True,
                       kind: str = "Parquet") -> ConfigError:
    """``can_skip``: the job takes --ignore-corrupt-files (the count does, encode does not:
    every row of its input gets its ids). ``kind``: :func:`format_name`."""
    what = ("or pass --ignore-corrupt-files to skip unreadable files" if can_skip
            else "then rerun")
    other = _format_by_name(path) if kind == "Parquet" else None
    if other is not None:  # (the default format, given another format's file)
        what = f"or, if the input is {other} files, pass --input-format {other}; {what}"
    return ConfigError(f"config key 'input': {path} is not a readable {kind} file ({reason}); "
                       f"fix or remove it, {what}")


_FORMAT_OF_SUFFIX = {".json": "json", ".jsonl": "json", ".ndjson": "json", ".csv": "csv",
                     ".txt": "text", ".text": "text", ".orc": "orc"}


def _format_by_name(path: str) -> str | None:
    """The input format a file's name says it is in (``a.jsonl``, ``b.csv.gz``), or None."""
    name = path.rsplit("/", 1)[-1].lower()
    for compressed in (".gz", ".bz2", ".zst", ".lz4", ".snappy", ".deflate"):
        name = name.removesuffix(compressed)
    return _FORMAT_OF_SUFFIX.get(os.path.splitext(name)[1])


def list_local_corpus(path: str, text_column: str,
                      footers: dict[str, pq.FileMetaData] | None = None,
                      skipped: list[str] | None = None) -> list[str] | None:
    """The files of a local corpus listed without the JVM (as :func:`read_corpus` lists them),
    when that is unambiguous: one Parquet file, or a directory that holds only files (names
    starting with ``_`` or ``.`` skipped, as Spark does). None lets Spark list and validate:
    globs, nested or partitioned directories, names Spark lists otherwise (``_x=1``,
    ``_metadata``, ``x._COPYING_``), other filesystems, a missing column or one that is not
    text. A file whose Parquet footer cannot be read is an error naming it, or, with
    ``skipped`` given (``ignore_corrupt_files``), left out and added to ``skipped``.
    ``footers``, if given, receives each listed file's Parquet metadata (read once, for
    :func:`plan_slices`)."""
    if not fsutil.is_local(path) or fsutil.has_glob(path):
        return None
    local = os.path.abspath(fsutil.local_path(path))
    try:
        if os.path.isfile(local):
            candidates = [local]
        elif os.path.isdir(local):
            every = list(os.scandir(local))
            if any(_spark_lists_otherwise(e.name) for e in every):
                return None
            entries = [e for e in every if not e.name.startswith(("_", "."))]
            if not entries:
                raise ConfigError(f"config key 'input': no Parquet files under {path} (an "
                                  "empty directory)")
            if not all(e.is_file() for e in entries):
                return None
            candidates = [e.path for e in entries]
        else:
            return None
    except PermissionError as exc:
        raise ConfigError(f"config key 'input': cannot read {path}: permission denied "
                          f"({exc.strerror or exc})") from None
    read: dict[str, pq.FileMetaData] = {}
    lacking: list[tuple[str, pa.Schema]] = []  # the files without the column
    lacking_rows: list[tuple[str, pa.Schema]] | None = []  # ... that have no rows either
    for f in candidates:
        try:
            meta = pq.ParquetFile(f).metadata
            schema = meta.schema.to_arrow_schema()
        except FileNotFoundError:  # (not a corrupt file to skip)
            raise removed_while_listed(normalize_path("file://" + f)) from None
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds
            if skipped is None:
                raise corrupt_file_error(f, first_line(exc)) from None
            skipped.append(normalize_path("file://" + f))
            continue
        i = schema.get_field_index(text_column)
        if i < 0:  # (in another case Spark's reader may take it: spark.sql.caseSensitive)
            if text_column.lower() in (n.lower() for n in schema.names):
                return None
            if meta.num_rows == 0 and lacking_rows is not None:
                lacking_rows.append((f, schema))  # (an empty placeholder: nothing to lose)
                continue
            lacking.append((f, schema))
            continue
        if not is_text_type(schema.field(i).type):
            return None
        read[normalize_path("file://" + f)] = meta
    lacking = lacking or ([] if read else lacking_rows or [])
    if lacking and not read:  # in no file: an error now, not after Spark has started
        raise ConfigError(f"config key 'text_column': column {text_column!r} not in {path} "
                          f"(columns: {', '.join(lacking[0][1].names)})")
    if lacking:  # in some files only: Spark's reader would give their rows as nulls
        raise files_without_column(text_column, path, lacking, len(candidates))
    if footers is not None:
        footers.update(read)
    if not read:
        raise ConfigError(f"config key 'input': no readable Parquet files under {path} "
                          f"({len(skipped or [])} unreadable ones skipped)")
    return sorted(read)


class FilesWithoutColumn(ConfigError):
    """Some files of a corpus lack its text column (:func:`files_without_column`)."""


def files_without_column(text_column: str, path: str, lacking: list[tuple[str, pa.Schema]],
                         total: int) -> FilesWithoutColumn:
    """Some files of a corpus lack its text column: Spark would read their rows as nulls and
    the count would skip them, losing whatever they hold (a shard written with another
    column name). One error naming them. (Files without rows are not counted among them.)"""
    f, schema = lacking[0]
    return FilesWithoutColumn(
        f"config key 'text_column': column {text_column!r} is missing from {len(lacking)} of "
        f"the {total} files of {path}, e.g. {f} (columns: {', '.join(schema.names)}); their "
        "rows would be read as nulls and left out. Move those files out of the input, or give "
        "the input as a comma-separated list of the files to read")


def refuse_local_files_without_column(files: list[str], text_column: str, path: str) -> None:
    """:func:`files_without_column` for the local Parquet files among ``files`` (listed by
    Spark); a file that cannot be read is left to the reader that meets it."""
    lacking = []
    for f in files:
        if not fsutil.is_local(f):
            continue
        try:
            meta = pq.read_metadata(fsutil.local_path(f))
            schema = meta.schema.to_arrow_schema()
        except Exception:  # noqa: BLE001 - pyarrow raises several kinds
            continue
        if meta.num_rows and text_column.lower() not in (n.lower() for n in schema.names):
            lacking.append((f, schema))  # (one without rows loses nothing)
    if lacking:
        raise files_without_column(text_column, path, lacking, len(files))


def _spark_lists_otherwise(name: str) -> bool:
    """A name Spark's file index does not treat as "skipped if it starts with _ or .": it
    reads ``_x=1.parquet`` and ``_metadata``, and skips ``x._COPYING_`` (a file being
    copied). Such a directory is left to Spark's listing."""
    return ((name.startswith("_") and "=" in name) or name.endswith("._COPYING_")
            or name.startswith(("_metadata", "_common_metadata")))


def check_local_footers(files: list[str], can_skip: bool = True,
                        text_column: str | None = None) -> int | None:
    """Read the Parquet footer of each local file of ``files`` (cheap): an unreadable one, or
    one whose ``text_column`` is not text, is one error naming it before any Spark task meets
    it (a task's failure comes with pages of Java stack traces in the log). Returns the files'
    rows when every one is local (else None: unknown without reading remote footers)."""
    rows: int | None = 0
    for f in files:
        if not fsutil.is_local(f):
            rows = None
            continue
        try:
            meta = pq.read_metadata(fsutil.local_path(f))
            schema = meta.schema.to_arrow_schema() if text_column else None
        except FileNotFoundError:  # (not a corrupt file to skip)
            raise removed_while_listed(f) from None
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds
            raise corrupt_file_error(f, first_line(exc), can_skip) from None
        if schema is not None and text_column is not None:
            check_text_type(schema, text_column, f)
        if rows is not None:
            rows += meta.num_rows
    return rows


def is_text_type(t: pa.DataType) -> bool:
    """A column read as text (by Spark's Parquet reader, and by pyarrow in our tasks): string
    or binary, dictionary-encoded (a pandas Categorical) or a view type."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    views = [getattr(pa.types, n, None) for n in ("is_string_view", "is_binary_view")]
    return any(is_text(t) for is_text in _TEXT_TYPES) or any(v(t) for v in views if v)


def check_text_type(schema: pa.Schema, text_column: str, f: str) -> bool:
    """Whether the file's schema has ``text_column``; an error naming the file when that
    column is not text (:func:`is_text_type`)."""
    i = schema.get_field_index(text_column)
    if i < 0:
        return False
    if not is_text_type(schema.field(i).type):
        raise ConfigError(f"config key 'text_column': column {text_column!r} is "
                          f"{schema.field(i).type} in {f}, not string or binary")
    return True


def first_line(exc: BaseException | str) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass(frozen=True)
class ReadSlice:
    """Consecutive row groups of one local Parquet file, read in a task with pyarrow."""

    file_index: int
    path: str  # a local path
    row_groups: tuple[int, ...]
    first_row: int  # index in the file of the first row of the first row group
    nbytes: int
    num_rows: int = 0

    def batch_rows(self, most: int, text_bytes: int) -> int:
        """Rows to read at a time by the file's sizes: at most ``most``, and about
        ``text_bytes`` of this slice's rows by their mean size in the file (which understates
        rows that a dictionary makes small: see :func:`read_slice_batches`)."""
        return max(1, min(most, text_bytes * self.num_rows // max(1, self.nbytes)))


PROBE_ROWS = 32  # rows of a slice read first, to measure its rows as decoded


def read_slice_batches(parquet: pq.ParquetFile, s: ReadSlice, columns: list[str], most: int,
                       text_bytes: int) -> Iterator[pa.RecordBatch]:
    """The slice's rows, in order, in batches of at most ``most`` rows and about ``text_bytes``
    as decoded, so that long rows stay few in memory. The file's sizes can understate the rows
    (a long text repeated is one dictionary entry): a first batch of a few rows measures them
    as decoded, then the rest is read in batches of the size that measure gives (the first
    rows decoded twice, a page or so)."""
    groups = list(s.row_groups)
    probe = min(s.batch_rows(most, text_bytes), PROBE_ROWS)
    first = next(parquet.iter_batches(batch_size=probe, row_groups=groups, columns=columns,
                                      use_threads=False), None)
    if first is None:
        return
    yield first
    skip = first.num_rows
    if skip < probe:  # (that was the whole slice)
        return
    rows = max(1, min(most, text_bytes * skip // max(1, first.nbytes)))
    for batch in parquet.iter_batches(batch_size=rows, row_groups=groups, columns=columns,
                                      use_threads=False):
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        yield batch.slice(skip) if skip else batch
        skip = 0


def plan_slices(files: list[str], text_column: str, tasks: int,
                footers: dict[str, pq.FileMetaData] | None = None,
                skipped: list[str] | None = None) -> list[list[ReadSlice]] | None:
    """Row groups of local ``files`` dealt to ``tasks`` tasks of about equal size (largest
    first, each to the least loaded task), each task's slices in corpus order. None when a file
    lacks ``text_column`` as a top-level column (Spark's reader then handles it: the column in
    another case, or an empty file of another schema; a file with rows and no such column is
    refused before, :func:`files_without_column`). ``footers``: metadata already read, by
    file. A file whose footer cannot be read, or whose column is not text, is an error naming
    it; with
    ``skipped`` given (``ignore_corrupt_files``) an unreadable one is left out and added."""
    slices: list[ReadSlice] = []
    for fidx, f in enumerate(files):
        path = fsutil.local_path(f)
        meta = (footers or {}).get(f)
        try:
            meta = meta or pq.ParquetFile(path).metadata
            schema = meta.schema.to_arrow_schema()
        except FileNotFoundError:  # (not a corrupt file to skip)
            raise removed_while_listed(f) from None
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds
            if skipped is None:
                raise corrupt_file_error(f, first_line(exc)) from None
            skipped.append(f)
            continue
        if not check_text_type(schema, text_column, f):
            return None
        first = 0
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            slices.append(ReadSlice(fidx, path, (rg,), first, group.total_byte_size,
                                    group.num_rows))
            first += group.num_rows
    n = max(1, min(tasks, len(slices)))
    loads = [(0, t) for t in range(n)]
    plan: list[list[ReadSlice]] = [[] for _ in range(n)]
    for s in sorted(slices, key=lambda s: (-s.nbytes, s.file_index, s.first_row)):
        load, t = heapq.heappop(loads)
        plan[t].append(s)
        heapq.heappush(loads, (load + s.nbytes, t))
    for task in plan:
        task.sort(key=lambda s: (s.file_index, s.first_row))
    return plan


@dataclass
class Corpus:
    """What the count reads, in corpus order: the sources in the order given (``input``
    split at commas, or the one table or DataFrame), the files of each source by path.
    ``keys[i]`` is file i's (source index, path); ``weights[i]`` its source's weight."""

    files: list[str]
    keys: list[tuple[int, str]]
    weights: list[int]
    df: DataFrame | None = None  # Spark's reader: (text, source, path, block, row)
    footers: dict[str, pq.FileMetaData] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    by_file: bool = True  # each row knows its file (not a view's rows: all its first file's)
    from_frame: bool = False  # a DataFrame (pipeline.api): its rows' order is its own


def _source_weights(cfg: Config, n: int) -> list[int]:
    return list(cfg.input_weights) if cfg.input_weights else [1] * n


def list_local_sources(cfg: Config, footers: dict[str, pq.FileMetaData],
                       skipped: list[str] | None) -> Corpus | None:
    """The corpus listed without the JVM: local Parquet sources only (else None)."""
    if cfg.count_reader == "spark" or cfg.input_format != "parquet" or cfg.input_table:
        return None
    weights = _source_weights(cfg, len(cfg.inputs))
    corpus = Corpus([], [], [], footers=footers, skipped=skipped or [])
    for i, source in enumerate(cfg.inputs):
        files = list_local_corpus(source, cfg.text_column, footers, skipped)
        if files is None:
            return None
        corpus.files += files
        corpus.keys += [(i, f) for f in files]
        corpus.weights += [weights[i]] * len(files)
    return corpus


IGNORE_CORRUPT_KEY = "spark.sql.files.ignoreCorruptFiles"


@contextlib.contextmanager
def skipping_corrupt_files(spark: SparkSession, skip: bool, can_skip: bool = True
                           ) -> Iterator[None]:
    """Spark's readers skip unreadable files (spark.sql.files.ignoreCorruptFiles) while this
    lasts exactly when ``skip`` (``ignore_corrupt_files``); the session's own setting is put
    back after (it may be the user's, in pipeline.api, and other reads must keep it). A
    session that skips them already (a cluster default, ``--conf``) does not while this
    lasts without ``skip``: it would drop a damaged file's rows silently, with no file
    listed as left out (warned once per session). ``can_skip``: the job has
    ``ignore_corrupt_files`` (count, train; not the encode, which reads every row). A
    session not created yet (:class:`DeferredSession`) is not created for this: the setting
    is made if Spark SQL is used while this lasts (one being created in the background is not
    waited for here)."""
    if isinstance(spark, DeferredSession) and not spark.ready:
        with contextlib.ExitStack() as made, spark.when_created(
                lambda session: made.enter_context(_skipping(session, skip, can_skip))):
            yield
        return
    with _skipping(spark, skip, can_skip):
        yield


@contextlib.contextmanager
def _skipping(spark: SparkSession, skip: bool, can_skip: bool) -> Iterator[None]:
    before = spark.conf.get(IGNORE_CORRUPT_KEY, None)
    if not skip and str(before).lower() == "true" and not _told_of_session_skip(spark):
        log.warning("%s is true in this Spark session: not for the corpus, whose unreadable "
                    "files stop the job, named (%s)", IGNORE_CORRUPT_KEY,
                    "give --ignore-corrupt-files to leave them out and list them in "
                    "stats.json" if can_skip else "the encode job reads every row: fix or "
                    "remove them")
    spark.conf.set(IGNORE_CORRUPT_KEY, "true" if skip else "false")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(IGNORE_CORRUPT_KEY)
        else:
            spark.conf.set(IGNORE_CORRUPT_KEY, before)


_TOLD: set[str] = set()  # the applications told that their skipping is not used


def _told_of_session_skip(spark: SparkSession) -> bool:
    app = spark.sparkContext.applicationId
    told = app in _TOLD
    _TOLD.add(app)
    return told


def column(name: str) -> Column:
    """The column named ``name`` as it is: a dot is part of the name (``F.col("meta.id")``
    reads field ``id`` of a struct ``meta``), a backtick too."""
    return F.col("`" + name.replace("`", "``") + "`")


def read_sources(spark: SparkSession, cfg: Config, frame: DataFrame | None = None) -> Corpus:
    """The corpus through Spark's readers (any format, a catalog table, or a DataFrame); with
    ``ignore_corrupt_files``, read it inside :func:`skipping_corrupt_files`."""
    if frame is not None:
        names = ["a DataFrame"]
    else:
        names = [cfg.input_table] if cfg.input_table else cfg.inputs
    weights = _source_weights(cfg, len(names))
    corpus = Corpus([], [], [])
    frames = []
    for i, name in enumerate(names):
        df, files, path, block, row = read_source(spark, cfg, name, frame)
        if path is None:  # a view: its rows count as its first file's
            path, corpus.by_file = F.lit(as_uri(files[0])), False  # (as Spark names it)
        frames.append(df.select(column(cfg.text_column).alias("text"),
                                F.lit(i).cast("int").alias("source"),
                                path.alias("path"),
                                block.cast("long").alias("block"),
                                row.cast("long").alias("row")))
        corpus.files += files
        corpus.keys += [(i, normalize_path(f)) for f in files]
        corpus.weights += [weights[i]] * len(files)
    corpus.df = functools.reduce(DataFrame.unionByName, frames)
    corpus.from_frame = frame is not None
    return corpus


def read_source(spark: SparkSession, cfg: Config, name: str, frame: DataFrame | None,
                can_skip: bool = True, all_columns: bool = False
                ) -> tuple[DataFrame, list[str], Column | None, Column, Column]:
    """One source: its DataFrame, its files in path order, and the columns that order its
    rows: (file path, block, row) = (the row's file, 0, row index in the file) for Parquet;
    (the row's file, split start, None: numbered in the task) for other file formats; (the
    one name, Spark partition, None) for a DataFrame or a table without files; (None, Spark
    partition, None) for a view over files, which has no file metadata. ``can_skip``: the
    job takes ``--ignore-corrupt-files`` (for the message); ``all_columns``: JSON lines are
    read with every column of the first file's schema, not only the text."""
    what = "config key 'input_table'" if cfg.input_table else "config key 'input'"
    try:
        if frame is not None:
            df = frame
        elif cfg.input_table:
            df = spark.table(name)
        elif cfg.input_format == "csv":
            # RFC 4180, as Python's csv module and pandas write it: a quote inside a quoted
            # field is doubled (Spark's default escape, a backslash, would keep both quotes)
            # (enforceSchema off: every file's header is checked against the first one's,
            # else a file with other columns would be read by position, under their names)
            df = (spark.read.option("header", True).option("multiLine", True)
                  .option("escape", '"').option("enforceSchema", False)
                  .csv(fsutil.spark_path(name)))
        elif cfg.input_format == "text":
            df = spark.read.text(fsutil.spark_path(name)).withColumnRenamed(
                "value", cfg.text_column)
        elif cfg.input_format == "json":
            df = _read_json(spark, cfg, fsutil.spark_path(name), all_columns)
        else:
            df = _read_files(spark, cfg.input_format, fsutil.spark_path(name))
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - AnalysisException, or py4j errors
        named = None if isinstance(exc, AnalysisException) \
            else unreadable_file_error(exc, can_skip, format_name(cfg))
        if named is not None:  # an unreadable file
            raise named from None
        msg = _reason(exc)
        if "PATH_NOT_FOUND" in msg or "does not exist" in msg:
            raise ConfigError(f"{what}: path does not exist: {name}") from None
        if _lists_files(cfg, frame) and ("UNABLE_TO_INFER_SCHEMA" in msg
                                         or "Conflicting directory structures" in msg):
            _refuse_files_left_out(spark, what, name, [])  # files only in plain subfolders?
            if not _has_data_files(spark, name):
                raise ConfigError(f"{what}: no {format_name(cfg)} files under {name} (an "
                                  "empty folder, or only hidden files)") from None
            if _skipping_corrupt(spark) and cfg.input_format in ("parquet", "orc"):
                raise ConfigError(f"{what}: no file of {name} could be read: each was skipped "
                                  "as corrupt (ignore_corrupt_files)") from None
        if "CONFLICTING_PARTITION_COLUMN_NAMES" in msg:
            raise ConfigError(f"{what}: the partition folders under {name} are named after "
                              "different columns (key=value with other keys); give each "
                              "folder as an input, or a glob") from None
        if "DATA_SOURCE_NOT_FOUND" in msg or "Failed to find data source" in msg:
            raise ConfigError(f"config key 'input_format': Spark has no {cfg.input_format!r} "
                              "reader here (delta needs the delta-spark package: spark-submit "
                              "--packages io.delta:delta-spark_2.13:<version>)") from None
        if "TABLE_OR_VIEW_NOT_FOUND" in msg:
            raise ConfigError(f"{what}: no table {name!r} in the catalog") from None
        raise ConfigError(f"{what}: cannot read {name}: {msg}") from None
    if frame is not None:
        check_text_column(df, cfg.text_column, name)
        return _frame_source(df, name)
    files = sorted({normalize_uri(f) for f in df.inputFiles()})
    if _lists_files(cfg, frame):
        _refuse_parquet_read_as_text(cfg, files)  # (before its columns: JSON's would be junk)
    check_text_column(df, cfg.text_column, name)
    if _lists_files(cfg, frame):
        _refuse_files_left_out(spark, what, name, files)
    if cfg.input_format == "parquet" and not cfg.input_table:
        refuse_local_files_without_column(files, cfg.text_column, name)
    if not files:  # no files to order by: Spark's partitions, in order
        if frame is None and cfg.input_table:
            raise ConfigError(f"{what}: table {name!r} has no files (empty, or not a file "
                              "table); read it into a DataFrame and use pipeline.api")
        return df, [name], F.lit(name), F.spark_partition_id(), F.lit(None)
    meta = _metadata_fields(df)
    if meta is None:  # a view over files: no file metadata, so its partitions, in order
        log.info("%s: %r has no file metadata (a view): its rows are counted in the order of "
                 "its Spark partitions", what, name)
        return df, files, None, F.spark_partition_id(), F.lit(None)
    path = F.col("_metadata.file_path")
    parquet = cfg.input_format == "parquet" and not cfg.input_table
    if parquet or "row_index" in meta:  # (a catalog table stored as Parquet has them too)
        return df, files, path, F.lit(0), F.col("_metadata.row_index")
    return df, files, path, F.col("_metadata.file_block_start"), F.lit(None)


def _read_files(spark: SparkSession, fmt: str, path: str) -> DataFrame:
    """Files of a format with a schema of its own (Parquet, ORC, Delta). Spark takes a Parquet
    schema from one file's footer: when ignoreCorruptFiles skips that file, it has none, so
    then it reads every footer (mergeSchema), the corrupt ones skipped."""
    try:
        return spark.read.format(fmt).load(path)
    except AnalysisException as exc:
        if fmt != "parquet" or "UNABLE_TO_INFER_SCHEMA" not in _reason(exc) \
                or not _skipping_corrupt(spark):
            raise
    return spark.read.option("mergeSchema", "true").parquet(path)


def _has_data_files(spark: SparkSession, name: str) -> bool:
    """Whether a listing finds data files under ``name`` (a glob: assumed so)."""
    if fsutil.has_glob(name):
        return True
    try:
        return bool(fsutil.data_files_under(spark, name))
    except Exception:  # noqa: BLE001 - what cannot be listed is not known to be empty
        return True


def _skipping_corrupt(spark: SparkSession) -> bool:
    """Whether Spark's readers skip unreadable files now (:func:`skipping_corrupt_files`)."""
    return str(spark.conf.get(IGNORE_CORRUPT_KEY, "false")).lower() == "true"


def _refuse_parquet_read_as_text(cfg: Config, files: list[str]) -> None:
    """Parquet files given to a text reader (text, JSON lines, CSV) would be counted as
    "text" made of compressed bytes: an error naming one, by its name (``.parquet``) or, for a
    local file, its first and last bytes (the ``PAR1`` magic at both ends)."""
    if cfg.input_format not in ("text", "json", "csv"):
        return
    for f in files:
        parquet = f.endswith(".parquet")
        if not parquet and fsutil.is_local(f):
            with contextlib.suppress(OSError), open(fsutil.local_path(f), "rb") as fh:
                head = fh.read(4)
                fh.seek(-min(4, os.fstat(fh.fileno()).st_size), os.SEEK_END)
                parquet = head == fh.read(4) == b"PAR1"  # the magic at both ends
        if parquet:
            raise ConfigError(
                f"config key 'input_format': {f} is a Parquet file, which the "
                f"{cfg.input_format!r} reader would count as text; use --input-format parquet "
                "(the default) for Parquet input")


# logical plan nodes that keep each row of a file source one row of the DataFrame, with its
# file metadata: a DataFrame made of them alone is counted in path order, as its files are
_ROW_KEEPING = {"LogicalRelation", "Project", "Filter", "SubqueryAlias", "Sample",
                "GlobalLimit", "LocalLimit"}
_ROW_MOVING = {"Repartition", "RepartitionByExpression", "Sort"}  # ... and move rows


def _plan_nodes(df: DataFrame) -> list[tuple[str, Any]]:
    """The nodes of a DataFrame's analyzed logical plan (name, JVM node), root first."""
    out, todo = [], [df._jdf.queryExecution().analyzed()]
    while todo:
        node = todo.pop()
        out.append((str(node.nodeName()), node))
        children = node.children()
        todo += [children.apply(i) for i in range(children.size())]
    return out


def _sorted_last(nodes: list[tuple[str, Any]]) -> bool:
    """Whether the last step of a plan that moves rows is a global sort (``orderBy``): its
    partitions then hold the rows in the order asked for, which is the corpus order. A
    ``coalesce`` after it (a Repartition without a shuffle) joins partitions in order."""
    moving = next((node for name, node in nodes if name in _ROW_MOVING
                   and not (name == "Repartition" and not node.shuffle())), None)  # coalesce
    return moving is not None and str(moving.nodeName()) == "Sort" \
        and bool(getattr(moving, "global")())


def _frame_source(df: DataFrame, name: str
                  ) -> tuple[DataFrame, list[str], Column | None, Column, Column]:
    """A DataFrame's rows in corpus order. One that selects, filters, samples, limits or
    repartitions the rows of one file source (``spark.read.parquet(...)``,
    ``spark.table(...).select(...)``) is counted in its files' path order and each file's row
    order, as the same files given as ``--input`` are: by ``(file, row index)`` where the
    format has row indices (Parquet), each partition's rows sorted by it when the plan moved
    rows; by ``(file, split start, row in split)`` otherwise, only when the plan kept the
    scan's partitions. One whose last row-moving step is a global sort (``orderBy``), and
    any other DataFrame (in-memory rows, joins, unions, exploded or aggregated rows), is
    counted in the order of its Spark partitions (for a sort: the sorted order)."""
    by_partitions = df, [name], F.lit(name), F.spark_partition_id(), F.lit(None)
    try:
        plan = _plan_nodes(df)
        nodes = [name for name, _ in plan]
        if _sorted_last(plan):
            return by_partitions  # the order the user sorted in
    except Exception:  # noqa: BLE001 - a plan py4j cannot walk: the partitions' order
        return by_partitions
    if nodes.count("LogicalRelation") != 1 or not set(nodes) <= _ROW_KEEPING | _ROW_MOVING:
        return by_partitions
    meta = _metadata_fields(df)
    files = sorted({normalize_uri(f) for f in df.inputFiles()})
    if meta is None or "file_path" not in meta or not files:
        return by_partitions
    path = F.col("_metadata.file_path")
    if "row_index" in meta:
        row = F.col("_metadata.row_index")
        if _ROW_MOVING & set(nodes):
            df = (df.withColumn("_spark_bpe_path", path).withColumn("_spark_bpe_row", row)
                  .sortWithinPartitions("_spark_bpe_path", "_spark_bpe_row"))
            path, row = F.col("_spark_bpe_path"), F.col("_spark_bpe_row")
        return df, files, path, F.lit(0), row
    if _ROW_MOVING & set(nodes):
        return by_partitions
    return df, files, path, F.col("_metadata.file_block_start"), F.lit(None)


def _lists_files(cfg: Config, frame: DataFrame | None) -> bool:
    """Whether Spark's reader lists the input's files itself (not a DataFrame, a table, or
    Delta, whose log says which files are the table's)."""
    return frame is None and not cfg.input_table and cfg.input_format != "delta"


def _refuse_files_left_out(spark: SparkSession, what: str, name: str, read: list[str]) -> None:
    """A directory whose files Spark's reader would not all read (files in subfolders that
    are not ``key=value`` partitions, next to files or alone) is an error naming them, never
    a corpus silently read in part."""
    if fsutil.has_glob(name):
        return  # a glob reads what it matches
    try:
        under = fsutil.data_files_under(spark, name)
        # (as the listings spell it: hdfs:///x is hdfs://namenode:8020/x there)
        root = normalize_path("file://" + os.path.abspath(fsutil.local_path(name))
                              if fsutil.is_local(name) else fsutil.qualified(spark, name)
                              ).rstrip("/")
    except Exception:  # noqa: BLE001 - a listing that fails is Spark's to report
        return
    if not under:
        return
    nested = [f[len(root):].strip("/") for f in sorted(set(map(normalize_path, under)) - set(read))
              if f.startswith(root + "/")]
    # in a subfolder; when nothing was read (the read failed), in a plain one (not key=value)
    left_out = [f"{root}/{f}" for f in nested if "/" in f
                and (read or not all("=" in d for d in f.split("/")[:-1]))]
    if left_out:
        sub_dir = left_out[0][len(root):].strip("/").split("/")[0]
        raise ConfigError(
            f"{what}: {len(left_out)} files under {name} would not be read, in subfolders "
            f"that are not partitions (key=value), e.g. {left_out[0]}; give each folder as "
            f"an input (--input {name}/{sub_dir},...) or a glob ({name}/*/*)")


# JSON lines are read strictly: left to itself Spark turns a malformed line (a shard cut off
# mid-record) or a string over Jackson's 20 M-character default into a null row, silently.
# Spark's ignoreCorruptFiles does not skip a malformed record either: it stays an error.
JSON_OPTIONS = {"mode": "FAILFAST", "maxStringLen": str(2**31 - 1)}


def _read_json(spark: SparkSession, cfg: Config, name: str, all_columns: bool = False
               ) -> DataFrame:
    """JSON lines with a schema of the text column alone (``all_columns``: every column, for
    the encode job's keys), taken from the first file: left to itself Spark infers the schema
    from every row of every file, one more full pass over the corpus before the count's.
    Files without a row (an empty partition's) are passed over: the schema comes from the
    first one with rows. (Without the column there, that file's frame is returned, for
    check_text_column to name its columns.)"""
    column = cfg.text_column
    files = sorted(spark.read.schema(T.StructType([T.StructField(column, T.StringType())]))
                   .json(name).inputFiles())
    _refuse_parquet_read_as_text(cfg, [normalize_uri(f) for f in files])  # before a scan
    if not files:
        return spark.read.options(**JSON_OPTIONS).json(name)
    first = _first_json_schema(spark, files)
    if column not in first.columns and first.columns == ["_corrupt_record"]:
        bad = fsutil.local_path(normalize_uri(sorted(first.inputFiles())[0]))
        raise ConfigError(f"config key 'input': {bad} has no record Spark's JSON reader could "
                          f"read (its only column is _corrupt_record): {JSON_LINES_ONLY}; fix "
                          "it or move it out of the input")
    if column not in first.columns:
        return first
    schema = first.schema if all_columns else T.StructType([first.schema[column]])
    return spark.read.options(**JSON_OPTIONS).schema(schema).json(name)


def _first_json_schema(spark: SparkSession, files: list[str]) -> DataFrame:
    """The first of ``files`` (Spark's URIs) that has columns, read alone, inferring its
    schema leniently (a malformed line is the count's to name, with its file); files with no
    row have none, so the next ones are read, in growing groups (1, 4, 16, ... files: an
    inference reads its files whole, a job each). The last group's frame when none has any."""
    reader = spark.read.option("maxStringLen", JSON_OPTIONS["maxStringLen"])
    start, size = 0, 1
    while True:
        frame = reader.json([literal_path(f) for f in files[start:start + size]])
        start, size = start + size, size * 4
        if frame.columns or start >= len(files):
            return frame


def _reason(exc: Exception) -> str:
    """The first line of what went wrong: for a py4j error, the Java exception's own message
    (its Python message only says which call failed)."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        with contextlib.suppress(Exception):
            return first_line(str(java.toString()))
    return first_line(exc)


def _metadata_fields(df: DataFrame) -> list[str] | None:
    """The fields of a file source's ``_metadata`` (Parquet's include ``row_index``), read
    from its schema, or None when it has none (a view): resolving a missing field instead
    would have PySpark log the failure as an ERROR with a Java stack trace, although it is
    caught, so the plan's metadata columns are asked first."""
    try:
        seq = df._jdf.queryExecution().analyzed().metadataOutput()
        if "_metadata" not in {str(seq.apply(i).name()) for i in range(seq.size())}:
            return None
    except Exception:  # noqa: BLE001 - a plan py4j cannot ask: resolving tells
        pass
    try:
        meta = df.select("_metadata").schema["_metadata"].dataType
    except AnalysisException:
        return None
    return meta.fieldNames() if isinstance(meta, T.StructType) else None


JSON_LINES_ONLY = ("JSON input must be JSON lines, one object per line; a pretty-printed file "
                   "or a JSON array is not")


def check_text_column(df: DataFrame, text_column: str, name: str) -> None:
    if text_column not in df.columns and df.columns == ["_corrupt_record"]:
        raise ConfigError(
            f"config key 'text_column': {name} has no record Spark's JSON reader could read "
            f"(its only column is _corrupt_record): {JSON_LINES_ONLY}")
    if text_column not in df.columns:
        raise ConfigError(
            f"config key 'text_column': column {text_column!r} not in {name} "
            f"(columns: {', '.join(df.columns)})"
        )
    dtype = df.schema[text_column].dataType
    if not isinstance(dtype, (T.StringType, T.BinaryType)):
        raise ConfigError(
            f"config key 'text_column': column {text_column!r} is {dtype.simpleString()}, "
            "not string or binary"
        )


def arrow_plan(spark: SparkSession, cfg: Config, files: list[str],
                footers: dict[str, pq.FileMetaData] | None = None,
                skipped: list[str] | None = None) -> list[list[ReadSlice]] | None:
    """The tasks of the Arrow reader, or None to let Spark's Parquet scan feed the tasks.

    ``count_reader = auto`` reads local files with pyarrow inside the tasks: the JVM then only
    schedules them, instead of decoding Parquet and converting rows to Arrow (work a fresh JVM
    does slowly until its JIT has warmed up). Other filesystems go through Spark."""
    if cfg.count_reader == "spark":
        return None
    local = all(fsutil.is_local(f) for f in files)
    if not local:
        if cfg.count_reader == "arrow":
            raise ConfigError("config key 'count_reader' = 'arrow' reads local files only; "
                              f"{cfg.input} is not local: use 'auto' or 'spark'")
        return None
    tasks = cfg.num_partitions or 2 * spark.sparkContext.defaultParallelism
    plan = plan_slices(files, cfg.text_column, tasks, footers, skipped)
    if plan is None and cfg.count_reader == "arrow":
        raise ConfigError(f"config key 'count_reader' = 'arrow': some files under {cfg.input} "
                          f"have no top-level column {cfg.text_column!r}; use 'spark'")
    return plan


def _java_causes(exc: BaseException, depth: int = 5) -> str:
    """The messages of a py4j error's Java causes (a captured Spark error's own text may stop
    at the top one), one per line; "" for other errors."""
    out = []
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    with contextlib.suppress(Exception):  # (the JVM may be gone)
        while java is not None and len(out) < depth:
            out.append(str(java.toString()))
            java = java.getCause()
    return "\n" + "\n".join(out) if out else ""


def unreadable_file_error(exc: BaseException, can_skip: bool = True,
                          kind: str = "Parquet") -> ConfigError | None:
    """A read (count, encode) that failed on a corrupt input file, or on one a task did not
    find, as one line naming the file (exit 2); None for any other failure."""
    text = str(exc)
    gone = parse_not_here(text, "input")
    if gone:
        return ConfigError(f"config key 'input': {gone[1]} was listed by this driver but is "
                           f"not there for the executor on {gone[0]} (removed since, or not "
                           f"on a shared filesystem): {SHARED_FS}")
    m = re.search(re.escape(UNREADABLE) + r" (.+?) :: ([^\n]*)", text)
    if m:
        return corrupt_file_error(m.group(1), m.group(2).strip(), can_skip, kind)
    header = re.search(r"(?:CSV header does not conform to the schema\.|Number of column in CSV "
                       r"header is not equal to number of fields in the schema:?)(.*?)CSV "
                       r"file: (\S+)", text + _java_causes(exc), re.S)
    if header:  # (read with enforceSchema off: a file whose header is not the first file's)
        why = " ".join(header.group(1).split())
        return ConfigError(f"config key 'input': {header.group(2)} has another CSV header than "
                           f"the first file ({why}): its columns would be read by position, "
                           "under the first file's names; give files with one header")
    m = re.search(r"FAILED_READ_FILE\.?(\w*)\][^\n]*?reading file (\S+?)\.?(?:\s|$)", text)
    if m and "MALFORMED_RECORD_IN_PARSING" in text:  # JSON read in FAILFAST mode
        parser = re.search(r"Caused by: com\.fasterxml\.[\w.$]+: ([^\n(]+)", text)
        why = "a malformed record" + (f": {parser.group(1).strip()}" if parser else "")
        skip = (" (--ignore-corrupt-files skips files that cannot be opened, not malformed "
                "records)" if can_skip else "")
        return ConfigError(f"config key 'input': {m.group(2)} is not a readable {kind} file "
                           f"({why}); fix or remove it{skip}")
    if m and (m.group(1) == "FILE_NOT_EXIST" or "java.io.FileNotFoundException" in text):
        return ConfigError(f"config key 'input': {m.group(2)} was listed but is not there for "
                           f"the task that read it (removed since, or not on a shared "
                           f"filesystem): {SHARED_FS}")  # (never skipped: ignoreMissingFiles)
    if m:
        cause = (re.search(r"\S+ (is not a Parquet file[^\n]*)", text)
                 or re.search(r"Caused by: java\.[\w.$]+: ([^\n]+)", text))
        why = cause.group(1) if cause else m.group(1).replace("_", " ").lower()
        return corrupt_file_error(m.group(2), why.strip(), can_skip, kind)
    return None


def list_input(spark: SparkSession, cfg: Config
               ) -> tuple[list[str], dict[str, pq.FileMetaData], list[str] | None]:
    """The input's files in corpus order, listed as the count lists them (without the JVM for
    local Parquet), the Parquet footers read on the way, and the files left out as unreadable
    (``ignore_corrupt_files``; None where Spark lists: it finds them only as it reads)."""
    footers: dict[str, pq.FileMetaData] = {}
    skipped: list[str] | None = [] if cfg.ignore_corrupt_files else None
    corpus = list_local_sources(cfg, footers, skipped)
    if corpus is None:
        start_session(spark)
        with skipping_corrupt_files(spark, cfg.ignore_corrupt_files):  # as the count read it
            corpus = read_sources(spark, cfg)
        skipped = None
    return corpus.files, footers, skipped


def input_fingerprint(spark: SparkSession, files: list[str],
                      footers: dict[str, pq.FileMetaData] | None = None,
                      cfg: Config | None = None) -> dict:
    """What the count read, summarised: every file's path, size and modification time (and,
    for local files, its Parquet footer's row count); for a catalog table or view, its
    definition; for a Delta table, its version. Two listings with the same digest are the
    same input as far as anything short of reading every byte can tell; a shard added, removed,
    rewritten or touched changes it, and so does a view redefined over the same files or a
    Delta commit that adds no file (a DELETE with deletion vectors)."""
    statuses = _file_statuses(spark, files)
    entries = _source_versions(spark, cfg) if cfg is not None else []
    for f, (size, mtime) in zip(files, statuses):
        rows = None
        if fsutil.is_local(f):
            meta = (footers or {}).get(f)
            with contextlib.suppress(Exception):  # an unreadable footer: size and time only
                meta = meta or pq.ParquetFile(fsutil.local_path(f)).metadata
            rows = None if meta is None else meta.num_rows
        entries.append(f"{f}\t{size}\t{mtime}\t{'' if rows is None else rows}")
    return {
        "files": len(files),
        "bytes": sum(size for size, _ in statuses),
        "digest": hashlib.sha256("\n".join(entries).encode()).hexdigest()[:32],
        "paths_digest": hashlib.sha256("\n".join(files).encode()).hexdigest()[:32],
        "newest_mtime_ms": max((mtime // 1_000_000 if fsutil.is_local(f) else mtime
                                for f, (_, mtime) in zip(files, statuses)), default=0),
    }


def _source_versions(spark: SparkSession, cfg: Config) -> list[str]:
    """What the files alone do not show: a catalog table's or view's analyzed plan (its
    definition and columns, expression ids left out), a Delta table's newest commit."""
    out = []
    if cfg.input_table:
        try:
            plan = spark.table(cfg.input_table)._jdf.queryExecution().analyzed().toString()
        except Exception as exc:  # noqa: BLE001 - read again by the count, which names it
            plan = f"unknown: {type(exc).__name__}"
        out.append(f"table\t{cfg.input_table}\t{stable_plan(plan)}")
    if cfg.input_format == "delta":
        out += [f"delta\t{src}\t{delta_version(spark, src)}" for src in cfg.inputs]
    return out


def stable_plan(plan: str) -> str:
    """An analyzed plan's text without what a session numbers afresh on each analysis:
    expression ids (``text#12``), common-table-expression and recursion ids."""
    plan = re.sub(r"#[0-9]+L?", "", plan)
    return re.sub(r"\b(CTERelation(?:Def|Ref)|UnionLoop(?:Ref)?) [0-9]+", r"\1", plan)


def delta_version(spark: SparkSession | None, table: str) -> int:
    """The newest commit of the Delta table at ``table`` (-1 when it has no log)."""
    names = fsutil.list_dir(spark, fsutil.join(table, "_delta_log")) or []
    found = [int(m.group(1)) for n in names if (m := re.match(r"(\d{20})\.(json|checkpoint)", n))]
    return max(found, default=-1)


def _file_statuses(spark: SparkSession, files: list[str]) -> list[tuple[int, int]]:
    """(size in bytes, modification time) of each file: os.stat for local files; for others
    one Hadoop listing per parent directory (an object store answers a listing with the
    sizes and times of all its keys, instead of one request per file)."""
    out: dict[str, tuple[int, int]] = {}
    remote: dict[str, list[str]] = {}
    for f in files:
        if fsutil.is_local(f):
            out[f] = _file_status(spark, f)
        else:
            remote.setdefault(f.rsplit("/", 1)[0], []).append(f)
    for parent, members in remote.items():
        fs, p = fsutil._fs(spark, parent)
        try:
            with fsutil._not_found_as_python(parent):
                statuses = fs.listStatus(p)
        except FileNotFoundError:  # (a folder a retention job removed since it was listed)
            raise removed_while_listed(members[0]) from None
        listed = {normalize_path(s.getPath().toString()): (int(s.getLen()),
                                                           int(s.getModificationTime()))
                  for s in statuses}
        for f in members:  # (a file the listing spells otherwise: asked for by name)
            out[f] = listed.get(f) or _file_status(spark, f)
    return [out[f] for f in files]


def _file_status(spark: SparkSession, f: str) -> tuple[int, int]:
    try:
        return fsutil.file_status(spark, f)
    except FileNotFoundError:
        raise removed_while_listed(f) from None


def describe_input_change(old: dict | None, new: dict) -> str:
    """Why a word table's input fingerprint does not match (one clause for a log line)."""
    if not old:
        return "the word table was counted without an input fingerprint (an older spark-bpe)"
    counts = (f"{old.get('files')} files, {old.get('bytes')} bytes then; {new['files']} files, "
              f"{new['bytes']} bytes now")
    if old.get("paths_digest") == new["paths_digest"]:
        then, now = (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t / 1000)) for t in (
            old.get("newest_mtime_ms", 0), new["newest_mtime_ms"]))
        counts = (f"the same {new['files']} files, some rewritten or touched: "
                  f"{old.get('bytes')} bytes then, {new['bytes']} now; newest modification "
                  f"{then} UTC then, {now} UTC now")
    elif "paths_digest" in old and old.get("files") == new["files"]:
        counts = f"other files, as many as before: {counts}"
    return f"the input changed since the word table was counted ({counts})"
