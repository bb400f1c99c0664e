"""The daemons' directories are private: for the daemon's own user, nobody else.

A worker's data dirs hold every cached byte; the master's meta dir (LMDB,
checkpoints, the block token key) and journal dir hold every name.  They are made
0700, and the files in them are created 0600 (explicit modes: a umask can only
take bits away, and ``os.makedirs`` of an existing directory changes nothing).

At start each daemon checks its directories (``private_dir``), not the files in
them: a worker can hold millions of block files, and a directory that is 0700 is
what keeps other users away from everything below it.

* A directory that its group or others can reach in any way (a mode other than
  0700 in those bits, an ACL mask) is made 0700, with one warning line naming it:
  restored from a backup, made by an older version, or by hand with the default
  umask.  Whatever was readable until then may have been read.
* A directory not owned by the daemon's (effective) user is refused
  (``NotOwnedError``; the daemons exit 2 with one line): its owner can read,
  replace or chmod anything in it again, which no mode bit prevents.  That holds
  for a daemon running as root too: a root worker in a directory owned by another
  user would serve what that user planted.  A directory owned by the same uid as
  the daemon is fine, whichever uid that is.
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Iterable

from .errors import CurvineError, ErrorKind

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600


class NotOwnedError(CurvineError):
    """A private directory belongs to another user: the daemon refuses to start."""

    def __init__(self, message: str):
        super().__init__(ErrorKind.PERMISSION, message)


def make_dir(path: str, durable: bool = False) -> bool:
    """Create ``path`` with mode 0700 if it does not exist (parents get the default
    mode); ``durable``: the new entry is fsynced into its parent.  True if it was
    created."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return False
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            return False
    os.chmod(path, DIR_MODE)  # in case the umask took owner bits away
    if durable:
        fsync_dir(os.path.dirname(path) or ".")
    return True


def private_dir(path: str, what: str, subdirs: Iterable[str] = (), scan_depth: int = 0,
                create: bool = True, check_owner: bool = True,
                durable: bool = False) -> list[tuple[str, int]]:
    """Make sure ``path`` and its directories are private to this process's user.

    ``path`` and ``subdirs`` (relative names, parents first) are created 0700 when
    ``create`` (fsynced into their parents when ``durable``), each one only after
    its parent passed the check.  The directories found by listing ``path`` down to
    ``scan_depth`` levels are checked too (only where listings are short: never
    over block files).  A directory not owned by this user raises
    ``NotOwnedError`` (when ``check_owner``); one that group or others can reach is
    made 0700, and one warning names them.  ``what`` names the setting in the
    messages ("worker.data_dirs").  Returns the (path, old mode) of the directories
    made 0700.  OSError (and CurvineError IO for a path that is not a directory)
    pass through."""
    euid = os.geteuid()
    changed: list[tuple[str, int]] = []

    def check(p: str) -> None:
        try:
            st = os.stat(p)
        except FileNotFoundError:
            if create:
                raise
            return  # not made yet: whoever makes it makes it 0700
        if not stat.S_ISDIR(st.st_mode):
            raise CurvineError(ErrorKind.IO, f"{p} ({what}) is not a directory")
        if check_owner and st.st_uid != euid:
            raise NotOwnedError(
                f"{p} ({what}) is owned by uid {st.st_uid}, not by this daemon's user "
                f"(uid {euid}): that user could read or replace what is stored there; "
                f"chown -R {euid} {p}, or run the daemon as uid {st.st_uid}")
        if st.st_mode & 0o077:
            os.chmod(p, DIR_MODE)
            changed.append((p, stat.S_IMODE(st.st_mode)))

    # parents before children: nothing is made in a directory before it passed
    named = list(dict.fromkeys([path] + [os.path.join(path, s) for s in subdirs]))
    for p in named:
        if create:
            make_dir(p, durable)
        check(p)
    if scan_depth > 0:
        for p in _subdirs(path, scan_depth):
            if p not in named:
                check(p)
    if changed:
        first, mode = changed[0]
        more = f" and {len(changed) - 1} more directories under {path}" if len(changed) > 1 else ""
        log.warning("%s (%s) had mode %o%s: made 0700 (other local users could read what "
                    "is stored there until now)", first, what, mode, more)
    return changed


def tighten_file(path: str, what: str) -> bool:
    """Make an existing regular file 0600 if group or others have any access to it
    (one warning); True if it was changed.  A missing file is fine."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o077:
            return False
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    log.warning("%s (%s) had mode %o: made 0600 (other local users could read it until "
                "now)", path, what, stat.S_IMODE(st.st_mode))
    return True


def _subdirs(top: str, depth: int) -> list[str]:
    """Directories below ``top`` down to ``depth`` levels (symlinks not followed)."""
    found, level = [], [top]
    for _ in range(depth):
        nxt = []
        for d in level:
            try:
                with os.scandir(d) as it:
                    nxt += [e.path for e in it if e.is_dir(follow_symlinks=False)]
            except (FileNotFoundError, NotADirectoryError):
                continue
        found += nxt
        level = nxt
    return found


def write_file(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``, mode 0600 whatever the umask, durably (file and
    directory fsynced); a temporary file left by a crash here is overwritten, and a
    link at its name is not followed."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
