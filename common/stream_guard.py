"""Server streams that stop moving are cancelled, so a slow or hostile client cannot
pin a server thread forever.

gRPC's sync server gives each call a thread until the call ends, and a call without a
client deadline never ends by itself: a WriteBlock stream whose client stops sending,
or a ReadBlock stream whose client stops reading (the server's send then waits on flow
control), holds its thread indefinitely.  A handler wraps such a stream in
``IdleStreams.watch(context, method)`` and calls ``touch()`` on each message; one
watchdog thread cancels calls that made no progress for ``idle_timeout`` seconds,
counts them in ``curvine_streams_cancelled_idle_total{method}``, and logs one line.
Cancelling wakes the blocked receive or send, so the handler's thread returns.

Long-lived streams that are legitimately quiet (the master's Calls and Session streams
of an idle mount) pass ``busy``: they count as stalled only while it is true, i.e.
while the server has replies its client is not taking.
"""

from __future__ import annotations

import logging
import threading
import time

from typing import Callable

from .metrics import STREAMS_CANCELLED_IDLE

log = logging.getLogger(__name__)


class Watched:
    """One watched call; ``touch()`` marks progress (cheap: one float store)."""

    __slots__ = ("context", "method", "last", "cancelled", "busy")

    def __init__(self, context, method: str, busy: Callable[[], bool] | None = None):
        self.context = context
        self.method = method
        self.last = time.monotonic()
        self.cancelled = False
        self.busy = busy  # None: always expected to make progress

    def touch(self) -> None:
        self.last = time.monotonic()


class IdleStreams:
    """Cancels watched calls idle for longer than ``idle_timeout`` (0 = never)."""

    def __init__(self, idle_timeout: float, name: str = "streams"):
        self.idle_timeout = float(idle_timeout)
        self._name = name
        self._lock = threading.Lock()
        self._calls: dict[int, Watched] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, context, method: str,
              busy: Callable[[], bool] | None = None) -> "_Watch":
        return _Watch(self, context, method, busy)

    def send_from(self, context, method: str, items, after_send: Callable[[], None] | None
                  = None, expecting: Callable[[], bool] | None = None):
        """Yield what arrives on queue ``items`` until None: the body of a server stream
        whose replies are produced elsewhere.  The call counts as stalled only while a
        reply waits in ``items`` or is being sent, or while ``expecting()`` (e.g. a first
        message not yet received); ``after_send`` runs after each send."""
        sending = False

        def busy() -> bool:
            return sending or not items.empty() or (expecting is not None and expecting())

        with self.watch(context, method, busy) as watched:
            while True:
                item = items.get()
                if item is None:
                    return
                sending = True
                watched.touch()
                yield item  # returns once gRPC has sent it
                sending = False
                watched.touch()
                if after_send is not None:
                    after_send()

    def _add(self, w: Watched) -> None:
        if self.idle_timeout <= 0 or w.context is None:
            return
        with self._lock:
            self._calls[id(w)] = w
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name=f"idle-{self._name}",
                                                daemon=True)
                self._thread.start()

    def _remove(self, w: Watched) -> None:
        with self._lock:
            self._calls.pop(id(w), None)

    def _run(self) -> None:
        period = min(max(self.idle_timeout / 4, 0.05), 1.0)
        while not self._stop.wait(period):
            now = time.monotonic()
            with self._lock:
                watched = list(self._calls.values())
            idle = []
            for w in watched:
                if w.cancelled:
                    continue
                if w.busy is not None and not w.busy():
                    w.last = now  # nothing owed to the client: quiet, not stalled
                elif now - w.last > self.idle_timeout:
                    idle.append(w)
            for w in idle:
                w.cancelled = True
                STREAMS_CANCELLED_IDLE.labels(method=w.method).inc()
                log.info("%s: no progress for %.0fs (limit %gs); cancelled the call from %s",
                         w.method, now - w.last, self.idle_timeout, _peer(w.context))
                try:
                    w.context.cancel()
                except Exception as e:  # noqa: BLE001 - the call may have just ended
                    log.debug("cancelling %s failed: %s", w.method, e)

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(5)


class _Watch:
    """Context manager of ``IdleStreams.watch``: yields the ``Watched``."""

    def __init__(self, owner: IdleStreams, context, method: str, busy=None):
        self._owner = owner
        self.watched = Watched(context, method, busy)

    def __enter__(self) -> Watched:
        self._owner._add(self.watched)
        return self.watched

    def __exit__(self, *exc) -> None:
        self._owner._remove(self.watched)


def _peer(context) -> str:
    try:
        return context.peer()
    except Exception:  # noqa: BLE001
        return "?"


class QuietLog:
    """Log lines about misbehaving peers, at most one per ``interval`` seconds per kind
    (a flood of garbage must not become a flood of log lines, nor of tracebacks): the
    next line says how many were left out.  Thread-safe."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0):
        self._log = logger
        self.interval = interval
        self._lock = threading.Lock()
        self._next: dict[str, float] = {}  # kind -> monotonic time of its next line
        self._skipped: dict[str, int] = {}

    def log(self, level: int, kind: str, msg: str, *args) -> bool:
        """Log ``msg % args`` unless a line of ``kind`` went out within the interval;
        True if it was logged."""
        now = time.monotonic()
        with self._lock:
            if now < self._next.get(kind, 0.0):
                self._skipped[kind] = self._skipped.get(kind, 0) + 1
                return False
            self._next[kind] = now + self.interval
            skipped = self._skipped.pop(kind, 0)
        if skipped:
            msg += " (%d more like it since the last such line, not logged)"
            args = (*args, skipped)
        self._log.log(level, msg, *args)
        return True

    def warning(self, kind: str, msg: str, *args) -> bool:
        return self.log(logging.WARNING, kind, msg, *args)
