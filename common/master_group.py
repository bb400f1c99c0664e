"""Which master of a group to call next: the leader once one names it, else each in turn.

A master group (``cluster.master_addrs``, docs/operations.md "Master group") has one
leader.  A standby refuses what only the leader serves with ``NOT_LEADER`` and the
leader's gRPC address as the message ("" while an election is on); a master that is
down is ``UNAVAILABLE``.  ``MasterGroup`` turns those answers into the address to call
next, and says whether to call it at once (a named leader) or after the caller's
usual pause (every member tried).  The worker's link to the master holds one; so does
the clients' route to the master.  One master (no group) is a group of one: nothing
moves.
"""

from __future__ import annotations

import logging
import threading

from .errors import CurvineError, ErrorKind

log = logging.getLogger(__name__)

# answers after which another master may serve the call
MOVE_ON = frozenset({ErrorKind.UNAVAILABLE, ErrorKind.TIMEOUT, ErrorKind.NOT_LEADER})


class MasterGroup:
    """The masters' addresses and which one is current; thread-safe.

    ``dial``: the addresses this process calls (a worker's are the masters' worker
    ports).  ``names``: the same masters' gRPC addresses, as a standby names the
    leader (``cluster.master_addrs``); ``dial`` itself when omitted."""

    def __init__(self, dial: list[str], names: list[str] | None = None, start: int = 0):
        if not dial:
            raise ValueError("a master group needs at least one address")
        names = list(names) if names is not None else list(dial)
        if len(names) != len(dial):
            raise ValueError(f"{len(dial)} addresses for {len(names)} masters")
        self.dial = list(dial)
        self.names = names
        self._lock = threading.Lock()
        self._current = start % len(dial)
        self._tried = 0  # members that failed in a row since one last answered

    @property
    def current(self) -> str:
        with self._lock:
            return self.dial[self._current]

    def __len__(self) -> int:
        return len(self.dial)

    def answered(self) -> None:
        """The current master served a call."""
        with self._lock:
            self._tried = 0

    def after_failure(self, err: CurvineError) -> bool:
        """The current master failed a call with ``err``: move to the leader it named,
        else to the next member.  True: call the new current master at once (a named
        leader, or members of this round not tried yet); False: every member failed
        in a row, pause first (or ``err`` is not one another master would answer
        differently, and nothing moved)."""
        if err.kind not in MOVE_ON or len(self.dial) == 1:
            return False
        leader = err.message.strip() if err.kind == ErrorKind.NOT_LEADER else ""
        with self._lock:
            if leader in self.names and self.names.index(leader) != self._current:
                self._current = self.names.index(leader)
                self._tried = 0
                return True
            self._current = (self._current + 1) % len(self.dial)
            self._tried += 1
            if self._tried >= len(self.dial):
                self._tried = 0
                return False
            return True
