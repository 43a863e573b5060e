"""Typed configuration: ``conf/default.toml``, then ``--config FILE``, then command-line flags.

Every field of :class:`Config` is a TOML key and a flag (``vocab_size`` <-> ``--vocab-size``).
Everything is validated before any Spark work starts; errors name the key.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from pipeline.bpe import ALPHABETS
from pipeline.fsutil import is_local, local_path
from pipeline.pretokenize import (
    NORMALIZATIONS,
    PATTERNS,
    PatternError,
    PretokenizerSpec,
    compile_pattern,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "conf" / "default.toml"
ENGINES = ("auto", "spark", "local")
RESUME_MODES = ("auto", "never")
SPARK_UI_MODES = ("auto", "on", "off")
COUNT_READERS = ("auto", "spark", "arrow")


class ConfigError(ValueError):
    """Bad configuration or input: the message says which key and what to do."""


@dataclass
class Config:
    # -- input ---------------------------------------------------------------------------------
    input: str = ""  # Parquet path, glob or directory (any Hadoop filesystem URI)
    text_column: str = "text"
    words: str = ""  # an existing word table (skips the corpus scan)
    output: str = ""  # run directory (train) or word table directory (count_words)
    count_on_driver_max_mb: int = 128  # inputs up to this much Parquet merge counts on the driver
    count_reader: str = "auto"  # auto (local files: pyarrow in the tasks) | spark | arrow
    ignore_corrupt_files: bool = False  # skip unreadable input files (listed in stats.json)
    # -- pretokenization -------------------------------------------------------------------------
    pattern: str = "cl100k"  # gpt2 | cl100k | o200k | none | a custom regex
    special_tokens: list[str] = field(default_factory=list)
    lowercase: bool = False
    normalization: str = "none"  # none | NFC | NFKC | NFD | NFKD
    max_word_bytes: int = 1024  # longer words are left out of training (counted); 0 = no cap
    alphabet: str = "bytes"  # bytes | chars
    end_of_word_suffix: str = ""  # e.g. "</w>" (chars alphabet only)
    # -- training --------------------------------------------------------------------------------
    vocab_size: int = 0  # 256 + merges + special tokens (bytes alphabet)
    num_merges: int = 0  # alternative to vocab_size
    min_pair_count: int = 2
    max_token_bytes: int = 0  # 0 = no limit
    engine: str = "auto"  # auto | spark | local
    driver_budget_mb: int = 0  # memory the driver engine may use; 0 = derived (pipeline/memory.py)
    batch_merges: bool = True  # spark engine: several merges per round when provably exact
    max_batch: int = 256
    num_partitions: int = 0  # 0 = Spark's default parallelism
    # -- checkpoints -----------------------------------------------------------------------------
    checkpoint_dir: str = ""
    checkpoint_every_merges: int = 1000
    checkpoint_every_seconds: float = 60.0
    resume: str = "auto"  # auto | never
    lease_timeout_seconds: float = 120.0  # a run directory's lease not renewed this long is free
    # -- runtime ---------------------------------------------------------------------------------
    master: str = ""  # empty: whatever spark-submit says, else local[*]
    shuffle_partitions: int = 0  # 0 = 2 x default parallelism
    log_level: str = "INFO"
    progress_bar: bool = True  # only when stderr is a terminal
    heartbeat_seconds: float = 5.0  # a progress line per running stage this often
    spark_ui: str = "auto"  # web UI: auto (on for cluster masters, off in local modes) | on | off
    report_sample_rows: int = 200  # rows held out for the report's compression curve
    report_sample: str = ""  # Parquet of held-out text for report.html (default: input rows)
    # -- encoding (jobs/encode.py) ---------------------------------------------------------------
    tokenizer: str = ""  # a trained run directory
    key_columns: list[str] = field(default_factory=list)  # empty: all but the text column
    ids_column: str = "ids"
    special_in_text: str = "error"  # error | special | text
    encode_engine: str = "auto"  # auto | tiktoken | reference

    # -- derived ---------------------------------------------------------------------------------
    def pretokenizer_spec(self) -> PretokenizerSpec:
        return PretokenizerSpec(
            pattern=self.pattern,
            special_tokens=tuple(self.special_tokens),
            lowercase=self.lowercase,
            normalization=self.normalization,
        )

    def merges_wanted(self, base_size: int = 256) -> int:
        if self.num_merges:
            return self.num_merges
        return self.vocab_size - base_size - len(self.special_tokens)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)


FIELD_HELP = {
    "input": "Parquet corpus: path, glob or directory (hdfs://, s3a:// ... work)",
    "words": "existing word table directory (from count_words) instead of --input",
    "output": "output directory",
    "vocab_size": "256 + merges + special tokens",
    "num_merges": "number of merges (alternative to --vocab-size)",
    "pattern": f"split pattern: {', '.join(PATTERNS)}, none, or a custom regex",
    "special_tokens": "comma-separated special tokens, cut out before splitting",
    "engine": "auto (decided by memory) | spark | local",
    "ignore_corrupt_files": "skip input files that cannot be read (listed in stats.json) "
                            "instead of stopping with an error naming the file",
    "max_word_bytes": "words longer than this many bytes are left out of training (0: keep all)",
    "driver_budget_mb": "MB the driver engine may use (0: derived from the driver's memory)",
    "resume": "auto | never",
    "checkpoint_dir": "where checkpoints go (any Hadoop filesystem URI)",
    "report_sample": "Parquet of held-out text for report.html (default: rows of --input)",
    "tokenizer": "encode: the trained run directory to encode with",
    "key_columns": "encode: columns copied next to the ids (default: every column but the "
                   "text; file + row when there is none)",
    "ids_column": "encode: name of the token-ids column (array<int>)",
    "special_in_text": "encode: a special-token string in the text is an error (error), "
                       "its special id (special), or plain text (text)",
    "encode_engine": "encode: auto (tiktoken when installed) | tiktoken | reference",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", action="append", default=[], help="extra TOML config file(s)")
    for f in fields(Config):
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        help_text = FIELD_HELP.get(f.name, f.name.replace("_", " "))
        if kind == "bool":
            p.add_argument(_flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction,
                           default=None, help=help_text)
        else:
            p.add_argument(_flag(f.name), dest=f.name, default=None, metavar="VALUE",
                           help=help_text)
    return p


def _coerce(name: str, kind: str, value: Any) -> Any:
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind == "int":
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if kind == "float":
            return float(value)
        if kind == "list[str]":
            if isinstance(value, str):
                return [s for s in value.split(",") if s] if value else []
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return list(value)
            raise ValueError(value)
        if not isinstance(value, str):
            raise ValueError(value)
        return value
    except (TypeError, ValueError):
        raise ConfigError(f"config key '{name}': expected {kind}, got {value!r}") from None


def _apply(values: dict[str, Any], cfg: Config, source: str) -> None:
    types = {f.name: (f.type if isinstance(f.type, str) else f.type.__name__) for f in fields(cfg)}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in types:
            raise ConfigError(f"{source}: unknown config key '{key}'")
        setattr(cfg, name, _coerce(name, types[name], value))


def load_toml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    flat: dict[str, Any] = {}
    for k, v in data.items():  # sections are only for readability
        if isinstance(v, dict):
            flat.update(v)
        else:
            flat[k] = v
    return flat


def resolve(argv: list[str] | None = None, description: str = "") -> Config:
    """defaults <- conf/default.toml <- each --config <- command-line flags; then validate."""
    args = build_parser(description).parse_args(argv)
    cfg = Config()
    if DEFAULT_CONFIG.exists():
        _apply(load_toml(DEFAULT_CONFIG), cfg, str(DEFAULT_CONFIG))
    for path in args.config:
        _apply(load_toml(path), cfg, path)
    cli = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    if "num_merges" in cli and "vocab_size" not in cli:
        cfg.vocab_size = 0
    if "vocab_size" in cli and "num_merges" not in cli:
        cfg.num_merges = 0
    if "words" in cli and "input" not in cli:
        cfg.input = ""
    _apply(cli, cfg, "command line")
    return cfg


def validate(cfg: Config, job: str) -> Config:
    """Check everything that can be checked without Spark. ``job``: count | train | encode."""
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    need(cfg.output != "", "config key 'output': set an output directory (--output DIR)")
    if job == "count":
        need(cfg.input != "", "config key 'input': give a Parquet corpus (--input PATH)")
    if job == "train":
        need(bool(cfg.input) != bool(cfg.words),
             "give exactly one of --input PATH (a Parquet corpus) or --words DIR (a word table)")
    if cfg.input and is_local(cfg.input) and not any(c in cfg.input for c in "*?["):
        need(os.path.exists(local_path(cfg.input)),
             f"config key 'input': path does not exist: {cfg.input}")
    if cfg.words and is_local(cfg.words):
        need(os.path.isdir(local_path(cfg.words)),
             f"config key 'words': word table directory does not exist: {cfg.words}")
    need(cfg.text_column != "", "config key 'text_column' is empty")
    try:
        compile_pattern(cfg.pattern)
    except PatternError as exc:
        raise ConfigError(f"config key 'pattern': {exc}") from None
    need(cfg.normalization in NORMALIZATIONS,
         f"config key 'normalization' must be one of {NORMALIZATIONS}, not {cfg.normalization!r}")
    need(cfg.alphabet in ALPHABETS,
         f"config key 'alphabet' must be one of {ALPHABETS}, not {cfg.alphabet!r}")
    need(not cfg.end_of_word_suffix or cfg.alphabet == "chars",
         "config key 'end_of_word_suffix' needs alphabet = 'chars'")
    need(len(set(cfg.special_tokens)) == len(cfg.special_tokens),
         "config key 'special_tokens' has duplicates")
    need(all(cfg.special_tokens), "config key 'special_tokens' has an empty token")
    need(cfg.engine in ENGINES, f"config key 'engine' must be one of {ENGINES}, not {cfg.engine!r}")
    need(cfg.resume in RESUME_MODES,
         f"config key 'resume' must be one of {RESUME_MODES}, not {cfg.resume!r}")
    need(cfg.min_pair_count >= 1, "config key 'min_pair_count' must be >= 1")
    need(cfg.max_token_bytes >= 0, "config key 'max_token_bytes' must be >= 0 (0 = no limit)")
    need(cfg.max_word_bytes >= 0, "config key 'max_word_bytes' must be >= 0 (0 = no cap)")
    need(cfg.max_batch >= 1, "config key 'max_batch' must be >= 1")
    need(cfg.driver_budget_mb >= 0, "config key 'driver_budget_mb' must be >= 0 (0 = derived "
         "from the memory the driver has)")
    need(cfg.num_partitions >= 0, "config key 'num_partitions' must be >= 0")
    need(cfg.count_on_driver_max_mb >= 0, "config key 'count_on_driver_max_mb' must be >= 0")
    need(cfg.count_reader in COUNT_READERS,
         f"config key 'count_reader' must be one of {COUNT_READERS}, not {cfg.count_reader!r}")
    need(cfg.spark_ui in SPARK_UI_MODES,
         f"config key 'spark_ui' must be one of {SPARK_UI_MODES}, not {cfg.spark_ui!r}")
    need(cfg.checkpoint_every_merges >= 1, "config key 'checkpoint_every_merges' must be >= 1")
    need(cfg.checkpoint_every_seconds > 0, "config key 'checkpoint_every_seconds' must be > 0")
    need(cfg.lease_timeout_seconds > 0, "config key 'lease_timeout_seconds' must be > 0")
    need(cfg.heartbeat_seconds > 0, "config key 'heartbeat_seconds' must be > 0")
    if job == "train":
        need(cfg.vocab_size > 0 or cfg.num_merges > 0,
             "config key 'vocab_size': set --vocab-size N or --num-merges N")
        need(not (cfg.vocab_size and cfg.num_merges),
             "config keys 'vocab_size' and 'num_merges' are both set: give only one")
        if cfg.vocab_size and cfg.alphabet == "bytes":
            floor = 256 + len(cfg.special_tokens)
            need(cfg.vocab_size > floor,
                 f"config key 'vocab_size' = {cfg.vocab_size} leaves no merges: it must be more "
                 f"than 256 bytes + {len(cfg.special_tokens)} special tokens = {floor}")
        need(cfg.num_merges >= 0, "config key 'num_merges' must be >= 0")
    return cfg
