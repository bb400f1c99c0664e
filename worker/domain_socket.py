"""The worker's Unix domain socket: short-circuit I/O for clients that may not open
its data dirs (the HDFS short-circuit design).

A client on this host (an inference pod with the socket's directory mounted, never
the data dirs) asks for a block with its block token; the worker checks the token
exactly as its gRPC service does (``WorkerServicer._authorize``: the same key, the
same refusals), opens the block file itself and passes the descriptor back
(SCM_RIGHTS).  The client then reads the bytes from the page cache with no copy
through the worker.  Writes the same way: the worker creates the staging file
(``BlockStore.begin_write``, capacity reserved), passes a write-only descriptor, the
client writes the block into it and asks the worker to finalise it
(``BlockWriter.finish_external``); the block is then reported to the master like
any other.  A staging file whose connection closes before FinishWrite is removed.

Wire: 4-byte big-endian length + a ``LocalRequest``/``LocalReply``
(proto/src/curvine/proto/worker.proto, common/local_wire.py), one reply per request.
Bounded on every side (docs/security.md, "Limits"): ``max_connections`` connections
(one thread each; one more gets a BUSY reply and is closed at once), at most
``per_peer`` of them of one process (by its pid, SO_PEERCRED; BUSY too), a connection
that starts no request within ``idle_timeout`` is dropped, and one whose request is
not whole within REQUEST_TIMEOUT of its first byte, a request over
``local_wire.MAX_REQUEST`` bytes ends its connection, at most
``MAX_WRITES_PER_CONNECTION`` staging files per connection.  Bad input gets an INVALID
reply naming the field.  Refusals are counted in curvine_worker_fd_refused{reason}.

The socket file is mode 0666 in a directory the worker creates 0755: who may connect
is not what protects the data, the block token is (docs/security.md).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
import time
from typing import Callable

from google.protobuf.message import DecodeError

from curvine.common import block_tokens, local_wire
from curvine.common.blocks import check_block_id
from curvine.common.errors import CurvineError, ErrorKind, invalid
from curvine.proto import worker_pb2

from .blockstore import BlockWriter
from .service import WorkerServicer

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
PER_PEER = 32  # connections of one process (a pod's connector reads with 16 threads)
MAX_WRITES_PER_CONNECTION = 4
IDLE_TIMEOUT = 60.0  # seconds a connection may take to start its next request
REQUEST_TIMEOUT = 10.0  # seconds a request may take from its first byte
SOCKET_MODE = 0o666
DIR_MODE = 0o755

# refusal reasons counted for the metrics
REFUSALS = ("busy", "idle", "slow_request", "per_peer", "invalid", "permission",
            "unavailable", "not_found", "no_space", "other")


def _error_reply(e: CurvineError) -> worker_pb2.LocalReply:
    return worker_pb2.LocalReply(error_kind=int(e.kind), error=str(e))


class DomainSocketServer:
    """Serves ``servicer``'s block store on the Unix socket ``path``.

    ``identity()`` returns (uuid, worker id) for Hello (worker id 0 until the worker
    registered; block calls are UNAVAILABLE until then, like on gRPC).  ``start()``
    binds (replacing a stale socket file, never a live one or anything else),
    ``close()`` stops serving, ends every connection (their staging files are
    removed) and removes the socket file."""

    def __init__(self, path: str, servicer: WorkerServicer,
                 identity: Callable[[], tuple[str, int]],
                 max_connections: int = MAX_CONNECTIONS, idle_timeout: float = IDLE_TIMEOUT,
                 per_peer: int = PER_PEER, request_timeout: float = REQUEST_TIMEOUT):
        if not path or not os.path.isabs(path):
            raise invalid("worker.domain_socket", f"{path!r} is not an absolute path")
        self.path = path
        self.servicer = servicer
        self.store = servicer.store
        self.identity = identity
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.per_peer = per_peer
        self.request_timeout = request_timeout
        self._peers: dict[int, int] = {}  # peer pid -> connections open
        self._listener: socket.socket | None = None
        self._inode: tuple[int, int] | None = None  # (dev, ino) of our socket file
        self._lock = threading.Lock()
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._closing = threading.Event()
        self._accept_thread: threading.Thread | None = None
        self._stats_lock = threading.Lock()
        self.served = {"read": [0, 0], "write": [0, 0]}  # op -> [blocks, bytes]
        self.refused = dict.fromkeys(REFUSALS, 0)
        self._handlers = {"hello": self._hello, "open_read": self._open_read,
                          "open_write": self._open_write, "finish_write": self._finish_write,
                          "abort_write": self._abort_write, "adopt": self._adopt}

    # -- life cycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Bind and serve; CurvineError (naming worker.domain_socket) if it cannot."""
        where = f"worker.domain_socket {self.path}"
        directory = os.path.dirname(self.path)
        try:
            if not os.path.isdir(directory):
                os.makedirs(directory, mode=DIR_MODE, exist_ok=True)
                os.chmod(directory, DIR_MODE)  # whatever the umask: clients list it
            self._remove_stale()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        except OSError as e:
            raise CurvineError(ErrorKind.IO, f"{where}: {e.strerror or e}") from None
        try:
            with local_wire.reachable(self.path) as address:
                sock.bind(address)
            os.chmod(self.path, SOCKET_MODE)  # the token, not the mode, is the check
            st = os.lstat(self.path)
            sock.listen(self.max_connections)
        except OSError as e:
            sock.close()
            raise CurvineError(ErrorKind.IO, f"{where}: {e.strerror or e}") from None
        sock.settimeout(0.5)  # the accept loop notices close() within this
        self._listener = sock
        self._inode = (st.st_dev, st.st_ino)
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                               name="domain-socket")
        self._accept_thread.start()
        log.info("serving short-circuit descriptors on %s", self.path)

    def _remove_stale(self) -> None:
        """A socket file nobody listens on (a killed worker's) is removed; a live one,
        or a file that is not a socket, is left alone and refused."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise CurvineError(ErrorKind.EXISTS, f"worker.domain_socket {self.path}: exists "
                                                 "and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        probe.settimeout(1.0)
        try:
            with local_wire.reachable(self.path) as address:
                probe.connect(address)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(self.path)
            log.info("removed the stale socket %s", self.path)
            return
        except OSError:
            pass  # e.g. a full backlog: someone is there
        finally:
            probe.close()
        raise CurvineError(ErrorKind.EXISTS, f"worker.domain_socket {self.path}: another "
                                             "process is serving it (two workers with one "
                                             "socket path?)")

    @property
    def serving(self) -> str | None:
        """None while serving, else why not (for /healthz)."""
        if self._listener is None or self._closing.is_set():
            return f"domain socket {self.path} is not serving"
        if self._accept_thread is not None and not self._accept_thread.is_alive():
            return f"domain socket {self.path}: its accept thread ended"
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return f"domain socket {self.path} was removed by someone else (restart the worker)"
        except OSError as e:
            return f"domain socket {self.path}: {e.strerror}"
        if (st.st_dev, st.st_ino) != self._inode:
            return f"domain socket {self.path} was replaced or removed by someone else"
        return None

    def close(self, timeout: float = 5.0) -> None:
        self._closing.set()
        listener, self._listener = self._listener, None
        if listener is not None:
            if self._accept_thread is not None:
                self._accept_thread.join(timeout)
            listener.close()
            self._unlink_ours()
        with self._lock:
            conns = list(self._conns.items())
        for conn, _ in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes its thread; it aborts its writes
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for _, thread in conns:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _unlink_ours(self) -> None:
        try:
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cannot remove %s: %s", self.path, e)

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def _count(self, reason: str) -> None:
        with self._stats_lock:
            self.refused[reason] += 1

    def _served(self, op: str, length: int) -> None:
        with self._stats_lock:
            self.served[op][0] += 1
            self.served[op][1] += length

    # -- connections ----------------------------------------------------------------------

    def _accept_loop(self) -> None:
        listener = self._listener
        while not self._closing.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError as e:
                if self._closing.is_set():
                    break
                log.warning("domain socket %s: accept failed: %s", self.path, e)
                time.sleep(0.1)  # e.g. EMFILE: do not spin
                continue
            try:
                pid = local_wire.peer_credentials(conn)[0]
            except OSError:
                pid = 0
            with self._lock:
                full = len(self._conns) >= self.max_connections
                mine = self._peers.get(pid, 0)
                if not full and mine < self.per_peer:
                    self._peers[pid] = mine + 1
                    thread = threading.Thread(target=self._serve, args=(conn, pid),
                                              daemon=True, name="domain-socket-conn")
                    self._conns[conn] = thread
            if full:
                self._refuse_busy(conn, "busy", f"{self.max_connections} connections open")
            elif mine >= self.per_peer:
                self._refuse_busy(conn, "per_peer", f"{self.per_peer} connections of pid "
                                                    f"{pid} open")
            else:
                thread.start()

    def _refuse_busy(self, conn: socket.socket, reason: str = "busy",
                     why: str = "") -> None:
        """A BUSY reply, written without waiting for a request, then closed: never a
        thread, never a hang (the client reads it as the reply to its request)."""
        self._count(reason)
        try:
            conn.setblocking(False)
            conn.send(local_wire.encode(_error_reply(CurvineError(
                ErrorKind.BUSY, f"worker domain socket: {why or 'busy'}; try again or use "
                                "another connection"))))
        except OSError:
            pass
        finally:
            conn.close()

    def _serve(self, conn: socket.socket, pid: int = 0) -> None:
        # block id -> (its staging file, the length announced): this connection's writes
        writes: dict[int, tuple[BlockWriter, int]] = {}
        try:
            if log.isEnabledFor(logging.DEBUG):
                try:
                    pid, uid, gid = local_wire.peer_credentials(conn)
                    log.debug("domain socket: connection of pid %d uid %d gid %d", pid, uid, gid)
                except OSError:
                    pass
            while not self._closing.is_set():
                try:
                    frame = local_wire.receive(conn, time.monotonic() + self.idle_timeout,
                                               whole_within=self.request_timeout)
                except local_wire.SlowMessage:
                    self._count("slow_request")
                    log.debug("domain socket: dropped a connection whose request took over "
                              "%gs", self.request_timeout)
                    break
                except TimeoutError:
                    self._count("idle")
                    log.debug("domain socket: dropped a connection silent for %gs",
                              self.idle_timeout)
                    break
                except CurvineError as e:  # too big: the stream cannot be resynchronised
                    self._count("invalid")
                    local_wire.send(conn, _error_reply(e))
                    break
                if frame is None:
                    break
                reply, fd, ours = self._handle(frame[0], writes)
                try:
                    local_wire.send(conn, reply, fd)
                finally:
                    if ours:  # the client has its own copy now (or never will)
                        os.close(fd)
        except (local_wire.PeerClosed, OSError):
            pass  # the peer went away: its writes are aborted below
        except Exception:  # noqa: BLE001 - a bug must not take the worker down
            log.exception("domain socket: connection failed")
        finally:
            for writer, _ in writes.values():
                writer.abort()
            with self._lock:
                self._conns.pop(conn, None)
                n = self._peers.get(pid, 0) - 1
                if n > 0:
                    self._peers[pid] = n
                else:
                    self._peers.pop(pid, None)
            conn.close()

    def _handle(self, data: bytes, writes: dict):
        """(reply, descriptor to pass or None, whether that descriptor is to be closed
        once sent) of one request; never raises."""
        try:
            try:
                req = worker_pb2.LocalRequest.FromString(data)
            except DecodeError:
                raise invalid("request", "not a LocalRequest message") from None
            op = req.WhichOneof("op")
            if op is None:
                raise invalid("request", "names no operation (hello, open_read, "
                                         "open_write, finish_write, abort_write, adopt)")
            return self._handlers[op](getattr(req, op), writes)
        except CurvineError as e:
            self._count(_REASON.get(e.kind, "other"))
            return _error_reply(e), None, False
        except Exception as e:  # noqa: BLE001 - a reply, never a traceback to the client
            log.exception("domain socket: request failed")
            self._count("other")
            return _error_reply(CurvineError(ErrorKind.IO, f"worker: {e}")), None, False

    # -- operations -------------------------------------------------------------------------

    def _hello(self, _req, _writes):
        uuid, worker_id = self.identity()
        return worker_pb2.LocalReply(uuid=uuid, worker_id=worker_id), None, False

    def _open_read(self, req, _writes):
        block_id = check_block_id(req.block_id, "open_read.block_id")
        self.servicer._authorize(block_id, req.token, block_tokens.READ, "open_read.token")
        fd, size = self.store.open_block(block_id)
        self._served("read", size)
        # sending gives the client its own descriptor; ours is closed once sent
        return worker_pb2.LocalReply(length=size), fd, True

    def _open_write(self, req, writes):
        block_id = check_block_id(req.block_id, "open_write.block_id")
        limit = self.servicer.block_size
        if req.expected_length > limit:
            raise invalid("open_write.expected_length",
                          f"{req.expected_length} exceeds the block size {limit}")
        self.servicer._authorize(block_id, req.token, block_tokens.WRITE, "open_write.token")
        if block_id in writes:
            raise invalid("open_write.block_id", f"block {block_id:016x} is already open "
                                                 "for writing on this connection")
        if len(writes) >= MAX_WRITES_PER_CONNECTION:
            raise CurvineError(ErrorKind.BUSY, f"open_write: {MAX_WRITES_PER_CONNECTION} "
                                               "writes open on this connection")
        writer = self.store.begin_write(block_id, req.expected_length)
        writes[block_id] = (writer, req.expected_length)
        # the writer keeps its descriptor: it finalises (or removes) the file
        return worker_pb2.LocalReply(), writer.fileno(), False

    def _finish_write(self, req, writes):
        block_id = check_block_id(req.block_id, "finish_write.block_id")
        self.servicer._authorize(block_id, req.token, block_tokens.WRITE, "finish_write.token")
        if block_id not in writes:
            raise invalid("finish_write.block_id", f"block {block_id:016x} is not open for "
                                                   "writing on this connection")
        writer, expected = writes.pop(block_id)  # finished or aborted below, whatever happens
        limit = self.servicer.block_size
        if req.length > limit:
            writer.abort()
            raise invalid("finish_write.length", f"{req.length} exceeds the block size {limit}")
        if expected and req.length != expected:
            writer.abort()
            raise invalid("finish_write.length", f"announced {expected} bytes, wrote "
                                                 f"{req.length}")
        length, crc = writer.finish_external(req.length, req.checksum)
        self._served("write", length)
        log.debug("finalised block %016x written through a descriptor: %d bytes",
                  block_id, length)
        return worker_pb2.LocalReply(length=length, checksum=crc), None, False

    def _adopt(self, req, _writes):
        _, length, crc = self.servicer.adopt(req, "adopt.")
        self._served("write", length)
        return worker_pb2.LocalReply(length=length, checksum=crc), None, False

    def _abort_write(self, req, writes):
        block_id = check_block_id(req.block_id, "abort_write.block_id")
        entry = writes.pop(block_id, None)
        if entry is not None:
            entry[0].abort()
        return worker_pb2.LocalReply(), None, False


_REASON = {ErrorKind.INVALID: "invalid", ErrorKind.PERMISSION: "permission",
           ErrorKind.UNAVAILABLE: "unavailable", ErrorKind.NOT_FOUND: "not_found",
           ErrorKind.NO_SPACE: "no_space", ErrorKind.BUSY: "busy"}
