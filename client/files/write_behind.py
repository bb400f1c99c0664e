"""Write-behind: writes queued by one writer and applied in order by a pool thread.

``FileWriter.write_behind`` queues a write of immutable bytes (what FUSE hands over)
without blocking, and one background task per writer applies the queue in order, so
the FUSE loop answers the write request at once and the kernel sends the next one
while this one is written.  Every other operation of the writer (a blocking ``write``,
``read``, ``truncate``, ``publish``...) first applies what is queued (``sync``).  A
queued write that fails (no space, a worker down) fails every later operation of the
handle: its version is never published without it; close(2) reports the error.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from typing import Callable, Iterator

from curvine.common.errors import CurvineError, ErrorKind

from ..blocks.pools import LazyExecutor

log = logging.getLogger(__name__)

WRITE_BEHIND_BYTES = 8 << 20  # queued write-behind bytes per writer before writes block

_drain_pool = LazyExecutor(64, "write-behind")  # write-behind queues, one task per writer


class WriteBehind:
    """The write-behind queue of one writer.

    ``apply(offset, data)`` writes into the version; a queued write is applied only
    while holding the writer's ``lock`` (so never out of order with its other
    operations).  ``queued()`` is called for every write accepted, before it can be
    applied (the writer notes the change)."""

    def __init__(self, lock: threading.RLock, apply: Callable[[int, bytes], object],
                 queued: Callable[[], None], ino: int):
        self._lock = lock
        self._apply = apply
        self._queued = queued
        self._ino = ino
        self._mutex = threading.Lock()  # guards the fields below
        self._writes: collections.deque[tuple[int, bytes]] = collections.deque()
        self._bytes = 0
        self._end = 0  # end of the furthest queued write
        self._running = False  # a drain task is scheduled or running
        self._blocking = 0  # blocking writes in progress: queueing would overtake them
        self._error: CurvineError | None = None
        self._closed = False

    @property
    def end(self) -> int:
        """Where the furthest queued write ends; 0 when nothing is queued."""
        return self._end if self._bytes else 0

    def idle(self) -> bool:
        """Nothing queued, no blocking write under way and no error to report: a write
        applied now by the caller (holding the writer's lock) overtakes nothing."""
        with self._mutex:
            return not self._writes and not self._blocking and self._error is None

    def queue(self, offset: int, data: bytes) -> bool:
        """Queue a write of ``data`` (immutable bytes) without blocking; False when it
        must go through the blocking path instead (queue full, an error to report,
        closed, ...)."""
        n = len(data)
        if type(data) is not bytes or offset < 0 or n == 0:
            return False
        with self._mutex:
            if (self._closed or self._error is not None or self._blocking
                    or self._bytes and self._bytes + n > WRITE_BEHIND_BYTES):
                return False
            self._writes.append((offset, data))
            self._bytes += n
            self._end = max(self._end, offset + n)
            self._queued()
            start = not self._running
            self._running = True
        if start:
            try:
                _drain_pool().submit(self._drain)
            except BaseException:
                with self._mutex:
                    self._running = False
                raise
        return True

    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        """Around a blocking write: nothing is queued meanwhile (it would overtake)."""
        with self._mutex:
            self._blocking += 1
        try:
            yield
        finally:
            with self._mutex:
                self._blocking -= 1

    def sync(self) -> None:
        """Apply every queued write (the caller holds the lock); raise the error one of
        them hit, now and at every later call."""
        while True:
            with self._mutex:
                if not self._writes:
                    self._end = 0
                    err = self._error
                    break
            self._apply_oldest()
        if err is not None:
            raise CurvineError(err.kind, f"an earlier write of this handle failed: "
                                         f"{err.message}")

    def close(self) -> None:
        """Drop what is queued and refuse further writes."""
        with self._mutex:
            self._closed = True
            self._writes.clear()
            self._bytes = 0

    def _drain(self) -> None:
        """Apply queued writes in order (a pool thread)."""
        while True:
            with self._lock:
                with self._mutex:
                    if not self._writes:
                        self._running = False
                        return
                self._apply_oldest()

    def _apply_oldest(self) -> None:
        """Apply the oldest queued write, if any (the caller holds the lock)."""
        with self._mutex:
            if not self._writes:
                return  # close() dropped the queue meanwhile
            item = self._writes[0]
            skip = self._error is not None or self._closed
        error = None
        if not skip:
            offset, data = item
            try:
                self._apply(offset, data)
            except CurvineError as e:
                error = e
            except Exception as e:  # noqa: BLE001 - reported at the next operation
                log.exception("write-behind of inode %d failed", self._ino)
                error = CurvineError(ErrorKind.IO, f"write at {offset}: {e}")
        with self._mutex:
            if error is not None and self._error is None:
                self._error = error
            if skip or error is not None:  # the rest of the queue goes with it
                self._writes.clear()
                self._bytes = 0
            elif self._writes and self._writes[0] is item:  # (close() may clear it)
                self._writes.popleft()
                self._bytes -= len(item[1])
