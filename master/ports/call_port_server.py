"""The master's call port: the namespace calls of master.Call on a plain framed TCP
connection, answered by the same code as the Calls stream (``MasterServicer._run_call``).

Why a second transport: through gRPC's sync server and client every call costs
several thread hand-offs on each side (the client's request iterator and channel
threads, the server's reader and response generator) -- most of the ~0.9 ms of master
CPU and ~0.3 ms of mount CPU per call measured in issue 16.  Here one asyncio loop
thread serves every connection: a read call (READ_CALLS) is answered in that thread,
and so is an AddBlock that need not wait (``run_nowait``); a namespace mutation runs
as steps (master/meta/steps.py): checked in that thread, planned and made durable by the
committer, answered in that thread again, with no thread waiting for the journal; the
other calls go to the call pool.  Each connection is an
asyncio.Protocol that parses frames as their bytes arrive (no task or stream reader
per call).  The mount's client
(fuse_client/call_port_trio.py) runs in its trio loop; the path client's
(client/master/call_port_blocking.py: the LMCache connector, CLI commands) is blocking and pooled.

Protocol (all integers big-endian):

- client hello: ``CVC1``, u16 token length, the client token (UTF-8; empty in an open
  cluster);
- server answer: ``CVC1``, u8 status: 0 accepted, 1 wrong token (then closed), 2 too
  many connections (then closed);
- then frames both ways: u32 length, payload: a master.Call from the client, a
  master.CallResult (same id, any order) from the master.

Guards (a holder of the client token must not be able to starve the master, nor make
it buffer or compute without bound; docs/security.md, "Limits"), each counted in
curvine_connections_cut_total{port="call_port"} or, for the cut of a client that takes
no replies, curvine_streams_cancelled_idle{method="CallPort"}:

- connections: at most ``max_connections`` (4 x master.max_sessions; past it a client
  is answered BUSY), at most ``per_peer`` of them from one address
  (master.call_port_per_peer; past it a new one is closed at once);
- time: a hello within HELLO_TIMEOUT; every frame whole within ``frame_timeout``
  (master.call_frame_timeout) of its first byte; a connection that sends no call for
  ``idle_timeout`` (master.stream_idle_timeout) while none of its calls is being
  answered is closed, and so is one whose reading was paused that long (it takes no
  replies);
- bytes: a frame of at most ``frame_max`` (master.client_message_max; a larger one
  closes the connection); a frame over SMALL_FRAME still arriving needs room in
  ``buffer_max`` (master.call_port_buffer), shared by all connections, else the
  connection is not read until there is room; replies: at most MAX_CALLS_IN_FLIGHT
  calls of one connection being answered, or replies above WRITE_BUFFER waiting for
  it, and reading pauses;
- the loop: a read is answered in the loop only in its cheap form (the servicer's
  ``run_nowait``; a few milliseconds at most); a read that would cost more goes to the
  heavy-read threads (``heavy``), one at a time per connection (its next one waits,
  unread), taken in turn by peer address (a peer that sends many waits for its turn
  behind each other peer's one);
- garbage: a frame that is not a master.Call closes the connection with one log line
  (at most one such line per QuietLog interval for the whole port).

With TLS on (security.tls_*) the port speaks TLS (the hello and the frames inside it)
with the material of the gRPC ports: the master's certificate, and a client
certificate required where tls_client_auth is.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import logging
import ssl as ssl_mod
import threading
from concurrent import futures
from typing import Callable

from google.protobuf.message import DecodeError

from curvine.common.call_wire import (ACCEPTED, ANSWER, BUSY, FRAME, HELLO, MAGIC,
                                      UNAUTHENTICATED)
from curvine.common.loop_inbox import LoopInbox
from curvine.common.metrics import CONNECTIONS_CUT, RPC_UNAUTHENTICATED, STREAMS_CANCELLED_IDLE
from curvine.common.stream_guard import QuietLog
from curvine.proto import master_pb2

log = logging.getLogger(__name__)


class AfterIndex:
    """What run_nowait returns for a read that must first wait for something that
    costs the master nothing (a standby's read index, master/group/read_index.py):
    ``wait(done)`` calls ``done(error or None)`` from another thread when it may go;
    then ``run(error)``, in the loop, is its answer (None: a heavy read).  No thread
    is held while it waits, and the read runs in the loop as on a leader."""

    __slots__ = ("wait", "run")

    def __init__(self, wait: Callable[[Callable], None],
                 run: Callable[[Exception | None], "master_pb2.CallResult | None"]):
        self.wait = wait
        self.run = run


HELLO_TIMEOUT = 10.0
MAX_TOKEN = 4096
WRITE_BUFFER = 256 << 10  # replies buffered for a slow client before its reading pauses
SMALL_FRAME = 64 << 10  # frames up to this arrive without taking room in buffer_max
SWEEP = 1.0  # seconds between the checks of deadlines (at most; less for short timers)
# the defaults of master.client_message_max, call_frame_timeout, call_port_per_peer,
# call_port_buffer (common/config.py)
FRAME_MAX = 16 << 20
FRAME_TIMEOUT = 10.0
PER_PEER = 64
BUFFER_MAX = 64 << 20
_CUT = {reason: CONNECTIONS_CUT.labels("call_port", reason)
        for reason in ("idle", "partial_frame", "per_peer", "frame_too_large", "garbage",
                       "not_a_client")}


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
                 | None = None,
                 heavy: tuple[futures.Executor, Callable, int] | None = None,
                 frame_max: int = FRAME_MAX, frame_timeout: float = FRAME_TIMEOUT,
                 per_peer: int = PER_PEER, buffer_max: int = BUFFER_MAX):
        self._run_call = run_call
        # run_nowait(call): its result if it need not wait and is cheap, else None (then
        # a read goes to the heavy-read threads, anything else to the pool)
        self._run_nowait = run_nowait
        # (executor, run(call), threads) of the reads run_nowait leaves; None: the pool,
        # run_call, one at a time
        self._heavy_pool, self._run_heavy, self._heavy_slots = heavy or (pool, run_call, 1)
        self._heavy_running = 0
        # connections with a heavy read waiting for a thread, by peer host; the hosts in
        # turn (a host is in _heavy_turns while it has one waiting)
        self._heavy_waiting: dict[str, collections.deque] = {}
        self._heavy_turns: collections.deque[str] = collections.deque()
        self.frame_max = frame_max
        self.frame_timeout = float(frame_timeout)
        self.per_peer = per_peer
        self.buffer_max = buffer_max
        self.buffered = 0  # bytes taken of buffer_max (frames over SMALL_FRAME arriving)
        self._buffer_waiters: list[_Connection] = []  # waiting for room, oldest first
        self._peers: dict[str, int] = {}  # peer host -> connections open
        self.quiet = QuietLog(log)
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
        # answers other threads hand to the loop (the pool's, a standby's read index's:
        # every read that shared an etcd round trip at once): one wake-up for a batch
        self._inbox: LoopInbox | None = None

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
        self._inbox = LoopInbox(loop.call_soon_threadsafe, "an answer")
        try:
            self._server = loop.run_until_complete(loop.create_server(
                lambda: _Connection(self), self._host, self._port, reuse_address=True,
                ssl=self._ssl, ssl_handshake_timeout=HELLO_TIMEOUT if self._ssl else None))
        except BaseException as e:  # noqa: BLE001 - reported to start()
            ready.set_exception(e)
            loop.close()
            return
        ready.set_result(self._server.sockets[0].getsockname()[1])
        sweeper = loop.create_task(self._sweep())
        try:
            loop.run_until_complete(self._server.serve_forever())
        except asyncio.CancelledError:
            pass
        finally:
            sweeper.cancel()
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

    async def _sweep(self) -> None:
        """Close the connections past a deadline (one pass over all of them, at most
        every SWEEP seconds: nothing per call on the hot path)."""
        timers = [t for t in (self.idle_timeout, self.frame_timeout) if t]
        period = min([SWEEP] + [max(t / 4, 0.05) for t in timers])
        while True:
            await asyncio.sleep(period)
            now = self._loop.time()
            for conn in list(self._open):
                conn.check(now)

    def peer_opened(self, host: str) -> bool:
        """Count a connection of ``host``; False if it has its share open already."""
        n = self._peers.get(host, 0)
        if n >= self.per_peer:
            return False
        self._peers[host] = n + 1
        return True

    def peer_closed(self, host: str) -> None:
        n = self._peers.get(host, 0) - 1
        if n > 0:
            self._peers[host] = n
        else:
            self._peers.pop(host, None)

    def heavy(self, conn: "_Connection") -> None:
        """``conn`` has a heavy read (conn.heavy_call) to run: in its host's turn."""
        waiting = self._heavy_waiting.get(conn.host)
        if waiting is None:
            waiting = self._heavy_waiting[conn.host] = collections.deque()
            self._heavy_turns.append(conn.host)
        waiting.append(conn)
        self._next_heavy()

    def heavy_done(self) -> None:
        self._heavy_running -= 1
        self._next_heavy()

    def _next_heavy(self) -> None:
        while self._heavy_running < self._heavy_slots and self._heavy_turns:
            host = self._heavy_turns.popleft()
            waiting = self._heavy_waiting[host]
            conn = waiting.popleft()
            if waiting:
                self._heavy_turns.append(host)
            else:
                del self._heavy_waiting[host]
            call, conn.heavy_call = conn.heavy_call, None
            if conn.closed or call is None:
                continue
            self._heavy_running += 1
            self._heavy_pool.submit(conn._pooled, call, conn._run_heavy_done)

    def reserve(self, n: int) -> bool:
        """Take ``n`` bytes of buffer_max for a frame arriving; False if there is no room."""
        if self.buffered + n > self.buffer_max:
            return False
        self.buffered += n
        return True

    def release(self, n: int) -> None:
        """Give back a frame's room, and let the connections waiting for room read again
        (each takes it again or waits again)."""
        self.buffered -= n
        waiters, self._buffer_waiters = self._buffer_waiters, []
        for conn in waiters:
            self._loop.call_soon(conn.room)

    def _cut(self, peer, why: str) -> None:
        STREAMS_CANCELLED_IDLE.labels("CallPort").inc()
        self.quiet.warning("no-replies", "call port: closing the connection of %s: it %s",
                           peer, why)


class _Connection(asyncio.Protocol):
    """One client's connection, as a protocol: frames are parsed and dispatched as their
    bytes arrive, with no task, future or stream reader per call (about a third of the
    loop's CPU per read call when it was a coroutine on a StreamReader).

    Back-pressure: reading pauses while ``max_in_flight`` calls of this connection are
    being answered, while its replies fill the write buffer, while its heavy read waits
    for the one before, or while its frame waits for room in the port's buffer; a
    connection paused for ``idle_timeout`` is cut off.  Deadlines are checked by the
    port's sweep (``check``): the hot path only notes the time of each read."""

    def __init__(self, port: CallPort):
        self.port = port
        self.loop = port._loop
        self.transport: asyncio.Transport | None = None
        self.peer = None
        self.host: str | None = None  # counted in port._peers while open
        self.buf = bytearray()
        self.accepted = False  # hello taken
        self.closed = False
        self.in_flight = 0  # calls in the pool or the heavy-read threads
        self.reading_paused = False
        self.writing_paused = False  # the transport's buffer is above WRITE_BUFFER
        self.timer: asyncio.TimerHandle | None = None  # the hello's deadline
        now = self.loop.time()
        self.last = now  # loop time of the last bytes received (or reply sent)
        self.paused_since = 0.0
        self.partial_since: float | None = None  # the buffer's incomplete frame began
        self.reserved = 0  # bytes of port.buffer_max held by the frame arriving
        self.waiting_room = False  # in port._buffer_waiters
        self.heavy_busy = False  # a heavy read of this connection waits or is answered
        self.heavy_call: master_pb2.Call | None = None  # it, while it waits for a thread
        self.heavy_next: master_pb2.Call | None = None  # the next one, waiting for it

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        host = str(self.peer[0]) if isinstance(self.peer, tuple) and self.peer else "?"
        port = self.port
        if not port.peer_opened(host):
            _CUT["per_peer"].inc()
            port.quiet.warning("per-peer", "call port: refused a connection of %s: it has "
                               "%d open (master.call_port_per_peer)", host, port.per_peer)
            self.closed = True
            transport.abort()
            return
        self.host = host
        transport.set_write_buffer_limits(high=WRITE_BUFFER)
        self.timer = self.loop.call_later(HELLO_TIMEOUT, transport.abort)
        port._open.add(self)

    def data_received(self, data: bytes) -> None:
        """Also called with b"" on resuming: frames that arrived before a pause."""
        if self.closed:
            return
        if data:
            self.buf += data
            self.last = self.loop.time()
        try:
            if not self.accepted and not self._hello():
                return
            self._process()
        except Exception:  # noqa: BLE001 - a bug ends one connection, not the port
            log.exception("call port: connection from %s failed", self.peer)
            self.transport.abort()

    def connection_lost(self, exc) -> None:
        if self.host is None:
            return  # refused in connection_made: never counted
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
        port = self.port
        port._open.discard(self)
        port.peer_closed(self.host)
        self.host = None
        self.buf = bytearray()
        if self.reserved:
            n, self.reserved = self.reserved, 0
            port.release(n)
        if self.accepted:
            port.connections -= 1

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
            _CUT["not_a_client"].inc()
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
            port.quiet.warning("busy", "call port: refused %s: %d connections open (4 x "
                               "master.max_sessions)", self.peer, port.connections)
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
                if (self.in_flight >= port.max_in_flight or self.writing_paused
                        or self.heavy_next is not None):
                    self._pause()
                    return
                (n,) = FRAME.unpack_from(buf, pos)
                if n > port.frame_max:
                    _CUT["frame_too_large"].inc()
                    port.quiet.warning("frame-size", "call port: %s sent a %d-byte frame "
                                       "(at most %d: master.client_message_max); closing",
                                       self.peer, n, port.frame_max)
                    self.transport.abort()
                    return
                start = pos + FRAME.size
                if len(buf) - start < n:
                    if n > SMALL_FRAME and not self.reserved:
                        if not port.reserve(n):
                            self._wait_for_room()
                            return
                        self.reserved = n
                    break
                try:
                    call = master_pb2.Call.FromString(bytes(buf[start:start + n]))
                except DecodeError:
                    _CUT["garbage"].inc()
                    port.quiet.warning("garbage", "call port: %s sent a frame that is not a "
                                       "master.Call (%d bytes); closing", self.peer, n)
                    self.transport.abort()
                    return
                pos = start + n
                self.partial_since = None
                if self.reserved:
                    r, self.reserved = self.reserved, 0
                    port.release(r)
                port.calls += 1
                self._dispatch(call)
        finally:
            del buf[:pos]
            if buf and self.partial_since is None:
                self.partial_since = self.loop.time()

    def _dispatch(self, call: master_pb2.Call) -> None:
        port = self.port
        read = call.WhichOneof("op") in port._read_calls
        if port._run_nowait is not None:
            result = port._run_nowait(call)
            if isinstance(result, AfterIndex):  # a read that waits (a standby's read index)
                self.in_flight += 1
                result.wait(lambda error: self._call_in_loop(self._indexed, call, result,
                                                             error))
                return
            if result is not None:
                self._send(result)
                return
        elif read:
            self._send(port._run_call(call))  # no run_nowait: every read in the loop
            return
        if read:
            self._read_heavy(call)
            return
        self.in_flight += 1
        if port._mutations is None or not port._mutations.start(call, self._answered):
            port._pool.submit(self._pooled, call, port._run_call)

    def _read_heavy(self, call: master_pb2.Call) -> None:
        if self.heavy_busy:
            self.heavy_next = call  # one at a time: reading pauses until it is done
            return
        self._heavy(call)

    def _indexed(self, call: master_pb2.Call, after: AfterIndex,
                 error: Exception | None) -> None:
        """(In the loop) a read whose wait is over: answered here, or a heavy read."""
        self.in_flight -= 1
        if self.closed:
            return
        result = after.run(error)
        if result is None:
            self._read_heavy(call)
        else:
            self._send(result)
        self._resume()

    def _call_in_loop(self, fn, *args) -> None:
        """``fn(*args)`` in the loop, from another thread (nothing once it stopped)."""
        self.port._inbox.post(fn, *args)  # (nothing once the port stopped: nobody to answer)

    def _heavy(self, call: master_pb2.Call) -> None:
        self.heavy_busy = True
        self.heavy_call = call
        self.in_flight += 1
        self.port.heavy(self)

    def _run_heavy_done(self, call):
        """In a heavy-read thread: the read, serialized here (a big reply would take
        the loop milliseconds), then (in the loop) the next one may go."""
        return self.port._run_heavy(call).SerializeToString(), True

    def _pooled(self, call: master_pb2.Call, run) -> None:
        """In a pool thread: a mutation (it waits for the journal) or a heavy read."""
        self._call_in_loop(self._answered, run(call))

    def _answered(self, result) -> None:
        if isinstance(result, tuple):  # a heavy read's
            result = result[0]
            self.port.heavy_done()
            self.heavy_busy = False
            nxt, self.heavy_next = self.heavy_next, None
            if nxt is not None and not self.closed:
                self._heavy(nxt)
        self.in_flight -= 1
        self._send(result)
        self._resume()

    def _send(self, result: "master_pb2.CallResult | bytes") -> None:
        if not self.closed:
            data = result if isinstance(result, bytes) else result.SerializeToString()
            self.transport.write(FRAME.pack(len(data)) + data)

    def _wait_for_room(self) -> None:
        """The frame arriving needs room in the port's buffer that others hold: stop
        reading until ``room``."""
        if not self.waiting_room:
            self.waiting_room = True
            self.port._buffer_waiters.append(self)
        self._pause()

    def room(self) -> None:
        """The port's buffer has room again: read on (the frame takes it, or waits)."""
        self.waiting_room = False
        self._resume()

    def _pause(self) -> None:
        """The client is behind with its replies (or the pool with its calls, or the
        port's buffer has no room): stop reading it, and cut it off if that lasts
        idle_timeout."""
        if self.reading_paused or self.closed:
            return
        self.reading_paused = True
        self.paused_since = self.loop.time()
        self.transport.pause_reading()

    def _resume(self) -> None:
        if (not self.reading_paused or self.closed or self.writing_paused
                or self.waiting_room or self.heavy_next is not None
                or self.in_flight >= self.port.max_in_flight):
            return
        self.reading_paused = False
        self.last = self.loop.time()
        self.partial_since = self.last if self.buf else None  # its deadline starts again
        self.transport.resume_reading()
        self.data_received(b"")  # frames that arrived before the pause (one guarded path)

    def check(self, now: float) -> None:
        """The port's sweep: close this connection if it is past a deadline."""
        if self.closed or not self.accepted:
            return  # (the hello has its own timer)
        port = self.port
        if self.reading_paused:
            if port.idle_timeout and now - self.paused_since > port.idle_timeout:
                port._cut(self.peer, "takes no replies")
                self.transport.abort()
            return
        if self.partial_since is not None and now - self.partial_since > port.frame_timeout:
            _CUT["partial_frame"].inc()
            port.quiet.warning("partial", "call port: closing the connection of %s: a frame "
                               "not whole within %gs (master.call_frame_timeout)", self.peer,
                               port.frame_timeout)
            self.transport.abort()
            return
        if (port.idle_timeout and not self.in_flight and not self.buf
                and now - self.last > port.idle_timeout):
            _CUT["idle"].inc()
            log.debug("call port: closing the connection of %s: no call for %gs "
                      "(master.stream_idle_timeout)", self.peer, port.idle_timeout)
            self.transport.abort()
