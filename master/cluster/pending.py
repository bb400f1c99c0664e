"""Blocks placed on workers that no published version holds yet.

AddBlock places a block (on the workers the registry chose, its bytes reserved in
their account) and records it here with the file it was allocated to; owner 0 is a
put's block (AddBlock's put form or AddBlocksForPut, for PutFile and PutFiles, which
have no inode yet).  A block leaves when a record that puts it in a file is applied
(``completed``), or is freed: its publish failed or found the file gone (or, for
PutFiles, left its file out), its writer dropped it (CompleteFileRequest.
abandoned_block_ids, PutFilesRequest.abandoned), its file was removed before it
completed, or, for a put, nothing claimed it within PUT_BLOCK_TTL
(master/cluster/capacity.py frees those).  In memory only: a restarted master knows none, and accepts a block a
writer got before the restart with its write token instead (Master.complete,
put_file).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

# A put's blocks (AddBlock's put form) not claimed by PutFile within this many seconds
# are freed (Capacity); PutFile refuses them afterwards.  Blocks not pending at all are
# accepted (with their write token) only this soon after the master started: from
# before a restart, which forgot what was pending.
PUT_BLOCK_TTL = 600.0


class PendingBlocks:
    """block id -> (owner ino, time placed (time.time()), workers, bytes reserved);
    thread-safe.  ``queue_deletes(pairs)`` (the registry's) takes the (worker, block,
    bytes) of blocks freed here."""

    def __init__(self, queue_deletes: Callable[[list[tuple[int, int, int]]], None]):
        self._queue_deletes = queue_deletes
        self._blocks: dict[int, tuple[int, float, list[int], int]] = {}
        self._lock = threading.Lock()

    def add(self, block_id: int, owner: int, workers: list[int], size: int) -> None:
        """``block_id`` was placed on ``workers`` for inode ``owner`` (0: a put)."""
        with self._lock:
            self._blocks[block_id] = (owner, time.time(), workers, size)

    def __contains__(self, block_id: int) -> bool:
        with self._lock:
            return block_id in self._blocks

    def owners(self, block_ids: Iterable[int]) -> dict[int, int]:
        """The owner of each of ``block_ids`` that is pending."""
        with self._lock:
            return {b: self._blocks[b][0] for b in block_ids if b in self._blocks}

    def completed(self, block_ids: Iterable[int]) -> None:
        """These blocks are in a file now (a record was applied): no longer pending."""
        with self._lock:
            for b in block_ids:
                self._blocks.pop(b, None)

    def free(self, block_ids: Iterable[int]) -> None:
        """Delete these blocks (those pending) from their workers."""
        pairs = []
        with self._lock:
            for b in block_ids:
                p = self._blocks.pop(b, None)
                if p is not None:
                    pairs.extend((w, b, p[3]) for w in p[2])
        if pairs:  # (nothing to delete: no wake-up of the delete thread)
            self._queue_deletes(pairs)

    def free_abandoned(self, ino: int, block_ids: Iterable[int]) -> None:
        """Blocks a writer of ``ino`` was given and dropped (CompleteFileRequest.
        abandoned_block_ids): delete them now.  Only blocks still pending for that inode
        qualify, so a wrong or repeated list can free nothing that a file uses."""
        pairs = []
        with self._lock:
            for b in block_ids:
                p = self._blocks.get(b)
                if p is not None and p[0] == ino:
                    del self._blocks[b]
                    pairs.extend((w, b, p[3]) for w in p[2])
        if pairs:
            self._queue_deletes(pairs)

    def owners_and_overdue_puts(self) -> tuple[set[int], list[int]]:
        """(the inodes blocks are pending for, a put's blocks older than
        PUT_BLOCK_TTL)."""
        with self._lock:
            inos = {p[0] for p in self._blocks.values()}
            # a put's blocks (owner 0) are unclaimed once PutFile is overdue
            overdue = time.time() - PUT_BLOCK_TTL
            stale_puts = [b for b, p in self._blocks.items() if p[0] == 0 and p[1] < overdue]
        return inos, stale_puts

    def of_owners(self, inos: set[int]) -> list[int]:
        """The pending blocks of these inodes."""
        with self._lock:
            return [b for b, p in self._blocks.items() if p[0] in inos]
