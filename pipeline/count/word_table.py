"""The word table ``(word, count, first_seen)`` on disk: its schema, format version and
metadata, content digest, and how it is written, opened and read back on the driver."""

from __future__ import annotations

import json
import logging
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from pipeline import fsutil
from pipeline.config import Config, ConfigError
from pipeline.pretokenize import PretokenizerSpec
from pipeline.spark_session import file_reader

log = logging.getLogger(__name__)

WORD_TABLE_VERSION = 2  # v2: max_word_bytes, input_fingerprint (v1 is read as "no cap")
READABLE_VERSIONS = (1, 2)
WORD_TABLE_FORMAT = "spark-bpe word table"
WORD_TABLE_COLUMNS = ("word", "count", "first_seen")  # word: bytes; count, first_seen: int64
WORD_TABLE_SCHEMA = T.StructType([
    T.StructField(name, T.BinaryType() if name == "word" else T.LongType(), False)
    for name in WORD_TABLE_COLUMNS])
WORD_TABLE_ARROW_SCHEMA = pa.schema([
    pa.field(name, pa.binary() if name == "word" else pa.int64(), nullable=False)
    for name in WORD_TABLE_COLUMNS])


# where special tokens are found: tables without this key cut them after normalization and
# lowercasing, which differs when those make or unmake a special-token string
SPECIAL_TOKENS_CUT = "before normalization"


_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 in which every output bit depends on
    every input bit (numpy's uint64 arithmetic wraps, as the algorithm wants)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


def _digest_parts(words: pa.Array, counts: np.ndarray, first_seen: np.ndarray
                  ) -> tuple[int, int]:
    """(sum mod 2**64 of the rows' hashes, rows). A row's hash mixes its word's crc32 and
    adler32 with its count and first_seen through three rounds of :func:`_mix64`, so moving
    counts between rows, or any other edit, changes the sum except with odds of about 2**-64
    (a linear hash combined by XOR let a one-word typo fix cancel out)."""
    ws = words.to_pylist()
    n = len(ws)
    key = (np.fromiter(map(zlib.crc32, ws), dtype=np.uint64, count=n) << np.uint64(32)) | \
        np.fromiter(map(zlib.adler32, ws), dtype=np.uint64, count=n)
    h = _mix64(_mix64(_mix64(key) ^ counts.astype(np.uint64)) ^ first_seen.astype(np.uint64))
    return int(h.sum(dtype=np.uint64)), n


def table_digest(table: pa.Table) -> str:
    """A content digest of a word table (see :func:`_digest_parts`) and its row count. The
    same value comes from Spark as :func:`spark_table_summary`'s ``digest`` (tests hold them
    equal); it does not depend on the rows' order or on how they are split into batches."""
    return format_digest(*_parts(table, False))


_EXACT_CHUNK = 1 << 20  # rows summed at a time where an int64 dot product could wrap


def weighted_total(lengths: np.ndarray, counts: np.ndarray) -> int:
    """``sum(lengths * counts)`` exactly (a Python int: never wrapped at 2**63 as an int64
    dot product would be). Non-negative inputs. Where the float sum says it could wrap, a
    chunk of rows at a time, in Python integers only for a chunk that could wrap itself."""
    lengths, counts = np.asarray(lengths), np.asarray(counts)
    if float(np.dot(lengths.astype(np.float64), counts.astype(np.float64))) < 2.0**62:
        return int(np.dot(lengths.astype(np.int64), counts.astype(np.int64)))  # cannot wrap
    total = 0
    for i in range(0, len(counts), _EXACT_CHUNK):
        a, b = lengths[i:i + _EXACT_CHUNK], counts[i:i + _EXACT_CHUNK]
        if float(np.dot(a.astype(np.float64), b.astype(np.float64))) < 2.0**62:
            total += int(np.dot(a.astype(np.int64), b.astype(np.int64)))
        else:
            total += sum(int(x) * int(y) for x, y in zip(a.tolist(), b.tolist()))
    return total


def table_summary(table: pa.Table) -> dict:
    """What training needs to know of a table before reading it, kept in ``word_table.json``:
    its digest, and its tokens and distinct-word symbols in the bytes alphabet (sums of byte
    lengths, weighted by count and not)."""
    lengths = pc.binary_length(table.column("word")).to_numpy().astype(np.int64)
    return {"digest": table_digest(table),
            "byte_tokens": weighted_total(lengths, table.column("count").to_numpy()),
            "byte_symbols": int(lengths.sum())}


def _legacy_parts(words: pa.Array, counts: np.ndarray, first_seen: np.ndarray
                  ) -> tuple[int, int]:
    """The first digest's parts (XOR of ``crc32(word) << 32 ^ count ^ first_seen << 16``,
    rows): only to recognise checkpoints an older spark-bpe wrote (see :func:`legacy_digest`)."""
    ws = words.to_pylist()
    crc = np.fromiter(map(zlib.crc32, ws), dtype=np.uint64, count=len(ws))
    h = ((crc << np.uint64(32)) ^ counts.astype(np.uint64)
         ^ (first_seen.astype(np.uint64) << np.uint64(16)))
    return (int(np.bitwise_xor.reduce(h)) if len(h) else 0), len(ws)


def _parts(table: pa.Table | pa.RecordBatch, legacy: bool) -> tuple[int, int]:
    fn = _legacy_parts if legacy else _digest_parts
    words = table.column("word")
    return fn(words.combine_chunks() if isinstance(words, pa.ChunkedArray) else words,
              table.column("count").to_numpy(), table.column("first_seen").to_numpy())


def _combine(a: int, b: int, legacy: bool) -> int:
    return a ^ b if legacy else (a + b) % 2**64


def legacy_digest(table: pa.Table | DataFrame) -> str:
    """The digest an older spark-bpe recorded (``c<hex>-<rows>``) of a table in memory or a
    DataFrame: a checkpoint fingerprinted with it is recognised as this table's."""
    if isinstance(table, pa.Table):
        total, rows = _parts(table, True)
    else:
        total, rows, _, _ = _spark_parts(table, True)
    return f"c{total:016x}-{rows}"


def _spark_parts(df: DataFrame, legacy: bool) -> tuple[int, int, int, int]:
    """(digest total, rows, byte tokens, byte symbols) of a word-table DataFrame in one pass,
    computed where its rows are (one small row per partition comes back)."""
    def partials(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        total = rows = tokens = symbols = 0
        for b in batches:
            s, n = _parts(b, legacy)
            lengths = pc.binary_length(b.column("word")).to_numpy().astype(np.int64)
            total, rows = _combine(total, s, legacy), rows + n
            tokens += weighted_total(lengths, b.column("count").to_numpy())
            symbols += int(lengths.sum())
        yield pa.RecordBatch.from_pydict({"h": [str(total)], "rows": [rows],
                                          "tokens": [str(tokens)], "symbols": [symbols]})

    got = df.select(*WORD_TABLE_COLUMNS).mapInArrow(
        partials, "h string, rows long, tokens string, symbols long").collect()
    total = 0
    for r in got:
        total = _combine(total, int(r["h"]), legacy)
    return (total, sum(r["rows"] for r in got), sum(int(r["tokens"]) for r in got),
            sum(r["symbols"] for r in got))


def spark_table_summary(df: DataFrame) -> dict:
    """:func:`table_summary` of a word-table DataFrame, in one Spark job."""
    total, rows, tokens, symbols = _spark_parts(df, False)
    return {"digest": format_digest(total, rows), "byte_tokens": tokens,
            "byte_symbols": symbols}


def format_digest(total: int, rows: int) -> str:
    """``h<16 hex digits>-<rows>`` (the ``c`` prefix was an earlier, weaker digest)."""
    return f"h{total % 2**64:016x}-{int(rows)}"


def write_table_data(spark: SparkSession, table: pa.Table, path: str) -> None:
    """Write a word table made on the driver: directly when local, through Spark otherwise."""
    if fsutil.is_local(path):
        local = fsutil.local_path(path)
        os.makedirs(local, exist_ok=True)
        target = os.path.join(local, "part-00000.parquet")
        try:
            pq.write_table(table, target)
        except OSError as exc:  # pyarrow's error names no file: name it (a full disk, ...)
            if exc.filename or exc.errno is None:
                raise
            raise OSError(exc.errno, exc.strerror or str(exc), target) from exc
    else:
        spark.createDataFrame(table).write.parquet(fsutil.spark_path(path))


def iter_arrow(df: DataFrame, prefetch: bool = True) -> Iterator[pa.RecordBatch]:
    """``df``'s rows on the driver as Arrow batches, brought over one partition at a time: the
    driver JVM holds one partition's rows at once, never the whole table (``toArrow`` and
    ``collect`` gather every partition in the JVM heap first, which is what ran a 1 GB default
    driver out of memory on a 6 M-word table). ``prefetch``: the next partition is computed
    while this one is read (two in the heap at once: not for partitions of 100 MB)."""

    def to_ipc(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            if b.num_rows:
                yield pa.RecordBatch.from_arrays([pa.array([arrow_ipc([b], b.schema)],
                                                           pa.binary())], ["ipc"])

    for row in df.mapInArrow(to_ipc, "ipc binary").toLocalIterator(
            prefetchPartitions=prefetch):
        yield from pa.ipc.open_stream(row["ipc"])


def collect_arrow(df: DataFrame) -> pa.Table:
    """``df`` on the driver as one Arrow table (:func:`iter_arrow`)."""
    batches = list(iter_arrow(df))
    return pa.Table.from_batches(batches) if batches else df.limit(0).toArrow()


def read_word_table(spark: SparkSession, wt: WordTable) -> pa.Table:
    """The word table's rows on the driver, sorted by first_seen: read with pyarrow when it is
    on a local filesystem (no JVM involved), else through Spark a partition at a time."""
    columns = list(WORD_TABLE_COLUMNS)
    if fsutil.is_local(wt.data_path):
        local = fsutil.local_path(wt.data_path)
        files = sorted(os.path.join(local, f) for f in os.listdir(local)
                       if f.endswith(".parquet") and not f.startswith((".", "_")))
        table = pa.concat_tables([pq.read_table(f, columns=columns) for f in files]) \
            if files else collect_arrow(file_reader(spark).parquet(
                fsutil.spark_path(wt.data_path)).select(*columns))
    else:
        table = collect_arrow(file_reader(spark).parquet(fsutil.spark_path(wt.data_path))
                              .select(*columns))
    return table.sort_by("first_seen")


@dataclass
class WordTable:
    """A word table on disk: ``<dir>/data`` (Parquet) + ``word_table.json`` + ``stats.json``.

    ``table``: the same rows in memory (sorted by first_seen) when the count was merged on the
    driver in this process, so training need not read them back through Spark."""

    path: str
    meta: dict
    table: pa.Table | None = None

    @property
    def data_path(self) -> str:
        return fsutil.join(self.path, "data")


def open_word_table(spark: SparkSession, path: str) -> WordTable:
    """Open a word table written by :func:`count_words`, checking its version."""
    meta_path = fsutil.join(path, "word_table.json")
    if not fsutil.exists(spark, meta_path):
        raise ConfigError(
            f"config key 'words': {path} is not a word table (no word_table.json); "
            "make one with jobs/count_words.py"
        )
    try:
        meta = json.loads(fsutil.read_text(spark, meta_path))
    except ValueError:
        raise ConfigError(
            f"config key 'words': {meta_path} is corrupt; recreate the table with "
            "jobs/count_words.py"
        ) from None
    if (meta.get("format") != WORD_TABLE_FORMAT
            or meta.get("version") not in READABLE_VERSIONS):
        raise ConfigError(
            f"config key 'words': {path} has format {meta.get('format')!r} version "
            f"{meta.get('version')!r}; this build reads versions {READABLE_VERSIONS}. "
            "Recreate it with jobs/count_words.py"
        )
    meta.setdefault("max_word_bytes", 0)  # v1 tables were counted without a cap
    wt = WordTable(path, meta)
    check_data_files(wt)
    _distrust_if_edited(spark, wt)
    return wt


def data_listing(spark: SparkSession | None, data: str, times: bool = True
                 ) -> dict[str, list[int]]:
    """Each data file under ``data`` (by its path below it): [size, modification time], or
    [size] where the time is not kept (an object store's rename is a copy)."""
    statuses = fsutil.data_file_statuses(spark, data) or {}
    return {rel: [size, mtime] if times else [size]
            for rel, (size, mtime) in sorted(statuses.items())}


# what word_table.json holds that was computed from the data files
_DATA_SUMMARY = ("digest", "byte_tokens", "byte_symbols")


def _distrust_if_edited(spark: SparkSession | None, wt: WordTable) -> None:
    """A table whose data files are not the ones ``word_table.json`` lists (edited, added,
    removed, rewritten in place, or copied without their times) is trusted for its settings
    only: the digest and sums recorded from the data are dropped, so that training computes
    them again from the data (a changed table must not pass for the one its checkpoints or
    finished run were made from)."""
    recorded = wt.meta.get("data_files")
    if recorded is None:
        return  # (written by an older spark-bpe: nothing to compare)
    now = data_listing(spark, wt.data_path)
    same = set(now) == set(recorded) and all(
        now[k][:len(v)] == v for k, v in recorded.items())
    if not same:
        log.warning("the data files of the word table at %s are not the ones its "
                    "word_table.json lists (edited, rewritten or copied since): its content "
                    "digest is computed again from the data", wt.path)
        for key in _DATA_SUMMARY:
            wt.meta.pop(key, None)


class DamagedWordTable(ConfigError):
    """A word table whose data files cannot be read."""


def check_data_files(wt: WordTable) -> None:
    """Read the footer of each data file of a local word table (cheap): a truncated or
    overwritten file is one error naming it, before any training (else a traceback from
    deep in an engine). Tables elsewhere are checked by Spark when it reads them."""
    if not fsutil.is_local(wt.data_path):
        return
    local = fsutil.local_path(wt.data_path)
    try:
        names = sorted(f for f in os.listdir(local) if f.endswith(".parquet")
                       and not f.startswith((".", "_")))
    except OSError as exc:
        raise DamagedWordTable(f"config key 'words': the word table at {wt.path} has no "
                               f"readable data directory ({exc.strerror or exc}); recount it "
                               "(jobs/count_words.py, or train with --input)") from None
    for name in names:
        try:
            pq.read_metadata(os.path.join(local, name))
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise DamagedWordTable(
                f"config key 'words': {os.path.join(local, name)} is not a readable Parquet "
                f"file ({reason}): the word table at {wt.path} is damaged; recount it "
                "(jobs/count_words.py, or train with --input)") from None


def sum_duplicates(words: pa.Array, counts: np.ndarray
                   ) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """Rows of (word, count) with repeated words: (the distinct words, as binary; each row's
    index into them; each distinct word's summed count, exact int64)."""
    enc = pc.dictionary_encode(words)
    word_id = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    totals = np.zeros(len(enc.dictionary), dtype=np.int64)  # (np.bincount sums in float64)
    np.add.at(totals, word_id, counts)
    if len(counts) and int(counts.max()) * len(counts) >= 2**63:  # (else no sum can wrap)
        _check_sums(word_id, counts, len(totals))
    return enc.dictionary.cast(pa.binary()), word_id, totals


def _check_sums(word_id: np.ndarray, counts: np.ndarray, n: int) -> None:
    """CountOverflow if a word's summed count is 2**63 or more: the words whose float sum
    comes near (within far more than its rounding) are summed again exactly."""
    near = np.flatnonzero(np.bincount(word_id, weights=counts, minlength=n) >= 2.0**62)
    for w in near.tolist():
        if sum(counts[word_id == w].tolist()) >= 2**63:
            raise CountOverflow("a word's count is 2**63 or more: over the 64-bit counts of "
                                "a word table")


class CountOverflow(ValueError):
    """A word's summed count does not fit in the word table's int64."""


def first_in_order(word_id: np.ndarray, by_key: np.ndarray) -> np.ndarray:
    """With ``by_key`` the rows sorted by first occurrence: for each distinct word, the index
    into ``by_key`` of its earliest row."""
    return np.unique(word_id[by_key], return_index=True)[1]


def arrow_ipc(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> bytes:
    """Record batches as one Arrow IPC stream (bytes the JVM passes through untouched)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return sink.getvalue().to_pybytes()


# what a word table records of its input (and the values a table from before a key existed
# was made with)
_SOURCE_DEFAULTS = {"input": "", "text_column": "text", "input_format": "parquet",
                    "input_table": "", "input_weights": []}


def source_meta(cfg: Config) -> dict:
    """The input settings a word table records (``text_column`` is recorded beside them)."""
    return {"input": cfg.input, "input_format": cfg.input_format,
            "input_table": cfg.input_table, "input_weights": list(cfg.input_weights)}


def source_changes(meta: dict, cfg: Config) -> list[str]:
    """How this config's input differs from the one a word table records, one phrase per
    setting (``input 'a' then, 'b' now``); empty when it names the same input (whether the
    files behind it changed is the input fingerprint's job)."""
    now = {**source_meta(cfg), "text_column": cfg.text_column}
    return [f"{k} {meta.get(k, default)!r} then, {now[k]!r} now"
            for k, default in _SOURCE_DEFAULTS.items() if meta.get(k, default) != now[k]
            and not (k == "input" and absolute_sources(meta.get(k, default))
                     == absolute_sources(now[k]))]


def absolute_sources(value: str) -> str:
    """An ``input`` as the sources it names, local ones as absolute, normalised paths:
    ``data/sample`` and ``/repo/data/sample`` from /repo are one input (whether its files
    are the same is for the input fingerprint to say)."""
    return ",".join(fsutil.absolute_local(p) for p in Config(input=value).inputs)


def split_settings(meta: dict) -> dict:
    """The config keys that decide how text is cut into words (the pretokenizer's and
    ``max_word_bytes``), as a word table's metadata or a checkpoint's settings record them."""
    return {**(meta.get("pretokenizer") or {}), "max_word_bytes": meta.get("max_word_bytes", 0)}


def setting_changes(then: dict, now: dict) -> list[str]:
    """One phrase per key whose value differs (``lowercase False then, True now``)."""
    return [f"{k} {then.get(k)!r} then, {v!r} now" for k, v in now.items() if then.get(k) != v]


def word_table_meta(spec: PretokenizerSpec, text_column: str, max_word_bytes: int,
                    stats: dict, source: dict, left_out: dict | None = None,
                    summary: dict | None = None) -> dict:
    """``word_table.json``: the format, where the words came from (``source``: the input and
    its fingerprint, or the external table), the settings that made them (part of every
    checkpoint's fingerprint), what they add up to and what was left out."""
    meta = {
        "format": WORD_TABLE_FORMAT,
        "version": WORD_TABLE_VERSION,
        **source,
        "text_column": text_column,
        "pretokenizer": spec.as_meta(),
        "max_word_bytes": max_word_bytes,
        "special_tokens_cut": SPECIAL_TOKENS_CUT,
        "unique_words": stats["unique_words"],
        "stats": {k: stats[k] for k in ("rows", "words", "bytes", "unique_words")},
        "left_out": {"long_words": 0, "long_word_bytes": 0, "rows_with_long_words": 0,
                     "unreadable_files": [], **(left_out or {})},
    }
    meta.update(summary or {})  # table_summary, when the table was in memory
    return meta


# what a word table directory holds (with the hidden and underscored files writers add)
_TABLE_ENTRIES = frozenset({"data", "word_table.json", "stats.json", "config.json"})


def check_replaceable(spark: SparkSession | None, path: str) -> None:
    """Refuse to write a word table over ``path`` unless it is missing, empty, or a word table
    (whole, or one an interrupted writer left on an object store): never replace a directory
    of other files, or a file."""
    names = fsutil.list_dir(spark, path)
    if names is None:
        if fsutil.exists(spark, path):
            raise ConfigError(f"config key 'output': {path} is a file, not a directory: "
                              "refusing to replace it")
        return
    other = sorted(n for n in names if n not in _TABLE_ENTRIES and not n.startswith(("_", ".")))
    if other:
        raise ConfigError(
            f"config key 'output': {path} exists and is not a word table (it holds "
            f"{', '.join(other[:3])}{', ...' if len(other) > 3 else ''}): refusing to replace "
            "it; remove it or choose another --output")


def publish_word_table(spark: SparkSession, tmp: str, dest: str, meta: dict, stats: dict,
                       config_json: str | None = None,
                       check: Callable[[], None] | None = None) -> None:
    """Write the metadata files next to the data already under ``tmp`` and move the whole
    table to ``dest`` in one step (``word_table.json`` is what marks it complete). ``check``
    (the output's lease) may refuse first: then ``tmp`` is removed and nothing published."""
    if check is not None:
        fsutil.check_before_publish(spark, check, tmp, dest)
    meta = {**meta, "data_files": data_listing(spark, fsutil.join(tmp, "data"),
                                               times=not fsutil.is_object_store(dest))}
    fsutil.write_text(spark, fsutil.join(tmp, "stats.json"), json.dumps(stats, indent=2))
    fsutil.write_text(spark, fsutil.join(tmp, "word_table.json"), json.dumps(meta, indent=2))
    if config_json is not None:
        fsutil.write_text(spark, fsutil.join(tmp, "config.json"), config_json)
    fsutil.replace_dir(spark, tmp, dest)
