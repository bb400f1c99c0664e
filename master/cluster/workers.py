"""Workers as the master sees them: registrations, liveness, placement, the queue of
block deletes, and the one account of each worker's usage.

Registrations are journaled (worker ids are named by block locations); liveness,
usage and the delete queues live in memory and are rebuilt from heartbeats and block
reports after a master restart.

Usage (``WorkerState.estimated_used``) is what placement, eviction, statfs and the
metrics all read.  The worker's heartbeat reports its used bytes together with the
block ids it finalised and deleted since the previous heartbeat, so the master knows
exactly which of its own changes that number already includes:

- a block placed here (AddBlock, a re-replication copy) counts its reserved bytes
  from placement until the worker reports it finalised or deleted; once a publish
  names its length (``published``), that length; a create's block counts nothing
  before that (``unsized``: the writer has not written yet, as a writer before its
  AddBlock at close);
- a block whose deletion the worker has confirmed (the master's DeleteBlocks call
  returned, master/cluster/deleter.py) no longer counts, until a heartbeat reports it removed;
- a block queued for deletion but not yet confirmed still counts: it is still on the
  worker's disk, and placing new data in its space would make the worker refuse it.
  Eviction counts such bytes as on their way out (``pending_free``) so that it does
  not evict for the same space twice.

Capacity (``WorkerState.capacity``) is what the worker reported, except where live
workers' data dirs share a file system (equal ``Volume.fs_id``: same host, same
device): each of them would report the whole free space of that disk, so the master
divides it between them (:func:`apportion`) and a worker's capacity is what it stores
plus its share.  The pool, the sum of the live workers' capacities, then never
exceeds the disks.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field

from curvine.proto import common_pb2

from .lag import LagMonitor

PLACED_EXPIRY = 600.0  # seconds: a placement never reported nor freed stops counting


@dataclass
class WorkerState:
    info: common_pb2.WorkerInfo
    capacity: int = 0  # reported_capacity, or its share where a disk is shared
    reported_capacity: int = 0
    volumes: dict[str, int] = field(default_factory=dict)  # fs_id -> free, as reported
    shares_with: tuple[int, ...] = ()  # live workers sharing one of its file systems
    used: int = 0  # as last reported
    num_blocks: int = 0
    last_heartbeat: float = 0.0  # time.monotonic(); 0 = not heard from since master start
    deletes: set[int] = field(default_factory=set)  # to hand out (DeleteBlocks, heartbeat)
    # block id -> (bytes reserved, monotonic time placed): not yet in ``used``
    placed: dict[int, tuple[int, float]] = field(default_factory=dict)
    # block id -> bytes, of blocks in ``used`` that the master removed: ``confirmed``
    # ones are gone from the worker's disk, the others are still there
    deleting: dict[int, int] = field(default_factory=dict)
    confirmed: set[int] = field(default_factory=set)
    secret_digest: bytes = b""  # binds the uuid (journaled; kept out of ``info``)
    registration: bytes = b""  # of the live registration (heartbeats carry it)
    # the blocks located here when the live registration was answered, until its block
    # report arrives: only these may be missing from it (Registry.take_report_basis)
    report_basis: frozenset[int] | None = None

    def estimated_used(self) -> int:
        placed = sum(n for n, _ in self.placed.values())
        gone = sum(self.deleting[b] for b in self.confirmed)
        return max(self.used + placed - gone, 0)

    def pending_free(self) -> int:
        """Bytes deleted by the master that the worker has not confirmed yet."""
        return sum(n for b, n in self.deleting.items() if b not in self.confirmed)

    def free(self) -> int:
        return max(self.capacity - self.estimated_used(), 0)

    def reset_account(self) -> None:
        self.placed.clear()
        self.deleting.clear()
        self.confirmed.clear()


@dataclass(frozen=True)
class WorkerUsage:
    worker_id: int
    alive: bool
    capacity: int
    reported_used: int
    used: int  # estimated (the account placement reads)
    pending_free: int  # of ``used``: deleted, not yet confirmed by the worker


def apportion(workers: dict[int, tuple[int, int, dict[str, int]]],
              free: dict[str, int]) -> tuple[dict[int, int], dict[int, set[int]]]:
    """Capacities of live workers whose file systems may be shared.

    ``workers``: worker id -> (reported capacity, reported used, {fs_id: free}); ``free``:
    fs_id -> its latest free bytes.  A worker's room is ``capacity - used`` (its own
    limit: worker.capacity, or the free space of its disks when it has none); the free
    space of each file system is handed out to the workers on it by water-filling, no
    one getting more than its room, so the rooms of the workers on a file system add up
    to at most its free space.  Returns ({worker id: capacity}, {worker id: the others
    sharing a file system with it}); a worker that shares none (or reported no volumes)
    keeps the capacity it reported."""
    on: dict[str, list[int]] = {}
    for wid, (_, _, vols) in workers.items():
        for fs_id in vols:
            on.setdefault(fs_id, []).append(wid)
    room = {wid: max(cap - used, 0) for wid, (cap, used, _) in workers.items()}
    left = dict(room)
    got = {wid: 0 for wid in workers}
    for fs_id in sorted(on):
        sharers = sorted(on[fs_id], key=lambda w: (left[w], w))
        remaining = free.get(fs_id, 0)
        for i, wid in enumerate(sharers):
            give = min(left[wid], remaining // (len(sharers) - i))
            got[wid] += give
            left[wid] -= give
            remaining -= give
    capacity, peers = {}, {}
    for wid, (cap, used, vols) in workers.items():
        others = {w for fs_id in vols for w in on[fs_id]} - {wid}
        if vols:
            peers[wid] = others
        if not others or not cap:
            capacity[wid] = cap  # alone on its disks: its own number (worker.capacity)
            continue
        capacity[wid] = max(used + min(room[wid], got[wid]), 1)
    return capacity, peers


class WorkerRegistry:
    def __init__(self, lost_after: float, lag: LagMonitor | None = None):
        self.lost_after = lost_after
        self.lag = lag  # the master's own stalls do not count as workers' silence
        self._lock = threading.Lock()
        self._workers: dict[int, WorkerState] = {}
        self._free: dict[str, int] = {}  # fs_id -> free bytes, the latest report of it
        self._reports = 0  # heartbeats and registrations so far (apportion's cache key)
        self._apportioned: tuple | None = None
        self.deletes_queued = threading.Condition(self._lock)  # notified by queue_deletes

    def upsert(self, record: common_pb2.WorkerInfo) -> None:
        """A registration record (from the journal or the store); its secret digest is
        kept here, never in the ``info`` that clients are sent."""
        info = common_pb2.WorkerInfo()
        info.CopyFrom(record)
        info.ClearField("secret_digest")
        with self._lock:
            st = self._workers.get(info.worker_id)
            if st is None:
                st = self._workers[info.worker_id] = WorkerState(info=info)
            else:
                st.info = info
            if record.secret_digest:
                st.secret_digest = record.secret_digest

    def by_uuid(self, uuid: str) -> common_pb2.WorkerInfo | None:
        with self._lock:
            for st in self._workers.values():
                if st.info.uuid == uuid:
                    return st.info
        return None

    def secret_digest(self, worker_id: int) -> bytes:
        with self._lock:
            st = self._workers.get(worker_id)
            return st.secret_digest if st is not None else b""

    def registration_ok(self, worker_id: int, registration: bytes) -> bool:
        """Whether a heartbeat or block report names the live registration of its
        worker (an impostor without the worker's secret has none)."""
        with self._lock:
            st = self._workers.get(worker_id)
            return (st is not None and bool(st.registration)
                    and hmac.compare_digest(st.registration, registration))

    def known(self, worker_id: int) -> bool:
        with self._lock:
            return worker_id in self._workers

    def registered(self, worker_id: int, capacity: int, used: int, volumes=(),
                   located: frozenset[int] = frozenset()) -> bytes:
        """A (re)registration: its usage is the whole truth, placements and deletes the
        master counted before are forgotten (a restarted worker lost its writes in
        flight; its block report settles the rest).  ``located``: the blocks the master
        locates on the worker now, read before this registration is answered (the
        report's basis, ``take_report_basis``).  Returns the new registration
        (heartbeats and block reports must carry it)."""
        registration = secrets.token_bytes(16)
        with self._lock:
            st = self._workers.get(worker_id)
            if st is not None:
                st.reset_account()
                st.registration = registration
                st.report_basis = located
        self.heartbeat(worker_id, capacity, used, 0, volumes=volumes)
        return registration

    def take_report_basis(self, worker_id: int) -> frozenset[int]:
        """The blocks the worker's block report must name, once: those the master
        located on it when it answered the live registration.  The worker lists its
        blocks only after that answer, and a location is added only after its block was
        finished there, so each of these was finished before the listing: one the report
        lacks is gone.  A location added since may belong to a block finished after the
        listing, while the report was in flight: it is not the report's to drop.  Empty
        for a second report of one registration (the first settled it)."""
        with self._lock:
            st = self._workers.get(worker_id)
            if st is None or st.report_basis is None:
                return frozenset()
            basis, st.report_basis = st.report_basis, None
            return basis

    def heartbeat(self, worker_id: int, capacity: int, used: int, num_blocks: int,
                  added=(), removed=(), failed=(), lost: bool = False,
                  volumes=()) -> list[int] | None:
        """Record a heartbeat (``added``/``removed``: block ids finalised/deleted since the
        last one, which ``used`` includes; ``failed``: copies that were not made;
        ``volumes``: common_pb2.Volume of its data dirs' file systems); returns the blocks
        to delete, or None for an unknown worker."""
        now = time.monotonic()
        with self._lock:
            st = self._workers.get(worker_id)
            if st is None:
                return None
            st.reported_capacity, st.used, st.num_blocks = capacity, used, num_blocks
            st.volumes = {v.fs_id: v.free for v in volumes}
            self._free.update(st.volumes)
            self._reports += 1
            st.last_heartbeat = now
            self._apportion(now)
            if lost:
                st.reset_account()
            for b in added:
                st.placed.pop(b, None)
            for b in failed:
                st.placed.pop(b, None)
            for b in removed:
                st.placed.pop(b, None)
                st.deleting.pop(b, None)
                st.confirmed.discard(b)
            stale = [b for b, (_, t) in st.placed.items() if now - t > PLACED_EXPIRY]
            for b in stale:
                del st.placed[b]
            # whatever master/cluster/deleter.py has not delivered yet (it is woken at once, so
            # these are mostly deletes it could not deliver)
            deletes = sorted(st.deletes)
            st.deletes.clear()
            return deletes

    def queue_deletes(self, triples) -> None:
        """Blocks to delete: (worker id, block id, bytes) each."""
        with self._lock:
            for worker_id, block_id, nbytes in triples:
                st = self._workers.get(worker_id)
                if st is None:
                    continue
                st.deletes.add(block_id)
                if block_id not in st.placed:  # else ``used`` does not include it yet
                    st.deleting[block_id] = nbytes
            self.deletes_queued.notify_all()

    def take_deletes(self) -> dict[int, tuple[str, list[int]]]:
        """worker id -> (address, block ids) of every queued delete of a live worker,
        taken out of the queues (``give_back_deletes`` if they cannot be delivered)."""
        now = time.monotonic()
        out = {}
        with self._lock:
            for wid, st in self._workers.items():
                if st.deletes and self.alive(st, now):
                    out[wid] = (st.info.address, sorted(st.deletes))
                    st.deletes.clear()
        return out

    def give_back_deletes(self, worker_id: int, block_ids) -> None:
        """Deletes taken and not delivered: the next heartbeat reply carries them."""
        with self._lock:
            st = self._workers.get(worker_id)
            if st is not None:
                st.deletes.update(block_ids)

    def confirm_deletes(self, worker_id: int, block_ids) -> None:
        """The worker has deleted these blocks (its DeleteBlocks call returned)."""
        with self._lock:
            st = self._workers.get(worker_id)
            if st is None:
                return
            for b in block_ids:
                st.placed.pop(b, None)  # finalised or not, it is not there now
                if b in st.deleting:
                    st.confirmed.add(b)

    def alive(self, st: WorkerState, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return st.last_heartbeat > 0 and now - st.last_heartbeat < self.lost_after

    def _apportion(self, now: float) -> None:
        """(under the lock) Set each worker's ``capacity``: its share where live workers
        share a file system (:func:`apportion`), else what it reported.  Recomputed only
        when a report arrived or the set of live workers changed since the last time."""
        live = frozenset(wid for wid, st in self._workers.items() if self.alive(st, now))
        key = (self._reports, live)
        if key == self._apportioned:
            return
        self._apportioned = key
        capacity, peers = apportion(
            {wid: (self._workers[wid].reported_capacity, self._workers[wid].used,
                   self._workers[wid].volumes) for wid in live}, self._free)
        for wid, st in self._workers.items():
            st.capacity = capacity.get(wid, st.reported_capacity)
            st.shares_with = tuple(sorted(peers.get(wid, ())))

    def apportioned(self) -> None:
        """Bring every worker's ``capacity`` up to date (master/ports/report.py, which reads
        the states under the lock itself, calls this first)."""
        with self._lock:
            self._apportion(time.monotonic())

    def snapshot(self) -> list[tuple[common_pb2.WorkerInfo, bool]]:
        """Every registered worker with capacity and (estimated) used filled in, and
        whether it is alive."""
        now = time.monotonic()
        out = []
        with self._lock:
            self._apportion(now)
            for st in self._workers.values():
                info = common_pb2.WorkerInfo()
                info.CopyFrom(st.info)
                info.capacity, info.used = st.capacity, st.estimated_used()
                alive = self.alive(st, now)
                info.lost = not alive and st.last_heartbeat > 0
                out.append((info, alive))
        return out

    def usage(self) -> list[WorkerUsage]:
        now = time.monotonic()
        with self._lock:
            self._apportion(now)
            return [WorkerUsage(wid, self.alive(st, now), st.capacity, st.used,
                                st.estimated_used(), st.pending_free())
                    for wid, st in self._workers.items()]

    def silent(self, since: float, fraction: float = 1.0) -> list[int]:
        """Workers that missed heartbeats for ``lost_after`` (times ``fraction``): silent
        since their last one, or never heard from although the master has run (since
        ``since``, a time.monotonic()) for that long."""
        now = time.monotonic()
        limit = self.lost_after * fraction
        heard = self.lag.heard_since if self.lag is not None else (lambda t, now: t)
        with self._lock:
            return [wid for wid, st in self._workers.items()
                    if now - heard(st.last_heartbeat or since, now) >= limit]

    def count(self) -> int:
        with self._lock:
            return len(self._workers)

    def alive_ids(self) -> set[int]:
        now = time.monotonic()
        with self._lock:
            return {wid for wid, st in self._workers.items() if self.alive(st, now)}

    def for_readers(self, wids) -> list[common_pb2.WorkerInfo]:
        """The registered workers among ``wids``, by id, as a read reply gives them:
        ``lost`` set on those silent past lost_after (readers try them last, and the
        connector takes a block only on them as a miss)."""
        now = time.monotonic()
        out = []
        with self._lock:
            for wid in sorted(wids):
                st = self._workers.get(wid)
                if st is None:
                    continue
                info = st.info
                if st.last_heartbeat > 0 and not self.alive(st, now):
                    info = common_pb2.WorkerInfo()
                    info.CopyFrom(st.info)
                    info.lost = True
                out.append(info)
        return out

    def info(self, worker_id: int) -> common_pb2.WorkerInfo | None:
        with self._lock:
            st = self._workers.get(worker_id)
            return st.info if st is not None else None

    def published(self, blocks) -> None:
        """Blocks (common_pb2.Block) a publish put in a file: those still counted at
        what placement reserved count their length from now on, until their workers
        report them."""
        with self._lock:
            for b in blocks:
                for wid in b.worker_ids:
                    st = self._workers.get(wid)
                    placed = st.placed.get(b.block_id) if st is not None else None
                    if placed is not None:
                        st.placed[b.block_id] = (b.length, placed[1])

    def unsized(self, block_id: int, worker_ids) -> None:
        """A block placed before anything was written (a create's): it counts nothing
        until a publish names its length.  Counted whole, four LMCache writers' creates
        reserved 256 MiB of a 512 MiB pool and eviction took their newest chunks; a
        mount writer's own AddBlock comes at close with the length, as this now counts."""
        with self._lock:
            for wid in worker_ids:
                st = self._workers.get(wid)
                placed = st.placed.get(block_id) if st is not None else None
                if placed is not None:
                    st.placed[block_id] = (0, placed[1])

    def choose(self, count: int, host_id: str, size: int, exclude: set[int],
               block_id: int) -> list[common_pb2.WorkerInfo]:
        """Place ``block_id`` on up to ``count`` live workers with room for ``size``
        bytes (one on the client's host first, then the ones with the most free
        space); those bytes count as used there from now on."""
        now = time.monotonic()
        with self._lock:
            self._apportion(now)
            candidates = []
            for wid, st in self._workers.items():
                if wid in exclude or not self.alive(st, now):
                    continue
                free = st.free()
                if st.capacity and free < size:
                    continue
                local = bool(host_id) and st.info.host_id == host_id
                candidates.append((not local, -free, wid, st))
            candidates.sort(key=lambda c: c[:3])
            chosen = [c[3] for c in candidates[:count]]
            for st in chosen:
                st.placed[block_id] = (size, now)
            return [st.info for st in chosen]
