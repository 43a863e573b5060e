#!/usr/bin/env bash
# Quick start: set up Python (and Java if missing), then train a tokenizer on the shipped sample
# corpus with spark-submit. Extra arguments go to jobs/train.py (e.g. --vocab-size 8192).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
export SPARK_CONF_DIR="${SPARK_CONF_DIR:-$PWD/conf/spark}"  # quiet Spark log (yours wins)
exec .venv/bin/spark-submit --master "local[*]" jobs/train.py "$@"
