"""verify's walk over a journal: the segment files of a directory (``walk``) and the
check of each record against the master's replay (``replay_problem``); the group's
journal in etcd is walked by cli/journal_etcd.py with the same two."""

from __future__ import annotations

import os
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from curvine.journal.journal import Damage, gap_damage, list_segments, segment_damage
from curvine.journal.segment import JournalCorruption, SegmentReader
from curvine.proto import journal_pb2


@dataclass
class Walk:
    segments: int = 0
    records: int = 0
    first_seq: int = 0
    last_seq: int = 0
    bytes: int = 0
    damage: Damage | None = None


def walk(directory: str) -> Walk:
    """Check every segment the way the master does at start (the journal's
    ``segment_damage`` and ``gap_damage``, then the replay's decoding of each record):
    damage anywhere but an incomplete tail of the last segment is corruption; so is a
    crc-valid record the master could not replay, wherever it is (no crash writes
    one), and a segment path that is not a regular file."""
    w = Walk()
    segs = list_segments(directory)
    expect = None
    for i, (first, path) in enumerate(segs):
        w.segments += 1
        w.bytes += os.lstat(path).st_size  # a symlink is refused below, not followed
        w.damage = gap_damage(path, first, expect)
        if w.damage is not None:
            return w
        reader = SegmentReader(path, first)
        last = first - 1
        try:
            for rec in reader:
                problem = replay_problem(rec.payload)
                if problem is not None:
                    w.last_seq = max(w.last_seq, last)
                    w.damage = Damage(path, reader.offset, f"record seq {rec.seq} passes its "
                                      f"checksum but cannot be replayed: {problem}", False)
                    return w
                last = rec.seq
                w.records += 1
                w.first_seq = w.first_seq or rec.seq
        except JournalCorruption as e:  # not a regular file (segment.open_segment)
            w.damage = Damage(e.segment, e.offset, e.reason, False)
            return w
        w.last_seq = max(w.last_seq, last)
        w.damage = segment_damage(reader, last, is_last=i == len(segs) - 1)
        if w.damage is not None and not w.damage.torn_tail:
            return w
        expect = last + 1
    return w


def replay_problem(payload: bytes) -> str | None:
    """Why the master's replay would fail on this record whatever its metadata holds,
    or None.  The replay (master/meta/committer.py) parses every record as a JournalEntry,
    then Namespace.remember and Namespace.apply use the record kind that is set; so a
    payload that does not parse, an entry with no record kind set (not a journal entry,
    or a kind this version does not know) and a kind this master has no apply for are
    damage.  Whether a well-formed record applies to the state before it is only known
    by replaying it: the master checks that at start (exit 2, naming the record)."""
    from curvine.master.meta.namespace import APPLY
    entry = journal_pb2.JournalEntry()
    try:
        entry.ParseFromString(payload)
    except DecodeError:
        return f"its {len(payload)} bytes do not decode as a journal entry"
    except Exception as e:  # noqa: BLE001 - whatever the parser raises, replay would too
        return f"its {len(payload)} bytes do not decode as a journal entry ({type(e).__name__})"
    op = entry.WhichOneof("op")
    if op is None:
        return "the entry holds no record kind this version knows"
    if op not in APPLY:
        return f"this version of the master cannot apply a {op} record"
    return None
