#!/usr/bin/env bash
# Build pyfuse3 3.5.0 with fallocate.patch (adds Operations.fallocate, wired to the
# FUSE lowlevel fallocate op; stock pyfuse3 leaves it NULL, so every fallocate(2)
# on a mount fails with EOPNOTSUPP) and cache-symlinks.patch (adds
# Operations.enable_cache_symlinks: the kernel keeps symlink targets in its page cache,
# FUSE_CAP_CACHE_SYMLINKS, instead of a READLINK request per path walk through a
# symlink) and cache-readdir.patch (Operations.opendir may return a FileInfo whose
# cache_readdir and keep_cache let the kernel keep a directory's entries: FOPEN_CACHE_DIR,
# FOPEN_KEEP_CACHE) and read-queued.patch (the FUSE device is non-blocking and the
# session loop reads a request already queued at once, waiting for readability only
# when there is none: no trio scheduler pass and epoll registration per request) and
# install it into a venv.
#
#   scripts/pyfuse3/build.sh [VENV]     (VENV defaults to the repository's .venv)
#
# Idempotent: returns at once when the venv's pyfuse3 already has the patches. The
# wheel it builds is kept in ~/.cache/curvine-py/wheels (XDG_CACHE_HOME), under a key
# of the sdist, the patches, the Python and libfuse versions, so another venv on this
# machine gets it in seconds. Needs pkg-config, gcc, patch and libfuse3's headers
# (scripts/install.sh installs them); setuptools, setuptools_scm and Cython come from
# PyPI into pip's build environment. scripts/install.sh is the one way in: it runs this.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${1:-$root/.venv}"
[ -d "$venv" ] && venv="$(cd "$venv" && pwd)"
py="$venv/bin/python"

VERSION=3.5.0
SHA256=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
PATCHES=("$here/fallocate.patch" "$here/cache-symlinks.patch" "$here/cache-readdir.patch"
         "$here/read-queued.patch")
# pip list / pip freeze show this local version for the patched build.
LOCAL_VERSION="$VERSION+curvine.fallocate.symlinks.readdir.readqueued"

die() { echo "pyfuse3/build.sh: $*" >&2; exit 1; }

[ -x "$py" ] || die "no python at $py (create the venv first, e.g. scripts/setup.sh)"

# Patched = this build's version (the patches are applied before the .pyx is
# cythonized) AND the compiled extension has the fallocate callback and FileInfo's
# cache_readdir (a build from the shipped, stale __init__.c would have neither).
is_patched() {
  LOCAL_VERSION="$LOCAL_VERSION" "$py" - <<'EOF' 2>/dev/null
import importlib.metadata, os, sys, pyfuse3
ok = (importlib.metadata.version("pyfuse3") == os.environ["LOCAL_VERSION"]
      and hasattr(pyfuse3.Operations, "fallocate")
      and hasattr(pyfuse3.Operations, "enable_cache_symlinks")
      and hasattr(pyfuse3.FileInfo(), "cache_readdir"))
if ok:
    with open(pyfuse3.__file__, "rb") as f:
        binary = f.read()
    ok = b"fuse_fallocate_async" in binary and hasattr(pyfuse3, "_curvine_read_queued")
sys.exit(0 if ok else 1)
EOF
}

if is_patched; then
  echo "pyfuse3/build.sh: patched pyfuse3 already in $venv, nothing to do"
  exit 0
fi

# This wheel in place of any pyfuse3, then what it needs (trio, ...; a fresh venv has
# none of it, and is_patched imports pyfuse3)
install_wheel() {
  "$py" -m pip install -q --no-deps --force-reinstall --no-index "$1" &&
    "$py" -m pip install -q "$1"
}

cache="${XDG_CACHE_HOME:-$HOME/.cache}/curvine-py"
# A wheel built here before for the same sources, Python and libfuse
key="$( { echo "$SHA256 $LOCAL_VERSION"; cat "${PATCHES[@]}";
          "$py" -c 'import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())';
          pkg-config --modversion fuse3 2>/dev/null || echo "no-fuse3"; } | sha256sum | cut -c1-16)"
wheels="$cache/wheels/pyfuse3-$key"
for whl in "$wheels"/pyfuse3-*.whl; do
  [ -f "$whl" ] || continue
  if install_wheel "$whl" >/dev/null 2>&1 && is_patched; then
    echo "pyfuse3/build.sh: installed the cached build of pyfuse3 $LOCAL_VERSION into $venv ($whl)"
    exit 0
  fi
  rm -rf "$wheels"  # a wheel that does not install or lacks the patches: build again
done

for cmd in pkg-config gcc patch sha256sum tar; do
  command -v "$cmd" >/dev/null 2>&1 || die "missing $cmd"
done
pkg-config --exists fuse3 || die "libfuse3 headers not found by pkg-config (apt-get install libfuse3-dev)"

work="$(mktemp -d "${TMPDIR:-/tmp}/pyfuse3-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log="$work/build.log"
start=$SECONDS

fail() {
  echo "pyfuse3/build.sh: $* (last lines of the log follow)" >&2
  tail -n 25 "$log" >&2 || true
  exit 1
}

# Keep the checked sdist so that a fresh venv does not download it again.
sdist="$cache/pyfuse3-$VERSION.tar.gz"
if [ ! -f "$sdist" ] || [ "$(sha256sum "$sdist" | cut -d' ' -f1)" != "$SHA256" ]; then
  mkdir -p "$cache"
  # --no-binary pyfuse3, not :all: (that also builds pip's build environment for the
  # sdist's metadata, Cython included, from source: 13 minutes instead of seconds)
  "$py" -m pip download -q --no-deps --no-binary pyfuse3 -d "$work/dl" "pyfuse3==$VERSION" \
    >"$log" 2>&1 || fail "pip download pyfuse3==$VERSION failed"
  [ -f "$work/dl/pyfuse3-$VERSION.tar.gz" ] || fail "pip download gave no pyfuse3-$VERSION.tar.gz"
  got="$(sha256sum "$work/dl/pyfuse3-$VERSION.tar.gz" | cut -d' ' -f1)"
  [ "$got" = "$SHA256" ] || die "sha256 mismatch for pyfuse3-$VERSION.tar.gz: got $got, want $SHA256"
  mv "$work/dl/pyfuse3-$VERSION.tar.gz" "$sdist"
fi

tar -xzf "$sdist" -C "$work"
src="$work/pyfuse3-$VERSION"
for p in "${PATCHES[@]}"; do
  patch -d "$src" -p1 --forward --quiet <"$p" >>"$log" 2>&1 || fail "$(basename "$p") does not apply"
done
# The sdist ships a pre-generated __init__.c; setuptools compiles that instead of the
# .pyx whenever Cython is missing, and Cython skips a .c newer than its sources.
# Without it the build must cythonize the patched .pyx (or fail loudly).
rm -f "$src/src/pyfuse3/__init__.c"

SETUPTOOLS_SCM_PRETEND_VERSION_FOR_PYFUSE3="$LOCAL_VERSION" \
  "$py" -m pip wheel --no-deps --no-cache-dir -w "$work/wheel" "$src" >>"$log" 2>&1 ||
  fail "building pyfuse3 failed"
whl="$(ls "$work"/wheel/pyfuse3-*.whl 2>/dev/null | head -n1)"
[ -n "$whl" ] || fail "pip wheel made no pyfuse3 wheel"
install_wheel "$whl" >>"$log" 2>&1 || fail "installing the pyfuse3 wheel failed"

is_patched || fail "installed pyfuse3 still lacks the patches"
if mkdir -p "$wheels" 2>/dev/null && cp "$whl" "$wheels/.tmp.$$" 2>/dev/null; then
  mv "$wheels/.tmp.$$" "$wheels/$(basename "$whl")"
fi
echo "pyfuse3/build.sh: built and installed pyfuse3 $LOCAL_VERSION into $venv in $((SECONDS - start))s"
