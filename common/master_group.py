"""Which master of a group to call next: the leader once one names it, else each in turn.

A master group (``cluster.master_addrs``, docs/operations.md "Master group") has one
leader.  A standby refuses what only the leader serves with ``NOT_LEADER`` and the
leader's gRPC address as the message ("" while an election is on); a master that is
down is ``UNAVAILABLE``.  ``MasterGroup`` turns those answers into the address to call
next, and says whether to call it at once (a named leader) or after the caller's
usual pause (every member tried).  The worker's link to the master holds one.
``GroupRpc`` is an ``RpcClient`` (common/rpc.py) over a group: what the clients' master
calls go through, so that following the leader is in this one place.  One master (no
group) is a group of one: nothing moves.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any, Sequence

import grpc

from .errors import CurvineError, ErrorKind, from_rpc_error
from .rpc import RETRY_FIRST, RETRY_MAX, RpcClient
from .security import Security

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
        # members that failed since one last answered: a standby that still names a
        # leader which is gone must not send us back to it
        self._failed: set[int] = set()
        self.moves = 0  # times the current master changed: carriers bound to one reconnect

    def _set(self, index: int) -> None:
        if index != self._current:
            self._current = index
            self.moves += 1

    @property
    def current(self) -> str:
        with self._lock:
            return self.dial[self._current]

    def __len__(self) -> int:
        return len(self.dial)

    def answered(self) -> None:
        """The current master served a call."""
        with self._lock:
            self._failed.clear()

    def move_to(self, name: str) -> bool:
        """Call the master ``name`` next (its gRPC address, as the group names its
        leader: GetGroup); False if it is none of ours."""
        with self._lock:
            if name not in self.names:
                return False
            self._set(self.names.index(name))
            return True

    def after_failure(self, err: CurvineError) -> bool:
        """The current master failed a call with ``err``: move to the leader it named
        (unless that one failed too since a member last answered), else to the next
        member that has not.  True: call the new current master at once; False: every
        member failed in a row, pause first (or ``err`` is not one another master would
        answer differently, and nothing moved)."""
        if err.kind not in MOVE_ON or len(self.dial) == 1:
            return False
        leader = err.message.strip() if err.kind == ErrorKind.NOT_LEADER else ""
        with self._lock:
            self._failed.add(self._current)
            named = self.names.index(leader) if leader in self.names else None
            if named is not None and named not in self._failed:
                self._set(named)
                return True
            untried = [(self._current + k) % len(self.dial) for k in range(1, len(self.dial))]
            untried = [i for i in untried if i not in self._failed]
            if not untried:  # a whole round failed: start again after a pause
                self._failed.clear()
                self._set((self._current + 1) % len(self.dial))
                return False
            self._set(untried[0])
            return True


class GroupRpc:
    """``RpcClient``'s interface (``call``, ``stub``, ``address``, ``closed``,
    ``close``) over every master of a group: calls go to the current one; a call that
    finds it down (UNAVAILABLE, TIMEOUT) or a standby (NOT_LEADER) is made again on the
    leader that was named, else on the next master, until one serves it or ``wait``
    runs out.  A NOT_LEADER call was never applied, so even a call that may not be
    retried (``idempotent=False``) moves on; such a call is not retried after
    UNAVAILABLE or TIMEOUT, as with ``RpcClient``.  Streams (``stub``) go to the
    current master: a stream that ends is opened again there, on the leader once a
    call has found it.  Thread-safe."""

    def __init__(self, addresses: Sequence[str], stub_cls: Any, *, security: Security,
                 timeout: float = 30.0, wait: float = 60.0):
        self.masters = MasterGroup(list(addresses))
        self.timeout = timeout
        self.wait = wait
        # channels connect at their first call: a member never called costs nothing
        self._clients = {a: RpcClient(a, stub_cls, security=security, timeout=timeout,
                                      wait=0) for a in self.masters.dial}
        self._closed = threading.Event()

    @property
    def address(self) -> str:
        """The master calls go to now (the leader, once a call found it)."""
        return self.masters.current

    @property
    def stub(self) -> Any:
        return self._clients[self.masters.current].stub

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def call(self, method: str, request: Any, *, idempotent: bool = True,
             timeout: float | None = None, wait: float | None = None) -> Any:
        wait_s = self.wait if wait is None else wait
        deadline = time.monotonic() + wait_s
        delay = RETRY_FIRST
        while True:
            address = self.masters.current
            try:
                reply = self._clients[address].call(method, request, idempotent=idempotent,
                                                    timeout=timeout, wait=0)
            except CurvineError as err:
                movable = err.kind == ErrorKind.NOT_LEADER or (idempotent
                                                              and err.kind in MOVE_ON)
                if not movable or self._closed.is_set():
                    raise
                at_once = self.masters.after_failure(err)
                left = deadline - time.monotonic()
                # past the wait, a quick answer (refused, a standby) still moves on to the
                # other members once; a call that ran into its deadline does not
                if left <= 0 and not (at_once and err.kind != ErrorKind.TIMEOUT):
                    raise CurvineError(ErrorKind.UNAVAILABLE, f"{method}: no master of "
                                       f"{', '.join(self.masters.dial)} served it within "
                                       f"{wait_s:g}s ({address}: {err.message})") from None
                if self.masters.current != address:
                    log.debug("%s: master %s %s; trying %s", method, address,
                              "is a standby" if err.kind == ErrorKind.NOT_LEADER
                              else "is unavailable", self.masters.current)
                if not at_once:
                    # every member failed in a row (an election, or all down): back off
                    pause = min(delay * (0.5 + random.random()), max(left, 0.0))
                    if self._closed.wait(pause):
                        raise err from None
                    delay = min(delay * 2, RETRY_MAX)
                continue
            self.masters.answered()
            return reply

    def close(self) -> None:
        self._closed.set()
        for c in self._clients.values():
            c.close()


def moves(rpc: RpcClient | GroupRpc) -> int:
    """How many times ``rpc`` moved to another master (0 for one master): what a
    carrier bound to one master (a call port connection, a stream) compares with the
    count it connected at, to reconnect to the leader."""
    return rpc.masters.moves if isinstance(rpc, GroupRpc) else 0


def stream_failed(rpc: RpcClient | GroupRpc, exc: grpc.RpcError, opened_at: int) -> None:
    """A stream opened on ``rpc.stub`` when ``moves(rpc)`` was ``opened_at`` failed with
    ``exc``: a standby's NOT_LEADER, or a master that is down, moves ``rpc`` on as a
    failed call would, so that the stream opens again on the leader.  Nothing when
    ``rpc`` moved meanwhile (the stream was cancelled for that, or the failure is news
    of a master the calls have left already)."""
    if isinstance(rpc, GroupRpc) and rpc.masters.moves == opened_at:
        rpc.masters.after_failure(from_rpc_error(exc))


def master_rpc(addresses: Sequence[str], stub_cls: Any, *, security: Security,
               timeout: float = 30.0, wait: float = 60.0) -> RpcClient | GroupRpc:
    """The client of the masters at ``addresses`` (config.master_addrs): a plain
    ``RpcClient`` for one, a ``GroupRpc`` that follows the leader for several."""
    if len(addresses) == 1:
        return RpcClient(addresses[0], stub_cls, security=security, timeout=timeout,
                         wait=wait)
    return GroupRpc(addresses, stub_cls, security=security, timeout=timeout, wait=wait)
