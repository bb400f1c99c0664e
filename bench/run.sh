#!/usr/bin/env bash
# Install what is missing (scripts/setup.sh), then run `curvine bench` with the given
# arguments: a local cluster beside a plain directory on the same disk, the workloads
# of issue 3, a table of medians and ratios, and bench-results.json in the current
# directory. As root it drops the page cache before cold reads.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bash "$repo/scripts/setup.sh"
exec "$repo/.venv/bin/curvine" bench "$@"
