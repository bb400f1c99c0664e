"""A file descriptor with one owner, closed exactly once, never while in use.

A descriptor number is reused by the kernel as soon as it is closed: a read, a
check or a second close through a stale number lands on whatever the process opened
next (another block file, a staging dir, a socket).  So every descriptor the client
keeps beyond one function is an ``OwnedFd``:

- ``close()`` is the owner's, and idempotent: the first call closes, later ones do
  nothing (no second ``os.close``).
- Every other use borrows it: ``with f.borrow() as fd: os.pread(fd, ...)``.  While
  any borrow is open the number stays ours; a ``close()`` meanwhile only marks it
  closed and the last borrower closes it.  A borrow after ``close()`` raises
  ``FdClosed`` (the reader or writer is gone), which is never an error of the file.
- An ``os.close`` that fails with EBADF means some other code closed a number it did
  not own: logged as an ERROR with the owner's name, never swallowed silently.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from typing import Iterator

log = logging.getLogger(__name__)


class FdClosed(Exception):
    """The descriptor was closed by its owner (the handle using it is gone)."""


def close_fd(fd: int, owner: str) -> None:
    """``os.close(fd)`` for code that owns ``fd`` outright; a failure is a bug
    (EBADF: someone closed our number) and is logged as an ERROR naming ``owner``."""
    try:
        os.close(fd)
    except OSError as e:
        log.error("closing descriptor %d of %s failed: %s (closed elsewhere: a bug)",
                  fd, owner, e.strerror or e)


class OwnedFd:
    """``fd`` owned by ``owner`` (a short description, for the log)."""

    __slots__ = ("_fd", "owner", "_lock", "_users", "_closing", "_on_close")

    def __init__(self, fd: int, owner: str, on_close=None):
        self._fd = fd
        self.owner = owner
        self._lock = threading.Lock()
        self._users = 0
        self._closing = False
        self._on_close = on_close  # called once the descriptor is really closed

    @property
    def closed(self) -> bool:
        return self._closing

    @contextlib.contextmanager
    def borrow(self) -> Iterator[int]:
        """The descriptor, kept open until the ``with`` block ends; FdClosed if the
        owner closed it already."""
        with self._lock:
            if self._closing:
                raise FdClosed(self.owner)
            self._users += 1
        try:
            yield self._fd
        finally:
            with self._lock:
                self._users -= 1
                last = self._closing and self._users == 0
            if last:
                self._really_close()

    def close(self) -> None:
        """Close now, or when the last borrower is done; later calls do nothing."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            now = self._users == 0
        if now:
            self._really_close()

    def _really_close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        close_fd(fd, self.owner)
        if self._on_close is not None:
            self._on_close()

    def __repr__(self) -> str:
        state = "closed" if self._closing else f"fd {self._fd}"
        return f"OwnedFd({self.owner}, {state})"

    def __del__(self):
        # An owner that forgot to close: the number is still ours, close it once.
        if self._fd >= 0 and not self._closing:
            try:
                os.close(self._fd)
            except OSError as e:
                if e.errno == errno.EBADF:
                    log.error("descriptor %d of %s was closed elsewhere (a bug)",
                              self._fd, self.owner)
