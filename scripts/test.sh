#!/usr/bin/env bash
# Install what is missing, check the generated protobuf modules, run the test suite.
# Exits non-zero on any failure (including "no tests collected").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python proto/generate.py --check
# LMCache and a CPU torch for tests/test_lmcache.py (about 1.5 GiB, 1-3 minutes the
# first time); when they cannot be installed, that test skips and the reason is above.
if [ "${CURVINE_SKIP_LMCACHE_INSTALL:-0}" != 1 ]; then
  bash scripts/install-lmcache.sh ||
    echo "test.sh: LMCache not installed (reason above); tests/test_lmcache.py will skip" >&2
fi
rc=0
# Two pytest workers (pytest-xdist): most tests wait on daemons, timers and disks more
# than they use a core; work stealing balances the long ones.
.venv/bin/python -m pytest -q -n 2 --dist worksteal "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
