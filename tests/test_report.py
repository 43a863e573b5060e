"""report.html: its numbers against independent computations, the Spark entry point, and a
render in headless Chromium (skipped when no Chromium is installed) that must not scroll
sideways."""

from __future__ import annotations

import html
import importlib.util
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.bpe import bytes_vocab, encode_symbols
from pipeline.config import Config
from pipeline.encoder import LONG_WORD, SHORT_WORD
from pipeline.engines.local import LocalTrainer
from pipeline.report import (
    LONG_TOKEN,
    TRACE_ROWS,
    _visible,
    measure_sample,
    merge_ranks_applied,
    render_report,
    write_report,
)

from .conftest import MULTILINGUAL, REPO, need
from .naive_count import naive_count
from .test_exports import EOT, rows_of, train_in_memory


def _load_render_script():
    spec = importlib.util.spec_from_file_location("render_report",
                                                  REPO / "scripts" / "render_report.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["render_report"] = mod  # dataclasses need their module registered
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A multilingual run, its exact per-merge token counts, and held-out rows."""
    d = tmp_path_factory.mktemp("report")
    texts = rows_of(MULTILINGUAL, "part-00000.parquet", 300_000)
    tok = train_in_memory(texts, d, "cl100k", 1500, (EOT,))
    table = naive_count([texts], "cl100k", (EOT,)).rows()
    total = sum(len(w) * c for w, c, _ in table)
    held = rows_of(MULTILINGUAL, "part-00002.parquet", 40_000)
    return tok, texts, held, total, d


def assert_as_replayed(sample, weights: np.ndarray, merges) -> None:
    """merge_ranks_applied on these weighted words gives what replaying ``merges`` in order
    on them gives (the local engine's replay): removals per merge, final tokens per word."""
    lengths = np.array([len(w) for w in sample], dtype=np.int64)
    flat = np.array([b for w in sample for b in w], dtype=np.int64)
    removed, final, per_word = merge_ranks_applied(flat, lengths, weights, merges)
    replay = LocalTrainer(flat, lengths, weights, bytes_vocab().tokens)
    replay.replay(merges)
    assert removed.tolist() == replay.removed
    tokens, per_word_replayed, _ = replay.state.words(min_tokens=1)
    assert final.tolist() == tokens.tolist()
    assert per_word.tolist() == per_word_replayed.tolist()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.sampled_from(b"abc"), min_size=1, max_size=12), min_size=1,
                max_size=25),
       st.lists(st.lists(st.sampled_from(b"abc"), min_size=1, max_size=12), min_size=1,
                max_size=25),
       st.integers(1, 30))
def test_lowest_rank_encoding_removes_what_a_replay_removes(train_words, sample_words, n):
    """The report's per-word lowest-rank-first encoding equals replaying the merge list in
    order (tokens removed by each merge, final tokens), for merges learnt on other words."""
    base = bytes_vocab()
    learner = LocalTrainer.from_words(train_words, [1 + i % 3 for i in range(len(train_words))],
                                      base.tokens)
    learner.train(n, 1)
    weights = np.array([1 + i % 4 for i in range(len(sample_words))], dtype=np.int64)
    assert_as_replayed(sample_words, weights, learner.merges)


@pytest.mark.parametrize("length", [SHORT_WORD + 7, LONG_WORD + 3, 3 * LONG_WORD])
def test_long_words_remove_what_a_replay_removes(length):
    """Words long enough for the heap and the numpy paths of ``bpe_encode`` (a pathological
    row kept with ``max_word_bytes = 0``): the same numbers as a replay."""
    rng = np.random.default_rng(length)
    base = bytes_vocab()
    train_words = [bytes(rng.choice(list(b"aab "), size=40)) for _ in range(30)]
    learner = LocalTrainer.from_words([list(w) for w in train_words], [2] * 30, base.tokens)
    learner.train(60, 1)
    sample = [b"a" * length, bytes(rng.choice(list(b"ab "), size=length)), b"ab"]
    weights = np.array([3, 1, 2], dtype=np.int64)
    assert_as_replayed(sample, weights, learner.merges)


def oracle_measure(held: list[str], merges) -> tuple[int, int, Counter]:
    """(bytes, tokens, token-length histogram) of the held-out rows, from the naive count's
    words (tests/naive_count.py) encoded by the definition (``bpe.encode_symbols``): neither
    the Pretokenizer nor the encoder the report uses."""
    table = naive_count([held], "cl100k", (EOT,))
    ranks = {(m.left, m.right): m.new_id for m in merges}
    length = dict.fromkeys(range(256), 1)
    for m in merges:
        length[m.new_id] = length[m.left] + length[m.right]
    n_bytes = n_tokens = 0
    hist: Counter = Counter()
    for word, count in table.counts.items():
        ids = encode_symbols(list(word), ranks)
        n_bytes += len(word) * count
        n_tokens += len(ids) * count
        for i in ids:
            hist[min(length[i], LONG_TOKEN)] += count
    return n_bytes, n_tokens, hist


def test_numbers_match_an_independent_encoding(trained):
    tok, texts, held, total, d = trained
    sample = measure_sample(tok, held, "held out rows", held_out=True)
    n_bytes, n_tokens, hist = oracle_measure(held, tok.merges)
    assert sample.bytes == n_bytes
    assert sample.curve[0] == (0, 1.0)  # bytes alphabet: one token per byte before merging
    assert sample.curve[-1][0] == len(tok.merges)
    assert sample.curve[-1][1] == pytest.approx(n_bytes / n_tokens)
    assert sum(sample.length_hist.values()) == n_tokens
    assert sample.length_hist == hist
    # a point inside the curve: encode afresh with that prefix of the merge list
    k, bpt = sample.curve[len(sample.curve) // 10]
    assert 0 < k < len(tok.merges)
    assert bpt == pytest.approx(n_bytes / oracle_measure(held, tok.merges[:k])[1])
    for toks in sample.examples:  # the examples are real encodings of text from the sample
        joined = b"".join(t if isinstance(t, bytes) else t.encode() for t in toks)
        assert any(joined.decode() in t for t in held)


def test_page_shows_trace_curve_and_examples(trained):
    tok, texts, held, total, d = trained
    left = [total - i for i in range(1, len(tok.merges) + 1)]  # any decreasing sequence
    sample = measure_sample(tok, held, "held out rows", held_out=True)
    page = render_report(tok, left, total, total, sample, title="my run")
    assert page.count("<svg") == 2 and "held-out sample" in page
    rows = re.findall(r'<tr><td class="num">([\d,]+)</td>', page)
    ranks = [int(r.replace(",", "")) for r in rows]
    n = len(tok.merges)
    assert ranks == list(range(1, TRACE_ROWS + 1)) + list(range(n - TRACE_ROWS + 1, n + 1))
    first = tok.merges[0]
    assert html.escape(_visible(tok.vocab[first.new_id])) in page
    assert f"{first.count:,}" in page
    assert page.count('class="example"') == len(sample.examples) > 0
    assert f"{total / left[-1]:.3f}" in page


@pytest.mark.spark
def test_write_report_through_spark(spark, trained, tmp_path):
    tok, texts, held, total, d = trained
    (tmp_path / "held").mkdir()
    pq.write_table(pa.table({"text": held}), tmp_path / "held" / "a.parquet")
    cfg = Config(output=str(tmp_path / "run"), report_sample=str(tmp_path / "held"),
                 report_sample_rows=50)
    path = write_report(spark, cfg, tok, [7] * len(tok.merges), 8, 8)
    page = Path(path).read_text()
    assert "8 bytes in words" in page and "held out in" in page and "held-out sample" in page
    cfg = Config(output=str(tmp_path / "run2"), input=str(tmp_path / "nope"))
    page = Path(write_report(spark, cfg, tok, [7] * len(tok.merges), 8, 8)).read_text()
    assert "no sample in this report" in page  # an unreadable sample does not fail the run


def test_report_renders_without_sideways_scrolling(trained, tmp_path):
    mod = _load_render_script()
    binary = mod.find_chromium()
    need(binary is not None, "no Chromium (bash scripts/setup_tests.sh installs it)")
    tok, texts, held, total, d = trained
    left = [total - i for i in range(1, len(tok.merges) + 1)]
    page = render_report(tok, left, total, total, measure_sample(tok, held, "held out", True))
    report = tmp_path / "report.html"
    report.write_text(page, encoding="utf-8")
    for width in (1000, 412):
        r = mod.render(report, width, tmp_path / f"r{width}.png", binary)
        assert r.ok, f"scrolls sideways at {width}px: {r.overflowing}"
        assert r.height > 1000 and r.png.stat().st_size > 10_000
    # the check itself can fail: a page with one unbreakable wide line
    wide = tmp_path / "wide.html"
    wide.write_text("<html><body><pre>" + "x" * 400 + "</pre></body></html>")
    assert not mod.render(wide, 600, None, binary).ok


def test_examples_show_a_special_token_as_one_special(tmp_path):
    """A special token in the sample is one special token in the report's examples, as
    training cuts it out of the text: it was encoded as ordinary text, byte by byte."""
    from pipeline.report import examples

    tok = train_in_memory(["hello world, more text here"] * 20, tmp_path, "cl100k", 300,
                          (EOT,), min_pair_count=1)
    (shown,) = examples(tok, [f"hello world and some filler text {EOT} more text here"])
    assert EOT in shown
    assert b"<" not in shown and b"<|" not in shown
    assert b"".join(t.encode() if isinstance(t, str) else t for t in shown) == \
        f"hello world and some filler text {EOT} more text here".encode()


def test_odd_samples_render_truthfully(tmp_path):
    """Found by review: a sample of 3 rows gave 2 examples; an invalid byte swallowed the
    tokens after it into one "incomplete" span; a NUL or a right-to-left override reached the
    page raw (a parse error; the tokens after it shown reversed); a merges axis of 2 merges
    read 0.50, 1.50; a 2.5% gridline read "2%"; a chars run's end-of-word suffix was counted
    as text in its examples' bytes (2.10 bytes per token beside the summary's 0.90)."""
    from pipeline.bpe import BaseVocab, Merge
    from pipeline.outputs import TrainedTokenizer
    from pipeline.report import _example_html, bar_chart, examples, line_chart

    tok = train_in_memory(["row one", "row two", "row three"] * 5, tmp_path, "cl100k", 260,
                          (), min_pair_count=1)
    assert len(examples(tok, ["row one", "row two", "row three"])) == 3

    page = _example_html([b"\xff", b"c", b"d"])
    assert page.count("<span") == 3 and "incomplete" not in page
    page = _example_html([b"a\x00", "\u202e".encode(), b"xy", "\u200d".encode()])
    assert "\x00" not in page and "\u202e" not in page
    assert "\\u0000" in page and "\\u202e" in page and "\u200d" in page  # (a joiner stays)
    title = render_report(tok, [10, 9], 10, 10, None, title="run \u202e x")
    assert "\u202e" not in title and "run \\u202e x" in title

    ticks = re.findall(r'text-anchor="middle">([^<]+)</text>',
                       line_chart([("s", "#000", [(0, 1.0), (1, 1.5), (2, 2.0)])], "merges",
                                  "bytes per token"))
    assert ticks[:3] == ["0", "1", "2"], ticks
    labels = re.findall(r'text-anchor="end">([^<]+%)</text>',
                        bar_chart(["1", "2"], [("v", "#000", [0.1, 0.02])], "y"))
    assert labels == ["0%", "2.5%", "5%", "7.5%", "10%"]

    base = BaseVocab("chars", [b"a", b"b", b" ", b"</w>"], "</w>")
    chars = TrainedTokenizer(base, [Merge(0, 3, 4, 5), Merge(1, 3, 5, 3)], [], "gpt2")
    (shown,) = examples(chars, ["ab ba aab"])
    assert b"".join(shown) == b"ab ba aab"  # the text, no suffix bytes
    sample = measure_sample(chars, ["ab ba aab"], "sample")
    assert sample.bytes == 9 and max(sample.length_hist) == 1  # ("a</w>": 1 byte of text)


def test_lengths_labels_and_notes_found_by_review(tmp_path, monkeypatch):
    """A chars run's vocabulary histogram counted its end-of-word suffix as text ("a</w>": 5
    bytes) while the sample's beside it did not; a sample label or a note with a lone
    surrogate (a path decoded with surrogateescape) made the page unwritable as UTF-8 and
    failed a finished run; a run from a word table said nothing about its missing sample."""
    from pipeline import report as report_mod
    from pipeline.bpe import BaseVocab, Merge
    from pipeline.outputs import TrainedTokenizer

    base = BaseVocab("chars", [b"a", b"b", b" ", b"</w>"], "</w>")
    chars = TrainedTokenizer(base, [Merge(0, 3, 4, 5), Merge(1, 3, 5, 3)], [], "gpt2")
    shares = {}
    monkeypatch.setattr(report_mod, "bar_chart",
                        lambda cats, series, label: shares.update(series[0:1] and
                                                                  {"v": series[0][2]}) or "")
    report_mod._lengths_section(chars, None)
    assert shares["v"][0] == 1.0  # a, b, space, a</w>, b</w>: one byte of text each

    sample = measure_sample(chars, ["ab ba"], "rows of data/caf\udce9")
    page = render_report(chars, [5, 4], 5, 5, sample, title="run",
                         notes=["could not read data/caf\udce9: no such file"])
    page.encode("utf-8")  # (raised: surrogates not allowed)
    assert "caf\\udce9" in page

    monkeypatch.setattr(report_mod.fsutil, "write_text",
                        lambda spark, path, text: shares.update(page=text))
    cfg = Config(words=str(tmp_path / "words"), output=str(tmp_path / "run"))
    write_report(None, cfg, chars, [5, 4], 5, 5)
    assert "trained from a word table" in shares["page"] and "report_sample" in shares["page"]
