"""Prometheus machinery and the HTTP endpoint (``/metrics``, ``/healthz``) of each daemon.

Here: a daemon's registry (``registry``: its groups, the limits every port counts,
``process_*``), scrape-time collectors (``Collector``), the label children of an RPC
method (``MethodMetrics``), the endpoint (``serve``, ``MetricsServer``), and the only
metrics that are no one process's: those the server plumbing of this package updates
in every server (RPCs: rpc.py, auth.py, stream_guard.py; limits: every port, this
endpoint too).

Each process's own metrics are defined in its package, at module level and
unregistered, so that its instrumented code updates them without plumbing, beside the
one function that assembles its registry: master/ports/metrics.py (with the journal's,
journal/metrics.py), worker/metrics.py, fuse_client/metrics.py (with the client
library's, client/files/metrics.py).  docs/metrics.md lists them all.

Hot paths touch only label children resolved once (at import or decoration time):
one update is one lock inside prometheus_client, never a lookup by label strings.

``/healthz`` answers 200 ``ok`` when the daemon's health function returns None, and
503 with the one-line reason it returns otherwise.
"""
from __future__ import annotations

import contextlib
import errno
import http.server
import io
import logging
import selectors
import socket
import threading
import time
from typing import Callable, Iterable

from prometheus_client import (CollectorRegistry, Counter, Histogram, ProcessCollector,
                               disable_created_metrics)
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

# No ``*_created`` series: a daemon's counters start with the process, which
# process_start_time_seconds says once.
disable_created_metrics()

# Latencies of a unary call on loopback start at ~0.5 ms (docs/measurements.md); a mutation
# waits for a journal fsync; a block stream may take seconds.
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
               2.5, 5.0, 10.0, 30.0)

# -- RPC servers (master, worker): common/rpc.py's handler decorators -----------------
RPC_HANDLED = Counter(
    "curvine_rpc_server_handled_total",
    "RPCs completed by this server, by method and gRPC status code (OK or the error); "
    "namespace calls on a mount's Calls stream count under their unary method",
    ["method", "code"], registry=None)
RPC_DURATION = Histogram(
    "curvine_rpc_server_duration_seconds",
    "Time from a call's arrival at its handler to its reply (streams: to their end)",
    ["method"], buckets=RPC_BUCKETS, registry=None)
RPC_UNAUTHENTICATED = Counter(
    "curvine_rpc_unauthenticated_total",
    "Calls refused because the cluster token was missing or wrong (common/auth.py), "
    "by method (\"unknown\" for a method this server does not have)",
    ["method"], registry=None)
STREAMS_CANCELLED_IDLE = Counter(
    "curvine_streams_cancelled_idle",
    "Streams the server cancelled after no progress for its idle timeout (a client that "
    "stopped sending or reading: common/stream_guard.py), by method",
    ["method"], registry=None)
STREAMS_REFUSED_BUSY = Counter(
    "curvine_streams_refused_busy_total",
    "Block streams refused because the worker had its limit of streams open (the RPC "
    "threads that unary calls need are never all held by streams)", ["method"],
    registry=None)
RPC_METRICS = (RPC_HANDLED, RPC_DURATION, RPC_UNAUTHENTICATED, STREAMS_CANCELLED_IDLE,
               STREAMS_REFUSED_BUSY)

# -- limits (docs/security.md, "Limits"): what each port and request may cost ---------
# Registered in every daemon's registry (``registry``), so one name covers every port.
CONNECTIONS_CUT = Counter(
    "curvine_connections_cut_total",
    "Connections a server refused or closed for passing one of its limits, by port "
    "(call_port, data_port, http) and reason (idle: no request for the idle timeout; "
    "partial_frame / slow_request: a request not complete within its deadline; "
    "per_peer: the peer had its share of connections open; busy: the port had all it "
    "takes; evicted: the oldest waiting one closed for a new one; frame_too_large; "
    "garbage: a frame that does not parse; not_a_client: a bad hello)",
    ["port", "reason"], registry=None)
REQUESTS_LIMITED = Counter(
    "curvine_requests_limited_total",
    "Requests refused or answered in part because they passed a limit, by method and "
    "limit (e.g. LookupMany names, reply_bytes, reply_blocks, file_blocks: the reply "
    "was cut short there and the caller asks again for the rest)",
    ["method", "limit"], registry=None)
LIMIT_METRICS = (CONNECTIONS_CUT, REQUESTS_LIMITED)


class MethodMetrics:
    """The label children of one RPC method, resolved once (by the handler decorator)."""

    __slots__ = ("method", "duration", "ok", "_errors")

    def __init__(self, method: str):
        self.method = method
        self.duration = RPC_DURATION.labels(method=method)
        self.ok = RPC_HANDLED.labels(method=method, code="OK")
        self._errors: dict[str, object] = {}

    def error(self, code: str) -> None:
        child = self._errors.get(code)
        if child is None:  # a benign race: two threads resolve the same child
            child = self._errors[code] = RPC_HANDLED.labels(method=self.method, code=code)
        child.inc()

    def finished(self, started: float, code: str = "OK") -> None:
        """One call, begun at ``started`` (time.perf_counter), ended with status ``code``."""
        self.duration.observe(time.perf_counter() - started)
        if code == "OK":
            self.ok.inc()
        else:
            self.error(code)


def registry(groups: Iterable[Iterable] = (), collectors: Iterable = ()) -> CollectorRegistry:
    """A daemon's registry: the metric groups it updates, its scrape-time collectors,
    the limits every port counts (LIMIT_METRICS), and the standard ``process_*``
    metrics (CPU, memory, open files, start time)."""
    reg = CollectorRegistry()
    ProcessCollector(registry=reg)
    for group in (LIMIT_METRICS, *groups):
        for metric in group:
            reg.register(metric)
    for c in collectors:
        reg.register(c)
    return reg


class Collector:
    """A scrape-time collector from a function yielding metric families; a failure
    is logged (once per distinct message) and leaves those families out."""

    def __init__(self, name: str, fn: Callable[[], Iterable]):
        self.name = name
        self.fn = fn
        self._last_error = ""

    def collect(self):
        try:
            families = list(self.fn())
        except Exception as e:  # noqa: BLE001 - a scrape must not fail for one group
            if str(e) != self._last_error:
                self._last_error = str(e)
                log.warning("metrics: collecting %s failed: %s", self.name, e)
            return []
        self._last_error = ""
        return families


Health = Callable[[], "str | None"]  # None when healthy, else a one-line reason


# -- the HTTP endpoint's limits --------------------------------------------------------
# A connection must deliver its whole request head within HTTP_REQUEST_TIMEOUT of being
# accepted (idle or slow alike: then it is closed), and its reply gets as long again to
# be sent; every reply ends the connection (no keep-alive).  Until its head is complete
# (the blank line, at most HTTP_MAX_REQUEST_HEAD bytes) a connection is only a file
# descriptor watched by the accept thread: no thread per idle or trickling client.  At
# most HTTP_MAX_HANDLERS complete requests are served at once (one thread each), and at
# most HTTP_MAX_CONNECTIONS connections are open in all; one more closes the oldest
# connection still sending its head (or, if none is, the new one, at once), so that a
# flood of idle connections cannot keep a prompt client such as a /healthz probe out.
# One peer address may hold at most HTTP_MAX_PER_PEER of those connections: one more
# closes that address's oldest (a prompt client behind the same address still gets
# in).  Every connection closed for a limit is counted in
# curvine_connections_cut_total{port="http"}.
HTTP_REQUEST_TIMEOUT = 10.0
HTTP_MAX_HANDLERS = 32
HTTP_MAX_CONNECTIONS = 256
HTTP_MAX_PER_PEER = 64
HTTP_MAX_REQUEST_HEAD = 16 << 10
HTTP_LISTEN_BACKLOG = 128
HTTP_ACCEPT_BATCH = 64  # connections accepted per turn of the accept loop


class MetricsServer:
    """``/metrics`` and ``/healthz`` over HTTP: one accept thread reads every open
    connection's request head; a complete request gets a handler thread."""

    def __init__(self, host: str, port: int, reg: CollectorRegistry, health: Health,
                 role: str = "daemon"):
        self.registry = reg
        self.health = health
        self.role = role
        self._server = _LimitedHTTPServer((host.strip("[]"), port), _make_handler(self),
                                          socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve, name=f"{role}-http",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.stop()
        if self._thread.is_alive():
            self._thread.join(5)
        self._server.server_close()

    def check(self) -> str | None:
        try:
            reason = self.health()
        except Exception as e:  # noqa: BLE001 - an unhealthy answer, not a crash
            log.debug("health check of %s failed", self.role, exc_info=True)
            reason = f"health check failed: {e}"
        return None if reason is None else " ".join(str(reason).split())


class _LimitedHTTPServer(http.server.HTTPServer):
    """An HTTPServer with its own accept loop (:meth:`serve`) enforcing the limits
    above; handler threads are daemon threads (a hung scrape never holds up exit)."""

    request_queue_size = HTTP_LISTEN_BACKLOG

    def __init__(self, address, handler, family):
        self.address_family = family
        self._lock = threading.Lock()
        self._stopping = False
        self._busy = 0  # requests being handled (threads)
        self._warned_at = -60.0
        # connections not yet handed to a thread, oldest first:
        # sock -> [addr, deadline, bytes of the request head so far]
        self._waiting: dict[socket.socket, list] = {}
        self._ready: dict[socket.socket, None] = {}  # of those, the complete heads
        self._peers: dict[str, int] = {}  # peer host -> its connections in _waiting
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        super().__init__(address, handler)  # binds (a failure calls server_close)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full wake pipe already wakes it
            self._wake_w.send(b"x")

    def stop(self) -> None:
        self._stopping = True
        self._wake()

    def server_close(self) -> None:
        super().server_close()
        for s in list(self._waiting):
            self._drop(s)
        self._wake_r.close()
        self._wake_w.close()

    def serve(self) -> None:
        self.socket.setblocking(False)
        with selectors.DefaultSelector() as sel:
            sel.register(self.socket, selectors.EVENT_READ, "listen")
            sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            pause_accept_until = 0.0
            while not self._stopping:
                try:
                    now = time.monotonic()
                    if pause_accept_until and now >= pause_accept_until:
                        sel.register(self.socket, selectors.EVENT_READ, "listen")
                        pause_accept_until = 0.0
                    first = next(iter(self._waiting.values()), None)
                    timeout = 1.0 if first is None else min(max(first[1] - now, 0.0), 1.0)
                    for key, _ in sel.select(timeout):
                        if key.data == "listen":
                            if not self._accept(sel):
                                # out of file descriptors: stop accepting for a moment
                                sel.unregister(self.socket)
                                pause_accept_until = time.monotonic() + 0.1
                        elif key.data == "wake":
                            with contextlib.suppress(OSError):
                                self._wake_r.recv(4096)
                        else:  # a waiting connection sent something (or closed)
                            self._receive(sel, key.fileobj)
                    self._expire(sel, time.monotonic())
                    self._dispatch()
                except Exception:  # noqa: BLE001 - the endpoint must outlive any one bug
                    log.exception("%s http: accept loop", threading.current_thread().name)
                    time.sleep(0.1)

    def _accept(self, sel) -> bool:
        """Accept what is pending; False when out of file descriptors."""
        for _ in range(HTTP_ACCEPT_BATCH):
            try:
                conn, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    now = time.monotonic()
                    if now - self._warned_at >= 60.0:  # at most once a minute
                        self._warned_at = now
                        log.warning("http: cannot accept connections: %s", e.strerror)
                    return False
                continue  # e.g. ECONNABORTED: that client is gone
            host = _host(addr)
            if self._peers.get(host, 0) >= HTTP_MAX_PER_PEER:
                oldest = next(s for s, entry in self._waiting.items()
                              if _host(entry[0]) == host)
                log.debug("http: %s has %d connections open, closing its oldest", host,
                          HTTP_MAX_PER_PEER)
                _HTTP_CUT_PER_PEER.inc()
                if oldest not in self._ready:
                    sel.unregister(oldest)
                self._drop(oldest)
            if len(self._waiting) + self._busy >= HTTP_MAX_CONNECTIONS:
                idle = next((s for s in self._waiting if s not in self._ready), None)
                if idle is None:
                    log.debug("http: %d connections open, closing a new one from %s",
                              HTTP_MAX_CONNECTIONS, addr)
                    _HTTP_CUT_BUSY.inc()
                    self._close(conn)
                    continue
                sel.unregister(idle)
                log.debug("http: %d connections open, closing the oldest idle one (%s)",
                          HTTP_MAX_CONNECTIONS, self._waiting[idle][0])
                _HTTP_CUT_EVICTED.inc()
                self._drop(idle)
            conn.setblocking(False)
            self._waiting[conn] = [addr, time.monotonic() + HTTP_REQUEST_TIMEOUT, b""]
            self._peers[host] = self._peers.get(host, 0) + 1
            sel.register(conn, selectors.EVENT_READ, "conn")
        return True

    def _receive(self, sel, s: socket.socket) -> None:
        entry = self._waiting[s]
        try:
            data = s.recv(HTTP_MAX_REQUEST_HEAD + 1 - len(entry[2]))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away (or reset)
            sel.unregister(s)
            self._drop(s)
            return
        entry[2] += data
        if b"\r\n\r\n" in entry[2] or b"\n\n" in entry[2]:
            sel.unregister(s)
            self._ready[s] = None
        elif len(entry[2]) > HTTP_MAX_REQUEST_HEAD:
            log.debug("http: %s sent a request head over %d bytes, closed", entry[0],
                      HTTP_MAX_REQUEST_HEAD)
            _HTTP_CUT_TOO_LARGE.inc()
            sel.unregister(s)
            self._drop(s)

    def _expire(self, sel, now: float) -> None:
        for s, (addr, deadline, _) in list(self._waiting.items()):
            if deadline > now:
                break  # oldest first: the rest are younger
            if s not in self._ready:
                sel.unregister(s)
            log.debug("http: %s sent no request within %gs, closed", addr,
                      HTTP_REQUEST_TIMEOUT)
            _HTTP_CUT_SLOW.inc()
            self._drop(s)

    def _dispatch(self) -> None:
        while self._ready:
            with self._lock:
                if self._busy >= HTTP_MAX_HANDLERS:
                    return
                self._busy += 1
            s = next(iter(self._ready))
            del self._ready[s]
            addr, deadline, head = self._waiting.pop(s)
            self._forget_peer(addr)
            try:
                s.setblocking(True)
                threading.Thread(target=self._handle, args=(s, addr, deadline, head),
                                 name=f"{threading.current_thread().name}-req",
                                 daemon=True).start()
            except RuntimeError:  # cannot start a thread: refuse this one
                with self._lock:
                    self._busy -= 1
                self._close(s)

    def _handle(self, conn: socket.socket, addr, deadline: float, head: bytes) -> None:
        try:
            self.RequestHandlerClass(conn, addr, self, deadline, head)
        except Exception as e:  # noqa: BLE001 - one client's failure stays with it
            log.debug("http: request from %s failed: %s", addr, e)
        finally:
            self.shutdown_request(conn)
            with self._lock:
                self._busy -= 1
            self._wake()  # a waiting request may now get this thread's place

    def _drop(self, s: socket.socket) -> None:
        entry = self._waiting.pop(s, None)
        if entry is not None:
            self._forget_peer(entry[0])
        self._ready.pop(s, None)
        self._close(s)

    def _forget_peer(self, addr) -> None:
        host = _host(addr)
        n = self._peers.get(host, 0) - 1
        if n > 0:
            self._peers[host] = n
        else:
            self._peers.pop(host, None)

    @staticmethod
    def _close(s: socket.socket) -> None:
        with contextlib.suppress(OSError):
            s.close()


def _host(addr) -> str:
    """The peer host of an accepted connection's address (its share is counted per host)."""
    return str(addr[0]) if isinstance(addr, tuple) and addr else str(addr)


_HTTP_CUT_SLOW = CONNECTIONS_CUT.labels("http", "slow_request")
_HTTP_CUT_TOO_LARGE = CONNECTIONS_CUT.labels("http", "frame_too_large")
_HTTP_CUT_PER_PEER = CONNECTIONS_CUT.labels("http", "per_peer")
_HTTP_CUT_BUSY = CONNECTIONS_CUT.labels("http", "busy")
_HTTP_CUT_EVICTED = CONNECTIONS_CUT.labels("http", "evicted")


class _DeadlineReader(io.RawIOBase):
    """``head`` (already received), then the socket's bytes until ``deadline``
    (time.monotonic); after it, TimeoutError."""

    def __init__(self, sock: socket.socket, deadline: float, head: bytes):
        super().__init__()
        self._sock = sock
        self._deadline = deadline
        self._head = memoryview(head)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self._head:
            n = min(len(b), len(self._head))
            b[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"request not received within {HTTP_REQUEST_TIMEOUT:g}s")
        self._sock.settimeout(left)
        return self._sock.recv_into(b)


def _make_handler(ms: MetricsServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "curvine"
        protocol_version = "HTTP/1.1"

        def __init__(self, request, client_address, server, deadline: float, head: bytes):
            self.deadline = deadline
            self.head = head
            super().__init__(request, client_address, server)

        def setup(self):
            super().setup()
            self.rfile.close()
            self.rfile = io.BufferedReader(
                _DeadlineReader(self.connection, self.deadline, self.head))

        def do_GET(self):  # noqa: N802 - the name http.server calls
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept"))
                self._reply(200, encoder(ms.registry), content_type)
            elif path == "/healthz":
                reason = ms.check()
                if reason is None:
                    self._reply(200, b"ok\n")
                else:
                    self._reply(503, reason.encode() + b"\n")
            else:
                self._reply(404, b"not found: try /metrics or /healthz\n")

        def _reply(self, status: int, body: bytes,
                   content_type: str = "text/plain; charset=utf-8") -> None:
            self.connection.settimeout(HTTP_REQUEST_TIMEOUT)  # to send the reply
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")  # one request per connection
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):  # noqa: A002 - http.server's signature
            log.debug("http %s: " + format, self.address_string(), *args)

    return Handler


def serve(role: str, host: str, port: int, key: str, reg: CollectorRegistry,
          health: Health) -> MetricsServer | None:
    """Start the endpoint on ``host:port``; None when ``port`` is 0 (off) or cannot be
    bound.  A port that cannot be bound is logged as an ERROR naming the config key
    ``key`` and the daemon goes on without metrics: the data path matters more."""
    if not port:
        log.info("metrics and health endpoint off (%s = 0)", key)
        return None
    try:
        server = MetricsServer(host, port, reg, health, role)
    except OSError as e:
        log.error("cannot serve /metrics and /healthz on %s:%d (%s): %s; running without "
                  "them", host, port, key, e.strerror or e)
        return None
    server.start()
    log.info("metrics on http://%s:%d/metrics, health on /healthz", host, server.port)
    return server
