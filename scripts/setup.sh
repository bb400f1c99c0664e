#!/usr/bin/env bash
# Install everything curvine-py's tests and demo need on a fresh Debian/Ubuntu machine,
# then the package itself into .venv (editable, with the test extras) through
# scripts/install.sh, the install path the image and the GPU-node guide use too. Safe
# to run again: apt-get runs only when something is missing, pip only when
# pyproject.toml changed. apt-get waits (up to 5 minutes) for another apt/dpkg's lock.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/apt.sh
. scripts/apt.sh

# Only the tests and the demo need these (scripts/install.sh brings what a mount needs):
# fio: tests/test_fio.py verifies data written through a mount (skipped without it);
# openssl: `curvine local up --tls` makes its CA and certificate with it;
# stress-ng: tests/test_fs_stress.py runs its file-system stressors on a mount;
# python3-venv: the venv below, and the ones tests/test_install.py makes;
# etcd-server: the master group's consensus engine, started by the tests (tests/etcd_util.py)
# and by `curvine local up --masters 3` (Debian's package does not start a service here)
DEV_PACKAGES=(python3-venv fio openssl stress-ng etcd-server)

if command -v dpkg >/dev/null 2>&1; then
  read -r -a missing <<<"$(apt_missing "${DEV_PACKAGES[@]}")"
  if ((${#missing[@]})); then
    echo "setup: missing: ${missing[*]}" >&2
    command -v apt-get >/dev/null 2>&1 ||
      { echo "setup: no apt-get here; install ${missing[*]} yourself" >&2; exit 1; }
    apt_install "${missing[@]}"
  fi
else
  for cmd in fio openssl stress-ng etcd; do
    command -v "$cmd" >/dev/null 2>&1 || { echo "setup: missing $cmd; install it yourself" >&2; exit 1; }
  done
fi

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "setup: curvine-py needs Python >= 3.11 (found: $("$PYTHON" -V 2>&1 || echo none));" \
       "set PYTHON=/path/to/python3.11" >&2
  exit 1
fi

# A venv whose creation was interrupted has a python but no pip: make it again.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  "$PYTHON" -m venv --clear .venv
fi

# Install again only when pyproject.toml or an install script changed, or an import is
# broken; install.sh also makes sure the venv has the patched pyfuse3
# (scripts/pyfuse3/*.patch: fallocate, cache-symlinks, cache-readdir, read-queued).
stamp=.venv/.curvine-installed
want="$(cat pyproject.toml scripts/install.sh scripts/pyfuse3/* | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] ||
   ! .venv/bin/python -c 'import curvine.cli.main, pyfuse3, trio, grpc, lmdb, pytest, grpc_tools' 2>/dev/null ||
   ! .venv/bin/curvine doctor --install-only >/dev/null 2>&1; then
  bash scripts/install.sh --editable --extras test .venv
  echo "$want" > "$stamp"
fi
