"""Word tables made elsewhere: ``--words`` given a (word, count[, first_seen]) table that
``count_words`` did not write, as Parquet or as TSV (SentencePiece's ``word<TAB>count``).

The table is taken as given (its words are the words: no split, no cap) and written once as
a word table of ours in the run directory, so that everything after it (checkpoints, resume,
outputs) works as for a counted corpus. The tie-break needs each word's first occurrence:
``first_seen`` when the table has it (only its order matters; for every row, or the table is
refused), otherwise the table's own row order (files by path, rows in file order). A word
listed twice is counted once with the summed count and the earlier position. With
``lowercase`` or ``normalization``, its words must already be as those make text (the
encoders apply them): a table with a word they change is refused.

TSV lines are ``word<TAB>count`` or ``word<TAB>count<TAB>first_seen`` (one or the other in
the whole table); the word may hold any
character but tab, newline, carriage return and backslash, which are written ``\\t``, ``\\n``,
``\\r`` and ``\\\\``. Blank lines are skipped; any other malformed line is an error naming its
file and line.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import fsutil
from pipeline.config import Config, ConfigError
from pipeline.count.corpus import first_line
from pipeline.count.word_table import (
    WORD_TABLE_ARROW_SCHEMA,
    CountOverflow,
    check_replaceable,
    first_in_order,
    publish_word_table,
    sum_duplicates,
    table_summary,
    weighted_total,
    word_table_meta,
    write_table_data,
)
from pipeline.pretokenize import Pretokenizer
from pipeline.spark_session import file_reader

log = logging.getLogger(__name__)

TSV_SUFFIXES = (".tsv", ".txt", ".tsv.gz")
_INTEGER = re.compile(r"-?[0-9]+")
_UNESCAPE = {"t": "\t", "n": "\n", "r": "\r", "\\": "\\"}


def is_ours(spark, path: str) -> bool:
    return fsutil.exists(spark, fsutil.join(path, "word_table.json"))


def unescape(text: str) -> str:
    """``\\t \\n \\r \\\\`` as the characters they stand for; any other backslash is a
    ValueError (a word with a backslash is written with ``\\\\``)."""
    if "\\" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            if i + 1 >= len(text) or text[i + 1] not in _UNESCAPE:
                raise ValueError(f"an unknown escape {text[i:i + 2]!r} (the escapes are \\t "
                                 "\\n \\r \\\\; write a backslash as \\\\)")
            out.append(_UNESCAPE[text[i + 1]])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def escape(word: str) -> str:
    return (word.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r"))


def _files(path: str, suffixes: tuple[str, ...]) -> list[str]:
    local = fsutil.local_path(path)
    if os.path.isdir(local):
        return sorted(f for f in glob.glob(os.path.join(local, "*"))
                      if f.endswith(suffixes) and not os.path.basename(f).startswith(("_", ".")))
    return sorted(glob.glob(local)) if fsutil.has_glob(local, fsutil.PYTHON_GLOB) else [local]


def _local_tsv(path: str) -> Iterator[tuple[str, Iterable[str]]]:
    for f in _files(path, TSV_SUFFIXES):
        opener = open
        if f.endswith(".gz"):
            import gzip

            opener = gzip.open  # type: ignore[assignment]
        with opener(f, "rt", encoding="utf-8", errors="surrogateescape", newline="\n") as fh:
            yield f, fh


def _spark_tsv(spark, path: str) -> Iterator[tuple[str, Iterable[str]]]:
    """The TSV files of a path on another filesystem through Spark's text reader, one file
    per row (``wholetext``; .gz decompressed by Hadoop), in path order."""
    from pyspark.sql import functions as F

    df = file_reader(spark).text(path, wholetext=True).select(
        "value", F.col("_metadata.file_path").alias("file"))
    suffix = F.lit(False)
    for s in TSV_SUFFIXES:
        suffix = suffix | F.col("file").endswith(s)
    for row in df.where(suffix).orderBy("file").toLocalIterator():
        yield row["file"], row["value"].split("\n")


def read_tsv(path: str, spark=None) -> pa.Table:
    """word, count, first_seen (the row order when the file has no third column). Local
    files are read here; others through Spark (``spark``), whose text reader decodes invalid
    UTF-8 as U+FFFD where a local read keeps the bytes."""
    words: list[bytes] = []
    counts: list[int] = []
    firsts: list[int] = []
    found = False
    given: bool | None = None  # whether the lines have a first_seen column
    f, n = path, 0
    try:
        for f, lines in (_local_tsv(path) if fsutil.is_local(path) or spark is None
                         else _spark_tsv(spark, path)):
            found, n = True, 0
            for n, line in enumerate(lines, 1):
                line = line.rstrip("\n").rstrip("\r")
                if n == 1:
                    line = line.removeprefix("\ufeff")  # a byte-order mark is not a word's
                if not line:
                    continue
                third = _tsv_line(line, f, n, words, counts, firsts)
                if given is None:
                    given = third
                elif third != given:  # (positions and row numbers do not mix)
                    raise ConfigError(
                        f"config key 'words': {f} line {n} has {'a' if third else 'no'} "
                        "first_seen column, unlike the lines before it: give first_seen on "
                        "every line or on none")
    except (OSError, EOFError) as exc:  # a truncated .gz, a file that cannot be read
        raise ConfigError(f"config key 'words': {f} cannot be read after line {n}: "
                          f"{type(exc).__name__}: {exc}") from None
    if not found:
        raise ConfigError(f"config key 'words': no TSV files ({', '.join(TSV_SUFFIXES)}) in "
                          f"{path}")
    return _with_origin(pa.table({"word": pa.array(words, pa.binary()),
                                  "count": pa.array(counts, pa.int64()),
                                  "first_seen": pa.array(firsts, pa.int64())}), bool(given))


_ORIGIN = b"spark_bpe.first_seen"  # schema metadata: where a read table's first_seen came from


def _with_origin(table: pa.Table, given: bool) -> pa.Table:
    return table.replace_schema_metadata({_ORIGIN: b"column" if given else b"row order"})


def first_seen_origin(table: pa.Table) -> str:
    """How :func:`read_tsv` or :func:`read_parquet` got ``table``'s first_seen, for the log."""
    given = (table.schema.metadata or {}).get(_ORIGIN) == b"column"
    return "its first_seen column" if given else "its row order"


def _tsv_line(line: str, f: str, n: int, words: list[bytes], counts: list[int],
              firsts: list[int]) -> bool:
    """Line ``n`` of TSV file ``f`` appended to the columns, or a ConfigError naming it;
    whether the line gave its first_seen."""
    parts = line.split("\t")
    try:  # (an empty word is left out by canonical)
        if len(parts) not in (2, 3) or not all(_INTEGER.fullmatch(p) for p in parts[1:]):
            raise ValueError  # (int() would take "1_000", " 7 ", "+7" and other digits)
        count = int(parts[1])
        first = int(parts[2]) if len(parts) == 3 else len(firsts)
    except ValueError:
        raise ConfigError(f"config key 'words': {f} line {n} is not 'word<TAB>count"
                          f"[<TAB>first_seen]': {line[:80]!r}") from None
    if not (-2**63 <= count < 2**63 and -2**63 <= first < 2**63):
        raise ConfigError(f"config key 'words': {f} line {n}: a count or first_seen over "
                          f"the 64-bit integers of a word table: {line[:80]!r}")
    try:
        word = unescape(parts[0]).encode("utf-8", "surrogateescape")
    except ValueError as exc:
        raise ConfigError(f"config key 'words': {f} line {n}: {exc}: {line[:80]!r}") from None
    words.append(word)
    counts.append(count)
    firsts.append(first)
    return len(parts) == 3


def read_parquet(spark, path: str) -> pa.Table:
    """word, count[, first_seen] from Parquet (local with pyarrow, else through Spark)."""
    if fsutil.is_local(path):
        files = _files(path, (".parquet",))
        if not files:
            local = fsutil.local_path(path)
            there = sorted(n for n in os.listdir(local) if not n.startswith(("_", "."))) \
                if os.path.isdir(local) else []
            raise ConfigError(
                f"config key 'words': {path} holds no word table: no word_table.json (one of "
                "ours), no .parquet files and no TSV files (names ending "
                f"{', '.join(TSV_SUFFIXES)})" + (f"; it holds {', '.join(there[:3])}"
                                                 + (" ..." if len(there) > 3 else "")
                                                 if there else "; it is empty")
                + " (TSV that Spark wrote as part-*.csv: rename its files to .tsv)")
        try:
            t = pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(f"config key 'words': {path} is neither a word table of ours, "
                              f"TSV nor readable Parquet ({exc})") from None
    else:  # in the local read's order (files by path, rows in file order): it breaks ties
        from pyspark.sql import functions as F

        # (every file's columns: a schema from one file could miss first_seen)
        try:
            df = file_reader(spark).option("mergeSchema", "true").parquet(
                fsutil.spark_path(path))
        except Exception as exc:  # noqa: BLE001 - files whose columns do not merge, unreadable
            raise ConfigError(f"config key 'words': {path} is neither a word table of ours, "
                              f"TSV nor readable Parquet ({first_line(exc)})") from None
        t = (df.select(*df.columns, F.col("_metadata.file_path").alias("_spark_bpe_file"),
                       F.col("_metadata.row_index").alias("_spark_bpe_row"))
             .orderBy("_spark_bpe_file", "_spark_bpe_row").toArrow()
             .drop_columns(["_spark_bpe_file", "_spark_bpe_row"]))
    missing = {"word", "count"} - set(t.column_names)
    if missing:
        raise ConfigError(f"config key 'words': {path} has no column(s) {sorted(missing)} "
                          f"(columns: {t.column_names}); an external word table needs word "
                          "and count, and may have first_seen")
    word = t.column("word")
    if not any(is_(word.type) for is_ in (pa.types.is_string, pa.types.is_large_string,
                                          pa.types.is_binary, pa.types.is_large_binary)):
        raise ConfigError(f"config key 'words': {path} column 'word' is {word.type}, not "
                          "string or binary")
    for name in ("count", "first_seen"):
        if name in t.column_names and not pa.types.is_integer(t.column(name).type):
            raise ConfigError(f"config key 'words': {path} column {name!r} is "
                              f"{t.column(name).type}, not integers")
    if pa.types.is_string(word.type) or pa.types.is_large_string(word.type):
        word = pc.cast(word, pa.binary())
    given = "first_seen" in t.column_names
    first = t.column("first_seen") if given else pa.array(np.arange(t.num_rows, dtype=np.int64))
    if first.null_count:  # (positions and row numbers do not mix)
        raise ConfigError(f"config key 'words': {path}: first_seen is missing for "
                          f"{first.null_count:,} of {t.num_rows:,} rows (null, or a file "
                          "without the column): give first_seen for every row or for none")
    try:
        columns = {"count": pc.cast(t.column("count"), pa.int64()),
                   "first_seen": pc.cast(first, pa.int64())}
    except pa.ArrowInvalid as exc:  # (uint64 values of 2**63 and more)
        why = str(exc).strip().splitlines()[0]
        raise ConfigError(f"config key 'words': {path}: a count or first_seen over the 64-bit "
                          f"integers of a word table ({why})") from None
    return _with_origin(pa.table({"word": word, **columns}), given)


def canonical(table: pa.Table, special_tokens: Iterable[str] = ()) -> pa.Table:
    """Duplicates merged (counts summed, earliest position kept), non-positive counts and
    empty words dropped, words holding a special token's text dropped (a count cuts those
    out of text: learned here, they would make an ordinary token spelled as the special one),
    first_seen replaced by its dense rank (0, 1, 2, ...)."""
    words = table.column("word").combine_chunks()
    counts = pc.fill_null(table.column("count"), 0).to_numpy()  # (int64: a null is no count)
    first = table.column("first_seen").to_numpy()
    keep = (counts > 0) & (pc.binary_length(words).to_numpy(zero_copy_only=False) > 0)
    if not keep.all():
        log.warning("the external word table: left out %d of %d rows (a count below 1 or "
                    "null, or an empty or null word)", len(keep) - int(keep.sum()), len(keep))
    special = np.zeros(len(keep), dtype=bool)
    for token in special_tokens:
        special |= pc.fill_null(pc.match_substring(words, token), False).to_numpy(
            zero_copy_only=False)
    special &= keep
    if special.any():
        held = words.filter(pa.array(special))
        log.warning("the external word table: left out %d rows (%d occurrences) whose word "
                    "holds a special token (%s): special tokens are not learned from words",
                    int(special.sum()), weighted_total(np.ones(len(held)), counts[special]),
                    ", ".join(t for t in special_tokens
                              if pc.any(pc.match_substring(held, t)).as_py()))
        keep &= ~special
    words = words.filter(pa.array(keep))
    counts, first = counts[keep], first[keep]
    try:
        distinct, wid, totals = sum_duplicates(words, counts)
    except CountOverflow as exc:
        raise ConfigError(f"config key 'words': repeated words sum up too far: {exc}") from None
    n = len(distinct)
    order = np.lexsort((np.arange(len(wid)), first))  # by position, then by row
    at = first_in_order(wid, order)
    rank = np.empty(n, dtype=np.int64)
    rank[wid[order][np.sort(at)]] = np.arange(n, dtype=np.int64)
    out = pa.table({"word": distinct,
                    "count": pa.array(totals, pa.int64()),
                    "first_seen": pa.array(rank, pa.int64())}, schema=WORD_TABLE_ARROW_SCHEMA)
    return out.sort_by("first_seen")


def _check_prepared(cfg: Config, source: str, words: pa.ChunkedArray) -> None:
    """An external table's words are used as given, but the tokenizer records ``lowercase``
    and ``normalization``, and its encoders apply them to their input: a word these would
    change (``HELLO`` with lowercase) is one no encoded text holds, whose merges never
    apply. Refused, naming one and how many (they must be made so, where the table is)."""
    if not cfg.lowercase and cfg.normalization == "none":
        return
    prepare = Pretokenizer(cfg.pretokenizer_spec()).prepare
    changed, example = 0, ""
    for chunk in words.chunks:
        for word in chunk.to_pylist():
            text = word.decode("utf-8", "surrogateescape")
            if prepare(text) != text:
                changed += 1
                example = example or text
    if changed:
        said = " and ".join(
            ([f"normalization = {cfg.normalization!r}"] if cfg.normalization != "none" else [])
            + (["lowercase = true"] if cfg.lowercase else []))
        key = "normalization" if cfg.normalization != "none" else "lowercase"
        raise ConfigError(
            f"config key '{key}': the external word table {source} is used as given, but "
            f"{changed} of its {len(words)} words are not as {said} makes text (e.g. "
            f"{example!r} -> {prepare(example)!r}): the tokenizer's encoders apply it to "
            "their input, so merges learned on those words would never apply. Make the words "
            "so where the table is made, or train without these settings")


def import_word_table(spark, cfg: Config, source: str, dest: str,
                      check: Callable[[], None] | None = None,
                      before_replacing: Callable[[dict | None], None] | None = None) -> dict:
    """Write ``source`` (an external table) as a word table of ours at ``dest``; returns its
    metadata (the pretokenizer settings are the run's own: the table is taken as given).
    ``check``: the output's lease, checked before publishing; ``before_replacing``: called
    with the new table's metadata just before it replaces ``dest`` (with None before an
    object store's old table is emptied to be written over in place)."""
    names = fsutil.list_dir(spark, source)
    if names and "words" in names and fsutil.exists(
            spark, fsutil.join(source, "words", "word_table.json")):
        raise ConfigError(f"config key 'words': {source} is a run directory; its word table is "
                          f"{fsutil.join(source, 'words')}")
    check_replaceable(spark, dest)
    tsv = [f for f in names or () if f.endswith(TSV_SUFFIXES) and not f.startswith(("_", "."))]
    parquet = [f for f in names or () if f.endswith(".parquet") and not f.startswith(("_", "."))]
    if tsv and parquet:
        raise ConfigError(f"config key 'words': {source} holds both TSV ({tsv[0]}) and Parquet "
                          f"({parquet[0]}) files: a word table is one or the other; move one "
                          "kind elsewhere")
    is_tsv = source.endswith(TSV_SUFFIXES) or bool(tsv)
    raw = read_tsv(source, spark) if is_tsv else read_parquet(spark, source)
    origin = first_seen_origin(raw)
    table = canonical(raw, cfg.special_tokens)
    if table.num_rows == 0:
        raise ConfigError(f"config key 'words': {source} holds no word with a count above 0")
    _check_prepared(cfg, source, table.column("word"))
    if before_replacing is not None and fsutil.is_object_store(dest):
        before_replacing(None)
    tmp = fsutil.staging_dir(spark, dest, "word_table.json")
    write_table_data(spark, table, fsutil.join(tmp, "data"))
    counts = table.column("count").to_numpy()
    words = weighted_total(np.ones(len(counts), dtype=np.int64), counts)
    nbytes = weighted_total(pc.binary_length(table.column("word")).to_numpy(), counts)
    stats = {"rows": table.num_rows, "words": words, "bytes": nbytes,
             "unique_words": table.num_rows}
    meta = word_table_meta(cfg.pretokenizer_spec(), cfg.text_column, 0, stats,
                           {"input": "", "external": source}, summary=table_summary(table))
    def check_and_prepare() -> None:
        if check is not None:
            check()
        if before_replacing is not None and not fsutil.is_object_store(dest):
            before_replacing(meta)

    publish_word_table(spark, tmp, dest, meta, stats, check=check_and_prepare)
    log.info("imported the external word table %s: %d distinct words, %d words (first-seen "
             "order: %s) -> %s", source, table.num_rows, words, origin, dest)
    return meta
