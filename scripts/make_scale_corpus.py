"""Grow real Parquet corpora to a target size, seeded and reproducible, with new words.

    .venv/bin/python scripts/make_scale_corpus.py --target-mb 1000 --output /work/scale/c1g
        [SOURCE_DIR ...] [--seed 20240601] [--shards N] [--jobs N] [--no-count]

Rows are real source rows (uniform over the rows of all sources, so the byte mix and the row
lengths follow the sources), a third of them recombined from paragraph spans of two rows. Into
them go the things that keep a real crawl's vocabulary growing (Heaps' law) instead of
saturating at the sources' words: typos of the row's own words (swap / drop / double /
neighbour key), joined neighbours (camelCase, PascalCase, snake_case, concatenations),
identifiers, names, URLs, e-mail addresses and handles, file paths, hex ids, numbers, dates,
times, versions, and a few random tokens (API keys, short links). Recurring things are drawn
from heavy-tailed pools: item ``k = floor(q * (Pareto(alpha) - 1))`` is made deterministically
from ``(seed, family, k)``, so a popular identifier or domain comes back across rows and shards,
and the number of distinct items drawn grows like ``T ** (1 / (1 + alpha))``; a typo's edit
is drawn the same way per word. Only random tokens grow linearly.

Shard ``i`` is made from ``(seed, i, its size)`` alone: the output is identical for any
``--jobs``, and corpora made with the same seed and shard size share their first shards. The
1 GB and 4 GB corpora resample the same sources (en-docs among them): they are not
independent of the 116 MB corpus, only larger and with more distinct words.
Every shard is streamed to disk in row groups (zstd Parquet, one ``text`` column, rows of at
most 64 KiB); the sources (~135 MB of text by default) are the only thing held in memory.
With counting on (default) every shard is split with the cl100k pattern afterwards and
``_README.md`` gets words, distinct words, symbols (bytes of the distinct words) and the
distinct-word curve over the shards with a Heaps fit.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import random
import shlex
import sys
import time
import zlib
from collections import Counter
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import regex

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "corpora"
DEFAULT_SOURCES = [str(SHARED / "en-docs"), str(SHARED / "multilingual")]
MAX_ROW_BYTES = 65536
ROW_GROUP_BYTES = 16 << 20

# Events per 1,000 characters, and the share of each kind. Tuned so that 1 GB has ~2.8 M
# distinct cl100k words (issue 12's 956 MB corpus had 2.45 M).
EVENTS_PER_KCHAR = 11.0
EVENT_WEIGHTS = {
    "typo": 14, "join": 9, "number": 24, "ident": 13, "name": 7, "url": 6, "user": 4,
    "hash": 5, "path": 3, "randtok": 1.5,
}
# Pools: (q, alpha); item k = floor(q * (Pareto(alpha) - 1)); a word's typo number j is drawn
# the same way with "edit".
POOLS = {
    "ident": (6000, 0.55), "name": (1500, 0.55), "domain": (600, 0.6), "user": (3000, 0.55),
    "hash": (4000, 0.6), "edit": (1.0, 0.6),
}
RECOMBINE_P = 0.33

WORD = regex.compile(r"(?<!\p{L})\p{L}{3,20}(?!\p{L})")
GAP = regex.compile(r"(?<=\S) (?=\S)")  # a space inside prose: where items are inserted
PAIR = regex.compile(r"(?<!\p{L})(\p{L}{2,15}) (\p{L}{2,15})(?!\p{L})")
KEYS = ["qwertyuiop", "asdfghjkl", "zxcvbnm"]
NEIGHBOURS = {}
for _r, _row in enumerate(KEYS):
    for _i, _c in enumerate(_row):
        near = _row[max(0, _i - 1):_i] + _row[_i + 1:_i + 2]
        for _o in (_r - 1, _r + 1):
            if 0 <= _o < len(KEYS):
                near += KEYS[_o][max(0, _i - 1):_i + 1]
        NEIGHBOURS[_c] = near
TLDS = ["com"] * 40 + ["org"] * 10 + ["net"] * 8 + ["io"] * 6 + ["de"] * 5 + ["ru"] * 4 + [
    "co.uk", "co.uk", "dev", "fr", "jp", "cn", "info", "edu", "gov", "nl", "pl", "it", "es",
    "com.br", "ca", "au", "ch", "se", "app", "ai", "xyz"]
EXTS = ["py", "js", "ts", "tsx", "c", "h", "cc", "rs", "go", "java", "md", "rst", "txt", "json",
        "yaml", "toml", "html", "css", "sh", "so", "conf", "log", "csv", "png", "pdf"]
FIRST = ["james", "john", "robert", "michael", "david", "william", "richard", "maria", "anna",
         "elena", "sofia", "lucas", "noah", "emma", "olivia", "liam", "mia", "ivan", "olga",
         "dmitri", "li", "wei", "yuki", "hiro", "pierre", "claire", "jan", "piotr", "karin",
         "lars", "ahmed", "fatima", "carlos", "lucia", "giulia", "marco", "sven", "ingrid",
         "priya", "arjun", "chen"]
SYL_ON = ["", "b", "br", "c", "ch", "d", "dr", "f", "g", "gr", "h", "j", "k", "kr", "l", "m",
          "n", "p", "pr", "r", "s", "sh", "st", "t", "tr", "v", "w", "z", "th", "qu"]
SYL_NU = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "y", "ä", "é", "ö", "ø", "á"]
SYL_NU_W = [10, 10, 8, 8, 5, 2, 2, 2, 1, 1, 0.4, 0.4, 0.3, 0.2, 0.2]
SYL_CO = ["", "", "", "n", "r", "l", "s", "x", "m", "nd", "rt", "k", "th", "sk", "v"]
B62 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]

G: dict = {}  # set in the parent before the pool forks: rows, seed, vocab


def load_sources(dirs: list[str]) -> list[str]:
    rows: list[str] = []
    G["first_source_rows"] = 0
    for d in dirs:
        files = sorted(glob.glob(os.path.join(d, "*.parquet"))) if os.path.isdir(d) else [d]
        if not files:
            raise SystemExit(f"error: no Parquet files in {d}")
        for f in files:
            rows += [t for t in pq.read_table(f, columns=["text"]).column(0).to_pylist() if t]
        G["first_source_rows"] = G["first_source_rows"] or len(rows)
    return rows


def build_vocab(rows: list[str], n: int = 40000) -> list[str]:
    """Lowercase ASCII words of the first source by frequency (the 60 most common dropped)."""
    c: Counter[str] = Counter()
    find = regex.compile(r"(?<![A-Za-z])[a-z]{3,14}(?![A-Za-z])").findall
    for t in rows[::3]:
        c.update(find(t))
    ranked = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))
    return [w for w, _ in ranked[60:60 + n]]


def pool_index(r: random.Random, family: str) -> int:
    q, alpha = POOLS[family]
    return int(q * (r.paretovariate(alpha) - 1.0))


def item_rng(family: str, k: int) -> random.Random:
    return random.Random(f"{G['seed']}/{family}/{k}")


def vocab_word(r: random.Random) -> str:
    v = G["vocab"]
    return v[int(len(v) * r.random() ** 2.5)]


def syllables(r: random.Random, lo: int = 2, hi: int = 4) -> str:
    return "".join(r.choice(SYL_ON) + r.choices(SYL_NU, SYL_NU_W)[0] + r.choice(SYL_CO)
                   for _ in range(r.randint(lo, hi)))


@lru_cache(maxsize=1 << 17)
def ident(k: int) -> str:
    r = item_rng("ident", k)
    parts = [vocab_word(r) for _ in range(r.choice((1, 2, 2, 2, 3, 3, 4)))]
    style = r.choices(range(7), (30, 20, 25, 8, 7, 5, 5))[0]
    if style == 0:
        s = parts[0] + "".join(p.capitalize() for p in parts[1:])
    elif style == 1:
        s = "".join(p.capitalize() for p in parts)
    elif style == 2:
        s = "_".join(parts)
    elif style == 3:
        s = "_".join(parts).upper()
    elif style == 4:
        s = "".join(parts)
    else:
        s = ("-" if style == 5 else ".").join(parts)
    if r.random() < 0.12:
        s += str(r.randint(0, 99))
    return s


@lru_cache(maxsize=1 << 16)
def name(k: int) -> str:
    r = item_rng("name", k)
    s = syllables(r, 1, 3).capitalize()
    return s + " " + syllables(r, 2, 3).capitalize() if r.random() < 0.3 else s


@lru_cache(maxsize=1 << 15)
def domain(k: int) -> str:
    r = item_rng("domain", k)
    kind = r.random()
    if kind < 0.45:
        base = vocab_word(r) + vocab_word(r)
    elif kind < 0.75:
        base = syllables(r, 2, 3)
    else:
        base = vocab_word(r) + ("-" if r.random() < 0.5 else "") + syllables(r, 1, 2)
    sub = r.choice(["", "", "", "www.", "docs.", "api.", "blog.", "m.", "en.", "cdn."])
    return sub + base + "." + r.choice(TLDS)


@lru_cache(maxsize=1 << 16)
def user(k: int) -> tuple[str, str]:
    r = item_rng("user", k)
    first = r.choice(FIRST) if r.random() < 0.5 else syllables(r, 1, 2)
    last = syllables(r, 2, 3)
    kind = r.random()
    if kind < 0.35:
        handle = first + last
    elif kind < 0.6:
        handle = first[0] + last
    elif kind < 0.8:
        handle = vocab_word(r) + r.choice(["", "_", "."]) + vocab_word(r)
    else:
        handle = first + "." + last
    if r.random() < 0.4:
        handle += str(r.randint(1, 2025))
    return handle, domain(pool_index(r, "domain"))


@lru_cache(maxsize=1 << 16)
def hexid(k: int) -> str:
    r = item_rng("hash", k)
    h = f"{r.getrandbits(160):040x}"
    kind = r.random()
    if kind < 0.4:
        return h[:r.choice((7, 7, 8, 10, 12))]
    if kind < 0.7:
        return h
    if kind < 0.9:
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
    return "0x" + h[:r.choice((4, 8, 8, 12, 16))]


def typo(w: str, j: int) -> str:
    """Edit ``j`` of word ``w``: deterministic, so popular typos of a word recur."""
    h = zlib.crc32(f"{w}\x1f{j}".encode())
    n = len(w)
    kind, h = h % 4, h // 4
    i = h % n
    h //= n
    if kind == 0 and n > 1:
        i = min(i, n - 2)
        return w[:i] + w[i + 1] + w[i] + w[i + 2:]
    if kind == 1:
        return w[:i] + w[i + 1:]
    if kind == 2:
        return w[:i + 1] + w[i] + w[i + 1:]
    c = w[i].lower()
    near = NEIGHBOURS.get(c) or w
    sub = near[h % len(near)]
    return w[:i] + (sub.upper() if w[i].isupper() else sub) + w[i + 1:]


def join(a: str, b: str, r: random.Random) -> str:
    style = r.random()
    if not (a.isascii() and b.isascii()) or style < 0.3:
        return a + b.lower() if style < 0.85 else a + b
    if style < 0.6:
        return a + b.capitalize()
    if style < 0.72:
        return a.capitalize() + b.capitalize()
    if style < 0.9:
        return a + "_" + b
    return a + "-" + b


def number(r: random.Random) -> str:
    kind = r.random()
    if kind < 0.3:
        return str(int(10 ** (r.random() * 6)))
    if kind < 0.42:
        return f"{10 ** (r.random() * 4):.{r.choice((1, 2, 2, 3))}f}"
    if kind < 0.5:
        if r.random() < 0.6:
            return f"{r.randint(0, 100)}%"
        return f"${r.randint(1, 999)}.{r.randint(0, 99):02d}"
    if kind < 0.66:
        y, m, d = r.randint(1970, 2025), r.randint(1, 12), r.randint(1, 28)
        f = r.random()
        if f < 0.5:
            return f"{y}-{m:02d}-{d:02d}"
        return f"{d} {MONTHS[m - 1]} {y}" if f < 0.8 else f"{m}/{d}/{y}"
    if kind < 0.74:
        return f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}" + (
            f":{r.randint(0, 59):02d}" if r.random() < 0.5 else "")
    if kind < 0.9:
        v = ".".join(str(int(10 ** (r.random() * 1.5)) - 1) for _ in range(r.choice((2, 3, 3))))
        return r.choice(("v", "", "", "version ")) + v + r.choice(
            ("", "", "", "-rc1", "-beta", f"-{r.randint(1, 9)}", ".dev0", "+deb12u1"))
    if kind < 0.95:
        return ".".join(str(r.randint(0, 255)) for _ in range(4))
    return f"+{r.randint(1, 99)} {r.randint(100, 999)} {r.randint(1000000, 9999999)}"


def url(r: random.Random) -> str:
    segs = []
    for _ in range(r.choice((0, 1, 1, 2, 2, 3, 4))):
        s = r.random()
        if s < 0.35:
            segs.append(vocab_word(r))
        elif s < 0.6:
            segs.append("-".join(vocab_word(r) for _ in range(r.randint(2, 6))))
        elif s < 0.75:
            segs.append(ident(pool_index(r, "ident")))
        elif s < 0.9:
            segs.append(str(r.randint(1, 10 ** r.randint(1, 8))))
        else:
            segs.append(hexid(pool_index(r, "hash")))
    u = r.choice(("https://", "https://", "https://", "http://")) + domain(pool_index(r, "domain"))
    u += "/" + "/".join(segs) if segs else ""
    if segs and r.random() < 0.3:
        u += "." + r.choice(("html", "html", "php", "pdf", "md", "aspx"))
    if r.random() < 0.2:
        u += f"?{vocab_word(r)}={r.randint(0, 10 ** 5)}"
        if r.random() < 0.5:
            u += f"&{r.choice(('ref', 'utm_source', 'id', 'v', 'token'))}=" + randtok(r)
    return u


def randtok(r: random.Random) -> str:
    return "".join(r.choices(B62, k=r.choice((8, 11, 11, 16, 20, 24, 32, 40))))


def make_token(kind: str, r: random.Random) -> str:
    if kind == "number":
        return number(r)
    if kind == "ident":
        s = ident(pool_index(r, "ident"))
        w = r.random()
        return f"`{s}`" if w < 0.2 else s + "()" if w < 0.35 else s
    if kind == "name":
        return name(pool_index(r, "name"))
    if kind == "url":
        return url(r)
    if kind == "user":
        handle, dom = user(pool_index(r, "user"))
        return "@" + handle if r.random() < 0.4 else f"{handle}@{dom}"
    if kind == "hash":
        return hexid(pool_index(r, "hash"))
    if kind == "path":
        parts = [r.choice(("src", "lib", "usr/lib", "app", "docs", "tests", "~", "/etc", "C:"))]
        parts += [vocab_word(r) for _ in range(r.randint(0, 2))]
        return "/".join(parts) + "/" + ident(pool_index(r, "ident")) + "." + r.choice(EXTS)
    return randtok(r)


def mutate(text: str, r: random.Random, stats: Counter) -> str:
    n = len(text)
    lam = n * EVENTS_PER_KCHAR / 1000.0
    # Poisson by inversion for small means, normal approximation for large ones
    if lam < 30:
        k, p, u = 0, math.exp(-lam), r.random()
        cum = p
        while u > cum and k < 200:
            k += 1
            p *= lam / k
            cum += p
    else:
        k = max(0, int(r.gauss(lam, math.sqrt(lam)) + 0.5))
    if not k:
        return text
    kinds, weights = G["kinds"], G["weights"]
    edits = []
    for kind in r.choices(kinds, cum_weights=weights, k=k):
        pos = r.randrange(n)
        if kind == "typo":
            m = WORD.search(text, pos)
            if m:
                j = pool_index(r, "edit")
                edits.append((m.start(), m.end(), typo(m.group(), j)))
        elif kind == "join":
            m = PAIR.search(text, pos)
            if m:
                edits.append((m.start(), m.end(), join(m.group(1), m.group(2), r)))
        else:
            m = GAP.search(text, pos)
            if m:
                edits.append((m.start(), m.start(), " " + make_token(kind, r)))
        stats[kind] += 1
    edits.sort(key=lambda e: e[0])
    out, last = [], 0
    for s, e, rep in edits:
        if s < last:
            continue
        out += (text[last:s], rep)
        last = e
    out.append(text[last:])
    return "".join(out)


def cap_row(text: str) -> str:
    if len(text) * 4 <= MAX_ROW_BYTES:
        return text
    b = text.encode("utf-8")
    if len(b) <= MAX_ROW_BYTES:
        return text
    b = b[:MAX_ROW_BYTES]
    cut = b.rfind(b"\n")
    return b[:cut if cut > MAX_ROW_BYTES // 2 else len(b)].decode("utf-8", "ignore").rstrip("\n")


def base_row(r: random.Random) -> str:
    rows = G["rows"]
    text = rows[r.randrange(len(rows))]
    if r.random() >= RECOMBINE_P:
        return text
    other = rows[r.randrange(len(rows))]
    a, b = text.split("\n\n"), other.split("\n\n")
    i, j = r.randrange(len(a)), r.randrange(len(b))
    span_a = a[i:i + r.randint(1, max(1, len(a) - i))]
    span_b = b[j:j + r.randint(1, max(1, len(b) - j))]
    return "\n\n".join(span_a + span_b if r.random() < 0.5 else span_b + span_a)


def make_shard(args: tuple[int, int, str]) -> dict:
    index, budget, path = args
    r = random.Random(f"{G['seed']}/shard/{index}")
    stats: Counter[str] = Counter()
    schema = pa.schema([pa.field("text", pa.string())])
    tmp = path + ".tmp"
    rows = nbytes = 0
    with pq.ParquetWriter(tmp, schema, compression="zstd", compression_level=3) as w:
        batch: list[str] = []
        batch_bytes = 0
        while nbytes < budget:
            text = cap_row(mutate(base_row(r), r, stats))
            size = len(text) if text.isascii() else len(text.encode("utf-8"))
            if not text.strip():
                continue
            batch.append(text)
            batch_bytes += size
            nbytes += size
            rows += 1
            if batch_bytes >= ROW_GROUP_BYTES or nbytes >= budget:
                w.write_table(pa.table({"text": pa.array(batch, pa.string())}))
                batch, batch_bytes = [], 0
    os.replace(tmp, path)
    return {"index": index, "rows": rows, "bytes": nbytes, "events": dict(stats)}


def count_shard(path: str) -> tuple[int, int, set[str]]:
    from pipeline.pretokenize import Pretokenizer, PretokenizerSpec

    words = Pretokenizer(PretokenizerSpec(pattern="cl100k")).words
    seen: set[str] = set()
    n = 0
    pf = pq.ParquetFile(path)
    for rg in range(pf.num_row_groups):
        for t in pf.read_row_group(rg, columns=["text"]).column(0).to_pylist():
            ws = words(t)
            n += len(ws)
            seen.update(ws)
    return n, pf.metadata.num_rows, seen


def heaps_fit(points: list[tuple[int, int]]) -> tuple[float, float]:
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(v) for _, v in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    beta = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else float("nan")
    return math.exp(my - beta * mx), beta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="*", default=DEFAULT_SOURCES)
    ap.add_argument("--target-mb", type=float, required=True, help="MB (1e6 bytes) of UTF-8 text")
    ap.add_argument("--output", required=True)
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--shards", type=int, default=0, help="default: ~64 MB of text per shard")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-count", action="store_true", help="skip the cl100k word count")
    args = ap.parse_args()

    t0 = time.perf_counter()
    target = int(args.target_mb * 1e6)
    shards = args.shards or max(1, math.ceil(args.target_mb / 64))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*.parquet*"):
        old.unlink()
    rows = load_sources(args.sources)
    src_bytes = sum(len(t.encode("utf-8")) for t in rows)
    G.update(rows=rows, seed=args.seed, vocab=build_vocab(rows[:G["first_source_rows"]]),
             kinds=list(EVENT_WEIGHTS))
    acc, cum = 0.0, []
    for v in EVENT_WEIGHTS.values():
        acc += v
        cum.append(acc)
    G["weights"] = cum
    print(f"sources: {len(rows):,} rows, {src_bytes / 1e6:.1f} MB; vocab {len(G['vocab']):,}; "
          f"{shards} shards, {args.jobs} processes", flush=True)
    per = target // shards
    tasks = [(i, per + (target - per * shards if i == shards - 1 else 0),
              str(out / f"part-{i:05d}.parquet")) for i in range(shards)]
    ctx = get_context("fork")
    results = []
    with ctx.Pool(args.jobs) as pool:
        for res in pool.imap(make_shard, tasks):
            results.append(res)
            print(f"  shard {res['index']}: {res['rows']:,} rows, {res['bytes'] / 1e6:.1f} MB",
                  flush=True)
        gen_s = time.perf_counter() - t0
        curve = []
        if not args.no_count:
            seen: set[str] = set()
            words = nbytes = 0
            for (n, _, s), res in zip(pool.imap(count_shard, [t[2] for t in tasks]), results):
                words += n
                nbytes += res["bytes"]
                seen |= s
                curve.append((nbytes, words, len(seen)))
            symbols = sum(len(w.encode("utf-8", "surrogatepass")) for w in seen)
            del seen
    total_rows = sum(r["rows"] for r in results)
    total_bytes = sum(r["bytes"] for r in results)
    events: Counter[str] = Counter()
    for r in results:
        events.update(r["events"])
    disk = sum(f.stat().st_size for f in out.glob("part-*.parquet"))
    elapsed = time.perf_counter() - t0
    cmd = " ".join(shlex.quote(a) for a in [".venv/bin/python", "scripts/make_scale_corpus.py",
                                            *sys.argv[1:]])
    lines = [
        f"# {out.name}: real corpora grown to {total_bytes / 1e6:,.0f} MB with new words",
        "",
        f"Made by `scripts/make_scale_corpus.py` (spark-bpe) in {gen_s:.0f} s "
        + (f"({elapsed:.0f} s with the count), " if not args.no_count else "(not counted), ")
        + f"{args.jobs} processes:",
        "",
        f"    {cmd}",
        "",
        "## Summary",
        "",
        f"- rows: **{total_rows:,}**",
        f"- total raw UTF-8 text: **{total_bytes:,} bytes** ({total_bytes / 1e6:,.1f} MB)",
        f"- shards: **{shards}** (`part-00000.parquet` ...), on disk {disk:,} bytes "
        f"({disk / 1e6:,.1f} MB), zstd level 3",
        "- schema: one column `text` (string, no nulls, no empty rows, every row <= 65,536 "
        "UTF-8 bytes)",
        f"- seed: {args.seed}; shard i is made from (seed, i, its size) only, so any `--jobs` "
        "gives the same files, and corpora made with the same seed and shard size share their "
        "first shards (the 250 MB and 1 GB corpora nest that way by default)",
        f"- sources: {', '.join(f'`{s}`' for s in args.sources)} ({len(rows):,} rows, "
        f"{src_bytes:,} bytes)",
    ]
    if curve:
        k, beta = heaps_fit([(w, v) for _, w, v in curve])
        _, words, distinct = curve[-1]
        lines += [
            f"- cl100k words: **{words:,}**; distinct words: **{distinct:,}**; symbols (UTF-8 "
            f"bytes of the distinct words): **{symbols:,}**",
            f"- Heaps fit over the shards (V = K * N^beta, N words): K = {k:.1f}, "
            f"beta = {beta:.3f}",
        ]
    lines += [
        "",
        "## How rows were made",
        "",
        "Each row is a source row drawn uniformly from all source rows (so the byte mix and the "
        f"row lengths follow the sources); {RECOMBINE_P:.0%} of them are replaced by a random "
        "span of paragraphs of that row joined to a random span of another row's paragraphs. "
        f"Then about {EVENTS_PER_KCHAR:g} events per 1,000 characters, of these kinds "
        f"(weights): {', '.join(f'{k} {v:g}' for k, v in EVENT_WEIGHTS.items())}. `typo` swaps, "
        "drops, doubles or replaces by a keyboard neighbour one letter of a word (3-20 letters) "
        "of the row; `join` fuses two neighbouring words (camelCase, PascalCase, snake_case, "
        "kebab-case, concatenation); the others insert an item after a space: numbers, "
        "decimals, prices, percentages, dates, times, versions, IP and phone numbers; "
        "identifiers built from the sources' words; made-up names; URLs; handles and e-mail "
        "addresses; hex ids (short/full SHA-1, UUIDs, 0x addresses); file paths; random "
        "base62 tokens.",
        "",
        "Identifiers, names, domains, users, hex ids and a word's typos are items of "
        "heavy-tailed pools (item `k = floor(q * (Pareto(alpha) - 1))`, built deterministically "
        f"from (seed, family, k)); (q, alpha): {POOLS}. So they recur like real ones and their "
        "distinct items grow like T^(1/(1+alpha)) in T draws. The random tokens grow "
        "linearly, joins and typos of rare words nearly so; the sources' own words saturate. "
        "So the local exponent rises with size (the first shard already holds most of the "
        "sources' words).",
        "",
        f"Events made: {', '.join(f'{k} {events[k]:,}' for k in EVENT_WEIGHTS)}.",
    ]
    if curve:
        lines += ["", "## Distinct words over the shards (cl100k, cumulative)", "",
                  "| shards | MB of text | words | distinct words | local beta |",
                  "|---:|---:|---:|---:|---:|"]
        marks = sorted({0, 1, 3, 7, 15, 31, len(curve) - 1} & set(range(len(curve))))
        for a, i in zip([None, *marks], marks):
            beta = ""
            if a is not None:
                local = math.log(curve[i][2] / curve[a][2]) / math.log(curve[i][1] / curve[a][1])
                beta = f"{local:.3f}"
            lines.append(f"| {i + 1} | {curve[i][0] / 1e6:,.0f} | {curve[i][1]:,} | "
                         f"{curve[i][2]:,} | {beta} |")
    lines += ["", "## Shards", "", "| file | rows | raw bytes |", "|---|---:|---:|"]
    lines += [f"| part-{r['index']:05d}.parquet | {r['rows']:,} | {r['bytes']:,} |"
              for r in results]
    lines += ["", "Licences: those of the sources (see their `_README.md`).", ""]
    (out / "_README.md").write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines[8:16 if curve else 14]))
    print(f"done in {elapsed:.0f} s: {out}")


if __name__ == "__main__":
    main()
