"""Random pread/pwrite/ftruncate/mmap/fallocate/fsync/reopen on one file of a mount,
checked after every operation against an in-memory model (tests/random_io_checker.py).

Each profile runs on a plain local directory first (it must pass there: the checker's
model is what a local file system does) and then on mount 0 of a real cluster (2
workers, block size 1 MiB, so the operations cross blocks); the page cache is dropped
every 500 operations when we are root.  The last test writes with the checker on
mount 0, closes, and reads the final bytes through mount 1 (close-to-open).

The checker runs in a child process (an mmap access answered with an I/O error is a
SIGBUS, which would kill pytest) and each run is bounded in time.
"""

from __future__ import annotations

import os

import pytest

from cluster_util import module_cluster, tracebacks_in_logs
from fs_helpers import MIB, first_difference, read_all, sha256
from random_io_checker import PROFILES, run_in_subprocess

BLOCK = MIB
OPS = 10_000          # per profile and file system
SIZE_MAX = 8 * MIB    # the file never grows past this
LOCAL_TIMEOUT = 60.0  # seconds per run on a local dir (about 5 s here)
# seconds per run on the mount (35-125 s on a busy 2-CPU box): a bound, under
# pytest-timeout's 300 s per test
MOUNT_TIMEOUT = 240.0
C2O_OPS = 3_000       # the close-to-open test: its point is the other mount
DROP = os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK)


@pytest.fixture(scope="module")
def rio_cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, "rio", BLOCK // MIB)


@pytest.fixture
def mount_dirs(rio_cluster, request):
    """(dir on mount 0, the same dir through mount 1); fails the test if a daemon
    logged a traceback while it ran."""
    name = request.node.name.replace("[", "-").replace("]", "")
    a = os.path.join(rio_cluster.mounts[0], name)
    os.mkdir(a)
    yield a, os.path.join(rio_cluster.mounts[1], name)
    found = tracebacks_in_logs(rio_cluster)
    if found:
        pytest.fail("a daemon logged a traceback:\n" + "\n\n".join(found), pytrace=False)


def _run(path_dir: str, profile: str, timeout: float, seed: int = 0, dump: str | None = None,
         ops: int = OPS):
    rep, problem = run_in_subprocess(path_dir, ops=ops, seed=seed, profile=profile,
                                     drop_caches=DROP, size_max=SIZE_MAX, timeout=timeout,
                                     dump=dump)
    if rep is None:
        pytest.fail(f"random I/O on {path_dir} ({profile}): {problem}", pytrace=False)
    print(rep.summary())
    return rep


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_local_dir(profile, tmp_path):
    """The checker itself against a local file system: its model is right."""
    rep = _run(str(tmp_path), profile, LOCAL_TIMEOUT)
    assert rep.unsupported == {}, "a local file system supports every operation"


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_mount(profile, mount_dirs):
    a, _ = mount_dirs
    rep = _run(a, profile, MOUNT_TIMEOUT)
    if rep.unsupported:
        print(f"the mount refused: {rep.unsupported}")


def test_close_to_open_through_other_mount(mount_dirs, tmp_path):
    """What the checker left on mount 0 (its last step is close) is what mount 1
    reads: size and every byte."""
    a, b = mount_dirs
    dump = str(tmp_path / "final")
    rep = _run(a, "mixed", MOUNT_TIMEOUT, seed=7, dump=dump, ops=C2O_OPS)
    want = read_all(dump)
    assert len(want) == rep.size and sha256(want) == rep.sha256
    other = os.path.join(b, os.path.basename(rep.path))
    assert os.stat(other).st_size == rep.size, "mount 1 sees another size"
    got = read_all(other)
    if got != want:
        off = first_difference(got, want)
        pytest.fail(f"mount 1 reads {len(got)} bytes, mount 0 closed {len(want)}; first "
                    f"difference at offset {off} (block {off // BLOCK})", pytrace=False)
