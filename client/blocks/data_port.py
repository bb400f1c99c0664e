"""Client of the workers' bulk read port (worker/data_port.py; frames: common/data_wire.py):
a block range straight into the caller's buffers with ``recv_into``, no copy in Python.

Connections are kept per worker address (a few idle ones each) and reused; one that
fails in any way is closed, never reused.  Every socket call has a deadline.
Thread-safe.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Sequence

from curvine.common import data_wire
from curvine.common.errors import CurvineError, ErrorKind

IDLE_PER_WORKER = 8
SOCKET_BUFFER = 4 << 20


def _recv_into_views(sock: socket.socket, views: Sequence[memoryview], n: int,
                     deadline: float) -> None:
    for v in views:
        got = 0
        while got < len(v):
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            k = sock.recv_into(v[got:])
            if k == 0:
                raise ConnectionError("the worker closed the connection")
            got += k
            n -= k


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray(n)
    _recv_into_views(sock, [memoryview(buf)], n, deadline)
    return bytes(buf)


class DataPorts:
    """Reads of blocks from their workers' data ports."""

    def __init__(self, timeout: float = 30.0):
        self.timeout = timeout
        self._idle: dict[str, list[socket.socket]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _connect(self, address: str, timeout: float) -> socket.socket:
        with self._lock:
            idle = self._idle.get(address)
            if idle:
                return idle.pop()
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
        return sock

    def _release(self, address: str, sock: socket.socket) -> None:
        with self._lock:
            idle = self._idle.setdefault(address, [])
            if not self._closed and len(idle) < IDLE_PER_WORKER:
                idle.append(sock)
                return
        sock.close()

    def read_into(self, address: str, block_id: int, token: bytes, offset: int,
                  views: Sequence[memoryview], timeout: float | None = None) -> int:
        """Bytes [offset, offset + sum(len(views))) of the block into ``views`` within
        ``timeout`` (None: this client's); the bytes read (fewer only if the block is
        shorter).  CurvineError on failure."""
        want = sum(len(v) for v in views)
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            sock = self._connect(address, timeout)
        except OSError as e:
            raise CurvineError(ErrorKind.UNAVAILABLE, f"data port {address}: {e}") from None
        try:
            sock.settimeout(timeout)
            sock.sendall(data_wire.request(block_id, offset, want, token))
            status, n = data_wire.REPLY.unpack(_recv_exact(sock, data_wire.REPLY.size, deadline))
            if status:
                (mlen,) = data_wire.MESSAGE_LEN.unpack(
                    _recv_exact(sock, data_wire.MESSAGE_LEN.size, deadline))
                msg = _recv_exact(sock, mlen, deadline).decode(errors="replace")
                self._release(address, sock)
                sock = None
                try:
                    kind = ErrorKind(status)
                except ValueError:
                    kind = ErrorKind.IO
                raise CurvineError(kind, f"data port {address}: {msg}")
            if n > want:
                raise CurvineError(ErrorKind.IO, f"data port {address}: sends {n} bytes, "
                                                 f"{want} were asked for")
            left, targets = n, []
            for v in views:
                if left <= 0:
                    break
                targets.append(v[:left])
                left -= len(targets[-1])
            _recv_into_views(sock, targets, n, deadline)
            self._release(address, sock)
            sock = None
            return n
        except (OSError, ConnectionError, struct.error) as e:
            raise CurvineError(ErrorKind.UNAVAILABLE, f"data port {address}: {e}") from None
        finally:
            if sock is not None:
                sock.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for socks in idle.values():
            for s in socks:
                s.close()
