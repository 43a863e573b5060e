"""Encode and decode with a trained tokenizer (the reference encoder; Python and numpy, no Spark).

Encoding: the text is cut at the special tokens that are allowed, each remaining chunk is
normalized / lowercased as in training and split with the run's pattern (``regex.findall``:
text the pattern does not match is dropped, as in training and in tiktoken; the built-in
patterns match everything), and each word is byte-level BPE encoded: repeatedly merge the
adjacent pair with the lowest rank, leftmost first. For a trained merge list that is the same
as replaying the merges in training order; it is also exactly what Hugging Face ``tokenizers``
does with ``tokenizer.json`` and what tiktoken does with ``tokenizer.tiktoken`` (the parity
tests in ``tests/test_exports.py`` check all three on real and generated text). A word costs
O(n log n) in its length, so a pathological row (2 M spaces, 20 M letters: one word each) is
encoded in seconds, not hours (:func:`bpe_encode`; ``tests/test_long_words.py``).

Token identity is by bytes: if a byte string were made by two merges, the first id is used
(see :mod:`pipeline.outputs`), so our ids are the ids of every export.

Special tokens follow tiktoken's rules: a special-token string in user text is an error unless
it is allowed (``allowed_special``), and is never silently turned into a special id;
``disallowed_special=()`` encodes it as ordinary text.

Text is Unicode plus, as in training, the bytes of invalid UTF-8 as ``surrogateescape`` spells
them (U+DC80..U+DCFF, what ``decode_row`` makes of a binary row): those stay exact bytes. Any
other surrogate (a lone one, or a pair a UTF-16 source left split) is repaired as tiktoken
does: a pair becomes its character, a lone one U+FFFD (:func:`repair_surrogates`).

Decoding is lossless for any id sequence that came from ``encode`` (``decode_bytes`` gives the
exact bytes; ``decode`` the text, after the run's normalization and that repair); an id outside
the vocabulary is an :class:`EncodeError` naming the id and the vocabulary size.
"""

from __future__ import annotations

import base64
import dataclasses
import heapq
import json
import operator
from collections.abc import Collection, Iterable, Sequence

import numpy as np
import regex

from pipeline import fsutil
from pipeline.bpe import BaseVocab, Merge, bytes_vocab, vocab_bytes
from pipeline.order import left_to_right, pack_pairs
from pipeline.outputs import (
    TOKENIZER_META_FORMAT,
    TOKENIZER_META_VERSION,
    IncompleteRun,
    canonical_ids,
    check_run,
)
from pipeline.pretokenize import (
    Pretokenizer,
    PretokenizerSpec,
    cut_specials,
    special_token_pattern,
)

# a surrogate pair, or a surrogate that is not one of surrogateescape's bytes (U+DC80..U+DCFF)
UNENCODABLE = regex.compile("[\ud800-\udbff][\udc00-\udfff]|[\ud800-\udc7f\udd00-\udfff]")


def repair_surrogates(text: str) -> str:
    """``text`` with what UTF-8 cannot encode mended as tiktoken mends it (its UTF-16
    round trip): a surrogate pair becomes its character, any other surrogate U+FFFD; the
    surrogateescape bytes U+DC80..U+DCFF stay (they stand for invalid UTF-8 bytes)."""
    return UNENCODABLE.sub(
        lambda m: m.group().encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        if len(m.group()) == 2 else "\ufffd", text)


CACHE_WORDS = 200_000
CACHE_WORD_CHARS = 256  # longer words are not cached: they rarely repeat and would pin memory
SHORT_WORD = 24  # below this many symbols the quadratic scan beats the heap
LONG_WORD = 1 << 15  # from about this many symbols on, merge_groups (numpy) beats the heap

JOIN_STEP = 1 << 16  # ids joined at a time by Tokenizer.decode

PairRanks = dict[tuple[int, int], tuple[int, int]]


class EncodeError(ValueError):
    pass


def bpe_encode(symbols: Sequence[int], pair_ranks: PairRanks,
               table: PairTable | None = None) -> list[int]:
    """Byte-pair encode one word's initial symbols. ``pair_ranks[(a, b)] = (rank, new id)``.

    Repeatedly merges the adjacent pair of lowest rank (the leftmost on a tie, so ``a a a``
    with ``(a, a)`` gives ``aa a``). The three paths apply exactly these merges in this order
    and differ only in cost, so that no word, however long, costs more than O(n log n): short
    words use a scan per merge (:func:`merge_scan`, quadratic but the fastest below
    ``SHORT_WORD``), longer ones a heap (:func:`merge_heap`), and from ``LONG_WORD`` symbols on
    (a pathological row such as 20 MB of ``a``, or any row with pattern ``none``)
    :func:`merge_groups`, which does the per-symbol work in numpy, when the merge table allows
    it (``table``: the numpy form of ``pair_ranks``, built here when not given)."""
    n = len(symbols)
    if n < 2:
        return list(symbols)
    if n < SHORT_WORD:
        return merge_scan(symbols, pair_ranks)
    if n >= LONG_WORD:
        if table is None:
            table = PairTable(pair_ranks)
        if table.grouped_ok:
            return merge_groups(symbols, table).tolist()
    return merge_heap(symbols, pair_ranks)


def merge_scan(symbols: Sequence[int], pair_ranks: PairRanks) -> list[int]:
    """:func:`bpe_encode` as defined: scan all pairs for the lowest rank, merge it, repeat."""
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


def merge_heap(symbols: Sequence[int], pair_ranks: PairRanks) -> list[int]:
    """:func:`bpe_encode` in O(n log n) for any table: a heap of candidate pairs keyed
    (rank, position) over linked positions pops the lowest rank, leftmost first, as the scan
    picks it (positions keep their text order). A popped entry whose pair no longer stands at
    its position is stale and skipped; if it matches again, that pair does stand there now
    under the same key, so applying it is what the scan would do."""
    n = len(symbols)
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
        rank, i, a, b, new = heapq.heappop(heap)
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


class PairTable:
    """``pair_ranks`` as sorted numpy arrays, for :func:`merge_groups`; built on first use, so
    a tokenizer that never meets a long word never pays for it.

    ``grouped_ok`` says whether merging every occurrence of the lowest-rank pair at once is
    the same as merging them one by one: true when ranks are distinct and every pair that
    contains a merge's result ranks after that merge (so a merge never creates a pair that
    should have gone first). A trained merge list always has this (a token exists before any
    merge that uses it); a ``bytes`` run whose byte strings repeat (duplicate tokens, mapped to
    their first id) may not, and then words of any length take :func:`merge_heap`."""

    DENSE = 256  # pairs of ids below this (every byte pair) are looked up in a dense table

    def __init__(self, pair_ranks: PairRanks):
        self._pair_ranks = pair_ranks
        self._built = False

    def _build(self) -> None:
        items = [(a, b, r, c) for (a, b), (r, c) in self._pair_ranks.items()]
        arr = np.array(items, dtype=np.int64).reshape(-1, 4)
        a, b, r, c = arr.T
        keys = pack_pairs(a, b)
        order = np.argsort(keys)
        self._keys = keys[order]
        self._key_rank = r[order].astype(np.int32)
        top = int(r.max()) + 1 if len(r) else 0
        self._left = np.full(top, -1, np.int64)
        self._right = np.full(top, -1, np.int64)
        self._new = np.full(top, -1, np.int64)
        self._left[r], self._right[r], self._new[r] = a, b, c
        d = self.DENSE
        self._dense = np.full(d * d, -1, np.int32)
        small = (a < d) & (b < d)
        self._dense[a[small] * d + b[small]] = r[small]
        ok = len(np.unique(r)) == len(r)
        if ok and len(r):
            made = np.full(int(max(a.max(), b.max(), c.max())) + 1, -1, np.int64)
            np.maximum.at(made, c, r)  # the latest rank that makes each token
            ok = bool(np.all(r > made[a]) and np.all(r > made[b]))
        self._grouped_ok = ok
        self._built = True

    @property
    def grouped_ok(self) -> bool:
        if not self._built:
            self._build()
        return self._grouped_ok

    def merge(self, rank: int) -> tuple[int, int, int]:
        """(left, right, new) of the pair with this rank."""
        return int(self._left[rank]), int(self._right[rank]), int(self._new[rank])

    STEP = 1 << 18  # pairs looked up at once: bounds the temporaries (about 40 bytes a pair)

    def ranks(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """Rank of each pair (left[i], right[i]) (ids >= 0), -1 where it is not a merge;
        ``STEP`` pairs at a time (a 20 M-character word has 20 M pairs: its temporaries all
        at once would be most of a gigabyte, which a first call pays for in page faults)."""
        if not self._built:
            self._build()
        if len(left) <= self.STEP:
            return self._ranks(left, right)
        out = np.empty(len(left), np.int32)
        for s in range(0, len(left), self.STEP):
            out[s:s + self.STEP] = self._ranks(left[s:s + self.STEP], right[s:s + self.STEP])
        return out

    def _ranks(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        d = self.DENSE
        if not len(left) or (int(left.max()) < d and int(right.max()) < d):
            return self._dense[left * d + right]
        if not len(self._keys):
            return np.full(len(left), -1, np.int32)
        q = pack_pairs(left, right)
        idx = np.searchsorted(self._keys, q)
        np.minimum(idx, len(self._keys) - 1, out=idx)
        return np.where(self._keys[idx] == q, self._key_rank[idx], np.int32(-1))


class _RankBuckets:
    """Positions waiting to be merged, in one bucket per rank, taken lowest rank first."""

    def __init__(self) -> None:
        self.buckets: dict[int, list[np.ndarray]] = {}
        self.ranks: list[int] = []  # heap of the ranks that have a bucket

    def __bool__(self) -> bool:
        return bool(self.ranks)

    def add(self, pos: np.ndarray, r: np.ndarray) -> None:
        """Queue the pairs that start at ``pos`` (increasing), of ranks ``r`` (-1: no merge)."""
        hit = r >= 0
        if not hit.all():
            pos, r = pos[hit], r[hit]
        if not len(pos):
            return
        if r.min() == r.max():
            groups: Iterable[tuple[int, np.ndarray]] = [(int(r[0]), pos)]
        else:
            by_rank = np.argsort(r, kind="stable")  # keeps each rank's positions increasing
            pos, r = pos[by_rank], r[by_rank]
            cuts = np.flatnonzero(r[1:] != r[:-1]) + 1
            groups = zip(r[np.concatenate(([0], cuts))].tolist(), np.split(pos, cuts))
        for rank, p in groups:
            bucket = self.buckets.get(rank)
            if bucket is None:
                self.buckets[rank] = [p]
                heapq.heappush(self.ranks, rank)
            else:
                bucket.append(p)

    def pop(self) -> tuple[int, np.ndarray]:
        """The lowest rank and its positions, increasing and distinct."""
        rank = heapq.heappop(self.ranks)
        parts = self.buckets.pop(rank)
        return rank, parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts))


def merge_groups(symbols: Sequence[int] | bytes, table: PairTable) -> np.ndarray:
    """:func:`bpe_encode` for very long words (needs ``table.grouped_ok``), O(n log n) with the
    per-symbol work in numpy: all pairs of one rank are merged in one vectorized step.

    Why that is exact: the scan takes the lowest rank r present, leftmost first; merging it
    only creates pairs that rank after r (``grouped_ok``), so the scan's next picks are the
    remaining occurrences of the same pair, left to right, until none is left. Two occurrences
    overlap only for a pair ``(a, a)`` inside a run, and there the scan takes the first, third,
    ... of each chain of overlapping ones: so does :func:`order.left_to_right`. Positions are
    linked (``nxt``/``prv``, a merged-away position holds -1); candidates wait in per-rank
    buckets taken in rank order, and a candidate is applied only if its pair still stands."""
    n = len(symbols)
    tok = np.empty(n + 1, np.int32)  # tok[n] = -1: the end, which matches no pair
    tok[:n] = np.frombuffer(symbols, np.uint8) if isinstance(symbols, bytes) else symbols
    tok[n] = -1
    nxt = np.arange(1, n + 2, dtype=np.int32)
    prv = np.arange(-1, n, dtype=np.int32)
    queue = _RankBuckets()
    if n >= 2:
        queue.add(np.arange(n - 1, dtype=np.int32), table.ranks(tok[:n - 1], tok[1:n]))
    while queue:
        rank, p = queue.pop()
        a, b, new = table.merge(rank)
        q = nxt[p]
        stands = (tok[p] == a) & (tok[q] == b)
        if not stands.all():
            p, q = p[stands], q[stands]
        if not len(p):
            continue
        if a == b and len(p) > 1:
            p = left_to_right(p, nxt)
            q = nxt[p]
        k = nxt[q]
        tok[p] = new
        tok[q] = -1
        nxt[p] = k
        prv[k] = p
        # the new pairs start at p and at each p's left neighbour, which lies in [p[i-1], p[i])
        left = prv[p]
        cand = np.empty(2 * len(p), np.int32)
        cand[0::2], cand[1::2] = left, p  # so this is increasing, but for repeats
        keep = cand >= 0
        keep[2::2] &= left[1:] != p[:-1]  # p[i-1] is already there
        cand = cand[keep]
        cand = cand[nxt[cand] < n]
        queue.add(cand, table.ranks(tok[cand], tok[nxt[cand]]))
    out = tok[:n]
    return out[out >= 0]


def _check_text(text: object) -> None:
    if not isinstance(text, str):
        hint = " (decode the bytes first)" if isinstance(text, (bytes, bytearray)) else ""
        raise TypeError(f"text to encode must be a str, not {type(text).__name__}{hint}")


def _id_list(ids: Iterable[int]) -> list[int] | tuple[int, ...]:
    """Token ids as a list of Python ints where they come as a numpy array (whose items would
    be numpy scalars of 30-odd bytes each)."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.dtype == bool):
            raise TypeError(f"token ids must be a 1-D array of integers, not {ids.ndim}-D "
                            f"{ids.dtype}")
        return ids.tolist()
    return ids if isinstance(ids, (list, tuple)) else list(ids)


def _int_id(i: object) -> int:
    try:
        return operator.index(i)  # ints, numpy ints, bools; never a float that looks whole
    except TypeError:
        raise TypeError(f"token ids must be integers, got {i!r}") from None


def _non_int(ids: Sequence[object]) -> object:
    return next((i for i in ids if not hasattr(i, "__index__")), ids[0])


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
        self.pair_table = PairTable(self.pair_ranks)  # numpy form, for very long words
        # the text of each token: the end-of-word suffix symbol adds none (the same
        # characters typed in the text stay)
        self.text_vocab = self.vocab if not base.end_of_word_suffix else vocab_bytes(
            dataclasses.replace(base, tokens=[*base.tokens[:-1], b""]), merges)
        n = len(self.vocab)
        self.special_tokens = list(special_tokens)
        self.special_ids = {s: n + i for i, s in enumerate(special_tokens)}
        self.special_by_id = {i: s.encode() for s, i in self.special_ids.items()}
        self.spec = spec.without_specials()
        self._pre = Pretokenizer(self.spec)
        self._cache: dict[str, list[int]] = {}
        self._special_res: dict[frozenset[str], regex.Pattern[str]] = {}

    @property
    def n_vocab(self) -> int:
        return len(self.vocab) + len(self.special_ids)

    @classmethod
    def load(cls, run_dir: str) -> Tokenizer:
        """The tokenizer of a complete run directory (one with a valid ``run.json``)."""
        path = fsutil.join(run_dir, "tokenizer_meta.json")
        try:
            check_run(run_dir, ("tokenizer_meta.json",))
        except IncompleteRun as exc:
            raise EncodeError(str(exc)) from None
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
        if meta.get("format") != TOKENIZER_META_FORMAT \
                or meta.get("version") != TOKENIZER_META_VERSION:
            raise EncodeError(f"{source}: unknown format {meta.get('format')!r} "
                              f"v{meta.get('version')}; this build reads version "
                              f"{TOKENIZER_META_VERSION}")
        if meta["alphabet"] == "bytes":
            base = bytes_vocab()
        else:
            base = BaseVocab("chars", [base64.b64decode(t) for t in meta["base_tokens"]],
                             meta.get("end_of_word_suffix", ""))
        merges = [Merge(a, b, base.size + i, c) for i, (a, b, c) in enumerate(meta["merges"])]
        spec = PretokenizerSpec.from_meta(meta).without_specials()
        return cls(base, merges, meta["special_tokens"], spec)

    # -- encoding --------------------------------------------------------------------------------
    def _symbols(self, word: str) -> Sequence[int]:
        try:
            return self.base.symbols(word)  # bytes: ints that numpy takes without a copy
        except KeyError as exc:
            raise EncodeError(f"character {exc.args[0]!r} is not in this chars-alphabet "
                              "vocabulary (a chars run encodes only the characters its "
                              "corpus had; train with alphabet = 'bytes' to encode any "
                              "text)") from None

    def encode_word(self, word: str) -> list[int]:
        """One pretokenized word (no splitting, no normalization), in O(n log n) whatever its
        length (:func:`bpe_encode`)."""
        ids = self._cache.get(word)
        if ids is None:
            ids = bpe_encode(self._symbols(word), self.pair_ranks, self.pair_table)
            if len(word) <= CACHE_WORD_CHARS and len(self._cache) < CACHE_WORDS:
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
        _check_text(text)
        out: list[int] = []
        try:
            self._encode_chunk(text, out)
        except UnicodeEncodeError:
            out.clear()
            self._encode_chunk(repair_surrogates(text), out)
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
        _check_text(text)
        try:
            return self._encode(text, allowed_special, disallowed_special)
        except UnicodeEncodeError:  # (rare: only then is the text scanned for surrogates)
            return self._encode(repair_surrogates(text), allowed_special, disallowed_special)

    def _encode(self, text: str, allowed_special: Collection[str] | str,
                disallowed_special: Collection[str] | str) -> list[int]:
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
        if pat is None:
            pat = self._special_res[key] = special_token_pattern(allowed)
        out: list[int] = []
        for chunk, special in cut_specials(text, pat):
            self._encode_chunk(chunk, out)
            if special is not None:
                out.append(self.special_ids[special])
        return out

    def encode_batch(self, texts: Iterable[str], **kwargs) -> list[list[int]]:
        return [self.encode(t, **kwargs) for t in texts]

    # -- decoding --------------------------------------------------------------------------------
    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The tokens' bytes joined (an end-of-word suffix symbol included)."""
        return self._join(ids, self.vocab)

    def _join(self, ids: Iterable[int], vocab: list[bytes]) -> bytes:
        ids = _id_list(ids)
        n = len(vocab)
        try:
            plain = not ids or (min(ids) >= 0 and max(ids) < n)
        except TypeError:
            raise TypeError(f"token ids must be integers, got {_non_int(ids)!r}") from None
        if plain:  # no special token, no id out of range: the joins run in C
            get = vocab.__getitem__
        else:
            ids = [vocab[i] if 0 <= i < n else self._special_bytes(i) for i in map(_int_id, ids)]
            get = None
        # in slices: bytes.join keeps an 80-byte buffer per part (1.6 GB for 20 M ids at once)
        step = JOIN_STEP
        try:
            return b"".join([b"".join(map(get, ids[k:k + step]) if get else ids[k:k + step])
                             for k in range(0, len(ids), step)])
        except TypeError:  # a float among the ids (min and max took it)
            raise TypeError(f"token ids must be integers, got {_non_int(ids)!r}") from None

    def _special_bytes(self, i: int) -> bytes:
        b = self.special_by_id.get(i)
        if b is None:
            raise EncodeError(f"token id {i} is out of range: this vocabulary has ids "
                              f"0..{self.n_vocab - 1}")
        return b

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Text of a token sequence. ``errors`` as in ``bytes.decode``: a sequence cut in the
        middle of a character gives U+FFFD with the default ``"replace"``."""
        return self._join(ids, self.text_vocab).decode("utf-8", errors)
