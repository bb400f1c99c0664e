"""Short-circuit trusts only the node, and readers verify (issue 12).

Real master, worker and FUSE processes of ``curvine local`` on loopback, and the
client library in this process:

- a mount or client whose own configuration names data dirs never opens a block or
  staging file outside them, whatever a worker reports (a dir not in the list, a
  symlinked alias of a configured dir);
- a symlink planted in a worker's data dir (at a block file, at ``blocks/NN``) is
  never followed: readers get the other replica, or EIO with one replica, never the
  bytes it points at;
- a block overwritten on disk behind the worker's back (same length) is never served:
  short-circuit and remote reads, whole files and a pread in the middle, through the
  mount and the library, get the other replica or EIO;
- staging files are created 0600 and O_EXCL, never through a symlinked staging dir,
  and given to the staging dir's owner when the client is root.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat

import pytest

from cluster_util import daemon_metric
from fs_helpers import wait_until
from curvine.client.blocks import block_client
from curvine.client.files.fs import CurvineFS
from curvine.client.files.metrics import (CLIENT_READ_REMOTE, CLIENT_READ_SHORT_CIRCUIT,
                                          CLIENT_WRITTEN_SHORT_CIRCUIT)
from curvine.common.blocks import block_relpath
from curvine.common.config import Config
from curvine.common.errors import CurvineError, ErrorKind, to_errno

MIB = 1 << 20
SIZE = 2 * MIB + 123  # one block
MID = MIB + 7  # a pread in the middle of it


def _worker_dirs(c) -> list[str]:
    return [c._path("worker", str(i), "data") for i in range(c.n_workers)]


def _fs(c, short_circuit: bool = True, dirs: list[str] | None = None) -> CurvineFS:
    """A client library instance with its own configuration: short-circuit dirs
    ``dirs`` (default: the cluster's worker dirs, as `curvine local` gives mounts)."""
    cfg = Config()
    cfg.client = dataclasses.replace(
        cfg.client, short_circuit=short_circuit,
        short_circuit_dirs=list(_worker_dirs(c) if dirs is None else dirs))
    cfg.security = dataclasses.replace(cfg.security, token_file=c.token_file)
    return CurvineFS(c.master_addr, cfg=cfg)


def _mount_bytes(c, metric: str, path: str) -> float:
    return daemon_metric(c, "fuse", metric, path=path)


def _copies(fs: CurvineFS, path: str) -> list[str]:
    """The block files of ``path``'s one block, in the order of its locations (the
    order readers try them in: every worker is on this host)."""
    _, blocks, workers = fs.master.get_blocks(fs.resolve(path).ino)
    assert len(blocks) == 1
    b = blocks[0]
    return [os.path.join(workers[w].data_dirs[0], block_relpath(b.block_id))
            for w in b.worker_ids]


def _data(tag: int) -> bytes:
    return bytes((tag * 7 + i * 13) % 251 for i in range(256)) * (SIZE // 256) + \
        bytes(SIZE % 256)


def _secret(tmp_path, name: str = "secret") -> tuple[str, bytes]:
    """A root-only file of the block's length (what an attacker's symlink points at)."""
    p = tmp_path / name
    data = b"SECRET-ROOT-ONLY" * (SIZE // 16) + b"S" * (SIZE % 16)
    p.write_bytes(data)
    os.chmod(p, 0o600)
    return str(p), data


def _plant_file_symlink(block_file: str, target: str) -> None:
    os.unlink(block_file)
    os.symlink(target, block_file)


def _plant_dir_symlink(block_file: str, tmp_path, secret: bytes, name: str) -> None:
    """blocks/NN becomes a symlink to a dir holding a file of the block's name."""
    nn = os.path.dirname(block_file)
    os.rename(nn, nn + ".moved")
    evil = tmp_path / name
    evil.mkdir()
    (evil / os.path.basename(block_file)).write_bytes(secret)
    os.symlink(str(evil), nn)


def _overwrite(block_file: str) -> None:
    """Same length, other bytes, behind the worker's back."""
    with open(block_file, "r+b") as f:
        f.seek(MIB)
        f.write(b"\xee" * 4096)
        f.seek(0)
        f.write(b"\xee" * 100)


def _read_mount(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _pread_mount(path: str, n: int, off: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, n, off)
    finally:
        os.close(fd)


def _read_lib(fs: CurvineFS, path: str, partial: bool) -> bytes:
    r = fs.open_reader(path)
    try:
        return bytes(r.read(MID, 4096) if partial else r.read(0, r.size))
    finally:
        r.close()


def _warnings(c, needle: str) -> int:
    with open(c.log_path("fuse", 0), errors="replace") as f:
        return sum(1 for line in f if " WARNING " in line and needle in line)


# ----------------------------------------------------------------- which dirs are trusted

def test_mount_never_opens_dirs_its_config_does_not_name(make_cluster, tmp_path):
    """The mount's config names another dir (client.short_circuit_dirs): it reads the
    worker's blocks remotely and writes without staging files, although the worker
    (the only one, on this host) reports its real data dir.  Old code: the mount used
    the reported dir (short-circuit bytes > 0, block files open)."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "staging").mkdir(parents=True)
    (elsewhere / "blocks").mkdir()
    conf = tmp_path / "c.toml"
    conf.write_text(f'[client]\nshort_circuit_dirs = ["{elsewhere}"]\n')
    c = make_cluster(workers=1, mounts=1, conf=str(conf))
    fs = _fs(c, short_circuit=False)
    with fs:
        fs.mkdir("/t")
        data = _data(1)
        fs.write_bytes("/t/a", data)
    mnt = c.mounts[0]
    pid = next(s["pid"] for s in c.status() if (s["role"], s["index"]) == ("fuse", 0))
    worker_dir = _worker_dirs(c)[0] + os.sep
    with open(os.path.join(mnt, "t", "a"), "rb") as f:
        assert f.read(MIB) == data[:MIB]
        held = [os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")]
        assert f.read() == data[MIB:]
    assert not [t for t in held if t.startswith(worker_dir)], held
    with open(os.path.join(mnt, "t", "b"), "wb") as f:
        f.write(data)
    assert _read_lib(_fs(c, short_circuit=False), "/t/b", partial=False) == data
    assert _mount_bytes(c, "curvine_client_read_bytes_total", "short_circuit") == 0
    assert _mount_bytes(c, "curvine_client_read_bytes_total", "remote") >= SIZE
    assert _mount_bytes(c, "curvine_client_written_bytes_total", "short_circuit") == 0
    assert _mount_bytes(c, "curvine_client_written_bytes_total", "remote") >= SIZE
    assert os.listdir(elsewhere / "staging") == [] and os.listdir(elsewhere / "blocks") == []


def test_reported_dirs_are_matched_against_the_local_config(make_cluster, tmp_path,
                                                            monkeypatch):
    """A real worker's blocks, read by clients whose configs differ: the configured dir
    itself, or a symlinked alias of it, is trusted (the alias is resolved locally); a
    worker reporting a symlinked alias of the configured dir, or a dir not in the
    list, is not (remote reads, no staging file there).  Old code: every case read
    short-circuit."""
    c = make_cluster(workers=1, mounts=0)
    real = _worker_dirs(c)[0]
    alias = tmp_path / "alias"
    os.symlink(real, alias)
    data = _data(2)
    with _fs(c, short_circuit=False) as fs:
        fs.write_bytes("/f", data)

    def reads(fs: CurvineFS) -> tuple[float, float]:
        sc0, rm0 = CLIENT_READ_SHORT_CIRCUIT._value.get(), CLIENT_READ_REMOTE._value.get()
        assert _read_lib(fs, "/f", partial=False) == data
        assert _read_lib(fs, "/f", partial=True) == data[MID:MID + 4096]
        return (CLIENT_READ_SHORT_CIRCUIT._value.get() - sc0,
                CLIENT_READ_REMOTE._value.get() - rm0)

    with _fs(c, dirs=[real]) as fs:
        assert reads(fs) == (SIZE + 4096, 0)  # control: trusted, short-circuit
    with _fs(c, dirs=[str(alias)]) as fs:
        assert reads(fs) == (SIZE + 4096, 0)  # a configured alias resolves to it
    with _fs(c, dirs=[str(tmp_path)]) as fs:
        assert reads(fs) == (0, SIZE + 4096)  # not in the list
        w0 = CLIENT_WRITTEN_SHORT_CIRCUIT._value.get()
        fs.write_bytes("/g", data)
        assert CLIENT_WRITTEN_SHORT_CIRCUIT._value.get() == w0
    with _fs(c, dirs=[real]) as fs:
        # the worker reports a symlinked alias of the configured dir: not that dir
        get_blocks = fs.master.get_blocks

        def aliased(*a, **k):
            inode, blocks, workers = get_blocks(*a, **k)
            for w in workers.values():
                del w.data_dirs[:]
                w.data_dirs.append(str(alias))
            return inode, blocks, workers

        monkeypatch.setattr(fs.master, "get_blocks", aliased)
        assert reads(fs) == (0, SIZE + 4096)


# ----------------------------------------------------- tampered copies: the other replica

@pytest.mark.expect_log(r"WARNING curvine\.client\.files\.file_reader: block [0-9a-f]+: the local block file of worker \d+ \S+ is not intact \(\'/[^\']*\.blk\': (Too many levels of symbolic links|Not a directory) \(a symlink or a file in the way\)\)", r"WARNING curvine\.client\.files\.file_reader: block [0-9a-f]+: the local block file of worker \d+ \S+ is not intact \(crc32 [0-9a-f]{8}, recorded [0-9a-f]{8}\)", r"WARNING curvine\.worker\.blockstore: block [0-9a-f]+: the copy here is not intact", r"WARNING curvine\.master\.cluster\.replication: worker \d+ found \d+ copies not intact", r"WARNING curvine\.worker\.blockstore: cannot remove block [0-9a-f]+ under \S+: (Too many levels of symbolic links|Not a directory)")  # block files tampered with on purpose (their workers find and remove them)
def test_tampered_copies_fail_over_to_the_other_replica(make_cluster, tmp_path):
    """replicas=2: the copy read first is replaced by a symlink to a root-only file,
    its blocks/NN dir by a symlink, or overwritten in place (same length).  The mount
    (short-circuit), and the library short-circuit and remote, whole file and a pread
    in the middle, all return the file's bytes.  Old code: the secret's or the
    overwritten bytes (no O_NOFOLLOW, no crc32 check on reads)."""
    c = make_cluster(workers=2, mounts=1, replicas=2)
    mnt = c.mounts[0]
    secret_path, secret = _secret(tmp_path)
    cases = {"link": 10, "dirlink": 20, "overwrite": 30}
    names = {}
    with _fs(c) as fs:
        fs.mkdir("/t")
        for case, tag in cases.items():
            for kind in ("whole", "part"):
                name = f"/t/{case}-{kind}"
                fs.write_bytes(name, _data(tag))
                names[name] = _data(tag)
                copies = _copies(fs, name)
                assert len(copies) == 2
                if case == "link":
                    _plant_file_symlink(copies[0], secret_path)
                elif case == "dirlink":
                    _plant_dir_symlink(copies[0], tmp_path, secret, f"evil-{kind}")
                else:
                    _overwrite(copies[0])

    for name, data in names.items():
        path = mnt + name
        if name.endswith("whole"):
            got = _read_mount(path)
            assert got == data, f"{name}: the mount returned other bytes"
        else:
            got = _pread_mount(path, 4096, MID)
            assert got == data[MID:MID + 4096], f"{name}: the mount returned other bytes"
        for short_circuit in (True, False):
            with _fs(c, short_circuit=short_circuit) as fs:
                assert _read_lib(fs, name, partial=False) == data, (name, short_circuit)
                assert _read_lib(fs, name, partial=True) == data[MID:MID + 4096]
    assert _mount_bytes(c, "curvine_client_read_bytes_total", "short_circuit") >= 3 * SIZE
    assert _warnings(c, "is not intact") >= 1


# ------------------------------------------------------------ tampered copies: EIO

@pytest.mark.expect_log(r"WARNING curvine\.client\.files\.file_reader: block [0-9a-f]+: the local block file of worker \d+ \S+ is not intact \(\'/[^\']*\.blk\': (Too many levels of symbolic links|Not a directory) \(a symlink or a file in the way\)\)", r"WARNING curvine\.client\.files\.file_reader: block [0-9a-f]+: the local block file of worker \d+ \S+ is not intact \(crc32 [0-9a-f]{8}, recorded [0-9a-f]{8}\)", r"WARNING curvine\.fuse_client\.operations: read\([\d, ]+\): block [0-9a-f]+: no intact replica \(1 did not match", r"WARNING curvine\.worker\.blockstore: block [0-9a-f]+: the copy here is not intact", r"WARNING curvine\.master\.cluster\.replication: worker \d+ found \d+ copies not intact", r"WARNING curvine\.worker\.blockstore: cannot remove block [0-9a-f]+ under \S+: (Too many levels of symbolic links|Not a directory)")  # the only copies tampered with on purpose (their workers find and remove them)
def test_tampered_only_copy_is_eio_never_other_bytes(make_cluster, tmp_path):
    """One replica: the same tampering makes every read fail cleanly, never with other
    bytes: EIO at the mount (in the library ErrorKind.CHECKSUM, or IO where the worker
    itself refused a symlinked block file) while the copy is there, logged once per
    copy; the copy is then found not intact by its worker and removed, and the master
    removes the file (no copy left): later reads are a clean miss (ENOENT, or ESTALE
    for a handle that was open), and the name goes.  Other files are not affected.
    Old code: the secret's or overwritten bytes."""
    c = make_cluster(workers=1, mounts=1, replicas=1)
    mnt = c.mounts[0]
    secret_path, secret = _secret(tmp_path)
    blocks = {}
    with _fs(c) as fs:
        fs.mkdir("/t")
        fs.write_bytes("/t/intact", _data(9))
        for i, case in enumerate(("link", "dirlink", "overwrite")):
            for kind in ("whole", "part"):
                name = f"/t/{case}-{kind}"
                fs.write_bytes(name, _data(i))
                (copy,) = _copies(fs, name)
                blocks[name] = os.path.basename(copy)[:16]
                if case == "link":
                    _plant_file_symlink(copy, secret_path)
                elif case == "dirlink":
                    _plant_dir_symlink(copy, tmp_path, secret, f"evil-{kind}")
                else:
                    _overwrite(copy)

    for name in blocks:
        path = mnt + name
        with pytest.raises(OSError) as e:
            if name.endswith("whole"):
                _read_mount(path)
            else:
                _pread_mount(path, 4096, MID)
        assert e.value.errno == errno.EIO, (name, e.value)  # the first read: the copy is there
        for short_circuit in (True, False):
            with _fs(c, short_circuit=short_circuit) as fs:
                for partial in (False, True):
                    with pytest.raises(CurvineError) as e:
                        _read_lib(fs, name, partial)
                    # CHECKSUM (a copy read and refused), IO (the worker refused its
                    # symlinked file), or a miss once the copy (and so the file) is gone
                    assert e.value.kind in (ErrorKind.CHECKSUM, ErrorKind.IO,
                                            ErrorKind.NOT_FOUND, ErrorKind.STALE), (
                        name, short_circuit, e.value)
    assert _read_mount(mnt + "/t/intact") == _data(9)
    # every tampered copy is found and removed, and with it the file: the name goes
    wait_until(lambda: not any(os.path.exists(mnt + name) for name in blocks), 30,
               "the files whose only copy was not intact to be removed")
    assert _read_mount(mnt + "/t/intact") == _data(9)
    for name, bid in blocks.items():
        # the mount logged the bad copy once (its reader, every read after)
        assert _warnings(c, f"block {bid}: the local block file") == 1, name


# ------------------------------------------------------------------------ staging files

def test_staging_files_are_private_exclusive_and_not_followed(make_cluster, tmp_path,
                                                             monkeypatch):
    """Against a real worker's data dir: client staging files (named and O_TMPFILE)
    are mode 0600 whatever the umask; a symlink at the staging name is not followed
    (O_EXCL|O_NOFOLLOW); a symlinked staging dir is not used; a root client gives its
    files to the staging dir's owner.  Old code: 0644 files, and files created through
    the symlinked staging dir."""
    c = make_cluster(workers=1, mounts=0)
    with _fs(c) as fs:
        info = fs.master.statfs().workers[0]
    real = _worker_dirs(c)[0]
    staging = os.path.join(real, "staging")
    bid = 0x7777

    old_umask = os.umask(0o022)
    try:
        fd, path = block_client.create_local_staging(info, bid)
        st = os.fstat(fd)
        os.close(fd)
        os.unlink(path)
        assert os.path.dirname(path) == staging and stat.S_IMODE(st.st_mode) == 0o600
        fd, _ = block_client.create_local_tmpfile(info)
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
        os.close(fd)
    finally:
        os.umask(old_umask)

    # A symlink planted at the name the client will use is not followed.
    victim = tmp_path / "victim"
    victim.write_bytes(b"victim")
    fixed = os.path.join(staging, f"{bid:016x}.c{'0' * 16}.tmp")
    os.symlink(victim, fixed)
    monkeypatch.setattr(block_client, "client_staging_path",
                        lambda d, b: os.path.join(d, "staging", f"{b:016x}.c{'0' * 16}.tmp"))
    assert block_client.create_local_staging(info, bid) is None
    assert victim.read_bytes() == b"victim" and os.path.islink(fixed)
    os.unlink(fixed)
    monkeypatch.undo()

    # A staging dir replaced by a symlink (to a root-only dir) is not used.
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir(mode=0o700)
    os.rename(staging, staging + ".real")
    os.symlink(victim_dir, staging)
    try:
        assert block_client.create_local_staging(info, bid) is None
        assert block_client.create_local_tmpfile(info) is None
        assert os.listdir(victim_dir) == []
    finally:
        os.unlink(staging)
        os.rename(staging + ".real", staging)

    # Root, a staging dir of another user (the worker's): the file is that user's.
    if os.geteuid() == 0:
        os.chown(staging, 65534, 65534)
        try:
            fd, path = block_client.create_local_staging(info, bid)
            st = os.fstat(fd)
            os.close(fd)
            os.unlink(path)
            assert (st.st_uid, st.st_gid) == (65534, 65534)
            fd, _ = block_client.create_local_tmpfile(info)
            st = os.fstat(fd)
            os.close(fd)
            assert (st.st_uid, st.st_gid) == (65534, 65534)
        finally:
            os.chown(staging, 0, 0)
