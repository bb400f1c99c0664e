"""The journal of a master group, kept in etcd: what the committer makes durable.

The same interface as the local journal (``curvine.journal.Journal``: ``append``,
``sync``, ``records``, ``retire``, ``last_seq``, ``durable_seq``, ``first_seq``,
``failure``, ``stats``, ``unreplayable``, ``close``), so the committer, the replay at
open and recovery (master/meta/metadata.py) run unchanged over it.  Keys under the
group's prefix:

- ``journal/<seq of its first record, 20 digits>``: one batch of records, framed as in
  a segment file (journal/segment.py ``encode_frame``: length, crc, seq, type), at
  most ``CHUNK_BYTES`` (etcd refuses requests over 1.5 MiB by default);
- ``commit``: the seq of the last record written (decimal).

``sync`` writes each batch with ONE Txn guarded by the leader key: ``create_revision
(leader) == term`` (the revision of this member's campaign, leadership.py) -> put the
batch and ``commit``.  The Txn succeeding is the durability point: etcd has it on a
quorum, fsynced, and ordered before any later leader's first write (that leader's key
can only exist once ours is gone).  A Txn whose compare fails means another member
leads: nothing more is acknowledged (NOT_LEADER), the journal refuses every later
append, and the member steps down (master/member.py).  An etcd that does not answer
is retried with the same request (a Txn whose reply was lost may have been applied:
writing the same keys again is harmless while we still hold the key) until the
fence says the lease may be gone.

A member that is not leading opens it read-only (``fence`` None): ``records`` serves
its replay and its standby's tail; ``refresh`` reads ``commit`` (the read index).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Callable

from curvine.common.errors import CurvineError, ErrorKind
from curvine.journal.metrics import JOURNAL_BATCH, JOURNAL_ETCD_WRITE
from curvine.journal.segment import (MAX_PAYLOAD, JournalCorruption, JournalError,
                                     JournalRecord, decode_frames, encode_frame)

from .etcd import Etcd, created_at, prefix_end, put_op

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20  # frames per Txn: under etcd's default --max-request-bytes (1.5 MiB)
# batch keys per Range when reading: a standby's catch-up is one Range per PAGE batches
# (under load the leader writes a batch of one record per Txn, so often one record
# per key); PAGE * CHUNK_BYTES fits etcd.MAX_REPLY_BYTES
PAGE = 128
# the batch that holds a seq starts at most this many seqs before it, nearly always
# (a batch is what the committer wrote at once: max_batch 4096 records); looked up
# further back only when not found there (_batch_holding)
BATCH_SPAN = 4096
RETRY_PAUSE = 0.1
# etcd holds the journal from one checkpoint to the next, within its database quota
# (2 GiB by default): a group checkpoints at least this often (master/member.py)
CHECKPOINT_EVERY_MAX = 100_000  # records
CHECKPOINT_BYTES_MAX = 256 << 20


def batch_key(journal_prefix: bytes, first_seq: int) -> bytes:
    return journal_prefix + b"%020d" % first_seq


class EtcdJournal:
    """The group's journal under ``prefix`` (``journal/``, ``commit``).  ``fence()``
    returns the current term while this member may write, else raises NOT_LEADER;
    None: read-only.  Writes are guarded by ``term`` (the term this journal was opened
    in: a later term of the same member is another journal, after a step down).
    ``on_fenced(reason)`` hears that a write found another leader."""

    def __init__(self, etcd: Etcd, prefix: bytes, leader_key: bytes,
                 fence: Callable[[], int] | None = None, term: int = 0,
                 on_fenced: Callable[[str], None] = lambda reason: None,
                 retire_floor: Callable[[], int] | None = None):
        self.etcd = etcd
        self.prefix = journal_prefix = prefix + b"journal/"
        self._end = prefix_end(journal_prefix)
        self.commit_key = prefix + b"commit"
        self.leader_key = leader_key
        self._fence = fence
        self.term = term
        self._on_fenced = on_fenced
        # the lowest seq every member has applied: keys above it are kept (retire)
        self._retire_floor = retire_floor
        self._pending: list[bytes] = []
        self._pending_first = 0
        self._failed: BaseException | None = None
        self.stats = {"records": 0, "syncs": 0, "txns": 0, "bytes": 0, "last_batch": 0,
                      "last_sync_seconds": 0.0, "segments_retired": 0, "retries": 0}
        self.last_read: tuple[str, int, int] | None = None
        self._durable_seq = self.read_commit()
        self._last_seq = self._durable_seq
        self._first_seq = self._read_first_seq()
        log.info("journal in etcd %s (%s): records %d..%d", ",".join(etcd.endpoints),
                 journal_prefix.decode(errors="replace"), self._first_seq, self._durable_seq)

    # -- reading -----------------------------------------------------------------
    def read_commit(self) -> int:
        """The seq of the last durable record, as etcd has it now (linearizable)."""
        kv = self.etcd.get(self.commit_key)
        return int(kv.value) if kv is not None else 0

    def refresh(self) -> int:
        """Read ``commit`` again (a member that does not write); returns it."""
        commit = self.read_commit()
        if commit > self._durable_seq:
            self._durable_seq = self._last_seq = commit
        return commit

    def _read_first_seq(self) -> int:
        reply = self.etcd.range(self.prefix, self._end, limit=1, keys_only=True)
        if not reply.kvs:
            return self._durable_seq + 1
        return int(reply.kvs[0].key[len(self.prefix):])

    @property
    def last_seq(self) -> int:
        return self._last_seq

    @property
    def durable_seq(self) -> int:
        return self._durable_seq

    @property
    def first_seq(self) -> int:
        return self._first_seq

    def records(self, after_seq: int) -> Iterator[JournalRecord]:
        """Every record with seq > ``after_seq`` in etcd now, in order (checked eagerly
        like the local journal's: JournalError when some were retired)."""
        self._first_seq = self._read_first_seq()
        if after_seq + 1 < self._first_seq:
            raise JournalError(f"journal gap: records {after_seq + 1}..{self._first_seq - 1} "
                               f"were compacted away in etcd, the oldest kept is "
                               f"{self._first_seq}: this member needs a checkpoint of the "
                               f"leader's metadata")
        start = self._batch_holding(after_seq + 1) or self.prefix
        return self._iter_records(start, after_seq)

    def _batch_holding(self, seq: int) -> bytes | None:
        """The key of the batch that holds ``seq`` (the last key at or before its
        batch key), or None when there is none.  A member that applied whole batches
        finds a batch starting at ``seq`` itself: one Range of one key.  Else a
        descending Range, which etcd 3.4 answers by reading and sorting every key of
        its range (etcd.py ``range``): over the last BATCH_SPAN seqs first, not the
        whole journal."""
        key = batch_key(self.prefix, seq)
        reply = self.etcd.range(key, key + b"\0", keys_only=True)
        if reply.kvs:
            return key
        low = max(seq - BATCH_SPAN, 0)
        while True:
            begin = batch_key(self.prefix, low) if low else self.prefix
            reply = self.etcd.range(begin, key + b"\0", limit=1, descending=True,
                                    keys_only=True)
            if reply.kvs:
                return reply.kvs[0].key
            if not low:
                return None
            low = max(low - 16 * BATCH_SPAN, 0)

    def batches(self, start: bytes | None = None) -> Iterator[tuple[str, int, bytes]]:
        """Every batch from the key ``start`` on (default: the oldest), in order, as
        (its key as text, the seq of its first record, its frames), PAGE keys per
        Range (what ``records`` and ``curvine journal verify`` read)."""
        start = start or self.prefix
        while True:
            page = self.etcd.range(start, self._end, limit=PAGE).kvs
            for kv in page:
                yield (kv.key.decode(errors="replace"), int(kv.key[len(self.prefix):]),
                       kv.value)
            if len(page) < PAGE:
                return
            start = page[-1].key + b"\0"

    def _iter_records(self, start: bytes, after_seq: int) -> Iterator[JournalRecord]:
        self.last_read = None
        expect: int | None = None
        for where, first, frames in self.batches(start):
            if expect is not None and first != expect:
                raise JournalCorruption(where, 0, f"batch starts at seq {first} but the "
                                                  f"previous one ends at {expect - 1}")
            for rec in decode_frames(frames, first, where):
                expect = rec.seq + 1
                if rec.seq > after_seq:
                    self.last_read = (where, 0, rec.seq)
                    if rec.seq > self._durable_seq:
                        self._durable_seq = self._last_seq = rec.seq
                    yield rec
        self.last_read = None

    def unreplayable(self, exc: BaseException) -> JournalCorruption | None:
        """Like Journal.unreplayable: a record that passed its crc but cannot be
        applied is damage, named by its batch key."""
        if (self.last_read is None or not isinstance(exc, Exception)
                or isinstance(exc, (JournalError, CurvineError, OSError, MemoryError))
                or type(exc).__module__.partition(".")[0] == "lmdb"):
            return None
        where, offset, seq = self.last_read
        return JournalCorruption(where, offset, f"record seq {seq} passes its checksum but "
                                                f"cannot be replayed ({type(exc).__name__}: "
                                                f"{str(exc)[:200]})")

    # -- writing -----------------------------------------------------------------
    def append(self, type: int, payload: bytes) -> int:
        """Buffer one record; durable only after sync()."""
        self._check_writable()
        if len(payload) > min(MAX_PAYLOAD, CHUNK_BYTES - 64):
            raise JournalError(f"record of {len(payload)} bytes is too big for one etcd "
                               f"request")
        seq = self._last_seq + 1
        self._pending.append(encode_frame(seq, type, bytes(payload)))
        if len(self._pending) == 1:
            self._pending_first = seq
        self._last_seq = seq
        return seq

    def sync(self) -> int:
        """Write every buffered record, one leader-guarded Txn per chunk; returns how
        many became durable.  NOT_LEADER when a compare fails or the fence closes."""
        self._check_writable()
        batch, seq = self._pending, self._pending_first
        self._pending = []
        if not batch:
            return 0
        started = time.monotonic()
        written = 0
        i = 0
        while i < len(batch):
            chunk_first, size, j = seq, 0, i
            while j < len(batch) and (j == i or size + len(batch[j]) <= CHUNK_BYTES):
                size += len(batch[j])
                j += 1
            data = b"".join(batch[i:j])
            seq += j - i
            self._write(chunk_first, seq - 1, data)
            self._durable_seq = seq - 1
            written += len(data)
            i = j
        st = self.stats
        st["records"] += len(batch)
        st["syncs"] += 1
        st["bytes"] += written
        st["last_batch"] = len(batch)
        st["last_sync_seconds"] = time.monotonic() - started
        JOURNAL_BATCH.observe(len(batch))
        return len(batch)

    def _write(self, first: int, last: int, data: bytes) -> None:
        ops = [put_op(batch_key(self.prefix, first), data),
               put_op(self.commit_key, b"%d" % last)]
        while True:
            try:
                if self._fence() != self.term:
                    raise CurvineError(ErrorKind.NOT_LEADER, "")
            except CurvineError as e:
                self._failed = e
                raise
            try:
                started = time.perf_counter()
                reply = self.etcd.txn([created_at(self.leader_key, self.term)], ops)
                JOURNAL_ETCD_WRITE.observe(time.perf_counter() - started)
            except CurvineError as e:
                if e.kind != ErrorKind.UNAVAILABLE:
                    self._failed = e
                    raise
                self.stats["retries"] += 1
                log.info("journal write of records %d..%d: %s; retrying while the lease "
                         "lasts", first, last, e)
                time.sleep(RETRY_PAUSE)
                continue
            self.stats["txns"] += 1
            if reply.succeeded:
                return
            reason = (f"the journal write of records {first}..{last} found the leader key "
                      f"of another term")
            self._on_fenced(reason)
            self._failed = CurvineError(ErrorKind.NOT_LEADER, "")
            raise self._failed

    @property
    def failure(self) -> BaseException | None:
        return self._failed

    def _check_writable(self) -> None:
        if self._fence is None:
            raise JournalError("the journal in etcd is read-only on a member that does "
                               "not lead")
        if self._failed is not None:
            raise JournalError(f"journal refuses writes after a failed write: "
                               f"{self._failed!r}")

    # -- housekeeping --------------------------------------------------------------
    def retire(self, upto_seq: int) -> int:
        """Delete the batches whose records are all <= ``upto_seq`` and every member
        has applied (``retire_floor``); the batch holding the next record stays.
        Returns how many were deleted."""
        if self._retire_floor is not None:
            upto_seq = min(upto_seq, self._retire_floor())
        if upto_seq <= 0:
            return 0
        holding = self._batch_holding(upto_seq + 1)
        if holding is None:
            return 0
        deleted = self.etcd.delete_range(self.prefix, holding)
        removed = deleted.deleted
        self.stats["segments_retired"] += removed
        self._first_seq = self._read_first_seq()
        if removed:
            # etcd keeps every revision until compacted (its --auto-compaction is off
            # by default), and nobody reads old revisions of ours: drop them, or its
            # database grows by every batch ever written until it hits its quota
            self.etcd.compact(deleted.header.revision)
            log.info("journal in etcd: %d batches before seq %d deleted, history "
                     "compacted at revision %d", removed, self._first_seq,
                     deleted.header.revision)
        return removed

    def close(self) -> None:
        """Unsynced records are dropped (never acknowledged); etcd's client is the
        member's."""
        self._pending = []
