#!/usr/bin/env bash
# Pack a virtualenv with everything the executors (and a cluster-mode driver) import, for
#   spark-submit --archives dist/spark-bpe-venv.tar.gz#environment \
#                --conf spark.pyspark.python=./environment/bin/python ...
#
#   bash scripts/pack_venv.sh [OUT.tar.gz]        (default: dist/spark-bpe-venv.tar.gz)
#
# It holds numpy, pyarrow, pandas, regex (native code) and the pipeline package itself, at the
# versions of this checkout's .venv when there is one (driver and executors then agree).
# PySpark is left out: Spark puts its own pyspark.zip on the executors' PYTHONPATH.
# venv-pack does not copy the Python interpreter: the cluster nodes need the same Python
# version at the same path as this machine (use a container image or conda-pack otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-dist/spark-bpe-venv.tar.gz}"
PY="${PYTHON:-python3}"
BUILD="$(mktemp -d)"
trap 'rm -rf "$BUILD"' EXIT

pins=()
for pkg in numpy pyarrow pandas regex tiktoken; do  # tiktoken: the fast path of jobs/encode.py
  if [ -x .venv/bin/python ] && v="$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$pkg'))" 2>/dev/null)"; then
    pins+=("$pkg==$v")
  else
    pins+=("$pkg")
  fi
done

"$PY" -m venv "$BUILD/venv"
"$BUILD/venv/bin/python" -m pip install -q --upgrade pip
"$BUILD/venv/bin/python" -m pip install -q venv-pack "${pins[@]}"
# the package itself, not editable and without dependencies (pyspark is only in its [spark]
# extra; the rest is pinned above); built from a copy so
# that no build/ directory is left in the checkout
mkdir -p "$BUILD/src"
cp -r pyproject.toml README.md pipeline "$BUILD/src/"
find "$BUILD/src" -name __pycache__ -prune -exec rm -rf {} +
"$BUILD/venv/bin/python" -m pip install -q --no-deps "$BUILD/src"
"$BUILD/venv/bin/python" -c "import numpy, pyarrow, pandas, regex, pipeline.bpe"
mkdir -p "$(dirname "$OUT")"
"$BUILD/venv/bin/venv-pack" -q -p "$BUILD/venv" -o "$OUT.tmp" --format tar.gz --force
mv -f "$OUT.tmp" "$OUT"
echo "$OUT: $(du -h "$OUT" | cut -f1) ($("$BUILD/venv/bin/python" -V), ${pins[*]})"
