"""Every engine, partitioning and batch setting equals the sequential oracle (no JVM: the
round loop runs on in-process partitions here; tests/test_train_spark.py runs it on Spark)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.bpe import initial_words, tokens_after, train_oracle
from pipeline.engines import local
from pipeline.engines.local import LocalTrainer
from pipeline.engines.rounds import InProcessPartitions, run_rounds

# small alphabets: ties and a a a overlaps are common
words_st = st.lists(st.binary(min_size=1, max_size=12).map(lambda b: bytes(x % 3 + 97 for x in b))
                    | st.text(alphabet="ab ", min_size=1, max_size=12).map(str.encode),
                    min_size=1, max_size=30, unique=True)


@st.composite
def corpora(draw):
    words = draw(words_st)
    counts = draw(st.lists(st.integers(1, 6), min_size=len(words), max_size=len(words)))
    return words, counts


def split_blocks(ids, counts, parts: int, replay=None) -> InProcessPartitions:
    """The words in ``parts`` consecutive ranges, as in-process partitions."""
    lengths = np.array([len(w) for w in ids])
    flat = np.array([t for w in ids for t in w])
    bounds = np.linspace(0, len(ids), parts + 1).astype(int)
    words = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        so, eo = int(lengths[:lo].sum()), int(lengths[:hi].sum())
        words.append((flat[so:eo], lengths[lo:hi], np.array(counts[lo:hi])))
    return InProcessPartitions(words, 256, replay)


@pytest.mark.parametrize("squeeze", [False, True], ids=["", "squeezed"])
@pytest.mark.parametrize("small", [0, 12, 10**9], ids=["numpy", "mixed", "python"])
@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpora(), st.sampled_from([1, 2]), st.sampled_from([None, 2, 3, 5]))
def test_local_engine_equals_oracle(monkeypatch, small, squeeze, corpus, min_count, max_bytes):
    """Both merge paths (vectorized, and plain Python for rare pairs) and their mix.
    ``squeezed``: word counts of 3 or more go through the big-count lookup, the heap starts
    with 2 pairs (its floor is lowered over and over), and the position buffer and the pair
    arrays start as small as they can (they are compacted and grown as merges add positions
    and pairs)."""
    monkeypatch.setattr(local, "SMALL", small)
    if squeeze:
        monkeypatch.setattr(local, "BIG", 3)
        monkeypatch.setattr(local, "HEAP_START", 2)
        monkeypatch.setattr(local, "MIN_CAPACITY", 1)
        monkeypatch.setattr(local, "_CHUNK", 5)
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
    res = run_rounds(blocks, [1] * 256, 40, min_count, max_bytes, max_batch)
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
    # rounds: rebuild the partitions by replaying the prefix in one pass, then continue
    blocks = split_blocks(ids, counts, parts, replay=[(m.left, m.right) for m in prefix])
    token_len = [1] * 256
    vocab = list(base.tokens)
    for m in prefix:
        vocab.append(vocab[m.left] + vocab[m.right])
    token_len = [len(t) for t in vocab]
    res = run_rounds(blocks, token_len, 40 - len(prefix), 1, None, 256)
    assert prefix + res.merges == expected


def test_batching_makes_several_merges_per_round():
    rng = np.random.default_rng(0)
    words = list(dict.fromkeys(bytes(rng.integers(97, 123, rng.integers(2, 9)).tolist())
                               for _ in range(3000)))
    counts = rng.zipf(1.5, len(words)).clip(1, 10_000).tolist()
    ids, base = initial_words(words)
    expected = train_oracle(ids, counts, base.tokens, 200)
    res = run_rounds(split_blocks(ids, counts, 3), [1] * 256, 200, 2, None, 256)
    assert res.merges == expected
    assert res.stats.rounds < len(expected) / 2


def test_partition_states_survive_retries_lost_rounds_and_interruptions(tmp_path):
    """The executor-side protocol of the Spark engine, without Spark: a retried round gets
    its saved report, a state that missed rounds catches up from the history, and a state
    left half-changed or ahead of the round is reported lost (the driver then rebuilds)."""
    from pipeline.engines.partition import PartitionLost, PartitionStore, apply_batch

    words = [b"abab", b"aab", b"bba", b"abba", b"ba"]
    counts = [3, 2, 2, 1, 4]
    ids, base = initial_words(words)
    expected = train_oracle(ids, counts, base.tokens, 6, 1)
    batches = [[(m.left, m.right, m.new_id)] for m in expected]
    history = np.array([(m.left, m.right) for m in expected], dtype=np.int64)
    flat = np.array([t for w in ids for t in w])
    lengths = np.array([len(w) for w in ids])
    ref = InProcessPartitions([(flat, lengths, np.array(counts))], 256)
    store = PartitionStore("t", 0, root=str(tmp_path))
    store.build(flat, lengths, np.array(counts), 256, history[:0])

    def same(x, y):
        return all(np.array_equal(getattr(x, k), getattr(y, k))
                   for k in ("keys", "deltas", "min_pos", "removed")) and x.tokens == y.tokens

    first = store.run_round(0, 0, batches[0], 0, lambda: history)
    assert same(first, ref.run_round(batches[0]))
    again = store.run_round(0, 0, batches[0], 0, lambda: history)  # a retried task
    assert same(again, first)
    # round 1 never reached this partition (say, its task ran elsewhere): round 2 catches up
    ref.run_round(batches[1])
    late = store.run_round(2, 2, batches[2], 0, lambda: history)
    assert same(late, ref.run_round(batches[2]))
    with pytest.raises(PartitionLost, match="holds 3 merges, the round starts at 1"):
        store.run_round(1, 1, batches[1], 0, lambda: history)
    # a task killed while changing the arrays leaves the state dirty: never trusted again
    meta = store.read_meta()
    store._write_meta({**meta, "dirty": True})
    with pytest.raises(PartitionLost, match="interrupted"):
        store.run_round(3, 3, batches[3], 0, lambda: history)
    # ... and a rebuild with the history replayed is exact again
    store.build(flat, lengths, np.array(counts), 256, history[:3])
    assert same(store.run_round(3, 3, batches[3], 0, lambda: history),
                ref.run_round(batches[3]))
    assert same(apply_batch(store.at_gen(4, lambda: history), batches[4], 0, 0),
                ref.run_round(batches[4]))
    with pytest.raises(PartitionLost, match="no state"):
        PartitionStore("t", 1, root=str(tmp_path)).run_round(0, 0, batches[0], 0, lambda: history)


def test_a_rebuild_waits_for_a_task_still_changing_the_partition(tmp_path):
    """A failed round's other tasks run on for up to spark.python.task.killTimeout: a rebuild
    of a partition one of them holds waits for it to end (the lock was a file inside the
    directory the rebuild removes: the rebuild locked a new one, and the old task's save
    then landed on the rebuilt state)."""
    import threading
    import time

    from pipeline.engines.partition import PartitionStore

    words = [b"abab", b"aab", b"bba"]
    ids, _ = initial_words(words)
    flat = np.array([t for w in ids for t in w])
    lengths = np.array([len(w) for w in ids])
    store = PartitionStore("t", 0, root=str(tmp_path))
    store.build(flat, lengths, np.array([3, 2, 2]), 256, np.zeros((0, 2), np.int64))
    holding = threading.Event()

    def old_task() -> None:
        with store.locked():
            holding.set()
            time.sleep(0.5)
            store._write_meta({"dirty": False, "gen": 7, "round": 6, "scalars": {}})

    task = threading.Thread(target=old_task)
    task.start()
    holding.wait()
    store.build(flat, lengths, np.array([3, 2, 2]), 256, np.zeros((0, 2), np.int64))
    task.join()
    assert store.read_meta()["gen"] == 0  # the rebuilt state, not the old task's
    store.remove()
    assert not list(tmp_path.iterdir())


def test_initial_counting_sort_in_chunks_equals_one_pass(monkeypatch):
    """The initial registration sorts byte pairs in bounded chunks; many tiny chunks must
    give the same ids, counts, positions and merges as one."""
    rng = np.random.default_rng(1)
    words = list(dict.fromkeys(bytes(rng.integers(97, 101, rng.integers(1, 7)).tolist())
                               for _ in range(400)))
    counts = rng.integers(1, 9, len(words)).tolist()
    ids, base = initial_words(words)
    whole = LocalTrainer.from_words(ids, counts, base.tokens)
    monkeypatch.setattr(local, "_CHUNK", 7)
    chunked = LocalTrainer.from_words(ids, counts, base.tokens)
    n = whole.state.n_ids
    assert chunked.state.n_ids == n
    for name in ("cnt", "lo", "hi", "pair_left", "pair_right"):
        assert np.array_equal(getattr(whole.state, name)[:n], getattr(chunked.state, name)[:n])
    assert np.array_equal(whole.state.buf[:whole.state.buf_len],
                          chunked.state.buf[:chunked.state.buf_len])
    assert chunked.train(60, 1) == whole.train(60, 1) == train_oracle(ids, counts, base.tokens,
                                                                        60, 1)


@pytest.mark.parametrize("offset", [0, 1])
def test_initial_symbols_reads_large_binary_as_binary(offset):
    """Spark hands Python ``large_binary`` (int64 offsets) when
    spark.sql.execution.arrow.useLargeVarTypes is on: the same symbols as ``binary``."""
    import pyarrow as pa

    from pipeline.bpe import bytes_vocab

    words = [b"ab", b"cde", b"", b"f"]
    want = local.initial_symbols(bytes_vocab(), pa.array(words, pa.binary())[offset:])
    got = local.initial_symbols(bytes_vocab(), pa.array(words, pa.large_binary())[offset:])
    assert [a.tolist() for a in got] == [a.tolist() for a in want]
    assert want[0].tolist() == list(b"".join(words[offset:]))


@given(st.lists(st.integers(1, 9), max_size=40), st.integers(1, 12))
def test_the_hand_off_pieces_hold_every_word_once_in_order(lengths, per):
    """Words cut into pieces of at most ``per`` tokens (a longer word alone): concatenated,
    the pieces are the words, in order."""
    from pipeline.engines.spark import cut_words

    lengths_a = np.array(lengths, dtype=np.int64)
    flat = np.arange(int(lengths_a.sum()), dtype=np.int32)
    counts = np.arange(len(lengths), dtype=np.int64) + 1
    pieces = list(cut_words(flat, lengths_a, counts, per))
    assert all(len(f) == int(ln.sum()) and (len(f) <= per or len(ln) == 1)
               for f, ln, _ in pieces)
    if not lengths:
        assert pieces == []
        return
    f, ln, c = (np.concatenate(x) for x in zip(*pieces))
    assert (f.tolist(), ln.tolist(), c.tolist()) == (flat.tolist(), lengths, counts.tolist())


def test_initial_symbols_of_words_over_2_gib():
    """A partition whose words hold over 2 GiB of bytes: a large_binary column was cast down
    to binary (32-bit offsets) and a chunked one joined as binary, both an ArrowInvalid
    before any merge. Two words of 1.1 GiB, in buffers no page of which is touched."""
    import pyarrow as pa

    from pipeline.bpe import bytes_vocab
    from pipeline.engines.local import initial_symbols

    n = 1_100_000_000
    data = pa.py_buffer(np.zeros(2 * n, dtype=np.uint8))  # (calloc: no page is touched)
    offsets = pa.py_buffer(np.array([0, n, 2 * n], dtype=np.int64))
    words = pa.Array.from_buffers(pa.large_binary(), 2, [None, offsets, data])
    flat, lengths = initial_symbols(bytes_vocab(), words)
    assert lengths.tolist() == [n, n] and flat.size == 2 * n
    # a chunked column is joined with 64-bit offsets from LARGE_BINARY_FROM bytes on (a
    # small threshold here, the same path)
    chunked = pa.chunked_array([pa.array([b"ab", b"c"]), pa.array([b"", b"def"])])
    want = initial_symbols(bytes_vocab(), chunked)
    assert local.joined(chunked).type == pa.binary()
    try:
        local.LARGE_BINARY_FROM = 4
        assert local.joined(chunked).type == pa.large_binary()
        got = initial_symbols(bytes_vocab(), chunked)
    finally:
        local.LARGE_BINARY_FROM = 1 << 31
    assert got[0].tolist() == want[0].tolist() == list(b"abcdef")
    assert got[1].tolist() == want[1].tolist() == [2, 1, 0, 3]
