#!/usr/bin/env bash
# Install curvine-py and the patched pyfuse3 it mounts with into a venv or a Python
# prefix: the one install path of scripts/setup.sh, deploy/k8s/Dockerfile and
# docs/deploy-gpu-node.md.
#
#   scripts/install.sh [--editable] [--extras NAMES] [--slim] PREFIX
#
# PREFIX is a venv or a Python prefix with bin/python (the image's /usr/local); a
# PREFIX without one becomes a new venv of $PYTHON (default python3, >= 3.11).
#   --editable      install the package from this checkout in place (development)
#   --extras NAMES  optional dependencies, e.g. "test"
#   --slim          afterwards remove the build-only Debian packages this run installed
#                   (gcc, headers, pkg-config, patch) and apt's lists: for images
#
# Steps: the Debian packages a mount and the pyfuse3 build need, when missing (apt-get
# waits for another apt/dpkg's lock, scripts/apt.sh); pyfuse3 3.5.0 with
# scripts/pyfuse3/*.patch (scripts/pyfuse3/build.sh, a cached wheel when there is one);
# then curvine-py, which keeps that pyfuse3 (it satisfies pyfuse3>=3.4). A plain
# `pip install` of curvine-py gets PyPI's pyfuse3 instead: its mounts work, without
# fallocate and the kernel's listing and symlink caches (`curvine doctor` says so).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
# shellcheck source=scripts/apt.sh
. "$here/apt.sh"

die() { echo "install.sh: $*" >&2; exit 1; }

editable=0 extras="" slim=0 prefix=""
while (($#)); do
  case "$1" in
    --editable) editable=1 ;;
    --extras) shift; extras="${1:?--extras needs a value}" ;;
    --extras=*) extras="${1#--extras=}" ;;
    --slim) slim=1 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [ -z "$prefix" ] || die "one PREFIX only (got $prefix and $1)"; prefix="$1" ;;
  esac
  shift
done
[ -n "$prefix" ] || die "usage: scripts/install.sh [--editable] [--extras NAMES] [--slim] PREFIX"

# fuse3: fusermount3 (every mount); the rest only builds pyfuse3
RUNTIME_PACKAGES=(fuse3)
BUILD_PACKAGES=(libfuse3-dev pkg-config gcc libc6-dev patch)

installed_now=()
if command -v dpkg >/dev/null 2>&1; then
  read -r -a missing <<<"$(apt_missing "${RUNTIME_PACKAGES[@]}" "${BUILD_PACKAGES[@]}")"
  if ((${#missing[@]})); then
    command -v apt-get >/dev/null 2>&1 || die "missing Debian packages ${missing[*]} and no apt-get"
    echo "install.sh: installing ${missing[*]}" >&2
    apt_install "${missing[@]}" || die "apt-get install ${missing[*]} failed"
    installed_now=("${missing[@]}")
  fi
else
  # Not Debian: check for the tools instead of the packages.
  for cmd in fusermount3 pkg-config gcc patch; do
    command -v "$cmd" >/dev/null 2>&1 ||
      die "missing $cmd: install fuse3, libfuse3's headers, pkg-config, gcc and patch"
  done
fi

if [ -x "$prefix/bin/python" ]; then
  py="$prefix/bin/python"
else
  PYTHON="${PYTHON:-python3}"
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
    die "curvine-py needs Python >= 3.11 (found: $("$PYTHON" -V 2>&1 || echo none)); set PYTHON=/path/to/python3.11"
  "$PYTHON" -m venv "$prefix" || die "cannot make a venv at $prefix (Debian: apt-get install python3-venv)"
  py="$prefix/bin/python"
fi
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
  die "$py is older than Python 3.11"
"$py" -m pip --version >/dev/null 2>&1 || die "$py has no pip"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

# The patched pyfuse3 first: pip then keeps it for curvine-py's pyfuse3>=3.4.
bash "$here/pyfuse3/build.sh" "$prefix"

spec="$root"
[ -z "$extras" ] || spec="$root[$extras]"
if ((editable)); then
  "$py" -m pip install -q -e "$spec"
else
  "$py" -m pip install -q "$spec"
fi
# Nothing above may have replaced it (returns at once when it is still there).
bash "$here/pyfuse3/build.sh" "$prefix" >/dev/null

if ((slim)) && ((${#installed_now[@]})); then
  purge=()
  for pkg in "${installed_now[@]}"; do
    [[ " ${BUILD_PACKAGES[*]} " == *" $pkg "* ]] && purge+=("$pkg")
  done
  if ((${#purge[@]})); then
    apt_get_waiting purge -y "${purge[@]}"
    apt_get_waiting autoremove -y
  fi
  rm -rf /var/lib/apt/lists/*
fi

"$prefix/bin/curvine" doctor --install-only >&2 ||
  die "the installed curvine-py does not work (curvine doctor above)"
