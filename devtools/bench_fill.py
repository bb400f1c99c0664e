"""`curvine bench --workloads fill`: LMCache pods storing into a full pool.

Each run starts its own small cluster (1 master, 2 workers of ``--fill-pool-mib`` MiB
each, 2 mounts, default settings otherwise) in the benchmark's temporary directory.
4 writer processes, 2 per mount, store 14 MiB chunks the LMCache way (``<key>.tmp``,
one write, close, rename to ``<key>.data``) as fast as they can until together they
have attempted five times the pool (every attempt that fails is counted, by errno).
Meanwhile a thread samples ``statfs`` of mount A every 25 ms; an *episode* runs from
the first sample above the master's high watermark to the first one below its low
watermark.  Evictions come from the master's ``CapacityStatus`` (``evicted_files``
before and after the writes).

The plain side is the same 4 writers on a file system of the pool's size that simply
fills: a tmpfs (``mount -t tmpfs``) when root, else (if that fails) a loop-mounted
ext4 image; when neither can be mounted the plain side is skipped and the output says
why.  It reports its stores/s until the first ENOSPC and how many stores failed.

Everything mounted and started here is unmounted and stopped in ``finally`` blocks,
also on Ctrl-C (and SIGTERM, which is turned into a KeyboardInterrupt meanwhile).
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import hashlib
import math
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import threading
import time
from typing import Callable

from curvine.client.master.master_client import MasterClient

from .bench_common import BenchError, CpuMeter, Metric, MiB, name_procs
from .demo import SEED, chunk_data
from .local import ClusterError, LocalCluster, is_mounted, mounted_paths

FILL_CHUNK = 14 * MiB  # 256 tokens of Qwen2-7B's KV, as LMCache stores them
FILL_TIMES = 5  # the writers attempt this many times the pool
WRITERS_PER_MOUNT = 2
SAMPLE_S = 0.025  # statfs sampling interval
WRITE_DEADLINE_S = 75.0  # no new store after this long (per side and run)
HUNG_GRACE_S = 20.0  # then a writer still inside a store counts as hung
SETTLE_MIN_S = 1.5  # keep sampling after the writes: usage is reported by heartbeats
SETTLE_MAX_S = 15.0  # ... until the pool is below the low watermark, at most this long
HUNG = "hung"  # "errno" of a writer that never came back from a store


# --------------------------------------------------------------------------- writers

def _store(directory: str, key: str, data) -> tuple[int | str, str]:
    """LMCache's put; (0, "") or (errno or exception name, the step that failed)."""
    tmp = os.path.join(directory, key + ".tmp")
    step = "open"
    try:
        with open(tmp, "wb") as f:
            step = "write"
            f.write(data)
            step = "close"
        step = "rename"
        os.rename(tmp, os.path.join(directory, key + ".data"))
        return 0, ""
    except Exception as e:  # noqa: BLE001 - every failure is a figure, never a crash
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno:
            return e.errno, step
        return type(e).__name__, step


def _fill_writer(directory: str, prefix: str, chunk_size: int, seed: int, attempts, quota: int,
                 deadline_s: float, go, conn) -> None:
    """Child process: store chunks until the writers together attempted ``quota``;
    sends "ready", waits for ``go``, then sends its records (t0, t1, errno, step)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    data = bytearray(chunk_data(0, chunk_size, seed))
    conn.send("ready")
    go.wait()
    deadline = time.monotonic() + deadline_s
    records = []
    i = 0
    while time.monotonic() < deadline:
        with attempts.get_lock():
            if attempts.value >= quota:
                break
            attempts.value += 1
        data[:8] = i.to_bytes(8, "little")  # every chunk distinct
        key = (f"vllm@fill@1@{prefix}@"
               f"{hashlib.sha256(f'{prefix}-{i}'.encode()).hexdigest()[:16]}")
        t0 = time.monotonic()
        err, step = _store(directory, key, data)
        records.append((t0, time.monotonic(), err, step))
        i += 1
    conn.send(records)
    conn.close()


def _run_writers(dirs: list[str], tag: str, quota: int, chunk_size: int) -> dict:
    """One writer process per entry of ``dirs``, started together; their records."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a threaded process
    attempts = ctx.Value("q", 0)
    go = ctx.Event()
    procs, conns = [], []
    out: dict = {"records": [], "hung_writers": 0, "dead_writers": 0}
    try:
        for w, d in enumerate(dirs):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_fill_writer, daemon=True, name=f"curvine-bench-fill-{w}",
                            args=(d, f"{tag}w{w}", chunk_size, SEED + 1000 + w, attempts,
                                  quota, WRITE_DEADLINE_S, go, child))
            p.start()
            child.close()
            procs.append(p)
            conns.append(parent)
        ready_by = time.monotonic() + 60
        for conn in conns:
            try:
                ok = conn.poll(max(0.0, ready_by - time.monotonic())) and conn.recv() == "ready"
            except (EOFError, OSError):
                ok = False
            if not ok:
                raise BenchError("a fill writer process did not start")
        out["t_start"] = time.monotonic()
        go.set()
        wait_until = out["t_start"] + WRITE_DEADLINE_S + HUNG_GRACE_S
        for conn in conns:
            try:
                if conn.poll(max(0.0, wait_until - time.monotonic())):
                    out["records"].extend(conn.recv())
                else:
                    out["hung_writers"] += 1
            except (EOFError, OSError):
                out["dead_writers"] += 1
        ends = [r[1] for r in out["records"]]
        out["t_end"] = max(ends) if ends else time.monotonic()
        out["attempts"] = attempts.value
        return out
    finally:
        _stop_procs(procs)
        for conn in conns:
            conn.close()


def _stop_procs(procs) -> None:
    for p in procs:
        p.join(timeout=2)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


def _log_problems(logs: list[str], per_log: int = 8) -> dict[str, list[str]]:
    """The last WARNING/ERROR lines (and tracebacks' last lines) of each daemon log."""
    out = {}
    for path in logs:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - (1 << 20)))
                text = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            continue
        hits = [line[:300] for line in text
                if " WARNING " in line or " ERROR " in line or " CRITICAL " in line
                or line.startswith(("OSError", "RuntimeError", "Exception"))]
        if hits:
            out[os.path.basename(path)] = hits[-per_log:]
    return out


def _errname(err: int | str) -> str:
    return errno_mod.errorcode.get(err, str(err)) if isinstance(err, int) else err


def _summarize(res: dict) -> dict:
    """Counts and rates of one side's run from its writers' records."""
    recs = sorted(res["records"])
    t_start = res["t_start"]
    ok = [r for r in recs if r[2] == 0]
    failed: dict[str, int] = {}
    steps: dict[str, int] = {}
    for _, _, err, step in recs:
        if err != 0:
            name = _errname(err)
            failed[name] = failed.get(name, 0) + 1
            steps[f"{name} at {step}"] = steps.get(f"{name} at {step}", 0) + 1
    if res["hung_writers"]:
        failed[HUNG] = res["hung_writers"]
    if res["dead_writers"]:
        failed["writer died"] = res["dead_writers"]
    wall = max(res["t_end"] - t_start, 1e-9)
    enospc = [r[1] for r in recs if r[2] == errno_mod.ENOSPC]
    first = min(enospc) if enospc else None
    before = [r for r in ok if first is None or r[1] <= first]
    until = (first if first is not None else res["t_end"]) - t_start
    store_ms = [(r[1] - r[0]) * 1000 for r in ok]
    return {
        "attempts": len(recs) + res["hung_writers"], "stored": len(ok),
        "failed": sum(failed.values()), "failed_by_errno": failed, "failed_by_step": steps,
        "wall_s": round(wall, 3), "stores_per_s": len(ok) / wall,
        "first_enospc_s": round(first - t_start, 3) if first is not None else None,
        "stored_before_first_enospc": len(before),
        "stores_per_s_until_first_enospc": len(before) / max(until, 1e-9),
        "store_ms_p50": round(statistics.median(store_ms), 2) if store_ms else None,
        "store_ms_max": round(max(store_ms), 2) if store_ms else None,
    }


# --------------------------------------------------------------------------- usage

class UsageSampler:
    """``(f_blocks - f_bfree) / f_blocks`` of a mount every ``interval`` seconds."""

    def __init__(self, path: str, interval: float = SAMPLE_S):
        self.path = path
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="fill-statfs")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                st = os.statvfs(self.path)
                if st.f_blocks:
                    self.samples.append((time.monotonic(),
                                         (st.f_blocks - st.f_bfree) / st.f_blocks))
            except OSError:
                self.errors += 1
            self._stop.wait(self.interval)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)  # a hung statfs must not hang the benchmark


def episodes(samples: list[tuple[float, float]], high: float,
             low: float) -> tuple[list[dict], dict | None]:
    """Stretches from the first sample above ``high`` to the first below ``low``;
    (finished episodes, the one still open at the last sample or None)."""
    done, start, peak = [], None, 0.0
    for t, u in samples:
        if start is None:
            if u > high:
                start, peak = t, u
        else:
            peak = max(peak, u)
            if u < low:
                done.append({"start": start, "ms": (t - start) * 1000, "peak": peak})
                start = None
    open_ = None
    if start is not None:
        open_ = {"start": start, "ms_so_far": (samples[-1][0] - start) * 1000, "peak": peak}
    return done, open_


# --------------------------------------------------------------------------- plain side

def _run_cmd(argv: list[str]) -> str | None:
    """None if ``argv`` succeeded, else its last line of error output."""
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if r.returncode == 0:
        return None
    return ((r.stderr or r.stdout).strip().splitlines() or [f"exit code {r.returncode}"])[-1]


class PlainFs:
    """A file system of exactly the pool's size for the plain writers."""

    def __init__(self, where: str, size: int):
        self.mnt = os.path.join(where, "fill-plain")
        self.img = os.path.join(where, "fill-plain.img")
        self.size = size
        self.kind = ""
        self.reason = ""

    def mount(self) -> bool:
        if os.geteuid() != 0:
            self.reason = ("not root: cannot mount a tmpfs or a loop-mounted ext4 image of "
                           "the pool's size")
            return False
        os.makedirs(self.mnt, exist_ok=True)
        err = _run_cmd(["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0755",
                        "curvine-bench-fill", self.mnt])
        if err is None:
            self.kind = "tmpfs"
            return True
        why = [f"mount -t tmpfs: {err}"]
        if shutil.which("mkfs.ext4"):
            with open(self.img, "wb") as f:
                f.truncate(self.size)
            err = (_run_cmd(["mkfs.ext4", "-q", "-F", "-m", "0", self.img])
                   or _run_cmd(["mount", "-o", "loop", self.img, self.mnt]))
            if err is None:
                self.kind = "ext4 on a loop device"
                return True
            why.append(f"loop ext4: {err}")
        else:
            why.append("loop ext4: no mkfs.ext4")
        self.reason = "; ".join(why)
        return False

    def unmount(self) -> list[str]:
        """Unmount (lazily if busy) and remove the image; what is still left."""
        if is_mounted(self.mnt):
            if _run_cmd(["umount", self.mnt]) is not None:
                _run_cmd(["umount", "-l", self.mnt])
        left = [self.mnt] if is_mounted(self.mnt) else []
        if not left:
            with contextlib.suppress(OSError):
                os.rmdir(self.mnt)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.img)
        return left


# --------------------------------------------------------------------------- the workload

@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM raises KeyboardInterrupt meanwhile, so that the finally blocks run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def _no_interrupts():
    """Clean-up that a second Ctrl-C must not cut short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        signal.signal(signal.SIGTERM, old_term)


class FillBench:
    """The ``fill`` workload: ``run()`` fills ``metrics`` and ``raw``."""

    def __init__(self, runs: int, pool_mib: int, top: str, say: Callable[[str], None]):
        self.runs = runs
        self.per_worker = pool_mib * MiB
        self.pool = 2 * self.per_worker
        self.quota = math.ceil(FILL_TIMES * self.pool / FILL_CHUNK)
        self.top = top
        self.say = say
        self.metrics: list[Metric] = []
        self.raw: dict = {"chunk_size": FILL_CHUNK, "per_worker_capacity": self.per_worker,
                          "writers": 2 * WRITERS_PER_MOUNT, "attempts_per_side": self.quota,
                          "sample_interval_s": SAMPLE_S, "curvine": [], "plain": [],
                          "plain_fs": None, "notes": []}

    def run(self) -> None:
        plain = PlainFs(self.top, self.pool)
        left: list[str] = []
        with _sigterm_interrupts():
            try:
                with _no_interrupts():
                    mounted = plain.mount()
                if mounted:
                    self.raw["plain_fs"] = {"kind": plain.kind, "size": self.pool,
                                            "path": plain.mnt}
                    self.say(f"  plain: {plain.kind} of {self.pool / MiB:g} MiB at {plain.mnt}")
                else:
                    self.raw["notes"].append(f"plain side skipped: {plain.reason}")
                    self.say(f"  plain side SKIPPED: {plain.reason}")
                for run in range(self.runs):
                    c = self._curvine(run)
                    p = self._plain(plain.mnt, run) if mounted else None
                    self._say_run(run, c, p)
            finally:
                with _no_interrupts():
                    left = plain.unmount()
                self._build_metrics()
        if left:
            raise BenchError(f"could not unmount {', '.join(left)}")

    # ------------------------------------------------------------- curvine
    def _curvine(self, run: int) -> dict:
        base = os.path.join(self.top, f"fill-cluster-{run}")
        cluster = LocalCluster(base, workers=2, mounts=2, worker_capacity=self.per_worker)
        mc = sampler = None
        out: dict = {"run": run}
        self.raw["curvine"].append(out)
        teardown = None
        try:
            t0 = time.perf_counter()
            mount_a, mount_b = cluster.up()
            out["cluster_up_s"] = round(time.perf_counter() - t0, 1)
            mc = MasterClient(cluster.master_addr, timeout=10.0, wait=10.0,
                              security=cluster.security)
            st = mc.capacity_status()
            high, low = st.high, st.low
            out.update(pool=st.capacity, high=high, low=low,
                       evicted_files_before=st.stats["evicted_files"])
            if st.capacity != self.pool:
                out["note"] = f"pool is {st.capacity} bytes, not {self.pool}"
            tag = f"fill-{os.getpid()}-{run}"
            dir_a, dir_b = os.path.join(mount_a, tag), os.path.join(mount_b, tag)
            os.mkdir(dir_a)
            if not os.path.isdir(dir_b):
                raise BenchError(f"{dir_a} made through mount A is not visible as {dir_b}")
            procs = name_procs(cluster.status(), [mount_a, mount_b])
            cpu = CpuMeter(procs)
            sampler = UsageSampler(mount_a)
            sampler.start()
            cpu.start()
            res = _run_writers([dir_a] * WRITERS_PER_MOUNT + [dir_b] * WRITERS_PER_MOUNT,
                               f"r{run}", self.quota, FILL_CHUNK)
            ev_after = mc.capacity_status().stats["evicted_files"]
            out["cpu_seconds"] = cpu.stop()
            # usage is reported by heartbeats: keep sampling until the pool is below the
            # low watermark again (or give up after SETTLE_MAX_S)
            settle_from = time.monotonic()
            while time.monotonic() - settle_from < SETTLE_MAX_S:
                time.sleep(0.1)
                if time.monotonic() - settle_from >= SETTLE_MIN_S and \
                        episodes(list(sampler.samples), high, low)[1] is None:
                    break
            sampler.stop()
            final = mc.capacity_status()
            out.update(_summarize(res))
            out["evicted_files_after_writes"] = ev_after
            out["evicted_files_after_settle"] = final.stats["evicted_files"]
            out["evictions"] = ev_after - out["evicted_files_before"]
            out["evictions_per_s"] = out["evictions"] / out["wall_s"]
            out["capacity_stats_end"] = dict(final.stats)
            if out["failed"]:  # for whoever is fixing it: what the daemons said
                out["log_problems"] = _log_problems(cluster.logs())
            out["used_end"], out["estimated_used_end"] = final.used, final.estimated_used
            done, open_ = episodes(sampler.samples, high, low)
            out["samples"] = len(sampler.samples)
            out["statfs_errors"] = sampler.errors
            out["peak_usage"] = round(max((u for _, u in sampler.samples), default=0.0), 4)
            out["episodes_ms"] = [round(e["ms"], 1) for e in done]
            out["episode_peaks"] = [round(e["peak"], 4) for e in done]
            out["episode_open_at_end"] = (None if open_ is None else
                                          {"ms_so_far": round(open_["ms_so_far"], 1),
                                           "peak": round(open_["peak"], 4)})
            return out
        finally:
            with _no_interrupts():
                if sampler is not None:
                    sampler.stop()
                if mc is not None:
                    with contextlib.suppress(Exception):
                        mc.close()
                try:
                    cluster.down()
                except ClusterError as e:
                    teardown = e
                    out["teardown_error"] = str(e)
                if teardown is None and not any(m.startswith(base + os.sep)
                                                for m in mounted_paths()):
                    shutil.rmtree(base, ignore_errors=True)
            if teardown is not None:
                raise BenchError(f"fill cluster teardown: {teardown}")

    # ------------------------------------------------------------- plain
    def _plain(self, mnt: str, run: int) -> dict:
        d = os.path.join(mnt, f"run-{run}")
        os.mkdir(d)
        try:
            res = _run_writers([d] * (2 * WRITERS_PER_MOUNT), f"p{run}", self.quota,
                               FILL_CHUNK)
            out = {"run": run, **_summarize(res)}
            self.raw["plain"].append(out)
            return out
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def _say_run(self, run: int, c: dict, p: dict | None) -> None:
        fails = ", ".join(f"{k} {v}" for k, v in sorted(c["failed_by_errno"].items()))
        eps = c["episodes_ms"]
        ep_text = (f"{len(eps)} episode(s) above {c['high']:.2f} (median "
                   f"{statistics.median(eps):.0f} ms, max {max(eps):.0f} ms)" if eps else
                   f"no episode above {c['high']:.2f} ended (peak usage {c['peak_usage']:.2f})")
        if c["episode_open_at_end"]:
            ep_text += ", one still above at the end"
        text = (f"  fill run {run + 1}/{self.runs}: curvine {c['stores_per_s']:.1f} stores/s, "
                f"{c['failed']} of {c['attempts']} failed{f' ({fails})' if fails else ''}, "
                f"{c['evictions']} evictions ({c['evictions_per_s']:.1f}/s), {ep_text}")
        if p is not None:
            text += (f"; plain {p['stores_per_s_until_first_enospc']:.1f} stores/s until the "
                     f"first ENOSPC, {p['failed']} failed")
        self.say(text)
        self.say("    CPU seconds (curvine side): "
                 + ", ".join(f"{k} {v:.1f}" for k, v in c.get("cpu_seconds", {}).items()))

    # ------------------------------------------------------------- table rows
    def _metric(self, id: str, label: str, unit: str, better: str) -> Metric:
        m = Metric("fill", id, label, unit, better)
        self.metrics.append(m)
        return m

    def _build_metrics(self) -> None:
        self.metrics.clear()
        cur = [c for c in self.raw["curvine"] if "stores_per_s" in c]
        pla = self.raw["plain"]
        if not cur and not pla:
            return
        m = self._metric("stores_per_s", "stores/s (plain: until its 1st ENOSPC)", "stores/s",
                         "higher")
        m.curvine = [c["stores_per_s"] for c in cur]
        m.plain = [p["stores_per_s_until_first_enospc"] for p in pla]
        m = self._metric("failed", f"stores failed, of {self.quota}", "count", "lower")
        m.curvine = [c["failed"] for c in cur]
        m.plain = [p["failed"] for p in pla]
        names = sorted({k for r in cur + pla for k in r["failed_by_errno"]})
        for name in names:
            m = self._metric(f"failed_{name}", f"  failed with {name}", "count", "lower")
            m.curvine = [c["failed_by_errno"].get(name, 0) for c in cur]
            m.plain = [p["failed_by_errno"].get(name, 0) for p in pla]
        m = self._metric("evictions_per_s", "evictions/s (files)", "files/s", "")
        m.curvine = [c["evictions_per_s"] for c in cur]
        high = cur[0]["high"] if cur else 0.9
        low = cur[0]["low"] if cur else 0.8
        m = self._metric("over_high_median", f"above {high:.2f} until below {low:.2f}, median",
                         "ms", "lower")
        m.curvine = [statistics.median(c["episodes_ms"]) for c in cur if c["episodes_ms"]]
        m = self._metric("over_high_max", f"above {high:.2f} until below {low:.2f}, max", "ms",
                         "lower")
        m.curvine = [max(c["episodes_ms"]) for c in cur if c["episodes_ms"]]
        m = self._metric("episodes", "episodes above the high watermark", "count", "")
        m.curvine = [len(c["episodes_ms"]) for c in cur]
        m = self._metric("episode_open", f"  not below {low:.2f} {SETTLE_MAX_S:g}s after the "
                         "writes", "count", "lower")
        m.curvine = [int(c["episode_open_at_end"] is not None) for c in cur]
