"""Pretokenization: text -> words (pure Python, no Spark).

A *word* is one match of the split pattern in a chunk of text between special tokens. Special
tokens are cut out first, so no word ever spans one. The same functions run on the Spark
executors, in the count tasks (``count/word_count.py``), and in the encoder. The tests define
the word table independently (``tests/naive_count.py``).
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice

import regex

from pipeline.patterns import (
    PATTERNS,  # noqa: F401 - also importable from here, as before
    compile_pattern,
    fast_pattern,
    has_fast_pattern,
    in_bmp,
)

# For these patterns a row may be cut between a "\n" and an ASCII letter or digit without
# changing any match: no match runs through such a boundary (a match that takes the "\n" ends
# there, one that starts at the letter or digit looks at nothing before it), and the matches of
# the whitespace run before the cut are the same at a string's end. (Not so for gpt2, which
# splits "  \n" before a word into "  " and "\n" but keeps it whole at the end.) The BMP
# pieces of a row with some characters above U+FFFF then still take the fast pattern.
_LINE_CUT_SAFE = ("cl100k", "o200k")
_LINE_CUT = re.compile(r"(?<=\n)(?=[A-Za-z0-9])")

NORMALIZATIONS = ("none", "NFC", "NFKC", "NFD", "NFKD")


@dataclass(frozen=True)
class PretokenizerSpec:
    """Everything that decides how text becomes words (part of every fingerprint)."""

    pattern: str = "cl100k"
    special_tokens: tuple[str, ...] = ()
    lowercase: bool = False
    normalization: str = "none"

    def as_meta(self) -> dict:
        """The settings as word tables, checkpoints and ``tokenizer_meta.json`` record them."""
        return {"pattern": self.pattern, "special_tokens": list(self.special_tokens),
                "lowercase": self.lowercase, "normalization": self.normalization}

    @classmethod
    def from_meta(cls, meta: dict) -> PretokenizerSpec:
        return cls(meta["pattern"], tuple(meta.get("special_tokens") or ()),
                   bool(meta.get("lowercase", False)), meta.get("normalization", "none"))

    def without_specials(self) -> PretokenizerSpec:
        """The split of text between special tokens (an encoder cuts those out first)."""
        return dataclasses.replace(self, special_tokens=())


def special_token_pattern(specials: Iterable[str]) -> regex.Pattern[str] | None:
    """A pattern that finds the special tokens in text, longest first (of two that start at
    one place, the longer wins); None for none."""
    ordered = sorted(set(specials), key=len, reverse=True)
    return regex.compile("|".join(regex.escape(s) for s in ordered)) if ordered else None


def cut_specials(text: str, specials: regex.Pattern[str]) -> Iterator[tuple[str, str | None]]:
    """``text`` as (ordinary text, the special token after it); the last special is None."""
    pos = 0
    for m in specials.finditer(text):
        yield text[pos:m.start()], m.group()
        pos = m.end()
    yield text[pos:], None


@dataclass
class Pretokenizer:
    spec: PretokenizerSpec
    _split: regex.Pattern[str] | None = field(init=False, repr=False)
    _whole_matches: bool = field(init=False, repr=False)
    _specials: regex.Pattern[str] | None = field(init=False, repr=False)
    _findall: Callable[[str], list[str]] | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._split = compile_pattern(self.spec.pattern)
        self._whole_matches = self._split is None or self._split.groups == 0
        self._findall = None if self._split is None else self._split.findall
        if has_fast_pattern(self.spec.pattern):
            self._findall = _fast_findall(self._split.findall,
                                          re.compile(fast_pattern(self.spec.pattern)).findall,
                                          self.spec.pattern in _LINE_CUT_SAFE)
        self._specials = special_token_pattern(self.spec.special_tokens)

    def prepare(self, text: str) -> str:
        if self.spec.normalization != "none":
            text = unicodedata.normalize(self.spec.normalization, text)
        if self.spec.lowercase:
            text = text.lower()
        return text

    def chunks(self, text: str) -> list[str]:
        """Text between special tokens (special tokens themselves dropped)."""
        if self._specials is None:
            return [text] if text else []
        return [c for c in self._specials.split(text) if c]

    def words(self, text: str) -> list[str]:
        """All words of one row, in text order."""
        return self.split_chunks(self.prepare(c) for c in self.chunks(text))

    def split_chunks(self, chunks: Iterable[str]) -> list[str]:
        """The words of prepared text chunks (special tokens already cut out), in order."""
        if self._split is not None and self._whole_matches and isinstance(chunks, tuple) \
                and len(chunks) == 1:
            return self._findall(chunks[0])
        out: list[str] = []
        for chunk in chunks:
            if self._split is None:
                out.append(chunk)
            elif self._whole_matches:
                out.extend(self._findall(chunk))
            else:  # findall would return groups: a word is always the whole match
                out.extend(m.group() for m in self._split.finditer(chunk))
        return out


def _fast_findall(full: Callable[[str], list[str]], fast: Callable[[str], list[str]],
                  line_cuts: bool) -> Callable[[str], list[str]]:
    """findall of a named pattern: BMP text (or, where line cuts are safe, each BMP piece of a
    row cut at lines starting with a letter or digit) takes the ``re`` translation."""
    cut = _LINE_CUT.split

    def findall(text: str) -> list[str]:
        if in_bmp(text):
            return fast(text)
        if not line_cuts:
            return full(text)
        out: list[str] = []
        for piece in cut(text):
            out += fast(piece) if in_bmp(piece) else full(piece)
        return out

    return findall


def text_values(column) -> list[str | bytes | None]:
    """The values of a text column (a pyarrow array): str, or bytes for a binary column; a
    string column that holds invalid UTF-8 (written by a tool that did not check it) gives
    its values as bytes, which :func:`decode_row` keeps byte-exact, instead of failing."""
    try:  # (dictionary-encoded and view columns too: as Spark's reader, they are text)
        return column.to_pylist()
    except UnicodeDecodeError:
        import pyarrow as pa

        return column.cast(pa.binary()).to_pylist()


def decode_row(value: str | bytes) -> tuple[str, bool]:
    """Text of a row; binary values that are not valid UTF-8 are kept byte-exact via
    surrogateescape. Returns (text, was_valid_utf8)."""
    if isinstance(value, str):
        return value, True
    try:
        return value.decode("utf-8"), True
    except UnicodeDecodeError:
        return value.decode("utf-8", "surrogateescape"), False


def word_bytes(word: str) -> bytes:
    return word.encode("utf-8", "surrogateescape")


@dataclass
class RowStats:
    rows: int = 0
    null_rows: int = 0
    empty_rows: int = 0
    invalid_utf8_rows: int = 0
    bytes: int = 0
    words: int = 0
    special_tokens: int = 0
    long_words: int = 0  # occurrences of words over max_word_bytes, left out
    long_word_bytes: int = 0
    rows_with_long_words: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class WordCounter:
    """Counts words of consecutive rows, remembering each word's first occurrence as
    ``(file, row, rank)``: the file index, the row index in the file and the index of the
    word's first match in that row. Rows must arrive in corpus order ((file, row) increasing;
    set ``file_index`` before a file's rows). The key does not depend on how rows are split
    into partitions, so the minimum over partitions is the global first occurrence.

    The first keys are kept in three lists parallel to ``counts``' insertion order."""

    pretokenizer: Pretokenizer
    file_index: int = 0  # the file whose rows add_row receives
    max_word_bytes: int = 0  # longer words are left out (and counted in stats); 0 = no cap
    counts: dict[str, int] = field(default_factory=dict)
    first_file: list[int] = field(default_factory=list)
    first_row: list[int] = field(default_factory=list)
    first_rank: list[int] = field(default_factory=list)
    stats: RowStats = field(default_factory=RowStats)
    max_row: int = 0  # largest row index with words, and largest rank in a row: they size
    max_rank: int = 0  # the first_seen bit layout, the same for every partitioning
    _last_long_row: int = -1

    def add_row(self, row_index: int, value: str | bytes | None) -> None:
        st = self.stats
        st.rows += 1
        if value is None:
            st.null_rows += 1
            return
        if len(value) == 0:
            st.empty_rows += 1
            return
        text, valid = decode_row(value)
        if not valid:
            st.invalid_utf8_rows += 1
            st.bytes += len(value)
        else:
            st.bytes += len(text) if text.isascii() else len(text.encode("utf-8"))
        pre = self.pretokenizer
        prepare = pre.prepare
        # special tokens are found in the text as it is, then each piece is normalized: as the
        # encoders do (tiktoken's semantics), so "<|ENDOFTEXT|>" stays text under lowercase
        if pre._specials is not None and any(s in text for s in pre.spec.special_tokens):
            pieces = pre._specials.split(text)
            st.special_tokens += len(pieces) - 1
            words = pre.split_chunks(prepare(c) for c in pieces if c)
        else:
            words = pre.split_chunks((prepare(text),))
        if not words:
            return
        st.words += len(words)
        counts = self.counts
        known = len(counts)
        _count_elements(counts, words)
        if row_index > self.max_row:
            self.max_row = row_index
        if len(words) > self.max_rank:  # a rank is below the number of matches in the row
            self.max_rank = len(words) - 1
        new = len(counts) - known
        if not new:  # no word new to this counter: no first occurrence
            return
        # the new words are the last keys of ``counts``, inserted in the order of their first
        # matches in this row: find each one's first match after the previous one's (in C)
        fresh = list(islice(reversed(counts), new))
        fresh.reverse()
        index = words.index
        at = -1
        ranks = []
        cap = self.max_word_bytes
        for w in fresh:
            at = index(w, at + 1)
            if not w:  # an empty match (a pattern whose lookaround matches nothing here, past
                st.words -= self.counts.pop(w)  # check_pattern's probes): no word, no token
                continue
            if cap and len(w) * 4 > cap and len(word_bytes(w)) > cap:
                self._leave_out(w)  # a word new to this counter: its occurrences are here
                continue
            ranks.append(at)
        self.first_rank += ranks
        self.first_row += [row_index] * len(ranks)
        self.first_file += [self.file_index] * len(ranks)

    def _leave_out(self, word: str) -> None:
        """A word over ``max_word_bytes``: not counted (nothing is learned from a 1 MB "word",
        and it would make 1 MB tokens); its occurrences and bytes go to the statistics."""
        n = self.counts.pop(word)
        st = self.stats
        st.words -= n
        st.long_words += n
        st.long_word_bytes += n * len(word_bytes(word))
        if st.rows != self._last_long_row:
            st.rows_with_long_words += 1
            self._last_long_row = st.rows


try:  # the C helper behind Counter(iterable); fall back to Counter if it ever moves
    from collections import _count_elements  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover

    def _count_elements(mapping: dict[str, int], iterable: Iterable[str]) -> None:
        for k, v in Counter(iterable).items():
            mapping[k] = mapping.get(k, 0) + v
