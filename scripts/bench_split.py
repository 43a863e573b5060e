"""The split and the per-row counting of one count task, on one core, in one process.

    .venv/bin/python scripts/bench_split.py PARQUET_FILE [--pattern cl100k] [--repeat 3]

Reads the file's text column with pyarrow, then times, over all its rows, interleaved per
repetition: the ``regex`` package's ``findall`` of the named pattern (what the split cost
before the ``re`` translation), the Pretokenizer's split (the ``re`` translation on BMP text),
and ``WordCounter.add_row`` (split, dict counting and first occurrences: a count task's work
per row). Prints MB/s of UTF-8 text (medians) and checks that both splits give the same words.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow.parquet as pq  # noqa: E402
import regex  # noqa: E402

from pipeline.patterns import PATTERNS, in_bmp  # noqa: E402
from pipeline.pretokenize import Pretokenizer, PretokenizerSpec, WordCounter  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("parquet")
    ap.add_argument("--pattern", default="cl100k", choices=sorted(PATTERNS))
    ap.add_argument("--text-column", default="text")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rows = [r for r in pq.read_table(args.parquet, columns=[args.text_column])
            .column(0).to_pylist() if r]
    mb = sum(len(r.encode("utf-8", "surrogateescape")) for r in rows) / 1e6
    pre = Pretokenizer(PretokenizerSpec(args.pattern))
    full = regex.compile(PATTERNS[args.pattern]).findall

    def split_regex() -> None:
        for r in rows:
            full(r)

    def split_ours() -> None:
        for r in rows:
            pre.split_chunks((r,))

    def count_rows() -> None:
        wc = WordCounter(pre, max_word_bytes=1024)
        for i, r in enumerate(rows):
            wc.add_row(i, r)

    timings: dict[str, list[float]] = {"regex findall": [], "our split": [], "add_row": []}
    for _ in range(args.repeat):
        for name, fn in zip(timings, (split_regex, split_ours, count_rows)):
            t0 = time.perf_counter()
            fn()
            timings[name].append(time.perf_counter() - t0)
    same = all(full(r) == pre.split_chunks((r,)) for r in rows)
    print(f"{args.parquet}: {len(rows):,} rows, {mb:.1f} MB, "
          f"{sum(not r.isascii() for r in rows):,} rows with non-ASCII text, "
          f"{sum(not in_bmp(r) for r in rows):,} with characters above U+FFFF; "
          f"pattern {args.pattern}, {args.repeat} repetitions (medians), same words: {same}")
    base = statistics.median(timings["regex findall"])
    for name, secs in timings.items():
        med = statistics.median(secs)
        print(f"  {name:14s} {med:7.2f} s  {mb / med:6.1f} MB/s  {base / med:5.2f}x the regex "
              f"split's speed")


if __name__ == "__main__":
    main()
