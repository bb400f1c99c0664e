"""Short-circuit I/O through the local workers' Unix domain sockets.

A client on a worker's host that may not open the worker's data dirs (an inference
pod with only ``client.domain_socket_dir`` mounted) gets block files as descriptors
from the worker itself: ``open_read`` returns a read-only descriptor of a finalised
block, ``write`` writes a block into a staging descriptor the worker hands out and has
the worker finalise it.  The worker checks the block token first (worker/domain_socket.py
has the protocol), so this needs the same tokens as the gRPC data path.

Sockets are found by listing ``socket_dir`` for ``*.sock`` and asking each which worker
it is (Hello: its uuid, matched with ``WorkerInfo.uuid``); an unknown uuid rescans at
most once per ``RESCAN_INTERVAL``.  Each socket has a small pool of connections (every
call takes one, so threads never share one); a broken one is dropped and the call is
tried once more on a new connection when that is safe.  Every socket call has a
deadline (``timeout``).  Failures are ``CurvineError``: the worker's own refusals
(NOT_FOUND, PERMISSION, NO_SPACE, UNAVAILABLE before it registered, BUSY) as it sent
them, a socket that cannot be reached or breaks as UNAVAILABLE, a worker that does
not answer in time as TIMEOUT.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time

from curvine.common import local_wire
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.local_wire import PeerClosed
from curvine.proto import common_pb2, worker_pb2

log = logging.getLogger(__name__)

RESCAN_INTERVAL = 5.0  # seconds between scans of socket_dir for an unknown worker
POOL_SIZE = 4  # idle connections kept per socket
_IOV_MAX = 1024  # buffers per pwritev (Linux IOV_MAX)


class _Conn:
    """One connection to one worker's socket, used by one thread at a time."""

    def __init__(self, path: str, timeout: float):
        self.path = path
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self.sock.settimeout(timeout)
            with local_wire.reachable(path) as address:
                self.sock.connect(address)
        except BaseException:
            self.sock.close()
            raise
        self.used = False  # carried a request before (a pooled connection may be stale)

    def call(self, request: worker_pb2.LocalRequest, want_fd: bool = False,
             timeout: float | None = None) -> tuple[worker_pb2.LocalReply, int | None]:
        """The worker's reply (and its descriptor when ``want_fd``) within ``timeout``
        (None: the connection's); a refusal is raised as the worker's CurvineError;
        transport failures as OSError (TimeoutError past the deadline) or PeerClosed."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self.used = True
        try:
            local_wire.send(self.sock, request, timeout=timeout)
        except BrokenPipeError:
            # the worker may have refused this connection (BUSY) before reading: its
            # reply is still waiting to be read
            pass
        frame = local_wire.receive(self.sock, deadline, max_fds=1 if want_fd else 0,
                                   limit=local_wire.MAX_REPLY)
        if frame is None:
            raise PeerClosed("the worker closed the connection")
        body, fds = frame
        try:
            reply = worker_pb2.LocalReply.FromString(body)
        except Exception:  # noqa: BLE001 - a garbled reply: this connection is done
            for fd in fds:
                os.close(fd)
            raise PeerClosed("the worker sent a reply that does not parse") from None
        if reply.error_kind:
            for fd in fds:
                os.close(fd)
            try:
                kind = ErrorKind(reply.error_kind)
            except ValueError:
                kind = ErrorKind.IO
            raise CurvineError(kind, reply.error or kind.name.lower())
        if not want_fd:
            for fd in fds:
                os.close(fd)
            return reply, None
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise PeerClosed(f"the worker's reply carried {len(fds)} descriptors, not one")
        return reply, fds[0]

    def close(self) -> None:
        self.sock.close()


class LocalSockets:
    """The domain sockets of the workers on this host, in ``socket_dir``; thread-safe."""

    def __init__(self, socket_dir: str, timeout: float = 10.0, pool_size: int = POOL_SIZE):
        self.socket_dir = socket_dir
        self.timeout = timeout
        self.pool_size = pool_size
        self._lock = threading.Lock()
        self._scan_lock = threading.Lock()
        self._by_uuid: dict[str, str] = {}  # worker uuid -> socket path
        self._idle: dict[str, list[_Conn]] = {}  # socket path -> idle connections
        self._last_scan = -RESCAN_INTERVAL
        self._closed = False

    # -- discovery --------------------------------------------------------------------------

    def has(self, worker: common_pb2.WorkerInfo) -> bool:
        """Whether a socket of this worker (by uuid) is in socket_dir."""
        return self._path_of(worker.uuid) is not None

    def _path_of(self, uuid: str) -> str | None:
        if not uuid or self._closed:
            return None
        with self._lock:
            path = self._by_uuid.get(uuid)
        if path is not None:
            return path
        self._scan()
        with self._lock:
            return self._by_uuid.get(uuid)

    def _scan(self) -> None:
        """Ask every ``*.sock`` of socket_dir which worker it is (rate-limited)."""
        with self._scan_lock:
            if time.monotonic() - self._last_scan < RESCAN_INTERVAL:
                return
            self._last_scan = time.monotonic()
            try:
                names = sorted(n for n in os.listdir(self.socket_dir) if n.endswith(".sock"))
            except OSError as e:
                log.debug("cannot list %s: %s", self.socket_dir, e)
                names = []
            found: dict[str, str] = {}
            for name in names:
                path = os.path.join(self.socket_dir, name)
                try:
                    conn = _Conn(path, self.timeout)
                except OSError as e:
                    log.debug("socket %s: %s", path, e)
                    continue
                try:
                    reply, _ = conn.call(worker_pb2.LocalRequest(hello={}))
                except (CurvineError, OSError, PeerClosed) as e:
                    conn.close()
                    log.debug("socket %s: hello failed: %s", path, e)
                    continue
                found[reply.uuid] = path
                self._put_back(conn)
            with self._lock:
                self._by_uuid = found
        if found:
            log.debug("local worker sockets in %s: %s", self.socket_dir,
                      ", ".join(f"{u} at {p}" for u, p in found.items()))

    def _forget(self, uuid: str, path: str) -> None:
        """The socket of ``uuid`` is gone or serves another worker: look again next
        time (after the rescan interval)."""
        with self._lock:
            if self._by_uuid.get(uuid) == path:
                del self._by_uuid[uuid]
            stale = self._idle.pop(path, [])
        for conn in stale:
            conn.close()

    # -- connections ------------------------------------------------------------------------

    def _take(self, worker: common_pb2.WorkerInfo, fresh: bool = False) -> _Conn:
        path = self._path_of(worker.uuid)
        if path is None:
            raise CurvineError(ErrorKind.UNAVAILABLE, f"no domain socket of worker "
                                                      f"{worker.uuid} in {self.socket_dir}")
        if not fresh:
            with self._lock:
                idle = self._idle.get(path)
                if idle:
                    return idle.pop()
        try:
            conn = _Conn(path, self.timeout)
        except OSError as e:
            self._forget(worker.uuid, path)
            raise CurvineError(ErrorKind.UNAVAILABLE, f"worker socket {path}: "
                                                      f"{e.strerror or e}") from None
        try:
            # the path may serve another worker now (a restart, a reused name)
            reply, _ = conn.call(worker_pb2.LocalRequest(hello={}))
        except CurvineError:
            conn.close()
            raise
        except (OSError, PeerClosed) as e:
            conn.close()
            self._forget(worker.uuid, path)
            raise self._transport_error(path, e) from None
        if reply.uuid != worker.uuid:
            conn.close()
            self._forget(worker.uuid, path)
            raise CurvineError(ErrorKind.UNAVAILABLE, f"worker socket {path} now serves "
                                                      f"worker {reply.uuid}, not {worker.uuid}")
        return conn

    def _put_back(self, conn: _Conn) -> None:
        with self._lock:
            idle = self._idle.setdefault(conn.path, [])
            if not self._closed and len(idle) < self.pool_size:
                idle.append(conn)
                return
        conn.close()

    def _transport_error(self, path: str, e: BaseException) -> CurvineError:
        if isinstance(e, TimeoutError):
            return CurvineError(ErrorKind.TIMEOUT, f"worker socket {path}: no reply within "
                                                   f"{self.timeout:g}s")
        return CurvineError(ErrorKind.UNAVAILABLE, f"worker socket {path}: "
                                                   f"{getattr(e, 'strerror', None) or e}")

    def _call(self, worker, request, want_fd: bool = False, timeout: float | None = None):
        """One request on a pooled connection, retried once on a new one if the pooled
        connection turns out broken (the worker dropped it while it was idle: the
        request was not served).  Returns (connection, reply, fd); the caller puts the
        connection back."""
        conn = self._take(worker)
        retry = conn.used
        while True:
            try:
                reply, fd = conn.call(request, want_fd, timeout)
            except CurvineError:
                self._put_back(conn)  # a refusal: the connection is fine
                raise
            except (OSError, PeerClosed) as e:
                conn.close()
                if retry and not isinstance(e, TimeoutError):
                    retry = False
                    conn = self._take(worker, fresh=True)
                    continue
                raise self._transport_error(conn.path, e) from None
            return conn, reply, fd

    # -- operations -------------------------------------------------------------------------

    def open_read(self, worker: common_pb2.WorkerInfo, block_id: int, token: bytes,
                  timeout: float | None = None) -> tuple[int, int]:
        """(read-only descriptor, length) of a finalised block of ``worker``; the
        caller closes the descriptor.  ``timeout``: for the worker's answer (None: the
        sockets')."""
        conn, reply, fd = self._call(worker, worker_pb2.LocalRequest(
            open_read=worker_pb2.LocalOpenRead(block_id=block_id, token=token)), want_fd=True,
            timeout=timeout)
        self._put_back(conn)
        return fd, reply.length

    def write(self, worker: common_pb2.WorkerInfo, block_id: int, token: bytes,
              buffers: list, checksum: int, timeout: float | None = None) -> tuple[int, int]:
        """Store ``buffers`` (bytes-like, in order) as block ``block_id`` on ``worker``:
        the worker's staging descriptor is written with pwritev and finalised with the
        caller's crc32 ``checksum`` of the bytes.  Returns (length, checksum) as
        stored.  Any failure leaves nothing behind (aborted, or the connection closed,
        which the worker takes as an abort)."""
        views = [memoryview(b).cast("B") for b in buffers]
        views = [v for v in views if v.nbytes]
        length = sum(v.nbytes for v in views)
        end = time.monotonic() + (self.timeout if timeout is None else timeout)
        conn, _, fd = self._call(worker, worker_pb2.LocalRequest(
            open_write=worker_pb2.LocalOpenWrite(block_id=block_id, token=token,
                                                 expected_length=length)), want_fd=True,
            timeout=timeout)
        try:
            try:
                _pwrite_all(fd, views)
            finally:
                os.close(fd)  # closed before the worker makes the file the block
        except OSError as e:
            self._abort(conn, block_id)
            kind = ErrorKind.NO_SPACE if e.errno in (errno.ENOSPC, errno.EDQUOT) else ErrorKind.IO
            raise CurvineError(kind, f"block {block_id:016x}: writing the worker's staging "
                                     f"file: {e.strerror or e}") from None
        except BaseException:
            conn.close()  # the worker removes the staging file when the connection ends
            raise
        try:
            reply, _ = conn.call(worker_pb2.LocalRequest(finish_write=worker_pb2.LocalFinishWrite(
                block_id=block_id, token=token, length=length, checksum=checksum)),
                timeout=max(end - time.monotonic(), 0.001))
        except CurvineError:
            self._abort(conn, block_id)  # if a refusal left the staging file open
            raise
        except (OSError, PeerClosed) as e:
            conn.close()  # whatever the worker did not finish, it removes
            raise self._transport_error(conn.path, e) from None
        except BaseException:
            conn.close()
            raise
        self._put_back(conn)
        return reply.length, reply.checksum

    def adopt(self, worker: common_pb2.WorkerInfo, block_id: int, token: bytes, path: str,
              length: int, checksum: int) -> tuple[int, int]:
        """AdoptBlock on the socket: the worker finalises the staging file ``path`` the
        caller wrote (create_local_staging) as ``block_id``; (length, checksum) as
        stored.  Several times cheaper than the gRPC call."""
        conn, reply, _ = self._call(worker, worker_pb2.LocalRequest(adopt=worker_pb2.LocalAdopt(
            block_id=block_id, token=token, path=path, length=length, checksum=checksum)))
        self._put_back(conn)
        return reply.length, reply.checksum

    def _abort(self, conn: _Conn, block_id: int) -> None:
        """Drop the staging file; if even that fails, closing the connection does."""
        try:
            conn.call(worker_pb2.LocalRequest(abort_write=worker_pb2.LocalAbortWrite(
                block_id=block_id)))
        except (CurvineError, OSError, PeerClosed):
            conn.close()
            return
        self._put_back(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
            self._by_uuid.clear()
        for conn in conns:
            conn.close()

    def __enter__(self) -> "LocalSockets":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pwrite_all(fd: int, views: list[memoryview]) -> None:
    """Write ``views`` back to back from offset 0, whatever pwritev writes per call."""
    offset = 0
    i = 0
    while i < len(views):
        batch = views[i:i + _IOV_MAX]
        n = os.pwritev(fd, batch, offset)
        if n <= 0:
            raise OSError(5, "pwritev wrote nothing")
        offset += n
        # skip whole buffers written, keep the rest of a partly written one
        while n and i < len(views):
            if n >= views[i].nbytes:
                n -= views[i].nbytes
                i += 1
            else:
                views[i] = views[i][n:]
                n = 0
