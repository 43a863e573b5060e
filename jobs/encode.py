"""spark-submit jobs/encode.py --tokenizer RUN_DIR --input PATH[,PATH...] --output PATH [options]

Encodes every row of a corpus (Parquet, or --input-format json|text|orc|csv|delta) with a
trained run into Parquet: writes the row's key columns
(--key-columns; default every column but --text-column, or the input file + row) and its token
ids as array<int> (--ids-column, default ids), plus _encode.json with the statistics (rows,
bytes, tokens, bytes per token, tokens per word). A special-token string in the text fails the
job unless --special-in-text special (its id) or text (ordinary text).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.cli import run_job  # noqa: E402
from pipeline.config import Config  # noqa: E402


def main(cfg: Config) -> int:
    from pipeline.encode_corpus import check_encode_config, encode_corpus
    from pipeline.spark_session import build_session

    check_encode_config(cfg)  # local paths: before Spark starts
    spark = build_session(cfg, "spark-bpe encode")
    try:
        result = encode_corpus(spark, cfg)
    finally:
        spark.stop()
    st = result.stats["stats"]
    print(json.dumps({k: st[k] for k in ("rows", "bytes", "tokens", "bytes_per_token",
                                         "tokens_per_word", "seconds", "tokens_per_second")}))
    print(f"encoded {st['rows']} rows into {st['tokens']} tokens: {result.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_job("encode", __doc__, main))
