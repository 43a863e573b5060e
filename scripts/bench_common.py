r"""Shared pieces of the benchmarks: the reference trainers, timing, the corpus as rows.

The references see the corpus the way our trainer does: one Parquet row is one text (a word
never spans rows, a row may hold newlines), streamed from the files in corpus order, nulls and
empty strings skipped. Hugging Face ``tokenizers`` gets the split pattern rewritten for
Oniguruma (``pipeline.patterns.onig_pattern``): the raw ``regex`` pattern would let cl100k's
``\p{N}{1,3}+`` swallow whole digit runs there.
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


def _hf_setup(vocab_size: int, pattern: str):
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(onig_pattern(PATTERNS.get(pattern, pattern))),
                             behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2)
    return tok, trainer


def hf_train_rows(rows: Iterable[str], vocab_size: int, pattern: str = "cl100k") -> int:
    """Hugging Face tokenizers ``train_from_iterator`` over the rows (one row = one text, like
    ours): byte-level BPE, the same split pattern; returns the vocabulary size."""
    tok, trainer = _hf_setup(vocab_size, pattern)
    tok.train_from_iterator(rows, trainer)
    return tok.get_vocab_size()


def rustbpe_train(rows: Iterable[str], vocab_size: int, pattern: str = "cl100k") -> int:
    """rustbpe ``train_from_iterator`` over the rows (a list or a streaming iterator)."""
    import rustbpe

    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(iter(rows), vocab_size, pattern=PATTERNS.get(pattern, pattern))
    return tok.vocab_size


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
