"""The master is down: how long mounts wait for it, and what they answer after that.

A mount stalls each metadata operation while the master is unreachable, for up to
``cluster.master_wait``; if the master is back by then, the operation succeeds.
Beyond the wait it fails with EIO (never a hang, never ENOENT for a name that may
exist), the mount stays mounted, and the same operations work again as soon as the
master is back.  A file open for writing across the outage is published by its close
or its close fails: readers see the old version or the new one, never part of it.

Every file-system call here runs in a child process with a time bound, so a call that
hangs fails the test instead of hanging it.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from curvine.devtools.local import is_mounted
from fs_helpers import MIB, log_text, read_all, sha256, wait_until

WAIT = 3.0  # cluster.master_wait of the short-wait clusters
LONG_WAIT = 30.0  # ... of the cluster whose master comes back within the wait
RPC_TIMEOUT = 10.0
# A bounded call may take the wait plus one RPC deadline (a call that was in flight
# when the master went away) plus start-up noise on a busy machine.
ATTR_TIMEOUT = 1.0  # fuse.attr_timeout (the default)
BOUND = WAIT + RPC_TIMEOUT + 15.0

# One file-system call in a child process; prints {"errno": 0 | n, "elapsed": s}.
_OP = r"""
import json, os, sys, time
op, path, arg = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.monotonic()
try:
    if op == "stat":
        os.stat(path)
    elif op == "read":
        with open(path, "rb") as f:
            n = len(f.read())
        if arg and n != int(arg):
            raise SystemExit(f"read {n} bytes, expected {arg}")
    elif op == "create":
        with open(path, "wb") as f:
            f.write(arg.encode())
    elif op == "readdir":
        names = os.listdir(path)
        if arg and arg not in names:
            raise SystemExit(f"{arg} not listed")
    elif op == "mkdir":
        os.mkdir(path)
    elif op == "rename":
        os.rename(path, arg)
    elif op == "unlink":
        os.unlink(path)
    else:
        raise SystemExit(f"unknown op {op}")
    res = {"errno": 0}
except OSError as e:
    res = {"errno": e.errno, "error": str(e)}
res["elapsed"] = time.monotonic() - t0
print(json.dumps(res), flush=True)
"""

# A writer in a child process: open (O_TRUNC), write the first half, say "half", wait
# for a line on stdin, write the rest, close; prints {"errno": ..., "close_s": ...}.
_WRITER = r"""
import json, os, sys, time
path, seed, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
import random
data = random.Random(seed).randbytes(size)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, data[:size // 2])
print("half", flush=True)
sys.stdin.readline()
res = {}
try:
    view = memoryview(data)[size // 2:]
    while view:
        view = view[os.write(fd, view):]
    res["errno"] = 0
except OSError as e:
    res["errno"], res["error"] = e.errno, "write: " + str(e)
t0 = time.monotonic()
try:
    os.close(fd)
except OSError as e:
    if not res["errno"]:
        res["errno"], res["error"] = e.errno, "close: " + str(e)
res["close_s"] = time.monotonic() - t0
print(json.dumps(res), flush=True)
"""


class _Op:
    """A file-system call running in a child process."""

    def __init__(self, op: str, path: str, arg: str = ""):
        self.what = f"{op} {os.path.basename(path) or path}"
        self.proc = subprocess.Popen([sys.executable, "-c", _OP, op, path, arg],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def result(self, deadline: float) -> dict:
        """{"errno", "elapsed"}; {"hung": True} if it did not return by ``deadline``."""
        try:
            out, err = self.proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return {"hung": True}
        if self.proc.returncode != 0:
            return {"failed": f"exit {self.proc.returncode}: {err.strip()[-500:]}"}
        return json.loads(out)


def _run_ops(ops: list[tuple], bound: float) -> dict[str, dict]:
    started = [_Op(*o) for o in ops]
    deadline = time.monotonic() + bound
    return {o.what: o.result(deadline) for o in started}


def _show(results: dict[str, dict]) -> str:
    def one(r):
        if "hung" in r:
            return "HUNG"
        if "failed" in r:
            return r["failed"]
        return f"{errno.errorcode.get(r['errno'], r['errno']) if r['errno'] else 'ok'} " \
               f"after {r['elapsed']:.1f}s"
    return ", ".join(f"{k}: {one(r)}" for k, r in results.items())


# A reader in a child process: open, read 1 MiB, say "half", wait for a line on stdin,
# read the rest; prints {"errno": ..., "sha256": ...}.
_READER = r"""
import hashlib, json, sys
path = sys.argv[1]
f = open(path, "rb")
h = hashlib.sha256(f.read(1 << 20))
print("half", flush=True)
sys.stdin.readline()
res = {"errno": 0}
try:
    while True:
        chunk = f.read(1 << 20)
        if not chunk:
            break
        h.update(chunk)
    f.close()
    res["sha256"] = h.hexdigest()
except OSError as e:
    res["errno"], res["error"] = e.errno, str(e)
print(json.dumps(res), flush=True)
"""


class _Child:
    """A file open in a child process (``script``: _WRITER or _READER), half done:
    ``finish()`` lets it do the rest and close, ``result()`` is its JSON line."""

    def __init__(self, script: str, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-c", script, *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self._line(30)
        assert line == "half", f"the child did not start: {line!r}"

    def _line(self, timeout: float) -> str:
        import selectors
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                self.proc.kill()
                self.proc.communicate()
                return "<no answer>"
        return self.proc.stdout.readline().strip()

    def finish(self) -> None:
        """Write the second half and close (does not wait)."""
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self, bound: float) -> dict:
        line = self._line(bound)
        if line == "<no answer>":
            return {"hung": True}
        self.proc.stdin.close()
        self.proc.wait(10)
        return json.loads(line)


class _Writer(_Child):
    """A file open for writing (O_TRUNC) in a child process, half written."""

    def __init__(self, path: str, seed: int, size: int):
        self.data = random.Random(seed).randbytes(size)
        super().__init__(_WRITER, path, str(seed), str(size))


def _conf(tmp_path, wait: float) -> str:
    p = tmp_path / f"wait-{wait:g}.toml"
    p.write_text(f'[cluster]\nmaster_wait = "{wait:g}s"\nrpc_timeout = "{RPC_TIMEOUT:g}s"\n')
    return str(p)


def _store(directory: str, n: int, seed: int) -> dict[str, bytes]:
    rnd = random.Random(seed)
    files = {}
    for i in range(n):
        data = rnd.randbytes(rnd.randrange(1000, 3 * MIB))
        name = f"s{seed}-{i}.data"
        with open(os.path.join(directory, name + ".tmp"), "wb") as f:
            f.write(data)
        os.rename(os.path.join(directory, name + ".tmp"), os.path.join(directory, name))
        files[name] = data
    return files


def _check(directory: str, files: dict[str, bytes], what: str) -> None:
    for name, data in files.items():
        got = read_all(os.path.join(directory, name))
        assert sha256(got) == sha256(data), \
            f"{what}: {name}: {len(got)} bytes, not the {len(data)} bytes stored"


_SESSION_OPEN = re.compile(r"lease session \w+ open")


def _log_count(c, i: int, what) -> int:
    """Lines of mount ``i``'s log that match ``what`` (a string or a compiled regex)."""
    text = log_text(c.log_path("fuse", i))
    if isinstance(what, str):
        return text.count(what)
    return len(what.findall(text))


def _fuse_alive(c, i: int) -> bool:
    return next(s["alive"] for s in c.status() if s["role"] == "fuse" and s["index"] == i)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
@pytest.mark.expect_log(r"curvine-fuse\[\d+\] WARNING curvine\.fuse_client\.operations: \w+\(\d+\): \w+: \S+ unavailable for \S+ \(UNAVAILABLE", r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master is down on purpose
def test_master_down_beyond_wait_is_eio(make_cluster, tmp_path, sig):
    """Master stopped for longer than cluster.master_wait (3 s): stat (of a file and
    of a missing name), open+read, create, readdir, mkdir, rename and unlink on a mount
    fail with EIO after about the wait, none hangs, the mounts stay mounted; a file
    open for writing across the outage fails at close or is published whole.  With
    the master started again, the same calls succeed and everything stored before
    reads back intact through both mounts."""
    c = make_cluster(workers=1, mounts=2, conf=_conf(tmp_path, WAIT))
    a, b = (os.path.join(m, "kv") for m in c.mounts)
    os.mkdir(a)
    files = _store(a, 6, 11)
    _check(b, files, "before the outage")
    victim = os.path.join(a, "victim.data")
    old = random.Random(5).randbytes(2 * MIB + 17)
    with open(victim, "wb") as f:
        f.write(old)
    writer = _Writer(victim, 6, 3 * MIB + 5)  # a new version, half written
    some = next(iter(files))

    sessions = [_log_count(c, i, _SESSION_OPEN) for i in range(len(c.mounts))]
    c.kill("master", sig=sig)
    t_down = time.monotonic()
    writer.finish()  # the rest is written and closed while the master is down
    # Directory attributes fetched before the outage may be answered for
    # fuse.attr_timeout (1 s) without asking the master: let them expire.
    time.sleep(ATTR_TIMEOUT + 0.2)
    calls = [("stat", os.path.join(a, some)), ("stat", os.path.join(a, "missing.data")),
             ("read", os.path.join(b, some)), ("create", os.path.join(a, "new.tmp"), "x"),
             ("readdir", a), ("readdir", c.mounts[1]), ("stat", c.mounts[0]),
             ("mkdir", os.path.join(b, "newdir")),
             ("rename", os.path.join(a, some), os.path.join(a, "moved.data")),
             ("unlink", os.path.join(b, list(files)[1]))]
    down = _run_ops(calls, BOUND)
    closed = writer.result(BOUND)
    print(f"master down ({signal.Signals(sig).name}), wait {WAIT:g}s: {_show(down)}")
    print(f"writer across the outage: {closed}")
    for i, m in enumerate(c.mounts):
        assert is_mounted(m) and _fuse_alive(c, i), f"mount {i} went away during the outage"
    wrong = {k: r for k, r in down.items() if r.get("errno") != errno.EIO}
    assert not wrong, f"expected EIO from every call while the master is down: {_show(wrong)}"
    assert "hung" not in closed, "close of a file written across the outage hung"
    assert closed["errno"] in (0, errno.EIO), f"writer across the outage: {closed}"
    down_for = time.monotonic() - t_down

    c.start("master")
    print(f"master was down {down_for:.1f}s")
    up = _run_ops([("stat", os.path.join(a, some)), ("read", os.path.join(b, some),
                                                     str(len(files[some]))),
                   ("create", os.path.join(a, "new.tmp"), "x"), ("readdir", a, some),
                   ("stat", c.mounts[0]), ("mkdir", os.path.join(b, "newdir")),
                   ("stat", os.path.join(a, "missing.data"))], BOUND)
    print(f"master back: {_show(up)}")
    want = {"stat missing.data": errno.ENOENT}
    wrong = {k: r for k, r in up.items() if r.get("errno") != want.get(k, 0)}
    assert not wrong, f"calls after the master came back: {_show(wrong)}"
    _check(b, files, "after the outage (mount 1)")
    _check(a, files, "after the outage (mount 0)")
    # the file written across the outage: the old version or the new one, whole
    got = read_all(os.path.join(b, "victim.data"))
    which = "new" if got == writer.data else "old" if got == old else None
    print(f"file written across the outage reads as the {which} version "
          f"({len(got)} bytes; close gave {errno.errorcode.get(closed['errno'], 'ok')})")
    assert which is not None, f"victim.data: {len(got)} bytes, neither the old version " \
                              f"({len(old)}) nor the new one ({len(writer.data)})"
    if closed["errno"] == 0:
        assert which == "new", "close succeeded but the old version is still there"
    # and new data goes in and reads back across mounts
    more = _store(b, 3, 12)
    _check(a, more, "stored after the outage")
    # each mount's lease session and Calls stream came back (leases need Linux >= 6.16)
    for i in range(len(c.mounts)):
        if sessions[i]:
            wait_until(lambda: _log_count(c, i, _SESSION_OPEN) > sessions[i], 20,
                       f"mount {i} to reopen its lease session")
        wait_until(lambda: _log_count(c, i, "calls stream working again"), 20,
                   f"mount {i}'s Calls stream to carry calls again")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master is down on purpose
def test_master_back_within_wait_calls_succeed(make_cluster, tmp_path, sig):
    """Master stopped; calls started while it is down (stat, open+read, create,
    readdir, mkdir, and the close of a file written across the outage) wait for it
    and succeed once it is back within cluster.master_wait."""
    c = make_cluster(workers=1, mounts=2, conf=_conf(tmp_path, LONG_WAIT))
    a, b = (os.path.join(m, "kv") for m in c.mounts)
    os.mkdir(a)
    files = _store(a, 4, 21)
    some = next(iter(files))
    writer = _Writer(os.path.join(a, "across.data"), 7, 5 * MIB + 3)
    big = random.Random(8).randbytes(24 * MIB)
    with open(os.path.join(a, "big.data"), "wb") as f:
        f.write(big)
    reader = _Child(_READER, os.path.join(b, "big.data"))  # 1 MiB read, 23 to go
    c.kill("master", sig=sig)
    writer.finish()
    reader.finish()
    calls = [_Op(*o) for o in [
        ("stat", os.path.join(b, some)), ("read", os.path.join(b, some), str(len(files[some]))),
        ("create", os.path.join(a, "during.data"), "written during the outage"),
        ("readdir", b, some), ("mkdir", os.path.join(b, "dir-during")),
        ("stat", os.path.join(a, "missing.data"))]]
    time.sleep(1.0)  # the calls are waiting for the master now
    t0 = time.monotonic()
    c.start("master")
    print(f"master restarted in {time.monotonic() - t0:.1f}s")
    deadline = time.monotonic() + LONG_WAIT + RPC_TIMEOUT
    results = {o.what: o.result(deadline) for o in calls}
    closed = writer.result(LONG_WAIT + RPC_TIMEOUT)
    read = reader.result(LONG_WAIT + RPC_TIMEOUT)
    print(f"calls during the outage: {_show(results)}; writer: {closed}; "
          f"reader: {read.get('error', 'ok')}")
    assert read.get("errno") == 0, f"a file open for reading across the outage: {read}"
    assert read["sha256"] == sha256(big), "a file read across the outage: other bytes"
    want = {"stat missing.data": errno.ENOENT}
    wrong = {k: r for k, r in results.items() if r.get("errno") != want.get(k, 0)}
    assert not wrong, f"calls made while the master was down: {_show(wrong)}"
    assert closed.get("errno") == 0, f"close of the file written across the outage: {closed}"
    assert read_all(os.path.join(b, "across.data")) == writer.data
    assert read_all(os.path.join(b, "during.data")) == b"written during the outage"
    assert os.path.isdir(os.path.join(a, "dir-during"))
    _check(b, files, "after the outage")


@pytest.mark.slow
def test_master_restarts_under_writers_long(make_cluster, tmp_path):
    """30 master restarts, SIGTERM and SIGKILL in turn, under four writers on two
    mounts (the default wait): no writer ever gets an error, both mounts stay up, and
    every chunk whose close and rename returned reads back through the other mount."""
    from fs_helpers import (acknowledged_problems, chunk_writer, join_procs, read_results,
                            spawn_ctx, start_procs)
    restarts = 30
    c = make_cluster(workers=2, mounts=2)
    dirs = [os.path.join(m, "kv") for m in c.mounts]
    os.mkdir(dirs[0])
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    stop = spawn_ctx().Event()
    results = [str(tmp_path / f"w{w}.txt") for w in range(4)]
    procs = start_procs(chunk_writer, [(w, dirs[w % 2], results[w], stop, seed + w)
                                       for w in range(4)])

    def stored() -> int:
        return sum(len(read_results(r)[0]) for r in results if os.path.exists(r))

    took = []
    try:
        wait_until(lambda: stored() >= 4, 60, "the writers' first chunks")
        for i in range(restarts):
            sig = (signal.SIGTERM, signal.SIGKILL)[i % 2]
            time.sleep(rnd.uniform(0.2, 2.0))
            before = stored()
            t0 = time.monotonic()
            c.kill("master", sig=sig)
            time.sleep(rnd.uniform(0.0, 1.0))
            c.start("master")
            wait_until(lambda: stored() >= before + 4, 90,
                       f"writers to make progress after restart {i + 1} "
                       f"({signal.Signals(sig).name})")
            took.append(time.monotonic() - t0)
    finally:
        stop.set()
        join_procs(procs, timeout=120)
    done, errors = [], []
    for w, r in enumerate(results):
        d, e = read_results(r)
        done.extend((w, *x) for x in d)
        errors.extend(f"writer {w}: {x}" for x in e)
    print(f"{len(done)} chunks stored across {restarts} restarts; stop -> 4 more chunks "
          f"stored: median {sorted(took)[len(took) // 2]:.1f}s, max {max(took):.1f}s; "
          f"writer errors {len(errors)}")
    for i, m in enumerate(c.mounts):
        assert is_mounted(m) and _fuse_alive(c, i), f"mount {i} went away"
    problems = [f"a writer got an error: {e}" for e in errors[:10]]
    problems += acknowledged_problems(done, dirs)
    assert not problems, "\n".join(problems[:30])
