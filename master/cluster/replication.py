"""Replicas on the master: declaring workers lost, and copying under-replicated blocks.

A background loop (``ReplicationMonitor``, one round every ``interval``):

1. A worker silent for ``master.worker_lost_after`` is declared lost: it gets no
   placements, readers go to other replicas, and its blocks become suspects (copied
   from the other replicas where the file wants more).  Its locations are kept for
   ``master.lost_grace``: a pause (GC, I/O stall, network blip) is not a loss.  Still
   lost after the grace, its locations are dropped (DropLocationsRecord, journaled; a
   file left without any replica is removed from the namespace by that record's
   apply, so readers get ENOENT).  A lost worker that heartbeats again is asked to
   register again, so that its full block report tells what it still holds; back
   within the grace, it keeps every location (a copy made meanwhile that is now one
   too many is deleted from it).  Silence while
   the master itself was stalled does not count (master/cluster/lag.py), and losing more than
   ``master.max_lost_share`` of the workers at once is held, files kept, for
   ``master.mass_loss_hold`` (a fault of the master or the network, not of them all).
2. Suspect blocks (hinted by drops, by files completed with fewer replicas than
   wanted, and found by one scan of every file after the master starts) are checked
   against the file's wanted count (``Inode.replicas``, else ``cluster.replicas``).
   For a block short of replicas the master picks live targets with room (as for new
   blocks) and queues "copy block B from these sources" commands, handed to each
   target in its next heartbeat reply.  At most ``replication_max_inflight`` copies
   per target; a copy not confirmed within ``replication_timeout`` is given up and
   planned again, as is one the worker reports failed (after a short back-off).
2b. A copy a reader found not intact (reported with ReportAccess) is checked by the
   worker that holds it (a VerifyCommand in its next heartbeat reply, never dropped on
   a client's word alone); a worker that finds a copy not intact (that check, or the
   file changed after it was finished) removes it and reports it in a heartbeat: the
   location is dropped (journaled) and the block copied again from a sound replica
   (a file left with none is removed, a clean ENOENT).
3. A worker confirms finished copies in its next heartbeat; the master admits them as
   locations with an AddLocationsRecord (journaled) while the file still wants them,
   and asks the worker to delete any copy it does not want (never more replicas than
   wanted).  A rejoining worker's block report goes through the same admission: a
   block the master dropped while the worker was lost becomes a location again when
   its file still has it and is short of replicas, and is deleted otherwise.

Nothing here is durable on its own: suspects, copies in flight and the lost set are
rebuilt after a restart (the start-up scan, and heartbeats / block reports).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from curvine.common.config import MasterConfig
from curvine.common.errors import CurvineError, invalid
from curvine.proto import common_pb2, master_pb2

from ..meta.committer import Plan
from ..meta.namespace import Namespace
from ..meta.store import U64, Store
from .workers import WorkerRegistry

log = logging.getLogger(__name__)

DROP_CHUNK = 10_000  # block ids per DropLocationsRecord
MAX_BAD_REPORT = 1000  # copies one ReportAccess may say are bad
MAX_VERIFY_QUEUED = 1000  # checks waiting for one worker's next heartbeat
PLAN_PER_ROUND = 5_000  # suspects examined per round (the rest wait for the next one)
RETRY_BACKOFF = 5.0  # seconds before a block whose copy failed is planned again
NO_SOURCE_BACKOFF = 2.0  # seconds before a block without a live source / target is retried
UNKNOWN_LENGTH = 1 << 63  # a stored length that was not reported: assume it covers


class ReplicationMonitor:
    """Worker loss and re-replication for one master (see the module docstring).

    ``store`` and ``ns``: the metadata it reads and plans records with; ``registry``:
    the workers; ``submit(plan)``: commits a record (the master's, which revokes leases
    too); ``started``: when the master started (time.monotonic(): silence counts from
    there); ``mc``: the master.* settings; ``default_replicas``: cluster.replicas."""

    def __init__(self, store: Store, ns: Namespace, registry: WorkerRegistry,
                 submit: Callable[[Plan], Any], started: float, mc: MasterConfig,
                 default_replicas: int):
        self.store = store
        self.ns = ns
        self.registry = registry
        self.submit = submit
        self.started = started
        self.default_replicas = int(default_replicas)
        self.max_inflight = max(1, int(mc.replication_max_inflight))
        self.copy_timeout = max(1.0, float(mc.replication_timeout))
        self.interval = min(1.0, max(0.05, float(mc.worker_lost_after) / 4))
        self.max_lost_share = float(mc.max_lost_share)
        self.mass_loss_hold = float(mc.mass_loss_hold)
        self.lost_grace = float(mc.lost_grace)
        self._held: set[int] = set()  # silent workers of a mass loss being held
        self._held_since = 0.0  # since (time.monotonic())
        self._held_logged = 0.0
        self._lock = threading.Lock()
        self._suspects: dict[int, float] = {}  # block id -> not before (time.monotonic())
        self._inflight: dict[int, dict[int, float]] = {}  # block id -> {target: deadline}
        self._commands: dict[int, dict[int, master_pb2.ReplicateCommand]] = {}  # by target
        # copies readers reported bad, for their workers to check: worker -> {block: cmd}
        self._verify: dict[int, dict[int, master_pb2.VerifyCommand]] = {}
        self._lost: set[int] = set()  # workers declared lost (silent; asked to re-register)
        self._lost_at: dict[int, float] = {}  # since when (time.monotonic())
        self._dropped: set[int] = set()  # lost past the grace: locations dropped
        self._dropping: set[int] = set()  # lost, locations being dropped right now
        self.scanned = False
        self._round_lock = threading.Lock()  # one round at a time (loop or a test)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replication", daemon=True)

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.run_round()
            except CurvineError as e:  # e.g. the journal is stopping: try again later
                log.warning("replication round failed: %s", e)
            except Exception:  # noqa: BLE001 - the loop must survive a bug in one round
                log.exception("replication round failed")

    def run_round(self) -> None:
        """One round: declare lost workers, scan once after start, expire copies that
        took too long, plan copies of under-replicated blocks."""
        with self._round_lock:
            self._declare_lost()
            self._drop_expired()
            if not self.scanned:
                self._scan()
                self.scanned = True
            self._expire()
            self._plan()

    # ------------------------------------------------------------------ hints
    def hint(self, block_ids) -> None:
        """These blocks may be short of replicas: check them in the next round."""
        with self._lock:
            for b in block_ids:
                if b:
                    self._suspects.setdefault(b, 0.0)

    def hint_completed(self, blocks, node: common_pb2.Inode) -> None:
        """A version was published: its blocks written to fewer workers than wanted
        (a worker failed, or too few were alive) are suspects."""
        wanted = self.ns.wanted_replicas(node, self.default_replicas)
        self.hint(b.block_id for b in blocks if b.block_id and len(b.worker_ids) < wanted)

    # ------------------------------------------------------------------ lost workers
    def _to_declare(self, silent: list[int]) -> list[int]:
        """Which of the ``silent`` workers (not lost yet) to declare lost now.  More
        than ``master.max_lost_share`` of the registered workers lost at once looks like
        a fault of the master or the network more than of the workers, whose data may
        well still be on their disks: such a loss is held, its workers' files kept
        (reads go to other replicas, or fail until the workers return), for
        ``master.mass_loss_hold``; a held worker that comes back leaves the hold, and
        those still silent when it ends are declared lost after all."""
        now = time.monotonic()
        if self._held:
            self._held &= set(silent)  # the ones that came back are fine
        if not self._held:
            registered = self.registry.count()
            # Workers that fail together fall silent within a heartbeat or two of each
            # other: the ones half way to being lost count as going with these.
            going = set(self.registry.silent(self.started, 0.5)) | set(silent)
            with self._lock:
                lost = len(self._lost)
                going -= self._lost
            if not silent or lost + len(going) <= self.max_lost_share * registered:
                return silent
            self._held, self._held_since, self._held_logged = going, now, now
            log.error("HOLDING a mass loss: %d of %d registered workers silent (%s; more "
                      "than master.max_lost_share %.0f%%): their files are kept, not "
                      "removed, for up to master.mass_loss_hold (%.0fs): check the "
                      "master's host and network; the workers' data may still be on disk",
                      lost + len(going), registered, ", ".join(map(str, sorted(going))),
                      self.max_lost_share * 100, self.mass_loss_hold)
        held_for = now - self._held_since
        if held_for >= self.mass_loss_hold:
            log.error("workers %s still silent after %.0fs (master.mass_loss_hold): "
                      "declaring them lost", ", ".join(map(str, sorted(self._held))),
                      held_for)
            self._held = set()
            return silent
        if now - self._held_logged >= 60.0:
            self._held_logged = now
            log.error("holding the loss of workers %s for %.0fs more",
                      ", ".join(map(str, sorted(self._held))), self.mass_loss_hold - held_for)
        return [w for w in silent if w not in self._held]

    def _declare_lost(self) -> None:
        silent = [w for w in self.registry.silent(self.started) if not self.is_lost(w)]
        if not silent and not self._held:
            return
        new = self._to_declare(silent)
        for wid in new:
            with self._lock:
                if wid in self._lost:
                    continue
                self._lost.add(wid)  # from here on its heartbeats ask it to re-register
                self._lost_at[wid] = time.monotonic()
                dropped_cmds = self._commands.pop(wid, {})
                for b, targets in self._inflight.items():
                    targets.pop(wid, None)
                for b in dropped_cmds:
                    self._suspects.setdefault(b, 0.0)
            with self.store.read() as txn:
                ids = list(self.store.blocks_on_worker(txn, wid))
            info = self.registry.info(wid)
            log.warning("worker %d (%s) missed heartbeats for %.0fs: declared lost (no "
                        "placements, reads go elsewhere); its %d block locations are kept "
                        "for %.0fs (master.lost_grace)", wid, info.address if info else "?",
                        self.registry.lost_after, len(ids), self.lost_grace)
            self.hint(ids)  # copied from the other replicas where files want more
        if new and self.lost_grace <= 0:
            self._drop_expired()

    def _drop_expired(self) -> None:
        """Drop the locations of workers lost for longer than the grace."""
        now = time.monotonic()
        with self._lock:
            due = [w for w in self._lost - self._dropped - self._dropping
                   if now - self._lost_at.get(w, now) >= self.lost_grace]
            self._dropping.update(due)
        for wid in due:
            with self.store.read() as txn:
                ids = list(self.store.blocks_on_worker(txn, wid))
            info = self.registry.info(wid)
            log.warning("worker %d (%s) still lost after %.0fs (master.lost_grace): "
                        "dropping its %d block locations", wid,
                        info.address if info else "?", self.lost_grace, len(ids))
            try:
                for i in range(0, len(ids), DROP_CHUNK):
                    self._drop(wid, ids[i:i + DROP_CHUNK])
                with self._lock:
                    if wid in self._lost:
                        self._dropped.add(wid)
            finally:
                with self._lock:
                    self._dropping.discard(wid)
            self.hint(ids)

    def _drop(self, wid: int, block_ids: list[int]) -> None:
        self.submit(lambda txn: self.ns.plan_drop_locations(txn, wid, block_ids))

    def held_count(self) -> int:
        return len(self._held)

    def is_lost(self, wid: int) -> bool:
        with self._lock:
            return wid in self._lost

    # ------------------------------------------------------------------ planning
    def _scan(self) -> None:
        """Every file's blocks once (after a master start nothing in memory says which
        blocks are short of replicas)."""
        store, ns = self.store, self.ns
        found = []
        with store.read() as txn:
            for key, value in txn.cursor(db=store.db["fblocks"]):
                blocks = common_pb2.BlockList.FromString(value).blocks
                node = store.get_inode(txn, U64.unpack(key)[0])
                if node is None:
                    continue
                wanted = ns.wanted_replicas(node, self.default_replicas)
                found.extend(b.block_id for b in blocks
                             if b.block_id and len(b.worker_ids) < wanted)
        if found:
            log.info("%d blocks have fewer replicas than wanted", len(found))
        self.hint(found)

    def _evaluate(self, txn, block_id: int):
        """(ino, block, wanted) of a block some file still has, else None."""
        store = self.store
        ino = store.block_owner(txn, block_id)
        node = store.get_inode(txn, ino) if ino is not None else None
        if node is None:
            return None
        block = next((b for b in store.get_blocks(txn, ino) if b.block_id == block_id), None)
        if block is None:
            return None
        return ino, block, self.ns.wanted_replicas(node, self.default_replicas)

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            for b, targets in list(self._inflight.items()):
                for wid, deadline in list(targets.items()):
                    if deadline <= now:
                        log.info("copy of block %016x to worker %d not confirmed within "
                                 "%.0fs; planning it again", b, wid, self.copy_timeout)
                        del targets[wid]
                        self._commands.get(wid, {}).pop(b, None)
                        self._suspects.setdefault(b, 0.0)
                if not targets:
                    del self._inflight[b]

    def _plan(self) -> None:
        registry = self.registry
        now = time.monotonic()
        alive = registry.alive_ids()
        with self._lock:
            due = [b for b, t in self._suspects.items() if t <= now][:PLAN_PER_ROUND]
            lost = set(self._lost)
            dropped = set(self._dropped)
            load: dict[int, int] = {}
            for targets in self._inflight.values():
                for wid in targets:
                    load[wid] = load.get(wid, 0) + 1
        busy = {wid for wid, n in load.items() if n >= self.max_inflight}
        stale: dict[int, list[int]] = {}  # locations on dropped workers (written after the drop)
        with self.store.read() as txn:
            for b in due:
                ev = self._evaluate(txn, b)
                with self._lock:
                    pending = dict(self._inflight.get(b, {}))
                if ev is None:
                    self._forget(b)
                    continue
                _ino, block, wanted = ev
                for w in block.worker_ids:
                    if w in dropped:
                        stale.setdefault(w, []).append(b)
                have = [w for w in block.worker_ids if w not in lost]
                if len(have) >= wanted:
                    if not pending:
                        self._forget(b)
                    continue
                need = wanted - len(have) - len(pending)
                if need <= 0:
                    continue  # enough copies in flight: checked again once they report
                sources = [registry.info(w) for w in have if w in alive]
                sources = [s for s in sources if s is not None]
                exclude = set(block.worker_ids) | set(pending) | busy | lost
                targets = registry.choose(need, "", block.length, exclude, b) if sources else []
                if not targets:
                    with self._lock:
                        if b in self._suspects:
                            self._suspects[b] = now + NO_SOURCE_BACKOFF
                    continue
                cmd = master_pb2.ReplicateCommand(block_id=b, length=block.length,
                                                  checksum=block.checksum, sources=sources)
                with self._lock:
                    for t in targets:
                        self._commands.setdefault(t.worker_id, {})[b] = cmd
                        self._inflight.setdefault(b, {})[t.worker_id] = now + self.copy_timeout
                        load[t.worker_id] = load.get(t.worker_id, 0) + 1
                        if load[t.worker_id] >= self.max_inflight:
                            busy.add(t.worker_id)
                log.debug("block %016x: %d of %d replicas; copying to %s", b, len(have),
                          wanted, [t.worker_id for t in targets])
        for wid, ids in stale.items():
            self._drop(wid, ids)

    def _forget(self, block_id: int) -> None:
        with self._lock:
            self._suspects.pop(block_id, None)

    # ------------------------------------------------------------------ workers' side
    def on_heartbeat(self, req: master_pb2.HeartbeatRequest,
                     reply: master_pb2.HeartbeatReply) -> None:
        """Take a worker's copy outcomes; hand it the copies queued for it."""
        wid = req.worker_id
        with self._lock:
            if wid in self._lost:
                reply.reregister = True  # its block report says what it still holds
                return
            for b in req.failed_block_ids:
                self._inflight.get(b, {}).pop(wid, None)
                if b in self._inflight and not self._inflight[b]:
                    del self._inflight[b]
                self._suspects[b] = time.monotonic() + RETRY_BACKOFF
            for b in req.replicated_block_ids:
                self._inflight.get(b, {}).pop(wid, None)
                if b in self._inflight and not self._inflight[b]:
                    del self._inflight[b]
            commands = self._commands.pop(wid, {})
            verify = self._verify.pop(wid, {})
        if req.bad_block_ids:
            self._drop_bad(wid, list(req.bad_block_ids))
        reply.verify.extend(verify.values())
        if req.failed_block_ids:
            log.info("worker %d could not copy %d blocks; planning them again",
                     wid, len(req.failed_block_ids))
        if req.replicated_block_ids:
            self.admit(wid, {b: UNKNOWN_LENGTH for b in req.replicated_block_ids})
            self.hint(req.replicated_block_ids)
        reply.replicate.extend(commands.values())

    def verify_copies(self, copies: list[tuple[int, int]]) -> None:
        """Readers found these (block id, worker id) copies not intact: have each worker
        check its copy against the recorded crc32 (bounded per worker; copies no file
        locates there, or of unknown crc32, are ignored)."""
        if len(copies) > MAX_BAD_REPORT:
            raise invalid("bad_copies", f"{len(copies)} entries, at most {MAX_BAD_REPORT}")
        store = self.store
        with store.read() as txn:
            found = []
            for block_id, wid in copies:
                ev = self._evaluate(txn, block_id)
                if ev is not None and wid in ev[1].worker_ids and ev[1].checksum:
                    found.append((wid, master_pb2.VerifyCommand(
                        block_id=block_id, length=ev[1].length, checksum=ev[1].checksum)))
        with self._lock:
            for wid, cmd in found:
                queue = self._verify.setdefault(wid, {})
                if len(queue) < MAX_VERIFY_QUEUED:
                    queue[cmd.block_id] = cmd
        if found:
            log.info("readers found %d copies not intact: their workers check them",
                     len(found))

    def _drop_bad(self, wid: int, block_ids: list[int]) -> None:
        """Worker ``wid`` removed these copies (not intact): no longer locations, and
        copied again from the other replicas."""
        log.warning("worker %d found %d copies not intact and removed them (e.g. block "
                    "%016x): dropping those locations, copying them again from sound "
                    "replicas", wid, len(block_ids), block_ids[0])
        for i in range(0, len(block_ids), DROP_CHUNK):
            self._drop(wid, block_ids[i:i + DROP_CHUNK])
        self.hint(block_ids)

    def on_block_report(self, req: master_pb2.BlockReportRequest) -> None:
        """A (re)joining worker's full report: blocks that files still have but that
        are not located on it (dropped while it was lost) are admitted again when
        their file is short of replicas, else deleted."""
        wid = req.worker_id
        lengths = list(req.block_lengths) if len(req.block_lengths) == len(req.block_ids) else []
        store = self.store
        candidates: dict[int, int] = {}
        with store.read() as txn:
            located = set(store.blocks_on_worker(txn, wid))
            for i, b in enumerate(req.block_ids):
                if b not in located and store.block_owner(txn, b) is not None:
                    candidates[b] = lengths[i] if lengths else UNKNOWN_LENGTH
        with self._lock:
            was_lost = wid in self._lost
            in_grace = was_lost and wid not in self._dropped
            self._lost.discard(wid)
            self._lost_at.pop(wid, None)
            self._dropped.discard(wid)
        if in_grace:
            self._trim_after_grace(wid)
        if candidates:
            added = self.admit(wid, candidates)
            log.info("worker %d rejoined%s: %d of its %d blocks that were no longer located "
                     "there are replicas again", wid, " after being lost" if was_lost else "",
                     len(added), len(candidates))
        elif was_lost:
            log.info("worker %d rejoined after being lost", wid)

    def _trim_after_grace(self, wid: int) -> None:
        """Worker ``wid`` came back within the grace: where a copy made meanwhile left
        a block with more locations than its file wants, its own copy goes (dropped,
        journaled, and deleted on it)."""
        store = self.store
        extra: list[tuple[int, int]] = []
        with store.read() as txn:
            for b in store.blocks_on_worker(txn, wid):
                ev = self._evaluate(txn, b)
                if ev is not None and len(ev[1].worker_ids) > ev[2]:
                    extra.append((b, ev[1].length))
        if not extra:
            return
        log.info("worker %d is back within master.lost_grace: %d of its copies are one "
                 "too many (copied elsewhere meanwhile); deleting them", wid, len(extra))
        for i in range(0, len(extra), DROP_CHUNK):
            self._drop(wid, [b for b, _ in extra[i:i + DROP_CHUNK]])
        self.registry.queue_deletes([(wid, b, n) for b, n in extra])

    def admit(self, wid: int, lengths: dict[int, int]) -> list[int]:
        """Record copies on worker ``wid`` as locations where wanted (journaled); ask
        the worker to delete the others.  Returns the block ids admitted."""
        ns = self.ns
        with self._lock:
            lost = set(self._lost)  # their locations do not count until they are back
        added, unwanted = self.submit(
            lambda txn: ns.plan_add_locations(txn, wid, lengths, self.default_replicas,
                                              lost))
        if unwanted:
            log.info("worker %d holds %d copies no file wants (enough replicas, or the "
                     "file is gone); deleting them", wid, len(unwanted))
            self.registry.queue_deletes(
                [(wid, b, lengths[b] if lengths.get(b, UNKNOWN_LENGTH) != UNKNOWN_LENGTH
                  else 0) for b in unwanted])
        return added

    # ------------------------------------------------------------------ status
    def status(self, limit: int = 0) -> master_pb2.ReplicationStatusReply:
        limit = limit or 100
        with self._lock:
            ids = set(self._suspects) | set(self._inflight)
            in_flight = sum(len(t) for t in self._inflight.values())
            lost = sorted(self._lost)
            dropped = sorted(self._lost - self._dropping)
        reply = master_pb2.ReplicationStatusReply(copies_in_flight=in_flight,
                                                  lost_workers=dropped, scanned=self.scanned)
        inos: set[int] = set()
        with self.store.read() as txn:
            for b in ids:
                ev = self._evaluate(txn, b)
                if ev is None:
                    continue
                ino, block, wanted = ev
                if len([w for w in block.worker_ids if w not in lost]) < wanted:
                    reply.under_replicated_blocks += 1
                    inos.add(ino)
        reply.under_replicated_inos.extend(sorted(inos)[:limit])
        return reply
