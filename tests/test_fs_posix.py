"""POSIX behaviour of a real mount, checked against a plain local directory.

Every bad-input case runs the same operation on a local tmp dir and on the mount
and expects the same errno (ENAMETOOLONG, ENOTDIR, ENOTEMPTY, EINVAL, EISDIR,
EEXIST, ...).  Then the ordinary operations: directories, rename replacing a
target, truncate, chmod, utime, statvfs, append, writes at random offsets, and
reading through a handle whose file was unlinked.

One cluster serves the whole module (block size 4 MiB, so files here span
several blocks); each test still fails if a daemon logged a traceback during it.
"""

from __future__ import annotations

import errno
import os
import random
import stat
import subprocess
import sys
import time

import pytest

from curvine.fuse_client import filesystem, page_cache

from cluster_util import daemon_metric, module_cluster, tracebacks_in_logs
from fs_helpers import MIB, errname, errno_of, read_all, sha256

BLOCK = 4 * MIB


@pytest.fixture(scope="module")
def posix_cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, "posix", BLOCK // MIB)


@pytest.fixture
def fs(posix_cluster, request, tmp_path):
    """(mount A dir, mount B dir, local dir) fresh for this test; fails the test if
    a daemon logged a traceback while it ran."""
    name = request.node.name.replace("[", "-").replace("]", "")
    a = os.path.join(posix_cluster.mounts[0], name)
    os.mkdir(a)
    b = os.path.join(posix_cluster.mounts[1], name)
    local = tmp_path / "local"
    local.mkdir()
    yield a, b, str(local)
    found = tracebacks_in_logs(posix_cluster)
    if found:
        pytest.fail("a daemon logged a traceback:\n" + "\n\n".join(found), pytrace=False)


def _touch(path: str, data: bytes = b"") -> None:
    with open(path, "wb") as f:
        f.write(data)


# --------------------------------------------------------------------------- errnos

def _case_setup(root: str) -> None:
    os.mkdir(os.path.join(root, "d"))
    os.mkdir(os.path.join(root, "d", "sub"))
    _touch(os.path.join(root, "d", "f"), b"x")
    os.mkdir(os.path.join(root, "empty"))
    os.mkdir(os.path.join(root, "full"))
    _touch(os.path.join(root, "full", "g"))
    _touch(os.path.join(root, "f"), b"hello")


LONG = "n" * 256
LONG_UTF8 = "\u00e9" * 128  # 256 bytes in UTF-8, 128 characters

CREAT = os.O_CREAT | os.O_WRONLY
EXCL = os.O_CREAT | os.O_EXCL | os.O_WRONLY


def _cases():
    j = os.path.join
    return {
        # names over 255 bytes
        "create long name": lambda r: os.open(j(r, LONG), CREAT, 0o644),
        "create long utf-8 name": lambda r: os.open(j(r, LONG_UTF8), CREAT, 0o644),
        "stat long name": lambda r: os.stat(j(r, LONG)),
        "mkdir long name": lambda r: os.mkdir(j(r, LONG)),
        "rename to long name": lambda r: os.rename(j(r, "f"), j(r, LONG)),
        "create 255-byte name (allowed)": lambda r: os.open(j(r, "m" * 255), CREAT, 0o644),
        # a path through a file
        "stat through a file": lambda r: os.stat(j(r, "f", "x")),
        "create through a file": lambda r: os.open(j(r, "f", "x"), CREAT, 0o644),
        "mkdir through a file": lambda r: os.mkdir(j(r, "f", "x")),
        "listdir of a file": lambda r: os.listdir(j(r, "f")),
        "rmdir of a file": lambda r: os.rmdir(j(r, "f")),
        # directories
        "rmdir non-empty": lambda r: os.rmdir(j(r, "full")),
        "rename dir into itself": lambda r: os.rename(j(r, "d"), j(r, "d", "sub", "d2")),
        "rename dir into its child": lambda r: os.rename(j(r, "d"), j(r, "d", "x")),
        "unlink a directory": lambda r: os.unlink(j(r, "d")),
        "mkdir existing dir": lambda r: os.mkdir(j(r, "d")),
        "mkdir over a file": lambda r: os.mkdir(j(r, "f")),
        "open O_EXCL existing": lambda r: os.open(j(r, "f"), EXCL, 0o644),
        "open O_EXCL existing dir": lambda r: os.open(j(r, "d"), EXCL, 0o644),
        "rename dir over non-empty dir": lambda r: os.rename(j(r, "empty"), j(r, "full")),
        "rename file over dir": lambda r: os.rename(j(r, "f"), j(r, "empty")),
        "rename dir over file": lambda r: os.rename(j(r, "empty"), j(r, "f")),
        "open dir for writing": lambda r: os.open(j(r, "d"), os.O_WRONLY),
        "truncate a dir": lambda r: os.truncate(j(r, "d"), 0),
        # missing names
        "open missing": lambda r: os.open(j(r, "nope"), os.O_RDONLY),
        "rename missing": lambda r: os.rename(j(r, "nope"), j(r, "nope2")),
        "unlink missing": lambda r: os.unlink(j(r, "nope")),
        "rmdir missing": lambda r: os.rmdir(j(r, "nope")),
        "create in missing dir": lambda r: os.open(j(r, "nope", "x"), CREAT, 0o644),
    }


def test_bad_input_gets_the_local_errno(fs):
    a, _b, local = fs
    rows = []
    for name, op in _cases().items():
        got = []
        for root in (local, a):
            case_root = os.path.join(root, f"case{len(rows)}")
            os.mkdir(case_root)
            _case_setup(case_root)
            got.append(errno_of(op, case_root))
        rows.append((name, *got))
    table = "\n".join(f"  {n:34} local={errname(x):13} mount={errname(y)}" for n, x, y in rows)
    print("errno, local dir vs mount:\n" + table)
    bad = [r for r in rows if r[1] != r[2]]
    assert not bad, "errno differs from a local file system:\n" + "\n".join(
        f"  {n}: local {errname(x)}, mount {errname(y)}" for n, x, y in bad)
    # and the local side really failed where the brief says it must
    want = {"create long name": errno.ENAMETOOLONG, "stat through a file": errno.ENOTDIR,
            "rmdir non-empty": errno.ENOTEMPTY, "rename dir into itself": errno.EINVAL,
            "unlink a directory": errno.EISDIR, "mkdir existing dir": errno.EEXIST,
            "open O_EXCL existing": errno.EEXIST}
    for n, x, _ in rows:
        if n in want:
            assert x == want[n], f"{n}: local file system gave {errname(x)}"


def test_failed_operations_change_nothing(fs):
    """After the failing cases, the tree is exactly what the setup made (no
    half-created long names, no moved directories), seen from both mounts."""
    a, b, local = fs
    for root in (local, a):
        _case_setup(root)
        for op in _cases().values():
            errno_of(op, root)

    def tree(root):
        out = {}
        for dirpath, dirnames, filenames in os.walk(root):
            rel = os.path.relpath(dirpath, root)
            for n in filenames:
                p = os.path.join(dirpath, n)
                out[os.path.join(rel, n)] = read_all(p)
            for n in dirnames:
                out[os.path.join(rel, n) + "/"] = None
        return out

    want = tree(local)
    assert tree(a) == want
    assert tree(b) == want


def _write_on(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def test_read_through_handle_of_unlinked_file(fs):
    """A reader whose file is unlinked keeps reading the data it opened, as on a
    local file system (unlink on the same mount), and never other bytes (unlink
    from another mount: that data, or a clean error)."""
    a, b, local = fs
    data = random.Random(1).randbytes(3 * MIB + 12345)
    for root, other in ((local, local), (a, a)):
        # written from the other mount, so nothing of it is in this mount's page cache
        _write_on(os.path.join(b if root == a else local, "victim"), data)
        fd = os.open(os.path.join(root, "victim"), os.O_RDONLY)
        try:
            first = os.read(fd, MIB)
            os.unlink(os.path.join(other, "victim"))
            assert not os.path.exists(os.path.join(root, "victim"))
            time.sleep(2.5)  # workers get their block deletes with the next heartbeat
            rest = b""
            while True:
                chunk = os.read(fd, MIB)
                if not chunk:
                    break
                rest += chunk
            assert first + rest == data, f"{root}: reading the unlinked file gave other bytes"
            assert os.fstat(fd).st_size == len(data)
            os.lseek(fd, 100, os.SEEK_SET)
            assert os.read(fd, 1000) == data[100:1100]
        finally:
            os.close(fd)
        assert not os.path.exists(os.path.join(other, "victim"))

    # unlinked from the other mount: the data it opened, or a clean error
    _write_on(os.path.join(b, "victim2"), data)
    fd = os.open(os.path.join(a, "victim2"), os.O_RDONLY)
    try:
        first = os.read(fd, MIB)
        assert first == data[:MIB]
        os.unlink(os.path.join(b, "victim2"))
        time.sleep(2.5)
        got = bytearray(first)
        try:
            while True:
                chunk = os.read(fd, MIB)
                if not chunk:
                    break
                got += chunk
            assert bytes(got) == data, "reader of a file unlinked elsewhere got other bytes"
            print("unlinked on the other mount: reader finished with the data it opened")
        except OSError as e:
            assert bytes(got) == data[:len(got)], "other bytes before the error"
            print(f"unlinked on the other mount: reader got {errname(e.errno)} after "
                  f"{len(got)} good bytes")
    finally:
        os.close(fd)
    assert not os.path.exists(os.path.join(a, "victim2"))


_WRITER = """
import os, sys, time
fd = os.open(sys.argv[1], int(sys.argv[2]))
opened = time.monotonic()
os.pwrite(fd, b"X" * 4096, int(sys.argv[3]))
os.close(fd)
print(opened)
"""


def _open_waits(cluster, outcome: str) -> float:
    """curvine_fuse_opens_waiting_for_readers_total{outcome} of mount 0."""
    return daemon_metric(cluster, "fuse", "curvine_fuse_opens_waiting_for_readers_total",
                         outcome=outcome)


@pytest.mark.parametrize("mode", ["O_TRUNC", "O_RDWR", "O_RDWR|O_TRUNC"])
def test_reader_keeps_its_version_when_another_process_opens_the_file_to_write(
        fs, posix_cluster, mode):
    """Consistency rule 1 (docs/consistency.md) on one mount: a reader of a published file reads
    all of that version although another process here opens the file to write while
    it reads.  The kernel has one page cache and one size per inode: an O_TRUNC open
    (LMCache's writers of one key open the same <key>.tmp so) sets the size to 0 for
    the whole mount, and an O_RDWR handle writes into that page cache before it
    publishes.  So the mount holds such an open until the reader, which reads through
    the page cache, has closed; a stat meanwhile that makes the kernel ask (``stat
    --cached=never``) is told the published size, not the waiting writer's.  A local
    file system shows the reader the change instead."""
    a, _, _ = fs
    data = random.Random(5).randbytes(6 * MIB + 4321)
    path = os.path.join(a, "chunk")
    _write_on(path, data)
    flags, at = {"O_TRUNC": (os.O_WRONLY | os.O_TRUNC, 0), "O_RDWR": (os.O_RDWR, 2 * MIB),
                 "O_RDWR|O_TRUNC": (os.O_RDWR | os.O_TRUNC, 0)}[mode]
    waits_before = _open_waits(posix_cluster, "closed")
    fd = os.open(path, os.O_RDONLY)
    try:
        got = bytearray(os.read(fd, MIB))
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, path, str(flags), str(at)],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)  # the writer's open is on its way (held by the mount)
        shown = subprocess.run(["stat", "--cached=never", "-c", "%s", path],
                               capture_output=True, text=True, check=True).stdout
        assert int(shown) == len(data), "a stat during the wait showed the writer's size"
        while chunk := os.read(fd, MIB):
            got += chunk
        assert len(got) == len(data), (
            f"the reader got {len(got)} of {len(data)} bytes after another process's "
            f"{mode} open")
        assert bytes(got) == data, "the reader got bytes its version does not hold"
        closed = time.monotonic()
    finally:
        os.close(fd)
    out, _ = writer.communicate(timeout=60)
    assert writer.returncode == 0
    assert float(out) >= closed, f"the {mode} open returned before the reader closed"
    assert _open_waits(posix_cluster, "closed") == waits_before + 1
    want = (b"X" * 4096 if flags & os.O_TRUNC
            else data[:at] + b"X" * 4096 + data[at + 4096:])
    assert read_all(path) == want
    if mode != "O_TRUNC":
        return

    # The truncating process's open does not wait for its own reader (it could be
    # the one to close it).  That reader then sees the truncation, as on a local file
    # system, or (once the emptied version is published) the rest of its own version.
    p = os.path.join(a, "own")
    _write_on(p, data)
    rfd = os.open(p, os.O_RDONLY)
    try:
        first = os.read(rfd, 4096)
        t0 = time.monotonic()
        wfd = os.open(p, os.O_WRONLY | os.O_TRUNC)
        waited = time.monotonic() - t0
        os.close(wfd)
        rest = b""
        while chunk := os.read(rfd, MIB):
            rest += chunk
    finally:
        os.close(rfd)
    assert first == data[:4096]
    assert rest in (b"", data[4096:]), "a reader got other bytes than its version's"
    assert waited < page_cache.CACHED_READERS_WAIT, (
        f"the O_TRUNC open waited {waited:.1f}s for its own process's reader")


def test_an_old_reader_and_a_new_reader_of_a_file_get_their_own_versions(fs):
    """Consistency rule 1 (docs/consistency.md) across mounts: mount B reads version 1 of a file
    through the page cache while mount A publishes version 2 (same size, other
    bytes), and then a new reader on B reads version 2.  The old reader must finish
    with version 1 only: one page cache cannot hold both, so the new reader reads
    without it.  Once the old reader is gone, B's readers get version 2 whole."""
    a, b, _ = fs
    v1 = random.Random(11).randbytes(6 * MIB)
    v2 = random.Random(12).randbytes(6 * MIB)
    _write_on(os.path.join(a, "f"), v1)
    fd = os.open(os.path.join(b, "f"), os.O_RDONLY)
    try:
        got = bytearray(os.read(fd, MIB))
        _write_on(os.path.join(a, "f"), v2)
        assert read_all(os.path.join(b, "f")) == v2, "a new reader on B did not get version 2"
        while chunk := os.read(fd, MIB):
            got += chunk
    finally:
        os.close(fd)
    assert len(got) == len(v1)
    assert bytes(got) == v1, (
        "the old reader on B got other bytes than version 1 "
        f"({'version 2 after the first MiB' if bytes(got[MIB:]) == v2[MIB:] else 'a mix'})")
    for _ in range(2):
        assert read_all(os.path.join(b, "f")) == v2


@pytest.mark.parametrize("new_size", [5, 9 * MIB])
def test_a_reader_finishes_its_version_when_another_mount_publishes_another_size(fs, new_size):
    """Consistency rule 1 (docs/consistency.md) across mounts, when the new version has another size:
    the kernel's size of the inode bounds reads through the page cache.  The reader
    must still read all of the version it opened, and no more, while other processes
    on its mount stat the file and read the new version.  Its mount keeps telling the
    kernel the old size until that reader closes (so a stat there shows it); then
    the new size."""
    a, b, _ = fs
    v1 = random.Random(21).randbytes(6 * MIB)
    v2 = random.Random(22).randbytes(new_size)
    _write_on(os.path.join(a, "f"), v1)
    fd = os.open(os.path.join(b, "f"), os.O_RDONLY)
    try:
        got = bytearray(os.read(fd, MIB))
        _write_on(os.path.join(a, "f"), v2)
        assert os.stat(os.path.join(b, "f")).st_size == len(v1)
        assert read_all(os.path.join(b, "f")) == v2, "a new reader on B did not get version 2"
        got += os.read(fd, MIB)
        os.stat(os.path.join(b, "f"))
        while chunk := os.read(fd, MIB):
            got += chunk
    finally:
        os.close(fd)
    assert len(got) == len(v1), f"the old reader read {len(got)} bytes of {len(v1)}"
    assert bytes(got) == v1
    assert os.stat(os.path.join(b, "f")).st_size == new_size
    assert read_all(os.path.join(b, "f")) == v2


def _cluster_keeping_names(make_cluster, tmp_path):
    """Mounts A and B without leases, whose kernels keep names and attributes for 30 s:
    what a kernel keeps in a race with a revocation, at the defaults, held still long
    enough for a test to see it."""
    conf = tmp_path / "fuse.toml"
    conf.write_text('[fuse]\nleases = false\nattr_timeout = "30s"\nentry_timeout = "30s"\n')
    return make_cluster(workers=1, mounts=2, conf=str(conf))


def test_a_reader_reads_all_of_a_new_version_while_the_kernel_holds_the_old_size(
        make_cluster, tmp_path):
    """Consistency rules 1 and 3 (docs/consistency.md): the kernel may keep a file's attributes for
    a while (here without leases, for a 30 s attr and entry timeout), so a stat on B
    shows the old size; but a reader that opens the file there gets the version the
    master has now, and all of it, though the kernel still held the old version's
    size (which bounds reads through the page cache) when it opened.  (The same size
    is held with leases too, when an answer was not leased: one given while this
    mount writes the file; tests/version_fuzz.py found it that way.)"""
    c = _cluster_keeping_names(make_cluster, tmp_path)
    a, b = (os.path.join(m, "f") for m in c.mounts)
    v1 = random.Random(31).randbytes(MIB)
    v2 = random.Random(32).randbytes(6 * MIB)
    _write_on(a, v1)
    assert os.stat(b).st_size == len(v1)  # B's kernel keeps this for 30 s
    _write_on(a, v2)  # in place: the same inode
    assert os.stat(b).st_size == len(v1), "the test needs B's kernel to keep the old size"
    got = read_all(b)
    assert len(got) == len(v2), f"a new reader on B read {len(got)} bytes of {len(v2)}"
    assert got == v2
    assert os.stat(b).st_size == len(v2)  # and its open made the kernel ask again


def test_an_open_finds_the_file_another_mount_renamed_over_the_name(make_cluster, tmp_path):
    """Consistency rule 2 (docs/consistency.md): rename is atomic, so opening a name that always
    exists never fails.  B's kernel still maps "f" to the file that A's rename
    replaced (kept here without leases, for a 30 s entry timeout; with leases the same
    happens when the open races with the revocation: tests/version_fuzz.py, rename
    mode, got ENOENT in ~8% of its opens).  The mount answers the open of the gone
    inode with ESTALE, and the kernel looks the name up again and opens the new
    file."""
    c = _cluster_keeping_names(make_cluster, tmp_path)
    a, b = c.mounts
    _write_on(os.path.join(a, "f"), b"old")
    assert read_all(os.path.join(b, "f")) == b"old"  # B's kernel keeps f -> the old inode
    _write_on(os.path.join(a, "g"), b"new")
    os.rename(os.path.join(a, "g"), os.path.join(a, "f"))
    assert read_all(os.path.join(b, "f")) == b"new"


def _worker_used(c) -> float:
    return sum(daemon_metric(c, "worker", "curvine_worker_used_bytes", i)
               for i in range(c.n_workers))


def _blocks_of(c, path: str) -> list:
    from curvine.client.master.master_client import MasterClient
    m = MasterClient(c.master_addr, timeout=10.0, wait=10.0, security=c.security)
    try:
        ino = os.stat(path).st_ino
        return list(m.get_blocks(ino)[1])
    finally:
        m.close()


def test_a_write_into_a_hole_stores_what_was_written(make_cluster):
    """At the default settings (64 MiB blocks): one byte written into the middle of a
    1 GiB sparse file adds at most 1 MiB to the workers' usage and to st_blocks (not
    the 64 MiB block the hole spans); a sequential write over a hole still makes whole
    blocks; every byte reads back as written, from the other mount too."""
    c = make_cluster(workers=1, mounts=2)
    a, b = (os.path.join(m, "sparse") for m in c.mounts)
    with open(a, "wb") as f:
        f.truncate(1 << 30)
    assert os.stat(a).st_blocks == 0
    before = _worker_used(c)
    at = 500 * MIB + 12345
    with open(a, "r+b") as f:
        f.seek(at)
        f.write(b"x")
    added = _worker_used(c) - before
    assert 0 < added <= MIB, added
    assert os.stat(a).st_blocks * 512 <= MIB
    with open(b, "rb") as f:
        f.seek(at - 5000)
        assert f.read(10000) == bytes(5000) + b"x" + bytes(4999)
    # 130 MiB written in order over the hole from 600 MiB: blocks of 64 MiB, not 1 MiB
    data = os.urandom(MIB)
    with open(a, "r+b") as f:
        f.seek(600 * MIB)
        for _ in range(130):
            f.write(data)
    lengths = [blk.length for blk in _blocks_of(c, a) if blk.block_id]
    assert lengths.count(64 * MIB) == 2 and sum(lengths) <= 131 * MIB + MIB, lengths
    assert 130 * MIB <= os.stat(a).st_blocks * 512 <= 132 * MIB
    with open(b, "rb") as f:
        f.seek(600 * MIB + 77 * MIB)
        assert f.read(MIB) == data
        assert os.fstat(f.fileno()).st_size == 1 << 30


# --------------------------------------------------------------------------- behaviour

def test_directories(fs):
    a, b, _ = fs
    os.makedirs(os.path.join(a, "x", "y", "z"))
    names = {f"file{i:03d}" for i in range(150)}
    for n in names:
        _touch(os.path.join(a, "x", n), n.encode())
    assert set(os.listdir(os.path.join(b, "x"))) == names | {"y"}
    with os.scandir(os.path.join(b, "x")) as it:
        kinds = {e.name: (e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
                 for e in it}
    assert kinds["y"] == (True, False)
    assert all(kinds[n] == (False, True) for n in names)
    assert stat.S_ISDIR(os.stat(os.path.join(b, "x", "y")).st_mode)
    assert os.listdir(os.path.join(b, "x", "y")) == ["z"]
    assert os.listdir(os.path.join(b, "x", "y", "z")) == []
    with pytest.raises(OSError) as ei:
        os.rmdir(os.path.join(b, "x", "y"))
    assert ei.value.errno == errno.ENOTEMPTY
    os.rmdir(os.path.join(b, "x", "y", "z"))
    os.rmdir(os.path.join(b, "x", "y"))
    assert not os.path.exists(os.path.join(a, "x", "y"))
    for n in names:
        os.unlink(os.path.join(b, "x", n))
    assert os.listdir(os.path.join(a, "x")) == []
    os.rmdir(os.path.join(a, "x"))
    assert os.listdir(a) == []
    # a directory renamed keeps its content; a name in it is reachable under the new path
    os.makedirs(os.path.join(a, "p", "q"))
    _touch(os.path.join(a, "p", "q", "r"), b"deep")
    os.rename(os.path.join(a, "p"), os.path.join(a, "p2"))
    assert read_all(os.path.join(b, "p2", "q", "r")) == b"deep"
    assert not os.path.exists(os.path.join(b, "p"))


def test_rename_replaces_target(fs):
    a, b, _ = fs
    old, new = os.urandom(200_000), os.urandom(300_000)
    _write_on(os.path.join(a, "target"), old)
    assert read_all(os.path.join(b, "target")) == old  # B caches the old content
    _write_on(os.path.join(a, "source"), new)
    os.rename(os.path.join(a, "source"), os.path.join(a, "target"))
    assert not os.path.exists(os.path.join(b, "source"))
    assert os.stat(os.path.join(b, "target")).st_size == len(new)
    assert read_all(os.path.join(b, "target")) == new, "B reads the replaced file's old bytes"
    assert read_all(os.path.join(a, "target")) == new
    assert sorted(os.listdir(b)) == ["target"]
    # an empty directory may be replaced by a directory
    os.mkdir(os.path.join(a, "d1"))
    _touch(os.path.join(a, "d1", "inside"), b"1")
    os.mkdir(os.path.join(a, "d2"))
    os.rename(os.path.join(b, "d1"), os.path.join(b, "d2"))
    assert os.listdir(os.path.join(a, "d2")) == ["inside"]
    assert not os.path.exists(os.path.join(a, "d1"))
    # rename onto itself is a no-op
    os.rename(os.path.join(a, "target"), os.path.join(a, "target"))
    assert read_all(os.path.join(b, "target")) == new


def test_truncate(fs):
    a, b, local = fs
    data = random.Random(2).randbytes(BLOCK + MIB + 777)  # spans two blocks
    for root in (local, a):
        _write_on(os.path.join(root, "t"), data)
    other = {local: local, a: b}
    for size in (BLOCK + 100, 1000, 0, 3 * MIB + 5, BLOCK * 2 + 1):
        for root in (local, a):
            os.truncate(os.path.join(root, "t"), size)
        want = read_all(os.path.join(local, "t"))
        assert len(want) == size
        assert os.stat(os.path.join(a, "t")).st_size == size
        assert read_all(os.path.join(a, "t")) == want, f"after truncate to {size} on mount A"
        assert read_all(os.path.join(other[a], "t")) == want, f"after truncate to {size}, mount B"
    # ftruncate through an open handle, then writing past the new end
    for root in (local, a):
        with open(os.path.join(root, "t"), "r+b") as f:
            f.truncate(10)
            f.seek(20)
            f.write(b"tail")
    want = read_all(os.path.join(local, "t"))
    assert want == bytes(20) + b"tail"
    assert read_all(os.path.join(a, "t")) == want
    assert read_all(os.path.join(b, "t")) == want


def test_chmod_and_utime(fs):
    a, b, _ = fs
    p_a, p_b = os.path.join(a, "m"), os.path.join(b, "m")
    _touch(p_a, b"mode")
    os.chmod(p_a, 0o600)
    assert stat.S_IMODE(os.stat(p_a).st_mode) == 0o600
    assert stat.S_ISREG(os.stat(p_a).st_mode)
    os.chmod(p_b, 0o751)
    assert stat.S_IMODE(os.stat(p_b).st_mode) == 0o751
    deadline = time.monotonic() + 3.0  # the other mount may cache attributes (attr_timeout)
    while stat.S_IMODE(os.stat(p_a).st_mode) != 0o751 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stat.S_IMODE(os.stat(p_a).st_mode) == 0o751
    os.mkdir(os.path.join(a, "dir"))
    os.chmod(os.path.join(a, "dir"), 0o700)
    assert stat.S_IMODE(os.stat(os.path.join(a, "dir")).st_mode) == 0o700

    atime, mtime = 1_600_000_000_123_456_789, 1_500_000_000_987_654_321
    os.utime(p_a, ns=(atime, mtime))
    st = os.stat(p_a)
    assert (st.st_atime_ns, st.st_mtime_ns) == (atime, mtime)
    deadline = time.monotonic() + 3.0
    while os.stat(p_b).st_mtime_ns != mtime and time.monotonic() < deadline:
        time.sleep(0.1)
    assert os.stat(p_b).st_mtime_ns == mtime
    assert read_all(p_b) == b"mode"  # content untouched by setattr
    # utime(None) sets both to now
    before = time.time_ns()
    os.utime(p_a)
    st = os.stat(p_a)
    assert st.st_mtime_ns >= before - 2_000_000_000
    # a write moves mtime forward
    os.utime(p_a, ns=(atime, mtime))
    with open(p_a, "ab") as f:
        f.write(b"!")
    assert os.stat(p_a).st_mtime_ns > mtime


def test_statvfs(fs):
    a, _, _ = fs
    s = os.statvfs(a)
    assert s.f_bsize > 0 and s.f_frsize > 0
    assert s.f_blocks > 0, "no capacity reported"
    assert 0 <= s.f_bavail <= s.f_bfree <= s.f_blocks
    assert s.f_namemax == 255
    assert s.f_files >= s.f_ffree >= 0
    # free space is the workers' (a multi-TB value would mean a unit bug)
    local = os.statvfs(os.path.dirname(os.path.dirname(os.path.dirname(a))))
    assert s.f_blocks * s.f_frsize <= 2 * 1.1 * local.f_blocks * local.f_frsize + 1


def test_append(fs):
    a, b, local = fs
    for root in (local, a):
        p = os.path.join(root, "log")
        with open(p, "ab") as f:
            f.write(b"abc")
        with open(p, "ab") as f:
            f.write(b"def")
            f.write(b"x" * MIB)
        fd1 = os.open(p, os.O_WRONLY | os.O_APPEND)
        os.write(fd1, b"[1]")
        os.lseek(fd1, 0, os.SEEK_SET)  # O_APPEND ignores the offset
        os.write(fd1, b"[2]")
        os.close(fd1)
    want = read_all(os.path.join(local, "log"))
    assert want == b"abcdef" + b"x" * MIB + b"[1][2]"
    assert read_all(os.path.join(a, "log")) == want
    assert read_all(os.path.join(b, "log")) == want
    # appending on B to what A wrote
    with open(os.path.join(b, "log"), "ab") as f:
        f.write(b"from-b")
    assert read_all(os.path.join(a, "log")) == want + b"from-b"


def test_random_offset_writes(fs):
    a, b, local = fs
    rnd = random.Random(3)
    size = 2 * BLOCK + 3 * MIB
    base = rnd.randbytes(size)
    for root in (local, a):
        _write_on(os.path.join(root, "r"), base)
    ops = []
    for _ in range(120):
        off = rnd.randrange(0, size + 2 * MIB)  # some past EOF: a hole, then data
        n = rnd.choice((1, 17, 4096, 65536, MIB + 3, rnd.randrange(1, 300_000)))
        ops.append((off, rnd.randbytes(n)))
    seen = {}
    for root in (local, a):
        reads = seen[root] = []
        fd = os.open(os.path.join(root, "r"), os.O_RDWR)
        try:
            for i, (off, d) in enumerate(ops):
                assert os.pwrite(fd, d, off) == len(d)
                if i % 20 == 19:  # read-your-writes through the same handle
                    reads.append(os.pread(fd, 300_000, ops[i - 7][0]))
                    reads.append(os.pread(fd, 3 * MIB, BLOCK - MIB))
        finally:
            os.close(fd)
    assert seen[a] == seen[local], "reading through the writing handle"
    want = read_all(os.path.join(local, "r"))
    assert os.stat(os.path.join(a, "r")).st_size == len(want)
    got_a = read_all(os.path.join(a, "r"))
    got_b = read_all(os.path.join(b, "r"))
    assert sha256(got_a) == sha256(want), "mount A: content after random writes differs"
    assert sha256(got_b) == sha256(want), "mount B: content after random writes differs"
    # random-offset reads of the finished file
    with open(os.path.join(b, "r"), "rb") as f:
        for _ in range(50):
            off = rnd.randrange(0, len(want))
            n = rnd.randrange(1, 2 * MIB)
            f.seek(off)
            assert f.read(n) == want[off:off + n]
