"""spark-submit jobs/count_words.py (--input PATH[,PATH...] | --input-table NAME)
    --output WORDS_DIR [--input-format F] [--input-weights W,...] [--pattern P] [options]

Scans a corpus (Parquet, or --input-format json|text|orc|csv|delta; several sources, each
counted --input-weights times; or a catalog table) and writes the reusable word table (word,
count, first_seen).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.cli import run_job  # noqa: E402
from pipeline.config import Config  # noqa: E402


def main(cfg: Config) -> int:
    from pipeline.count.word_count import count_words
    from pipeline.spark_session import build_session

    spark = build_session(cfg, "spark-bpe count_words", deferred=True)
    try:
        table = count_words(spark, cfg)
    finally:
        spark.stop()
    print(f"word table written to {table.path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_job("count", __doc__, main))
