"""Shared pieces of the benchmarks: the reference trainers, timing, the corpus as text files."""

from __future__ import annotations

import glob
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.pretokenize import PATTERNS

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = REPO.parent / "shared" / "corpora" / "en-docs"


def corpus_texts(corpus: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(corpus, "*.parquet")))
    return [t for f in files for t in pq.read_table(f).column("text").to_pylist() if t]


def write_text_files(texts: list[str], out_dir: str, shards: int = 16) -> list[str]:
    """The corpus as plain text files, for ``tokenizers``' ``train(files)``."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    per = (len(texts) + shards - 1) // shards
    for i in range(shards):
        p = os.path.join(out_dir, f"part-{i:05d}.txt")
        with open(p, "w", encoding="utf-8") as fh:
            fh.write("\n".join(texts[i * per:(i + 1) * per]))
        paths.append(p)
    return paths


def hf_train(files: list[str], vocab_size: int, pattern: str = "cl100k") -> int:
    """Hugging Face tokenizers: byte-level BPE with the same split pattern; returns merges."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERNS[pattern]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2)
    tok.train(files, trainer)
    return tok.get_vocab_size()


def rustbpe_train(texts: list[str], vocab_size: int, pattern: str = "cl100k") -> int:
    import rustbpe

    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(iter(texts), vocab_size, pattern=PATTERNS[pattern])
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
