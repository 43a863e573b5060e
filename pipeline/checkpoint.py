"""Durable, versioned checkpoints of the merge list (text, checksummed, written atomically).

A checkpoint file ``merges-<count>.txt`` holds a header (format version, fingerprint of the
config and word table it belongs to, the settings the fingerprint covers as one JSON line,
the run directory that wrote it, number of merges), one ``left right count removed`` line
per merge (token ids, pair count, corpus tokens the merge removed), and a last line with the
SHA-256 of everything above it.
A reader never sees a half-written file (temp + rename); a corrupt or truncated one is detected
by the checksum, reported, and the previous good one is used. The last ``KEEP`` files are kept.

Example::

    #spark-bpe merges checkpoint v2
    #fingerprint 3f005c28c8ec580d8d3fbe7b4c51e074
    #settings {"alphabet": "bytes", ...}
    #run /data/runs/nightly
    #merges 2
    32 116 1234 1234
    104 101 1100 1100
    #sha256 9c0f...
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline import fsutil
from pipeline.bpe import Merge
from pipeline.config import Config, ConfigError, same_or_inside

if TYPE_CHECKING:  # pyspark only for the type hints: this module imports without it
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

VERSION = 2  # v2: fingerprint covers the word table's content; a #settings line
READABLE = (1, 2)  # v1 files are read only to explain why they do not match
HEADER = "#spark-bpe merges checkpoint"
_NAME = re.compile(r"merges-(\d{9})\.txt$")
KEEP = 3


def fingerprint_settings(cfg: Config, word_table_meta: dict, base_size: int,
                         table_digest: str) -> dict:
    """Everything the merge sequence depends on (not the vocabulary size: a bigger one extends
    it, a smaller one is a prefix). ``table_digest`` summarises the word table's content, so a
    moved corpus still matches and a changed one does not."""
    return {
        "pretokenizer": word_table_meta.get("pretokenizer"),
        "max_word_bytes": word_table_meta.get("max_word_bytes", 0),
        "word_table": {
            "digest": table_digest,
            "unique_words": word_table_meta.get("unique_words"),
            "stats": word_table_meta.get("stats"),
        },
        "alphabet": cfg.alphabet,
        "end_of_word_suffix": cfg.end_of_word_suffix,
        "base_size": base_size,
        "min_pair_count": cfg.min_pair_count,
        "max_token_bytes": cfg.max_token_bytes,
    }


def fingerprint_of(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:32]


def explain_difference(theirs: dict | None, ours: dict) -> str:
    """Which fingerprinted settings differ, in words (for the refusal message)."""
    if not theirs:
        return ("it was written by an older spark-bpe, whose fingerprint does not record its "
                "settings")
    diffs = []
    for key in sorted(set(theirs) | set(ours)):
        a, b = theirs.get(key), ours.get(key)
        if a == b:
            continue
        if key == "word_table":
            diffs.append("the word table (a different corpus or word-count settings)")
        elif key == "pretokenizer":
            diffs.append(f"pretokenizer (checkpoint {json.dumps(a)}, this run {json.dumps(b)})")
        else:
            diffs.append(f"{key} (checkpoint {a!r}, this run {b!r})")
    return "; ".join(diffs) or "the settings fingerprint"


def _older_digest_of(theirs: dict | None, ours: dict, legacy_digest: Callable[[], str]
                     ) -> bool:
    """Whether ``theirs`` equals ``ours`` but for a word-table digest in the older scheme
    (``c...``) that ``legacy_digest`` (computed only then) gives for this table."""
    table = (theirs or {}).get("word_table") or {}
    digest = str(table.get("digest", ""))
    if not digest.startswith("c"):
        return False
    same = {**theirs, "word_table": {**table, "digest": ours.get("word_table", {}).get("digest")}}
    return same == ours and legacy_digest() == digest


CORPUS_KEYS = ("word_table", "base_size")  # what a run's corpus decides (base_size: chars)


def _only_corpus_differs(theirs: dict | None, ours: dict) -> bool:
    """Whether a checkpoint differs from this run only in what its corpus decides: the word
    table, and with the chars alphabet the base vocabulary."""
    if not theirs:
        return False
    keys = set(theirs) | set(ours)
    return all(theirs.get(k) == ours.get(k) for k in keys if k not in CORPUS_KEYS)


def render(merges: list[Merge], removed: list[int], fp: str, settings: dict | None = None,
           rows: list[str] | None = None, run: str = "") -> str:
    """The checkpoint text. ``rows``: the merge lines already rendered for a prefix of
    ``merges`` (extended in place, so a run that checkpoints often renders each merge once).
    ``run``: the run directory writing it (not part of the fingerprint: a moved run resumes)."""
    rows = [] if rows is None else rows
    rows += [f"{m.left} {m.right} {m.count} {r}"
             for m, r in zip(merges[len(rows):], removed[len(rows):])]
    head = [f"{HEADER} v{VERSION}", f"#fingerprint {fp}"]
    if settings is not None:
        head.append(f"#settings {json.dumps(settings, sort_keys=True)}")
    if run:
        head.append(f"#run {run}")
    head.append(f"#merges {len(merges)}")
    text = "\n".join(head + rows[:len(merges)]) + "\n"
    return text + f"#sha256 {hashlib.sha256(text.encode()).hexdigest()}\n"


def parse(text: str, base_size: int | None
          ) -> tuple[str, dict | None, list[Merge], list[int]]:
    """(fingerprint, settings, merges, tokens removed by each); ValueError if corrupt.
    ``base_size`` None: the header and checksum only (no merges returned)."""
    head, rows = _split(text)
    settings = json.loads(head["settings"]) if "settings" in head else None
    if settings is not None and not isinstance(settings, dict):
        raise ValueError("its settings line is not a JSON object")
    if base_size is None:
        return head["fingerprint"], settings, [], []
    merges, removed = [], []
    for k, line in enumerate(rows):
        a, b, c, r = (int(x) for x in line.split())
        if not (0 <= a < base_size + k and 0 <= b < base_size + k):
            raise ValueError(f"merge {k} refers to a token that does not exist yet")
        merges.append(Merge(a, b, base_size + k, c))
        removed.append(r)
    return head["fingerprint"], settings, merges, removed


def run_of(text: str) -> str:
    """The run directory that wrote a checkpoint ('' for files written before v2 recorded
    it); ValueError if corrupt."""
    return _split(text)[0].get("run", "")


def _split(text: str) -> tuple[dict[str, str], list[str]]:
    """(header fields, merge lines) of a checkpoint, its checksum verified; ValueError if
    corrupt."""
    if not text.endswith("\n"):
        raise ValueError("truncated (no final newline)")
    lines = text[:-1].split("\n")
    if len(lines) < 4 or not lines[-1].startswith("#sha256 "):
        raise ValueError("truncated (no checksum line)")
    body = "\n".join(lines[:-1]) + "\n"
    if hashlib.sha256(body.encode()).hexdigest() != lines[-1].split(" ", 1)[1].strip():
        raise ValueError("checksum mismatch")
    if lines[0] not in {f"{HEADER} v{v}" for v in READABLE}:
        newer = re.fullmatch(re.escape(HEADER) + r" v(\d+)", lines[0])
        if newer and int(newer.group(1)) > VERSION:
            raise NewerFormat(int(newer.group(1)))
        raise ValueError(f"unknown format {lines[0]!r}")
    head: dict[str, str] = {}
    i = 1
    while i < len(lines) - 1 and lines[i].startswith("#"):
        key, _, value = lines[i][1:].partition(" ")
        head[key] = value
        i += 1
    if "fingerprint" not in head or "merges" not in head:
        raise ValueError("header lacks fingerprint or merge count")
    n = int(head["merges"])
    rows = lines[i:-1]
    if len(rows) != n:
        raise ValueError(f"header says {n} merges, file has {len(rows)}")
    return head, rows


class NewerFormat(ValueError):
    """A sound checkpoint of a format newer than this build reads."""

    def __init__(self, version: int):
        super().__init__(f"format v{version}")
        self.version = version


UNREADABLE = (ValueError, IndexError, IsADirectoryError)  # a damaged or odd file: skipped


class Checkpointer:
    def __init__(self, spark: SparkSession | None, directory: str, fp: str, base_size: int,
                 settings: dict | None = None, run: str = ""):
        """``run``: this run's directory, recorded in each checkpoint, so that checkpoints of
        another run that shares ``directory`` are refused rather than taken for this run's
        own stale ones."""
        self.spark, self.dir, self.fp, self.base_size = spark, directory, fp, base_size
        self.settings, self.run = settings, run
        self.last_written = -1
        self._rows: list[str] = []  # rendered lines of the merge list saved last
        self._last: Merge | None = None  # its last merge (a new list must extend that one)

    def another_run(self, writer: str) -> bool:
        """Whether a checkpoint written by run directory ``writer`` is another run's: this
        directory lies outside this run's (a shared --checkpoint-dir) and a different run
        wrote it. Checkpoints inside the run directory are its own, even after a move."""
        return bool(writer and self.run and same_or_inside(writer, self.run) != ""
                    and same_or_inside(self.dir, self.run) is None)

    def shared_with(self, writer: str, how: str) -> ConfigError:
        """The error for checkpoints here of another run, ``writer``, that differs ``how``."""
        return ConfigError(
            f"the checkpoints in {self.dir} were written by another run, {writer}, {how}: two "
            "runs share this --checkpoint-dir. Give each run its own --checkpoint-dir, or, if "
            f"{writer} is gone, start fresh with --resume never (resume='never' in "
            "pipeline.api; deletes these checkpoints)")

    def _files(self) -> list[tuple[int, str]]:
        out = []
        for name in fsutil.list_dir(self.spark, self.dir) or []:
            m = _NAME.match(name)
            if m:
                out.append((int(m.group(1)), fsutil.join(self.dir, name)))
        return sorted(out)

    def newest_settings(self) -> tuple[dict | None, str]:
        """The settings recorded in the newest readable checkpoint and the run directory that
        wrote it; (None, '') when there is no checkpoint, or only ones too old or too damaged
        to say."""
        for _, path in reversed(self._files()):
            try:
                text = fsutil.read_text(self.spark, path)
                return parse(text, None)[1], run_of(text)
            except UNREADABLE:
                continue
        return None, ""

    def load(self, legacy_digest: Callable[[], str] | None = None
             ) -> tuple[list[Merge], list[int]] | None:
        """The newest valid checkpoint: (merges, tokens removed by each), or None.

        Checkpoints that differ from this run only in its corpus (the input changed, other
        input weights, another ``--words`` table) are stale: they are deleted and the run
        trains afresh, whichever run noticed the change (a rerun after one killed between
        recounting and training must not be stuck). Raises ConfigError when the newest
        readable checkpoint was made with other settings (never silently trains on top of
        foreign merges). ``legacy_digest``: this table's digest as an older spark-bpe computed
        it; a checkpoint that differs only in recording that digest is this run's (it
        resumes)."""
        for number, path in reversed(self._files()):
            try:
                # the settings first: merges of another base vocabulary (another alphabet)
                # must be refused as foreign, not taken for a damaged file
                text = fsutil.read_text(self.spark, path)
                fp, settings, _, _ = parse(text, None)
            except NewerFormat as exc:
                raise ConfigError(
                    f"checkpoint {path} was written by a newer spark-bpe ({exc}; this one "
                    f"reads up to v{VERSION}): resume with that version, or start fresh with "
                    "--resume never (resume='never' in pipeline.api; deletes these "
                    "checkpoints)") from None
            except UNREADABLE as exc:
                log.warning("checkpoint %s is corrupt (%s); trying the previous one", path, exc)
                continue
            if (fp != self.fp and legacy_digest is not None
                    and _older_digest_of(settings, self.settings or {}, legacy_digest)):
                log.info("checkpoint %s was written by an older spark-bpe (another word-table "
                         "digest) for this same word table: resuming from it", path)
                fp = self.fp
            writer = run_of(text)
            if fp != self.fp and self.another_run(writer):
                why = explain_difference(settings, self.settings or {})
                raise self.shared_with(writer, f"whose config or corpus differs ({why})")
            if fp != self.fp and _only_corpus_differs(settings, self.settings or {}):
                log.warning("the word table is not the one these checkpoints were trained on "
                            "(the input changed, other input weights or another --words "
                            "table): deleting the checkpoints of the previous input in %s and "
                            "training afresh", self.dir)
                self.clear()
                return None
            if fp != self.fp:
                why = explain_difference(settings, self.settings or {})
                raise ConfigError(
                    f"checkpoint {path} belongs to a different config or corpus: {why}. "
                    "Use another --checkpoint-dir / --output, or start fresh with "
                    "--resume never (resume='never' in pipeline.api; deletes these checkpoints)"
                )
            try:
                _, _, merges, removed = parse(text, self.base_size)
                if len(merges) != number:
                    raise ValueError(f"its name says {number} merges, it holds {len(merges)}")
            except UNREADABLE as exc:
                log.warning("checkpoint %s is corrupt (%s); trying the previous one", path, exc)
                continue
            log.info("resuming from checkpoint %s (%d merges)", path, len(merges))
            self.last_written = len(merges)
            return merges, removed
        return None

    def save(self, merges: list[Merge], removed: list[int]) -> None:
        """Write ``merges-<n>.txt`` atomically; a list no longer than the newest checkpoint
        (e.g. a smaller vocabulary served from a prefix) is not written again."""
        if len(merges) <= self.last_written:
            return
        path = fsutil.join(self.dir, f"merges-{len(merges):09d}.txt")
        fsutil.mkdirs(self.spark, self.dir)
        n = len(self._rows)
        if n and (len(merges) < n or merges[n - 1] != self._last):
            self._rows = []  # not an extension of the list saved last: render afresh
        fsutil.write_text(self.spark, path,
                          render(merges, removed, self.fp, self.settings, self._rows, self.run))
        self._last = merges[-1] if merges else None
        self.last_written = len(merges)
        # the KEEP newest up to this one; a higher-numbered file is one load() skipped (it is
        # damaged): deleting this run's own new ones for it would leave nothing to resume from
        for _, old in [f for f in self._files() if f[0] <= len(merges)][:-KEEP]:
            fsutil.delete(self.spark, old)

    def clear(self) -> None:
        for _, path in self._files():
            fsutil.delete(self.spark, path)
        self.last_written = -1

    def clean_temp(self) -> None:
        """Remove temp files a killed writer left behind (they never look like checkpoints)."""
        fsutil.remove_temp_files(self.spark, self.dir)
