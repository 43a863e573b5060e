"""The BPE algorithm in pure Python: initial symbols, pair counting, merging, the sequential
oracle trainer, and encode/decode. No Spark, no numpy: this file is the definition every fast
engine is tested against (docs/DESIGN.md section 2).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

ALPHABETS = ("bytes", "chars")


@dataclass(frozen=True)
class Merge:
    left: int
    right: int
    new_id: int
    count: int


@dataclass
class BaseVocab:
    """The initial symbols. ``tokens[i]`` is the bytes of symbol i (for ``chars``, the UTF-8 of
    the character, or the end-of-word suffix)."""

    alphabet: str
    tokens: list[bytes]
    end_of_word_suffix: str = ""

    @property
    def size(self) -> int:
        return len(self.tokens)

    @functools.cached_property
    def char_ids(self) -> dict[str, int]:
        """``chars``: each character's symbol id (the end-of-word suffix, if any, is the last
        symbol and not in this map)."""
        n = self.size - (1 if self.end_of_word_suffix else 0)
        return {self.tokens[i].decode("utf-8", "surrogateescape"): i for i in range(n)}

    def symbols(self, word: str, unknown: int | None = None) -> Sequence[int]:
        """A word's initial symbols: its UTF-8 bytes (``bytes``; lone surrogates from invalid
        UTF-8 turned back into their bytes), or one id per character then the suffix
        (``chars``). A character not in the vocabulary raises KeyError, or becomes
        ``unknown`` when that is given."""
        if self.alphabet == "bytes":
            return word.encode("utf-8", "surrogateescape")  # a sequence of ints
        ids = self.char_ids
        syms = [ids[ch] for ch in word] if unknown is None else [ids.get(ch, unknown)
                                                                 for ch in word]
        if self.end_of_word_suffix:
            syms.append(self.size - 1)
        return syms


def bytes_vocab() -> BaseVocab:
    return BaseVocab("bytes", [bytes([i]) for i in range(256)])


def initial_words(
    words: Sequence[bytes], alphabet: str = "bytes", end_of_word_suffix: str = ""
) -> tuple[list[list[int]], BaseVocab]:
    """Words (UTF-8 bytes, in first-seen order) -> initial symbol ids and the base vocabulary.

    ``bytes``: ids are the byte values 0..255. ``chars``: one symbol per character, ids given in
    order of first appearance (words are in first-seen order, so this is deterministic), and the
    end-of-word suffix, if any, is one more symbol, the last, appended to every word (as the
    Spark count's ``chars`` vocabulary in ``train.py``); the symbols are
    :meth:`BaseVocab.symbols`'.
    """
    if alphabet == "bytes":
        if end_of_word_suffix:
            raise ValueError("end_of_word_suffix needs alphabet = 'chars'")
        return [list(w) for w in words], bytes_vocab()
    if alphabet != "chars":
        raise ValueError(f"alphabet must be one of {ALPHABETS}, not {alphabet!r}")
    texts = [w.decode("utf-8", "surrogateescape") for w in words]
    chars = dict.fromkeys(ch for t in texts for ch in t)  # in order of first appearance
    tokens = [ch.encode("utf-8", "surrogateescape") for ch in chars]
    if end_of_word_suffix:
        tokens.append(end_of_word_suffix.encode())
    base = BaseVocab("chars", tokens, end_of_word_suffix)
    return [list(base.symbols(t)) for t in texts], base


def count_pairs(
    words: Sequence[Sequence[int]], counts: Sequence[int]
) -> dict[tuple[int, int], int]:
    """Weighted pair counts; dict order is the order of first occurrence (words in first-seen
    order, pairs left to right), which is exactly the tie-break order."""
    pairs: dict[tuple[int, int], int] = {}
    for toks, c in zip(words, counts):
        for p in zip(toks, toks[1:]):
            pairs[p] = pairs.get(p, 0) + c
    return pairs


def merge_word(tokens: Sequence[int], a: int, b: int, new_id: int) -> list[int]:
    """Replace each ``a b`` by ``new_id``, reading left to right (``a a a`` -> ``aa a``)."""
    out: list[int] = []
    i, n = 0, len(tokens)
    while i < n:
        if i + 1 < n and tokens[i] == a and tokens[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(tokens[i])
            i += 1
    return out


def train_oracle(
    words: Sequence[Sequence[int]],
    counts: Sequence[int],
    token_bytes: Sequence[bytes],
    num_merges: int,
    min_pair_count: int = 2,
    max_token_bytes: int | None = None,
) -> list[Merge]:
    """The sequential trainer: slow, obviously correct. ``words`` must be in first-seen order.

    Every step recounts all pairs, picks the highest count (ties: the pair seen first), skips
    pairs whose merged token would be longer than ``max_token_bytes``, and merges it in every
    word left to right.
    """
    cur = [list(w) for w in words]
    vocab = list(token_bytes)
    merges: list[Merge] = []
    for _ in range(num_merges):
        best: tuple[int, int] | None = None
        best_count = 0
        for p, c in count_pairs(cur, counts).items():
            if c > best_count and (
                max_token_bytes is None or len(vocab[p[0]]) + len(vocab[p[1]]) <= max_token_bytes
            ):
                best, best_count = p, c
        if best is None or best_count < min_pair_count:
            break
        new_id = len(vocab)
        vocab.append(vocab[best[0]] + vocab[best[1]])
        merges.append(Merge(best[0], best[1], new_id, best_count))
        cur = [merge_word(t, best[0], best[1], new_id) for t in cur]
    return merges


def tokens_after(
    words: Sequence[Sequence[int]], counts: Sequence[int], merges: Sequence[Merge]
) -> list[int]:
    """Total tokens in the corpus after each merge (the seeds' "tokens left" column)."""
    cur = [list(w) for w in words]
    out = []
    for m in merges:
        cur = [merge_word(t, m.left, m.right, m.new_id) for t in cur]
        out.append(sum(len(t) * c for t, c in zip(cur, counts)))
    return out


def encode_symbols(symbols: Sequence[int], ranks: dict[tuple[int, int], int]) -> list[int]:
    """Encode one word's initial symbols: repeatedly merge the adjacent pair of lowest rank
    (equivalent to replaying the merges in training order). ``ranks[(a, b)]`` is the new id.

    This is the definition, kept apart from the encoder's fast paths on purpose
    (``encoder.bpe_encode``: a scan, a heap, numpy groups, over ranks that may differ from
    ids) so that the tests compare them with it rather than with themselves."""
    toks = list(symbols)
    while len(toks) > 1:
        best_rank = None
        for p in zip(toks, toks[1:]):
            r = ranks.get(p)
            if r is not None and (best_rank is None or r < best_rank):
                best_rank, best = r, p
        if best_rank is None:
            break
        toks = merge_word(toks, best[0], best[1], best_rank)
    return toks


def vocab_bytes(base: BaseVocab, merges: Sequence[Merge]) -> list[bytes]:
    """Every token's bytes: the base tokens, then one per merge."""
    return extend_vocab(list(base.tokens), merges)


def extend_vocab(vocab: list[bytes], merges: Sequence[Merge]) -> list[bytes]:
    """Append the tokens of ``merges`` (whose ids continue ``vocab``) to ``vocab``."""
    for m in merges:
        if m.new_id != len(vocab):
            raise ValueError(f"merge ids are not consecutive at {m}")
        vocab.append(vocab[m.left] + vocab[m.right])
    return vocab
