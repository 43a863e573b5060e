#!/usr/bin/env bash
# Idempotent setup: Java 17+ (apt, if missing and we are root), a .venv with spark-bpe, PySpark
# (the [spark] extra) and the test dependencies. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

java_major() {
  command -v java >/dev/null 2>&1 || { echo 0; return; }
  java -version 2>&1 | awk -F'"' '/version/ {print $2}' | awk -F. '{print ($1 == "1") ? $2 : $1}'
}

if [ "$(java_major)" -lt 17 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing Java (JRE 17+) with apt-get" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null \
      || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-21-jre-headless >/dev/null \
      || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null
  else
    echo "error: Java 17 or newer is required (install a JDK/JRE 17+ and put java on PATH)" >&2
    exit 1
  fi
fi

PY="${PYTHON:-python3}"
venv_ok() { [ -x .venv/bin/python ] && .venv/bin/python -m pip --version >/dev/null 2>&1; }
if ! venv_ok; then
  # (a venv left without pip by an earlier failed attempt is made again: --clear)
  if ! "$PY" -m venv --clear .venv >/dev/null 2>&1; then
    ver="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      echo "setup: installing python3-venv with apt-get (Debian's Python has no venv without it)" >&2
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$ver-venv" >/dev/null \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      "$PY" -m venv --clear .venv
    else
      echo "error: $PY cannot make a virtual environment (on Debian or Ubuntu: apt install" \
           "python$ver-venv), then run this again" >&2
      exit 1
    fi
  fi
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[spark,test]"
echo "setup: ready (.venv, $(java -version 2>&1 | head -n 1))" >&2
