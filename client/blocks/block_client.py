"""Block I/O against workers: streamed writes, streamed reads with readahead, and the
short-circuit paths to block files on this host (reads of finalised files; writes of
staging files that the worker then adopts).

Blocking calls, safe from many threads (the FUSE client runs them through
``trio.to_thread``).  Every call takes the caller's ``security`` (common/security.py;
keyword, required); one gRPC channel per (worker address, security) is shared by the
whole process.  Every failure is a ``CurvineError`` whose message names the worker.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import queue
import stat
import threading
from typing import Iterable

import grpc

from curvine.common.checksum import crc32
from curvine.common.errors import CurvineError, ErrorKind, from_rpc_error, invalid
from curvine.common.ids import MIB
from curvine.common.rpc import make_channel
from curvine.common.security import Security
from curvine.proto import common_pb2, worker_pb2, worker_pb2_grpc
# The block file layout and the data framing have one definition each, in the worker.
from curvine.common import wire
from curvine.common.blocks import (CLIENT_STAGING_NAME, block_relpath, check_block_id,
                                   client_staging_path)

CHUNK = MIB  # data per gRPC message (docs/measurements.md: 1 MiB is the sweet spot)
DEFAULT_READAHEAD = 4  # messages buffered ahead of the reader (client.readahead_blocks)

WorkerInfo = common_pb2.WorkerInfo

_lock = threading.Lock()
_workers: dict[tuple[str, Security], "_WorkerCalls"] = {}


class _WorkerCalls:
    """A channel plus the data-path calls, framed by hand (see curvine.common.wire)."""

    def __init__(self, address: str, security: Security):
        self.channel = make_channel(address, security)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)
        self.write = self.channel.stream_unary(
            "/curvine.Worker/WriteBlock",
            request_serializer=None,  # requests are already serialised bytes
            response_deserializer=worker_pb2.WriteBlockReply.FromString,
            _registered_method=True)
        self.read = self.channel.unary_stream(
            "/curvine.Worker/ReadBlock",
            request_serializer=worker_pb2.ReadBlockRequest.SerializeToString,
            response_deserializer=wire.decode_read_reply,  # yields views of the data
            _registered_method=True)


def get_channel(address: str, *, security: Security) -> grpc.Channel:
    """The process-wide channel to ``address`` with ``security`` (created on first use)."""
    return _calls(address, security).channel


def _calls(address: str, security: Security) -> _WorkerCalls:
    key = (address, security)
    with _lock:
        calls = _workers.get(key)
        if calls is None:
            calls = _workers[key] = _WorkerCalls(address, security)
        return calls


def close_channels() -> None:
    """Close every cached channel (calls in flight fail; later calls reconnect)."""
    with _lock:
        entries = list(_workers.values())
        _workers.clear()
    for calls in entries:
        calls.channel.close()


RECONNECT_WAIT = 2.0  # seconds a failed connection may take to come back for one retry


def wait_ready(worker: WorkerInfo, timeout: float | None = None, *,
               security: Security) -> bool:
    """Wait up to ``timeout`` seconds (default RECONNECT_WAIT) for this process's channel
    to ``worker`` to be connected; whether it is.  A worker back from a restart is
    refused at once while the channel still waits out its reconnect backoff from the
    outage (up to 1 s, common/rpc.py): a call that failed UNAVAILABLE is worth one more
    try after this."""
    return _wait_ready(_calls(worker.address, security),
                       RECONNECT_WAIT if timeout is None else timeout)


def _wait_ready(calls: _WorkerCalls, timeout: float) -> bool:
    try:
        grpc.channel_ready_future(calls.channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        return False
    return True


def _ready_again(calls: _WorkerCalls, e: grpc.RpcError, timeout: float) -> bool:
    """Whether a call that failed UNAVAILABLE is worth one more try: its channel is
    ready again within RECONNECT_WAIT (see wait_ready); a worker that stays down costs
    this wait once."""
    if e.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    return _wait_ready(calls, min(RECONNECT_WAIT, timeout))


def _error(worker: WorkerInfo, e: grpc.RpcError) -> CurvineError:
    err = from_rpc_error(e)
    return CurvineError(err.kind, f"worker {worker.address}: {err.message}")


def _write_requests(block_id: int, data: memoryview, result: dict, token: bytes):
    n = len(data)
    crc = 0
    pos = 0
    while True:
        end = min(pos + CHUNK, n)
        piece = data[pos:end]
        crc = crc32(piece, crc)
        last = end >= n
        if last:
            result["crc"] = crc
        yield wire.encode_write_request(
            piece, block_id=block_id if pos == 0 else 0, expected_length=n,
            finish=last, checksum=crc if last else 0, token=token)
        if last:
            return
        pos = end


def _check(block_id: int, offset: int = 0, length: int = 0) -> None:
    # Fail here with INVALID rather than deep in protobuf or gRPC's sender thread.
    check_block_id(block_id)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise invalid("offset", f"{offset!r} is not a byte offset")
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise invalid("length", f"{length!r} is not a byte count")


def write_block(worker: WorkerInfo, block_id: int, data: bytes | bytearray | memoryview,
                timeout: float = 30.0, token: bytes = b"", *,
                security: Security) -> tuple[int, int]:
    """Stream ``data`` as block ``block_id`` to ``worker``; returns (length, crc32).

    ``token`` is the master's write token for the block (AddBlock; every call of this
    module takes the block's token: common/block_tokens.py).  The worker checks the
    crc32 before finalising; any failure leaves no block."""
    _check(block_id)
    view = memoryview(data).cast("B")
    calls = _calls(worker.address, security)
    for attempt in range(2):
        result: dict = {}
        try:
            reply = calls.write(_write_requests(block_id, view, result, token),
                                timeout=timeout)
            break
        except grpc.RpcError as e:
            if attempt or not _ready_again(calls, e, timeout):
                raise _error(worker, e) from None
    crc = result.get("crc")
    if reply.length != len(view) or reply.checksum != crc:
        raise CurvineError(ErrorKind.CHECKSUM,
                           f"worker {worker.address}: block {block_id:016x} stored as "
                           f"{reply.length} bytes crc32 {reply.checksum:08x}, sent "
                           f"{len(view)} bytes crc32 {crc or 0:08x}")
    return reply.length, reply.checksum


_NO_MORE = object()


class BlockWriteStream:
    """A WriteBlock call fed while the block is still being written: ``send`` pieces in
    order (each is framed, i.e. copied, at once), then ``finish()`` for (length, crc32),
    or ``cancel()`` (the worker drops what it staged).  gRPC sends from its own thread;
    at most ``depth`` framed pieces wait for it, so a slow worker slows ``send``.  Once
    the call failed, ``send`` and ``finish`` raise its error."""

    def __init__(self, worker: WorkerInfo, block_id: int, timeout: float = 30.0,
                 depth: int = 8, token: bytes = b"", *, security: Security):
        _check(block_id)
        self.worker = worker
        self.block_id = block_id
        self.token = token
        self.length = 0
        self.crc = 0
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._first = True
        self._cancelled = False
        self._call = _calls(worker.address, security).write.future(self._requests(),
                                                                    timeout=timeout)

    def _requests(self):
        while True:
            try:
                item = self._queue.get(timeout=0.1)
            except queue.Empty:
                call = getattr(self, "_call", None)
                if self._cancelled or call is not None and call.done():
                    return
                continue
            if item is _NO_MORE:
                return  # cancelled: the stream ends without a finish message
            yield item

    def _put(self, msg) -> None:
        while True:
            if self._call.done():
                self._raise()
            try:
                self._queue.put(msg, timeout=0.1)
                return
            except queue.Full:
                continue

    def _raise(self):
        try:
            self._call.result(timeout=0)
        except grpc.RpcError as e:
            raise _error(self.worker, e) from None
        except grpc.FutureCancelledError:
            raise CurvineError(ErrorKind.IO, f"worker {self.worker.address}: block "
                                             f"{self.block_id:016x}: stream cancelled") from None
        raise CurvineError(ErrorKind.IO, f"worker {self.worker.address}: block "
                                         f"{self.block_id:016x}: stream ended early")

    def send(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        for pos in range(0, len(view), CHUNK):
            piece = view[pos:pos + CHUNK]
            msg = wire.encode_write_request(piece, block_id=self.block_id if self._first else 0,
                                            token=self.token)
            self._first = False
            self.crc = crc32(piece, self.crc)
            self.length += len(piece)
            self._put(msg)

    def finish(self, timeout: float | None = None) -> tuple[int, int]:
        """Finalise the block; returns (length, crc32) as the worker checked them."""
        self._put(wire.encode_write_request(b"", block_id=self.block_id if self._first else 0,
                                            finish=True, checksum=self.crc, token=self.token))
        self._first = False
        try:
            reply = self._call.result(timeout=timeout)
        except grpc.RpcError as e:
            raise _error(self.worker, e) from None
        except grpc.FutureCancelledError:
            self._raise()
        if reply.length != self.length or reply.checksum != self.crc:
            raise CurvineError(ErrorKind.CHECKSUM,
                               f"worker {self.worker.address}: block {self.block_id:016x} "
                               f"stored as {reply.length} bytes crc32 {reply.checksum:08x}, "
                               f"sent {self.length} bytes crc32 {self.crc:08x}")
        return reply.length, reply.checksum

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()
        try:
            self._queue.put_nowait(_NO_MORE)
        except queue.Full:
            pass  # the call is cancelled anyway: gRPC stops reading the iterator


def read_block(worker: WorkerInfo, block_id: int, offset: int, length: int,
               timeout: float = 30.0, token: bytes = b"", *, security: Security) -> bytes:
    """[offset, offset+length) of a block (length 0 = to the end), in one bytes object."""
    _check(block_id, offset, length)
    calls = _calls(worker.address, security)
    request = worker_pb2.ReadBlockRequest(block_id=block_id, offset=offset, length=length,
                                          token=token)
    for attempt in range(2):
        try:
            parts = list(calls.read(request, timeout=timeout))  # views into the messages
            break
        except grpc.RpcError as e:
            if attempt or not _ready_again(calls, e, timeout):
                raise _error(worker, e) from None
    data = b"".join(parts)  # the one copy
    if length and len(data) != length:
        raise CurvineError(ErrorKind.IO, f"worker {worker.address}: block {block_id:016x}: "
                                         f"got {len(data)} of {length} bytes")
    return data


_END = object()


def _pump(stream, q: queue.Queue, closed: threading.Event, address: str) -> None:
    def put(item) -> bool:
        while not closed.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    try:
        for view in stream:  # a view into the received message: no copy
            if not put(view):
                return
        put(_END)
    except grpc.RpcError as e:
        if not closed.is_set():
            err = from_rpc_error(e)
            put(CurvineError(err.kind, f"worker {address}: {err.message}"))
    except BaseException as e:  # noqa: BLE001 - hand everything to the consumer
        put(CurvineError(ErrorKind.IO, f"worker {address}: {e}"))


class BlockReader:
    """Sequential reader of [offset, offset+length) of one block (length 0 = to the end).

    Iterate once: it yields chunks (bytes-like, <= 1 MiB) in order.  A background thread
    keeps up to ``readahead`` chunks received ahead of the consumer; ``poll()`` takes the
    next one only if it has arrived (never blocks).  ``close()`` cancels the stream.  Use
    as a context manager or call ``close()``.
    """

    def __init__(self, worker: WorkerInfo, block_id: int, offset: int = 0, length: int = 0,
                 timeout: float = 30.0, readahead: int = DEFAULT_READAHEAD,
                 token: bytes = b"", *, security: Security):
        _check(block_id, offset, length)
        self.worker = worker
        self.block_id = block_id
        self.length = length
        self._received = 0
        self._closed = threading.Event()
        self._stream = _calls(worker.address, security).read(
            worker_pb2.ReadBlockRequest(block_id=block_id, offset=offset, length=length,
                                        token=token),
            timeout=timeout)
        self._queue: queue.Queue = queue.Queue(maxsize=max(readahead, 1))
        self._held = None  # the end or an error seen by poll(), for the iterator
        # The pump gets no reference to self, so an abandoned reader is collected and
        # its __del__ stops the pump.
        threading.Thread(target=_pump, name="block-readahead", daemon=True,
                         args=(self._stream, self._queue, self._closed, worker.address)).start()

    def _get(self, block: bool):
        if self._held is not None:
            item, self._held = self._held, None
            return item
        return self._queue.get(timeout=0.1) if block else self._queue.get_nowait()

    def poll(self):
        """The next chunk if it has arrived, else None (also at the end of the stream or
        on an error: iterating reports those).  Never blocks."""
        if self._closed.is_set():
            return None
        try:
            item = self._get(False)
        except queue.Empty:
            return None
        if item is _END or isinstance(item, CurvineError):
            self._held = item
            return None
        self._received += len(item)
        return item

    def __iter__(self):
        while not self._closed.is_set():
            try:
                item = self._get(True)
            except queue.Empty:
                continue
            if item is _END:
                self._check_complete()
                return
            if isinstance(item, CurvineError):
                self.close()
                raise item
            self._received += len(item)
            yield item

    def _check_complete(self) -> None:
        if self.length and self._received != self.length:
            raise CurvineError(ErrorKind.IO, f"worker {self.worker.address}: block "
                                             f"{self.block_id:016x}: got {self._received} of "
                                             f"{self.length} bytes")

    def close(self) -> None:
        closed = getattr(self, "_closed", None)  # __del__ of a half-built reader
        if closed is None or closed.is_set():
            return
        closed.set()
        self._stream.cancel()

    def __enter__(self) -> "BlockReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


# -- short-circuit: block files and staging files of this host's workers -------------
#
# Paths reported over the network (``WorkerInfo.data_dirs``, from the master) only
# select which of this process's own configured data dirs a worker's files are in
# (``LocalDirs``); every path opened is built from the configured dir, walked one
# component at a time with O_NOFOLLOW (docs/security.md, Short-circuit).

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted at a block's name must not hang the open
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_STAGING_MODE = 0o600


class LocalDirs:
    """Where short-circuit I/O may go: the data dirs of this host's workers as this
    process's own configuration names them (``client.short_circuit_dirs``, else
    ``worker.data_dirs`` of the same file).

    A data dir a worker reports is used only if it equals (``os.path.normpath``) the
    ``os.path.realpath`` or the absolute form of one of these; the dir then opened is
    the configured one (its real path, resolved once, here), never the reported
    string.  A reported path is never resolved: a symlink alias of a configured dir is
    not that dir.

    ``trust_reported``: the compatibility mode of a library caller that gave no
    configuration (``local_dirs(None)`` before ``set_local_dirs``): reported dirs are
    used as they are, still opened component by component with O_NOFOLLOW.  The mount
    (fuse_client/main.py) and ``CurvineFS`` always pass their configuration."""

    def __init__(self, dirs: Iterable[str | bytes] | None = (), trust_reported: bool = False):
        self.trust_reported = trust_reported
        self.dirs: list[str] = []  # real paths, in configured order
        self._local: dict[str, str] = {}  # accepted reported form -> real path
        for d in dirs or ():
            d = os.fsdecode(d)
            if not d or "\0" in d:
                continue
            absolute = os.path.normpath(os.path.abspath(d))
            real = os.path.realpath(absolute)
            if real not in self.dirs:
                self.dirs.append(real)
            self._local.setdefault(real, real)
            self._local.setdefault(absolute, real)

    @classmethod
    def from_config(cls, cfg) -> "LocalDirs":
        return cls(list(cfg.client.short_circuit_dirs) or list(cfg.worker.data_dirs))

    def of(self, worker: WorkerInfo) -> list[tuple[str, str]]:
        """(dir to open, the worker's name for it) for each data dir ``worker`` reports
        that is one of ours, in the worker's order."""
        out: list[tuple[str, str]] = []
        for d in worker.data_dirs:
            if not isinstance(d, str) or not d.startswith("/") or "\0" in d:
                continue
            name = os.path.normpath(d)
            local = name if self.trust_reported else self._local.get(name)
            if local is not None and (local, name) not in out:
                out.append((local, name))
        return out

    def __repr__(self) -> str:
        return ("LocalDirs(reported dirs trusted)" if self.trust_reported
                else f"LocalDirs({self.dirs!r})")


_default_dirs = LocalDirs(None, trust_reported=True)


def set_local_dirs(dirs: "LocalDirs | Iterable[str]") -> LocalDirs:
    """Make ``dirs`` this process's short-circuit dirs for readers and writers built
    without their own (the mount sets its configuration here at start)."""
    global _default_dirs
    _default_dirs = dirs if isinstance(dirs, LocalDirs) else LocalDirs(dirs)
    return _default_dirs


def local_dirs(dirs: "LocalDirs | Iterable[str] | None" = None) -> LocalDirs:
    """``dirs`` as a LocalDirs; None: this process's (``set_local_dirs``)."""
    if dirs is None:
        return _default_dirs
    return dirs if isinstance(dirs, LocalDirs) else LocalDirs(dirs)


def _open_root(local: str, follow: bool = False) -> int:
    """A configured data dir (its real path: the last component is not followed;
    ``follow``: a reported dir in the trust_reported mode, as it is named)."""
    return os.open(local, _DIR_FLAGS & ~os.O_NOFOLLOW if follow else _DIR_FLAGS)


class TamperedPath(OSError):
    """Below a trusted data dir, a symlink or something else than a directory or a
    regular file where a block's path goes: that copy is not to be read."""


def _open_in(root: str, parts: list[str], flags: int, mode: int = 0o600,
             follow_root: bool = False) -> int:
    """``parts`` below the data dir ``root``, opened one at a time with O_NOFOLLOW
    (directories O_DIRECTORY), the last with ``flags``.  A symlink or a non-directory
    in the way is TamperedPath."""
    fd = _open_root(root, follow_root)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], flags, mode, dir_fd=fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise TamperedPath(e.errno, f"{e.strerror} (a symlink or a file in the way)",
                               os.path.join(root, *parts)) from None
        raise
    finally:
        os.close(fd)


def _split_under(path: str, dirs: Iterable[tuple[str, str]]) -> tuple[str, list[str]] | None:
    """(the dir to open, components below it) for a ``path`` inside one of ``dirs``
    ((dir to open, the worker's name for it) pairs, ``LocalDirs.of``), named either way."""
    for local, name in dirs:
        for root in (local, name):
            prefix = root.rstrip("/") + "/"
            if path.startswith(prefix):
                parts = path[len(prefix):].split("/")
                if all(p and p not in (".", "..") for p in parts):
                    return local, parts
    return None


def open_block_file(path: str, dirs: Iterable[tuple[str, str]],
                    follow_root: bool = False) -> int:
    """Open the block file at ``path``, inside one of the trusted data dirs ``dirs``
    (``LocalDirs.of``), for reading: the configured dir is opened, each component below
    it with O_NOFOLLOW (directories O_DIRECTORY), and the file must be a regular file.
    TamperedPath if something else is in the way (a symlink, a FIFO...), another
    OSError if it cannot be opened (ENOENT...)."""
    found = _split_under(path, dirs)
    if found is None:
        raise OSError(errno.EPERM, "not inside a configured data dir", path)
    fd = _open_in(found[0], found[1], _FILE_FLAGS, follow_root=follow_root)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TamperedPath(errno.EINVAL, "not a regular file", path)
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def local_block_path(worker: WorkerInfo, block_id: int,
                     dirs: "LocalDirs | None" = None) -> str | None:
    """The path of a block's finalised file in one of ``worker``'s data dirs that
    ``dirs`` (default: this process's, ``set_local_dirs``) trusts, if something is
    there (lstat).  Open it only with ``open_block_file``, which refuses anything but
    a regular file reached without a symlink.

    Only meaningful when ``worker.host_id == curvine.common.ids.host_id()``."""
    rel = block_relpath(block_id)
    for local, _ in local_dirs(dirs).of(worker):
        path = os.path.join(local, rel)
        try:
            os.lstat(path)
        except OSError:
            continue
        return path
    return None


def _open_staging(local: str, follow_root: bool = False) -> int:
    """The staging dir of a configured data dir (neither followed)."""
    root = _open_root(local, follow_root)
    try:
        return os.open("staging", _DIR_FLAGS, dir_fd=root)
    finally:
        os.close(root)


def _give_to_dir_owner(fd: int, dir_fd: int) -> None:
    """Root writes files the worker must read: give them to the staging dir's owner
    (the worker's user; its files are private to it)."""
    if os.geteuid() != 0:
        return
    st = os.fstat(dir_fd)
    if st.st_uid != 0:
        os.fchown(fd, st.st_uid, st.st_gid)


def _lock_new(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def _staging_dirs(worker: WorkerInfo, dirs: "LocalDirs | None") -> list[tuple[str, str]]:
    """(local dir, the worker's name for it) of the worker's trusted data dirs whose
    staging area this process can reach, most free space first."""
    found = []
    for local, name in local_dirs(dirs).of(worker):
        try:
            st = os.statvfs(os.path.join(local, "staging"))
        except OSError:
            continue
        found.append((st.f_bavail * st.f_frsize, local, name))
    found.sort(key=lambda t: -t[0])
    return [(local, name) for _, local, name in found]



def _claim(fd: int, sfd: int) -> bool:
    """Make a new staging file the worker's to adopt: mode 0600 whatever the umask,
    owned by the staging dir's owner, flock'ed; False if any of it fails."""
    try:
        os.fchmod(fd, _STAGING_MODE)
        _give_to_dir_owner(fd, sfd)
        return _lock_new(fd)
    except OSError:
        return False


def _in_first_staging_dir(worker: WorkerInfo, dirs: "LocalDirs | None", create):
    """``create(staging dir fd, data dir, worker's name of it)`` in each trusted staging
    dir of the (local) worker, most free space first, until one answers; None if none
    does.  The staging dir is opened O_NOFOLLOW|O_DIRECTORY; an OSError of ``create``
    (a file system without O_TMPFILE, permissions) moves on to the next dir."""
    follow = local_dirs(dirs).trust_reported
    for local, name in _staging_dirs(worker, dirs):
        try:
            sfd = _open_staging(local, follow)
        except OSError:
            continue
        try:
            made = create(sfd, local, name)
        except OSError:
            continue
        finally:
            os.close(sfd)
        if made is not None:
            return made
    return None


def create_local_staging(worker: WorkerInfo, block_id: int,
                         dirs: "LocalDirs | None" = None) -> tuple[int, str] | None:
    """Create a client staging file for ``block_id`` in one of the (local) worker's
    trusted data dirs, the one with the most free space; returns (fd, path), ``path``
    in the worker's terms (for AdoptBlock), or None if no such dir is writable from
    here (a container without the worker's volume, permissions, a symlink).

    The staging dir is opened O_NOFOLLOW|O_DIRECTORY in the configured data dir, the
    file created O_EXCL|O_NOFOLLOW with mode 0600 (given to the dir's owner when this
    process is root), read-write and flock'ed: the worker sweeps client staging files
    only once their lock is free (the writer closed them or died)."""
    check_block_id(block_id)

    def create(sfd: int, _local: str, name: str) -> tuple[int, str] | None:
        path = client_staging_path(name, block_id)
        fname = os.path.basename(path)
        fd = os.open(fname, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     _STAGING_MODE, dir_fd=sfd)
        if _claim(fd, sfd):
            return fd, path
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(fname, dir_fd=sfd)
        return None

    return _in_first_staging_dir(worker, dirs, create)


def create_local_tmpfile(worker: WorkerInfo,
                         dirs: "LocalDirs | None" = None) -> tuple[int, str] | None:
    """An unnamed file (O_TMPFILE, mode 0600, flock'ed) in the staging area of the
    (local) worker's trusted data dir with the most free space: a block written before
    the master placed it.  ``name_local_tmpfile`` gives it its staging name once it is
    placed there; otherwise it vanishes with its descriptor (also when the writer
    dies).  Returns (fd, the configured data dir), or None if no data dir can take one."""
    def create(sfd: int, local: str, _name: str) -> tuple[int, str] | None:
        fd = os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, _STAGING_MODE, dir_fd=sfd)
        if _claim(fd, sfd):
            return fd, local
        os.close(fd)
        return None

    return _in_first_staging_dir(worker, dirs, create)


def name_local_tmpfile(fd: int, worker: WorkerInfo, block_id: int,
                       dirs: "LocalDirs | None" = None) -> str | None:
    """Link the unnamed file ``fd`` (create_local_tmpfile) into the staging area of a
    trusted data dir of ``worker`` as a client staging file of ``block_id``; returns
    its path in the worker's terms, or None (no such dir on the file's file system).

    The new name is made in the staging dir opened O_NOFOLLOW, and a link never
    replaces or follows an existing name."""
    dirs = local_dirs(dirs)
    for local, name in dirs.of(worker):
        path = client_staging_path(name, block_id)
        try:
            sfd = _open_staging(local, dirs.trust_reported)
        except OSError:
            continue
        try:
            proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:  # linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N: how an O_TMPFILE gets a name
                os.link(str(fd), os.path.basename(path), src_dir_fd=proc, dst_dir_fd=sfd,
                        follow_symlinks=True)
            finally:
                os.close(proc)
            return path
        except OSError:
            continue  # another file system (EXDEV), or not writable
        finally:
            os.close(sfd)
    return None


def unlink_staging(path: str) -> None:
    """Remove a client staging file (``create_local_staging``, ``name_local_tmpfile``)
    by its name in the staging dir, that dir opened O_NOFOLLOW; errors are ignored."""
    staging, fname = os.path.split(path)
    root = os.path.dirname(staging)
    if os.path.basename(staging) != "staging" or not CLIENT_STAGING_NAME.fullmatch(fname):
        return
    with contextlib.suppress(OSError):
        # the data dir as named where the file was made (one of the trusted forms)
        rfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            sfd = os.open("staging", _DIR_FLAGS, dir_fd=rfd)
        finally:
            os.close(rfd)
        try:
            os.unlink(fname, dir_fd=sfd)
        finally:
            os.close(sfd)


def adopt_block(worker: WorkerInfo, block_id: int, path: str, length: int, checksum: int,
                timeout: float = 30.0, token: bytes = b"", *,
                security: Security) -> tuple[int, int]:
    """Ask the (local) worker to finalise the staging file ``path`` as block ``block_id``
    (see ``create_local_staging``); returns (length, crc32) as the worker recorded them."""
    _check(block_id, 0, length)
    req = worker_pb2.AdoptBlockRequest(block_id=block_id, path=path, length=length,
                                       checksum=checksum, token=token)
    try:
        reply = _calls(worker.address, security).stub.AdoptBlock(req, timeout=timeout)
    except grpc.RpcError as e:
        raise _error(worker, e) from None
    return check_adopted(worker, block_id, reply.length, reply.checksum, length, checksum)


def check_adopted(worker: WorkerInfo, block_id: int, got_length: int, got_checksum: int,
                  length: int, checksum: int) -> tuple[int, int]:
    """What a worker says it adopted must be what was written (else CHECKSUM)."""
    if got_length != length or got_checksum != checksum:
        raise CurvineError(ErrorKind.CHECKSUM,
                           f"worker {worker.address}: block {block_id:016x} adopted as "
                           f"{got_length} bytes crc32 {got_checksum:08x}, written "
                           f"{length} bytes crc32 {checksum:08x}")
    return got_length, got_checksum
