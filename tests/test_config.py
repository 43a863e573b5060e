"""Config: precedence, types, and validation before any Spark work."""

from __future__ import annotations

import pytest

from pipeline.config import ConfigError, resolve, validate


def cfg(*argv: str):
    return resolve(list(argv))


def test_defaults_come_from_conf_default_toml():
    c = cfg()
    assert c.input == "data/sample" and c.vocab_size == 4096 and c.pattern == "cl100k"
    assert c.special_tokens == ["<|endoftext|>"]
    validate(c, "train")


def test_command_line_wins_over_files(tmp_path):
    f = tmp_path / "x.toml"
    f.write_text('[train]\nvocab_size = 1000\nengine = "spark"\n[pretokenize]\nlowercase = true\n')
    c = cfg("--config", str(f), "--vocab-size", "32768", "--no-lowercase",
            "--special-tokens", "<a>,<b>")
    assert c.vocab_size == 32768 and c.engine == "spark" and c.lowercase is False
    assert c.special_tokens == ["<a>", "<b>"]
    assert cfg("--num-merges", "10").vocab_size == 0
    assert cfg("--words", "w").input == ""


@pytest.mark.parametrize("argv,key", [
    (["--vocab-size", "abc"], "vocab_size"),
    (["--vocab-size", "200"], "vocab_size"),
    (["--vocab-size", "257"], "vocab_size"),  # 256 bytes + 1 special token = no merges
    (["--pattern", "(unclosed"], "pattern"),
    (["--engine", "gpu"], "engine"),
    (["--normalization", "NFX"], "normalization"),
    (["--alphabet", "words"], "alphabet"),
    (["--end-of-word-suffix", "</w>"], "end_of_word_suffix"),
    (["--min-pair-count", "0"], "min_pair_count"),
    (["--input", "/definitely/not/here"], "input"),
    (["--resume", "maybe"], "resume"),
    (["--special-tokens", "<a>,<a>"], "special_tokens"),
])
def test_invalid_values_name_the_key(argv, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        validate(cfg(*argv), "train")


def test_unknown_key_in_file(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("vocab_sise = 3\n")
    with pytest.raises(ConfigError, match="unknown config key 'vocab_sise'"):
        cfg("--config", str(f))


def test_input_xor_words():
    with pytest.raises(ConfigError, match="exactly one"):
        validate(cfg("--words", "data/sample", "--input", "data/sample"), "train")


def test_web_ui_defaults_to_on_for_clusters_only():
    from pipeline.spark_session import web_ui_enabled

    assert not web_ui_enabled("auto", "local[2]")
    assert not web_ui_enabled("auto", "local-cluster[2,1,1024]")
    assert web_ui_enabled("auto", "spark://127.0.0.1:7077") and web_ui_enabled("auto", "yarn")
    assert web_ui_enabled("on", "local[*]") and not web_ui_enabled("off", "yarn")
    with pytest.raises(ConfigError, match="spark_ui"):
        validate(cfg("--spark-ui", "maybe"), "train")
