"""The master's call port: the namespace calls of master.Call on a plain framed TCP
connection, answered by the same code as the Calls stream (``MasterServicer._run_call``).

Why a second transport: through gRPC's sync server and client every call costs
several thread hand-offs on each side (the client's request iterator and channel
threads, the server's reader and response generator) -- most of the ~0.9 ms of master
CPU and ~0.3 ms of mount CPU per call measured in issue 16.  Here one asyncio loop
thread serves every connection: a read call (READ_CALLS) is answered in that thread,
and so is an AddBlock that need not wait (``run_nowait``); a namespace mutation runs
as steps (master/steps.py): checked in that thread, planned and made durable by the
committer, answered in that thread again, with no thread waiting for the journal; the
other calls go to the call pool.  Each connection is an
asyncio.Protocol that parses frames as their bytes arrive (no task or stream reader
per call).  The mount's client
(fuse_client/call_port.py) runs in its trio loop; the path client's
(client/call_port.py: the LMCache connector, CLI commands) is blocking and pooled.

Protocol (all integers big-endian):

- client hello: ``CVC1``, u16 token length, the client token (UTF-8; empty in an open
  cluster);
- server answer: ``CVC1``, u8 status: 0 accepted, 1 wrong token (then closed), 2 too
  many connections (then closed);
- then frames both ways: u32 length, payload: a master.Call from the client, a
  master.CallResult (same id, any order) from the master.

Guards, as for the Calls stream (a holder of the client token must not be able to
starve the master): at most ``max_connections`` connections (4 x master.max_sessions); a
hello within HELLO_TIMEOUT; at most MAX_CALLS_IN_FLIGHT calls of one connection being
answered, or replies above WRITE_BUFFER waiting for it (past that the master stops
reading it); a client that takes no reply for
``idle_timeout`` (master.stream_idle_timeout) is cut off; a frame larger than
MESSAGE_LIMIT closes the connection.  With TLS on (security.tls_*) the port speaks
TLS (the hello and the frames inside it) with the material of the gRPC ports: the
master's certificate, and a client certificate required where tls_client_auth is.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl as ssl_mod
import threading
from concurrent import futures
from typing import Callable

from curvine.common.call_wire import (ACCEPTED, ANSWER, BUSY, FRAME, HELLO, MAGIC,
                                      UNAUTHENTICATED)
from curvine.common.metrics import RPC_UNAUTHENTICATED, STREAMS_CANCELLED_IDLE
from curvine.common.rpc import MESSAGE_LIMIT
from curvine.proto import master_pb2

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 10.0
MAX_TOKEN = 4096
WRITE_BUFFER = 256 << 10  # replies buffered for a slow client before its reading pauses


class CallPort:
    """Serves ``run_call(call) -> CallResult`` (the servicer's) on ``host:port`` from a
    loop thread; ``read_calls``: the ops answered in that thread (the rest go to
    ``pool``).  ``tokens``: the accepted client tokens (() = no check)."""

    def __init__(self, run_call: Callable[[master_pb2.Call], master_pb2.CallResult],
                 read_calls: frozenset[str], pool: futures.Executor, host: str, port: int,
                 tokens: tuple[str, ...] = (), max_connections: int = 1024,
                 idle_timeout: float = 60.0, max_in_flight: int = 256,
                 mutations: Callable | None = None, ssl: "ssl_mod.SSLContext | None" = None,
                 run_nowait: Callable[[master_pb2.Call], master_pb2.CallResult | None]
                 | None = None):
        self._run_call = run_call
        # run_nowait(call): its result if it need not wait, else None (then the pool)
        self._run_nowait = run_nowait
        self._ssl = ssl  # TLS (security.tls_*): the same material as the gRPC ports
        # mutations(call_soon_threadsafe) -> an object whose start(call, answer) runs the
        # mutations among calls in the loop (the servicer's CallMutations)
        self._make_mutations = mutations
        self._mutations = None
        self._read_calls = read_calls
        self._pool = pool
        self._host = host
        self._port = port
        self._tokens = tuple(t.encode() for t in tokens)
        self.max_connections = max_connections
        self.idle_timeout = float(idle_timeout) or None
        self.max_in_flight = max_in_flight
        self.connections = 0
        self.calls = 0  # calls read (the loop thread counts)
        self.port = 0  # bound port, once started
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._open: set[_Connection] = set()  # every connection (the loop's)
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Bind and serve; returns the bound port.  OSError if the port is taken."""
        ready: futures.Future = futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(ready,),
                                        name="call-port", daemon=True)
        self._thread.start()
        self.port = ready.result(timeout=30)
        return self.port

    def stop(self) -> None:
        """Close every connection and the port (again: nothing)."""
        loop, self._loop = self._loop, None
        if loop is None or self._thread is None:
            return
        try:
            loop.call_soon_threadsafe(self._shutdown)
        except RuntimeError:
            return  # the loop ended already
        self._thread.join(timeout=10)

    # -- the loop thread ------------------------------------------------------------
    def _serve(self, ready: futures.Future) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        if self._make_mutations is not None:
            self._mutations = self._make_mutations(loop.call_soon_threadsafe)
        try:
            self._server = loop.run_until_complete(loop.create_server(
                lambda: _Connection(self), self._host, self._port, reuse_address=True,
                ssl=self._ssl, ssl_handshake_timeout=HELLO_TIMEOUT if self._ssl else None))
        except BaseException as e:  # noqa: BLE001 - reported to start()
            ready.set_exception(e)
            loop.close()
            return
        ready.set_result(self._server.sockets[0].getsockname()[1])
        try:
            loop.run_until_complete(self._server.serve_forever())
        except asyncio.CancelledError:
            pass
        finally:
            for conn in list(self._open):
                conn.transport.abort()
            loop.run_until_complete(asyncio.sleep(0))  # their connection_lost runs
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    @staticmethod
    def _shutdown() -> None:
        """In the loop: stop accepting (serve_forever closes the server when cancelled);
        then every connection is closed (its calls in the pool finish, their replies are
        dropped)."""
        for task in asyncio.all_tasks():
            task.cancel()

    @staticmethod
    def _cut(peer, why: str) -> None:
        STREAMS_CANCELLED_IDLE.labels("CallPort").inc()
        log.warning("call port: closing the connection of %s: it %s", peer, why)


class _Connection(asyncio.Protocol):
    """One client's connection, as a protocol: frames are parsed and dispatched as their
    bytes arrive, with no task, future or stream reader per call (about a third of the
    loop's CPU per read call when it was a coroutine on a StreamReader).

    Back-pressure: reading pauses while ``max_in_flight`` calls of this connection are
    being answered or while its replies fill the write buffer; a connection paused for
    ``idle_timeout`` is cut off."""

    def __init__(self, port: CallPort):
        self.port = port
        self.loop = port._loop
        self.transport: asyncio.Transport | None = None
        self.peer = None
        self.buf = bytearray()
        self.accepted = False  # hello taken
        self.closed = False
        self.in_flight = 0  # calls in the pool
        self.reading_paused = False
        self.writing_paused = False  # the transport's buffer is above WRITE_BUFFER
        self.timer: asyncio.TimerHandle | None = None  # hello deadline, or idle cut-off

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        transport.set_write_buffer_limits(high=WRITE_BUFFER)
        self.timer = self.loop.call_later(HELLO_TIMEOUT, transport.abort)
        self.port._open.add(self)

    def data_received(self, data: bytes) -> None:
        """Also called with b"" on resuming: frames that arrived before a pause."""
        self.buf += data
        try:
            if not self.accepted and not self._hello():
                return
            self._process()
        except Exception:  # noqa: BLE001 - a bug ends one connection, not the port
            log.exception("call port: connection from %s failed", self.peer)
            self.transport.abort()

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
        self.port._open.discard(self)
        if self.accepted:
            self.port.connections -= 1

    def pause_writing(self) -> None:
        self.writing_paused = True
        self._pause()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._resume()

    # -- the hello ---------------------------------------------------------------------
    def _hello(self) -> bool:
        """Answer the hello once it is whole; True if accepted (the rest of the buffer
        is calls)."""
        if len(self.buf) < HELLO.size:
            return False
        magic, n = HELLO.unpack_from(self.buf)
        if magic != MAGIC or n > MAX_TOKEN:
            self.transport.abort()  # not a call port client
            return False
        if len(self.buf) < HELLO.size + n:
            return False
        token = bytes(self.buf[HELLO.size:HELLO.size + n])
        del self.buf[:HELLO.size + n]
        self.timer.cancel()
        self.timer = None
        port = self.port
        status = ACCEPTED
        if port._tokens and not any(hmac.compare_digest(token, t) for t in port._tokens):
            RPC_UNAUTHENTICATED.labels("CallPort").inc()
            status = UNAUTHENTICATED
        elif port.connections >= port.max_connections:
            log.warning("call port: refused %s: %d connections open (4 x master.max_sessions)",
                        self.peer, port.connections)
            status = BUSY
        self.transport.write(ANSWER.pack(MAGIC, status))
        if status != ACCEPTED:
            self.transport.close()  # once the answer is sent
            return False
        self.accepted = True
        port.connections += 1
        return True

    # -- calls -------------------------------------------------------------------------
    def _process(self) -> None:
        """Dispatch the whole frames in the buffer, up to max_in_flight in the pool."""
        buf, port = self.buf, self.port
        pos = 0
        try:
            while len(buf) - pos >= FRAME.size and not self.closed:
                if self.in_flight >= port.max_in_flight or self.writing_paused:
                    self._pause()
                    return
                (n,) = FRAME.unpack_from(buf, pos)
                if n > MESSAGE_LIMIT:
                    log.warning("call port: %s sent a %d-byte frame; closing", self.peer, n)
                    self.transport.abort()
                    return
                start = pos + FRAME.size
                if len(buf) - start < n:
                    break
                call = master_pb2.Call.FromString(bytes(buf[start:start + n]))
                pos = start + n
                port.calls += 1
                if call.WhichOneof("op") in port._read_calls:
                    self._send(port._run_call(call))
                    continue
                if port._run_nowait is not None:
                    result = port._run_nowait(call)
                    if result is not None:
                        self._send(result)
                        continue
                self.in_flight += 1
                if port._mutations is None or not port._mutations.start(call, self._answered):
                    port._pool.submit(self._pooled, call)
        finally:
            del buf[:pos]

    def _pooled(self, call: master_pb2.Call) -> None:
        """In a pool thread: a mutation (it waits for the journal)."""
        result = self.port._run_call(call)
        try:
            self.loop.call_soon_threadsafe(self._answered, result)
        except RuntimeError:
            pass  # the port stopped meanwhile (loop closed): nobody to answer

    def _answered(self, result: master_pb2.CallResult) -> None:
        self.in_flight -= 1
        self._send(result)
        self._resume()

    def _send(self, result: master_pb2.CallResult) -> None:
        if not self.closed:
            data = result.SerializeToString()
            self.transport.write(FRAME.pack(len(data)) + data)

    def _pause(self) -> None:
        """The client is behind with its replies (or the pool with its calls): stop
        reading it, and cut it off if that lasts idle_timeout."""
        if self.reading_paused or self.closed:
            return
        self.reading_paused = True
        self.transport.pause_reading()
        if self.port.idle_timeout:
            self.timer = self.loop.call_later(self.port.idle_timeout, self._idle)

    def _resume(self) -> None:
        if (not self.reading_paused or self.closed or self.writing_paused
                or self.in_flight >= self.port.max_in_flight):
            return
        self.reading_paused = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.transport.resume_reading()
        self.data_received(b"")  # frames that arrived before the pause (one guarded path)

    def _idle(self) -> None:
        self.timer = None
        if self.reading_paused and not self.closed:
            self.port._cut(self.peer, "takes no replies")
            self.transport.abort()
