"""The one route of the mount's master calls: :class:`Calls`, on the mount's Calls
stream where the call has a field in master.Call, else as a unary RPC in a thread.
The trio loop awaits ``Calls.run``; other threads (a writer publishing at close, an
upload allocating a block) call ``Calls.from_thread``.

A unary gRPC call from trio costs a ``trio.to_thread`` hop there and back plus grpcio's
per-call set-up, status and trailers on both ends; a message on an open stream costs
about half of that CPU and ~40% less latency here (client: ~320 vs ~420 us CPU, ~430
vs ~750 us per call on this box).  One thread keeps the stream open and hands each
result straight to the waiting trio task (``run_sync_soon``) or thread (a Future).

The stream is an optimisation only: while it is down, or if it breaks with a call in
flight, the call goes as a unary RPC in a thread, with the same request (mutations
keep their request id, so one the master did apply is answered from its retry cache).
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import logging
import queue
import threading
from typing import Awaitable, Callable

import grpc
import outcome
import trio

from curvine.client.master.call_port_blocking import BlockingCallPort
from curvine.client.master.master_client import MasterClient, Prepared, StreamThread
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO
from curvine.common.rpc import RETRY_MAX
from curvine.proto import master_pb2

from .call_port_trio import CallPortClient, PortDown, reply_of

log = logging.getLogger(__name__)

# The first message of every Calls stream (its result, id 0, is dropped): the master
# cancels a stream that has sent nothing for master.stream_idle_timeout.
HELLO = master_pb2.Call(id=0, getattr=master_pb2.GetAttrRequest(ino=ROOT_INO))


class _StreamDown(Exception):
    pass


class CallStream(StreamThread):
    """The mount's Calls stream (started from a thread; ``call`` from trio)."""

    def __init__(self, master: MasterClient, timeout: float):
        super().__init__("calls")
        self.master = master
        self.timeout = timeout
        self._lock = threading.Lock()
        self._out: queue.SimpleQueue | None = None  # set while a stream is open
        self._pending: dict[int, tuple] = {}  # id -> (trio token, task)
        self._ids = itertools.count(1)

    async def call(self, prepared: Prepared):
        """The call's reply message; CurvineError as the master raised it;
        _StreamDown when the stream cannot carry it (nothing is known of its fate)."""
        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()
        with self._lock:
            out = self._out
            if out is None:
                raise _StreamDown()
            cid = next(self._ids)
            self._pending[cid] = (token, task)
        out.put(master_pb2.Call(id=cid, **{prepared.op: prepared.request}))

        def abort(_raise_cancel):
            with self._lock:
                if self._pending.pop(cid, None) is None:
                    return trio.lowlevel.Abort.FAILED  # its result is on the way
            return trio.lowlevel.Abort.SUCCEEDED

        with trio.move_on_after(self.timeout) as scope:
            result = await trio.lowlevel.wait_task_rescheduled(abort)
        if scope.cancelled_caught:
            raise self._timeout(prepared)
        return reply_of(result)

    def call_blocking(self, prepared: Prepared):
        """``call`` from any thread but the trio loop's (a writer publishing, an upload
        allocating a block): the result comes straight to this thread."""
        waiter: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            out = self._out
            if out is None:
                raise _StreamDown()
            cid = next(self._ids)
            self._pending[cid] = waiter
        out.put(master_pb2.Call(id=cid, **{prepared.op: prepared.request}))
        try:
            result = waiter.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            with self._lock:
                self._pending.pop(cid, None)
            raise self._timeout(prepared) from None
        return reply_of(result.unwrap())

    def _timeout(self, prepared: Prepared) -> CurvineError:
        return CurvineError(ErrorKind.TIMEOUT, f"{prepared.method}: no answer within "
                                               f"{self.timeout:.0f}s")

    @staticmethod
    def _wake(waiter, value: outcome.Outcome) -> None:
        """Hand ``value`` to a waiting trio task (token, task) or thread (a Future)."""
        if isinstance(waiter, concurrent.futures.Future):
            waiter.set_result(value)
            return
        token, task = waiter
        try:
            token.run_sync_soon(trio.lowlevel.reschedule, task, value)
        except trio.RunFinishedError:
            pass

    def _resolve(self, cid: int, value: outcome.Outcome) -> None:
        with self._lock:
            waiter = self._pending.pop(cid, None)
        if waiter is not None:
            self._wake(waiter, value)

    def _run(self) -> None:
        delay = 0.1
        lost = False  # since the last result: retries while the master is down log quietly
        while not self._stop.is_set() and not self.master._rpc.closed:
            out: queue.SimpleQueue = queue.SimpleQueue()
            out.put(HELLO)

            def requests():
                while True:
                    c = out.get()
                    if c is None:
                        return
                    yield c

            call = None
            try:
                self._call = call = self.master._rpc.stub.Calls(requests())
                with self._lock:
                    self._out = out
                for result in call:
                    if lost:
                        log.info("calls stream working again")
                        lost = False
                    delay = 0.1
                    self._resolve(result.id, outcome.Value(result))
            except grpc.RpcError as e:
                if not self._stop.is_set():
                    log.log(logging.DEBUG if lost else logging.INFO,
                            "calls stream lost: %s (namespace calls go unary until it is "
                            "back)", e.code() if hasattr(e, "code") else e)
                    lost = True
            except Exception:  # noqa: BLE001 - unary calls still work
                # closing: the channel was closed under the call (ValueError), not a fault
                if not (self._stop.is_set() or self.master._rpc.closed):
                    log.exception("calls stream failed")
            finally:
                with self._lock:
                    self._out = None
                    pending, self._pending = self._pending, {}
                out.put(None)
                self._call = None
                if call is not None:
                    call.cancel()
                for waiter in pending.values():
                    self._wake(waiter, outcome.Error(_StreamDown()))
            self._stop.wait(delay)
            delay = min(delay * 2, RETRY_MAX)


class Calls:
    """``await calls.run(op, *args)``: master call ``op`` of MasterClient.prepare, on
    the master's call port when it is up (fuse_client/call_port_trio.py), else on the Calls
    stream when it is up, for calls that have a field in master.Call; else (or when
    both break with the call in flight) as a unary RPC through ``to_thread`` (a
    function that runs a blocking callable in a thread)."""

    def __init__(self, master: MasterClient,
                 to_thread: Callable[..., Awaitable], stream: CallStream | None = None,
                 port: CallPortClient | None = None,
                 thread_port: BlockingCallPort | None = None):
        self.master = master
        self.to_thread = to_thread
        self.stream = stream
        self.port = port
        # the same port from threads on connections of their own (client/master/call_port_blocking.py):
        # a writer's AddBlock and CompleteFile without a hop into the trio loop
        self.thread_port = thread_port

    async def run(self, op: str, *args, **kwargs):
        prepared = self.master.prepare(op, *args, **kwargs)
        for route in self._routes(prepared):
            try:
                return prepared.convert(await route.call(prepared))
            except _ROUTE_DOWN:
                pass
            except CurvineError as e:
                _unless_unavailable(e)
        return await self.to_thread(functools.partial(self.master.call, prepared))

    def from_thread(self, op: str, *args, **kwargs):
        """``run`` from a thread (not the trio loop's): on the port or the stream, else
        unary in this very thread.  Not through ``to_thread``: a thread trio started
        already holds a slot of the mount's thread limiter, and threads that all wait
        for another slot would wait forever."""
        prepared = self.master.prepare(op, *args, **kwargs)
        routes = self._routes(prepared)
        if routes and self.thread_port is not None:
            routes.insert(0, self.thread_port)
        for route in routes:
            try:
                return prepared.convert(route.call_blocking(prepared))
            except _ROUTE_DOWN:
                pass
            except CurvineError as e:
                _unless_unavailable(e)
        return self.master.call(prepared)

    def _routes(self, prepared: Prepared) -> list:
        """The port and the stream, those that are set, for a call that has a field in
        master.Call; none for the others (unary only)."""
        if not prepared.op:
            return []
        return [r for r in (self.port, self.stream) if r is not None]


# a route that cannot carry a call: it goes on the next one (nothing is known of its fate)
_ROUTE_DOWN = (PortDown, _StreamDown)


def _unless_unavailable(e: CurvineError) -> None:
    """Re-raise ``e`` unless the master said UNAVAILABLE (e.g. no live workers yet after
    its restart): that one goes unary, which retries it for up to cluster.master_wait
    like every unary call."""
    if e.kind != ErrorKind.UNAVAILABLE:
        raise e
