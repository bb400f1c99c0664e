"""What the bench command and its workload modules share: the rows of the report
(``Metric``, scored against ``TARGETS``), the error a workload raises (``BenchError``),
cache eviction before a cold read (``PageCache``), CPU seconds per daemon (``CpuMeter``)
and the names of a local cluster's daemons (``name_procs``).

bench.py runs the workloads and imports their modules (bench_fill.py, bench_lmcache.py,
bench_smallio.py ...) inside its functions; they take these from here, not from
bench.py, so that no import goes round in a circle (tests/test_layers_client.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics

from .local import proc_stat

MiB = 1 << 20


class BenchError(Exception):
    """The benchmark could not run or a workload read back wrong data."""


# --------------------------------------------------------------------------- results

@dataclasses.dataclass(frozen=True)
class Target:
    """A goal from issue 3: on the ratio curvine/plain, or on the absolute value."""

    op: str  # ">=" or "<="
    value: float
    on: str = "ratio"  # "ratio" or "value"
    peers: str = ""  # what JuiceFS, SeaweedFS, MooseFS reach on this machine kind

    def met(self, x: float) -> bool:
        return x >= self.value if self.op == ">=" else x <= self.value

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}" + ("x" if self.on == "ratio" else "")


TARGETS = {
    ("kv", "write"): Target(">=", 1.0, peers="0.62x, 0.36x, 0.76x"),
    ("kv", "cold_read"): Target(">=", 0.8, peers="0.23x, 0.14x, 0.20x"),
    ("prompt", "cold"): Target("<=", 1.3, peers="2.9x, 5.1x, 3.1x"),
    ("prompt", "warm"): Target("<=", 1.5, peers="7.5x, 13x, 6x"),
    ("meta", "create_1p"): Target(">=", 0.25, peers="0.06x, 0.02x, 0.18x"),
    ("meta", "stat_1p"): Target(">=", 0.1, peers="0.015x, 0.05x, 0.035x"),
    ("meta", "unlink_1p"): Target(">=", 0.05, peers="0.007x, 0.003x, 0.035x"),
    ("memory", "fuse_read_peak"): Target("<=", 300, on="value"),
    # issue 14: ratios to fs:// on the plain directory, except where noted
    ("lmcache", "connector_sc_retrieve_cold"): Target("<=", 1.2),
    ("lmcache", "connector_sc_retrieve_warm"): Target("<=", 1.2),
    ("lmcache", "connector_sc_store"): Target("<=", 1.5),
    ("lmcache", "connector_sc_rpcs_lookup_hit"): Target("<=", 1, on="value"),
    ("lmcache", "connector_sc_rpcs_lookup_miss"): Target("<=", 1, on="value"),
    ("lmcache", "connector_remote_rpcs_lookup_hit"): Target("<=", 1, on="value"),
    ("lmcache", "connector_remote_rpcs_lookup_miss"): Target("<=", 1, on="value"),
    # 3x faster than the remote mount read of issue 14 (385 ms cold, 260 ms warm)
    ("lmcache", "connector_remote_retrieve_cold"): Target("<=", 128, on="value"),
    ("lmcache", "connector_remote_retrieve_warm"): Target("<=", 87, on="value"),
    # ratio to MooseFS's remote read of the same prompt in the same run
    ("lmcache", "connector_remote_vs_moosefs_retrieve_cold"): Target("<=", 1.0),
    ("lmcache", "connector_remote_vs_moosefs_retrieve_warm"): Target("<=", 1.0),
    # issue 15: within 2x of MooseFS's time in the same run (rates: >= 0.5x of its rate)
    ("smallio", "randwrite_4k_mbps_vs_moosefs"): Target(">=", 0.5),
    ("smallio", "randwrite_64k_mbps_vs_moosefs"): Target(">=", 0.5),
    ("smallio", "randread_4k_cold_mbps_vs_moosefs"): Target(">=", 0.5),
    ("smallio", "randread_4k_warm_mbps_vs_moosefs"): Target(">=", 0.5),
    ("smallio", "randread_64k_cold_mbps_vs_moosefs"): Target(">=", 0.5),
    ("smallio", "randread_64k_warm_mbps_vs_moosefs"): Target(">=", 0.5),
    ("smallio", "workload_s_vs_moosefs"): Target("<=", 2.0),
    ("smallio", "workload_unexpected"): Target("<=", 0, on="value"),
}


@dataclasses.dataclass
class Metric:
    """One row of the table: per-run figures of both sides."""

    workload: str
    id: str
    label: str
    unit: str
    better: str  # "higher" or "lower"
    curvine: list[float] = dataclasses.field(default_factory=list)
    plain: list[float] = dataclasses.field(default_factory=list)

    @staticmethod
    def _median(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    @property
    def curvine_median(self) -> float | None:
        return self._median(self.curvine)

    @property
    def plain_median(self) -> float | None:
        return self._median(self.plain)

    @property
    def ratio(self) -> float | None:
        """curvine / plain, for rates and times alike (``better`` says which way is good)."""
        c, p = self.curvine_median, self.plain_median
        return c / p if c is not None and p else None

    @property
    def target(self) -> Target | None:
        return TARGETS.get((self.workload, self.id))

    @property
    def status(self) -> str | None:
        t = self.target
        if t is None:
            return None
        x = self.ratio if t.on == "ratio" else self.curvine_median
        return None if x is None else ("pass" if t.met(x) else "miss")

    def to_json(self) -> dict:
        t = self.target
        return {
            "id": self.id, "label": self.label, "unit": self.unit, "better": self.better,
            "curvine": {"runs": self.curvine, "median": self.curvine_median},
            "plain": {"runs": self.plain, "median": self.plain_median},
            "ratio": self.ratio,
            "target": dataclasses.asdict(t) if t else None,
            "status": self.status,
        }


def percentile(xs: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the closest ranks."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# --------------------------------------------------------------------------- page cache

class PageCache:
    """Evicts data before a cold read: drop_caches as root, else posix_fadvise.

    ``fadvise`` can only evict files the benchmark can name: the plain side's and,
    for a cluster it started, the workers' block files."""

    def __init__(self, enabled: bool, block_dirs: list[str]):
        self.block_dirs = block_dirs
        if not enabled:
            self.method = "none"
        elif os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK):
            self.method = "drop_caches"
        else:
            self.method = "fadvise"
        self.count = 0

    @property
    def dropped(self) -> bool:
        return self.method != "none"

    def describe(self) -> str:
        if self.method == "drop_caches":
            return ("page cache DROPPED before each cold read (sync; echo 3 > "
                    "/proc/sys/vm/drop_caches); curvine's blocks are on the same disk, "
                    "so the drop empties both sides")
        if self.method == "fadvise":
            where = ("the plain files and the workers' block files" if self.block_dirs else
                     "the plain files only (the blocks behind --mounts are out of reach)")
            return (f"page cache NOT dropped (not root); evicted with posix_fadvise(DONTNEED): "
                    f"{where}")
        return "page cache NOT dropped (--no-drop-caches): 'cold' reads may hit the page cache"

    def drop(self, files: list[str] = ()) -> None:
        if self.method == "none":
            return
        os.sync()
        self.count += 1
        if self.method == "drop_caches":
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return
        paths = list(files)
        for d in self.block_dirs:
            for root, _dirs, names in os.walk(d):
                paths.extend(os.path.join(root, n) for n in names)
        for p in paths:
            with contextlib.suppress(OSError):
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


# --------------------------------------------------------------------------- CPU

def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of ``pid`` so far (None if it is gone)."""
    fields = proc_stat(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class CpuMeter:
    """CPU seconds each daemon (and this process) spends in one workload: where the
    time goes when the machine, not the disk, is the limit."""

    def __init__(self, procs: dict[str, int]):
        self.procs = dict(procs)
        self._start: dict[str, float | None] = {}

    def _now(self) -> dict[str, float | None]:
        t = os.times()
        now = {name: _cpu_seconds(pid) for name, pid in self.procs.items()}
        now["bench"] = t.user + t.system + t.children_user + t.children_system
        return now

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> dict[str, float]:
        end = self._now()
        return {k: round(end[k] - self._start[k], 2) for k in end
                if end[k] is not None and self._start.get(k) is not None}


def name_procs(rows: list[dict], mounts: list[str]) -> dict[str, int]:
    """Label -> pid of the live daemons of a local cluster (``LocalCluster.status()``
    rows): "master", "worker <i>", and "fuse A" / "fuse B" for the mounts ``mounts``
    names (the others by index)."""
    names = {}
    for r in rows:
        if not r["alive"]:
            continue
        if r["role"] == "fuse":
            m = os.path.realpath(r["mount"] or "")
            label = "A" if m == mounts[0] else "B" if m == mounts[1] else str(r["index"])
            names[f"fuse {label}"] = r["pid"]
        else:
            names[f"{r['role']} {r['index']}" if r["role"] == "worker" else r["role"]] = r["pid"]
    return names
