#!/usr/bin/env bash
# Install LMCache and a CPU build of torch into the project venv (.venv), for
# tests/test_lmcache.py (LMCache's own engine and fs connector on curvine mounts).
#
# Exits 0 when `import lmcache` works afterwards (or already did), non-zero with a
# one-line reason on stderr otherwise; scripts/test.sh then lets that test skip.
#
# Why not `pip install lmcache`: lmcache 0.5.6 declares grpcio-observability==1.78.0,
# which pins grpcio==1.78.0 (curvine needs grpcio==1.85.1), and CUDA-only packages
# (cupy-cuda13x, cuda-python, nvtx, cufile-python) plus cloud clients that a CPU run
# of the engine and its fs connector never imports. So: torch first (the CPU wheel on
# this machine's disk), lmcache without dependencies, then the dependencies that its
# engine and storage backends import, with lmcache's own version bounds, while every
# package already in the venv keeps its version.
#
# Env: VENV (default .venv), LMCACHE_VERSION (0.5.6), TORCH_VERSION (2.13.0).
# Cost on the 2-core CI machine: 1-3 minutes and about 1.5 GiB in the venv
# (docs/lmcache.md, "Installing LMCache without a GPU").
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
LMCACHE_VERSION="${LMCACHE_VERSION:-0.5.6}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
NEED_MIB=2000   # torch 0.9 GiB + lmcache and its dependencies 0.5 GiB, plus pip's unpacking

fail() { echo "install-lmcache: $*" >&2; exit 1; }

[ -x "$PY" ] || fail "no $PY; run scripts/setup.sh first"

# What tests/test_lmcache.py needs: torch without CUDA, and LMCache's engine and fs
# connector importable.
check_py='
import sys, torch
import lmcache, lmcache.v1.cache_engine, lmcache.v1.storage_backend.connector.fs_connector
from importlib.metadata import version
if torch.version.cuda is not None:
    sys.exit("torch %s is a CUDA build" % torch.__version__)
print("torch %s, lmcache %s" % (torch.__version__, version("lmcache")))
'
check() { LMCACHE_TRACK_USAGE=false "$PY" -c "$check_py" 2>&1 | tail -1; }

if have="$(check)" && [[ "$have" == "torch $TORCH_VERSION"*", lmcache $LMCACHE_VERSION" ]]; then
  echo "install-lmcache: already installed ($have)"
  exit 0
fi

avail_mib=$(( $(df -Pk "$VENV" | awk 'NR==2 {print $4}') / 1024 ))
if (( avail_mib < NEED_MIB )); then
  fail "needs about $NEED_MIB MiB free on the file system of $VENV, has $avail_mib MiB"
fi

start=$(date +%s)
constraints="$(mktemp)"
pip_log="$(mktemp)"
trap 'rm -f "$constraints" "$pip_log"' EXIT
# Everything already in the venv (grpcio, protobuf, prometheus_client, ...) stays at
# its version; torch is the one package this script may replace.
"$PY" -m pip freeze --exclude-editable 2>/dev/null \
  | grep -v -i -e '^#' -e ' @ ' -e '^-e' -e '^torch==' > "$constraints" || true
echo "torch==$TORCH_VERSION" >> "$constraints"

step_start=$start
step_done() {  # printed, so that a slow CI install shows where the time went
  local now; now=$(date +%s)
  echo "install-lmcache: $1 took $(( now - step_start )) s"
  step_start=$now
}

pip_install() {
  local rc=0
  "$PY" -m pip install -q --disable-pip-version-check "$@" > "$pip_log" 2>&1 || rc=$?
  # pip's warnings about this machine's index folders that lack a package, and about
  # lmcache's declared dependencies left out on purpose, are noise here.
  grep -v -e "^WARNING: Location 'file://" -e "requires .*, which is not installed" \
          -e "but you have .* which is incompatible" -e "dependency conflicts" \
          -e "^ERROR: pip's dependency resolver" "$pip_log" >&2 || true
  return "$rc"
}

# 1. torch: the exact version, so that pip takes the CPU wheel from the machine's disk
#    instead of a several-GB CUDA build from PyPI.
pip_install -c "$constraints" "torch==$TORCH_VERSION" || fail "pip could not install torch==$TORCH_VERSION"
"$PY" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)' 2>/dev/null \
  || fail "torch==$TORCH_VERSION installed as a CUDA build; expected the CPU wheel (pip find-links)"
step_done "torch"

# 2. lmcache itself, without its declared dependencies (see the top of this file).
pip_install --no-deps "lmcache==$LMCACHE_VERSION" || fail "pip could not install lmcache==$LMCACHE_VERSION"
step_done "lmcache"

# 3. What `lmcache.v1.cache_engine` and the fs connector import, with lmcache's bounds,
#    except its prometheus_client<=0.24.1: curvine's metrics take a newer one, and the
#    engine works with it (tests/test_lmcache.py ran with 0.26).
pip_install -c "$constraints" \
  aiofile aiofiles aiohttp cachetools cryptography msgspec numba 'numpy<=2.2.6' \
  'prometheus_client>=0.18.0' psutil py-cpuinfo pyyaml 'pyzmq>=25.0.0' requests \
  sortedcontainers 'transformers>=5.4' \
  || fail "pip could not install lmcache's dependencies"
step_done "lmcache's dependencies"

have="$(check)" || fail "lmcache does not import after the install: $have"
[[ "$have" == "torch $TORCH_VERSION"*", lmcache $LMCACHE_VERSION" ]] || fail "unexpected versions after the install: $have"
size="$(du -sh "$VENV" | cut -f1)"
echo "install-lmcache: installed $have in $(( $(date +%s) - start )) s; $VENV is now $size"
