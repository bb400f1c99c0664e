"""Writing one version of a file.

Every open-for-write gets its own ``FileWriter``: a private version of the file
that nobody else sees until ``publish()`` hands its blocks to the master
(CompleteFile).  Several writers of the same path may work at once; the last to
publish wins and readers never see a mix (consistency rule 1, docs/consistency.md).

The version is an extent map (``extents``) covering [0, size): uploaded blocks,
holes and at most one block being written.  That block is uploaded in the background
when the writes move past it, and synchronously at publish.  A write into an uploaded
block reads it back, modifies it and uploads it later as a new block.

The parts: where the block being written lives (a staging file, memory, memory
streamed to the workers) and when it is placed: ``block_buffers``; storing a buffer on
its workers: ``uploader``; writes queued without blocking (write-behind):
``write_behind``.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, NamedTuple

from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import check_file_size
from curvine.proto import common_pb2

from ..blocks import block_client
from .block_buffers import MemoryBuffer, SmallBuffer, first_buffer, placed_buffer
from .extents import Extent, ExtentMap
from .file_reader import BlockFetcher, join
from .local_worker import LocalWorker
from .uploader import Uploader
from .write_behind import WriteBehind

if TYPE_CHECKING:
    from ..blocks.domain_socket import LocalSockets

__all__ = ["FileWriter", "LocalWorker"]

log = logging.getLogger(__name__)

Block = common_pb2.Block
Inode = common_pb2.Inode
WorkerInfo = common_pb2.WorkerInfo

_ZEROS = memoryview(bytes(1 << 20))  # written by allocate(zero=True), 1 MiB at a time
# A write into a hole stores from here (its offset rounded down to this), not the
# whole block the hole spans: the data path's unit.
SPARSE_GRAIN = 1 << 20


class InlineVersion(NamedTuple):
    """A version taken to publish inline from an event loop (``inline_nowait``)."""

    blocks: list[Block]  # inline blocks and holes
    size: int
    mtime_ns: int
    seen: int  # the writer's change count when taken
    abandoned: list[int]  # the create's block, unused: handed back with this publish


class FileWriter:
    """One version of file ``ino`` being written; thread-safe.

    ``changed``: the version counts as changed from the start (an emptied or new
    file is published at close even without writes).  ``complete``: the CompleteFile
    call of ``publish``, ``complete(ino, blocks, size, mtime_ns=, abandoned=)``
    (None: ``master.complete_file``); ``add_block``: the AddBlock call of uploads
    (None: ``master.add_block``); ``sockets``: the local workers' domain sockets, where
    staging files are adopted when there is one; ``inline_max``: a version of at most
    this many bytes is published inline (its bytes in CompleteFile, kept by the
    master: StatFs ``inline_max``; 0 = never), with no block and no worker;
    ``granted``: a block the file's create placed (``add_block``'s result), taken by the
    first upload instead of an AddBlock, else handed back by the first publish."""

    def __init__(self, master, ino: int, block_size: int, base_blocks: Iterable[Block],
                 host_id: str, *, workers: Mapping[int, WorkerInfo] | None = None,
                 short_circuit: bool = True, timeout: float = 30.0, size_hint: int = 0,
                 local_worker: LocalWorker | None = None,
                 local_dirs: "block_client.LocalDirs | Iterable[str] | None" = None,
                 changed: bool = False, complete: Callable[..., Inode] | None = None,
                 add_block: Callable[..., tuple] | None = None,
                 sockets: "LocalSockets | None" = None, inline_max: int = 0,
                 granted: tuple | None = None):
        self.master = master
        self.ino = ino
        self.block_size = block_size
        self.host_id = host_id
        self.timeout = timeout
        # Where short-circuit reads and staging files may go: this process's own
        # configuration (given, else the local worker's, else the process's).
        if local_dirs is not None:
            dirs = block_client.local_dirs(local_dirs)
        elif local_worker is not None:
            dirs = local_worker.dirs
        else:
            dirs = block_client.local_dirs()
        self._fetcher = BlockFetcher(workers or {}, short_circuit, timeout, local_dirs=dirs,
                                     security=master.security)
        self._complete = complete
        self._lock = threading.RLock()
        # Blocks this version shares with the published one stay readable while this
        # writer's open is recorded at the master (GetBlocks or CompleteFile with an
        # open id): another writer's newer version does not free them until it closes.
        self._extents = ExtentMap(base_blocks)
        # The bytes this writer will store, if the caller knows (0: not known, as for a
        # FUSE writer): then even the first block is placed at its first byte.
        self.size_hint = size_hint
        self.inline_max = min(inline_max, block_size)
        self._uploader = Uploader(master, ino, host_id, self._fetcher,
                                  local_worker or LocalWorker(host_id, dirs), dirs, timeout,
                                  add_block, sockets, granted)
        self._cur: Extent | None = None  # the one buffer being written
        self._uploading: Extent | None = None  # at most one background upload
        # Changes made and changes published: dirty while they differ.  Counted under
        # their own lock, since queued writes are counted without _lock.
        self._change_lock = threading.Lock()
        self._changes = 1 if changed else 0
        self._published_changes = 0
        self.mtime_ns = 0  # explicit mtime to publish with (0 = the master's now)
        self._closed = False
        # _write is looked up at each queued write (a test wraps it)
        self._behind = WriteBehind(self._lock, lambda offset, data: self._write(offset, data),
                                   self._changed, ino)

    @property
    def size(self) -> int:
        return max(self._extents.size, self._behind.end)

    @property
    def dirty(self) -> bool:
        """True while the version has a change that is not published."""
        return self._changes != self._published_changes

    def discard(self) -> None:
        """Forget the unpublished change without publishing it (the file was unlinked
        while being written)."""
        with self._change_lock:
            self._published_changes = self._changes

    def _changed(self) -> None:
        with self._change_lock:
            self._changes += 1
            self.mtime_ns = 0

    # -- public operations ----------------------------------------------------

    def write_behind(self, offset: int, data: bytes) -> bool:
        """Queue a write of ``data`` (immutable bytes) without blocking; False when it
        must go through ``write`` instead (queue full, an error to report, ...)."""
        check_file_size(offset + len(data), self.block_size, "write end")  # now, not at close
        return self._behind.queue(offset, data)

    def write_now(self, offset: int, data: bytes) -> bool:
        """Apply a write in the caller's thread when it is only a copy into memory: the
        block being written is in memory and takes [offset, offset+len) without
        growing past its capacity, nothing is queued before it and the lock is free.
        False (nothing done): use ``write_behind`` or ``write``.  Small random
        writes into a file open O_RDWR land here; a thread hop would cost far more."""
        n = len(data)
        if n == 0 or offset < 0 or not self._lock.acquire(blocking=False):
            return False
        try:
            exts = self._extents
            if self._closed or not self._behind.idle():
                return False
            ext = self._cur if self._cur is not None else self._small_extent_nowait(offset, n)
            buf = ext.buf if ext is not None else None
            if (ext is None or not (type(buf) is MemoryBuffer or type(buf) is SmallBuffer
                                    and offset - ext.start + n <= buf.limit)
                    or not ext.start <= offset <= min(ext.end, exts.size)
                    or offset + n > exts.capacity_end(ext)):
                return False
            exts.write(ext, offset - ext.start, data)
        finally:
            self._lock.release()
        self._changed()
        return True

    def _small_extent_nowait(self, offset: int, n: int) -> Extent | None:
        """For ``write_now`` with no buffer in memory: the extent a write of ``n`` at
        ``offset`` goes to, made the buffer being written here when that is only a copy
        (a file that stays within inline_max and has no block on workers: its inline
        bytes or a hole into memory, or its first buffer); else None."""
        exts = self._extents
        after_hole = offset == exts.size and exts and exts[-1].is_hole
        if (self._uploading is not None or not self.inline_max or offset > exts.size
                or max(offset + n, exts.size) > self.inline_max
                or after_hole and self.size_hint  # a placed block (AddBlock) would come next
                or any(e.buf is None and e.block.block_id for e in exts)):
            return None
        return self._buffer_at(offset)

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        with self._behind.blocking():
            with self._lock:
                self._check_open()
                self._behind.sync()
                n = self._write(offset, data)
                if n:
                    self._changed()
                return n

    def _write(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if offset < 0:
            raise CurvineError(ErrorKind.INVALID, "offset: negative")
        if n == 0:
            return 0
        check_file_size(offset + n, self.block_size, "write end")
        with self._lock:
            self._check_open()
            exts = self._extents
            if offset > exts.size:
                self._grow(offset, for_write=True)
            pos = 0
            while pos < n:
                off = offset + pos
                ext = self._buffer_at(off)
                k = min(n - pos, exts.capacity_end(ext) - off)
                exts.write(ext, off - ext.start, view[pos:pos + k])  # rel <= len: no gap
                pos += k
            return n

    def truncate(self, size: int) -> None:
        if size < 0:
            raise CurvineError(ErrorKind.INVALID, "size: negative")
        with self._lock:
            self._settle()
            exts = self._extents
            if size > exts.size:
                self._grow(size, for_write=False)
            elif size < exts.size:
                ext, dropped = exts.cut(size)
                if self._cur in dropped:
                    self._cur = None
                if ext is not None:
                    self._make_current(ext)
                    exts.truncate(ext, size)
            self._changed()

    def allocate(self, offset: int, length: int, *, zero: bool = False,
                 keep_size: bool = False) -> None:
        """fallocate(2) on this version: ``zero`` makes [offset, offset+length) read as
        zeros (PUNCH_HOLE, ZERO_RANGE: written as zeros); unless ``keep_size`` the file
        grows to cover the range (with holes).  Space is not reserved ahead."""
        if offset < 0 or length <= 0:
            raise CurvineError(ErrorKind.INVALID, "offset or length out of range")
        end = offset + length
        with self._lock:
            self._settle()
            size = self._extents.size
            changed = False
            if zero:
                zend = min(end, size) if keep_size else end
                pos = offset
                while pos < zend:
                    n = min(zend - pos, len(_ZEROS))
                    self._write(pos, _ZEROS[:n])
                    pos += n
                    changed = True
            if not keep_size and end > self._extents.size:
                self._grow(end, for_write=False)
                changed = True
            if changed:
                self._changed()

    def read(self, offset: int, size: int) -> bytes | memoryview:
        """Read this version (what this handle wrote, over its base)."""
        with self._lock:
            self._check_open()
            self._behind.sync()
            exts = self._extents
            end = min(exts.size, offset + size)
            if offset >= end:
                return b""
            parts = []
            i = exts.index(offset)
            while offset < end:
                ext = exts[i]
                n = min(end, ext.end) - offset
                parts.append(self._read_extent(ext, offset - ext.start, n))
                offset += n
                i += 1
            return join(parts)

    def _read_extent(self, ext: Extent, rel: int, n: int) -> bytes | memoryview:
        if ext.buf is not None:
            return ext.buf.read(rel, n)
        data = self._fetcher.read(ext.block, rel, n)
        if len(data) != n:
            raise CurvineError(ErrorKind.IO, f"block {ext.block.block_id:016x}: "
                                             f"read {len(data)} of {n} bytes")
        return data

    def blocks(self) -> list[Block]:
        """Upload what is in memory and return the version's blocks in order."""
        with self._lock:
            self._settle()
            if self._cur is not None and not len(self._cur.buf):
                self._drop_empty(self._cur)
            for ext in self._extents:
                if ext.buf is None and not ext.block.block_id and ext.block.HasField("data"):
                    # a base version's inline bytes: a version stored on workers keeps
                    # none (the master bounds a file's inline bytes by inline_max)
                    ext.buf = MemoryBuffer(self.block_size).write(0, ext.block.data)
                if ext.buf is not None:
                    ext.stored(self._uploader.upload(ext.buf))
                    if ext is self._cur:
                        self._cur = None
            return [e.block for e in self._extents]

    def _inline_version(self) -> list[Block] | None:
        """The version as inline blocks (bytes in Block.data) and holes, if it fits
        ``inline_max`` and every byte is here (in memory, inline already or a hole);
        else None.  The caller holds _lock and has settled the writes."""
        exts = self._extents
        if not self.inline_max or not exts or exts.size > self.inline_max:
            return None
        blocks = []
        for ext in exts:
            if ext.buf is not None:
                n = len(ext.buf)
                if n:
                    blocks.append(Block(block_id=0, length=n, data=bytes(ext.buf.read(0, n))))
            elif ext.block.block_id:
                return None  # on workers: stays there (a file stored before it was small)
            else:
                blocks.append(ext.block)
        return blocks

    def publish(self) -> Inode:
        """Make this version the file's content (CompleteFile); returns the new Inode.

        A version of at most ``inline_max`` bytes goes inline in the call itself (no
        block, no worker); when the master's inline space is full (NO_SPACE) it is
        stored on workers instead, as any other.  The writer then continues from the
        published blocks as its base."""
        with self._lock:
            self._settle()
            inline = self._inline_version()
            if inline is not None:
                try:
                    inode = self._complete_version(inline)
                except CurvineError as e:
                    if e.kind != ErrorKind.NO_SPACE:
                        raise
                    self.no_inline_room(e)
                else:
                    self._stored_inline(inline)
                    return inode
            return self._complete_version(self.blocks())

    def take_granted(self) -> list[int]:
        """The create's block if no upload took it, for a publish made without this
        writer (an empty one) to hand back."""
        return self._uploader.take_granted()

    def no_inline_room(self, e: CurvineError) -> None:
        """The master refused inline bytes (NO_SPACE: master.inline_capacity is
        full): this writer stores every later version on workers."""
        log.info("inode %d: the master keeps no more inline data (%s); storing this file "
                 "on workers", self.ino, e)
        self.inline_max = 0

    def inline_nowait(self) -> InlineVersion | None:
        """The version to publish inline, taken without waiting (the lock free, no
        queued or blocking write, no upload, no block allocated since the last
        publish), for a caller in an event loop that makes the CompleteFile call itself
        and then calls ``inline_published``.  None: publish with ``flush`` from a
        thread."""
        if not self.dirty or not self._lock.acquire(blocking=False):
            return None
        try:
            if (self._closed or self._uploading is not None or self._uploader.allocated
                    or not self._behind.idle()):
                return None
            blocks = self._inline_version()
            if blocks is None:
                return None
            return InlineVersion(blocks, self._extents.size, self.mtime_ns, self._changes,
                                 self._uploader.take_granted())
        finally:
            self._lock.release()

    def inline_published(self, version: InlineVersion) -> None:
        """``version`` (from ``inline_nowait``) is the file's content now.  If nothing
        changed since it was taken, the writer is clean and its buffers give way to the
        inline blocks; otherwise it stays dirty (its later changes are published next).
        Never waits."""
        with self._change_lock:
            if self._changes != version.seen:
                return
            self._published_changes = version.seen
            self.mtime_ns = 0
        if not self._lock.acquire(blocking=False):
            return  # the buffers stay (a thread has the writer): nothing is lost
        try:
            if self._changes == version.seen and not self._closed:  # no change since
                self._stored_inline(version.blocks)
        finally:
            self._lock.release()

    def _stored_inline(self, blocks: list[Block]) -> None:
        """The published inline ``blocks`` (from ``_inline_version``) replace the
        buffers they were copied from."""
        stored = iter(blocks)
        for ext in self._extents:
            block = next(stored) if ext.length else None
            if ext.buf is not None and block is not None:
                ext.stored(block)
        self._cur = None

    def _complete_version(self, blocks: list[Block]) -> Inode:
        """CompleteFile with ``blocks`` (the caller holds _lock)."""
        with self._lock:
            seen = self._changes  # writes queued from here on are not in this version
            published = {b.block_id for b in blocks if b.block_id}
            complete = self._complete or self.master.complete_file
            inode = complete(self.ino, blocks, self._extents.size, mtime_ns=self.mtime_ns,
                             abandoned=self._uploader.abandoned(published))
            self._uploader.forget_allocated()
            with self._change_lock:
                if self._changes == seen:
                    self._published_changes = seen
                    self.mtime_ns = 0
            return inode

    def flush(self) -> Inode | None:
        """Publish if anything changed since the last publish; the new Inode or None."""
        with self._lock:
            return self.publish() if self.dirty else None

    def close(self) -> None:
        """Forget the version (unpublished blocks are the master's to collect)."""
        self._closed = True
        self._behind.close()  # queued writes are dropped
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
            self._extents.clear()
            self._cur = None
            self._fetcher.close()

    def close_nowait(self) -> bool:
        """``close`` when it is only bookkeeping: no other thread holds the writer and no
        buffer is left to release (the usual state after a publish).  False: nothing
        done; call ``close`` from a thread."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if (self._cur is not None or self._uploading is not None
                    or any(ext.buf is not None for ext in self._extents)):
                return False
            if not self._fetcher.close_nowait():
                return False
            self._closed = True
            self._behind.close()
            self._extents.clear()
            return True
        finally:
            self._lock.release()

    # -- the block being written ------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise CurvineError(ErrorKind.STALE, "file handle is closed")

    def _settle(self) -> None:
        """Apply the queued writes and wait for the background upload (the caller
        holds _lock).  A failed upload is no error here: its bytes stay in memory and
        the next publish uploads them again."""
        self._check_open()
        self._behind.sync()
        try:
            self._wait_upload()
        except CurvineError:
            pass

    def _grow(self, size: int, for_write: bool) -> None:
        """Extend the version with zeros to ``size``: holes, or zeros in the buffer."""
        check_file_size(size, self.block_size)
        exts = self._extents
        last = exts[-1] if exts else None
        if (for_write and last is not None and last is self._cur
                and size <= exts.capacity_end(last)):
            exts.zero_extend(last, size)
            return
        exts.add_holes(size, self.block_size)

    def _buffer_at(self, off: int) -> Extent:
        """The in-memory extent that takes a write at ``off`` (<= size)."""
        exts = self._extents
        if off < exts.size:
            i = exts.index(off)
            ext = exts[i]
            if ext.is_hole:
                return self._into_hole(i, off)
        else:  # appending
            ext = exts[-1] if exts else None
            if ext is not None and ext is not self._cur:
                # Re-open a short last block (e.g. after a publish) rather than start
                # a new one after it, so that appends do not fragment the file.
                if ext.is_hole or ext.length >= self.block_size:
                    ext = None
            elif ext is not None and off >= exts.capacity_end(ext):
                ext = None
            if ext is None:
                if off == 0 and (not self.size_hint or self.size_hint <= self.inline_max):
                    # placed once its size is known (memory while it may stay inline)
                    buf = first_buffer(self.block_size, self.inline_max, self._uploader)
                elif off < self.inline_max and not self.size_hint:
                    # after a hole in a file that may stay inline: memory too, placed
                    # only if it outgrows inline_max (no AddBlock for a small file)
                    buf = first_buffer(self.block_size, self.inline_max - off, self._uploader)
                else:
                    hint = min(max(self.size_hint - off, 0), self.block_size)
                    buf = placed_buffer(self.block_size, hint, self._uploader)
                ext = Extent(off, buf=buf)
                exts.append(ext)
                self._switch_to(ext)
                return ext
        self._make_current(ext)
        return ext

    def _into_hole(self, i: int, off: int) -> Extent:
        """The buffer that takes a write at ``off`` inside the hole ``exts[i]``: the
        block before the hole when it ends less than SPARSE_GRAIN before ``off`` and has
        room (the one being written, or a short one brought back into memory: appends
        after a gap do not fragment the file), else a new buffer from ``off`` rounded
        down to SPARSE_GRAIN.  Either grows over the rest of the hole as the writes go
        on, so a write into a hole stores what was written (and at most a grain of
        zeros before it), not a whole block of zeros."""
        exts = self._extents
        hole = exts[i]
        prev = exts[i - 1] if i else None
        if (prev is not None and not prev.is_hole and off - hole.start < SPARSE_GRAIN
                and off < prev.start + self.block_size):
            self._make_current(prev)
            if off < exts.capacity_end(prev):
                exts.zero_fill(prev, off)
                return prev
        at = max(hole.start, off - off % SPARSE_GRAIN)
        ext = Extent(at, buf=MemoryBuffer(self.block_size))
        exts.split_hole(i, at, ext)
        if off > at:
            exts.zero_fill(ext, off)
        self._switch_to(ext)
        return ext

    def _make_current(self, ext: Extent) -> None:
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
        elif ext.buf is None:  # a block on workers, or inline (holes: _into_hole)
            buf = MemoryBuffer(max(self.block_size, ext.block.length))
            try:
                buf.write(0, self._fetcher.read_all(ext.block))
            except BaseException:
                buf.release()
                raise
            ext.buf = buf
            ext.block = None
        self._switch_to(ext)

    def _switch_to(self, ext: Extent) -> None:
        prev, self._cur = self._cur, ext
        if prev is not None:
            self._start_upload(prev)

    def _start_upload(self, ext: Extent) -> None:
        if not len(ext.buf):
            self._drop_empty(ext)
            return
        # One upload in flight per writer bounds its memory to two blocks.
        self._wait_upload()
        ext.upload = self._uploader.upload_later(ext.buf)
        self._uploading = ext

    def _drop_empty(self, ext: Extent) -> None:
        """Forget a buffer nothing was written to (made for a write into a hole that
        then went elsewhere): an empty extent is no block."""
        self._extents.remove(ext)
        ext.buf.release()
        if ext is self._cur:
            self._cur = None

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
        ext.stored(block)
