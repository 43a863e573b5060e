"""Typed configuration: ``conf/default.toml``, then ``--config FILE``, then command-line flags.

Every field of :class:`Config` is a TOML key and a flag (``vocab_size`` <-> ``--vocab-size``).
Everything is validated before any Spark work starts; errors name the key.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import numbers
import os
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from pipeline.bpe import ALPHABETS
from pipeline.fsutil import (
    HADOOP_GLOB,
    PYTHON_GLOB,
    has_glob,
    is_local,
    join,
    local_path,
    scheme,
)
from pipeline.patterns import PATTERNS, PatternError, check_pattern
from pipeline.pretokenize import NORMALIZATIONS, PretokenizerSpec
from pipeline.progress import HEARTBEAT_SECONDS

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "conf" / "default.toml"


class ConfigError(ValueError):
    """Bad configuration or input: the message says which key and what to do."""


COUNT, TRAIN, ENCODE = "count", "train", "encode"
ALL_JOBS = (COUNT, TRAIN, ENCODE)
MAX_INPUT_WEIGHT = 1_000_000
INPUT_FORMATS = ("parquet", "json", "text", "orc", "csv", "delta")


def opt(default: Any, help: str | dict[str, str], jobs: tuple[str, ...] = ALL_JOBS,
        choices: tuple[str, ...] | None = None) -> Any:
    """A config key: its default (the only place defaults live), its help (one text, or one
    per job), the jobs that take it as a flag, and its allowed values (shown in --help and
    checked by :func:`validate`)."""
    meta = {"help": help, "jobs": jobs, "choices": choices}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


CT, CTE, TE = (COUNT, TRAIN), ALL_JOBS, (TRAIN, ENCODE)


@dataclass
class Config:
    # -- input ---------------------------------------------------------------------------------
    input: str = opt("", {
        COUNT: "the corpus: a path, glob or directory on any Hadoop filesystem; several sources "
               "separated by commas (see input_weights)",
        TRAIN: "the corpus: a path, glob or directory on any Hadoop filesystem; several sources "
               "separated by commas (see input_weights)",
        ENCODE: "the corpus to encode (input_format): a path, glob or directory on any "
                "Hadoop filesystem; several separated by commas"}, CTE)
    input_format: str = opt("parquet", "format of --input, read by Spark (parquet files are "
                                       "read with pyarrow when local)", CTE, INPUT_FORMATS)
    input_table: str = opt("", "a catalog table to read instead of --input", CT)
    input_weights: list[int] = opt([], "integer weight of each --input source (counts are "
                                       "multiplied: data mixtures); empty = all 1", CT)
    text_column: str = opt("text", "the column holding the text (string or binary)", CTE)
    words: str = opt("", "a word table instead of --input: one from count_words, or an "
                         "external (word, count[, first_seen]) Parquet or TSV table", (TRAIN,))
    output: str = opt("", {COUNT: "output directory: the word table",
                          TRAIN: "output directory: the run (tokenizer, exports, stats, report)",
                          ENCODE: "output directory: the encoded corpus (Parquet)"})
    count_merge: str = opt("auto", "where the tasks' partial counts are merged (auto: on the "
                                   "driver when they fit its memory budget)", CT,
                           ("auto", "driver", "spark"))
    count_reader: str = opt("auto", "auto: local Parquet read by pyarrow in the tasks, else "
                                    "Spark's scan; spark: always Spark's scan; arrow: "
                                    "pyarrow only (local Parquet, else an error)", CT,
                            ("auto", "spark", "arrow"))
    ignore_corrupt_files: bool = opt(False, "skip input files that cannot be read (listed in "
                                            "stats.json) instead of one error naming the "
                                            "file", CT)
    # -- pretokenization -------------------------------------------------------------------------
    pattern: str = opt("cl100k", f"split pattern: {', '.join(PATTERNS)}, none, or a regex", CT)
    special_tokens: list[str] = opt(["<|endoftext|>"], "comma-separated special tokens, cut "
                                                         "out of the text before splitting", CT)
    lowercase: bool = opt(False, "lowercase the text", CT)
    normalization: str = opt("none", "Unicode normalization", CT, NORMALIZATIONS)
    max_word_bytes: int = opt(1024, "words longer than this many bytes are left out of "
                                    "training and counted (0 = keep all)", CT)
    alphabet: str = opt("bytes", "initial symbols", (TRAIN,), ALPHABETS)
    end_of_word_suffix: str = opt("", 'e.g. "</w>" (chars alphabet only)', (TRAIN,))
    # -- training --------------------------------------------------------------------------------
    vocab_size: int = opt(0, "256 + merges + special tokens", (TRAIN,))
    num_merges: int = opt(0, "number of merges (instead of --vocab-size)", (TRAIN,))
    min_pair_count: int = opt(2, "stop when the best pair occurs fewer times", (TRAIN,))
    max_token_bytes: int = opt(0, "never make a token longer than this (0 = no limit)", (TRAIN,))
    engine: str = opt("auto", "merge engine (auto: decided by memory)", (TRAIN,),
                      ("auto", "spark", "local"))
    driver_budget_mb: int = opt(0, "MB the driver may use for the count merge and the driver "
                                   "engine (0 = derived from what the driver has)", CT)
    batch_merges: bool = opt(True, "spark engine: several merges per round when provably "
                                   "exact", (TRAIN,))
    max_batch: int = opt(256, "spark engine: most merges in one round", (TRAIN,))
    num_partitions: int = opt(0, "partitions of the work (0 = Spark's default parallelism)")
    name: str = opt("", "the tokenizer's name (the tiktoken encoding's name): default "
                        "spark-bpe-<run directory name>", (TRAIN,))
    # -- checkpoints -----------------------------------------------------------------------------
    checkpoint_dir: str = opt("", "where merge-list checkpoints go ('' = RUN_DIR/"
                                  "checkpoints)", (TRAIN,))
    checkpoint_every_merges: int = opt(1000, "checkpoint at least every N merges", (TRAIN,))
    checkpoint_every_seconds: float = opt(60.0, "and at least every N seconds", (TRAIN,))
    resume: str = opt("auto", "continue from the newest valid checkpoint, or start fresh",
                      (TRAIN,), ("auto", "never"))
    lease_timeout_seconds: float = opt(120.0, "one run per output (run directory, word "
                                              "table, encoded corpus): a lease not renewed "
                                              "this long is taken over")
    # -- runtime ---------------------------------------------------------------------------------
    master: str = opt("", "Spark master for this job, over spark-submit's --master (default: "
                          "spark-submit's, else local[*]); other spark-submit settings stay")
    shuffle_partitions: int = opt(0, "spark.sql.shuffle.partitions (a value here wins; 0 = "
                                     "spark-submit's, else 2 x default parallelism)")
    log_level: str = opt("INFO", "our log level (Spark's own log is configured by Spark)",
                         choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    progress_bar: bool = opt(True, "a progress bar on a terminal (never in a log)")
    heartbeat_seconds: float = opt(HEARTBEAT_SECONDS,
                                   "a progress line per running stage this often")
    progress_file: str = opt("", {
        COUNT: "also write the heartbeats to this file, one JSON object per line, for "
               "dashboards ('' = the log only)",
        TRAIN: "where the heartbeats go as JSON lines, for dashboards ('' = "
               "RUN/progress.jsonl)",
        ENCODE: "also write the heartbeats to this file, one JSON object per line, for "
                "dashboards ('' = the log only)"})
    spark_ui: str = opt("auto", "Spark web UI (auto: on for cluster masters, off in local "
                                "modes, unless spark-submit sets spark.ui.enabled; on/off win "
                                "over it)", choices=("auto", "on", "off"))
    report_sample_rows: int = opt(200, "rows sampled for report.html", (TRAIN,))
    report_sample: str = opt("", "Parquet of held-out text for report.html ('' = rows of "
                                 "the input)", (TRAIN,))
    # -- encoding (jobs/encode.py) ---------------------------------------------------------------
    tokenizer: str = opt("", "the trained run directory to encode with", (ENCODE,))
    key_columns: list[str] = opt([], "columns copied next to the ids (default: every column "
                                     "but the text; file and row when there is none)",
                                 (ENCODE,))
    ids_column: str = opt("ids", "name of the token-ids column (array<int>)", (ENCODE,))
    special_in_text: str = opt("error", "a special-token string in the text: an error, its "
                                        "special id, or plain text", (ENCODE,),
                               ("error", "special", "text"))
    encode_engine: str = opt("auto", "auto: tiktoken when installed on the executors",
                             (ENCODE,), ("auto", "tiktoken", "reference"))
    encode_io: str = opt("auto", "auto: local Parquet read and the ids written by pyarrow "
                                 "in the tasks (where the output is certain to be Spark's), "
                                 "else Spark's scan and writer; spark: always Spark's; arrow: "
                                 "pyarrow only (else an error saying why)", (ENCODE,),
                         ("auto", "spark", "arrow"))

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

    @property
    def inputs(self) -> list[str]:
        """The input sources: ``input`` split at the commas outside a Hadoop glob's braces
        (``a/,b/part-{0,1}.parquet`` is two sources)."""
        return [s for s in self.input_items() if s]

    def input_items(self) -> list[str]:
        """``input`` split as :attr:`inputs` is, empty items kept (validation refuses them)."""
        if not self.input.strip():
            return []
        sources, depth, start = [], 0, 0
        for i, c in enumerate(self.input + ","):
            depth += (c == "{") - (c == "}" and depth > 0)
            if c == "," and depth == 0:
                sources.append(self.input[start:i].strip())
                start = i + 1
        return sources

    def to_json(self, job: str, indent: int | None = 2) -> str:
        """The settings ``job`` takes (its flags), as JSON: what a run, a word table or an
        encoded corpus saves as its config, and what a job logs at start. Other jobs' keys
        are left out: they did not apply, whatever their value."""
        keys = job_keys(job)
        return json.dumps({k: v for k, v in dataclasses.asdict(self.with_absolute_paths()).items()
                           if k in keys}, indent=indent, sort_keys=True)

    def with_absolute_paths(self) -> Config:
        """A copy whose relative local paths are absolute against this process's working
        directory (what a saved or logged config must say: a path relative to where a job
        was started means nothing later; URIs stay as given)."""
        def fix(path: str) -> str:
            return os.path.abspath(path) if path and not scheme(path) else path

        def fix_source(path: str) -> str:  # a comma would make two sources of it: kept as is
            fixed = fix(path)
            return path if "," in fixed and "," not in path else fixed

        copy = dataclasses.replace(self)
        copy.input = ",".join(map(fix_source, self.input_items()))  # (an empty one stays)
        for key in PATH_KEYS:
            setattr(copy, key, fix(getattr(self, key)))
        return copy


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _kind(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else f.type.__name__


class _OneLineParser(argparse.ArgumentParser):
    """A misspelled or malformed flag ends the job as every other config error does: one line
    (``error: ...``) and exit code 2, not argparse's usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (--help lists this job's flags)\n")


def build_parser(description: str, job: str = TRAIN) -> argparse.ArgumentParser:
    """The flags of one job: its keys only, each with its default and allowed values."""
    from pipeline import __version__

    # no abbreviations: a scheduled command saying --vocab would change meaning (or break)
    # the day another flag starts with those letters
    p = _OneLineParser(description=description, allow_abbrev=False,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"spark-bpe {__version__}")
    p.add_argument("--config", action="append", default=[], metavar="FILE",
                   help="TOML config file(s), applied in order" + (
                       " (after conf/default.toml when the run is the sample's)"
                       if job == TRAIN else ""))
    defaults, builtin, keys = job_defaults(job), Config(), job_keys(job)
    for f in fields(Config):
        if f.name not in keys:
            continue
        kind, default = _kind(f), getattr(defaults, f.name)
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        repo = str(DEFAULT_CONFIG.parent.parent) + os.sep
        if isinstance(shown, str) and shown.startswith(repo):  # the sample run's, as written
            shown = shown[len(repo):]
        help_text = f.metadata["help"]
        if isinstance(help_text, dict):
            help_text = help_text[job]
        if default != getattr(builtin, f.name):  # from conf/default.toml
            help_text += f" (default: {shown!r}, {SAMPLE_RUN_NOTE}: a run on its own corpus " \
                         "must set it)"
        elif "(default: " not in help_text:  # else the text says what the default means
            help_text += f" (default: {shown!r})"
        if f.metadata["choices"]:
            help_text += f"; one of {', '.join(f.metadata['choices'])}"
        if kind == "bool":
            p.add_argument(_flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction,
                           default=None, help=help_text)
        else:
            p.add_argument(_flag(f.name), dest=f.name, default=None,
                           metavar=kind.upper().replace("[", "_").replace("]", ""),
                           help=help_text)
    return p


def _int(value: Any) -> int:
    """An integer from a flag's text or a TOML/API value; a float (4096.9) or a boolean is an
    error, never silently truncated."""
    if isinstance(value, str):
        return int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(value)  # (numpy's integers are Integral; its float32 or a Decimal not)
    return int(value)


def _coerce(name: str, kind: str, value: Any) -> Any:
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if getattr(getattr(value, "dtype", None), "kind", "") == "b":  # numpy's bool_
                return bool(value)
            if not isinstance(value, str):  # (a TOML or API 1 is not a yes)
                raise ValueError(value)
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind == "int":
            return _int(value)
        if kind == "float":
            if isinstance(value, bool):  # (float(True) is 1.0)
                raise ValueError(value)
            return float(value)
        if kind == "list[int]":  # (an empty item is an error: "2," is not [2])
            items = (value.split(",") if value.strip() else []) if isinstance(value, str) \
                else value
            if isinstance(items, (list, tuple)):
                return [_int(v.strip() if isinstance(v, str) else v) for v in items]
            raise ValueError(value)
        if kind == "list[str]":
            if isinstance(value, str):  # (an empty item is an error; "a, b" is a and b)
                return [v.strip() or v for v in value.split(",")] if value else []
            if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                return list(value)
            raise ValueError(value)
        if not isinstance(value, str):
            raise ValueError(value)
        return value
    except (TypeError, ValueError):
        raise ConfigError(f"config key '{name}': expected {kind}, got {value!r}") from None


RENAMED_KEYS = {  # keys of earlier versions, and what replaced them
    "count_on_driver_max_mb": "replaced by count_merge = auto | driver | spark: the count now "
                              "merges on the driver when the measured partial counts fit its "
                              "memory budget (driver_budget_mb)",
}


def _apply(values: dict[str, Any], cfg: Config, source: str) -> None:
    types = {f.name: (f.type if isinstance(f.type, str) else f.type.__name__) for f in fields(cfg)}
    choices = {f.name: f.metadata["choices"] for f in fields(cfg)}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in types:
            hint = RENAMED_KEYS.get(name, "")
            raise ConfigError(f"{source}: unknown config key '{key}'"
                              + (f" ({hint})" if hint else ""))
        value = _coerce(name, types[name], value)
        if choices[name] and isinstance(value, str):  # "debug", "nfc": the choice as spelled
            value = {c.lower(): c for c in choices[name]}.get(value.lower(), value)
        setattr(cfg, name, value)


def _apply_layer(values: dict[str, Any], cfg: Config, source: str,
                 tied: dict[str, bool] | None = None) -> None:
    """Apply one layer (a --config file, then the flags) over the ones before it. Naming one of
    a set of exclusive keys replaces what the earlier layers said about the others:
    ``num_merges`` drops an earlier ``vocab_size`` (and the reverse), and a corpus (``input``,
    ``input_table`` or ``words``) drops an earlier other corpus, and the ``input_weights``
    given with it (in the same layer; weights given alone apply to the corpus named later).
    ``tied``: carried from layer to layer, whether the weights came with a corpus."""
    tied = {} if tied is None else tied
    names = {k.replace("-", "_") for k in values}
    if "num_merges" in names and "vocab_size" not in names:
        cfg.vocab_size = 0
    if "vocab_size" in names and "num_merges" not in names:
        cfg.num_merges = 0
    if names & set(CORPUS_KEYS):
        for key in CORPUS_KEYS:
            if key not in names:
                setattr(cfg, key, "")
        if "input_weights" not in names and tied.get("weights"):  # the replaced corpus's
            cfg.input_weights = []
    if "input_weights" in names:
        tied["weights"] = bool(names & set(CORPUS_KEYS))
    _apply(values, cfg, source)


def load_toml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not valid TOML: not UTF-8 text") from None
    except OSError as exc:  # a directory, no permission
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    flat: dict[str, Any] = {}
    for k, v in data.items():  # sections are only for readability
        if isinstance(v, dict) and k.replace("-", "_") in Config.__dataclass_fields__:
            raise ConfigError(f"config key '{k}' in {path} takes a plain value, not a table")
        if isinstance(v, dict) and k.lower() in (COUNT, TRAIN, ENCODE, "count_words"):
            raise ConfigError(f"{path}: section [{k}]: sections are only for readability and "
                              "apply to every job, not to one job; give each job its own "
                              "--config file")
        for key, value in (v.items() if isinstance(v, dict) else [(k, v)]):
            if isinstance(value, dict):
                raise ConfigError(f"config file {path}: [{k}] {key} is a table; config keys "
                                  "take plain values (sections are one level deep)")
            name = key.replace("-", "_")
            if isinstance(v, dict) and name not in Config.__dataclass_fields__:
                hint = RENAMED_KEYS.get(name, "")  # (named with its section: [x] y is not y)
                raise ConfigError(f"{path}: unknown config key '{key}' in section [{k}]"
                                  + (f" ({hint})" if hint else ""))
            same = next((k2 for k2 in flat if k2.replace("-", "_") == key.replace("-", "_")),
                        None)  # (vocab_size and vocab-size are one key)
            if same is not None:
                twice = f"'{key}'" if same == key else f"'{same}' and '{key}'"
                raise ConfigError(f"config key {twice} is set twice in {path}")
            flat[key] = value
    return flat


MIN_SECONDS, MAX_SECONDS = 0.01, 1e7  # the durations' range (1e7 s: about 116 days)
JAVA_INT_MAX = 2**31 - 1
PATH_KEYS = ("words", "output", "tokenizer", "checkpoint_dir", "report_sample",
             "progress_file")  # the local paths among the keys, besides input's sources
SAMPLE_RUN_NOTE = "the sample run's, conf/default.toml"
CORPUS_KEYS = ("input", "input_table", "words")


def job_defaults(job: str, own_corpus: bool = False) -> Config:
    """The built-in defaults, and for ``train`` also conf/default.toml: the sample run's corpus,
    output and vocabulary, for the quick start's bare ``spark-submit jobs/train.py``. They do
    not apply to a run that names its own corpus (``own_corpus``), which must give its own
    output and vocabulary size, nor to the other jobs: a bare ``count_words`` must not write
    its table over the sample run."""
    cfg = Config()
    if job == TRAIN and not own_corpus and DEFAULT_CONFIG.exists():
        _apply(load_toml(DEFAULT_CONFIG), cfg, str(DEFAULT_CONFIG))
        repo = DEFAULT_CONFIG.parent.parent  # its paths are the repository's, from any cwd
        for key in ("input", "output"):
            value = getattr(cfg, key)
            if value and is_local(value) and not os.path.isabs(local_path(value)):
                setattr(cfg, key, str(repo / value))
    return cfg


def resolve(argv: list[str] | None = None, description: str = "", job: str = TRAIN) -> Config:
    """Config defaults (:func:`job_defaults`) <- each --config <- the job's command-line flags.
    A training run that names its own input (or word table) gets none of the sample run's
    settings: it must name its own output (the default one is the sample run's) and vocabulary
    size."""
    return resolve_with_notes(argv, description, job)[0]


def resolve_with_notes(argv: list[str] | None = None, description: str = "", job: str = TRAIN
                       ) -> tuple[Config, list[str]]:
    """:func:`resolve`, and a note for each --config file that sets keys this job does not
    take (one file may serve several jobs: its other keys are ignored, and the log says so)."""
    args = build_parser(description, job).parse_args(argv)
    _refuse_repeated_flags(sys.argv[1:] if argv is None else argv)
    files, notes = [], []
    for path in args.config:
        values = load_toml(path)
        other = sorted(k for k in values if k.replace("-", "_") in Config.__dataclass_fields__
                       and k.replace("-", "_") not in job_keys(job))
        if other:  # neither applied nor validated (unknown keys still are an error)
            notes.append(f"--config {path}: not {job} settings, ignored: {', '.join(other)}")
            values = {k: v for k, v in values.items() if k not in other}
        files.append((path, values))
    cli = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    explicit = set(cli).union(*({k.replace("-", "_") for k in values} for _, values in files))
    own_corpus = bool(explicit & set(CORPUS_KEYS))
    # the shipped sample run (conf/default.toml) is the bare command's: a run configured with
    # a --config file (conf/cluster.toml, a site's) must name its corpus, never train the sample
    sample_run = not own_corpus and not files
    cfg = job_defaults(job, own_corpus=not sample_run)
    tied: dict[str, bool] = {}
    for path, values in files:
        _apply_layer(values, cfg, path, tied)
    _apply_layer(cli, cfg, "command line", tied)
    if own_corpus and "output" not in explicit:
        flags = [f"--{k.replace('_', '-')}" for k in CORPUS_KEYS if k in job_keys(job)]
        given = " or ".join([", ".join(flags[:-1]), flags[-1]] if len(flags) > 1 else flags)
        missing = [flag for flag, absent in (  # all at once, not one per try
            ("--tokenizer RUN_DIR", job == ENCODE and not cfg.tokenizer),
            ("--output DIR", True),
            ("--vocab-size N (or --num-merges N)",
             job == TRAIN and not (cfg.vocab_size or cfg.num_merges))) if absent]
        what = missing[0] if len(missing) == 1 else \
            f"{', '.join(missing[:-1])} and {missing[-1]}"
        raise ConfigError(f"config key 'output': give {what} with {given}"
                          + (" (the default output directory is the sample run's)"
                             if job == TRAIN else ""))
    if job == TRAIN and sample_run and "output" in explicit:  # (a flag lost on the way?)
        notes.append(f"no --input, --input-table or --words given: this run trains the "
                     f"shipped sample corpus ({cfg.input}) into {cfg.output}")
    return cfg, notes


def _refuse_repeated_flags(argv: list[str]) -> None:
    """A flag given twice would silently keep its last value (``--input a --input b`` trains
    on b only): refused, except ``--config``, which layers files."""
    seen: set[str] = set()
    for token in argv:
        if token == "--":
            break
        name = token.split("=", 1)[0]
        if not name.startswith("--") or name == "--config":
            continue
        base = "--" + name[5:] if name.startswith("--no-") else name
        if base in seen:
            hint = (" (several sources: one comma-separated --input a,b)"
                    if base == "--input" else "")
            raise ConfigError(f"{base} is given more than once{hint}; give it once")
        seen.add(base)


def _check_special_tokens(cfg: Config) -> None:
    """Special tokens every exported encoder splits alike: none a prefix of another (where
    both match, tiktoken takes the one it lists first, ours and tokenizers the longest), and
    none equal to a byte's token of the byte-level vocabulary (tokenizers would give it the
    byte's id)."""
    for a in cfg.special_tokens:
        for b in cfg.special_tokens:
            if a != b and b.startswith(a):
                raise ConfigError(
                    f"config key 'special_tokens': {a!r} is a prefix of {b!r}: where both "
                    "match, the encoders of the exports would split them differently "
                    "(tiktoken takes either); rename one")
    if cfg.alphabet == "bytes":
        from pipeline.outputs import BYTE_ENCODER

        clash = [t for t in cfg.special_tokens if t in set(BYTE_ENCODER.values())]
        if clash:
            raise ConfigError(
                f"config key 'special_tokens': {clash[0]!r} is also the token of a byte in the "
                "byte-level vocabulary (tokenizer.json would give it that byte's id); use a "
                "longer special token, e.g. '<|" + clash[0] + "|>'")


def job_keys(job: str) -> set[str]:
    """The config keys a job takes (its flags)."""
    return {f.name for f in fields(Config) if job in f.metadata["jobs"]}


def _split_glob(path: str) -> tuple[str, str]:
    """(the directory a glob starts in, the pattern below it): ``data/*.parquet`` ->
    (``data``, ``*.parquet``), ``*.parquet`` -> (``.``, ``*.parquet``); a path without a glob
    -> (the path, '')."""
    cut = min((path.index(c) for c in HADOOP_GLOB if c in path), default=None)
    if cut is None:
        return path, ""
    slash = path.rfind("/", 0, cut)
    if slash < 0:
        return ".", path
    return path[:slash] or "/", path[slash + 1:]


def _comparable(path: str) -> str:
    """A path spelled so that two spellings of one place compare equal: local paths absolute,
    normalized and with symlinks resolved, URIs without a trailing slash; a glob is cut to the
    directory it starts in (``corpus/*.parquet`` -> ``corpus``)."""
    path = _split_glob(path)[0]
    if is_local(path):
        return os.path.realpath(local_path(path) or ".")
    return path.rstrip("/")


def _inside(inner: str, outer: str) -> str | None:
    """``inner``'s path below ``outer`` ('' when they are the same place), or None."""
    if inner == outer:
        return ""
    prefix = outer.rstrip("/") + "/"
    return inner[len(prefix):] if inner.startswith(prefix) else None


def same_or_inside(inner: str, outer: str) -> str | None:
    """Where ``inner`` lies below ``outer`` in any spelling of both ('' when they are the
    same place), or None when it is elsewhere."""
    return _inside(_comparable(inner), _comparable(outer))


def _read_by(place: str, source: str) -> bool:
    """Whether the readers of ``source`` (a path, a directory or a glob) list what is at
    ``place`` (comparable): inside the source directory (unless under a name they skip,
    ``_runs/x`` or ``.x``), or, for a glob, under a name the glob matches."""
    below = _inside(place, _comparable(source))
    if below is None or below == "":
        return below == ""
    if any(part.startswith(("_", ".")) for part in below.split("/")):
        return False  # the readers skip it
    pattern = _split_glob(source)[1]
    return not pattern or all(fnmatch.fnmatchcase(part, pat)  # each level the glob has
                              for part, pat in zip(below.split("/"), pattern.split("/")))


def check_output_place(output: str, sources: list[tuple[str, str]]) -> None:
    """An output must not be a file (or under one), hold a source, or lie where a source's
    readers would list it (:func:`_read_by`). ``sources``: (config key, path). Local paths
    only are checked for being files."""
    out = _comparable(output)
    for key, given in sources:
        if _inside(_comparable(given), out) is not None or _read_by(out, given):
            raise ConfigError(f"config key 'output': {output} overlaps --{key.replace('_', '-')} "
                              f"{given} (writing it would replace or add to what is read); "
                              "choose an output outside it")
    if is_local(output):
        place = out
        while not os.path.exists(place) and os.path.dirname(place) != place:
            place = os.path.dirname(place)
        if os.path.exists(place) and not os.path.isdir(place):
            raise ConfigError(f"config key 'output': {place} is a file, not a directory")


def validate(cfg: Config, job: str, frame: bool = False) -> Config:
    """Check everything that can be checked without Spark. ``job``: count | train | encode.
    ``frame``: the corpus is a DataFrame (``pipeline.api``), not ``input``."""
    for f in fields(Config):
        choices = f.metadata["choices"]
        value = getattr(cfg, f.name)
        _need(not choices or value in choices,
              f"config key '{f.name}' must be one of {choices}, not {value!r}")
        _need(not isinstance(value, str) or "\0" not in value,
              f"config key '{f.name}' holds a NUL character (\\0), which no path or name "
              "may hold")
        _need(not isinstance(value, str) or not value or value.strip()
              or f.name in ("pattern", "end_of_word_suffix"),  # (pattern: checked below)
              f"config key '{f.name}' is only whitespace ({value!r})")
    _check_sources(cfg, job, frame)
    _need(not frame or cfg.input_format == Config.input_format,
          f"config key 'input_format' = {cfg.input_format!r}: a DataFrame corpus is already "
          "read (its reader's format is the DataFrame's); leave input_format out")
    _need(not cfg.input_table or cfg.input_format == Config.input_format,
          f"config key 'input_format' = {cfg.input_format!r}: --input-table "
          f"{cfg.input_table} is read as the catalog table it is (its format is the "
          "table's); leave input_format out")
    if job in (COUNT, TRAIN) and cfg.count_reader == "arrow" and not cfg.words:
        read_by_spark = ("a DataFrame" if frame else
                         f"--input-table {cfg.input_table}" if cfg.input_table else
                         f"--input-format {cfg.input_format}"
                         if cfg.input_format != "parquet" else "")
        _need(not read_by_spark,
              f"config key 'count_reader' = 'arrow' reads Parquet files with pyarrow; "
              f"{read_by_spark} is read by Spark's reader: use 'auto' or 'spark'")
    _check_split(cfg)
    _check_numbers(cfg)
    if job == TRAIN:
        _check_merges_wanted(cfg)
    if job == ENCODE:
        _need(all(c.strip() for c in cfg.key_columns),
              "config key 'key_columns' has an empty column name")
        _need(cfg.text_column not in cfg.key_columns,
              f"config key 'key_columns': {cfg.text_column!r} is the text column (its ids are "
              "written instead)")
    if job == ENCODE and cfg.num_partitions and cfg.input_format == "text" \
            and not (cfg.input_table or frame):  # (other formats: known once read)
        raise unnumbered_repartition("text")
    return cfg


COUNT_ONLY_KEYS = ("input_format", "text_column", "count_reader", "count_merge",
                   "ignore_corrupt_files")  # what reading a corpus takes: not a word table


def unused_with_words(cfg: Config) -> list[str]:
    """The settings for reading a corpus that a run given ``--words`` sets, which it does not
    use (the table is already counted)."""
    default = Config()
    keys = [k for k in COUNT_ONLY_KEYS  # (the report's sample is read with these two)
            if not (cfg.report_sample and k in ("text_column", "ignore_corrupt_files"))]
    return [k for k in keys if getattr(cfg, k) != getattr(default, k)] if cfg.words else []


def unnumbered_repartition(kind: str) -> ConfigError:
    """The encode job's refusal to repartition an input keyed by where its rows were read."""
    return ConfigError(
        f"config key 'num_partitions': a {kind} input whose only column is the text is keyed "
        "(file, block, row), its rows numbered as its files are read, so it cannot be "
        "repartitioned first; leave num_partitions at 0 (Spark reads each block of a file, or "
        "each file it cannot split, in a task of its own)")


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _check_sources(cfg: Config, job: str, frame: bool) -> None:
    """The corpus (input, input_table, words, weights), the output and where they lie."""
    _need(all(1 <= w <= MAX_INPUT_WEIGHT for w in cfg.input_weights),
          f"config key 'input_weights': weights are integers from 1 to {MAX_INPUT_WEIGHT:,} "
          "(word counts are 64-bit: a weight this size leaves room for 9.2 trillion "
          "occurrences of one word)")
    _need(not cfg.input_weights or bool(cfg.inputs),
          "config key 'input_weights': weights apply to the --input sources (one per source), "
          "not to --words or --input-table")
    _need(not cfg.input_weights or len(cfg.input_weights) == len(cfg.inputs),
          f"config key 'input_weights': {len(cfg.input_weights)} weights for "
          f"{len(cfg.inputs)} input sources")
    missing = [flag for flag, absent in (
        ("--tokenizer RUN_DIR", job == ENCODE and not cfg.tokenizer),
        ("--input PATH", job in (COUNT, ENCODE) and not (cfg.input or cfg.input_table or frame)),
        ("--input PATH (or --words DIR)", job == TRAIN and not (cfg.input or cfg.input_table
                                                                 or frame or cfg.words)),
        ("--output DIR", not cfg.output)) if absent]
    if len(missing) > 1:  # all at once, not one per try
        raise ConfigError(f"give {', '.join(missing[:-1])} and {missing[-1]} (the job's "
                          "--help lists its settings)")
    _need(cfg.output != "", "config key 'output': set an output directory (--output DIR)")
    for key in ("output", "checkpoint_dir"):
        place = getattr(cfg, key)
        # a count's or an encode's output and a checkpoint directory have their lease beside
        # them, in the parent: a bucket root has none (a run's output holds its own lease)
        _need(not (re.fullmatch(r"[A-Za-z][\w+.-]*://[^/]*/*", place)
                   and (key == "checkpoint_dir" or job != TRAIN)),
              f"config key '{key}': {place} is the root of a bucket or filesystem; give a "
              f"directory under it ({place.rstrip('/')}/NAME)")
    # the word table a count writes, or a run counts into its output, is read back through
    # Spark's reader, which takes these characters for a pattern (exp[1] read exp1)
    glob = [c for c in HADOOP_GLOB + "]}\\" if c in cfg.output] \
        if job == COUNT or (job == TRAIN and not cfg.words) else []
    _need(not glob, f"config key 'output': {cfg.output} holds "
          f"{' '.join(dict.fromkeys(glob))}, which Spark's reader takes for a pattern when "
          "the job reads its word table back; choose a name without them")
    if job == COUNT:
        _need(cfg.input != "" or cfg.input_table != "" or frame,
              "config key 'input': give a corpus (--input PATH or --input-table NAME)")
    if job == TRAIN:
        _need((bool(cfg.input) or bool(cfg.input_table) or frame) != bool(cfg.words),
              "config keys 'input' and 'words': give exactly one of --input PATH (a corpus) or "
              "--words DIR (a word table)")
    _need(not (cfg.input and cfg.input_table),
          "config keys 'input' and 'input_table' are both set: give only one")
    for source in cfg.inputs:
        if is_local(source) and not has_glob(source):
            _need(os.path.exists(local_path(source)),
                  f"config key 'input': path does not exist: {source}"
                  + (" (a path without a scheme is a local one: write hdfs://..., s3a://... "
                     "for another filesystem)" if scheme(source) == "" else ""))
    if job == TRAIN and cfg.report_sample and is_local(cfg.report_sample) \
            and not has_glob(cfg.report_sample):
        _need(os.path.exists(local_path(cfg.report_sample)),
              f"config key 'report_sample': path does not exist: {cfg.report_sample}")
    if cfg.words and is_local(cfg.words) and not has_glob(cfg.words, PYTHON_GLOB):
        _need(os.path.exists(local_path(cfg.words)),
              f"config key 'words': no word table at {cfg.words}")
    _need(not cfg.input or bool(cfg.inputs), f"config key 'input': no path in {cfg.input!r}")
    _need(all(cfg.input_items()), f"config key 'input' has an empty source (two commas, or "
          f"one at an end): {cfg.input!r}")
    check_output_place(cfg.output, [("input", p) for p in cfg.inputs])
    _need(not cfg.words or same_or_inside(cfg.output, cfg.words) is None,
          f"config key 'output': {cfg.output} is in --words {cfg.words}; choose an output "
          "outside it")  # (RUN/words as --words of RUN is fine: it is read before it is written)
    if job == TRAIN and cfg.checkpoint_dir:
        _check_checkpoint_dir(cfg)
    if cfg.progress_file:
        _check_progress_file(cfg, job)


def _read_places(cfg: Config, job: str) -> list[tuple[str, str]]:
    """(config key, path) of everything the job reads: nothing it writes may lie there."""
    keys = [*(("input", p) for p in cfg.inputs), ("words", cfg.words)]
    keys += [("report_sample", cfg.report_sample)] if job == TRAIN else []
    keys += [("tokenizer", cfg.tokenizer)] if job == ENCODE else []
    return [(k, p) for k, p in keys if p]


def _not_where_read(key: str, path: str, cfg: Config, job: str) -> None:
    for what, source in _read_places(cfg, job):
        _need(not _read_by(_comparable(path), source),
              f"config key '{key}': {path} is inside --{what.replace('_', '-')} {source}, "
              "which the job reads; write it elsewhere")


def _check_checkpoint_dir(cfg: Config) -> None:
    """Checkpoints go outside what the run reads and outside the word table it counts (a
    recount replaces the table's directory, and the checkpoints' lease with it)."""
    path = cfg.checkpoint_dir
    _not_where_read("checkpoint_dir", path, cfg, TRAIN)
    same = (path.rstrip("/") == cfg.output.rstrip("/") if has_glob(path, PYTHON_GLOB)
            else same_or_inside(path, cfg.output) == "")  # (_comparable cuts at a glob)
    _need(not same,
          f"config key 'checkpoint_dir': {path} is the run directory itself, which holds the "
          "run's files only; leave checkpoint_dir unset (checkpoints go to OUTPUT/checkpoints) "
          "or choose another directory")
    if is_local(path):
        local = os.path.abspath(local_path(path))
        _need(not os.path.isfile(local),
              f"config key 'checkpoint_dir': {path} is a file, not a directory")
        above = os.path.dirname(local)
        while above != os.path.dirname(above) and not os.path.exists(above):
            above = os.path.dirname(above)
        _need(not os.path.isfile(above),
              f"config key 'checkpoint_dir': {path} is under {above}, which is a file")
    for table in [cfg.words] * bool(cfg.words) + [join(cfg.output, "words")]:
        _need(same_or_inside(path, table) is None,  # (an external --words is copied there)
              f"config key 'checkpoint_dir': {path} is inside the word table {table}, which "
              "a count replaces whole; choose a checkpoint directory outside it")


def _check_progress_file(cfg: Config, job: str) -> None:
    """``progress_file`` is a file outside what the job reads and outside its output (which
    is replaced whole), except ``RUN/progress.jsonl``, where a run writes it anyway."""
    path = cfg.progress_file
    key = f"config key 'progress_file': {path}"
    _need(not path.endswith("/") and not has_glob(path, PYTHON_GLOB),
          f"{key} is not a file name")
    if is_local(path):
        _need(not os.path.isdir(local_path(path)), f"{key} is a directory; give a file")
    own = job == TRAIN and same_or_inside(path, cfg.output) == "progress.jsonl"
    _need(own or same_or_inside(path, cfg.output) is None,
          f"{key} is inside --output {cfg.output}, which holds the job's own files only; "
          "write it elsewhere")
    _not_where_read("progress_file", path, cfg, job)
    if job == TRAIN and cfg.checkpoint_dir:
        _need(same_or_inside(path, cfg.checkpoint_dir) is None,
              f"{key} is inside --checkpoint-dir {cfg.checkpoint_dir}; write it elsewhere")


def _check_split(cfg: Config) -> None:
    """How text is cut into words: text column, pattern, alphabet, special tokens."""
    _need(cfg.text_column != "", "config key 'text_column' is empty")
    _need(cfg.pattern != "", "config key 'pattern' is empty (pattern = 'none' makes each row "
          "one word)")
    try:
        check_pattern(cfg.pattern)
    except PatternError as exc:
        raise ConfigError(f"config key 'pattern': {exc}") from None
    _need(not cfg.end_of_word_suffix or cfg.alphabet == "chars",
          "config key 'end_of_word_suffix' needs alphabet = 'chars'")
    _need(all(cfg.special_tokens), "config key 'special_tokens' has an empty token")
    _need(all(t.strip() for t in cfg.special_tokens), "config key 'special_tokens' has a token "
          "of whitespace only (it would cut every such run out of the text)")
    _need(len(set(cfg.special_tokens)) == len(cfg.special_tokens),
          "config key 'special_tokens' has duplicates")
    _check_special_tokens(cfg)


def _check_numbers(cfg: Config) -> None:
    """The numeric keys' ranges."""
    _need(cfg.min_pair_count >= 1, "config key 'min_pair_count' must be >= 1")
    _need(cfg.max_token_bytes == 0 or cfg.max_token_bytes >= 2, "config key 'max_token_bytes' "
          "must be 0 (no limit) or >= 2 (a merge makes a token of 2 bytes or more)")
    _need(cfg.shuffle_partitions >= 0, "config key 'shuffle_partitions' must be >= 0 (0 = "
          "Spark's setting)")
    _need(cfg.report_sample_rows >= 0, "config key 'report_sample_rows' must be >= 0")
    _need(cfg.max_word_bytes >= 0, "config key 'max_word_bytes' must be >= 0 (0 = no cap)")
    _need(cfg.max_batch >= 1, "config key 'max_batch' must be >= 1")
    _need(cfg.driver_budget_mb >= 0, "config key 'driver_budget_mb' must be >= 0 (0 = derived "
          "from the memory the driver has)")
    _need(cfg.num_partitions >= 0, "config key 'num_partitions' must be >= 0")
    _need(cfg.checkpoint_every_merges >= 1,
          "config key 'checkpoint_every_merges' must be >= 1")
    for key in ("checkpoint_every_seconds", "lease_timeout_seconds", "heartbeat_seconds"):
        _need(MIN_SECONDS <= getattr(cfg, key) <= MAX_SECONDS,  # (a thread's wait past the
              f"config key '{key}' must be a number of seconds from {MIN_SECONDS} to "
              f"{MAX_SECONDS:.0e}")  # top overflows; near 0 it spins)
    for key in ("shuffle_partitions", "num_partitions", "report_sample_rows"):
        _need(getattr(cfg, key) <= JAVA_INT_MAX,  # (Spark takes them as a Java int)
              f"config key '{key}' must be at most {JAVA_INT_MAX}")


def _check_merges_wanted(cfg: Config) -> None:
    """train: exactly one of vocab_size and num_merges, and one that leaves merges to make."""
    _need(cfg.vocab_size >= 0, "config key 'vocab_size' must be >= 0 (0 = use num_merges)")
    _need(cfg.num_merges >= 0, "config key 'num_merges' must be >= 0 (0 = use vocab_size)")
    _need(cfg.vocab_size > 0 or cfg.num_merges > 0,
          "config key 'vocab_size': set --vocab-size N or --num-merges N")
    _need(not (cfg.vocab_size and cfg.num_merges),
          "config keys 'vocab_size' and 'num_merges' are both set: give only one")
    if cfg.vocab_size and cfg.alphabet == "bytes":
        floor = 256 + len(cfg.special_tokens)
        _need(cfg.vocab_size > floor,
              f"config key 'vocab_size' = {cfg.vocab_size} leaves no merges: it must be more "
              f"than 256 bytes + {len(cfg.special_tokens)} special tokens = {floor}")
    if cfg.vocab_size and cfg.alphabet == "chars":  # (its characters: known once counted)
        suffix = int(bool(cfg.end_of_word_suffix))
        floor = 1 + suffix + len(cfg.special_tokens)
        _need(cfg.vocab_size > floor,
              f"config key 'vocab_size' = {cfg.vocab_size} leaves no merges: it must be more "
              f"than 1 character{' + 1 suffix' * suffix} + {len(cfg.special_tokens)} special "
              f"tokens = {floor}")
