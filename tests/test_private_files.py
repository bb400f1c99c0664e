"""Files on disk are private to the daemons' user (issue 12).

The worker's data dirs hold every cached byte; the master's meta dir (LMDB,
checkpoints, the block token key) and journal hold every name.  What is proven:

- a real cluster (`curvine local`, a short-circuit mount and one through the worker,
  files written, a checkpoint forced) leaves nothing under its BASE that uid 65534
  (``nobody``) can open for reading or list: no block, staging, LMDB, journal,
  checkpoint, key, token, uuid, config or log file.  Every file the daemons make in
  their dirs is 0600, every dir 0700;
- a data dir, meta dir or journal dir opened up to 0755 while its daemon was down is
  made 0700 again at start, with one warning line naming it (LMDB files too);
- a data dir or meta dir owned by another user is refused: exit 2, one line;
- the pieces on their own: BlockStore (own writes, adopted client files, an old
  0755 layout), the LMDB store and checkpoints.

How ``nobody`` is made to see only our modes: pytest's tmp dirs are 0700
(/tmp/pytest-of-root), so nobody could not even reach BASE, and `curvine local` makes
BASE itself 0700 (checked).  Both would hide what the daemons do.  So BASE is opened
up to 0755 for the check, and the child that drops to nobody gets a descriptor of
BASE opened by root and does every open relative to it (``dir_fd``, as in
test_permissions.py): the directories above BASE play no part, and the only
protection left is the modes of the daemons' own dirs and files.  On the code before
this change, data dirs were 0755 and block files 0644, LMDB and journal files 0644:
the first test lists them.

Needs root (the test switches users and chowns); the cluster test needs FUSE.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import subprocess
import sys
import zlib

import pytest

from cluster_util import wait_for
from curvine.common.blocks import CLIENT_STAGING_NAME, block_path
from curvine.devtools.local import ClusterError
from curvine.journal.checkpoint import write_checkpoint
from curvine.master.meta.store import Store
from curvine.worker.blockstore import BlockStore

NOBODY = 65534
KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture
def root_only():
    if os.geteuid() != 0:
        pytest.skip("needs root: switches to uid 65534 and chowns directories")


def _mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _cli(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "curvine.cli.main", *args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert r.returncode == 0, (args, r.returncode, r.stderr.decode())
    return r


def _walk(base: str, skip: set[str]) -> tuple[list[str], list[str]]:
    """(files, dirs) under ``base`` as paths relative to it, walked as root without
    following symlinks; the top-level names in ``skip`` are left out."""
    files, dirs = [], []
    for root, dnames, fnames in os.walk(base):
        rel = os.path.relpath(root, base)
        if rel == ".":
            dnames[:] = [d for d in dnames if d not in skip]
            fnames = [f for f in fnames if f not in skip]
        else:
            dirs.append(rel)
        for f in fnames:
            files.append(os.path.normpath(os.path.join(rel, f)))
    return sorted(files), sorted(dirs)


def _as_nobody(base_fd: int, files: list[str], dirs: list[str]) -> dict[str, list[str]]:
    """In a forked child that dropped to uid/gid NOBODY (no groups): which of ``files``
    it can open for reading and which of ``dirs`` it can list, relative to
    ``base_fd``.  A fork, not a new interpreter: the venv may not be readable to it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            got = {"readable": [], "listable": [], "uid": [f"{os.getuid()}:{os.getgid()}"]}
            for f in files:
                try:
                    fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=base_fd)
                except OSError as e:
                    if e.errno not in (errno.EACCES, errno.ENOENT, errno.ELOOP, errno.ENXIO):
                        got["readable"].append(f"{f} (open failed oddly: {e})")
                    continue
                os.close(fd)
                got["readable"].append(f)
            for d in dirs:
                try:
                    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY, dir_fd=base_fd)
                    try:
                        os.listdir(fd)
                    finally:
                        os.close(fd)
                except OSError:
                    continue
                got["listable"].append(d)
            os.write(w, json.dumps(got).encode())
            code = 0
        except BaseException as e:  # noqa: BLE001 - report, then exit the child
            os.write(w, json.dumps({"child error": repr(e)}).encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    result = json.loads(data or b"{}")
    assert os.waitstatus_to_exitcode(status) == 0, f"child failed: {result}"
    assert result["uid"] == [f"{NOBODY}:{NOBODY}"]
    return result


# ------------------------------------------------------------------ a real cluster
@pytest.mark.fuse
def test_nothing_under_base_is_readable_by_another_user(make_cluster, root_only):
    c = make_cluster(workers=1, mounts=2, short_circuit=[True, False])
    base = c.base
    m = ("--master", c.master_addr, "--conf", os.path.join(base, "conf", "master-0.toml"))
    # blocks written by the worker (mount 1: through WriteBlock) and adopted from a
    # client's staging file (mount 0: short-circuit)
    for i, mnt in enumerate(c.mounts):
        for j in range(3):
            with open(os.path.join(mnt, f"f{i}{j}"), "wb") as f:
                f.write(os.urandom(300 * KiB + j))
    _cli("fs", "mkdir", "-p", "/a/secret-name", *m)
    _cli("journal", "checkpoint", *m)
    open_writer = open(os.path.join(c.mounts[0], "being-written"), "wb")
    try:
        open_writer.write(os.urandom(2 * MiB))  # may sit in a client staging file
        open_writer.flush()

        base_mode = _mode(base)
        files, dirs = _walk(base, skip={"mnt"})
        # the files that matter are really there, so the checks below mean something
        blocks = [f for f in files if f.endswith(".blk")]
        assert len(blocks) >= 6, files
        for must in ("master/meta/lmdb/data.mdb", "master/meta/block_token.key",
                     "worker/0/data/block_token.key", "worker/0/data/worker.uuid", "token"):
            assert must in files, (must, files)
        assert any(f.startswith("master/meta/checkpoints/ckpt-") and f.endswith("data.mdb")
                   for f in files), files
        assert any(f.startswith("master/journal/seg-") for f in files), files
        assert any(f.startswith("logs/") for f in files), files

        # the daemons' own modes: every dir 0700, the files they make 0600 (journal
        # segments and client staging files in flight are made by code not covered
        # here; their 0700 dirs keep them private either way)
        # BASE/run is the workers' domain socket dir: 0755 by design (pods of other
        # uids connect to its 0666 sockets; the block token is the check, and it
        # holds nothing else: docs/security.md)
        assert _mode(os.path.join(base, "run")) == 0o755
        assert all(f.endswith(".sock") for f in os.listdir(os.path.join(base, "run")))
        wide_dirs = {d: oct(_mode(os.path.join(base, d))) for d in dirs
                     if _mode(os.path.join(base, d)) != 0o700 and d != "run"}
        secret = [f for f in files if f == "token"
                  or f.endswith((".blk", ".mdb", ".key", ".uuid", ".secret"))]
        wide_files = {f: oct(_mode(os.path.join(base, f))) for f in secret
                      if _mode(os.path.join(base, f)) & 0o077}

        # what another local user can do: BASE opened up, our modes are all that is left
        os.chmod(base, 0o755)
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
        try:
            got = _as_nobody(fd, files, dirs)
        finally:
            os.close(fd)
            os.chmod(base, base_mode)
    finally:
        open_writer.close()
    print(f"{len(files)} files, {len(dirs)} dirs under {base}; as nobody: {got}")
    # BASE's own files (cluster.json: ports and pids; the lock) are `curvine local`'s
    # bookkeeping, behind BASE's 0700; everything the daemons keep is in a 0700 dir
    bookkeeping = {"cluster.json", ".lock"}
    readable = [f for f in got["readable"] if f not in bookkeeping]
    problems = {
        f"readable by uid {NOBODY}": readable,
        f"listable by uid {NOBODY}": [d for d in got["listable"] if d != "run"],
        "BASE (curvine local makes it 0700)": oct(base_mode) if base_mode != 0o700 else "",
        "dirs not 0700": wide_dirs,
        "daemon files open to group/other": wide_files,
    }
    problems = {k: v for k, v in problems.items() if v}
    assert not problems, json.dumps(problems, indent=1)


def _warnings(log_path: str, since: int, needle: str) -> list[str]:
    with open(log_path, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return [line for line in text.splitlines() if " WARNING " in line and needle in line]


@pytest.mark.expect_log(r"WARNING curvine\.common\.private_files: \S+ \([\w.]+(?: \(LMDB\))?\) had mode [0-7]+(?: and \d+ more directories under \S+)?: made 0[67]00", r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # dirs and files opened up on purpose; the master is restarted (its worker waits meanwhile)
def test_opened_up_dirs_are_made_private_again_at_start(make_cluster, root_only):
    c = make_cluster(workers=1, mounts=0)
    data = os.path.join(c.base, "worker", "0", "data")
    meta = os.path.join(c.base, "master", "meta")
    journal = os.path.join(c.base, "master", "journal")
    m = ("--master", c.master_addr, "--conf", os.path.join(c.base, "conf", "master-0.toml"))
    r = subprocess.run([sys.executable, "-m", "curvine.cli.main", "fs", "put", "-", "/f", *m],
                       input=b"x" * 5000, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=120)
    assert r.returncode == 0, r.stderr.decode()

    # the worker, stopped, finds its data dir as an old version or a restore left it
    c.kill("worker", 0, sig=15)
    opened = {data: 0o755, os.path.join(data, "blocks"): 0o755,
              os.path.join(data, "blocks", "3a"): 0o775, os.path.join(data, "staging"): 0o777}
    for p, mode in opened.items():
        os.chmod(p, mode)
    wlog = c.log_path("worker", 0)
    since = os.path.getsize(wlog)
    c.start("worker", 0)
    for p in opened:
        assert _mode(p) == 0o700, (p, oct(_mode(p)))
    lines = _warnings(wlog, since, data)
    assert len(lines) == 1, lines
    assert f"{data} (worker.data_dirs) had mode 755 and 3 more directories" in lines[0], lines

    # the master likewise: meta dir, journal dir, LMDB's files
    c.kill("master", 0, sig=15)
    lmdb_file = os.path.join(meta, "lmdb", "data.mdb")
    for p, mode in ((meta, 0o755), (journal, 0o750), (os.path.join(meta, "lmdb"), 0o755),
                    (lmdb_file, 0o644)):
        os.chmod(p, mode)
    mlog = c.log_path("master", 0)
    since = os.path.getsize(mlog)
    c.start("master", 0)
    for p, mode in ((meta, 0o700), (journal, 0o700), (os.path.join(meta, "lmdb"), 0o700),
                    (lmdb_file, 0o600)):
        assert _mode(p) == mode, (p, oct(_mode(p)))
    assert len(_warnings(mlog, since, f"{meta} (master.meta_dir) had mode 755 and 1 more")) == 1
    assert len(_warnings(mlog, since, f"{journal} (journal.dir) had mode 750")) == 1
    assert len(_warnings(mlog, since, f"{lmdb_file} (master.meta_dir (LMDB)) had mode 644")) == 1
    # and the cluster still serves the file written before
    got = subprocess.run([sys.executable, "-m", "curvine.cli.main", "fs", "get", "-q", "/f", "-", *m],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert got.returncode == 0 and got.stdout == b"x" * 5000, got.stderr.decode()


@pytest.mark.expect_log(r"curvine-worker\[\d+\] ERROR __main__: \S+ \(worker\.data_dirs\) is owned by uid 65534, not by this daemon", r"master\[\d+\] CRITICAL curvine\.master: cannot start: \S+ \(master\.meta_dir\) is owned by uid 65534, not by this daemon", r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # dirs chowned to nobody on purpose: the daemon refuses to start (and the worker waits for the master meanwhile)
def test_a_dir_owned_by_another_user_is_refused(make_cluster, root_only):
    c = make_cluster(workers=1, mounts=0)
    data = os.path.join(c.base, "worker", "0", "data")
    meta = os.path.join(c.base, "master", "meta")
    for role, path, what in (("worker", data, "worker.data_dirs"),
                             ("master", meta, "master.meta_dir")):
        c.kill(role, 0, sig=15)
        os.chown(path, NOBODY, NOBODY)
        try:
            with pytest.raises(ClusterError, match="exited with code 2"):
                c.start(role, 0, timeout=30)
            with open(c.log_path(role, 0), "rb") as f:
                text = f.read().decode(errors="replace")
            refusal = [line for line in text.splitlines() if "is owned by uid" in line]
            assert len(refusal) == 1, refusal
            assert f"{path} ({what}) is owned by uid {NOBODY}, not by this daemon's user " \
                   f"(uid 0)" in refusal[0], refusal
            assert "Traceback" not in text
            assert _mode(path) == 0o700  # untouched: nothing was tightened or written
        finally:
            os.chown(path, 0, 0)
        c.start(role, 0)  # its own again: starts
    wait_for(lambda: all(p["alive"] for p in c.status()), what="all daemons up")


# ------------------------------------------------------------------ the pieces
def test_block_store_makes_private_dirs_and_files(tmp_path, caplog):
    data = tmp_path / "data"
    store = BlockStore([str(data)], capacity=64 * MiB)
    dirs = [str(data), str(data / "staging"), str(data / "blocks")] + \
        [str(data / "blocks" / f"{i:02x}") for i in range(256)]
    assert {p: _mode(p) for p in dirs if _mode(p) != 0o700} == {}

    with store.begin_write(7, 5) as w:  # the worker's own write
        assert _mode(w.staging_path) == 0o600
        w.append(b"hello")
        w.finish(zlib.crc32(b"hello"))
    assert _mode(block_path(str(data), 7)) == 0o600

    # a client's staging file, made 0644 (as clients did): adopted as 0600
    path = str(data / "staging" / f"{8:016x}.cabcdef0123456789.tmp")
    assert CLIENT_STAGING_NAME.fullmatch(os.path.basename(path))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"world")
    os.close(fd)
    os.chmod(path, 0o644)
    store.adopt(8, path, 5, zlib.crc32(b"world"))
    assert _mode(block_path(str(data), 8)) == 0o600

    # an old layout, opened up: made 0700 at the next start, with one warning
    for p in (str(data), str(data / "blocks" / "07"), str(data / "staging")):
        os.chmod(p, 0o755)
    with caplog.at_level(logging.WARNING, logger="curvine.common.private_files"):
        store2 = BlockStore([str(data)], capacity=64 * MiB)
    assert {p: _mode(p) for p in dirs if _mode(p) != 0o700} == {}
    warned = [r.getMessage() for r in caplog.records if r.name == "curvine.common.private_files"]
    assert warned == [f"{data} (worker.data_dirs) had mode 755 and 2 more directories under "
                      f"{data}: made 0700 (other local users could read what is stored "
                      f"there until now)"], warned
    assert 7 in store2 and 8 in store2  # blocks are kept


def test_block_store_refuses_another_users_data_dir(tmp_path, root_only):
    from curvine.common import private_files  # (here: the module is new)
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    os.chown(data, NOBODY, NOBODY)
    with pytest.raises(private_files.NotOwnedError, match=f"owned by uid {NOBODY}"):
        BlockStore([str(data)], capacity=MiB)
    assert not (data / "blocks").exists()  # refused before anything was made in it


def test_lmdb_store_and_checkpoints_are_private(tmp_path):
    lmdb_dir = tmp_path / "meta" / "lmdb"
    store = Store(str(lmdb_dir))
    try:
        assert _mode(str(lmdb_dir)) == 0o700
        assert {n: _mode(str(lmdb_dir / n)) for n in os.listdir(lmdb_dir)} == \
            {"data.mdb": 0o600, "lock.mdb": 0o600}
        root = tmp_path / "meta" / "checkpoints"
        path = write_checkpoint(store.env, str(root), 1)
        assert _mode(str(root)) == 0o700 and _mode(path) == 0o700
        assert {n: _mode(os.path.join(path, n)) for n in os.listdir(path)} == {"data.mdb": 0o600}
    finally:
        store.close()
    # files an older version made 0644 are made 0600 when the store opens
    os.chmod(lmdb_dir / "data.mdb", 0o644)
    os.chmod(lmdb_dir, 0o755)
    Store(str(lmdb_dir)).close()
    assert _mode(str(lmdb_dir / "data.mdb")) == 0o600 and _mode(str(lmdb_dir)) == 0o700


def test_private_dir_helper(tmp_path, caplog):
    from curvine.common import private_files
    top = tmp_path / "top"
    assert private_files.private_dir(str(top), "x", ("a", "a/b")) == []
    assert all(_mode(str(p)) == 0o700 for p in (top, top / "a", top / "a" / "b"))
    (top / "a" / "b" / "c").mkdir(mode=0o755)
    os.chmod(top / "a" / "b" / "c", 0o755)  # found by listing, not named
    with caplog.at_level(logging.WARNING, logger="curvine.common.private_files"):
        changed = private_files.private_dir(str(top), "x", scan_depth=3, create=False)
    assert changed == [(str(top / "a" / "b" / "c"), 0o755)]
    assert _mode(str(top / "a" / "b" / "c")) == 0o700
    assert len(caplog.records) == 1
    # not listed deep enough: not looked at (so a block dir is never walked)
    os.chmod(top / "a" / "b" / "c", 0o755)
    assert private_files.private_dir(str(top), "x", scan_depth=2, create=False) == []
    (top / "file").write_text("")
    with pytest.raises(Exception, match="is not a directory"):
        private_files.private_dir(str(top / "file"), "x")
