"""Symbolic links, hard links, special files, open-unlinked files, user xattrs, rename
flags, mmap of written files, fallocate, O_TMPFILE and copy_file_range on a real mount,
each checked three ways: against a plain local directory (the same calls, the same
results and errnos), across the two mounts of the cluster, and after the master is
killed with SIGKILL and replays its journal.

One cluster serves the module (1 MiB blocks, so data spans blocks); the restart test
has a cluster of its own.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import signal
import socket
import stat
import tempfile
import threading

import pytest

from cluster_util import module_cluster, tracebacks_in_logs, wait_for
from curvine.common.ids import MIB
from fs_helpers import errname, errno_of

_libc = ctypes.CDLL(None, use_errno=True)
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
AT_FDCWD = -100
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 1, 2


def renameat2(src: str, dst: str, flags: int) -> None:
    if _libc.renameat2(AT_FDCWD, src.encode(), AT_FDCWD, dst.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), src)


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    if _libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


@pytest.fixture(scope="module")
def types_cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, "types", 1)


@pytest.fixture
def fs(types_cluster, request, tmp_path):
    """(mount A dir, mount B dir, local dir), fresh for this test."""
    name = request.node.name.replace("[", "-").replace("]", "")
    a = os.path.join(types_cluster.mounts[0], name)
    os.mkdir(a)
    b = os.path.join(types_cluster.mounts[1], name)
    local = tmp_path / "local"
    local.mkdir()
    yield a, b, str(local)
    found = tracebacks_in_logs(types_cluster)
    if found:
        pytest.fail("a daemon logged a traceback:\n" + "\n\n".join(found), pytrace=False)


def outcome(fn, *args):
    """What a call gives: its value, or the errno's name (compared across FSs)."""
    try:
        return fn(*args)
    except OSError as e:
        return errname(e.errno)


def same_on_both(script, a: str, local: str):
    """Run ``script(root)`` on the mount and on the local dir; their results match."""
    got, want = script(a), script(local)
    assert got == want, f"mount: {got}\nlocal: {want}"
    return got


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# --------------------------------------------------------------------------- symlinks

def _symlinks(root: str):
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    os.mkdir(j("d"))
    _write(j("d", "f"), b"hello")
    out = {}
    os.symlink("d/f", j("rel"))
    os.symlink(j("d"), j("absdir"))
    os.symlink("nowhere", j("dangling"))
    out["readlink"] = os.readlink(j("rel"))
    st = os.lstat(j("rel"))
    out["lstat"] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_nlink)
    out["stat_follows"] = os.stat(j("rel")).st_size
    out["read_through"] = _read(j("rel"))
    out["dir_through"] = sorted(os.listdir(j("absdir")))
    out["dangling_stat"] = outcome(os.stat, j("dangling"))
    out["dangling_lstat"] = stat.S_ISLNK(os.lstat(j("dangling")).st_mode)
    out["exists"] = outcome(os.symlink, "x", j("rel"))
    out["nofollow"] = outcome(os.open, j("rel"), os.O_RDONLY | os.O_NOFOLLOW)
    out["readlink_file"] = outcome(os.readlink, j("d", "f"))
    out["scandir"] = sorted((e.name, e.is_symlink(), e.is_dir()) for e in os.scandir(root))
    out["rename"] = outcome(os.rename, j("rel"), j("d", "moved"))
    out["moved"] = os.readlink(j("d", "moved"))
    out["write_through"] = outcome(_write, j("d", "moved"), b"via link")
    out["after_write"] = _read(j("d", "f"))
    out["unlink"] = outcome(os.unlink, j("d", "moved"))
    out["target_kept"] = os.path.exists(j("d", "f"))
    out["long_target"] = outcome(os.symlink, "x" * 4096, j("long"))
    return out


def test_symlinks_like_a_local_directory(fs):
    a, b, local = fs
    same_on_both(_symlinks, a, local)


def test_symlink_is_seen_by_the_other_mount(fs):
    a, b, _ = fs
    os.symlink("../some/where", os.path.join(a, "ln"))
    assert os.readlink(os.path.join(b, "ln")) == "../some/where"
    assert stat.S_ISLNK(os.lstat(os.path.join(b, "ln")).st_mode)


def test_the_kernel_keeps_a_symlinks_target(fs, types_cluster):
    """A symlink's target, once read, stays in the kernel (FUSE_CAP_CACHE_SYMLINKS,
    scripts/pyfuse3/cache-symlinks.patch): reading it again needs no request to the
    mount, which is stopped (SIGSTOP) meanwhile."""
    _, b, _ = fs
    os.symlink("f", os.path.join(b, "ln"))
    assert os.readlink(os.path.join(b, "ln")) == "f"  # the READLINK: now in the kernel
    pid = next(r["pid"] for r in types_cluster.status()
               if r["role"] == "fuse" and r["mount"] == types_cluster.mounts[1])
    box: dict = {}
    th = threading.Thread(target=lambda: box.setdefault(
        "target", os.readlink(os.path.join(b, "ln"))), daemon=True)
    os.kill(pid, signal.SIGSTOP)
    try:
        th.start()
        th.join(5.0)
        answered_while_stopped = not th.is_alive()
    finally:
        os.kill(pid, signal.SIGCONT)
    th.join(10.0)
    assert answered_while_stopped, "the second readlink waited for the (stopped) mount"
    assert box.get("target") == "f"


# --------------------------------------------------------------------------- hard links

def _hard_links(root: str):
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    os.mkdir(j("d"))
    _write(j("a"), b"one")
    out = {}
    os.link(j("a"), j("d", "b"))
    out["nlink"] = (os.stat(j("a")).st_nlink, os.stat(j("d", "b")).st_nlink)
    out["same_ino"] = os.stat(j("a")).st_ino == os.stat(j("d", "b")).st_ino
    _write(j("a"), b"two, longer")
    out["via_other"] = _read(j("d", "b"))
    out["link_dir"] = outcome(os.link, j("d"), j("dlink"))
    out["link_exists"] = outcome(os.link, j("a"), j("d", "b"))
    out["link_missing"] = outcome(os.link, j("nope"), j("x"))
    out["rename_onto_self"] = outcome(os.rename, j("a"), j("d", "b"))
    out["both_there"] = (os.path.exists(j("a")), os.path.exists(j("d", "b")))
    os.link(j("a"), j("c"))
    out["three"] = os.stat(j("c")).st_nlink
    os.unlink(j("a"))
    out["after_unlink"] = (os.stat(j("c")).st_nlink, _read(j("d", "b")))
    os.rename(j("c"), j("d", "c2"))
    out["after_rename"] = (os.stat(j("d", "c2")).st_nlink, _read(j("d", "c2")))
    _write(j("other"), b"o")
    os.rename(j("other"), j("d", "b"))  # replaces one of two names
    out["replaced"] = (os.stat(j("d", "c2")).st_nlink, _read(j("d", "c2")),
                       _read(j("d", "b")))
    os.unlink(j("d", "c2"))
    out["listing"] = sorted(os.listdir(j("d")))
    os.symlink("a", j("sl"))
    os.link(j("sl"), j("sl2"), follow_symlinks=False)
    out["link_of_symlink"] = (os.readlink(j("sl2")), os.lstat(j("sl")).st_nlink)
    return out


def test_hard_links_like_a_local_directory(fs):
    a, b, local = fs
    same_on_both(_hard_links, a, local)


def test_hard_link_data_lives_until_the_last_name(fs):
    a, b, _ = fs
    data = os.urandom(3 * MIB + 5)
    _write(os.path.join(a, "x"), data)
    os.link(os.path.join(a, "x"), os.path.join(a, "y"))
    assert os.stat(os.path.join(b, "y")).st_nlink == 2
    os.unlink(os.path.join(a, "x"))
    assert _read(os.path.join(b, "y")) == data
    assert os.stat(os.path.join(b, "y")).st_nlink == 1
    os.unlink(os.path.join(b, "y"))
    assert not os.path.exists(os.path.join(a, "y"))


# --------------------------------------------------------------------------- special files

def _special(root: str):
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    out = {}
    os.mkfifo(j("fifo"), 0o640)
    os.mknod(j("chr"), 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(j("blk"), 0o600 | stat.S_IFBLK, os.makedev(7, 0))
    s = socket.socket(socket.AF_UNIX)
    # through the directory's descriptor: a socket path has at most 107 bytes, and a
    # pytest temp dir on a machine that ran many sessions is long enough to pass it
    dfd = os.open(os.path.dirname(j("sock")), os.O_RDONLY | os.O_DIRECTORY)
    try:
        s.bind(f"/proc/self/fd/{dfd}/sock")
    finally:
        s.close()
        os.close(dfd)
    for n in ("fifo", "chr", "blk", "sock"):
        st = os.lstat(j(n))
        out[n] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode) & 0o700,
                  st.st_rdev if n in ("chr", "blk") else 0, st.st_size)
    out["exists"] = outcome(os.mkfifo, j("fifo"))
    got = []
    t = threading.Thread(target=lambda: got.append(_read(j("fifo"))))
    t.start()
    _write(j("fifo"), b"through the pipe")
    t.join(10)
    out["fifo_io"] = got
    out["rename"] = outcome(os.rename, j("fifo"), j("fifo2"))
    out["unlink"] = outcome(os.unlink, j("chr"))
    out["listing"] = sorted(os.listdir(root))
    return out


def test_special_files_like_a_local_directory(fs):
    a, b, local = fs
    same_on_both(_special, a, local)


def test_special_files_are_seen_by_the_other_mount(fs):
    a, b, _ = fs
    os.mknod(os.path.join(a, "c"), 0o644 | stat.S_IFCHR, os.makedev(1, 3))
    st = os.lstat(os.path.join(b, "c"))
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    # the mount is nodev (libfuse's default, kept: a pod must not reach the host's
    # devices through a node it made): the kernel refuses to open a device on it
    assert errno_of(os.open, os.path.join(b, "c"), os.O_RDONLY) == errno.EACCES


# --------------------------------------------------------------------------- open-unlinked

def _open_unlinked(root: str):
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    out = {}
    fd = os.open(j("f"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"0123456789" * 1000)
        os.unlink(j("f"))
        out["gone"] = os.path.exists(j("f"))
        st = os.fstat(fd)
        out["fstat"] = (st.st_nlink, st.st_size)
        os.ftruncate(fd, 5000)
        out["truncated"] = os.fstat(fd).st_size
        os.pwrite(fd, b"tail", 7000)
        out["grown"] = os.fstat(fd).st_size
        os.fsync(fd)
        out["read"] = (os.pread(fd, 10, 0), os.pread(fd, 10, 4995), os.pread(fd, 8, 6998))
        try:
            os.posix_fallocate(fd, 0, 9000)
            out["fallocate"] = os.fstat(fd).st_size
        except OSError as e:
            out["fallocate"] = errname(e.errno)
        out["listing"] = os.listdir(root)
    finally:
        os.close(fd)
    # replaced by a rename while open for reading: the reader keeps the old bytes
    _write(j("r"), b"old content")
    _write(j("n"), b"new")
    with open(j("r"), "rb") as f:
        os.rename(j("n"), j("r"))
        out["reader_keeps"] = f.read()
    out["name_now"] = _read(j("r"))
    # tmpfile(): O_TMPFILE where it works, else a name unlinked at once
    with tempfile.TemporaryFile(dir=root) as t:
        t.write(b"scratch" * 100)
        t.seek(0)
        out["tmpfile"] = t.read(14)
    out["left"] = sorted(os.listdir(root))
    return out


def test_open_unlinked_files_like_a_local_directory(fs):
    a, b, local = fs
    same_on_both(_open_unlinked, a, local)


def test_an_unlinked_open_file_is_removed_at_its_last_close(fs):
    a, b, _ = fs
    path = os.path.join(a, "big")
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, os.urandom(2 * MIB))
        os.fsync(fd)  # published: blocks on the workers
        os.unlink(os.path.join(b, "big"))  # by the OTHER mount: not held for that one
        assert errno_of(os.stat, path) == errno.ENOENT
    finally:
        os.close(fd)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"x" * 1000)
        os.unlink(path)  # by this mount: held
        os.write(fd, b"y" * 1000)
        os.fsync(fd)
        assert os.pread(fd, 2000, 0) == b"x" * 1000 + b"y" * 1000
        assert os.fstat(fd).st_nlink == 0
    finally:
        os.close(fd)
    # after the last close the master forgets it: nothing of it lists anywhere
    assert os.listdir(a) == [] and os.listdir(b) == []


# --------------------------------------------------------------------------- xattrs

def _xattrs(root: str):
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    _write(j("f"), b"data")
    os.mkdir(j("d"))
    out = {}
    os.setxattr(j("f"), "user.color", b"blue")
    os.setxattr(j("d"), "user.empty", b"")
    out["get"] = os.getxattr(j("f"), "user.color")
    out["empty"] = os.getxattr(j("d"), "user.empty")
    out["list"] = sorted(os.listxattr(j("f")))
    out["missing"] = outcome(os.getxattr, j("f"), "user.nope")
    out["create_exists"] = outcome(os.setxattr, j("f"), "user.color", b"x", os.XATTR_CREATE)
    out["replace_missing"] = outcome(os.setxattr, j("f"), "user.new", b"x",
                                     os.XATTR_REPLACE)
    os.setxattr(j("f"), "user.color", b"red", os.XATTR_REPLACE)
    out["replaced"] = os.getxattr(j("f"), "user.color")
    out["binary"] = (os.setxattr(j("f"), "user.bin", bytes(range(256))),
                     os.getxattr(j("f"), "user.bin"))
    out["remove"] = outcome(os.removexattr, j("f"), "user.bin")
    out["remove_missing"] = outcome(os.removexattr, j("f"), "user.bin")
    out["name_too_long"] = outcome(os.setxattr, j("f"), "user." + "n" * 251, b"x")
    out["after"] = sorted(os.listxattr(j("f")))
    os.rename(j("f"), j("g"))
    out["kept_by_rename"] = os.getxattr(j("g"), "user.color")
    out["symlink_nofollow"] = outcome(os.setxattr, j("g"), "user.s", b"1")
    return out


def test_user_xattrs_like_a_local_directory(fs):
    a, b, local = fs
    same_on_both(_xattrs, a, local)


def test_xattrs_are_seen_by_the_other_mount_and_have_limits(fs):
    a, b, _ = fs
    _write(os.path.join(a, "f"), b"")
    os.setxattr(os.path.join(a, "f"), "user.k", b"v" * 1000)
    assert os.getxattr(os.path.join(b, "f"), "user.k") == b"v" * 1000
    os.removexattr(os.path.join(b, "f"), "user.k")
    assert errno_of(os.getxattr, os.path.join(a, "f"), "user.k") == errno.ENODATA
    assert errno_of(os.setxattr, os.path.join(a, "f"), "trusted.k", b"v") == errno.EOPNOTSUPP
    os.setxattr(os.path.join(a, "f"), "user.big", b"b" * 60000)
    assert errno_of(os.setxattr, os.path.join(a, "f"), "user.big2", b"b" * 10000) \
        in (errno.E2BIG, errno.ENOSPC)


# --------------------------------------------------------------------------- rename flags

def _rename_flags(root: str):
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    _write(j("a"), b"A")
    _write(j("b"), b"B")
    os.mkdir(j("d"))
    _write(j("d", "in"), b"I")
    out = {}
    out["noreplace_exists"] = outcome(renameat2, j("a"), j("b"), RENAME_NOREPLACE)
    out["noreplace_new"] = outcome(renameat2, j("a"), j("c"), RENAME_NOREPLACE)
    out["exchange"] = outcome(renameat2, j("c"), j("b"), RENAME_EXCHANGE)
    out["swapped"] = (_read(j("b")), _read(j("c")))
    out["exchange_dir"] = outcome(renameat2, j("b"), j("d"), RENAME_EXCHANGE)
    out["dir_now"] = (os.path.isdir(j("b")), sorted(os.listdir(j("b"))), _read(j("d")))
    out["exchange_missing"] = outcome(renameat2, j("b"), j("none"), RENAME_EXCHANGE)
    out["exchange_into_self"] = outcome(renameat2, j("b"), j("b", "in"), RENAME_EXCHANGE)
    out["both_flags"] = outcome(renameat2, j("c"), j("d"), RENAME_EXCHANGE | RENAME_NOREPLACE)
    return out


def test_rename_flags_like_a_local_directory(fs):
    a, b, local = fs
    same_on_both(_rename_flags, a, local)


def test_an_exchange_is_seen_by_the_other_mount(fs):
    a, b, _ = fs
    _write(os.path.join(a, "x"), b"x")
    _write(os.path.join(a, "y"), b"yy")
    assert _read(os.path.join(b, "x")) == b"x"
    renameat2(os.path.join(a, "x"), os.path.join(a, "y"), RENAME_EXCHANGE)
    assert (_read(os.path.join(b, "x")), _read(os.path.join(b, "y"))) == (b"yy", b"x")


# --------------------------------------------------------------------------- mmap

def _mmap(root: str):
    p = os.path.join(root, "m")
    out = {}
    with open(p, "w+b") as f:
        f.write(b"a" * 3 * MIB)
        f.flush()
        with mmap.mmap(f.fileno(), 0) as m:
            m[10:15] = b"HELLO"
            m[MIB - 2:MIB + 2] = b"EDGE"  # across a block boundary
            out["mapped_read"] = bytes(m[8:17])
            m.flush()
        f.seek(0)
        out["read_after"] = f.read(20)
        f.truncate(4 * MIB)
        with mmap.mmap(f.fileno(), 0) as m:
            m[-3:] = b"END"
    with open(p, "rb") as f:
        data = f.read()
    out["final"] = (len(data), data[10:15], data[MIB - 2:MIB + 2], data[-3:],
                    data.count(b"a"))
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        out["readonly_map"] = bytes(m[10:15])
    return out


def test_mmap_of_written_files_like_a_local_directory(fs):
    a, b, local = fs
    same_on_both(_mmap, a, local)


def test_mmap_writes_are_seen_by_the_other_mount_after_close(fs):
    a, b, _ = fs
    p = os.path.join(a, "m")
    with open(p, "w+b") as f:
        f.write(bytes(2 * MIB))
        f.flush()
        m = mmap.mmap(f.fileno(), 0)
        m[123:126] = b"xyz"
        m.close()
    with open(os.path.join(b, "m"), "rb") as f:
        data = f.read()
    assert len(data) == 2 * MIB and data[123:126] == b"xyz"


# --------------------------------------------------------------------------- the rest

def _fallocate(root: str):
    p = os.path.join(root, "f")
    out = {}
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"z" * 10000)
        out["mode0"] = (outcome(fallocate, fd, 0, 5000, 20000), os.fstat(fd).st_size)
        out["keep"] = (outcome(fallocate, fd, FALLOC_FL_KEEP_SIZE, 0, 100000),
                       os.fstat(fd).st_size)
        out["punch"] = outcome(fallocate, fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                               100, 200)
        out["bytes"] = (os.pread(fd, 400, 0), os.pread(fd, 10, 24990))
        out["punch_no_keep"] = outcome(fallocate, fd, FALLOC_FL_PUNCH_HOLE, 0, 10)
        out["posix"] = (outcome(os.posix_fallocate, fd, 30000, 100), os.fstat(fd).st_size)
    finally:
        os.close(fd)
    rfd = os.open(p, os.O_RDONLY)
    try:
        out["readonly"] = outcome(fallocate, rfd, 0, 0, 10)
    finally:
        os.close(rfd)
    out["final_size"] = os.stat(p).st_size
    return out


def test_fallocate_like_a_local_directory(fs):
    a, b, local = fs
    same_on_both(_fallocate, a, local)


def _huge(root: str):
    """Sizes past any file: EFBIG, and the file is unchanged (stress-ng's fsize walks
    fallocate up to 2**62; the mount used to grow a hole per block until it died)."""
    p = os.path.join(root, "big")
    out = {}
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"x" * 100)
        for shift in (50, 55, 62):
            out[f"fallocate {shift}"] = outcome(fallocate, fd, 0, (1 << shift) - 2, 1)
            out[f"ftruncate {shift}"] = outcome(os.ftruncate, fd, 1 << shift)
            out[f"pwrite {shift}"] = outcome(os.pwrite, fd, b"y", 1 << shift)
        out["size"] = os.fstat(fd).st_size
    finally:
        os.close(fd)
    out["truncate"] = outcome(os.truncate, p, 1 << 50)
    out["final"] = (os.stat(p).st_size, _read(p))
    return out


def test_huge_sizes_like_a_local_directory(fs):
    a, b, local = fs
    same_on_both(_huge, a, local)
    assert os.stat(os.path.join(b, "big")).st_size == 100


def test_copy_file_range_and_o_tmpfile(fs):
    a, b, _ = fs
    src, dst = os.path.join(a, "src"), os.path.join(a, "dst")
    data = os.urandom(3 * MIB + 17)
    _write(src, data)
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        left = len(data)
        while left:
            n = os.copy_file_range(fi.fileno(), fo.fileno(), left)
            assert n > 0
            left -= n
    assert _read(os.path.join(b, "dst")) == data
    # O_TMPFILE: FUSE has no such request; the kernel answers EOPNOTSUPP, on which
    # callers (glibc, Python's tempfile) fall back to a named file
    assert errno_of(os.open, a, os.O_TMPFILE | os.O_RDWR, 0o600) == errno.EOPNOTSUPP


# --------------------------------------------------------------------------- replay

@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master is SIGKILLed on purpose
def test_everything_survives_a_master_sigkill(make_cluster, tmp_path):
    c = make_cluster(workers=1, mounts=2)
    a, b = c.mounts
    j = lambda *p: os.path.join(a, *p)  # noqa: E731
    _write(j("f"), b"file data")
    os.symlink("f", j("sl"))
    os.mkfifo(j("fifo"))
    os.mknod(j("chr"), 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    os.link(j("f"), j("f2"))
    os.link(j("f"), j("f3"))
    os.unlink(j("f3"))
    os.setxattr(j("f"), "user.a", b"1")
    os.setxattr(j("f"), "user.b", b"2")
    os.removexattr(j("f"), "user.b")
    _write(j("x"), b"X")
    _write(j("y"), b"Y")
    renameat2(j("x"), j("y"), RENAME_EXCHANGE)
    held = os.open(j("held"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(held, b"kept while open")
        os.fsync(held)
        os.unlink(j("held"))

        def state(root):
            r = lambda *p: os.path.join(root, *p)  # noqa: E731
            return {"listing": sorted(os.listdir(root)), "sl": os.readlink(r("sl")),
                    "fifo": stat.S_ISFIFO(os.lstat(r("fifo")).st_mode),
                    "chr": os.lstat(r("chr")).st_rdev,
                    "nlink": os.stat(r("f")).st_nlink, "f2": _read(r("f2")),
                    "xattrs": sorted(os.listxattr(r("f"))), "a": os.getxattr(r("f"), "user.a"),
                    "xy": (_read(r("x")), _read(r("y")))}

        before = state(a)
        c.kill("master", sig=signal.SIGKILL)
        c.start("master")
        for root in (a, b):
            assert wait_for(lambda: errno_of(os.listdir, root) is None, timeout=60,
                            what="the mount answers again")
            assert state(root) == before
        assert os.pread(held, 100, 0) == b"kept while open"
        os.ftruncate(held, 4)
        assert os.pread(held, 100, 0) == b"kept"
    finally:
        os.close(held)
    assert "held" not in os.listdir(b)
