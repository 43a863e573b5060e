"""Config: precedence, types, and validation before any Spark work."""

from __future__ import annotations

import json
import logging
import os
import re
import sys

import pytest

from pipeline.config import Config, ConfigError, resolve, resolve_with_notes, validate

from .conftest import REPO


def cfg(*argv: str):
    return resolve(list(argv))


def test_defaults_come_from_conf_default_toml():
    c = cfg()
    assert c.input == str(REPO / "data" / "sample") and c.vocab_size == 4096
    assert c.pattern == "cl100k"
    assert c.special_tokens == ["<|endoftext|>"]
    validate(c, "train")


def test_command_line_wins_over_files(tmp_path):
    f = tmp_path / "x.toml"
    f.write_text('[merges]\nvocab_size = 1000\nengine = "spark"\n[pretokenize]\nlowercase = true\n')
    c = cfg("--config", str(f), "--vocab-size", "32768", "--no-lowercase",
            "--special-tokens", "<a>,<b>")
    assert c.vocab_size == 32768 and c.engine == "spark" and c.lowercase is False
    assert c.special_tokens == ["<a>", "<b>"]
    assert cfg("--num-merges", "10").vocab_size == 0
    assert cfg("--words", "w", "--output", "o").input == ""


@pytest.mark.parametrize("argv,message", [
    (["--vocab-size", "abc"], "'vocab_size': expected int, got 'abc'"),
    (["--vocab-size", "200"], "'vocab_size' = 200 leaves no merges"),
    # 256 bytes + 1 special token = no merges
    (["--vocab-size", "257"], "'vocab_size' = 257 leaves no merges: it must be more than 256 "
                              "bytes + 1 special tokens = 257"),
    (["--pattern", "(unclosed"], "'pattern': pattern '(unclosed' does not compile"),
    (["--engine", "gpu"], "'engine' must be one of ('auto', 'spark', 'local'), not 'gpu'"),
    (["--normalization", "NFX"], "'normalization' must be one of"),
    (["--alphabet", "words"], "'alphabet' must be one of ('bytes', 'chars'), not 'words'"),
    (["--end-of-word-suffix", "</w>"], "'end_of_word_suffix' needs alphabet = 'chars'"),
    (["--min-pair-count", "0"], "'min_pair_count' must be >= 1"),
    (["--input", "/definitely/not/here", "--output", "o"],
     "'input': path does not exist: /definitely/not/here"),
    (["--output", "o", "--report-sample", "/definitely/not/held-out.parquet"],
     "'report_sample': path does not exist: /definitely/not/held-out.parquet"),
    (["--resume", "maybe"], "'resume' must be one of ('auto', 'never'), not 'maybe'"),
    (["--special-tokens", "<a>,<a>"], "'special_tokens' has duplicates"),
])
def test_invalid_values_name_the_key_and_the_reason(argv, message):
    with pytest.raises(ConfigError, match="^config key " + re.escape(message)):
        validate(cfg(*argv), "train")


def test_unknown_key_in_file(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("vocab_sise = 3\n")
    with pytest.raises(ConfigError, match="unknown config key 'vocab_sise'"):
        cfg("--config", str(f))


def test_input_xor_words():
    with pytest.raises(ConfigError, match="config keys 'input' and 'words': give exactly one"):
        validate(cfg("--words", "data/sample", "--input", "data/sample", "--output", "o"),
                 "train")


def test_web_ui_defaults_to_on_for_clusters_only():
    from pipeline.spark_session import web_ui_enabled

    assert not web_ui_enabled("auto", "local[2]")
    assert not web_ui_enabled("auto", "local-cluster[2,1,1024]")
    assert web_ui_enabled("auto", "spark://127.0.0.1:7077") and web_ui_enabled("auto", "yarn")
    assert web_ui_enabled("on", "local[*]") and not web_ui_enabled("off", "yarn")
    with pytest.raises(ConfigError, match="spark_ui"):
        validate(cfg("--spark-ui", "maybe"), "train")


def test_a_run_with_its_own_input_needs_its_own_output():
    """A scheduled run that forgets --output must not write into the sample run."""
    for argv in (["--input", "data/sample"], ["--words", "w"], ["--input-table", "t"]):
        with pytest.raises(ConfigError, match="config key 'output': give --output"):
            cfg(*argv)
    assert cfg("--input", "data/sample", "--output", "x").output == "x"
    assert cfg().output == str(REPO / "out" / "sample-run")  # the quick start itself


def test_the_sample_runs_settings_apply_to_the_sample_run_only():
    """conf/default.toml's vocabulary and corpus are the quick start's: a run on its own
    corpus must give its own vocabulary size, and --input-table or --words is not mixed with
    the sample's --input."""
    sample = cfg("--output", "x", "--lowercase")  # still the sample run, elsewhere
    assert (sample.input, sample.vocab_size) == (str(REPO / "data" / "sample"), 4096)
    # ... and its log says so (a scheduled run whose --input got lost must not pass unseen)
    from pipeline.config import resolve_with_notes

    notes = resolve_with_notes(["--output", "x"])[1]
    assert notes == [f"no --input, --input-table or --words given: this run trains the shipped "
                     f"sample corpus ({REPO / 'data' / 'sample'}) into x"]
    assert resolve_with_notes([])[1] == []  # (the quick start's bare run: no note)
    for own in (["--input", "data/sample"], ["--input-table", "db.docs"], ["--words", "conf"]):
        c = cfg(*own, "--output", "x")
        assert c.vocab_size == 0 and c.num_merges == 0
        with pytest.raises(ConfigError, match="config key 'vocab_size': set --vocab-size N"):
            validate(c, "train")
    table = validate(cfg("--input-table", "db.docs", "--output", "x", "--vocab-size", "300"),
                     "train")
    assert (table.input, table.input_table, table.vocab_size) == ("", "db.docs", 300)


def test_only_training_defaults_to_the_sample_run():
    """A bare count_words or encode has no input or output (it must not write a word table or
    an encoded corpus over the sample run); ``--help`` shows the defaults each job really uses."""
    from pipeline.config import build_parser

    for job in ("count", "encode"):
        c = resolve([], job=job)
        assert c.input == "" and c.output == ""
        with pytest.raises(ConfigError, match="--output DIR"):  # (no default output)
            validate(c, job)
    train = " ".join(build_parser("train", "train").format_help().split())
    count = " ".join(build_parser("count", "count").format_help().split())
    assert "(default: 4096, the sample run's, conf/default.toml: a run on its own corpus must " \
        "set it)" in train and "(default: 'data/sample', the sample run's" in train
    assert "(default: 2)" in train  # --min-pair-count: a built-in default, said plainly
    assert "(default: 'data/sample')" not in count


def test_each_job_takes_its_own_flags_and_shows_defaults(capsys):
    from pipeline.config import build_parser

    encode = build_parser("encode", "encode").format_help()
    train = build_parser("train", "train").format_help()
    count = build_parser("count", "count").format_help()
    assert "--vocab-size" not in encode and "--tokenizer" in encode
    assert "--tokenizer" not in train and "--vocab-size" in train and "--words" in train
    assert "--vocab-size" not in count and "--max-word-bytes" in count
    assert "(default: 'auto'); one of auto, spark, local" in " ".join(train.split())
    for job in ("count", "encode", "train"):  # every job holds the lease of its output
        assert resolve(["--lease-timeout-seconds", "7"], job=job).lease_timeout_seconds == 7
    with pytest.raises(SystemExit) as ex:
        resolve(["--vocab-size", "300", "--output", "o"], job="encode")
    err = capsys.readouterr().err  # one line, as every config error
    assert ex.value.code == 2 and err.startswith("error: unrecognized arguments: --vocab-size")
    assert err.count("\n") == 1, err
    with pytest.raises(SystemExit) as ex:  # an abbreviation is not a flag
        resolve(["--vocab", "300", "--output", "o"])
    err = capsys.readouterr().err
    assert ex.value.code == 2 and err.startswith("error: unrecognized arguments: --vocab 300")
    with pytest.raises(SystemExit) as ex:
        resolve(["--output"])
    err = capsys.readouterr().err
    assert ex.value.code == 2 and err.count("\n") == 1 and err.startswith("error: argument "
                                                                           "--output"), err
    with pytest.raises(SystemExit) as ex:
        resolve(["--version"])
    assert ex.value.code == 0 and capsys.readouterr().out.startswith("spark-bpe 0.")


def test_a_config_file_shared_by_jobs_says_which_keys_a_job_ignores(tmp_path, caplog):
    """One file may serve train and encode: encode takes its ``text_column`` and ignores
    ``vocab_size`` and ``engine``, and its log says so (an unknown key is still an error)."""
    import logging

    from pipeline.cli import run_job
    from pipeline.config import resolve_with_notes

    f = tmp_path / "shared.toml"
    f.write_text('text_column = "body"\nvocab_size = 1000\nengine = "local"\n')
    c, notes = resolve_with_notes(["--config", str(f), "--output", "o"], job="encode")
    assert c.text_column == "body"
    assert notes == [f"--config {f}: not encode settings, ignored: engine, vocab_size"]
    assert not any("not train settings" in n for n in resolve_with_notes(
        ["--config", str(f), "--output", "o"], job="train")[1])
    seen = []
    with caplog.at_level(logging.INFO, logger="pipeline"):
        assert run_job("encode", "encode", seen.append,
                       ["--config", str(f), "--input", str(REPO / "data" / "sample"),
                        "--tokenizer", "t", "--output", str(tmp_path / "o")]) == 0
    assert seen and any(notes[0] in r.getMessage() for r in caplog.records)
    # an ignored key is neither applied nor validated: train's weights for two sources do
    # not stop an encode of one
    f.write_text('input = "a.parquet,b.parquet"\ninput_weights = [1, 3]\nvocab_size = 1000\n')
    c, notes = resolve_with_notes(["--config", str(f), "--input", str(REPO / "data" / "sample"),
                                   "--tokenizer", "t", "--output", "o"], job="encode")
    assert notes == [f"--config {f}: not encode settings, ignored: input_weights, vocab_size"]
    assert (c.input_weights, c.vocab_size) == (Config().input_weights, Config().vocab_size)
    assert validate(c, "encode") is c
    f.write_text("vocab_sise = 1000\n")
    with pytest.raises(ConfigError, match="unknown config key 'vocab_sise'"):
        resolve_with_notes(["--config", str(f), "--output", "o"], job="encode")


def test_defaults_live_in_one_place():
    """conf/default.toml holds only the sample run's settings; every other default is in
    Config; the cluster file names only known keys."""
    from pipeline.config import DEFAULT_CONFIG, Config, load_toml

    assert set(load_toml(DEFAULT_CONFIG)) == {"input", "output", "vocab_size"}
    cluster = load_toml(DEFAULT_CONFIG.parent / "cluster.toml")
    assert set(cluster) <= set(Config.__dataclass_fields__)
    assert cluster["progress_bar"] is False and Config().progress_bar is True
    # every key it sets differs from the default: a placeholder set to the default ("" for
    # checkpoint_dir) wiped what an earlier --config file had set
    assert all(v != getattr(Config(), k) for k, v in cluster.items()), cluster


def test_a_section_named_after_a_job_is_refused(tmp_path):
    """Sections are for readability and apply to every job: [encode] num_partitions = 8
    in a shared file silently set the train job's partitions too."""
    shared = tmp_path / "shared.toml"
    shared.write_text("[train]\nvocab_size = 1000\n[encode]\nnum_partitions = 8\n")
    with pytest.raises(ConfigError, match=r"section \[train\]: sections are only for "
                                          "readability and apply to every job"):
        resolve_with_notes(["--config", str(shared)], job="train")
    ok = tmp_path / "ok.toml"
    ok.write_text("[merges]\nvocab_size = 1000\n")
    assert resolve_with_notes(["--config", str(ok), "--output", "o", "--input", "x"],
                              job="train")[0].vocab_size == 1000


def test_input_weights_match_the_sources():
    c = cfg("--input", "data/sample,data/sample", "--input-weights", "3,1", "--output", "o",
            "--vocab-size", "300")
    assert c.inputs == ["data/sample", "data/sample"] and c.input_weights == [3, 1]
    validate(c, "train")
    with pytest.raises(ConfigError, match="1 weights for 2 input sources"):
        validate(cfg("--input", "data/sample,data/sample", "--input-weights", "3",
                     "--output", "o"), "train")
    for bad in ("0", "1000001", str(2**62)):  # (a huge weight wrapped the 64-bit counts)
        with pytest.raises(ConfigError, match="integers from 1 to 1,000,000"):
            validate(cfg("--input", "data/sample", "--input-weights", bad, "--output", "o"),
                     "train")
    validate(cfg("--input", "data/sample", "--input-weights", "1000000", "--output", "o",
                 "--vocab-size", "300"), "train")
    with pytest.raises(ConfigError, match="weights apply to the --input sources .* not to "
                                          "--words"):
        validate(cfg("--words", "w.tsv", "--input-weights", "2", "--output", "o",
                     "--vocab-size", "300"), "train")


def test_the_arrow_count_reader_refuses_what_only_spark_reads(tmp_path):
    """count_reader = arrow reads Parquet files with pyarrow: with JSON, a catalog table or
    a DataFrame it was silently Spark's reader (the help says "else an error")."""
    from pipeline.config import unused_with_words

    base = ("--output", "o", "--vocab-size", "300", "--count-reader", "arrow")
    validate(cfg("--input", "data/sample", *base), "train")
    for extra, said in ((("--input", "data/sample", "--input-format", "json"),
                         "--input-format json"),
                        (("--input-table", "db.docs"), "--input-table db.docs")):
        with pytest.raises(ConfigError, match=f"^config key 'count_reader' = 'arrow' reads "
                                              f"Parquet files with pyarrow; {said} is read by "
                                              "Spark's reader: use 'auto' or 'spark'"):
            validate(cfg(*extra, *base), "count")
    with pytest.raises(ConfigError, match="; a DataFrame is read by Spark's reader"):
        validate(Config(output="o", count_reader="arrow"), "count", frame=True)
    (tmp_path / "w.tsv").write_text("a\t1\n")
    words = cfg("--words", str(tmp_path / "w.tsv"), *base, "--text-column", "body")
    validate(words, "train")  # (not read: only said, by the run, to be unused)
    assert unused_with_words(words) == ["text_column", "count_reader"]
    assert unused_with_words(cfg("--input", "data/sample", *base)) == []
    sampled = cfg("--words", str(tmp_path / "w.tsv"), *base, "--text-column", "body",
                  "--report-sample", "data/sample")  # (the sample is read with text_column)
    assert unused_with_words(sampled) == ["count_reader"]


def test_a_hadoop_brace_glob_is_one_source():
    """Commas inside a glob's braces belong to the glob (Hadoop's ``{a,b}``), not to the
    list of sources; a brace glob is not checked as a literal path."""
    c = cfg("--input", "data/sample/part-0000{0,1}.parquet, data/{sample,x{y,z}}/*",
            "--input-weights", "2,1", "--output", "o", "--vocab-size", "300")
    assert c.inputs == ["data/sample/part-0000{0,1}.parquet", "data/{sample,x{y,z}}/*"]
    validate(c, "train")
    assert Config(input="a,b ,,c").inputs == ["a", "b", "c"]


def test_each_config_file_and_the_flags_replace_exclusive_keys_of_the_layers_before(tmp_path):
    """A later layer (a --config file, then the flags) that names num_merges drops an earlier
    vocab_size, and one that names a corpus drops an earlier other corpus, as flags always did."""
    merges = tmp_path / "merges.toml"
    merges.write_text("num_merges = 500\n")
    vocab = tmp_path / "vocab.toml"
    vocab.write_text("vocab_size = 300\n")
    c = validate(cfg("--config", str(vocab), "--config", str(merges), "--input",
                     str(REPO / "data" / "sample"), "--output", "o"), "train")
    assert (c.vocab_size, c.num_merges) == (0, 500)
    # a run configured with a file names its corpus: the sample run is the bare command's
    # (a site file without one trained the sample into out/sample-run, silently)
    with pytest.raises(ConfigError, match=r"^give --input PATH \(or --words DIR\) and "
                                          r"--output DIR"):
        validate(cfg("--config", str(merges)), "train")
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('vocab_size = 32768\ninput = "data/sample"\noutput = "o"\n')
    c = validate(cfg("--config", str(cluster), "--config", str(merges)), "train")
    assert (c.vocab_size, c.num_merges) == (0, 500)
    table = tmp_path / "table.toml"
    table.write_text('input_table = "db.docs"\n')
    c = validate(cfg("--config", str(cluster), "--config", str(table)), "train")
    assert (c.input, c.input_table) == ("", "db.docs")
    c = validate(cfg("--config", str(table), "--words", "conf", "--output", "o",
                     "--vocab-size", "300"), "train")
    assert (c.input_table, c.words) == ("", "conf")
    c = validate(cfg("--config", str(cluster), "--input-table", "db.docs"), "train")
    assert (c.input, c.input_table) == ("", "db.docs")
    # a weighted mix replaced by another corpus takes its weights with it (it was an error)
    mix = tmp_path / "mix.toml"
    mix.write_text('input = "a,b"\ninput_weights = [3, 1]\noutput = "o"\nvocab_size = 300\n')
    for d in "cd":
        (tmp_path / d).mkdir()
    c_d = f"{tmp_path / 'c'},{tmp_path / 'd'}"
    for corpus in (["--words", "conf"], ["--input", str(tmp_path / "c")],
                   ["--input-table", "db.docs"], ["--input", c_d]):
        c = validate(cfg("--config", str(mix), *corpus), "train")
        assert c.input_weights == [], corpus
    assert validate(cfg("--config", str(mix), "--input", c_d, "--input-weights", "1,5"),
                    "train").input_weights == [1, 5]
    # weights given without a corpus apply to the one named later (file or flags)
    weights = tmp_path / "w.toml"
    weights.write_text("input_weights = [3, 1]\n")
    c = validate(cfg("--config", str(weights), "--input", c_d, "--output", "o",
                     "--vocab-size", "300"), "train")
    assert c.input_weights == [3, 1]
    paths = tmp_path / "paths.toml"
    paths.write_text(f'input = "{c_d}"\noutput = "o"\nvocab_size = 300\n')
    assert validate(cfg("--config", str(weights), "--config", str(paths)),
                    "train").input_weights == [3, 1]


@pytest.mark.parametrize("text,message", [
    ("vocab_size = 4096.9\n", "config key 'vocab_size': expected int, got 4096.9"),
    ("max_batch = 2.5\n", "config key 'max_batch': expected int"),
    ("input_weights = [1.7]\n", "config key 'input_weights': expected list[int]"),
    ("input_weights = [true]\n", "config key 'input_weights': expected list[int]"),
    ("checkpoint_every_seconds = true\n", "config key 'checkpoint_every_seconds': expected "
                                          "float, got True"),
    ("lowercase = 1\n", "config key 'lowercase': expected bool, got 1"),
])
def test_a_float_or_boolean_for_an_integer_key_is_refused_not_truncated(tmp_path, text, message):
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        cfg("--config", str(f))


@pytest.mark.parametrize("argv,message", [
    (["--num-merges", "-5"], "config key 'num_merges' must be >= 0"),
    (["--vocab-size", "-5"], "config key 'vocab_size' must be >= 0"),
    (["--input", " , ", "--output", "o", "--vocab-size", "300"], "config key 'input': no path"),
    (["--pattern", ""], "config key 'pattern' is empty"),
    (["--max-token-bytes", "1"], "config key 'max_token_bytes' must be 0 (no limit) or >= 2"),
    (["--shuffle-partitions", "-3"], "config key 'shuffle_partitions' must be >= 0"),
    (["--report-sample-rows", "-3"], "config key 'report_sample_rows' must be >= 0"),
    (["--heartbeat-seconds", "inf"],
     "config key 'heartbeat_seconds' must be a number of seconds from 0.01"),
    (["--lease-timeout-seconds", "nan"], "config key 'lease_timeout_seconds' must be a number"),
])
def test_out_of_range_values_are_one_config_error(argv, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(cfg(*argv), "train")


def test_a_config_file_that_cannot_be_read_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="config file .* cannot be read: Is a directory"):
        cfg("--config", str(tmp_path))
    latin = tmp_path / "latin1.toml"
    latin.write_bytes('pattern = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="is not valid TOML: not UTF-8 text"):
        cfg("--config", str(latin))


def test_choices_in_any_case_and_toml_tables_that_are_not_sections(tmp_path):
    c = cfg("--log-level", "debug", "--normalization", "nfc", "--engine", "LOCAL")
    assert (c.log_level, c.normalization, c.engine) == ("DEBUG", "NFC", "local")
    for text, message in [
        ('input = { path = "data/sample" }\n', "config key 'input' in .* takes a plain value"),
        ("[a]\nvocab_size = 1000\n[b]\nvocab_size = 2000\n", "'vocab_size' is set twice"),
        ("[spark.conf]\nx = 1\n", r"\[spark\] conf is a table"),
        ("[x]\ny = 1\n", r"unknown config key 'y' in section \[x\]$"),  # (it said 'y' only)
    ]:
        f = tmp_path / "c.toml"
        f.write_text(text)
        with pytest.raises(ConfigError, match=message):
            cfg("--config", str(f))


def test_an_output_that_overlaps_a_source_or_is_a_file_is_refused(tmp_path, monkeypatch):
    """Writing the output must never replace or add to what is read: not the input itself,
    not a directory holding it, not a place inside it that the readers would list (a name
    starting with _ or . is skipped by them, so it is allowed); not a file or under one."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "afile").write_text("x")

    def check(output, *inputs, words=""):
        argv = ["--input", ",".join(inputs)] if inputs else ["--words", words]
        validate(cfg(*argv, "--output", output, "--vocab-size", "300"), "train")

    for output, source in [("corpus", "corpus"), ("./corpus/", "corpus"), (".", "corpus"),
                           ("corpus/run", "corpus"), ("corpus", "corpus/*.parquet"),
                           ("corpus/x.parquet", "corpus/*.parquet"), ("y.parquet", "*.parquet"),
                           ("corpus/2024", "corpus/20*/*.parquet"),
                           (str(tmp_path / "corpus" / "x"), "corpus")]:
        with pytest.raises(ConfigError, match=f"^config key 'output': {re.escape(output)} "
                                              f"overlaps --input {re.escape(source)} "):
            check(output, source)
    check("corpus/_runs/r1", "corpus")  # hidden from the corpus readers
    check("corpus/run", "corpus/*.parquet")  # not a name the glob matches
    check(str(tmp_path / "out"), "*.parquet")  # a glob in the working directory
    check("shard-run", "shard-*.parquet")
    check("corpus/2024/run", "corpus/20*/*.parquet")
    check("corpus-run", "corpus")  # a sibling whose name starts the same
    (tmp_path / "link").symlink_to(tmp_path / "corpus")  # the corpus by another name
    for output, source in [("link/run", "corpus"), ("corpus/run", "link")]:
        with pytest.raises(ConfigError, match=f"^config key 'output': {output} overlaps "):
            check(output, source)
    for output in ("afile", "afile/run"):
        with pytest.raises(ConfigError, match=f"{tmp_path / 'afile'} is a file, not a dir"):
            check(output, "corpus")
    (tmp_path / "run" / "words").mkdir(parents=True)
    with pytest.raises(ConfigError, match="run/words/x is in --words run/words;"):
        check("run/words/x", words="run/words")
    check("run", words="run/words")  # a run's own table, read before it is written


def test_a_flag_given_twice_is_refused():
    """argparse keeps the last value: --input a --input b would train on b alone."""
    with pytest.raises(ConfigError, match=r"^--input is given more than once \(several "
                                          r"sources: one comma-separated --input a,b\)"):
        cfg("--input", "a", "--input", "b", "--output", "o", "--vocab-size", "300")
    with pytest.raises(ConfigError, match=r"^--progress-bar is given more than once"):
        cfg("--progress-bar", "--no-progress-bar")
    with pytest.raises(ConfigError, match=r"^--vocab-size is given more than once"):
        cfg("--vocab-size=300", "--vocab-size", "400")
    cfg("--input", "a,b", "--output", "o", "--vocab-size", "300")  # once is fine


def test_the_api_logs_where_a_notebook_sees_it(monkeypatch):
    """Without logging configured (a notebook), the API's log lines go to stderr at
    log_level; a program's own logging is left alone, except for the level of ours."""
    import logging

    from pipeline import api

    ours = logging.getLogger("pipeline")
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "level", logging.NOTSET)
    api._config("count", "data/sample", {"output": "out/x"})
    assert [type(h).__name__ for h in ours.handlers] == ["BarAwareHandler"]
    assert ours.level == logging.INFO
    api._config("count", "data/sample", {"output": "out/x", "log_level": "WARNING"})
    assert len(ours.handlers) == 1 and ours.level == logging.WARNING
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.NullHandler()])
    api._config("count", "data/sample", {"output": "out/x"})
    assert ours.handlers == []  # the program's own logging is kept
    # a level the program set on ours (no handler): kept, where it was reset to INFO
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    ours.setLevel(logging.WARNING)
    api._config("count", "data/sample", {"output": "out/x"})
    assert ours.level == logging.WARNING and len(ours.handlers) == 1


def test_the_api_takes_path_objects_and_names_a_wrong_session(tmp_path):
    """pathlib.Path for the corpus, paths in a list and path options (it said the corpus must
    be a path, not PosixPath); spark= that is not a session is one ConfigError (it was an
    AttributeError); a task whose Python lacks our modules is one line naming the fix."""
    from pathlib import Path

    from pipeline import api
    from pipeline.spark_session import worker_python_failure

    cfg, _ = api._config("count", Path("data/sample"), {"output": tmp_path / "w"})
    assert cfg.input == str(REPO / "data" / "sample") and cfg.output == str(tmp_path / "w")
    cfg, _ = api._config("count", [Path("data/sample"), "data/sample"],
                         {"output": tmp_path / "w"})
    assert len(cfg.inputs) == 2
    with pytest.raises(ConfigError, match=r"^spark= must be a SparkSession .* not 'local'"):
        api.count_words("data/sample", output=str(tmp_path / "w"), spark="local")
    failed = RuntimeError("An exception was thrown from the Python worker. Please see the "
                          "stack trace below.\nTraceback (most recent call last):\n  File "
                          "\"x.py\"\nModuleNotFoundError: No module named 'pipeline'")
    assert worker_python_failure(failed).startswith(
        "the Spark workers' Python cannot import 'pipeline': run them with the Python that "
        "has spark-bpe and its dependencies (PYSPARK_PYTHON or spark.pyspark.python")
    assert worker_python_failure(RuntimeError("No module named 'x' (not a worker's)")) == ""
    from types import SimpleNamespace

    session = SimpleNamespace(sparkContext=SimpleNamespace(master="local[2]"))
    with pytest.raises(ConfigError, match="^the Spark workers' Python cannot import "
                                          "'pipeline'"), \
            api._session(Config(), session, "test", {}):
        raise failed


def test_the_saved_and_logged_config_holds_the_jobs_own_keys(caplog):
    """A run, a word table and an encoded corpus save (and the jobs and the API log) the
    settings of their job only: another job's key did not apply, whatever its value."""
    import logging

    from pipeline import api
    from pipeline.config import COUNT, ENCODE, TRAIN, job_keys

    c = Config(vocab_size=500, pattern="gpt2", tokenizer="out/run")
    for job in (TRAIN, COUNT, ENCODE):
        assert set(json.loads(c.to_json(job))) == job_keys(job)
    assert "pattern" not in json.loads(c.to_json(ENCODE))  # encode uses the tokenizer's
    assert json.loads(c.to_json(TRAIN))["vocab_size"] == 500
    assert "tokenizer" not in json.loads(c.to_json(TRAIN))
    assert "\n" not in c.to_json(COUNT, indent=None)  # one log line
    with caplog.at_level(logging.INFO, logger="pipeline.api"):
        api._config(COUNT, "data/sample", {"output": "out/x", "pattern": "gpt2"})
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("count config: ")]
    assert len(logged) == 1
    assert json.loads(logged[0].removeprefix("count config: "))["pattern"] == "gpt2"


def test_the_api_never_mixes_a_progress_bar_into_log_lines(monkeypatch):
    """A program without logging gets our lines through the handler that clears the bar
    around each one; a program whose own handler writes to stderr gets no bar; one that
    logs to a file keeps the bar (on a terminal)."""
    import io
    import logging

    from pipeline import api
    from pipeline.config import COUNT
    from pipeline.progress import BarAwareHandler

    root, ours = logging.getLogger(), logging.getLogger("pipeline")
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(ours, "handlers", [])
    cfg, _ = api._config(COUNT, "data/sample", {"output": "out/x"})
    assert cfg.progress_bar and [type(h) for h in ours.handlers] == [BarAwareHandler]
    for stream, bar in ((sys.stderr, False), (io.StringIO(), True)):
        monkeypatch.setattr(ours, "handlers", [])
        monkeypatch.setattr(root, "handlers", [logging.StreamHandler(stream)])
        cfg, _ = api._config(COUNT, "data/sample", {"output": "out/x"})
        assert cfg.progress_bar is bar and not ours.handlers


def test_py4j_tracebacks_of_an_interrupted_call_stay_out_of_the_log():
    """py4j logs a SIGTERM'd call with a traceback through the root logger: dropped by our
    handler (the job's last line says it was terminated); other py4j errors stay."""
    import logging

    from pipeline.cli import _not_py4j_interrupt

    def record(msg: str, path: str) -> logging.LogRecord:
        return logging.LogRecord("root", logging.ERROR, path, 1, msg, None, None)

    gateway = "/x/site-packages/py4j/java_gateway.py"
    assert not _not_py4j_interrupt(record("KeyboardInterrupt while sending command.", gateway))
    assert _not_py4j_interrupt(record("Exception while sending command.", gateway))
    assert _not_py4j_interrupt(record("KeyboardInterrupt while sending command.", "/app.py"))


@pytest.mark.parametrize("master,set_here", [("local[2]", True), ("local", True),
                                             ("local-cluster[2,1,1024]", True),
                                             ("spark://10.0.0.1:7077", False), ("yarn", False),
                                             ("k8s://https://api:6443", False)])
def test_the_driver_python_is_the_workers_default_only_on_this_machine(monkeypatch, master,
                                                                        set_here):
    import sys

    from pipeline.spark_session import default_worker_python

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    default_worker_python(master)
    assert (os.environ.get("PYSPARK_PYTHON") == sys.executable) is set_here
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python")  # the user's choice always stays
    default_worker_python(master)
    assert os.environ["PYSPARK_PYTHON"] == "/opt/python"


def test_the_tiktoken_name_is_the_run_directory_s_whatever_the_path_says(tmp_path,
                                                                         monkeypatch):
    """Two runs must not share a tiktoken name: ".", "run/." and "x/.." name the directory
    they mean, not a dot; a user's --name wins."""
    import dataclasses

    from pipeline.run_dir import tokenizer_name

    (tmp_path / "nightly" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "nightly")

    def named(output: str, name: str = "") -> str:
        return tokenizer_name(dataclasses.replace(Config(), output=output, name=name))

    for output in (".", "./", str(tmp_path / "nightly" / "."), "sub/..", "file:."):
        assert named(output) == "spark-bpe-nightly", output
    assert named("sub") == named("sub/") == named("s3a://bucket/runs/sub") == "spark-bpe-sub"
    assert named("out/a run+x") == "spark-bpe-a-run-x"
    assert named(".", "team-bpe") == "team-bpe"


def test_a_progress_file_goes_where_nothing_read_or_replaced_lies(tmp_path):
    """--progress-file: a file outside the inputs and outside the output the job replaces
    (RUN/progress.jsonl, where a run writes it anyway, is allowed)."""
    (tmp_path / "corpus").mkdir()
    (tmp_path / "dash").mkdir()
    base = ["--input", str(tmp_path / "corpus"), "--vocab-size", "300"]
    run = tmp_path / "run"
    for job in ("count", "train"):
        ok = validate(cfg(*base, "--output", str(run), "--progress-file",
                          str(tmp_path / "dash" / "p.jsonl")), job)
        assert ok.progress_file == str(tmp_path / "dash" / "p.jsonl")
    assert validate(cfg(*base, "--output", str(run), "--progress-file",
                        str(run / "progress.jsonl")), "train")
    bad = {str(run / "progress.jsonl"): ("count", "inside --output"),
           str(run / "x" / "p.jsonl"): ("train", "inside --output"),
           str(tmp_path / "corpus" / "p.jsonl"): ("train", "inside --input"),
           str(tmp_path / "dash"): ("count", "is a directory"),
           str(tmp_path / "dash") + "/": ("count", "not a file name")}
    for path, (job, why) in bad.items():
        with pytest.raises(ConfigError, match=f"config key 'progress_file': .*{why}"):
            validate(cfg(*base, "--output", str(run), "--progress-file", path), job)


def test_checkpoints_go_outside_what_the_run_reads_and_its_word_table(tmp_path):
    """A checkpoint directory inside the corpus would be read as corpus by the next run (a
    scheduler's retry fails for ever); inside the report sample or the word table (which a
    count replaces whole, lease and all) it is lost. All refused before Spark starts, as is a
    progress file on the report sample or among the checkpoints."""
    (tmp_path / "corpus").mkdir()
    (tmp_path / "held.parquet").write_bytes(b"PAR1")
    run = tmp_path / "run"
    base = ["--input", str(tmp_path / "corpus"), "--output", str(run), "--vocab-size", "300",
            "--report-sample", str(tmp_path / "held.parquet")]
    ok = validate(cfg(*base, "--checkpoint-dir", str(tmp_path / "ck")), "train")
    assert ok.checkpoint_dir == str(tmp_path / "ck")
    assert validate(cfg(*base, "--checkpoint-dir", str(run / "ck")), "train")  # (its own)
    bad = {("--checkpoint-dir", str(tmp_path / "corpus" / "ck")): "checkpoint_dir': .*inside "
           "--input",
           ("--checkpoint-dir", str(run / "words" / "ck")): "checkpoint_dir': .*inside the "
           "word table",
           ("--progress-file", str(tmp_path / "held.parquet")): "progress_file': .*inside "
           "--report-sample",
           ("--progress-file", str(tmp_path / "ck" / "p.jsonl")): "progress_file': .*inside "
           "--checkpoint-dir"}
    for (flag, path), why in bad.items():
        ck = [] if flag == "--checkpoint-dir" else ["--checkpoint-dir", str(tmp_path / "ck")]
        with pytest.raises(ConfigError, match=f"config key '{why}"):
            validate(cfg(*base, *ck, flag, path), "train")
    # the run directory itself (every rerun then refused the directory as not a run's),
    # and a file (found only when the first checkpoint was written, with a traceback)
    (tmp_path / "ck-file").write_text("x")
    for path, why in ((run, "is the run directory itself"), (f"{run}/", "is the run "
                      "directory itself"), (tmp_path / "ck-file", "is a file, not a directory"),
                      (tmp_path / "ck-file" / "a" / "b", "is under .*ck-file, which is a file")):
        with pytest.raises(ConfigError, match=f"config key 'checkpoint_dir': .*{why}"):
            validate(cfg(*base, "--checkpoint-dir", str(path)), "train")
    for name in ("ck[1]", "ck*"):  # (a glob character is part of a directory's name here)
        assert validate(cfg(*base, "--checkpoint-dir", str(run / name)), "train")
    words = tmp_path / "words"
    words.mkdir()
    with pytest.raises(ConfigError, match="checkpoint_dir.: .* is inside --words"):
        validate(cfg("--words", str(words), "--output", str(run), "--vocab-size", "300",
                     "--checkpoint-dir", str(words / "ck")), "train")


def test_checkpoints_and_progress_may_go_where_the_readers_do_not_look(tmp_path):
    """Beside the files a glob reads, or under a name the readers skip (``_x``, ``.x``): as
    for --output. An external --words is copied into RUN/words, so checkpoints may not go
    there either."""
    (tmp_path / "corpus").mkdir()
    glob = str(tmp_path / "corpus" / "*.parquet")
    run = tmp_path / "run"
    for inp, place in ((glob, tmp_path / "corpus" / "ckpt"),
                       (str(tmp_path / "corpus"), tmp_path / "corpus" / "_ckpt"),
                       (str(tmp_path / "corpus"), tmp_path / "corpus" / ".ck")):
        base = ["--input", inp, "--output", str(run), "--vocab-size", "300"]
        assert validate(cfg(*base, "--checkpoint-dir", str(place)), "train")
        assert validate(cfg(*base, "--progress-file", str(place / "p.jsonl")), "count")
    with pytest.raises(ConfigError, match="checkpoint_dir.: .* is inside --input"):
        validate(cfg("--input", glob, "--output", str(run), "--vocab-size", "300",
                     "--checkpoint-dir", str(tmp_path / "corpus" / "x.parquet")), "train")
    (tmp_path / "w.tsv").write_text("a\t1\n")
    with pytest.raises(ConfigError, match="checkpoint_dir.: .* is inside the word table "
                                          f"{run}/words"):
        validate(cfg("--words", str(tmp_path / "w.tsv"), "--output", str(run), "--vocab-size",
                     "300", "--checkpoint-dir", str(run / "words" / "ck")), "train")


def test_the_api_takes_the_corpus_once():
    """A positional corpus and input= (or words=, input_table=): the keyword won, unsaid."""
    from pipeline import api

    for key in ("input", "words", "input_table"):
        with pytest.raises(ConfigError, match=f"config key '{key}': the corpus is given twice"):
            api._config("train", "/data/a", {"output": "/tmp/o", "vocab_size": 300,
                                             key: "/data/b"})
    with pytest.raises(ConfigError, match="'words' is not a setting of encode"):
        api._config("encode", "/data/a", {"output": "/tmp/o", "words": "/data/b"})


def test_numpy_booleans_are_booleans():
    import numpy as np

    from pipeline.config import _coerce

    assert _coerce("lowercase", "bool", np.True_) is True
    assert _coerce("lowercase", "bool", np.bool_(False)) is False


def test_encode_refuses_to_repartition_a_text_input_before_spark():
    """A text input has only its text column, so the encode job keys it by where its rows
    were read and cannot repartition it: refused by the config check, not after Spark
    started (the same message the job gives for a JSON or CSV input found to have one
    column)."""
    args = ("--input", str(REPO / "data" / "sample"), "--tokenizer", "t", "--output", "o")
    text = resolve([*args, "--input-format", "text", "--num-partitions", "4"], job="encode")
    with pytest.raises(ConfigError, match="config key 'num_partitions': a text input whose "
                                          "only column is the text"):
        validate(text, "encode")
    validate(resolve([*args, "--input-format", "text"], job="encode"), "encode")
    validate(resolve([*args, "--input-format", "json", "--num-partitions", "4"], job="encode"),
             "encode")  # (JSON may have key columns: known once read)


def test_an_empty_item_in_a_list_flag_is_an_error_as_in_a_config_file(tmp_path):
    """``--special-tokens '<|a|>,'`` dropped the empty item and trained without a word; a
    config file's ``["<|a|>", ""]`` was an error. Both are errors now; an empty flag is still
    "none"."""
    base = ("--input", str(REPO / "data" / "sample"), "--output", "o", "--vocab-size", "300")
    for value in ("<|a|>,", ",", "<|a|>,,<|b|>"):
        with pytest.raises(ConfigError, match="^config key 'special_tokens' has an empty token$"):
            validate(resolve([*base, f"--special-tokens={value}"]), "train")
    f = tmp_path / "c.toml"
    f.write_text('special_tokens = ["<|a|>", ""]\n')
    with pytest.raises(ConfigError, match="^config key 'special_tokens' has an empty token$"):
        validate(resolve([*base, "--config", str(f)]), "train")
    assert validate(resolve([*base, "--special-tokens", ""]), "train").special_tokens == []
    enc = ("--input", str(REPO / "data" / "sample"), "--tokenizer", "t", "--output", "o")
    with pytest.raises(ConfigError, match="^config key 'key_columns' has an empty column name$"):
        validate(resolve([*enc, "--key-columns", "id,"], job="encode"), "encode")
    # the same for sources and weights ("$A,$B" with B unset)
    sample = str(REPO / "data" / "sample")
    with pytest.raises(ConfigError, match="^config key 'input' has an empty source"):
        validate(resolve(["--input", f"{sample},", "--output", "o", "--vocab-size", "300"]),
                 "train")
    with pytest.raises(ConfigError,
                       match=r"^config key 'input_weights': expected list\[int\], got '2,'"):
        resolve(["--input", sample, "--input-weights", "2,", "--output", "o"])
    two = validate(resolve(["--input", f"{sample}, {sample}", "--input-weights", " 2, 3",
                            "--output", "o", "--vocab-size", "300"]), "train")
    assert two.inputs == [sample, sample] and two.input_weights == [2, 3]


def test_a_toml_key_given_in_both_spellings_is_set_twice(tmp_path):
    """vocab_size and vocab-size are one key: given both ways in one file, the last one won
    unsaid (the same spelling twice was refused)."""
    f = tmp_path / "c.toml"
    f.write_text('vocab_size = 5000\n[merges]\nvocab-size = 300\n')
    with pytest.raises(ConfigError, match="config key 'vocab_size' and 'vocab-size' is set "
                                          "twice in"):
        resolve(["--config", str(f), "--input", "x", "--output", "o"])


def test_an_integer_key_takes_no_float_of_any_kind():
    """A float is never truncated into an integer key: numpy's float32 and a Decimal went
    through int() (4096.9 -> 4096); numpy's integers are integers."""
    from decimal import Decimal

    import numpy as np

    from pipeline.config import _coerce

    for value in (np.float32(4096.9), Decimal("4096.9"), np.float64(4096.0), 4096.9, True):
        with pytest.raises(ConfigError, match="config key 'vocab_size': expected int"):
            _coerce("vocab_size", "int", value)
    with pytest.raises(ConfigError, match="input_weights"):
        _coerce("input_weights", "list[int]", [np.float32(2.7), 1])
    assert _coerce("vocab_size", "int", np.int64(4096)) == 4096
    assert _coerce("input_weights", "list[int]", [np.int32(2), 1]) == [2, 1]


def test_the_api_refuses_an_empty_source_as_the_cli_does():
    """'a,' or 'a,,b' as the corpus: the API rebuilt the input from its non-empty sources
    before validating, and trained on the rest; the CLI's error is given."""
    from pipeline.api import _config

    sample = str(REPO / "data" / "sample")
    for corpus in (f"{sample},", f"{sample},,{sample}"):
        with pytest.raises(ConfigError, match="config key 'input' has an empty source"):
            _config("train", corpus, {"output": "o", "vocab_size": 300})


def test_a_file_that_cannot_be_read_is_not_called_a_write_failure(tmp_path, monkeypatch,
                                                                   capsys):
    """A permission error on reading (a run directory's run.json, say) said 'could not
    write ... make room or fix the permissions' with exit 1; it is a read, exit 2."""
    import errno

    from pipeline import cli

    target = tmp_path / "run.json"
    target.write_text("{}")
    real_access = os.access
    monkeypatch.setattr(cli.os, "access", lambda p, mode: False if str(p) == str(target)
                        else real_access(p, mode))  # (as root, every file is readable)

    def body(cfg):
        raise PermissionError(errno.EACCES, "Permission denied", str(target))

    code = cli.run_job("encode", "encode", body, ["--input", str(REPO / "data" / "sample"),
                                                  "--tokenizer", str(tmp_path),
                                                  "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"error: encode could not read {target}: Permission denied; fix its permissions" \
        in err
    assert "could not write" not in err


def test_a_nul_character_in_a_path_is_a_config_error(tmp_path):
    """A NUL in output, checkpoint_dir or progress_file reached os.path.realpath and ended
    the job with a ValueError traceback (exit 1); it is one config error."""
    for key in ("output", "checkpoint_dir", "progress_file"):
        values = {"input": str(REPO / "data" / "sample"), "output": str(tmp_path / "o"),
                  "vocab_size": 300, key: str(tmp_path / "a\0b")}
        with pytest.raises(ConfigError, match=f"config key '{key}' holds a NUL character"):
            validate(Config(**values), "train")


def test_every_missing_required_flag_is_named_at_once():
    """A bare encode said --output was missing, then --tokenizer, then --input: three tries.
    All that is missing is named in one error; one alone keeps its own message."""
    with pytest.raises(ConfigError, match=r"^give --tokenizer RUN_DIR, --input PATH and "
                                          r"--output DIR \(the job's --help"):
        validate(Config(), "encode")
    with pytest.raises(ConfigError, match=r"^give --input PATH and --output DIR "):
        validate(Config(), "count")
    with pytest.raises(ConfigError, match=r"^config key 'output': set an output directory"):
        validate(Config(input=str(REPO / "data" / "sample")), "count")
    # a corpus given, the rest not: named together too (it was --output, then the next one)
    sample = str(REPO / "data" / "sample")
    with pytest.raises(ConfigError, match=r"^config key 'output': give --output DIR and "
                                          r"--vocab-size N \(or --num-merges N\) with --input"):
        resolve(["--input", sample])
    with pytest.raises(ConfigError, match=r"^config key 'output': give --tokenizer RUN_DIR "
                                          r"and --output DIR with --input"):
        resolve(["--input", sample], job="encode")
    with pytest.raises(ConfigError, match=r"^config key 'output': give --output DIR with "):
        resolve(["--input", sample, "--vocab-size", "300"])


def test_a_saved_or_logged_config_says_where_its_relative_paths_were(tmp_path, monkeypatch):
    """config.json next to a run (and the config block a job logs) kept the paths as typed:
    "repo/data/sample", "runs/r" say nothing once the job's working directory is forgotten.
    Local paths come out absolute; URIs and settings that are not paths as given."""
    import json

    monkeypatch.chdir(tmp_path)
    c = Config(input="data/sample,s3a://lake/x/", output="runs/r", words="",
               report_sample="held.parquet", vocab_size=300)
    saved = json.loads(c.to_json("train"))
    assert saved["input"] == f"{tmp_path}/data/sample,s3a://lake/x/"
    assert saved["output"] == f"{tmp_path}/runs/r"
    assert saved["report_sample"] == f"{tmp_path}/held.parquet"
    assert saved["words"] == "" and saved["vocab_size"] == 300
    assert c.output == "runs/r"  # (the config itself is left as it is)


def test_a_catalog_table_takes_no_input_format():
    """--input-table T --input-format json was accepted and the format silently not used
    (the table is read as the table it is), while config.json said json."""
    validate(cfg("--input-table", "db.docs", "--output", "o", "--vocab-size", "300"), "train")
    with pytest.raises(ConfigError, match="config key 'input_format' = 'json': --input-table "
                                          "db.docs is read as the catalog table"):
        validate(cfg("--input-table", "db.docs", "--input-format", "json", "--output", "o",
                     "--vocab-size", "300"), "train")


def test_the_notes_on_settings_are_warnings(tmp_path, caplog):
    """The notes that another job's keys were ignored and that a run with no corpus trains
    the shipped sample were INFO lines: gone at --log-level WARNING."""
    from pipeline import cli

    shared = tmp_path / "shared.toml"
    shared.write_text('tokenizer = "somewhere"\nvocab_size = 300\n')
    caplog.set_level(logging.WARNING)
    code = cli._run("train", "", lambda cfg: 0, ["--output", str(tmp_path / "run"),
                                                 "--config", str(shared), "--input",
                                                 str(REPO / "data" / "sample"),
                                                 "--log-level", "WARNING"])
    assert code == 0
    code = cli._run("train", "", lambda cfg: 0, ["--output", str(tmp_path / "run"),
                                                 "--log-level", "WARNING"])
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert code == 0
    assert any("not train settings, ignored: tokenizer" in m for m in said), said
    assert any("this run trains the shipped sample corpus" in m for m in said), said


@pytest.mark.parametrize("job,key,place", [("count", "output", "s3a://bucket"),
                                           ("encode", "output", "hdfs://nn:8020/"),
                                           ("train", "checkpoint_dir", "gs://ckpts")])
def test_an_output_at_a_bucket_root_is_a_config_error(job, key, place, tmp_path):
    """Their lease lies beside them, in the parent: a bucket root has none
    (s3a:/.bucket.lease.json, an unclear Hadoop error after Spark started). A run directory
    holds its own lease: a train output may be one."""
    sample = str(REPO / "data" / "sample")
    kw = {"input": sample, "output": "s3a://bucket/run", "tokenizer": str(tmp_path),
          "vocab_size": 300 if job == "train" else 0, key: place}
    with pytest.raises(ConfigError, match=f"config key '{key}': .* is the root of a bucket"):
        validate(Config(**kw), job)
    validate(Config(**{**kw, key: place.rstrip("/") + "/run2"}), job)
    validate(Config(input=sample, vocab_size=300, output="s3a://bucket"), "train")


@pytest.mark.parametrize("name", ["exp[1]", "a{b}", "x*", "a\\b"])
def test_an_output_whose_name_spark_reads_as_a_pattern_is_a_config_error(tmp_path, name):
    """--output runs/exp[1]: the job read its own word table back through Spark's reader as
    the pattern runs/exp1 (another run's table, if there was one). An encode's output, or a
    run's from --words, is never read back that way: it may have such a name."""
    sample, out = str(REPO / "data" / "sample"), str(tmp_path / name)
    for job in ("train", "count"):
        with pytest.raises(ConfigError, match="which Spark's reader takes for a pattern"):
            validate(Config(input=sample, vocab_size=300, output=out), job)
    words = tmp_path / "words"
    words.mkdir()
    validate(Config(words=str(words), vocab_size=300, output=out), "train")
    validate(Config(input=sample, tokenizer=str(tmp_path), output=out), "encode")
