"""The mount's connection to the master's call port (master/ports/call_port_server.py, which has the
protocol): master.Call frames out, master.CallResult frames back, all in the trio loop.

A call from the trio loop registers its task, writes its frame straight into the
non-blocking socket (the rest, if the socket is full, is flushed by a writer task)
and sleeps until the reader task hands it its result: no thread hand-off on either
side.  A call from another thread (a writer's publish, an upload's AddBlock) is handed
to the loop with ``run_sync_soon`` and waits on a Future.

The port is an optimisation like the Calls stream: while it is down, or when the
connection breaks with a call in flight, the call raises :class:`PortDown` and
``Calls`` sends the same request on the stream or as a unary RPC (mutations keep
their request id, so one the master did apply is answered from its retry cache).

With TLS on, the same bytes go through an ``ssl.SSLObject`` over memory buffers
(``_Tls``), so a call still writes its frame without waiting.

An outage of the port (the master gone, or, in a master group, the calls moving from
member to member during an election: the mount replaces its TrioCallPort at each move)
is logged twice at INFO, when it starts and when a call is answered on a port again
(``Outage``, one per mount); every reconnect in between is DEBUG.
"""

from __future__ import annotations

import concurrent.futures
import errno
import itertools
import logging
import socket
import ssl
import time

import outcome
import trio

from curvine.client.master.requests import Prepared
from curvine.common.call_wire import (ANSWER, FRAME, UNAUTHENTICATED, PortDown, PortRefused,
                                      check_answer, hello, reply_of)
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.rpc import MESSAGE_LIMIT, RETRY_MAX
from curvine.proto import master_pb2

log = logging.getLogger(__name__)

RECV_SIZE = 1 << 20
EXPIRY_CHECK = 0.5  # seconds between checks for calls past their deadline


class Outage:
    """Whether the mount's call port is in an outage, across the TrioCallPorts of one
    mount: the loss that starts one and the first answer that ends it are logged at
    INFO, the reconnects between at DEBUG (as the lease session logs its outages)."""

    def __init__(self):
        self.since = 0.0  # monotonic start of the outage; 0: none
        self.ever_up = False  # a connection was up once (the mount's first is INFO)

    def lost(self, message: str, *args) -> None:
        """A connection failed or broke: the first of an outage at INFO."""
        if self.since:
            log.debug(message, *args)
            return
        self.since = time.monotonic()
        log.info(message, *args)

    def moved(self) -> None:
        """The mount's calls moved to another master (a failover, a switchover): an
        outage until a call is answered on the new one, quiet if none was on."""
        if not self.since:
            self.since = time.monotonic()
            log.debug("call port: the calls moved to another master")

    def answered(self, host: str, port: int) -> None:
        """A call was answered on ``host:port``: the outage (if any) is over."""
        since, self.since = self.since, 0.0
        log.info("namespace calls on the master's call port %s:%d again (after %.1f s)",
                 host, port, time.monotonic() - since)


class TrioCallPort:
    """``await call(prepared)`` from the trio loop, ``call_blocking(prepared)`` from
    other threads; ``run()`` (a task of the mount's nursery) keeps the connection to
    ``host:port`` up."""

    def __init__(self, host: str, port: int, token: str, timeout: float,
                 tls: ssl.SSLContext | None = None, server_name: str = "",
                 outage: Outage | None = None):
        self.host = host
        self.outage = outage or Outage()  # the mount's, shared by its ports over time
        self.port = port
        self.timeout = timeout
        self._tls_context = tls  # TLS on: the master verified as server_name (or host)
        self._server_name = server_name or host
        self._tls: _Tls | None = None  # the connection's, with TLS on
        self._token = token.encode()
        self._sock: socket.socket | None = None  # set while connected (non-blocking)
        self._out = bytearray()  # frames the socket did not take yet
        self._out_ready = trio.Event()
        # id -> (trio Task or Future, monotonic deadline, method)
        self._pending: dict[int, tuple] = {}
        self._ids = itertools.count(1)
        self._trio_token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self.connected = trio.Event()  # set at the first connection (tests wait on it)

    # -- calls --------------------------------------------------------------------
    async def call(self, prepared: Prepared):
        if self._sock is None:
            raise PortDown()
        cid = next(self._ids)
        # Sent before it is registered: nothing can answer it before this task sleeps,
        # and a send that fails takes the connection down without waking this task.
        self._send(cid, prepared)
        if self._sock is None:
            raise PortDown()
        # The deadline is kept with the call and enforced by _expire: a cancel scope
        # per call cost ~15 us of the loop's CPU (about a fifth of a call's).
        self._pending[cid] = (trio.lowlevel.current_task(),
                              time.monotonic() + self.timeout, prepared.method)

        def abort(_raise_cancel):
            if self._pending.pop(cid, None) is None:
                return trio.lowlevel.Abort.FAILED  # its result is on the way
            return trio.lowlevel.Abort.SUCCEEDED

        return reply_of(await trio.lowlevel.wait_task_rescheduled(abort))

    def call_blocking(self, prepared: Prepared, timeout: float | None = None):
        """The reply from another thread, within ``timeout`` (None: the port's)."""
        token = self._trio_token
        if self._sock is None or token is None:
            raise PortDown()
        cid = next(self._ids)
        waiter: concurrent.futures.Future = concurrent.futures.Future()
        try:
            token.run_sync_soon(self._submit, cid, waiter, prepared)
        except trio.RunFinishedError:
            raise PortDown() from None
        try:
            result = waiter.result(timeout=self.timeout if timeout is None else timeout)
        except concurrent.futures.TimeoutError:
            try:
                token.run_sync_soon(self._pending.pop, cid, None)
            except trio.RunFinishedError:
                pass
            raise self._timeout(prepared.method) from None
        return reply_of(result.unwrap())

    def _submit(self, cid: int, waiter: concurrent.futures.Future, prepared: Prepared) -> None:
        """In the loop: a thread's call."""
        if self._sock is None:
            waiter.set_result(outcome.Error(PortDown()))
            return
        self._pending[cid] = (waiter, time.monotonic() + self.timeout, prepared.method)
        self._send(cid, prepared)

    def _timeout(self, method: str) -> CurvineError:
        return CurvineError(ErrorKind.TIMEOUT, f"{method}: no answer within "
                                               f"{self.timeout:.0f}s (call port)")

    async def _expire(self) -> None:
        """Fail the calls past their deadline (checked every EXPIRY_CHECK seconds, so a
        call may wait that much longer than the timeout)."""
        while True:
            await trio.sleep(EXPIRY_CHECK)
            now = time.monotonic()
            late = [cid for cid, (_, deadline, _) in self._pending.items() if deadline <= now]
            for cid in late:
                waiter, _, method = self._pending.pop(cid)
                _wake(waiter, outcome.Error(self._timeout(method)))

    def _send(self, cid: int, prepared: Prepared) -> None:
        data = master_pb2.Call(id=cid, **{prepared.op: prepared.request}).SerializeToString()
        frame = FRAME.pack(len(data)) + data
        if self._tls is not None:
            try:
                frame = self._tls.wrap(frame)
            except ssl.SSLError as e:
                log.info("call port: TLS failed (%s); calls go on the stream", e)
                self._down()
                return
        self._write(frame)

    def _write(self, frame) -> None:
        """Bytes for the socket, in order (what it does not take now, the writer task
        sends)."""
        if self._out:  # earlier frames wait for room: keep the order
            self._queue(frame)
            return
        try:
            sent = self._sock.send(frame)
        except BlockingIOError:
            sent = 0
        except OSError as e:
            log.info("call port: send failed (%s); calls go on the stream", e)
            self._down()
            return
        if sent < len(frame):
            self._queue(memoryview(frame)[sent:])

    def _queue(self, data) -> None:
        self._out += data
        if len(self._out) > MESSAGE_LIMIT:
            log.warning("call port: the master takes no calls (%d bytes waiting); "
                        "reconnecting", len(self._out))
            self._down()
            return
        self._out_ready.set()

    # -- the connection -------------------------------------------------------------
    async def run(self) -> None:
        """Connect, serve, reconnect after a failure (with backoff), until cancelled."""
        self._trio_token = trio.lowlevel.current_trio_token()
        delay = 0.1
        lost = idle_cut = False
        with trio.CancelScope() as self._scope:
            while True:
                try:
                    sock, tls = await self._connect()
                except (OSError, PortRefused, trio.TooSlowError) as e:
                    if isinstance(e, PortRefused) and e.status == UNAUTHENTICATED:
                        log.error("call port %s:%d refused this mount's token; namespace "
                                  "calls stay on the Calls stream", self.host, self.port)
                        return
                    message = "call port %s:%d: %s (calls go on the stream until it is up)"
                    if isinstance(e, ssl.SSLError):
                        log.warning(message, self.host, self.port, e)
                    else:
                        self.outage.lost(message, self.host, self.port, e)
                    lost, idle_cut = True, False  # not an idle cut: the master is away
                    await trio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX)
                    continue
                # the first of the mount at INFO; after an outage, its first answer
                log.log(logging.DEBUG if self.outage.ever_up else logging.INFO,
                        "namespace calls on the master's call port %s:%d%s", self.host,
                        self.port, " (connected again)" if lost else "")
                self.outage.ever_up = True
                lost = idle_cut = False
                delay = 0.1
                self._sock, self._tls = sock, tls
                self.connected.set()
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._flush, sock)
                        nursery.start_soon(self._expire)
                        try:
                            await self._read(sock)
                        except (OSError, trio.ClosedResourceError) as e:
                            # the master closes a connection idle past its limit
                            # (master.stream_idle_timeout): expected, not worth a line
                            idle_cut = not self._pending
                            if idle_cut:
                                log.debug("call port: connection closed idle (%s)", e)
                            else:
                                self.outage.lost("call port %s:%d: connection lost (%s)",
                                                 self.host, self.port, e)
                        nursery.cancel_scope.cancel()
                finally:
                    self._down()
                lost = True

    def stop(self) -> None:
        """From the loop: end ``run`` (pending calls fail over to the stream)."""
        if self._scope is not None:
            self._scope.cancel()
        self._down()

    async def _connect(self) -> tuple[socket.socket, "_Tls | None"]:
        with trio.fail_after(self.timeout):
            infos = await trio.socket.getaddrinfo(self.host, self.port,
                                                  type=socket.SOCK_STREAM)
            family, type_, proto, _, addr = infos[0]
            sock = socket.socket(family, type_, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    sock.connect(addr)
                except BlockingIOError:
                    pass
                await trio.lowlevel.wait_writable(sock)
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, f"connect: {errno.errorcode.get(err, err)}")
                if self._tls_context is None:
                    await _send_all(sock, hello(self._token))
                    check_answer(await _recv_exactly(sock, ANSWER.size))
                    return sock, None
                tls = _Tls(self._tls_context, self._server_name)
                await tls.handshake(sock)
                await _send_all(sock, tls.wrap(hello(self._token)))
                check_answer(await tls.recv_exactly(sock, ANSWER.size))
                return sock, tls
            except BaseException:
                sock.close()
                raise

    async def _flush(self, sock: socket.socket) -> None:
        """Write what the socket did not take at once."""
        try:
            while True:
                await self._out_ready.wait()
                self._out_ready = trio.Event()
                while self._out and self._sock is sock:
                    try:
                        sent = sock.send(self._out)
                    except BlockingIOError:
                        await trio.lowlevel.wait_writable(sock)
                        continue
                    del self._out[:sent]
        except (OSError, trio.ClosedResourceError) as e:
            log.info("call port: send failed (%s)", e)
            self._down()  # wakes the reader too

    async def _read(self, sock: socket.socket) -> None:
        tls = self._tls
        buf = bytearray()
        if tls is not None:
            buf += tls.take()  # what came with the hello's answer
        while True:
            data = await _recv_some(sock, RECV_SIZE)
            if tls is not None:
                tls.unwrap(data)
                if tls.outgoing.pending:  # TLS's own messages (a key update's answer)
                    self._write(tls.outgoing.read())
                data = tls.take()
            buf += data
            pos = 0
            while len(buf) - pos >= FRAME.size:
                (n,) = FRAME.unpack_from(buf, pos)
                if n > MESSAGE_LIMIT:
                    raise OSError(errno.EPROTO, f"a {n}-byte frame")
                if len(buf) - pos - FRAME.size < n:
                    break
                start = pos + FRAME.size
                result = master_pb2.CallResult.FromString(bytes(buf[start:start + n]))
                pos = start + n
                if self.outage.since and not result.error_kind:
                    self.outage.answered(self.host, self.port)
                self._resolve(result.id, outcome.Value(result))
            del buf[:pos]

    def _resolve(self, cid: int, value: outcome.Outcome) -> None:
        pending = self._pending.pop(cid, None)
        if pending is not None:  # else it timed out or was cancelled meanwhile
            _wake(pending[0], value)

    def _down(self) -> None:
        """The connection is gone: every pending call fails over."""
        sock, self._sock = self._sock, None
        self._tls = None
        if sock is not None:
            trio.lowlevel.notify_closing(sock)  # its waiting reader or writer wakes
            sock.close()
        self._out.clear()
        pending, self._pending = self._pending, {}
        for waiter, _, _ in pending.values():
            _wake(waiter, outcome.Error(PortDown()))


class _Tls:
    """TLS over memory buffers for a non-blocking socket: ``wrap`` turns plaintext into
    the bytes to send at once; ``unwrap`` takes received bytes, ``take`` the plaintext
    they held."""

    def __init__(self, context: ssl.SSLContext, server_name: str):
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_hostname=server_name)
        self.plain = bytearray()

    async def handshake(self, sock: socket.socket) -> None:
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                if self.outgoing.pending:
                    await _send_all(sock, self.outgoing.read())
                self.incoming.write(await _recv_some(sock, RECV_SIZE))
        if self.outgoing.pending:
            await _send_all(sock, self.outgoing.read())

    def wrap(self, data: bytes) -> bytes:
        self.obj.write(data)
        return self.outgoing.read()

    def unwrap(self, data: bytes) -> None:
        self.incoming.write(data)
        while True:
            try:
                chunk = self.obj.read(RECV_SIZE)
            except ssl.SSLWantReadError:
                return
            except ssl.SSLZeroReturnError:
                raise OSError(errno.ECONNRESET, "closed by the master (TLS)") from None
            if not chunk:
                raise OSError(errno.ECONNRESET, "closed by the master (TLS)")
            self.plain += chunk

    def take(self) -> bytes:
        data, self.plain = bytes(self.plain), bytearray()
        return data

    async def recv_exactly(self, sock: socket.socket, n: int) -> bytes:
        while len(self.plain) < n:
            self.unwrap(await _recv_some(sock, RECV_SIZE))
        data = bytes(self.plain[:n])
        del self.plain[:n]
        return data


def _wake(waiter, value: outcome.Outcome) -> None:
    """Hand a call's outcome to its trio task or its thread's Future (in the loop)."""
    if isinstance(waiter, concurrent.futures.Future):
        waiter.set_result(value)
    else:
        trio.lowlevel.reschedule(waiter, value)


async def _send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)


async def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        buf += await _recv_some(sock, n - len(buf))
    return bytes(buf)


async def _recv_some(sock: socket.socket, n: int) -> bytes:
    """Up to ``n`` bytes, at least one (waiting in the loop); OSError once closed."""
    while True:
        try:
            data = sock.recv(n)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
            continue
        if not data:
            raise OSError(errno.ECONNRESET, "closed by the master")
        return data
