"""Reading one published version of a file: its blocks, fetched once at open.

Where a block is read from is decided in one place, ``BlockFetcher._source``: a
block stored by a worker on this host is read from its local file (``_LocalFile``,
short-circuit), any other block, or one whose local file fails, from a copy streamed
whole from a worker (``_Fetch``); a hole (block id 0) is zeros.  Every entry point
(``read`` of any range, ``read_all``, ``read_nowait`` behind ``read_cached``) goes
through it, and both sources follow one policy:

- Checked before served: a block is read whole and its crc32 compared with the one
  the master recorded at publish (``Block.checksum``; 0 = not known, e.g. a truncated
  block, then there is nothing to check: ``_checks``) before any part of it is
  returned (``_crc_problem``).  A copy that does not match is rejected
  (``_reject_copy``): logged once (block id and worker), never read again by this
  reader, and the next replica is tried; when none matches, the read fails with
  ErrorKind.CHECKSUM (EIO at the mount), never with other bytes.
- Counted when served: the bytes returned, once, on the counter of the source that
  served them (``served``: short-circuit or remote).

A local block file is found only in a data dir that this process's own configuration
names (``block_client.LocalDirs``; a dir a worker reports over the network only
selects one of those), opened component by component with O_NOFOLLOW.  The file is
opened once and the descriptor kept: an open descriptor keeps reading the bytes it
opened even if the block is deleted later (consistency rule 4, docs/consistency.md).  It is checked
once per descriptor, at open for the blocks in the first PREFETCH_BYTES of the file
(which the kernel is asked to read ahead, POSIX_FADV_WILLNEED), in the background when
a read reaches the block before, else at its first read; later reads of that
descriptor are served from it (preadv2 RWF_NOWAIT lets ``read_cached`` answer from
the page cache without blocking, so the FUSE loop needs no thread hop).

Other blocks are streamed whole from a worker (ReadBlock from offset 0, with
readahead) and kept in memory once checked: the last MAX_HELD blocks per reader, so
the reads that follow, sequential or not, are served from memory.  A stream that fails
goes on from another replica.

Thread-safe: FUSE issues several reads of one handle at once, possibly slightly out
of order (kernel readahead).
"""

from __future__ import annotations

import bisect
import collections
import errno
import logging
import os
import resource
import threading
import time
from typing import Callable, Iterable, Mapping

from curvine.common.checksum import crc32
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.fds import FdClosed, OwnedFd
from curvine.common.ids import MIB, host_id
from curvine.common.security import Security
from curvine.proto import common_pb2

from ..blocks import block_client
from ..blocks.pools import LazyExecutor
from .metrics import CLIENT_READ_REMOTE, CLIENT_READ_SHORT_CIRCUIT

log = logging.getLogger(__name__)

Block = common_pb2.Block
WorkerInfo = common_pb2.WorkerInfo

_ZEROS = bytes(MIB)
MAX_LOCAL_FDS = 256  # local block files opened eagerly per reader; later ones lazily
MAX_HELD = 3  # remote blocks kept whole (checked) per reader
PREFETCH_BYTES = 64 * MIB  # local block bytes read ahead (and checked) at open
# A stream left unread this long that then fails was most likely cut by its worker
# (worker.stream_idle_timeout), not broken: the worker is not marked bad for it.
QUIET_STREAM = 5.0
NOWAIT_CHUNKS = 16  # chunks a non-blocking read takes off a stream at most per call
CHECK_PIECE = MIB  # bytes of a local block file read per step while checking it
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
# Checking crc32s on reads.  Always on; the switch exists for measuring what the
# checks cost (bench/verify_cost.py) and is read when a reader is made.
VERIFY = True

# threads that start readahead for callers that must not block (the FUSE loop)
_ahead_pool = LazyExecutor(4, "readahead")

_check_buf = threading.local()  # per thread: a CHECK_PIECE buffer for local checks

# (block id, worker id, copy) of bad copies already logged (a warning once each)
_logged_lock = threading.Lock()
_logged: set[tuple[int, int, str]] = set()
_LOGGED_MAX = 4096


class _VerifiedFiles:
    """Local block files whose bytes matched their crc32, by file identity (bounded,
    least recently checked dropped first); shared by every reader of the process."""

    LIMIT = 100_000

    def __init__(self):
        self._lock = threading.Lock()
        self._seen: collections.OrderedDict = collections.OrderedDict()

    def get(self, identity) -> bool:
        with self._lock:
            if identity in self._seen:
                self._seen.move_to_end(identity)
                return True
            return False

    def put(self, identity) -> None:
        with self._lock:
            self._seen[identity] = True
            self._seen.move_to_end(identity)
            while len(self._seen) > self.LIMIT:
                self._seen.popitem(last=False)


_verified = _VerifiedFiles()


class _HeldFiles:
    """Local block files all readers of this process hold open, bounded: past
    ``limit`` (a quarter of the descriptor limit, read at first use: after the mount
    raised it), a reader reads those blocks from their worker instead of holding one
    more file, so no client's opens can take every descriptor of the mount."""

    def __init__(self):
        self.limit: int | None = None
        self.held = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.limit is None:
                soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
                self.limit = max(64, soft // 4) if soft != resource.RLIM_INFINITY else 1 << 16
            if self.held >= self.limit:
                return False
            self.held += 1
            return True

    def give(self) -> None:
        with self._lock:
            self.held -= 1


held_files = _HeldFiles()


def check_block_file(block: Block, fd: int) -> str | None:
    """None if the first ``block.length`` bytes of the block file open at ``fd`` match
    the block's crc32, else what is wrong with the copy.  The caller holds ``fd`` open
    (borrowed), so a failure is the file's (EIO, short, other bytes); an OSError other
    than EIO is raised (no verdict on the copy).  A file checked before and unchanged
    since is not read again."""
    st = os.fstat(fd)
    # Any write to the file since it was checked changes its ctime (which no
    # unprivileged process can set back): the same file, unchanged, is not read
    # again for every open (warm reads of a hot chunk).
    identity = (block.block_id, block.checksum, st.st_dev, st.st_ino, st.st_size,
                st.st_mtime_ns, st.st_ctime_ns)
    if _verified.get(identity):
        return None
    detail = _crc_of_file(block, fd)
    if detail is None:
        _verified.put(identity)
    return detail


def note_written_file(block_id: int, checksum: int, fd: int) -> None:
    """This process wrote block ``block_id`` (crc32 ``checksum``) into the file open at
    ``fd``, now the block's file (adopted): its readers here need not read it whole to
    check it (``check_block_file``), while the file stays as it is now."""
    st = os.fstat(fd)
    _verified.put((block_id, checksum, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                   st.st_ctime_ns))


def _crc_of_file(block: Block, fd: int) -> str | None:
    buf = getattr(_check_buf, "buf", None)
    if buf is None:
        buf = _check_buf.buf = bytearray(CHECK_PIECE)
    view = memoryview(buf)
    crc, pos, n = 0, 0, block.length
    try:
        while pos < n:
            got = os.preadv(fd, [view[:min(CHECK_PIECE, n - pos)]], pos)
            if got <= 0:
                break
            crc = crc32(view[:got], crc)
            pos += got
    except OSError as e:
        if e.errno != errno.EIO:
            raise  # not the file's bytes: no verdict on the copy
        return f"reading it failed: {e.strerror}"
    if pos != n:
        return f"{pos} of {n} bytes"
    return _crc_problem(block, crc)


def zeros(n: int) -> bytes | memoryview:
    return memoryview(_ZEROS)[:n] if n <= MIB else bytes(n)


def join(parts: list) -> bytes | memoryview:
    if not parts:
        return b""
    if len(parts) == 1:
        return parts[0]
    return b"".join(parts)


def _handle_closed() -> CurvineError:
    return CurvineError(ErrorKind.STALE, "the file handle is closed")


def _crc_problem(block: Block, crc: int) -> str | None:
    """What is wrong with a copy of ``block`` whose bytes have crc32 ``crc``; None if
    it matches the crc32 the master recorded."""
    if crc != block.checksum:
        return f"crc32 {crc:08x}, recorded {block.checksum:08x}"
    return None


def _log_bad_copy(block: Block, wid: int, worker: WorkerInfo | None, copy: str,
                  detail: str) -> None:
    """One warning per (block, worker, copy) and process; later ones at debug.  What
    came over the network (the address, paths) is logged escaped (%r)."""
    key = (block.block_id, wid, copy)
    with _logged_lock:
        first = key not in _logged
        if first:
            if len(_logged) >= _LOGGED_MAX:
                _logged.clear()
            _logged.add(key)
    address = worker.address if worker is not None else "?"
    log.log(logging.WARNING if first else logging.DEBUG,
            "block %016x: the %s of worker %d (%r) is not intact (%s); not reading that "
            "copy again", block.block_id, copy, wid, address, detail)


class _LocalFile:
    """A source: the block's file on this host, its descriptor opened once and owned
    by the reader (``OwnedFd``: every use borrows it, so a close by the reader's
    owner never pulls the number from under a read or a check); read only once
    ``checked`` (``BlockFetcher._local``)."""

    served = CLIENT_READ_SHORT_CIRCUIT

    def __init__(self, block_id: int, fd: int, worker_id: int):
        self.block_id = block_id
        self.fd = OwnedFd(fd, f"the local file of block {block_id:016x}",
                          on_close=held_files.give)
        self.worker_id = worker_id
        self.checked = False  # its bytes matched the block's crc32
        self.lock = threading.Lock()  # held while checking

    def read(self, offset: int, size: int) -> bytes | None:
        """``size`` bytes at ``offset``; None when the file does not give them all (a
        failing disk: another replica may be fine).  STALE: the reader is closed."""
        try:
            with self.fd.borrow() as fd:
                data = os.pread(fd, size, offset)
        except FdClosed:
            raise _handle_closed() from None
        except OSError as e:
            log.warning("reading the local file of block %016x failed (%s); reading "
                        "remotely", self.block_id, e)
            return None
        if len(data) != size:
            log.warning("local file of block %016x is short (%d of %d bytes at %d); "
                        "reading remotely", self.block_id, len(data), size, offset)
            return None
        return data

    def read_nowait(self, offset: int, size: int,
                    out: bytearray | None) -> memoryview | None:
        """The bytes, into ``out``, if every one is in the page cache (RWF_NOWAIT)."""
        if not _NOWAIT or out is None or len(out) < size:
            return None
        view = memoryview(out)[:size]
        try:
            with self.fd.borrow() as fd:
                got = os.preadv(fd, [view], offset, _NOWAIT)
        except (OSError, FdClosed):
            # EAGAIN: not cached; closed: the reader is gone; anything else: the
            # thread path reports it
            return None
        return view if got == size else None

    def close(self) -> None:
        self.fd.close()


class _Fetch:
    """A source: one block received whole from one replica (a ReadBlock stream from
    offset 0).

    Chunks are kept and their crc32 computed as they arrive; none is served before all
    have arrived and matched the crc32 the master recorded (``done``)."""

    served = CLIENT_READ_REMOTE

    def __init__(self, block: Block, worker: WorkerInfo, timeout: float, readahead: int,
                 verify: bool, security: Security):
        self.block = block
        self.worker = worker
        self.verify = verify
        self.reader = block_client.BlockReader(worker, block.block_id, 0, block.length,
                                               timeout=timeout, readahead=readahead,
                                               token=block.token, security=security)
        self.it = iter(self.reader)
        self.starts: list[int] = []
        self.chunks: list = []
        self.pos = 0  # bytes received
        self.crc = 0
        self.lock = threading.Lock()  # held while receiving
        self.done = False  # every byte received and checked: chunks never change again
        self.closed = False
        self.used = time.monotonic()  # when a chunk last arrived (or the stream opened)

    def _take(self, data) -> None:
        n = len(data)
        if self.pos + n > self.block.length:
            raise CurvineError(ErrorKind.IO, f"worker {self.worker.address!r}: block "
                                             f"{self.block.block_id:016x}: sent more than "
                                             f"its {self.block.length} bytes")
        self.starts.append(self.pos)
        self.chunks.append(data)
        if self.verify:
            self.crc = crc32(data, self.crc)
        self.pos += n
        self.used = time.monotonic()

    def pull(self) -> bool:
        """Receive the next chunk (blocking); False at the end of the stream."""
        try:
            data = next(self.it)
        except StopIteration:
            return False
        if data:
            self._take(data)
        return True

    def pull_nowait(self) -> bool:
        """Take the next chunk if it has arrived; False if not (or at the end)."""
        poll = getattr(self.reader, "poll", None)
        data = poll() if poll is not None else None
        if not data:
            return False
        self._take(data)
        return True

    def check(self) -> None:
        """All bytes are here: compare the crc32 (CHECKSUM error if it differs)."""
        problem = _crc_problem(self.block, self.crc) if self.verify else None
        if problem is not None:
            raise CurvineError(ErrorKind.CHECKSUM, problem)
        self.done = True

    def slice(self, offset: int, end: int) -> bytes | memoryview:
        """[offset, end) of the (done) block."""
        i = bisect.bisect_right(self.starts, offset) - 1
        parts = []
        while offset < end and i < len(self.chunks):
            cstart, data = self.starts[i], self.chunks[i]
            lo = offset - cstart
            hi = min(len(data), end - cstart)
            if lo == 0 and hi == len(data):
                parts.append(data)
            else:
                parts.append(memoryview(data)[lo:hi])
            offset = cstart + hi
            i += 1
        return join(parts)

    def read(self, offset: int, size: int) -> bytes | memoryview:
        return self.slice(offset, offset + size)

    def read_nowait(self, offset: int, size: int,
                    out: bytearray | None) -> bytes | memoryview:
        return self.slice(offset, offset + size)

    def close(self) -> None:
        self.closed = True
        self.reader.close()


class BlockFetcher:
    """Reads byte ranges of immutable blocks from local files or worker streams, each
    block checked against its crc32 before any byte of it is served.

    ``local_dirs``: where short-circuit reads may open files (``block_client.LocalDirs``
    or a list of dirs; None: this process's, ``block_client.set_local_dirs``).
    ``security``: the credentials of the streams from workers (common/security.py)."""

    def __init__(self, workers: Mapping[int, WorkerInfo], short_circuit: bool = True,
                 timeout: float = 30.0, readahead: int = block_client.DEFAULT_READAHEAD,
                 local_dirs: "block_client.LocalDirs | Iterable[str] | None" = None, *,
                 security: Security, on_bad_copy: Callable[[int, int], None] | None = None):
        self.workers: dict[int, WorkerInfo] = dict(workers)
        # told (block id, worker id) of each copy rejected: the master has it checked
        self.on_bad_copy = on_bad_copy
        self.security = security
        self.short_circuit = short_circuit
        self.timeout = timeout
        self.readahead = max(1, readahead)
        self.verify = VERIFY
        self.local = block_client.local_dirs(local_dirs)
        self._host = host_id()
        self._lock = threading.Lock()
        self._open_lock = threading.Lock()  # new remote fetches, one at a time
        self._files: dict[int, _LocalFile] = {}  # block id -> its open local file
        self._no_local: set[int] = set()
        self._prefetched: set[int] = set()  # blocks whose local file was advised WILLNEED
        self._stream_prefetched: set[int] = set()  # remote blocks streamed ahead of reads
        self._fetches: collections.OrderedDict[int, _Fetch] = collections.OrderedDict()
        self._bad_workers: set[int] = set()
        self._bad_copies: dict[int, set[int]] = {}  # block id -> workers whose copy failed
        self._broken: dict[int, CurvineError] = {}  # block id -> no copy matched
        self._closed = False

    def add_workers(self, workers: Mapping[int, WorkerInfo]) -> None:
        with self._lock:
            self.workers.update(workers)

    # -- where a block is read from ---------------------------------------------

    def _source(self, block: Block, nowait: bool = False) -> "_LocalFile | _Fetch | None":
        """Where ``block`` (not a hole) is read from: its local file once checked, else
        its copy received whole from a replica and checked.  ``nowait``: only a source
        that serves without waiting (never opening or checking a file, never opening
        a stream), else None; a local block not checked yet is the thread path's."""
        if self.short_circuit:
            if not nowait:
                local = self._local(block)
                if local is not None:
                    return local
            elif block.block_id not in self._no_local:
                local = self._files.get(block.block_id)
                return local if local is not None and local.checked else None
        return self._fetched(block, nowait)

    def is_local(self, block: Block) -> bool:
        """Whether the block's local file is open already (no I/O)."""
        return block.block_id in self._files

    # -- what is checked, and what is done with a copy that fails ---------------

    def _checks(self, block: Block) -> bool:
        """Whether copies of ``block`` are compared with a crc32 (0: not known)."""
        return self.verify and bool(block.checksum)

    def _reject_copy(self, block: Block, worker_id: int, copy: str, detail: str) -> None:
        """A copy that is not intact: logged once, never read again by this reader, and
        reported (``on_bad_copy``)."""
        _log_bad_copy(block, worker_id, self.workers.get(worker_id), copy, detail)
        if self.on_bad_copy is not None:
            self.on_bad_copy(block.block_id, worker_id)
        with self._lock:
            self._bad_copies.setdefault(block.block_id, set()).add(worker_id)

    # -- short-circuit --------------------------------------------------------

    def _lookup(self, w: WorkerInfo, block_id: int) -> str | None:
        if self.local is block_client.local_dirs():  # this process's: the default
            return block_client.local_block_path(w, block_id)
        return block_client.local_block_path(w, block_id, self.local)

    def open_local(self, block: Block) -> _LocalFile | None:
        """The block's local file, opened once (not checked yet: ``_local``); None if
        not local."""
        bid = block.block_id
        with self._lock:
            local = self._files.get(bid)
            if local is not None:
                return local
            if bid in self._no_local or not self.short_circuit or self._closed:
                return None
            bad = set(self._bad_copies.get(bid, ()))
        if not held_files.take():
            return None  # every local file this process may hold is open: read remotely
        opened = None
        for w_id in block.worker_ids:
            w = self.workers.get(w_id)
            if w is None or w_id in bad or w.host_id != self._host:
                continue
            dirs = self.local.of(w)
            if not dirs:
                continue  # none of its data dirs is one this host's configuration names
            path = self._lookup(w, bid)
            if path is None:
                continue
            try:
                fd = block_client.open_block_file(path, dirs, self.local.trust_reported)
            except block_client.TamperedPath as e:
                # The worker would read the same path: its copy is not to be trusted.
                self._reject_copy(block, w_id, "local block file",
                                  f"{e.filename!r}: {e.strerror}")
                continue
            except OSError as e:
                log.debug("short-circuit open of %r (block %016x, worker %d) failed: %s",
                          path, bid, w_id, e.strerror)
                continue
            opened = _LocalFile(bid, fd, w_id)
            break
        with self._lock:
            if opened is None:
                held_files.give()
                self._no_local.add(bid)
                return None
            local = self._files.get(bid)
            if self._closed or local is not None:
                opened.close()
                return local
            self._files[bid] = opened
            return opened

    def _local(self, block: Block) -> _LocalFile | None:
        """The block's local file once its bytes matched its crc32 (checked once per
        descriptor); None: read it remotely.  STALE once this reader is closed."""
        bid = block.block_id
        while True:
            local = self.open_local(block)
            if local is None or local.checked:
                return local
            with local.lock:
                if local.checked:
                    return local
                if self._files.get(bid) is not local:
                    if self._closed:
                        raise _handle_closed()
                    continue  # dropped meanwhile (its check failed): the next copy
                try:
                    with local.fd.borrow() as fd:
                        detail = self._check_local(block, fd)
                except FdClosed:
                    raise _handle_closed() from None
                except OSError as e:
                    # Not a verdict on the copy's bytes: read remotely this time.
                    log.error("checking the local file of block %016x failed: %s",
                              bid, e)
                    return None
                if detail is None:
                    local.checked = True
                    return local
                self._reject_copy(block, local.worker_id, "local block file", detail)
                with self._lock:
                    if self._files.get(bid) is local:
                        del self._files[bid]
                local.close()

    def _check_local(self, block: Block, fd: int) -> str | None:
        """None if the file's bytes match the block's crc32 (or there is nothing to
        compare), else what is wrong with the copy (``check_block_file``)."""
        if not self._checks(block):
            return None
        return check_block_file(block, fd)

    def advise(self, block: Block) -> None:
        """Ask the kernel to read the block's local file ahead (once per block)."""
        local = self.open_local(block)
        if local is None:
            return
        with self._lock:
            if block.block_id in self._prefetched:
                return
            self._prefetched.add(block.block_id)
        try:
            with local.fd.borrow() as fd:
                os.posix_fadvise(fd, 0, block.length, os.POSIX_FADV_WILLNEED)
        except FdClosed:
            pass  # the reader was closed meanwhile
        except OSError as e:  # a file system without readahead
            log.debug("readahead advice for block %016x failed: %s", block.block_id, e)

    def prefetch(self, block: Block) -> None:
        """Read the block's local file ahead and check it (so that non-blocking reads
        can serve it)."""
        self.advise(block)
        self._local(block)

    # -- reads ----------------------------------------------------------------

    def read(self, block: Block, offset: int, size: int) -> bytes | memoryview:
        """``size`` bytes at ``offset`` of ``block`` (fewer only past its end), from a
        copy that matched the block's crc32."""
        size = max(0, min(size, block.length - offset))
        if size == 0:
            return b""
        if block.block_id == 0:  # inline data (kept by the master), or a hole
            if block.HasField("data"):
                return memoryview(block.data)[offset:offset + size]
            return zeros(size)
        source = self._source(block)
        data = source.read(offset, size)
        if data is None:  # the local file failed: a replica's copy
            source = self._fetched(block)
            data = source.read(offset, size)
        source.served.inc(size)
        return data

    def read_all(self, block: Block) -> bytes | memoryview:
        """The whole block (used to modify it into a new one)."""
        return self.read(block, 0, block.length)

    def read_nowait(self, block: Block, offset: int, size: int,
                    out: bytearray | None = None) -> bytes | memoryview | None:
        """[offset, offset+size) of ``block`` if that needs no waiting, else None (never
        opens a file or a stream): from a checked local file whose bytes are in the
        page cache (RWF_NOWAIT, into ``out``), or from a remote block received and
        checked (taking what its stream has received already)."""
        if self._closed or size <= 0 or offset + size > block.length or not block.block_id:
            return None
        source = self._source(block, nowait=True)
        data = source.read_nowait(offset, size, out) if source is not None else None
        if data is not None:
            source.served.inc(size)
        return data

    # -- remote ---------------------------------------------------------------

    def _candidates(self, block: Block) -> list[WorkerInfo]:
        """Replicas to try: local first, known-bad workers last, bad copies never."""
        with self._lock:
            bad_copies = self._bad_copies.get(block.block_id, ())
            ws = [self.workers[w] for w in block.worker_ids
                  if w in self.workers and w not in bad_copies]
            bad = set(self._bad_workers)
        ws.sort(key=lambda w: (w.worker_id in bad, w.lost, w.host_id != self._host))
        return ws

    def _mark_bad(self, w: WorkerInfo, block: Block, e: CurvineError) -> None:
        log.info("reading block %016x from worker %d (%r) failed: %s", block.block_id,
                 w.worker_id, w.address, e)
        with self._lock:
            self._bad_workers.add(w.worker_id)

    def _no_replica(self, block: Block, last: CurvineError | None) -> CurvineError:
        bid = block.block_id
        with self._lock:
            bad_copies = len(self._bad_copies.get(bid, ()))
        if bad_copies and (last is None or last.kind == ErrorKind.CHECKSUM):
            # Every copy was read and none matched: that will not change.
            err = CurvineError(ErrorKind.CHECKSUM,
                               f"block {bid:016x}: no intact replica ({bad_copies} did not "
                               f"match the crc32 the master recorded or were tampered "
                               f"with)")
            with self._lock:
                self._broken[bid] = err
            return err
        if last is None:
            return CurvineError(ErrorKind.IO, f"block {bid:016x}: no worker holds a replica")
        # A block deleted under an open reader (unlink, eviction) is a stale handle,
        # not a missing name.
        kind = ErrorKind.STALE if last.kind == ErrorKind.NOT_FOUND else last.kind
        return CurvineError(kind, f"block {bid:016x}: no replica readable: {last.message}")

    def _find_fetch(self, block: Block) -> _Fetch | None:
        with self._lock:
            f = self._fetches.get(block.block_id)
            if f is not None:
                self._fetches.move_to_end(block.block_id)
            return f

    def _new_fetch(self, block: Block) -> _Fetch:
        """A fetch of ``block`` from the best replica that opens one (or the one
        another thread opened meanwhile)."""
        with self._open_lock:  # threads arriving together share one new fetch
            return self._open_fetch(block)

    def _open_fetch(self, block: Block) -> _Fetch:
        """``_new_fetch`` with ``_open_lock`` held."""
        f = self._find_fetch(block)
        if f is not None:
            return f
        last: CurvineError | None = None
        for w in self._candidates(block):
            try:
                f = _Fetch(block, w, self.timeout, self.readahead, self._checks(block),
                           self.security)
            except CurvineError as e:
                last = e
                self._mark_bad(w, block, e)
                continue
            evicted = []
            with self._lock:
                self._fetches[block.block_id] = f
                while len(self._fetches) > MAX_HELD:
                    evicted.append(self._fetches.popitem(last=False)[1])
            for old in evicted:
                # one being received by another thread ends with that read
                if old.lock.acquire(blocking=False):
                    try:
                        old.close()
                    finally:
                        old.lock.release()
            return f
        raise self._no_replica(block, last)

    def _drop_fetch(self, f: _Fetch) -> None:
        f.close()
        with self._lock:
            if self._fetches.get(f.block.block_id) is f:
                del self._fetches[f.block.block_id]

    def _fetched(self, block: Block, nowait: bool = False) -> _Fetch | None:
        """The block received whole from a replica and checked.  ``nowait``: only what
        needs no waiting (an existing fetch, its chunks arrived already), else None."""
        bid = block.block_id
        attempts = 0
        while True:
            broken = self._broken.get(bid)
            if broken is not None:
                if nowait:
                    return None
                raise broken
            if self._closed:
                if nowait:
                    return None
                raise _handle_closed()
            f = self._find_fetch(block)
            if f is None:
                if nowait:
                    return None
                f = self._new_fetch(block)
            if f.done:
                return f
            if not f.lock.acquire(blocking=not nowait):
                return None
            try:
                if f.done:
                    return f
                if f.closed:
                    if nowait:
                        return None
                    continue  # evicted while this thread waited
                quiet = time.monotonic() - f.used
                try:
                    if nowait:
                        taken = 0
                        while (f.pos < block.length and taken < NOWAIT_CHUNKS
                               and f.pull_nowait()):
                            taken += 1
                        if f.pos < block.length:
                            return None
                    else:
                        while f.pos < block.length and f.pull():
                            pass
                        if f.pos < block.length:
                            raise CurvineError(ErrorKind.IO, f"worker {f.worker.address!r}: "
                                               f"block {bid:016x} ended at {f.pos}, expected "
                                               f"{block.length} bytes")
                    f.check()
                    return f
                except CurvineError as e:
                    self._drop_fetch(f)
                    if e.kind == ErrorKind.CHECKSUM:
                        self._reject_copy(block, f.worker.worker_id, "copy streamed",
                                          e.message)
                    elif quiet < QUIET_STREAM:
                        self._mark_bad(f.worker, block, e)
                    else:
                        log.info("stream of block %016x from worker %d, unread for %.0fs, "
                                 "ended: %s; reading on from another", bid,
                                 f.worker.worker_id, quiet, e)
                    if nowait:
                        return None
                    attempts += 1
                    # Every replica once, plus one more try (a transient failure).
                    if attempts > len(block.worker_ids):
                        raise self._no_replica(block, e) from None
                    if attempts == len(block.worker_ids) and e.kind == ErrorKind.UNAVAILABLE:
                        # the last try: a worker just back from a restart is refused
                        # while this process's channel to it waits out its reconnect
                        # backoff; wait (bounded) for that instead of failing the read
                        block_client.wait_ready(f.worker, security=self.security)
            finally:
                f.lock.release()

    def prefetch_stream(self, block: Block) -> None:
        """Start streaming a remote block (readahead across blocks), unless it is
        local or being fetched; failures are left to the read that needs it."""
        if self._closed or block.block_id == 0 or self.is_local(block):
            return
        with self._lock:
            if (block.block_id in self._stream_prefetched
                    or block.block_id in self._fetches):
                return
            self._stream_prefetched.add(block.block_id)
        if not self._open_lock.acquire(blocking=False):
            return  # another thread is opening a stream: do not wait for it
        try:
            self._open_fetch(block)
        except CurvineError as e:
            log.debug("prefetching block %016x failed: %s", block.block_id, e)
        finally:
            self._open_lock.release()

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def close_nowait(self) -> bool:
        """``close`` if nothing holds the fetcher's lock now (False: nothing done).
        Closing is descriptors and stream cancels, none of which waits: the mount does
        it in its loop, without a thread hop."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._close_locked()
        finally:
            self._lock.release()
        return True

    def _close_locked(self) -> None:
        self._closed = True
        sources = [*self._files.values(), *self._fetches.values()]
        self._files.clear()
        self._fetches.clear()
        for source in sources:
            source.close()


class FileReader:
    """Reads one version of a file: ``read(offset, size)`` from any thread.

    ``local_dirs`` and ``security``: see ``BlockFetcher``."""

    def __init__(self, blocks: Iterable[Block], workers: Mapping[int, WorkerInfo],
                 short_circuit: bool = True, timeout: float = 30.0,
                 readahead: int = block_client.DEFAULT_READAHEAD,
                 local_dirs: "block_client.LocalDirs | Iterable[str] | None" = None, *,
                 security: Security, on_bad_copy: Callable[[int, int], None] | None = None):
        self.blocks = list(blocks)
        self._starts = []
        pos = 0
        for b in self.blocks:
            self._starts.append(pos)
            pos += b.length
        self.size = pos
        # a small file's bytes came with its blocks (Block.data): served from here
        self._inline = {i: memoryview(b.data) for i, b in enumerate(self.blocks)
                        if not b.block_id and b.length and b.HasField("data")}
        self._fetcher = BlockFetcher(workers, short_circuit, timeout, readahead, local_dirs,
                                     security=security, on_bad_copy=on_bad_copy)
        self._ahead_done: set[int] = set()  # next blocks already asked for (_ahead)
        if short_circuit:
            # Open local block files now, so that an unlink or eviction after open()
            # cannot take the data away from this reader.
            for b in self.blocks[:MAX_LOCAL_FDS]:
                if b.block_id:
                    self._fetcher.open_local(b)
            # Cold data: have the kernel start reading the first blocks now, and check
            # them (the reads that follow are then served without a thread hop).
            first_blocks = [b for b, start in zip(self.blocks, self._starts)
                            if start < PREFETCH_BYTES and b.block_id]
            for b in first_blocks:
                self._fetcher.advise(b)
            for b in first_blocks:
                self._fetcher.prefetch(b)
        # A remote first block: start its stream now, so that the first read does not
        # wait for the call to be set up (the open reply and the kernel's first read
        # request overlap with it).
        first = next((b for b in self.blocks if b.block_id), None)
        if first is not None:
            self._fetcher.prefetch_stream(first)  # nothing if it is local

    def read_cached(self, offset: int, size: int, out: bytearray) -> memoryview | None:
        """[offset, offset+size) without blocking, or None.

        Served from a checked local block file this reader has open when every byte is
        in the page cache (RWF_NOWAIT, into ``out``: the caller uses the view before
        the next call), or from a remote block received and checked already.  Anything
        else (cold data, a block not checked yet, a read across blocks) is None: use
        ``read`` from a thread."""
        if size <= 0 or offset >= self.size:
            return None
        end = min(self.size, offset + size)
        i = self._block_at(offset)
        b, start = self.blocks[i], self._starts[i]
        if end > start + b.length:
            return None
        if not b.block_id:
            inline = self._inline.get(i)
            return inline[offset - start:end - start] if inline is not None else None
        data = self._fetcher.read_nowait(b, offset - start, end - offset, out)
        if data is not None:
            self._ahead(i, end - start, background=True)
        return data

    def _ahead(self, i: int, reached: int, background: bool) -> None:
        """A read reached ``reached`` bytes into block ``i``: get the next block coming
        (local: kernel readahead of its file and its check, always from a thread;
        remote: its stream, once past the middle of this one), at most once per block.
        ``background``: from a thread, for callers that must not block."""
        if i + 1 >= len(self.blocks) or not self.blocks[i + 1].block_id:
            return
        nxt = self.blocks[i + 1]
        local = self._fetcher.is_local(nxt)
        if not local and reached <= self.blocks[i].length // 2:
            return
        if nxt.block_id in self._ahead_done:
            return
        self._ahead_done.add(nxt.block_id)
        if local:
            _ahead_pool().submit(self._fetcher.prefetch, nxt)
        elif background:
            _ahead_pool().submit(self._fetcher.prefetch_stream, nxt)
        else:
            self._fetcher.prefetch_stream(nxt)

    def read(self, offset: int, size: int) -> bytes | memoryview:
        if offset >= self.size or size <= 0:
            return b""
        end = min(self.size, offset + size)
        i = self._block_at(offset)
        parts = []
        while offset < end:
            b = self.blocks[i]
            start = self._starts[i]
            if b.length == 0:
                i += 1
                continue
            n = min(end, start + b.length) - offset
            inline = self._inline.get(i)
            if inline is not None:
                parts.append(inline[offset - start:offset - start + n])
            else:
                parts.append(self._fetcher.read(b, offset - start, n))  # all n: in the block
                self._ahead(i, offset - start + n, background=False)
            offset += n
            i += 1
        return join(parts)

    def _block_at(self, offset: int) -> int:
        """Index of the block that holds byte ``offset`` (< size)."""
        return bisect.bisect_right(self._starts, offset) - 1

    def close(self) -> None:
        self._fetcher.close()

    def close_nowait(self) -> bool:
        """``close`` without waiting for another thread (False: nothing done)."""
        return self._fetcher.close_nowait()
