"""A naive word counter: the definition of the word table, written for the tests from the
documented semantics without any of the pipeline's counting code (no ``Pretokenizer``,
``WordCounter`` or ``FirstSeenLayout``). Only the split patterns' strings are
taken from ``pipeline.patterns.PATTERNS`` (test_pretokenize holds them equal to tiktoken's).

Files in the order given (the caller sorts them by path), rows in order. A row that is null or
empty is skipped; a binary row is decoded as UTF-8, keeping invalid bytes with
``surrogateescape``; special tokens are cut out of the text as it is (leftmost first, the
longest where several start at one place, as tiktoken finds them); every chunk between them is
normalized (``normalization``), then lowercased, then split with ``regex`` (a word is the
whole match; pattern ``none``: the chunk is the word). A word's rank is the index of its first
match among the row's matches. Words
longer than ``max_word_bytes`` (UTF-8, invalid bytes as they were) are left out of the table,
but still take their places in the ranks and in the maxima below.

``first_seen`` packs (file, row, rank) as ``file << (row_bits + rank_bits) | row << rank_bits
| rank``, with the bit lengths of files - 1, the largest row index that has a match, and the
largest rank; past 63 bits it is the dense rank of that key.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import regex

from pipeline.patterns import PATTERNS


def cut_special_tokens(text: str, specials: Sequence[str]) -> tuple[list[str], int]:
    """The non-empty pieces of ``text`` between special tokens, and how many were cut."""
    longest_first = sorted(set(specials), key=len, reverse=True)
    pieces, start, i, cuts = [], 0, 0, 0
    while i < len(text):
        token = next((s for s in longest_first if text.startswith(s, i)), None)
        if token is None:
            i += 1
            continue
        pieces.append(text[start:i])
        cuts += 1
        i += len(token)
        start = i
    pieces.append(text[start:])
    return [p for p in pieces if p], cuts


@dataclass
class NaiveTable:
    files: int
    counts: dict[bytes, int] = field(default_factory=dict)
    first: dict[bytes, tuple[int, int, int]] = field(default_factory=dict)  # (file, row, rank)
    stats: dict[str, int] = field(default_factory=dict)
    max_row: int = 0
    max_rank: int = 0

    def order(self) -> list[bytes]:
        """Words by first occurrence."""
        return sorted(self.first, key=self.first.__getitem__)

    def bit_widths(self) -> tuple[int, int, int]:
        return ((self.files - 1).bit_length(), self.max_row.bit_length(),
                self.max_rank.bit_length())

    def first_seen(self, dense: bool | None = None) -> dict[bytes, int]:
        """word -> expected first_seen: packed when it fits in 63 bits (or ``dense=False``),
        else (or with ``dense=True``) the dense rank."""
        file_bits, row_bits, rank_bits = self.bit_widths()
        if dense is None:
            dense = file_bits + row_bits + rank_bits > 63
        if dense:
            return {w: i for i, w in enumerate(self.order())}
        return {w: f << (row_bits + rank_bits) | r << rank_bits | k
                for w, (f, r, k) in self.first.items()}

    def rows(self, dense: bool | None = None) -> list[tuple[bytes, int, int]]:
        """(word, count, first_seen) in first-seen order."""
        first_seen = self.first_seen(dense)
        return [(w, self.counts[w], first_seen[w]) for w in self.order()]


def naive_count(files: Sequence[Iterable[str | bytes | None]], pattern: str = "cl100k",
                special_tokens: Sequence[str] = (), lowercase: bool = False,
                normalization: str = "none", max_word_bytes: int = 0) -> NaiveTable:
    split = None if pattern == "none" else regex.compile(PATTERNS.get(pattern, pattern))
    table = NaiveTable(files=len(files))
    stats = dict.fromkeys(("rows", "null_rows", "empty_rows", "invalid_utf8_rows", "bytes",
                           "words", "special_tokens", "long_words", "long_word_bytes",
                           "rows_with_long_words"), 0)
    for file_index, rows in enumerate(files):
        for row_index, value in enumerate(rows):
            stats["rows"] += 1
            if value is None:
                stats["null_rows"] += 1
                continue
            if len(value) == 0:
                stats["empty_rows"] += 1
                continue
            if isinstance(value, bytes):
                stats["bytes"] += len(value)
                try:
                    text = value.decode("utf-8")
                except UnicodeDecodeError:
                    stats["invalid_utf8_rows"] += 1
                    text = value.decode("utf-8", "surrogateescape")
            else:
                stats["bytes"] += len(value.encode("utf-8"))
                text = value
            chunks, cuts = cut_special_tokens(text, special_tokens)  # in the raw text
            stats["special_tokens"] += cuts
            if normalization != "none":
                chunks = [unicodedata.normalize(normalization, c) for c in chunks]
            if lowercase:
                chunks = [c.lower() for c in chunks]
            if split is None:
                matches = chunks
            else:
                matches = [m.group() for chunk in chunks for m in split.finditer(chunk)]
            if not matches:
                continue
            table.max_row = max(table.max_row, row_index)
            table.max_rank = max(table.max_rank, len(matches) - 1)
            long_in_row = False
            for rank, match in enumerate(matches):
                word = match.encode("utf-8", "surrogateescape")
                if max_word_bytes and len(word) > max_word_bytes:
                    stats["long_words"] += 1
                    stats["long_word_bytes"] += len(word)
                    long_in_row = True
                    continue
                stats["words"] += 1
                table.counts[word] = table.counts.get(word, 0) + 1
                table.first.setdefault(word, (file_index, row_index, rank))
            stats["rows_with_long_words"] += long_in_row
    table.stats = stats
    return table


def word_table_differences(rows: Iterable[tuple[bytes, int, int]], naive: NaiveTable,
                           dense: bool | None = None) -> list[str]:
    """What differs between a word table's (word, count, first_seen) rows and the naive count:
    the words and counts, the order of first_seen, and its exact values. Empty when equal."""
    rows = [(bytes(w), c, f) for w, c, f in rows]
    problems = []
    got_counts = {w: c for w, c, _ in rows}
    if len(got_counts) != len(rows):
        problems.append(f"{len(rows) - len(got_counts)} duplicate words")
    if got_counts != naive.counts:
        wrong = [(w, got_counts.get(w), naive.counts.get(w))
                 for w in got_counts.keys() | naive.counts.keys()
                 if got_counts.get(w) != naive.counts.get(w)]
        problems.append(f"{len(wrong)} words with other counts (word, got, expected), e.g. "
                        f"{sorted(wrong, key=repr)[:5]}")
        return problems
    got_order = [w for w, _, _ in sorted(rows, key=lambda r: r[2])]
    expected_order = naive.order()
    if got_order != expected_order:
        at = next(i for i, (a, b) in enumerate(zip(got_order, expected_order)) if a != b)
        problems.append(f"first_seen order differs from position {at}: got "
                        f"{got_order[at:at + 3]}, expected {expected_order[at:at + 3]}")
    expected = naive.first_seen(dense)
    wrong = [(w, f, expected[w]) for w, _, f in rows if f != expected[w]]
    if wrong:
        problems.append(f"{len(wrong)} first_seen values differ (word, got, expected; bit "
                        f"widths {naive.bit_widths()}), e.g. {wrong[:5]}")
    return problems


def assert_word_table(out: Path, naive: NaiveTable, dense: bool | None = None) -> None:
    """The word table written to ``out`` (WORDS_DIR) equals the naive count: its schema, the
    words and counts, the order of first_seen and its exact values (packed, or dense)."""
    table = pq.read_table(out / "data")
    assert table.schema.names == ["word", "count", "first_seen"]
    assert [str(t) for t in table.schema.types] == ["binary", "int64", "int64"]
    rows = zip(*(table.column(c).to_pylist() for c in table.schema.names))
    problems = word_table_differences(rows, naive, dense)
    assert not problems, "\n".join(problems)
