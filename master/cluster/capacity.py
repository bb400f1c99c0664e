"""Capacity: what keeps the cache from filling up (docs/capacity.md).

One background thread of the master removes files, each batch as one journaled
``EvictRecord`` (so a restarted master replays the same namespace) whose blocks go to
the workers' delete queues like any unlink, and whose names are revoked from the
mounts' leases by ``Master.submit``:

- **LRU eviction.**  Mounts report the files they open for reading in batches
  (``ReportAccess``, never journaled); creating and completing a file counts as an
  access too.  ``AccessLog`` keeps ino -> last access in an OrderedDict, oldest
  first; a restarted master rebuilds it from the inodes' atime/mtime in LMDB, so it
  still evicts the oldest first.  When the live workers' estimated usage passes
  ``master.evict_high`` (a fraction of their capacity), the least recently used
  *complete* files are evicted until it is below ``master.evict_low``.
- **TTL.**  A complete file whose mtime + ttl has passed is removed (ttl_ms comes
  from its directory at create, or from SetPolicy on the file).
- **Orphans.**  A file still being written whose writer's mount is gone: Create
  records the mount's lease session (``CreateRecord.writer_session``, kept in
  LMDB's ``writer`` table until the file completes); once every session known to
  write the file has been closed for ``master.orphan_timeout``, and no block was
  added to it for as long, the file is removed.  A mount that reconnects opens a new
  session listing its old ones (``SessionRequest.dropped``): those count as alive
  again, so a live but slow writer is never removed.  Files created without a
  session (mounts without leases, the CLI) are never treated as orphans.
- **Unlinked files kept open.**  A file whose last name went while a mount had it
  open stays, without a name (nlink 0), held by that mount's session (LMDB's
  ``held`` table, namespace.py ``_keeps``) until the mount's ReleaseInode; if that
  session is gone for ``master.orphan_timeout`` (the same liveness as orphans'), it is
  removed here (``EVICT_UNLINKED``).  LRU eviction and TTL never take such a file:
  it has no name to miss, and its reader still reads it.

Usage is the master's one account of each worker (master/cluster/workers.py): the workers'
heartbeats, plus the blocks placed since, minus the blocks the workers confirmed
deleted (master/cluster/deleter.py delivers deletes at once, not with the next heartbeat).
Eviction counts blocks whose delete is not yet confirmed as on their way out, so one
round never evicts the same space twice; a placement that pushes usage over the high
watermark wakes the loop at once.

**Placement that finds no room makes room** (``make_room``, called by AddBlock): it
evicts the least recently used files synchronously (journaled like any eviction),
delivers their deletes, and places the block, within ``cluster.rpc_timeout``.  One
placement at a time makes room, under the same lock as the background round; the
others wait for it and then find the room it made.  ENOSPC reaches a writer only when
nothing is evictable or the block is larger than every worker.

**Files open for reading are never evicted** (nor expired by their TTL before they
are closed).  The opens, the mounts' sessions and the blocks kept for open files are
master/cluster/opens.py's; the blocks placed and not yet published,
master/cluster/pending.py's (a put's that PutFile did not claim in time, and those of
files removed while written, are freed from here).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time

from typing import Any, Callable

from curvine.common.config import MasterConfig
from curvine.common.errors import CurvineError, ErrorKind, invalid
from curvine.proto import common_pb2, journal_pb2, master_pb2

from ..meta.committer import Plan
from ..meta.namespace import Namespace
from ..meta.store import Store
from .deleter import DeletePusher
from .opens import MountSessions, OpenFiles
from .pending import PendingBlocks
from .workers import WorkerRegistry

log = logging.getLogger(__name__)

FILE = common_pb2.FILE
COMPLETE = common_pb2.COMPLETE
WRITING = common_pb2.WRITING
MAX_REPORT = 10_000  # inodes (and closed opens) per ReportAccess
ROOM_RETRY = 0.05  # seconds between attempts of a placement waiting for deletes
HELD_RETRY = 1.0  # seconds before an expired file that was open is looked at again
SCAN_PER_ROUND = 20_000  # LRU entries looked at per eviction round
REBUILD_BATCH = 10_000  # inodes read per LMDB read transaction at start


class AccessLog:
    """ino -> last access (ns), least recently used first; thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._od: collections.OrderedDict[int, int] = collections.OrderedDict()

    def touch(self, inos, t_ns: int) -> None:
        with self._lock:
            od = self._od
            for ino in inos:
                od[ino] = t_ns
                od.move_to_end(ino)

    def get(self, ino: int) -> int | None:
        return self._od.get(ino)

    def forget(self, inos) -> None:
        with self._lock:
            for ino in inos:
                self._od.pop(ino, None)

    def oldest(self, n: int) -> list[tuple[int, int]]:
        with self._lock:
            return list(itertools.islice(self._od.items(), n))

    def merge_older(self, entries: list[tuple[int, int]]) -> None:
        """Put ``entries`` (ino, time) from the start-up scan *before* everything
        touched meanwhile (those accesses are newer)."""
        entries.sort(key=lambda e: e[1])
        with self._lock:
            od = collections.OrderedDict((ino, t) for ino, t in entries if ino not in self._od)
            od.update(self._od)
            self._od = od

    def __len__(self) -> int:
        return len(self._od)


class Capacity:
    """Eviction, TTL expiry and orphan removal for one master (see the module doc)."""

    def __init__(self, store: Store, ns: Namespace, submit: Callable[[Plan], Any],
                 registry: WorkerRegistry, deletes: DeletePusher, pending: PendingBlocks,
                 opens: OpenFiles, sessions: MountSessions, lru: AccessLog,
                 mc: MasterConfig):
        """``store``, ``ns``: the metadata it reads and plans evictions with;
        ``submit(plan)``: commits a record (the master's, which revokes leases too);
        ``registry``: the workers' usage (the one account) and delete queues;
        ``deletes``: delivers deletes now, for a placement waiting for room; ``pending``:
        blocks placed and not yet published (freed here when they cannot be any more);
        ``opens``: files open on mounts (never evicted); ``sessions``: the mounts'
        liveness (orphans); ``lru``: the access order (OpenFiles touches it too: an
        open is an access); ``mc``: the master.* settings."""
        self.store = store
        self.ns = ns
        self.submit = submit
        self.registry = registry
        self.deletes = deletes
        self.pending = pending
        self.opens = opens
        self.sessions = sessions
        self.lru = lru
        self.high = float(mc.evict_high)
        self.low = float(mc.evict_low)
        self.interval = float(mc.evict_interval)
        self.batch = int(mc.evict_batch)
        self._lock = threading.Lock()
        # one round of eviction at a time: the background loop or a placement making room
        self._room_lock = threading.Lock()
        self._ttl_due: dict[int, int] = {}  # ino -> expiry (ns); authority for _ttl_heap
        self._ttl_heap: list[tuple[int, int]] = []  # (expiry ns, ino), lazily pruned
        self._writers: dict[int, set[int]] = {}  # ino being written -> writer sessions
        self._activity: dict[int, float] = {}  # ino being written -> last create/add block
        self.stats = {"rounds": 0, "evicted_files": 0, "evicted_bytes": 0,
                      "expired_files": 0, "expired_bytes": 0, "orphans_removed": 0,
                      "orphan_bytes": 0, "access_reports": 0, "accesses": 0,
                      "evict_failures": 0, "room_made": 0, "room_evicted_files": 0,
                      "no_room": 0, "unlinked_removed": 0, "unlinked_bytes": 0}
        self.ready = threading.Event()  # the start-up scan is done
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="capacity", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        try:
            self._rebuild()
        except Exception:  # noqa: BLE001 - without the scan, eviction starts from scratch
            log.exception("capacity: start-up scan failed")
        self.ready.set()
        while not self._stop.is_set():
            more = False
            try:
                more = self.run_round()
            except CurvineError as e:
                self.stats["evict_failures"] += 1
                log.warning("capacity round failed: %s", e)
            except Exception:  # noqa: BLE001 - the loop must survive a bug in one round
                self.stats["evict_failures"] += 1
                log.exception("capacity round failed")
            if not more:
                self._wake.wait(self.interval)
                self._wake.clear()

    def _rebuild(self) -> None:
        """LRU order, TTL deadlines and writers of a (re)started master, from LMDB."""
        started = time.monotonic()
        store = self.store
        entries: list[tuple[int, int]] = []
        due: list[tuple[int, int]] = []
        writing: set[int] = set()
        after = 0
        while not self._stop.is_set():
            with store.read() as txn:
                cur = txn.cursor(db=store.db["inode"])
                if not cur.set_range(after.to_bytes(8, "big")):
                    break
                n = 0
                for key, val in cur:
                    ino = int.from_bytes(key, "big")
                    if ino == after:
                        continue
                    node = common_pb2.Inode()
                    node.ParseFromString(val)
                    after = ino
                    n += 1
                    if node.type == FILE and node.nlink:  # (nlink 0: held, see above)
                        if node.state == COMPLETE:
                            entries.append((ino, max(node.atime_ns, node.mtime_ns)))
                            if node.ttl_ms:
                                due.append((node.mtime_ns + node.ttl_ms * 1_000_000, ino))
                        else:
                            writing.add(ino)
                    if n >= REBUILD_BATCH:
                        break
                if n < REBUILD_BATCH:
                    break
        with store.read() as txn:
            recorded = [(ino, sid) for ino, sid in store.writers(txn) if ino in writing]
        self.lru.merge_older(entries)
        with self._lock:
            for expiry, ino in due:
                self._set_due(ino, expiry)
            for ino, sid in recorded:
                self._writers.setdefault(ino, set()).add(sid)
        log.info("capacity: %d files tracked, %d with a TTL, %d being written by a known "
                 "mount (scan %.2fs)", len(entries), len(due), len(recorded),
                 time.monotonic() - started)

    # ------------------------------------------------------------------ hooks
    def on_create(self, node: common_pb2.Inode, session: int) -> None:
        """A Create (new file, or an existing one opened for write) by ``session``."""
        if node.type != FILE or node.state != WRITING:
            return
        with self._lock:
            if session:
                self._writers.setdefault(node.ino, set()).add(session)
            self._activity[node.ino] = time.monotonic()
        self.lru.touch([node.ino], time.time_ns())

    def on_add_block(self, ino: int) -> None:
        """A block was placed (its bytes are in the workers' account already): its file
        is being written, and the pool may have crossed the high watermark."""
        with self._lock:
            if ino in self._writers:
                self._activity[ino] = time.monotonic()
        if self.estimated_over_high():
            self._wake.set()

    def on_complete(self, node: common_pb2.Inode) -> None:
        """A version was published: an access, maybe a TTL deadline."""
        self.on_complete_many([node])

    def on_complete_many(self, nodes: list[common_pb2.Inode]) -> None:
        """Versions were published (PutFiles: one call for the files of one record)."""
        if not nodes:
            return
        self.lru.touch([n.ino for n in nodes], time.time_ns())
        with self._lock:
            for node in nodes:
                self._writers.pop(node.ino, None)
                self._activity.pop(node.ino, None)
                if node.ttl_ms:
                    self._set_due(node.ino, node.mtime_ns + node.ttl_ms * 1_000_000)

    def on_policy(self, node: common_pb2.Inode) -> None:
        if node.type == FILE and node.state == COMPLETE and node.ttl_ms:
            with self._lock:
                self._set_due(node.ino, node.mtime_ns + node.ttl_ms * 1_000_000)
            self._wake.set()

    def on_released(self, ino: int) -> None:
        """An unlinked file kept open was removed by its mount's ReleaseInode."""
        self.lru.forget([ino])
        with self._lock:
            self._ttl_due.pop(ino, None)

    def report_access(self, inos, session: int = 0, closed_opens=()) -> None:
        if len(inos) > MAX_REPORT:
            raise invalid("inos", f"{len(inos)} entries, at most {MAX_REPORT} per report")
        if len(closed_opens) > MAX_REPORT:
            raise invalid("closed_opens", f"{len(closed_opens)} entries, at most "
                                          f"{MAX_REPORT} per report")
        if closed_opens and not session:
            raise invalid("session", "required with closed_opens")
        self.lru.touch(inos, time.time_ns())
        if closed_opens:
            self.opens.note_closed(session, closed_opens)
        self.stats["access_reports"] += 1
        self.stats["accesses"] += len(inos)

    # ------------------------------------------------------------------ usage
    def usage(self) -> tuple[int, int, int]:
        """(capacity, reported used, estimated used) of the live workers."""
        live = [u for u in self.registry.usage() if u.alive]
        return (sum(u.capacity for u in live), sum(u.reported_used for u in live),
                sum(u.used for u in live))

    def _projected(self) -> tuple[int, int]:
        """(capacity, estimated used less what is being deleted) of the live workers."""
        live = [u for u in self.registry.usage() if u.alive]
        return sum(u.capacity for u in live), sum(u.used - u.pending_free for u in live)

    def limits(self, capacity: int) -> tuple[int, int]:
        """(evict above, evict down to) in bytes: the watermarks.  Placement needs only
        the bytes a writer will write (AddBlock's size hint), and one that finds no room
        makes it (``make_room``), so no block-sized headroom is kept beside them."""
        return int(self.high * capacity), int(self.low * capacity)

    def estimated_over_high(self) -> bool:
        capacity, projected = self._projected()
        return capacity > 0 and projected > self.limits(capacity)[0]

    def status(self) -> master_pb2.CapacityStatusReply:
        capacity, used, estimate = self.usage()
        return master_pb2.CapacityStatusReply(
            capacity=capacity, used=used, estimated_used=estimate, high=self.high,
            low=self.low, stats=dict(self.stats), tracked_files=len(self.lru))

    # ------------------------------------------------------------------ rounds
    def run_round(self) -> bool:
        """One bounded round of TTL expiry, orphan removal and eviction; True when
        there is more to do right away."""
        if not self.ready.is_set():
            return False
        self.stats["rounds"] += 1
        self._free_abandoned_blocks()
        self.opens.release_kept()  # of mounts that died with files open
        more = self._expire_ttl()
        more = self._remove_orphans() or more
        more = self._remove_unlinked() or more
        with self._room_lock:
            more = self._evict_lru() or more
        return more

    def _evict_lru(self) -> bool:
        """(under _room_lock) Evict down to the low watermark, a batch at a time."""
        capacity, projected = self._projected()
        above, below = self.limits(capacity)
        if capacity <= 0 or projected <= above:
            return False
        need = projected - below
        chosen, freed, full = self._victims(lambda freed: sum(freed.values()) >= need)
        if not chosen:
            log.warning("pool above the high watermark (%d of %d bytes) but no file to "
                        "evict (every file is open or being written)", projected, capacity)
            return False
        removed, freed_bytes = self._evict(chosen)
        log.info("evicted %d least recently used files (%d bytes): pool at %d of %d bytes "
                 "(high %.2f, low %.2f)", len(removed), sum(freed_bytes.values()), projected,
                 capacity, self.high, self.low)
        self.deletes.deliver(time.monotonic() + self.deletes.timeout)
        # more to do if this batch was cut short by its size
        return full and sum(freed.values()) < need

    def _victims(self, enough) -> tuple[list[tuple[int, int]], dict[int, int], bool]:
        """The least recently used complete files that no reader has open, oldest first,
        until ``enough(bytes freed per live worker)`` or a batch is full.  Returns
        (chosen (ino, last access), bytes per worker, whether the batch is full)."""
        live = {u.worker_id for u in self.registry.usage() if u.alive}
        chosen: list[tuple[int, int]] = []
        freed: dict[int, int] = {}
        gone = []
        store = self.store
        now = time.monotonic()
        with store.read() as txn:
            for ino, t in self.lru.oldest(SCAN_PER_ROUND):
                node = store.get_inode(txn, ino)
                if node is None or node.type != FILE or node.nlink == 0:
                    gone.append(ino)  # (nlink 0: unlinked, kept open: never evicted)
                    continue
                if node.state != COMPLETE:
                    continue  # being written: never evicted (orphans are handled apart)
                if self.opens.is_open(ino, now):
                    continue
                blocks = store.get_blocks(txn, ino)
                if not any(b.block_id for b in blocks) and any(b.HasField("data") for b in blocks):
                    continue  # inline (master.inline_capacity bounds those): frees no worker
                for b in blocks:
                    if b.block_id:
                        for w in b.worker_ids:
                            if w in live:
                                freed[w] = freed.get(w, 0) + b.length
                chosen.append((ino, t))
                if enough(freed) or len(chosen) >= self.batch:
                    break
        self.lru.forget(gone)
        return chosen, freed, len(chosen) >= self.batch

    def _evict(self, chosen: list[tuple[int, int]]) -> tuple[list[int], dict[int, int]]:
        """Journal the eviction of ``chosen`` files that are still complete, unread since
        they were chosen and not opened meanwhile."""
        seen = dict(chosen)

        def still_wanted(node):
            # complete, and not read (nor republished) since it was chosen
            return node.state == COMPLETE and self.lru.get(node.ino) == seen[node.ino]

        removed, freed, _ = self._remove(journal_pb2.EVICT_LRU, [i for i, _ in chosen],
                                         still_wanted, keep_open=True)
        self.stats["evicted_files"] += len(removed)
        self.stats["evicted_bytes"] += sum(freed.values())
        return removed, freed

    def make_room(self, place, size: int, exclude: set[int], deadline: float):
        """Make room for a block of ``size`` bytes that ``place()`` (the registry's
        placement) found no worker for, and place it: evict the least recently used
        files, deliver their deletes, try again; until ``deadline`` (monotonic).
        NO_SPACE when nothing is evictable or no worker could ever hold the block."""
        def no_room(why: str) -> CurvineError:
            self.stats["no_room"] += 1
            return CurvineError(ErrorKind.NO_SPACE, why)

        if not self._room_lock.acquire(timeout=max(deadline - time.monotonic(), 0)):
            raise no_room("no room for the block: the eviction in flight did not finish "
                          "in time")
        try:
            while True:
                workers = place()
                if workers:
                    return workers
                eligible = [u for u in self.registry.usage()
                            if u.alive and u.worker_id not in exclude and u.capacity]
                if not eligible:
                    raise no_room("no live worker can take the block")
                if all(u.capacity < size for u in eligible):
                    raise no_room(f"a block of {size} bytes is larger than every worker")
                if time.monotonic() >= deadline:
                    raise no_room("no room for the block within cluster.rpc_timeout")
                room = {u.worker_id: u.capacity - u.used for u in eligible}
                coming = {u.worker_id: u.pending_free for u in eligible}
                if any(room[w] + coming[w] >= size for w in room):
                    # Deletes on their way make the room: deliver them and try again; if
                    # a heartbeat reply carried them, the next heartbeat confirms them.
                    if not self.deletes.deliver(deadline):
                        time.sleep(ROOM_RETRY)
                    continue

                def enough(freed):
                    return any(room[w] + coming[w] + freed.get(w, 0) >= size for w in room)

                chosen, _, _ = self._victims(enough)
                if not chosen:
                    raise no_room("no room for the block and nothing to evict: every file "
                                  "is open for reading or being written")
                removed, freed = self._evict(chosen)
                if not removed:
                    continue  # read or opened meanwhile: choose again
                self.stats["room_made"] += 1
                self.stats["room_evicted_files"] += len(removed)
                # (counted in curvine_placement_room_made_total: one per store when full)
                log.debug("made room for a block of %d bytes: evicted %d least recently used "
                         "files (%d bytes)", size, len(removed), sum(freed.values()))
                self.deletes.deliver(deadline)
                self._wake.set()  # the background round brings usage down to the low mark
        finally:
            self._room_lock.release()

    def _expire_ttl(self) -> bool:
        now = time.time_ns()
        due: list[int] = []
        with self._lock:
            heap = self._ttl_heap
            while heap and heap[0][0] <= now and len(due) < self.batch:
                expiry, ino = heapq.heappop(heap)
                if self._ttl_due.get(ino) == expiry:
                    del self._ttl_due[ino]
                    due.append(ino)
            more = bool(heap) and heap[0][0] <= now
        if not due:
            return False
        later: list[common_pb2.Inode] = []

        def still_wanted(node):
            if node.state != COMPLETE or not node.ttl_ms:
                return False
            if node.mtime_ns + node.ttl_ms * 1_000_000 > time.time_ns():
                later.append(node)  # new version or mtime since: not yet
                return False
            return True

        removed, freed, held = self._remove(journal_pb2.EVICT_TTL, due, still_wanted,
                                            keep_open=True)
        for node in later:
            self.on_policy(node)
        if held:  # expired but open for reading: removed once closed
            retry = time.time_ns() + int(HELD_RETRY * 1e9)
            with self._lock:
                for ino in held:
                    self._set_due(ino, retry)
        self.stats["expired_files"] += len(removed)
        self.stats["expired_bytes"] += sum(freed.values())
        if removed:
            log.info("removed %d expired files (TTL, %d bytes)", len(removed), sum(freed.values()))
        return more

    def _free_abandoned_blocks(self) -> None:
        """Blocks handed out for a version of a file that no longer exists (removed
        while written, e.g. a failed store whose ``.tmp`` was unlinked): that version
        can never be published, so their space goes back now, not at the workers' next
        block report."""
        inos, stale_puts = self.pending.owners_and_overdue_puts()
        if stale_puts:
            self.pending.free(stale_puts)
            log.info("freed %d blocks allocated for puts that were never published",
                     len(stale_puts))
        inos.discard(0)
        if not inos:
            return
        with self.store.read() as txn:
            gone = {ino for ino in inos if self.store.get_inode(txn, ino) is None}
        if gone:
            blocks = self.pending.of_owners(gone)
            self.pending.free(blocks)
            log.info("freed %d blocks written for files removed before they completed",
                     len(blocks))

    def _remove_orphans(self) -> bool:
        now = time.monotonic()
        orphans = []
        with self._lock:
            for ino, sessions in self._writers.items():
                if not self.sessions.gone_for_good(sessions, now):
                    continue
                if (now - self._activity.get(ino, self.sessions.started)
                        < self.sessions.orphan_timeout):
                    continue
                orphans.append(ino)
                if len(orphans) >= self.batch:
                    break
        if not orphans:
            return False

        def still_wanted(node):
            return node.state == WRITING and node.ino in self._writers

        removed, freed, _ = self._remove(journal_pb2.EVICT_ORPHAN, orphans, still_wanted)
        with self._lock:
            for ino in orphans:  # removed, completed meanwhile, or gone already
                self._writers.pop(ino, None)
                self._activity.pop(ino, None)
        self.stats["orphans_removed"] += len(removed)
        self.stats["orphan_bytes"] += sum(freed.values())
        if removed:
            log.info("removed %d files whose writer's mount is gone for over %.0fs "
                     "(orphans, %d bytes)", len(removed), self.sessions.orphan_timeout,
                     sum(freed.values()))
        return len(orphans) >= self.batch

    def _remove_unlinked(self) -> bool:
        """Unlinked files kept open by a mount whose session is gone for the orphan
        timeout: nobody can release them any more."""
        now = time.monotonic()
        with self.store.read() as txn:
            held = list(self.store.held(txn))
        if not held:
            return False
        gone = []
        with self._lock:
            for ino, sid in held:
                if self.sessions.gone_for_good({sid}, now):
                    gone.append(ino)
                    if len(gone) >= self.batch:
                        break
        if not gone:
            return False
        removed, freed, _ = self._remove(journal_pb2.EVICT_UNLINKED, gone,
                                         lambda node: node.nlink == 0)
        self.stats["unlinked_removed"] += len(removed)
        self.stats["unlinked_bytes"] += sum(freed.values())
        if removed:
            log.info("removed %d unlinked files kept open by a mount that is gone for over "
                     "%.0fs (%d bytes)", len(removed), self.sessions.orphan_timeout,
                     sum(freed.values()))
        return len(gone) >= self.batch

    def _remove(self, reason: int, inos: list[int], still_wanted, keep_open: bool = False,
                ) -> tuple[list[int], dict, list[int]]:
        """Journal the removal of those of ``inos`` that ``still_wanted`` in one record
        (its blocks are queued for deletion by Master._on_effects).  ``keep_open``:
        not those a mount has open for reading, and no open of the others succeeds
        until the record is journaled.  Returns (removed, bytes per worker, kept open)."""
        held: list[int] = []
        if keep_open:
            held = self.opens.begin_eviction(inos, time.monotonic())
            inos = [i for i in inos if i not in held]
        ns = self.ns
        try:
            value = self.submit(lambda txn: ns.plan_evict(txn, reason, inos, still_wanted)
                                ) if inos else None
        finally:
            if keep_open:
                self.opens.end_eviction(inos)
        removed, freed = value if value is not None else ([], {})
        self.lru.forget(removed)
        with self._lock:
            for ino in removed:
                self._ttl_due.pop(ino, None)
        return removed, freed, held

    def _set_due(self, ino: int, expiry: int) -> None:
        """(under _lock) ino expires at ``expiry`` (ns)."""
        if self._ttl_due.get(ino) != expiry:
            self._ttl_due[ino] = expiry
            heapq.heappush(self._ttl_heap, (expiry, ino))
