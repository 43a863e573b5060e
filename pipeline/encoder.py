"""Encode and decode with a trained tokenizer (the reference encoder; pure Python, no Spark).

Encoding: the text is cut at the special tokens that are allowed, each remaining chunk is
normalized / lowercased as in training and split with the run's pattern (``regex.findall``:
text the pattern does not match is dropped, as in training and in tiktoken; the built-in
patterns match everything), and each word is byte-level BPE encoded: repeatedly merge the
adjacent pair with the lowest rank, leftmost first. For a trained merge list that is the same
as replaying the merges in training order; it is also exactly what Hugging Face ``tokenizers``
does with ``tokenizer.json`` and what tiktoken does with ``tokenizer.tiktoken`` (the parity
tests in ``tests/test_exports.py`` check all three on real and generated text).

Token identity is by bytes: if a byte string were made by two merges, the first id is used
(see :mod:`pipeline.outputs`), so our ids are the ids of every export.

Special tokens follow tiktoken's rules: a special-token string in user text is an error unless
it is allowed (``allowed_special``), and is never silently turned into a special id;
``disallowed_special=()`` encodes it as ordinary text.

Decoding is lossless for any id sequence that came from ``encode`` (``decode_bytes`` gives the
exact bytes; ``decode`` the text, after the run's normalization); an id outside the vocabulary
is an :class:`EncodeError` naming the id and the vocabulary size.
"""

from __future__ import annotations

import base64
import heapq
import json
from collections.abc import Collection, Iterable

import regex

from pipeline import fsutil
from pipeline.bpe import BaseVocab, Merge, vocab_bytes
from pipeline.outputs import canonical_ids
from pipeline.pretokenize import Pretokenizer, PretokenizerSpec, word_bytes

CACHE_WORDS = 200_000
SHORT_WORD = 24  # below this many symbols the quadratic scan beats the heap


class EncodeError(ValueError):
    pass


def bpe_encode(symbols: list[int], pair_ranks: dict[tuple[int, int], tuple[int, int]]
               ) -> list[int]:
    """Byte-pair encode one word's initial symbols. ``pair_ranks[(a, b)] = (rank, new id)``.

    Repeatedly merges the adjacent pair of lowest rank (the leftmost on a tie, so ``a a a``
    with ``(a, a)`` gives ``aa a``). Short words use a scan per merge; long ones (pattern
    ``none`` makes a whole row one word) a heap of candidate pairs over linked positions, which
    applies merges in the same order."""
    n = len(symbols)
    if n < 2:
        return list(symbols)
    if n < SHORT_WORD:
        toks = list(symbols)
        get = pair_ranks.get
        while len(toks) > 1:
            best = None
            best_i = -1
            for i in range(len(toks) - 1):
                r = get((toks[i], toks[i + 1]))
                if r is not None and (best is None or r[0] < best[0]):
                    best, best_i = r, i
            if best is None:
                return toks
            toks[best_i:best_i + 2] = [best[1]]
        return toks
    toks = list(symbols)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    heap = []
    for i in range(n - 1):
        r = pair_ranks.get((toks[i], toks[i + 1]))
        if r is not None:
            heap.append((r[0], i, toks[i], toks[i + 1], r[1]))
    heapq.heapify(heap)
    alive = [True] * n
    while heap:
        _, i, a, b, new = heapq.heappop(heap)
        j = nxt[i]
        if not alive[i] or j >= n or toks[i] != a or toks[j] != b:
            continue  # stale: one side was merged away since this pair was pushed
        toks[i] = new
        alive[j] = False
        k = nxt[j]
        nxt[i] = k
        if k < n:
            prv[k] = i
            r = pair_ranks.get((new, toks[k]))
            if r is not None:
                heapq.heappush(heap, (r[0], i, new, toks[k], r[1]))
        p = prv[i]
        if p >= 0:
            r = pair_ranks.get((toks[p], new))
            if r is not None:
                heapq.heappush(heap, (r[0], p, toks[p], new, r[1]))
    out = []
    i = 0
    while i < n:
        out.append(toks[i])
        i = nxt[i]
    return out


class Tokenizer:
    def __init__(self, base: BaseVocab, merges: list[Merge], special_tokens: list[str],
                 spec: PretokenizerSpec):
        self.base = base
        self.merges = merges
        self.vocab = vocab_bytes(base, merges)
        # bytes alphabet: identity by bytes (see the module docstring); chars: by id, since an
        # end-of-word suffix symbol and the same characters typed in the text are different
        self.canon = (canonical_ids(self.vocab) if base.alphabet == "bytes"
                      else list(range(len(self.vocab))))
        canon = self.canon
        self.pair_ranks: dict[tuple[int, int], tuple[int, int]] = {}
        for m in merges:
            self.pair_ranks.setdefault((canon[m.left], canon[m.right]),
                                       (m.new_id, canon[m.new_id]))
        n = len(self.vocab)
        self.special_tokens = list(special_tokens)
        self.special_ids = {s: n + i for i, s in enumerate(special_tokens)}
        self.special_by_id = {i: s.encode() for s, i in self.special_ids.items()}
        self.spec = PretokenizerSpec(spec.pattern, (), spec.lowercase, spec.normalization)
        self._pre = Pretokenizer(self.spec)
        self._cache: dict[str, list[int]] = {}
        self._special_res: dict[frozenset[str], regex.Pattern[str]] = {}
        if base.alphabet == "chars":
            n_chars = base.size - (1 if base.end_of_word_suffix else 0)
            self._char_ids = {base.tokens[i].decode("utf-8", "surrogateescape"): i
                              for i in range(n_chars)}

    @property
    def n_vocab(self) -> int:
        return len(self.vocab) + len(self.special_ids)

    @classmethod
    def load(cls, run_dir: str) -> Tokenizer:
        path = fsutil.join(run_dir, "tokenizer_meta.json")
        try:
            meta = json.loads(fsutil.read_text(None, path))
        except FileNotFoundError:
            raise EncodeError(f"{run_dir} is not a trained run (no tokenizer_meta.json)") from None
        except ValueError:
            raise EncodeError(f"{path} is corrupt: retrain or restore the run directory") from None
        return cls.from_meta(meta, path)

    @classmethod
    def from_meta(cls, meta: dict, source: str = "tokenizer_meta.json") -> Tokenizer:
        """Build from the parsed ``tokenizer_meta.json`` of a run."""
        if meta.get("format") != "spark-bpe tokenizer" or meta.get("version") != 1:
            raise EncodeError(f"{source}: unknown format {meta.get('format')!r} "
                              f"v{meta.get('version')}; this build reads version 1")
        if meta["alphabet"] == "bytes":
            base = BaseVocab("bytes", [bytes([i]) for i in range(256)])
        else:
            base = BaseVocab("chars", [base64.b64decode(t) for t in meta["base_tokens"]],
                             meta.get("end_of_word_suffix", ""))
        merges = [Merge(a, b, base.size + i, c) for i, (a, b, c) in enumerate(meta["merges"])]
        spec = PretokenizerSpec(meta["pattern"], (), meta["lowercase"], meta["normalization"])
        return cls(base, merges, meta["special_tokens"], spec)

    # -- encoding --------------------------------------------------------------------------------
    def _symbols(self, word: str) -> list[int]:
        if self.base.alphabet == "bytes":
            return list(word_bytes(word))
        try:
            syms = [self._char_ids[ch] for ch in word]
        except KeyError as exc:
            raise EncodeError(f"character {exc.args[0]!r} is not in this chars-alphabet "
                              "vocabulary") from None
        if self.base.end_of_word_suffix:
            syms.append(self.base.size - 1)
        return syms

    def encode_word(self, word: str) -> list[int]:
        """One pretokenized word (no splitting, no normalization)."""
        ids = self._cache.get(word)
        if ids is None:
            ids = bpe_encode(self._symbols(word), self.pair_ranks)
            if len(self._cache) < CACHE_WORDS:
                self._cache[word] = ids
        return ids

    def _encode_chunk(self, text: str, out: list[int]) -> None:
        if not text:
            return
        enc = self.encode_word
        for w in self._pre.words(text):
            out.extend(enc(w))

    def words(self, text: str) -> list[str]:
        """The pretokenized words of a chunk of text (after normalization), as in training."""
        return self._pre.words(text)

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode, treating special-token strings as ordinary text (tiktoken's
        ``encode_ordinary``)."""
        out: list[int] = []
        self._encode_chunk(text, out)
        return out

    def _special_set(self, value: Collection[str] | str, what: str) -> set[str]:
        if value == "all":
            return set(self.special_ids)
        if isinstance(value, str):
            raise EncodeError(f"{what} must be 'all' or a collection of special tokens, "
                              f"not the string {value!r}")
        names = set(value)
        unknown = names - set(self.special_ids)
        if unknown:
            raise EncodeError(f"{what}: {sorted(unknown)} are not special tokens of this "
                              f"tokenizer (it has {sorted(self.special_ids)})")
        return names

    def encode(self, text: str, allowed_special: Collection[str] | str = frozenset(),
               disallowed_special: Collection[str] | str = "all") -> list[int]:
        """Encode with tiktoken's special-token semantics: an allowed special token becomes its
        id; a disallowed one in the text raises :class:`EncodeError`; any other is text."""
        allowed = self._special_set(allowed_special, "allowed_special")
        if disallowed_special == "all":
            disallowed = set(self.special_ids) - allowed
        else:
            disallowed = self._special_set(disallowed_special, "disallowed_special")
        for s in sorted(disallowed):
            if s in text:
                raise EncodeError(
                    f"text contains the special token {s!r}; pass allowed_special={{{s!r}}} to "
                    "encode it as a special token, or disallowed_special=() to encode it as text"
                )
        if not allowed:
            return self.encode_ordinary(text)
        key = frozenset(allowed)
        pat = self._special_res.get(key)
        if pat is None:  # longest first: of two specials starting at one place, the longer wins
            pat = regex.compile("|".join(regex.escape(s) for s in sorted(allowed, key=len,
                                                                            reverse=True)))
            self._special_res[key] = pat
        out: list[int] = []
        pos = 0
        for m in pat.finditer(text):
            self._encode_chunk(text[pos:m.start()], out)
            out.append(self.special_ids[m.group()])
            pos = m.end()
        self._encode_chunk(text[pos:], out)
        return out

    def encode_batch(self, texts: Iterable[str], **kwargs) -> list[list[int]]:
        return [self.encode(t, **kwargs) for t in texts]

    # -- decoding --------------------------------------------------------------------------------
    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        parts = []
        vocab = self.vocab
        n = len(vocab)
        for i in ids:
            if 0 <= i < n:
                parts.append(vocab[i])
            elif i in self.special_by_id:
                parts.append(self.special_by_id[i])
            else:
                raise EncodeError(f"token id {i} is out of range: this vocabulary has ids "
                                  f"0..{self.n_vocab - 1}")
        return b"".join(parts)

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Text of a token sequence. ``errors`` as in ``bytes.decode``: a sequence cut in the
        middle of a character gives U+FFFD with the default ``"replace"``."""
        data = self.decode_bytes(ids)
        if self.base.end_of_word_suffix:
            data = data.replace(self.base.end_of_word_suffix.encode(), b"")
        return data.decode("utf-8", errors)
