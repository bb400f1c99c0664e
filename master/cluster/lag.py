"""The master's own lag: whether it was able to hear its workers.

A worker is declared lost when the master has not heard from it for
``master.worker_lost_after``.  Silence proves nothing while the master itself was
stalled (CPU starvation, a long GC or LMDB pause, the process stopped, swapping): the
heartbeats were sent, the master did not take them.  One thread ticks every TICK
seconds and measures how late each tick wakes; a tick later than STALL marks a stall,
and silence before the end of the last stall does not count (``heard_since``).
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)

TICK = 0.2  # seconds between wake-ups
STALL = 1.0  # a wake-up this much later than asked for is a stall


class LagMonitor:
    def __init__(self, tick: float = TICK, stall: float = STALL):
        self.tick = tick
        self.stall = stall
        self.max_lag = 0.0  # worst lag seen (seconds), for the metrics
        self.stalls = 0  # stalls seen
        self.stall_end = 0.0  # time.monotonic() at the end of the last stall (0 = none)
        self._last_tick = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)

    def heard_since(self, t: float, now: float | None = None) -> float:
        """The start of the time in which silence counts: ``t`` (a worker's last
        heartbeat), or the end of a master stall after it.  A tick overdue right now
        means a stall that is only ending (the caller ran before this thread did)."""
        now = time.monotonic() if now is None else now
        if self._thread.is_alive() and now - self._last_tick > self.tick + self.stall:
            return now
        return max(t, self.stall_end)

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            now = time.monotonic()
            self.note(now - self._last_tick - self.tick, now)
            self._last_tick = now

    def note(self, lag: float, now: float) -> None:
        """One wake-up ``lag`` seconds late at ``now``."""
        if lag > self.max_lag:
            self.max_lag = lag
        if lag > self.stall:
            self.stalls += 1
            self.stall_end = now
            log.warning("the master stalled for %.1fs: workers' silence in that time is "
                        "not counted against them", lag)
