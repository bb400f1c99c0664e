"""Storing the blocks of one version on workers.

A ``FileWriter``'s ``Uploader`` asks the master for blocks (AddBlock, with the write
token the workers want for each), stores a buffer's bytes on every target of its
block (streaming them, or, to a worker of this host, writing a staging file that it
adopts), tries other workers when one fails, and remembers the block ids it was given,
so that a publish hands back those the version dropped.  What a buffer holds and how
far it got is the buffer's own (``block_buffers.BlockBuffer.store`` calls back into
this); every loop over a block's targets is ``_on_each``.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable, Iterable, Protocol

from curvine.common.checksum import crc32
from curvine.common.errors import CurvineError, ErrorKind
from curvine.proto import common_pb2

from ..blocks import block_client
from .file_reader import note_written_file
from .metrics import CLIENT_WRITTEN_REMOTE, CLIENT_WRITTEN_SHORT_CIRCUIT
from ..blocks.pools import LazyExecutor

if TYPE_CHECKING:
    from .local_worker import LocalWorker
    from ..blocks.domain_socket import LocalSockets
    from .file_reader import BlockFetcher

log = logging.getLogger(__name__)

Block = common_pb2.Block
WorkerInfo = common_pb2.WorkerInfo

UPLOAD_ATTEMPTS = 3  # block allocations tried (excluding failed workers) per upload
STREAM_DEADLINE = 600.0  # seconds a block may take to be written while it streams

_upload_pool = LazyExecutor(16, "block-upload")

# A call that does its part of a block on one worker, given the block's crc32 if
# known (else None), and returns the crc32 (None if it learnt none).
TargetCall = Callable[[int | None], int | None]


class Storable(Protocol):
    """What the uploader needs of a buffer (``block_buffers.BlockBuffer``): that it
    stores itself, calling back into the uploader.  A protocol, so that this module
    does not import the buffers that import it."""

    def store(self, uploader: Uploader) -> Block: ...


class Uploader:
    """Puts the blocks of one writer's version on workers; called by its buffers."""

    def __init__(self, master, ino: int, host_id: str, fetcher: BlockFetcher,
                 local: LocalWorker, dirs: block_client.LocalDirs, timeout: float,
                 add_block: Callable[..., tuple] | None = None,
                 sockets: "LocalSockets | None" = None, granted: tuple | None = None):
        self.master = master
        self.sockets = sockets  # the local workers' domain sockets, for AdoptBlock
        # AddBlock: ``add_block(ino, host_id, length, exclude)`` (None: the master's RPC)
        self._add_block = add_block or master.add_block
        self.ino = ino
        self.host_id = host_id
        self.local = local  # this host's worker, learnt from the targets written to
        self.dirs = dirs  # where staging files may go
        self.timeout = timeout
        self._fetcher = fetcher  # the writer's reads go to the workers stored on
        # Block ids the master gave this writer since its last publish: those the next
        # publish does not include were dropped (rewritten, uploaded again), and the
        # publish hands them back so they do not sit on the workers as garbage.
        self._allocated: set[int] = set()
        # block id -> the master's write token, for every block this handle was given
        # (AddBlock): the workers serve a block only with its token
        self._tokens: dict[int, bytes] = {}
        # A block the master placed with the file's create (block id, targets, token):
        # the first allocate takes it instead of asking; unused, it goes back with the
        # next publish (``abandoned``, ``take_granted``).
        self._granted = granted

    @property
    def short_circuit(self) -> bool:
        return self._fetcher.short_circuit

    def upload(self, buf: Storable) -> Block:
        """Store the buffer as a new block on the workers the master picks."""
        return buf.store(self)

    def upload_later(self, buf: Storable) -> Future:
        """``upload`` in a pool thread."""
        return _upload_pool().submit(buf.store, self)

    # -- blocks from the master -------------------------------------------------

    def allocate(self, length: int, exclude: Iterable[int] = ()) -> tuple[int, list[WorkerInfo]]:
        """A new block id and its targets (AddBlock).  Avoids ``exclude`` if the master
        can; else any worker: the excluded ones may be all there are, and a worker
        whose stream failed is often healthy (it cut a stream left silent past
        worker.stream_idle_timeout)."""
        exclude = list(exclude)
        try:
            if self._granted is not None and not exclude:
                (block_id, targets, token), self._granted = self._granted, None
            else:
                block_id, targets, token = self._add_block(self.ino, self.host_id,
                                                           length, exclude)
        except CurvineError as e:
            if e.kind != ErrorKind.NO_SPACE or not exclude:
                raise
            log.info("no worker for inode %d besides %s (%s); trying them again",
                     self.ino, sorted(set(exclude)), e)
            block_id, targets, token = self._add_block(self.ino, self.host_id,
                                                             length, [])
        self._tokens[block_id] = token
        self._allocated.add(block_id)
        return block_id, targets

    def abandoned(self, published: set[int]) -> list[int]:
        """The block ids allocated since the last publish that are not in
        ``published``, and the create's block if unused: for the publish to hand
        back (``forget_allocated`` follows it)."""
        return sorted(self._allocated - published) + self.take_granted()

    def take_granted(self) -> list[int]:
        """The create's block if no allocate took it ([] else), for a publish to hand
        back: from here on it is the master's again."""
        granted, self._granted = self._granted, None
        return [granted[0]] if granted is not None else []

    @property
    def allocated(self) -> bool:
        """Some block was allocated since the last publish."""
        return bool(self._allocated)

    def forget_allocated(self) -> None:
        """A publish took the allocated blocks (or handed them back)."""
        self._allocated.clear()

    # -- storing ------------------------------------------------------------------

    def store(self, data: memoryview, alloc=None, exclude: Iterable[int] = (),
              crc: int | None = None, local: bool = True) -> Block:
        """Store ``data`` as a new block (to ``alloc``'s block and targets first, if
        given), trying other workers on failure: a target on this host by a staging
        file it adopts (``local``; ``crc``: the data's crc32 if known), the others by
        streaming."""
        length = len(data)
        exclude = list(exclude)
        last: CurvineError | None = None
        for _ in range(UPLOAD_ATTEMPTS):
            targets = None
            if alloc is not None:
                block_id, targets = alloc
                alloc = None
                targets = [w for w in targets if w.worker_id not in exclude]
            if not targets:
                block_id, targets = self.allocate(length, exclude)
            if not targets:
                raise CurvineError(ErrorKind.NO_SPACE, "the master found no worker to write to")
            stored, crc, failed = self._on_each(
                block_id, [(w, functools.partial(self._put, w, block_id, data, local))
                           for w in targets], crc)
            for w, e in failed:
                last = e
                exclude.append(w.worker_id)
            if stored:
                return self.stored_block(block_id, length, crc, stored)
        raise last or CurvineError(ErrorKind.IO, "block upload failed")

    def replicate(self, block_id: int, data: memoryview,
                  workers: Iterable[WorkerInfo]) -> list[WorkerInfo]:
        """Write a block stored already to more workers; those that took it."""
        stored, _, _ = self._on_each(
            block_id, [(w, lambda _crc, w=w: self._write(w, block_id, data)) for w in workers])
        return stored

    def open_streams(self, block_id: int, targets: Iterable[WorkerInfo]) -> tuple[list, list[int]]:
        """A WriteBlock stream to each target, to be fed while the block is written;
        and the ids of the workers that could not be reached."""
        streams = []

        def open_stream(w: WorkerInfo, _crc) -> None:
            streams.append(block_client.BlockWriteStream(
                w, block_id, timeout=max(self.timeout, STREAM_DEADLINE),
                token=self._tokens[block_id], security=self.master.security))

        _, _, failed = self._on_each(
            block_id, [(w, functools.partial(open_stream, w)) for w in targets], doing="opening")
        return streams, [w.worker_id for w, _ in failed]

    def finish_streams(self, streams: list, length: int) -> tuple[Block | None, list[int]]:
        """Finish a block streamed while written (``length`` bytes sent on ``streams``):
        the Block on the workers that took it (None: none did), and the ids of the
        workers whose stream failed."""
        block_id = streams[0].block_id

        def finish(st, _crc) -> int:
            try:
                _, crc = st.finish(timeout=self.timeout)
            except CurvineError:
                st.cancel()
                raise
            CLIENT_WRITTEN_REMOTE.inc(length)
            return crc

        stored, crc, failed = self._on_each(
            block_id, [(st.worker, functools.partial(finish, st)) for st in streams],
            doing="finishing")
        failed_ids = [w.worker_id for w, _ in failed]
        if not stored:
            return None, failed_ids
        return self.stored_block(block_id, length, crc, stored), failed_ids

    def adopt(self, w: WorkerInfo, block_id: int, path: str, length: int, crc: int) -> None:
        """Have worker ``w`` (on this host) take the staging file ``path`` as the block:
        on its domain socket when it has one here (a small framed call), else by the
        AdoptBlock RPC; raises CurvineError when it refuses."""
        token = self._tokens[block_id]
        if not self._adopt_on_socket(w, block_id, token, path, length, crc):
            block_client.adopt_block(w, block_id, path, length, crc, timeout=self.timeout,
                                     token=token, security=self.master.security)
        CLIENT_WRITTEN_SHORT_CIRCUIT.inc(length)

    def _adopt_on_socket(self, w: WorkerInfo, block_id: int, token, path: str, length: int,
                         crc: int) -> bool:
        """``adopt`` on ``w``'s domain socket; False when it has none here or the
        socket is gone (then the RPC goes)."""
        if self.sockets is None or not self.sockets.has(w):
            return False
        try:
            got = self.sockets.adopt(w, block_id, token, path, length, crc)
        except CurvineError as e:
            if e.kind != ErrorKind.UNAVAILABLE:  # a refusal, not a socket gone
                raise
            log.debug("worker %d: domain socket unavailable (%s); AdoptBlock RPC",
                      w.worker_id, e)
            return False
        block_client.check_adopted(w, block_id, *got, length, crc)
        return True

    def stored_block(self, block_id: int, length: int, crc: int | None,
                     workers: list[WorkerInfo]) -> Block:
        """The Block that ``workers`` now hold; this writer may read it from them."""
        self._fetcher.add_workers({w.worker_id: w for w in workers})
        return Block(block_id=block_id, length=length, checksum=crc or 0,
                     worker_ids=[w.worker_id for w in workers], token=self._tokens[block_id])

    def _on_each(self, block_id: int, calls: Iterable[tuple[WorkerInfo, TargetCall]],
                 crc: int | None = None, doing: str = "writing"):
        """Do each worker's part of block ``block_id``, in order; a worker that fails
        is logged and left out.  Returns the workers that did it, the last crc32 known
        and the failures as (worker, error)."""
        done, failed = [], []
        for w, call in calls:
            try:
                crc = call(crc)
            except CurvineError as e:
                log.info("%s block %016x on worker %d (%s) failed: %s", doing, block_id,
                         w.worker_id, w.address, e)
                failed.append((w, e))
            else:
                done.append(w)
        return done, crc, failed

    def _put(self, w: WorkerInfo, block_id: int, data: memoryview, local: bool,
             crc: int | None) -> int:
        """Store ``data`` on ``w``: by a staging file it adopts when ``local`` and it is
        on this host (short-circuit), else by streaming it."""
        if local and self.short_circuit and w.host_id == self.host_id:
            adopted = self._store_local(w, block_id, data, crc)
            if adopted is not None:
                return adopted
        return self._write(w, block_id, data)

    def _write(self, w: WorkerInfo, block_id: int, data: memoryview) -> int:
        _, crc = block_client.write_block(w, block_id, data, timeout=self.timeout,
                                          token=self._tokens[block_id],
                                          security=self.master.security)
        CLIENT_WRITTEN_REMOTE.inc(len(data))
        return crc

    def _store_local(self, w: WorkerInfo, block_id: int, data: memoryview,
                     crc: int | None) -> int | None:
        """Write ``data`` into a staging file of worker ``w`` (on this host) and have it
        adopt the file as ``block_id``; returns the crc32, or None when no data dir of
        it is writable from here (the caller streams to it instead).  A disk error or a
        refusal (the worker is full) raises, as a failed stream would."""
        made = block_client.create_local_staging(w, block_id, self.dirs)
        if made is None:
            return None
        fd, path = made
        adopted = False
        try:
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], done)
            if crc is None:
                crc = crc32(data)
            self.adopt(w, block_id, path, len(data), crc)
            adopted = True
            note_written_file(block_id, crc, fd)  # readers here need not check it again
            self.local.note([w])
            return crc
        except OSError as e:
            raise CurvineError(ErrorKind.NO_SPACE if e.errno in (errno.ENOSPC, errno.EDQUOT)
                               else ErrorKind.IO, f"staging file {path}: {e.strerror}") from None
        finally:
            os.close(fd)
            if not adopted:
                block_client.unlink_staging(path)
