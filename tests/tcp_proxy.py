"""A TCP proxy for one connection that can stall the client's side: a helper of the
tests of the request limits (tests/test_port_limits.py, tests/test_request_limits.py),
not a test module.

``TcpProxy(address, limit)`` listens on a free loopback port (``address`` is where the
client connects: ``proxy.address``), takes ONE connection and opens one to the server:
it passes the first ``limit`` bytes the client sends, then swallows the rest (a sender
that stalls mid-message, from the server's side), and passes everything the server
sends.  When the server closes its side, ``closed`` is set (``closed_at``: monotonic
time) and the client's side is shut down.  ``close()`` ends the listener and both
sockets; the copy threads end with them.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

CHUNK = 65536


class TcpProxy:
    def __init__(self, address: str, limit: int = 1 << 62):
        host, port = address.rsplit(":", 1)
        self.upstream_address = (host, int(port))
        self.limit = limit
        self.passed = 0  # client bytes passed to the server
        self.closed = threading.Event()
        self.closed_at = 0.0
        self._sockets: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed before a client came
            client, _ = self.listener.accept()
            self._sockets.append(client)
            upstream = socket.create_connection(self.upstream_address)
            self._sockets.append(upstream)
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._down, args=(client, upstream), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(CHUNK):
                if self.passed < self.limit:
                    upstream.sendall(data)
                    self.passed += len(data)

    def _down(self, client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(CHUNK):
                client.sendall(data)
        self.closed_at = time.monotonic()
        self.closed.set()
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()
