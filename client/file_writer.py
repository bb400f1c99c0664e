"""Writing one version of a file.

Every open-for-write gets its own ``FileWriter``: a private version of the file
that nobody else sees until ``publish()`` hands its blocks to the master
(CompleteFile).  Several writers of the same path may work at once; the last to
publish wins and readers never see a mix (DESIGN consistency rule 1).

The version is a list of extents covering [0, size): uploaded blocks (immutable,
reusable from the base version), holes (block id 0, never written) and at most one
block being written.  That block is uploaded in the background when the writes move
past it, and synchronously at publish.  A write into an uploaded block reads it back,
modifies it and uploads it later as a new block.

Where the block being written lives: the first block of a file is placed only when
its size is known (at publish, or once it is full), so that the master reserves what
the writer stores (a 14 MiB KV chunk needs 14 MiB free, not a 64 MiB block).  Until
then it is written into an unnamed file (O_TMPFILE) in the staging area of a worker
of this host; when the master places the block on a worker of this host on the same
file system, the file gets its staging name there by a link and is adopted (no copy),
otherwise its bytes are copied to the workers chosen; without a known local worker it
is gathered in memory.
Later blocks of a file that outgrew one block are placed at their first byte, with a
whole block reserved: when the master places one on a worker of this host
(short-circuit enabled), the writes go straight into a staging file in that worker's
data dir and "uploading" is one AdoptBlock call; otherwise the block is gathered in
memory and streamed to the workers while it is written.  The crc32 is computed once,
while writing.

Write-behind: ``write_behind`` queues a write of immutable bytes (what FUSE hands
over) without blocking, and one background thread per writer applies the queue in
order, so the FUSE loop answers the write request at once and the kernel sends the
next one while this one is written.  Every other operation (a blocking ``write``,
``read``, ``truncate``, ``publish``...) first applies what is queued.  A queued write
that fails (no space, a worker down) fails every later operation of the handle: its
version is never published without it; close(2) reports the error.
"""

from __future__ import annotations

import bisect
import errno
import collections
import contextlib
import logging
import mmap
import os
import queue
import threading
import zlib
from concurrent.futures import Future
from typing import Iterable, Mapping

from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.metrics import CLIENT_WRITTEN_REMOTE, CLIENT_WRITTEN_SHORT_CIRCUIT
from curvine.proto import common_pb2

from . import block_client
from .pools import LazyExecutor
from .file_reader import BlockFetcher, join, zeros

log = logging.getLogger(__name__)

Block = common_pb2.Block
WorkerInfo = common_pb2.WorkerInfo

UPLOAD_ATTEMPTS = 3  # block allocations tried (excluding failed workers) per upload

_upload_pool = LazyExecutor(16, "block-upload")
_drain_pool = LazyExecutor(64, "write-behind")  # write-behind queues, one task per writer

WRITE_BEHIND_BYTES = 8 << 20  # queued write-behind bytes per writer before writes block
STREAM_DEADLINE = 600.0  # seconds a block may take to be written while it streams


IDLE_BUFFER_BYTES = 256 << 20  # block buffers kept mapped for reuse, per process



class LocalWorker:
    """The worker of this host that the master last named (statfs, AddBlock), shared by
    the writers of one mount or client: where a first block is written before it is
    placed (see the module docstring).  Only a worker with a data dir that ``dirs``
    (this process's configuration, ``block_client.LocalDirs``; None: the process's)
    names is taken: a dir reported over the network is never written to by itself."""

    def __init__(self, host_id: str,
                 dirs: "block_client.LocalDirs | Iterable[str] | None" = None):
        self.host_id = host_id
        self.dirs = block_client.local_dirs(dirs)
        self.info: WorkerInfo | None = None

    def note(self, workers: Iterable[WorkerInfo]) -> None:
        for w in workers:
            if w.host_id == self.host_id and not w.lost and self.dirs.of(w):
                self.info = w


class _BufferPool:
    """Anonymous mappings of block size, reused: pages that are already faulted in
    take a copy ~10x faster than fresh ones (MEASURED.md), and a mapping only
    costs the pages actually written (a 32 MiB file in a 64 MiB block)."""

    def __init__(self, idle_bytes: int):
        self.idle_bytes = idle_bytes
        self._lock = threading.Lock()
        self._free: dict[int, list[mmap.mmap]] = {}
        self._idle = 0

    def get(self, size: int) -> mmap.mmap:
        with self._lock:
            free = self._free.get(size)
            if free:
                self._idle -= size
                return free.pop()
        return mmap.mmap(-1, size)

    def put(self, mem: mmap.mmap) -> None:
        size = len(mem)
        with self._lock:
            if self._idle + size <= self.idle_bytes:
                self._free.setdefault(size, []).append(mem)
                self._idle += size
                return
        try:
            mem.close()
        except BufferError:
            pass  # a view still exists somewhere; the mapping goes with it


_buffers = _BufferPool(IDLE_BUFFER_BYTES)


class _Buffer:
    """A block's bytes in memory: a mapping of block size and a fill length.
    Bytes past the length are garbage; growing always writes them."""

    __slots__ = ("mem", "len", "alloc", "streams", "stream_failed", "crc", "crc_len",
                 "staging_failed")

    def __init__(self, capacity: int, data: bytes | memoryview = b"", alloc=None,
                 checksum: bool = False):
        self.mem = _buffers.get(capacity)
        self.len = 0
        self.alloc = alloc  # (block id, targets) from the master, if allocated already
        # WriteBlock calls fed while the block is written (FileWriter._send); None when
        # the block is not being streamed.  stream_failed: ids of workers that failed.
        self.streams: list | None = None
        self.stream_failed: list[int] = []
        # crc32 of [0, crc_len) kept while the writes append (``checksum``), for a
        # short-circuit store at upload; None once a write does not append
        self.crc = _RunningCrc() if checksum else None
        self.crc_len = 0
        self.staging_failed = False  # a copy of a staging file that failed: stream it
        if data:
            self.write(0, data)

    def __len__(self) -> int:
        return self.len

    @property
    def capacity(self) -> int:
        return len(self.mem)

    def write(self, rel: int, data) -> None:
        n = len(data)
        self.mem[rel:rel + n] = data
        if self.crc is not None:
            if rel == self.crc_len:
                self.crc.add(memoryview(data))
                self.crc_len += n
            else:
                self.crc = None
        if rel + n > self.len:
            self.len = rel + n

    def zero_extend(self, size: int) -> None:
        while self.len < size:
            n = min(size - self.len, 1 << 20)
            self.write(self.len, zeros(n))

    def truncate(self, size: int) -> None:
        self.len = min(self.len, size)
        if self.crc is not None and self.crc_len > self.len:
            self.crc = None

    def checksum(self) -> int | None:
        """crc32 of the buffer if it was kept while writing, else None."""
        if self.crc is None or self.crc_len != self.len:
            return None
        return self.crc.value()

    def read(self, rel: int, n: int) -> bytes:
        return self.mem[rel:min(rel + n, self.len)]

    def view(self) -> memoryview:
        return memoryview(self.mem)[:self.len]

    def cancel_streams(self) -> None:
        for st in self.streams or ():
            st.cancel()
        if self.streams is not None:
            self.streams = []
            self.alloc = None  # that block id had a stream: the upload takes a new one

    def release(self) -> None:
        self.cancel_streams()
        if self.mem is not None:
            mem, self.mem = self.mem, None
            _buffers.put(mem)


class _RunningCrc:
    """crc32 of the pieces appended so far, computed off the write path.

    Pieces of immutable ``bytes`` (what FUSE hands over) go to one background thread,
    in order, so that the write request is answered before its checksum is done (the
    kernel sends a file's direct writes one at a time); anything else is summed at
    once.  ``value()`` waits for what is queued."""

    _queue: queue.Queue | None = None
    _start_lock = threading.Lock()

    def __init__(self):
        self._value = 0
        self._queued = 0
        self._done = 0
        self._cond = threading.Condition(threading.Lock())

    @classmethod
    def _worker_queue(cls) -> queue.Queue:
        with cls._start_lock:
            if cls._queue is None:
                cls._queue = queue.Queue(maxsize=CRC_QUEUE_PIECES)
                threading.Thread(target=cls._run, args=(cls._queue,), name="crc32",
                                 daemon=True).start()
            return cls._queue

    @staticmethod
    def _run(q: queue.Queue) -> None:
        while True:
            crc, piece = q.get()
            value = zlib.crc32(piece, crc._value)  # only this thread changes _value
            with crc._cond:
                crc._value = value
                crc._done += 1
                crc._cond.notify_all()

    def add(self, piece: memoryview) -> None:
        if not isinstance(piece.obj, bytes):  # the caller may reuse its buffer
            with self._cond:
                self._cond.wait_for(lambda: self._done == self._queued)
                self._value = zlib.crc32(piece, self._value)
            return
        with self._cond:
            self._queued += 1
        self._worker_queue().put((self, piece))

    def value(self) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._done == self._queued)
            return self._value


CRC_QUEUE_PIECES = 64  # pieces (<= 1 MiB each) waiting for the crc32 thread


class _FileBuffer:
    """A block being written straight into a staging file of a worker on this host
    (short-circuit write); same interface as ``_Buffer``.

    The block id and targets are allocated before the first byte.  The crc32 is kept
    up to date while the writes append; any other change recomputes it at upload.
    Once handed to the worker (``sealed``) the file is never written again: the
    writer copies it into memory first (``FileWriter._ensure_writable``)."""

    def __init__(self, capacity: int, fd: int, path: str, block_id: int,
                 worker: WorkerInfo, others: list, data_dir: str = ""):
        self.capacity = capacity
        self.fd: int | None = fd
        # "" (and block_id 0): an unnamed file in data_dir, the block not placed yet
        self.path = path
        self.data_dir = data_dir
        self.alloc = None  # (block id, targets) when placed on other workers
        self.block_id = block_id
        self.worker = worker  # the local worker that adopts the file
        self.others = others  # further replicas, streamed from the file
        self.len = 0
        self.sealed = False  # handed to the worker (or about to be)
        self.adopt_tried = False
        self.adopted = False
        self._crc = _RunningCrc()
        self._crc_len = 0  # bytes covered by _crc; -1 once invalid

    def __len__(self) -> int:
        return self.len

    def write(self, rel: int, data) -> None:
        n = len(data)
        view = memoryview(data)
        done = 0
        while done < n:
            done += os.pwrite(self.fd, view[done:], rel + done)
        if rel == self._crc_len:
            self._crc.add(view)
            self._crc_len += n
        elif self._crc_len >= 0:
            self._crc_len = -1  # an overwrite or a gap: recompute at upload
        if rel + n > self.len:
            self.len = rel + n

    def zero_extend(self, size: int) -> None:
        if size > self.len:
            os.ftruncate(self.fd, size)
            self.len = size

    def truncate(self, size: int) -> None:
        if size < self.len:
            os.ftruncate(self.fd, size)
            self.len = size
            if self._crc_len > size:
                self._crc_len = -1

    def read(self, rel: int, n: int) -> bytes:
        n = min(rel + n, self.len) - rel
        if n <= 0:
            return b""
        data = os.pread(self.fd, n, rel)
        if len(data) != n:
            raise CurvineError(ErrorKind.IO, f"staging file {self.path}: read {len(data)} "
                                             f"of {n} bytes")
        return data

    def checksum(self) -> int:
        if self._crc_len == self.len:
            return self._crc.value()
        crc, pos = 0, 0
        while pos < self.len:
            piece = self.read(pos, min(MAX_PIECE, self.len - pos))
            crc = zlib.crc32(piece, crc)
            pos += len(piece)
        return crc

    def mapping(self) -> mmap.mmap | None:
        """The file's bytes, mapped read-only (None when empty)."""
        return mmap.mmap(self.fd, self.len, prot=mmap.PROT_READ) if self.len else None

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is None:
            return
        if not self.adopted and self.path:
            block_client.unlink_staging(self.path)
        os.close(fd)  # also drops the flock


MAX_PIECE = 1 << 20


class _Extent:
    """[start, start+length) of the version: an uploaded block/hole, or a buffer."""

    __slots__ = ("start", "block", "buf", "upload")

    def __init__(self, start: int, block: Block | None = None, buf: _Buffer | None = None):
        self.start = start
        self.block = block  # set once uploaded (or a hole / base block)
        self.buf = buf  # the bytes while in memory
        self.upload: Future | None = None  # a background upload of buf in flight

    @property
    def length(self) -> int:
        return len(self.buf) if self.buf is not None else self.block.length

    @property
    def end(self) -> int:
        return self.start + self.length


class FileWriter:
    """One version of file ``ino`` being written; thread-safe."""

    def __init__(self, master, ino: int, block_size: int, base_blocks: Iterable[Block],
                 host_id: str, *, workers: Mapping[int, WorkerInfo] | None = None,
                 short_circuit: bool = True, timeout: float = 30.0, size_hint: int = 0,
                 local_worker: LocalWorker | None = None,
                 local_dirs: "block_client.LocalDirs | Iterable[str] | None" = None):
        self.master = master
        self.ino = ino
        self.block_size = block_size
        self.host_id = host_id
        self.timeout = timeout
        # Where short-circuit reads and staging files may go: this process's own
        # configuration (given, else the local worker's, else the process's).
        if local_dirs is not None:
            self._dirs = block_client.local_dirs(local_dirs)
        elif local_worker is not None:
            self._dirs = local_worker.dirs
        else:
            self._dirs = block_client.local_dirs()
        self._fetcher = BlockFetcher(workers or {}, short_circuit, timeout,
                                     local_dirs=self._dirs)
        self._lock = threading.RLock()
        self._extents: list[_Extent] = []
        self._size = 0
        for b in base_blocks:
            if b.length:
                self._extents.append(_Extent(self._size, block=b))
                self._size += b.length
        # Blocks this version shares with the file's published version.  Another
        # writer's publish frees them, so publish checks they are still live.
        self._shared = {e.block.block_id for e in self._extents if e.block.block_id}
        # Block ids the master gave this writer since its last publish: those the next
        # publish does not include were dropped (rewritten, uploaded again), and the
        # publish hands them back so they do not sit on the workers as garbage.
        self._allocated: set[int] = set()
        # block id -> the master's write token, for every block this handle was given
        # (AddBlock): the workers serve a block only with its token
        self._tokens: dict[int, bytes] = {}
        # The bytes this writer will store, if the caller knows (0: not known, as for a
        # FUSE writer): then even the first block is placed at its first byte.
        self.size_hint = size_hint
        self._local = local_worker or LocalWorker(host_id, self._dirs)
        self._cur: _Extent | None = None  # the one buffer being written
        self._uploading: _Extent | None = None  # at most one background upload
        self.dirty = False  # changed since open or the last publish
        self.mtime_ns = 0  # explicit mtime to publish with (0 = the master's now)
        self._closed = False
        # Write-behind queue (see the module docstring); _wb_cond guards these fields,
        # and a queued write is applied only while holding _lock (so never out of order).
        self._wb_cond = threading.Condition(threading.Lock())
        self._wb_queue: collections.deque = collections.deque()
        self._wb_bytes = 0
        self._wb_end = 0  # end of the furthest queued write
        self._wb_seq = 0  # writes queued so far
        self._wb_running = False  # a drain task is scheduled or running
        self._wb_blocking = 0  # blocking writes in progress: queueing would overtake them
        self._wb_error: CurvineError | None = None

    @property
    def size(self) -> int:
        if self._wb_bytes:
            return max(self._size, self._wb_end)
        return self._size

    # -- public operations ----------------------------------------------------

    def write_behind(self, offset: int, data: bytes) -> bool:
        """Queue a write of ``data`` (immutable bytes) without blocking; False when it
        must go through ``write`` instead (queue full, an error to report, ...)."""
        n = len(data)
        if type(data) is not bytes or offset < 0 or n == 0:
            return False
        with self._wb_cond:
            if (self._closed or self._wb_error is not None or self._wb_blocking
                    or self._wb_bytes and self._wb_bytes + n > WRITE_BEHIND_BYTES):
                return False
            self._wb_queue.append((offset, data))
            self._wb_bytes += n
            self._wb_end = max(self._wb_end, offset + n)
            self._wb_seq += 1
            self.dirty = True
            self.mtime_ns = 0
            start = not self._wb_running
            self._wb_running = True
        if start:
            try:
                _drain_pool().submit(self._drain)
            except BaseException:
                with self._wb_cond:
                    self._wb_running = False
                raise
        return True

    def _drain(self) -> None:
        """Apply queued writes in order (a pool thread)."""
        while True:
            with self._lock:
                with self._wb_cond:
                    if not self._wb_queue:
                        self._wb_running = False
                        self._wb_cond.notify_all()
                        return
                self._apply_one_queued()

    def _apply_one_queued(self) -> None:
        """Apply the oldest queued write, if any (the caller holds _lock)."""
        with self._wb_cond:
            if not self._wb_queue:
                return  # close() dropped the queue meanwhile
            item = self._wb_queue[0]
            offset, data = item
            failed = self._wb_error is not None or self._closed
        if not failed:
            try:
                self._write(offset, data)
            except CurvineError as e:
                failed = e
            except Exception as e:  # noqa: BLE001 - reported at the next operation
                log.exception("write-behind of inode %d failed", self.ino)
                failed = CurvineError(ErrorKind.IO, f"write at {offset}: {e}")
        with self._wb_cond:
            if isinstance(failed, CurvineError) and self._wb_error is None:
                self._wb_error = failed
            if failed:  # the rest of the queue goes with it
                self._wb_queue.clear()
                self._wb_bytes = 0
            elif self._wb_queue and self._wb_queue[0] is item:  # (close() may clear it)
                self._wb_queue.popleft()
                self._wb_bytes -= len(data)
            self._wb_cond.notify_all()

    def _sync_writes(self) -> None:
        """Apply every queued write (the caller holds _lock); raise the error one of
        them hit, now and at every later call."""
        while True:
            with self._wb_cond:
                if not self._wb_queue:
                    self._wb_end = 0
                    err = self._wb_error
                    break
            self._apply_one_queued()
        if err is not None:
            raise CurvineError(err.kind, f"an earlier write of this handle failed: "
                                         f"{err.message}")

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        with self._wb_cond:
            self._wb_blocking += 1
        try:
            with self._lock:
                self._check_open()
                self._sync_writes()
                n = self._write(offset, data)
                if n:
                    self.dirty = True
                    self.mtime_ns = 0
                return n
        finally:
            with self._wb_cond:
                self._wb_blocking -= 1

    def _write(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if offset < 0:
            raise CurvineError(ErrorKind.INVALID, "offset: negative")
        if n == 0:
            return 0
        with self._lock:
            self._check_open()
            if offset > self._size:
                self._grow(offset, for_write=True)
            pos = 0
            while pos < n:
                off = offset + pos
                ext = self._buffer_at(off)
                self._ensure_writable(ext)
                rel = off - ext.start
                k = min(n - pos, self._capacity_end(ext) - off)
                self._buffer_op(ext, "write", rel, view[pos:pos + k])  # rel <= len: no gap
                if ext.end > self._size:
                    self._size = ext.end
                pos += k
            return n

    def truncate(self, size: int) -> None:
        if size < 0:
            raise CurvineError(ErrorKind.INVALID, "size: negative")
        with self._lock:
            self._check_open()
            self._sync_writes()
            try:
                self._wait_upload()
            except CurvineError:
                pass  # the bytes stay in memory for the next publish
            if size > self._size:
                self._grow(size, for_write=False)
            elif size < self._size:
                i = self._index(size)
                ext = self._extents[i]
                keep = i + 1 if ext.start < size else i
                for dropped in self._extents[keep:]:
                    if dropped is self._cur:
                        self._cur = None
                del self._extents[keep:]
                self._size = self._extents[-1].end if self._extents else 0
                if ext.start < size:
                    if ext.buf is None and ext.block.block_id == 0:
                        ext.block = Block(block_id=0, length=size - ext.start)
                    else:
                        self._make_current(ext)
                        self._ensure_writable(ext)
                        self._buffer_op(ext, "truncate", size - ext.start)
                self._size = size
            self.dirty = True
            self.mtime_ns = 0

    def read(self, offset: int, size: int) -> bytes | memoryview:
        """Read this version (what this handle wrote, over its base)."""
        with self._lock:
            self._check_open()
            self._sync_writes()
            end = min(self._size, offset + size)
            if offset >= end:
                return b""
            parts = []
            i = self._index(offset)
            while offset < end:
                ext = self._extents[i]
                n = min(end, ext.end) - offset
                rel = offset - ext.start
                if ext.buf is not None:
                    parts.append(ext.buf.read(rel, n))
                else:
                    data = self._fetcher.read(ext.block, rel, n)
                    if len(data) != n:
                        raise CurvineError(ErrorKind.IO, f"block {ext.block.block_id:016x}: "
                                                         f"read {len(data)} of {n} bytes")
                    parts.append(data)
                offset += n
                i += 1
            return join(parts)

    def blocks(self) -> list[Block]:
        """Upload what is in memory and return the version's blocks in order."""
        with self._lock:
            self._check_open()
            self._sync_writes()
            try:
                self._wait_upload()
            except CurvineError:
                pass  # the bytes are still in memory: uploaded again below
            for ext in self._extents:
                if ext.buf is not None:
                    ext.block = self._upload(ext.buf)
                    ext.buf.release()
                    ext.buf = None
                    if ext is self._cur:
                        self._cur = None
            return [e.block for e in self._extents]

    def publish(self):
        """Make this version the file's content (CompleteFile); returns the new Inode.

        The writer then continues from the published blocks as its base."""
        with self._lock:
            blocks = self.blocks()
            seq = self._wb_seq  # writes queued from here on are not in this version
            self._check_shared(blocks)
            published = {b.block_id for b in blocks if b.block_id}
            inode = self.master.complete_file(self.ino, blocks, self._size,
                                              mtime_ns=self.mtime_ns,
                                              abandoned=sorted(self._allocated - published))
            self._allocated.clear()
            self._shared = published
            with self._wb_cond:
                if self._wb_seq == seq:
                    self.dirty = False
                    self.mtime_ns = 0
            return inode

    def _check_shared(self, blocks: list[Block]) -> None:
        """Refuse to publish blocks of an old version that another writer replaced
        (the master freed them): better ESTALE at close than a file that fails later."""
        reused = {b.block_id for b in blocks if b.block_id} & self._shared
        if not reused:
            return
        _, current, _ = self.master.get_blocks(self.ino)
        gone = reused - {b.block_id for b in current}
        if gone:
            raise CurvineError(ErrorKind.STALE, f"inode {self.ino} was replaced by another "
                                                f"writer while this handle modified it "
                                                f"({len(gone)} shared blocks freed)")

    def flush(self):
        """Publish if anything changed since the last publish; the new Inode or None."""
        with self._lock:
            return self.publish() if self.dirty else None

    def close(self) -> None:
        """Forget the version (unpublished blocks are the master's to collect)."""
        with self._wb_cond:
            self._closed = True  # queued writes are dropped
            self._wb_queue.clear()
            self._wb_bytes = 0
        with self._lock:
            if not self._extents and self._cur is None and self._uploading is None:
                self._fetcher.close()
                return
            up = self._uploading
            self._uploading = None
            for ext in self._extents:
                if ext.buf is None:
                    continue
                if ext is up and up.upload is not None and not up.upload.cancel():
                    # Still being sent: give the buffer back when that is over.
                    up.upload.add_done_callback(lambda _f, b=ext.buf: b.release())
                else:
                    ext.buf.release()
            self._extents = []
            self._cur = None
            self._fetcher.close()

    # -- extents ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise CurvineError(ErrorKind.STALE, "file handle is closed")

    def _index(self, offset: int) -> int:
        """Index of the extent holding ``offset`` (< size)."""
        exts = self._extents
        if exts and exts[-1].start <= offset:  # the common case: writing at the end
            return len(exts) - 1
        starts = [e.start for e in self._extents]
        return bisect.bisect_right(starts, offset) - 1

    def _capacity_end(self, ext: _Extent) -> int:
        """How far the extent's buffer may grow: only the last one grows, to a block."""
        if ext is self._extents[-1]:
            return ext.start + ext.buf.capacity
        return ext.end

    def _grow(self, size: int, for_write: bool) -> None:
        """Extend the version with zeros to ``size``: holes, or zeros in the buffer."""
        last = self._extents[-1] if self._extents else None
        if for_write and last is not None and last is self._cur:
            if size <= self._capacity_end(last):
                self._ensure_writable(last)
                self._buffer_op(last, "zero_extend", size - last.start)
                self._size = size
                return
        pos = self._size
        while pos < size:
            n = min(self.block_size, size - pos)
            self._extents.append(_Extent(pos, block=Block(block_id=0, length=n)))
            pos += n
        self._size = size

    def _buffer_at(self, off: int) -> _Extent:
        """The in-memory extent that takes a write at ``off`` (<= size)."""
        if off < self._size:
            ext = self._extents[self._index(off)]
        else:  # appending
            ext = self._extents[-1] if self._extents else None
            if ext is not None and ext is not self._cur:
                # Re-open a short last block (e.g. after a publish) rather than start
                # a new one after it, so that appends do not fragment the file.
                if ext.buf is None and ext.block.block_id == 0 or ext.length >= self.block_size:
                    ext = None
            elif ext is not None and off >= self._capacity_end(ext):
                ext = None
            if ext is None:
                if off == 0 and not self.size_hint:
                    buf = self._unplaced_buffer()  # placed once its size is known
                else:
                    buf = self._new_buffer(min(max(self.size_hint - off, 0), self.block_size))
                ext = _Extent(off, buf=buf)
                self._extents.append(ext)
                prev, self._cur = self._cur, ext
                if prev is not None:
                    self._start_upload(prev)
                return ext
        self._make_current(ext)
        return ext

    def _make_current(self, ext: _Extent) -> None:
        """Bring ``ext`` into memory as the buffer being written; send the previous
        buffer off to be uploaded."""
        if ext is self._cur:
            return
        if ext is self._uploading:
            # Modified again while uploading: keep the bytes, forget that upload.
            self._uploading = None
            try:
                ext.upload.result()
            except CurvineError:
                pass
            ext.upload = None
            ext.block = None
        elif ext.buf is None:
            buf = _Buffer(max(self.block_size, ext.block.length))
            try:
                if ext.block.block_id:
                    buf.write(0, self._fetcher.read_all(ext.block))
                else:
                    buf.zero_extend(ext.block.length)
            except BaseException:
                buf.release()
                raise
            ext.buf = buf
            ext.block = None
        prev, self._cur = self._cur, ext
        if prev is not None:
            self._start_upload(prev)

    def _start_upload(self, ext: _Extent) -> None:
        # One upload in flight per writer bounds its memory to two blocks.
        self._wait_upload()
        ext.upload = _upload_pool().submit(self._upload, ext.buf)
        self._uploading = ext

    def _wait_upload(self) -> None:
        ext = self._uploading
        if ext is None:
            return
        self._uploading = None
        try:
            block = ext.upload.result()
        except BaseException:
            ext.upload = None  # keeps its bytes; the next publish uploads them again
            raise
        ext.upload = None
        ext.block = block
        ext.buf.release()
        ext.buf = None

    def _unplaced_buffer(self):
        """The first block, before its size is known: an unnamed file in the staging
        area of this host's worker, else memory (see the module docstring)."""
        w = self._local.info if self._fetcher.short_circuit else None
        made = block_client.create_local_tmpfile(w, self._dirs) if w is not None else None
        if made is None:
            return _Buffer(self.block_size, checksum=True)
        fd, data_dir = made
        return _FileBuffer(self.block_size, fd, "", 0, w, [], data_dir=data_dir)

    def _new_buffer(self, size_hint: int = 0):
        """A buffer for a new block (``size_hint`` bytes expected, 0 = a whole block): a
        staging file of the local worker when the master places the block there, else
        memory streamed to the workers while written."""
        try:
            block_id, targets, self._tokens[block_id] = self.master.add_block(
                self.ino, self.host_id, size_hint, [])
            self._allocated.add(block_id)
        except CurvineError as e:
            # E.g. the file was unlinked or replaced meanwhile, or no worker has room:
            # writes go on in memory and publishing reports it (as without this path).
            log.debug("no block for inode %d yet (%s); writing to memory", self.ino, e)
            return _Buffer(self.block_size)
        if not targets:
            return _Buffer(self.block_size)
        self._local.note(targets)
        if self._fetcher.short_circuit:
            for i, w in enumerate(targets):
                if w.host_id != self.host_id:
                    continue
                made = block_client.create_local_staging(w, block_id, self._dirs)
                if made is not None:
                    fd, path = made
                    return _FileBuffer(self.block_size, fd, path, block_id, w,
                                       [t for j, t in enumerate(targets) if j != i])
        buf = _Buffer(self.block_size, alloc=(block_id, list(targets)))
        buf.streams = []
        for w in targets:
            try:
                buf.streams.append(block_client.BlockWriteStream(
                    w, block_id, timeout=max(self.timeout, STREAM_DEADLINE),
                    token=self._tokens[block_id]))
            except CurvineError as e:
                log.info("cannot stream block %016x to worker %d (%s): %s", block_id,
                         w.worker_id, w.address, e)
                buf.stream_failed.append(w.worker_id)
        return buf

    def _send(self, buf: _Buffer, data) -> None:
        """Hand appended bytes to the block's streams; a stream that fails is dropped
        (the upload then sends the whole block to another worker)."""
        for st in list(buf.streams):
            try:
                st.send(data)
            except CurvineError as e:
                log.info("streaming block %016x to worker %d (%s) failed: %s", st.block_id,
                         st.worker.worker_id, st.worker.address, e)
                st.cancel()
                buf.streams.remove(st)
                buf.stream_failed.append(st.worker.worker_id)

    def _ensure_writable(self, ext: _Extent) -> None:
        """A staging file handed to the worker is never written again: continue in a
        memory copy of it."""
        buf = ext.buf
        if isinstance(buf, _FileBuffer) and buf.sealed:
            self._to_memory(ext)

    def _to_memory(self, ext: _Extent) -> None:
        """Continue the block of ``ext`` in a memory copy of its staging file (which is
        dropped unless the worker adopted it).  The copy keeps the block id for the
        other targets, if any."""
        buf = ext.buf
        others = [w for w in buf.others if w.worker_id != buf.worker.worker_id]
        alloc = (buf.block_id, others) if others and not buf.adopt_tried else None
        mem = _Buffer(max(self.block_size, len(buf)), alloc=alloc)
        mem.staging_failed = not buf.sealed
        try:
            pos = 0
            while pos < len(buf):
                piece = buf.read(pos, MAX_PIECE)
                mem.write(pos, piece)
                pos += len(piece)
        except BaseException:
            mem.release()
            raise
        buf.release()
        ext.buf = mem

    def _buffer_op(self, ext: _Extent, op: str, *args) -> None:
        """``ext.buf.<op>(*args)``; a staging file that fails (disk full, I/O error)
        is left for a memory copy, and the block streamed to a worker at upload.  On a
        streamed memory buffer appends are sent on; anything else ends the streams."""
        buf = ext.buf
        if isinstance(buf, _Buffer) and buf.streams:
            if op == "write" and args[0] == buf.len:
                buf.write(*args)
                self._send(buf, args[1])
                return
            if op == "zero_extend" and args[0] > buf.len:
                n = args[0] - buf.len
                buf.zero_extend(args[0])
                while n > 0:
                    k = min(n, MAX_PIECE)
                    self._send(buf, zeros(k))
                    n -= k
                return
            buf.cancel_streams()  # rewrites bytes already sent
        try:
            getattr(ext.buf, op)(*args)
        except OSError as e:
            if not isinstance(ext.buf, _FileBuffer):
                raise
            log.info("staging file %s failed (%s); continuing in memory", ext.buf.path, e)
            self._to_memory(ext)
            getattr(ext.buf, op)(*args)

    def _upload_file(self, buf: _FileBuffer) -> Block:
        """Hand a staging file to the local worker (AdoptBlock), stream it to the other
        replicas; if the worker refuses it, stream it as a new block instead."""
        buf.sealed = True
        length = len(buf)
        crc = buf.checksum()
        if not buf.block_id and not self._place_file(buf, length):
            # placed where this file cannot be linked: copy its bytes there
            block_id, targets = buf.alloc
            with self._mapped(buf) as data:
                return self._stream(data, alloc=(block_id, targets), crc=crc)
        if not buf.adopt_tried:
            buf.adopt_tried = True
            try:
                block_client.adopt_block(buf.worker, buf.block_id, buf.path, length, crc,
                                         timeout=self.timeout,
                                         token=self._tokens[buf.block_id])
                buf.adopted = True
                CLIENT_WRITTEN_SHORT_CIRCUIT.inc(length)
            except CurvineError as e:
                log.info("worker %d (%s) did not adopt block %016x: %s; streaming it",
                         buf.worker.worker_id, buf.worker.address, buf.block_id, e)
        with self._mapped(buf) as data:
            if not buf.adopted:
                return self._stream(data, exclude=[buf.worker.worker_id])
            stored = [buf.worker]
            for w in buf.others:
                try:
                    block_client.write_block(w, buf.block_id, data, timeout=self.timeout,
                                             token=self._tokens[buf.block_id])
                    stored.append(w)
                    CLIENT_WRITTEN_REMOTE.inc(length)
                except CurvineError as e:
                    log.info("writing block %016x to worker %d (%s) failed: %s",
                             buf.block_id, w.worker_id, w.address, e)
        self._fetcher.add_workers({w.worker_id: w for w in stored})
        return Block(block_id=buf.block_id, length=length, checksum=crc,
                     worker_ids=[w.worker_id for w in stored], token=self._tokens[buf.block_id])

    def _place_file(self, buf: _FileBuffer, length: int) -> bool:
        """Place the block of an unnamed staging file, now that its length is known:
        True when the master put it on a worker of this host whose staging area is on
        the same file system (the file is then linked there under its staging name,
        with the block id and the other targets), else False with ``buf.alloc`` =
        (block id, targets) to copy it to."""
        block_id, targets, self._tokens[block_id] = self._add_block(length, [])
        self._allocated.add(block_id)
        for w in targets:
            if w.host_id != self.host_id:
                continue
            # into a trusted data dir of w on the file's file system (a link works
            # within one only), else None
            path = block_client.name_local_tmpfile(buf.fd, w, block_id, self._dirs)
            if path is not None:
                buf.path = path
                buf.block_id, buf.worker = block_id, w
                buf.others = [t for t in targets if t is not w]
                return True
        buf.alloc = (block_id, targets)
        return False

    @staticmethod
    @contextlib.contextmanager
    def _mapped(buf: _FileBuffer):
        """A memoryview of the staging file's bytes (mapped read-only) for a block."""
        mapping = buf.mapping()
        data = memoryview(mapping) if mapping is not None else memoryview(b"")
        try:
            yield data
        finally:
            data.release()
            if mapping is not None:
                try:
                    mapping.close()
                except BufferError:
                    pass  # a view is still referenced (a traceback): freed with it

    def _upload(self, buf) -> Block:
        """Store the buffer as a new block on the workers the master picks."""
        if isinstance(buf, _FileBuffer):
            return self._upload_file(buf)
        alloc, buf.alloc = buf.alloc, None  # a block id is written once
        if buf.streams is None or not (buf.streams or buf.stream_failed):
            return self._stream(buf.view(), alloc=alloc, crc=buf.checksum(),
                                local=not buf.staging_failed)
        # Streamed while written: only the tail and the finish are left.
        streams, buf.streams = buf.streams, []
        stored, crc = [], 0
        for st in streams:
            try:
                _, crc = st.finish(timeout=self.timeout)
                stored.append(st.worker)
                CLIENT_WRITTEN_REMOTE.inc(len(buf))
            except CurvineError as e:
                log.info("finishing block %016x on worker %d (%s) failed: %s", st.block_id,
                         st.worker.worker_id, st.worker.address, e)
                st.cancel()
                buf.stream_failed.append(st.worker.worker_id)
        if not stored:
            return self._stream(buf.view(), exclude=buf.stream_failed)
        self._fetcher.add_workers({w.worker_id: w for w in stored})
        return Block(block_id=streams[0].block_id, length=len(buf), checksum=crc,
                     worker_ids=[w.worker_id for w in stored], token=streams[0].token)

    def _add_block(self, length: int, exclude: list[int]):
        """AddBlock avoiding ``exclude`` if the master can; else with any worker: the
        excluded ones may be all there are, and a worker whose stream failed is often
        healthy (it cut a stream left silent past worker.stream_idle_timeout)."""
        try:
            return self.master.add_block(self.ino, self.host_id, length, exclude)
        except CurvineError as e:
            if e.kind != ErrorKind.NO_SPACE or not exclude:
                raise
            log.info("no worker for inode %d besides %s (%s); trying them again",
                     self.ino, sorted(set(exclude)), e)
            return self.master.add_block(self.ino, self.host_id, length, [])

    def _stream(self, data: memoryview, alloc=None, exclude: list[int] | None = None,
                crc: int | None = None, local: bool = True) -> Block:
        """Store ``data`` as a new block (to ``alloc``'s block and targets first, if
        given), trying other workers on failure: a target on this host by a staging
        file it adopts (``local``; ``crc``: the data's crc32 if known), the others by
        streaming."""
        length = len(data)
        exclude = list(exclude or [])
        last: CurvineError | None = None
        for _ in range(UPLOAD_ATTEMPTS):
            targets = None
            if alloc is not None:
                block_id, targets = alloc
                alloc = None
                targets = [w for w in targets if w.worker_id not in exclude]
            if not targets:
                block_id, targets, self._tokens[block_id] = self._add_block(length, exclude)
                self._allocated.add(block_id)
            if not targets:
                raise CurvineError(ErrorKind.NO_SPACE, "the master found no worker to write to")
            stored = []
            for w in targets:
                try:
                    adopted = None
                    if local and self._fetcher.short_circuit and w.host_id == self.host_id:
                        adopted = self._store_local(w, block_id, data, crc)
                    if adopted is not None:
                        crc = adopted
                    else:
                        _, crc = block_client.write_block(w, block_id, data,
                                                          timeout=self.timeout,
                                                          token=self._tokens[block_id])
                        CLIENT_WRITTEN_REMOTE.inc(length)
                    stored.append(w)
                except CurvineError as e:
                    log.info("writing block %016x to worker %d (%s) failed: %s", block_id,
                             w.worker_id, w.address, e)
                    last = e
                    exclude.append(w.worker_id)
            if stored:
                self._fetcher.add_workers({w.worker_id: w for w in stored})
                return Block(block_id=block_id, length=length, checksum=crc or 0,
                             worker_ids=[w.worker_id for w in stored],
                             token=self._tokens[block_id])
        raise last or CurvineError(ErrorKind.IO, "block upload failed")

    def _store_local(self, w: WorkerInfo, block_id: int, data: memoryview,
                     crc: int | None) -> int | None:
        """Write ``data`` into a staging file of worker ``w`` (on this host) and have it
        adopt the file as ``block_id``; returns the crc32, or None when no data dir of
        it is writable from here (the caller streams to it instead).  A disk error or a
        refusal (the worker is full) raises, as a failed stream would."""
        made = block_client.create_local_staging(w, block_id, self._dirs)
        if made is None:
            return None
        fd, path = made
        adopted = False
        try:
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], done)
            if crc is None:
                crc = zlib.crc32(data)
            block_client.adopt_block(w, block_id, path, len(data), crc, timeout=self.timeout,
                                     token=self._tokens[block_id])
            adopted = True
            CLIENT_WRITTEN_SHORT_CIRCUIT.inc(len(data))
            self._local.note([w])
            return crc
        except OSError as e:
            raise CurvineError(ErrorKind.NO_SPACE if e.errno in (errno.ENOSPC, errno.EDQUOT)
                               else ErrorKind.IO, f"staging file {path}: {e.strerror}") from None
        finally:
            os.close(fd)
            if not adopted:
                block_client.unlink_staging(path)
