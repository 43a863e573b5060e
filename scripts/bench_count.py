"""Benchmark the word-count stage against Hugging Face tokenizers and rustbpe, same run.

    .venv/bin/python scripts/bench_count.py [--corpus DIR] [--repeat 3] [--master local[2]]

Ours: ``count_words`` (Spark, the full stage: read, split, count, first_seen ranks, write the
word table), timed after the Spark session is up (session start reported separately).
References: ``tokenizers`` and rustbpe ``train_from_iterator`` over our rows, both asked for
vocab 257 (one merge) so their time is the pre-tokenize + count stage; same split pattern.
Runs are interleaved; medians and ratios are printed.

Not like for like (BENCHMARKS.md, the fairness rules): the references train in this process
on rows already in memory, in a fixed order, without our special token or writing a
tokenizer, while ours reads Parquet, starts a JVM and writes every export; no memory is
measured. ``scripts/bench_scale.py`` is the fair comparison.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from bench_common import (  # noqa: E402
    DEFAULT_CORPUS,
    corpus_texts,
    fmt_row,
    hf_train_rows,
    median,
    rustbpe_train,
    timed,
)

from pipeline.config import Config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--pattern", default="cl100k")
    args = ap.parse_args()

    from pipeline.count.word_count import count_words
    from pipeline.spark_session import build_session

    tmp = tempfile.mkdtemp(prefix="bench-count-")
    texts = corpus_texts(args.corpus)
    nbytes = sum(len(t.encode()) for t in texts)

    t0 = time.perf_counter()
    spark = build_session(Config(master=args.master), "bench-count",
                          {"spark.ui.enabled": "false"})
    session_s = time.perf_counter() - t0

    ours, hf, rust = [], [], []
    unique = None
    for i in range(args.repeat):
        out = os.path.join(tmp, f"words-{i}")
        cfg = Config(input=args.corpus, output=out, pattern=args.pattern)
        s, wt = timed(lambda cfg=cfg: count_words(spark, cfg))
        ours.append(s)
        unique = wt.meta["unique_words"]
        hf.append(timed(lambda: hf_train_rows(texts, 257, args.pattern))[0])
        rust.append(timed(lambda: rustbpe_train(texts, 257, args.pattern))[0])
        print(f"run {i + 1}: ours {ours[-1]:.1f} s, tokenizers {hf[-1]:.1f} s, "
              f"rustbpe {rust[-1]:.1f} s", flush=True)
    spark.stop()
    shutil.rmtree(tmp, ignore_errors=True)

    ref = median(hf)
    print()
    print(f"corpus {args.corpus}: {len(texts)} rows, {nbytes / 1e6:.1f} MB, {unique} unique "
          f"words ({args.pattern}); master {args.master}; {os.cpu_count()} cores")
    print(f"Spark session start (not included below): {session_s:.1f} s")
    print("| word count stage | median | vs tokenizers | runs |")
    print("|---|---|---|---|")
    print(fmt_row("spark-bpe count_words", ours, ref))
    print(fmt_row("HF tokenizers train_from_iterator(rows), vocab 257", hf, ref))
    print(fmt_row("rustbpe train_from_iterator, vocab 257", rust, ref))
    print(f"ours / rustbpe: {median(ours) / median(rust):.2f}x; "
          f"ours throughput {nbytes / 1e6 / median(ours):.1f} MB/s")


if __name__ == "__main__":
    main()
