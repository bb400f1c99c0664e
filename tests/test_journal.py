"""Unit tests for curvine.journal: framing, group commit, recovery, checkpoints.

The recovery tests damage real segment files byte by byte, because the one thing a
write-ahead journal must never do is drop a record that follows damage (it may
have been acknowledged) or refuse to start after an ordinary crash.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import time
import zlib

import lmdb
import pytest

from curvine.journal import (
    Journal,
    JournalCorruption,
    JournalError,
    JournalRecord,
    latest_checkpoint,
    write_checkpoint,
)
from curvine.journal import segment as seg
from curvine.journal.segment import FRAME_HEADER_SIZE, HEADER_SIZE, MAX_PAYLOAD

JLOG = "curvine.journal"


@pytest.fixture(autouse=True)
def _no_unexpected_warnings(request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture):
    """A WARNING from the journal means it repaired something: fail unless the test
    asked for it (by using the ``expect_warnings`` fixture)."""
    caplog.set_level(logging.DEBUG, logger=JLOG)
    yield
    if "expect_warnings" not in request.fixturenames:
        bad = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert not bad, f"unexpected warnings: {bad}"


@pytest.fixture
def expect_warnings(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    return caplog


def payloads(n: int, size: int = 40) -> list[bytes]:
    return [bytes([i % 251]) * size + i.to_bytes(4, "big") for i in range(n)]


def fill(directory: str, data: list[bytes], **kw) -> None:
    with Journal(directory, **kw) as j:
        for i, p in enumerate(data):
            j.append(i % 7, p)
        j.sync()


def only_segment(directory: str) -> str:
    names = sorted(n for n in os.listdir(directory) if n.endswith(".wal"))
    assert len(names) == 1, names
    return os.path.join(directory, names[0])


def segments(directory: str) -> list[str]:
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".wal"))


def frame_offsets(data: list[bytes]) -> list[int]:
    offs, off = [], HEADER_SIZE
    for p in data:
        offs.append(off)
        off += FRAME_HEADER_SIZE + len(p)
    return offs


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def replay(directory: str, after: int = 0) -> list[JournalRecord]:
    with Journal(directory) as j:
        return list(j.records(after))


# -- framing ---------------------------------------------------------------------

def test_frame_layout_is_big_endian_with_crc_over_seq_type_payload():
    """Pins the on-disk format: a silent change would make old journals unreadable."""
    frame = seg.encode_frame(0x0102030405060708, 0xABCD, b"hello")
    length, crc, seq, typ = struct.unpack(">IIQH", frame[:18])
    assert (length, seq, typ) == (5, 0x0102030405060708, 0xABCD)
    assert frame[18:] == b"hello"
    assert crc == zlib.crc32(frame[8:])
    header = seg.encode_header(42)
    assert len(header) == HEADER_SIZE
    assert header[:4] == b"CVJ1"
    assert struct.unpack(">HHQ", header[4:16]) == (seg.VERSION, 0, 42)
    assert seg.segment_name(42) == "seg-00000000000000000042.wal"
    assert seg.parse_segment_name("seg-00000000000000000042.wal") == 42
    assert seg.parse_segment_name("seg-42.wal") is None


@pytest.mark.parametrize("size", [0, 1, 4096, 3 << 20])
def test_round_trip_payload_sizes(tmp_path, size):
    data = [os.urandom(size), b"", os.urandom(size)]
    d = str(tmp_path)
    with Journal(d) as j:
        assert [j.append(0xFFFF, p) for p in data] == [1, 2, 3]
        assert j.sync() == 3
    assert replay(d) == [JournalRecord(i + 1, 0xFFFF, p) for i, p in enumerate(data)]


def test_append_rejects_oversized_record_and_bad_type(tmp_path):
    with Journal(str(tmp_path)) as j:
        with pytest.raises(JournalError):
            j.append(1, bytes(MAX_PAYLOAD + 1))
        with pytest.raises(JournalError):
            j.append(1 << 16, b"")
        with pytest.raises(JournalError):
            j.append(-1, b"")
        # misuse does not poison the journal
        assert j.append(1, b"ok") == 1
        assert j.sync() == 1


# -- group commit ----------------------------------------------------------------

def test_many_appends_one_sync_is_one_write_and_one_fsync(tmp_path, monkeypatch):
    d = str(tmp_path)
    with Journal(d) as j:
        j.append(1, b"first")
        j.sync()  # creates the segment (file + directory fsync)
        calls = {"fsync": 0, "write": 0}
        real_fsync, real_write = os.fdatasync, os.write

        def fsync(fd):
            calls["fsync"] += 1
            real_fsync(fd)

        def write(fd, data):
            calls["write"] += 1
            return real_write(fd, data)

        monkeypatch.setattr(os, "fdatasync", fsync)
        monkeypatch.setattr(os, "write", write)
        for i in range(1000):
            assert j.append(2, b"r%d" % i) == i + 2
        assert j.last_seq == 1001
        assert j.durable_seq == 1
        assert j.sync() == 1000
        monkeypatch.undo()
        assert calls == {"fsync": 1, "write": 1}
        assert j.stats["fsyncs"] == 2
        assert j.stats["syncs"] == 2
        assert j.stats["last_batch"] == 1000
        assert j.stats["records"] == 1001
        assert j.durable_seq == 1001
        assert j.sync() == 0  # nothing pending: no I/O
        assert j.stats["fsyncs"] == 2
    assert len(replay(d)) == 1001


def test_appends_from_many_threads_while_syncing(tmp_path):
    """Group commit means handlers append concurrently while one thread syncs:
    seqs must be unique and gap-free and every payload must land under its seq."""
    import threading
    d = str(tmp_path)
    seqs: dict[int, bytes] = {}
    with Journal(d, segment_size=4096) as j:
        stop = threading.Event()

        def syncer():
            while not stop.is_set():
                j.sync()

        def worker(w: int):
            for i in range(300):
                p = b"w%d-%d" % (w, i)
                seqs[j.append(w, p)] = p

        st = threading.Thread(target=syncer)
        st.start()
        workers = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        stop.set()
        st.join()
        j.sync()
        assert j.durable_seq == 1200
    assert sorted(seqs) == list(range(1, 1201))
    assert {r.seq: r.payload for r in replay(d)} == seqs


def test_first_sync_fsyncs_new_segment_directory(tmp_path):
    with Journal(str(tmp_path / "j")) as j:
        j.append(1, b"x")
        j.sync()
        assert j.stats["dir_fsyncs"] == 1
        assert j.stats["segments_created"] == 1


def test_unsynced_appends_are_not_on_disk(tmp_path, expect_warnings):
    d = str(tmp_path)
    with Journal(d) as j:
        j.append(1, b"a")
        j.sync()
        j.append(1, b"b")
        assert [r.payload for r in j.records(0)] == [b"a"]
    assert [r.payload for r in replay(d)] == [b"a"]
    assert "unsynced" in expect_warnings.text


def test_failed_fsync_makes_journal_refuse_appends(tmp_path, monkeypatch):
    d = str(tmp_path)
    with Journal(d) as j:
        j.append(1, b"a")
        j.sync()
        j.append(1, b"b")

        def broken(fd):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", broken)
        with pytest.raises(JournalError, match="sync failed"):
            j.sync()
        monkeypatch.undo()
        with pytest.raises(JournalError):
            j.append(1, b"c")
        with pytest.raises(JournalError):
            j.sync()
    # the write did reach the file; a restart decides what is there
    assert [r.payload for r in replay(d)] == [b"a", b"b"]


# -- reopen and replay -----------------------------------------------------------

def test_reopen_replays_identical_records_and_continues_seq(tmp_path):
    d = str(tmp_path)
    data = payloads(50)
    fill(d, data)
    got = replay(d)
    assert got == [JournalRecord(i + 1, i % 7, p) for i, p in enumerate(data)]
    with Journal(d) as j:
        assert (j.first_seq, j.last_seq) == (1, 50)
        assert j.append(3, b"more") == 51
        j.sync()
    assert replay(d, 50) == [JournalRecord(51, 3, b"more")]


def test_empty_journal(tmp_path):
    d = str(tmp_path / "new" / "journal")
    with Journal(d) as j:
        assert (j.first_seq, j.last_seq) == (1, 0)
        assert list(j.records(0)) == []
        assert j.retire(100) == 0
    assert os.path.isdir(d)


def test_records_after_seq_slicing(tmp_path):
    d = str(tmp_path)
    fill(d, payloads(20))
    with Journal(d) as j:
        assert [r.seq for r in j.records(0)] == list(range(1, 21))
        assert [r.seq for r in j.records(7)] == list(range(8, 21))
        assert [r.seq for r in j.records(19)] == [20]
        assert list(j.records(20)) == []
        with pytest.raises(JournalError, match="beyond"):
            j.records(21)
        with pytest.raises(JournalError):
            j.records(-1)


def test_second_instance_on_same_directory_is_refused(tmp_path):
    d = str(tmp_path)
    with Journal(d):
        with pytest.raises(JournalError, match="in use"):
            Journal(d)
    Journal(d).close()  # released on close


# -- segments ----------------------------------------------------------------------

def test_segment_roll_and_retire(tmp_path):
    d = str(tmp_path)
    data = payloads(30, size=100)  # frames of 122 bytes
    with Journal(d, segment_size=500) as j:
        for i, p in enumerate(data):
            j.append(1, p)
            if i % 4 == 3:
                j.sync()
        j.sync()
        files = segments(d)
        assert len(files) > 3
        firsts = [seg.parse_segment_name(os.path.basename(f)) for f in files]
        assert firsts[0] == 1
        # every segment but the last reaches segment_size, none grows past one record
        for f in files[:-1]:
            assert 500 <= os.path.getsize(f) < 500 + 122
        assert [r.payload for r in j.records(0)] == data
        # retire up to a seq in the middle of the third segment: only two go
        upto = firsts[2] + 1
        assert j.retire(upto) == 2
        assert segments(d) == files[2:]
        assert j.first_seq == firsts[2]
        assert [r.seq for r in j.records(upto)] == list(range(upto + 1, 31))
        # the active segment is never retired
        assert j.retire(10**9) == len(files) - 3
        assert segments(d) == files[-1:]
        assert j.last_seq == 30
        assert j.append(1, b"next") == 31
        j.sync()
    with Journal(d, segment_size=500) as j:
        assert j.first_seq == firsts[-1]
        assert [r.seq for r in j.records(firsts[-1] - 1)] == list(range(firsts[-1], 32))


def test_one_large_batch_rolls_between_records(tmp_path):
    d = str(tmp_path)
    data = payloads(10, size=100)
    with Journal(d, segment_size=300) as j:
        for p in data:
            j.append(1, p)
        assert j.sync() == 10
    files = segments(d)
    # header + 3 frames of 122 bytes pass 300: 3 records per segment
    assert [seg.parse_segment_name(os.path.basename(f)) for f in files] == [1, 4, 7, 10]
    assert [r.payload for r in replay(d)] == data


def test_gap_after_retire(tmp_path):
    d = str(tmp_path)
    with Journal(d, segment_size=100) as j:
        for p in payloads(10, size=100):
            j.append(1, p)
            j.sync()
        assert j.retire(5) == 5
        assert j.first_seq == 6
        with pytest.raises(JournalError, match="gap"):
            j.records(4)
        with pytest.raises(JournalError, match="gap"):
            j.records(0)
        assert [r.seq for r in j.records(5)] == [6, 7, 8, 9, 10]


# -- torn tail ---------------------------------------------------------------------

def _check_recovered(d: str, data: list[bytes], keep: int) -> None:
    with Journal(d) as j:
        assert j.last_seq == keep
        assert [r.payload for r in j.records(0)] == data[:keep]
        assert j.append(1, b"after crash") == keep + 1
        assert j.sync() == 1
    got = replay(d)
    assert [r.seq for r in got] == list(range(1, keep + 2))
    assert got[-1].payload == b"after crash"


def test_torn_tail_cut_at_every_offset_of_last_record(tmp_path, expect_warnings):
    data = payloads(3)
    last = frame_offsets(data)[-1]
    d0 = str(tmp_path / "orig")
    fill(d0, data)
    full = open(only_segment(d0), "rb").read()
    for cut in range(last, len(full)):
        d = str(tmp_path / f"cut{cut}")
        os.mkdir(d)
        path = os.path.join(d, os.path.basename(only_segment(d0)))
        with open(path, "wb") as f:
            f.write(full[:cut])
        expect_warnings.clear()
        _check_recovered(d, data, 2)
        assert os.path.getsize(path) == last + FRAME_HEADER_SIZE + len(b"after crash")
        if cut > last:
            msg = [r.getMessage() for r in expect_warnings.records
                   if r.levelno == logging.WARNING]
            assert len(msg) == 1, msg
            assert path in msg[0] and f"offset {last}" in msg[0] and \
                f"cut {cut - last} bytes" in msg[0]


def test_torn_tail_garbage_at_every_byte_of_last_record(tmp_path, expect_warnings):
    """A crash can also leave the right length with wrong bytes (bad checksum)."""
    data = payloads(3)
    last = frame_offsets(data)[-1]
    d0 = str(tmp_path / "orig")
    fill(d0, data)
    full = open(only_segment(d0), "rb").read()
    for pos in range(last, len(full)):
        d = str(tmp_path / f"flip{pos}")
        os.mkdir(d)
        path = os.path.join(d, os.path.basename(only_segment(d0)))
        with open(path, "wb") as f:
            f.write(full)
        flip(path, pos)
        _check_recovered(d, data, 2)
    assert expect_warnings.text.count("torn tail") == len(full) - last


def test_torn_tail_with_huge_garbage_length_does_not_allocate(tmp_path, expect_warnings):
    d = str(tmp_path)
    data = payloads(2)
    fill(d, data)
    with open(only_segment(d), "ab") as f:
        f.write(struct.pack(">IIQH", 0xFFFFFFFF, 0, 3, 1) + b"junk")
    _check_recovered(d, data, 2)


def test_torn_tail_of_zeros_and_random_bytes_is_fast(tmp_path, expect_warnings):
    """After a crash the tail may be megabytes of zeros or stale bytes; the search
    for a valid record after the damage must not crawl through it in Python."""
    for name, junk in (("zeros", bytes(32 << 20)), ("random", os.urandom(4 << 20))):
        d = str(tmp_path / name)
        data = payloads(5)
        fill(d, data)
        with open(only_segment(d), "ab") as f:
            f.write(junk)
        t0 = time.monotonic()
        _check_recovered(d, data, 5)
        assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("seq", [3, 0x1_0000, 2**40 + 3])
def test_find_valid_frame_after_zeros_and_garbage(tmp_path, seq):
    """The zero-run skip and the seq search must not jump over a real frame,
    whatever its alignment and however many leading zero bytes its seq has."""
    path = str(tmp_path / "seg")
    # a crc ending in zero bytes makes the zero run reach into the seq field,
    # the case where skipping the run too far would miss the frame
    frame = next(f for f in (seg.encode_frame(seq, 0, i.to_bytes(4, "big"))
                             for i in range(1 << 22)) if f[6:8] == b"\0\0")
    for gap in list(range(0, 40)) + [4096]:
        for filler in (bytes(gap), os.urandom(gap)):
            with open(path, "wb") as f:
                f.write(b"\xff" * 3 + filler + frame + bytes(50))
            assert seg.find_valid_frame(path, 1, seq) == (3 + gap, seq)
            assert seg.find_valid_frame(path, 1, seq + 1) is None  # seq too old
            assert seg.find_valid_frame(path, 4 + gap, seq) is None  # starts past it


def test_torn_segment_header_of_empty_last_segment(tmp_path, expect_warnings):
    data = payloads(3, size=100)
    d0 = str(tmp_path / "orig")
    fill(d0, data, segment_size=100)  # one record per segment
    files = segments(d0)
    assert len(files) == 3
    for keep in range(HEADER_SIZE):
        d = str(tmp_path / f"hdr{keep}")
        os.mkdir(d)
        for f in files[:-1]:
            with open(os.path.join(d, os.path.basename(f)), "wb") as out:
                out.write(open(f, "rb").read())
        last = os.path.join(d, os.path.basename(files[-1]))
        with open(last, "wb") as out:
            out.write(open(files[-1], "rb").read()[:keep])
        _check_recovered(d, data, 2)
        # the repaired segment keeps its name: seq 3 is the first in it again
        assert seg.parse_segment_name(os.path.basename(segments(d)[-1])) == 3


# -- corruption ----------------------------------------------------------------------

def test_flipped_byte_before_the_tail_is_corruption(tmp_path):
    """Every byte of a middle record: a valid record follows, so this is not a
    torn tail and nothing may be cut."""
    data = payloads(4)
    offs = frame_offsets(data)
    d0 = str(tmp_path / "orig")
    fill(d0, data)
    full = open(only_segment(d0), "rb").read()
    name = os.path.basename(only_segment(d0))
    for pos in range(offs[1], offs[2]):
        d = str(tmp_path / f"flip{pos}")
        os.mkdir(d)
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(full)
        flip(path, pos)
        with pytest.raises(JournalCorruption) as ei:
            Journal(d)
        e = ei.value
        assert (e.segment, e.offset) == (path, offs[1])
        assert name in str(e) and f"offset {offs[1]}" in str(e)
        assert open(path, "rb").read() == full[:pos] + bytes([full[pos] ^ 0x5A]) + full[pos + 1:]
        assert_unlocked(d)  # a failed open must not keep the directory locked


def assert_unlocked(d: str) -> None:
    with open(os.path.join(d, "LOCK"), "ab") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_bad_header_followed_by_valid_record_is_corruption(tmp_path):
    d = str(tmp_path)
    fill(d, payloads(2))
    path = only_segment(d)
    flip(path, 1)  # magic
    with pytest.raises(JournalCorruption) as ei:
        Journal(d)
    assert (ei.value.segment, ei.value.offset) == (path, 0)


def test_corruption_in_a_non_last_segment(tmp_path):
    data = payloads(9, size=100)
    d = str(tmp_path)
    fill(d, data, segment_size=300)
    files = segments(d)
    assert len(files) == 3
    # last record of the first segment: nothing follows it in that file, but it
    # is not the tail of the journal
    first_frames = frame_offsets(data[:3])
    flip(files[0], first_frames[-1] + FRAME_HEADER_SIZE + 5)
    with pytest.raises(JournalCorruption) as ei:
        Journal(d, segment_size=300)
    assert (ei.value.segment, ei.value.offset) == (files[0], first_frames[-1])
    assert os.path.basename(files[0]) in str(ei.value)


def test_truncated_non_last_segment_is_corruption(tmp_path):
    data = payloads(9, size=100)
    d = str(tmp_path)
    fill(d, data, segment_size=300)
    files = segments(d)
    size = os.path.getsize(files[0])
    os.truncate(files[0], size - 3)
    with pytest.raises(JournalCorruption) as ei:
        Journal(d)
    assert ei.value.segment == files[0]
    assert ei.value.offset == frame_offsets(data[:3])[-1]


def test_missing_middle_segment_is_corruption(tmp_path):
    d = str(tmp_path)
    fill(d, payloads(9, size=100), segment_size=300)
    files = segments(d)
    os.unlink(files[1])
    with pytest.raises(JournalCorruption) as ei:
        Journal(d)
    assert ei.value.segment == files[2]
    assert "previous segment ends at seq 3" in str(ei.value)


def test_seq_that_does_not_follow_is_corruption_even_at_the_tail(tmp_path):
    """Intact frames with a wrong seq are not what a crash leaves behind."""
    d = str(tmp_path)
    path = os.path.join(d, seg.segment_name(1))
    frames = [seg.encode_frame(s, 1, b"p%d" % s) for s in (1, 2, 4)]
    with open(path, "wb") as f:
        f.write(seg.encode_header(1) + b"".join(frames))
    with pytest.raises(JournalCorruption) as ei:
        Journal(d)
    assert ei.value.offset == HEADER_SIZE + len(frames[0]) + len(frames[1])
    assert "seq 4 where 3 was expected" in str(ei.value)


def test_header_seq_must_match_file_name(tmp_path):
    d = str(tmp_path)
    with open(os.path.join(d, seg.segment_name(5)), "wb") as f:
        f.write(seg.encode_header(1) + seg.encode_frame(1, 1, b"x"))
    with pytest.raises(JournalCorruption, match="file name says 5"):
        Journal(d)


def test_corruption_pickles(tmp_path):
    """Errors may cross process boundaries (e.g. a test harness): keep them plain."""
    import pickle
    e = pickle.loads(pickle.dumps(JournalCorruption("/j/seg-1.wal", 7, "checksum mismatch")))
    assert (e.segment, e.offset) == ("/j/seg-1.wal", 7)
    assert "/j/seg-1.wal" in str(e) and "offset 7" in str(e)


# -- checkpoints -------------------------------------------------------------------

def _env(path: str, **kw) -> lmdb.Environment:
    return lmdb.open(path, map_size=64 << 20, max_dbs=4, **kw)


@pytest.mark.parametrize("subdir", [True, False])
def test_checkpoint_write_and_latest(tmp_path, subdir):
    root = str(tmp_path / "ckpt")
    assert latest_checkpoint(root) is None
    env = _env(str(tmp_path / "meta"), subdir=subdir)
    db = env.open_db(b"inodes")
    paths = []
    for seq in (10, 20, 30):
        with env.begin(write=True) as txn:
            txn.put(b"applied", str(seq).encode(), db=db)
        env.sync()
        paths.append(write_checkpoint(env, root, seq))
    assert paths[-1] == os.path.join(root, "ckpt-00000000000000000030")
    assert latest_checkpoint(root) == (30, paths[-1])
    assert sorted(os.listdir(root)) == ["ckpt-00000000000000000020", "ckpt-00000000000000000030"]
    copy = lmdb.open(paths[-1], readonly=True, lock=False, max_dbs=4)
    try:
        with copy.begin() as txn:
            assert txn.get(b"applied", db=copy.open_db(b"inodes", txn=txn)) == b"30"
    finally:
        copy.close()
    # same seq again: the existing checkpoint stands
    assert write_checkpoint(env, root, 30) == paths[-1]
    with pytest.raises(JournalError):
        write_checkpoint(env, root, 25)
    env.close()


def test_checkpoint_removes_leftover_temp_dirs(tmp_path):
    root = tmp_path / "ckpt"
    (root / ".tmp-ckpt-crashed").mkdir(parents=True)
    (root / ".tmp-ckpt-crashed" / "data.mdb").write_bytes(b"partial")
    (root / "ckpt-junk").mkdir()  # not a checkpoint name: ignored
    env = _env(str(tmp_path / "meta"))
    path = write_checkpoint(env, str(root), 1)
    env.close()
    assert sorted(os.listdir(root)) == ["ckpt-00000000000000000001", "ckpt-junk"]
    assert latest_checkpoint(str(root)) == (1, path)
    assert os.path.getsize(os.path.join(path, "data.mdb")) > 0


def test_checkpoint_then_retire_then_restart(tmp_path):
    """The master's sequence: checkpoint at the applied seq, retire, restart from
    the checkpoint and replay only what follows it."""
    jd, root = str(tmp_path / "journal"), str(tmp_path / "ckpt")
    env = _env(str(tmp_path / "meta"))
    with Journal(jd, segment_size=200) as j:
        for i in range(1, 21):
            seq = j.append(1, b"k%d" % i)
            j.sync()
            with env.begin(write=True) as txn:
                txn.put(b"k%d" % i, b"v")
                txn.put(b"applied", str(seq).encode())
        env.sync()
        write_checkpoint(env, root, 20)
        j.retire(20)
        assert j.append(1, b"k21") == 21
        j.sync()
    env.close()
    seq, path = latest_checkpoint(root)
    with Journal(jd, segment_size=200) as j:
        assert [r.payload for r in j.records(seq)] == [b"k21"]
        with pytest.raises(JournalError):
            j.records(seq - 5)
