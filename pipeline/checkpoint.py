"""Durable, versioned checkpoints of the merge list (text, checksummed, written atomically).

A checkpoint file ``merges-<count>.txt`` holds a header (format version, fingerprint of the
config and word table it belongs to, number of merges), one ``left right count`` line per merge
(token ids), and a last line with the SHA-256 of everything above it. A reader never sees a
half-written file (temp + rename); a corrupt or truncated one is detected by the checksum,
reported, and the previous good one is used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re

from pyspark.sql import SparkSession

from pipeline import fsutil
from pipeline.bpe import Merge
from pipeline.config import Config, ConfigError

log = logging.getLogger(__name__)

VERSION = 1
HEADER = "#spark-bpe merges checkpoint"
_NAME = re.compile(r"merges-(\d{9})\.txt$")
KEEP = 3


def fingerprint(cfg: Config, word_table_meta: dict, base_size: int) -> str:
    """What the merge sequence depends on (not the vocabulary size: a bigger one extends it)."""
    doc = {
        "pretokenizer": word_table_meta.get("pretokenizer"),
        "word_table": {k: word_table_meta.get(k) for k in ("input", "unique_words", "stats")},
        "alphabet": cfg.alphabet,
        "end_of_word_suffix": cfg.end_of_word_suffix,
        "base_size": base_size,
        "min_pair_count": cfg.min_pair_count,
        "max_token_bytes": cfg.max_token_bytes,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def render(merges: list[Merge], removed: list[int], fp: str) -> str:
    body = [f"{HEADER} v{VERSION}", f"#fingerprint {fp}", f"#merges {len(merges)}"]
    body += [f"{m.left} {m.right} {m.count} {r}" for m, r in zip(merges, removed)]
    text = "\n".join(body) + "\n"
    return text + f"#sha256 {hashlib.sha256(text.encode()).hexdigest()}\n"


def parse(text: str, base_size: int) -> tuple[str, list[Merge], list[int]]:
    """(fingerprint, merges, tokens removed by each); ValueError if corrupt or truncated."""
    lines = text.split("\n")
    if len(lines) < 5 or not lines[-2].startswith("#sha256 "):
        raise ValueError("truncated (no checksum line)")
    body = "\n".join(lines[:-2]) + "\n"
    if hashlib.sha256(body.encode()).hexdigest() != lines[-2].split()[1]:
        raise ValueError("checksum mismatch")
    if lines[0] != f"{HEADER} v{VERSION}":
        raise ValueError(f"unknown format {lines[0]!r}")
    fp = lines[1].split()[1]
    n = int(lines[2].split()[1])
    merges, removed = [], []
    for i, line in enumerate(lines[3 : 3 + n]):
        a, b, c, r = (int(x) for x in line.split())
        merges.append(Merge(a, b, base_size + i, c))
        removed.append(r)
    if len(merges) != n or len(lines) != n + 5:
        raise ValueError("merge count does not match header")
    return fp, merges, removed


class Checkpointer:
    def __init__(self, spark: SparkSession | None, directory: str, fp: str, base_size: int):
        self.spark, self.dir, self.fp, self.base_size = spark, directory, fp, base_size
        self.last_written = -1

    def _files(self) -> list[tuple[int, str]]:
        if fsutil.is_local(self.dir) or self.spark is None:
            import os

            d = fsutil.local_path(self.dir)
            names = os.listdir(d) if os.path.isdir(d) else []
        else:
            fs, p = fsutil._fs(self.spark, self.dir)
            names = [s.getPath().getName() for s in fs.listStatus(p)] if fs.exists(p) else []
        out = []
        for name in names:
            m = _NAME.match(name)
            if m:
                out.append((int(m.group(1)), fsutil.join(self.dir, name)))
        return sorted(out)

    def load(self) -> tuple[list[Merge], list[int]] | None:
        """The newest valid checkpoint: (merges, tokens removed by each), or None."""
        for _, path in reversed(self._files()):
            try:
                fp, merges, removed = parse(fsutil.read_text(self.spark, path), self.base_size)
            except (ValueError, IndexError) as exc:
                log.warning("checkpoint %s is corrupt (%s); trying the previous one", path, exc)
                continue
            if fp != self.fp:
                raise ConfigError(
                    f"checkpoint {path} belongs to a different config or corpus (fingerprint "
                    f"{fp}, this run {self.fp}); use another --checkpoint-dir or --output, or "
                    "start fresh with --resume never"
                )
            log.info("resuming from checkpoint %s (%d merges)", path, len(merges))
            self.last_written = len(merges)
            return merges, removed
        return None

    def save(self, merges: list[Merge], removed: list[int]) -> None:
        if len(merges) == self.last_written:
            return
        path = fsutil.join(self.dir, f"merges-{len(merges):09d}.txt")
        fsutil.mkdirs(self.spark, self.dir)
        fsutil.write_text(self.spark, path, render(merges, removed, self.fp))
        self.last_written = len(merges)
        for _, old in self._files()[:-KEEP]:
            fsutil.delete(self.spark, old)

    def clear(self) -> None:
        for _, path in self._files():
            fsutil.delete(self.spark, path)
