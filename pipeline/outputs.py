"""The run directory: merge list, vocabulary, trace, config, stats and loader-ready exports.

Files (all text, written atomically):
- ``merges.txt`` + ``vocab.json``: GPT-2 format, tokens spelled with the byte-level unicode map
- ``trace.tsv``: rank, left, right, new token, count, tokens left in the corpus
- ``tokenizer.json``: Hugging Face ``tokenizers`` (byte-level BPE, the run's split pattern)
- ``tokenizer.tiktoken`` + ``tiktoken.json``: tiktoken ranks, pattern and special tokens
- ``config.json``, ``stats.json``, and ``run.json`` last (the run is complete when it exists)
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline import fsutil
from pipeline.bpe import BaseVocab, Merge, vocab_bytes
from pipeline.pretokenize import resolve_pattern

RUN_FORMAT_VERSION = 1


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + n)
            n += 1
    return mapping


BYTE_ENCODER = bytes_to_unicode()
BYTE_DECODER = {v: k for k, v in BYTE_ENCODER.items()}


def gpt2_spelling(token: bytes) -> str:
    return "".join(BYTE_ENCODER[b] for b in token)


def printable(token: bytes) -> str:
    """A readable, one-line rendering of a token for the trace."""
    text = token.decode("utf-8", "backslashreplace")
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace(
        "\r", "\\r")


@dataclass
class TrainedTokenizer:
    base: BaseVocab
    merges: list[Merge]
    special_tokens: list[str]
    pattern: str  # name or regex, as configured
    lowercase: bool = False
    normalization: str = "none"

    @property
    def vocab(self) -> list[bytes]:
        return vocab_bytes(self.base, self.merges)

    def special_ids(self) -> dict[str, int]:
        n = self.base.size + len(self.merges)
        return {s: n + i for i, s in enumerate(self.special_tokens)}

    @property
    def pattern_regex(self) -> str | None:
        return resolve_pattern(self.pattern)


def write_trace(path: str, tok: TrainedTokenizer, tokens_left: Sequence[int], spark=None) -> None:
    vocab = tok.vocab
    lines = ["rank\tleft\tright\tnew_token\tcount\ttokens_left"]
    for i, (m, left) in enumerate(zip(tok.merges, tokens_left)):
        lines.append(
            f"{i + 1}\t{printable(vocab[m.left])}\t{printable(vocab[m.right])}\t"
            f"{printable(vocab[m.new_id])}\t{m.count}\t{left}"
        )
    fsutil.write_text(spark, path, "\n".join(lines) + "\n")


def merges_txt(tok: TrainedTokenizer) -> str:
    vocab = tok.vocab
    lines = ["#version: 0.2"]
    lines += [f"{gpt2_spelling(vocab[m.left])} {gpt2_spelling(vocab[m.right])}"
              for m in tok.merges]
    return "\n".join(lines) + "\n"


def vocab_json(tok: TrainedTokenizer) -> dict[str, int]:
    """Token spelling -> id. A byte string made twice (by two different merges) keeps its first
    id, as Hugging Face and tiktoken do."""
    out: dict[str, int] = {}
    for i, t in enumerate(tok.vocab):
        out.setdefault(gpt2_spelling(t), i)
    for s, i in tok.special_ids().items():
        out[s] = i
    return out


def hf_tokenizer_json(tok: TrainedTokenizer) -> dict:
    vocab = tok.vocab
    normalizers = []
    if tok.normalization != "none":
        normalizers.append({"type": tok.normalization})
    if tok.lowercase:
        normalizers.append({"type": "Lowercase"})
    pre = [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": False}]
    if tok.pattern_regex is not None:
        pre.insert(0, {"type": "Split", "pattern": {"Regex": tok.pattern_regex},
                       "behavior": "Isolated", "invert": False})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for s, i in tok.special_ids().items()
        ],
        "normalizer": (None if not normalizers else
                       normalizers[0] if len(normalizers) == 1 else
                       {"type": "Sequence", "normalizers": normalizers}),
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {gpt2_spelling(t): i for i, t in reversed(list(enumerate(vocab)))},
            "merges": [[gpt2_spelling(vocab[m.left]), gpt2_spelling(vocab[m.right])]
                       for m in tok.merges],
        },
    }


def tiktoken_ranks(tok: TrainedTokenizer) -> str:
    seen: set[bytes] = set()
    lines = []
    for i, t in enumerate(tok.vocab):
        if t in seen:
            continue  # a byte string made twice keeps its first rank
        seen.add(t)
        lines.append(f"{base64.b64encode(t).decode()} {i}")
    return "\n".join(lines) + "\n"


def write_exports(run_dir: str, tok: TrainedTokenizer, spark=None) -> list[str]:
    """Write every export this tokenizer supports; returns notes on what was not exported."""
    j = fsutil.join
    notes = []
    fsutil.write_text(spark, j(run_dir, "merges.txt"), merges_txt(tok))
    fsutil.write_text(spark, j(run_dir, "vocab.json"),
                      json.dumps(vocab_json(tok), ensure_ascii=False, indent=0))
    if tok.base.alphabet != "bytes":
        notes.append(
            "tokenizer.json and tokenizer.tiktoken are not written: this run starts from "
            "characters (alphabet = 'chars'), and both formats need a byte-level vocabulary. "
            "merges.txt and vocab.json spell tokens with the byte-level map of their UTF-8."
        )
    else:
        fsutil.write_text(spark, j(run_dir, "tokenizer.json"),
                          json.dumps(hf_tokenizer_json(tok), ensure_ascii=False))
        fsutil.write_text(spark, j(run_dir, "tokenizer.tiktoken"), tiktoken_ranks(tok))
        fsutil.write_text(spark, j(run_dir, "tiktoken.json"), json.dumps({
            "name": "spark-bpe",
            "pat_str": tok.pattern_regex or r"[\s\S]+",
            "special_tokens": tok.special_ids(),
            "pattern_name": tok.pattern,
            "lowercase": tok.lowercase,
            "normalization": tok.normalization,
        }, ensure_ascii=False, indent=2))
    fsutil.write_text(spark, j(run_dir, "tokenizer_meta.json"), json.dumps({
        "format": "spark-bpe tokenizer",
        "version": RUN_FORMAT_VERSION,
        "alphabet": tok.base.alphabet,
        "base_tokens": [base64.b64encode(t).decode() for t in tok.base.tokens]
        if tok.base.alphabet != "bytes" else None,
        "end_of_word_suffix": tok.base.end_of_word_suffix,
        "merges": [[m.left, m.right, m.count] for m in tok.merges],
        "special_tokens": tok.special_tokens,
        "pattern": tok.pattern,
        "lowercase": tok.lowercase,
        "normalization": tok.normalization,
    }))
    return notes


def load_tiktoken(run_dir: str):
    """A ``tiktoken.Encoding`` for a run directory (needs the ``tiktoken`` package)."""
    import tiktoken

    j = fsutil.join
    try:
        meta = json.loads(fsutil.read_text(None, j(run_dir, "tiktoken.json")))
        ranks_text = fsutil.read_text(None, j(run_dir, "tokenizer.tiktoken"))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{run_dir} has no tiktoken export (tokenizer.tiktoken + tiktoken.json); "
            "chars-alphabet runs cannot be exported to tiktoken") from None
    ranks = {}
    for line in ranks_text.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(
        name=meta.get("name", "spark-bpe"),
        pat_str=meta["pat_str"],
        mergeable_ranks=ranks,
        special_tokens=meta["special_tokens"],
    )
