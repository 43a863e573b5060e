"""Pretokenization: tiktoken's exact patterns, special tokens, normalization."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import sys
from pathlib import Path

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.patterns import PATTERNS, fast_pattern, in_bmp
from pipeline.pretokenize import Pretokenizer, PretokenizerSpec, WordCounter

from .conftest import need


def tiktoken_source_patterns() -> dict[str, str]:
    """The pat_str values in tiktoken_ext/openai_public.py, read without downloading anything."""
    spec = importlib.util.find_spec("tiktoken_ext.openai_public")
    need(spec is not None and spec.origin is not None, "tiktoken is not installed")
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in ("cl100k_base", "o200k_base"):
            env: dict[str, str] = {}
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assign) and isinstance(sub.targets[0], ast.Name):
                    with contextlib.suppress(Exception):  # only literal expressions matter
                        env[sub.targets[0].id] = _literal(sub.value)
                if isinstance(sub, ast.Dict):
                    for k, v in zip(sub.keys, sub.values):
                        if isinstance(k, ast.Constant) and k.value == "pat_str":
                            if isinstance(v, ast.Constant):
                                found[node.name] = v.value
                            elif isinstance(v, ast.Name) and v.id in env:
                                found[node.name] = env[v.id]
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "r50k_pat_str":
            found["r50k"] = _literal(node.value)
    return found


def _literal(expr: ast.expr) -> str:
    return eval(compile(ast.Expression(expr), "<tiktoken>", "eval"))


def test_patterns_are_tiktokens():
    src = tiktoken_source_patterns()
    assert PATTERNS["gpt2"] == src["r50k"]
    assert PATTERNS["cl100k"] == src["cl100k_base"]
    assert PATTERNS["o200k"] == src["o200k_base"]


def test_special_tokens_are_cut_out_and_never_spanned():
    pre = Pretokenizer(PretokenizerSpec("gpt2", ("<|endoftext|>", "<|end|>")))
    words = pre.words("hello<|endoftext|> world<|end|>!")
    assert words == ["hello", " world", "!"]
    assert pre.chunks("a<|end|>b<|endoftext|>") == ["a", "b"]


def test_special_tokens_are_found_before_normalization_as_the_encoders_find_them():
    """Training cuts special tokens where the encoders (tiktoken, ours) do: in the text as it
    is; "<|ENDOFTEXT|>" lowercased is text, and NFKC is applied to each piece."""
    from collections import Counter

    from pipeline.bpe import bytes_vocab
    from pipeline.encoder import Tokenizer

    spec = PretokenizerSpec("cl100k", ("<|endoftext|>",), lowercase=True,
                            normalization="NFKC")
    row = "Ünïcode<|ENDOFTEXT|>x<|endoftext|>ﬁn ＡＢ"
    wc = WordCounter(Pretokenizer(spec))
    wc.add_row(0, row)
    assert wc.stats.special_tokens == 1
    plain = Pretokenizer(PretokenizerSpec("cl100k", (), True, "NFKC"))
    pieces = row.split("<|endoftext|>")
    assert Counter(wc.counts) == Counter(w for p in pieces for w in plain.words(p))
    assert Pretokenizer(spec).words(row) == [w for p in pieces for w in plain.words(p)]
    # what the encoder makes of the row: the same pieces' words, and the special's id
    tok = Tokenizer(bytes_vocab(), [], ["<|endoftext|>"], spec)
    ids = tok.encode(row, allowed_special="all")
    special = tok.special_ids["<|endoftext|>"]
    assert ids.count(special) == 1
    assert tok.decode(ids[:ids.index(special)]) == "".join(plain.words(pieces[0]))


def test_none_pattern_and_normalization():
    pre = Pretokenizer(PretokenizerSpec("none", (), lowercase=True, normalization="NFKC"))
    assert pre.words("ＡＢＣ def") == ["abc def"]
    assert Pretokenizer(PretokenizerSpec("cl100k")).words("I'm 12345 ok\n\n") == [
        "I", "'m", " ", "123", "45", " ok", "\n\n"]


def test_a_word_is_the_whole_match_even_with_groups():
    pre = Pretokenizer(PretokenizerSpec(r"(\w)\w*|\s"))
    assert pre.words("hello big world") == ["hello", " ", "big", " ", "world"]


_ALPHABET = ["ab", "b", "cd", " ", "\n", "x1", "é", "<|endoftext|>", "'s", "  ", "9", ","]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.sampled_from(_ALPHABET), max_size=120)
                          .map("".join)), max_size=12),
       st.integers(0, 40))
def test_word_counter_matches_a_naive_scan(rows, extra):
    """Counts, statistics and first occurrences (file, row, rank) of WordCounter equal the
    naive counter's (tests/naive_count.py: no Pretokenizer, its own special-token cut and
    split); ``extra`` distinct words in one row exercise the many-new-words path."""
    from .naive_count import naive_count

    rows = list(rows) + [" ".join(f"w{i}" for i in range(extra)) + " ab"]
    pre = Pretokenizer(PretokenizerSpec("cl100k", ("<|endoftext|>",)))
    wc = WordCounter(pre)
    for i, r in enumerate(rows):
        wc.add_row(i, r)
    naive = naive_count([rows], special_tokens=["<|endoftext|>"])
    assert {w.encode(): c for w, c in wc.counts.items()} == naive.counts
    first = dict(zip(wc.counts, zip(wc.first_file, wc.first_row, wc.first_rank)))
    assert {w.encode(): f for w, f in first.items()} == naive.first
    assert wc.stats.words == naive.stats["words"] == sum(naive.counts.values())
    assert wc.stats.special_tokens == naive.stats["special_tokens"]
    assert (wc.stats.rows, wc.stats.null_rows, wc.stats.empty_rows) == (
        naive.stats["rows"], naive.stats["null_rows"], naive.stats["empty_rows"])


# characters where the patterns' classes differ: \x1c-\x1f are str.isspace() but not \s in
# ``regex``; "/" ends o200k punctuation runs; "'" starts contractions in either case
_ASCII_PIECES = ["a", "Z", "s", "S", "t", "LL", "ve", "Re", "'", "0", "12345", " ", "  ", "\t",
                 "\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1f", "/", "!?", "_", "-",
                 "\x00", "\x7f", ".", "'s", "'T", "ab12", "\n\n"]
# non-ASCII letters (Lu, Ll, Lt, Lm, Lo), marks, digits, spaces and line breaks
_WIDE_PIECES = ["é", "Ǆ", "ǅ", "ʰ", "日本", "\u0301", "٣", "Ⅻ", "\u00a0", "\u2028", "\x85",
                "\u3000", "ſ", "K", "😀"]


NAMED = sorted(PATTERNS)
# every BMP character, lone surrogates (rows of invalid UTF-8 decoded with surrogateescape)
# included, often next to the characters the patterns treat specially
_BMP = st.characters(max_codepoint=0xFFFF, exclude_categories=())
# the translations use possessive quantifiers, which ``re`` has from Python 3.11 (before it the
# Pretokenizer does not use them)
needs_possessive_re = pytest.mark.skipif(sys.version_info < (3, 11), reason="re before 3.11")


@needs_possessive_re
@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_ASCII_PIECES), max_size=40).map("".join), st.sampled_from(NAMED))
def test_fast_translations_equal_the_patterns_on_ascii_text(text, name):
    import re

    assert re.findall(fast_pattern(name), text) == regex.findall(PATTERNS[name], text)


@needs_possessive_re
@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_ASCII_PIECES + _WIDE_PIECES[:-1]), _BMP),
                max_size=40).map("".join), st.sampled_from(NAMED))
def test_fast_translations_equal_the_patterns_on_any_bmp_text(text, name):
    import re

    assert in_bmp(text)
    assert re.findall(fast_pattern(name), text) == regex.findall(PATTERNS[name], text)


@needs_possessive_re
def test_every_bmp_character_alone_and_in_context():
    """Each BMP character, alone and after the characters that start a pattern's pieces: the
    translated classes hold exactly the characters ``regex`` puts in the originals'."""
    import re

    chars = [chr(c) for c in range(0x10000)]
    for name in NAMED:
        fast, full = re.compile(fast_pattern(name)), regex.compile(PATTERNS[name])
        for before in ("", "a", " ", "'", "\n", "1", "!"):
            text = "".join(before + c + "\x00" for c in chars)
            assert fast.findall(text) == full.findall(text), (name, repr(before))


def test_bmp_check():
    assert in_bmp("") and in_bmp("abc") and in_bmp("é日\uffff") and in_bmp("\udc80\ud83d")
    assert not in_bmp("a😀") and not in_bmp("\U00010000")


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_ASCII_PIECES + _WIDE_PIECES), max_size=40).map("".join),
       st.sampled_from(NAMED))
def test_fast_split_equals_the_regex_package_on_mixed_text(text, name):
    """Rows with characters above U+FFFF: line cuts (cl100k, o200k) and the fast path of the
    other pieces change no word."""
    assert Pretokenizer(PretokenizerSpec(name)).words(text) == regex.findall(PATTERNS[name], text)


def test_a_pattern_that_matches_nothing_only_in_some_text_makes_no_empty_word():
    """check_pattern's probes refuse a pattern that matches the empty string in common text;
    one whose empty match needs other text (here a lookahead before "q") passed them, the
    count made a word '' of no symbols, and the local engine failed after the count
    ("every word needs at least one token"). Empty matches are no words: the counts, the
    words statistic and training are those of the non-empty matches."""
    from pipeline.bpe import initial_words, train_oracle
    from pipeline.engines.local import LocalTrainer
    from pipeline.patterns import check_pattern

    pattern = r"[a-pr-z]+|(?=q)|\w+|[^\w\s]+|\s+"
    check_pattern(pattern)  # (passes its probes)
    rows = ["a quick quiz q", "quick, quiet quips"] * 3
    wc = WordCounter(Pretokenizer(PretokenizerSpec(pattern, ())))
    for i, r in enumerate(rows):
        wc.add_row(i, r)
    matches = [m for r in rows for m in regex.findall(pattern, r) if m]
    assert "" not in wc.counts and wc.stats.words == len(matches)
    assert sum(wc.counts.values()) == len(matches)
    words = [w.encode() for w in wc.counts]
    ids, base = initial_words(words)
    counts = list(wc.counts.values())
    want = train_oracle(ids, counts, base.tokens, 12)
    assert LocalTrainer.from_words(ids, counts, base.tokens).train(12, 2, None) == want
