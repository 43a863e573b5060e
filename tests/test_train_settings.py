"""Training settings that change the merge list, through ``train()`` on both engines, each
against the sequential oracle (``pipeline.bpe``) over the word table the run counted:
``max_token_bytes``, ``min_pair_count`` stopping a run early, the ``chars`` alphabet with an
end-of-word suffix (and its encoder against the oracle's encode); and the time-based
checkpoint of the merge log."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import regex

from pipeline.bpe import encode_symbols, initial_words, train_oracle, vocab_bytes
from pipeline.config import Config
from pipeline.patterns import resolve_pattern

pytestmark = pytest.mark.spark

SEED = ("the baker bakes cakes; the maker makes bakes. a cake, a bake, a make. "
        "hop hops shop shops the shop hops. ") * 3


def corpus(tmp_path, rows: list[str]):
    d = tmp_path / "corpus"
    d.mkdir()
    pq.write_table(pa.table({"text": rows}), d / "part-0.parquet")
    return d


def oracle_input(run, alphabet: str = "bytes", suffix: str = ""):
    """The run's own word table as the oracle's input: words in first-seen order."""
    table = pq.read_table(f"{run}/words/data").sort_by("first_seen")
    words, counts = table.column("word").to_pylist(), table.column("count").to_pylist()
    ids, base = initial_words(words, alphabet, suffix)
    return ids, counts, base


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_max_token_bytes_and_min_pair_count_equal_the_oracle(spark, tmp_path, engine):
    from pipeline.train import train

    src = corpus(tmp_path, [SEED, "zq xv " * 2])
    run = tmp_path / "run"
    res = train(spark, Config(input=str(src), output=str(run), vocab_size=256 + 400,
                              engine=engine, num_partitions=2, max_token_bytes=4,
                              progress_bar=False))
    ids, counts, base = oracle_input(run)
    want = train_oracle(ids, counts, base.tokens, 400, min_pair_count=2, max_token_bytes=4)
    assert res.merges == want
    assert len(want) < 400  # stopped early: no pair left twice (min_pair_count = 2)
    assert max(len(t) for t in vocab_bytes(base, want)) == 4  # the cap was reached and held
    stats = json.loads((run / "stats.json").read_text())
    assert stats["merges"] == len(want) and stats["stopped_early"] is True
    # and the same table without the cap merges longer tokens: the cap changed the list
    longer = train_oracle(ids, counts, base.tokens, 400, min_pair_count=2)
    assert max(len(t) for t in vocab_bytes(base, longer)) > 4


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_chars_alphabet_with_a_suffix_equals_the_oracle_and_encodes_as_it(spark, tmp_path,
                                                                          engine):
    from pipeline.encoder import Tokenizer
    from pipeline.train import train

    src = corpus(tmp_path, [SEED, "é_è ü_ hop_"])
    run = tmp_path / "run"
    res = train(spark, Config(input=str(src), output=str(run), num_merges=40, engine=engine,
                              num_partitions=2, alphabet="chars", end_of_word_suffix="_",
                              progress_bar=False))
    ids, counts, base = oracle_input(run, "chars", "_")
    want = train_oracle(ids, counts, base.tokens, 40)
    assert res.merges == want
    tok = Tokenizer.load(str(run))
    assert tok.base.tokens == base.tokens and tok.base.tokens[-1] == b"_"
    # the encoder against the oracle's encode: split, initial symbols, merges by rank
    ranks = {(m.left, m.right): m.new_id for m in want}
    text = "the shop bakes hop_ cakes, é_è"
    expected = [t for w in regex.findall(resolve_pattern("cl100k"), text)
                for t in encode_symbols(list(base.symbols(w)), ranks)]
    assert tok.encode(text) == expected
    assert len(expected) < len(text)  # merges were used
    assert tok.decode(expected) == text  # the suffix symbol is not the text's "_"


def test_chars_alphabet_counts_symbols_of_invalid_utf8_as_the_engines_do(spark, tmp_path):
    """A binary text column with invalid UTF-8 under the chars alphabet: each byte of an
    invalid sequence is one symbol to the engines (surrogateescape), and the run's token
    counts say so; Spark's length() took a lead byte and the two bytes after it for one
    character ("caf\\xe4 ab" counted 1 where the engines see 3)."""
    from pipeline.train import train

    src = tmp_path / "corpus"
    src.mkdir()
    rows = [b"caf\xe4ab abab \x80\x80ab", "é abab".encode(), b"\xf0\x9f ab"]
    pq.write_table(pa.table({"text": pa.array(rows, pa.binary())}), src / "part-0.parquet")
    run = tmp_path / "run"
    res = train(spark, Config(input=str(src), output=str(run), num_merges=3, alphabet="chars",
                              end_of_word_suffix="_", progress_bar=False))
    from .naive_count import naive_count

    table = naive_count([rows], special_tokens=["<|endoftext|>"]).rows()  # (independent)
    words, counts = [w for w, _, _ in table], [c for _, c, _ in table]
    want = sum((len(w.decode("utf-8", "surrogateescape")) + 1) * c
               for w, c in zip(words, counts))
    assert res.stats["corpus_tokens_before"] == want
    ids, base = initial_words(words, alphabet="chars", end_of_word_suffix="_")
    assert res.merges == train_oracle(ids, counts, base.tokens, 3)
    assert res.stats["corpus_tokens_after"] == want - sum(m.count for m in res.merges)


def test_a_chars_rerun_over_a_bytes_run_leaves_none_of_its_exports(spark, tmp_path):
    """A chars run writes no tiktoken or tokenizers export: rerun over a bytes run's
    directory, it removes the earlier run's (they would sit beside the new run.json, which
    would list them, and load_tiktoken would serve the old tokenizer). Made to fail by
    removing only run.json first, as before."""
    from pipeline.outputs import check_run, load_tiktoken
    from pipeline.train import train

    src = corpus(tmp_path, [SEED])
    run = tmp_path / "run"
    train(spark, Config(input=str(src), output=str(run), num_merges=20, progress_bar=False))
    assert (run / "tokenizer.tiktoken").exists() and (run / "tokenizer.json").exists()
    train(spark, Config(input=str(src), output=str(run), num_merges=20, alphabet="chars",
                        resume="never", progress_bar=False))
    left = {p.name for p in run.iterdir()}
    assert not left & {"tokenizer.json", "tokenizer.tiktoken", "tiktoken.json"}, left
    assert set(check_run(str(run))["files"]) == {"merges.txt", "vocab.json",
                                                 "tokenizer_meta.json"}
    with pytest.raises(FileNotFoundError, match="alphabet = 'chars'"):
        load_tiktoken(str(run))


class RecordingCheckpointer:
    """A checkpointer that records how many merges each checkpoint held."""

    def __init__(self) -> None:
        self.saved: list[int] = []
        self.last_written = 0

    def save(self, merges, removed) -> None:
        self.saved.append(len(merges))
        self.last_written = len(merges)


def test_the_merge_log_checkpoints_after_checkpoint_every_seconds(monkeypatch):
    from pipeline import train as train_mod
    from pipeline.bpe import Merge, bytes_vocab

    now = [1000.0]
    monkeypatch.setattr(train_mod.time, "monotonic", lambda: now[0])
    ckpt = RecordingCheckpointer()
    saved = ckpt.saved
    cfg = Config(checkpoint_every_merges=1000, checkpoint_every_seconds=5)
    prep = SimpleNamespace(cfg=cfg, checkpointer=ckpt, target=10, prior=[],
                           prior_removed=[], base=bytes_vocab())
    stage = SimpleNamespace(update=lambda *a, **k: None)
    mlog = train_mod.MergeLog(prep, stage)
    mlog.extend([Merge(97, 98, 256, 5)], [5])
    now[0] += 4
    mlog.extend([Merge(256, 99, 257, 4)], [4])
    assert saved == []  # 2 merges, 4 s: neither limit reached
    now[0] += 2
    mlog.checkpoint()
    assert saved == [2]  # 6 s since the log began: the merges so far are written
    now[0] += 10
    mlog.checkpoint()
    assert saved == [2]  # nothing new to write
    mlog.extend([Merge(257, 100, 258, 3)], [3])
    assert saved == [2, 3]  # 10 s since the last checkpoint
    now[0] += 2
    mlog.extend([Merge(258, 101, 259, 2)], [2])
    assert saved == [2, 3]  # 2 s since the last checkpoint: the timer started again
    now[0] += 4
    mlog.extend([Merge(259, 102, 260, 1)], [1])
    assert saved == [2, 3, 5]


def test_the_driver_engine_checkpoints_every_checkpoint_every_merges():
    """--checkpoint-every-merges N on the driver engine: a checkpoint at N, 2N, ... exactly
    (merges are made in chunks of at most 256, and a chunk ends where a checkpoint is due),
    and the merges still equal the oracle's."""
    import random

    from pipeline import train as train_mod
    from pipeline.bpe import bytes_vocab
    from pipeline.engines.local import LocalTrainer

    rng = random.Random(7)
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 12)))
             for _ in range(2000)]
    counts = [rng.randint(1, 50) for _ in words]
    syms = [list(w.encode()) for w in words]
    base = vocab_bytes(bytes_vocab(), [])
    oracle = [(m.left, m.right) for m in train_oracle(syms, counts, base, 450)]
    for every, expected in ((100, [100, 200, 300, 400]), (300, [300]),
                            (40, list(range(40, 450, 40)))):
        ckpt = RecordingCheckpointer()
        saved = ckpt.saved
        cfg = Config(checkpoint_every_merges=every, checkpoint_every_seconds=3600)
        prep = SimpleNamespace(cfg=cfg, checkpointer=ckpt, target=450, prior=[],
                               prior_removed=[], base=bytes_vocab())
        mlog = train_mod.MergeLog(prep, SimpleNamespace(update=lambda *a, **k: None,
                                                        restart_rate=lambda: None))
        lt = LocalTrainer.from_words(syms, counts, base)
        train_mod._train_local(lt, mlog, cfg)
        assert saved == expected, (every, saved)
        assert [(m.left, m.right) for m in mlog.merges] == oracle
