"""A standby's read index: a read waits until the member has applied the commit seq
read from etcd after the read arrived (DESIGN rule 2 through a standby).

Batched as etcd's own ReadIndex: one thread (``read-index``) reads ``commit``; every
read that arrives while a Range is in flight shares the next one, which is sent as
soon as the previous one answers.  A waiting read holds no thread: it is a callback
(``wait_async``), called from this thread (or the member's, once it has applied the
commit) with None or the error to answer with.  The call port's loop hands its read
back to the loop that way (master/ports/call_port_server.py ``AfterIndex``); a gRPC
thread blocks on a latch (``wait``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from curvine.common.errors import CurvineError, ErrorKind

log = logging.getLogger(__name__)

READ_INDEX_WAIT = 5.0  # how long a read on a standby waits to have applied the commit
EXPIRY_CHECK = 0.25  # seconds between looks for reads waiting past READ_INDEX_WAIT

Done = Callable[[CurvineError | None], None]


class ReadIndex:
    """``read_commit()`` reads etcd's ``commit`` (linearizable); ``applied()`` is the
    member's applied seq now; ``wake_follower()`` makes the member look for new
    records at once.  The member calls ``applied_up_to(seq)`` after applying."""

    def __init__(self, read_commit: Callable[[], int], applied: Callable[[], int],
                 wake_follower: Callable[[], None], timeout: float = READ_INDEX_WAIT):
        self._read_commit = read_commit
        self._applied = applied
        self._wake_follower = wake_follower
        self.timeout = timeout
        self._lock = threading.Lock()
        self._arrived: list[tuple[float, Done]] = []  # no Range sent since they came
        self._applying: list[tuple[int, float, Done]] = []  # (commit, deadline, done)
        self._signal = threading.Event()
        self._closed = False
        self.ranges = 0  # Ranges of commit sent (each shared by the reads of its batch)
        self.reads = 0
        self._thread = threading.Thread(target=self._run, name="read-index", daemon=True)
        self._thread.start()

    # -- the reads' side
    def wait_async(self, done: Done) -> None:
        """``done(None)`` once this member has applied a commit read after now, or
        ``done(error)``: UNAVAILABLE past ``timeout`` or when etcd does not answer."""
        with self._lock:
            if self._closed:
                closed = True
            else:
                closed = False
                self._arrived.append((time.monotonic() + self.timeout, done))
                self.reads += 1
        if closed:
            done(CurvineError(ErrorKind.UNAVAILABLE, "this standby is changing role"))
            return
        self._signal.set()

    def wait(self) -> None:
        """``wait_async`` for a thread that may block (a unary RPC's)."""
        latch = threading.Event()
        outcome: list[CurvineError | None] = []

        def done(error: CurvineError | None) -> None:
            outcome.append(error)
            latch.set()

        self.wait_async(done)
        # (the thread answers every read within its timeout plus one etcd call)
        if not latch.wait(self.timeout + 10) or outcome[0] is not None:
            raise outcome[0] if outcome else CurvineError(
                ErrorKind.UNAVAILABLE, "the read index did not answer")

    # -- the member's side
    def applied_up_to(self, seq: int) -> None:
        """The member has applied ``seq``: the reads waiting for it may go."""
        with self._lock:
            if not self._applying:
                return
            ready = [d for commit, _, d in self._applying if commit <= seq]
            self._applying = [w for w in self._applying if w[0] > seq]
        self._finish(ready, None)

    def close(self) -> None:
        """Stop; the reads still waiting are answered UNAVAILABLE."""
        with self._lock:
            self._closed = True
        self._signal.set()
        self._thread.join(timeout=10)
        with self._lock:
            left = [d for _, d in self._arrived] + [d for _, _, d in self._applying]
            self._arrived, self._applying = [], []
        self._finish(left, CurvineError(ErrorKind.UNAVAILABLE, "this standby is changing role"))

    # -- the thread
    def _run(self) -> None:
        while True:
            with self._lock:
                waiting = bool(self._applying)
            self._signal.wait(EXPIRY_CHECK if waiting else None)
            self._signal.clear()
            if self._closed:
                return
            self._expire()
            with self._lock:
                batch, self._arrived = self._arrived, []
            if batch:
                self._index(batch)

    def _index(self, batch: list[tuple[float, Done]]) -> None:
        """One Range of ``commit`` for every read of ``batch`` (all arrived before it
        was sent)."""
        self.ranges += 1
        try:
            commit = self._read_commit()
        except CurvineError as e:
            self._finish([d for _, d in batch], e)
            return
        except Exception as e:  # noqa: BLE001 - a bug must not leave reads waiting
            log.exception("read index: reading commit failed")
            self._finish([d for _, d in batch], CurvineError(ErrorKind.IO, str(e)))
            return
        with self._lock:
            # applied read under the lock: an apply after it calls applied_up_to,
            # which waits for this lock and then sees these reads
            if self._applied() >= commit:
                ready = [d for _, d in batch]
            else:
                ready = []
                self._applying.extend((commit, deadline, d) for deadline, d in batch)
        if not ready:
            self._wake_follower()
        self._finish(ready, None)

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [w for w in self._applying if w[1] <= now]
            if not late:
                return
            self._applying = [w for w in self._applying if w[1] > now]
        applied = self._applied()
        for commit, _, done in late:
            self._finish([done], CurvineError(
                ErrorKind.UNAVAILABLE, f"this standby has applied seq {applied} of "
                                       f"{commit} committed; ask the leader"))

    @staticmethod
    def _finish(dones: list[Done], error: CurvineError | None) -> None:
        for done in dones:
            try:
                done(error)
            except Exception:  # noqa: BLE001 - one caller's bug must not stop the others
                log.exception("read index: a read's callback failed")
