"""Pathological rows: one bad row must not stall or kill a run (the encoder side).

A row of 2 M spaces, 20 M letters, 5 M digits or 5 M punctuation marks is one huge word (or
millions of small ones) after the split. Both encoders take each in a few seconds with the same
ids: the reference :class:`pipeline.encoder.Tokenizer` (its word merge is O(n log n):
``merge_heap``, and ``merge_groups`` for very long words) and the encode job's
:class:`pipeline.encode_corpus.BatchEncoder` (tiktoken, and the reference encoder for a row
tiktoken cannot take or takes slowly: it panics on a whitespace run of ~1 M characters, and
is 3x slower than the reference on a long run of one letter). The fast merges are held to the
plain quadratic algorithm on random words and random merge tables.
"""

from __future__ import annotations

import functools
import json
import random
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import encode_corpus as ec
from pipeline import encoder
from pipeline.bpe import Merge, bytes_vocab, encode_symbols
from pipeline.config import Config
from pipeline.encoder import (
    PairRanks,
    PairTable,
    Tokenizer,
    bpe_encode,
    merge_groups,
    merge_heap,
    merge_scan,
)
from pipeline.outputs import write_run_json
from pipeline.patterns import PATTERNS, fast_pattern
from pipeline.pretokenize import Pretokenizer, PretokenizerSpec

from .conftest import EN_DOCS, need_module
from .test_exports import EOT, rows_of, train_in_memory

tiktoken = need_module("tiktoken")

PUNCT = "!?.,;:-_()[]{}"


@functools.cache  # made once: 10 M random characters take seconds (not to be changed)
def pathological_rows() -> dict[str, str]:
    rng = random.Random(7)
    return {
        "spaces": " " * 2_000_000 + "x",
        "letters": "a" * 20_000_000,
        "digits": "".join(rng.choices("0123456789", k=5_000_000)),
        "punct": "".join(rng.choices(PUNCT, k=5_000_000)),
    }


# Seconds allowed per row and encoder: 5-10x what a 2-core test machine takes (0.3-1 s; 20 M
# letters ~5 s). The encoder before this test took 11-18 s on the space row, 40-56 s on the
# letters (cl100k, o200k) and up to 23 s on the digits (gpt2: one word); a quadratic one, hours.
BUDGET = {"spaces": 5.0, "letters": 25.0, "digits": 8.0, "punct": 5.0}


def slow_bpe(symbols: list[int], pair_ranks: PairRanks) -> list[int]:
    """The old simple algorithm, kept as the reference: rescan every pair for the lowest rank,
    merge the leftmost one, repeat (quadratic)."""
    toks = list(symbols)
    while True:
        best = None
        for i in range(len(toks) - 1):
            r = pair_ranks.get((toks[i], toks[i + 1]))
            if r is not None and (best is None or r[0] < best[0][0]):
                best = (r, i)
        if best is None:
            return toks
        (_, new), i = best
        toks[i:i + 2] = [new]


def timed(fn: Callable[[], list[int]]) -> tuple[list[int], float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


# -- a run trained on real text plus runs of one character ---------------------------------------

def training_texts() -> list[str]:
    """en-docs, plus rows that give the merge table tokens for runs of spaces, ``a``, digits and
    punctuation (so the long words below take many merges, with ties inside runs)."""
    rng = random.Random(3)
    extra = []
    for k in (2, 3, 4, 5, 8, 13, 16, 32, 64):
        extra += ["a" * k + " " + "A" * k, " " * k + "x", "\n" * k]
    for _ in range(60):
        extra.append(" ".join("".join(rng.choices("0123456789", k=rng.randint(2, 9)))
                              for _ in range(20)))
        extra.append(" ".join("".join(rng.choices(PUNCT, k=rng.randint(2, 6)))
                              for _ in range(20)))
    return rows_of(EN_DOCS, "part-00000.parquet", 150_000) + extra


_RUNS: dict[str, Path] = {}  # pattern -> a run trained on training_texts() (once per session)
_REFERENCE_IDS: dict[tuple[str, str], list[int]] = {}  # (run, case) -> the reference's ids


def trained_run(pattern: str, tmp_path_factory) -> Path:
    if pattern not in _RUNS:
        d = tmp_path_factory.mktemp(f"long-{pattern}")
        train_in_memory(training_texts(), d, pattern, 1200, (EOT,))
        _RUNS[pattern] = d
    return _RUNS[pattern]


def reference_ids(run: Path, case: str, ref: Tokenizer) -> list[int]:
    """The reference encoder's ids for a pathological row (encoded once per run: 20 M letters
    take seconds)."""
    key = (str(run), case)
    if key not in _REFERENCE_IDS:
        _REFERENCE_IDS[key] = ref.encode(pathological_rows()[case])
    return _REFERENCE_IDS[key]


@pytest.fixture(scope="module", params=["cl100k", "gpt2", "o200k"])
def run_dir(request, tmp_path_factory) -> Path:
    return trained_run(request.param, tmp_path_factory)


def batch_encoder(run: Path, engine: str = "tiktoken") -> ec.BatchEncoder:
    cfg = Config(tokenizer=str(run), input="unused", output="unused", encode_engine=engine)
    return ec.BatchEncoder(ec.load_plan(None, cfg))


# -- the four pathological rows --------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("case", ["spaces", "letters", "digits", "punct"])
def test_pathological_row_both_encoders(run_dir: Path, case: str):
    """Each row in seconds through the reference encoder and through the encode job's encoder
    (tiktoken, or the reference where tiktoken cannot take the row): same ids, exact decode."""
    text = pathological_rows()[case]
    ref = Tokenizer.load(str(run_dir))
    ids, sec = timed(lambda: ref.encode(text))
    assert sec < BUDGET[case], f"reference encoder: {sec:.1f} s"
    _REFERENCE_IDS[(str(run_dir), case)] = ids
    enc = batch_encoder(run_dir)
    (got, n_special), sec = timed(lambda: enc.encode(text))
    assert sec < BUDGET[case], f"encode job's encoder: {sec:.1f} s"
    assert n_special == 0 and got == ids
    assert ref.decode(ids) == text
    # which path: tiktoken panics on a ~1 M whitespace run and is slower on a run of one
    # letter, so those rows are the reference encoder's
    assert bool(enc.via_reference) == (case in ("spaces", "letters"))
    assert not enc.tiktoken_error
    if case == "spaces":  # an independent check of that row: tiktoken's own BPE, no regex
        tk = enc.tk
        expected = [t for w in ref.words(text) for t in tk._encode_single_piece(w.encode())]
        assert ids == expected
    if case == "letters":  # one word: tiktoken's BPE of a piece past LONG_WORD (the same path
        piece = text[: 4 * encoder.LONG_WORD]  # of ours, merge_groups), 20 M would take long
        assert ref.encode(piece) == enc.tk._encode_single_piece(piece.encode())


@pytest.mark.slow
def test_split_of_pathological_rows_is_fast():
    """The split itself (``regex`` with the named patterns, ``re`` with their translations,
    and the Pretokenizer that picks between them) is linear on these rows."""
    rows = pathological_rows()
    for name, pattern in PATTERNS.items():
        full = regex.compile(pattern)
        fast = re.compile(fast_pattern(name)).findall if sys.version_info >= (3, 11) else None
        pre = Pretokenizer(PretokenizerSpec(name))
        for case, text in rows.items():
            for how, findall in (("regex", full.findall), ("re", fast),
                                 ("pretokenizer", pre.words)):
                if findall is None:  # possessive quantifiers in ``re`` from Python 3.11
                    continue
                words, sec = timed(lambda f=findall, t=text: f(t))
                assert sec < 8, f"{name} {how} split of {case}: {sec:.1f} s"
                assert "".join(words) == text


def test_tiktoken_failure_falls_back_per_row(run_dir: Path):
    """A row tiktoken raises or panics on is encoded by the reference encoder (same ids) and
    counted; the batch goes on. (pyo3's PanicException is a BaseException.)"""

    class PanicException(BaseException):
        pass

    class Failing:
        def __init__(self, real, exc: BaseException):
            self.real, self.exc = real, exc

        def encode_ordinary(self, text: str) -> list[int]:
            if "boom" in text:
                raise self.exc
            return self.real.encode_ordinary(text)

    enc = batch_encoder(run_dir)
    rows = ["fine row", "boom row", None, "another fine row", "boom again"]
    batch = pa.RecordBatch.from_arrays([pa.array(rows), pa.array(range(len(rows)))],
                                       names=["text", "k"])
    ref = Tokenizer.load(str(run_dir))
    for exc in (PanicException("called `Result::unwrap()` on an `Err` value: StackOverflow"),
                ValueError("no")):
        enc.tk = Failing(batch_encoder(run_dir).tk, exc)
        stats = dict.fromkeys(ec.STAT_KEYS, 0)
        ids = ec.encode_batch(enc, batch, stats).to_pylist()
        assert ids == [None if t is None else ref.encode(t) for t in rows]
        assert stats["rows_via_reference"] == 2 and stats["tiktoken_errors"] == 2
    enc.tk = Failing(batch_encoder(run_dir).tk, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):  # stopping the job is not a tiktoken failure
        enc.encode("boom")


def test_real_tiktoken_panic_is_caught(run_dir: Path, monkeypatch):
    """Without the whitespace-run check, tiktoken itself meets the 2 M space row: whether it
    panics (0.14 does) or not, the row gets the reference encoder's ids."""
    monkeypatch.setattr(ec, "_long_run", lambda text: "")
    text = " " * 1_200_000 + "x"
    enc = batch_encoder(run_dir)
    got, _ = enc.encode(text)
    assert got == Tokenizer.load(str(run_dir)).encode(text)
    assert bool(enc.via_reference) == bool(enc.tiktoken_error)


def test_old_tiktoken_long_pieces_go_to_the_reference(run_dir: Path, monkeypatch):
    """tiktoken before 0.13 is quadratic in a piece's length: rows with a long piece (by the
    run's own split) go to the reference encoder; others stay with tiktoken."""
    monkeypatch.setattr(ec, "_tiktoken_version", lambda module: (0, 12))
    enc = batch_encoder(run_dir)
    ref = Tokenizer.load(str(run_dir))
    long_row = "word " * 2000 + "b" * (ec.TIKTOKEN_MAX_PIECE + 1)
    for text, to_ref in ((long_row, True), ("word " * 2000, False), ("short", False)):
        got, _ = enc.encode(text)
        assert got == ref.encode(text)
        assert bool(enc.via_reference) == to_ref


def test_rows_with_a_character_newer_than_pythons_unicode_go_to_the_reference(run_dir: Path):
    """A character Python's Unicode database does not know (U+323B0, a CJK ideograph of a
    Unicode newer than 14) may be a letter to the regex package (our split, at training too)
    and unassigned to tiktoken's regex engine, which then splits the text around it otherwise
    (found by the fuzz test: tiktoken gave 5 ids where the reference gave 1): such rows go to
    the reference encoder; rows of known characters, emoji included, stay with tiktoken."""
    enc = batch_encoder(run_dir)
    ref = Tokenizer.load(str(run_dir))
    for text, to_ref in (("A\U000323b0", True), ("x \U000323b0\U000323b1 y", True),
                         ("caf\u00e9 \U0001f600 \u65e5\u672c \u0870", False),
                         ("plain ascii", False)):
        got, _ = enc.encode(text)
        assert got == ref.encode(text), text
        assert bool(enc.via_reference) == to_ref, (text, enc.via_reference)
    enc.encode("A\U000323b0")
    assert "U+323B0" in enc.via_reference


def test_rows_with_surrogate_escapes_go_to_the_reference(run_dir: Path):
    """A str row holding U+DC80..U+DCFF (the surrogate escape of an invalid UTF-8 byte, as
    decode_row makes them) encodes those bytes, as the reference does: tiktoken would make
    each U+FFFD (3 ids where the reference gives 1). Other lone surrogates stay with
    tiktoken, which repairs them as the reference does."""
    enc = batch_encoder(run_dir)
    ref = Tokenizer.load(str(run_dir))
    for text, to_ref in (("x\udc80y", True), ("\udcff\udc80", True), ("caf\u00e9 \udcc3", True),
                         ("a\ud800b", False), ("lone \udc00 low", False)):
        got, _ = enc.encode(text)
        assert got == ref.encode(text), repr(text)
        assert bool(enc.via_reference) == to_ref, (text, enc.via_reference)
    assert ref.decode_bytes(enc.encode("x\udc80y")[0]) == b"x\x80y"
    enc.encode("\udcff")
    assert "U+DCFF" in enc.via_reference and "invalid UTF-8" in enc.via_reference


def test_a_normalizing_runs_surrogate_pairs_and_a_run_without_export(tmp_path: Path, caplog):
    """A str holding a surrogate pair, given to BatchEncoder.encode of a run that normalizes
    or lowercases: the pair is joined before normalizing, as the reference encoder does
    (normalized first, it stayed two surrogates, which tiktoken made U+FFFD). A run written
    without a tiktoken export: encode_engine auto takes the reference encoder, saying so;
    tiktoken asked for is one line saying what is missing."""
    from pipeline.config import ConfigError

    texts = ["Mathematical \U0001d400 bold A and \U00010400 Deseret, ﬁne ligatures"] * 20
    run = tmp_path / "nfkc"
    train_in_memory(texts, run, vocab_size=300, lowercase=True, normalization="NFKC")
    enc, ref = batch_encoder(run), Tokenizer.load(str(run))
    for text in ("\ud835\udc00", "x \ud801\udc00 y", "\ud835\udc00\udc80", "lone \ud800"):
        assert enc.encode(text)[0] == ref.encode(text), repr(text)
    for name in ("tokenizer.tiktoken", "tiktoken.json"):
        (run / name).unlink()
    write_run_json(str(run), {"merges": 0})  # (a run that wrote no export)
    caplog.set_level("WARNING", logger="pipeline.encode_corpus")
    assert batch_encoder(run, "auto").encode("x \ud801\udc00 y")[0] == ref.encode(
        "x \ud801\udc00 y")
    assert "encoding with the reference encoder (slow)" in caplog.text
    with pytest.raises(ConfigError, match="config key 'tokenizer': .* has no tiktoken export"):
        batch_encoder(run, "tiktoken")


def test_long_run_probe():
    """_long_run finds every run of TIKTOKEN_MAX_RUN whitespace characters or of one
    character, wherever it starts, and never one shorter than half that."""
    half = ec.TIKTOKEN_MAX_RUN // 2
    rng = random.Random(5)
    for _ in range(300):
        length = rng.choice([rng.randint(0, 3 * half), 2 * half, 2 * half - 1, half - 1])
        run = rng.choice([" ", "\t", "\n", "\u3000", " \n", "a", "-", "家"])
        text = "xy" * rng.randint(0, 2 * half) + (run * length)[:length] + "z" * rng.randint(0, 9)
        found = ec._long_run(text)
        if length >= 2 * half:
            assert found
        if length < half:
            assert not found
    assert not ec._long_run("a " * 1_000_000)
    assert not ec._long_run("ab" * 1_000_000)  # long, but no run: tiktoken takes it


def test_long_words_are_not_cached(run_dir: Path):
    ref = Tokenizer.load(str(run_dir))
    ref.encode("short words " + "z" * (encoder.CACHE_WORD_CHARS + 1))
    assert max(map(len, ref._cache)) <= encoder.CACHE_WORD_CHARS


def test_decoding_millions_of_ids_takes_little_memory_beyond_its_text(run_dir: Path):
    """``bytes.join`` keeps an 80-byte buffer per part: 2 M ids joined at once took 160 MB
    more than their text (20 M letters: 1.7 GB of page faults, 18 s on a fresh CI machine).
    Joined in slices, with a special token among them and from a generator, the same text."""
    import tracemalloc

    ref = Tokenizer.load(str(run_dir))
    ids = [ref.encode("a")[0]] * 2_000_000
    tracemalloc.start()
    try:
        text = ref.decode(ids)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text == "a" * 2_000_000
    assert peak < 20_000_000, f"decode of 2 M ids peaked at {peak / 1e6:.0f} MB"
    eot = ref.special_ids[EOT]
    assert ref.decode(iter([*ids[:3], eot, *ids[:2]])) == "aaa" + EOT + "aa"
    tracemalloc.start()  # a numpy array: its list of ints (8 bytes an id), not 30-byte scalars
    try:
        assert ref.decode(np.array(ids)) == text
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40_000_000, f"decode of a 2 M-id array peaked at {peak / 1e6:.0f} MB"
    assert ref.decode([]) == "" and ref.decode_bytes(()) == b""


# -- the word merges against the simple algorithm --------------------------------------------------

BASE = [97, 98, 99]  # a b c


@st.composite
def trained_tables(draw, max_merges: int = 30) -> PairRanks:
    """A merge list as training makes one: each merge joins two existing tokens (new ids from
    256, so pairs of new tokens take the table's sorted-key lookup, byte pairs the dense one),
    rank = new id."""
    ids = list(BASE)
    table: PairRanks = {}
    for _ in range(draw(st.integers(0, max_merges))):
        pair = (draw(st.sampled_from(ids)), draw(st.sampled_from(ids)))
        if pair not in table:
            new = 256 + len(table)
            table[pair] = (new, new)
            ids.append(new)
    return table


@st.composite
def any_tables(draw) -> PairRanks:
    """Arbitrary tables: distinct ranks in any order, results any id (even a pair's own
    symbols): what duplicate byte strings can make of a run's table, and worse."""
    pool = [*BASE, 256, 257, 258]
    pairs = draw(st.lists(st.tuples(st.sampled_from(pool), st.sampled_from(pool)),
                          unique=True, max_size=20))
    ranks = draw(st.permutations(range(len(pairs))))
    return {p: (r, draw(st.sampled_from(pool))) for p, r in zip(pairs, ranks)}


# words made of runs, so ties (the same pair side by side, "aaaa") are common
WORDS = st.lists(st.tuples(st.sampled_from(BASE), st.integers(1, 40)), min_size=1,
                 max_size=12).map(lambda runs: [s for s, k in runs for _ in range(k)])
PROPERTY = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(table=trained_tables(), word=WORDS)
def test_merges_equal_the_simple_algorithm(table: PairRanks, word: list[int]):
    expected = slow_bpe(word, table)
    assert expected == encode_symbols(word, {p: r for p, (r, _) in table.items()})
    pairs = PairTable(table)
    assert pairs.grouped_ok  # a trained list always allows the grouped merge
    assert merge_groups(word, pairs).tolist() == expected
    stepped = PairTable(table)
    stepped.STEP = 3  # pairs looked up a few at a time, as a long word's are
    assert merge_groups(word, stepped).tolist() == expected
    assert merge_heap(word, table) == expected
    assert merge_scan(word, table) == expected
    assert bpe_encode(word, table) == expected


@PROPERTY
@given(table=any_tables(), word=WORDS)
def test_merges_equal_the_simple_algorithm_any_table(table: PairRanks, word: list[int]):
    """For any table the heap is exact; the grouped merge is used only where it is exact."""
    expected = slow_bpe(word, table)
    assert merge_heap(word, table) == expected
    pairs = PairTable(table)
    if pairs.grouped_ok:
        assert merge_groups(word, pairs).tolist() == expected


def test_grouped_merge_refused_where_it_would_differ():
    """(a, b) -> c with rank 1, and (c, a) with rank 0 would go before the second (a, b): all
    (a, b) at once gives c c, one by one gives (ca) b."""
    table = {(97, 98): (1, 99), (99, 97): (0, 100)}
    word = [97, 98, 97, 98]
    assert slow_bpe(word, table) == [100, 98]
    assert not PairTable(table).grouped_ok
    assert merge_groups(word, PairTable(table)).tolist() != [100, 98]  # why it is refused
    long_word = word * 10_000  # long enough for merge_groups, which bpe_encode must not use
    assert len(long_word) >= encoder.LONG_WORD
    assert merge_groups(long_word, PairTable(table)).tolist() != merge_heap(long_word, table)
    assert bpe_encode(long_word, table) == merge_heap(long_word, table)


def test_long_word_paths_agree_on_real_text(run_dir: Path):
    """A 200 KB real-text word (pattern ``none`` makes rows like it) and long runs: the grouped
    merge, the heap and tiktoken's own BPE give the same ids."""
    ref = Tokenizer.load(str(run_dir))
    tk = batch_encoder(run_dir).tk
    text = "".join(rows_of(EN_DOCS, "part-00001.parquet", 200_000))
    for word in (text.encode()[:200_000], b"a" * 100_001, b" " * 50_001, b"ab" * 30_000):
        syms = list(word)
        expected = tk._encode_single_piece(word)
        assert ref.pair_table.grouped_ok
        assert merge_groups(word, ref.pair_table).tolist() == expected
        assert merge_heap(syms, ref.pair_ranks) == expected
        assert bpe_encode(word, ref.pair_ranks, ref.pair_table) == expected


# -- the encode job end to end ---------------------------------------------------------------------

@pytest.mark.spark
@pytest.mark.slow
def test_encode_job_with_pathological_rows(tmp_path: Path, tmp_path_factory):
    """jobs/encode.py on normal rows plus the four pathological rows of issue 10 (2 M spaces,
    which tiktoken panics on, 20 M ``a``, 5 M digits, 5 M punctuation marks): the job
    succeeds, every row has the reference encoder's ids, and _encode.json counts the two rows
    that went to the reference encoder."""
    from .test_encode_job import read_output, run_encode_job

    run = trained_run("cl100k", tmp_path_factory)  # the run the tests above encode with
    rows = pathological_rows()
    texts = [p for t in rows_of(EN_DOCS, "part-00001.parquet", 40_000)
             for p in t.split("\n\n") if p.strip()][:100]
    texts[3:3] = [rows["spaces"], rows["letters"], rows["digits"], rows["punct"]]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"doc": list(range(len(texts))), "text": texts}),
                   tmp_path / "in" / "part-0.parquet")
    out = tmp_path / "out"
    r = run_encode_job("--tokenizer", str(run), "--input", str(tmp_path / "in"),
                       "--output", str(out), "--key-columns", "doc")
    assert r.returncode == 0, r.stderr[-3000:]
    table = read_output(out).sort_by("doc")
    ref = Tokenizer.load(str(run))
    long_rows = {text: case for case, text in rows.items()}
    assert table.column("ids").to_pylist() == [
        reference_ids(run, long_rows[t], ref) if t in long_rows else ref.encode(t)
        for t in texts]
    stats = json.loads((out / "_encode.json").read_text())["stats"]
    assert stats["rows"] == len(texts) and stats["engine"] == "tiktoken"
    assert stats["rows_via_reference"] == 2 and stats["tiktoken_errors"] == 0


def test_duplicate_tokens_long_word_takes_the_heap(monkeypatch):
    """A run whose byte strings repeat: 'abc' is made by (ab, c) and again by (a, bc), so its
    first id 257 is also made at rank 260, after (257, d) at rank 258. That breaks the
    condition under which merging by groups is proven exact (``grouped_ok``), so a word over
    LONG_WORD symbols takes the heap, which is exact for any table."""
    a, b, c, d = 97, 98, 99, 100
    merges = [Merge(a, b, 256, 9), Merge(256, c, 257, 8), Merge(257, d, 258, 7),
              Merge(b, c, 259, 6), Merge(a, 259, 260, 5)]
    tok = Tokenizer(bytes_vocab(), merges, [], PretokenizerSpec("none"))
    assert not tok.pair_table.grouped_ok

    def refused(*args):
        raise AssertionError("merge_groups used on a table that is not grouped_ok")

    monkeypatch.setattr(encoder, "merge_groups", refused)
    unit = "xabcd abcdd bcabc "  # (no merge takes x or a space: each unit encodes alone)
    word = unit * (encoder.LONG_WORD // 10)
    ranks = {(m.left, m.right): m.new_id for m in merges}  # ids are the ranks here
    assert tok.encode(word) == encode_symbols(list(unit.encode()), ranks) * (
        encoder.LONG_WORD // 10)  # the definition, not the heap against itself
    assert tok.decode(tok.encode(word)) == word
