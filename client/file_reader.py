"""Reading one published version of a file: its blocks, fetched once at open.

A block stored by a worker on this host is read straight from its file
(short-circuit).  The file is opened once and the descriptor kept: an open
descriptor keeps reading the bytes it opened even if the block is deleted later
(DESIGN consistency rule 4).  The kernel is told to read local block files ahead
(POSIX_FADV_WILLNEED: the first PREFETCH_BYTES at open, then the next block when a
read reaches one), and ``read_cached`` serves a read without blocking when its bytes
are in the page cache already (preadv2 RWF_NOWAIT), so the FUSE loop can answer it
without a thread hop.  Other blocks are streamed from a worker with
readahead; a sequential reader continues its stream, a jump restarts it, and any
worker error fails over to another replica.

Thread-safe: FUSE issues several reads of one handle at once, possibly slightly out
of order (kernel readahead), which the stream absorbs with a small window of chunks
kept behind and fetched ahead of its position.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
import zlib
from typing import Iterable, Mapping

from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import MIB, host_id
from curvine.common.metrics import CLIENT_READ_REMOTE, CLIENT_READ_SHORT_CIRCUIT
from curvine.proto import common_pb2

from . import block_client
from .pools import LazyExecutor

log = logging.getLogger(__name__)

Block = common_pb2.Block
WorkerInfo = common_pb2.WorkerInfo

_ZEROS = bytes(MIB)
MAX_LOCAL_FDS = 256  # local block files opened eagerly per reader; later ones lazily
MAX_STREAMS = 4  # remote streams kept open per reader (sequential runs being followed)
PREFETCH_BYTES = 64 * MIB  # local block bytes the kernel is asked to read ahead at open
# A stream left unread this long that then fails was most likely cut by its worker
# (worker.stream_idle_timeout), not broken: the worker is not marked bad for it.
QUIET_STREAM = 5.0
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)


# threads that start readahead for callers that must not block (the FUSE loop)
_ahead_pool = LazyExecutor(4, "readahead")


def zeros(n: int) -> bytes | memoryview:
    return memoryview(_ZEROS)[:n] if n <= MIB else bytes(n)


def join(parts: list) -> bytes | memoryview:
    if not parts:
        return b""
    if len(parts) == 1:
        return parts[0]
    return b"".join(parts)


class _Stream:
    """A remote ReadBlock stream of one block plus a window of recent chunks."""

    def __init__(self, block: Block, worker: WorkerInfo, offset: int, timeout: float,
                 readahead: int):
        self.block = block
        self.worker = worker
        self.reader = block_client.BlockReader(worker, block.block_id, offset, 0,
                                               timeout=timeout, readahead=readahead,
                                               token=block.token)
        self.it = iter(self.reader)
        self.pos = offset  # block offset of the next byte the stream will deliver
        self.chunks: list[tuple[int, bytes]] = []  # contiguous, ending at pos
        self.lock = threading.Lock()  # held while reading from the stream
        self.closed = False
        self.used = time.monotonic()  # when a chunk was last taken

    @property
    def start(self) -> int:
        return self.chunks[0][0] if self.chunks else self.pos

    def covers(self, block_id: int, offset: int, window: int) -> bool:
        return (not self.closed and self.block.block_id == block_id
                and self.start <= offset <= self.pos + window)

    def close(self) -> None:
        self.closed = True
        self.reader.close()

    def pull(self, keep_behind: int) -> bool:
        """Receive the next chunk; False at the end of the block."""
        try:
            data = next(self.it)
        except StopIteration:
            return False
        return self._keep(data, keep_behind)

    def pull_nowait(self, keep_behind: int) -> bool:
        """Take the next chunk if it has arrived; False if not (or at the end)."""
        poll = getattr(self.reader, "poll", None)
        return self._keep(poll(), keep_behind) if poll is not None else False

    def _keep(self, data, keep_behind: int) -> bool:
        if not data:
            return False
        self.chunks.append((self.pos, data))
        self.pos += len(data)
        self.used = time.monotonic()
        while self.chunks and self.chunks[0][0] + len(self.chunks[0][1]) < self.pos - keep_behind:
            self.chunks.pop(0)
        return True

    def slice(self, offset: int, end: int) -> bytes | memoryview:
        """[offset, end) from the kept chunks (the caller checked they cover it)."""
        starts = [c[0] for c in self.chunks]
        i = bisect.bisect_right(starts, offset) - 1
        parts = []
        while offset < end and i < len(self.chunks):
            cstart, data = self.chunks[i]
            lo = offset - cstart
            hi = min(len(data), end - cstart)
            if lo == 0 and hi == len(data):
                parts.append(data)
            else:
                parts.append(memoryview(data)[lo:hi])
            offset = cstart + hi
            i += 1
        return join(parts)


class BlockFetcher:
    """Reads byte ranges of immutable blocks from local files or worker streams."""

    def __init__(self, workers: Mapping[int, WorkerInfo], short_circuit: bool = True,
                 timeout: float = 30.0, readahead: int = block_client.DEFAULT_READAHEAD):
        self.workers: dict[int, WorkerInfo] = dict(workers)
        self.short_circuit = short_circuit
        self.timeout = timeout
        self.readahead = max(1, readahead)
        self._host = host_id()
        self._lock = threading.Lock()
        self._open_lock = threading.Lock()
        self._fds: dict[int, int] = {}  # block id -> descriptor of its local file
        self._no_local: set[int] = set()
        self._prefetched: set[int] = set()  # blocks whose local file was advised WILLNEED
        self._stream_prefetched: set[int] = set()  # remote blocks streamed ahead of reads
        self._streams: list[_Stream] = []  # least recently used first
        self._bad_workers: set[int] = set()
        self._closed = False

    def add_workers(self, workers: Mapping[int, WorkerInfo]) -> None:
        with self._lock:
            self.workers.update(workers)

    # -- short-circuit --------------------------------------------------------

    def open_local(self, block: Block) -> int | None:
        """The descriptor of the block's local file, opened once; None if not local."""
        bid = block.block_id
        with self._lock:
            fd = self._fds.get(bid)
            if fd is not None or bid in self._no_local or not self.short_circuit or self._closed:
                return fd
        fd = None
        for wid in block.worker_ids:
            w = self.workers.get(wid)
            if w is None or w.host_id != self._host:
                continue
            path = block_client.local_block_path(w, bid)
            if path is None:
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                break
            except OSError as e:
                log.debug("short-circuit open of %s failed: %s", path, e)
        with self._lock:
            if fd is None:
                self._no_local.add(bid)
                return None
            if self._closed or bid in self._fds:
                os.close(fd)
                return self._fds.get(bid)
            self._fds[bid] = fd
            return fd

    def local_fd(self, block: Block) -> int | None:
        """The descriptor of the block's local file if it is open already (no I/O)."""
        return self._fds.get(block.block_id)

    def prefetch(self, block: Block) -> None:
        """Ask the kernel to read the block's local file ahead (once per block)."""
        fd = self.open_local(block) if self.short_circuit else None
        if fd is None:
            return
        with self._lock:
            if block.block_id in self._prefetched:
                return
            self._prefetched.add(block.block_id)
        try:
            os.posix_fadvise(fd, 0, block.length, os.POSIX_FADV_WILLNEED)
        except OSError as e:  # closed meanwhile, or a file system without readahead
            log.debug("readahead advice for block %016x failed: %s", block.block_id, e)

    # -- reads ----------------------------------------------------------------

    def read(self, block: Block, offset: int, size: int) -> bytes | memoryview:
        """Up to ``size`` bytes at ``offset`` of ``block`` (short only at its end)."""
        size = max(0, min(size, block.length - offset))
        if size == 0:
            return b""
        if block.block_id == 0:
            return zeros(size)
        if self.short_circuit:
            fd = self.open_local(block)
            if fd is not None:
                try:
                    data = os.pread(fd, size, offset)
                except OSError as e:  # a failing disk: another replica may be fine
                    log.warning("reading the local file of block %016x failed (%s); "
                                "reading remotely", block.block_id, e)
                    data = b""
                if len(data) == size:
                    CLIENT_READ_SHORT_CIRCUIT.inc(size)
                    return data
                log.warning("local file of block %016x is short (%d of %d bytes at %d); "
                            "reading remotely", block.block_id, len(data), size, offset)
        data = self._read_remote(block, offset, size)
        CLIENT_READ_REMOTE.inc(len(data))
        return data

    def read_all(self, block: Block) -> bytes | memoryview:
        """The whole block (used to modify it into a new one)."""
        if block.block_id == 0:
            return bytes(block.length)
        if self.short_circuit:
            fd = self.open_local(block)
            if fd is not None:
                try:
                    data = os.pread(fd, block.length, 0)
                except OSError as e:
                    log.warning("reading the local file of block %016x failed: %s",
                                block.block_id, e)
                    data = b""
                if len(data) == block.length and self._intact(block, data):
                    CLIENT_READ_SHORT_CIRCUIT.inc(len(data))
                    return data
        last: CurvineError | None = None
        for w in self._candidates(block):
            try:
                data = block_client.read_block(w, block.block_id, 0, block.length,
                                               timeout=self.timeout, token=block.token)
                if not self._intact(block, data):
                    raise CurvineError(ErrorKind.CHECKSUM, f"worker {w.address}: block "
                                       f"{block.block_id:016x} does not match its crc32")
                CLIENT_READ_REMOTE.inc(len(data))
                return data
            except CurvineError as e:
                last = e
                self._mark_bad(w, block, e)
        raise self._no_replica(block, last)

    @staticmethod
    def _intact(block: Block, data) -> bool:
        """A whole block against the crc32 recorded at publish (0: not known, e.g. a
        truncated block)."""
        return not block.checksum or zlib.crc32(data) == block.checksum

    def _candidates(self, block: Block) -> list[WorkerInfo]:
        """Replicas to try: local first, known-bad workers last."""
        with self._lock:
            ws = [self.workers[w] for w in block.worker_ids if w in self.workers]
            bad = set(self._bad_workers)
        ws.sort(key=lambda w: (w.worker_id in bad, w.lost, w.host_id != self._host))
        return ws

    def _mark_bad(self, w: WorkerInfo, block: Block, e: CurvineError) -> None:
        log.info("reading block %016x from worker %d (%s) failed: %s", block.block_id,
                 w.worker_id, w.address, e)
        with self._lock:
            self._bad_workers.add(w.worker_id)

    def _no_replica(self, block: Block, last: CurvineError | None) -> CurvineError:
        if last is None:
            return CurvineError(ErrorKind.IO, f"block {block.block_id:016x}: no worker "
                                              f"holds a replica")
        # A block deleted under an open reader (unlink, eviction) is a stale handle,
        # not a missing name.
        kind = ErrorKind.STALE if last.kind == ErrorKind.NOT_FOUND else last.kind
        return CurvineError(kind, f"block {block.block_id:016x}: no replica "
                                  f"readable: {last.message}")

    def _stream_at(self, block: Block, offset: int, window: int,
                   avoid: set[int]) -> _Stream:
        """A stream of ``block`` whose window holds ``offset``, else a new one there
        (from a replica not in ``avoid`` if possible)."""
        if self._closed:
            raise CurvineError(ErrorKind.STALE, "the file handle is closed")
        s = self._find_stream(block, offset, window)
        if s is not None:
            return s
        with self._open_lock:  # threads arriving together share one new stream
            s = self._find_stream(block, offset, window)
            if s is not None:
                return s
            return self._open_stream(block, offset, avoid)

    def _find_stream(self, block: Block, offset: int, window: int) -> _Stream | None:
        with self._lock:
            for s in reversed(self._streams):
                if s.covers(block.block_id, offset, window):
                    self._streams.remove(s)
                    self._streams.append(s)
                    return s
        return None

    def _open_stream(self, block: Block, offset: int, avoid: set[int]) -> _Stream:
        evicted = []
        last: CurvineError | None = None
        candidates = self._candidates(block)
        candidates.sort(key=lambda w: w.worker_id in avoid)
        for w in candidates:
            try:
                s = _Stream(block, w, offset, self.timeout, self.readahead)
            except CurvineError as e:
                last = e
                self._mark_bad(w, block, e)
                continue
            with self._lock:
                self._streams.append(s)
                while len(self._streams) > MAX_STREAMS:
                    evicted.append(self._streams.pop(0))
            # Another thread may be reading an evicted stream: close it when done.
            for old in evicted:
                with old.lock:
                    old.close()
            return s
        raise self._no_replica(block, last)

    def read_nowait(self, block: Block, offset: int, size: int) -> bytes | memoryview | None:
        """[offset, offset+size) of a remote block if a stream of it has received those
        bytes already; None otherwise (never blocks, never opens a stream)."""
        end = offset + size
        if self._closed or end > block.length:
            return None
        window = self.readahead * MIB
        s = self._find_stream(block, offset, window)
        if s is None or not s.lock.acquire(blocking=False):
            return None
        try:
            if not s.covers(block.block_id, offset, window):
                return None
            while s.pos < end:
                if not s.pull_nowait(keep_behind=window + size):
                    return None
            CLIENT_READ_REMOTE.inc(size)
            return s.slice(offset, end)
        finally:
            s.lock.release()

    def prefetch_stream(self, block: Block) -> None:
        """Start streaming a remote block from its beginning (readahead across blocks),
        unless a stream of it exists; failures are left to the read that needs it."""
        if self._closed or block.block_id == 0 or self.local_fd(block) is not None:
            return
        with self._lock:
            if (block.block_id in self._stream_prefetched
                    or any(x.block.block_id == block.block_id for x in self._streams)):
                return
            self._stream_prefetched.add(block.block_id)
        if not self._open_lock.acquire(blocking=False):
            return  # another thread is opening a stream: do not wait for it
        try:
            if self._find_stream(block, 0, 0) is None:
                self._open_stream(block, 0, set())
        except CurvineError as e:
            log.debug("prefetching block %016x failed: %s", block.block_id, e)
        finally:
            self._open_lock.release()

    def _drop_stream(self, s: _Stream) -> None:
        s.close()
        with self._lock:
            if s in self._streams:
                self._streams.remove(s)

    def _read_remote(self, block: Block, offset: int, size: int) -> bytes | memoryview:
        end = offset + size
        window = self.readahead * MIB
        failed: set[int] = set()
        attempts = 0
        while True:
            s = self._stream_at(block, offset, window, failed)
            with s.lock:
                if not s.covers(block.block_id, offset, window):
                    continue  # moved on (or closed) while this thread waited
                quiet = time.monotonic() - s.used
                try:
                    while s.pos < end:
                        if not s.pull(keep_behind=window + size):
                            break
                    if s.closed:
                        continue  # evicted mid-read: not the worker's fault
                    if s.pos < end:
                        raise CurvineError(ErrorKind.IO, f"worker {s.worker.address}: block "
                                           f"{block.block_id:016x} ended at {s.pos}, "
                                           f"expected {block.length} bytes")
                    return s.slice(offset, end)
                except CurvineError as e:
                    self._drop_stream(s)
                    failed.add(s.worker.worker_id)
                    if quiet < QUIET_STREAM:
                        self._mark_bad(s.worker, block, e)
                    else:
                        log.info("stream of block %016x from worker %d, unread for %.0fs, "
                                 "ended: %s; reading on from another", block.block_id,
                                 s.worker.worker_id, quiet, e)
                    attempts += 1
                    # Every replica once, plus one more try (a transient failure).
                    if attempts > len(block.worker_ids):
                        raise self._no_replica(block, e) from None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            fds = list(self._fds.values())
            self._fds.clear()
            streams = list(self._streams)
            self._streams.clear()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        for s in streams:
            s.close()


class FileReader:
    """Reads one version of a file: ``read(offset, size)`` from any thread."""

    def __init__(self, blocks: Iterable[Block], workers: Mapping[int, WorkerInfo],
                 short_circuit: bool = True, timeout: float = 30.0,
                 readahead: int = block_client.DEFAULT_READAHEAD):
        self.blocks = list(blocks)
        self._starts = []
        pos = 0
        for b in self.blocks:
            self._starts.append(pos)
            pos += b.length
        self.size = pos
        self._fetcher = BlockFetcher(workers, short_circuit, timeout, readahead)
        self._ahead_done: set[int] = set()  # next blocks already asked for (_ahead)
        if short_circuit:
            # Open local block files now, so that an unlink or eviction after open()
            # cannot take the data away from this reader.
            for b in self.blocks[:MAX_LOCAL_FDS]:
                if b.block_id:
                    self._fetcher.open_local(b)
            # Cold data: have the kernel start reading the first blocks now.
            for b, start in zip(self.blocks, self._starts):
                if start >= PREFETCH_BYTES:
                    break
                if b.block_id:
                    self._fetcher.prefetch(b)
        # A remote first block: start its stream now, so that the first read does not
        # wait for the call to be set up (the open reply and the kernel's first read
        # request overlap with it).
        first = next((b for b in self.blocks if b.block_id), None)
        if first is not None and self._fetcher.local_fd(first) is None:
            self._fetcher.prefetch_stream(first)

    def read_cached(self, offset: int, size: int, out: bytearray) -> memoryview | None:
        """[offset, offset+size) without blocking, or None.

        Served from a local block file this reader has open when every byte is in the
        page cache (RWF_NOWAIT, into ``out``: the caller uses the view before the next
        call), or from the chunks a remote block's stream has received already.
        Anything else (cold data, a read across blocks, a stream not there yet) is
        None: use ``read`` from a thread."""
        if not _NOWAIT or size <= 0 or offset >= self.size:
            return None
        end = min(self.size, offset + size)
        i = bisect.bisect_right(self._starts, offset) - 1
        b, start = self.blocks[i], self._starts[i]
        if end > start + b.length or not b.block_id:
            return None
        fd = self._fetcher.local_fd(b)
        n = end - offset
        if fd is None:  # a remote block: from what its stream has received already
            data = self._fetcher.read_nowait(b, offset - start, n)
            if data is not None:
                self._ahead(i, end - start, background=True)
            return data
        if len(out) < n:
            return None
        view = memoryview(out)[:n]
        try:
            got = os.preadv(fd, [view], offset - start, _NOWAIT)
        except OSError:  # EAGAIN: not cached; anything else: the thread path reports it
            return None
        if got != n:
            return None
        CLIENT_READ_SHORT_CIRCUIT.inc(n)
        self._ahead(i, end - start, background=True)
        return view

    def _ahead(self, i: int, reached: int, background: bool) -> None:
        """A read reached ``reached`` bytes into block ``i``: get the next block coming
        (local: kernel readahead of its file; remote: its stream, once past the middle
        of this one), at most once per block.  ``background``: from a thread, for
        callers that must not block."""
        if i + 1 >= len(self.blocks) or not self.blocks[i + 1].block_id:
            return
        nxt = self.blocks[i + 1]
        local = self._fetcher.local_fd(nxt) is not None
        if not local and reached <= self.blocks[i].length // 2:
            return
        if nxt.block_id in self._ahead_done:
            return
        self._ahead_done.add(nxt.block_id)
        fn = self._fetcher.prefetch if local else self._fetcher.prefetch_stream
        if background:
            _ahead_pool().submit(fn, nxt)
        else:
            fn(nxt)

    def read(self, offset: int, size: int) -> bytes | memoryview:
        if offset >= self.size or size <= 0:
            return b""
        end = min(self.size, offset + size)
        i = bisect.bisect_right(self._starts, offset) - 1
        parts = []
        while offset < end:
            b = self.blocks[i]
            start = self._starts[i]
            if b.length == 0:
                i += 1
                continue
            n = min(end, start + b.length) - offset
            data = self._fetcher.read(b, offset - start, n)
            self._ahead(i, offset - start + n, background=False)
            if len(data) != n:
                raise CurvineError(ErrorKind.IO, f"block {b.block_id:016x}: read "
                                                 f"{len(data)} of {n} bytes")
            parts.append(data)
            offset += n
            i += 1
        return join(parts)

    def close(self) -> None:
        self._fetcher.close()
