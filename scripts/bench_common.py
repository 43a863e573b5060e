r"""Shared pieces of the benchmarks: the reference trainers, timing, the corpus as rows.

The references see the corpus the way our trainer does: one Parquet row is one text (a word
never spans rows, a row may hold newlines), streamed from the files in corpus order, nulls and
empty strings skipped. Hugging Face ``tokenizers`` gets the split pattern rewritten for
Oniguruma (``pipeline.patterns.onig_pattern``): the raw ``regex`` pattern would let cl100k's
``\p{N}{1,3}+`` swallow whole digit runs there. Both references are given the same special
tokens as ours (``<|endoftext|>`` by default), which take a slot of the vocabulary as they do
in ours, so all three make the same number of merges; ``save`` has each write its tokenizer,
as ours does, inside the timed run.
"""

from __future__ import annotations

import glob
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.outputs import onig_pattern
from pipeline.patterns import PATTERNS

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = REPO.parent / "shared" / "corpora" / "en-docs"


def corpus_files(corpus: str) -> list[str]:
    """The Parquet files of a corpus (a directory, a file or a glob), sorted by path."""
    if os.path.isdir(corpus):
        return sorted(glob.glob(os.path.join(corpus, "*.parquet")))
    return sorted(glob.glob(corpus))


def iter_rows(corpus: str, column: str = "text", batch_rows: int = 1024) -> Iterator[str]:
    """The corpus rows in corpus order, streamed a record batch at a time (nulls and empty
    strings skipped, as our word count does)."""
    for f in corpus_files(corpus):
        for batch in pq.ParquetFile(f).iter_batches(batch_size=batch_rows, columns=[column]):
            yield from (t for t in batch.column(0).to_pylist() if t)


def corpus_texts(corpus: str) -> list[str]:
    """All rows in memory (small corpora only; ``iter_rows`` streams)."""
    return list(iter_rows(corpus))


SPECIALS = ("<|endoftext|>",)  # our trainer's default special tokens


def _hf_setup(vocab_size: int, pattern: str, specials: tuple[str, ...] = ()):
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(onig_pattern(PATTERNS.get(pattern, pattern))),
                             behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, special_tokens=list(specials))
    return tok, trainer


def hf_train_rows(rows: Iterable[str], vocab_size: int, pattern: str = "cl100k",
                  specials: tuple[str, ...] = (), save: str | None = None) -> int:
    """Hugging Face tokenizers ``train_from_iterator`` over the rows (one row = one text, like
    ours): byte-level BPE, the same split pattern; ``specials`` count in ``vocab_size``;
    ``save``: write ``tokenizer.json`` there. Returns the vocabulary size (specials included)."""
    tok, trainer = _hf_setup(vocab_size, pattern, specials)
    tok.train_from_iterator(rows, trainer)
    if save:
        tok.save(os.path.join(save, "tokenizer.json"))
    return tok.get_vocab_size()


def rustbpe_train(rows: Iterable[str], vocab_size: int, pattern: str = "cl100k",
                  specials: tuple[str, ...] = (), save: str | None = None) -> int:
    """rustbpe ``train_from_iterator`` over the rows (a list or a streaming iterator). rustbpe
    has no special tokens: they are counted out of ``vocab_size`` (the merges are the same
    number as a trainer's that has them). ``save``: write the ranks as a ``.tiktoken`` file
    (base64 token, rank), as ours does. Returns the vocabulary size, specials included."""
    import base64

    import rustbpe

    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(iter(rows), vocab_size - len(specials),
                            pattern=PATTERNS.get(pattern, pattern))
    if save:
        ranks = sorted(tok.get_mergeable_ranks(), key=lambda kv: kv[1])
        Path(save, "ranks.tiktoken").write_bytes(b"".join(
            base64.b64encode(bytes(token)) + b" %d\n" % rank for token, rank in ranks))
    return tok.vocab_size + len(specials)


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def fmt_row(name: str, secs: list[float], ref: float | None = None) -> str:
    med = median(secs)
    ratio = f"{med / ref:6.2f}x" if ref else "      "
    runs = ", ".join(f"{s:.1f}" for s in secs)
    return f"| {name} | {med:.2f} s | {ratio} | {runs} |"
