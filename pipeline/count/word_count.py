"""The count stage (Spark): a corpus (Parquet, or any input format ``corpus.py`` reads) -> word
table ``(word, count, first_seen)``.

Text reaches Python in Arrow batches (``mapInArrow``). Each task counts the words of its rows
per input file and remembers each word's first occurrence as (file index, block, row, index of
the word's first match in the row); ``block`` is the start of the file split a Spark reader
gave the task (0 for Parquet, whose rows are numbered in the file; other formats' rows are
numbered in their split, and the merge moves them by the rows of the file's earlier splits,
which the tasks report). The partial counts are then merged: counts summed, the smallest key
kept per word, and the key packed into an order-preserving int64 ``first_seen``
(``order.FirstSeenLayout``; or, when it needs more than 63 bits, replaced by its dense rank).
The partials (``partials.py``) are kept (local Arrow
files with a local master, else the executors' disks) while the merge (``merge.py``) is
chosen from their measured size (``count_merge``, ``memory.py``): when they fit the driver's
memory they come to the driver as Arrow and numpy merges them (no shuffle, none of a fresh
JVM's warm-up), else a Spark aggregation does. Either way the word table does not depend on
partitioning (docs/DESIGN.md section 1).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark import Accumulator, StorageLevel, TaskContext
from pyspark.sql import DataFrame, SparkSession

from pipeline import faults, fsutil
from pipeline.config import COUNT, Config, ConfigError
from pipeline.count.corpus import (
    Corpus,
    ReadSlice,
    UnreadableFile,
    arrow_plan,
    first_line,
    format_name,
    input_fingerprint,
    list_local_sources,
    normalize_uri,
    not_here,
    read_slice_batches,
    read_sources,
    skipping_corrupt_files,
    unreadable_file_error,
)
from pipeline.count.merge import merge_partials, merge_with_spark
from pipeline.count.partials import (
    NULL_ROWS_OF,
    PARTIAL_ARROW_SCHEMA,
    PARTIAL_SCHEMA,
    SPLIT_LAST_ROW,
    SPLIT_ROWS,
    Counted,
    OutputSize,
    Partials,
    partial_batches,
    partials_spill_dir,
)
from pipeline.count.word_table import (
    WordTable,
    absolute_sources,
    arrow_ipc,
    check_replaceable,
    publish_word_table,
    source_meta,
    table_summary,
    word_table_meta,
    write_table_data,
)
from pipeline.lease import Lease
from pipeline.memory import (
    choose_count_merge,
    driver_budget,
    driver_fetch_limit,
    release_freed_memory,
    task_out_of_memory,
)
from pipeline.pretokenize import (
    Pretokenizer,
    PretokenizerSpec,
    WordCounter,
    text_values,
)
from pipeline.progress import Progress, jsonl_at
from pipeline.spark_session import (
    TaskCounts,
    TaskErrors,
    TaskReporter,
    job_group,
    read_progress,
    start_session,
    warm_python_workers,
)

log = logging.getLogger(__name__)


def _count_partition_fn(spec: PretokenizerSpec, file_index: dict[tuple[int, str], int],
                        weights: list[int], max_word_bytes: int, counts: TaskCounts):
    """The Spark-reader task: rows arrive from Spark's scan as Arrow batches of (text, source,
    path, block, row). Parquet gives each row's index in its file (block 0); other formats
    only the byte offset where the file's split starts, so a row is numbered within its split,
    which one task reads in order: (file, block, row) is then still the corpus order."""

    def count_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        faults.at("count_task")  # tests: heartbeats while the tasks run
        report = counts.reporter(TaskContext.get().partitionId())
        yield from count_scanned_batches(spec, batches, file_index, weights, max_word_bytes,
                                         report)

    return count_partition


def count_scanned_batches(spec: PretokenizerSpec, batches: Iterable[pa.RecordBatch],
                          file_index: dict[tuple[int, str], int], weights: list[int],
                          max_word_bytes: int, report: TaskReporter
                          ) -> Iterator[pa.RecordBatch]:
    """The Spark-reader task's counting: one counter per (file, split), since a task packs
    splits in no corpus order and first occurrences are only right within a split read in
    order. A split's counts go out as soon as the task moves on to the next split (Spark reads
    one split to its end before the next), so a task holds one split's words, not those of
    every split it packs. Were a split to come back, its rows would go on being numbered where
    they stopped, and the merge takes each word's first occurrence over the pieces."""
    splits = _SplitCounts(Pretokenizer(spec), weights, max_word_bytes)

    def finished_splits() -> Iterator[Counted]:
        rows_read = bytes_read = 0
        for batch in batches:
            texts = text_values(batch.column(0))
            sources = batch.column(1).to_pylist()
            paths = batch.column(2)
            blocks = batch.column(3).to_pylist()
            rows = batch.column(4).to_pylist()
            # (source, path, block) come in long runs: resolve each run once
            ends = sorted(set(_run_ends(batch.column(1))) | set(_run_ends(paths))
                          | set(_run_ends(batch.column(3))))
            start = 0
            for end in ends:
                fidx = file_index[(sources[start], normalize_uri(paths[start].as_py()))]
                finished = splits.move_to((fidx, blocks[start] or 0))
                if finished is not None:
                    yield finished
                bytes_read += splits.add_rows(rows[start:end], texts[start:end])
                start = end
            rows_read += batch.num_rows
            report.update(rows_read, bytes_read)
        report.finish(rows_read, bytes_read)
        finished = splits.finish()
        if finished is not None:
            yield finished

    # (file_rows, last_rows: filled as the splits finish, read by partial_batches after the last)
    yield from partial_batches(finished_splits(), splits.file_rows, extra_max=splits.last_rows)


class _SplitCounts:
    """The splits one Spark-reader task counts, one :class:`WordCounter` at a time, and what
    the merge needs of them: rows per file (with ignore_corrupt_files, a file that gave none
    was skipped by Spark), rows per split and the last row with words (the merge numbers rows
    within their file: ``merge.SplitOffsets``)."""

    def __init__(self, pre: Pretokenizer, weights: list[int], max_word_bytes: int):
        self.pre, self.weights, self.max_word_bytes = pre, weights, max_word_bytes
        self.file_rows: dict[str, int] = {}
        self.last_rows: dict[str, int] = {}
        self.rows_of: dict[tuple[int, int], int] = {}  # rows numbered so far, per split
        self.split: tuple[int, int] | None = None
        self.wc: WordCounter | None = None
        self.base = 0  # the current split's rows numbered before this piece of it

    def move_to(self, split: tuple[int, int]) -> Counted | None:
        """Count the rows that follow in ``split`` (file, block); the split left, if any."""
        if split == self.split:
            return None
        finished = self.finish()
        self.split, self.base = split, self.rows_of.get(split, 0)
        self.wc = WordCounter(self.pre, split[0], max_word_bytes=self.max_word_bytes)
        return finished

    def add_rows(self, rows: list[int | None], texts: list) -> int:
        """Count rows of the current split (a row without its index from the reader is the
        next one); the bytes read."""
        wc = self.wc
        assert wc is not None
        add, before = wc.add_row, wc.stats.bytes
        for row, text in zip(rows, texts):
            add(self.base + wc.stats.rows if row is None else row, text)
        return wc.stats.bytes - before

    def finish(self) -> Counted | None:
        """The current split's counts (None before the first), recorded as finished."""
        wc, split = self.wc, self.split
        if wc is None or split is None:
            return None
        self.wc = None
        self.rows_of[split] = self.base + wc.stats.rows
        for key, n in ((f"file_rows:{split[0]}", wc.stats.rows),
                       (f"{NULL_ROWS_OF}{split[0]}", wc.stats.null_rows),
                       (f"{SPLIT_ROWS}{split[0]}:{split[1]}", wc.stats.rows)):
            self.file_rows[key] = self.file_rows.get(key, 0) + n
        if wc.counts or wc.stats.long_words:  # (max_row: the last row with words)
            key = f"{SPLIT_LAST_ROW}{split[0]}:{split[1]}"
            self.last_rows[key] = max(self.last_rows.get(key, 0), wc.max_row)
        return wc, split[1], self.weights[split[0]]


REPORT_ROWS = 256  # rows between progress updates of an Arrow-reader task
BATCH_ROWS, BATCH_BYTES = 4096, 32 << 20  # rows read at a time: at most, and about this much


def _count_slices(spec: PretokenizerSpec, text_column: str, slices: list[ReadSlice],
                  max_word_bytes: int = 0, ignore_corrupt: bool = False,
                  weights: list[int] | None = None, report: TaskReporter | None = None
                  ) -> Iterator[pa.RecordBatch]:
    """The Arrow-reader task: read these row groups with pyarrow and count their words. One
    counter per source weight (the slices come in corpus order). ``report``: told the rows
    and bytes read so far every ``REPORT_ROWS`` rows (it writes them at most every 2 s)."""
    faults.at("count_task")  # tests: heartbeats while the tasks run
    pre = Pretokenizer(spec)
    # one counter per source weight; with ignore_corrupt one per file, so that the merge can
    # leave out every word of a file that turns out unreadable part way (merge.py); a file's
    # counter goes out when the task moves on to the next file (one file's words in memory)
    counters: dict[tuple[int, int], WordCounter] = {}
    unreadable: set[int] = set()
    rows_read = bytes_read = 0
    opened: dict[str, pq.ParquetFile] = {}
    for s in slices:
        if s.file_index in unreadable:
            continue
        if ignore_corrupt and counters and next(iter(counters))[1] != s.file_index:
            yield from partial_batches([(wc, 0, key[0]) for key, wc in counters.items()],
                                       per_file=True)
            counters.clear()
        weight = weights[s.file_index] if weights else 1
        key = (weight, s.file_index if ignore_corrupt else -1)
        wc = counters.get(key)
        if wc is None:
            wc = counters[key] = WordCounter(pre, max_word_bytes=max_word_bytes)
        add = wc.add_row
        wc.file_index = s.file_index
        row = s.first_row
        try:
            if s.path not in opened:  # (a file's footer parsed once per task)
                opened.clear()
                opened[s.path] = pq.ParquetFile(s.path)
            for batch in read_slice_batches(opened[s.path], s, [text_column], BATCH_ROWS,
                                            BATCH_BYTES):
                values = text_values(batch.column(0))
                for at in range(0, len(values), REPORT_ROWS):  # long rows: report within
                    before = wc.stats.bytes
                    for text in values[at:at + REPORT_ROWS]:
                        add(row, text)
                        row += 1
                    rows_read += min(REPORT_ROWS, len(values) - at)
                    bytes_read += wc.stats.bytes - before
                    if report is not None:
                        report.update(rows_read, bytes_read)
        except FileNotFoundError:  # listed by the driver, not there for this executor: not
            raise not_here(s.path) from None  # a corrupt file (Spark's ignoreMissingFiles)
        except (MemoryError, pa.ArrowMemoryError, pa.ArrowCapacityError) as exc:
            raise task_out_of_memory(s.path, exc) from None  # (never skipped: not corrupt)
        except (OSError, pa.ArrowException) as exc:
            if not ignore_corrupt:  # the driver turns this into one line naming the file
                raise UnreadableFile.at(s.path, first_line(exc)) from None
            unreadable.add(s.file_index)  # the merge leaves out all its rows (merge.py)
    if report is not None:
        report.finish(rows_read, bytes_read)
    yield from partial_batches([(wc, 0, key[0]) for key, wc in counters.items()],
                                {f"skipped_file:{i}": 1 for i in unreadable}, ignore_corrupt)


def _run_ends(values: pa.Array) -> list[int]:
    n = len(values)
    if n == 0:
        return []
    ree = pc.run_end_encode(values)
    return ree.run_ends.to_pylist()


def _partial_frame(corpus: Corpus, cfg: Config, spec: PretokenizerSpec,
                   size: Accumulator, counts: TaskCounts, spill: str | None = None
                   ) -> DataFrame:
    """Spark's reader: the tasks' partial counts as a DataFrame (``PARTIAL_SCHEMA``); the
    bytes of each task's Arrow output are added to ``size`` (:class:`OutputSize`). With
    ``spill`` (a local master) each task writes them to one Arrow IPC file there instead, and
    the frame has one row per task: the file's path."""
    assert corpus.df is not None
    file_index = {(src, f): i for i, (src, f) in enumerate(corpus.keys)}
    src = corpus.df
    if cfg.num_partitions and cfg.input_format == "parquet" and not cfg.input_table \
            and not corpus.from_frame:  # (a DataFrame's rows may have no file or row index:
        # hashed to one task, sorted on equal keys) keep each file's rows in order inside a
        # partition: repartition by file, sort rows
        src = src.repartition(cfg.num_partitions, "source", "path").sortWithinPartitions(
            "source", "path", "row")
    count = _count_partition_fn(spec, file_index, corpus.weights, cfg.max_word_bytes, counts)

    def measured(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task_bytes = 0
        for b in count(batches):
            task_bytes += b.nbytes
            yield b
        size.add((task_bytes, task_bytes))
        release_freed_memory()  # the worker idles while the driver trains

    def spilled(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        assert spill is not None
        path = write_spill_file(spill, TaskContext.get().partitionId(), count(batches))
        task_bytes = os.path.getsize(path)
        size.add((task_bytes, task_bytes))
        release_freed_memory()
        yield pa.RecordBatch.from_pydict({"path": [path]})

    if spill is not None:
        return src.mapInArrow(spilled, "path string")
    return src.mapInArrow(measured, PARTIAL_SCHEMA)


def write_spill_file(spill: str, task: int, batches: Iterable[pa.RecordBatch]) -> str:
    """A count task's partial counts as one Arrow IPC stream in ``spill`` (a local master: the
    driver memory-maps it, no JVM in between), written whole and then renamed, so that a
    retried or speculative attempt never leaves a torn file."""
    path = os.path.join(spill, f"task-{task:05d}.arrow")
    tmp = f"{path}.{os.getpid()}.tmp"
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_stream(sink, PARTIAL_ARROW_SCHEMA) as writer:
        for b in batches:
            writer.write_batch(b)
    os.replace(tmp, path)
    return path


def _count_partials(spark: SparkSession, corpus: Corpus, cfg: Config, spec: PretokenizerSpec,
                    plan: list[list[ReadSlice]] | None, counts: TaskCounts) -> Partials:
    """Run the count tasks. All run at once and keep their output on the executors' disks,
    measured by an accumulator; they report what they have read to ``counts``."""
    sc = spark.sparkContext
    size = sc.accumulator((0, 0), OutputSize())
    counts.begin("")  # the reading: its heartbeat counts these tasks, not the warm-up's
    spill = partials_spill_dir(sc)
    if plan is None and spill is not None:
        spilled = Partials(spark, 0, 0, spill_dir=spill)
        try:  # (a column the input does not have fails here, before any task)
            frame = _partial_frame(corpus, cfg, spec, size, counts, spill)
        except BaseException:
            spilled.release()
            raise

        def run() -> None:  # the files in task order (a task with no rows writes one too)
            spilled.files = sorted(r["path"] for r in frame.collect())

        return _measured(spilled, run, size)
    if plan is None:
        frame = _partial_frame(corpus, cfg, spec, size, counts).persist(StorageLevel.DISK_ONLY)
        return _measured(Partials(spark, 0, 0, frame=frame), frame.count, size)
    text_column, cap, ignore = cfg.text_column, cfg.max_word_bytes, cfg.ignore_corrupt_files
    weights = corpus.weights
    n = len(plan)
    counts.total_rows = sum(s.num_rows for task in plan for s in task)

    errors = TaskErrors(sc)

    def count_task(ids: Iterator[int]) -> Iterator[bytes]:
        for i in ids:
            batches = _count_slices(spec, text_column, plan[i], cap, ignore, weights,
                                    counts.reporter(i))
            try:
                if spill is not None:
                    task_bytes = os.path.getsize(write_spill_file(spill, i, batches))
                else:
                    task_bytes = 0
                    for b in batches:
                        blob = arrow_ipc([b], PARTIAL_ARROW_SCHEMA)
                        task_bytes += len(blob)
                        yield blob
            except UnreadableFile as exc:  # no retry mends it: the driver ends the job
                errors.report(i, exc)
                return
            size.add((task_bytes, task_bytes))
            release_freed_memory()  # the worker idles while the driver trains

    blobs = sc.parallelize(range(n), n).mapPartitions(count_task)
    if spill is None:
        blobs.persist(StorageLevel.DISK_ONLY)
    partials = Partials(spark, 0, 0, blobs=None if spill else blobs, spill_dir=spill,
                        files=[os.path.join(spill, f"task-{i:05d}.arrow") for i in range(n)]
                        if spill else [])

    def run() -> None:
        with errors.raising(sc, UnreadableFile):
            blobs.count()

    return _measured(partials, run, size)


def _measured(partials: Partials, run: Callable[[], object], size: Accumulator) -> Partials:
    """Run the count tasks (``run``) and record their output's size; if they fail, nothing
    of theirs is kept."""
    try:
        run()
    except BaseException:
        partials.release()
        raise
    partials.nbytes, partials.largest = size.value
    return partials


def count_words(spark: SparkSession, cfg: Config, progress: Progress | None = None,
                frame: DataFrame | None = None, lease: Lease | None = None,
                before_replacing: Callable[[dict | None], None] | None = None) -> WordTable:
    """Run the word-count stage and write the word table to ``cfg.output`` atomically, holding
    the output's lease (:meth:`pipeline.lease.Lease.beside`; ``lease``: already held by the
    caller) throughout, with heartbeats while it runs (rows and bytes the tasks have read, see
    :class:`pipeline.spark_session.TaskCounts`; tasks done from Spark's status tracker). ``frame``:
    count this DataFrame's ``text_column`` instead of ``cfg.input`` (corpus order: its
    partitions in order, rows in partition order). ``before_replacing``: called with the new
    table's metadata once the count has succeeded, just before the new table replaces the one
    at ``cfg.output`` (or with None before writing starts, where the table is written in
    place: an object store), so that a failed count leaves everything as it was (a run's
    ``run.json`` is removed there when the table changes)."""
    t0 = time.monotonic()
    check_replaceable(spark, cfg.output)
    own_progress = progress is None
    progress = progress or Progress("count_words", jsonl_at(spark, cfg.progress_file),
                                    every=cfg.heartbeat_seconds, bar=cfg.progress_bar)
    sc = spark.sparkContext
    with contextlib.ExitStack() as stack:
        if own_progress:
            stack.callback(progress.close)  # (a file on a store: its last write)
        if lease is None:
            lease = stack.enter_context(Lease.beside(spark, cfg.output,
                                                     cfg.lease_timeout_seconds, "word count"))
        for path in fsutil.remove_stale_temps(spark, cfg.output):
            log.info("removed %s, left by an interrupted count", path)
        counts = TaskCounts.create(sc)
        try:
            with job_group(sc, "count") as group, progress.stage(
                    "count", unit="tasks", poll=read_progress(sc, group, counts),
                    recent_eta=True) as stage:
                with skipping_corrupt_files(spark, cfg.ignore_corrupt_files):
                    wt = _count(_CountJob(spark, cfg, cfg.pretokenizer_spec(), t0, counts,
                                          lease.check, before_replacing), frame)
                counts.phase = ""
                st = wt.meta["stats"]
                stage.update(note=f"{st['unique_words']:,} distinct words, "
                                  f"{st['words']:,} words")
        finally:
            counts.close()
    return wt


@dataclass(frozen=True)
class _CountJob:
    """What every step of one count needs: the session, the settings, the split, the start
    time, the tasks' counters (heartbeats), the lease check and what to do before the new
    table replaces the old one (see :func:`count_words`)."""
    spark: SparkSession
    cfg: Config
    spec: PretokenizerSpec
    t0: float
    counts: TaskCounts
    check: Callable[[], None]
    before_replacing: Callable[[dict | None], None] | None = None

    @property
    def in_place(self) -> bool:
        """Whether the table is written over the old one (an object store: no rename)."""
        return fsutil.is_object_store(self.cfg.output)

    def check_and_prepare(self, meta: dict) -> None:
        """Before publishing the table ``meta`` describes: the lease still ours, then
        ``before_replacing`` (unless it ran before an in-place write)."""
        self.check()
        if self.before_replacing is not None and not self.in_place:
            self.before_replacing(meta)


@dataclass(frozen=True)
class _Input:
    """The corpus as listed: its files, the pyarrow read plan (None: Spark's reader), its
    fingerprint (for reuse) and the unreadable files left out while listing."""
    corpus: Corpus
    plan: list[list[ReadSlice]] | None
    fingerprint: dict
    skipped: list[str]


def _count(job: _CountJob, frame: DataFrame | None = None) -> WordTable:
    spark, cfg = job.spark, job.cfg
    footers: dict[str, pq.FileMetaData] = {}
    skipped: list[str] | None = [] if cfg.ignore_corrupt_files else None
    corpus = None if frame is not None else list_local_sources(cfg, footers, skipped)
    plan = None if corpus is None else arrow_plan(spark, cfg, corpus.files, footers)
    warming = None
    if plan is None:  # Spark's reader: start the Python workers while Spark plans the scan
        start_session(spark)
        spec = job.spec
        warming = warm_python_workers(spark, lambda: Pretokenizer(spec),
                                      "spark-bpe-warm-workers")
        try:
            corpus = read_sources(spark, cfg, frame)
            if frame is None and cfg.input_format == "parquet" and not cfg.input_table:
                # listed by Spark (a glob, nested directories), read by pyarrow
                plan = arrow_plan(spark, cfg, corpus.files, skipped=skipped)
        except BaseException:  # (a missing column, say) let the warm-up job end first: Spark
            warming.join(60)  # stopped under it logs errors after the job's error line
            raise
    assert corpus is not None
    _warn_of_files_listed_twice(corpus.files)
    try:
        fingerprint = input_fingerprint(spark, corpus.files, footers, cfg) if frame is None \
            else {"files": 0, "bytes": 0, "digest": "a DataFrame: never reused"}
        return _count_and_write(job, _Input(corpus, plan, fingerprint, skipped or []))
    except Exception as exc:
        named = unreadable_file_error(exc, kind=format_name(cfg))
        if named is None:
            raise
        raise named from None
    finally:
        if warming is not None:
            warming.join()


def _warn_of_files_listed_twice(files: list[str]) -> None:
    """Sources that overlap (a folder and a file in it): the file's rows are counted once per
    source, as a weight would count them; said, since it is rarely meant."""
    twice = sorted(f for f, n in collections.Counter(files).items() if n > 1)
    if twice:
        log.warning("%d input files are in more than one of the input sources, e.g. %s: their "
                    "rows are counted once per source (give each file once; --input-weights "
                    "weights a source)", len(twice), twice[0])


def _count_and_write(job: _CountJob, source: _Input) -> WordTable:
    if job.in_place and job.before_replacing is not None:
        job.before_replacing(None)  # the old table is emptied and written over in place there:
    tmp = fsutil.staging_dir(job.spark, job.cfg.output, "word_table.json")  # what depends
    try:  # on it goes first
        return _count_into(job, source, tmp)
    except BaseException:
        with contextlib.suppress(Exception):  # nothing half-written is left behind
            fsutil.delete(job.spark, tmp)  # (on an object store: the output, without marker)
        raise


def _files_of_nulls(stats: dict[str, int], files: list[str]) -> list[str]:
    """The files Spark's reader gave rows of only null text (removing the per-file null counts
    from ``stats``): a file without the text column (a Parquet or CSV file of other columns,
    JSON lines without the key) reads that way, indistinguishable from one of null rows."""
    nulls = {int(k[len(NULL_ROWS_OF):]): stats.pop(k) for k in list(stats)
             if k.startswith(NULL_ROWS_OF)}
    return sorted({files[i] for i, n in nulls.items()  # (a file two sources list: once)
                   if n and n == stats.get(f"file_rows:{i}", 0)})


def _skipped_files(stats: dict[str, int], files: list[str], listed_skipped: list[str],
                   spark_read: bool, ignore: bool, parquet: bool = True) -> list[str]:
    """The unreadable input files left out (``ignore_corrupt_files``), from the listing and
    the tasks' statistics (which this removes from ``stats``)."""
    skipped = list(listed_skipped)
    with_rows: set[int] = set()
    for key in [k for k in stats if k.startswith(("skipped_file:", "file_rows:"))]:
        value = stats.pop(key)
        index = int(key.split(":", 1)[1])
        if key.startswith("skipped_file:"):
            skipped.append(files[index])
        elif value:
            with_rows.add(index)
    if spark_read and ignore:  # Spark skips unreadable files silently: they gave no rows
        skipped += [f for i, f in enumerate(files)
                    if i not in with_rows and not (parquet and _empty(f))]
    return sorted(set(skipped))


def _empty(file: str) -> bool:
    """Whether a file of a Parquet input that gave Spark's reader no rows is a readable local
    Parquet file with none (not one Spark skipped as unreadable). Other files cannot tell:
    listed as skipped."""
    if not fsutil.is_local(file):
        return False
    try:
        return pq.ParquetFile(fsutil.local_path(file)).metadata.num_rows == 0  # (decoded)
    except Exception:  # noqa: BLE001 - unreadable: it was skipped
        return False


def _merge(job: _CountJob, partials: Partials, n_files: int, tmp: str, reader: str
           ) -> tuple[pa.Table | None, dict[str, int], int, float]:
    """Merge the partial counts where ``count_merge`` and the driver's memory say, and write
    the word table under ``tmp``. Returns (the table when merged on the driver, statistics,
    distinct words, time counted)."""
    spark, cfg, counts = job.spark, job.cfg, job.counts
    conf = dict(spark.sparkContext.getConf().getAll())
    where, buckets, why = choose_count_merge(
        cfg.count_merge, partials.nbytes, driver_budget(cfg.driver_budget_mb, conf),
        partials.largest,
        driver_fetch_limit(conf, rows=partials.frame is not None) if partials.through_jvm
        else None)
    t_counted = time.monotonic()
    (log.warning if cfg.count_merge not in ("auto", where) else log.info)(  # (driver asked,
        # spark taken)
        "counted in %.1f s (%s); %s", t_counted - job.t0, reader, why)
    counts.begin(f"merging the partial counts ({where})")
    if where == "driver":
        try:
            collected = partials.fetch(buckets)
        except Exception as exc:  # noqa: BLE001 - only a result too big for the driver
            if not isinstance(exc, MemoryError) and "maxResultSize" not in str(exc) \
                    and "OutOfMemory" not in str(exc):
                raise
            log.warning("partial counts too big for the driver (%s); merging with Spark "
                        "instead (set count_merge = spark)", first_line(exc))
            counts.begin("merging the partial counts (spark)")
        else:
            merged, stats = merge_partials(collected, n_files)
            del collected
            t_count = time.monotonic()
            log.info("merged the partial counts on the driver in %.1f s", t_count - t_counted)
            write_table_data(spark, merged, fsutil.join(tmp, "data"))
            return merged, stats, merged.num_rows, t_count
    stats, unique_words, t_count = merge_with_spark(partials.as_frame(), partials.side(),
                                                     n_files, tmp, t_counted)
    return None, stats, unique_words, t_count


def _count_into(job: _CountJob, source: _Input, tmp: str) -> WordTable:
    spark, cfg, spec, corpus, plan = job.spark, job.cfg, job.spec, source.corpus, source.plan
    files = corpus.files
    reader = "pyarrow in the tasks" if plan is not None else "Spark's reader"
    partials = _count_partials(spark, corpus, cfg, spec, plan, job.counts)
    try:
        merged, stats, unique_words, t_count = _merge(job, partials, len(files), tmp, reader)
    finally:
        partials.release()
    if merged is not None:  # (a Spark merge writes the table as it aggregates)
        log.info("wrote the word table in %.1f s", time.monotonic() - t_count)
    stats["unique_words"] = unique_words
    stats["files_of_null_text"] = _files_of_nulls(stats, files)
    if stats["files_of_null_text"]:
        log.warning("%d input files gave only null text (listed in stats.json), e.g. %s: a "
                    "file without the %r column reads that way; check that they hold it",
                    len(stats["files_of_null_text"]), stats["files_of_null_text"][0],
                    cfg.text_column)
    stats["skipped_files"] = _skipped_files(stats, files, source.skipped,
                                            plan is None and corpus.by_file,
                                            cfg.ignore_corrupt_files,
                                            cfg.input_format == "parquet")
    if stats["skipped_files"]:
        log.warning("ignore_corrupt_files: left out %d unreadable input files (listed in "
                    "stats.json): %s", len(stats["skipped_files"]),
                    ", ".join(stats["skipped_files"][:5])
                    + (" ..." if len(stats["skipped_files"]) > 5 else ""))
    if stats.get("words", 0) == 0:
        fsutil.delete(spark, tmp)
        raise ConfigError(
            f"config key 'input': the corpus at {cfg.input} has no words "
            f"({stats.get('rows', 0)} rows, {stats.get('null_rows', 0)} null, "
            f"{stats.get('empty_rows', 0)} empty): nothing to train on"
        )
    stats["seconds"] = round(time.monotonic() - job.t0, 3)
    stats["files"] = len(files)
    origin = {**source_meta(cfg), "input_fingerprint": source.fingerprint, "files": len(files),
              "input": absolute_sources(cfg.input)}  # (a rerun from elsewhere: the same input)
    left_out = {**{k: stats.get(k, 0) for k in ("long_words", "long_word_bytes",
                                                "rows_with_long_words")},
                "unreadable_files": stats["skipped_files"]}
    meta = word_table_meta(spec, cfg.text_column, cfg.max_word_bytes, stats, origin, left_out,
                           None if merged is None else table_summary(merged))
    publish_word_table(spark, tmp, cfg.output, meta, stats, cfg.to_json(COUNT),
                       lambda: job.check_and_prepare(meta))
    log.info(
        "word table: %d unique words, %d words, %d rows (%d null, %d empty) in %.1f s -> %s",
        stats["unique_words"], stats["words"], stats["rows"], stats["null_rows"],
        stats["empty_rows"], stats["seconds"], cfg.output,
    )
    if stats.get("long_words"):
        log.warning("left out %d occurrences of words longer than max_word_bytes = %d "
                    "(%d bytes in %d rows; counted in stats.json)", stats["long_words"],
                    cfg.max_word_bytes, stats["long_word_bytes"],
                    stats["rows_with_long_words"])
    return WordTable(cfg.output, meta, merged)


