"""The worker's bulk read port: a block range over plain TCP, sent with sendfile(2).

gRPC streaming costs several copies of every byte on each side and about 0.6-0.9 GB/s
per stream on loopback (docs/measurements.md).  A reader on another node (the cross-pod hit the
L2 exists for) needs more, so a worker also serves block reads on this port: the
kernel copies the block from the page cache to the socket (no copy in Python here) and
the client receives straight into its buffer (client/blocks/data_port.py, ``recv_into``).

Wire: common/data_wire.py.  Authorization is the block's read token,
checked exactly as the gRPC service checks it (``WorkerServicer._authorize``).

Used only when the cluster runs without TLS (the port would bypass it; with TLS the
client reads over gRPC).  Bounded like the domain socket (docs/security.md, "Limits";
each cut counted in curvine_connections_cut_total{port="data_port"}):
``max_connections`` (one thread each; one more is refused BUSY and closed), at most
``per_peer`` of them from one address (BUSY too), a connection that starts no request
within ``idle_timeout`` is dropped, and one whose request (header and token, at most
a few hundred bytes) is not whole within REQUEST_TIMEOUT of its first byte too: a
peer that trickles bytes holds a slot no longer than a silent one.  A malformed
request ends its connection.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from curvine.common import block_tokens
from curvine.common.blocks import check_block_id
from curvine.common.data_wire import MAGIC, MAX_TOKEN, REQUEST, data_reply, error_reply
from curvine.common.errors import CurvineError, ErrorKind, invalid
from curvine.common.metrics import CONNECTIONS_CUT

from .metrics import WORKER_READ_REMOTE
from .service import WorkerServicer

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
PER_PEER = 32  # connections of one peer address (a pod's connector reads with 16 threads)
IDLE_TIMEOUT = 60.0  # for the first byte of a request
REQUEST_TIMEOUT = 10.0  # for the rest of it, from its first byte
SEND_TIMEOUT = 30.0  # a reader that takes nothing for this long is dropped
SOCKET_BUFFER = 4 << 20
_CUT = {reason: CONNECTIONS_CUT.labels("data_port", reason)
        for reason in ("idle", "slow_request", "per_peer", "busy")}


class _SlowRequest(Exception):
    """A request not whole within REQUEST_TIMEOUT of its first byte."""


def _recv_exact(conn: socket.socket, n: int, deadline: float,
                first: bytes = b"") -> bytes:
    """n bytes (``first`` of them already received) before the monotonic ``deadline``;
    _SlowRequest past it, ConnectionError if the peer closes."""
    buf = bytearray(first)
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _SlowRequest()
        conn.settimeout(left)
        try:
            data = conn.recv(n - len(buf))
        except TimeoutError:
            raise _SlowRequest() from None
        if not data:
            raise ConnectionError("the peer closed mid-request")
        buf += data
    return bytes(buf)


class DataPortServer:
    """Serves block reads of ``servicer.store`` on ``host:port`` (0 = any free port)."""

    def __init__(self, servicer: WorkerServicer, host: str, port: int,
                 max_connections: int = MAX_CONNECTIONS, idle_timeout: float = IDLE_TIMEOUT,
                 per_peer: int = PER_PEER, request_timeout: float = REQUEST_TIMEOUT):
        self.servicer = servicer
        self.store = servicer.store
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.per_peer = per_peer
        self.request_timeout = request_timeout
        self._peers: dict[str, int] = {}  # peer host -> connections open
        self._listener = socket.create_server((host, port), backlog=128)
        self._listener.settimeout(0.5)
        self.port = self._listener.getsockname()[1]
        self.host = host
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._thread = threading.Thread(target=self._accept_loop, name="data-port",
                                        daemon=True)
        self.served_bytes = 0

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self._closing.set()
        self._thread.join(timeout)
        self._listener.close()
        with self._lock:
            conns = list(self._conns.items())
        for conn, _ in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for _, thread in conns:
            thread.join(timeout)

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                conn, addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as e:
                if self._closing.is_set():
                    break
                log.warning("data port: accept failed: %s", e)
                self._closing.wait(0.1)
                continue
            host = str(addr[0]) if isinstance(addr, tuple) and addr else "?"
            with self._lock:
                full = len(self._conns) >= self.max_connections
                mine = self._peers.get(host, 0)
                if not full and mine < self.per_peer:
                    self._peers[host] = mine + 1
                    thread = threading.Thread(target=self._serve, args=(conn, host),
                                              daemon=True, name="data-port-conn")
                    self._conns[conn] = thread
            if full or mine >= self.per_peer:
                _CUT["busy" if full else "per_peer"].inc()
                why = (f"{self.max_connections} connections open" if full else
                       f"{self.per_peer} connections of {host} open")
                try:
                    conn.setblocking(False)
                    conn.send(error_reply(CurvineError(
                        ErrorKind.BUSY, f"worker data port: {why}; try again")))
                except OSError:
                    pass
                conn.close()
            else:
                thread.start()

    def _serve(self, conn: socket.socket, host: str) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            while not self._closing.is_set():
                # a request may take idle_timeout to start, then request_timeout in all
                conn.settimeout(self.idle_timeout)
                try:
                    first = conn.recv(REQUEST.size)
                except TimeoutError:
                    _CUT["idle"].inc()
                    break
                if not first:
                    break
                deadline = time.monotonic() + self.request_timeout
                head = _recv_exact(conn, REQUEST.size, deadline, first)
                magic, block_id, offset, length, token_len = REQUEST.unpack(head)
                if magic != MAGIC or token_len > MAX_TOKEN:
                    conn.sendall(error_reply(invalid("request", "not a curvine data port "
                                                                "request")))
                    break
                token = _recv_exact(conn, token_len, deadline) if token_len else b""
                conn.settimeout(SEND_TIMEOUT)
                self._send_block(conn, block_id, offset, length, token)
        except _SlowRequest:
            _CUT["slow_request"].inc()
            log.debug("data port: dropped %s: a request not whole within %gs", host,
                      self.request_timeout)
        except (OSError, ConnectionError):
            pass  # the peer went away, or went silent
        except Exception:  # noqa: BLE001 - a bug must not take the worker down
            log.exception("data port: connection failed")
        finally:
            with self._lock:
                self._conns.pop(conn, None)
                n = self._peers.get(host, 0) - 1
                if n > 0:
                    self._peers[host] = n
                else:
                    self._peers.pop(host, None)
            conn.close()

    def _send_block(self, conn: socket.socket, block_id: int, offset: int, length: int,
                    token: bytes) -> None:
        try:
            check_block_id(block_id)
            self.servicer._authorize(block_id, token, block_tokens.READ, "token")
            size, path = self.store.info(block_id)
            if offset > size:
                raise invalid("offset", f"{offset} is beyond the block's {size} bytes")
            n = min(length or size - offset, size - offset)
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except CurvineError as e:
            conn.sendall(error_reply(e))
            return
        except OSError as e:  # deleted between info and open: as if it were not here
            conn.sendall(error_reply(CurvineError(ErrorKind.NOT_FOUND,
                                                  f"block {block_id:016x}: {e.strerror}")))
            return
        sent = 0
        with os.fdopen(fd, "rb", buffering=0) as f:
            try:
                conn.sendall(data_reply(n))
                # socket.sendfile: sendfile(2), waiting for the socket within its timeout
                # (the socket is non-blocking underneath, so os.sendfile alone would
                # stop at EAGAIN)
                sent = conn.sendfile(f, offset, n)
                if sent < n:  # the file shrank under us: the client sees a short read
                    raise ConnectionError("block file ended early")
            finally:
                WORKER_READ_REMOTE.inc(sent)
                self.served_bytes += sent
