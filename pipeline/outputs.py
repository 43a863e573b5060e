"""The run directory: merge list, vocabulary, trace, config, stats and loader-ready exports.

Files (all text, written atomically):
- ``merges.txt`` + ``vocab.json``: GPT-2 format, tokens spelled with the byte-level unicode map
- ``trace.tsv``: rank, left, right, new token, count, tokens left in the corpus
- ``tokenizer.json``: Hugging Face ``tokenizers`` (byte-level BPE, the run's split pattern)
- ``tokenizer.tiktoken`` + ``tiktoken.json``: tiktoken ranks, pattern and special tokens
- ``tokenizer_meta.json``: the merge list by id (what :class:`pipeline.encoder.Tokenizer` reads)
- ``config.json``, ``stats.json``, and ``run.json`` last (the run is complete when it exists)

One tokenizer, four spellings, one encoding. Every format identifies a token by its bytes, so
if a byte string were ever made by two merges (``(a, bc)`` and later ``(ab, c)``), the first id
is the token's id everywhere: ``vocab.json``, ``tokenizer.json`` and ``tokenizer.tiktoken``
keep the first id, ``merges.txt`` keeps the first merge of a repeated pair of spellings, and
:class:`pipeline.encoder.Tokenizer` maps the later id to the first one. The later id is a hole
(never produced by encoding; still decodable by our decoder). ``tokenizer_meta.json`` lists
such ids under ``duplicate_tokens``; on the runs we checked (en-docs, multilingual, gpt2 /
cl100k / o200k / none patterns, 8k-32k vocabularies) there were none.

Usage::

    enc = load_tiktoken("out/run")                       # tiktoken.Encoding
    enc.encode("hello <|endoftext|>", allowed_special={"<|endoftext|>"})

    from tokenizers import Tokenizer
    hf = Tokenizer.from_file("out/run/tokenizer.json")  # also PreTrainedTokenizerFast(
    hf.encode("hello").ids                               #   tokenizer_file=...) in transformers
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import regex

from pipeline import fsutil
from pipeline.bpe import BaseVocab, Merge, vocab_bytes
from pipeline.config import ConfigError
from pipeline.patterns import (
    PATTERNS,
    onig_pattern,
    regex_only_syntax,
    resolve_pattern,
    tiktoken_pattern,
)
from pipeline.pretokenize import PretokenizerSpec

TOKENIZER_META_FORMAT = "spark-bpe tokenizer"  # tokenizer_meta.json, what encoder.py reads
TOKENIZER_META_VERSION = 1
TIKTOKEN_ANY = r"[\s\S]+"  # tiktoken's pat_str for pattern = none (a chunk is one piece)


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


_SPELLING_TABLE = {b: c for b, c in BYTE_ENCODER.items()}  # latin-1 ordinal -> GPT-2 letter


def gpt2_spelling(token: bytes) -> str:
    """The token in GPT-2's byte-to-letter alphabet (``vocab.json``, ``merges.txt``): each
    byte is one letter (latin-1 decodes byte b to code point b; ``translate`` maps it, in C)."""
    return token.decode("latin-1").translate(_SPELLING_TABLE)


def printable(token: bytes) -> str:
    """A readable, one-line rendering of a token for the trace."""
    text = token.decode("utf-8", "backslashreplace")
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace(
        "\r", "\\r")


def canonical_ids(vocab: Sequence[bytes]) -> list[int]:
    """``canon[i]``: the first id whose bytes equal token i's (i itself unless duplicated)."""
    first: dict[bytes, int] = {}
    return [first.setdefault(t, i) for i, t in enumerate(vocab)]


@dataclass
class TrainedTokenizer:
    base: BaseVocab
    merges: list[Merge]
    special_tokens: list[str]
    pattern: str  # name or regex, as configured
    lowercase: bool = False
    normalization: str = "none"
    name: str = "spark-bpe"  # the tokenizer's name (tiktoken asks one per distinct encoding)

    @property
    def vocab(self) -> list[bytes]:
        """Token bytes by id (cached while the merge list keeps its length)."""
        cached = self.__dict__.get("_vocab")
        if cached is None or cached[0] != len(self.merges):
            cached = self.__dict__["_vocab"] = (len(self.merges),
                                                vocab_bytes(self.base, self.merges))
        return cached[1]

    @property
    def spellings(self) -> list[str]:
        """:attr:`vocab` spelled GPT-2 style (cached like it)."""
        cached = self.__dict__.get("_spellings")
        if cached is None or cached[0] != len(self.merges):
            cached = self.__dict__["_spellings"] = (len(self.merges),
                                                    list(map(gpt2_spelling, self.vocab)))
        return cached[1]

    @property
    def spec(self) -> PretokenizerSpec:
        """The split settings it was trained with."""
        return PretokenizerSpec(self.pattern, tuple(self.special_tokens), self.lowercase,
                                self.normalization)

    def special_ids(self) -> dict[str, int]:
        n = self.base.size + len(self.merges)
        return {s: n + i for i, s in enumerate(self.special_tokens)}

    @property
    def pattern_regex(self) -> str | None:
        return resolve_pattern(self.pattern)

    def duplicate_tokens(self) -> list[tuple[int, int]]:
        """(later id, first id) for every byte string made more than once."""
        return [(i, c) for i, c in enumerate(canonical_ids(self.vocab)) if c != i]


def write_trace(path: str, tok: TrainedTokenizer, tokens_left: Sequence[int], spark=None) -> None:
    vocab = tok.vocab
    lines = ["rank\tleft\tright\tnew_token\tcount\ttokens_left"]
    for i, (m, left) in enumerate(zip(tok.merges, tokens_left)):
        lines.append(
            f"{i + 1}\t{printable(vocab[m.left])}\t{printable(vocab[m.right])}\t"
            f"{printable(vocab[m.new_id])}\t{m.count}\t{left}"
        )
    fsutil.write_text(spark, path, "\n".join(lines) + "\n")


def unique_merges(tok: TrainedTokenizer) -> list[tuple[str, str]]:
    """The merge list spelled GPT-2 style, a repeated pair of spellings kept once (the first:
    Hugging Face would otherwise give the pair the later rank and the first id)."""
    spelled = tok.spellings
    seen: set[tuple[str, str]] = set()
    out = []
    for m in tok.merges:
        pair = (spelled[m.left], spelled[m.right])
        if pair not in seen:
            seen.add(pair)
            out.append(pair)
    return out


def merges_txt(tok: TrainedTokenizer) -> str:
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in unique_merges(tok)]
    return "\n".join(lines) + "\n"


def vocab_json(tok: TrainedTokenizer) -> dict[str, int]:
    """Token spelling -> id. A byte string made twice (by two different merges) keeps its first
    id, as Hugging Face and tiktoken do."""
    out: dict[str, int] = {}
    for i, t in enumerate(tok.spellings):
        out.setdefault(t, i)
    for s, i in tok.special_ids().items():
        out.setdefault(s, i)  # (one spelled as a learned token is left out: see its note)
    return out


def special_clashes(tok: TrainedTokenizer) -> dict[str, int]:
    """The special tokens whose text is also the GPT-2 spelling of a learned token (a run
    that lowercases learns ``<|endoftext|>`` from text's ``<|ENDOFTEXT|>``), with that
    token's id: a name -> id map (vocab.json, tokenizer.json) cannot hold both."""
    if tok.base.alphabet != "bytes":
        return {}
    first: dict[str, int] = {}
    for i, t in enumerate(tok.spellings):
        first.setdefault(t, i)
    return {s: first[s] for s in tok.special_tokens if s in first}


# texts a custom pattern is split on by the other engines before an export or the encode job
# trusts them with it: the classes and anchors that the regex package, fancy-regex (tiktoken)
# and Oniguruma (tokenizers) can read differently (\h, \d, \w and joiners, $ and \Z at a
# final newline, case, scripts, digits of other scripts, combining marks, case-insensitive
# classes)
SPLIT_PROBES = ("abc\n", "Hello, world! 123\n\n  x\ty", "don't DO IT'S 3.14\r\n",
                "ab12 cd_ef\u00a0g\tF0\n", "日本語 текст €5 ١٢٣", "  trailing  \n", "x\n\n",
                "ǅemal Straße İı 𝔘", "a\x0bb\x0cc\x1cd\x85e\u2028f", "0xff 0x1F",
                "カタカナ ひらがな 한국어 e\u0301 \u0928\u092e\u0938\u094d\u0924\u0947 🙂👍🏽",
                # (U+0345, a mark fancy-regex takes for a letter under (?i): ᾳ as NFD gives)
                "\u03b1\u0345 x\u0345y")
# where a difference is a caveat noted in run.json, not a refusal: the regex package's \w
# takes the joiners U+200C/U+200D (Persian, Indic text, emoji sequences), Oniguruma's not
CAVEAT_PROBES = ("x\u200dy a\u200cb \u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


def _splits_otherwise(engine: str, pattern: str, probe: str, theirs: list[bytes],
                      ours: list[bytes]) -> str:
    return (f"{engine} splits the run's pattern otherwise: {probe!r} into "
            f"{[t.decode('utf-8', 'replace') for t in theirs]!r}, the regex package into "
            f"{[t.decode() for t in ours]!r}")


@functools.lru_cache(maxsize=16)
def tiktoken_split_problem(pattern: str) -> str | None:
    """Why tiktoken cannot be trusted with the split pattern ``pattern`` (a regex source):
    it cannot compile it, or it splits a probe text (``SPLIT_PROBES``) into other pieces
    than the ``regex`` package; '' if neither, None if tiktoken is not installed. The pieces
    are read back through a vocabulary of every byte substring of the probe, in which each
    piece is one token."""
    try:
        import tiktoken
    except ImportError:
        return None
    compiled = regex.compile(pattern)
    for probe in SPLIT_PROBES:
        data = probe.encode()
        subs = {data[i:j] for i in range(len(data)) for j in range(i + 1, len(data) + 1)}
        ranks = {bytes([b]): b for b in range(256)}
        for t in sorted(subs - ranks.keys(), key=lambda t: (len(t), t)):
            ranks[t] = len(ranks)
        try:
            enc = tiktoken.Encoding(name="spark-bpe-split-probe",
                                    pat_str=tiktoken_pattern(pattern), mergeable_ranks=ranks,
                                    special_tokens={})
        except ValueError as exc:
            return f"tiktoken cannot compile the split pattern ({_first_line(exc)})"
        theirs = [enc.decode_single_token_bytes(t) for t in enc.encode_ordinary(probe)]
        ours = [m.group().encode() for m in compiled.finditer(probe) if m.group()]
        if theirs != ours:
            return _splits_otherwise("tiktoken's regex engine", pattern, probe, theirs, ours)
    return ""


@functools.lru_cache(maxsize=16)
def hf_split_problem(pattern: str, probes: tuple[str, ...] = SPLIT_PROBES) -> str | None:
    """As :func:`tiktoken_split_problem`, for ``tokenizers`` given the pattern rewritten for
    Oniguruma (the ``Split`` of tokenizer.json); None if tokenizers is not installed."""
    try:
        from tokenizers import Regex
        from tokenizers.pre_tokenizers import Split
    except ImportError:
        return None
    try:
        split = Split(Regex(onig_pattern(pattern)), behavior="removed", invert=True)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own error types
        return f"tokenizers (Oniguruma) cannot compile the split pattern ({_first_line(exc)})"
    compiled = regex.compile(pattern)
    for probe in probes:
        theirs = [piece.encode() for piece, _ in split.pre_tokenize_str(probe)]
        ours = [m.group().encode() for m in compiled.finditer(probe) if m.group()]
        if theirs != ours:
            return _splits_otherwise("tokenizers (Oniguruma)", pattern, probe, theirs, ours)
    return ""


def _custom(tok: TrainedTokenizer) -> str | None:
    """The run's split pattern when it is a custom regex (not a name, not none)."""
    return tok.pattern_regex if tok.pattern not in PATTERNS else None


def hf_unwritable(tok: TrainedTokenizer) -> str:
    """Why ``tokenizer.json`` is not written for this run ('' if it is): a special token
    spelled as a learned token, or a split pattern Oniguruma cannot be given, cannot compile
    or splits otherwise (checked where tokenizers is installed)."""
    if tok.base.alphabet != "bytes":
        return "chars"
    if special_clashes(tok):
        return "special clash"
    src = tok.pattern_regex
    if src is not None and (construct := regex_only_syntax(src)):
        return f"regex-only syntax {construct}"
    if (src := _custom(tok)) is not None and (problem := hf_split_problem(src)):
        return problem
    return ""


def tiktoken_unwritable(tok: TrainedTokenizer) -> str:
    """Why ``tokenizer.tiktoken`` and ``tiktoken.json`` are not written ('' if they are): a
    chars run, or a custom split pattern tiktoken cannot compile or splits otherwise
    (checked where tiktoken is installed)."""
    if tok.base.alphabet != "bytes":
        return "chars"
    if (src := _custom(tok)) is not None and (problem := tiktoken_split_problem(src)):
        return problem
    return ""


def hf_tokenizer_json(tok: TrainedTokenizer) -> dict:
    """``tokenizer.json`` for Hugging Face ``tokenizers``: the run's normalization, the split
    pattern (rewritten for Oniguruma, see :func:`onig_pattern`) as a ``Split`` that keeps only
    the matches (``Removed`` + ``invert``: exactly ``regex.findall``, like training and
    tiktoken), byte-level BPE, special tokens as added tokens (matched before normalization
    and splitting, like our encoder with ``allowed_special="all"``)."""
    normalizers = []
    if tok.normalization != "none":
        normalizers.append({"type": tok.normalization})
    if tok.lowercase:
        normalizers.append({"type": "Lowercase"})
    pre = [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": False}]
    if tok.pattern_regex is not None:
        pre.insert(0, {"type": "Split", "pattern": {"Regex": onig_pattern(tok.pattern_regex)},
                       "behavior": "Removed", "invert": True})
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
            "vocab": {t: i for i, t in reversed(list(enumerate(tok.spellings)))},
            "merges": [list(p) for p in unique_merges(tok)],
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


def tiktoken_meta(tok: TrainedTokenizer, ranks_text: str) -> dict:
    """``tiktoken.json``. ``tiktoken_sha256`` is the hash of ``tokenizer.tiktoken``: pass it as
    ``expected_hash`` to ``tiktoken.load.load_tiktoken_bpe``, which otherwise caches files by
    path and would hand back an older run's ranks after a retrain into the same directory."""
    return {
        "name": tok.name,
        "pat_str": TIKTOKEN_ANY if tok.pattern_regex is None
        else tiktoken_pattern(tok.pattern_regex),
        "special_tokens": tok.special_ids(),
        "n_vocab": tok.base.size + len(tok.merges) + len(tok.special_tokens),
        "pattern_name": tok.pattern if tok.pattern in PATTERNS or tok.pattern == "none"
        else "custom",
        "lowercase": tok.lowercase,
        "normalization": tok.normalization,
        "tiktoken_sha256": hashlib.sha256(ranks_text.encode()).hexdigest(),
        "usage": "pipeline.outputs.load_tiktoken(RUN_DIR), or tiktoken.Encoding(name, "
                 "pat_str=pat_str, mergeable_ranks=tiktoken.load.load_tiktoken_bpe("
                 "'RUN_DIR/tokenizer.tiktoken', expected_hash=tiktoken_sha256), "
                 "special_tokens=special_tokens)",
    }


def export_notes(tok: TrainedTokenizer) -> list[str]:
    """What the exports of this tokenizer cannot express (logged and kept in run.json)."""
    notes = []
    if tok.base.alphabet != "bytes":
        notes.append(
            "tokenizer.json and tokenizer.tiktoken are not written: this run starts from "
            "characters (alphabet = 'chars'), and both formats need a byte-level vocabulary "
            "(every byte a token). merges.txt and vocab.json spell tokens with the byte-level "
            "map of their UTF-8 but are not a loadable GPT-2 tokenizer; encode with "
            "pipeline.encoder.Tokenizer.load(RUN_DIR)."
        )
        return notes
    clashes = special_clashes(tok)
    if clashes:
        s, i = next(iter(clashes.items()))
        notes.append(
            f"tokenizer.json is not written and vocab.json leaves out {len(clashes)} special "
            f"token(s): {s!r} is also the spelling of learned token {i} (a name -> id map "
            "cannot hold both; tokenizers would give the special token's text that id). "
            "tokenizer.tiktoken and pipeline.encoder.Tokenizer keep both; to export to "
            "tokenizers, retrain with a special token no text can make (with capital letters, in a "
            "run that lowercases).")
    if tok.lowercase or tok.normalization != "none":
        notes.append(
            "tiktoken does not normalize: load_tiktoken(RUN_DIR) refuses this run unless "
            "called with ignore_normalization=True, and then the caller must apply "
            f"normalization={tok.normalization!r}, lowercase={tok.lowercase} first "
            "(tokenizer.json and pipeline.encoder.Tokenizer do it themselves)."
        )
    if tok.normalization != "none":
        notes.append(
            f"normalization: tokenizer.json's {tok.normalization} uses the Unicode tables "
            "built into tokenizers, older than Python's (Unicode "
            f"{unicodedata.unidata_version} here): a character given its decomposition in a "
            "newer Unicode (72 assigned in Unicode 14, such as U+10781, for tokenizers 0.23 "
            "under Python 3.11) is left as it is there, normalized by training and "
            "pipeline.encoder; text with one encodes differently in tokenizers."
        )
    if tok.lowercase:
        notes.append(
            "lowercase: tokenizer.json's Lowercase lowercases character by character, while "
            "training and pipeline.encoder use Python's str.lower, which turns a word-final "
            "capital sigma into 'ς' (Final_Sigma rule); text with a capital Σ can encode "
            "differently in tokenizers. Everything else lowercases alike."
        )
    src = _custom(tok)
    construct = regex_only_syntax(src) if src is not None else ""
    hf_problem = construct and f"the split pattern uses {construct!r}, which only the regex " \
        "package has (Oniguruma, which tokenizers compiles patterns with, would read it as " \
        "something else and drop or split text otherwise)"
    hf_problem = hf_problem or (hf_split_problem(src) if src is not None else "")
    tk_problem = tiktoken_split_problem(src) if src is not None else ""
    for export, problem in (("tokenizer.json", hf_problem),
                            ("tokenizer.tiktoken and tiktoken.json", tk_problem)):
        if problem:
            notes.append(f"{export} not written: {problem}. Encode with "
                         "pipeline.encoder.Tokenizer.load(RUN_DIR) (jobs/encode.py does).")
    if src is not None and not hf_problem:
        checked = "split like training on probe texts" if hf_problem == "" else \
            "not checked: tokenizers is not installed where the run was trained"
        notes.append(
            "custom split pattern: tokenizer.json holds it rewritten for Oniguruma "
            f"({onig_pattern(src)!r}; {checked}); check Tokenizer.from_file(...) against "
            "pipeline.encoder.Tokenizer on your text."
        )
        if hf_problem == "" and (caveat := hf_split_problem(src, CAVEAT_PROBES)):
            notes.append(f"custom split pattern: {caveat}: the regex package's \\w takes the "
                         "joiners U+200C and U+200D, Oniguruma's does not, so tokenizer.json "
                         "encodes text with them (Persian, Indic scripts, emoji sequences) "
                         "otherwise.")
    if src is not None and tk_problem is None:
        notes.append("custom split pattern: not checked against tiktoken (not installed where "
                     "the run was trained); check load_tiktoken(RUN_DIR) against "
                     "pipeline.encoder.Tokenizer on your text (jobs/encode.py does).")
    if tok.duplicate_tokens():
        notes.append(
            f"{len(tok.duplicate_tokens())} byte strings were made by two merges: every export "
            "keeps the first id (tokenizer_meta.json 'duplicate_tokens' lists the later ids, "
            "which encoding never produces)."
        )
    return notes


RUN_FILE = "run.json"
RUN_FORMAT = "spark-bpe run"
RUN_VERSION = 1
# the exports run.json lists with their SHA-256 (a chars run writes only some of them)
EXPORT_FILES = ("merges.txt", "vocab.json", "tokenizer.json", "tokenizer.tiktoken",
                "tiktoken.json", "tokenizer_meta.json")


# everything a run directory holds (and their staging siblings, ``name.tmp-*``), besides
# hidden names (its lease)
RUN_ENTRIES = ("run.json", "merges.txt", "vocab.json", "tokenizer.json", "tokenizer.tiktoken",
               "tiktoken.json", "tokenizer_meta.json", "trace.tsv", "report.html", "stats.json",
               "config.json", "progress.jsonl", "words", "checkpoints")


def check_run_place(spark, output: str, also: tuple[str, ...] = ()) -> None:
    """Refuse to train into ``output`` when it holds anything a run does not (a word table, a
    corpus, someone's files): its files would be replaced or mixed with the run's. ``also``:
    more names of the run (a checkpoint directory configured inside it)."""
    names = fsutil.list_dir(spark, output)
    if names is None:
        if fsutil.exists(spark, output):
            raise ConfigError(f"config key 'output': {output} is a file, not a directory")
        return
    ours = (*RUN_ENTRIES, *also)
    other = sorted(n for n in names if not n.startswith(("_", "."))
                   and n not in ours and not n.startswith(tuple(f"{e}.tmp-" for e in ours))
                   and not n.startswith(tuple(f"{e}.old-" for e in ours)))
    if other:
        raise ConfigError(
            f"config key 'output': {output} exists and is not a run directory (it holds "
            f"{', '.join(other[:3])}{', ...' if len(other) > 3 else ''}): refusing to write a "
            "run into it; remove it or choose another --output")


class IncompleteRun(ValueError):
    """A directory a reader was pointed at is not a complete, consistent run."""


def _sha256_text(spark, path: str) -> str:
    """The SHA-256 of a text file as read back (a file that is not UTF-8 any more, damaged
    since it was written, gets a value no written file has: it is "changed")."""
    try:
        return hashlib.sha256(fsutil.read_text(spark, path).encode("utf-8")).hexdigest()
    except UnicodeDecodeError:
        return "not UTF-8"


def write_run_json(run_dir: str, summary: dict, spark=None) -> None:
    """``run.json``, written last: the run is complete, and these are its files (the SHA-256
    of every export, so a reader can tell a file another run changed afterwards)."""
    j = fsutil.join
    files = {n: _sha256_text(spark, j(run_dir, n)) for n in EXPORT_FILES
             if fsutil.exists(spark, j(run_dir, n))}
    fsutil.write_text(spark, j(run_dir, RUN_FILE), json.dumps(
        {"format": RUN_FORMAT, "version": RUN_VERSION, **summary, "files": files}, indent=2))


def check_run(run_dir: str, files: Sequence[str] = (), spark=None) -> dict:
    """``run_dir``'s ``run.json``, after checking that the run is complete and that ``files``
    are the ones it finished with; else :class:`IncompleteRun` saying what to do."""
    path = fsutil.join(run_dir, RUN_FILE)
    try:
        run = json.loads(fsutil.read_text(spark, path))
    except IsADirectoryError:
        raise IncompleteRun(f"{path} is a directory: {run_dir} is not a run directory") \
            from None
    except NotADirectoryError:  # (a file on the way: the path given, or one above it)
        if fsutil.is_local(run_dir) and os.path.isfile(fsutil.local_path(run_dir)):
            raise IncompleteRun(f"{run_dir} is a file: give the run directory (the folder "
                                f"holding {RUN_FILE})") from None
        raise IncompleteRun(f"no run directory at {run_dir} (a file is on its path)") \
            from None
    except FileNotFoundError:
        if not fsutil.exists(spark, run_dir):
            raise IncompleteRun(f"no run directory at {run_dir}") from None
        raise IncompleteRun(
            f"{run_dir} is not a complete run (no {RUN_FILE}): it is still training, was "
            "interrupted, or is not a run directory; rerun its jobs/train.py command to "
            "finish it") from None
    except ValueError:
        raise IncompleteRun(f"{path} is corrupt: rerun the run's jobs/train.py command to "
                            "write it again") from None
    if not isinstance(run, dict) or run.get("format") != RUN_FORMAT:
        raise IncompleteRun(f"{path} is not a spark-bpe run.json (format "
                            f"{run.get('format') if isinstance(run, dict) else None!r})")
    recorded = run.get("files") or {}
    if not isinstance(recorded, dict):
        raise IncompleteRun(f"{path} is corrupt (its 'files' is not a mapping): rerun the "
                            "run's jobs/train.py command to write it again")
    for name in files:
        want = recorded.get(name)
        if want is not None and not fsutil.exists(spark, fsutil.join(run_dir, name)):
            raise IncompleteRun(
                f"{fsutil.join(run_dir, name)} is missing ({RUN_FILE} lists it: the run "
                "finished with it); rerun the run's jobs/train.py command to write it again")
        if want is not None and _sha256_text(spark, fsutil.join(run_dir, name)) != want:
            raise IncompleteRun(
                f"{fsutil.join(run_dir, name)} is not the file its run finished with (changed "
                f"since {RUN_FILE} was written); rerun the run's jobs/train.py command")
    return run


def write_exports(run_dir: str, tok: TrainedTokenizer, spark=None) -> list[str]:
    """Write every export this tokenizer supports; returns notes on what was not exported or
    needs care."""
    j = fsutil.join
    notes = export_notes(tok)
    fsutil.write_text(spark, j(run_dir, "merges.txt"), merges_txt(tok))
    fsutil.write_text(spark, j(run_dir, "vocab.json"),
                      json.dumps(vocab_json(tok), ensure_ascii=False, indent=0))
    if not hf_unwritable(tok):
        fsutil.write_text(spark, j(run_dir, "tokenizer.json"),
                          json.dumps(hf_tokenizer_json(tok), ensure_ascii=False))
    if not tiktoken_unwritable(tok):
        ranks = tiktoken_ranks(tok)
        fsutil.write_text(spark, j(run_dir, "tokenizer.tiktoken"), ranks)
        fsutil.write_text(spark, j(run_dir, "tiktoken.json"),
                          json.dumps(tiktoken_meta(tok, ranks), ensure_ascii=False, indent=2))
    fsutil.write_text(spark, j(run_dir, "tokenizer_meta.json"), json.dumps({
        "format": TOKENIZER_META_FORMAT,
        "version": TOKENIZER_META_VERSION,
        "alphabet": tok.base.alphabet,
        "base_tokens": [base64.b64encode(t).decode() for t in tok.base.tokens]
        if tok.base.alphabet != "bytes" else None,
        "end_of_word_suffix": tok.base.end_of_word_suffix,
        "merges": [[m.left, m.right, m.count] for m in tok.merges],
        **tok.spec.as_meta(),  # pattern, special tokens, lowercase, normalization
        "duplicate_tokens": tok.duplicate_tokens(),
        "export_notes": notes,
    }))
    return notes


@dataclass
class TiktokenExport:
    """What ``tiktoken.Encoding(...)`` needs, read from a run directory (no tiktoken import)."""

    name: str
    pat_str: str
    mergeable_ranks: dict[bytes, int]
    special_tokens: dict[str, int]
    lowercase: bool
    normalization: str

    def encoding_args(self) -> dict:
        return {"name": self.name, "pat_str": self.pat_str,
                "mergeable_ranks": self.mergeable_ranks, "special_tokens": self.special_tokens}


NO_EXPORT_BECAUSE = ("the run starts from characters (alphabet = 'chars'), which tiktoken "
                     "cannot represent, or tiktoken cannot take its custom split pattern "
                     "(run.json's notes say why)")


def read_tiktoken_export(run_dir: str, spark=None) -> TiktokenExport:
    j = fsutil.join
    check_run(run_dir, ("tiktoken.json", "tokenizer.tiktoken"), spark)
    try:
        meta = json.loads(fsutil.read_text(spark, j(run_dir, "tiktoken.json")))
        ranks_text = fsutil.read_text(spark, j(run_dir, "tokenizer.tiktoken"))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{run_dir} has no tiktoken export (tokenizer.tiktoken + tiktoken.json): either it "
            f"is not a run directory, or {NO_EXPORT_BECAUSE}") from None
    ranks = {}
    for line in ranks_text.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return TiktokenExport(meta.get("name", "spark-bpe"), meta["pat_str"], ranks,
                          meta["special_tokens"], bool(meta.get("lowercase", False)),
                          meta.get("normalization", "none"))


def load_tiktoken(run_dir: str, *, ignore_normalization: bool = False,
                  export: TiktokenExport | None = None):
    """A ``tiktoken.Encoding`` for a run directory (needs the ``tiktoken`` package)::

        enc = load_tiktoken("out/run")
        ids = enc.encode(text)                           # == Tokenizer.load(...).encode(text)
        enc.encode(text, allowed_special={"<|endoftext|>"})

    Without this helper (``meta`` = ``RUN_DIR/tiktoken.json``)::

        tiktoken.Encoding(meta["name"], pat_str=meta["pat_str"],
                          mergeable_ranks=tiktoken.load.load_tiktoken_bpe(
                              RUN_DIR + "/tokenizer.tiktoken",
                              expected_hash=meta["tiktoken_sha256"]),
                          special_tokens=meta["special_tokens"])

    (``expected_hash`` matters: ``load_tiktoken_bpe`` caches by path.)

    tiktoken cannot lowercase or normalize: for a run trained with either, this raises unless
    ``ignore_normalization=True`` (then prepare the text yourself, as the run's
    ``tiktoken.json`` says). ``export``: the export already read (a run on another
    filesystem, read through Spark: ``read_tiktoken_export(run_dir, spark)``)."""
    import tiktoken

    exp = export or read_tiktoken_export(run_dir)
    if (exp.lowercase or exp.normalization != "none") and not ignore_normalization:
        raise ValueError(
            f"{run_dir} was trained with normalization={exp.normalization!r}, "
            f"lowercase={exp.lowercase}, which tiktoken cannot apply: normalize the text "
            "yourself and call load_tiktoken(..., ignore_normalization=True), or use "
            "tokenizer.json / pipeline.encoder.Tokenizer")
    return tiktoken.Encoding(**exp.encoding_args())
