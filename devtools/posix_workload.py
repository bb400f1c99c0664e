"""A multi-process random namespace and data workload on one directory tree.

``run_workload(root, procs, ops, seed)`` starts ``procs`` processes (spawned, not
forked) that each run ``ops`` random operations on one small shared tree under
``root``: three fixed directories and about 60 names, so the processes race on the
same names all the time.  The operations: create (O_CREAT|O_TRUNC + write + close),
a write at a random offset into an existing file (O_RDWR), append, read of the whole
file, truncate, rename (sometimes over an existing name, sometimes of a directory),
hard link, symlink, readlink, unlink, mkdir, rmdir, fsync, readdir (``os.scandir``),
stat and lstat.

Errors a race explains (ENOENT: another process removed the name first; EEXIST,
ENOTEMPTY, EISDIR, ENOTDIR, ELOOP: the name changed type; EINVAL: readlink of a
non-symlink or a directory moved into itself; EPERM from link() of a name that was a
directory before or after the call, or changed during it) are *expected* and counted
per errno name.  Anything else (EIO, ESTALE, ENOSYS, EOPNOTSUPP, EPERM of a link of a
name that stayed one file, an exception that is not an OSError, a process that dies, a
hang past ``timeout``) goes to *unexpected*, with the operation and path.  The sequence
of operations is a function of ``seed`` (process i uses ``Random(f"{seed}/{i}")``);
what each finds depends on the races.

``WorkloadResult.latency`` has the wall time of every operation by its name (count,
total, p50, p99, max in ms): which operations a file system is slow at.

``python -m curvine.devtools.posix_workload ROOT [--procs N --ops N --seed N
--timeout S]`` prints the result as JSON; exit status 0, or 1 when something
unexpected happened.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import multiprocessing
import multiprocessing.connection
import os
import random
import stat
import sys
import time
import traceback

# Fixed directories (made before the run, never removed: no operation names them).
FIXED_DIRS = ("", "d0", "d1", "d0/d2")
FILE_NAMES = tuple(f"f{i}" for i in range(10))  # per fixed directory
SUBDIR_NAMES = ("s0", "s1")  # per fixed directory: mkdir / rmdir / renamed around
INNER_NAMES = ("x0", "x1")  # inside each subdirectory (vanish with it)
MAX_FILE = 256 << 10  # writes and truncates stay below this size
MAX_IO = 64 << 10
CURRENT_LEN = 160  # bytes of "<op> <paths>" a process shows the parent
UNEXPECTED_KEEP = 200  # unexpected entries kept per process (the rest are counted)

# errno name -> the operations where a race explains it
EXPECTED = {
    "ENOENT": None,  # every operation: the name (or a parent) went away
    "EEXIST": {"link", "symlink", "mkdir", "rename", "rmdir"},
    "ENOTEMPTY": {"rmdir", "rename"},
    "EISDIR": {"create", "write", "append", "read", "truncate", "unlink", "rename", "fsync"},
    "ENOTDIR": None,  # a path component or a rename's target changed type
    "ELOOP": None,  # a symlink to itself (open and stat follow it)
    "EINVAL": {"readlink", "rename"},  # not a symlink; a directory into its own subtree
}


@dataclasses.dataclass
class WorkloadResult:
    seconds: float  # from the start signal until the last process finished (or was killed)
    ops_done: int
    expected_errors: dict[str, int]  # errno name -> count
    unexpected: list[str]  # "<op> <path>: <what>", plus timeouts and crashes
    procs: int = 0
    ops_per_proc: int = 0
    seed: int = 0
    timed_out: bool = False
    latency: dict[str, dict] = dataclasses.field(default_factory=dict)  # op -> figures (ms)
    ok_by_op: dict[str, int] = dataclasses.field(default_factory=dict)  # op -> successes

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- the tree

def tree_names() -> tuple[list[str], list[str]]:
    """(file-like names, directory-like names), relative to the root."""
    files, dirs = [], []
    for d in FIXED_DIRS:
        files += [os.path.join(d, n) for n in FILE_NAMES]
        for s in SUBDIR_NAMES:
            sub = os.path.join(d, s)
            dirs.append(sub)
            files += [os.path.join(sub, x) for x in INNER_NAMES]
    return files, dirs


def prepare(root: str, seed: int) -> None:
    """The fixed directories, and about half of the files (so the first operations
    find something)."""
    rng = random.Random(f"{seed}/setup")
    for d in FIXED_DIRS:
        os.makedirs(os.path.join(root, d), exist_ok=True)
    files, dirs = tree_names()
    for sub in dirs:
        if rng.random() < 0.5:
            os.makedirs(os.path.join(root, sub), exist_ok=True)
    for f in files:
        p = os.path.join(root, f)
        if rng.random() < 0.5 and os.path.isdir(os.path.dirname(p)):
            with open(p, "wb") as fh:
                fh.write(rng.randbytes(rng.randrange(0, 8192)))


# --------------------------------------------------------------------------- operations

class _Proc:
    """One process's operations; ``rng`` decides everything but what races decide."""

    def __init__(self, root: str, rng: random.Random, current=None):
        self.root = root
        self.current = current  # shared with the parent: what runs now (for a hang)
        self.op = ""
        self.rng = rng
        self.files, self.dirs = tree_names()
        self.names = self.files + self.dirs
        self.payload = os.urandom(MAX_IO + 4096)
        self.where = ""

    def _path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def _at(self, *rels: str) -> None:
        """Name the paths of the operation under way (for an unexpected error)."""
        self.where = " -> ".join(rels)
        if self.current is not None:
            self.current.value = f"{self.op} {self.where}".encode()[:CURRENT_LEN - 1]

    def file_name(self) -> str:
        """Mostly a file name; sometimes any name (it may be a directory or symlink)."""
        return self.rng.choice(self.files if self.rng.random() < 0.9 else self.names)

    def dir_name(self, anything: float = 0.2) -> str:
        """Mostly a subdirectory's name; with probability ``anything`` any name."""
        return self.rng.choice(self.dirs if self.rng.random() >= anything else self.names)

    def data(self, n: int) -> memoryview:
        start = self.rng.randrange(0, 4096)
        return memoryview(self.payload)[start:start + n]

    # each returns the paths it used (for messages); raises OSError
    def create(self) -> str:
        rel = self.file_name()
        self._at(rel)
        fd = os.open(self._path(rel), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        try:
            n = self.rng.randrange(0, MAX_IO)
            if n:
                os.write(fd, self.data(n))
        finally:
            os.close(fd)
        return rel

    def write(self) -> str:
        rel = self.file_name()
        self._at(rel)
        fd = os.open(self._path(rel), os.O_RDWR)
        try:
            off = self.rng.randrange(0, MAX_FILE - MAX_IO)
            os.pwrite(fd, self.data(self.rng.randrange(1, 16 << 10)), off)
        finally:
            os.close(fd)
        return rel

    def append(self) -> str:
        rel = self.file_name()
        self._at(rel)
        fd = os.open(self._path(rel), os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, self.data(self.rng.randrange(1, 8 << 10)))
        finally:
            os.close(fd)
        return rel

    def read(self) -> str:
        rel = self.file_name()
        self._at(rel)
        fd = os.open(self._path(rel), os.O_RDONLY)
        try:
            while os.read(fd, 1 << 20):
                pass
        finally:
            os.close(fd)
        return rel

    def truncate(self) -> str:
        rel = self.file_name()
        self._at(rel)
        os.truncate(self._path(rel), self.rng.randrange(0, MAX_FILE))
        return rel

    def rename(self) -> str:
        if self.rng.random() < 0.8:  # a file, mostly to a file's name
            src, dst = self.file_name(), self.file_name()
        else:  # a directory, mostly to a directory's name
            src, dst = self.dir_name(0.1), self.dir_name(0.1)
        self._at(src, dst)
        os.rename(self._path(src), self._path(dst))
        return f"{src} -> {dst}"

    def link(self) -> str:
        src, dst = self.file_name(), self.file_name()
        self._at(src, dst)
        before = self._identity(src)
        try:
            os.link(self._path(src), self._path(dst), follow_symlinks=False)
        except PermissionError:
            # link() of a directory is EPERM by POSIX. A race explains it when src was a
            # directory just before or just after the call, or was not the same
            # non-directory across it (another process changed the name meanwhile: it
            # may have been a directory when link() looked). Only a name that stayed the
            # same file throughout makes EPERM unexpected.
            after = self._identity(src)
            if before != after or before is None or before[1]:
                raise _Expected("EPERM") from None
            raise
        return f"{src} -> {dst}"

    def _identity(self, rel: str) -> tuple[int, bool] | None:
        """(inode, is a directory) of the name now, None if it is absent."""
        try:
            st = os.lstat(self._path(rel))
        except OSError:
            return None
        return st.st_ino, stat.S_ISDIR(st.st_mode)

    def symlink(self) -> str:
        rel = self.file_name()
        r = self.rng.random()
        # targets in the link's own directory only: nothing resolves outside the tree
        if r < 0.1:
            target = os.path.basename(rel)  # a loop: ELOOP when followed
        elif r < 0.2:
            target = "missing"
        else:
            target = self.rng.choice(FILE_NAMES + SUBDIR_NAMES + INNER_NAMES)
        self._at(f"{rel} (symlink to {target})")
        os.symlink(target, self._path(rel))
        return f"{rel} -> {target}"

    def readlink(self) -> str:
        rel = self.file_name()
        self._at(rel)
        os.readlink(self._path(rel))
        return rel

    def unlink(self) -> str:
        rel = self.file_name()
        self._at(rel)
        os.unlink(self._path(rel))
        return rel

    def mkdir(self) -> str:
        rel = self.dir_name(0.05)
        self._at(rel)
        os.mkdir(self._path(rel), 0o755)
        return rel

    def rmdir(self) -> str:
        rel = self.dir_name()
        self._at(rel)
        os.rmdir(self._path(rel))
        return rel

    def fsync(self) -> str:
        rel = self.file_name()
        self._at(rel)
        fd = os.open(self._path(rel), os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, self.data(self.rng.randrange(1, 4096)))
            os.fsync(fd)
        finally:
            os.close(fd)
        return rel

    def readdir(self) -> str:
        rel = self.rng.choice(FIXED_DIRS + tuple(self.dirs))
        self._at(rel or ".")
        with os.scandir(self._path(rel) if rel else self.root) as it:
            for e in it:
                e.name  # noqa: B018 - the listing itself is the operation
        return rel or "."

    def stat(self) -> str:
        rel = self.rng.choice(self.names)
        self._at(rel)
        os.stat(self._path(rel))
        return rel

    def lstat(self) -> str:
        rel = self.rng.choice(self.names)
        self._at(rel)
        os.lstat(self._path(rel))
        return rel


# operation -> weight (how often it is drawn)
OPS = {
    "create": 14, "write": 10, "append": 6, "read": 10, "truncate": 5, "rename": 8,
    "link": 4, "symlink": 3, "readlink": 3, "unlink": 6, "mkdir": 4, "rmdir": 4,
    "fsync": 3, "readdir": 5, "stat": 10, "lstat": 5,
}


class _Expected(Exception):
    """An error a race explains that is not an OSError's errno (EPERM of link(dir))."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def _is_expected(op: str, err: int) -> str | None:
    name = errno.errorcode.get(err, str(err))
    ops = EXPECTED.get(name, ())
    if ops is None or (ops and op in ops):
        return name
    return None


def _describe(e: OSError) -> str:
    name = errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__
    return f"{name} ({e.strerror or e})"


def _child(root: str, seed: int, index: int, ops: int, conn, progress, current) -> None:
    """One process: wait for the start signal, run, send the result."""
    rng = random.Random(f"{seed}/{index}")
    p = _Proc(root, rng, current)
    names = list(OPS)
    weights = [OPS[n] for n in names]
    plan = rng.choices(names, weights, k=ops)  # the sequence: a function of the seed
    expected: dict[str, int] = {}
    unexpected: list[str] = []
    dropped = 0
    ok: dict[str, int] = {}
    times: dict[str, list[float]] = {n: [] for n in names}
    conn.send("ready")
    if conn.recv() != "go":
        return
    for i, op in enumerate(plan):
        p.where, p.op = "", op
        current.value = op.encode()
        t0 = time.perf_counter()
        what = None
        try:
            getattr(p, op)()
            ok[op] = ok.get(op, 0) + 1
        except _Expected as e:
            expected[e.name] = expected.get(e.name, 0) + 1
        except OSError as e:
            name = _is_expected(op, e.errno) if e.errno else None
            if name is not None:
                expected[name] = expected.get(name, 0) + 1
            else:
                what = f"{op} {p.where}: {_describe(e)}"
        except Exception as e:  # noqa: BLE001 - reported, not raised
            what = (f"{op} {p.where}: {type(e).__name__}: {e} "
                    f"({traceback.format_exc(limit=2).splitlines()[-2].strip()})")
        times[op].append(time.perf_counter() - t0)
        if what is not None:
            if len(unexpected) < UNEXPECTED_KEEP:
                unexpected.append(f"proc {index} op {i}: {what}")
            else:
                dropped += 1
        progress.value = i + 1
    if dropped:
        unexpected.append(f"proc {index}: {dropped} more unexpected errors not listed")
    conn.send({"expected": expected, "unexpected": unexpected, "ok": ok, "times": times})



# --------------------------------------------------------------------------- driver

def _latency(samples: list[float]) -> dict:
    s = sorted(samples)
    if not s:
        return {"count": 0}

    def pct(q: float) -> float:
        return s[min(len(s) - 1, int(round((len(s) - 1) * q / 100)))] * 1000

    return {"count": len(s), "total_ms": round(sum(s) * 1000, 2),
            "mean_ms": round(sum(s) * 1000 / len(s), 3), "p50_ms": round(pct(50), 3),
            "p90_ms": round(pct(90), 3), "p99_ms": round(pct(99), 3),
            "max_ms": round(s[-1] * 1000, 3)}


def run_workload(root: str, procs: int = 4, ops: int = 2000, seed: int = 0,
                 timeout: float = 600.0) -> WorkloadResult:
    """Run the workload on ``root`` (made if missing; the tree is left there)."""
    if procs < 1 or ops < 0:
        raise ValueError("procs must be >= 1 and ops >= 0")
    os.makedirs(root, exist_ok=True)
    root = os.path.abspath(root)
    prepare(root, seed)
    ctx = multiprocessing.get_context("spawn")
    children, conns, progress, current = [], [], [], []
    unexpected: list[str] = []
    expected: dict[str, int] = {}
    ok: dict[str, int] = {}
    times: dict[str, list[float]] = {}
    timed_out = False
    try:
        for i in range(procs):
            parent, child = ctx.Pipe()
            prog = ctx.Value("q", 0, lock=False)
            cur = ctx.Array("c", CURRENT_LEN, lock=False)
            p = ctx.Process(target=_child, args=(root, seed, i, ops, child, prog, cur),
                            daemon=True, name=f"posix-workload-{i}")
            p.start()
            child.close()
            children.append(p)
            conns.append(parent)
            progress.append(prog)
            current.append(cur)
        # spawning is slow (a fresh interpreter each): start the clock once all are up
        start_deadline = time.monotonic() + 120
        for i, c in enumerate(conns):
            if not c.poll(max(0.0, start_deadline - time.monotonic())):
                raise RuntimeError(f"workload process {i} did not start")
            c.recv()
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout
        for c in conns:
            c.send("go")
        pending = dict(enumerate(conns))
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for c in multiprocessing.connection.wait(list(pending.values()), timeout=left):
                i = next(k for k, v in pending.items() if v is c)
                del pending[i]
                try:
                    res = c.recv()
                except (EOFError, OSError):
                    children[i].join(5)
                    unexpected.append(f"proc {i}: died (exit status {children[i].exitcode}) "
                                      f"after {progress[i].value} ops, in "
                                      f"{current[i].value.decode(errors='replace')}")
                    continue
                for k, v in res["expected"].items():
                    expected[k] = expected.get(k, 0) + v
                for k, v in res["ok"].items():
                    ok[k] = ok.get(k, 0) + v
                for k, v in res["times"].items():
                    times.setdefault(k, []).extend(v)
                unexpected.extend(res["unexpected"])
        seconds = time.perf_counter() - t0
        for i in sorted(pending):
            unexpected.append(f"proc {i}: timeout: killed after {timeout:g} s, "
                              f"{progress[i].value} of {ops} ops done, running "
                              f"{current[i].value.decode(errors='replace')}")
    finally:
        for p in children:
            if p.is_alive():
                p.join(0.5 if not timed_out else 0)
            if p.is_alive():
                p.kill()
                p.join(10)
        for c in conns:
            c.close()
    return WorkloadResult(
        seconds=round(seconds, 3), ops_done=sum(x.value for x in progress),
        expected_errors=dict(sorted(expected.items())), unexpected=unexpected,
        procs=procs, ops_per_proc=ops, seed=seed, timed_out=timed_out,
        latency={k: _latency(v) for k, v in sorted(times.items())},
        ok_by_op=dict(sorted(ok.items())))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m curvine.devtools.posix_workload",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="directory to run in (made if missing; the tree is left)")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--ops", type=int, default=2000, help="operations per process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS")
    args = ap.parse_args(argv)
    res = run_workload(args.root, args.procs, args.ops, args.seed, args.timeout)
    json.dump(res.to_json(), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 1 if res.unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
