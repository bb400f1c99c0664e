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
"""

from __future__ import annotations

import mmap
import os
import re
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
    (None at a clean end of file or at ``limit``).

    Reads through a buffered file, one record at a time, so a 64 MiB segment is
    never held in memory as a whole.
    """

    def __init__(self, path: str, first_seq: int, limit: int | None = None) -> None:
        self.path = path
        self.first_seq = first_seq
        self.limit = limit
        self.end = 0
        self.bad: BadSpot | None = None

    def __iter__(self) -> Iterator[JournalRecord]:
        with open(self.path, "rb", buffering=_READ_BUFFER) as f:
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
                yield JournalRecord(seq, typ, payload)
                off += FRAME_HEADER_SIZE + length
                self.end = off
                expect += 1


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
    looking for those bytes with ``mmap.find`` (C speed) instead of trying every
    offset in Python.  Runs of zero bytes, which a crash can leave behind, are
    skipped whole (a valid seq is never zero).
    """
    size = os.path.getsize(path)
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
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            while pos <= last:
                h = mm.find(needle, pos, last + k)
                if h < 0:
                    return None
                off = h - _CRC_START
                length, crc, seq, _typ = FRAME_HEADER.unpack_from(mm, off)
                if seq == 0:
                    # every seq field inside this zero run is zero: jump to its end
                    m = _NONZERO.search(mm, h)
                    if m is None:
                        return None
                    pos = max(h + 1, m.start() - 7)
                    continue
                if (lo <= seq <= hi and length <= MAX_PAYLOAD
                        and off + FRAME_HEADER_SIZE + length <= size
                        and zlib.crc32(view[h:off + FRAME_HEADER_SIZE + length]) == crc):
                    return off, seq
                pos = h + 1
            return None
        finally:
            view.release()
