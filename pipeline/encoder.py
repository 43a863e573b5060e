"""Encode and decode with a trained tokenizer (the reference encoder; pure Python).

Special tokens follow tiktoken's rules: a special-token string in user text is an error unless
it is allowed (``allowed_special``), and is never silently turned into a special id;
``disallowed_special=()`` encodes it as ordinary text.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Collection, Iterable

import regex

from pipeline import fsutil
from pipeline.bpe import BaseVocab, Merge, encode_symbols, vocab_bytes
from pipeline.pretokenize import Pretokenizer, PretokenizerSpec, word_bytes


class EncodeError(ValueError):
    pass


class Tokenizer:
    def __init__(self, base: BaseVocab, merges: list[Merge], special_tokens: list[str],
                 spec: PretokenizerSpec):
        self.base = base
        self.merges = merges
        self.vocab = vocab_bytes(base, merges)
        self.ranks = {(m.left, m.right): m.new_id for m in merges}
        n = len(self.vocab)
        self.special_ids = {s: n + i for i, s in enumerate(special_tokens)}
        self.special_by_id = {i: s.encode() for s, i in self.special_ids.items()}
        self.spec = PretokenizerSpec(spec.pattern, (), spec.lowercase, spec.normalization)
        self._pre = Pretokenizer(self.spec)
        self._cache: dict[str, list[int]] = {}
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
        if meta.get("format") != "spark-bpe tokenizer" or meta.get("version") != 1:
            raise EncodeError(f"{path}: unknown format {meta.get('format')!r} "
                              f"v{meta.get('version')}; this build reads version 1")
        if meta["alphabet"] == "bytes":
            base = BaseVocab("bytes", [bytes([i]) for i in range(256)])
        else:
            base = BaseVocab("chars", [base64.b64decode(t) for t in meta["base_tokens"]],
                             meta.get("end_of_word_suffix", ""))
        merges = [Merge(a, b, base.size + i, c) for i, (a, b, c) in enumerate(meta["merges"])]
        spec = PretokenizerSpec(meta["pattern"], (), meta["lowercase"], meta["normalization"])
        return cls(base, merges, meta["special_tokens"], spec)

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

    def _encode_chunk(self, text: str, out: list[int]) -> None:
        for w in self._pre.words(text):
            ids = self._cache.get(w)
            if ids is None:
                ids = encode_symbols(self._symbols(w), self.ranks)
                if len(self._cache) < 100_000:
                    self._cache[w] = ids
            out.extend(ids)

    def encode_ordinary(self, text: str) -> list[int]:
        out: list[int] = []
        self._encode_chunk(text, out)
        return out

    def encode(self, text: str, allowed_special: Collection[str] | str = frozenset(),
               disallowed_special: Collection[str] | str = "all") -> list[int]:
        allowed = set(self.special_ids) if allowed_special == "all" else set(allowed_special)
        if disallowed_special == "all":
            disallowed = set(self.special_ids) - allowed
        else:
            disallowed = set(disallowed_special)
        for s in disallowed:
            if s in text:
                raise EncodeError(
                    f"text contains the special token {s!r}; pass allowed_special={{{s!r}}} to "
                    "encode it as a special token, or disallowed_special=() to encode it as text"
                )
        if not allowed:
            return self.encode_ordinary(text)
        pat = regex.compile("|".join(regex.escape(s) for s in sorted(allowed, key=len,
                                                                        reverse=True)))
        out: list[int] = []
        pos = 0
        for m in pat.finditer(text):
            self._encode_chunk(text[pos:m.start()], out)
            out.append(self.special_ids[m.group()])
            pos = m.end()
        self._encode_chunk(text[pos:], out)
        return out

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        parts = []
        n = len(self.vocab)
        for i in ids:
            if 0 <= i < n:
                parts.append(self.vocab[i])
            elif i in self.special_by_id:
                parts.append(self.special_by_id[i])
            else:
                raise EncodeError(f"token id {i} is out of range (vocabulary has {self.n_vocab})")
        return b"".join(parts)

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        data = self.decode_bytes(ids)
        if self.base.end_of_word_suffix:
            data = data.replace(self.base.end_of_word_suffix.encode(), b"")
        return data.decode("utf-8", errors)
