"""Checkpoints: compact, durable copies of the master's LMDB at a journal seq.

Layout: ``<ckpt_root>/ckpt-<seq as 20 digits>/data.mdb`` (dirs 0700, files 0600:
a checkpoint holds every name); a checkpoint appears
only by an atomic rename after its contents and directory are fsynced, so any
``ckpt-*`` directory is complete.  The newest two are kept; the older one is a
usable fallback only while the journal still holds the records after it, i.e. if
the caller retires journal segments up to the older checkpoint's seq rather than
the newest one's.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from typing import TYPE_CHECKING

from curvine.common import private_files

from .journal import fsync_dir
from .segment import JournalError

if TYPE_CHECKING:
    import lmdb

log = logging.getLogger(__name__)

KEEP = 2
_NAME_RE = re.compile(r"^ckpt-(\d{20})$")
_TMP_PREFIX = ".tmp-ckpt-"


def checkpoint_name(seq: int) -> str:
    return f"ckpt-{seq:020d}"


def _list(ckpt_root: str) -> list[tuple[int, str]]:
    try:
        names = os.listdir(ckpt_root)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        m = _NAME_RE.match(name)
        path = os.path.join(ckpt_root, name)
        if m and os.path.isdir(path):
            out.append((int(m.group(1)), path))
    out.sort()
    return out


def latest_checkpoint(ckpt_root: str, at_most: int | None = None) -> tuple[int, str] | None:
    """(seq, path) of the newest complete checkpoint (with seq <= ``at_most`` if
    given), None if there is none."""
    found = [c for c in _list(ckpt_root) if at_most is None or c[0] <= at_most]
    return found[-1] if found else None


def write_checkpoint(env: lmdb.Environment, ckpt_root: str, seq: int) -> str:
    """Copy ``env`` (compacted) to ``ckpt_root/ckpt-<seq>`` durably; keep the newest
    two checkpoints; return the new one's path.

    ``seq`` must be the journal seq the copied state has applied (the caller
    commits and syncs that state first).  Writing the same seq again returns the
    existing checkpoint: it holds the same applied state, and replacing it would
    open a window with no checkpoint at that seq.
    """
    # private (common/private_files.py): ckpt_root 0700 (the ckpt-* dirs are mkdtemp's
    # 0700), the copied files 0600 (LMDB's copy makes them 0666 & ~umask)
    private_files.private_dir(ckpt_root, "checkpoints", check_owner=False, durable=True)
    _remove_stale_tmp(ckpt_root)
    final = os.path.join(ckpt_root, checkpoint_name(seq))
    found = _list(ckpt_root)
    if found and found[-1][0] > seq:
        raise JournalError(f"checkpoint at seq {seq} is older than the newest one "
                           f"({found[-1][1]})")
    if os.path.isdir(final):
        log.info("checkpoint %s already exists, keeping it", final)
        return final

    def copy(tmp: str) -> None:
        if env.flags()["subdir"]:
            env.copy(tmp, compact=True)
        else:
            # a no-subdir environment copies to a file name, not a directory
            env.copy(os.path.join(tmp, "data.mdb"), compact=True)
    return _install(ckpt_root, final, copy, "written")


def _install(ckpt_root: str, final: str, fill, how: str) -> str:
    """Make ``final`` atomically: ``fill(tmp)`` writes the files into a temporary
    directory, which is made private and durable, then renamed."""
    tmp = tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=ckpt_root)
    try:
        fill(tmp)
        for name in os.listdir(tmp):
            fd = os.open(os.path.join(tmp, name), os.O_RDONLY)
            try:
                os.fchmod(fd, private_files.FILE_MODE)
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(tmp)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(ckpt_root)
    log.info("checkpoint %s %s", final, how)
    _prune(ckpt_root)
    return final


def _prune(ckpt_root: str) -> None:
    found = _list(ckpt_root)
    for _seq, path in found[:-KEEP]:
        # rename first so a crash mid-delete never leaves a partial ckpt-* behind
        doomed = os.path.join(ckpt_root, _TMP_PREFIX + os.path.basename(path))
        os.rename(path, doomed)
        shutil.rmtree(doomed)
        log.info("checkpoint %s removed", path)
    if len(found) > KEEP:
        fsync_dir(ckpt_root)


def _remove_stale_tmp(ckpt_root: str) -> None:
    for name in os.listdir(ckpt_root):
        if name.startswith(_TMP_PREFIX):
            log.info("removing leftover checkpoint temp %s", name)
            shutil.rmtree(os.path.join(ckpt_root, name), ignore_errors=True)


CHUNK = 1 << 20  # bytes of a checkpoint file per message when streamed


def checkpoint_chunks(path: str):
    """(file name, bytes) of the checkpoint directory ``path``, CHUNK at a time (a
    member of a master group sends it to another: master/member.py)."""
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            while True:
                data = f.read(CHUNK)
                yield name, data
                if len(data) < CHUNK:
                    break


def receive_checkpoint(ckpt_root: str, seq: int, chunks) -> str:
    """Write the checkpoint at ``seq`` from ``chunks`` ((file name, bytes), as
    checkpoint_chunks gives them) into ``ckpt_root``, durably and atomically like
    write_checkpoint; returns its path."""
    private_files.private_dir(ckpt_root, "checkpoints", check_owner=False, durable=True)
    _remove_stale_tmp(ckpt_root)
    final = os.path.join(ckpt_root, checkpoint_name(seq))
    if os.path.isdir(final):
        return final
    def write(tmp: str) -> None:
        files: dict[str, int] = {}
        try:
            for name, data in chunks:
                if os.sep in name or name in ("", ".", ".."):
                    raise JournalError(f"checkpoint file name {name!r}")
                fd = files.get(name)
                if fd is None:
                    fd = files[name] = os.open(os.path.join(tmp, name),
                                               os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                               private_files.FILE_MODE)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
        finally:
            for fd in files.values():
                os.close(fd)
    return _install(ckpt_root, final, write, "received")
