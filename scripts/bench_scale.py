"""Ours vs Hugging Face tokenizers vs rustbpe at scale: wall time and peak memory of the whole
process tree, side by side in one run, interleaved (each repetition starts with the next tool
in turn, so that a drift of the machine's speed does not always fall on the same tool).

    .venv/bin/python scripts/bench_scale.py [CORPUS ...] [--vocab-size 32768] [--repeat 1]
        [--tools ours,tokenizers,rustbpe] [--with-count-stage] [--ours-args "..."]
        [--spark-args "..."] [--json out/bench_scale.json] [--plot out/bench_scale.svg]

Every run is a fresh subprocess: ours is ``spark-submit --master local[2] jobs/train.py``
(launcher, JVM, Python driver, Python workers); a reference is this script in ``--_ref`` mode
(``tokenizers`` / rustbpe ``train_from_iterator`` over the Parquet rows streamed in corpus
order, given our default special token and writing their tokenizer inside the timed run, see
bench_common; a run that ends with fewer tokens than asked for is marked ``short_vocab``).
Every ~0.2 s the whole process tree's VmRSS is read from /proc: the peak
of the tree's sum, and per-process peaks grouped by role (jvm, python driver, python
workers, launcher, reference). RSS sums count pages shared after fork (the PySpark daemon and
its workers) and shared libraries mapped by several processes once per process, so the tree's
proportional set size (PSS, ``/proc/PID/smaps_rollup``: each shared page divided among the
processes that map it) is sampled too: the peak of its sum is what the tree costs the
machine. The largest process is the larger of each sampled process's VmHWM (its exact
high-water mark) and ``os.wait4``'s ru_maxrss (exact too, but only of the processes the
launcher reaps: not the PySpark workers; and never below this script's own peak, which exec
hands down). CPU s is the user + sys time of every process of
the tree as last sampled from /proc (``wait4``'s figure, in ``cpu_seconds``, leaves out the
PySpark workers, which the launcher never reaps; a process's last ~0.2 s can be missed); it is
less sensitive than wall time to a busy machine. Ours also reports RUN_DIR/stats.json (stage
seconds, engine, rounds, merges per round, driver peak RSS). ``--with-count-stage`` adds a
vocab-257 run of each reference (its pre-tokenize + count stage). A failing run is recorded
with its exit code and the end of its stderr. Results, with the commit and the tools'
versions, are rewritten to the JSON file after every run. The report ends with ours against
each reference: ratios of the medians, and each repetition's pair.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import (  # noqa: E402
    DEFAULT_CORPUS,
    REPO,
    SPECIALS,
    corpus_files,
    hf_train_rows,
    iter_rows,
    rustbpe_train,
)
from proc_tree import TreeSampler  # noqa: E402

PY = str(REPO / ".venv" / "bin" / "python")
SPARK_SUBMIT = str(REPO / ".venv" / "bin" / "spark-submit")
DEFAULT_CORPORA = [str(DEFAULT_CORPUS), "/work/scale/c1g", "/work/scale/c4g"]
TOOLS = ("ours", "tokenizers", "rustbpe")
COLORS = {"ours": "#d62728", "tokenizers": "#1f77b4", "rustbpe": "#2ca02c"}


def run_measured(cmd: list[str], env: dict[str, str], log: Path, interval: float) -> dict:
    t0 = time.perf_counter()
    with open(f"{log}.out", "wb") as out, open(f"{log}.err", "wb") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, cwd=REPO)
    sampler = TreeSampler(proc.pid, interval)
    sampler.start()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    sampler.done.set()
    sampler.join()
    res = {"cmd": shlex.join(cmd), "exit_code": proc.returncode, "wall_seconds": round(wall, 2),
           "cpu_seconds": round(ru.ru_utime + ru.ru_stime, 1),
           "ru_maxrss_mb": round(ru.ru_maxrss / 1024, 1), **sampler.summary()}
    res["largest_process_mb"] = max(res["ru_maxrss_mb"], res["peak_process_mb"])
    if proc.returncode != 0:  # our jobs log their error to stdout, the references to stderr
        for name in ("out", "err"):
            tail = Path(f"{log}.{name}").read_text(errors="replace").splitlines()[-15:]
            res[f"std{name}_tail"] = tail
            res.setdefault("error", next((ln for ln in reversed(tail) if "rror" in ln), None))
    return res


# ---------------------------------------------------------------- the runs

def ref_main(tool: str, corpus: str, vocab: int, pattern: str, out: str) -> None:
    """Inside the reference's own subprocess: train with our default special tokens, write the
    tokenizer (as ours writes its exports), report seconds, the vocabulary and own peak RSS."""
    t0 = time.perf_counter()
    train = hf_train_rows if tool == "tokenizers" else rustbpe_train
    save = Path(f"{out}.tokenizer")
    save.mkdir(exist_ok=True)
    n = train(iter_rows(corpus), vocab, pattern, SPECIALS, str(save))
    secs = time.perf_counter() - t0
    Path(out).write_text(json.dumps({
        "train_seconds": round(secs, 2), "vocab_size": n,
        "self_ru_maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }))


def run_ref(tool: str, corpus: str, vocab: int, args, work: Path, tag: str) -> dict:
    out = work / f"{tag}.json"
    cmd = [PY, os.path.abspath(__file__), "--_ref", tool, "--vocab-size", str(vocab),
           "--pattern", args.pattern, "--_out", str(out), corpus]
    res = run_measured(cmd, dict(os.environ), work / tag, args.interval)
    if res["exit_code"] == 0 and out.exists():
        res.update(json.loads(out.read_text()))
        if res["vocab_size"] != vocab:  # stopped early: less work, not a faster trainer
            res["short_vocab"] = True
    shutil.rmtree(f"{out}.tokenizer", ignore_errors=True)
    return res


def run_ours(corpus: str, args, work: Path, tag: str) -> dict:
    run_dir = work / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [SPARK_SUBMIT, "--master", "local[2]", *shlex.split(args.spark_args),
           str(REPO / "jobs" / "train.py"), "--input", corpus, "--output", str(run_dir),
           "--vocab-size", str(args.vocab_size), "--pattern", args.pattern, "--no-progress-bar",
           *shlex.split(args.ours_args)]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": PY,
           "PYSPARK_DRIVER_PYTHON": PY}
    res = run_measured(cmd, env, work / tag, args.interval)
    stats_path = run_dir / "stats.json"
    if stats_path.exists():
        st = json.loads(stats_path.read_text())
        res.update({k: st.get(k) for k in ("stage_seconds", "engine", "spark_rounds",
                                           "spark_merges_per_round", "driver_peak_rss_mb",
                                           "words_in_table", "symbols_in_table", "merges")})
        res["vocab_size"] = st.get("vocab_size")
        if res["vocab_size"] != args.vocab_size:
            res["short_vocab"] = True
    if not args.keep_runs:
        shutil.rmtree(run_dir, ignore_errors=True)
    return res


def corpus_info(corpus: str) -> dict:
    """Rows and MB of text, read in a subprocess: a child's ru_maxrss starts at its parent's
    peak RSS (exec takes over the parent's high-water mark), so this process stays small."""
    out = subprocess.run([PY, os.path.abspath(__file__), "--_info", corpus], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def _corpus_info(corpus: str) -> dict:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rows = nbytes = 0
    for f in corpus_files(corpus):
        pf = pq.ParquetFile(f)
        rows += pf.metadata.num_rows
        for i in range(pf.num_row_groups):
            col = pf.read_row_group(i, columns=["text"]).column(0)
            nbytes += pc.sum(pc.binary_length(col.cast("binary"))).as_py() or 0
    return {"path": corpus, "rows": rows, "mb": round(nbytes / 1e6, 1)}


def provenance() -> dict:
    """What was measured: the code (commit, and whether the tree had changes) and the versions
    of the tools, recorded with the results rather than written down by hand."""
    from importlib.metadata import PackageNotFoundError, version

    def git(*a: str) -> str:
        r = subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""

    def ver(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    except OSError:
        java = ""
    return {"commit": git("rev-parse", "HEAD"),
            "changed_files": git("status", "--porcelain", "--untracked-files=no").splitlines(),
            "python": platform.python_version(), "java": (java.splitlines() or [""])[0],
            **{name: ver(name) for name in ("pyspark", "tokenizers", "rustbpe", "tiktoken")}}


# ---------------------------------------------------------------- reporting

def ratios(results: dict) -> str:
    """Ours against each reference per corpus: the ratio of the medians of wall time, of the
    tree's peak PSS and of the largest process, and the wall-time ratio of each repetition's
    pair, which shows the spread a single ratio hides. Runs that ended short of the
    vocabulary (less work, not a faster trainer) are left out."""
    out = ["| corpus | ours vs | wall, ratio of medians | wall, each repetition's pair | "
           "tree PSS | largest process |", "|---|---|---:|---|---:|---:|"]
    for c in results["corpora"]:
        def runs(tool: str) -> list[dict]:
            return [r for r in results["runs"] if r["corpus"] == c["path"] and r["tool"] == tool
                    and r["vocab"] == results["vocab_size"] and r["exit_code"] == 0
                    and not r.get("short_vocab")]
        ours = runs("ours")
        for ref in results["tools"]:
            theirs = runs(ref)
            if ref == "ours" or not ours or not theirs:
                continue
            by_rep = {_pair_key(r): r["wall_seconds"] for r in theirs}
            pairs = [r["wall_seconds"] / by_rep[_pair_key(r)] for r in ours
                     if _pair_key(r) in by_rep]

            def q(key: str) -> str:
                a, b = _med(ours, key), _med(theirs, key)
                return f"{a / b:.2f}x" if a and b else "—"
            out.append(f"| {Path(c['path']).name} | {ref} | {q('wall_seconds')} | "
                       + ", ".join(f"{x:.2f}x" for x in pairs)
                       + (f" (min {min(pairs):.2f}x, max {max(pairs):.2f}x)"
                          if len(pairs) > 1 else "")
                       + f" | {q('peak_tree_pss_mb')} | {q(LARGEST)} |")
    return "\n".join(out)


LARGEST = "largest_process_mb"


def _largest(r: dict) -> dict:
    """A run with ``largest_process_mb`` (results written before it had only ru_maxrss)."""
    return r if LARGEST in r or "ru_maxrss_mb" not in r else {**r, LARGEST: r["ru_maxrss_mb"]}


def _pair_key(r: dict) -> tuple:
    """What pairs a run of ours with a reference's: the same repetition of the same results
    file (files merged with --merge number their repetitions each from 1)."""
    return r.get("from_file", ""), r["repeat"]


def _med(runs: list[dict], key: str) -> float | None:
    runs = [_largest(r) for r in runs]
    xs = [r[key] for r in runs if r.get("exit_code") == 0 and r.get(key) is not None
          and not r.get("short_vocab")]
    return statistics.median(xs) if xs else None


def _f(x, fmt: str = "{:.1f}") -> str:
    return "—" if x is None else fmt.format(x)


def table(results: dict) -> str:
    out = ["| corpus | MB | tool | wall s | CPU s | train s | count stage s | peak RSS, tree | "
           "peak PSS, tree | peak per process (by role) | largest process | notes |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    for c in results["corpora"]:
        for tool in results["tools"]:
            runs = [r for r in results["runs"] if r["corpus"] == c["path"] and r["tool"] == tool
                    and r["vocab"] == results["vocab_size"]]
            if not runs:
                continue
            ok = [r for r in runs if r["exit_code"] == 0]
            last = (ok or runs)[-1]
            count = [r for r in results["runs"] if r["corpus"] == c["path"]
                     and r["tool"] == tool and r["vocab"] == 257]
            count_s = _med(count, "train_seconds")
            if tool == "ours":
                count_s = _med([{**r, "count": (r.get("stage_seconds") or {}).get("count_words")}
                                for r in ok], "count")
            roles = "; ".join(f"{k} {v['peak_process_mb']:.{0 if v['peak_process_mb'] > 9 else 1}f}"
                              + (f" (x{v['processes']}, sum {v['peak_sum_mb']:.0f})"
                                 if v["processes"] > 1 else "")
                              for k, v in sorted(last["roles"].items()))
            notes = [f"FAILED exit {r['exit_code']}: {(r.get('error') or '')[:120]}"
                     for r in runs if r["exit_code"] != 0]
            notes += [f"SHORT VOCAB {r.get('vocab_size')} (run {r['repeat']})"
                      for r in ok if r.get("short_vocab")]
            if unread := sum(r.get("pss_unread", 0) for r in ok):
                notes.append(f"PSS unreadable in {unread} process samples")
            if tool == "ours" and last.get("stage_seconds"):
                st = last["stage_seconds"]
                notes.append("last run's stages " + ", ".join(f"{k} {v:.1f}" for k, v in st.items()
                                                   if isinstance(v, (int, float))))
                notes.append(f"engine {last.get('engine')}, {last.get('spark_rounds')} rounds, "
                             f"driver_peak_rss_mb {last.get('driver_peak_rss_mb')}")
            # the CPU of every process in the tree where sampled, else the launcher's wait4
            cpu = "cpu_tree_seconds" if all("cpu_tree_seconds" in r for r in ok) else "cpu_seconds"
            if len(ok) > 1:
                notes.append("runs " + ", ".join(f"{r['wall_seconds']:.0f}" for r in ok))
            out.append(f"| {Path(c['path']).name} | {c['mb']:,.0f} | {tool} | "
                       f"{_f(_med(runs, 'wall_seconds'))} | {_f(_med(runs, cpu))} | "
                       f"{_f(_med(runs, 'train_seconds'))} | "
                       f"{_f(count_s)} | {_f(_med(runs, 'peak_tree_mb'), '{:,.0f} MB')} | "
                       f"{_f(_med(runs, 'peak_tree_pss_mb'), '{:,.0f} MB')} | "
                       f"{roles} | {_f(_med(runs, LARGEST), '{:,.0f} MB')} | "
                       f"{'; '.join(notes)} |")
    return "\n".join(out)


def _ticks(lo: float, hi: float) -> list[float]:
    import math
    for mantissas in ((1, 2, 5), (1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9)):
        out = [m * 10 ** e for e in range(math.floor(math.log10(lo)) - 1,
                                          math.ceil(math.log10(hi)) + 1)
               for m in mantissas if lo <= m * 10 ** e <= hi]
        if len(out) >= 3:
            break
    return out


def svg_plot(results: dict) -> str:
    """Two log-log panels: wall time and peak RSS of the tree against corpus size."""
    import math
    W, H, PW, PH, L, T, GAP = 1040, 405, 360, 300, 80, 50, 110
    series = {}
    for tool in results["tools"]:
        pts = []
        for c in results["corpora"]:
            runs = [r for r in results["runs"] if r["corpus"] == c["path"] and r["tool"] == tool
                    and r["vocab"] == results["vocab_size"]]
            t, m = _med(runs, "wall_seconds"), _med(runs, "peak_tree_mb")
            if t and m:
                pts.append((c["mb"], t, m))
        if pts:
            series[tool] = pts
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'font-family="sans-serif" font-size="12"><rect width="100%" height="100%" '
             f'fill="white"/><text x="{W / 2}" y="22" text-anchor="middle" font-size="15">'
             f'BPE training, vocab {results["vocab_size"]:,}: time and peak memory vs corpus '
             f'size</text>']
    xs = [p[0] for s in series.values() for p in s] or [1, 10]
    panels = [(1, "wall time (s)"), (2, "peak RSS, process tree (MB)")]
    for panel, (idx, label) in enumerate(panels):
        ys = [p[idx] for s in series.values() for p in s] or [1, 10]
        x0, y0 = L + panel * (PW + GAP), T
        xlo, xhi, ylo, yhi = min(xs) / 1.5, max(xs) * 1.5, min(ys) / 1.5, max(ys) * 1.5
        fx = lambda v: x0 + PW * math.log(v / xlo) / math.log(xhi / xlo)  # noqa: E731
        fy = lambda v: y0 + PH - PH * math.log(v / ylo) / math.log(yhi / ylo)  # noqa: E731
        parts.append(f'<rect x="{x0}" y="{y0}" width="{PW}" height="{PH}" fill="none" '
                     f'stroke="#333"/>')
        for v in _ticks(xlo, xhi):
            parts.append(f'<line x1="{fx(v):.1f}" x2="{fx(v):.1f}" y1="{y0}" y2="{y0 + PH}" '
                         f'stroke="#ddd"/><text x="{fx(v):.1f}" y="{y0 + PH + 16}" '
                         f'text-anchor="middle">{v:g}</text>')
        for v in _ticks(ylo, yhi):
            parts.append(f'<line x1="{x0}" x2="{x0 + PW}" y1="{fy(v):.1f}" y2="{fy(v):.1f}" '
                         f'stroke="#ddd"/><text x="{x0 - 6}" y="{fy(v) + 4:.1f}" '
                         f'text-anchor="end">{v:g}</text>')
        parts.append(f'<text x="{x0 + PW / 2}" y="{y0 + PH + 36}" text-anchor="middle">'
                     f'corpus size (MB of text, log)</text><text x="{x0 - 55}" '
                     f'y="{y0 + PH / 2}" text-anchor="middle" transform="rotate(-90 '
                     f'{x0 - 55} {y0 + PH / 2})">{label}, log</text>')
        for tool, pts in series.items():
            col = COLORS.get(tool, "#555")
            line = " ".join(f"{fx(p[0]):.1f},{fy(p[idx]):.1f}" for p in pts)
            parts.append(f'<polyline points="{line}" fill="none" stroke="{col}" '
                         f'stroke-width="2"/>')
            parts += [f'<circle cx="{fx(p[0]):.1f}" cy="{fy(p[idx]):.1f}" r="4" fill="{col}">'
                      f'<title>{tool}: {p[0]:g} MB, {p[idx]:,.1f}</title></circle>' for p in pts]
    for i, tool in enumerate(series):
        lx, ly = L + 2 * PW + GAP + 20, T + 10 + 20 * i
        parts.append(f'<line x1="{lx}" x2="{lx + 20}" y1="{ly}" y2="{ly}" '
                     f'stroke="{COLORS.get(tool, "#555")}" stroke-width="3"/>'
                     f'<text x="{lx + 26}" y="{ly + 4}">{tool}</text>')
    return "\n".join(parts + ["</svg>"])


def write_plot(results: dict, path: str) -> None:
    svg = svg_plot(results)
    if not path.endswith(".png"):
        Path(path).write_text(svg)
        return
    from render_report import _chromium, find_chromium

    svg_path = Path(path).with_suffix(".svg")
    svg_path.write_text(svg)
    binary = find_chromium()
    if binary is None:
        print(f"no Chromium for a PNG: wrote {svg_path} only", file=sys.stderr)
        return
    _chromium(binary, [f"--screenshot={path}", "--window-size=1040,405", svg_path.as_uri()])


# ---------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpora", nargs="*", default=DEFAULT_CORPORA)
    ap.add_argument("--vocab-size", type=int, default=32768)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--pattern", default="cl100k")
    ap.add_argument("--with-count-stage", action="store_true",
                    help="also time each reference at vocab 257 (its count stage)")
    ap.add_argument("--ours-args", default="", help="extra jobs/train.py arguments")
    ap.add_argument("--spark-args", default="", help="extra spark-submit options")
    ap.add_argument("--json", default=str(REPO / "out" / "bench_scale.json"))
    ap.add_argument("--plot", default="", help="PATH.svg (or .png, needs Chromium)")
    ap.add_argument("--workdir", default="", help="run dirs and logs (default: a temp dir)")
    ap.add_argument("--keep-runs", action="store_true", help="keep our run directories")
    ap.add_argument("--interval", type=float, default=0.2, help="RSS sampling period (s)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="no runs: the table (and "
                    "--plot) of earlier results files together, e.g. a separate 4 GB run")
    ap.add_argument("--_ref", default="", help=argparse.SUPPRESS)
    ap.add_argument("--_out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--_info", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._info:
        print(json.dumps(_corpus_info(args.corpora[0])))
        return
    if args._ref:
        ref_main(args._ref, args.corpora[0], args.vocab_size, args.pattern, args._out)
        return
    if args.merge:
        parts = [json.loads(Path(p).read_text()) for p in args.merge]
        for key in ("vocab_size", "pattern"):
            if len({json.dumps(p.get(key)) for p in parts}) > 1:
                ap.error(f"the files differ in {key}: {[p.get(key) for p in parts]}")
        if len({(p.get("provenance") or {}).get("commit") for p in parts}) > 1:
            print("warning: the files were measured on different code: "
                  + ", ".join(f"{f}: {(p.get('provenance') or {}).get('commit', '?')[:10]}"
                              for f, p in zip(args.merge, parts)), file=sys.stderr)
        results = {**parts[0], "runs": [{**r, "from_file": f} for f, p in zip(args.merge, parts)
                                         for r in p["runs"]],
                   "tools": list(dict.fromkeys(t for p in parts for t in p["tools"])),
                   "corpora": list({c["path"]: c for p in parts for c in p["corpora"]}.values())}
        return report(results, "merged: " + ", ".join(args.merge), args.plot)
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    args.corpora = [os.path.abspath(c) for c in args.corpora]  # (the runs' cwd is the repo)
    if bad := [t for t in tools if t not in TOOLS]:
        ap.error(f"unknown tools {bad}; choose from {TOOLS}")
    if missing := [c for c in args.corpora if not corpus_files(c)]:
        ap.error(f"no Parquet files in {missing}")
    import tempfile
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    results = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "vocab_size": args.vocab_size,
        "pattern": args.pattern, "tools": tools, "repeat": args.repeat,
        "ours_args": args.ours_args, "spark_args": args.spark_args, "workdir": str(work),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                                    / 2 ** 30, 1), "loadavg_at_start": os.getloadavg()},
        "provenance": provenance(),
        "corpora": [corpus_info(c) for c in args.corpora], "runs": [],
    }
    vocabs = [args.vocab_size] + ([257] if args.with_count_stage else [])
    if args.repeat % len(tools):  # (each tool goes first equally often only then)
        print(f"note: --repeat {args.repeat} is not a multiple of the {len(tools)} tools: "
              "they do not all go first equally often (the first run after another tool's "
              "pays for memory and a cold cache)", file=sys.stderr)
    for rep in range(args.repeat):
        order = tools[rep % len(tools):] + tools[:rep % len(tools)]  # each tool first in turn
        for c in results["corpora"]:
            for tool in order:
                for v in vocabs if tool != "ours" else [args.vocab_size]:
                    tag = f"{tool}-{Path(c['path']).name}-v{v}-r{rep}"
                    load = os.getloadavg()[0]
                    if tool == "ours":
                        res = run_ours(c["path"], args, work, tag)
                    else:
                        res = run_ref(tool, c["path"], v, args, work, tag)
                    res.update(corpus=c["path"], tool=tool, vocab=v, repeat=rep,
                               loadavg_before=load)
                    results["runs"].append(res)
                    print(f"{tag}: exit {res['exit_code']}, {res['wall_seconds']:.1f} s, "
                          f"peak tree {res['peak_tree_mb']:,.0f} MB "
                          f"(ru_maxrss {res['ru_maxrss_mb']:,.0f} MB), load {load:.1f}",
                          flush=True)
                    Path(args.json).write_text(json.dumps(results, indent=1))
    results["bench_process_maxrss_mb"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"\nload average now {os.getloadavg()[0]:.1f}")
    report(results, f"results: {args.json}", args.plot)


def report(results: dict, where: str, plot: str) -> None:
    print(f"\nvocab {results['vocab_size']}, pattern {results['pattern']}, "
          f"{results['machine']['cpus']} cores, repeat {results['repeat']} (medians)")
    print(table(results))
    print("\n" + ratios(results))
    print(f"\n{where}")
    if plot:
        write_plot(results, plot)
        print(f"plot: {plot}")


if __name__ == "__main__":
    main()
