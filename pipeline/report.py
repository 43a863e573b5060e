"""``report.html``: a one-page look at a trained run (no JavaScript, no external resources).

- summary (vocabulary, corpus, compression) and the export notes;
- the merge trace: the first and last merges with their counts and the tokens left;
- the compression curve: bytes per token against the number of merges, on the training corpus
  (exact, from the trace) and on a sample of text (held out when ``report_sample`` names one;
  otherwise rows of the training input, and the report says so);
- token-length histograms: vocabulary tokens by length in bytes, and sample tokens by length;
- a few example sentences from the sample, split into tokens.

The page is laid out for any width down to a phone's: tables have fixed layouts and wrap
anywhere, charts are SVG scaled to the column, token runs wrap inside words
(``scripts/render_report.py`` renders it in headless Chromium and checks there is no sideways
scrolling). :func:`render_report` is pure Python; :func:`write_report` is what ``train`` calls.
"""

from __future__ import annotations

import dataclasses
import html
import logging
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pipeline import fsutil
from pipeline.bpe import BaseVocab, Merge, vocab_bytes
from pipeline.encoder import PairTable, Tokenizer, bpe_encode
from pipeline.engines.local import initial_symbols
from pipeline.outputs import TrainedTokenizer, export_notes
from pipeline.pretokenize import Pretokenizer, decode_row, text_values, word_bytes

log = logging.getLogger(__name__)

TRACE_ROWS = 20  # first and last merges shown
EXAMPLES = 6
EXAMPLE_CHARS = 240
CURVE_POINTS = 300
LONG_TOKEN = 16  # histogram: this many bytes and more share one bar
SAMPLE_FILES = 8  # the report's sample is read from at most this many input files


@dataclass
class SampleStats:
    """What the report measures on a sample of text."""

    label: str
    rows: int
    bytes: int
    curve: list[tuple[int, float]]  # (merges, bytes per token)
    length_hist: dict[int, int]  # token length in bytes (capped) -> tokens in the sample
    examples: list[list[bytes | str]] = field(default_factory=list)  # tokens; str = special
    held_out: bool = False


# -- measuring ---------------------------------------------------------------------------------

def _downsample(n: int, points: int = CURVE_POINTS) -> list[int]:
    """Merge counts 0..n, at most ``points`` of them, always including both ends."""
    if n <= points:
        return list(range(n + 1))
    step = n / points
    return sorted({0, n, *(int(i * step) for i in range(points))})


def corpus_curve(total_bytes: int, total_tokens: int, tokens_left: Sequence[int]
                 ) -> list[tuple[int, float]]:
    """Bytes per token of the training corpus after k merges (k = 0 is the base alphabet)."""
    left = [total_tokens, *tokens_left]
    return [(k, total_bytes / left[k]) for k in _downsample(len(left) - 1) if left[k]]


def measure_sample(tok: TrainedTokenizer, texts: Sequence[str | bytes], label: str,
                   held_out: bool = False) -> SampleStats:
    """Replay the merges over the sample's words (vectorized, exact) to get its bytes per token
    after every merge and its final token lengths; encode a few example snippets."""
    pre = Pretokenizer(tok.spec)
    counts: Counter[str] = Counter()
    rows = 0
    for value in texts:
        if value is None or len(value) == 0:
            continue
        rows += 1
        text, _ = decode_row(value)
        counts.update(pre.words(text))
    words = list(counts)
    weights = np.fromiter(counts.values(), dtype=np.int64, count=len(words))
    flat, lengths = _symbols(tok.base, words, unknown=len(tok.vocab))
    total_bytes = int(sum(len(word_bytes(w)) * c for w, c in counts.items()))
    vocab = _text_vocab(tok)  # (a chars run's end-of-word suffix is no text)
    tok_len = np.array([len(t) for t in vocab] + [1], dtype=np.int64)  # last: unknown char
    curve: list[tuple[int, float]] = []
    hist: dict[int, int] = {}
    if len(words):
        removed, final, per_word = merge_ranks_applied(flat, lengths, weights, tok.merges)
        left = int(np.dot(lengths, weights)) - np.concatenate([[0], np.cumsum(removed)])
        curve = [(k, total_bytes / int(left[k])) for k in _downsample(len(tok.merges))]
        w = np.repeat(weights, per_word)
        lens = np.minimum(tok_len[np.minimum(final, len(tok_len) - 1)], LONG_TOKEN)
        hist = {int(k): int(v) for k, v in enumerate(np.bincount(lens, weights=w)) if v}
    stats = SampleStats(label, rows, total_bytes, curve, hist, held_out=held_out)
    stats.examples = examples(tok, texts)
    return stats


def merge_ranks_applied(flat: np.ndarray, lengths: np.ndarray, weights: np.ndarray,
                        merges: Sequence[Merge]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Encode each distinct word by always merging its lowest-ranked pair (leftmost on a tie),
    as tiktoken does (``encoder.bpe_encode``: O(n log n) per word, numpy for very long ones).
    Returns the tokens each merge removes from the weighted words, the final tokens and their
    number per word.

    The removals are read off the final tokens: a token made by merge k is one application of
    merge k, and it stands for one token ``left`` and one token ``right`` made (or held) before
    it; so, going from the last merge down, merge k was applied as often as its token was
    (weighted by word count), and each application adds one ``left`` and one ``right``. These
    are the numbers a replay of the merge list in order gives (tested against one)."""
    pair_ranks = {(m.left, m.right): (k, m.new_id) for k, m in enumerate(merges)}
    table = PairTable(pair_ranks)  # built only if a word is long enough to need it
    final: list[int] = []
    per_word: list[int] = []
    ends = np.cumsum(lengths).tolist()
    symbols = flat.tolist()
    start = 0
    for end in ends:
        toks = bpe_encode(symbols[start:end], pair_ranks, table)
        start = end
        final += toks
        per_word.append(len(toks))
    final_ids = np.asarray(final, dtype=np.int64)
    per_word_arr = np.asarray(per_word, dtype=np.int64)
    top = max([m.new_id for m in merges], default=0) + 1
    known = final_ids < top  # ids past the last merge (unknown characters) are never merged
    made = np.bincount(final_ids[known], weights=np.repeat(weights, per_word_arr)[known],
                       minlength=top).astype(np.int64).tolist()
    removed = np.zeros(len(merges), dtype=np.int64)
    for k in range(len(merges) - 1, -1, -1):
        m = merges[k]
        n = made[m.new_id]
        removed[k] = n
        made[m.left] += n
        made[m.right] += n
    return removed, final_ids, per_word_arr


def _symbols(base: BaseVocab, words: list[str], unknown: int) -> tuple[np.ndarray, np.ndarray]:
    """The initial symbols of ``words``; a character the base has not (a chars run) is
    ``unknown``, an id past every token (never part of a merge; one byte in the histogram)."""
    flat, lengths = initial_symbols(base, pa.array(map(word_bytes, words), pa.binary()), unknown)
    return flat.astype(np.int32), lengths


def _snippet(text: str) -> str:
    """A readable piece of a row: its first substantial line(s), cut at a space."""
    lines = [ln for ln in text.splitlines() if len(ln.strip()) >= 20] or [text]
    out = lines[0]
    for ln in lines[1:]:
        if len(out) >= EXAMPLE_CHARS // 2:
            break
        out += "\n" + ln
    if len(out) > EXAMPLE_CHARS:
        cut = out.rfind(" ", EXAMPLE_CHARS // 2, EXAMPLE_CHARS)
        out = out[: cut if cut > 0 else EXAMPLE_CHARS]
    return out


def _text_vocab(tok: TrainedTokenizer) -> list[bytes]:
    """The text of each token: a chars run's end-of-word suffix symbol adds none."""
    if not tok.base.end_of_word_suffix:
        return tok.vocab
    return vocab_bytes(dataclasses.replace(tok.base, tokens=[*tok.base.tokens[:-1], b""]),
                       tok.merges)


def examples(tok: TrainedTokenizer, texts: Sequence[str | bytes]) -> list[list[bytes | str]]:
    """A few snippets spread over the sample, as token byte strings (specials as str)."""
    rows = [decode_row(t)[0] for t in texts if t]
    if not rows:
        return []
    enc = Tokenizer(tok.base, tok.merges, tok.special_tokens, tok.spec.without_specials())
    n = min(EXAMPLES, len(rows))
    picked = sorted({int(i * len(rows) / n) for i in range(n)})
    out = []
    for i in picked:
        try:
            ids = enc.encode(_snippet(rows[i]), allowed_special="all")  # as training cuts them
        except ValueError:  # chars alphabet: a character the vocabulary never saw
            continue
        out.append([enc.text_vocab[t] if t < len(enc.vocab) else enc.special_tokens[t -
                    len(enc.vocab)] for t in ids])
    return out


# -- rendering ---------------------------------------------------------------------------------

VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


MAX_SHOWN = 40  # characters of a token shown in a table cell


def _visible(token: bytes) -> str:
    """A token for a table cell: whitespace made visible, bytes that are not (complete) UTF-8
    as ``\\xNN``, long tokens cut with their length."""
    text = token.decode("utf-8", "backslashreplace")
    shown = "".join(VISIBLE[ch] if ch in VISIBLE else ch if ch.isprintable() else
                    f"\\u{ord(ch):04x}" for ch in text)
    if len(shown) > MAX_SHOWN:
        shown = f"{shown[:MAX_SHOWN - 8]}… ({len(token)} bytes)"
    return shown


def _shown_char(ch: str) -> str:
    """A character of an example as shown: an invisible or layout-changing one (a control,
    a NUL, a right-to-left override, a lone surrogate) as ``\\uXXXX``; the joiners stay (emoji
    sequences, Indic scripts)."""
    return ch if ch.isprintable() or ch in "\u200c\u200d " else f"\\u{ord(ch):04x}"


def _shown(text: str) -> str:
    return "".join(map(_shown_char, text))


def _tok_cell(token: bytes) -> str:
    return f'<code class="tok">{html.escape(_visible(token))}</code>'


def _nice_ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1, math.ceil(step))
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:g}" if v == int(v) else f"{v:.2f}"


def line_chart(series: list[tuple[str, str, list[tuple[int, float]]]], x_label: str,
               y_label: str) -> str:
    """An SVG line chart that scales to its container (viewBox, width 100%)."""
    w, h, ml, mr, mt, mb = 720, 300, 60, 16, 16, 44
    pts = [p for _, _, s in series for p in s]
    if not pts:
        return "<p>(no data)</p>"
    x1 = max(p[0] for p in pts) or 1
    ys = [p[1] for p in pts]
    y0, y1 = min(1.0, min(ys)), max(ys) * 1.05
    sx = lambda x: ml + (w - ml - mr) * x / x1  # noqa: E731
    sy = lambda y: mt + (h - mt - mb) * (1 - (y - y0) / ((y1 - y0) or 1))  # noqa: E731
    parts = [f'<svg viewBox="0 0 {w} {h}" class="chart" role="img" '
             f'aria-label="{html.escape(y_label)} by {html.escape(x_label)}">']
    for t in _nice_ticks(y0, y1):
        parts.append(f'<line x1="{ml}" x2="{w - mr}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" '
                     'class="grid"/>')
        parts.append(f'<text x="{ml - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for t in _nice_ticks(0, x1, integer=True):  # (x: merges, a count)
        parts.append(f'<text x="{sx(t):.1f}" y="{h - mb + 16}" text-anchor="middle">'
                     f'{_fmt(t)}</text>')
    parts.append(f'<line x1="{ml}" x2="{w - mr}" y1="{h - mb}" y2="{h - mb}" class="axis"/>')
    parts.append(f'<text x="{(ml + w - mr) / 2}" y="{h - 6}" text-anchor="middle">'
                 f'{html.escape(x_label)}</text>')
    parts.append(f'<text x="14" y="{(mt + h - mb) / 2}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {(mt + h - mb) / 2})">{html.escape(y_label)}</text>')
    for i, (label, color, s) in enumerate(series):
        if not s:
            continue
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        parts.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"/>')
        ly = h - mb - 14 - 20 * (len(series) - 1 - i)
        parts.append(f'<rect x="{w - mr - 250}" y="{ly - 10}" width="12" height="12" '
                     f'fill="{color}"/><text x="{w - mr - 232}" y="{ly + 1}">'
                     f'{html.escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(categories: list[str], series: list[tuple[str, str, list[float]]],
              y_label: str) -> str:
    """Grouped bars (values as shares), SVG scaled to the container."""
    w, h, ml, mr, mt, mb = 720, 260, 50, 16, 30, 40
    top = max((v for _, _, vals in series for v in vals), default=0) or 1
    n, k = len(categories), max(len(series), 1)
    slot = (w - ml - mr) / max(n, 1)
    bw = slot * 0.8 / k
    parts = [f'<svg viewBox="0 0 {w} {h}" class="chart" role="img" '
             f'aria-label="{html.escape(y_label)}">']
    for t in _nice_ticks(0, top, 4):
        y = mt + (h - mt - mb) * (1 - t / top)
        label = f"{t:.0%}" if round(t * 100, 6) == round(t * 100) else f"{t:.1%}"  # (2.5%)
        parts.append(f'<line x1="{ml}" x2="{w - mr}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                     f'<text x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    for j, (_, color, vals) in enumerate(series):
        for i, v in enumerate(vals):
            bh = (h - mt - mb) * v / top
            x = ml + slot * i + slot * 0.1 + bw * j
            parts.append(f'<rect x="{x:.1f}" y="{h - mb - bh:.1f}" width="{bw:.1f}" '
                         f'height="{bh:.1f}" fill="{color}"><title>{v:.1%}</title></rect>')
    for i, c in enumerate(categories):
        parts.append(f'<text x="{ml + slot * (i + 0.5):.1f}" y="{h - mb + 16}" '
                     f'text-anchor="middle">{html.escape(c)}</text>')
    parts.append(f'<text x="{(ml + w - mr) / 2}" y="{h - 6}" text-anchor="middle">'
                 'token length in bytes</text>')
    for j, (label, color, _) in enumerate(series):
        parts.append(f'<rect x="{ml + 10 + 240 * j}" y="6" width="12" height="12" '
                     f'fill="{color}"/><text x="{ml + 28 + 240 * j}" y="17">'
                     f'{html.escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _example_html(tokens: list[bytes | str]) -> str:
    """Tokens as alternating coloured spans; byte fragments of one character are grouped."""
    out, buf, n_buf = [], b"", 0
    shade = 0

    def span(text: str, cls: str, title: str) -> str:
        nonlocal shade
        shade ^= 1
        shown = "".join(VISIBLE[ch] + ("\n" if ch == "\n" else "") if ch in "\n\t\r"
                        else _shown_char(ch) for ch in text)
        return (f'<span class="t{shade} {cls}" title="{html.escape(title)}">'
                f"{html.escape(shown)}</span>")

    for t in tokens:
        if isinstance(t, str):
            out.append(span(t, "special", "special token"))
            continue
        buf += t
        n_buf += 1
        try:
            text = buf.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.reason == "unexpected end of data" and n_buf < 4:
                continue  # the rest of the character may come in the next token
            text = buf.decode("utf-8", "backslashreplace")  # (invalid: shown as it is)
        cls = "frag" if n_buf > 1 else ""
        title = f"{n_buf} tokens for one character" if n_buf > 1 else f"{len(buf)} bytes"
        out.append(span(text, cls, title))
        buf, n_buf = b"", 0
    if buf:
        out.append(span(buf.decode("utf-8", "backslashreplace"), "frag", "incomplete"))
    return "".join(out)


CSS = """
*{box-sizing:border-box}
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans","Noto Sans CJK SC",
sans-serif;margin:0;padding:16px;color:#1d2330;background:#f7f8fa}
main{max-width:980px;margin:0 auto;overflow-wrap:anywhere}
h1{font-size:1.5em;margin:.2em 0 .1em}h2{font-size:1.15em;margin:1.6em 0 .5em;
border-bottom:1px solid #d6dae2;padding-bottom:.2em}
.sub{color:#5b6475;margin:0 0 1em}
table{border-collapse:collapse;width:100%;table-layout:fixed;background:#fff}
th,td{border:1px solid #e1e4ea;padding:3px 6px;text-align:left;vertical-align:top;
overflow-wrap:anywhere;word-break:break-word}
th{background:#eef1f6;font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;overflow-wrap:normal;
word-break:normal}
.kv td:first-child{width:38%;color:#5b6475}
code.tok{font-family:"DejaVu Sans Mono",Menlo,Consolas,monospace;background:#eef3ff;
border-radius:3px;padding:0 3px;white-space:pre-wrap;word-break:break-all}
.chart{width:100%;height:auto;display:block;background:#fff;border:1px solid #e1e4ea}
.chart text{font-size:12px;fill:#3b4252}.chart .grid{stroke:#eceff4}.chart .axis{stroke:#9aa3b2}
.example{background:#fff;border:1px solid #e1e4ea;padding:8px 10px;margin:0 0 10px;
font-family:"DejaVu Sans Mono",Menlo,Consolas,"Noto Sans Mono CJK SC",monospace;font-size:14px;
white-space:pre-wrap;word-break:break-all;line-height:1.9}
.example .t0{background:#dbe8ff}.example .t1{background:#ffe3c7}
.example .frag{outline:1px dashed #b04a4a}.example .special{background:#c9f2d0;font-weight:600}
.meta{color:#5b6475;font-size:.9em;margin:2px 0 12px}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:6px 10px;margin:6px 0}
@media (max-width:640px){body{font-size:13px;padding:8px}th,td{padding:2px 3px}
table{font-size:12px}.chart text{font-size:18px}.example{font-size:12px}}
"""


def render_report(tok: TrainedTokenizer, tokens_left: Sequence[int], corpus_bytes: int,
                  corpus_tokens: int, sample: SampleStats | None, title: str = "spark-bpe run",
                  notes: Sequence[str] = ()) -> str:
    """The whole page as a string (pure Python: the tests render it without Spark)."""
    e = html.escape
    title = _shown(title)
    body = [f"<h1>{e(title)}</h1>",
            f'<p class="sub">Byte-pair encoding run report · {time.strftime("%Y-%m-%d %H:%M")}'
            "</p>",
            *_summary_section(tok, tokens_left, corpus_bytes, corpus_tokens, sample),
            *(f'<p class="note">{e(_shown(n))}</p>' for n in notes),
            *_trace_section(tok, tokens_left),
            *_compression_section(tokens_left, corpus_bytes, corpus_tokens, sample),
            *_lengths_section(tok, sample),
            *_examples_section(sample)]
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(title)}</title><style>{CSS}</style></head><body><main>"
            + "\n".join(body) + "</main></body></html>")


def _summary_section(tok: TrainedTokenizer, tokens_left: Sequence[int], corpus_bytes: int,
                     corpus_tokens: int, sample: SampleStats | None) -> list[str]:
    e = html.escape
    final_tokens = tokens_left[-1] if tokens_left else corpus_tokens
    train_bpt = corpus_bytes / final_tokens if final_tokens else float("nan")
    summary = [
        ("vocabulary", f"{len(tok.vocab) + len(tok.special_tokens):,} = {tok.base.size:,} "
                       f"base ({tok.base.alphabet}) + {len(tok.merges):,} merges + "
                       f"{len(tok.special_tokens)} special"),
        ("split pattern", _shown(tok.pattern) if len(tok.pattern) < 40 else "custom regex"),
        ("special tokens", ", ".join(map(_shown, tok.special_tokens)) or "none"),
        ("normalization", f"{tok.normalization}{', lowercase' if tok.lowercase else ''}"),
        ("training corpus", f"{corpus_bytes:,} bytes in words; {corpus_tokens:,} → "
                            f"{final_tokens:,} tokens"),
        ("bytes per token (training corpus)", f"{train_bpt:.3f}"),
    ]
    if sample is not None and sample.curve:
        summary.append((f"bytes per token ({'held-out ' if sample.held_out else ''}sample)",
                        f"{sample.curve[-1][1]:.3f} on {sample.rows:,} rows, "
                        f"{sample.bytes:,} bytes"))
    return ['<table class="kv">' + "".join(f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>"
                                           for k, v in summary) + "</table>"]


def _trace_section(tok: TrainedTokenizer, tokens_left: Sequence[int]) -> list[str]:
    vocab, n_merges = tok.vocab, len(tok.merges)

    def trace_rows(idx: range) -> str:
        rows = []
        for i in idx:
            m = tok.merges[i]
            left = tokens_left[i] if i < len(tokens_left) else ""
            rows.append(f'<tr><td class="num">{i + 1:,}</td><td>{_tok_cell(vocab[m.left])} + '
                        f'{_tok_cell(vocab[m.right])}</td><td>{_tok_cell(vocab[m.new_id])}</td>'
                        f'<td class="num">{m.count:,}</td><td class="num">'
                        f'{left if left == "" else f"{left:,}"}</td></tr>')
        return "".join(rows)

    head = ('<table><colgroup><col style="width:9%"><col style="width:35%">'
            '<col style="width:22%"><col style="width:16%"><col style="width:18%"></colgroup>'
            '<tr><th class="num">rank</th><th>pair</th><th>new token</th><th class="num">'
            'count</th><th class="num">tokens left</th></tr>')
    out = ["<h2>Merge trace</h2>",
           '<p class="meta">Each merge joins the most frequent adjacent pair; count is how '
           'often it occurred when chosen. ␣ is a space, ↵ a newline, ⇥ a tab.</p>']
    if n_merges <= 2 * TRACE_ROWS:
        out.append(head + trace_rows(range(n_merges)) + "</table>")
    else:
        out.append("<h3>First merges</h3>" + head + trace_rows(range(TRACE_ROWS)) + "</table>")
        out.append("<h3>Last merges</h3>" + head +
                   trace_rows(range(n_merges - TRACE_ROWS, n_merges)) + "</table>")
    return out


def _compression_section(tokens_left: Sequence[int], corpus_bytes: int, corpus_tokens: int,
                         sample: SampleStats | None) -> list[str]:
    series = [("training corpus", "#2f6fdf", corpus_curve(corpus_bytes, corpus_tokens,
                                                            tokens_left))]
    if sample is not None and sample.curve:
        series.append(("held-out sample" if sample.held_out else "sample (training rows)",
                       "#e0702b", sample.curve))
    out = ["<h2>Compression</h2>", line_chart(series, "merges", "bytes per token")]
    if sample is not None:
        out.append(f'<p class="meta">Sample: {html.escape(_shown(sample.label))}.</p>')
    return out


def _lengths_section(tok: TrainedTokenizer, sample: SampleStats | None) -> list[str]:
    vocab, text = tok.vocab, _text_vocab(tok)  # (lengths of text, as the sample's are)
    cats = [str(i) for i in range(1, LONG_TOKEN)] + [f"{LONG_TOKEN}+"]
    vlen = Counter(min(len(t), LONG_TOKEN) for t in text if t)
    nv = sum(vlen.values()) or 1
    hist = [("vocabulary tokens", "#2f6fdf", [vlen.get(i, 0) / nv
                                                for i in range(1, LONG_TOKEN + 1)])]
    if sample is not None and sample.length_hist:
        ns = sum(sample.length_hist.values()) or 1
        hist.append(("tokens used in the sample", "#e0702b",
                     [sample.length_hist.get(i, 0) / ns for i in range(1, LONG_TOKEN + 1)]))
    out = ["<h2>Token lengths</h2>",
           bar_chart(cats, hist, "share of tokens by length in bytes")]
    longest = sorted(range(tok.base.size, len(vocab)), key=lambda i: -len(text[i]))[:8]
    if longest:
        out.append('<p class="meta">Longest tokens: ' + " ".join(_tok_cell(vocab[i])
                                                                  for i in longest) + "</p>")
    return out


def _examples_section(sample: SampleStats | None) -> list[str]:
    if sample is None or not sample.examples:
        return []
    out = ["<h2>Examples</h2>",
           '<p class="meta">Text from the sample, split into tokens (alternating colours; a '
           'dashed box is one character made of several byte tokens).</p>']
    for toks in sample.examples:
        n_bytes = sum(len(t) if isinstance(t, bytes) else len(t.encode()) for t in toks)
        out.append(f'<p class="meta">{len(toks)} tokens, {n_bytes} bytes, '
                   f"{n_bytes / max(len(toks), 1):.2f} bytes per token</p>")
        out.append(f'<div class="example">{_example_html(toks)}</div>')
    return out


# -- the Spark-facing entry point ----------------------------------------------------------------

def _sample_texts(spark, cfg) -> tuple[list, str, bool]:
    """Up to ``report_sample_rows`` rows: from ``report_sample`` (held out, Parquet) or the
    training input (every source, any format, or the catalog table); the first rows of up to
    ``SAMPLE_FILES`` Parquet files spread over it, or, through Spark's reader for other
    formats, the first rows of each source, so the cost is bounded."""
    n = cfg.report_sample_rows
    if cfg.report_sample:
        sources, parquet = [cfg.report_sample], True
    else:
        sources = [cfg.input_table] if cfg.input_table else list(cfg.inputs)
        parquet = cfg.input_format == "parquet" and not cfg.input_table
    if not sources or n <= 0:
        return [], "", False
    rows = _parquet_rows(spark, cfg, sources, n) if parquet else _reader_rows(spark, cfg,
                                                                              sources, n)
    if cfg.report_sample:
        label = f"{len(rows)} rows held out in {cfg.report_sample}"
    else:
        label = (f"{len(rows)} rows of the training input "
                 f"{cfg.input_table or cfg.input} (not held out: set report_sample to a "
                 "Parquet of held-out text for an unbiased curve)")
    return rows, label, bool(cfg.report_sample)


def check_report_sample(cfg) -> None:
    """A local ``report_sample`` must be Parquet with the text column: said before the count
    (a one-line config error), not found after training as a report without its sample."""
    import pyarrow.parquet as pq

    from pipeline.config import ConfigError
    from pipeline.count.corpus import first_line, list_local_corpus

    path = cfg.report_sample
    if (not path or cfg.report_sample_rows <= 0 or not fsutil.is_local(path)
            or fsutil.has_glob(path)):
        return  # (not used, or not local: the report says so if it cannot read it)
    why = ""
    try:
        files = list_local_corpus(path, cfg.text_column,
                                  skipped=[] if cfg.ignore_corrupt_files else None)
        if files is None and os.path.isfile(fsutil.local_path(path)):
            names = pq.read_schema(fsutil.local_path(path)).names
            if cfg.text_column not in names:
                why = f"no column {cfg.text_column!r} (columns: {', '.join(names)})"
    except ConfigError as exc:
        why = re.sub(r"^config key '\w+': ", "", str(exc))
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds
        why = first_line(exc)
    if why:
        raise ConfigError(f"config key 'report_sample': {path} is not a Parquet sample of "
                          f"held-out text: {why}")


def _parquet_rows(spark, cfg, sources: list[str], n: int) -> list:
    from pipeline.count.corpus import (
        as_uri,
        column,
        list_local_corpus,
        literal_path,
        normalize_uri,
    )
    from pipeline.spark_session import file_reader

    def reader():  # (made when needed: a local sample is read without a SparkSession)
        return file_reader(spark, cfg.ignore_corrupt_files)

    skipped: list[str] | None = [] if cfg.ignore_corrupt_files else None
    files = [f for src in sources for f in list_local_corpus(src, cfg.text_column,
                                                              skipped=skipped)
             or sorted(normalize_uri(u) for u in  # (file names, not URIs: a local one
                       reader().parquet(fsutil.spark_path(src)).inputFiles())]  # is opened)
    picked = files[:: max(1, len(files) // SAMPLE_FILES)][:SAMPLE_FILES]
    per_file = -(-n // max(len(picked), 1))
    rows: list = []
    for f in picked:
        want = min(per_file, n - len(rows))
        try:
            if fsutil.is_local(f):  # a local file: read its first rows directly, no Spark job
                rows += _first_rows(fsutil.local_path(f), cfg.text_column, want)
            else:
                df = reader().parquet(literal_path(as_uri(f))).select(column(cfg.text_column))
                rows += [r[0] for r in df.limit(want).collect()]
        except Exception as exc:
            if not cfg.ignore_corrupt_files:
                raise
            # as the count did with this setting: the file is left out, the sample goes on
            log.warning("report: left out the unreadable file %s (%s)", f,
                        str(exc).strip().splitlines()[0] if str(exc).strip() else
                        type(exc).__name__)
            continue
        if len(rows) >= n:
            break
    return rows


def _reader_rows(spark, cfg, sources: list[str], n: int) -> list:
    """The first rows of each source through the count's own reader (JSON, text, CSV, ORC,
    Delta, a catalog table): one bounded Spark job per source."""
    from pipeline.count.corpus import read_source, skipping_corrupt_files

    rows: list = []
    per_source = -(-n // len(sources))
    with skipping_corrupt_files(spark, cfg.ignore_corrupt_files):
        for name in sources:
            if len(rows) >= n:
                break
            df = read_source(spark, cfg, name, None)[0].select(cfg.text_column)
            rows += [r[0] for r in df.limit(min(per_source, n - len(rows))).collect()]
    return rows


def _first_rows(path: str, column: str, n: int) -> list:
    import pyarrow.parquet as pq

    rows: list = []
    for batch in pq.ParquetFile(path).iter_batches(batch_size=max(n, 1), columns=[column]):
        rows += text_values(batch.column(0))[: n - len(rows)]
        if len(rows) >= n:
            break
    return rows


def write_report(spark, cfg, tok: TrainedTokenizer, tokens_left: Sequence[int],
                 corpus_bytes: int, corpus_tokens: int,
                 before_write: Callable[[], None] = lambda: None) -> str:
    """Write ``report.html`` into the run directory (``cfg.output``); returns its path.

    ``corpus_bytes``, ``corpus_tokens``: the training corpus's bytes in words and its tokens
    before the first merge (``tokens_left`` continues from it), as ``train`` summed them from
    the word table. The sample comes from ``cfg.report_sample`` (held out) or ``cfg.input``; if
    it cannot be read the report says so and is written without it. ``before_write``:
    called just before the file is written (the run's lease check: making the report may
    take a while)."""
    notes = list(export_notes(tok))
    sample = None
    try:
        texts, label, held_out = _sample_texts(spark, cfg)
        if texts:
            sample = measure_sample(tok, texts, label, held_out)
        elif cfg.words and not cfg.report_sample and cfg.report_sample_rows > 0:
            notes.append("no sample in this report: the run trained from a word table "
                         "(words), which holds no text to sample; give report_sample "
                         "(--report-sample PATH, Parquet of held-out text) for a "
                         "compression curve and examples")
    except Exception as exc:  # noqa: BLE001 - the report must not fail a finished run
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        notes.append(f"no sample in this report: could not read "
                     f"{cfg.report_sample or cfg.input}: {first}")
        log.warning("report.html without a sample: %s", first)
    page = render_report(tok, tokens_left, corpus_bytes, corpus_tokens, sample,
                         title=f"spark-bpe run: {cfg.output.rstrip('/').rsplit('/', 1)[-1]}",
                         notes=notes)
    path = fsutil.join(cfg.output, "report.html")
    before_write()
    fsutil.write_text(spark, path, page)
    return path
