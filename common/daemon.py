"""Process plumbing for daemons: systemd readiness and clean shutdown on SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading

log = logging.getLogger(__name__)


def notify(state: str) -> None:
    """Send ``state`` (e.g. "READY=1") to systemd if NOTIFY_SOCKET is set."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode())
    except OSError as e:
        # Like systemd's own sd_notify: the notifier may be gone (e.g. `curvine local up`
        # has exited by the time a daemon stops); that is not the daemon's problem.
        log.debug("sd_notify(%s) failed: %s", state, e)


def stop_event() -> threading.Event:
    """An event set by SIGTERM or SIGINT (install from the main thread)."""
    ev = threading.Event()

    def _on_signal(signum, _frame):
        log.info("received %s, shutting down", signal.Signals(signum).name)
        ev.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return ev
