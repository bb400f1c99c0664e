"""stress-ng's file-system stressors on a mount, with --verify; and a multi-process
namespace workload (curvine.devtools.posix_workload) on a mount.

Every stressor runs first on a plain local directory (it must pass there, so a
failure on the mount is ours), then on mount 0 of a real cluster:
``stress-ng --<name> 1 --temp-path DIR --timeout 2s --verify --metrics-brief``
(plus sizes or an op bound where a stressor would otherwise write GBs or run long),
bounded by a subprocess timeout.  Passing means exit status 0 and no ``fail:`` or
``error:`` line (stress-ng reports some failures, e.g. a failed cleanup rmdir, with
status 0).  A stressor that *skips* fails the test, unless KERNEL_REFUSES says the
kernel refuses that feature for every FUSE file system; each such entry is proven
by the same stressor skipping the same way on a trivial pyfuse3 passthrough mount
(this file, run as ``python tests/test_fs_stress.py passthrough SRC MNT``).

The FUSE daemons get RLIMIT_DATA = 4 GiB: a daemon that allocates in proportion to
an offset (fsize's fallocate at 8 TiB) then fails on its own instead of making the
kernel's OOM killer pick processes on a shared machine.  A daemon that died during
a test fails that test, and the next test starts it again.

Some listed stressors do not exercise the temp path at all, by stress-ng's design:
dup (dup(2) of /dev/zero), io (sync(2)), open (opens /dev/zero and the like) and
getdent (walks /proc, /dev, /tmp, /sys, /run: it reaches the mount only because the
cluster lives under /tmp); fstat is pointed at a directory of the mount
(--fstat-dir) and mmap at a file on it (--mmap-file).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import resource
import signal
import stat
import shutil
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ != "__main__":
    from cluster_util import fuse_available, tracebacks_in_logs
    from curvine.devtools.local import LocalCluster, fusermount_unmount, is_mounted, log_tail
    from fs_helpers import MIB

STRESSORS = [
    "access", "chdir", "chmod", "chown", "copy-file", "dentry", "dir", "dirdeep", "dirmany",
    "dup", "fallocate", "fcntl", "fiemap", "filename", "flock", "fpunch", "fsize", "fstat",
    "getdent", "hdd", "inotify", "io", "iomix", "lease", "link", "locka", "lockf", "lockofd",
    "mknod", "open", "rename", "seek", "symlink", "sync-file", "touch", "utime", "xattr",
    "readahead", "mmap",
]

# Per stressor: options that keep it small (defaults write 256 MB..1 GB) or bounded.
EXTRA = {
    "copy-file": ["--copy-file-bytes", "128m"],  # stress-ng's minimum
    "fallocate": ["--fallocate-bytes", "16m"],
    "fiemap": ["--fiemap-bytes", "16m"],
    "fsize": ["--fsize-ops", "200"],
    "getdent": ["--getdent-ops", "100"],  # walks /proc, /sys ...: 40 s unbounded
    "hdd": ["--hdd-bytes", "16m"],
    "iomix": ["--iomix-bytes", "16m"],
    "mmap": ["--mmap-file", "--mmap-bytes", "16m"],
    "readahead": ["--readahead-bytes", "16m"],
    "seek": ["--seek-size", "16m"],
    "sync-file": ["--sync-file-bytes", "16m"],
}

# stressor -> (the text stress-ng prints when it skips, why every FUSE mount skips it)
KERNEL_REFUSES = {
    "fiemap": (
        "FS_IOC_FIEMAP not supported on the file system",
        "FUSE inodes have no ->fiemap (fs/fuse/dir.c fuse_common_inode_operations), so "
        "ioctl_fiemap() in fs/ioctl.c returns EOPNOTSUPP before any request reaches the "
        "daemon; the same skip happens on a trivial pyfuse3 passthrough"),
}

BLOCK = 1 << 20
RUN_SECONDS = 2            # --timeout of a run on the mount
LOCAL_RUN_SECONDS = 1      # --timeout of the local run (a baseline, not the test)
HARD_TIMEOUT = 90.0        # subprocess bound of one run (link and symlink take ~27 s today)
DAEMON_DATA_LIMIT = 4 << 30
WORKLOAD_PROCS, WORKLOAD_OPS = 4, 2000
WORKLOAD_TIMEOUT = 240.0

# stress-ng exit statuses (stress-ng.h)
EXIT_STATUS = {0: "success", 1: "error (bad option, or could not run)",
               2: "one or more stressors failed", 3: "no resource (ENOMEM, ENOSPC, ...)",
               4: "not implemented on this system", 5: "killed by a signal",
               6: "stressor exited by exit()", 7: "metrics untrustworthy"}

_STRESS_NG = shutil.which("stress-ng")


# --------------------------------------------------------------------------- running

class Run:
    def __init__(self, name, argv, rc, out, seconds, timed_out):
        self.name, self.argv, self.rc, self.out = name, argv, rc, out
        self.seconds, self.timed_out = seconds, timed_out
        lines = out.splitlines()
        self.fails = [ln for ln in lines if re.search(r"\b(fail|error):", ln)]
        self.skips = [ln for ln in lines if re.search(r"skip", ln, re.I)
                      and not re.search(r"skipped:\s*0\b", ln)]

    @property
    def passed(self) -> bool:
        return self.rc == 0 and not self.fails and not self.skips and not self.timed_out

    def describe(self) -> str:
        head = (f"stress-ng {self.name}: "
                + (f"TIMED OUT after {self.seconds:.0f}s" if self.timed_out else
                   f"exit {self.rc} ({EXIT_STATUS.get(self.rc, '?')}) in {self.seconds:.1f}s"))
        if self.timed_out:  # all of it, with the diagnosis of on_hang
            body = self.out.splitlines()
        else:
            body = (self.fails + self.skips
                    or [ln for ln in self.out.splitlines() if "metrc:" not in ln][-12:])[:25]
        return (head + "\n  command: " + " ".join(self.argv) + "\n"
                + "\n".join("  " + ln for ln in body))


def run_stressor(name: str, temp: str, seconds: int = RUN_SECONDS,
                 timeout: float = HARD_TIMEOUT, on_hang=None) -> Run:
    """``on_hang(pid)``: called with stress-ng's process group still stuck, before it
    is killed; what it returns is added to the run's output."""
    os.makedirs(temp, exist_ok=True)
    extra = list(EXTRA.get(name, []))
    if name == "fstat":
        d = os.path.join(temp, "fstat-dir")
        os.makedirs(d, exist_ok=True)
        for i in range(8):
            with open(os.path.join(d, f"f{i}"), "wb") as f:
                f.write(b"x" * (i * 1000))
        extra += ["--fstat-dir", d]
    argv = [_STRESS_NG, f"--{name}", "1", "--temp-path", temp, "--timeout", f"{seconds}s",
            "--verify", "--metrics-brief", *extra]
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True, cwd=temp)
    timed_out = False
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        diagnosis = on_hang(p.pid) if on_hang is not None else ""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        try:
            out, _ = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # stuck in the kernel on a dead FUSE request
            _abort_fuse_under(temp)
            out, _ = p.communicate(timeout=30)
        out += diagnosis.encode()
    return Run(name, argv, p.returncode, out.decode(errors="replace"),
               time.monotonic() - t0, timed_out)


def _fuse_mounts() -> list[tuple[str, str]]:
    """(mount point, "major:minor") of every FUSE mount, read from
    /proc/self/mountinfo (never touches a file system, which may hang)."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[fields.index("-") + 1].startswith("fuse"):
                mounts.append((fields[4].replace("\\040", " "), fields[2]))
    return mounts


def _mount_of(path: str) -> tuple[str, str] | None:
    """(mount point, "major:minor") of the FUSE mount holding ``path``."""
    path = os.path.abspath(path)
    holding = [m for m in _fuse_mounts() if path == m[0] or path.startswith(m[0] + "/")]
    return max(holding, key=lambda m: len(m[0]), default=None)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        return f"({e.strerror})"


def _diagnose_hang(c, pgid: int) -> str:
    """What a stuck stress-ng waits for: each process's kernel stack, the FUSE
    connections with requests waiting, and the stacks the daemons log on SIGUSR1."""
    lines = ["", "== diagnosis of the hang"]
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            if os.getpgid(pid) != pgid:
                continue
            status = dict(ln.split(":", 1) for ln in _read(f"/proc/{pid}/status").splitlines()
                          if ":" in ln)
            lines.append(f"process {pid} state {status.get('State', '?').strip()} "
                         f"wchan {_read(f'/proc/{pid}/wchan')}; kernel stack:")
            lines += ["    " + ln for ln in _read(f"/proc/{pid}/stack").splitlines()]
    minors = {dev.split(":")[1]: point for point, dev in _fuse_mounts()}
    for conn in sorted(os.listdir("/sys/fs/fuse/connections")):
        waiting = _read(f"/sys/fs/fuse/connections/{conn}/waiting")
        if waiting not in ("0", ""):
            lines.append(f"FUSE connection {conn} ({minors.get(conn, 'not mounted here')}): "
                         f"{waiting} requests waiting")
    daemons = [p for p in c.status() if p["alive"] and p["role"] in ("fuse", "master")]
    for p in daemons:
        with contextlib.suppress(OSError):
            os.kill(p["pid"], signal.SIGUSR1)
    time.sleep(2)
    for p in daemons:
        lines.append(f"== the last lines of {p['role']} {p['index']}'s log")
        lines.append(log_tail(p["log"], 150 if p["role"] == "fuse" else 60))
    return "\n".join(lines)


def _abort_fuse_under(path: str) -> None:
    """Abort the FUSE connection of the mount holding ``path`` (every waiting request
    fails with ENOTCONN), the only way to free a process stuck in a FUSE request."""
    m = _mount_of(path)
    if m is None:
        return
    minor = m[1].split(":")[1]
    with contextlib.suppress(OSError):
        with open(f"/sys/fs/fuse/connections/{minor}/abort", "w") as f:
            f.write("1")


# --------------------------------------------------------------------------- cluster

def _limit_daemons(c) -> None:
    for p in c.status():
        if p["role"] == "fuse" and p["alive"]:
            with contextlib.suppress(OSError):
                resource.prlimit(p["pid"], resource.RLIMIT_DATA,
                                 (DAEMON_DATA_LIMIT, DAEMON_DATA_LIMIT))


def _fuse0(c) -> dict:
    return next(p for p in c.status() if p["role"] == "fuse" and p["index"] == 0)


def _answers(path: str, timeout: float = 10.0) -> bool:
    """True if listing ``path`` works, from a child process (a hung mount hangs it)."""
    try:
        r = subprocess.run([sys.executable, "-c", f"import os; os.listdir({path!r})"],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                           check=False)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


@pytest.fixture(scope="module")
def stress_cluster(tmp_path_factory):
    reason = fuse_available()
    if reason:
        pytest.skip(f"needs FUSE mounts: {reason}")
    if _STRESS_NG is None:
        pytest.skip("stress-ng is not installed (scripts/setup.sh installs it)")
    base = tmp_path_factory.mktemp("stress")
    conf = base / "test.toml"
    conf.write_text(f'[cluster]\nblock_size = "{BLOCK // MIB}MiB"\n')
    c = LocalCluster(str(base / "cluster"), workers=2, mounts=2, conf=str(conf))
    c.restarts = []
    try:
        c.up()
        _limit_daemons(c)
        yield c
    finally:
        c.down()
    found = tracebacks_in_logs(c)
    assert not found, "a daemon logged a traceback:\n" + "\n\n".join(found)


@pytest.fixture
def mount_dir(stress_cluster, request):
    """A fresh directory on mount 0, whose daemon is running (started again if an
    earlier test killed it); fails the test if a daemon logged a traceback."""
    c = stress_cluster
    f0 = _fuse0(c)
    if not (f0["alive"] and _answers(c.mounts[0])):
        if f0["alive"]:
            _abort_fuse_under(c.mounts[0])
            c.kill("fuse", 0)
        c.start("fuse", 0)
        _limit_daemons(c)
        c.restarts.append(request.node.name)
    name = request.node.name.replace("[", "-").replace("]", "")
    d = os.path.join(c.mounts[0], name)
    os.mkdir(d)
    yield d
    found = tracebacks_in_logs(c)
    if found:
        pytest.fail("a daemon logged a traceback:\n" + "\n\n".join(found), pytrace=False)


def _kernel_log() -> list[str]:
    try:
        r = subprocess.run(["dmesg"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return r.stdout.decode(errors="replace").splitlines() if r.returncode == 0 else []


_KERNEL_NEWS = re.compile(r"segfault|exceed data ulimit|Out of memory|Killed process|"
                          r"general protection|oom-kill|traps:")


def _daemon_problem(c, kernel_before: set[str] | None = None) -> str | None:
    """None while curvine-fuse 0 runs; else what is known of its death: the tail of
    its log and the kernel's messages not in ``kernel_before`` (a _kernel_log())."""
    f0 = _fuse0(c)
    if f0["alive"]:
        return None
    news = [ln for ln in _kernel_log()[-500:]
            if ln not in kernel_before and _KERNEL_NEWS.search(ln)] \
        if kernel_before is not None else []
    return (f"curvine-fuse 0 (pid {f0['pid']}) DIED during the run"
            + ("; kernel log:\n" + "\n".join("    " + ln for ln in news[-6:]) if news else "")
            + "\n  last lines of its log:\n" + log_tail(f0["log"], 30, last_run=True))


# --------------------------------------------------------------------------- tests

@pytest.mark.parametrize("name", STRESSORS)
def test_stressor(name, mount_dir, stress_cluster, tmp_path):
    local = run_stressor(name, str(tmp_path / "local"), seconds=LOCAL_RUN_SECONDS,
                         timeout=60.0)
    assert local.passed, "on a LOCAL directory (so not a curvine problem):\n" + local.describe()
    kernel_before = set(_kernel_log()[-500:])
    run = run_stressor(name, mount_dir,
                       on_hang=functools.partial(_diagnose_hang, stress_cluster))
    print(f"{name}: local {local.seconds:.1f}s, mount {run.seconds:.1f}s")
    died = _daemon_problem(stress_cluster, kernel_before)
    if died:
        pytest.fail(run.describe() + "\n" + died, pytrace=False)
    if run.passed:
        return
    if run.skips and name in KERNEL_REFUSES and run.rc == 0 and not run.fails:
        text, why = KERNEL_REFUSES[name]
        if all(text in ln for ln in run.skips):
            print(f"{name}: skipped on FUSE as on every FUSE mount: {why}")
            return
    why = (" (a skip is allowed only for KERNEL_REFUSES: " + ", ".join(KERNEL_REFUSES) + ")"
           if run.skips else "")
    pytest.fail(run.describe() + why, pytrace=False)


@pytest.mark.parametrize("name", sorted(KERNEL_REFUSES))
def test_kernel_refuses_on_any_fuse(name, tmp_path):
    """Every KERNEL_REFUSES entry: the same stressor skips the same way on a trivial
    pyfuse3 passthrough of a local directory (so the refusal is the kernel's)."""
    reason = fuse_available()
    if reason:
        pytest.skip(f"needs FUSE mounts: {reason}")
    if _STRESS_NG is None:
        pytest.skip("stress-ng is not installed")
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    with open(tmp_path / "passthrough.log", "wb") as log:
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "passthrough",
                              str(src), str(mnt)], stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not is_mounted(str(mnt)):
            assert p.poll() is None, \
                "passthrough exited:\n" + (tmp_path / "passthrough.log").read_text()
            assert time.monotonic() < deadline, "passthrough did not mount"
            time.sleep(0.05)
        run = run_stressor(name, str(mnt / "t"), seconds=2, timeout=60)
        text, _why = KERNEL_REFUSES[name]
        assert run.rc == 0 and run.skips and all(text in ln for ln in run.skips), \
            "on a plain pyfuse3 passthrough:\n" + run.describe()
        assert any("fuse" in ln for ln in run.skips), run.describe()
        print(f"{name} on a pyfuse3 passthrough: {run.skips[0]}")
    finally:
        fusermount_unmount(str(mnt))
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _still_works(root: str) -> None:
    p = os.path.join(root, "after-workload")
    data = os.urandom(3 * BLOCK + 123)
    with open(p, "wb") as f:
        f.write(data)
    with open(p, "rb") as f:
        assert f.read() == data, "after the workload a new file reads other bytes"
    os.unlink(p)
    assert not os.path.exists(p)
    names = os.listdir(root)
    assert "after-workload" not in names


def test_workload(mount_dir, stress_cluster, tmp_path):
    """4 processes x 2000 racing namespace and data operations: on a local dir (the
    baseline: nothing unexpected), then on the mount: they finish, nothing unexpected
    (only errnos a race explains), and the mount still works afterwards."""
    from curvine.devtools.posix_workload import run_workload

    base = run_workload(str(tmp_path / "local"), WORKLOAD_PROCS, WORKLOAD_OPS, seed=0,
                        timeout=60)
    assert base.unexpected == [] and not base.timed_out, base.unexpected[:20]
    kernel_before = set(_kernel_log()[-500:])
    r = run_workload(os.path.join(mount_dir, "w"), WORKLOAD_PROCS, WORKLOAD_OPS, seed=0,
                     timeout=WORKLOAD_TIMEOUT)
    print(f"workload: local {base.seconds:.1f}s, mount {r.seconds:.1f}s, {r.ops_done} ops, "
          f"expected errors {r.expected_errors}")
    problems = []
    if r.timed_out:
        problems.append(f"did not finish within {WORKLOAD_TIMEOUT:g}s")
    if r.ops_done != WORKLOAD_PROCS * WORKLOAD_OPS:
        problems.append(f"{r.ops_done} of {WORKLOAD_PROCS * WORKLOAD_OPS} operations done")
    if r.unexpected:
        problems.append(f"{len(r.unexpected)} unexpected results:\n"
                        + "\n".join("    " + u for u in r.unexpected[:30]))
    died = _daemon_problem(stress_cluster, kernel_before)
    if died:
        problems.append(died)
    else:
        _still_works(mount_dir)
        _still_works(stress_cluster.mounts[0])
    assert not problems, "workload on the mount:\n  " + "\n  ".join(problems)


# --------------------------------------------------------------------------- passthrough

def _passthrough_main(src: str, mnt: str) -> int:
    """A trivial pyfuse3 passthrough of ``src`` on ``mnt`` (inode numbers are the
    source's; an inode remembers the last path it was seen under)."""
    import pyfuse3
    import trio

    class Ops(pyfuse3.Operations):
        def __init__(self):
            super().__init__()
            self.paths = {pyfuse3.ROOT_INODE: src}
            self.fds = {}

        def _path(self, ino):
            try:
                return self.paths[ino]
            except KeyError:
                raise pyfuse3.FUSEError(errno.ENOENT) from None

        def _child(self, parent, name):
            return os.path.join(self._path(parent), os.fsdecode(name))

        def _attr(self, path=None, fd=None):
            try:
                st = os.fstat(fd) if fd is not None else os.lstat(path)
            except OSError as e:
                raise pyfuse3.FUSEError(e.errno) from None
            a = pyfuse3.EntryAttributes()
            for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size",
                      "st_atime_ns", "st_mtime_ns", "st_ctime_ns"):
                setattr(a, k, getattr(st, k))
            a.st_ino = pyfuse3.ROOT_INODE if path == src else st.st_ino
            a.st_blksize, a.st_blocks = 4096, st.st_blocks
            a.generation, a.entry_timeout, a.attr_timeout = 0, 0, 0
            if path is not None and path != src:
                self.paths[st.st_ino] = path
            return a

        def _os(self, fn, *args):
            try:
                return fn(*args)
            except OSError as e:
                raise pyfuse3.FUSEError(e.errno) from None

        async def lookup(self, parent, name, ctx=None):
            return self._attr(self._child(parent, name))

        async def getattr(self, ino, ctx=None):
            return self._attr(self._path(ino))

        async def setattr(self, ino, attr, fields, fh, ctx):
            p = self._path(ino)
            if fields.update_size:
                self._os(os.truncate, p, attr.st_size)
            if fields.update_mode:
                self._os(os.chmod, p, stat.S_IMODE(attr.st_mode))
            if fields.update_uid or fields.update_gid:
                self._os(os.lchown, p, attr.st_uid if fields.update_uid else -1,
                         attr.st_gid if fields.update_gid else -1)
            if fields.update_atime or fields.update_mtime:
                st = self._os(os.lstat, p)
                ns = (attr.st_atime_ns if fields.update_atime else st.st_atime_ns,
                      attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns)
                self._os(lambda: os.utime(p, ns=ns))
            return self._attr(p)

        async def readlink(self, ino, ctx):
            return os.fsencode(self._os(os.readlink, self._path(ino)))

        async def mknod(self, parent, name, mode, rdev, ctx):
            p = self._child(parent, name)
            self._os(os.mknod, p, mode, rdev)
            return self._attr(p)

        async def mkdir(self, parent, name, mode, ctx):
            p = self._child(parent, name)
            self._os(os.mkdir, p, mode)
            return self._attr(p)

        async def symlink(self, parent, name, target, ctx):
            p = self._child(parent, name)
            self._os(os.symlink, os.fsdecode(target), p)
            return self._attr(p)

        async def link(self, ino, new_parent, new_name, ctx):
            p = self._child(new_parent, new_name)
            self._os(os.link, self._path(ino), p)
            return self._attr(p)

        async def unlink(self, parent, name, ctx):
            self._os(os.unlink, self._child(parent, name))

        async def rmdir(self, parent, name, ctx):
            self._os(os.rmdir, self._child(parent, name))

        async def rename(self, p_old, n_old, p_new, n_new, flags, ctx):
            if flags:
                raise pyfuse3.FUSEError(errno.EINVAL)
            old, new = self._child(p_old, n_old), self._child(p_new, n_new)
            self._os(os.rename, old, new)
            self._attr(new)

        async def forget(self, inode_list):
            pass

        async def opendir(self, ino, ctx):
            return ino

        async def readdir(self, fh, start_id, token):
            p = self._path(fh)
            names = sorted(self._os(os.listdir, p))
            for i, n in enumerate(names[start_id:], start_id):
                try:
                    a = self._attr(os.path.join(p, n))
                except pyfuse3.FUSEError:
                    continue
                if not pyfuse3.readdir_reply(token, os.fsencode(n), a, i + 1):
                    break

        async def releasedir(self, fh):
            pass

        async def open(self, ino, flags, ctx):
            fd = self._os(os.open, self._path(ino), flags & ~os.O_CREAT)
            self.fds[fd] = fd
            return pyfuse3.FileInfo(fh=fd)

        async def create(self, parent, name, mode, flags, ctx):
            p = self._child(parent, name)
            fd = self._os(os.open, p, flags | os.O_CREAT | os.O_TRUNC, mode)
            self.fds[fd] = fd
            return pyfuse3.FileInfo(fh=fd), self._attr(p)

        async def read(self, fh, off, size):
            return self._os(os.pread, fh, size, off)

        async def write(self, fh, off, buf):
            return self._os(os.pwrite, fh, buf, off)

        async def fsync(self, fh, datasync):
            self._os(os.fsync, fh)

        async def flush(self, fh):
            pass

        async def release(self, fh):
            self.fds.pop(fh, None)
            self._os(os.close, fh)

        async def statfs(self, ctx):
            sv = os.statvfs(src)
            d = pyfuse3.StatvfsData()
            for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                      "f_ffree", "f_favail"):
                setattr(d, k, getattr(sv, k))
            d.f_namemax = sv.f_namemax
            return d

    pyfuse3.init(Ops(), mnt, {"fsname=passthrough", "default_permissions"})
    try:
        async def run():
            async with trio.open_nursery() as nursery:
                async def on_signal():
                    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                        async for _ in sigs:
                            pyfuse3.terminate()
                            return
                nursery.start_soon(on_signal)
                await pyfuse3.main()
                nursery.cancel_scope.cancel()
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "passthrough":
        sys.exit(_passthrough_main(sys.argv[2], sys.argv[3]))
    print("usage: test_fs_stress.py passthrough SRC MNT", file=sys.stderr)
    sys.exit(2)
