"""What the admin CLI asks the master: the Report RPC (`curvine report`) and the
Checkpoint RPC (`curvine journal checkpoint`).

The report is assembled from what the master already keeps: the worker registry
(workers.py), LMDB's own entry counts (store.py; O(1), no scan, so a report is cheap
with millions of files), capacity.py (usage, watermarks, eviction counters),
replication.py (under-replicated blocks), leases.py (lease counters) and the lookup
hit/miss counts that the servicer keeps in :class:`LookupCounts`.
"""

from __future__ import annotations

import threading
import time

from curvine.journal.checkpoint import latest_checkpoint
from curvine.proto import master_pb2

CHECKPOINT_WAIT = 600.0  # seconds a checkpoint may take when the caller sets no deadline


class LookupCounts:
    """Lookups that found a name (hits) and that did not (misses), as the master
    answers them: for LMCache a miss is a KV chunk no pod has stored yet."""

    def __init__(self):
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def count(self, found: bool) -> None:
        self.count_many(int(found), int(not found))

    def count_many(self, found: int, missed: int) -> None:
        with self._lock:
            self.hits += found
            self.misses += missed


def _workers(master, lost: set[int]) -> list[master_pb2.WorkerReport]:
    registry = master.registry
    now = time.monotonic()
    rows = []
    # One consistent copy under the registry's lock: heartbeats update these fields
    # together, and the registry's snapshot() leaves out block counts and times.
    registry.apportioned()  # capacities as shares where workers share a disk
    with registry._lock:
        states = [(st.info, st.capacity, st.used, st.num_blocks, st.last_heartbeat,
                   registry.alive(st, now), st.shares_with) for st in registry._workers.values()]
    for info, capacity, used, blocks, last, alive, peers in sorted(states, key=lambda s: s[0].worker_id):
        if alive:
            state = "live"
        elif last > 0 or info.worker_id in lost:
            state = "lost"
        else:
            state = "unknown"
        rows.append(master_pb2.WorkerReport(
            worker_id=info.worker_id, address=info.address, host_id=info.host_id,
            state=state, capacity=capacity, used=used, blocks=blocks,
            heartbeat_age=now - last if last > 0 else -1.0, shares_disk_with=peers))
    return rows


def build(master, lookups: LookupCounts) -> master_pb2.ReportReply:
    """The Report RPC's reply."""
    rep = master.replication.status(1)
    reply = master_pb2.ReportReply(workers=_workers(master, set(rep.lost_workers)))
    store = master.store
    with store.read() as txn:
        reply.inodes = store.get_u64(txn, b"inode_count")
        reply.files_with_data = txn.stat(store.db["fblocks"])["entries"]
        reply.blocks = txn.stat(store.db["block"])["entries"]
        reply.block_locations = txn.stat(store.db["wblock"])["entries"]
        reply.applied_seq = store.get_u64(txn, b"applied_seq")
        reply.inline_bytes = store.inline_bytes(txn)
    reply.under_replicated_blocks = rep.under_replicated_blocks
    reply.copies_in_flight = rep.copies_in_flight
    reply.replication_scanned = rep.scanned
    reply.capacity.CopyFrom(master.capacity.status())
    reply.lookup_hits, reply.lookup_misses = lookups.hits, lookups.misses
    reply.lease_stats.update(master.leases.stats)
    reply.lease_sessions = master.leases.open_sessions()
    reply.journal_first_seq = master.journal.first_seq
    ckpt = latest_checkpoint(master.ckpt_root)
    reply.checkpoint_seq = ckpt[0] if ckpt else 0
    reply.uptime = time.monotonic() - master.started
    return reply


def _noop(txn):
    return None, None


def checkpoint_now(master, timeout: float | None = None) -> master_pb2.CheckpointReply:
    """Have the committer checkpoint now and return the checkpoint it wrote.

    The committer checkpoints between batches, after the batch that carries the
    request.  A no-op submitted after the request lands in that batch or a later one;
    a second no-op submitted once the first is answered can only be taken after the
    checkpoint step that follows the first one's batch.  So when it is answered, a
    checkpoint covering everything applied before this call exists.
    """
    timeout = timeout or CHECKPOINT_WAIT
    deadline = time.monotonic() + timeout
    retired = master.journal.stats["segments_retired"]
    master.committer.request_checkpoint()
    master.committer.submit(_noop, timeout=timeout)
    master.committer.submit(_noop, timeout=max(deadline - time.monotonic(), 1.0))
    seq, path = latest_checkpoint(master.ckpt_root) or (0, "")
    return master_pb2.CheckpointReply(
        seq=seq, path=path, retired_segments=master.journal.stats["segments_retired"] - retired)
