# Sourced by scripts/install.sh and scripts/setup.sh: Debian packages, installed with
# apt-get that waits for another apt/dpkg process's lock instead of failing.
#
#   apt_missing PKG...   prints the packages that are not installed (space-separated)
#   apt_install PKG...   apt-get update, then apt-get install -y PKG... (as root or
#                        with sudo), each waiting up to CURVINE_APT_LOCK_WAIT seconds
#                        (default 300) for a lock held by another apt or dpkg
#
# A freshly booted machine often runs unattended-upgrades or cloud-init's apt-get
# when these scripts start; apt-get then exits 100 at once ("Could not get lock").
# apt's own DPkg::Lock::Timeout covers the dpkg frontend lock of `install`, not the
# lists lock of `update` on every apt version, so every call is also retried while
# its error is a lock held by someone else, until the deadline.

CURVINE_APT_LOCK_WAIT="${CURVINE_APT_LOCK_WAIT:-300}"
CURVINE_APT_RETRY_EVERY="${CURVINE_APT_RETRY_EVERY:-5}"
_apt_sudo=()

apt_missing() {
  local pkg out=()
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || out+=("$pkg")
  done
  echo "${out[*]}"
}

# apt-get "$@", retried while another process holds an apt or dpkg lock.
apt_get_waiting() {
  local deadline=$((SECONDS + CURVINE_APT_LOCK_WAIT)) err rc said=0
  err="$(mktemp "${TMPDIR:-/tmp}/curvine-apt.XXXXXX")"
  while true; do
    rc=0
    "${_apt_sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get -o DPkg::Lock::Timeout="$CURVINE_APT_LOCK_WAIT" "$@" 2>"$err" || rc=$?
    if [ "$rc" -eq 0 ]; then
      cat "$err" >&2
      rm -f "$err"
      return 0
    fi
    if ! grep -qE "Could not get lock|Unable to lock|Unable to acquire the dpkg frontend lock" "$err"; then
      cat "$err" >&2
      rm -f "$err"
      return "$rc"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      cat "$err" >&2
      rm -f "$err"
      echo "apt: another apt/dpkg process still holds its lock after ${CURVINE_APT_LOCK_WAIT}s;" \
           "wait for it (ps -C apt-get,apt,dpkg,unattended-upgr) and run this again" >&2
      return "$rc"
    fi
    if [ "$said" -eq 0 ]; then
      echo "apt: another apt/dpkg process holds its lock ($(grep -m1 -oE 'lock [^ ]+|process [0-9]+[^.]*' "$err" | head -n1));" \
           "waiting up to ${CURVINE_APT_LOCK_WAIT}s for it (apt-get $1)" >&2
      said=1
    fi
    sleep "$CURVINE_APT_RETRY_EVERY"
  done
}

apt_install() {
  _apt_sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "apt: run as root or install sudo" >&2; return 1; }
    _apt_sudo=(sudo)
  fi
  apt_get_waiting update -qq || return $?
  apt_get_waiting install -y --no-install-recommends "$@"
}
