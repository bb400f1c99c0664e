"""The master's call port: the namespace calls of master.Call on a plain framed TCP
connection, answered by the same code as the Calls stream (``MasterServicer._run_call``).

Why a second transport: through gRPC's sync server and client every call costs
several thread hand-offs on each side (the client's request iterator and channel
threads, the server's reader and response generator) -- most of the ~0.9 ms of master
CPU and ~0.3 ms of mount CPU per call measured in issue 16.  Here one asyncio loop
thread serves every connection: a read call (READ_CALLS) is answered in that thread,
a mutation in the call pool (it waits for the journal), and the result is written
back by the loop.  The mount's side (fuse_client/call_port.py) runs in its trio loop.

Protocol (all integers big-endian):

- client hello: ``CVC1``, u16 token length, the client token (UTF-8; empty in an open
  cluster);
- server answer: ``CVC1``, u8 status: 0 accepted, 1 wrong token (then closed), 2 too
  many connections (then closed);
- then frames both ways: u32 length, payload: a master.Call from the client, a
  master.CallResult (same id, any order) from the master.

Guards, as for the Calls stream (a holder of the client token must not be able to
starve the master): at most ``max_connections`` connections (master.max_sessions); a
hello within HELLO_TIMEOUT; at most MAX_CALLS_IN_FLIGHT calls of one connection being
answered (past that the master stops reading it); a client that takes no reply for
``idle_timeout`` (master.stream_idle_timeout) is cut off; a frame larger than
MESSAGE_LIMIT closes the connection.  With TLS on (security.tls_*) the port is not
opened and mounts keep the Calls stream: this port has no TLS yet.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
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
                 idle_timeout: float = 60.0, max_in_flight: int = 256):
        self._run_call = run_call
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
        try:
            self._server = loop.run_until_complete(asyncio.start_server(
                self._connection, self._host, self._port, limit=1 << 20, reuse_address=True))
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
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    @staticmethod
    def _shutdown() -> None:
        """In the loop: stop accepting (serve_forever closes the server when cancelled)
        and end every connection (each closes its writer; its calls in the pool finish,
        their replies are dropped)."""
        for task in asyncio.all_tasks():
            task.cancel()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        counted = False
        try:
            status = await self._hello(reader)
            if status == ACCEPTED and self.connections >= self.max_connections:
                status = BUSY
            writer.write(ANSWER.pack(MAGIC, status))
            if status != ACCEPTED:
                if status == BUSY:
                    log.warning("call port: refused %s: %d connections open "
                                "(master.max_sessions)", peer, self.connections)
                await asyncio.wait_for(writer.drain(), HELLO_TIMEOUT)
                return
            self.connections += 1
            counted = True
            await self._calls(reader, writer, peer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError, OSError):
            pass  # the client went away or stalled: its connection ends
        except asyncio.CancelledError:
            pass  # stopping
        except Exception:  # noqa: BLE001 - a bug ends one connection, not the port
            log.exception("call port: connection from %s failed", peer)
        finally:
            if counted:
                self.connections -= 1
            writer.close()

    async def _hello(self, reader: asyncio.StreamReader) -> int:
        magic, n = HELLO.unpack(await asyncio.wait_for(reader.readexactly(HELLO.size),
                                                       HELLO_TIMEOUT))
        if magic != MAGIC or n > MAX_TOKEN:
            raise ConnectionError("not a call port client")
        token = await asyncio.wait_for(reader.readexactly(n), HELLO_TIMEOUT)
        if self._tokens and not any(hmac.compare_digest(token, t) for t in self._tokens):
            RPC_UNAUTHENTICATED.labels("CallPort").inc()
            return UNAUTHENTICATED
        return ACCEPTED

    async def _calls(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     peer) -> None:
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.max_in_flight)
        transport = writer.transport
        transport.set_write_buffer_limits(high=WRITE_BUFFER)

        def send(result: master_pb2.CallResult) -> None:
            slots.release()
            if not writer.is_closing():
                data = result.SerializeToString()
                writer.write(FRAME.pack(len(data)) + data)

        def pooled(call: master_pb2.Call) -> None:
            result = self._run_call(call)
            try:
                loop.call_soon_threadsafe(send, result)
            except RuntimeError:
                pass  # the port stopped meanwhile (loop closed): nobody to answer

        while True:
            if slots.locked() or transport.get_write_buffer_size() > WRITE_BUFFER:
                # The client is behind with its replies: wait for it, but not forever.
                try:
                    await asyncio.wait_for(self._room(slots, writer), self.idle_timeout)
                except asyncio.TimeoutError:
                    self._cut(peer, "takes no replies")
                    return
            else:
                await slots.acquire()  # free: returns at once
            try:
                (n,) = FRAME.unpack(await reader.readexactly(FRAME.size))
            except asyncio.IncompleteReadError:
                slots.release()
                return  # closed by the client
            if n > MESSAGE_LIMIT:
                log.warning("call port: %s sent a %d-byte frame; closing", peer, n)
                return
            call = master_pb2.Call.FromString(await reader.readexactly(n))
            self.calls += 1
            if call.WhichOneof("op") in self._read_calls:
                send(self._run_call(call))
            else:
                self._pool.submit(pooled, call)

    @staticmethod
    async def _room(slots: asyncio.Semaphore, writer: asyncio.StreamWriter) -> None:
        await writer.drain()
        await slots.acquire()

    @staticmethod
    def _cut(peer, why: str) -> None:
        STREAMS_CANCELLED_IDLE.labels("CallPort").inc()
        log.warning("call port: closing the connection of %s: it %s", peer, why)
