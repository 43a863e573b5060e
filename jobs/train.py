"""spark-submit jobs/train.py (--input PATH | --words WORDS_DIR) --output RUN_DIR [options]

Trains a byte-level BPE tokenizer end to end and writes a run directory. With no arguments it
trains on the sample corpus shipped in data/sample (see conf/default.toml).
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.cli import run_job  # noqa: E402
from pipeline.config import Config  # noqa: E402


def main(cfg: Config) -> int:
    from pipeline.spark_session import build_session
    from pipeline.train import train

    t0 = time.time()
    spark = build_session(cfg, "spark-bpe train")
    try:
        result = train(spark, cfg, session_seconds=time.time() - t0)
    finally:
        spark.stop()
    if result.already_done:
        print(f"already complete: tokenizer in {result.run_dir}")
    else:
        print(f"trained {len(result.merges)} merges: tokenizer written to {result.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(run_job("train", __doc__, main))
