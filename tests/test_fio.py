"""fio writes through one mount with checksummed blocks and verifies them through both.

Each job writes a file on mount 0 (``verify=crc32c``: every block carries a header
with its offset and a crc32c of its bytes), reads it back and verifies it through the
same write handle (``do_verify``), then a read job verifies every block of the file
through mount 1, after close published it.  A control run checks that verification
really reads the bytes: a copy with one flipped byte must fail.

fio is installed by scripts/setup.sh (Debian package ``fio``); without it these tests
are skipped.  The mount supports neither fallocate nor shared writable mmap, so jobs
use ``fallocate=none`` and the ``psync`` engine (pread/pwrite).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from fs_helpers import MIB

FIO = shutil.which("fio")
pytestmark = pytest.mark.skipif(FIO is None, reason="fio is not installed "
                                                    "(scripts/setup.sh installs it)")

COMMON = ["--ioengine=psync", "--fallocate=none", "--verify=crc32c", "--verify_state_save=0",
          "--output-format=json"]


def _fio(name: str, path: str, rw: str, bs: str, size: int, *extra: str,
         timeout: float = 600) -> tuple[subprocess.CompletedProcess, dict | None]:
    argv = [FIO, f"--name={name}", f"--filename={path}", f"--rw={rw}", f"--bs={bs}",
            f"--size={size}", *COMMON, *extra]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    try:
        report = json.loads(r.stdout[r.stdout.index("{"):])
    except ValueError:
        report = None
    return r, report


def _job(report: dict | None, r: subprocess.CompletedProcess, what: str) -> dict:
    assert r.returncode == 0, f"{what}: fio exited {r.returncode}:\n{r.stderr[-3000:]}"
    assert report is not None, f"{what}: no JSON report from fio:\n{r.stdout[-2000:]}"
    job = report["jobs"][0]
    assert job["error"] == 0, f"{what}: fio job error {job['error']}:\n{r.stderr[-3000:]}"
    return job


def _mbs(side: dict) -> float:
    return side["bw_bytes"] / 1e6


def _write_and_verify(c, name: str, rw: str, bs: str, size: int) -> None:
    a, b = (os.path.join(m, "fio") for m in c.mounts)
    os.makedirs(a, exist_ok=True)
    r, report = _fio(name, os.path.join(a, name), rw, bs, size, "--do_verify=1")
    job = _job(report, r, f"{name} ({rw} bs={bs}) on mount 0")
    assert job["write"]["io_bytes"] == size, f"{name}: wrote {job['write']['io_bytes']} bytes"
    assert job["read"]["io_bytes"] == size, \
        f"{name}: verified {job['read']['io_bytes']} of {size} bytes through the write handle"
    assert os.path.getsize(os.path.join(b, name)) == size
    # every block again, through the other mount's readers (the published version)
    r2, report2 = _fio(name + "-verify", os.path.join(b, name), "read", bs, size)
    vjob = _job(report2, r2, f"{name}: verify on mount 1")
    assert vjob["read"]["io_bytes"] == size, \
        f"{name}: verified {vjob['read']['io_bytes']} of {size} bytes on mount 1"
    print(f"fio {name}: {rw} bs={bs} {size // MIB} MiB: write {_mbs(job['write']):.1f} MB/s, "
          f"verify via the write handle {_mbs(job['read']):.1f} MB/s, verify via mount 1 "
          f"{_mbs(vjob['read']):.1f} MB/s; verify errors 0")


def test_fio_sequential_and_random_writes_verify(make_cluster):
    """Sequential 1 MiB writes (64 MiB) and random 64 KiB writes (16 MiB) into one file
    each: fio exits 0 with no verify error, through the writing mount and the other."""
    c = make_cluster(workers=1, mounts=2)
    _write_and_verify(c, "seq", "write", "1M", 64 * MIB)
    _write_and_verify(c, "rand", "randwrite", "64k", 16 * MIB)

    # control: one flipped byte in the middle of a block must fail verification
    a, b = (os.path.join(m, "fio") for m in c.mounts)
    with open(os.path.join(b, "seq"), "rb") as f:
        data = bytearray(f.read(4 * MIB))
    data[MIB + MIB // 2] ^= 0x01
    with open(os.path.join(a, "flipped"), "wb") as f:
        f.write(data)
    r, _ = _fio("flipped", os.path.join(b, "flipped"), "read", "1M", 4 * MIB)
    print(f"control (one flipped byte): fio exit {r.returncode}: "
          f"{r.stderr.strip().splitlines()[0] if r.stderr.strip() else ''}")
    assert r.returncode != 0 and "verify" in r.stderr, \
        f"fio did not notice a flipped byte (exit {r.returncode}):\n{r.stderr[-2000:]}"


@pytest.mark.slow
def test_fio_large_jobs_verify(make_cluster):
    """Bigger jobs: 1 GiB of sequential 1 MiB writes, 128 MiB of random 64 KiB writes,
    128 MiB of random 1 MiB writes."""
    c = make_cluster(workers=2, mounts=2)
    _write_and_verify(c, "seq-big", "write", "1M", 1024 * MIB)
    _write_and_verify(c, "rand-big", "randwrite", "64k", 128 * MIB)
    _write_and_verify(c, "rand-1m", "randwrite", "1M", 128 * MIB)
