#!/usr/bin/env bash
# Install what is missing, check the generated protobuf modules, run the test suite.
# Exits non-zero on any failure (including "no tests collected").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python proto/generate.py --check
rc=0
.venv/bin/python -m pytest -q "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
