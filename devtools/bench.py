"""`curvine bench`: curvine beside a plain directory on the same disk, in the same run.

Each workload runs on the file system (written through mount A, read through mount
B, as two LMCache pods would) and on a plain local directory, ``--runs`` times; the
table gives medians and the ratio curvine / plain, next to the targets of issue 3.

1. ``kv``: KV chunks written the LMCache way (``<key>.tmp``, one write, close, rename
   to ``<key>.data``) and read back cold: write MB/s, read MB/s, per-file p50/p99.
2. ``prompt``: the 8 chunk files of a 1,925-token prompt, read cold and warm (warm:
   the workers' block files are in the page cache but mount B never opened them;
   the plain side reads from the page cache).
3. ``meta``: create+close, stat and unlink of many empty files in one flat directory
   from one process and from several; stat of names that do not exist (a miss).
4. ``memory``: peak RSS of every daemon during 1-3, and of mount B's FUSE client
   while it reads one large file.
5. ``fill`` (only when named in ``--workloads``; see bench_fill.py): its own small
   cluster (2 workers of ``--fill-pool-mib``) that 4 writers fill to five times its
   pool: stores/s, failed stores by errno, evictions/s and how long the pool stays
   between the high and the low watermark; beside a tmpfs of the pool's size.
6. ``lmcache`` (only when named; needs torch and lmcache, else reported as skipped; see
   bench_lmcache.py): LMCache's own engine storing and retrieving the seed prompt, cold
   and warm, with ``fs://`` on the plain directory, ``fs://`` on mounts A -> B, the
   curvine connector (short-circuit and remote) and MooseFS; lookups and master RPCs.
8. ``meta-scale`` (only when named, on the bench's own cluster; see bench_meta_scale.py):
   lookups and empty-chunk stores from 1, 4 and 16 client processes, stat misses from
   1 and 8 processes through a mount, create/stat/listdir/unlink through a mount beside
   the plain directory; ops/s and master and mount CPU per operation (issue 16).
9. ``puts`` (only when named, on the bench's own cluster; see bench_puts.py): 16 chunks
   of 14 MiB stored with 1, 4 and 16 in flight and a prompt's 8 at once, through the
   connector beside ``<key>.tmp`` + rename on the plain directory (issue 36).
10. ``ha`` (only when named; see bench_ha.py): clusters of its own: failover time over 10
   leader kills in a group of 3 masters, and lookups and stores of 16 clients on one
   master and on a group of 3, with the leader's CPU per operation (issue 35).
7. ``smallio`` (only when named; see bench_smallio.py): random 4 KiB and 64 KiB writes
   (+ fsync) and reads inside one 64 MiB file, cold and warm, and the multi-process
   namespace workload of posix_workload.py, on curvine, the plain directory and
   MooseFS (when there is one), with the ratios to MooseFS and to the plain directory.

Cold reads come after ``sync; echo 3 > /proc/sys/vm/drop_caches`` when running as
root; otherwise the files of both sides are evicted with ``posix_fadvise(DONTNEED)``
where the benchmark can reach them.  The output says which one happened.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import multiprocessing
import os
import platform
import secrets
import shutil
import sys
import tempfile
import threading
import time
from typing import Callable

from curvine.common import argtypes
from curvine.common.mounts import mount_table

from .bench_common import (MiB, BenchError, CpuMeter, Metric, PageCache, name_procs,
                           percentile)
from .demo import SEED, chunk_data, chunk_keys, format_table, get_chunk, put_chunk
from .local import ClusterError, LocalCluster, mounted_paths

WORKLOADS = ("kv", "prompt", "meta", "memory", "fill", "lmcache", "smallio", "meta-scale",
             "puts", "ha")
# run without --workloads; "fill" and "ha" need clusters of their own, "lmcache" torch
# and lmcache, and "smallio" compares with MooseFS: only when named
DEFAULT_WORKLOADS = ("kv", "prompt", "meta", "memory")
CHUNK_TOKENS = 256  # LMCache's default chunk size in tokens
SCHEMA = 1


# --------------------------------------------------------------------------- parameters

@dataclasses.dataclass
class Params:
    runs: int = 3
    kv_files: int = 64
    kv_size: int = 16 * MiB
    prompt_tokens: int = 1925
    prompt_chunk_size: int = 14 * MiB  # 256 tokens of Qwen2-7B's KV
    meta_files: int = 5000
    meta_procs: int = 8
    missing: int = 1000
    rss_file_size: int = 1 << 30
    fill_pool_mib: int = 256  # capacity of each of the fill cluster's 2 workers
    lmcache_tokens: int = 1925  # the lmcache workload's seed prompt
    smallio_file_size: int = 64 * MiB  # the smallio workload's file
    smallio_ops: int = 4096  # random writes (reads) per smallio measure
    smallio_procs: int = 4  # processes of the multi-process workload
    smallio_workload_ops: int = 2000  # operations per process
    workloads: tuple[str, ...] = DEFAULT_WORKLOADS

    def prompt_sizes(self) -> list[int]:
        """Chunk files of the prompt: full 256-token chunks, then the partial last one."""
        full, rest = divmod(self.prompt_tokens, CHUNK_TOKENS)
        sizes = [self.prompt_chunk_size] * full
        if rest:
            sizes.append(self.prompt_chunk_size * rest // CHUNK_TOKENS)
        return sizes


QUICK = dict(runs=1, kv_files=4, kv_size=1 * MiB, prompt_chunk_size=1 * MiB, meta_files=200,
             meta_procs=2, missing=100, rss_file_size=32 * MiB, lmcache_tokens=300,
             smallio_file_size=4 * MiB, smallio_ops=64, smallio_procs=2,
             smallio_workload_ops=100)


# --------------------------------------------------------------------------- machine

def _meminfo() -> dict[str, int]:
    out = {}
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            out[name] = int(rest.split()[0]) * 1024
    return out


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or "?"


def _fs_of(path: str) -> dict:
    """Device, file system type and mount point holding ``path``."""
    real = os.path.realpath(path)
    best = ("", "?", "?")
    for dev, mnt, fstype in mount_table():
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best[0]):
            best = (mnt, dev, fstype)
    return {"path": real, "mount_point": best[0], "device": best[1], "fstype": best[2]}


def code_state() -> dict | None:
    """Commit and locally modified files of the checkout this code runs from (an
    editable install shares its tree with whoever is editing it)."""
    import subprocess
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                                  timeout=10, check=True).stdout
        return {"repo": repo, "commit": git("rev-parse", "HEAD").strip(),
                "modified": [line[3:] for line in git("status", "--porcelain",
                                                       "--untracked-files=no").splitlines()]}
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info() -> dict:
    mem = _meminfo()
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "mem_total_mib": round(mem.get("MemTotal", 0) / MiB),
        "mem_available_mib_at_start": round(mem.get("MemAvailable", 0) / MiB),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "root": os.geteuid() == 0,
    }


# --------------------------------------------------------------------------- memory

def _proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid`` in bytes ({} if it is gone)."""
    out = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, _, rest = line.partition(":")
                out[name] = int(rest.split()[0]) * 1024
    return out


def _reset_hwm(pid: int) -> bool:
    """Reset the kernel's peak-RSS mark of ``pid`` to its current RSS (clear_refs 5)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class RssSampler:
    """Peak RSS of named processes: VmRSS sampled by a thread, and VmHWM on demand."""

    def __init__(self, procs: dict[str, int], interval: float):
        self.procs = procs
        self.interval = interval
        self.peak = {name: 0 for name in procs}
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        for name, pid in self.procs.items():
            rss = _proc_status(pid).get("VmRSS", 0)
            if rss > self.peak[name]:
                self.peak[name] = rss
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> "RssSampler":
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rss-sampler")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self._sample()

    def peaks(self) -> dict[str, dict]:
        """Per process: the sampled peak and VmHWM now, in MiB."""
        out = {}
        for name, pid in self.procs.items():
            hwm = _proc_status(pid).get("VmHWM", 0)
            out[name] = {"pid": pid, "sampled_peak_mib": round(self.peak[name] / MiB, 1),
                         "vmhwm_mib": round(hwm / MiB, 1),
                         "peak_mib": round(max(hwm, self.peak[name]) / MiB, 1)}
        return out


def _pids_for_mounts(mounts: list[str]) -> dict[str, int]:
    """Daemons behind existing mounts: all of a `curvine local` cluster if the mounts
    belong to one, else just the FUSE clients found by their command lines."""
    real = [os.path.realpath(m) for m in mounts]
    base = os.path.dirname(os.path.dirname(real[0]))
    with contextlib.suppress(ClusterError):
        if os.path.isfile(os.path.join(base, "cluster.json")):
            rows = LocalCluster.attach(base).status()
            if any(r["mount"] and os.path.realpath(r["mount"]) in real for r in rows):
                return name_procs(rows, real)
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        if not any("fuse_client" in a or "curvine-fuse" in a for a in argv[:3]):
            continue
        for label, m in zip("AB", real):
            if m in (os.path.realpath(a) for a in argv if a.startswith("/")):
                found[f"fuse {label}"] = int(entry)
    return found


# --------------------------------------------------------------------------- metadata ops

def _op_create(paths: list[str]) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    for p in paths:
        os.close(os.open(p, flags, 0o644))


def _op_stat(paths: list[str]) -> None:
    for p in paths:
        os.stat(p)


def _op_stat_missing(paths: list[str]) -> None:
    for p in paths:
        try:
            os.stat(p)
        except FileNotFoundError:
            continue
        raise BenchError(f"{p} exists but was never created")


def _op_unlink(paths: list[str]) -> None:
    for p in paths:
        os.unlink(p)


META_OPS: dict[str, Callable[[list[str]], None]] = {
    "create": _op_create, "stat": _op_stat, "stat_missing": _op_stat_missing,
    "unlink": _op_unlink,
}


def _meta_worker(conn) -> None:
    """Child process of ProcPool: receives its paths, then runs one op at a time."""
    paths: list[str] = []
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        op, arg = msg
        if op == "paths":
            paths = arg
            conn.send(None)
            continue
        try:
            META_OPS[op](paths)
            conn.send(None)
        except Exception as e:  # noqa: BLE001 - reported by the parent
            conn.send(f"{type(e).__name__}: {e}")


class ProcPool:
    """N processes that each run a metadata op over their own paths, all at once."""

    def __init__(self, n: int):
        ctx = multiprocessing.get_context("spawn")  # no fork of a threaded process
        self.conns, self.procs = [], []
        try:
            for _ in range(n):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_meta_worker, args=(child,), daemon=True,
                                name="curvine-bench-meta")
                p.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(p)
        except BaseException:
            self.close()
            raise

    def _gather(self) -> None:
        errors = [e for e in (c.recv() for c in self.conns) if e]
        if errors:
            raise BenchError(f"a metadata process failed: {errors[0]}")

    def load(self, parts: list[list[str]]) -> None:
        for conn, part in zip(self.conns, parts):
            conn.send(("paths", part))
        self._gather()

    def run(self, op: str) -> float:
        """Seconds from the start signal until the last process finished ``op``."""
        t0 = time.perf_counter()
        for conn in self.conns:
            conn.send((op, None))
        self._gather()
        return time.perf_counter() - t0

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for conn in self.conns:
            conn.close()


# --------------------------------------------------------------------------- the benchmark

class Bench:
    """Runs the workloads on curvine (write via mount A, read via mount B) and on a
    plain directory, collecting per-run figures."""

    def __init__(self, params: Params, mount_a: str, mount_b: str, plain: str,
                 cache: PageCache, procs: dict[str, int], say: Callable[[str], None]):
        self.p = params
        tag = f"bench-{os.getpid()}-{secrets.token_hex(3)}"
        self.dir_a = os.path.join(mount_a, tag)  # curvine, as seen by pod A
        self.dir_b = os.path.join(mount_b, tag)  # the same directory, as seen by pod B
        self.dir_plain = os.path.join(plain, tag)
        self.cache = cache
        self.procs = procs
        self.say = say
        self.metrics: dict[str, list[Metric]] = {}
        self.raw: dict[str, dict] = {}
        self.memory: dict = {}

    # ------------------------------------------------------------- helpers
    def _metric(self, workload: str, id: str, label: str, unit: str, better: str) -> Metric:
        m = Metric(workload, id, label, unit, better)
        self.metrics.setdefault(workload, []).append(m)
        return m

    def setup(self) -> None:
        os.makedirs(self.dir_a)
        os.makedirs(self.dir_plain)
        if not os.path.isdir(self.dir_b):
            raise BenchError(f"{self.dir_a} made through mount A is not visible as {self.dir_b}: "
                             "are the two mounts the same cluster?")

    def cleanup(self) -> None:
        for d in (self.dir_a, self.dir_plain):
            shutil.rmtree(d, ignore_errors=True)

    @staticmethod
    def _check(data: bytes | None, want: bytes, where: str) -> None:
        if data is None:
            raise BenchError(f"{where}: not found")
        if len(data) != len(want) or data != want:
            raise BenchError(f"{where}: read {len(data)} bytes that differ from the "
                             f"{len(want)} written")

    def _write_all(self, directory: str, keys: list[str], sizes: list[int],
                   seed: int) -> list[float]:
        """Store chunks the LMCache way; seconds per file (data generation excluded)."""
        times = []
        for i, (key, size) in enumerate(zip(keys, sizes)):
            data = chunk_data(i, size, seed)
            t0 = time.perf_counter()
            put_chunk(directory, key, data)
            times.append(time.perf_counter() - t0)
        return times

    def _read_all(self, directory: str, keys: list[str], sizes: list[int],
                  seed: int) -> list[float]:
        """Look up and read every chunk (in order); seconds per file; checks the bytes."""
        times = []
        for i, (key, size) in enumerate(zip(keys, sizes)):
            t0 = time.perf_counter()
            data = get_chunk(directory, key)
            times.append(time.perf_counter() - t0)
            self._check(data, chunk_data(i, size, seed), os.path.join(directory, key + ".data"))
            del data
        return times

    @staticmethod
    def _remove(directory: str, keys: list[str]) -> None:
        for k in keys:
            os.unlink(os.path.join(directory, k + ".data"))

    def _plain_files(self, keys: list[str]) -> list[str]:
        return [os.path.join(self.dir_plain, k + ".data") for k in keys]

    # ------------------------------------------------------------- 1. KV chunks
    def kv(self) -> None:
        p = self.p
        sizes = [p.kv_size] * p.kv_files
        total = sum(sizes)
        w = self._metric("kv", "write", "write MB/s", "MB/s", "higher")
        r = self._metric("kv", "cold_read", "cold read MB/s", "MB/s", "higher")
        p50 = self._metric("kv", "read_p50", "read p50 ms/file", "ms", "lower")
        p99 = self._metric("kv", "read_p99", "read p99 ms/file", "ms", "lower")
        raw = self.raw["kv"] = {"read_ms_per_file": {"curvine": [], "plain": []},
                                "write_ms_per_file": {"curvine": [], "plain": []}}
        for run in range(p.runs):
            keys = chunk_keys(p.kv_files, seed=SEED + 100 + run)
            seed = SEED + run
            figures = []
            for side, wdir, rdir in (("curvine", self.dir_a, self.dir_b),
                                     ("plain", self.dir_plain, self.dir_plain)):
                wt = self._write_all(wdir, keys, sizes, seed)
                self.cache.drop(self._plain_files(keys) if side == "plain" else [])
                rt = self._read_all(rdir, keys, sizes, seed)
                self._remove(wdir, keys)
                ms = [t * 1000 for t in rt]
                getattr(w, side).append(total / 1e6 / sum(wt))
                getattr(r, side).append(total / 1e6 / sum(rt))
                getattr(p50, side).append(percentile(ms, 50))
                getattr(p99, side).append(percentile(ms, 99))
                raw["read_ms_per_file"][side].append([round(x, 3) for x in ms])
                raw["write_ms_per_file"][side].append([round(t * 1000, 3) for t in wt])
                figures.append(f"{side} write {getattr(w, side)[-1]:.0f} MB/s, "
                               f"read {getattr(r, side)[-1]:.0f} MB/s")
            self.say(f"  kv run {run + 1}/{p.runs}: " + "; ".join(figures))

    # ------------------------------------------------------------- 2. the reference prompt
    def prompt(self) -> None:
        p = self.p
        sizes = p.prompt_sizes()
        cold = self._metric("prompt", "cold", f"cold read ms ({len(sizes)} files)", "ms", "lower")
        warm = self._metric("prompt", "warm", "warm read ms (plain: page cache)", "ms", "lower")
        self.raw["prompt"] = {"file_sizes": sizes, "total_bytes": sum(sizes)}
        for run in range(p.runs):
            seed = SEED + 7 + run
            figures = []
            for metric, drop, salt in ((cold, True, 200), (warm, False, 300)):
                keys = chunk_keys(len(sizes), seed=SEED + salt + run)
                for side, wdir, rdir in (("curvine", self.dir_a, self.dir_b),
                                         ("plain", self.dir_plain, self.dir_plain)):
                    self._write_all(wdir, keys, sizes, seed)
                    if drop:
                        self.cache.drop(self._plain_files(keys) if side == "plain" else [])
                    ms = sum(self._read_all(rdir, keys, sizes, seed)) * 1000
                    self._remove(wdir, keys)
                    getattr(metric, side).append(ms)
                    figures.append(f"{metric.id} {side} {ms:.0f} ms")
            self.say(f"  prompt run {run + 1}/{p.runs}: " + ", ".join(figures))

    # ------------------------------------------------------------- 3. metadata
    def meta(self) -> None:
        p = self.p
        n, procs = p.meta_files, p.meta_procs
        one = {op: self._metric("meta", f"{op}_1p", f"{label}, 1 process", "ops/s", "higher")
               for op, label in (("create", "create+close"), ("stat", "stat"),
                                 ("unlink", "unlink"))}
        missing = self._metric("meta", "stat_missing", "stat of a missing name", "ops/s",
                               "higher")
        many = {op: self._metric("meta", f"{op}_np", f"{label}, {procs} processes", "ops/s",
                                 "higher")
                for op, label in (("create", "create+close"), ("stat", "stat"),
                                  ("unlink", "unlink"))}
        # Names shaped like LMCache's chunk files (the name length matters to lookups).
        names = [k + ".data" for k in chunk_keys(n, seed=SEED + 400)]
        absent = [k + ".data" for k in chunk_keys(p.missing, seed=SEED + 500)]
        pool = ProcPool(procs)
        try:
            for run in range(p.runs):
                figures = []
                for side, root in (("curvine", self.dir_a), ("plain", self.dir_plain)):
                    d = os.path.join(root, f"flat-{run}-1p")
                    os.mkdir(d)
                    paths = [os.path.join(d, x) for x in names]
                    for op in ("create", "stat"):
                        t0 = time.perf_counter()
                        META_OPS[op](paths)
                        getattr(one[op], side).append(n / (time.perf_counter() - t0))
                    t0 = time.perf_counter()
                    _op_stat_missing([os.path.join(d, x) for x in absent])
                    getattr(missing, side).append(p.missing / (time.perf_counter() - t0))
                    t0 = time.perf_counter()
                    _op_unlink(paths)
                    getattr(one["unlink"], side).append(n / (time.perf_counter() - t0))
                    os.rmdir(d)

                    d = os.path.join(root, f"flat-{run}-{procs}p")
                    os.mkdir(d)
                    paths = [os.path.join(d, x) for x in names]
                    pool.load([paths[i::procs] for i in range(procs)])
                    for op in ("create", "stat", "unlink"):
                        getattr(many[op], side).append(n / pool.run(op))
                    os.rmdir(d)
                    figures.append(f"{side} " + ", ".join(
                        f"{op} {getattr(one[op], side)[-1]:,.0f}/s" for op in one))
                self.say(f"  meta run {run + 1}/{p.runs}: " + "; ".join(figures))
        finally:
            pool.close()

    # ------------------------------------------------------------- 4. memory
    def rss_check(self) -> dict:
        """Peak RSS of mount B's FUSE client while it reads one large file (and of
        mount A's while it writes it); one run."""
        p = self.p
        fuse_a, fuse_b = self.procs.get("fuse A"), self.procs.get("fuse B")
        path_a = os.path.join(self.dir_a, "large.bin")
        path_b = os.path.join(self.dir_b, "large.bin")  # the same file, seen by mount B
        piece = min(16 * MiB, p.rss_file_size)
        watched = {k: v for k, v in (("fuse A", fuse_a), ("fuse B", fuse_b)) if v}
        result: dict = {"file_size": p.rss_file_size, "pids": watched}
        for pid in watched.values():
            _reset_hwm(pid)
        with RssSampler(watched, 0.02) as s:
            t0 = time.perf_counter()
            with open(path_a, "wb") as f:
                left, i = p.rss_file_size, 0
                while left:
                    data = chunk_data(i, min(piece, left), SEED + 900)
                    f.write(data)
                    left -= len(data)
                    i += 1
            result["write_s"] = time.perf_counter() - t0
        result["while_writing"] = s.peaks()
        self.cache.drop()
        reset = [_reset_hwm(pid) for pid in watched.values()]
        result["hwm_reset"] = all(reset) if reset else False
        with RssSampler(watched, 0.02) as s:
            buf = bytearray(MiB)
            got = 0
            t0 = time.perf_counter()
            with open(path_b, "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    got += n
            result["read_s"] = time.perf_counter() - t0
        result["while_reading"] = s.peaks()
        os.unlink(path_a)
        if got != p.rss_file_size:
            raise BenchError(f"{path_b}: read {got} bytes of {p.rss_file_size}")
        result["read_MBps"] = got / 1e6 / result["read_s"]
        result["write_MBps"] = p.rss_file_size / 1e6 / result["write_s"]
        return result


# --------------------------------------------------------------------------- report

def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "count":
        return f"{x:,.0f}" if x == int(x) else f"{x:,.1f}"
    if unit in ("ops/s",):
        return f"{x:,.0f}"
    if unit == "MiB":
        return f"{x:.0f}"
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


WORKLOAD_TITLES = {"kv": "1 KV chunks", "prompt": "2 prompt", "meta": "3 metadata",
                   "memory": "4 memory", "fill": "5 fill", "lmcache": "6 lmcache",
                   "smallio": "7 small I/O", "meta-scale": "8 metadata at scale",
                   "puts": "9 concurrent puts", "ha": "10 master group"}


def format_report(metrics: dict[str, list[Metric]]) -> str:
    rows = [("workload", "metric", "curvine", "plain", "ratio", "better", "target", "")]
    for wl in WORKLOADS:
        for i, m in enumerate(metrics.get(wl, [])):
            t = m.target
            rows.append((WORKLOAD_TITLES[wl] if i == 0 else "", m.label,
                         _fmt(m.curvine_median, m.unit), _fmt(m.plain_median, m.unit),
                         _fmt_ratio(m.ratio),
                         m.better, str(t) if t else "", m.status or ""))
    return format_table(rows, left=2)


def _fmt_ratio(r: float | None) -> str:
    if r is None:
        return "-"
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"


# --------------------------------------------------------------------------- driver

def _own_cluster(cluster, workload: str, module: str) -> None:
    """A workload that measures the bench's own cluster's daemons needs one."""
    if cluster is None:
        raise BenchError(f"{workload} runs on the bench's own cluster (no --mounts); for "
                         f"another cluster: python -m curvine.devtools.{module} --base BASE")


def run_bench(params: Params, mounts: list[str] | None = None, plain: str | None = None,
              workdir: str | None = None, json_path: str | None = "bench-results.json",
              drop_caches: bool = True, out=sys.stdout,
              moosefs_mounts: list[str] | None = None, moosefs_up: str | None = None) -> dict:
    """Run the benchmark; return the results (also written to ``json_path``).

    ``moosefs_mounts`` / ``moosefs_up``: MooseFS for the lmcache workload's path 5."""
    def say(msg: str = "") -> None:
        print(msg, file=out, flush=True)

    started = time.time()
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    results: dict = {
        "schema": SCHEMA,
        "argv": sys.argv,
        "started_at": datetime.datetime.fromtimestamp(started).astimezone().isoformat(),
        "machine": machine_info(),
        "code": code_state(),
        "load_average": {"start": list(load_start)},
        "params": dataclasses.asdict(params),
    }
    say(f"curvine bench: {results['machine']['nproc']} CPUs, "
        f"{results['machine']['mem_total_mib']} MiB, Linux {results['machine']['kernel']}, "
        f"Python {results['machine']['python']}; load average at start "
        + " ".join(f"{x:.2f}" for x in load_start))
    if load_start[0] > (os.cpu_count() or 1):
        say("  note: the machine is busy (load average above the CPU count): "
            "figures will be noisy")

    own_cluster = ("fill", "ha")  # workloads that start clusters of their own
    main_wls = [w for w in params.workloads if w not in own_cluster]  # on the main cluster
    top = None  # temporary directory this run created (cluster and/or plain dir)
    cluster = None
    bench = None
    fill = None
    cache = None
    lm = None  # the lmcache workload (bench_lmcache.LmcacheBench)
    lm_note = None  # ... or why it was skipped
    sm = None  # the smallio workload (bench_smallio.SmallIoBench)
    ha_raw = None  # the ha workload's medians (bench_ha.py)
    results["workload_seconds"], results["cpu_seconds"] = {}, {}
    try:
        if plain is None or mounts is None or set(own_cluster) & set(params.workloads):
            parent = workdir or (os.path.dirname(os.path.abspath(plain)) if plain else None)
            top = tempfile.mkdtemp(prefix="curvine-bench-", dir=parent)
        if main_wls:
            plain_root = os.path.abspath(plain) if plain else os.path.join(top, "plain")
            os.makedirs(plain_root, exist_ok=True)
            block_dirs: list[str] = []
            if mounts:
                mount_a, mount_b = (os.path.abspath(m) for m in mounts)
                for m in (mount_a, mount_b):
                    if not os.path.isdir(m):
                        raise BenchError(f"{m} is not a directory")
                procs = _pids_for_mounts([mount_a, mount_b])
                mode = "mounts"
            else:
                cluster = LocalCluster(os.path.join(top, "cluster"), workers=2, mounts=2)
                say(f"starting a local cluster in {cluster.base}: 1 master, 2 workers, "
                    "2 mounts ...")
                t0 = time.perf_counter()
                mount_a, mount_b = cluster.up()
                say(f"  up in {time.perf_counter() - t0:.1f}s")
                block_dirs = [os.path.join(cluster.base, "worker", str(i), "data")
                              for i in range(2)]
                procs = name_procs(cluster.status(), [mount_a, mount_b])
                mode = "local cluster"
            cache = PageCache(drop_caches, block_dirs)
            plain_fs = _fs_of(plain_root)
            curvine_fs = _fs_of(block_dirs[0]) if block_dirs else None
            same_disk = curvine_fs["device"] == plain_fs["device"] if curvine_fs else None
            results["setup"] = {"mode": mode, "mounts": [mount_a, mount_b],
                                "plain_dir": plain_root, "plain_fs": plain_fs,
                                "block_fs": curvine_fs, "same_device": same_disk,
                                "processes": procs}
            results["page_cache"] = {"dropped": cache.dropped, "method": cache.method,
                                     "note": cache.describe()}
            say(f"curvine: write through {mount_a}, read through {mount_b}; plain: "
                f"{plain_root} ({plain_fs['fstype']} on {plain_fs['device']})")
            if same_disk is False:
                say("  warning: the workers' blocks and the plain directory are on different "
                    "devices")
            say(cache.describe())
        say(f"{params.runs} run(s) per workload, medians reported")

        if main_wls:
            bench = Bench(params, mount_a, mount_b, plain_root, cache, procs, say)
            bench.setup()
            # Peaks from here on: daemons of an existing cluster may have peaked before.
            results["setup"]["hwm_reset_at_start"] = all(
                [_reset_hwm(pid) for pid in procs.values()])
            cpu = CpuMeter(procs)

            def done(wl: str, t0: float) -> None:
                wall = results["workload_seconds"][wl] = round(time.perf_counter() - t0, 1)
                used = results["cpu_seconds"][wl] = cpu.stop()
                say(f"  {wall:.0f}s wall; CPU seconds: "
                    + ", ".join(f"{k} {v:.1f}" for k, v in used.items()))

            with RssSampler(procs, 0.25) as sampler:
                for wl in ("kv", "prompt", "meta"):
                    if wl in params.workloads:
                        say(f"[{WORKLOAD_TITLES[wl]}]")
                        t0 = time.perf_counter()
                        cpu.start()
                        getattr(bench, wl)()
                        done(wl, t0)
                if "lmcache" in params.workloads:
                    from .bench_lmcache import LmcacheBench, MooseFs
                    say(f"[{WORKLOAD_TITLES['lmcache']}]")
                    t0 = time.perf_counter()
                    cpu.start()
                    lm = LmcacheBench(
                        params.runs, params.lmcache_tokens, plain_root, (mount_a, mount_b),
                        cache, procs, top or workdir or tempfile.gettempdir(), say,
                        MooseFs(tuple(moosefs_mounts) if moosefs_mounts else None,
                                os.path.abspath(moosefs_up) if moosefs_up else None),
                        cluster_base=cluster.base if cluster is not None else None)
                    try:
                        lm_note = lm.setup()
                        if lm_note:
                            say(f"  skipped: {lm_note}")
                        else:
                            lm.run()
                    finally:
                        bench.metrics["lmcache"] = lm.metrics
                        bench.raw["lmcache"] = ({"skipped": lm_note} if lm_note else lm.raw)
                        lm.cleanup()
                    done("lmcache", t0)
                if "smallio" in params.workloads:
                    from .bench_lmcache import MooseFs
                    from .bench_smallio import SmallIoBench
                    say(f"[{WORKLOAD_TITLES['smallio']}]")
                    t0 = time.perf_counter()
                    cpu.start()
                    sm = SmallIoBench(
                        params.runs, params.smallio_file_size, params.smallio_ops,
                        params.smallio_procs, params.smallio_workload_ops, plain_root,
                        (mount_a, mount_b), cache, say,
                        MooseFs(tuple(moosefs_mounts) if moosefs_mounts else None,
                                os.path.abspath(moosefs_up) if moosefs_up else None))
                    try:
                        sm.setup()
                        sm.run()
                    finally:
                        bench.metrics["smallio"] = sm.metrics
                        bench.raw["smallio"] = sm.raw
                        sm.cleanup()
                    done("smallio", t0)
                if "meta-scale" in params.workloads:
                    _own_cluster(cluster, "meta-scale", "bench_meta_scale")
                    from .bench_meta_scale import MetaScale, report
                    say(f"[{WORKLOAD_TITLES['meta-scale']}]")
                    t0 = time.perf_counter()
                    cpu.start()
                    medians = MetaScale(cluster, plain_root, say, params.runs).run()
                    bench.raw["meta-scale"] = medians
                    say(report(medians))
                    done("meta-scale", t0)
                if "puts" in params.workloads:
                    _own_cluster(cluster, "puts", "bench_puts")
                    from .bench_puts import PutsBench, report as puts_report
                    say(f"[{WORKLOAD_TITLES['puts']}]")
                    t0 = time.perf_counter()
                    cpu.start()
                    pb = PutsBench(cluster, plain_root, say, max(params.runs, 5))
                    try:
                        medians = pb.run()
                    finally:
                        pb.close()
                    bench.raw["puts"] = {"medians": medians, "master_calls": pb.calls}
                    say(puts_report(medians, pb.calls))
                    done("puts", t0)
            if "memory" in params.workloads:
                say(f"[{WORKLOAD_TITLES['memory']}]")
                t0 = time.perf_counter()
                cpu.start()
                during = sampler.peaks()
                for name, peak in during.items():
                    m = bench._metric("memory", f"peak_{name.replace(' ', '_')}",
                                      f"peak RSS MiB, {name}", "MiB", "lower")
                    m.curvine.append(peak["peak_mib"])
                size_label = (f"{params.rss_file_size / MiB:g} MiB"
                              if params.rss_file_size < 1 << 30
                              else f"{params.rss_file_size / (1 << 30):g} GiB")
                check = bench.rss_check()
                peak_b = check["while_reading"].get("fuse B", {}).get("peak_mib")
                m = bench._metric("memory", "fuse_read_peak",
                                  f"peak RSS MiB, fuse B reading {size_label}", "MiB", "lower")
                if peak_b is not None:
                    m.curvine.append(peak_b)
                peak_a = check["while_writing"].get("fuse A", {}).get("peak_mib")
                m = bench._metric("memory", "fuse_write_peak",
                                  f"peak RSS MiB, fuse A writing {size_label}", "MiB", "lower")
                if peak_a is not None:
                    m.curvine.append(peak_a)
                say(f"  {size_label}: written through A at {check['write_MBps']:.0f} MB/s, "
                    f"read through B at {check['read_MBps']:.0f} MB/s; fuse B peak RSS "
                    f"{peak_b if peak_b is not None else '?'} MiB")
                bench.memory = {"during_workloads": during, "large_file": check}
                done("memory", t0)
        if "fill" in params.workloads:
            from .bench_fill import FillBench
            say(f"[{WORKLOAD_TITLES['fill']}]")
            if mounts or plain:
                say("  note: fill ignores --mounts and --plain: it starts its own small "
                    "cluster and plain file system")
            fill = FillBench(params.runs, params.fill_pool_mib, top, say)
            say(f"  per run: a cluster of 2 workers x {params.fill_pool_mib} MiB (default "
                f"settings otherwise), 4 writers (2 per mount) attempt {fill.quota} stores "
                f"of 14 MiB (5x the pool)")
            t0 = time.perf_counter()
            fill.run()
            results["workload_seconds"]["fill"] = round(time.perf_counter() - t0, 1)
            say(f"  {results['workload_seconds']['fill']:.0f}s wall")
        if "ha" in params.workloads:
            from .bench_ha import HaBench, report as ha_report
            say(f"[{WORKLOAD_TITLES['ha']}]")
            t0 = time.perf_counter()
            ha = HaBench(top, say, runs=params.runs)
            ha_raw = ha.run()
            ha_raw["failover seconds, each kill"] = ha.failovers
            say(ha_report({k: v for k, v in ha_raw.items() if not isinstance(v, list)}))
            results["workload_seconds"]["ha"] = round(time.perf_counter() - t0, 1)
    except BaseException as e:
        results["error"] = ("interrupted" if isinstance(e, KeyboardInterrupt)
                            else f"{type(e).__name__}: {e}")
        raise
    finally:
        teardown_error = None
        if bench is not None:
            with contextlib.suppress(OSError):
                bench.cleanup()
        if cluster is not None:
            try:
                cluster.down()
            except ClusterError as e:
                teardown_error = e
                results.setdefault("error", f"teardown: {e}")
        if top and not any(m.startswith(top + os.sep) for m in mounted_paths()):
            shutil.rmtree(top, ignore_errors=True)
        load_end = os.getloadavg()
        results["load_average"]["end"] = list(load_end)
        results["runtime_s"] = round(time.perf_counter() - t_start, 1)
        all_metrics = dict(bench.metrics) if bench is not None else {}
        if fill is not None:
            all_metrics["fill"] = fill.metrics
        results["workloads"] = {
            wl: {"metrics": [m.to_json() for m in all_metrics.get(wl, [])],
                 **({"raw": bench.raw[wl]} if bench is not None and wl in bench.raw else {}),
                 **({"raw": fill.raw} if wl == "fill" and fill is not None else {}),
                 **({"raw": ha_raw} if wl == "ha" and ha_raw is not None else {})}
            for wl in WORKLOADS if wl in params.workloads}
        if bench is not None:
            results["memory"] = bench.memory
            results["page_cache"]["drops"] = bench.cache.count
        if json_path:
            with open(json_path, "w") as f:
                json.dump(results, f, indent=1)
                f.write("\n")
    if teardown_error is not None:
        raise teardown_error

    say()
    say(format_report(all_metrics))
    say()
    if lm is not None:
        say("lmcache: " + (f"skipped: {lm_note}" if lm_note else "LMCache engine, per path"))
        if not lm_note:
            say(lm.report())
        say()
    if sm is not None:
        say("smallio: per side, with the ratios to MooseFS and to the local dir")
        say(sm.report())
        say()
    say("ratio = curvine / plain (medians); 'better' says which way is good: MB/s and ops/s "
        "higher, ms and MiB lower; targets from issue 3")
    if fill is not None:
        say("fill: curvine stores/s over the whole fill, plain stores/s until its first "
            "ENOSPC (it never evicts); failed stores over the same number of attempts; "
            "evictions/s and episodes (pool above the high watermark until below the low "
            "one, statfs of mount A every 25 ms) are neither better nor worse")
        for note in fill.raw["notes"]:
            say(f"fill: {note}")
    if cache is not None:
        say(f"page cache: {'dropped' if cache.dropped else 'NOT dropped'} ({cache.method}) "
            f"before cold reads; load average start "
            f"{' '.join(f'{x:.2f}' for x in load_start)}, "
            f"end {' '.join(f'{x:.2f}' for x in results['load_average']['end'])}")
    else:
        say(f"load average start {' '.join(f'{x:.2f}' for x in load_start)}, "
            f"end {' '.join(f'{x:.2f}' for x in results['load_average']['end'])}")
    say(f"runtime {results['runtime_s']:.0f}s ("
        + ", ".join(f"{k} {v:.0f}s" for k, v in results["workload_seconds"].items()) + ")"
        + (f"; results in {json_path}" if json_path else ""))
    return results


# --------------------------------------------------------------------------- `curvine bench`

HELP = "benchmark curvine against a plain directory on the same disk"
DESCRIPTION = ("Run the workloads of issue 3 on curvine (write through mount A, read "
               "through mount B) and on a plain local directory in the same run; print "
               "medians, ratios and the targets, and write every figure to a JSON file.")


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mounts", nargs=2, metavar=("A", "B"),
                   help="two existing mounts of one cluster (default: start a local cluster "
                        "with 2 workers and 2 mounts)")
    p.add_argument("--plain", metavar="DIR",
                   help="plain directory on the same disk (default: a temporary directory "
                        "next to the cluster)")
    p.add_argument("--workdir", metavar="DIR",
                   help="where the temporary cluster and plain directory go (default $TMPDIR)")
    p.add_argument("--runs", type=argtypes.positive, metavar="N", help="runs per workload (default 3)")
    p.add_argument("--json", default="bench-results.json", metavar="FILE",
                   help="where to write all figures (default bench-results.json)")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes and 1 run (a smoke test, not a measurement)")
    p.add_argument("--workloads", type=_workloads, default=DEFAULT_WORKLOADS, metavar="LIST",
                   help="comma-separated subset of " + ",".join(WORKLOADS) + " (default "
                        + ",".join(DEFAULT_WORKLOADS) + "; fill only when named: it starts "
                        "its own small cluster, 2 workers of --fill-pool-mib, fills it to 5x "
                        "its pool from 4 writers and ignores --mounts/--plain; as root its "
                        "plain side is a tmpfs of the pool's size, else it is skipped; "
                        "lmcache only when named: it needs torch and lmcache; smallio "
                        "only when named: it compares with MooseFS)")
    p.add_argument("--no-drop-caches", dest="drop_caches", action="store_false",
                   help="do not evict the page cache before cold reads")
    g = p.add_argument_group("sizes")
    g.add_argument("--kv-files", type=argtypes.positive, metavar="N", help="KV chunk files (default 64)")
    g.add_argument("--kv-size", type=argtypes.size, metavar="SIZE", help="bytes per KV file (16MiB)")
    g.add_argument("--prompt-tokens", type=argtypes.positive, metavar="N",
                   help="tokens of the reference prompt (1925: 7 full 256-token chunks + 133)")
    g.add_argument("--prompt-chunk-size", type=argtypes.size, metavar="SIZE",
                   help="bytes of a full 256-token chunk (14MiB)")
    g.add_argument("--meta-files", type=argtypes.positive, metavar="N",
                   help="files per metadata run (default 5000)")
    g.add_argument("--meta-procs", type=argtypes.positive, metavar="N",
                   help="processes of the parallel metadata run (default 8)")
    g.add_argument("--missing", type=argtypes.positive, metavar="N",
                   help="missing names to stat (default 1000)")
    g.add_argument("--rss-file-size", type=argtypes.size, metavar="SIZE",
                   help="file read through mount B for the FUSE RSS check (default 1GiB)")
    g.add_argument("--fill-pool-mib", type=argtypes.positive, metavar="MIB",
                   help="capacity of each of the 2 workers of the fill cluster, in MiB "
                        "(default 256: a 512 MiB pool)")
    g = p.add_argument_group("lmcache workload")
    g.add_argument("--lmcache-tokens", type=argtypes.positive, metavar="N",
                   help="tokens of its seed prompt (1925: 8 chunk files of Qwen2-7B's KV)")
    g.add_argument("--moosefs-mounts", nargs=2, metavar=("M1", "M2"),
                   help="two mounts of one MooseFS for path 5 and for smallio (default: "
                        "moosefs-up.sh's /tmp/peers/mnt_mfs_a and _b when mounted)")
    g.add_argument("--moosefs-up", metavar="SCRIPT",
                   help="start MooseFS with this script (bench/moosefs-up.sh) and "
                        "stop it afterwards with the moosefs-down.sh beside it")
    g = p.add_argument_group("smallio workload")
    g.add_argument("--smallio-file-size", type=argtypes.size, metavar="SIZE",
                   help="the file of the random writes and reads (default 64MiB; a "
                        "multiple of 64KiB)")
    g.add_argument("--smallio-ops", type=argtypes.positive, metavar="N",
                   help="random writes (or reads) per measure (default 4096)")
    g.add_argument("--smallio-procs", type=argtypes.positive, metavar="N",
                   help="processes of the multi-process workload (default 4)")
    g.add_argument("--smallio-workload-ops", type=argtypes.positive, metavar="N",
                   help="operations per process of the multi-process workload (default 2000)")
    p.set_defaults(func=_cmd_bench, _parser=p)


def _workloads(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [x for x in names if x not in WORKLOADS]
    if bad or not names:
        what = f"unknown workload {bad[0]!r}" if bad else "empty list"
        raise argparse.ArgumentTypeError(f"{what} (choose from {','.join(WORKLOADS)})")
    return names


def params_from_args(args) -> Params:
    p = Params(**QUICK) if args.quick else Params()
    for name in ("runs", "kv_files", "kv_size", "prompt_tokens", "prompt_chunk_size",
                 "meta_files", "meta_procs", "missing", "rss_file_size", "fill_pool_mib",
                 "lmcache_tokens", "smallio_file_size", "smallio_ops", "smallio_procs",
                 "smallio_workload_ops"):
        value = getattr(args, name)
        if value is not None:
            setattr(p, name, value)
    p.workloads = tuple(w for w in WORKLOADS if w in args.workloads)
    return p


def _cmd_bench(args, parser) -> int:
    with contextlib.suppress(AttributeError):
        sys.stdout.reconfigure(line_buffering=True)
    params = params_from_args(args)
    if "fill" in params.workloads and params.fill_pool_mib < 16:
        parser.error(f"--fill-pool-mib {params.fill_pool_mib}: a worker must hold at least "
                     "one 14 MiB chunk (use 16 or more)")
    if "smallio" in params.workloads and (params.smallio_file_size < 64 << 10
                                          or params.smallio_file_size % (64 << 10)):
        parser.error(f"--smallio-file-size {params.smallio_file_size}: must be a multiple "
                     "of 64KiB")
    if params.runs < 3 and not args.quick:
        print("curvine bench: note: fewer than 3 runs; the issue asks for medians of >= 3",
              file=sys.stderr)
    try:
        run_bench(params, mounts=args.mounts, plain=args.plain, workdir=args.workdir,
                  json_path=args.json, drop_caches=args.drop_caches,
                  moosefs_mounts=args.moosefs_mounts, moosefs_up=args.moosefs_up)
    except BenchError as e:
        print(f"curvine: error: {e}", file=sys.stderr)
        return 1
    return 0
