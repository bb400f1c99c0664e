"""Where the block being written lives: one interface, a buffer kind per place.

A writer writes one block at a time into a ``BlockBuffer`` and then has it stored
(``store``, through the writer's ``uploader.Uploader``).  ``write``, ``zero_extend``
and ``truncate`` return the buffer that holds the block from then on: the same one,
or a memory copy that took over from a staging file, so the writer never asks which
kind it has.

Placement: the first block of a file is placed only when its size is known (at
publish, or once it is full), so that the master reserves what the writer stores (a
14 MiB KV chunk needs 14 MiB free, not a 64 MiB block).  Until then it is written into
an unnamed file (O_TMPFILE) in the staging area of a worker of this host
(``unplaced_buffer``); when the master places the block on a worker of this host on
the same file system, the file gets its staging name there by a link and is adopted
(no copy), otherwise its bytes are copied to the workers chosen; without a known local
worker it is gathered in memory.
Later blocks of a file that outgrew one block are placed at their first byte, with a
whole block reserved (``placed_buffer``): when the master places one on a worker of
this host (short-circuit enabled), the writes go straight into a staging file in that
worker's data dir and "uploading" is one AdoptBlock call; otherwise the block is
gathered in memory and streamed to the workers while it is written.  The crc32 is
computed once, while writing.

The kinds:
- ``StagingFileBuffer``: a staging file of a worker on this host (short-circuit write),
  named (placed) or unnamed (not placed yet); stored by AdoptBlock.
- ``MemoryBuffer``: a mapping from a pool of reused ones; stored by copying it to the
  workers (``Uploader.store``).
- ``StreamedBuffer``: memory whose appends are also streamed to the block's workers,
  so that storing it is only the finish.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import mmap
import os
import threading
from typing import TYPE_CHECKING, Callable, Iterator

from curvine.common.checksum import crc32
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.fds import FdClosed, OwnedFd
from curvine.proto import common_pb2

from ..blocks import block_client
from .file_reader import note_written_file, zeros

if TYPE_CHECKING:  # the buffers call their uploader; it knows them only as Storable
    from .uploader import Uploader

log = logging.getLogger(__name__)

Block = common_pb2.Block
WorkerInfo = common_pb2.WorkerInfo

IDLE_BUFFER_BYTES = 256 << 20  # block buffers kept mapped for reuse, per process
MAX_PIECE = 1 << 20


class _BufferPool:
    """Anonymous mappings of block size, reused: pages that are already faulted in
    take a copy ~10x faster than fresh ones (docs/measurements.md), and a mapping only
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


class BlockBuffer(abc.ABC):
    """The bytes [0, len) of a block being written, at most ``capacity`` of them.

    A change returns the buffer that holds the block from then on (this one, or a
    memory copy that took over); the caller keeps that one."""

    __slots__ = ()

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @property
    @abc.abstractmethod
    def capacity(self) -> int: ...

    @abc.abstractmethod
    def read(self, rel: int, n: int) -> bytes | memoryview: ...

    @abc.abstractmethod
    def write(self, rel: int, data) -> BlockBuffer:
        """Write ``data`` at ``rel`` (<= len: no gap)."""

    @abc.abstractmethod
    def zero_extend(self, size: int) -> BlockBuffer:
        """Grow to ``size`` bytes with zeros."""

    @abc.abstractmethod
    def truncate(self, size: int) -> BlockBuffer:
        """Shrink to ``size`` bytes."""

    @abc.abstractmethod
    def store(self, uploader: Uploader) -> Block:
        """Store the bytes as a new block on the workers; the buffer stays valid (a
        failed store is tried again later)."""

    @abc.abstractmethod
    def release(self) -> None:
        """Give back what the buffer holds (memory, a staging file, streams)."""


class MemoryBuffer(BlockBuffer):
    """A block's bytes in memory: a mapping of block size and a fill length.
    Bytes past the length are garbage; growing always writes them."""

    __slots__ = ("_mem", "_len", "_alloc", "_crc", "_crc_len", "_staging_failed")

    def __init__(self, capacity: int, *, alloc=None, checksum: bool = False,
                 staging_failed: bool = False):
        self._mem = _buffers.get(capacity)
        self._len = 0
        self._alloc = alloc  # (block id, targets) from the master, if allocated already
        # crc32 of [0, crc_len) kept while the writes append (``checksum``), for a
        # short-circuit store at upload; None once a write does not append
        self._crc: int | None = 0 if checksum else None
        self._crc_len = 0
        self._staging_failed = staging_failed  # a copy of a staging file that failed: stream it

    def __len__(self) -> int:
        return self._len

    @property
    def capacity(self) -> int:
        return len(self._mem)

    def write(self, rel: int, data) -> MemoryBuffer:
        n = len(data)
        self._mem[rel:rel + n] = data
        if self._crc is not None:
            if rel == self._crc_len:
                self._crc = crc32(data, self._crc)
                self._crc_len += n
            else:
                self._crc = None
        if rel + n > self._len:
            self._len = rel + n
        return self

    def zero_extend(self, size: int) -> MemoryBuffer:
        while self._len < size:
            n = min(size - self._len, MAX_PIECE)
            self.write(self._len, zeros(n))
        return self

    def truncate(self, size: int) -> MemoryBuffer:
        self._len = min(self._len, size)
        if self._crc is not None and self._crc_len > self._len:
            self._crc = None
        return self

    def checksum(self) -> int | None:
        """crc32 of the buffer if it was kept while writing, else None."""
        if self._crc is None or self._crc_len != self._len:
            return None
        return self._crc

    def read(self, rel: int, n: int) -> bytes:
        return self._mem[rel:min(rel + n, self._len)]

    def view(self) -> memoryview:
        return memoryview(self._mem)[:self._len]

    def store(self, uploader: Uploader) -> Block:
        alloc, self._alloc = self._alloc, None  # a block id is written once
        return uploader.store(self.view(), alloc=alloc, crc=self.checksum(),
                              local=not self._staging_failed)

    def release(self) -> None:
        if self._mem is not None:
            mem, self._mem = self._mem, None
            _buffers.put(mem)


class StreamedBuffer(MemoryBuffer):
    """A block in memory whose appends are also sent to its workers as they come
    (one WriteBlock stream per target), so that storing it is only the finish.

    Streaming is a state that only ends: a stream that fails is dropped, and a
    change to bytes already sent (an overwrite, a truncate) ends all of them.  Once
    no stream is left (``streaming`` is False) the block is stored as a whole under a
    new block id, avoiding the workers whose stream failed."""

    __slots__ = ("_streams", "_failed")

    def __init__(self, capacity: int, uploader: Uploader, block_id: int,
                 targets: list[WorkerInfo]):
        super().__init__(capacity)
        self._streams, self._failed = uploader.open_streams(block_id, targets)

    @property
    def streaming(self) -> bool:
        return bool(self._streams)

    def write(self, rel: int, data) -> MemoryBuffer:
        if self.streaming and rel == len(self):
            super().write(rel, data)
            self._send(data)
            return self
        self._end_streaming()  # rewrites bytes already sent
        return super().write(rel, data)

    def zero_extend(self, size: int) -> MemoryBuffer:
        if self.streaming and size > len(self):
            n = size - len(self)
            super().zero_extend(size)
            while n > 0:
                k = min(n, MAX_PIECE)
                self._send(zeros(k))
                n -= k
            return self
        self._end_streaming()
        return super().zero_extend(size)

    def truncate(self, size: int) -> MemoryBuffer:
        self._end_streaming()
        return super().truncate(size)

    def _send(self, data) -> None:
        """Hand appended bytes to the block's streams; a stream that fails is dropped
        (the upload then sends the whole block to another worker)."""
        for st in list(self._streams):
            try:
                st.send(data)
            except CurvineError as e:
                log.info("streaming block %016x to worker %d (%s) failed: %s", st.block_id,
                         st.worker.worker_id, st.worker.address, e)
                st.cancel()
                self._streams.remove(st)
                self._failed.append(st.worker.worker_id)

    def _end_streaming(self) -> None:
        for st in self._streams:
            st.cancel()
        self._streams = []

    def store(self, uploader: Uploader) -> Block:
        if self.streaming:
            # Streamed while written: only the tail and the finish are left.
            streams, self._streams = self._streams, []
            block, failed = uploader.finish_streams(streams, len(self))
            self._failed.extend(failed)
            if block is not None:
                return block
        return uploader.store(self.view(), exclude=self._failed)

    def release(self) -> None:
        self._end_streaming()
        super().release()


class StagingFileBuffer(BlockBuffer):
    """A block being written straight into a staging file of a worker on this host
    (short-circuit write).

    The block id and targets are allocated before the first byte, or (an unnamed
    file, block id 0) once the length is known, at ``store``.  The crc32 is kept up to
    date while the writes append; any other change recomputes it at upload.  Once
    handed to the worker (``sealed``) the file is never written again: a change goes
    to a memory copy of it, as it does when the file fails (disk full, I/O error)."""

    def __init__(self, capacity: int, fd: int, path: str, block_id: int,
                 worker: WorkerInfo, others: list, data_dir: str = ""):
        self._capacity = capacity
        # owned here, borrowed by every use: the writer's thread and an upload's may
        # both hold the buffer, and release() must not pull the number from a use
        self._fd = OwnedFd(fd, f"staging file {path or 'O_TMPFILE in ' + data_dir}")
        # "" (and block_id 0): an unnamed file in data_dir, the block not placed yet
        self.path = path
        self.data_dir = data_dir
        self.alloc = None  # (block id, targets) when placed on other workers
        self.block_id = block_id
        self.worker = worker  # the local worker that adopts the file
        self.others = others  # further replicas, streamed from the file
        self._len = 0
        self.sealed = False  # handed to the worker (or about to be)
        self.adopt_tried = False
        self.adopted = False
        # crc32 of [0, _crc_len), summed as the writes append (ISA-L: ~18 us per MiB,
        # less than handing the pieces to another thread)
        self._crc = 0
        self._crc_len = 0  # bytes covered by _crc; -1 once invalid

    def __len__(self) -> int:
        return self._len

    @property
    def capacity(self) -> int:
        return self._capacity

    def write(self, rel: int, data) -> BlockBuffer:
        return self._change(lambda: self._write_file(rel, data),
                            lambda mem: mem.write(rel, data))

    def zero_extend(self, size: int) -> BlockBuffer:
        return self._change(lambda: self._extend_file(size),
                            lambda mem: mem.zero_extend(size))

    def truncate(self, size: int) -> BlockBuffer:
        return self._change(lambda: self._truncate_file(size),
                            lambda mem: mem.truncate(size))

    def _change(self, in_file: Callable[[], None],
                in_memory: Callable[[MemoryBuffer], BlockBuffer]) -> BlockBuffer:
        """``in_file()``, or ``in_memory`` on a memory copy of the file when it was
        handed to the worker already or fails (disk full, I/O error: the block is then
        streamed to a worker at upload)."""
        if self.sealed:
            return in_memory(self._to_memory())
        try:
            in_file()
        except OSError as e:
            log.info("staging file %s failed (%s); continuing in memory", self.path, e)
            return in_memory(self._to_memory())
        return self

    def _write_file(self, rel: int, data) -> None:
        n = len(data)
        view = memoryview(data)
        done = 0
        with self._file() as fd:
            while done < n:
                done += os.pwrite(fd, view[done:], rel + done)
        if rel == self._crc_len:
            self._crc = crc32(view, self._crc)
            self._crc_len += n
        elif self._crc_len >= 0:
            self._crc_len = -1  # an overwrite or a gap: recompute at upload
        if rel + n > self._len:
            self._len = rel + n

    def _extend_file(self, size: int) -> None:
        if size > self._len:
            with self._file() as fd:
                os.ftruncate(fd, size)
            self._len = size

    def _truncate_file(self, size: int) -> None:
        if size < self._len:
            with self._file() as fd:
                os.ftruncate(fd, size)
            self._len = size
            if self._crc_len > size:
                self._crc_len = -1

    def _to_memory(self) -> MemoryBuffer:
        """A memory copy of the file to continue the block in; the file is dropped
        (unless the worker adopted it).  The copy keeps the block id for the other
        targets, if any."""
        others = [w for w in self.others if w.worker_id != self.worker.worker_id]
        alloc = (self.block_id, others) if others and not self.adopt_tried else None
        mem = MemoryBuffer(max(self._capacity, len(self)), alloc=alloc,
                           staging_failed=not self.sealed)
        try:
            pos = 0
            while pos < len(self):
                piece = self.read(pos, MAX_PIECE)
                mem.write(pos, piece)
                pos += len(piece)
        except BaseException:
            mem.release()
            raise
        self.release()
        return mem

    def read(self, rel: int, n: int) -> bytes:
        n = min(rel + n, self._len) - rel
        if n <= 0:
            return b""
        with self._file() as fd:
            data = os.pread(fd, n, rel)
        if len(data) != n:
            raise CurvineError(ErrorKind.IO, f"staging file {self.path}: read {len(data)} "
                                             f"of {n} bytes")
        return data

    def checksum(self) -> int:
        if self._crc_len == self._len:
            return self._crc
        crc, pos = 0, 0
        while pos < self._len:
            piece = self.read(pos, min(MAX_PIECE, self._len - pos))
            crc = crc32(piece, crc)
            pos += len(piece)
        return crc

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[memoryview]:
        """A memoryview of the file's bytes (mapped read-only) for a block."""
        with self._file() as fd:  # the mapping keeps its own reference to the file
            mapping = mmap.mmap(fd, self._len, prot=mmap.PROT_READ) if self._len else None
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

    def store(self, uploader: Uploader) -> Block:
        """Hand the file to the local worker (AdoptBlock), stream it to the other
        replicas; if the worker refuses it, stream it as a new block instead."""
        self.sealed = True
        length = len(self)
        crc = self.checksum()
        if not self.block_id and not self._place(uploader, length):
            # placed where this file cannot be linked: copy its bytes there
            with self._mapped() as data:
                return uploader.store(data, alloc=self.alloc, crc=crc)
        if not self.adopt_tried:
            self.adopt_tried = True
            try:
                uploader.adopt(self.worker, self.block_id, self.path, length, crc)
                self.adopted = True
                with self._file() as fd:  # the block's file now, after the worker's rename
                    note_written_file(self.block_id, crc, fd)
            except CurvineError as e:
                log.info("worker %d (%s) did not adopt block %016x: %s; streaming it",
                         self.worker.worker_id, self.worker.address, self.block_id, e)
        with self._mapped() as data:
            if not self.adopted:
                return uploader.store(data, exclude=[self.worker.worker_id])
            stored = [self.worker] + uploader.replicate(self.block_id, data, self.others)
        return uploader.stored_block(self.block_id, length, crc, stored)

    def _place(self, uploader: Uploader, length: int) -> bool:
        """Place the block of an unnamed file, now that its length is known: True when
        the master put it on a worker of this host whose staging area is on the same
        file system (the file is then linked there under its staging name, with the
        block id and the other targets), else False with ``alloc`` = (block id,
        targets) to copy it to."""
        block_id, targets = uploader.allocate(length)
        for w in targets:
            if w.host_id != uploader.host_id:
                continue
            # into a trusted data dir of w on the file's file system (a link works
            # within one only), else None
            with self._file() as fd:
                path = block_client.name_local_tmpfile(fd, w, block_id, uploader.dirs)
            if path is not None:
                self.path = path
                self.block_id, self.worker = block_id, w
                self.others = [t for t in targets if t is not w]
                return True
        self.alloc = (block_id, targets)
        return False

    @contextlib.contextmanager
    def _file(self) -> Iterator[int]:
        """The staging file's descriptor for one use; STALE once released (the writer
        let the buffer go: a use after that is the writer's bug, not the disk's)."""
        try:
            with self._fd.borrow() as fd:
                yield fd
        except FdClosed:
            raise CurvineError(ErrorKind.STALE, "the staging file was released") from None

    def release(self) -> None:
        if self._fd.closed:
            return
        if not self.adopted and self.path:
            block_client.unlink_staging(self.path)
        self._fd.close()  # also drops the flock (once no use holds it)


def unplaced_buffer(capacity: int, uploader: Uploader) -> BlockBuffer:
    """The first block, before its size is known: an unnamed file in the staging area
    of this host's worker, else memory (see the module docstring)."""
    w = uploader.local.info if uploader.short_circuit else None
    made = block_client.create_local_tmpfile(w, uploader.dirs) if w is not None else None
    if made is None:
        return MemoryBuffer(capacity, checksum=True)
    fd, data_dir = made
    return StagingFileBuffer(capacity, fd, "", 0, w, [], data_dir=data_dir)


class SmallBuffer(MemoryBuffer):
    """The first block of a version while the file may still be published inline
    (at most ``limit`` bytes, master.inline_max: its bytes go in CompleteFile): memory,
    no staging file.  A change that takes it past ``limit`` moves its bytes to the
    buffer the block would have had otherwise (``unplaced_buffer``)."""

    __slots__ = ("limit", "_uploader")

    def __init__(self, capacity: int, limit: int, uploader: Uploader):
        super().__init__(capacity, checksum=True)
        self.limit = limit
        self._uploader = uploader

    def write(self, rel: int, data) -> BlockBuffer:
        if rel + len(data) > self.limit:
            return self._outgrown().write(rel, data)
        return super().write(rel, data)

    def zero_extend(self, size: int) -> BlockBuffer:
        if size > self.limit:
            return self._outgrown().zero_extend(size)
        return super().zero_extend(size)

    def _outgrown(self) -> BlockBuffer:
        buf = unplaced_buffer(self.capacity, self._uploader)
        try:
            if len(self):
                buf = buf.write(0, self.view())
        except BaseException:
            buf.release()
            raise
        self.release()
        return buf


def first_buffer(capacity: int, inline_max: int, uploader: Uploader) -> BlockBuffer:
    """The first block of a version, before its size is known: memory while it may
    stay inline (``inline_max``: master.inline_max, 0 = never), else
    ``unplaced_buffer``."""
    if inline_max:
        return SmallBuffer(capacity, inline_max, uploader)
    return unplaced_buffer(capacity, uploader)


def placed_buffer(capacity: int, size_hint: int, uploader: Uploader) -> BlockBuffer:
    """A buffer for a new block (``size_hint`` bytes expected, 0 = a whole block): a
    staging file of the local worker when the master places the block there, else
    memory streamed to the workers while written."""
    try:
        block_id, targets = uploader.allocate(size_hint)
    except CurvineError as e:
        # E.g. the file was unlinked or replaced meanwhile, or no worker has room:
        # writes go on in memory and publishing reports it (as without this path).
        log.debug("no block for inode %d yet (%s); writing to memory", uploader.ino, e)
        return MemoryBuffer(capacity)
    if not targets:
        return MemoryBuffer(capacity)
    uploader.local.note(targets)
    if uploader.short_circuit:
        for i, w in enumerate(targets):
            if w.host_id != uploader.host_id:
                continue
            made = block_client.create_local_staging(w, block_id, uploader.dirs)
            if made is not None:
                fd, path = made
                return StagingFileBuffer(capacity, fd, path, block_id, w,
                                         [t for j, t in enumerate(targets) if j != i])
    return StreamedBuffer(capacity, uploader, block_id, list(targets))
