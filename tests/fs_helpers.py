"""Helpers for the tests that drive real FUSE mounts of a local cluster.

Data patterns that tell exactly which writer (and which round) produced a file, so a
reader can prove a file is one writer's complete bytes and never a mix; worker
processes (started with ``spawn``, so no gRPC or pytest state is forked) for the
concurrency and crash tests; errno comparison against a plain local directory.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import time
import traceback

MIB = 1 << 20

# --------------------------------------------------------------------------- patterns

_HEADER = "CVTEST w=%03d r=%05d n=%012d\n"
HEADER_LEN = len(_HEADER % (0, 0, 0))
_HEADER_RE = re.compile(rb"CVTEST w=(\d{3}) r=(\d{5}) n=(\d{12})\n")
_bases: dict[tuple[int, int], bytes] = {}


def _base(writer: int, size: int) -> bytes:
    key = (writer, size)
    b = _bases.get(key)
    if b is None:
        b = random.Random(0xC0FFEE + writer).randbytes(size)
        _bases[key] = b
    return b


def pattern(writer: int, rnd: int, size: int) -> bytes:
    """``size`` bytes unique to (writer, round): a header naming both, then the
    writer's random base rotated by a round-dependent amount (cheap to make, and
    differs from every other (writer, round) almost everywhere)."""
    assert size > HEADER_LEN
    header = (_HEADER % (writer, rnd, size)).encode()
    body = size - HEADER_LEN
    base = _base(writer, body)
    k = (rnd * 1_000_003 + 7) % body
    return header + base[k:] + base[:k]


def identify(data: bytes | memoryview, expect_size: int | None = None) -> tuple[int, int]:
    """(writer, round) if ``data`` is exactly one writer's complete pattern; else
    AssertionError saying what is wrong (short, mixed, foreign bytes)."""
    data = bytes(data)
    m = _HEADER_RE.match(data[:HEADER_LEN])
    if not m:
        raise AssertionError(f"no pattern header: first bytes {data[:48]!r} (len {len(data)})")
    w, r, n = (int(g) for g in m.groups())
    if expect_size is not None and n != expect_size:
        raise AssertionError(f"header says {n} bytes, expected {expect_size}")
    want = pattern(w, r, n)
    if len(data) != n:
        k = min(len(data), n)
        diff = first_difference(data[:k], want[:k])
        raise AssertionError(
            f"writer {w} round {r}: file has {len(data)} bytes, header says {n} "
            f"({'short' if len(data) < n else 'long'}; the bytes it has "
            + ("are that writer's" if diff < 0 else f"differ from that writer's at offset {diff}")
            + ")")
    if data != want:
        first = first_difference(data, want)
        raise AssertionError(f"writer {w} round {r}: bytes differ from that writer's pattern "
                             f"from offset {first} on (a mix or foreign data)")
    return w, r


def first_difference(a: bytes, b: bytes) -> int:
    """Offset of the first byte where ``a`` and ``b`` differ (-1 if equal)."""
    step = 64 * 1024
    for off in range(0, max(len(a), len(b)), step):
        x, y = a[off:off + step], b[off:off + step]
        if x != y:
            return off + next((i for i in range(min(len(x), len(y))) if x[i] != y[i]),
                              min(len(x), len(y)))
    return -1


def sha256(data) -> str:
    return hashlib.sha256(data).hexdigest()


def read_all(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def file_sha256(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(4 * MIB)
            if not chunk:
                return h.hexdigest(), n
            h.update(chunk)
            n += len(chunk)


# --------------------------------------------------------------------------- processes

def spawn_ctx():
    # spawn: children start clean (no forked gRPC channels, threads or pytest state)
    return multiprocessing.get_context("spawn")


def start_procs(target, arg_lists: list[tuple]) -> list:
    """Start ``target(*args)`` in a process per ``args`` (a target that calls the
    cluster takes the cluster's Security among them)."""
    ctx = spawn_ctx()
    procs = [ctx.Process(target=target, args=args, daemon=True) for args in arg_lists]
    for p in procs:
        p.start()
    return procs


def join_procs(procs: list, timeout: float) -> None:
    """Wait for ``procs``; kill and fail if any is still running after ``timeout``."""
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    stuck = [p for p in procs if p.is_alive()]
    for p in stuck:
        p.kill()
        p.join(5)
    if stuck:
        raise AssertionError(f"{len(stuck)} of {len(procs)} test processes still running after "
                             f"{timeout:g}s (a hung file-system call?)")
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise AssertionError(f"test processes exited with codes {bad}")


def write_json(path: str, obj) -> None:
    tmp = path + ".part"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def describe_exc(e: BaseException) -> str:
    if isinstance(e, OSError) and e.errno is not None:
        return f"{type(e).__name__}[{errno.errorcode.get(e.errno, e.errno)}]: {e}"
    return "".join(traceback.format_exception_only(type(e), e)).strip()


# --------------------------------------------------------------------------- errno

def errno_of(fn, *args) -> int | None:
    """The errno ``fn(*args)`` fails with, or None if it succeeds."""
    try:
        r = fn(*args)
        if isinstance(r, int) and fn is os.open:
            os.close(r)
    except OSError as e:
        return e.errno
    return None


def errname(n: int | None) -> str:
    return "success" if n is None else errno.errorcode.get(n, str(n))


# --------------------------------------------------------------------------- daemons

def log_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def wait_until(cond, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_master_once(base: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run ``curvine-master`` on the cluster's meta and journal dirs in the foreground
    (for a master that is expected to refuse to start); kills it if it does start."""
    exe = os.path.join(os.path.dirname(sys.executable), "curvine-master")
    argv = [exe, "--conf", os.path.join(base, "conf", "master-0.toml"), "--host", "127.0.0.1",
            "--port", str(free_port()), "--meta-dir", os.path.join(base, "master", "meta"),
            "--journal-dir", os.path.join(base, "master", "journal")]
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return subprocess.CompletedProcess(argv, None, out.decode(errors="replace"),
                                           err.decode(errors="replace"))
    return subprocess.CompletedProcess(argv, p.returncode, out.decode(errors="replace"),
                                       err.decode(errors="replace"))


# --------------------------------------------------------------------------- many files

def create_via_fuse(directory: str, names: list[str], out: str) -> None:
    """Create empty files through a mount: open(O_CREAT|O_WRONLY) + close each."""
    t0 = time.monotonic()
    errors = []
    flags = os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC
    for n in names:
        try:
            os.close(os.open(os.path.join(directory, n), flags, 0o644))
        except OSError as e:
            errors.append(f"{n}: {describe_exc(e)}")
            if len(errors) > 20:
                break
    write_json(out, {"n": len(names), "seconds": time.monotonic() - t0, "errors": errors})


def create_via_client(master_addr: str, security, dir_name: str, names: list[str],
                      threads: int, out: str) -> None:
    """Create empty, complete files with the client library (Create + CompleteFile),
    ``threads`` calls in flight."""
    from concurrent.futures import ThreadPoolExecutor

    from curvine.client.master.master_client import MasterClient
    from curvine.common.ids import ROOT_INO

    t0 = time.monotonic()
    mc = MasterClient(master_addr, security=security)
    parent = mc.lookup(ROOT_INO, dir_name.encode()).ino
    errors = []

    def make(chunk):
        for n in chunk:
            try:
                node = mc.create(parent, n.encode(), 0o644, os.getuid(), os.getgid(),
                                 exclusive=True)
                mc.complete_file(node.ino, [], 0)
            except Exception as e:  # noqa: BLE001 - reported to the test
                errors.append(f"{n}: {describe_exc(e)}")

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(make, [names[i::threads] for i in range(threads)]))
    mc.close()
    write_json(out, {"n": len(names), "seconds": time.monotonic() - t0, "errors": errors[:20]})


def chunk_writer(w: int, directory: str, results: str, stop, seed: int,
                 min_size: int = MIB, max_size: int = 4 * MIB) -> None:
    """Store chunk files the LMCache way (tmp, one write, close, rename) until
    ``stop`` is set; after each rename returns, append "name sha256 size" to
    ``results``.  Errors are appended as "ERR ..." lines and writing goes on."""
    rnd = random.Random(seed)
    n = 0
    with open(results, "a", buffering=1) as out:
        while not stop.is_set():
            n += 1
            name = f"w{w}-{n:05d}"
            data = rnd.randbytes(rnd.randrange(min_size, max_size + 1))
            tmp = os.path.join(directory, name + ".tmp")
            t0 = time.monotonic()
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                os.rename(tmp, os.path.join(directory, name + ".data"))
            except OSError as e:
                out.write(f"ERR {name} after {time.monotonic() - t0:.1f}s: {describe_exc(e)}\n")
                continue
            out.write(f"{name}.data {sha256(data)} {len(data)} {time.monotonic() - t0:.2f}\n")


def read_results(path: str) -> tuple[list[tuple[str, str, int, float]], list[str]]:
    """(name, sha256, size, seconds) of every stored chunk, and the error lines."""
    done, errors = [], []
    with open(path) as f:
        for line in f:
            if line.startswith("ERR "):
                errors.append(line.strip())
            elif line.endswith("\n"):
                name, digest, size, secs = line.split()
                done.append((name, digest, int(size), float(secs)))
    return done, errors


# --------------------------------------------------------------------------- journal

def acknowledged_problems(done: list[tuple], dirs: list[str]) -> list[str]:
    """What went wrong with chunks that chunk_writer processes reported as stored:
    ``done`` holds (writer, name, digest, size, seconds); each chunk is read through the
    mount the writer did not use (``dirs[(writer + 1) % 2]``) and must have its bytes,
    and every name must be listed in ``dirs[0]``."""
    problems = []
    for w, name, digest, size, _ in done:
        p = os.path.join(dirs[(w + 1) % 2], name)
        try:
            got = file_sha256(p)
        except OSError as e:
            problems.append(f"{p}: acknowledged, now {e}")
            continue
        if got != (digest, size):
            problems.append(f"{p}: acknowledged {size} bytes {digest[:12]}, now reads "
                            f"{got[1]} bytes {got[0][:12]}")
    missing = {x[1] for x in done} - set(os.listdir(dirs[0]))
    if missing:
        problems.append(f"{len(missing)} acknowledged chunks missing from the listing: "
                        f"{sorted(missing)[:5]}")
    return problems


def journal_frames(journal_dir: str) -> list[tuple[str, list[tuple[int, int, int, int]]]]:
    """Per segment file, in order: its path and (start, end, seq, type) of every
    frame, read with the journal's own reader (which must find no damage)."""
    from curvine.journal.segment import SegmentReader, parse_segment_name

    segs = sorted((parse_segment_name(n), os.path.join(journal_dir, n))
                  for n in os.listdir(journal_dir) if parse_segment_name(n) is not None)
    out = []
    for first, path in segs:
        reader = SegmentReader(path, first)
        frames = []
        for rec in reader:
            # while a record is yielded, reader.end is still the end of the previous one
            frames.append([reader.end, None, rec.seq, rec.type])
        for i, f in enumerate(frames):
            f[1] = frames[i + 1][0] if i + 1 < len(frames) else reader.end
        assert reader.bad is None, f"{path}: {reader.bad}"
        assert reader.end == os.path.getsize(path), f"{path}: bytes after the last frame"
        out.append((path, [tuple(f) for f in frames]))
    return out
