#!/usr/bin/env bash
# Install what is missing, then run the demo: a local cluster where mount 0 writes
# KV-cache chunks the way LMCache does and mount 1 reads them back.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/curvine demo "$@"
