"""Copies of blocks from other workers, on the master's command (re-replication).

The master hands ``ReplicateCommand``s in heartbeat replies ("copy block B, L bytes,
crc32 C, from one of these workers"); a small pool copies each over the ordinary
worker RPCs (a streamed ReadBlock from a source, sending this worker's client token,
written into this worker's store like any block: staging file, crc32, rename), checks
length and checksum, and the outcome goes back in the next heartbeat
(``take_outcomes``).  A source that fails is replaced by the next one; a copy that
fails on every source is reported failed and the master plans it again later.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from curvine.client.blocks import block_client
from curvine.common import block_tokens
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.blocks import check_block_id
from curvine.common.security import Security
from curvine.proto import master_pb2

from .blockstore import BlockStore

log = logging.getLogger(__name__)

COPY_THREADS = 4  # concurrent copies (the master also bounds copies per worker)


class BlockCopier:
    """``block_key()`` is this worker's block token key (from its registration): the
    copier signs its own read token for the source worker."""

    def __init__(self, store: BlockStore, security: Security, timeout: float = 60.0,
                 block_key: Callable[[], bytes | None] = lambda: b""):
        self.store = store
        self.security = security
        self.timeout = timeout
        self.block_key = block_key
        self._lock = threading.Lock()
        self._running: set[int] = set()
        self._done: list[int] = []
        self._failed: list[int] = []
        self._pool = ThreadPoolExecutor(max_workers=COPY_THREADS, thread_name_prefix="copy")

    def submit(self, commands) -> None:
        for cmd in commands:
            with self._lock:
                if cmd.block_id in self._running:
                    continue  # the master repeated a command still being carried out
                self._running.add(cmd.block_id)
            self._pool.submit(self._run, cmd)

    def verify(self, commands) -> None:
        """Check copies a reader reported bad (VerifyCommand), in the pool: one that
        does not match is removed and reported with the next heartbeat."""
        for cmd in commands:
            self._pool.submit(self._verify_one, cmd)

    def _verify_one(self, cmd) -> None:
        try:
            self.store.verify(check_block_id(cmd.block_id), cmd.length, cmd.checksum)
        except Exception:  # noqa: BLE001 - the pool must survive anything
            log.exception("checking block %016x failed", cmd.block_id)

    def take_outcomes(self) -> tuple[list[int], list[int]]:
        """(copied, failed) block ids since the last call, for the next heartbeat."""
        with self._lock:
            done, failed = self._done, self._failed
            self._done, self._failed = [], []
        return done, failed

    def give_back(self, done: list[int], failed: list[int]) -> None:
        """A heartbeat that carried these outcomes failed: send them with the next one."""
        with self._lock:
            self._done[:0] = done
            self._failed[:0] = failed

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, cmd: master_pb2.ReplicateCommand) -> None:
        ok = False
        try:
            ok = self.copy(cmd)
        except Exception:  # noqa: BLE001 - a bug fails this copy, not the worker
            log.exception("copying block %016x failed", cmd.block_id)
        with self._lock:
            self._running.discard(cmd.block_id)
            (self._done if ok else self._failed).append(cmd.block_id)

    def copy(self, cmd: master_pb2.ReplicateCommand) -> bool:
        """Copy one block from the first source that delivers it intact."""
        try:
            block_id = check_block_id(cmd.block_id)
        except CurvineError as e:
            log.warning("replicate command ignored: %s", e)
            return False
        have = self.store.size_of(block_id)
        if have is not None:
            # Already here (e.g. kept from before this worker was lost): nothing to copy.
            return have >= cmd.length
        for src in cmd.sources:
            try:
                self._copy_from(src, block_id, cmd.length, cmd.checksum)
                log.info("copied block %016x (%d bytes) from worker %d (%s)", block_id,
                         cmd.length, src.worker_id, src.address)
                return True
            except CurvineError as e:
                if e.kind == ErrorKind.EXISTS or self.store.size_of(block_id) is not None:
                    return True  # another copy of it finished meanwhile
                log.info("copying block %016x from worker %d (%s) failed: %s", block_id,
                         src.worker_id, src.address, e)
        return False

    def _copy_from(self, src, block_id: int, length: int, checksum: int) -> None:
        key = self.block_key()
        token = block_tokens.mint(key, block_id, block_tokens.READ) if key else b""
        with block_client.BlockReader(src, block_id, 0, length, timeout=self.timeout,
                                      token=token, security=self.security) as reader:
            with self.store.begin_write(block_id, length) as writer:
                for chunk in reader:
                    writer.append(chunk)
                if writer.length != length:
                    raise CurvineError(ErrorKind.IO, f"worker {src.address}: block "
                                                     f"{block_id:016x}: got {writer.length} "
                                                     f"of {length} bytes")
                if checksum and writer.crc != checksum:
                    raise CurvineError(ErrorKind.CHECKSUM,
                                       f"worker {src.address}: block {block_id:016x} has "
                                       f"crc32 {writer.crc:08x}, the master recorded "
                                       f"{checksum:08x}")
                writer.finish(writer.crc)
