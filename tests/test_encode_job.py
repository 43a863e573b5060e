"""The encode stage (``pipeline.encode_corpus``) and ``jobs/encode.py``: every row's ids equal the
reference encoder's, statistics are recomputed independently, bad input is one line."""

from __future__ import annotations

import base64
import json
import logging
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import Config, ConfigError
from pipeline.encode_corpus import encode_corpus
from pipeline.encoder import Tokenizer
from pipeline.train import train

from .conftest import EN_DOCS, MULTILINGUAL, REPO
from .test_exports import EOT, rows_of, train_in_memory

pytestmark = pytest.mark.spark

EDGE_ROWS = ["", "   \n\n\t  ", "😀👍🏽 家族 👩‍👩‍👧‍👦", "שָׁלוֹם 123456789 مرحبا", "e\u0301\u0301 x",
             "a\r\nb\r\n\r\n", " " * 300 + "end", "digits 3.14159 and ١٢٣"]


@pytest.fixture(scope="module")
def run_dir(spark, tmp_path_factory) -> Path:
    """A run trained by ``pipeline.train`` (the job's code path) on en-docs + multilingual."""
    d = tmp_path_factory.mktemp("encode-train")
    texts = (rows_of(EN_DOCS, "part-00000.parquet", 100_000)
             + rows_of(MULTILINGUAL, "part-00000.parquet", 100_000))
    (d / "corpus").mkdir()
    pq.write_table(pa.table({"text": texts}), d / "corpus" / "part-0.parquet")
    cfg = Config(input=str(d / "corpus"), output=str(d / "run"), vocab_size=1200,
                 special_tokens=[EOT], engine="local", progress_bar=False)
    train(spark, cfg)
    return d / "run"


@pytest.fixture(scope="module")
def held_out(tmp_path_factory) -> Path:
    """Held-out rows with a key column and a second column, in two files."""
    d = tmp_path_factory.mktemp("encode-input")
    texts = (rows_of(EN_DOCS, "part-00001.parquet", 60_000)
             + rows_of(MULTILINGUAL, "part-00001.parquet", 60_000) + EDGE_ROWS + [None])
    n = len(texts)
    half = n // 2
    table = pa.table({"doc_id": pa.array(range(n), pa.int64()), "text": texts,
                      "lang": ["x"] * n})
    pq.write_table(table.slice(0, half), d / "part-0.parquet", row_group_size=8)
    pq.write_table(table.slice(half), d / "part-1.parquet", row_group_size=8)
    return d


def oracle_encoder(run_dir: Path):
    """An encoder that shares no code with ours or tiktoken's: the regex package's split with
    the run's pattern, then the lowest-rank merge loop of the oracle (``bpe.encode_symbols``)
    on each word's bytes; a token made twice takes its first id (tokenizer_meta.json)."""
    import regex

    from pipeline.bpe import encode_symbols
    from pipeline.patterns import PATTERNS

    meta = json.loads((run_dir / "tokenizer_meta.json").read_text())
    ranks = {(a, b): 256 + i for i, (a, b, _) in enumerate(meta["merges"])}
    first = {later: earlier for later, earlier in meta["duplicate_tokens"]}
    split = regex.compile(PATTERNS.get(meta["pattern"], meta["pattern"]))  # named or custom
    cache: dict[str, list[int]] = {}

    def encode(text: str) -> list[int]:
        out: list[int] = []
        for word in split.findall(text):
            if word not in cache:
                ids = encode_symbols(list(word.encode("utf-8", "surrogateescape")), ranks)
                cache[word] = [first.get(t, t) for t in ids]
            out += cache[word]
        return out

    return encode


def read_output(path: Path) -> pa.Table:
    return pq.read_table(path)  # pyarrow skips _encode.json and _SUCCESS


@pytest.mark.parametrize("engine,io", [("tiktoken", "arrow"), ("tiktoken", "spark"),
                                       ("reference", "arrow")])
def test_every_row_equals_an_independent_oracle_encoder(spark, run_dir, held_out, tmp_path,
                                                        engine, io, caplog):
    """... through either reader and writer (pyarrow in the tasks, or Spark's), and the
    stage's heartbeats (issue 14) say how many tasks, rows and bytes are done."""
    out = tmp_path / "enc"
    cfg = Config(input=str(held_out), tokenizer=str(run_dir), output=str(out),
                 encode_engine=engine, encode_io=io, num_partitions=3, heartbeat_seconds=0.05,
                 progress_file=str(tmp_path / "dash" / "encode.jsonl"))
    caplog.set_level(logging.INFO, logger="pipeline.progress")
    res = encode_corpus(spark, cfg)
    table = read_output(out)
    assert table.column_names == ["doc_id", "lang", "ids"]
    assert table.schema.field("ids").type.value_type == pa.int32()
    src = pq.read_table(held_out).to_pydict()
    got = dict(zip(table.column("doc_id").to_pylist(), table.column("ids").to_pylist()))
    assert sorted(got) == src["doc_id"]
    ref = Tokenizer.load(str(run_dir))
    oracle = oracle_encoder(run_dir)  # independent of both engines
    n_bytes = n_tokens = n_words = 0
    for doc_id, text in zip(src["doc_id"], src["text"]):
        if text is None:
            assert got[doc_id] is None
            continue
        expected = oracle(text)
        assert got[doc_id] == expected, (doc_id, text[:80])
        assert ref.decode(got[doc_id]) == text
        n_bytes += len(text.encode())
        n_tokens += len(expected)
        n_words += len(text.split())
    st = res.stats["stats"]
    assert (st["rows"], st["null_rows"], st["bytes"], st["tokens"], st["words"]) == (
        len(src["text"]), 1, n_bytes, n_tokens, n_words)
    assert st["bytes_per_token"] == round(n_bytes / n_tokens, 4)
    assert st["tokens_per_word"] == round(n_tokens / n_words, 4)
    assert st["engine"] == engine and st["io"] == io and st["partitions"] == 3
    on_disk = json.loads((out / "_encode.json").read_text())
    assert on_disk["stats"] == st and on_disk["tokenizer"] == str(run_dir)
    beats = [r.getMessage() for r in caplog.records if r.name == "pipeline.progress"
             and r.getMessage().startswith("encode: ")]
    assert beats[0] == "encode: started" and beats[-1].startswith("encode: done in "), beats
    stages = [r.getMessage().split(":")[0] for r in caplog.records
              if r.name == "pipeline.progress"]
    assert stages.index("prepare") < stages.index("encode")  # listing and footers beat too
    # a Spark job lasts > 0.05 s, so at least one heartbeat came between (with or without ETA)
    assert any(re.search(r", [\d.]+ s elapsed(, ETA [\d.]+ s)?$", b) for b in beats[1:-1]), beats
    # rows out of all (the input's Parquet footers give them before the tasks run: the ETA)
    rows = f"{st['rows']:,}"
    assert re.search(rf"; {rows}/{rows} rows, (.*, )?tasks (\d+)/\2, ", beats[-1]), beats[-1]
    kb = f"{n_bytes / 1e3:.1f} kB read" if n_bytes < 1e6 else f"{n_bytes / 1e6:.1f} MB read"
    assert kb in beats[-1], beats[-1]
    # the same heartbeats, as JSON lines for a dashboard (--progress-file)
    events = [json.loads(x) for x in (tmp_path / "dash" / "encode.jsonl").read_text()
              .splitlines()]
    assert {e["job"] for e in events} == {"encode"}
    enc = [e for e in events if e["stage"] == "encode"]
    assert enc[0]["event"] == "start" and enc[-1]["event"] == "end"
    assert enc[-1]["done"] == enc[-1]["total"] == st["rows"]
    assert len(enc) == len(beats)  # each line of the log's, none dropped


def test_special_tokens_policy_and_auto_keys(spark, run_dir, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    texts = ["plain text", f"one{EOT}two", "more plain text"]
    pq.write_table(pa.table({"text": texts}), src / "a.parquet")
    ref = Tokenizer.load(str(run_dir))
    out = tmp_path / "out"
    base = dict(input=str(src), tokenizer=str(run_dir), output=str(out))
    with pytest.raises(ConfigError) as err:
        encode_corpus(spark, Config(**base))
    msg = str(err.value)
    assert "\n" not in msg and '"row": 1' in msg and "<|endoftext|>" in msg
    assert "special_in_text" in msg
    assert not out.exists() and not list(tmp_path.glob("out.tmp-*"))  # nothing half-written
    for mode, kwargs in (("special", {"allowed_special": "all"}),
                         ("text", {"disallowed_special": ()})):
        res = encode_corpus(spark, Config(**base, special_in_text=mode))
        table = read_output(out).sort_by("row")
        assert table.column_names == ["file", "row", "ids"]  # text only: file + row are the key
        assert table.column("row").to_pylist() == [0, 1, 2]
        assert table.column("ids").to_pylist() == [ref.encode(t, **kwargs) for t in texts]
        assert res.stats["stats"]["special_tokens"] == (1 if mode == "special" else 0)


def test_binary_text_column_keeps_invalid_utf8_exact(spark, run_dir, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    rows = [b"valid text", b"caf\xe9 not utf-8 \xff\xfe", "日本語".encode()]
    pq.write_table(pa.table({"k": [1, 2, 3], "text": pa.array(rows, pa.binary())}),
                   src / "a.parquet")
    out = tmp_path / "out"
    (tmp_path / "out.tmp-0badc0de").mkdir()  # left by an encode killed before it published
    res = encode_corpus(spark, Config(input=str(src), tokenizer=str(run_dir), output=str(out),
                                      key_columns=["k"], ids_column="tokens"))
    assert not (tmp_path / "out.tmp-0badc0de").exists()
    table = read_output(out).sort_by("k")
    assert table.column_names == ["k", "tokens"]
    ref = Tokenizer.load(str(run_dir))
    got = table.column("tokens").to_pylist()
    assert [ref.decode_bytes(ids) for ids in got] == rows
    # and the ids are the oracle's on each row's bytes (invalid ones as surrogate escapes)
    oracle = oracle_encoder(run_dir)
    assert got == [oracle(r.decode("utf-8", "surrogateescape")) for r in rows]
    assert res.stats["stats"]["invalid_utf8_rows"] == 1


def test_chars_alphabet_run_encodes_with_the_reference(spark, tmp_path):
    texts = ["the café baker bakes cakes, the café bakes soufflé"] * 3
    train_in_memory(texts, tmp_path / "run", r" ?\w+|[^\w\s]", 40, (), alphabet="chars")
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["the baker bakes", "cakes"]}), tmp_path / "in" / "a.parquet")
    base = dict(input=str(tmp_path / "in"), tokenizer=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="alphabet = 'chars'"):
        encode_corpus(spark, Config(**base, output=str(tmp_path / "o1"),
                                    encode_engine="tiktoken"))
    res = encode_corpus(spark, Config(**base, output=str(tmp_path / "o2")))
    assert res.stats["stats"]["engine"] == "reference"
    ref = Tokenizer.load(str(tmp_path / "run"))
    ids = read_output(tmp_path / "o2").sort_by("row").column("ids").to_pylist()
    assert ids == [ref.encode("the baker bakes"), ref.encode("cakes")]
    assert ref.decode(ids[0]) == "the baker bakes"
    # the reference encoder against the oracle's encode (split, character ids, merge ranks)
    import regex

    from pipeline.bpe import encode_symbols

    meta = json.loads((tmp_path / "run" / "tokenizer_meta.json").read_text())
    chars = {base64.b64decode(t).decode(): i for i, t in enumerate(meta["base_tokens"])}
    n = len(chars)
    ranks = {(a, b): n + i for i, (a, b, _) in enumerate(meta["merges"])}
    assert ids == [[t for w in regex.findall(r" ?\w+|[^\w\s]", text)
                    for t in encode_symbols([chars[c] for c in w], ranks)]
                   for text in ("the baker bakes", "cakes")]
    assert len(ids[0]) < len("the baker bakes")
    # a character the run never saw: the tokenizer is what cannot encode it
    (tmp_path / "unseen").mkdir()
    pq.write_table(pa.table({"text": ["the Σ baker"]}), tmp_path / "unseen" / "a.parquet")
    with pytest.raises(ConfigError, match="^config key 'tokenizer': .*character 'Σ' is not in "
                                          "this chars-alphabet vocabulary .*alphabet = 'bytes'"):
        encode_corpus(spark, Config(input=str(tmp_path / "unseen"), tokenizer=base["tokenizer"],
                                    output=str(tmp_path / "o3")))
    assert not (tmp_path / "o3").exists()


def test_a_pattern_tiktoken_cannot_compile_encodes_with_the_reference(spark, tmp_path,
                                                                     caplog):
    """A custom pattern the regex package takes and tiktoken's fancy-regex refuses (``\\m``,
    start of word): auto picks the reference encoder, with the reason; asking for tiktoken
    is one config error."""
    pattern = r"\m\w+|\W+|\w+"
    texts = ["the baker bakes cakes, the cakes bake"] * 3
    train_in_memory(texts, tmp_path / "run", pattern, 256 + 20, ())
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["the baker", "bakes cakes"]}), tmp_path / "in" / "a.parquet")
    base = dict(input=str(tmp_path / "in"), tokenizer=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="tiktoken cannot compile the run's split pattern"):
        encode_corpus(spark, Config(**base, output=str(tmp_path / "o1"),
                                    encode_engine="tiktoken"))
    with caplog.at_level(logging.WARNING, logger="pipeline.encode_corpus"):
        res = encode_corpus(spark, Config(**base, output=str(tmp_path / "o2")))
    assert res.stats["stats"]["engine"] == "reference"
    assert "Invalid escape" in caplog.text
    oracle = oracle_encoder(tmp_path / "run")  # (the reference engine is Tokenizer itself)
    ids = read_output(tmp_path / "o2").sort_by("row").column("ids").to_pylist()
    assert ids == [oracle("the baker"), oracle("bakes cakes")]
    assert len(ids[0]) < len("the baker")  # merges were applied


def test_bad_input_is_one_line(spark, run_dir, held_out, tmp_path):
    out = str(tmp_path / "o")
    cases = [
        (dict(input=str(held_out), tokenizer=str(tmp_path / "nope"), output=out),
         "no run directory at .*nope$"),
        (dict(input=str(held_out), tokenizer=str(run_dir), output=out, key_columns=["nope"]),
         "column 'nope' not in"),
        (dict(input=str(held_out), tokenizer=str(run_dir), output=out, text_column="body"),
         "column 'body' not in"),
        (dict(input=str(held_out), tokenizer=str(run_dir), output=out, ids_column="doc_id"),
         "'ids_column': 'doc_id' is also a key column"),
        (dict(input=str(held_out), tokenizer=str(run_dir), output=str(run_dir)),
         "overlaps --tokenizer"),
        (dict(input=str(held_out), tokenizer=str(run_dir), output=out, special_in_text="drop"),
         "'special_in_text' must be one of"),
    ]
    bad = tmp_path / "truncated"  # a cut-off shard next to a good one: named, nothing written
    bad.mkdir()
    pq.write_table(pa.table({"text": ["good row"] * 20}), bad / "part-0.parquet")
    pq.write_table(pa.table({"text": ["lost row"] * 2000}), bad / "part-1.parquet")
    whole = (bad / "part-1.parquet").read_bytes()
    (bad / "part-1.parquet").write_bytes(whole[: len(whole) // 2])
    cases.append((dict(input=str(bad), tokenizer=str(run_dir), output=out),
                  r"part-1\.parquet is not a readable Parquet file .*fix or remove it, then "
                  r"rerun$"))
    numbers = tmp_path / "numbers"  # a shard whose text column holds numbers: named as such
    numbers.mkdir()
    pq.write_table(pa.table({"text": ["good row"] * 20}), numbers / "part-0.parquet")
    pq.write_table(pa.table({"text": list(range(20))}), numbers / "part-1.parquet")
    cases.append((dict(input=str(numbers), tokenizer=str(run_dir), output=out),
                  r"^config key 'text_column': column 'text' is int64 in \S*part-1\.parquet, "
                  r"not string or binary$"))
    (tmp_path / "rows.jsonl").write_text('{"text": "not Parquet"}\n' * 50)  # a lone file
    cases.append((dict(input=str(tmp_path / "rows.jsonl"), tokenizer=str(run_dir), output=out),
                  r"rows\.jsonl is not a readable Parquet file .*fix or remove it, or, if the "
                  r"input is json files, pass --input-format json; then rerun$"))
    second = tmp_path / "second"  # a second corpus whose key column has another type
    second.mkdir()
    pq.write_table(pa.table({"doc_id": ["a"], "text": ["x"], "lang": ["y"]}),
                   second / "part-0.parquet")
    cases.append((dict(input=f"{held_out},{second}", tokenizer=str(run_dir), output=out),
                  "have different columns or column types; encode them one at a time"))
    for kwargs, expected in cases:
        with pytest.raises(ConfigError, match=expected) as err:
            encode_corpus(spark, Config(**kwargs))
        assert "\n" not in str(err.value)
    # a dictionary-encoded text column (a pandas Categorical) is text to Spark: encoded
    categorical = tmp_path / "categorical"
    categorical.mkdir()
    pq.write_table(pa.table({"text": pa.array(["a row", "another row", "a row"]
                                              ).dictionary_encode()}),
                   categorical / "part-0.parquet")
    done = encode_corpus(spark, Config(input=str(categorical), tokenizer=str(run_dir),
                                       output=str(tmp_path / "categorical-ids")))
    assert done.stats["stats"]["rows"] == 3
    shutil.rmtree(tmp_path / "categorical-ids")
    assert not Path(out).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("o")]  # no staging left


def _odd_corpus(d: Path, texts: list[str | None], keyed: bool) -> Path:
    """Files whose names Spark percent-encodes, several row groups each, a null text; with
    ``keyed``, key columns of every type the pyarrow path carries (nulls among them)."""
    d.mkdir()
    n = len(texts)
    for i, name in enumerate(["a b#1%.parquet", "é+x.parquet", "plain.parquet"]):
        part = texts[i::3]
        cols: dict = {"text": pa.array(part, pa.string())}
        if keyed:
            m = len(part)
            cols = {"i8": pa.array([j % 100 for j in range(m)], pa.int8()),
                    **cols,
                    "i16": pa.array(range(m), pa.int16()), "i32": pa.array(range(m), pa.int32()),
                    "id": pa.array([i * n + j for j in range(m)], pa.int64()),
                    "f32": pa.array([j / 4 for j in range(m)], pa.float32()),
                    "f64": pa.array([None if j == 1 else j / 3 for j in range(m)]),
                    "ok": pa.array([j % 2 == 0 for j in range(m)]),
                    "name": pa.array([None if j == 2 else f"n{j}" for j in range(m)]),
                    "raw": pa.array([bytes([j % 256, 255]) for j in range(m)], pa.binary())}
        pq.write_table(pa.table(cols), d / name, row_group_size=4)
    return d


def test_pyarrow_path_writes_what_sparks_path_writes(spark, run_dir, tmp_path, caplog):
    """``encode_io = arrow`` (pyarrow reads and writes in the tasks) and ``spark`` (Spark's scan
    and writer) give the same output, read back by Spark: columns, types, and every row, with
    Spark's spelling of odd file names in the ``file`` key. Where the pyarrow path cannot be
    sure of that, ``auto`` takes Spark's path and says why; ``arrow`` is then an error."""
    from chispa import assert_df_equality

    texts = rows_of(EN_DOCS, "part-00003.parquet", 20_000) + EDGE_ROWS + [None]
    for keyed in (False, True):
        src = _odd_corpus(tmp_path / f"src-{keyed}", texts, keyed)
        frames, stats = {}, {}
        for io in ("arrow", "spark"):
            out = tmp_path / f"out-{keyed}-{io}"
            res = encode_corpus(spark, Config(input=str(src), tokenizer=str(run_dir),
                                              output=str(out), encode_io=io))
            stats[io] = res.stats["stats"]
            frames[io] = spark.read.parquet(str(out))
        assert stats["arrow"]["io"] == "arrow" and stats["spark"]["io"] == "spark"
        for k in ("rows", "null_rows", "bytes", "words", "tokens"):
            assert stats["arrow"][k] == stats["spark"][k], k
        assert frames["arrow"].schema == frames["spark"].schema
        arrow_schemas = {io: read_output(tmp_path / f"out-{keyed}-{io}").schema.remove_metadata()
                         for io in ("arrow", "spark")}  # nullability too, which Spark drops
        assert arrow_schemas["arrow"] == arrow_schemas["spark"], arrow_schemas
        assert_df_equality(frames["arrow"], frames["spark"], ignore_row_order=True)
        if not keyed:
            files = {r.file for r in frames["arrow"].select("file").collect()}
            assert "file:" + str(src).replace(" ", "%20") + "/a%20b%231%25.parquet" in files
            assert frames["arrow"].count() == len(texts)
        done = sorted(p.name for p in (tmp_path / f"out-{keyed}-arrow").iterdir())
        assert "_SUCCESS" in done and not [n for n in done if n.startswith("_attempt")]
    # a key column pyarrow and Spark would type differently: auto takes Spark's path
    stamped = tmp_path / "stamped"
    stamped.mkdir()
    pq.write_table(pa.table({"text": ["a row", "another"],
                             "at": pa.array([1, 2], pa.timestamp("ms"))}), stamped / "p.parquet")
    caplog.set_level(logging.INFO, logger="pipeline.encode_corpus")
    res = encode_corpus(spark, Config(input=str(stamped), tokenizer=str(run_dir),
                                      output=str(tmp_path / "stamped-out")))
    assert res.stats["stats"]["io"] == "spark"
    assert any("Spark's reader and writer: key columns of types Spark converts (at)"
               in r.getMessage() for r in caplog.records)
    for kwargs, why in ((dict(input=str(stamped)), "key columns of types Spark converts"),
                        (dict(input=str(src), input_format="json"), "the input is json")):
        with pytest.raises(ConfigError, match=f"^config key 'encode_io' = 'arrow'.*{why}.*"
                                              "use 'auto' or 'spark'$"):
            encode_corpus(spark, Config(**kwargs, tokenizer=str(run_dir), encode_io="arrow",
                                        output=str(tmp_path / "never")))
    with pytest.raises(ConfigError, match="^config key 'encode_io' = 'arrow' reads local "
                                          "Parquet files, not a DataFrame"):
        encode_corpus(spark, Config(tokenizer=str(run_dir), encode_io="arrow",
                                    output=str(tmp_path / "never")),
                      spark.createDataFrame([("a row",)], "text string"))
    # an ids column named as an automatic key: Spark's path refuses it, so auto does too
    with pytest.raises(ConfigError, match="'ids_column': 'row' is also a key column"):
        encode_corpus(spark, Config(input=str(tmp_path / "src-False"), tokenizer=str(run_dir),
                                    output=str(tmp_path / "never"), ids_column="row"))
    assert not (tmp_path / "never").exists()
    # a text column named as an automatic key: the key keeps its type on either path (Spark's
    # typed it as the text, and wrote the row numbers as strings)
    (tmp_path / "rowtext").mkdir()
    pq.write_table(pa.table({"row": ["a row", "another"]}), tmp_path / "rowtext" / "p.parquet")
    for io in ("arrow", "spark"):
        encode_corpus(spark, Config(input=str(tmp_path / "rowtext"), tokenizer=str(run_dir),
                                    text_column="row", encode_io=io,
                                    output=str(tmp_path / f"rowtext-{io}")))
        written = read_output(tmp_path / f"rowtext-{io}")
        assert written.schema.field("row").type == pa.int64(), (io, written.schema)
        assert sorted(written.column("row").to_pylist()) == [0, 1]
    # names Spark's listing does not skip as "_ or . first" (it reads _x=1.parquet, skips a
    # file being copied): left to Spark's listing, the same rows either way
    names = tmp_path / "names"
    names.mkdir()
    for name in ("a.parquet", "_x=1.parquet", "b.parquet._COPYING_", "_skipped.parquet"):
        pq.write_table(pa.table({"text": [f"{name} row"]}), names / name)
    read = {}
    for io in ("auto", "spark"):
        encode_corpus(spark, Config(input=str(names), tokenizer=str(run_dir), encode_io=io,
                                    output=str(tmp_path / f"names-{io}")))
        read[io] = sorted(r.file.rsplit("/", 1)[1] for r in
                          spark.read.parquet(str(tmp_path / f"names-{io}")).collect())
    assert read["auto"] == read["spark"] == ["_x=1.parquet", "a.parquet"]


def test_pyarrow_path_names_a_file_whose_pages_are_corrupt(spark, run_dir, tmp_path):
    """A file whose footer reads but whose data does not fails the task; the job ends with one
    line naming the file, and nothing is written."""
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"text": ["good row"] * 20}), src / "a.parquet")
    pq.write_table(pa.table({"text": [f"row {i} " * 50 for i in range(2000)]}),
                   src / "b.parquet", compression="zstd")
    data = bytearray((src / "b.parquet").read_bytes())
    data[100:5000] = b"\xff" * 4900  # the first page, not the footer
    (src / "b.parquet").write_bytes(bytes(data))
    pq.read_metadata(src / "b.parquet")  # (the footer still reads)
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"b\.parquet is not a readable Parquet file") as err:
        encode_corpus(spark, Config(input=str(src), tokenizer=str(run_dir), output=str(out),
                                    encode_io="arrow"))
    assert "\n" not in str(err.value)
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["src"]


def test_pyarrow_path_says_when_executors_do_not_share_the_files(spark, run_dir, tmp_path,
                                                                 monkeypatch):
    """On a cluster a local path must be the same on every machine. An input file the
    executor does not find (or that was removed after listing), or a staging directory it
    cannot write into: one line each, naming the path, the host and the setting, nothing
    published. (A path with " :: " in it is named whole.)"""
    import socket

    import pipeline.encode_local as el

    src = tmp_path / "s :: rc"
    src.mkdir()
    for name in ("a.parquet", "b.parquet"):
        pq.write_table(pa.table({"text": [f"{name} row {i}" for i in range(30)]}), src / name)
    cfg = Config(input=str(src), tokenizer=str(run_dir), output=str(tmp_path / "o :: ut"))
    planned = el.plan_local_encode

    def listed_then_gone(spark, cfg):
        plan = planned(spark, cfg)
        (src / "b.parquet").rename(tmp_path / "b.parquet")
        return plan

    monkeypatch.setattr(el, "plan_local_encode", listed_then_gone)
    host = re.escape(socket.gethostname())
    with pytest.raises(ConfigError, match=rf"^config key 'input': {re.escape(str(src))}/b\.parquet "
                                          rf"was listed by this driver but is not there for the "
                                          rf"executor on {host} .*, or give an hdfs://"):
        encode_corpus(spark, cfg)
    monkeypatch.setattr(el, "plan_local_encode", planned)
    (tmp_path / "b.parquet").rename(src / "b.parquet")
    monkeypatch.setattr(el, "_make_staging", lambda out: None)  # not there for the executors
    with pytest.raises(ConfigError, match=rf"^config key 'output': the executor on {host} "
                                          rf"cannot write into {re.escape(str(tmp_path))}/"
                                          r"o :: ut\.tmp-\w+ \(not there"):
        encode_corpus(spark, cfg)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s :: rc"]


def test_pyarrow_path_reads_long_rows_a_few_at_a_time(tmp_path):
    """A batch's ids are Python lists until encoded (~36 bytes a token): rows of 1 MB come a
    few at a time, short rows ``BATCH_ROWS`` at a time, and every row once, in order."""
    from pipeline.count.corpus import plan_slices
    from pipeline.encode_local import BATCH_BYTES, BATCH_ROWS, _read

    for size, rows in ((1 << 20, 40), (50, 5000)):
        path = tmp_path / f"rows-{size}.parquet"
        pq.write_table(pa.table({"text": [f"{i:08d}" + "x" * (size - 8) for i in range(rows)]}),
                       path, row_group_size=rows // 2)
        (task,) = plan_slices([str(path)], "text", 1)
        seen = []
        for s in task:
            for first, batch in _read(s, ["text"], {}):
                assert batch.num_rows <= min(BATCH_ROWS, max(1, 2 * BATCH_BYTES // size))
                seen += [(first + i, int(t[:8])) for i, t in
                         enumerate(batch.column(0).to_pylist())]
        assert seen == [(i, i) for i in range(rows)]


def run_encode_job(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "jobs" / "encode.py"), "--master",
                           "local[2]", *args], capture_output=True, text=True, cwd=REPO)


def test_job_end_to_end_and_exit_codes(run_dir, held_out, tmp_path):
    out = tmp_path / "enc"
    r = run_encode_job("--tokenizer", str(run_dir), "--input", str(held_out), "--output",
                       str(out), "--key-columns", "doc_id")
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout.splitlines()[0])
    table = read_output(out)
    assert table.column_names == ["doc_id", "ids"]
    assert printed["tokens"] == sum(len(x) for x in table.column("ids").to_pylist() if x)
    assert printed["rows"] == table.num_rows
    config = json.loads((out / "_config.json").read_text())  # the resolved config
    assert config["tokenizer"] == str(run_dir) and config["key_columns"] == ["doc_id"]
    assert "vocab_size" not in config and "pattern" not in config  # encode's keys only
    # a directory that is not the output of an earlier encode is refused, not replaced
    r = run_encode_job("--tokenizer", str(run_dir), "--input", str(held_out), "--output",
                       str(run_dir.parent / "corpus"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors == [r.stderr.splitlines()[-1]] and "refusing to replace" in errors[0]
    assert "is not the output of an earlier encode" in r.stderr
    r = run_encode_job("--input", str(held_out), "--output", str(tmp_path / "x"))
    assert r.returncode == 2 and "config key 'tokenizer'" in r.stderr
    (tmp_path / "not-a-run").mkdir()
    r = run_encode_job("--tokenizer", str(tmp_path / "not-a-run"), "--input", str(held_out),
                       "--output", str(tmp_path / "x"))
    assert r.returncode == 2 and "not a complete run (no run.json)" in r.stderr
    assert not (tmp_path / "x").exists()
    # a run whose tiktoken export was deleted after it finished: one line, exit 2
    shutil.copytree(run_dir, tmp_path / "damaged")
    (tmp_path / "damaged" / "tokenizer.tiktoken").unlink()
    r = run_encode_job("--tokenizer", str(tmp_path / "damaged"), "--input", str(held_out),
                       "--output", str(tmp_path / "x"), "--encode-engine", "tiktoken")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.splitlines()[-1].startswith("error: config key 'tokenizer': ")
    assert "tokenizer.tiktoken is missing (run.json lists it" in r.stderr
    assert not (tmp_path / "x").exists()
    # a truncated shard under a partitioned corpus: one line naming it, found before any task
    # fails on it (a failed task logs pages of Java stack traces), exit 2
    part = tmp_path / "lake" / "lang=en"
    part.mkdir(parents=True)
    pq.write_table(pa.table({"text": ["good row"] * 20}), part / "a.parquet")
    pq.write_table(pa.table({"text": ["lost row"] * 2000}), part / "b.parquet")
    cut = part / "b.parquet"
    cut.write_bytes(cut.read_bytes()[:300])
    r = run_encode_job("--tokenizer", str(run_dir), "--input", str(tmp_path / "lake"),
                       "--output", str(tmp_path / "x"))
    assert r.returncode == 2, r.stderr[-2000:]
    assert re.match(r"error: config key 'input': \S+lang=en/b\.parquet is not a readable "
                    r"Parquet file", r.stderr.splitlines()[-1]), r.stderr[-2000:]
    assert " ERROR " not in r.stderr and "\tat " not in r.stderr, r.stderr[-3000:]


def _lines_of(texts: list[str]) -> list[str]:
    return [ln for t in texts for ln in t.splitlines() if ln.strip()]


def test_json_csv_and_text_inputs_encode_row_for_row(spark, run_dir, tmp_path):
    """The encode job reads what training reads (``input_format``). JSON lines and CSV with a
    key column give the Parquet input's ids row for row; text files (the text is their only
    column) are keyed (file, block, row): rows numbered from 0 within each block of a file as
    Spark splits it (several blocks here), which in (file, block, row) order are the file's
    lines. Every row equals the independent oracle."""
    import csv

    texts = rows_of(EN_DOCS, "part-00002.parquet", 40_000) + EDGE_ROWS
    oracle = oracle_encoder(run_dir)
    n = len(texts)
    src = tmp_path / "src"
    for fmt in ("parquet", "json", "csv"):
        (src / fmt).mkdir(parents=True)
    pq.write_table(pa.table({"doc_id": list(range(n)), "text": texts}),
                   src / "parquet" / "part-0.parquet")
    with open(src / "json" / "part-0.jsonl", "w", encoding="utf-8") as fh:
        for i, t in enumerate(texts):
            fh.write(json.dumps({"doc_id": i, "text": t}, ensure_ascii=False) + "\n")
    with open(src / "csv" / "part-0.csv", "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["doc_id", "text"])
        w.writerows([i, t] for i, t in enumerate(texts))
    by_format = {}
    for fmt in ("parquet", "json", "csv"):
        out = tmp_path / f"enc-{fmt}"
        encode_corpus(spark, Config(input=str(src / fmt), input_format=fmt, output=str(out),
                                    tokenizer=str(run_dir), key_columns=["doc_id"]))
        table = read_output(out)
        by_format[fmt] = {int(k): v for k, v in zip(table.column("doc_id").to_pylist(),
                                                    table.column("ids").to_pylist())}
    assert by_format["json"] == by_format["parquet"] == {i: oracle(t) for i, t in enumerate(texts)}
    # CSV through Spark's parser: a line break inside a quoted field comes back as "\n" (a
    # "\r\n" loses its "\r") and an empty field as null (README, "Inputs")
    csv_texts = [None if t == "" else t.replace("\r\n", "\n") for t in texts]
    assert by_format["csv"] == {i: None if t is None else oracle(t)
                                for i, t in enumerate(csv_texts)}
    assert any("\r\n" in t for t in texts) and "" in texts  # (the cases above are there)

    lines = _lines_of(texts)
    (src / "text").mkdir()
    cuts = [0, len(lines) * 2 // 5, len(lines) * 4 // 5, *range(len(lines) * 4 // 5 + 10,
                                                               len(lines), 10), len(lines)]
    names = ["a.txt", "b.txt", *(f"c{i:03d}.txt" for i in range(len(cuts) - 3))]
    for name, start, end in zip(names, cuts, cuts[1:]):
        (src / "text" / name).write_text("".join(ln + "\n" for ln in lines[start:end]),
                                         encoding="utf-8")
    out = tmp_path / "enc-text"
    # the two large files in several blocks each, the small ones packed several to a task
    settings = {"spark.sql.files.maxPartitionBytes": "16k", "spark.sql.files.openCostInBytes": "0"}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        encode_corpus(spark, Config(input=str(src / "text"), input_format="text",
                                    output=str(out), tokenizer=str(run_dir)))
    finally:
        for key in settings:
            spark.conf.unset(key)
    table = read_output(out).sort_by([("file", "ascending"), ("block", "ascending"),
                                      ("row", "ascending")])
    assert table.column_names == ["file", "block", "row", "ids"]
    keys = list(zip(*(table.column(c).to_pylist() for c in ("file", "block", "row"))))
    blocks: dict[tuple, list[int]] = {}
    for f, b, r in keys:
        blocks.setdefault((f, b), []).append(r)
    per_file = Counter(f.rsplit("/", 1)[-1] for f, _ in blocks)
    assert per_file["a.txt"] >= 2 and per_file["b.txt"] >= 2, per_file  # split in blocks
    assert all(rs == list(range(len(rs))) for rs in blocks.values())  # 0, 1, ... in each
    assert table.column("ids").to_pylist() == [oracle(ln) for ln in lines]

    with pytest.raises(ConfigError, match="'num_partitions': a text input whose only column "
                                          "is the text"):
        encode_corpus(spark, Config(input=str(src / "text"), input_format="text",
                                    output=str(tmp_path / "enc-text-2"),
                                    tokenizer=str(run_dir), num_partitions=3))

    # JSON lines whose only field is the text: keyed and numbered as text files are
    (src / "json-text").mkdir()
    with open(src / "json-text" / "part-0.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    out = tmp_path / "enc-json-text"
    encode_corpus(spark, Config(input=str(src / "json-text"), input_format="json",
                                output=str(out), tokenizer=str(run_dir)))
    table = read_output(out).sort_by([("block", "ascending"), ("row", "ascending")])
    assert table.column_names == ["file", "block", "row", "ids"]
    assert table.column("ids").to_pylist() == [oracle(t) for t in texts]

    # input columns that happen to be named file, block and row are key columns like any
    (src / "named").mkdir()
    pq.write_table(pa.table({"file": ["x"] * 3, "block": [0] * 3, "row": [5, 6, 7],
                             "text": texts[:3]}), src / "named" / "part-0.parquet")
    out = tmp_path / "enc-named"
    encode_corpus(spark, Config(input=str(src / "named"), output=str(out),
                                tokenizer=str(run_dir)))
    table = read_output(out).sort_by("row")
    assert table.column("row").to_pylist() == [5, 6, 7]
    assert table.column("ids").to_pylist() == [oracle(t) for t in texts[:3]]


def test_an_encode_to_a_remote_output_is_checked_once_the_session_is_there(run_dir, tmp_path):
    """Before Spark starts (the job's first check) an output on another filesystem cannot be
    looked at: it is left for the check with the session, not a NeedsSpark traceback."""
    from pipeline.encode_corpus import check_encode_config

    check_encode_config(Config(tokenizer=str(run_dir), input=str(tmp_path),
                               output="hdfs://namenode:8020/encoded"))


def test_an_interrupted_encode_leaves_no_staging_folder(spark, run_dir, held_out, tmp_path,
                                                        monkeypatch):
    """A SIGTERM (Terminated, a KeyboardInterrupt) while the tasks write: the staging folder
    goes (on an object store the output itself is the staging folder, which would then sit
    there without _encode.json and make every rerun refuse it), the output is untouched, and
    a rerun encodes."""
    from pipeline import encode_corpus as enc

    out = tmp_path / "encoded"
    real = enc._encode_into

    def killed(spark, cfg, plan, source, tmp, progress):
        real(spark, cfg, plan, source, tmp, progress)  # the part files are written
        raise KeyboardInterrupt

    monkeypatch.setattr(enc, "_encode_into", killed)
    cfg = Config(tokenizer=str(run_dir), input=str(held_out), output=str(out))
    with pytest.raises(KeyboardInterrupt):
        encode_corpus(spark, cfg)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == []
    monkeypatch.setattr(enc, "_encode_into", real)
    assert encode_corpus(spark, cfg).stats["stats"]["rows"] > 0


def test_encode_names_and_keys_that_spark_reads_otherwise(spark, run_dir, tmp_path):
    """Cases Spark's path met with a traceback, a wrong message or duplicate rows:
    - a key column named with a dot ("meta.id": F.col read it as field id of a struct meta);
    - an ids column spelled as a key column in another case (Spark's writer compares names
      case-insensitively, so it failed after the encode with an AnalysisException);
    - a row error of a JSON input named its file and block but not its row (the row was
      numbered after the encode);
    - inputs that overlap (a folder and a file in it) were encoded twice under the same keys,
      on both paths."""
    only_text = tmp_path / "only-text"
    only_text.mkdir()
    texts = [f"row {i} of text" if i != 3 else f"row 3 holds {EOT} here" for i in range(5)]
    (only_text / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    with pytest.raises(ConfigError, match=r'"block": 0, "row": 3\}: the text contains the '
                                          r'special token'):
        encode_corpus(spark, Config(input=str(only_text), input_format="json",
                                    output=str(tmp_path / "e"), tokenizer=str(run_dir)))
    src = tmp_path / "json"
    src.mkdir()
    rows = [{"meta.id": i, "text": f"row {i} of text"} for i in range(5)]
    (src / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    encode_corpus(spark, Config(input=str(src), input_format="json", output=str(tmp_path / "k"),
                                tokenizer=str(run_dir), key_columns=["meta.id"]))
    table = read_output(tmp_path / "k")
    assert sorted(table.column("meta.id").to_pylist()) == list(range(5))
    oracle = oracle_encoder(run_dir)
    assert dict(zip(table.column("meta.id").to_pylist(), table.column("ids").to_pylist())) \
        == {r["meta.id"]: oracle(r["text"]) for r in rows}

    pq_src = tmp_path / "pq"
    pq_src.mkdir()
    pq.write_table(pa.table({"text": ["one row", "another row"]}), pq_src / "a.parquet")
    with pytest.raises(ConfigError, match="'ids_column': 'FILE' is also a key column"):
        encode_corpus(spark, Config(input=str(pq_src), output=str(tmp_path / "c"),
                                    tokenizer=str(run_dir), ids_column="FILE"))
    for io, source in (("auto", pq_src), ("spark", pq_src)):
        with pytest.raises(ConfigError, match="is in more than one of the inputs"):
            encode_corpus(spark, Config(input=f"{source},{source}/a.parquet", encode_io=io,
                                        output=str(tmp_path / f"o-{io}"),
                                        tokenizer=str(run_dir)))
