"""Benchmark training end to end, the merge stage, the Spark engine, and driver memory.

    .venv/bin/python scripts/bench_train.py [--corpus DIR] [--vocab-size 32768] [--repeat 3]
        [--spark-merges N] [--skip-rss]

Measured in one run, interleaved, medians:
1. end to end: ``spark-submit jobs/train.py --input CORPUS`` (JVM + session start, count,
   merges, outputs: the wall time a user waits) vs Hugging Face ``tokenizers`` (rows)
   and rustbpe ``train_from_iterator`` at the same vocab size and split pattern;
2. merge stage alone: our local engine on the word table vs tokenizers' merge stage (its
   full-vocab time minus its vocab-257 time, same run);
3. the Spark engine forced for ``--spark-merges`` merges: rounds, merges per round, seconds per
   round, and an empty Spark job's time on the same session (the latency share);
4. driver peak RSS for 3 corpus sizes (a quarter, half and all of the shards).

Not like for like (BENCHMARKS.md, the fairness rules): the references train in this process
on rows already in memory, in a fixed order, without our special token or writing a
tokenizer, while ours reads Parquet, starts a JVM and writes every export; no memory is
measured. ``scripts/bench_scale.py`` is the fair comparison.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from bench_common import (  # noqa: E402
    DEFAULT_CORPUS,
    REPO,
    corpus_texts,
    fmt_row,
    hf_train_rows,
    median,
    rustbpe_train,
    timed,
)


def submit(args: list[str], env: dict[str, str]) -> float:
    cmd = [str(REPO / ".venv" / "bin" / "spark-submit"), "--master", "local[2]",
           str(REPO / "jobs" / "train.py"), *args, "--no-progress-bar"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        errors = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()]
        raise RuntimeError(f"train job failed: {errors[-5:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--vocab-size", type=int, default=32768)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--spark-merges", type=int, default=4000)
    ap.add_argument("--skip-rss", action="store_true")
    ap.add_argument("--merge-stage-only", metavar="WORDS_DIR", default="",
                    help="only table 2 (merge stage vs tokenizers), on this word table")
    args = ap.parse_args()
    py = str(REPO / ".venv" / "bin" / "python")
    env = {**os.environ, "PYSPARK_PYTHON": py, "PYSPARK_DRIVER_PYTHON": py,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    tmp = tempfile.mkdtemp(prefix="bench-train-")
    texts = corpus_texts(args.corpus)
    nbytes = sum(len(t.encode()) for t in texts)
    V = args.vocab_size

    # 1 + 2: end to end and merge stage, interleaved: in every repetition ours (end to end,
    # then the merge stage alone on the first run's word table), tokenizers, rustbpe
    import numpy as np
    import pyarrow.parquet as pq

    from pipeline.engines.local import LocalTrainer

    loaded: list = []
    local_merges: list = []  # the local engine's merge list, for the Spark comparison

    def our_merge_stage(words_dir: str) -> float:
        if not loaded:
            table = pq.read_table(os.path.join(words_dir, "data")).sort_by("first_seen")
            words = table.column("word").to_pylist()
            loaded[:] = [np.frombuffer(b"".join(words), dtype=np.uint8),
                         np.array([len(w) for w in words]), table.column("count").to_numpy()]
        flat, lengths, counts = loaded
        t0 = time.perf_counter()
        lt = LocalTrainer(flat, lengths, counts, [bytes([i]) for i in range(256)])
        lt.train(V - 257)
        seconds = time.perf_counter() - t0
        local_merges[:] = lt.merges
        return seconds

    ours, hf_full, hf_257, rust, merge_times = [], [], [], [], []
    words_dir = args.merge_stage_only or os.path.join(tmp, "run-0", "words")
    for i in range(args.repeat):
        if not args.merge_stage_only:
            run = os.path.join(tmp, f"run-{i}")
            ours.append(submit(["--input", args.corpus, "--output", run, "--vocab-size",
                                str(V)], env))
        merge_times.append(our_merge_stage(words_dir))
        hf_full.append(timed(lambda: hf_train_rows(texts, V))[0])
        hf_257.append(timed(lambda: hf_train_rows(texts, 257))[0])
        if not args.merge_stage_only:
            rust.append(timed(lambda: rustbpe_train(texts, V))[0])
            print(f"run {i + 1}: ours {ours[-1]:.1f} s (merge stage {merge_times[-1]:.1f} s), "
                  f"tokenizers {hf_full[-1]:.1f} s (257: {hf_257[-1]:.1f} s), rustbpe "
                  f"{rust[-1]:.1f} s", flush=True)
    if not args.merge_stage_only:
        stats = json.loads(Path(tmp, f"run-{args.repeat - 1}", "stats.json").read_text())
    n_merges = len(local_merges)
    hf_merge = [a - b for a, b in zip(hf_full, hf_257)]
    if args.merge_stage_only:
        print("\n| merge stage | median | vs tokenizers | runs |\n|---|---|---|---|")
        print(fmt_row(f"spark-bpe local engine, {n_merges} merges", merge_times,
                      median(hf_merge)))
        print(fmt_row("HF tokenizers (vocab V run minus vocab 257 run)", hf_merge,
                      median(hf_merge)))
        shutil.rmtree(tmp, ignore_errors=True)
        return

    print()
    print(f"corpus {args.corpus}: {len(texts)} rows, {nbytes / 1e6:.1f} MB, "
          f"{stats['words_in_table']} unique words (cl100k); vocab {V}; local[2]; "
          f"{os.cpu_count()} cores")
    print("\n| end to end | median | vs tokenizers | runs |\n|---|---|---|---|")
    print(fmt_row("spark-submit jobs/train.py (JVM start included)", ours, median(hf_full)))
    print(fmt_row(f"HF tokenizers train_from_iterator(rows), vocab {V}", hf_full, median(hf_full)))
    print(fmt_row(f"rustbpe train_from_iterator, vocab {V}", rust, median(hf_full)))
    print(f"our last run's stages (s): {json.dumps(stats['stage_seconds'])}")
    print("\n| merge stage | median | vs tokenizers | runs |\n|---|---|---|---|")
    print(fmt_row(f"spark-bpe local engine, {n_merges} merges", merge_times,
                  median(hf_merge)))
    print(fmt_row("HF tokenizers (vocab V run minus vocab 257 run)", hf_merge, median(hf_merge)))

    # 3: the Spark engine forced
    if args.spark_merges:
        from pipeline.config import Config
        from pipeline.spark_session import build_session
        from pipeline.train import train

        spark = build_session(Config(master="local[2]"), "bench-spark-engine",
                              {"spark.ui.enabled": "false"})
        sc = spark.sparkContext
        empty = []
        for _ in range(10):
            t0 = time.perf_counter()
            sc.parallelize([0, 1], 2).map(lambda x: x).count()
            empty.append(time.perf_counter() - t0)
        cfg = Config(words=words_dir, output=os.path.join(tmp, "spark-run"),
                     num_merges=args.spark_merges, engine="spark", progress_bar=False,
                     log_level="WARNING")
        t0 = time.perf_counter()
        res = train(spark, cfg)
        spark_s = time.perf_counter() - t0
        st = res.stats
        spark.stop()
        local_prefix = [(m.left, m.right) for m in local_merges[: len(res.merges)]]
        same = local_prefix == [(m.left, m.right) for m in res.merges]
        per_round = st["spark_seconds_per_round_median"]
        print(f"\nSpark engine forced, {len(res.merges)} merges: {st['spark_rounds']} rounds "
              f"(merges/round {st['spark_merges_per_round']}), {spark_s:.1f} s in all, "
              f"median {per_round:.3f} s per round; empty job {median(empty):.3f} s "
              f"(= {100 * median(empty) / per_round:.0f}% of a round); "
              f"{st['spark_refresh_jobs']} key-refresh jobs; identical to local engine: {same}")

    # 4: driver memory vs corpus size
    if not args.skip_rss:
        shards = sorted(glob.glob(os.path.join(args.corpus, "*.parquet")))
        print("\n| shards | MB of text | unique words | driver peak RSS (Python) |")
        print("|---|---|---|---|")
        for k in sorted({max(1, len(shards) // 4), max(1, len(shards) // 2), len(shards)}):
            sub = os.path.join(tmp, f"sub-{k}")
            os.makedirs(sub, exist_ok=True)
            for s in shards[:k]:
                os.symlink(os.path.abspath(s), os.path.join(sub, os.path.basename(s)))
            out = os.path.join(tmp, f"rss-{k}")
            submit(["--input", sub, "--output", out, "--vocab-size", str(V)], env)
            st = json.loads(Path(out, "stats.json").read_text())
            mb = sum(len(t.encode()) for t in corpus_texts(sub)) / 1e6
            print(f"| {k} | {mb:.1f} | {st['words_in_table']} | "
                  f"{st['driver_peak_rss_mb']:.0f} MB |")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n(medians of {args.repeat} interleaved runs)")


if __name__ == "__main__":
    main()
