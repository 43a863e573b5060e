#!/usr/bin/env bash
# Test-only setup, on top of scripts/setup.sh: headless Chromium for the report rendering test
# (apt, when missing and we are root). Under CI (CI=true) the test fails without it, so a failed
# install is an error there; elsewhere the test is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

have_chromium() {
  command -v chromium-headless-shell >/dev/null 2>&1 || command -v chromium >/dev/null 2>&1 \
    || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1
}

if ! have_chromium; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup_tests: installing headless Chromium for the report rendering test" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends chromium-headless-shell fonts-dejavu-core >/dev/null; } \
      || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium fonts-dejavu-core >/dev/null || true
  fi
fi
if ! have_chromium; then
  if [ "${CI:-}" = "true" ]; then
    echo "error: headless Chromium could not be installed; CI needs it for tests/test_report.py" >&2
    exit 1
  fi
  echo "setup_tests: no Chromium; the report rendering test will be skipped" >&2
fi
