"""Benchmark the encode job against single-process tiktoken on the same text and run.

    python scripts/bench_encode.py --input PARQUET [--run RUN_DIR | --vocab-size N]
        [--master local[2]] [--cores 2] [--out-dir DIR] [--io auto,spark]

1. the run: ``--run``, or ``jobs/train.py`` on ``--input`` with ``--vocab-size`` (default 32768);
2. baseline: every row read with pyarrow into one process, tiktoken loaded from the run's export
   (``load_tiktoken``), one thread: the faster of a loop over ``encode_ordinary`` and
   ``encode_ordinary_batch(texts, num_threads=1)`` (whose thread pool costs time on short
   rows): tokens/s x ``--cores`` is what the cores could do with no plumbing at all
   (``encode_ordinary_batch(num_threads=cores)`` is measured too);
3. the job: ``jobs/encode.py --master local[2]`` in a fresh process: wall time (JVM start
   included) and the encode stage alone (``_encode.json`` seconds: read, Python, write);
4. the job again on the first 50 rows: the stage's fixed cost (Python workers starting,
   JIT, output commit), so the marginal rate (tokens / (stage - fixed)) shows what the job
   does at scale; 3 and 4 for each ``--encode-io`` setting in ``--io`` in turn (default:
   ``auto``, pyarrow in the tasks for local Parquet, then ``spark``, Spark's reader and writer);
5. the baseline again, so a noisy machine shows as two different baseline figures;
6. CPU seconds (user + system) of the baseline and of the job's whole process tree (driver,
   JVM, Python workers; polled from /proc): on a shared machine the fairest measure of what
   the plumbing costs. The job's marginal CPU is its CPU minus the 50-row job's;
7. peak memory: of each job's process tree (sum, PSS, and per process by role: JVM, Python
   driver, Python workers; ``proc_tree.TreeSampler``) and of the baseline's process (VmHWM;
   it holds every row in memory, so its text is given beside it), and of a streaming
   tiktoken (``--_stream``: one thread, one Parquet record batch at a time, read included in
   its seconds), the fair memory reference for a job that streams. Each baseline runs in its
   own fresh process, as each job does.

Prints a table and the ratios (target: stage tokens/s >= 0.5 x the baseline x cores) and writes
``bench_encode.json`` into ``--out-dir``. Token totals of the job and the baseline must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from proc_tree import TreeSampler  # noqa: E402

CPU: dict[str, object] = {}  # what -> CPU seconds (user + system): robust to a busy machine
MEM: dict[str, dict] = {}  # what -> peak memory (MB): of a job's process tree, of a baseline
WAYS: dict[str, list] = {}  # the single-thread ways' seconds, each time
BATCH_ROWS = 10_000  # rows per encode_ordinary_batch call (the texts stay in memory; the ids
# of 1 GB, kept as Python lists, would take about 9 GB)


def baseline_child(run_dir: str, corpus: str, column: str, threads: int) -> dict:
    """In the baseline's own process: tiktoken's time on every row. One thread: the faster of
    a plain loop over ``encode_ordinary`` and ``encode_ordinary_batch(num_threads=1)``, whose
    thread pool costs microseconds a row (2.4x the loop's time on the multilingual corpus's
    short rows); ``threads`` > 1: ``encode_ordinary_batch``. The rows are read first (not
    timed) and held in memory."""
    import pyarrow.dataset as ds

    from pipeline.outputs import load_tiktoken

    table = ds.dataset(corpus, format="parquet").to_table(columns=[column])
    texts = [t for t in table.column(0).to_pylist() if t]
    del table
    enc = load_tiktoken(run_dir, ignore_normalization=True)
    timings = []
    ways = ("loop", "batch") if threads == 1 else ("batch",)
    for way in ways:
        t0, c0 = time.perf_counter(), time.process_time()
        tokens = 0
        if way == "loop":
            for text in texts:
                tokens += len(enc.encode_ordinary(text))
        else:
            for i in range(0, len(texts), BATCH_ROWS):  # token lists dropped as counted
                out = enc.encode_ordinary_batch(texts[i:i + BATCH_ROWS], num_threads=threads)
                tokens += sum(map(len, out))
        timings.append((time.perf_counter() - t0, time.process_time() - c0, tokens, way))
    sec, cpu, tokens, way = min(timings)
    return {"seconds": sec, "cpu": cpu, "tokens": tokens, "rows": len(texts),
            "bytes": sum(len(t.encode()) for t in texts),
            "text_mb": round(sum(sys.getsizeof(t) for t in texts) / 2**20, 1),
            "peak_rss_mb": _vm_hwm_mb(), "ways": {w: round(t, 3) for t, _, _, w in timings}}


def stream_child(run_dir: str, corpus: str, column: str) -> dict:
    """In its own process: tiktoken over the corpus streamed one record batch at a time (files
    in path order), one thread, reading included: what a plain single-process script costs,
    in time and in memory, next to a job that streams too."""
    import pyarrow.dataset as ds

    from pipeline.outputs import load_tiktoken

    t0, c0 = time.perf_counter(), time.process_time()
    enc = load_tiktoken(run_dir, ignore_normalization=True)
    tokens = rows = 0
    for batch in ds.dataset(corpus, format="parquet").to_batches(columns=[column],
                                                                 batch_size=4096):
        for text in batch.column(0).to_pylist():
            if text:
                tokens += len(enc.encode_ordinary(text))
                rows += 1
    return {"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0,
            "tokens": tokens, "rows": rows, "peak_rss_mb": _vm_hwm_mb()}


def _vm_hwm_mb() -> float:
    """This process's peak RSS since its exec (VmHWM; ru_maxrss would start at the parent's)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def baseline(args: argparse.Namespace, run_dir: str, threads: int) -> dict:
    """tiktoken on every row with ``threads`` threads, in a fresh process (see
    :func:`baseline_child`); its CPU seconds, peak memory and ways recorded."""
    spec = json.dumps([run_dir, args.input, args.text_column, threads])
    res = subprocess.run([sys.executable, __file__, "--_baseline", spec], capture_output=True,
                         text=True, cwd=REPO)
    if res.returncode != 0:
        sys.exit(f"the tiktoken baseline failed:\n{res.stderr[-3000:]}")
    got = json.loads(res.stdout.splitlines()[-1])
    key = f"tiktoken_{threads}"
    CPU.setdefault(key, []).append(got["cpu"])
    WAYS.setdefault(key, []).append(got["ways"])
    MEM.setdefault(key, []).append({"peak_rss_mb": got["peak_rss_mb"],
                                    "rows_held_mb": got["text_mb"]})
    return got


def run(cmd: list[str], what: str = "") -> tuple[float, subprocess.CompletedProcess]:
    """Run a job in a fresh process. Its process tree (the driver, the JVM, the Python
    workers) is sampled from /proc every 0.1 s: CPU seconds and peak memory recorded under
    ``what``."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)
    sampler = TreeSampler(proc.pid, 0.1)
    sampler.start()
    stdout, stderr = proc.communicate()
    sec = time.perf_counter() - t0
    sampler.done.set()
    sampler.join()
    if what:
        tree = sampler.summary()
        CPU[what] = tree["cpu_tree_seconds"]
        MEM[what] = {"peak_tree_mb": tree["peak_tree_mb"],
                     "peak_tree_pss_mb": tree["peak_tree_pss_mb"],
                     **{role: r["peak_process_mb"] for role, r in tree["roles"].items()}}
    res = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{res.stderr[-3000:]}")
    return sec, res


def run_job(py: str, args: argparse.Namespace, run_dir: str, out: Path, io: str
            ) -> tuple[float, dict, dict]:
    """The encode job on the input and on its first 50 rows: (wall, stats, the 50 rows' stats)."""
    def job(src: str, dst: str, what: str) -> tuple[float, dict]:
        wall, _ = run([py, "jobs/encode.py", "--tokenizer", run_dir, "--input", src,
                       "--output", dst, "--master", args.master, "--text-column",
                       args.text_column, "--encode-io", io], what)
        return wall, json.loads((Path(dst) / "_encode.json").read_text())["stats"]

    wall, st = job(args.input, str(out / f"encoded-{io}"), f"job_{io}")
    _, tiny = job(str(out / "tiny"), str(out / f"encoded-tiny-{io}"), f"tiny_{io}")
    return wall, st, tiny


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", required=True)
    p.add_argument("--run", default="")
    p.add_argument("--vocab-size", type=int, default=32768)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--cores", type=int, default=0,
                   help="cores the job gets (default: N of local[N], else this machine's)")
    p.add_argument("--text-column", default="text")
    p.add_argument("--out-dir", default=str(REPO / "out" / "bench-encode"))
    p.add_argument("--io", default="auto,spark",
                   help="--encode-io settings to run, in turn (default: auto,spark)")
    args = p.parse_args()
    if args.cores <= 0:
        m = re.fullmatch(r"local\[(\d+)(?:,\d+)?\]", args.master)
        args.cores = int(m.group(1)) if m else os.cpu_count() or 1
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    run_dir = args.run
    if not run_dir:
        run_dir = str(out / "run")
        sec, _ = run([py, "jobs/train.py", "--input", args.input, "--output", run_dir,
                      "--vocab-size", str(args.vocab_size), "--master", args.master,
                      "--text-column", args.text_column])
        print(f"trained {run_dir} in {sec:.1f} s")

    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    first = baseline(args, run_dir, 1)
    b1, tokens, n_rows, n_bytes = first["seconds"], first["tokens"], first["rows"], first["bytes"]
    print(f"input: {n_rows:,} rows, {n_bytes / 1e6:.1f} MB")
    bn = baseline(args, run_dir, args.cores)["seconds"]
    (out / "tiny").mkdir(exist_ok=True)
    head = ds.dataset(args.input, format="parquet").head(50, columns=[args.text_column])
    pq.write_table(head, out / "tiny" / "part-0.parquet")
    jobs = {}
    for io in args.io.split(","):  # each way in turn, then the baseline again
        jobs[io] = run_job(py, args, run_dir, out, io)
    b2 = baseline(args, run_dir, 1)["seconds"]
    spec = json.dumps([run_dir, args.input, args.text_column])
    streamed = json.loads(subprocess.run(
        [sys.executable, __file__, "--_stream", spec], capture_output=True, text=True,
        cwd=REPO, check=True).stdout.splitlines()[-1])
    if streamed["tokens"] != tokens:
        sys.exit(f"token totals differ: streaming tiktoken {streamed['tokens']}, {tokens}")
    MEM["tiktoken_streaming"] = {"peak_rss_mb": streamed["peak_rss_mb"]}
    CPU["tiktoken_streaming"] = streamed["cpu"]
    single = tokens / min(b1, b2)
    ideal = single * args.cores
    print(f"{tokens:,} tokens; machine load average {os.getloadavg()[0]:.1f}")
    print(f"{'what':58} {'seconds':>8} {'tokens/s':>12}")
    rows = [
        ("tiktoken, 1 thread (best of 2, each the faster way)", min(b1, b2),
         tokens / min(b1, b2)),
        (f"  x {args.cores} cores (the target's reference)", min(b1, b2) / args.cores, ideal),
        (f"tiktoken encode_ordinary_batch, {args.cores} threads", bn, tokens / bn),
        ("tiktoken streaming the files, 1 thread, reading included", streamed["seconds"],
         tokens / streamed["seconds"]),
    ]
    for name, sec, rate in rows:
        print(f"{name:58} {sec:8.2f} {rate:12,.0f}")
    tk_cpu = min(CPU["tiktoken_1"])
    results = {}
    for io, (wall, st, tiny) in jobs.items():
        if st["tokens"] != tokens:
            sys.exit(f"token totals differ: job ({io}) {st['tokens']}, tiktoken {tokens}")
        marginal = (tokens - tiny["tokens"]) / max(st["seconds"] - tiny["seconds"], 1e-9)
        job = f"encode job {args.master}, --encode-io {io} ({st['io']})"
        for name, sec, rate in [
            (f"{job}: stage", st["seconds"], tokens / st["seconds"]),
            (f"{job}: wall", wall, tokens / wall),
            (f"{job}: stage on 50 rows", tiny["seconds"], tiny["tokens"] / tiny["seconds"]),
            (f"{job}: marginal", st["seconds"] - tiny["seconds"], marginal),
        ]:
            print(f"{name:58} {sec:8.2f} {rate:12,.0f}")
        r = {"stage": (tokens / st["seconds"]) / ideal, "marginal": marginal / ideal,
             "wall": (tokens / wall) / ideal}
        print(f"  ratio to {args.cores} x tiktoken: stage {r['stage']:.2f}, marginal "
              f"{r['marginal']:.2f}, wall {r['wall']:.2f}   (target: stage >= 0.5)")
        print(f"  python encode seconds (sum over tasks): {st['python_encode_seconds']}, "
              f"partitions {st['partitions']}")
        job_cpu = CPU[f"job_{io}"] - CPU[f"tiny_{io}"] * (1 - tiny["tokens"] / tokens)
        print(f"  CPU seconds: tiktoken {tk_cpu:.2f}; job {CPU[f'job_{io}']:.2f} (JVM start "
              f"included), on 50 rows {CPU[f'tiny_{io}']:.2f}, marginal {job_cpu:.2f}; ratio "
              f"tiktoken / job marginal {tk_cpu / job_cpu:.2f}")
        mem = MEM[f"job_{io}"]
        print(f"  peak RSS (MB): process tree {mem['peak_tree_mb']:,.0f} (PSS "
              f"{mem['peak_tree_pss_mb']:,.0f}); largest process: " + ", ".join(
                  f"{role} {mem[role]:,.0f}" for role in ("jvm", "python driver",
                                                          "python workers") if role in mem))
        results[io] = {"job_stage_seconds": st["seconds"], "job_wall_seconds": wall,
                       "job_fixed_stage_seconds": tiny["seconds"], "ratio_stage": r["stage"],
                       "ratio_marginal": r["marginal"], "ratio_wall": r["wall"],
                       "job_stats": st}
    tk_mem = max(MEM["tiktoken_1"], key=lambda m: m["peak_rss_mb"])
    print(f"peak RSS (MB): tiktoken streaming the files {streamed['peak_rss_mb']:,.0f} (the "
          f"fair reference); tiktoken holding every row {tk_mem['peak_rss_mb']:,.0f} "
          f"({tk_mem['rows_held_mb']:,.0f} of Python strings)")
    (out / "bench_encode.json").write_text(json.dumps({
        "input": args.input, "run": run_dir, "rows": n_rows, "bytes": n_bytes,
        "tokens": tokens, "tiktoken_1_thread_seconds": [b1, b2],
        "tiktoken_n_threads_seconds": bn, "tiktoken_streaming": streamed, "jobs": results,
        "cores": args.cores,
        "load_average": os.getloadavg(), "cpu_seconds": CPU, "peak_memory_mb": MEM,
        "tiktoken_ways_seconds": WAYS,
    }, indent=2))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--_baseline"]:
        print(json.dumps(baseline_child(*json.loads(sys.argv[2]))))
        sys.exit(0)
    if sys.argv[1:2] == ["--_stream"]:
        print(json.dumps(stream_child(*json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(main())
