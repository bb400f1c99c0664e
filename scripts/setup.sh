#!/usr/bin/env bash
# Install everything curvine-py needs on a fresh Debian/Ubuntu machine, then the
# package itself into .venv (editable, with the test extras). Safe to run again:
# it only calls apt-get when something is missing and pip when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# fio: tests/test_fio.py verifies data written through a mount (skipped without it);
# openssl: `curvine local up --tls` makes its CA and certificate with it;
# stress-ng: tests/test_fs_stress.py runs its file-system stressors on a mount
APT_PACKAGES=(fuse3 libfuse3-dev pkg-config gcc python3-venv fio openssl stress-ng)

missing=()
if command -v dpkg >/dev/null 2>&1; then
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
else
  # Not Debian: check for the tools instead of the packages.
  for cmd in fusermount3 pkg-config gcc fio openssl stress-ng; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
  done
fi

if ((${#missing[@]})); then
  echo "setup: missing: ${missing[*]}" >&2
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: no apt-get here; install fuse3, libfuse3 headers, pkg-config, gcc, fio, openssl and stress-ng yourself" >&2
    exit 1
  fi
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup: run as root or install sudo" >&2; exit 1; }
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${APT_PACKAGES[@]}"
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

# Reinstall only when pyproject.toml changed or an import is broken.
stamp=.venv/.curvine-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] ||
   ! .venv/bin/python -c 'import curvine.cli.main, pyfuse3, trio, grpc, lmdb, pytest, grpc_tools' 2>/dev/null; then
  .venv/bin/pip install -q -e '.[test]'
  echo "$want" > "$stamp"
fi

# PyPI's pyfuse3 has no fallocate handler (every fallocate(2) on a mount fails with
# EOPNOTSUPP), nor the kernel's symlink and directory caches; replace it with 3.5.0 +
# scripts/pyfuse3/*.patch (fallocate, cache-symlinks, cache-readdir, read-queued).
# Returns at once when that build is already installed; pip keeps it afterwards (it
# satisfies pyfuse3>=3.4).
bash scripts/pyfuse3/build.sh .venv
