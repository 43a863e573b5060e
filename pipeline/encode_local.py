"""The encode job's path for local Parquet: pyarrow reads the rows and writes the ids inside the
Spark tasks, which Spark only schedules (``encode_io = auto`` or ``arrow``).

Why: on Spark's path (``mapInArrow`` over Spark's Parquet scan, Spark's Parquet writer) the
text goes JVM -> Arrow -> Python and the ids Python -> Arrow -> JVM rows -> Parquet, and a fresh
application's first SQL job pays seconds of planning and JIT; for a corpus of a few hundred MB
that plumbing cost more than the encoding (BENCHMARKS.md). Here a task reads its row groups
with pyarrow, encodes them with the same :func:`pipeline.encode_corpus.encode_batch` and
writes one zstd Parquet file, so the only JVM work is scheduling.

The output is the one Spark's path writes, read back by Spark or pyarrow: the same columns,
types and nullability (keys: ``file`` as Spark's ``_metadata.file_path`` spells it, and
``row``, the row's index in its file; or the input's own key columns), one row per input row.
Only where that is certain is this path taken; anything else goes to Spark's path (the reason
logged): files Spark would list differently (globs, nested or partitioned directories, names
like ``_x=1.parquet``), files whose schemas differ, key columns of types other than integers,
floats, booleans, strings and binary (or byte arrays annotated otherwise than as strings),
column names that differ only in case, an ids column named as a key, a session that reads
binary as strings or writes Parquet's legacy layout, ``num_partitions`` above the row groups,
or a large input in fewer row groups than cores (Spark's path shares such a file out).

Tasks: the row groups dealt to ``num_partitions`` tasks (default two per core, more for a big
input: about ``TASK_BYTES`` each), largest first, each task's in corpus order. A task writes
``_attempt-*`` under the staging directory and renames it to ``part-NNNNN-<job>-c000.zstd
.parquet`` when done, so a retried or speculative attempt replaces a whole file, never half of
one; ``_SUCCESS`` is written last, as Spark's committer does.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import Accumulator, Broadcast
from pyspark.sql import SparkSession

from pipeline import fsutil
from pipeline.config import Config, ConfigError
from pipeline.count.corpus import (
    SHARED_FS,
    FilesWithoutColumn,
    ReadSlice,
    UnreadableFile,
    first_line,
    list_local_corpus,
    not_here,
    parse_not_here,
    plan_slices,
    read_slice_batches,
)
from pipeline.encode_corpus import (
    AUTO_KEYS,
    OUTPUT_COMPRESSION,
    REPARTITION_MIN_BYTES,
    STAT_KEYS,
    EncodePlan,
    encode_batch,
    refuse_files_listed_twice,
    worker_encoder,
)
from pipeline.memory import task_out_of_memory
from pipeline.spark_session import TaskCounts, TaskErrors

log = logging.getLogger(__name__)

TASK_BYTES = 256 << 20  # input (files on disk) per task when a corpus needs more than 2 per core
BATCH_ROWS = 1024  # rows read and encoded at a time, at most ...
BATCH_BYTES = 8 << 20  # ... and about this much text as decoded (read_slice_batches): the
# ids of a batch are Python lists until it is encoded, ~36 bytes per token, ~70 MB here
ROW_GROUP_IDS = 8 << 20  # ids per output row group (32 MB as int32), or ...
ROW_GROUP_BYTES = 64 << 20  # ... this much Arrow data (wide keys, short or null texts)
# key column types that Spark reads and writes as the same Arrow type (anything else: Spark)
_PLAIN_TYPES = (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(), pa.float64(),
                pa.bool_(), pa.string(), pa.binary())
_TEXT_TYPES = (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())
IDS_TYPE = pa.list_(pa.field("element", pa.int32(), False))  # Spark's array<int> (no nulls)


@dataclass
class LocalEncode:
    """What the tasks of the pyarrow path need."""

    tasks: list[EncodeTask]
    keys: list[str]
    columns: list[str]  # read from each file: the text, then the key columns it has
    schema: pa.Schema  # of the output: the keys, then the ids
    rows: int


@dataclass
class EncodeTask:
    """One task: its row groups in corpus order, and the ``file`` key of each of its files."""

    index: int
    slices: list[ReadSlice]
    spellings: dict[int, str]  # file index -> Spark's ``_metadata.file_path`` of the file


def plan_local_encode(spark: SparkSession, cfg: Config) -> tuple[LocalEncode | None, str]:
    """The pyarrow path's tasks for this encode, or (None, why Spark's path encodes it)."""
    if cfg.encode_io == "spark":
        return None, "encode_io = spark"
    why = _not_local(cfg) or _session_differs(spark)
    if why:
        if cfg.encode_io == "arrow":
            raise ConfigError(f"config key 'encode_io' = 'arrow' reads and writes local "
                              f"Parquet only, as Spark's defaults read it: {why}; use 'auto' "
                              "or 'spark'")
        return None, why
    plan, why = _plan(spark, cfg)
    if plan is None and cfg.encode_io == "arrow":
        raise ConfigError(f"config key 'encode_io' = 'arrow': {why}; use 'auto' or 'spark'")
    return plan, why


def _not_local(cfg: Config) -> str:
    if cfg.input_format != "parquet":
        return f"the input is {cfg.input_format}, not Parquet"
    if not all(fsutil.is_local(p) for p in [*cfg.inputs, cfg.output]):
        return "the input or the output is not on the local filesystem"
    return ""


# Spark settings under which Spark's path reads or writes otherwise than pyarrow does here
_SPARK_DEFAULTS = {"spark.sql.parquet.binaryAsString": "false",  # binary columns as strings
                   "spark.sql.parquet.writeLegacyFormat": "false"}  # another list layout


def _session_differs(spark: SparkSession) -> str:
    changed = [k for k, v in _SPARK_DEFAULTS.items()
               if str(spark.conf.get(k, v)).strip().lower() != v]
    return f"the session sets {', '.join(changed)}" if changed else ""


def _plan(spark: SparkSession, cfg: Config) -> tuple[LocalEncode | None, str]:
    files, footers, why = _list(cfg)
    if files is None:
        return None, why
    first = footers[files[0]].schema.to_arrow_schema()
    keys, why = _keys(cfg, first, footers[files[0]])
    if keys is None:
        return None, why
    groups = sum(footers[f].num_row_groups for f in files)
    on_disk = sum(os.path.getsize(fsutil.local_path(f)) for f in files)
    cores = spark.sparkContext.defaultParallelism
    if cfg.num_partitions > groups:
        return None, f"num_partitions = {cfg.num_partitions} is more than the {groups} row groups"
    if not cfg.num_partitions and groups < cores and on_disk >= REPARTITION_MIN_BYTES:
        return None, f"{groups} row groups for {cores} cores (Spark's path shares them out)"
    n = cfg.num_partitions or max(2 * cores, math.ceil(on_disk / TASK_BYTES))
    slices = plan_slices(files, cfg.text_column, n, footers)
    if slices is None:  # (checked by the listing: a file without the text column)
        return None, f"a file without column {cfg.text_column!r}"
    if keys:
        fields = [first.field(k).with_nullable(True) for k in keys]  # as Spark reads them
        columns = [cfg.text_column, *keys]
    else:
        keys, columns = list(AUTO_KEYS), [cfg.text_column]
        fields = [pa.field("file", pa.string(), False), pa.field("row", pa.int64(), False)]
    if {k.lower() for k in keys} & {cfg.ids_column.lower()}:
        return None, f"ids_column {cfg.ids_column!r} is also a key column (Spark's path says so)"
    schema = pa.schema([*fields, pa.field(cfg.ids_column, IDS_TYPE, True)])
    spell = _spark_spelling(spark)
    tasks = [EncodeTask(i, task, {s.file_index: spell(files[s.file_index]) for s in task})
             for i, task in enumerate(slices)]
    rows = sum(footers[f].num_rows for f in files)
    return LocalEncode(tasks, keys, columns, schema, rows), ""


def _list(cfg: Config) -> tuple[list[str] | None, dict[str, pq.FileMetaData], str]:
    """The input's files in corpus order (as Spark lists them), their footers; or None and why
    not (Spark's path then lists, and says what is wrong if anything is)."""
    footers: dict[str, pq.FileMetaData] = {}
    files: list[str] = []
    for path in cfg.inputs:
        skipped: list[str] = []
        try:
            listed = list_local_corpus(path, cfg.text_column, footers, skipped)
        except FilesWithoutColumn:
            raise
        except ConfigError:  # (no readable file: Spark's path says so in the encode's words)
            listed = None
        if listed is None or skipped:
            return None, footers, (f"{path} is not a file or a directory of files (Parquet, "
                                   f"with a text column {cfg.text_column!r}, readable)")
        files += listed
    refuse_files_listed_twice(files)
    first = footers[files[0]].schema.to_arrow_schema()
    if any(not footers[f].schema.to_arrow_schema().equals(first) for f in files[1:]):
        return None, footers, "the files' schemas differ"
    return files, footers, ""


def _keys(cfg: Config, schema: pa.Schema, footer: pq.FileMetaData
          ) -> tuple[list[str] | None, str]:
    """The key columns to carry ([] for the automatic file and row), or None and why Spark's
    path must read them."""
    names = schema.names
    if len({n.lower() for n in names}) < len(names):
        return None, "column names that differ only in case"
    keys = list(cfg.key_columns) or [n for n in names if n != cfg.text_column]
    if any(k not in names or k == cfg.text_column for k in keys):
        return None, "the key columns are not the files' (Spark's path says which)"
    if schema.field(cfg.text_column).type not in _TEXT_TYPES:
        return None, f"column {cfg.text_column!r} is {schema.field(cfg.text_column).type}"
    annotated = {footer.schema.column(i).path: footer.schema.column(i).logical_type.type
                 for i in range(len(footer.schema))}
    if annotated.get(cfg.text_column) not in ("NONE", "STRING"):
        return None, f"column {cfg.text_column!r} is annotated {annotated.get(cfg.text_column)}"
    odd = [k for k in keys if schema.field(k).type not in _PLAIN_TYPES
           or annotated.get(k) not in _PLAIN_ANNOTATIONS]
    if odd:
        return None, f"key columns of types Spark converts ({', '.join(odd)})"
    return keys, ""


_PLAIN_ANNOTATIONS = ("NONE", "STRING", "INT")  # (an ENUM or JSON byte array is a string to
# Spark, binary to pyarrow; a nested column has no leaf of its name)
_SAFE_NAME = re.compile(r"[A-Za-z0-9/._+=,@-]*")  # spelled as is in a URI's path


def _spark_spelling(spark: SparkSession) -> Callable[[str], str]:
    """A local file's URI as Spark's ``_metadata.file_path`` gives it (``file:/a%20b``): what
    Hadoop's ``Path`` makes of Java's ``File.toURI``, asked of the JVM for a path with any
    character that URIs may quote (most names have none, and thousands of files would cost
    thousands of calls)."""
    jvm = spark.sparkContext._jvm
    path_of, file_of = jvm.org.apache.hadoop.fs.Path, jvm.java.io.File

    def spell(f: str) -> str:
        local = fsutil.local_path(f)
        if _SAFE_NAME.fullmatch(local):
            return "file:" + local
        return str(path_of(file_of(local).toURI()).toUri().toString())

    return spell


def encode_local(spark: SparkSession, local: LocalEncode, bc: Broadcast, acc: Accumulator,
                 counts: TaskCounts, tmp: str) -> None:
    """Run the tasks: each writes one Parquet file of ``tmp`` (made here) and its statistics
    to ``acc`` ({task: stats}); then ``_SUCCESS``. An input file or the staging directory that
    an executor does not see is one error saying so (local paths on a cluster must be on a
    filesystem every machine shares)."""
    out = fsutil.local_path(tmp)
    _make_staging(out)
    job = uuid.uuid4().hex
    counts.total_rows = local.rows
    shape = LocalEncode([], local.keys, local.columns, local.schema, local.rows)  # no tasks

    errors = TaskErrors(spark.sparkContext)

    def run(tasks: Iterator[EncodeTask]) -> Iterator[int]:
        from pyspark import TaskContext

        attempt = TaskContext.get().attemptNumber()
        for t in tasks:
            part = os.path.join(out, f"_attempt-{t.index:05d}-{attempt}-{job}")
            try:
                stats = _encode_task(bc.value, shape, t, part, counts)
            except UnreadableFile as exc:  # no retry mends it: the driver ends the job
                errors.report(t.index, exc)
                with contextlib.suppress(OSError):
                    os.remove(part)
                break
            os.replace(part, _final_name(out, t.index, job))
            acc.add({t.index: stats})
        yield 0

    n = len(local.tasks)  # each task's slices go to that task only
    try:
        with errors.raising(spark.sparkContext, UnreadableFile):
            spark.sparkContext.parallelize(local.tasks, n).mapPartitions(run).collect()
    except Exception as exc:
        gone = parse_not_here(str(exc), "output")
        if gone is None:
            raise
        raise ConfigError(f"config key 'output': the executor on {gone[0]} cannot write into "
                          f"{gone[1]} (not there for it): {SHARED_FS}") from None
    for name in os.listdir(out):  # attempts that were killed mid-file
        if name.startswith("_attempt-"):
            with contextlib.suppress(FileNotFoundError):  # (a speculative one renamed since)
                os.remove(os.path.join(out, name))
    with open(os.path.join(out, "_SUCCESS"), "wb"):
        pass


def _make_staging(out: str) -> None:
    os.makedirs(out, exist_ok=True)


def _final_name(out: str, index: int, job: str) -> str:
    return os.path.join(out, f"part-{index:05d}-{job}-c000.{OUTPUT_COMPRESSION}.parquet")


def _encode_task(plan: EncodePlan, local: LocalEncode, task: EncodeTask, path: str,
                 counts: TaskCounts) -> dict:
    """Read, encode and write ``task``'s row groups into ``path``; its statistics."""
    enc = worker_encoder(plan)
    stats = dict.fromkeys(STAT_KEYS, 0)
    stats["reference_fallback"] = int(enc.fell_back)
    report = counts.reporter(task.index)
    auto = len(local.columns) == 1  # the keys are the file and the row
    pending: list[pa.RecordBatch] = []
    pending_ids = pending_bytes = 0
    opened: dict[str, pq.ParquetFile] = {}  # (a file's footer parsed once per task)
    try:
        writer = pq.ParquetWriter(path, local.schema, compression=OUTPUT_COMPRESSION)
    except FileNotFoundError:  # the driver made the staging directory: not shared with us
        raise not_here(os.path.dirname(path), "output") from None
    with writer:
        for s in task.slices:
            for start, batch in _read(s, local.columns, opened):
                if auto:  # the key (file, row) before encoding: a row's error names it
                    n = batch.num_rows
                    batch = pa.RecordBatch.from_arrays(
                        [batch.column(0), pa.array([task.spellings[s.file_index]] * n),
                         pa.array(range(start, start + n), pa.int64())],
                        names=[local.columns[0], "file", "row"])
                ids = encode_batch(enc, batch, stats, IDS_TYPE)
                report.update(stats["rows"], stats["bytes"])
                done = pa.RecordBatch.from_arrays([*batch.columns[1:], ids], schema=local.schema)
                pending.append(done)
                pending_ids += len(ids.values)
                pending_bytes += done.nbytes
                if pending_ids >= ROW_GROUP_IDS or pending_bytes >= ROW_GROUP_BYTES:
                    writer.write_table(pa.Table.from_batches(pending), row_group_size=1 << 30)
                    pending, pending_ids, pending_bytes = [], 0, 0
        if pending or not stats["rows"]:
            writer.write_table(pa.Table.from_batches(pending, schema=local.schema),
                               row_group_size=1 << 30)
    report.finish(stats["rows"], stats["bytes"])
    return stats


def _read(s: ReadSlice, columns: list[str], opened: dict[str, pq.ParquetFile]
          ) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The slice's rows in batches (``BATCH_ROWS``, ``BATCH_BYTES``), each with the index in
    its file of its first row; a file that cannot be read fails the task naming it (the driver
    makes that one line). ``opened``: the task's open files (one at a time), by path."""
    row = s.first_row
    try:
        parquet = opened.get(s.path)
        if parquet is None:
            opened.clear()
            parquet = opened[s.path] = pq.ParquetFile(s.path)
        for batch in read_slice_batches(parquet, s, columns, BATCH_ROWS, BATCH_BYTES):
            yield row, batch
            row += batch.num_rows
    except (MemoryError, pa.ArrowMemoryError, pa.ArrowCapacityError) as exc:
        raise task_out_of_memory(s.path, exc) from None  # (not the file's fault)
    except FileNotFoundError:  # listed by the driver, not there for this executor
        raise not_here(s.path) from None
    except (OSError, pa.ArrowException) as exc:
        raise UnreadableFile.at(s.path, first_line(exc)) from None
