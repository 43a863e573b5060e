"""The pure-Python core: golden examples from the seed tutorials, and the oracle against a
brute-force recount over every word occurrence."""

from __future__ import annotations

from collections import Counter

import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.bpe import (
    count_pairs,
    encode_symbols,
    initial_words,
    merge_word,
    tokens_after,
    train_oracle,
)
from pipeline.pretokenize import Pretokenizer, PretokenizerSpec

SEED_REVIEW = "the café baker bakes cakes, the café bakes soufflé"
SEED_SPLIT = r" ?\w+|[^\w\s]"


def table(texts: list[str], spec: PretokenizerSpec) -> tuple[list[bytes], list[int]]:
    pre = Pretokenizer(spec)
    c: Counter[bytes] = Counter()
    for t in texts:
        c.update(w.encode() for w in pre.words(t))
    return list(c), list(c.values())


def test_aaabdaaabac_three_merges():
    words, base = initial_words([b"aaabdaaabac"])
    merges = train_oracle(words, [1], base.tokens, 3)
    assert [(m.left, m.right, m.new_id) for m in merges] == [
        (97, 97, 256), (256, 97, 257), (257, 98, 258)]
    cur = words[0]
    for m in merges:
        cur = merge_word(cur, m.left, m.right, m.new_id)
    assert cur == [258, 100, 258, 97, 99]
    assert tokens_after(words, [1], merges) == [9, 7, 5]


def test_encode_with_seed_merges():
    ranks = {(97, 97): 256, (256, 97): 257, (257, 98): 258}
    assert encode_symbols(list(b"aaabac"), ranks) == [258, 97, 99]
    assert encode_symbols(list(b"abaaab"), ranks) == [97, 98, 258]


def test_review_first_five_merges_chars():
    words, counts = table([SEED_REVIEW], PretokenizerSpec(pattern=SEED_SPLIT))
    ids, base = initial_words(words, alphabet="chars")
    merges = train_oracle(ids, counts, base.tokens, 5)
    vocab = list(base.tokens)
    got = []
    for m in merges:
        vocab.append(vocab[m.left] + vocab[m.right])
        got.append((vocab[m.left].decode(), vocab[m.right].decode(), m.count))
    assert got == [("a", "k", 4), ("ak", "e", 4), (" ", "c", 3), (" ", "b", 3),
                   (" b", "ake", 3)]
    assert tokens_after(ids, counts, merges) == [46, 42, 39, 36, 33]
    assert base.size == 16 and sum(len(w) * c for w, c in zip(ids, counts)) == 50


def test_review_bytes_joins_e_acute_on_fourth_merge():
    words, counts = table([SEED_REVIEW], PretokenizerSpec(pattern=SEED_SPLIT))
    ids, base = initial_words(words)
    merges = train_oracle(ids, counts, base.tokens, 4)
    assert (merges[3].left, merges[3].right, merges[3].count) == (0xC3, 0xA9, 3)


def test_review_encoder_replays_merges():
    words, counts = table([SEED_REVIEW], PretokenizerSpec(pattern=SEED_SPLIT))
    ids, base = initial_words(words, alphabet="chars")
    merges = train_oracle(ids, counts, base.tokens, 5)
    vocab = list(base.tokens) + [b""] * 5
    for m in merges:
        vocab[m.new_id] = vocab[m.left] + vocab[m.right]
    ranks = {(m.left, m.right): m.new_id for m in merges}
    char_id = {t.decode(): i for i, t in enumerate(base.tokens)}
    out = []
    for w in regex.findall(SEED_SPLIT, "the maker baked cakes"):
        syms = [char_id.get(ch, -1 - ord(ch)) for ch in w]
        out += [vocab[t].decode() if t >= 0 else chr(-1 - t)
                for t in encode_symbols(syms, ranks)]
    assert out == ["t", "h", "e", " ", "m", "ake", "r", " bake", "d", " c", "ake", "s"]


def hops_corpus():
    words = [b"hop", b"hops", b"shop", b"shops"]
    ids, base = initial_words(words, alphabet="chars")
    return ids, [5, 2, 3, 1], base


def test_hops_exercises():
    ids, counts, base = hops_corpus()
    h, o, p, s = (base.tokens.index(c.encode()) for c in "hops")
    pairs = count_pairs(ids, counts)
    assert pairs[(h, o)] == 11 and pairs[(o, p)] == 11
    assert sum(len(w) * c for w, c in zip(ids, counts)) == 40
    merges = train_oracle(ids, counts, base.tokens, 4)
    vocab = list(base.tokens)
    for m in merges:
        vocab.append(vocab[m.left] + vocab[m.right])
    assert [vocab[m.new_id] for m in merges[:3]] == [b"ho", b"hop", b"shop"]
    assert merges[2].count == 4
    assert tokens_after(ids, counts, merges[:1]) == [29]
    # the exercise's merge list, replayed: shops -> shop s
    ho, hop = 4, 5
    ranks = {(h, o): ho, (ho, p): hop, (s, hop): 6, (hop, s): 7}
    assert encode_symbols([s, h, o, p, s], ranks) == [6, s]


def test_dddcddd_one_step():
    ids, base = initial_words([b"dddcddd"])
    m = train_oracle(ids, [1], base.tokens, 1)[0]
    assert (m.left, m.right, m.count) == (100, 100, 4)
    assert tokens_after(ids, [1], [m]) == [5]


def test_overlapping_runs_merge_left_to_right():
    assert merge_word([1, 1, 1], 1, 1, 9) == [9, 1]
    assert merge_word([1, 1, 1, 1], 1, 1, 9) == [9, 9]
    assert merge_word([2, 1, 1, 1, 2], 1, 1, 9) == [2, 9, 1, 2]


def brute_force_train(occurrences: list[list[int]], vocab_size: int, num_merges: int,
                      min_count: int) -> list[tuple[int, int, int]]:
    """Seed-001 style: every word occurrence kept separately, pairs recounted each step, the
    first-inserted pair wins ties (Counter.most_common keeps insertion order)."""
    seqs = [list(o) for o in occurrences]
    out = []
    for step in range(num_merges):
        pairs: Counter[tuple[int, int]] = Counter()
        for s in seqs:
            for p in zip(s, s[1:]):
                pairs[p] += 1
        if not pairs:
            break
        (a, b), c = pairs.most_common(1)[0]
        if c < min_count:
            break
        t = vocab_size + step
        out.append((a, b, c))
        seqs = [_replace_pair(s, a, b, t) for s in seqs]
    return out


def _replace_pair(seq: list[int], a: int, b: int, t: int) -> list[int]:
    """Every (a, b) in ``seq``, left to right, replaced by t (written here, not bpe's)."""
    out, i = [], 0
    while i < len(seq):
        if i + 1 < len(seq) and seq[i] == a and seq[i + 1] == b:
            out.append(t)
            i += 2
        else:
            out.append(seq[i])
            i += 1
    return out


corpus = st.lists(st.text(alphabet="ab c", min_size=1, max_size=10), min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(corpus, st.integers(1, 3))
def test_oracle_equals_brute_force(occurrences, min_count):
    # word table in first-seen order, as the count stage makes it
    counts = Counter(o.encode() for o in occurrences)
    words = list(counts)
    ids, base = initial_words(words)
    merges = train_oracle(ids, [counts[w] for w in words], base.tokens, 30, min_count)
    expected = brute_force_train([list(o.encode()) for o in occurrences], 256, 30, min_count)
    assert [(m.left, m.right, m.count) for m in merges] == expected


def test_the_pure_modules_import_without_pyspark():
    """What a user of a trained tokenizer imports (and the pure core) works without pyspark."""
    import subprocess
    import sys

    from .conftest import REPO

    r = subprocess.run([sys.executable, str(REPO / "scripts" / "check_imports_without_pyspark.py")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_chars_suffix_is_the_last_symbol_and_distinct_from_text():
    # the suffix "_" also occurs in the text: it stays its own symbol, after every character
    ids, base = initial_words([b"a_b", b"ca"], alphabet="chars", end_of_word_suffix="_")
    assert base.tokens == [b"a", b"_", b"b", b"c", b"_"]
    assert ids == [[0, 1, 2, 4], [3, 0, 4]]
    assert [list(base.symbols(w)) for w in ("a_b", "ca")] == ids
