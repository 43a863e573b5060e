"""Split patterns (pure Python, no Spark): the named patterns, their fast ASCII
translations for the standard library's ``re``, checking a custom pattern, and its rewrite for
Oniguruma (what Hugging Face ``tokenizers`` compiles a ``Split`` pattern with).

``pretokenize`` splits text with them; ``outputs`` writes the Oniguruma form into
``tokenizer.json``.
"""

from __future__ import annotations

import functools
import sys

import regex

# The exact split patterns tiktoken uses for these encodings.
PATTERNS: dict[str, str] = {
    "gpt2": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
    "cl100k": (
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"""
        r"""| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
    ),
    "o200k": "|".join(
        [
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""\p{N}{1,3}""",
            r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
            r"""\s*[\r\n]+""",
            r"""\s+(?!\S)""",
            r"""\s+""",
        ]
    ),
}

# The named patterns for the standard library's ``re``, which runs them 2.5-3x faster than
# ``regex`` runs the originals, on text whose characters are all in the Basic Multilingual
# Plane (U+0000-U+FFFF: nearly all text). Each Unicode class of the originals becomes an
# explicit class of the BMP characters that ``regex`` itself matches with it (probed once per
# process, so the two agree whatever Unicode version each ships); ``re`` keeps such a class as a
# bitmap. (Characters above U+FFFF would make ``re`` scan hundreds of ranges per character, so
# text with any of them takes ``regex``.) Tests hold the translations equal to the originals.
_FAST_TEMPLATES: dict[str, tuple[str, ...]] = {
    "gpt2": (
        r"'(?:[sdmt]|ll|ve|re)", r" ?[{L}]++", r" ?[{N}]++", r" ?[^{S}{L}{N}]++",
        r"[{S}]++$", r"[{S}]+(?![^{S}])", r"[{S}]",
    ),
    "cl100k": (
        r"'(?i:[sdmt]|ll|ve|re)", r"[^\r\n{L}{N}]?+[{L}]++", r"[{N}]{1,3}+",
        r" ?[^{S}{L}{N}]++[\r\n]*+", r"[{S}]++$", r"[{S}]*[\r\n]", r"[{S}]+(?![^{S}])",
        r"[{S}]",
    ),
    "o200k": (
        r"[^\r\n{L}{N}]?[{UPPER}]*[{LOWER}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n{L}{N}]?[{UPPER}]+[{LOWER}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[{N}]{1,3}", r" ?[^{S}{L}{N}]+[\r\n/]*", r"[{S}]*[\r\n]+", r"[{S}]+(?![^{S}])",
        r"[{S}]+",
    ),
}
# the ``regex`` class behind each placeholder of the templates
_FAST_CLASSES = {
    "L": r"\p{L}", "N": r"\p{N}", "S": r"\s",
    "UPPER": r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", "LOWER": r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]",
}
# possessive quantifiers arrived in ``re`` with Python 3.11; before it, ``regex`` does it all
_RE_IS_POSSESSIVE = sys.version_info >= (3, 11)


@functools.cache
def _bmp_class(pattern: str) -> str:
    """The BMP characters ``regex`` matches with one-character ``pattern``, as the inside of
    an ``re`` character class (ranges of \\uXXXX escapes)."""
    bmp = "".join(map(chr, range(0x10000)))
    runs = ((m.start(), m.end() - 1) for m in regex.finditer(f"(?:{pattern})+", bmp))
    return "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in runs)


def has_fast_pattern(name: str) -> bool:
    """Whether ``name`` is a named pattern with a :func:`fast_pattern` (the translations need
    ``re``'s possessive quantifiers, Python 3.11+)."""
    return name in _FAST_TEMPLATES and _RE_IS_POSSESSIVE


@functools.cache
def fast_pattern(name: str) -> str:
    """The ``re`` translation of the named pattern ``name``, exact on BMP text."""
    pieces = []
    for piece in _FAST_TEMPLATES[name]:
        for key, cls in _FAST_CLASSES.items():
            piece = piece.replace("{" + key + "}", _bmp_class(cls))
        pieces.append(piece)
    return "|".join(pieces)


def in_bmp(text: str) -> bool:
    """True when no character of ``text`` is above U+FFFF (one C pass, no Python loop)."""
    return text.isascii() or len(text.encode("utf-16-le", "surrogatepass")) == 2 * len(text)


NO_SPLIT = "none"


class PatternError(ValueError):
    """A split pattern that does not compile."""


def resolve_pattern(pattern: str) -> str | None:
    """Return the regex source for a pattern name or custom regex; None for ``none``."""
    if pattern == NO_SPLIT:
        return None
    return PATTERNS.get(pattern, pattern)


def compile_pattern(pattern: str) -> regex.Pattern[str] | None:
    source = resolve_pattern(pattern)
    if source is None:
        return None
    try:
        return regex.compile(source)
    except regex.error as exc:
        raise PatternError(f"pattern {pattern!r} does not compile: {exc}") from None


# texts a custom pattern is tried on before any Spark work: a pattern that matches the empty
# string anywhere in them (``x*``, a lone ``\b``) would make empty words
_PATTERN_PROBES = ("", "a", " ", "ab cd", "Hello, world! 123\n\n  x\ty", "日本語 текст €5")


def check_pattern(pattern: str) -> None:
    """Raise :class:`PatternError` for a pattern that does not compile, that matches the
    empty string (every word must hold at least one character: a zero-length match would be
    a word with no token), that is a pattern's name but for its case or spaces (``CL100K``,
    ``"gpt2 "``: as a regex it would match only those letters), or that matches no letter of
    the probe texts (the text outside the matches is dropped, so that would train on next to
    nothing)."""
    near = pattern.strip().lower()
    if pattern not in PATTERNS and pattern != NO_SPLIT and (near in PATTERNS or near == NO_SPLIT):
        raise PatternError(f"pattern {pattern!r} is not a name (the names are {near!r} and the "
                           f"others in lowercase, without spaces); as a regex it would match "
                           f"only itself")
    compiled = compile_pattern(pattern)
    if compiled is None:
        return
    for probe in _PATTERN_PROBES:
        for m in compiled.finditer(probe):
            if m.start() == m.end():
                raise PatternError(
                    f"pattern {pattern!r} matches the empty string (at {m.start()} in "
                    f"{probe!r}); every match must hold at least one character (+ rather "
                    "than *, no match made of \\b or lookarounds alone)")
    letters = sum(c.isalpha() for probe in _PATTERN_PROBES
                  for m in compiled.finditer(probe) for c in m.group())
    if not letters:
        raise PatternError(f"pattern {pattern!r} matches no letter of {_PATTERN_PROBES[-2:]!r}: "
                           "a word is what the pattern matches and the text between matches "
                           "is dropped, so it would train on next to nothing")


# -- split patterns for Oniguruma (Hugging Face tokenizers) ---------------------------------------

_INTERVAL = regex.compile(r"\{(?:\d+(?:,\d*)?|,\d*)\}")  # (``{}`` is a literal)
_BRACED_ESCAPES = "pPNxgku"
_FIXED_ESCAPES = {"x": 2, "u": 4, "U": 8}


def _escape_end(src: str, i: int) -> int:
    """End of the escape sequence starting with the backslash at ``src[i]``."""
    if i + 1 >= len(src):
        return len(src)
    c = src[i + 1]
    if c in _BRACED_ESCAPES and i + 2 < len(src) and src[i + 2] == "{":
        close = src.find("}", i + 2)
        return len(src) if close < 0 else close + 1
    if c in "pP" and i + 2 < len(src):  # \pL
        return i + 3
    if c in _FIXED_ESCAPES:
        return min(len(src), i + 2 + _FIXED_ESCAPES[c])
    if c.isdigit():  # \0, \0oo, \ooo (octal), else a back-reference of one or two digits
        octal = "01234567"
        if c == "0" or (c in octal and src[i + 2:i + 3] and src[i + 2] in octal
                        and src[i + 3:i + 4] and src[i + 3] in octal):
            j = i + 2
            while j < min(len(src), i + 4) and src[j] in octal:
                j += 1
            return j
        return i + 3 if src[i + 2:i + 3].isdigit() else i + 2
    return i + 2


def _class_end(src: str, i: int) -> int:
    """End of the character class starting with ``[`` at ``src[i]`` (nested sets allowed)."""
    j = i + 1
    if j < len(src) and src[j] == "^":
        j += 1
    if j < len(src) and src[j] == "]":
        j += 1  # a leading ] is a literal
    depth = 1
    while j < len(src):
        c = src[j]
        if c == "\\":
            j = _escape_end(src, j)
            continue
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(src)


def onig_pattern(src: str) -> str:
    """Rewrite a ``regex``-package split pattern so Oniguruma (Ruby syntax, what Hugging Face
    ``tokenizers`` compiles ``Split`` patterns with) matches the same pieces.

    Differences handled (the built-in patterns only need the first):
    - ``X{m,n}+`` is possessive in ``regex`` but a repetition of ``X{m,n}`` in Ruby syntax
      (cl100k's ``\\p{N}{1,3}+`` would swallow a whole run of digits): written ``(?>X{m,n})``;
    - ``^`` / ``$`` are line anchors in Ruby syntax: written ``\\A`` / ``(?=\\n?\\z)`` (the
      ``regex`` meaning without MULTILINE; where an inline ``(?m)`` or ``(?m:...)`` is in
      force they are left as they are, line anchors in both); ``\\Z`` is written ``\\z``;
    - inline flags: ``m`` (MULTILINE) is dropped, Ruby's anchors being line anchors always,
      and ``s`` (DOTALL) is written ``m``, its Ruby name (Ruby's ``(?m)`` makes ``.`` match a
      newline); a flag group left empty is dropped;
    - ``(?P<name>...)`` / ``(?P=name)`` are written ``(?<name>...)`` / ``\\k<name>``.

    Anything else specific to the ``regex`` package (fuzzy matching, set operations, ``\\m``,
    verbose mode ``(?x)``...) is copied as is; such custom patterns need checking with
    ``tokenizers``. Character classes are copied unchanged, so ``^``/``$`` inside them keep
    their meaning.
    """
    return _OnigRewrite(src).run()


_FUZZY = regex.compile(r"\{\s*[eisd]\s*(?:<=?|=|\})")  # {e<=1}, {i<2}, {e}: fuzzy matching


def regex_only_syntax(src: str) -> str:
    """The first construct of ``src`` that only the ``regex`` package has and that
    :func:`onig_pattern` cannot translate (Oniguruma would read it as something else, and a
    tokenizer.json with it would drop or split text otherwise): ``\\m`` / ``\\M`` (start /
    end of a word), ``\\L<name>`` (a named list), fuzzy matching (``{e<=1}``); '' if none."""
    i = 0
    while i < len(src):
        c = src[i]
        if c == "\\":
            end = _escape_end(src, i)
            if src[i + 1:i + 2] in ("m", "M"):
                return src[i:end]
            if src[i + 1:i + 2] == "L" and src[i + 2:i + 3] == "<":
                close = src.find(">", i)
                return src[i:close + 1 if close > 0 else len(src)]
            i = end
        elif c == "[":
            i = _class_end(src, i)
        elif c == "{" and _FUZZY.match(src, i):
            close = src.find("}", i)
            return src[i:close + 1 if close > 0 else len(src)]
        else:
            i += 1
    return ""


def tiktoken_pattern(src: str) -> str:
    """Rewrite a ``regex``-package split pattern for tiktoken (whose engine is the Rust
    ``fancy-regex``), which reads two anchors otherwise: ``$`` is the end of the text only
    (``regex``: also before a final newline), written ``(?=\\n?\\z)``; ``\\Z`` is the end or
    before a final newline (``regex``: the end only), written ``\\z``. The rest means the same
    to both and is copied as is; so are the built-in patterns, tiktoken's own (gpt2's
    ``\\s++$`` cannot end before a newline: the possessive run takes it)."""
    if src in PATTERNS.values():
        return src
    return _OnigRewrite(src, only_anchors=True).run()


# an inline flag group, bare (``(?im)``: in force to the end of the enclosing group, as in
# ``regex``, Oniguruma and fancy-regex) or scoped (``(?m-s:...)``)
_FLAG_GROUP = regex.compile(r"\(\?([a-zA-Z]*)(?:-([a-zA-Z]*))?([:)])")


def _onig_flags(on: str, off: str, end: str) -> str:
    """A ``regex`` flag group in Ruby syntax: ``m`` dropped, ``s`` written ``m``."""
    def ruby(flags: str) -> str:
        return flags.replace("m", "").replace("s", "m")
    on, off = ruby(on), ruby(off)
    if end == ")" and not on and not off:
        return ""
    return "(?" + on + ("-" + off if off else "") + end


class _OnigRewrite:
    """One left-to-right pass of :func:`onig_pattern` (or, ``only_anchors``, of
    :func:`tiktoken_pattern`): each construct copied or rewritten by its own method. ``atom``
    is the index in ``out`` where the last complete atom starts (what a following ``{m,n}+``
    applies to); ``groups`` the indices of the open groups, ``scopes`` whether MULTILINE was
    in force where each was opened (restored when it closes); ``multiline`` whether it is in
    force here."""

    def __init__(self, src: str, only_anchors: bool = False):
        self.src, self.i = src, 0
        self.only_anchors = only_anchors
        self.multiline = False
        self.out: list[str] = []
        self.atom: int | None = None
        self.groups: list[int] = []
        self.scopes: list[bool] = []

    def run(self) -> str:
        src = self.src
        while self.i < len(src):
            c = src[self.i]
            if c == "\\":
                self._escape()
            elif c == "[":
                self._atom(_class_end(src, self.i))
            elif c == "(":
                self._open_group()
            elif c == ")":
                self._close_group()
            elif c == "{" and self.atom is not None and (m := _INTERVAL.match(src, self.i)):
                self._interval(m)
            elif c == "^" and not self.multiline and not self.only_anchors:
                self._anchor(r"\A")  # (tiktoken reads ^ as regex does)
            elif c == "$" and not self.multiline:
                self._anchor(r"(?=\n?\z)")
            else:
                self.atom = None if c in "*+?|" else len(self.out)
                self.out.append(c)
                self.i += 1
        return "".join(self.out)

    def _atom(self, end: int, text: str | None = None) -> None:
        """Copy ``src[i:end]`` (or write ``text`` for it) as one complete atom."""
        self.atom = len(self.out)
        self.out.append(self.src[self.i:end] if text is None else text)
        self.i = end

    def _escape(self) -> None:
        end = _escape_end(self.src, self.i)
        self._atom(end, r"\z" if self.src[self.i:end] == r"\Z" else None)

    def _open_group(self) -> None:
        src, i = self.src, self.i
        if src.startswith("(?P=", i) and not self.only_anchors:  # a backreference: an atom
            close = src.find(")", i)
            close = len(src) if close < 0 else close
            self._atom(close + 1, r"\k<" + src[i + 4:close] + ">")
            return
        flags = _FLAG_GROUP.match(src, i)
        if flags and flags.group(3) == ")":  # bare: MULTILINE to the end of the enclosing group
            self._flags(flags)
            return
        self.groups.append(len(self.out))
        self.scopes.append(self.multiline)
        if flags:
            self._flags(flags)
        elif self.only_anchors:
            self.out.append("(")
            self.i += 1
            self.atom = None
        elif src.startswith("(?P<", i):
            self.out.append("(?<")
            self.i += 4
        else:
            self.out.append("(")
            self.i += 1
            self.atom = None

    def _flags(self, m: regex.Match[str]) -> None:
        on, off = m.group(1), m.group(2) or ""
        self.multiline = ("m" in on or self.multiline) and "m" not in off
        self.out.append(m.group() if self.only_anchors else _onig_flags(on, off, m.group(3)))
        self.i = m.end()
        self.atom = None

    def _close_group(self) -> None:
        start = self.groups.pop() if self.groups else len(self.out)
        if self.scopes:
            self.multiline = self.scopes.pop()
        self.out.append(")")
        self.atom = start
        self.i += 1

    def _interval(self, m: regex.Match[str]) -> None:
        end = m.end()
        if end < len(self.src) and self.src[end] == "+" and not self.only_anchors:  # possessive
            assert self.atom is not None
            inner = "".join(self.out[self.atom:])
            del self.out[self.atom:]
            self.out.append(f"(?>{inner}{m.group()})")
            self.i = end + 1
        else:
            self.out.append(m.group())
            self.i = end
        self.atom = None

    def _anchor(self, text: str) -> None:
        self.out.append(text)
        self.atom = None
        self.i += 1
