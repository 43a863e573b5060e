"""The pathological rows of the bad-input tests through the encoders, in one process.

    .venv/bin/python scripts/bench_long_rows.py RUN_DIR [--repeat 3]

Rows: 2 M spaces then ``x``, 20 M ``a``, 5 M digits, 5 M random punctuation (the rows of
tests/test_bad_input.py). Times, interleaved per row, with the tool that goes first rotating
from one repetition to the next: our
reference encoder (``Tokenizer.encode``), the encode job's encoder (``BatchEncoder``: tiktoken,
or ours for a row tiktoken cannot take) and tiktoken's own ``encode_ordinary`` on the rows it
takes in reasonable time (not on the runs of one character: it panics on the spaces and its
BPE of one 20 M-character piece is quadratic). Prints the medians and checks that the ids
agree.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline import encode_corpus as ec  # noqa: E402
from pipeline.config import Config  # noqa: E402
from pipeline.encoder import Tokenizer  # noqa: E402

ROWS = {
    "spaces": " " * 2_000_000 + "x",
    "letters": "a" * 20_000_000,
    "digits": "7" * 5_000_000,
    "punct": "".join(random.Random(0).choices("!?.,;:-_()[]{}", k=5_000_000)),
}
TIKTOKEN_ROWS = ("digits", "punct")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tok = Tokenizer.load(args.run_dir)
    cfg = Config(tokenizer=args.run_dir, input="unused", output="unused",
                 encode_engine="tiktoken")
    job = ec.BatchEncoder(ec.load_plan(None, cfg))
    tools = {
        "ours (Tokenizer.encode)": lambda text: tok.encode(text),
        "encode job (BatchEncoder)": lambda text: job.encode(text)[0],
        "tiktoken encode_ordinary": lambda text: job.tk.encode_ordinary(text),
    }
    times: dict[tuple[str, str], list[float]] = {}
    names = list(tools)
    for rep in range(args.repeat):
        for row, text in ROWS.items():  # the first call after another row's pays for memory
            # who goes first rotates among the tools that take this row (tiktoken cannot take
            # every row: rotating over all three put ours first 4 times in 6 on those rows)
            able = [n for n in names if not n.startswith("tiktoken") or row in TIKTOKEN_ROWS]
            turn = able[rep % len(able):] + able[:rep % len(able)]
            ids = None
            for name in turn:
                fn = tools[name]
                t0 = time.perf_counter()
                got = fn(text)
                times.setdefault((row, name), []).append(time.perf_counter() - t0)
                if ids is None:
                    ids = got
                elif got != ids:
                    sys.exit(f"{name} disagrees with ours on the {row} row")
    print(f"tokenizer {args.run_dir}, {args.repeat} repetitions, seconds (median):")
    for (row, name), ts in times.items():
        print(f"  {row:8s} {len(ROWS[row]):>11,d} chars  {name:27s} "
              f"{statistics.median(ts):7.2f}  ({', '.join(f'{t:.2f}' for t in ts)})")


if __name__ == "__main__":
    main()
