"""The one route of a master call, used by the path client (client/master/master_client.py)
and the mount (fuse_client/calls.py): :class:`Route`.

A call that has a field in master.Call goes on each carrier that is set, in order: from a
thread, the call port on connections of that thread's own (``thread_port``) first; then the
master's call port (``port``), then the mount's Calls stream (``stream``).  A carrier that
cannot carry the call (down, or the connection broke with the call in flight: nothing is
known of its fate) passes it on, and so does the master's UNAVAILABLE on it (e.g. no live
workers yet after its restart); last the call goes as the unary RPC with the same request
(a mutation keeps its request id, so one the master did apply is answered from its retry
cache), which retries UNAVAILABLE for up to cluster.master_wait like every unary call.
Calls without a field in master.Call go unary only.

Where the master is: the carriers are set here (or found by ``discover``, before each
blocking call) and the unary RPC is one function, so following the master somewhere else
changes these and nothing of the callers.  A master group (common/master_group.py): a
standby's NOT_LEADER on a carrier passes the call on like UNAVAILABLE; the unary RPC
(``GroupRpc``) follows the leader it names, within the same wait; carriers bound to one
master see the move (``master_group.moves``) and reconnect to the leader.  Reads that
grant no lease (``spreadable``) go first to ``reads`` when it is set: the group member
this client reads from (client.read_member), a standby that answers after its read
index; if it cannot (down, behind, a standby no more), the call takes the route.

May import: ``curvine.common``, ``curvine.proto``, ``client.master.requests``.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Awaitable, Callable, Protocol

from curvine.common.call_wire import PortDown
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.master_group import MOVE_ON

from .requests import Prepared


class StreamDown(Exception):
    """The Calls stream cannot carry a call (nothing is known of its fate)."""


# a carrier that cannot carry a call: it goes on the next one
CARRIER_DOWN = (PortDown, StreamDown)


class Carrier(Protocol):
    """The call port (either client) or the Calls stream.  ``call`` only for carriers of
    the mount's trio loop."""

    def call_blocking(self, prepared: Prepared, timeout: float | None = None) -> Any: ...


Unary = Callable[[Prepared, "float | None", "float | None"], Any]  # (prepared, timeout, wait)
Reads = Callable[[Prepared, "float | None"], Any]  # (prepared, timeout): the reply

# what a standby answers (master/ports/service.py STANDBY_READS) ...
_STANDBY_READS = frozenset(("Lookup", "GetAttr", "ListDir", "StatFs", "LookupMany",
                            "GetXattr", "ListXattr", "GetBlocks"))


def spreadable(prepared: Prepared) -> bool:
    """A read any member of a group may answer: one a standby serves, that grants no
    lease (no session) and records no open (a GetBlocks without open_id)."""
    req = prepared.request
    return (prepared.method in _STANDBY_READS and not getattr(req, "session", 0)
            and not getattr(req, "open_id", 0) and not getattr(req, "write", False))
Discover = Callable[["Route", "float | None", "float | None"], None]  # (route, timeout, wait)


class Route:
    """The carriers of master calls and the unary RPC behind them; ``call_blocking`` from
    any thread but a trio loop's, ``await call`` from the mount's trio loop.  Both return
    the reply message (``prepared.convert`` is the caller's)."""

    def __init__(self, unary: Unary, discover: Discover | None = None):
        self.unary = unary
        # before a blocking call, with its time left and wait: sets carriers not known
        # yet (the path client's call port, once StatFs names one)
        self.discover = discover
        self.thread_port: Carrier | None = None  # a thread's own connections to the port
        self.port: Carrier | None = None  # the master's call port (the mount's in trio)
        self.stream: Carrier | None = None  # the mount's Calls stream
        self.reads: Reads | None = None  # the group member unleased reads go to first

    def carriers(self, prepared: Prepared, in_thread: bool) -> list:
        """The carriers that are set, in order, for a call that has a field in
        master.Call; none for the others (unary only)."""
        if not prepared.op:
            return []
        order = (self.thread_port, self.port, self.stream) if in_thread else (self.port,
                                                                             self.stream)
        return [c for c in order if c is not None]

    def call_blocking(self, prepared: Prepared, timeout: float | None = None,
                      wait: float | None = None):
        """The reply within ``timeout`` for the whole route (None: each carrier's own);
        ``wait``: how long the unary RPC waits for a master that is down."""
        end = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:  # the caller's deadline covers the whole route
            return None if end is None else max(end - time.monotonic(), 0.001)

        if self.reads is not None and spreadable(prepared):
            try:
                return self.reads(prepared, left())
            except CurvineError as e:
                if e.kind not in MOVE_ON:
                    raise
        if self.discover is not None:
            self.discover(self, left(), wait)
        for carrier in self.carriers(prepared, in_thread=True):
            try:
                return carrier.call_blocking(prepared, left())
            except CARRIER_DOWN:
                pass
            except CurvineError as e:
                _unless_unavailable(e)
        return self.unary(prepared, left(), wait)

    async def call(self, prepared: Prepared, to_thread: Callable[..., Awaitable]):
        """The reply, from the trio loop; the unary RPC through ``to_thread`` (a function
        that runs a blocking callable in a thread)."""
        if self.reads is not None and spreadable(prepared):
            try:
                return await to_thread(functools.partial(self.reads, prepared, None))
            except CurvineError as e:
                if e.kind not in MOVE_ON:
                    raise
        for carrier in self.carriers(prepared, in_thread=False):
            try:
                return await carrier.call(prepared)
            except CARRIER_DOWN:
                pass
            except CurvineError as e:
                _unless_unavailable(e)
        return await to_thread(functools.partial(self.unary, prepared, None, None))


# answers of a carrier's master after which the call goes on: it is down for now, or
# a standby of a group (the unary RPC then follows the leader it names)
PASS_ON = (ErrorKind.UNAVAILABLE, ErrorKind.NOT_LEADER)


def _unless_unavailable(e: CurvineError) -> None:
    """Re-raise ``e`` unless the master said UNAVAILABLE or NOT_LEADER: those go on (at
    last unary, which retries for up to cluster.master_wait, following the leader)."""
    if e.kind not in PASS_ON:
        raise e
