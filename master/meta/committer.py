"""The committer: the one thread that changes the master's state.

Mutations are queued to it.  It takes everything queued (a batch), plans and applies
each one inside a single LMDB write transaction (so later mutations of the batch see
earlier ones), appends their records to the journal, makes the journal durable with
ONE fsync, and only then commits the LMDB transaction and answers the callers.  The
batch grows while an fsync is running: that is the group commit.  Readers use their
own LMDB read transactions and so never see a mutation that is not yet durable.
A caller either waits (``submit``: unary RPCs, background rounds) or is called back
once its batch is durable (``submit_async``: the call port's steps, master/meta/steps.py).

On start, records after LMDB's ``applied_seq`` are replayed through the same
``Namespace.apply``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from curvine.common.errors import CurvineError, ErrorKind
from curvine.journal import Journal, JournalError
from curvine.journal.checkpoint import write_checkpoint
from curvine.proto import journal_pb2

from .namespace import Effects, Namespace
from .store import Store

log = logging.getLogger(__name__)

Plan = Callable[[Any], tuple[journal_pb2.JournalEntry | None, Any]]
_OP_NUMBER = {f.name: f.number for f in journal_pb2.JournalEntry.DESCRIPTOR.oneofs_by_name["op"].fields}
REPLAY_TXN_RECORDS = 5000


@dataclass(frozen=True)
class RetryHit:
    """A mutation with this request id was already applied; ``ino`` is its result."""

    ino: int


def result_ino(value: Any, ino: int) -> int:
    """The inode a mutation's value names: for a request applied before (a RetryHit,
    from the retry cache), the one its first answer named; else ``ino``."""
    return value.ino if isinstance(value, RetryHit) else ino


class _Latch:
    """Set once by the committer, waited for by one caller: a bare lock (one futex wake),
    cheaper than threading.Event's condition variable on the path of every mutation."""

    __slots__ = ("_lock",)

    def __init__(self):
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:
            pass  # set already

    def wait(self, timeout: float) -> bool:
        return self._lock.acquire(timeout=timeout)


class _Item:
    __slots__ = ("plan", "request_id", "done", "then", "result", "error", "fx")

    def __init__(self, plan: Plan, request_id: bytes, then: Callable | None = None):
        self.plan = plan
        self.request_id = request_id
        # submit waits on ``done``; submit_async's ``then(item)`` is called instead
        self.done = _Latch() if then is None else None
        self.then = then
        self.result: Any = None
        self.error: CurvineError | None = None
        self.fx: Effects | None = None  # what this mutation's record did

    def finish(self) -> None:
        """Its batch is durable (or failed): wake or call back its caller."""
        if self.then is None:
            self.done.set()
            return
        try:
            self.then(self)
        except Exception:  # noqa: BLE001 - one caller's bug must not stop the committer
            log.exception("a mutation's completion callback failed")


def record_type(entry: journal_pb2.JournalEntry) -> int:
    return _OP_NUMBER[entry.WhichOneof("op")]


class Committer:
    def __init__(self, store: Store, journal: Journal, ns: Namespace,
                 on_effects: Callable[[Effects], None], checkpoint_root: str,
                 checkpoint_every: int = 1_000_000, max_batch: int = 4096,
                 checkpoint_bytes: int = 0):
        self.store = store
        self.journal = journal
        self.ns = ns
        self.on_effects = on_effects
        # called in this thread right after each live record is applied, before the
        # next plan (Master._on_applied); the batch is not durable yet
        self.on_applied: Callable[[Effects], None] | None = None
        self.checkpoint_root = checkpoint_root
        self.checkpoint_every = checkpoint_every
        # journal bytes written since the last checkpoint that make one due as well
        # (small files' bytes travel in the records: master.inline_max); 0 = never
        self.checkpoint_bytes = checkpoint_bytes
        self._last_checkpoint_bytes = 0
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._checkpoint_requested = threading.Event()
        self.fatal: BaseException | None = None
        self.applied_seq = 0
        self._last_checkpoint_seq = 0
        self.stats = {"batches": 0, "records": 0, "max_batch": 0}

    # ------------------------------------------------------------------ recovery
    def replay(self) -> int:
        """Apply journal records after LMDB's applied_seq; returns how many."""
        s = self.store
        with s.env.begin() as txn:
            applied = s.get_u64(txn, b"applied_seq")
        if self.journal.last_seq < applied:
            raise JournalError(
                f"journal ends at seq {self.journal.last_seq} but the metadata in {s.path} "
                f"has applied seq {applied}: the journal directory is not this master's")
        started = time.monotonic()
        # Records LMDB already holds only refill the retry cache.
        count = self._apply_records(self.journal.records(min(applied, self.journal.first_seq - 1)),
                                    applied)
        self._last_checkpoint_seq = self.applied_seq if count == 0 else self._last_checkpoint_seq
        if count:
            log.info("replayed %d journal records in %.2fs (applied seq %d)",
                     count, time.monotonic() - started, self.applied_seq)
        return count

    def follow(self) -> int:
        """A standby's round (the committer thread is not running): apply the records
        the leader made durable since this member's applied seq, through the same
        apply as replay; returns how many."""
        if self.journal.refresh() <= self.applied_seq:  # one read of etcd when idle
            return 0
        return self._apply_records(self.journal.records(self.applied_seq), self.applied_seq)

    def _apply_records(self, records, applied: int) -> int:
        """Apply ``records`` with seq > ``applied`` (remembering every one in the retry
        cache), REPLAY_TXN_RECORDS per LMDB transaction, each storing its applied seq;
        hands the effects to ``on_effects``; returns how many were applied."""
        s = self.store
        count = 0
        fx = Effects()
        txn = s.env.begin(write=True)
        try:
            for rec in records:
                entry = journal_pb2.JournalEntry()
                entry.ParseFromString(rec.payload)
                self.ns.remember(entry)
                if rec.seq <= applied:
                    continue
                self.ns.apply(txn, entry, fx)
                applied = rec.seq
                count += 1
                if count % REPLAY_TXN_RECORDS == 0:
                    s.put_u64(txn, b"applied_seq", applied)
                    txn.commit()
                    txn = s.env.begin(write=True)
            s.put_u64(txn, b"applied_seq", applied)
            txn.commit()
        except BaseException:
            txn.abort()
            raise
        self.applied_seq = applied
        self.on_effects(fx)
        return count

    # ------------------------------------------------------------------ live path
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="committer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    def problem(self) -> str | None:
        """Why mutations cannot be committed now (for /healthz), or None."""
        if self.fatal is not None:
            return f"journal failure: {self.fatal}"
        if self.journal.failure is not None:
            return f"journal not writable: {self.journal.failure}"
        if self._thread is None or not self._thread.is_alive():
            return "the committer thread is not running"
        return None

    def submit(self, plan: Plan, request_id: bytes = b"", timeout: float = 30.0) -> Any:
        """Run ``plan`` in the committer; return its value once durable (or a RetryHit)."""
        return self.submit_fx(plan, request_id, timeout)[0]

    def submit_fx(self, plan: Plan, request_id: bytes = b"", timeout: float = 30.0
                  ) -> tuple[Any, Effects | None]:
        """Like submit; also returns the Effects of the record (None if it wrote none)."""
        self._check_running()
        item = _Item(plan, request_id)
        self._queue.put(item)
        if not item.done.wait(timeout):
            raise CurvineError(ErrorKind.TIMEOUT, "mutation not durable within the deadline")
        if item.error is not None:
            raise item.error
        return item.result, item.fx

    def submit_async(self, plan: Plan, request_id: bytes,
                     then: Callable[[_Item], None]) -> None:
        """Queue ``plan`` and return at once; once its batch is durable (or failed)
        ``then(item)`` is called in the committer thread, with item.result (or a
        RetryHit), item.error and item.fx set.  ``then`` must not block."""
        self._check_running()
        self._queue.put(_Item(plan, request_id, then))

    def _check_running(self) -> None:
        if self.fatal is not None:
            raise self.refusal()
        if self._thread is None:  # a mutation admitted just before its master changed
            raise CurvineError(ErrorKind.UNAVAILABLE, "this master commits nothing now "
                                                      "(a standby of a group, or stopping)")

    def refusal(self) -> CurvineError:
        """The error of a mutation after the journal failed: NOT_LEADER when it failed
        because another member leads, else UNAVAILABLE."""
        if isinstance(self.fatal, CurvineError) and self.fatal.kind == ErrorKind.NOT_LEADER:
            return self.fatal
        return CurvineError(ErrorKind.UNAVAILABLE, "master is shutting down after a journal failure")

    def request_checkpoint(self) -> None:
        self._checkpoint_requested.set()
        self._queue.put(_Item(lambda txn: (None, None), b""))

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            items = [first]
            stop = False
            while len(items) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                items.append(nxt)
            self._commit_batch(items)
            if self.fatal is not None:
                self._fail_queued()
                return
            self._maybe_checkpoint()
            if stop:
                return

    def _fail_queued(self) -> None:
        """After a journal failure: answer what is still queued, and what comes while
        this drains, with the refusal (submit refuses the rest itself)."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item.error = self.refusal()
                item.finish()

    def _commit_batch(self, items: list[_Item]) -> None:
        s = self.store
        batch_fx = Effects()
        appended = 0
        remembered: list[journal_pb2.JournalEntry] = []  # this batch's, until durable
        txn = s.env.begin(write=True)
        try:
            for it in items:
                hit = self.ns.retry.get(it.request_id)
                if hit is not None:
                    it.result = RetryHit(hit)
                    continue
                try:
                    entry, value = it.plan(txn)
                    if entry is not None:
                        fx = Effects()
                        sub = s.env.begin(write=True, parent=txn)
                        try:
                            self.ns.apply(sub, entry, fx)
                            sub.commit()
                        except BaseException:
                            sub.abort()
                            raise
                        self.journal.append(record_type(entry), entry.SerializeToString())
                        self.ns.remember(entry)
                        remembered.append(entry)
                        it.fx = fx
                        appended += 1
                        if self.on_applied is not None:
                            self.on_applied(fx)
                        batch_fx.freed += fx.freed
                        batch_fx.replaced += fx.replaced
                        batch_fx.completed += fx.completed
                        batch_fx.workers += fx.workers
                    it.result = value
                except CurvineError as e:
                    it.error = e
                except Exception as e:  # noqa: BLE001 - a bug in plan/apply fails one call
                    log.exception("mutation failed")
                    it.error = CurvineError(ErrorKind.IO, f"internal error: {e}")
            if appended:
                self.journal.sync()
                s.put_u64(txn, b"applied_seq", self.journal.last_seq)
            txn.commit()
        except BaseException as e:  # journal write/fsync failed: durability unknown, stop
            txn.abort()
            for entry in remembered:  # a retry must not be answered from what LMDB lacks
                self.ns.forget(entry)
            self.fatal = e
            if isinstance(e, CurvineError) and e.kind == ErrorKind.NOT_LEADER:
                # the journal in etcd found another leader (master/group/etcd_journal.py):
                # nothing of this batch is acknowledged; the member steps down
                error = e
            else:
                log.critical("journal commit failed, the master stops: %s", e)
                error = CurvineError(ErrorKind.UNAVAILABLE, "journal failure")
            for it in items:
                it.error = error
                it.finish()
            return
        if appended:
            self.applied_seq = self.journal.last_seq
            self.stats["batches"] += 1
            self.stats["records"] += appended
            self.stats["max_batch"] = max(self.stats["max_batch"], appended)
        try:
            self.on_effects(batch_fx)
        finally:
            for it in items:
                it.finish()

    def _maybe_checkpoint(self) -> None:
        due = (self.checkpoint_every
               and self.applied_seq - self._last_checkpoint_seq >= self.checkpoint_every
               or self.checkpoint_bytes and self.journal.stats["bytes"]
               - self._last_checkpoint_bytes >= self.checkpoint_bytes)
        if not (due or self._checkpoint_requested.is_set()):
            return
        self._checkpoint_requested.clear()
        self.checkpoint()

    def checkpoint(self) -> str | None:
        """Copy LMDB and retire the journal segments it covers (committer thread only,
        or before start)."""
        seq = self.applied_seq
        if seq == 0:
            return None
        started = time.monotonic()
        self.store.env.sync(True)
        path = write_checkpoint(self.store.env, self.checkpoint_root, seq)
        retired = self.journal.retire(seq)
        self._last_checkpoint_seq = seq
        self._last_checkpoint_bytes = self.journal.stats["bytes"]
        log.info("checkpoint at seq %d in %.2fs (%s), %d journal segments retired",
                 seq, time.monotonic() - started, path, retired)
        return path
