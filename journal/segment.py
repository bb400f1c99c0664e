"""On-disk framing of one journal segment file.

A segment is ``seg-<first_seq as 20 digits>.wal``::

    header  magic b"CVJ1" | version u16 | flags u16 (0) | first_seq u64 | crc u32
    frame   length u32 | crc u32 | seq u64 | type u16 | payload[length]

All integers are big-endian.  ``length`` is the payload length; the frame crc
(``zlib.crc32``, format version 1) covers seq + type + payload, the header crc covers
the 16 bytes before it.  Frames follow each other with consecutive sequence numbers,
the first one being the header's ``first_seq``.  ``length`` is capped at
:data:`MAX_PAYLOAD` so a garbage length never makes a reader allocate a huge buffer.

This module only reads and encodes; deciding whether damage is a torn tail or
corruption is the journal's job (see :func:`find_valid_frame`).

Every read opens the file with :func:`open_segment`: a segment must be a regular
file (not a symlink, FIFO, directory or device), and checking that never blocks.
Reading uses bounded memory whatever the file's size (a buffered reader, one record
at a time; the search after damage reads 1 MiB windows and skips holes).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

MAGIC = b"CVJ1"
VERSION = 1
MAX_PAYLOAD = 64 << 20

_HEADER_BODY = struct.Struct(">4sHHQ")
_HEADER_CRC = struct.Struct(">I")
HEADER_SIZE = _HEADER_BODY.size + _HEADER_CRC.size  # 20
FRAME_HEADER = struct.Struct(">IIQH")
FRAME_HEADER_SIZE = FRAME_HEADER.size  # 18
_CRC_START = 8  # the frame crc covers everything from seq on

_NAME_RE = re.compile(r"^seg-(\d{20})\.wal$")
_NONZERO = re.compile(rb"[^\x00]")
_READ_BUFFER = 1 << 20
_SCAN_WINDOW = 1 << 20  # candidate positions examined per read in find_valid_frame


class JournalError(Exception):
    """Misuse of the journal, a sequence gap, or an I/O failure that stopped it."""


class JournalCorruption(JournalError):
    """Damage before the tail: the journal cannot be trusted past this point.

    Raised instead of silently dropping records, because anything after a damaged
    record may have been acknowledged to a client.
    """

    def __init__(self, segment: str, offset: int, reason: str) -> None:
        super().__init__(segment, offset, reason)
        self.segment = segment
        self.offset = offset
        self.reason = reason

    def __str__(self) -> str:
        return (f"journal corruption in segment {self.segment} "
                f"at byte offset {self.offset}: {self.reason}")


@dataclass(frozen=True, slots=True)
class JournalRecord:
    seq: int
    type: int
    payload: bytes


def segment_name(first_seq: int) -> str:
    return f"seg-{first_seq:020d}.wal"


def parse_segment_name(name: str) -> int | None:
    """First seq encoded in a segment file name, or None for any other file."""
    m = _NAME_RE.match(name)
    return int(m.group(1)) if m else None


def encode_header(first_seq: int) -> bytes:
    body = _HEADER_BODY.pack(MAGIC, VERSION, 0, first_seq)
    return body + _HEADER_CRC.pack(zlib.crc32(body))


def encode_frame(seq: int, type: int, payload: bytes) -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise JournalError(f"record of {len(payload)} bytes exceeds the limit of {MAX_PAYLOAD}")
    tail = struct.pack(">QH", seq, type)
    crc = zlib.crc32(payload, zlib.crc32(tail))
    return struct.pack(">II", len(payload), crc) + tail + payload


@dataclass(frozen=True, slots=True)
class BadSpot:
    """Where a segment stopped being readable, and whether it may be a torn write.

    ``torn_ok`` is False when the bytes are intact but wrong (a crc-valid frame
    with an unexpected seq, a crc-valid header for another seq or version):
    no crash produces those, so they are never cut off as a torn tail.
    """
    offset: int
    reason: str
    torn_ok: bool


class SegmentReader:
    """Streams the records of one segment file; after iteration ``end`` is the
    offset after the last good frame and ``bad`` says why reading stopped early
    (None at a clean end of file or at ``limit``).  While a record is being
    yielded, ``offset`` is the byte offset of its frame (for error messages).

    Reads through a buffered file, one record at a time, so a segment is never held
    in memory as a whole, whatever its size.  A path that is not a regular file
    raises :class:`JournalCorruption` (see :func:`open_segment`).
    """

    def __init__(self, path: str, first_seq: int, limit: int | None = None) -> None:
        self.path = path
        self.first_seq = first_seq
        self.limit = limit
        self.end = 0
        self.offset = 0
        self.bad: BadSpot | None = None

    def __iter__(self) -> Iterator[JournalRecord]:
        fd = open_segment(self.path)
        with os.fdopen(fd, "rb", buffering=_READ_BUFFER) as f:
            size = os.fstat(f.fileno()).st_size
            if self.limit is not None:
                size = min(size, self.limit)
            header = f.read(HEADER_SIZE)
            self.bad = _check_header(header, self.first_seq)
            if self.bad is not None:
                return
            off = self.end = HEADER_SIZE
            expect = self.first_seq
            while off < size:
                if size - off < FRAME_HEADER_SIZE:
                    self.bad = BadSpot(off, "truncated frame header", True)
                    return
                head = f.read(FRAME_HEADER_SIZE)
                length, crc, seq, typ = FRAME_HEADER.unpack(head)
                if length > MAX_PAYLOAD:
                    self.bad = BadSpot(off, f"frame length {length} exceeds the limit", True)
                    return
                if off + FRAME_HEADER_SIZE + length > size:
                    self.bad = BadSpot(
                        off, f"frame of {length} payload bytes runs past the end of the file",
                        True)
                    return
                payload = f.read(length)
                if zlib.crc32(payload, zlib.crc32(head[_CRC_START:])) != crc:
                    self.bad = BadSpot(off, "checksum mismatch", True)
                    return
                if seq != expect:
                    self.bad = BadSpot(off, f"record has seq {seq} where {expect} was expected",
                                       False)
                    return
                self.offset = off
                yield JournalRecord(seq, typ, payload)
                off += FRAME_HEADER_SIZE + length
                self.end = off
                expect += 1


def decode_frames(data: bytes, first_seq: int, where: str) -> Iterator[JournalRecord]:
    """The frames of ``data`` (consecutive :func:`encode_frame` output starting at
    ``first_seq``, e.g. one batch of the journal kept in etcd), checked like a
    segment's; any damage is JournalCorruption naming ``where`` and the offset."""
    view = memoryview(data)
    off, expect = 0, first_seq
    while off < len(view):
        if len(view) - off < FRAME_HEADER_SIZE:
            raise JournalCorruption(where, off, "truncated frame header")
        head = bytes(view[off:off + FRAME_HEADER_SIZE])
        length, crc, seq, typ = FRAME_HEADER.unpack(head)
        end = off + FRAME_HEADER_SIZE + length
        if end > len(view):
            raise JournalCorruption(where, off, f"frame of {length} bytes runs past the end")
        payload = bytes(view[off + FRAME_HEADER_SIZE:end])
        if zlib.crc32(payload, zlib.crc32(head[_CRC_START:])) != crc:
            raise JournalCorruption(where, off, "checksum mismatch")
        if seq != expect:
            raise JournalCorruption(where, off, f"record has seq {seq} where {expect} was "
                                                f"expected")
        yield JournalRecord(seq, typ, payload)
        off, expect = end, expect + 1


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _not_regular(path: str, mode: int) -> JournalCorruption:
    kind = next((name for test, name in _KINDS if test(mode)), f"of file type {mode:#o}")
    return JournalCorruption(path, 0, f"the segment is {kind}, not a regular file; "
                                      "refusing to read it")


def open_segment(path: str, flags: int = os.O_RDONLY) -> int:
    """Open segment ``path`` (read-only unless ``flags`` say otherwise) and return
    the fd; :class:`JournalCorruption` at offset 0 if it is not a regular file.

    lstat first, so a FIFO, device or socket is never opened at all; then the open
    with O_NOFOLLOW | O_NONBLOCK (no symlink followed, no wait for a FIFO's writer
    if the path was swapped in between) and an fstat of what was opened.
    """
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:  # replaced by a symlink since the lstat
            raise _not_regular(path, stat.S_IFLNK) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_header(header: bytes, first_seq: int) -> BadSpot | None:
    if len(header) < HEADER_SIZE:
        return BadSpot(0, f"truncated segment header ({len(header)} of {HEADER_SIZE} bytes)",
                       True)
    body = header[:_HEADER_BODY.size]
    (crc,) = _HEADER_CRC.unpack_from(header, _HEADER_BODY.size)
    magic, version, _flags, hdr_seq = _HEADER_BODY.unpack(body)
    if magic != MAGIC or zlib.crc32(body) != crc:
        return BadSpot(0, "bad segment header (magic or checksum)", True)
    if version != VERSION:
        return BadSpot(0, f"unsupported segment format version {version}", False)
    if hdr_seq != first_seq:
        return BadSpot(0, f"header says first seq {hdr_seq}, file name says {first_seq}", False)
    return None


def find_valid_frame(path: str, start: int, expect_seq: int) -> tuple[int, int] | None:
    """First crc-valid frame at an offset >= ``start`` whose seq is ``expect_seq``
    or later, as (offset, seq); None if there is none.

    Used only after damage, to tell a torn tail (nothing valid after it) from
    damage in the middle.  Frames that we wrote after the damage carry seqs
    ``expect_seq + k`` with ``k <= remaining bytes // FRAME_HEADER_SIZE``; all
    seqs in that range share their leading bytes, so candidates are found by
    looking for those bytes with ``bytes.find`` (C speed) instead of trying every
    offset in Python.  Runs of zero bytes, which a crash can leave behind, are
    skipped whole (a valid seq is never zero), and holes of a sparse file are not
    read at all (``SEEK_DATA``).  The file is read in windows of about 1 MiB (and a
    candidate's payload in pieces of that size), so memory stays bounded however
    large the file is.
    """
    fd = open_segment(path)
    try:
        return _find_valid_frame(fd, os.fstat(fd).st_size, start, expect_seq)
    finally:
        os.close(fd)


def _find_valid_frame(fd: int, size: int, start: int, expect_seq: int) -> tuple[int, int] | None:
    if size - start < FRAME_HEADER_SIZE:
        return None
    lo = expect_seq
    hi = expect_seq + (size - start) // FRAME_HEADER_SIZE
    lo_b, hi_b = lo.to_bytes(8, "big"), hi.to_bytes(8, "big")
    k = 0
    while k < 8 and lo_b[k] == hi_b[k]:
        k += 1
    needle = lo_b[:k]
    pos = start + _CRC_START  # where the seq field of a frame at ``start`` sits
    last = size - FRAME_HEADER_SIZE + _CRC_START  # seq field of the last possible frame
    seek_data = True
    while pos <= last:
        if seek_data:
            try:
                data_at = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:
                    return None  # nothing but a hole from pos to the end of the file
                seek_data = False  # not supported here: read everything
            else:
                # a seq field wholly inside the hole is zero, never a valid seq
                pos = max(pos, data_at - 7)
                if pos > last:
                    return None
        stop = min(pos + _SCAN_WINDOW, last + 1)  # this window: seq fields at [pos, stop)
        base = pos - _CRC_START                   # file offset of buf[0]
        buf = os.pread(fd, stop - 1 + FRAME_HEADER_SIZE - _CRC_START - base, base)
        i = _CRC_START
        # candidates are buf indexes i < end_i (fewer if the file shrank meanwhile)
        end_i = min(stop - base, len(buf) - (FRAME_HEADER_SIZE - _CRC_START) + 1)
        while i < end_i:
            h = buf.find(needle, i, end_i - 1 + k)
            if h < 0:
                break
            off = base + h - _CRC_START
            length, crc, seq, _typ = FRAME_HEADER.unpack_from(buf, h - _CRC_START)
            if seq == 0:
                # every seq field inside this zero run is zero: jump to its end
                if buf.count(0, h) == len(buf) - h:
                    break  # zeros to the end of the window
                m = _NONZERO.search(buf, h)
                i = max(h + 1, m.start() - 7)
                continue
            if (lo <= seq <= hi and length <= MAX_PAYLOAD
                    and off + FRAME_HEADER_SIZE + length <= size
                    and _frame_crc(fd, buf, base, off, length) == crc):
                return off, seq
            i = h + 1
        pos = stop
    return None


def _frame_crc(fd: int, buf: bytes, base: int, off: int, length: int) -> int:
    """crc32 of seq + type + payload of the frame at file offset ``off``, from ``buf``
    (which holds the file from offset ``base``) and, past its end, from the file in
    pieces of at most _SCAN_WINDOW bytes."""
    begin, end = off + _CRC_START, off + FRAME_HEADER_SIZE + length
    have = min(end, base + len(buf))
    with memoryview(buf) as view:
        crc = zlib.crc32(view[begin - base:have - base])
    while have < end:
        piece = os.pread(fd, min(end - have, _SCAN_WINDOW), have)
        if not piece:
            return -1  # the file shrank: whatever it is, not a match
        crc = zlib.crc32(piece, crc)
        have += len(piece)
    return crc
