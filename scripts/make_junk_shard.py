"""One Parquet shard of junk rows, to drop next to a clean corpus: what an uncleaned lake holds.

    .venv/bin/python scripts/make_junk_shard.py OUT.parquet [--mb 100] [--seed 7]

Rows of 2,000-200,000 characters, seeded: 60% base64 of random bytes (one "word" per letter
run, almost all distinct), 25% space-separated 32-digit hex ids, 15% minified-JavaScript-like
``var _0x1a2b3c=function(a,b){return a[17]+b}`` chains. Every junk word is new, so the word
table's distinct words and symbols grow with the shard, not with the square root of its size
like real text (BENCHMARKS.md: 100 MB of it beside the 1 GB corpus triples the table).
"""

from __future__ import annotations

import argparse
import base64
import random

import pyarrow as pa
import pyarrow.parquet as pq


def junk_row(rng: random.Random) -> str:
    kind = rng.random()
    n = rng.randint(2_000, 200_000)
    if kind < 0.6:
        return base64.b64encode(rng.randbytes(n * 3 // 4)).decode()
    if kind < 0.85:
        return " ".join(rng.randbytes(16).hex() for _ in range(n // 33))
    return ";".join(f"var _0x{rng.getrandbits(24):06x}=function(a,b)"
                    f"{{return a[{rng.randint(0, 999)}]+b}}" for _ in range(n // 50))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output")
    ap.add_argument("--mb", type=int, default=100, help="characters to write, in MiB")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    schema = pa.schema([("text", pa.string())])
    written, rows = 0, []
    with pq.ParquetWriter(args.output, schema, compression="zstd") as writer:
        while written < args.mb << 20:
            rows.append(junk_row(rng))
            written += len(rows[-1])
            if len(rows) == 64 or written >= args.mb << 20:  # a row group of 64 rows
                writer.write_table(pa.table({"text": rows}, schema=schema))
                rows = []
    print(f"{args.output}: {written / 1e6:,.1f} M characters of junk")


if __name__ == "__main__":
    main()
