"""The encode job (Spark): encode a corpus with a trained run -> Parquet of token ids.

Input: Parquet by default, or any format the count reads (``input_format``: JSON lines, text,
CSV, ORC, Delta), through the same readers. Output: one row per input row, the key columns
(``key_columns``; by default every column but the text; when the text is the only column, the
input ``file`` and ``row``, its index in the file, for Parquet; for the other formats, which
Spark gives no row index, ``file``, ``block`` (the start of the block of the file Spark read it
in) and ``row``, its index in that block, numbered in the task) and the token ids as
``array<int>`` (``ids_column``; null for a null text). Beside the Parquet files,
``_encode.json`` (ignored by Parquet readers) holds the tokenizer it was made with and the
statistics: rows, bytes, tokens, bytes per token, tokens per word (words: whitespace-separated,
Python's ``str.split``), seconds, and rows the tiktoken engine left to the reference encoder.

How: the tokenizer (merge list, and tiktoken's ranks when that engine is used) is broadcast
once; each Python worker builds its encoder once and keeps it across tasks. Rows reach Python
one of two ways (``encode_io``): a local Parquet corpus with a local output is read and written
by pyarrow inside the tasks (:mod:`pipeline.encode_local`, which says when it applies); any
other input reaches Python in Arrow batches (``mapInArrow``) and Spark's writer writes the ids,
while a background job starts the workers and builds the encoder in them as the driver plans
the read. The hot loop is tiktoken built from the run's own
export (``encode_engine = tiktoken``, the default when it is installed), which the parity tests
hold to the reference :class:`pipeline.encoder.Tokenizer` (``encode_engine = reference``, also
used for rows of a binary text column that are not valid UTF-8, which tiktoken cannot take
byte-exact; on an executor where tiktoken is not installed, which the stats report; and for a
row tiktoken cannot take or takes slowly: a whitespace run of ~1 M characters makes it panic,
and a long run of one character is 3x faster in the reference encoder, so such runs are looked
for first, and a row it raises or panics on is caught; ``rows_via_reference`` counts them,
``tiktoken_errors`` the caught ones). Every path costs O(n log n) in a row's length, however
long its words (a row of 20 M letters is one word).
Statistics come back in a per-partition accumulator (a retried task replaces its own entry, so
they are exact). The output (zstd Parquet) is written to a temporary directory and renamed; an
existing directory is only replaced if it is an earlier encode output (has ``_encode.json``).

Partitions follow the input files (``num_partitions`` to force a count); an input that Spark
reads as fewer partitions than cores, such as one file with one row group, is spread over the
cores unless it is too small to be worth a shuffle.

Cost (``scripts/bench_encode.py``, BENCHMARKS.md): a fresh application's first job pays about
1.7 s before its tasks run (mostly Spark starting the JVM's job machinery and the Python
workers: ``scripts/bench_spark_start.py``); after that, on the pyarrow path, the tasks' time is
mostly the encoding itself (the stage's tokens/s against single-thread tiktoken x 2 cores:
0.55x on en-docs, 0.68x at 250 MB, 0.77x at 1 GB).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import re
import threading
import time
import unicodedata
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import Broadcast
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline import fsutil
from pipeline.config import ENCODE, Config, ConfigError, check_output_place, unnumbered_repartition
from pipeline.count.corpus import (
    check_local_footers,
    check_text_column,
    column,
    format_name,
    read_corpus,
    skipping_corrupt_files,
    unreadable_file_error,
)
from pipeline.encoder import UNENCODABLE, EncodeError, Tokenizer, repair_surrogates
from pipeline.lease import Lease
from pipeline.outputs import (
    IncompleteRun,
    check_run,
    read_tiktoken_export,
    tiktoken_split_problem,
)
from pipeline.patterns import PATTERNS, resolve_pattern, tiktoken_pattern
from pipeline.pretokenize import (
    Pretokenizer,
    PretokenizerSpec,
    cut_specials,
    decode_row,
    special_token_pattern,
    text_values,
)
from pipeline.progress import Progress, jsonl_at
from pipeline.spark_session import (
    PerTask,
    TaskCounts,
    job_group,
    read_progress,
    warm_python_workers,
)

if TYPE_CHECKING:
    from pipeline.encode_local import LocalEncode

log = logging.getLogger(__name__)

SPECIAL_MODES = ("error", "special", "text")
ENCODE_ENGINES = ("auto", "tiktoken", "reference")
STATS_FILE = "_encode.json"
CONFIG_FILE = "_config.json"  # the resolved config (config.json of a run or a word table)
AUTO_KEYS = ("file", "row")  # Parquet: the row's index in its file
BLOCK_KEYS = ("file", "block", "row")  # other formats: the row's index in its block of the file
IDS_TYPE = pa.list_(pa.int32())
# ids compress ~15% smaller with zstd than with Spark's default snappy, at the same CPU
OUTPUT_COMPRESSION = "zstd"
REPARTITION_MIN_BYTES = 2 << 20  # below this (on disk) a shuffle costs more than it saves
_ROW_ERROR = "spark-bpe encode error: "  # marks our own executor errors inside Spark's message
STAT_KEYS = ("rows", "null_rows", "invalid_utf8_rows", "bytes", "words", "tokens",
             "special_tokens", "python_seconds", "reference_fallback", "rows_via_reference",
             "tiktoken_errors")
# Rows the tiktoken engine hands to the reference encoder (same ids, counted in the stats):
# - a run this long (or, at some places, half as long) of whitespace: tiktoken's regex
#   (fancy-regex) runs out of backtracking stack on a run of about 1 M whitespace characters
#   ("\s+(?!\S)") and tiktoken panics (measured with tiktoken 0.14 and the gpt2, cl100k and
#   o200k patterns); or of one character repeated (20 M "a"), which tiktoken encodes slowly
#   (tests/test_long_words.py bounds each encoder's time on such rows). Found by probing (see
#   _long_run), so ordinary rows pay nothing. Any other failure is caught per row.
TIKTOKEN_MAX_RUN = 1 << 16
_RUN_BLOCK = TIKTOKEN_MAX_RUN // 2
_SPACE_BLOCK_AT = re.compile(rf"\s{{{_RUN_BLOCK}}}")  # re's \s covers Unicode spaces
# - with tiktoken before 0.13, whose BPE rescans a piece for every merge (quadratic in its
#   length; 0.13 added a heap for long pieces), a row with a piece longer than this (in
#   characters, found with the run's own split) goes to the reference encoder.
TIKTOKEN_MAX_PIECE = 1 << 12
TIKTOKEN_LINEAR_SINCE = (0, 13)
MAX_LOGGED_ERRORS = 20  # tiktoken errors logged with their row per Python worker


# -- configuration (checked before Spark starts) -------------------------------------------------

def _local(path: str) -> str | None:
    return fsutil.local_path(path) if fsutil.is_local(path) else None


def check_encode_config(cfg: Config, spark: SparkSession | None = None,
                        frame: bool = False) -> None:
    """Everything about an encode job that can be checked without reading the corpus. Local
    paths are checked without Spark; with ``spark``, any Hadoop filesystem. ``frame``: the
    corpus is a DataFrame (``pipeline.api``), not ``input``."""
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    need(cfg.tokenizer != "", "config key 'tokenizer': give a trained run directory "
                              "(--tokenizer RUN_DIR)")
    need(cfg.input != "" or frame,
         "config key 'input': give the corpus to encode (--input PATH)")
    need(cfg.special_in_text in SPECIAL_MODES,
         f"config key 'special_in_text' must be one of {SPECIAL_MODES}, "
         f"not {cfg.special_in_text!r}")
    need(cfg.encode_engine in ENCODE_ENGINES,
         f"config key 'encode_engine' must be one of {ENCODE_ENGINES}, "
         f"not {cfg.encode_engine!r}")
    need(cfg.ids_column != "", "config key 'ids_column' is empty")
    need(cfg.ids_column.lower() not in {k.lower() for k in cfg.key_columns},
         f"config key 'ids_column': {cfg.ids_column!r} is also a key column")
    need(len(set(cfg.key_columns)) == len(cfg.key_columns), "config key 'key_columns' has "
                                                            "duplicates")
    check_output_place(cfg.output, [*(("input", p) for p in cfg.inputs),
                                     ("tokenizer", cfg.tokenizer)])
    if spark is None and _local(cfg.tokenizer) is None:
        return
    try:
        check_run(cfg.tokenizer, ("tokenizer_meta.json",), spark)
    except IncompleteRun as exc:
        raise ConfigError(f"config key 'tokenizer': {exc}") from None
    if spark is None and not fsutil.is_local(cfg.output):
        return  # (looked at again once the session is there)
    if fsutil.exists(spark, cfg.output):
        killed = (" (an encode killed while it wrote to an object store leaves its part "
                  "files without it: remove the folder)") if fsutil.is_object_store(cfg.output) \
            else ""
        need(fsutil.exists(spark, fsutil.join(cfg.output, STATS_FILE)),
             f"config key 'output': {cfg.output} exists and is not the output of an earlier "
             f"encode (no {STATS_FILE}{killed}): refusing to replace it")


# -- what the executors get -----------------------------------------------------------------------

@dataclass
class EncodePlan:
    """Broadcast once: the tokenizer and how to apply it."""

    meta: dict  # tokenizer_meta.json
    engine: str  # tiktoken | reference
    special_in_text: str
    tiktoken_args: dict | None = None  # tiktoken.Encoding(**...) for the tiktoken engine
    token: str = field(default_factory=lambda: uuid.uuid4().hex)


def load_plan(spark: SparkSession | None, cfg: Config) -> EncodePlan:
    """Read the run directory and pick the engine (one-line ConfigErrors)."""
    path = fsutil.join(cfg.tokenizer, "tokenizer_meta.json")
    try:
        check_run(cfg.tokenizer, ("tokenizer_meta.json",), spark)
        meta = json.loads(fsutil.read_text(spark, path))
        Tokenizer.from_meta(meta, path)
    except IncompleteRun as exc:
        raise ConfigError(f"config key 'tokenizer': {exc}") from None
    except FileNotFoundError:
        raise ConfigError(f"config key 'tokenizer': {cfg.tokenizer} is not a trained run "
                          "directory (no tokenizer_meta.json)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"config key 'tokenizer': {path} is not usable: {exc}") from None
    engine = cfg.encode_engine
    why_not = _tiktoken_unavailable(meta)
    if engine == "auto":
        engine = "reference" if why_not else "tiktoken"
        if why_not:
            log.warning("encoding with the reference encoder (slow): %s", why_not)
    elif engine == "tiktoken" and why_not:
        raise ConfigError(f"config key 'encode_engine': tiktoken cannot encode with this run: "
                          f"{why_not}; use encode_engine = reference")
    args = None
    if engine == "tiktoken":
        try:
            args = read_tiktoken_export(cfg.tokenizer, spark).encoding_args()
        except FileNotFoundError as exc:
            if cfg.encode_engine != "auto":
                raise ConfigError(f"config key 'tokenizer': {exc}") from None
            log.warning("encoding with the reference encoder (slow): %s", exc)
            engine = "reference"
        except IncompleteRun as exc:
            raise ConfigError(f"config key 'tokenizer': {exc}") from None
    return EncodePlan(meta, engine, cfg.special_in_text, args)


def _tiktoken_unavailable(meta: dict) -> str:
    if meta["alphabet"] != "bytes":
        return "the run starts from characters (alphabet = 'chars'), tiktoken needs bytes"
    if meta.get("duplicate_tokens"):
        return ("the run made a byte string twice (tokenizer_meta.json 'duplicate_tokens'), "
                "where tiktoken's rank-by-bytes merging is not proven to match")
    try:
        import tiktoken
    except ImportError:
        return "the tiktoken package is not installed"
    pattern = resolve_pattern(meta["pattern"])
    if pattern is not None:  # tiktoken's regex engine (fancy-regex) is not the regex package
        try:
            tiktoken.Encoding(name="spark-bpe-pattern-probe", pat_str=tiktoken_pattern(pattern),
                              mergeable_ranks={bytes([b]): b for b in range(256)},
                              special_tokens={})
        except ValueError as exc:
            return (f"tiktoken cannot compile the run's split pattern "
                    f"({str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r})")
        if meta["pattern"] not in PATTERNS:  # (a custom one: it may mean another split there)
            return tiktoken_split_problem(pattern) or ""
    return ""


def _long_run(text: str) -> str:
    """What long run ``text`` has: a run of ``TIKTOKEN_MAX_RUN`` whitespace characters, or of
    one character repeated, is always found (one of half that may be); "" if none. Such a run
    covers a whole block [k*B, (k+1)*B) for the half length B, so it is enough to probe the
    first character of each block and look closer only where it could start one: O(len / B)
    work for ordinary text."""
    block = _RUN_BLOCK
    for k in range(0, len(text) - block + 1, block):
        c = text[k]
        if c.isspace():
            if _SPACE_BLOCK_AT.match(text, k):
                return f"a whitespace run of {block}+ characters"
        elif text[k + block - 1] == c and text.count(c, k, k + block) == block:
            return f"a run of {block}+ times {c!r}"
    return ""


@functools.lru_cache(maxsize=1)
def _unknown_or_astral() -> re.Pattern:
    """A BMP character unassigned in Python's Unicode database, a surrogate escape
    (U+DC80..U+DCFF: an invalid UTF-8 byte), or any character above the BMP (a bitmap and
    one range for ``re``, one C-level scan of the row; built once per process from 64 K
    lookups)."""
    ranges, start = [], None
    for cp in range(0x10001):
        unknown = cp < 0x10000 and (0xDC80 <= cp <= 0xDCFF or not 0xD800 <= cp <= 0xDFFF
                                    and unicodedata.category(chr(cp)) == "Cn")
        if unknown and start is None:
            start = cp
        elif not unknown and start is not None:
            ranges.append(f"\\u{start:04x}-\\u{cp - 1:04x}")
            start = None
    return re.compile("[" + "".join(ranges) + "\\U00010000-\\U0010ffff]")


def _reference_only_character(text: str) -> str:
    """A character of ``text`` that only the reference encoder takes as training did, or ''.
    Either Python's Unicode database (14.0 on Python 3.11) does not know it: the ``regex``
    package (our split, at training too) and tiktoken's regex engine each ship their own
    Unicode version, so such a character may be a letter to one and unassigned to the other,
    and the text around it split otherwise. Or it is a surrogate escape (U+DC80..U+DCFF),
    which stands for the invalid UTF-8 byte it escapes where tiktoken would make it U+FFFD
    (the job gives such rows as bytes; a caller of :meth:`BatchEncoder.encode` may not)."""
    for ch in set(_unknown_or_astral().findall(text)):  # (emoji repeat: each looked up once)
        if ord(ch) < 0x10000 or unicodedata.category(ch) == "Cn":
            return ch
    return ""


def _tiktoken_version(module) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in module.__version__.split(".")[:2])
    except (AttributeError, ValueError):
        return (0, 0)  # unknown: assume the worst (the quadratic BPE)


def _tiktoken_failure(exc: BaseException) -> bool:
    """tiktoken failed on the text (not the job being stopped): an Exception, or a Rust
    panic, whose ``pyo3_runtime.PanicException`` derives from BaseException only."""
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


class BatchEncoder:
    """Executor side: encodes texts with the plan's engine and the special-token policy.

    With the tiktoken engine, a row tiktoken cannot take (see ``TIKTOKEN_MAX_RUN``,
    ``TIKTOKEN_MAX_PIECE``; or tiktoken raises or panics on it), or may split or repair
    otherwise (a character newer than Python's Unicode database, a surrogate escape:
    :func:`_reference_only_character`) is encoded by the reference encoder instead, which
    gives the same ids in O(n log n) for any row. For the last row :meth:`encode` saw,
    ``via_reference`` says why ("" when tiktoken took it all) and ``tiktoken_error`` what
    tiktoken raised, if it did."""

    def __init__(self, plan: EncodePlan):
        self.plan = plan
        self.ref = Tokenizer.from_meta(plan.meta)
        self.tk = None
        self.fell_back = False  # tiktoken chosen on the driver but missing on this executor
        self.via_reference = ""
        self.tiktoken_error = ""
        self.logged_errors = 0  # this worker's tiktoken errors logged so far
        self.piece_split: Pretokenizer | None = None  # set: check piece lengths (old tiktoken)
        if plan.engine == "tiktoken":
            try:
                import tiktoken
            except ImportError:
                self.fell_back = True  # same ids (the parity tests), only slower
            else:
                self.tk = tiktoken.Encoding(**plan.tiktoken_args)
                if _tiktoken_version(tiktoken) < TIKTOKEN_LINEAR_SINCE:
                    self.piece_split = Pretokenizer(PretokenizerSpec(plan.meta["pattern"]))
        spec = dataclasses.replace(PretokenizerSpec.from_meta(plan.meta), pattern="none",
                                   special_tokens=())  # (only its lowercase, normalization)
        self.prepare = None
        if spec.lowercase or spec.normalization != "none":
            self.prepare = Pretokenizer(spec).prepare
        self.specials = list(self.ref.special_ids)
        self.special_re = special_token_pattern(self.specials)

    def tiktoken_refuses(self, prepared: str) -> str:
        """Why tiktoken should not be given this (normalized) text; "" if it can take it."""
        run = _long_run(prepared) if len(prepared) >= _RUN_BLOCK else ""
        if run:
            return run
        odd = "" if prepared.isascii() else _reference_only_character(prepared)
        if "\udc80" <= odd <= "\udcff":
            return f"an invalid UTF-8 byte (its surrogate escape U+{ord(odd):04X})"
        if odd:
            return f"a character newer than Unicode {unicodedata.unidata_version} " \
                   f"(U+{ord(odd):04X}: the split engines may disagree on it)"
        if (self.piece_split is not None and len(prepared) > TIKTOKEN_MAX_PIECE
                and max(map(len, self.piece_split.split_chunks((prepared,))), default=0)
                > TIKTOKEN_MAX_PIECE):
            return f"a piece of {TIKTOKEN_MAX_PIECE}+ characters (tiktoken < 0.13)"
        return ""

    def ordinary(self, text: str, valid_utf8: bool = True) -> list[int]:
        if self.tk is None or not valid_utf8:
            return self.ref.encode_ordinary(text)
        if self.prepare and not text.isascii() and UNENCODABLE.search(text):
            text = repair_surrogates(text)  # (before normalizing, as the reference does: a
            # pair normalized apart would stay two surrogates, which tiktoken makes U+FFFD)
        prepared = self.prepare(text) if self.prepare else text
        why = self.tiktoken_refuses(prepared)
        if not why:
            try:
                return self.tk.encode_ordinary(prepared)
            except BaseException as exc:
                if not _tiktoken_failure(exc):
                    raise
                why = "tiktoken raised"
                self.tiktoken_error = f"{type(exc).__name__}: {str(exc)[:200]}"
        self.via_reference = self.via_reference or why
        return self.ref.encode_ordinary(text)

    def encode(self, text: str, valid_utf8: bool = True) -> tuple[list[int], int]:
        """(ids, number of special tokens encoded as special ids)."""
        self.via_reference = self.tiktoken_error = ""
        mode = self.plan.special_in_text
        if mode == "text" or self.special_re is None:
            return self.ordinary(text, valid_utf8), 0
        m = self.special_re.search(text)
        if m is None:
            return self.ordinary(text, valid_utf8), 0
        if mode == "error":
            raise EncodeError(
                f"the text contains the special token {m.group()!r}: set special_in_text = "
                "special (encode it as its id) or text (encode it as ordinary text)")
        out: list[int] = []
        n = 0
        for chunk, special in cut_specials(text, self.special_re):
            out += self.ordinary(chunk, valid_utf8)
            if special is not None:
                out.append(self.ref.special_ids[special])
                n += 1
        return out, n


_WORKER_ENCODERS: dict[str, BatchEncoder] = {}


def worker_encoder(plan: EncodePlan) -> BatchEncoder:
    """One encoder per plan per Python worker (workers are reused across tasks)."""
    enc = _WORKER_ENCODERS.get(plan.token)
    if enc is None:
        _WORKER_ENCODERS.clear()
        enc = _WORKER_ENCODERS[plan.token] = BatchEncoder(plan)
    return enc


def encode_batch(enc: BatchEncoder, batch: pa.RecordBatch, stats: dict[str, float],
                 ids_type: pa.DataType = IDS_TYPE) -> pa.Array:
    """Column 0 of ``batch`` is the text, the others its key: the token ids of each row as a
    list<int32> array (``ids_type``); ``stats`` is updated."""
    col = batch.column(0)
    texts = text_values(col)
    t0 = time.perf_counter()
    ids_lists: list[list[int]] = []
    words = specials = invalid = via_ref = errors = 0
    for i, value in enumerate(texts):
        if value is None:
            ids_lists.append([])
            continue
        value, valid = decode_row(value)
        invalid += not valid
        try:
            ids, n_special = enc.encode(value, valid)
        except EncodeError as exc:
            raise EncodeError(f"{_ROW_ERROR}row {_row_keys(batch, i)}: {exc}") from None
        ids_lists.append(ids)
        words += len(value.split())
        specials += n_special
        if enc.via_reference:
            via_ref += 1
            if enc.tiktoken_error:
                errors += 1
                _log_tiktoken_error(enc, batch, i)
    lengths = np.fromiter(map(len, ids_lists), dtype=np.int64, count=len(ids_lists))
    total = int(lengths.sum())
    offsets = np.zeros(len(ids_lists) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(ids_lists), dtype=np.int32, count=total)
    stats["python_seconds"] += time.perf_counter() - t0
    nulls = col.null_count
    stats["rows"] += len(texts)
    stats["null_rows"] += nulls
    stats["invalid_utf8_rows"] += invalid
    stats["bytes"] += int(pc.sum(pc.binary_length(col)).as_py() or 0)
    stats["words"] += words
    stats["tokens"] += total
    stats["special_tokens"] += specials
    stats["rows_via_reference"] += via_ref
    stats["tiktoken_errors"] += errors
    mask = col.is_null() if nulls else None
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat), type=ids_type, mask=mask)


def _row_keys(batch: pa.RecordBatch, i: int) -> str:
    return json.dumps({batch.schema.field(j).name: batch.column(j)[i].as_py()
                       for j in range(1, batch.num_columns)}, default=str)


def _log_tiktoken_error(enc: BatchEncoder, batch: pa.RecordBatch, i: int) -> None:
    """An unexpected tiktoken failure is worth a line in the executor log (the first few per
    worker): the row was still encoded, by the reference encoder."""
    if enc.logged_errors < MAX_LOGGED_ERRORS:
        enc.logged_errors += 1
        log.warning("row %s: tiktoken raised %s; encoded with the reference encoder (same ids)",
                    _row_keys(batch, i), enc.tiktoken_error)


class BlockRows:
    """Row numbers from 0 within each (file, block start), for rows that arrive as a task
    reads its blocks: one after another, each block's rows in file order (Spark's file scan),
    so a block's rows are consecutive, possibly over several batches."""

    def __init__(self) -> None:
        self.block: tuple | None = None
        self.next = 0

    def number(self, files: pa.Array, blocks: pa.Array) -> pa.Array:
        block, n, out = self.block, self.next, []
        for key in zip(files.to_pylist(), blocks.to_pylist()):
            if key != block:
                block, n = key, 0
            out.append(n)
            n += 1
        self.block, self.next = block, n
        return pa.array(out, pa.int64())


def _encode_fn(bc, acc, out_schema: pa.Schema, counts: TaskCounts, numbered: bool = False):
    def encode_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        enc = worker_encoder(bc.value)
        stats = dict.fromkeys(STAT_KEYS, 0)
        stats["reference_fallback"] = int(enc.fell_back)
        ids_type = out_schema.field(len(out_schema) - 1).type
        task = TaskContext.get().partitionId()
        report = counts.reporter(task)
        rows = BlockRows() if numbered else None
        for batch in batches:
            keys = batch.columns[1:]
            batch = pa.RecordBatch.from_arrays(  # the key columns' own names (for errors)
                batch.columns, names=["text", *out_schema.names[:len(keys)]])
            if rows is not None:  # (file, block) -> (file, block, row), before the encode: an
                keys = [*keys, rows.number(*keys)]  # error names the row by all its keys
                batch = pa.RecordBatch.from_arrays(
                    [batch.column(0), *keys], names=[*batch.schema.names, "row"])
            ids = encode_batch(enc, batch, stats, ids_type)
            report.update(stats["rows"], stats["bytes"])
            yield pa.RecordBatch.from_arrays([*keys, ids], schema=out_schema)
        report.finish(stats["rows"], stats["bytes"])
        acc.add({task: stats})

    return encode_partition


# -- the stage ------------------------------------------------------------------------------------

@dataclass
class EncodeResult:
    output: str
    stats: dict


def _row_error(exc: BaseException) -> str | None:
    m = re.search(re.escape(_ROW_ERROR) + r"(.*)", str(exc))
    return m.group(1).strip() if m else None


def summarize(parts: dict[int, dict], seconds: float) -> dict:
    tot = {k: sum(p[k] for p in parts.values()) for k in STAT_KEYS}
    tokens, words = tot["tokens"], tot["words"]
    return {
        "rows": tot["rows"], "null_rows": tot["null_rows"],
        "invalid_utf8_rows": tot["invalid_utf8_rows"], "bytes": tot["bytes"],
        "words": words, "tokens": tokens, "special_tokens": tot["special_tokens"],
        "bytes_per_token": round(tot["bytes"] / tokens, 4) if tokens else None,
        "tokens_per_word": round(tokens / words, 4) if words else None,
        "partitions": len(parts),
        "seconds": round(seconds, 3),
        "tokens_per_second": round(tokens / seconds) if seconds > 0 else None,
        "python_encode_seconds": round(tot["python_seconds"], 3),
        "partitions_without_tiktoken": tot["reference_fallback"],
        "rows_via_reference": tot["rows_via_reference"],
        "tiktoken_errors": tot["tiktoken_errors"],
    }


def _scan_bytes(df) -> int | None:
    """Spark's size estimate of a file scan (the files' bytes on disk), if it has one."""
    try:
        size = df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()
        return int(size if isinstance(size, int) else size.toString())
    except Exception:  # noqa: BLE001 - only an optimisation hint
        return None


def encode_corpus(spark: SparkSession, cfg: Config, frame: DataFrame | None = None
                  ) -> EncodeResult:
    """Encode ``cfg.input`` (one or several corpora, comma-separated, ``input_format``) or
    ``frame`` (any DataFrame with ``text_column``) with the run at ``cfg.tokenizer`` into
    ``cfg.output``: check, read, encode into a staging directory, then publish it with
    ``_encode.json``."""
    t0 = time.monotonic()
    with Lease.beside(spark, cfg.output, cfg.lease_timeout_seconds, "encode job") as lease:
        for path in fsutil.remove_stale_temps(spark, cfg.output):
            log.info("removed %s, left by an interrupted encode", path)
        check_encode_config(cfg, spark, frame=frame is not None)  # the output as it is now
        progress = Progress("encode", jsonl_at(spark, cfg.progress_file),
                            every=cfg.heartbeat_seconds, bar=cfg.progress_bar)
        try:  # (an unreadable file is an error: a session's ignoreCorruptFiles is not used)
            with skipping_corrupt_files(spark, False, can_skip=False):
                with progress.stage("prepare"):  # (listing a lake's files, reading footers)
                    plan = load_plan(spark, cfg)
                    source = _source(spark, cfg, plan, frame)
                try:
                    summary = _encode_and_publish(spark, cfg, plan, source, t0, lease,
                                                  progress)
                finally:
                    source.close()
        finally:
            progress.close()  # (a file on a store: its last write)
    stats = summary["stats"]
    log.info("encoded %d rows, %d bytes -> %d tokens (%.3f bytes/token, %.3f tokens/word) "
             "in %.1f s", stats["rows"], stats["bytes"], stats["tokens"],
             stats["bytes_per_token"] or 0, stats["tokens_per_word"] or 0, stats["seconds"])
    return EncodeResult(cfg.output, summary)


def _encode_and_publish(spark: SparkSession, cfg: Config, plan: EncodePlan, source: _Source,
                        t0: float, lease: Lease, progress: Progress) -> dict:
    """Encode into a staging directory and move it into place with its ``_encode.json``
    (unless another job took the output's lease meanwhile); returns that summary."""
    tmp = fsutil.staging_dir(spark, cfg.output, STATS_FILE)
    log.info("encoding %s with %s (%s engine, %d merges; %s) -> %s",
             cfg.input or "a DataFrame", cfg.tokenizer, plan.engine, len(plan.meta["merges"]),
             source.how(), cfg.output)
    try:
        stats = _encode_into(spark, cfg, plan, source, tmp, progress)
    except BaseException as exc:  # (a SIGTERM's too) nothing half-written is left behind
        with contextlib.suppress(Exception):
            fsutil.delete(spark, tmp)  # (on an object store: the output, without its marker)
        unreadable = unreadable_file_error(exc, can_skip=False, kind=format_name(cfg)) \
            if isinstance(exc, Exception) else None
        if unreadable is None:
            raise
        raise unreadable from None
    fsutil.check_before_publish(spark, lease.check, tmp, cfg.output)
    stats["seconds_total"] = round(time.monotonic() - t0, 3)
    stats["engine"] = plan.engine
    stats["io"] = "spark" if source.local is None else "arrow"
    summary = {"format": "spark-bpe encoded corpus", "version": 1,
               "input": cfg.input or "a DataFrame",
               "tokenizer": cfg.tokenizer, "text_column": cfg.text_column,
               "key_columns": source.keys, "ids_column": cfg.ids_column,
               "special_in_text": cfg.special_in_text, "vocab_size": _n_vocab(plan.meta),
               "stats": stats}
    try:
        fsutil.write_text(spark, fsutil.join(tmp, CONFIG_FILE), cfg.to_json(ENCODE))
        fsutil.write_text(spark, fsutil.join(tmp, STATS_FILE), json.dumps(summary, indent=2))
    except BaseException:  # (a full disk, a SIGTERM) no staging folder or marker-less output
        with contextlib.suppress(Exception):
            fsutil.delete(spark, tmp)
        raise
    fsutil.replace_dir(spark, tmp, cfg.output)
    return summary


def refuse_files_listed_twice(files: list[str]) -> None:
    """Inputs that overlap (a folder and a file in it): the file's rows would be encoded
    twice, under the same keys, which nothing downstream could tell apart."""
    seen: set[str] = set()
    for f in files:
        if f in seen:
            raise ConfigError(f"config key 'input': {f} is in more than one of the inputs; its "
                              "rows would be encoded twice under the same keys: give each "
                              "file once")
        seen.add(f)


def _read_input(spark: SparkSession, cfg: Config, frame: DataFrame | None
                ) -> tuple[list[DataFrame], str, int | None]:
    """The corpus as DataFrames (one per source, same columns), its name for errors, and its
    rows when the footers say (local Parquet)."""
    if frame is not None:
        check_text_column(frame, cfg.text_column, "the DataFrame")
        return [frame], "the DataFrame", None
    sources = [read_corpus(spark, path, cfg.text_column, cfg.input_format)
               for path in cfg.inputs]
    frames = [df for df, _ in sources]
    listed = [f for _, files in sources for f in files]
    rows = None
    if cfg.input_format == "parquet":
        rows = check_local_footers(sorted(set(listed)), can_skip=False,
                                   text_column=cfg.text_column)
    refuse_files_listed_twice(listed)
    schemas = {frozenset((f.name, f.dataType.simpleString()) for f in df.schema.fields)
               for df in frames}
    if len(schemas) > 1:
        raise ConfigError(f"config key 'input': the corpora {cfg.input} have different "
                          "columns or column types; encode them one at a time")
    return frames, cfg.input, rows


@dataclass
class _Source:
    """What the encode reads: Spark's rows (``df``), or the pyarrow path's tasks (``local``);
    the plan broadcast to the tasks, and a job warming their Python workers meanwhile."""

    df: DataFrame | None  # the text and the key columns (but ``row`` when the tasks number it)
    keys: list[str]
    rows: int | None  # when known before reading (local Parquet footers): the heartbeat's ETA
    bc: Broadcast
    numbered: bool = False  # keys (file, block, row): row numbered in the tasks (not Parquet)
    local: LocalEncode | None = None
    why_spark: str = ""  # why Spark's path reads it
    warming: threading.Thread | None = None

    def how(self) -> str:
        return ("pyarrow in the tasks" if self.local is not None
                else f"Spark's reader and writer: {self.why_spark}")

    def close(self) -> None:
        if self.warming is not None:
            self.warming.join(60)  # (a job still running when Spark stops logs errors)
        self.bc.unpersist()


def _source(spark: SparkSession, cfg: Config, plan: EncodePlan,
            frame: DataFrame | None = None) -> _Source:
    """The pyarrow path's tasks where it can take the input (:mod:`pipeline.encode_local`),
    else Spark's rows, while the encoders are built in the workers."""
    from pipeline.encode_local import plan_local_encode

    if frame is not None and cfg.encode_io == "arrow":
        raise ConfigError("config key 'encode_io' = 'arrow' reads local Parquet files, not a "
                          "DataFrame; use 'auto' or 'spark'")
    local, why = plan_local_encode(spark, cfg) if frame is None else (None, "a DataFrame")
    bc = spark.sparkContext.broadcast(plan)
    if local is not None:
        return _Source(None, local.keys, local.rows, bc, local=local)
    # Spark's path: its Python workers start, and build the encoder, while the read is planned
    warming = warm_python_workers(spark, lambda: worker_encoder(bc.value),
                                  "spark-bpe-warm-encoders")
    try:
        source = _spark_source(spark, cfg, bc, frame)
    except BaseException:
        warming.join(60)
        bc.unpersist()
        raise
    source.why_spark, source.warming = why, warming
    return source


def _spark_source(spark: SparkSession, cfg: Config, bc: Broadcast,
                  frame: DataFrame | None = None) -> _Source:
    """The text and the key columns to carry (default: every other column; when the text is
    the only one, the input file and row, or for a DataFrame a row id), spread over the cores
    when the input is one large partition."""
    frames, name, rows = _read_input(spark, cfg, frame)
    columns = frames[0].columns
    keys = list(cfg.key_columns)
    for k in keys:
        if k not in columns:
            raise ConfigError(f"config key 'key_columns': column {k!r} not in {name} "
                              f"(columns: {', '.join(columns)})")
        if k == cfg.text_column:
            raise ConfigError(f"config key 'key_columns': {k!r} is the text column")
    if not keys:
        keys = [c for c in columns if c != cfg.text_column]
    numbered = False  # keys (file, block, row), row numbered in the tasks
    if keys:
        extra = [column(k) for k in keys]
    elif frame is not None:  # no files: Spark's row ids (partition, then row within it)
        keys = ["row"]
        extra = [F.monotonically_increasing_id().alias("row")]
    elif cfg.input_format == "parquet":
        keys = list(AUTO_KEYS)
        extra = [F.col("_metadata.file_path").alias("file"),
                 F.col("_metadata.row_index").alias("row")]
    else:  # no row index in Spark's other readers: the tasks number each block's rows
        keys, numbered = list(BLOCK_KEYS), True
        extra = [F.col("_metadata.file_path").alias("file"),
                 F.col("_metadata.file_block_start").alias("block")]
    src = functools.reduce(DataFrame.unionByName,
                           [f.select(column(cfg.text_column), *extra) for f in frames])
    if cfg.ids_column.lower() in {k.lower() for k in keys}:  # (Spark's names: any case)
        raise ConfigError(f"config key 'ids_column': {cfg.ids_column!r} is also a key column; "
                          "choose another name (--ids-column NAME)")
    if numbered:  # rows are numbered in the order each task reads its blocks: no shuffle first
        if cfg.num_partitions:
            raise unnumbered_repartition(format_name(cfg))
        return _Source(src, keys, rows, bc, numbered=True)
    if cfg.num_partitions:
        src = src.repartition(cfg.num_partitions)
    else:  # one file with one row group is one partition: share it out, unless it is tiny
        cores = spark.sparkContext.defaultParallelism
        if (src.rdd.getNumPartitions() < cores
                and sum(_scan_bytes(f) or 0 for f in frames) >= REPARTITION_MIN_BYTES):
            src = src.repartition(cores)
    return _Source(src, keys, rows, bc)


def _encode_into(spark: SparkSession, cfg: Config, plan: EncodePlan, source: _Source,
                 tmp: str, progress: Progress) -> dict:
    """Run the encode (tasks with heartbeats) into ``tmp``; returns the statistics."""
    from pipeline.encode_local import encode_local

    sc = spark.sparkContext
    acc = sc.accumulator({}, PerTask())
    counts = TaskCounts.create(sc)
    counts.total_rows = source.rows
    t_enc = time.monotonic()
    try:
        with job_group(sc, "encode") as group, progress.stage(
                "encode", unit="tasks", poll=read_progress(sc, group, counts),
                recent_eta=True):
            counts.begin("")  # the reading (and encoding) starts: its tasks out of all
            if source.local is not None:
                encode_local(spark, source.local, source.bc, acc, counts, tmp)
            else:
                _spark_encode(cfg, source, acc, counts).write.option(
                    "compression", OUTPUT_COMPRESSION).parquet(fsutil.spark_path(tmp))
            counts.end_reading()  # (the end line: every task done, as the tracker may not say)
    except Exception as exc:
        msg = _row_error(exc)
        if msg is not None:  # a row this config cannot encode: which key decides that
            key = "tokenizer" if "chars-alphabet vocabulary" in msg else "special_in_text"
            raise ConfigError(f"config key '{key}': {msg}") from None
        raise
    finally:
        counts.close()
    stats = summarize(acc.value, time.monotonic() - t_enc)
    if stats["partitions_without_tiktoken"]:
        log.warning("%d partitions ran on executors without tiktoken and used the reference "
                    "encoder (same ids, slower): install tiktoken on the executors",
                    stats["partitions_without_tiktoken"])
    if stats["rows_via_reference"]:
        log.info("%d rows went to the reference encoder (same ids): tiktoken cannot take them "
                 "(%d raised; see the executor logs)", stats["rows_via_reference"],
                 stats["tiktoken_errors"])
    return stats


def _spark_encode(cfg: Config, source: _Source, acc, counts: TaskCounts) -> DataFrame:
    """Spark's path: the encoded rows, to be written by Spark's Parquet writer."""
    from pyspark.sql.pandas.types import to_arrow_schema

    src = source.df
    # the key columns by position, after the text (by name, a text column named as an
    # automatic key, ``row``, would give that key the text's type)
    carried = list(src.schema.fields[1:])
    if source.numbered:  # the row number the tasks add
        carried.append(T.StructField("row", T.LongType(), False))
    out_struct = T.StructType(carried + [
        T.StructField(cfg.ids_column, T.ArrayType(T.IntegerType(), False), True)])
    # (columns renamed by position: mapInArrow resolves each input column by its name, and
    # reads "meta.id" as field id of a struct meta; the tasks take the names from out_struct)
    src = src.toDF(*[f"_spark_bpe_{i}" for i in range(len(src.columns))])
    return src.mapInArrow(_encode_fn(source.bc, acc, to_arrow_schema(out_struct), counts,
                                     source.numbered), out_struct)


def _n_vocab(meta: dict) -> int:
    base = 256 if meta["alphabet"] == "bytes" else len(meta["base_tokens"])
    return base + len(meta["merges"]) + len(meta["special_tokens"])
