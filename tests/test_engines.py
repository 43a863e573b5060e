"""Every engine, partitioning and batch setting equals the sequential oracle (no JVM: the
round loop runs on in-process blocks here; tests/test_train_spark.py runs it on Spark)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.bpe import initial_words, tokens_after, train_oracle
from pipeline.engines import local as fast_bpe
from pipeline.engines.block import Block, replay_block
from pipeline.engines.local import LocalTrainer
from pipeline.engines.rounds import InProcessBlocks, run_rounds

# small alphabets: ties and a a a overlaps are common
words_st = st.lists(st.binary(min_size=1, max_size=12).map(lambda b: bytes(x % 3 + 97 for x in b))
                    | st.text(alphabet="ab ", min_size=1, max_size=12).map(str.encode),
                    min_size=1, max_size=30, unique=True)


@st.composite
def corpora(draw):
    words = draw(words_st)
    counts = draw(st.lists(st.integers(1, 6), min_size=len(words), max_size=len(words)))
    return words, counts


def split_blocks(ids, counts, parts: int, replay=None) -> list[Block]:
    lengths = np.array([len(w) for w in ids])
    flat = np.array([t for w in ids for t in w])
    fs = np.arange(len(ids), dtype=np.int64) * 7 + 3  # any increasing first_seen
    bounds = np.linspace(0, len(ids), parts + 1).astype(int)
    blocks = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        so, eo = int(lengths[:lo].sum()), int(lengths[:hi].sum())
        b = Block.from_symbols(flat[so:eo], lengths[lo:hi], np.array(counts[lo:hi]), fs[lo:hi])
        if replay:
            b = replay_block(b, replay)
        if len(b.lengths):
            blocks.append(b)
    return blocks


@pytest.mark.parametrize("small", [0, 12, 10**9], ids=["numpy", "mixed", "python"])
@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpora(), st.sampled_from([1, 2]), st.sampled_from([None, 2, 3, 5]))
def test_local_engine_equals_oracle(monkeypatch, small, corpus, min_count, max_bytes):
    """Both merge paths (vectorized, and plain Python for rare pairs) and their mix."""
    monkeypatch.setattr(fast_bpe, "SMALL", small)
    words, counts = corpus
    ids, base = initial_words(words)
    expected = train_oracle(ids, counts, base.tokens, 40, min_count, max_bytes)
    lt = LocalTrainer.from_words(ids, counts, base.tokens)
    assert lt.train(40, min_count, max_bytes) == expected
    total = sum(len(w) * c for w, c in zip(ids, counts))
    assert (total - np.cumsum(lt.removed)).tolist() == tokens_after(ids, counts, expected)


@settings(max_examples=300, deadline=None)
@given(corpora(), st.sampled_from([1, 2, 7]), st.sampled_from([1, 4, 256]),
       st.sampled_from([1, 2]), st.sampled_from([None, 3]))
def test_rounds_equal_oracle(corpus, parts, max_batch, min_count, max_bytes):
    words, counts = corpus
    ids, base = initial_words(words)
    expected = train_oracle(ids, counts, base.tokens, 40, min_count, max_bytes)
    blocks = split_blocks(ids, counts, parts)
    if not blocks:
        assert expected == []
        return
    res = run_rounds(InProcessBlocks(blocks), [1] * 256, 40, min_count, max_bytes, max_batch)
    assert res.merges == expected
    total = sum(len(w) * c for w, c in zip(ids, counts))
    assert (total - np.cumsum(res.removed)).tolist() == tokens_after(ids, counts, expected)


@settings(max_examples=150, deadline=None)
@given(corpora(), st.integers(0, 20), st.sampled_from([1, 3]))
def test_resume_from_any_prefix(corpus, cut, parts):
    words, counts = corpus
    ids, base = initial_words(words)
    expected = train_oracle(ids, counts, base.tokens, 40, 1)
    prefix = expected[:cut]
    # local: replay the prefix, then continue
    lt = LocalTrainer.from_words(ids, counts, base.tokens)
    lt.replay(prefix)
    assert lt.train(40, 1) == expected
    # rounds: rebuild blocks by replaying the prefix in one pass, then continue
    blocks = split_blocks(ids, counts, parts, replay=[(m.left, m.right, m.new_id)
                                                      for m in prefix])
    token_len = [1] * 256
    vocab = list(base.tokens)
    for m in prefix:
        vocab.append(vocab[m.left] + vocab[m.right])
    token_len = [len(t) for t in vocab]
    if not blocks:
        assert expected == prefix
        return
    res = run_rounds(InProcessBlocks(blocks), token_len, 40 - len(prefix), 1, None, 256)
    assert prefix + res.merges == expected


def test_batching_makes_several_merges_per_round():
    rng = np.random.default_rng(0)
    words = list(dict.fromkeys(bytes(rng.integers(97, 123, rng.integers(2, 9)).tolist())
                               for _ in range(3000)))
    counts = rng.zipf(1.5, len(words)).clip(1, 10_000).tolist()
    ids, base = initial_words(words)
    expected = train_oracle(ids, counts, base.tokens, 200)
    res = run_rounds(InProcessBlocks(split_blocks(ids, counts, 3)), [1] * 256, 200, 2, None, 256)
    assert res.merges == expected
    assert res.stats.rounds < len(expected) / 2
