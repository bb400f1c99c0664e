"""The page-cache version rule of the mount: :class:`PageCache`, beside the other rules
about what the kernel may keep (kernel_cache.py).

The kernel has one page cache and one size per inode.  Readers here that read through
the page cache all read one version (a reader of another version reads with direct_io,
filesystem.FileSystem._open); while they are open the kernel is told that version's size
(FileSystem.attributes), and this class remembers which version's size each inode was
last told (``told``: an open of another version makes the kernel ask again).  An open
that empties a file (O_TRUNC) or writes it through the page cache (O_RDWR) first waits,
at most CACHED_READERS_WAIT, for other processes' page-cache readers of it to close
(``wait_for_readers``).  Consistency rule 1, docs/consistency.md.

Handles are FileSystem's (``cached_reader``, ``inode``, ``size``, ``pid``, ``fh``); this
module reads them and imports nothing of the mount's.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from .metrics import FUSE_OPEN_WAITS

log = logging.getLogger(__name__)

TOLD_SIZES = 100_000  # inodes whose last size told to the kernel this mount remembers
# an open that empties a file (O_TRUNC) or writes it through the page cache (O_RDWR)
# waits at most this long for other processes' page-cache readers of it here to close
CACHED_READERS_WAIT = 2.0

WRITERS_SIZE = -1  # told: a writer's size (not a published version's)


def process_of(pid: int) -> int:
    """The process (thread group) of a request's thread id.  Read from /proc, which
    never waits on a disk: called in the trio loop."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return pid


class PageCache:
    """The page-cache readers of each inode and the size the kernel was last told.

    ``of_inode`` (ino -> {fh: handle}) and ``handles`` (fh -> open handle) are the
    mount's, owned by FileSystem; read here, never changed."""

    def __init__(self, of_inode: dict[int, dict[int, Any]], handles: dict[int, Any]):
        self._of_inode = of_inode
        self._handles = handles
        # ino -> the version whose size this mount last gave the kernel (attributes;
        # WRITERS_SIZE: a writer's size).  Forgotten all at once when it grows too big.
        self._told: dict[int, int] = {}
        # ino -> set when one of its page-cache readers closes (wait_for_readers)
        self._reader_closed: dict[int, trio.Event] = {}

    # -- the size told ------------------------------------------------------------------
    def told(self, ino: int, version: int) -> None:
        """The kernel was given the size of ``version`` of ``ino`` (or WRITERS_SIZE)."""
        if len(self._told) >= TOLD_SIZES:
            self._told.clear()
        self._told[ino] = version

    def told_version(self, ino: int) -> int | None:
        """The version whose size the kernel was last told for ``ino``, if known."""
        return self._told.get(ino)

    def writer_closed(self, ino: int) -> None:
        """A writer of ``ino`` closed: its writes set the kernel's size (published or
        not), so what it was told is not known any more."""
        self._told.pop(ino, None)

    # -- readers through the page cache -------------------------------------------------
    def reader(self, ino: int):
        """A reader of ``ino`` here that reads through the kernel's page cache, if any.
        All such readers of an inode read one version."""
        for h in self._of_inode.get(ino, {}).values():
            if h.cached_reader:
                return h
        return None

    def readers_of_another_version(self, ino: int, version: int) -> bool:
        """Readers of ``ino`` here read a version other than ``version`` through the
        kernel's page cache."""
        h = self.reader(ino)
        return h is not None and h.inode.version != version

    def reader_closed(self, h) -> None:
        """``h``, released, was a page-cache reader: wake the opens waiting for it."""
        closed = self._reader_closed.pop(h.ino, None)
        if closed is not None:
            closed.set()

    async def wait_for_readers(self, ino: int, tgid: int) -> None:
        """Before an open that empties ``ino`` (O_TRUNC) or writes it through the
        page cache (O_RDWR) returns: wait, at most CACHED_READERS_WAIT, until the
        page-cache readers of ``ino`` that other processes opened here have closed.

        On an O_TRUNC open's reply the kernel sets the size to 0 for the whole mount,
        and reads through the page cache stop at that size; an O_RDWR handle's writes
        land in that page cache before they are published.  A reader of the published
        version would get a short file or unpublished bytes (consistency rule 1,
        docs/consistency.md).  Readers opened from now on get direct_io
        (FileSystem._open), which neither touches.  The caller's own process
        (``tgid``) is not waited for (it could be the one holding the reader open): it
        may see its own changes, as on a local file system."""
        # /proc reads for process_of: rarely any such reader
        others = [h for h in self._of_inode.get(ino, {}).values()
                  if h.cached_reader and process_of(h.pid) != tgid]
        if not others:
            return
        with trio.move_on_after(CACHED_READERS_WAIT) as waited:
            while any(h.fh in self._handles for h in others):
                closed = self._reader_closed.setdefault(ino, trio.Event())
                await closed.wait()
        FUSE_OPEN_WAITS.labels(outcome="timeout" if waited.cancelled_caught else "closed").inc()
        if waited.cancelled_caught:
            log.info("inode %d: opened to be emptied or written through the page cache "
                     "while another process still reads it here after %.0f s; that reader "
                     "may now see the change", ino, CACHED_READERS_WAIT)
