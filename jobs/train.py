"""spark-submit jobs/train.py (--input PATH[,PATH...] | --input-table NAME | --words WORDS_DIR)
    --output RUN_DIR (--vocab-size N | --num-merges N) [options]

Trains a byte-level BPE tokenizer end to end and writes a run directory. With no corpus given
it trains the sample run: data/sample, 4,096 tokens (conf/default.toml).

Exit code 0 only when RUN_DIR/run.json (written last) exists; otherwise non-zero, and the last
line of output is a one-line reason. Rerunning a finished run is a no-op that says where the
output is; rerunning an interrupted one resumes from its newest checkpoint.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.cli import run_job  # noqa: E402
from pipeline.config import Config  # noqa: E402


def main(cfg: Config) -> int:
    from pipeline import fsutil
    from pipeline.spark_session import build_session
    from pipeline.train import check_train_config, summary, train

    check_train_config(cfg)  # local places: before Spark starts
    t0 = time.monotonic()
    spark = build_session(cfg, "spark-bpe train", deferred=True)
    try:
        result = train(spark, cfg, session_seconds=time.monotonic() - t0)
        complete = fsutil.exists(spark, fsutil.join(result.run_dir, "run.json"))
    finally:
        spark.stop()
    if not complete:
        raise RuntimeError(f"training ended but {result.run_dir}/run.json was not written")
    if result.already_done:
        print(f"already complete, nothing to do: tokenizer in {result.run_dir}")
    else:
        print(f"{summary(len(result.merges), result.stats)}: tokenizer written to "
              f"{result.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(run_job("train", __doc__, main))
