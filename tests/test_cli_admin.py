"""The admin CLI against a real local cluster, run as a subprocess the way an operator
runs it: `curvine fs ...`, `curvine report`, `curvine journal ...` (docs/cli.md).

Every error case checks the documented exit code and that stderr is exactly one
`curvine: error: ...` line (no traceback).
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

from cluster_util import wait_for
from curvine.journal.segment import FRAME_HEADER_SIZE, HEADER_SIZE, SegmentReader, parse_segment_name

MiB = 1 << 20
BIG = 40 * MiB


def cli(*args, stdin: bytes | None = None, binary: bool = False, stderr=subprocess.PIPE,
        timeout: float = 120.0) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "curvine.cli.main", *args], input=stdin,
                       stdout=subprocess.PIPE, stderr=stderr, timeout=timeout)
    if not binary:
        r.stdout = r.stdout.decode()
    if r.stderr is not None:
        r.stderr = r.stderr.decode()
    return r


def ok(*args, **kw) -> subprocess.CompletedProcess:
    r = cli(*args, **kw)
    assert r.returncode == 0, (args, r.returncode, r.stderr)
    return r


def fails(code: int, *args, contains: str = "") -> str:
    """Run a command that must fail with ``code`` and one error line; returns the line."""
    r = cli(*args)
    assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("curvine: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert contains in r.stderr, (contains, r.stderr)
    return r.stderr.strip()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(MiB), b""):
            h.update(piece)
    return h.hexdigest()


def run_on_a_terminal(argv: list[str], timeout: float = 120.0) -> tuple[int, bytes]:
    """Run ``argv`` with stderr on a pseudo-terminal; (exit code, what it wrote there)."""
    master_fd, slave_fd = pty.openpty()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=slave_fd)
    os.close(slave_fd)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master_fd], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master_fd, 65536)
                except OSError:  # EIO: the child closed its end
                    break
                if not data:
                    break
                out += data
            elif p.poll() is not None:
                break
        return p.wait(timeout=max(deadline - time.monotonic(), 1.0)), out
    finally:
        os.close(master_fd)
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.expect_log(r"WARNING curvine\.master\.cluster\.replication: worker \d+ \(\S+\) missed heartbeats for \S+: declared lost")  # worker 1 SIGKILLed on purpose
def test_fs_commands_report_and_a_lost_worker(make_cluster, tmp_path):
    conf = tmp_path / "cli.toml"
    conf.write_text('[master]\nworker_lost_after = "3s"\n[worker]\nheartbeat_interval = "0.3s"\n')
    c = make_cluster(workers=2, mounts=1, replicas=2, conf=str(conf))
    m = ("--master", c.master_addr, "--conf", os.path.join(c.base, "conf", "master-0.toml"))
    mnt = c.mounts[0]

    # --- put / get of a large file, piped: no progress bar (no \r on stderr)
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        for _ in range(BIG // MiB):
            f.write(os.urandom(MiB))
    digest = sha256_file(str(big))
    ok("fs", "mkdir", "-p", "/data/sub/deeper", *m)
    t0 = time.monotonic()
    r = ok("fs", "put", str(big), "/data/", *m)  # into the directory, as big.bin
    put_s = time.monotonic() - t0
    assert r.stderr == "" and "\r" not in r.stderr and r.stdout == ""
    t0 = time.monotonic()
    r = ok("fs", "get", "/data/big.bin", str(tmp_path / "back.bin"), *m)
    get_s = time.monotonic() - t0
    assert r.stderr == ""
    assert sha256_file(str(tmp_path / "back.bin")) == digest
    assert sha256_file(os.path.join(mnt, "data", "big.bin")) == digest  # the FUSE mount
    print(f"\nput {BIG / MiB:.0f} MiB in {put_s:.2f}s, get in {get_s:.2f}s "
          f"(CLI process start included)")

    # on a terminal the bar is drawn (so the piped check above can fail), unless -q
    small = tmp_path / "small.bin"
    small.write_bytes(os.urandom(4 * MiB))
    code, shown = run_on_a_terminal([sys.executable, "-m", "curvine.cli.main", "fs", "put",
                                     str(small), "/data/big2.bin", *m])
    assert code == 0, shown
    assert b"\r" in shown and b"100.0%" in shown, shown
    code, shown = run_on_a_terminal([sys.executable, "-m", "curvine.cli.main", "fs", "put",
                                     "-q", str(small), "/data/big3.bin", *m])
    assert code == 0 and shown == b"", shown

    # stdin and stdout
    ok("fs", "put", "-", "/data/sub/small.txt", *m, stdin=b"hello curvine\n")
    r = ok("fs", "get", "/data/sub/small.txt", "-", *m, binary=True)
    assert r.stdout == b"hello curvine\n"
    with open(os.path.join(mnt, "data", "sub", "small.txt"), "rb") as f:
        assert f.read() == b"hello curvine\n"

    # --- ls, stat, du, df
    assert ok("fs", "ls", "/data", *m).stdout.splitlines() == [
        "big.bin", "big2.bin", "big3.bin", "sub/"]
    long = ok("fs", "ls", "-l", "/data", *m).stdout.splitlines()
    assert re.fullmatch(rf"-rw-r--r-- +1 +\S+ +\S+ +{BIG} \d{{4}}-\d\d-\d\d \d\d:\d\d big\.bin",
                        long[0]), long
    assert re.fullmatch(r"drwxr-xr-x +\d+ +\S+ +\S+ +\d+ .* sub/", long[3]), long
    assert ok("fs", "ls", "-lh", "/data/big.bin", *m).stdout.split()[4] == "40.0Mi"
    entries = [json.loads(line) for line in ok("fs", "ls", "--json", "/data/sub", *m).stdout.splitlines()]
    assert [(e["path"], e["type"], e["size"]) for e in entries] == [
        ("/data/sub/deeper", "directory", 0), ("/data/sub/small.txt", "file", 14)]
    st = json.loads(ok("fs", "stat", "--json", "/data/big.bin", *m).stdout)
    assert st["size"] == BIG and st["state"] == "complete" and st["mode"] == "0644"
    assert len(st["blocks"]) == 1 and st["blocks"][0]["length"] == BIG
    assert len(st["blocks"][0]["workers"]) == 2  # replicas=2
    text = ok("fs", "stat", "/data/big.bin", *m).stdout
    assert "  File: /data/big.bin" in text and f"Size: {BIG}" in text and "Block 0:" in text
    # the same file named by its path on the mount
    assert json.loads(ok("fs", "stat", "--json", os.path.join(mnt, "data", "big.bin"),
                         *m).stdout)["ino"] == st["ino"]
    total = BIG + 2 * 4 * MiB + 14
    assert ok("fs", "du", "-s", "/data", *m).stdout == f"{total}\t/data\n"
    assert ok("fs", "du", "/data", *m).stdout.splitlines() == [
        "0\t/data/sub/deeper", "14\t/data/sub", f"{total}\t/data"]
    df = json.loads(ok("fs", "df", "--json", *m).stdout)
    assert df["live_workers"] == 2 and df["capacity"] > 0
    assert df["files"] == 8  # /, data, sub, deeper, big, big2, big3, small.txt
    assert "Avail" in ok("fs", "df", "-h", *m).stdout

    # --- errors: one line, documented exit codes
    fails(3, "fs", "ls", "/nope", *m, contains="/nope: no such file or directory")
    fails(3, "fs", "get", "/data/nope", str(tmp_path / "x"), *m)
    assert not os.path.exists(tmp_path / "x")
    fails(1, "fs", "mkdir", "/data", *m, contains="/data: file exists")
    fails(3, "fs", "mkdir", "/nope/x", *m, contains="/nope: no such file or directory")
    ok("fs", "mkdir", "-p", "/data", *m)  # -p: an existing directory is fine
    fails(1, "fs", "rm", "/data", *m, contains="/data: is a directory (use -r)")
    fails(3, "fs", "rm", "/data/nope", *m)
    ok("fs", "rm", "-f", "/data/nope", *m)
    fails(1, "fs", "rm", "-r", "/", *m, contains="refusing to remove the root")
    fails(1, "fs", "mv", "/data", "/data/sub", *m, contains="into itself")
    fails(3, "fs", "put", str(tmp_path / "missing.bin"), "/data/m", *m, contains="missing.bin")
    assert cli("fs", "ls", "/data/m", *m).returncode == 3  # a failed put leaves no file
    fails(1, "fs", "ls", "relative/path", *m, contains="neither on a curvine mount")
    fails(1, "fs", "ls", "/", "--master", "127.0.0.1:1", contains="127.0.0.1:1")
    r = cli("fs", "mkdir", "-m", "999", "/x", *m)  # usage error: argparse, exit 2
    assert r.returncode == 2 and "octal" in r.stderr and "Traceback" not in r.stderr

    # --- mv and rm change what every client sees
    ok("fs", "mv", "/data/big3.bin", "/data/sub", *m)  # into the directory
    ok("fs", "mv", "/data/sub/small.txt", "/data/renamed.txt", *m)
    assert ok("fs", "ls", "/data/sub", *m).stdout.split() == ["big3.bin", "deeper/"]
    assert os.path.exists(os.path.join(mnt, "data", "renamed.txt"))
    ok("fs", "rm", "-r", "/data/sub", *m)
    ok("fs", "rm", "/data/big2.bin", *m)
    assert ok("fs", "ls", "/data", *m).stdout.split() == ["big.bin", "renamed.txt"]
    assert sorted(os.listdir(os.path.join(mnt, "data"))) == ["big.bin", "renamed.txt"]

    # --- report
    rep = json.loads(ok("report", "--json", *m).stdout)
    assert rep["master"] == c.master_addr
    assert [(w["id"], w["state"]) for w in rep["workers"]] == [(1, "live"), (2, "live")]
    for w in rep["workers"]:
        assert w["address"].startswith("127.0.0.1:") and w["host"] and w["capacity"] > 0
    assert rep["inodes"] == 4  # /, data, big.bin, renamed.txt
    # renamed.txt's 14 bytes are kept inline by the master (master.inline_max): no block
    assert rep["files_with_data"] == 2 and rep["blocks"] == 1 and rep["block_replicas"] == 2
    assert rep["inline_bytes"] == 14
    assert rep["under_replicated_blocks"] == 0
    assert rep["lookup_hits"] > 0 and rep["lookup_misses"] > 0  # the /nope lookups
    assert {"evicted_files", "expired_files", "orphans_removed"} <= set(rep["evictions"])
    assert rep["lease_sessions"] >= 1 and "granted" in rep["leases"]
    assert rep["journal"]["applied_seq"] > 0
    text = ok("report", *m).stdout
    assert "Workers: 2 live, 0 lost" in text and "Lookups:" in text and "Evictions:" in text

    # a worker that dies shows as lost, its blocks as under-replicated
    victim = next(p["address"] for p in c.status() if p["role"] == "worker" and p["index"] == 1)
    c.kill("worker", 1, sig=signal.SIGKILL)
    t0 = time.monotonic()

    def lost():
        r = json.loads(ok("report", "--json", *m).stdout)
        return r if r["workers_lost"] == 1 and r["under_replicated_blocks"] == 1 else None

    rep = wait_for(lost, timeout=30, interval=0.5, what="a worker reported lost")
    print(f"worker reported lost {time.monotonic() - t0:.1f}s after SIGKILL "
          f"(master.worker_lost_after 3s)")
    assert sorted((w["address"], w["state"]) for w in rep["workers"]) == sorted(
        (w["address"], "lost" if w["address"] == victim else "live") for w in rep["workers"])
    assert "Workers: 1 live, 1 lost" in ok("report", *m).stdout


def _frames(path: str, first_seq: int) -> list[tuple[int, int]]:
    """(offset, seq) of each record of a segment."""
    out, off = [], HEADER_SIZE
    for rec in SegmentReader(path, first_seq):
        out.append((off, rec.seq))
        off += FRAME_HEADER_SIZE + len(rec.payload)
    return out


@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master is restarted on purpose
def test_journal_dump_verify_checkpoint(make_cluster, tmp_path):
    c = make_cluster(workers=1, mounts=0)
    m = ("--master", c.master_addr, "--conf", os.path.join(c.base, "conf", "master-0.toml"))
    jdir = os.path.join(c.base, "master", "journal")
    meta = os.path.join(c.base, "master", "meta")
    ok("fs", "mkdir", "-p", "/a/b", *m)
    ok("fs", "put", "-", "/a/b/f", *m, stdin=b"x" * 1000)

    # --- dump: one line per record; --from / --limit; JSON lines
    lines = ok("journal", "dump", "--journal-dir", jdir, "--limit", "3").stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("1 mkdir ")
    assert [int(line.split()[0]) for line in lines] == [1, 2, 3]
    records = [json.loads(line) for line in
               ok("journal", "dump", "--journal-dir", jdir, "--json").stdout.splitlines()]
    by_type = {r["type"]: r for r in records}
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert by_type["create"]["record"]["name"] == "f"
    assert by_type["complete"]["record"]["size"] == 1000
    assert {r["record"]["name"] for r in records if r["type"] == "mkdir" and
            "name" in r["record"]} == {"a", "b"}
    tail = ok("journal", "dump", "--journal-dir", jdir, "--from", "3", "--limit", "2").stdout
    assert [int(line.split()[0]) for line in tail.splitlines()] == [3, 4]

    # --- verify the live journal, then damaged copies
    r = ok("journal", "verify", "--journal-dir", jdir)
    assert r.stdout.endswith(": OK\n") and f"seq 1..{len(records)}" in r.stdout
    (first, seg), = [(parse_segment_name(n), os.path.join(jdir, n)) for n in os.listdir(jdir)
                     if parse_segment_name(n) is not None]
    frames = _frames(seg, first)
    bad_copy = tmp_path / "damaged"
    shutil.copytree(jdir, bad_copy, ignore=shutil.ignore_patterns("LOCK"))
    bad_seg = os.path.join(bad_copy, os.path.basename(seg))
    off, _seq = frames[1]
    with open(bad_seg, "r+b") as f:  # flip a payload byte of the second record
        f.seek(off + FRAME_HEADER_SIZE + 2)
        b = f.read(1)
        f.seek(off + FRAME_HEADER_SIZE + 2)
        f.write(bytes([b[0] ^ 0xFF]))
    line = fails(4, "journal", "verify", "--journal-dir", str(bad_copy))
    assert f"segment {bad_seg} at byte offset {off}: checksum mismatch" in line, line
    fails(4, "journal", "dump", "--journal-dir", str(bad_copy), contains=f"byte offset {off}")
    # an incomplete last record is what a crash mid-append leaves: reported, not damage
    torn_copy = tmp_path / "torn"
    shutil.copytree(jdir, torn_copy, ignore=shutil.ignore_patterns("LOCK"))
    torn_seg = os.path.join(torn_copy, os.path.basename(seg))
    os.truncate(torn_seg, os.path.getsize(torn_seg) - 3)
    r = ok("journal", "verify", "--journal-dir", str(torn_copy))
    assert "OK" in r.stdout and f"byte offset {frames[-1][0]}" in r.stdout
    fails(3, "journal", "verify", "--journal-dir", str(tmp_path / "none"))

    # --- checkpoint: by the running master, then offline on a stopped one
    r = ok("journal", "checkpoint", *m)
    got = re.fullmatch(r"checkpoint at seq (\d+): (\S+) \(\d+ journal segments retired\)\n",
                       r.stdout)
    assert got, r.stdout
    seq, path = int(got.group(1)), got.group(2)
    assert seq >= len(records) and os.path.isdir(path)
    assert os.path.dirname(path) == os.path.join(meta, "checkpoints")
    assert os.path.exists(os.path.join(path, "data.mdb"))
    assert json.loads(ok("report", "--json", *m).stdout)["journal"]["checkpoint_seq"] == seq
    fails(1, "journal", "checkpoint", "--offline", "--meta-dir", meta, "--journal-dir", jdir,
          contains="in use")  # the master holds the journal
    ok("fs", "mkdir", "/after", *m)  # one more record than the first checkpoint
    c.kill("master", sig=signal.SIGTERM)
    r = ok("journal", "checkpoint", "--offline", "--meta-dir", meta, "--journal-dir", jdir)
    offline_seq = int(re.match(r"checkpoint at seq (\d+): ", r.stdout).group(1))
    assert offline_seq > seq
    assert os.path.isdir(os.path.join(meta, "checkpoints", f"ckpt-{offline_seq:020d}"))
    c.start("master")
    assert ok("fs", "get", "/a/b/f", "-", *m, binary=True).stdout == b"x" * 1000
    assert ok("fs", "ls", "/", *m).stdout.split() == ["a/", "after/"]
    ok("journal", "verify", "--journal-dir", jdir)


EXIT_HANG = """
import atexit, sys, threading, time
from curvine.cli import main as cli

lock = threading.Lock()


def hold():  # a daemon thread that holds a lock when the process exits
    lock.acquire()
    time.sleep(60)


threading.Thread(target=hold, daemon=True).start()
time.sleep(0.2)
# exit-time work that waits for it, as a gRPC stream finalized at exit waits for its
# call's lock (or concurrent.futures' atexit join waits for a stuck pool thread)
atexit.register(lock.acquire)
cli.main = lambda argv=None: 3
cli.run() if sys.argv[1] == "run" else sys.exit(cli.main())
"""


def test_the_cli_exits_without_finalization():
    """`curvine` (cli.main.run) ends the process once main returns, with main's exit
    code and its output flushed: exit-time work that waits for a lock a stopped daemon
    thread holds cannot keep it alive (how `curvine fs get` once printed the file and
    never exited: a gRPC stream finalized at exit).  The same script ending through
    sys.exit hangs, which shows the test can fail."""
    r = subprocess.run([sys.executable, "-c", EXIT_HANG, "run"], timeout=30,
                       capture_output=True)
    assert r.returncode == 3, r.stderr
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", EXIT_HANG, "sys.exit"], timeout=3,
                       capture_output=True)
    import tomllib
    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["curvine"] == "curvine.cli.main:run"  # the installed command
