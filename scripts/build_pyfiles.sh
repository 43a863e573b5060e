#!/usr/bin/env bash
# Build the zip that ships the `pipeline` package to executors with spark-submit --py-files.
#
#   bash scripts/build_pyfiles.sh [OUT.zip]        (default: dist/spark_bpe_pyfiles.zip)
#
# Only pure Python is in it (pipeline/*.py). Its native dependencies (regex, numpy, pyarrow,
# pandas) must be installed on the executors or shipped with a packed virtualenv
# (scripts/pack_venv.sh, --archives). Rebuild after every code change; the zip is
# reproducible (sorted entries, fixed timestamps), so an unchanged tree gives the same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-dist/spark_bpe_pyfiles.zip}"
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
mkdir -p "$(dirname "$OUT")"
"$PY" - "$OUT" <<'PYEOF'
import os
import sys
import zipfile

out = sys.argv[1]
tmp = out + ".tmp"
files = sorted(
    os.path.join(d, f)
    for d, dirs, names in os.walk("pipeline")
    if "__pycache__" not in d
    for f in names
    if f.endswith(".py")
)
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
    for path in files:
        info = zipfile.ZipInfo(path.replace(os.sep, "/"), date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        with open(path, "rb") as fh:
            z.writestr(info, fh.read())
os.replace(tmp, out)
print(f"{out}: {len(files)} files of the pipeline package")
PYEOF
