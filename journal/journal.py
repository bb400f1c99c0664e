"""The master's write-ahead journal: the durable truth that LMDB is a view of.

Records are appended to an in-memory batch and made durable by :meth:`Journal.sync`
with one write and one fsync for the whole batch (group commit).  On open every
segment is scanned and checked; a torn tail of the last segment (what a crash in the
middle of a write leaves) is cut off with a WARNING, any other damage raises
:class:`JournalCorruption` naming segment and offset, because records after it may
have been acknowledged.  That rule is :func:`segment_damage` (and :func:`gap_damage`
between segments), which ``curvine journal verify`` and ``dump`` apply too.

Threads: ``append`` may be called from many threads while one thread runs ``sync``;
``records``, ``retire`` and ``close`` are meant for the owning thread.  One process
at a time: the directory is locked with ``flock`` on ``<dir>/LOCK``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from .metrics import JOURNAL_BATCH, JOURNAL_FSYNC
from .segment import (
    HEADER_SIZE,
    MAX_PAYLOAD,
    JournalCorruption,
    JournalError,
    JournalRecord,
    SegmentReader,
    encode_frame,
    encode_header,
    find_valid_frame,
    open_segment,
    parse_segment_name,
    segment_name,
)

log = logging.getLogger(__name__)

LOCK_NAME = "LOCK"


@dataclass(slots=True)
class _Segment:
    path: str
    first_seq: int
    last_seq: int  # first_seq - 1 while it holds no record
    size: int      # end of the last durable frame


@dataclass(frozen=True, slots=True)
class Damage:
    """Where a journal stops being readable, and why.  ``torn_tail``: only what a crash
    in the middle of an append leaves, which the journal cuts off at open; any other
    damage is corruption (:meth:`error`)."""
    segment: str
    offset: int
    reason: str
    torn_tail: bool

    def error(self) -> JournalCorruption:
        return JournalCorruption(self.segment, self.offset, self.reason)


def list_segments(directory: str) -> list[tuple[int, str]]:
    """(first seq, path) of every segment file in ``directory``, oldest first."""
    found = []
    for name in os.listdir(directory):
        first = parse_segment_name(name)
        if first is not None:
            found.append((first, os.path.join(directory, name)))
        elif name != LOCK_NAME:
            log.debug("journal %s: ignoring %s", directory, name)
    return sorted(found)


def gap_damage(path: str, first_seq: int, expect_seq: int | None) -> Damage | None:
    """A segment that does not start right after the previous one (``expect_seq``;
    None for the first segment) is corruption: records between them are missing."""
    if expect_seq is None or first_seq == expect_seq:
        return None
    return Damage(path, 0, f"segment starts at seq {first_seq} but the previous segment "
                           f"ends at seq {expect_seq - 1}", False)


def segment_damage(reader: SegmentReader, last_seq: int, is_last: bool) -> Damage | None:
    """Where and why ``reader`` stopped before the end of its segment (None: it did
    not), ``last_seq`` being the last record it read.  A torn tail is bytes that may
    be a partial write (not intact-but-wrong ones, ``BadSpot.torn_ok``) at the end of
    the last segment with no valid record after them."""
    bad = reader.bad
    if bad is None:
        return None
    torn = is_last and bad.torn_ok
    reason = bad.reason
    if torn:
        later = find_valid_frame(reader.path, bad.offset + 1, last_seq + 1)
        if later is not None:
            torn = False
            reason += f", but a valid record (seq {later[1]}) follows at offset {later[0]}"
    return Damage(reader.path, bad.offset, reason, torn)


def fsync_dir(path: str) -> None:
    """Make a create, rename or unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    # one write() in practice; the loop only matters for huge batches (Linux caps a
    # single write at ~2 GiB) or a signal interrupting it
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class Journal:
    """Append-only, segmented, checksummed record log with group commit."""

    def __init__(self, directory: str, segment_size: int = 64 << 20, fsync: bool = True) -> None:
        if segment_size <= 0:
            raise JournalError(f"segment_size must be positive, got {segment_size}")
        self._dir = os.path.abspath(directory)
        self._segment_size = segment_size
        self._fsync = fsync
        self._segments: list[_Segment] = []
        self._fd: int | None = None  # active (last) segment, opened for append
        self._pending: list[bytes] = []
        self._pending_first = 0
        self._last_seq = 0      # last appended (buffered or durable)
        self._durable_seq = 0   # last written and fsynced
        self._failed: BaseException | None = None
        self._closed = False
        self._append_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self.stats: dict[str, Any] = {
            "records": 0, "syncs": 0, "fsyncs": 0, "bytes": 0,
            "last_sync_seconds": 0.0, "last_batch": 0,
            "dir_fsyncs": 0, "segments_created": 0, "segments_retired": 0,
            "torn_bytes_cut": 0,
        }
        # (segment, offset, seq) of the record records() yielded last; None before
        # and after a complete iteration (see unreplayable)
        self.last_read: tuple[str, int, int] | None = None
        self._lock_file = self._open_dir()
        try:
            self._scan()
            if self._segments:
                self._fd = open_segment(self._segments[-1].path, os.O_WRONLY | os.O_APPEND)
        except BaseException:
            self._lock_file.close()
            raise
        self._last_seq = self._durable_seq
        log.info("journal %s opened: %d segments, records %d..%d", self._dir,
                 len(self._segments), self.first_seq, self._durable_seq)

    # -- opening ---------------------------------------------------------------

    def _open_dir(self) -> IO[bytes]:
        if not os.path.isdir(self._dir):
            os.makedirs(self._dir, exist_ok=True)
            if self._fsync:
                fsync_dir(os.path.dirname(self._dir))
        f = os.fdopen(os.open(os.path.join(self._dir, LOCK_NAME),
                              os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600), "ab")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise JournalError(f"journal {self._dir} is in use by another journal instance "
                               f"or process") from None
        return f

    def _scan(self) -> None:
        found = list_segments(self._dir)
        expect: int | None = None
        for i, (first, path) in enumerate(found):
            gap = gap_damage(path, first, expect)
            if gap is not None:
                raise gap.error()
            reader = SegmentReader(path, first)
            last = first - 1
            for rec in reader:
                last = rec.seq
            size = reader.end
            damage = segment_damage(reader, last, is_last=i == len(found) - 1)
            if damage is not None:
                if not damage.torn_tail:
                    raise damage.error()
                size = self._cut_torn_tail(path, first, damage.offset, damage.reason)
            self._segments.append(_Segment(path, first, last, size))
            expect = last + 1
        if self._segments:
            self._durable_seq = self._segments[-1].last_seq

    def _cut_torn_tail(self, path: str, first_seq: int, offset: int, reason: str) -> int:
        """Cut the last segment at ``offset``; returns its new size."""
        with os.fdopen(open_segment(path, os.O_RDWR), "r+b") as f:
            old_size = os.fstat(f.fileno()).st_size
            if offset == 0:
                # the header itself is torn: the segment held nothing durable, so
                # write a fresh header for the seq its name promises
                f.truncate(0)
                f.write(encode_header(first_seq))
                new_size = HEADER_SIZE
            else:
                f.truncate(offset)
                new_size = offset
            f.flush()
            if self._fsync:
                os.fsync(f.fileno())
        cut = max(old_size - offset, 0)
        self.stats["torn_bytes_cut"] += cut
        log.warning("journal: torn tail in segment %s at offset %d (%s): cut %d bytes",
                    path, offset, reason, cut)
        return new_size

    # -- reading ---------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """Seq of the last appended record, durable or still buffered (0 when empty)."""
        return self._last_seq

    @property
    def durable_seq(self) -> int:
        """Seq of the last record made durable by :meth:`sync`."""
        return self._durable_seq

    @property
    def first_seq(self) -> int:
        """Seq of the first record still on disk (``durable_seq + 1`` when none)."""
        segs = self._segments
        return segs[0].first_seq if segs else self._durable_seq + 1

    def records(self, after_seq: int) -> Iterator[JournalRecord]:
        """All durable records with seq > ``after_seq``, in order.

        Checked eagerly: raises JournalError if some of those records were retired
        (the caller's state is older than the oldest record kept) or if
        ``after_seq`` lies beyond the journal's end (the caller's state is newer
        than the journal, i.e. the journal lost records).  Buffered, unsynced
        appends are not returned.
        """
        with self._sync_lock:
            segs = [_Segment(s.path, s.first_seq, s.last_seq, s.size) for s in self._segments]
            durable = self._durable_seq
        first = segs[0].first_seq if segs else durable + 1
        if after_seq < 0:
            raise JournalError(f"after_seq must be >= 0, got {after_seq}")
        if after_seq + 1 < first:
            raise JournalError(f"journal gap: records {after_seq + 1}..{first - 1} were retired, "
                               f"the oldest record kept is {first}")
        if after_seq > durable:
            raise JournalError(f"after_seq {after_seq} is beyond the last durable record "
                               f"{durable}: the journal has lost records")
        return self._iter_records(segs, after_seq)

    def _iter_records(self, segs: list[_Segment], after_seq: int) -> Iterator[JournalRecord]:
        # last_read is not cleared when the caller stops early or fails: that is
        # when unreplayable() needs it (the caller's failure closes this generator
        # before the caller's handler runs)
        self.last_read = None
        for seg in segs:
            if seg.last_seq <= after_seq:
                continue
            reader = SegmentReader(seg.path, seg.first_seq, limit=seg.size)
            try:
                for rec in reader:
                    if rec.seq > after_seq:
                        self.last_read = (seg.path, reader.offset, rec.seq)
                        yield rec
            except FileNotFoundError:
                raise JournalError(f"segment {seg.path} was retired while being read") from None
            if reader.bad is not None:
                # it passed the scan at open, so something changed it since
                raise JournalCorruption(seg.path, reader.bad.offset, reader.bad.reason)
            if reader.end != seg.size:
                raise JournalCorruption(seg.path, reader.end,
                                        f"segment ends early (expected {seg.size} bytes)")
        self.last_read = None

    def unreplayable(self, exc: BaseException) -> JournalCorruption | None:
        """The error to report when processing the record that :meth:`records` yielded
        last failed with ``exc`` (it does not decode, or cannot be applied): that
        crc-valid record is damage, named by segment and offset.  None when ``exc``
        is not the record's fault (a JournalError, which names its own place; an
        OSError, MemoryError or LMDB error, which are the machine's or the store's)
        or when no iteration of :meth:`records` stopped in the middle (``exc`` came
        from elsewhere, e.g. after the last record): then the caller re-raises it."""
        if (self.last_read is None or not isinstance(exc, Exception)
                or isinstance(exc, (JournalError, OSError, MemoryError))
                or type(exc).__module__.partition(".")[0] == "lmdb"):
            return None
        path, offset, seq = self.last_read
        lines = str(exc).strip().splitlines()
        detail = f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__
        # one log line of printable ASCII, whatever bytes the message quoted
        detail = "".join(ch if " " <= ch <= "~" else ascii(ch)[1:-1] for ch in detail)
        return JournalCorruption(path, offset, f"record seq {seq} passes its checksum but "
                                               f"cannot be replayed ({detail})")

    # -- writing ---------------------------------------------------------------

    def append(self, type: int, payload: bytes) -> int:
        """Buffer one record and return its seq; it is durable only after sync()."""
        if not 0 <= type <= 0xFFFF:
            raise JournalError(f"record type {type} does not fit in u16")
        if len(payload) > MAX_PAYLOAD:
            raise JournalError(f"record of {len(payload)} bytes exceeds the limit of "
                               f"{MAX_PAYLOAD}")
        with self._append_lock:
            self._check_writable()
            seq = self._last_seq + 1
            self._pending.append(encode_frame(seq, type, bytes(payload)))
            if len(self._pending) == 1:
                self._pending_first = seq
            self._last_seq = seq
            return seq

    def sync(self) -> int:
        """Write and fsync every buffered record; returns how many became durable.

        The whole batch goes out with one write and one fsync, unless it crosses a
        segment roll (then one of each per segment plus a directory fsync).  On any
        I/O failure the journal refuses further appends: what reached the disk is
        unknown, and only a restart (which repairs the tail) can tell.
        """
        with self._sync_lock:
            with self._append_lock:
                self._check_writable()
                batch, first = self._pending, self._pending_first
                self._pending = []
            if not batch:
                return 0
            t0 = time.monotonic()
            try:
                written = self._write_batch(batch, first)
            except OSError as e:
                with self._append_lock:
                    self._failed = e
                log.error("journal %s: sync of records %d..%d failed, refusing further "
                          "appends: %s", self._dir, first, first + len(batch) - 1, e)
                raise JournalError(f"journal sync failed, journal is now read-only: {e}") from e
            st = self.stats
            st["records"] += len(batch)
            st["syncs"] += 1
            st["bytes"] += written
            st["last_batch"] = len(batch)
            st["last_sync_seconds"] = time.monotonic() - t0
            JOURNAL_BATCH.observe(len(batch))
            return len(batch)

    def _write_batch(self, batch: list[bytes], first: int) -> int:
        written = 0
        seq = first
        i = 0
        while i < len(batch):
            active = self._segments[-1] if self._segments else None
            if active is None or (active.size >= self._segment_size
                                  and active.last_seq >= active.first_seq):
                active = self._roll(seq)
                chunk = [encode_header(seq)]
                size = HEADER_SIZE
            else:
                chunk = []
                size = active.size
            n = 0
            # fill this segment up to segment_size, always with at least one record
            while i < len(batch) and (n == 0 or size < self._segment_size):
                chunk.append(batch[i])
                size += len(batch[i])
                i += 1
                n += 1
            data = b"".join(chunk)
            assert self._fd is not None
            _write_all(self._fd, data)
            if self._fsync:
                # fdatasync: the appended bytes and the file size, not the mtime
                # (~130 us here instead of ~200 us for fsync; docs/measurements.md)
                started = time.perf_counter()
                os.fdatasync(self._fd)
                JOURNAL_FSYNC.observe(time.perf_counter() - started)
                self.stats["fsyncs"] += 1
            written += len(data)
            active.size += len(data)
            active.last_seq = seq + n - 1
            seq += n
            self._durable_seq = active.last_seq
        return written

    def _roll(self, first_seq: int) -> _Segment:
        """Create the next segment (header is written with its first frames)."""
        path = os.path.join(self._dir, segment_name(first_seq))
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        if self._fsync:
            try:
                fsync_dir(self._dir)
            except OSError:
                os.close(fd)
                raise
            self.stats["dir_fsyncs"] += 1
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        seg = _Segment(path, first_seq, first_seq - 1, 0)
        self._segments.append(seg)
        self.stats["segments_created"] += 1
        log.debug("journal: new segment %s", path)
        return seg

    @property
    def failure(self) -> BaseException | None:
        """The I/O error that made the journal refuse appends, if any (health checks)."""
        return self._failed

    def _check_writable(self) -> None:
        if self._closed:
            raise JournalError("journal is closed")
        if self._failed is not None:
            raise JournalError(f"journal refuses writes after a failed sync: {self._failed}")

    # -- housekeeping ----------------------------------------------------------

    def retire(self, upto_seq: int) -> int:
        """Delete whole segments whose records are all <= ``upto_seq`` (they are in
        a checkpoint now); never the active one.  Returns how many were deleted.

        Oldest first, with a directory fsync after each unlink, so a crash can only
        leave a shorter prefix retired, never a hole between segments.
        """
        removed = 0
        with self._sync_lock:
            while len(self._segments) > 1 and self._segments[0].last_seq <= upto_seq:
                seg = self._segments[0]
                os.unlink(seg.path)
                if self._fsync:
                    fsync_dir(self._dir)
                    self.stats["dir_fsyncs"] += 1
                del self._segments[0]
                removed += 1
                log.info("journal: retired segment %s (records %d..%d)", seg.path,
                         seg.first_seq, seg.last_seq)
            self.stats["segments_retired"] += removed
        return removed

    def close(self) -> None:
        """Close files and release the directory lock; does not sync."""
        with self._sync_lock, self._append_lock:
            if self._closed:
                return
            self._closed = True
            if self._pending and self._failed is None:
                log.warning("journal %s closed with %d unsynced records (seq %d..%d) dropped",
                            self._dir, len(self._pending), self._pending_first, self._last_seq)
            self._pending = []
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._lock_file.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
