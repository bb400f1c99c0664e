"""A blocking client of the master's call port (master/ports/call_port_server.py has
the protocol), for processes that call the master from threads: the LMCache
connector's lookups and stores, ``curvine`` commands.  The mount has its own client
in its trio loop (fuse_client/call_port_trio.py).

Why: a unary call through Python gRPC costs the master ~0.6 ms of CPU (thread
hand-offs in the sync server), against ~0.15 ms on the call port (issue 16).

Each connection carries one call at a time (send the frame, read the reply); a call
takes an idle connection from a small pool or opens one, so threads call in parallel
up to ``max_connections`` (a caller past that uses gRPC).  Like the mount's client
this is an optimisation: while the port is down, refused or busy, or when a
connection breaks under a call, :class:`PortDown` tells the caller to send the same
request as a unary RPC (a mutation keeps its request id, so one the master did apply
is answered from its retry cache).  A call the master does not answer within its
timeout raises TIMEOUT, as a gRPC deadline would.
"""

from __future__ import annotations

import itertools
import logging
import socket
import ssl
import threading
import time

from curvine.common.call_wire import (ANSWER, FRAME, UNAUTHENTICATED, PortDown, PortRefused,
                                      check_answer, hello, reply_of)
from curvine.common import tls
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.rpc import MESSAGE_LIMIT, RETRY_MAX
from curvine.proto import master_pb2

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 4  # connections of one client, unless it calls from more threads


class BlockingCallPort:
    """``call(op, request)`` (op: a field of master.Call) from any thread."""

    def __init__(self, host: str, port: int, token: str, timeout: float,
                 max_connections: int = MAX_CONNECTIONS, tls: "ssl.SSLContext | None" = None,
                 server_name: str = ""):
        self.host = host
        self._tls = tls  # with TLS on: the master is verified as server_name (or host)
        self._server_name = server_name or host
        self.port = port
        self.timeout = timeout
        self.max_connections = max_connections
        self._token = token.encode()
        self._lock = threading.Lock()
        self._idle: list[socket.socket] = []
        self._open = 0  # connections open (idle or carrying a call)
        self._ids = itertools.count(1)
        self._down_until = 0.0  # no connection attempt before this (monotonic)
        self._delay = 0.1
        self._refused = False  # wrong token: never again
        self._closed = False
        self.calls = 0  # calls answered on the port

    def call(self, op: str, request, timeout: float | None = None):
        """The reply of ``request`` (the master's error raised as CurvineError);
        PortDown when the port cannot carry it."""
        sock = self._take(timeout)
        healthy = False
        try:
            cid = next(self._ids)
            data = master_pb2.Call(id=cid, **{op: request}).SerializeToString()
            sock.settimeout(timeout or self.timeout)
            sock.sendall(FRAME.pack(len(data)) + data)
            (n,) = FRAME.unpack(_recv_exactly(sock, FRAME.size))
            if n > MESSAGE_LIMIT:
                raise OSError(f"a {n}-byte frame")
            result = master_pb2.CallResult.FromString(_recv_exactly(sock, n))
            if result.id != cid:
                raise OSError(f"answer to call {result.id}, expected {cid}")
            healthy = True
        except socket.timeout:
            raise CurvineError(ErrorKind.TIMEOUT, f"{op}: no answer within "
                                                  f"{timeout or self.timeout:.0f}s (call port)"
                               ) from None
        except OSError as e:  # ssl.SSLError included
            # a pooled connection the master closed (restart, idle cut-off) fails here
            # first: the caller sends the call another way; the next call reconnects
            log.debug("call port %s:%d: %s", self.host, self.port, e)
            raise PortDown() from None
        finally:
            self._give(sock, healthy)
        self.calls += 1
        return reply_of(result)

    def call_blocking(self, prepared, timeout: float | None = None):
        """A Prepared call (client/master/requests.py) as a carrier of the route
        (client/master/route.py)."""
        return self.call(prepared.op, prepared.request, timeout)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    # -- the pool -----------------------------------------------------------------
    def _take(self, timeout: float | None = None) -> socket.socket:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            if (self._closed or self._refused or self._open >= self.max_connections
                    or time.monotonic() < self._down_until):
                raise PortDown()
            self._open += 1
        try:
            sock = self._connect(timeout or self.timeout)
        except (OSError, PortRefused) as e:
            with self._lock:
                self._open -= 1
                self._down_until = time.monotonic() + self._delay
                self._delay = min(self._delay * 2, RETRY_MAX)
                if isinstance(e, PortRefused) and e.status == UNAUTHENTICATED:
                    self._refused = True
            if isinstance(e, PortRefused) and e.status == UNAUTHENTICATED:
                log.error("call port %s:%d refused this client's token; calls go as "
                          "unary RPCs", self.host, self.port)
            elif isinstance(e, ssl.SSLError):  # a configuration problem, not an outage
                log.warning("call port %s:%d: TLS failed: %s (unary RPCs meanwhile)",
                            self.host, self.port, e)
            else:
                log.debug("call port %s:%d: %s (unary RPCs meanwhile)", self.host,
                          self.port, e)
            raise PortDown() from None
        with self._lock:
            self._delay = 0.1
        return sock

    def _give(self, sock: socket.socket, healthy: bool) -> None:
        with self._lock:
            if healthy and not self._closed:
                self._idle.append(sock)
                return
            self._open -= 1
        sock.close()

    def _connect(self, timeout: float) -> socket.socket:
        """A connection whose hello was accepted within ``timeout`` (the caller's: a
        master that is stopped accepts the connection in its kernel, never the hello)."""
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self._server_name)
            sock.sendall(hello(self._token))
            check_answer(_recv_exactly(sock, ANSWER.size))
            return sock
        except BaseException:
            sock.close()
            raise


def for_security(host: str, port: int, security, timeout: float,
                 max_connections: int = MAX_CONNECTIONS) -> BlockingCallPort:
    """A BlockingCallPort with ``security``'s token, and its TLS when TLS is on."""
    context, name = tls.client_side(security.material, host)
    return BlockingCallPort(host, port, security.token, timeout, max_connections,
                            tls=context, server_name=name)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionResetError("closed by the master")
        got += k
    return bytes(buf)
