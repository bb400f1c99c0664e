"""Calls handed to an event loop from other threads, with one wake-up of the loop for
every call handed over before it runs them.

``loop.call_soon_threadsafe`` per call costs the loop a wake-up each (a write to its
self-pipe, a pass of its selector, a context switch); the threads that answer the
loop's calls answer them a batch at once (the committer a durable batch, a standby's
read index every read that shared its etcd round trip), so they share one.

May import: the standard library only.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


class LoopInbox:
    """``post(fn, *args)`` from any thread runs ``fn(*args)`` in the loop whose
    ``call_soon_threadsafe`` is given, in the order posted; once the loop is closed
    what is posted is dropped (nobody is left to answer).  ``what``: the calls, in the
    log line of one that raises (the others still run)."""

    def __init__(self, call_soon_threadsafe: Callable, what: str = "a call"):
        self._call_soon = call_soon_threadsafe
        self._what = what
        self._lock = threading.Lock()
        self._posted: list = []  # (fn, args) not run yet
        self._scheduled = False  # a drain is due in the loop

    def post(self, fn: Callable, *args) -> None:
        with self._lock:
            self._posted.append((fn, args))
            if self._scheduled:
                return  # the drain that is due runs this one too
            self._scheduled = True
        try:
            self._call_soon(self._drain)
        except RuntimeError:  # the loop is closed
            with self._lock:
                self._posted.clear()
                self._scheduled = False

    def _drain(self) -> None:
        with self._lock:
            posted, self._posted = self._posted, []
            self._scheduled = False
        for fn, args in posted:
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - one call's bug must not drop the others
                log.exception("%s handed to the loop failed", self._what)
