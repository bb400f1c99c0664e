"""`curvine journal verify` and the master against journals that were tampered with
or damaged in ways a crc check alone does not catch (issue 12):

- a record whose crc is right but that the master could not replay (it does not
  decode, holds no record kind, or does not apply): `verify` exits 4 naming segment
  and offset, the master exits 2 with one log line naming them (no traceback);
- a segment path that is not a regular file (FIFO, directory, symlink): refused at
  once, never opened in a way that blocks;
- a huge sparse segment: read in bounded memory and quickly.

Everything runs the real CLI and a real `curvine-master` as subprocesses; damaged
records are written with the journal's own framing code (valid crc).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from curvine.journal import Journal
from curvine.journal.segment import (
    HEADER_SIZE,
    SegmentReader,
    encode_frame,
    encode_header,
    parse_segment_name,
    segment_name,
)
from curvine.proto import common_pb2, journal_pb2
from fs_helpers import run_master_once

MiB = 1 << 20
GiB = 1 << 30
RSS_LIMIT = 200 * MiB
MKDIR = journal_pb2.JournalEntry.DESCRIPTOR.fields_by_name["mkdir"].number
CREATE = journal_pb2.JournalEntry.DESCRIPTOR.fields_by_name["create"].number

# crc-valid payloads the master cannot replay, whatever the metadata holds
UNREPLAYABLE = {
    "garbage": b"\xff\xff\xff\xff\x07",          # not protobuf at all
    "empty": b"",                                 # parses, but no record kind is set
    "unknown-kind": b"\xa0\x3e\x01",              # only field 1000: a kind we do not know
    "truncated": journal_pb2.JournalEntry(        # a real record cut short
        mkdir=journal_pb2.MkdirRecord(parent=1, name=b"x" * 40)).SerializeToString()[:-10],
}


# --------------------------------------------------------------------------- helpers

def cli(*args: str, timeout: float = 20.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "curvine.cli.main", *args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def verify(directory: str, timeout: float = 20.0) -> subprocess.CompletedProcess:
    return cli("journal", "verify", "--journal-dir", str(directory), timeout=timeout)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("curvine: error: ") and r.stderr.count("\n") == 1, r.stderr
    return r.stderr.strip()


def entry(i: int) -> bytes:
    return journal_pb2.JournalEntry(mkdir=journal_pb2.MkdirRecord(
        parent=1, name=f"d{i}".encode(), inode=common_pb2.Inode(ino=100 + i))).SerializeToString()


def make_journal(directory: str, n: int = 6, **kw) -> None:
    with Journal(directory, fsync=False, **kw) as j:
        for i in range(n):
            j.append(MKDIR, entry(i))
        j.sync()
    os.unlink(os.path.join(directory, "LOCK"))


def segment_files(directory: str) -> list[tuple[int, str]]:
    return sorted((parse_segment_name(n), os.path.join(directory, n))
                  for n in os.listdir(directory) if parse_segment_name(n) is not None)


def rewrite(path: str, first: int, replace: dict[int, bytes], append: list[bytes] = ()
            ) -> dict[int, int]:
    """Rewrite segment ``path`` with the payloads of the seqs in ``replace`` swapped
    and ``append`` added, every frame crc-valid; returns seq -> offset of each frame."""
    reader = SegmentReader(path, first)
    records = [(r.seq, r.type, replace.get(r.seq, r.payload)) for r in reader]
    assert reader.bad is None, reader.bad
    seq = records[-1][0] if records else first - 1
    for payload in append:
        seq += 1
        records.append((seq, MKDIR, payload))
    offsets, data = {}, bytearray(encode_header(first))
    for seq, typ, payload in records:
        offsets[seq] = len(data)
        data += encode_frame(seq, typ, payload)
    with open(path, "wb") as f:
        f.write(data)
    return offsets


# Runs a command and writes its peak RSS (KiB) to the file named first.  Linux keeps,
# in a child's ru_maxrss, the high-water mark of the process it was forked from (up to
# the exec): measured straight from pytest, which holds gigabytes after the LMCache
# tests, that is pytest's size.  Forked from this small process it is the command's.
_RSS_WRAPPER = (
    "import os, subprocess, sys\n"
    "rc = subprocess.call(sys.argv[2:])\n"
    "import resource\n"
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
    "sys.exit(rc)\n")


def measured(argv: list[str], timeout: float = 30.0) -> tuple[int | None, str, str, int, float]:
    """Run ``argv``; (exit code or None if killed at the timeout, stdout, stderr, peak
    RSS in bytes, seconds).  The RSS is the command's own (see _RSS_WRAPPER), not that
    of any other process this test run started."""
    import tempfile
    fd, rss_file = tempfile.mkstemp(prefix="rss-")
    os.close(fd)
    try:
        rc, out, err, _, secs = _measured([sys.executable, "-c", _RSS_WRAPPER, rss_file,
                                           *argv], timeout)
        text = open(rss_file).read().strip()
        return rc, out, err, int(text) * 1024 if text else 0, secs
    finally:
        os.unlink(rss_file)


def _measured(argv: list[str], timeout: float) -> tuple[int | None, str, str, int, float]:
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)  # a timeout kills the whole group
    deadline = t0 + timeout
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            os.killpg(p.pid, signal.SIGKILL)
            pid, status, usage = os.wait4(p.pid, 0)
            p.returncode = -9
            p.stdout.close()
            p.stderr.close()
            return None, "", "", usage.ru_maxrss * 1024, time.monotonic() - t0
        time.sleep(0.02)
    p.returncode = os.waitstatus_to_exitcode(status)
    out, err = p.stdout.read().decode(), p.stderr.read().decode()
    p.stdout.close()
    p.stderr.close()
    return p.returncode, out, err, usage.ru_maxrss * 1024, time.monotonic() - t0


# --------------------------------------------------------------------------- verify decodes

@pytest.mark.parametrize("kind,where", [(k, "middle") for k in sorted(UNREPLAYABLE)]
                         + [("garbage", "last"), ("empty", "last")])
def test_verify_reports_crc_valid_record_that_cannot_be_replayed(tmp_path, kind, where):
    """Old code: exit 0 ("OK"), the crc being right."""
    d = str(tmp_path / "j")
    make_journal(d, 6)
    (first, seg), = segment_files(d)
    if where == "middle":
        offsets = rewrite(seg, first, {3: UNREPLAYABLE[kind]})
        bad_seq = 3
    else:
        offsets = rewrite(seg, first, {}, append=[UNREPLAYABLE[kind]])
        bad_seq = 7  # the last record: crc-valid, so no torn write
    size = os.path.getsize(seg)
    r = verify(d)
    assert r.returncode == 4, (r.stdout, r.stderr)
    line = one_error_line(r)
    assert (f"journal damaged: segment {seg} at byte offset {offsets[bad_seq]}: record seq "
            f"{bad_seq} passes its checksum but cannot be replayed") in line, line
    # the summary counts the records before the damage
    assert f"{bad_seq - 1} records (seq 1..{bad_seq - 1})" in r.stdout, r.stdout
    assert os.path.getsize(seg) == size  # verify changes nothing


def test_verify_reports_unreplayable_record_in_a_non_last_segment(tmp_path):
    """Old code: exit 0."""
    d = str(tmp_path / "j")
    make_journal(d, 6, segment_size=HEADER_SIZE + 1)  # one record per segment
    segs = segment_files(d)
    assert len(segs) == 6
    assert verify(d).returncode == 0  # the records make_journal writes decode
    first, seg = segs[2]
    offsets = rewrite(seg, first, {first: b"\x07"})
    line = one_error_line(r := verify(d))
    assert r.returncode == 4
    assert f"segment {seg} at byte offset {offsets[first]}: record seq {first} " in line


# --------------------------------------------------------------------------- not regular

def _fifo(path: str, tmp_path) -> None:
    os.mkfifo(path)


def _directory(path: str, tmp_path) -> None:
    os.mkdir(path)


def _link_to_fifo(path: str, tmp_path) -> None:
    os.mkfifo(tmp_path / "fifo")
    os.symlink(tmp_path / "fifo", path)


def _link_to_segment(path: str, tmp_path) -> None:
    make_journal(str(tmp_path / "elsewhere"), 3)
    os.symlink(segment_files(str(tmp_path / "elsewhere"))[0][1], path)


def _link_to_dev_zero(path: str, tmp_path) -> None:
    os.symlink("/dev/zero", path)


@pytest.mark.parametrize("make,kind", [
    (_fifo, "a FIFO"),                    # old: verify hangs in open()
    (_directory, "a directory"),          # old: exit 1, IsADirectoryError
    (_link_to_fifo, "a symbolic link"),   # old: hangs
    (_link_to_segment, "a symbolic link"),  # old: exit 0, followed the link
    (_link_to_dev_zero, "a symbolic link"),  # old: exit 0, read /dev/zero as a torn header
], ids=["fifo", "directory", "symlink-fifo", "symlink-segment", "symlink-dev-zero"])
def test_verify_and_dump_refuse_a_segment_that_is_not_a_regular_file(tmp_path, make, kind):
    d = tmp_path / "j"
    make_journal(str(d), 3)
    (first, seg), = segment_files(str(d))
    # the bad one is the second segment, after an intact first one
    bad = os.path.join(d, segment_name(first + 3))
    make(bad, tmp_path)
    t0 = time.monotonic()
    for cmd in ("verify", "dump"):
        r = cli("journal", cmd, "--journal-dir", str(d), timeout=10)
        assert r.returncode == 4, (cmd, r.stdout, r.stderr)
        line = one_error_line(r)
        assert (f"segment {bad} at byte offset 0: the segment is {kind}, not a regular "
                f"file") in line, line
    assert time.monotonic() - t0 < 8


# --------------------------------------------------------------------------- sparse

def _verify_argv(d: str) -> list[str]:
    return [sys.executable, "-m", "curvine.cli.main", "journal", "verify", "--journal-dir", d]


def test_verify_streams_a_2gib_sparse_segment(tmp_path):
    """Zeros after the last record of the last segment are a torn tail (what the
    existing rules say of a zero tail: the master cuts it); verify says so in bounded
    memory.  Old code: ~2 GB peak RSS (mmap of the whole file) and ~16 s here."""
    d = str(tmp_path / "j")
    make_journal(d, 5)
    (first, seg), = segment_files(d)
    end = os.path.getsize(seg)
    os.truncate(seg, 2 * GiB)
    rc, out, err, rss, secs = measured(_verify_argv(d))
    print(f"\nverify of a 2 GiB sparse segment: {secs:.2f}s, peak RSS {rss / MiB:.0f} MiB")
    assert rc == 0, (out, err)
    assert out.splitlines()[0].endswith(": OK") and "5 records" in out, out
    assert f"note: the last record is incomplete (segment {seg} at byte offset {end}" in out
    assert rss < RSS_LIMIT and secs < 10


def test_verify_finds_a_record_after_a_2gib_hole(tmp_path):
    """A valid record after a hole is damage before the tail (exit 4, naming where the
    damage starts and the record after it); found without reading the hole.  Old
    code: right answer, ~2 GB peak RSS."""
    d = str(tmp_path / "j")
    make_journal(d, 5)
    (first, seg), = segment_files(d)
    end = os.path.getsize(seg)
    later = 2 * GiB + 7  # not aligned to anything
    with open(seg, "r+b") as f:
        f.seek(later)
        f.write(encode_frame(6, MKDIR, entry(6)))
    rc, out, err, rss, secs = measured(_verify_argv(d))
    print(f"\nverify with a 2 GiB hole: {secs:.2f}s, peak RSS {rss / MiB:.0f} MiB")
    assert rc == 4, (out, err)
    assert (f"segment {seg} at byte offset {end}: checksum mismatch, but a valid record "
            f"(seq 6) follows at offset {later}") in err, err
    assert rss < RSS_LIMIT and secs < 10


_OPEN_JOURNAL = """
import sys
from curvine.journal import Journal
with Journal(sys.argv[1], fsync=False) as j:
    print(j.durable_seq, sum(1 for _ in j.records(0)))
"""


def test_master_journal_open_streams_a_2gib_sparse_segment(tmp_path):
    """The master's own open (Journal._scan) on the same file: cuts the zero tail in
    bounded memory.  Old code: ~2 GB peak RSS."""
    d = str(tmp_path / "j")
    make_journal(d, 5)
    (first, seg), = segment_files(d)
    end = os.path.getsize(seg)
    os.truncate(seg, 2 * GiB)
    rc, out, err, rss, secs = measured([sys.executable, "-c", _OPEN_JOURNAL, d])
    print(f"\nJournal() on a 2 GiB sparse segment: {secs:.2f}s, peak RSS {rss / MiB:.0f} MiB")
    assert rc == 0, err
    assert out.split() == ["5", "5"]
    assert "torn tail" in err and os.path.getsize(seg) == end
    assert rss < RSS_LIMIT and secs < 10


# --------------------------------------------------------------------------- the master

def _stopped_cluster(make_cluster):
    """A real cluster (no workers, no mounts) with a few directories, its master
    stopped cleanly: (cluster, CLI args for it, journal dir, first seq, segment path,
    number of records)."""
    c = make_cluster(workers=0, mounts=0)
    m = ("--master", c.master_addr, "--conf", os.path.join(c.base, "conf", "master-0.toml"))
    for p in ("/a/b", "/c"):
        r = cli("fs", "mkdir", "-p", p, *m)
        assert r.returncode == 0, r.stderr
    c.kill("master", sig=signal.SIGTERM)
    jdir = os.path.join(c.base, "master", "journal")
    (first, seg), = segment_files(jdir)
    r = verify(jdir)
    assert r.returncode == 0, r.stderr  # every record the master wrote decodes
    n = int(re.search(r"(\d+) records", r.stdout).group(1))
    assert n >= 4
    return c, m, jdir, first, seg, n


def _serves(c, m) -> None:
    c.start("master")
    r = cli("fs", "ls", "/", *m)
    assert r.returncode == 0 and r.stdout.split() == ["a/", "c/"], (r.stdout, r.stderr)


def test_master_exits_2_naming_a_record_it_cannot_replay(make_cluster):
    """A real master on journals with a crc-valid record it cannot replay: exit 2,
    one CRITICAL line naming segment and offset, no traceback, the journal
    untouched.  Old code: exit 1 with a traceback (DecodeError, TypeError,
    AttributeError)."""
    c, m, jdir, first, seg, n = _stopped_cluster(make_cluster)
    pristine = open(seg, "rb").read()

    orphan = journal_pb2.JournalEntry(create=journal_pb2.CreateRecord(
        parent=999_999, name=b"orphan", inode=common_pb2.Inode(ino=555_555, parent=999_999,
                                                                name=b"orphan")))
    cases = [
        # (what, damage it, does verify see it?)
        ("garbage in the middle", lambda: rewrite(seg, first, {2: b"\xff\xff\xff\xff\x07"})[2],
         True),
        ("an entry with no record kind at the end",
         lambda: rewrite(seg, first, {}, append=[b""])[n + 1], True),
        # decodes, but applies only to a state that has inode 999999: only a replay sees it
        ("a create under a missing parent at the end",
         lambda: rewrite(seg, first, {}, append=[orphan.SerializeToString()])[n + 1], False),
    ]
    for what, damage, verify_sees in cases:
        with open(seg, "wb") as f:
            f.write(pristine)
        off = damage()
        size = os.path.getsize(seg)
        t0 = time.monotonic()
        r = run_master_once(c.base, timeout=20)
        print(f"\n{what}: curvine-master exited {r.returncode} after "
              f"{time.monotonic() - t0:.1f}s:\n{r.stderr[-600:]}")
        assert r.returncode == 2, (what, r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr
        critical = [ln for ln in r.stderr.splitlines() if "CRITICAL" in ln]
        assert len(critical) == 1, critical
        assert re.search(rf"journal corruption in segment \S*{os.path.basename(seg)} at byte "
                         rf"offset {off}: record seq \d+ passes its checksum but cannot be "
                         rf"replayed", critical[0]), critical[0]
        assert os.path.getsize(seg) == size  # nothing cut or "repaired"
        v = verify(jdir)
        if verify_sees:
            assert v.returncode == 4 and f"at byte offset {off}:" in v.stderr, v.stderr
        else:
            assert v.returncode == 0, v.stderr
        if what.startswith("garbage"):
            # the offline checkpoint replays like the master: damage, exit 4, named
            # (old code: exit 1, "internal error: DecodeError")
            r = cli("journal", "checkpoint", "--offline", "--conf", m[3], "--journal-dir", jdir,
                    "--meta-dir", os.path.join(c.base, "master", "meta"))
            assert r.returncode == 4, (r.stdout, r.stderr)
            assert f"at byte offset {off}: record seq 2 passes its checksum but cannot be " \
                   "replayed" in one_error_line(r)

    with open(seg, "wb") as f:
        f.write(pristine)
    _serves(c, m)  # the pristine journal still starts and serves what was made


def test_master_exits_2_on_a_fifo_segment(make_cluster):
    """A FIFO where the next segment would be: the master refuses it at once (exit
    2, naming it).  Old code: blocks forever in open() (killed at the timeout)."""
    c, m, jdir, first, seg, n = _stopped_cluster(make_cluster)
    fifo = os.path.join(jdir, segment_name(first + n))
    os.mkfifo(fifo)
    r = run_master_once(c.base, timeout=20)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    critical = [ln for ln in r.stderr.splitlines() if "CRITICAL" in ln]
    assert len(critical) == 1 and (f"{os.path.basename(fifo)} at byte offset 0: the segment "
                                   "is a FIFO, not a regular file") in critical[0], critical
    os.unlink(fifo)
    _serves(c, m)
