"""`curvine bench --workloads smallio`: small random I/O inside one file, and the
multi-process namespace workload, on curvine, a plain local directory and MooseFS in
the same run.

Per run and side (curvine: written through mount A, read through mount B; MooseFS:
its mount 1, read through its mount 2; plain: one directory):

a. ``randwrite_4k``: a ``--smallio-file-size`` file (64 MiB) is written and closed
   first (not timed); then open(O_RDWR), ``--smallio-ops`` pwrite(2) of 4 KiB at random
   4 KiB-aligned offsets, fsync, close: MB/s and ops/s from open to the end of close.
b. ``randwrite_64k``: the same with 64 KiB writes at 64 KiB-aligned offsets.
c. ``randread_{4k,64k}_{cold,warm}``: ``--smallio-ops`` pread(2) of that size at
   random aligned offsets of a freshly opened file.  *cold*: after the page cache is
   dropped (PageCache, as for the other workloads); *warm*: after one sequential read
   of the whole file (that read also checks every byte against what was written).
d. ``workload``: devtools/posix_workload.py, ``--smallio-procs`` processes x
   ``--smallio-workload-ops`` random namespace and data operations on one shared tree
   (seconds; the errors no race explains are counted; per-operation latencies go to
   the JSON and the report).

Each figure is a median over the runs; the report gives the ratios curvine/MooseFS
(the targets: curvine within 2x of MooseFS's time) and curvine/plain.  Without
MooseFS (``--moosefs-mounts``, its default mounts, or ``--moosefs-up``; see
bench_lmcache.MooseFs) its column says why and the _vs_moosefs rows have no figures.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import secrets
import shutil
import statistics
import time
from typing import Callable

from .bench_common import BenchError, Metric, PageCache
from .bench_lmcache import MooseFs
from .demo import format_table
from .posix_workload import run_workload

KiB, MiB = 1 << 10, 1 << 20
SIDES = ("curvine", "moosefs", "plain")
SIDE_TITLES = {"curvine": "curvine", "moosefs": "MooseFS", "plain": "local dir"}
IO_SIZES = (4 * KiB, 64 * KiB)
# measure id -> (label, unit, better); "mbps"/"iops" pairs share their runs' timings
MEASURES: dict[str, tuple[str, str, str]] = {}
for _s in ("4k", "64k"):
    MEASURES[f"randwrite_{_s}_mbps"] = (f"random {_s.upper()}iB writes + fsync, MB/s",
                                        "MB/s", "higher")
    MEASURES[f"randwrite_{_s}_iops"] = (f"random {_s.upper()}iB writes + fsync, ops/s",
                                        "ops/s", "higher")
for _s in ("4k", "64k"):
    for _m in ("cold", "warm"):
        MEASURES[f"randread_{_s}_{_m}_mbps"] = (f"random {_s.upper()}iB reads {_m}, MB/s",
                                                "MB/s", "higher")
        MEASURES[f"randread_{_s}_{_m}_iops"] = (f"random {_s.upper()}iB reads {_m}, ops/s",
                                                "ops/s", "higher")
MEASURES["workload_s"] = ("multi-process workload, s", "s", "lower")
MEASURES["workload_unexpected"] = ("multi-process workload, unexpected errors", "count",
                                   "lower")
WORKLOAD_TIMEOUT_S = 600.0


def _size_name(n: int) -> str:
    return f"{n // KiB}k"


class SmallIoBench:
    """Runs a-d ``runs`` times on each side that is available, sides interleaved."""

    def __init__(self, runs: int, file_size: int, ops: int, procs: int, workload_ops: int,
                 plain_root: str, mounts: tuple[str, str], cache: PageCache,
                 say: Callable[[str], None], moosefs: MooseFs | None = None,
                 workload_timeout: float = WORKLOAD_TIMEOUT_S):
        if file_size < max(IO_SIZES) or file_size % max(IO_SIZES):
            raise BenchError(f"--smallio-file-size must be a multiple of "
                             f"{max(IO_SIZES) // KiB} KiB")
        self.runs = runs
        self.file_size = file_size
        self.ops = ops
        self.procs = procs
        self.workload_ops = workload_ops
        self.workload_timeout = workload_timeout
        self.cache = cache
        self.say = say
        self.moosefs = moosefs or MooseFs()
        self.tag = f"smallio-{os.getpid()}-{secrets.token_hex(3)}"
        self.plain_root = plain_root
        self.mounts = mounts
        self.dirs: dict[str, tuple[str, str]] = {}  # side -> (write dir, read dir)
        self.available: dict[str, str | None] = {}  # side -> None or why not
        self.figures: dict[str, dict[str, list[float]]] = {s: {} for s in SIDES}
        self.latency: dict[str, list[dict]] = {s: [] for s in SIDES}  # per run, per op
        self.unexpected: dict[str, list[str]] = {s: [] for s in SIDES}  # first few
        self.expected_errors: dict[str, list[dict]] = {s: [] for s in SIDES}
        self.metrics: list[Metric] = []
        self.raw: dict = {}

    # ------------------------------------------------------------- setup
    def setup(self) -> None:
        a, b = self.mounts
        self.dirs["plain"] = (os.path.join(self.plain_root, self.tag),) * 2
        self.dirs["curvine"] = (os.path.join(a, self.tag), os.path.join(b, self.tag))
        self.available = {"plain": None, "curvine": None}
        self.moosefs.setup(self.say)
        if self.moosefs.mounts:
            m1, m2 = self.moosefs.mounts
            self.dirs["moosefs"] = (os.path.join(m1, self.tag), os.path.join(m2, self.tag))
            self.available["moosefs"] = None
        else:
            self.available["moosefs"] = f"skipped: MooseFS {self.moosefs.reason}"
            self.say(f"  MooseFS: {self.available['moosefs']}")
        for side in SIDES:
            if self.available.get(side):
                continue
            try:
                os.makedirs(self.dirs[side][0])
            except OSError as e:
                if side == "plain" or side == "curvine":
                    raise BenchError(f"{side}: cannot make {self.dirs[side][0]}: {e}") from e
                self.available[side] = f"skipped: {e}"
        deadline = time.monotonic() + 10
        for side in ("curvine", "moosefs"):
            if self.available.get(side) is None:
                while not os.path.isdir(self.dirs[side][1]):  # the other mount sees it
                    if time.monotonic() > deadline:
                        raise BenchError(f"{self.dirs[side][1]} made through the first mount "
                                         "is not visible through the second")
                    time.sleep(0.05)

    def cleanup(self) -> None:
        for side, (w, _r) in self.dirs.items():
            if side == "plain" or self.available.get(side) is None:
                shutil.rmtree(w, ignore_errors=True)
        self.moosefs.teardown()

    def _add(self, side: str, id: str, value: float) -> None:
        self.figures[side].setdefault(id, []).append(value)

    # ------------------------------------------------------------- a-c: one file
    def _make_file(self, path: str, model: bytearray) -> None:
        with open(path, "wb", buffering=0) as f:
            for off in range(0, self.file_size, MiB):
                f.write(memoryview(model)[off:off + MiB])
            os.fsync(f.fileno())

    def _randwrite(self, path: str, size: int, rng: random.Random,
                   model: bytearray) -> float:
        slots = self.file_size // size
        offsets = [rng.randrange(slots) * size for _ in range(self.ops)]
        payload = os.urandom(size + 4 * KiB)
        starts = [rng.randrange(4 * KiB) for _ in range(self.ops)]
        t0 = time.perf_counter()
        fd = os.open(path, os.O_RDWR)
        try:
            for off, s in zip(offsets, starts):
                if os.pwrite(fd, memoryview(payload)[s:s + size], off) != size:
                    raise BenchError(f"{path}: short write at {off}")
            os.fsync(fd)
        finally:
            os.close(fd)
        seconds = time.perf_counter() - t0
        for off, s in zip(offsets, starts):
            model[off:off + size] = payload[s:s + size]
        return seconds

    def _randread(self, path: str, size: int, rng: random.Random) -> float:
        slots = self.file_size // size
        offsets = [rng.randrange(slots) * size for _ in range(self.ops)]
        t0 = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        try:
            for off in offsets:
                if len(os.pread(fd, size, off)) != size:
                    raise BenchError(f"{path}: short read at {off}")
        finally:
            os.close(fd)
        return time.perf_counter() - t0

    def _check_file(self, path: str, model: bytearray) -> None:
        """Read the whole file (this warms the page cache) and compare every byte."""
        h = hashlib.sha256()
        got = 0
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(MiB):
                h.update(chunk)
                got += len(chunk)
        if got != len(model) or h.digest() != hashlib.sha256(model).digest():
            raise BenchError(f"{path}: read back {got} bytes that differ from the "
                             f"{len(model)} written")

    def _file_io(self, side: str, run: int) -> str:
        wdir, rdir = self.dirs[side]
        name = f"file-r{run}"
        wpath, rpath = os.path.join(wdir, name), os.path.join(rdir, name)
        rng = random.Random(f"smallio/{run}")
        model = bytearray(rng.randbytes(self.file_size))
        notes = []
        try:
            self._make_file(wpath, model)
            for size in IO_SIZES:
                s = self._randwrite(wpath, size, rng, model)
                n = _size_name(size)
                self._add(side, f"randwrite_{n}_mbps", self.ops * size / 1e6 / s)
                self._add(side, f"randwrite_{n}_iops", self.ops / s)
                notes.append(f"write {n} {self.ops * size / 1e6 / s:.1f} MB/s")
            os.sync()
            for size in IO_SIZES:
                n = _size_name(size)
                self.cache.drop([wpath] if side == "plain" else [])
                s = self._randread(rpath, size, rng)
                self._add(side, f"randread_{n}_cold_mbps", self.ops * size / 1e6 / s)
                self._add(side, f"randread_{n}_cold_iops", self.ops / s)
                self._check_file(rpath, model)  # warms the page cache
                s = self._randread(rpath, size, rng)
                self._add(side, f"randread_{n}_warm_mbps", self.ops * size / 1e6 / s)
                self._add(side, f"randread_{n}_warm_iops", self.ops / s)
            notes.append("read 4k cold/warm "
                         f"{self.figures[side]['randread_4k_cold_iops'][-1]:,.0f}/"
                         f"{self.figures[side]['randread_4k_warm_iops'][-1]:,.0f} ops/s")
        finally:
            with contextlib.suppress(OSError):
                os.unlink(wpath)
        return ", ".join(notes)

    # ------------------------------------------------------------- d: the workload
    def _workload(self, side: str, run: int) -> str:
        root = os.path.join(self.dirs[side][0], f"workload-r{run}")
        try:
            res = run_workload(root, self.procs, self.workload_ops, seed=run,
                               timeout=self.workload_timeout)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        self._add(side, "workload_s", res.seconds)
        self._add(side, "workload_unexpected", float(len(res.unexpected)))
        self.latency[side].append(res.latency)
        self.expected_errors[side].append(res.expected_errors)
        if len(self.unexpected[side]) < 20:
            self.unexpected[side].extend(res.unexpected[:20 - len(self.unexpected[side])])
        return (f"workload {res.seconds:.1f} s" + (" (TIMED OUT)" if res.timed_out else "")
                + (f", {len(res.unexpected)} unexpected errors" if res.unexpected else ""))

    # ------------------------------------------------------------- run
    def run(self) -> None:
        self.say(f"  a-c: one {self.file_size / MiB:g} MiB file, {self.ops} random "
                 f"{'/'.join(_size_name(s) for s in IO_SIZES)} writes (+ fsync) and reads "
                 f"per measure; d: {self.procs} processes x {self.workload_ops} operations")
        for run in range(self.runs):
            for side in SIDES:
                if self.available.get(side):
                    continue
                try:
                    notes = [self._file_io(side, run), self._workload(side, run)]
                except (OSError, BenchError) as e:
                    if side in ("plain", "curvine"):
                        raise BenchError(f"smallio on {SIDE_TITLES[side]}: {e}") from e
                    self.available[side] = f"failed: {e}"
                    self.say(f"  {SIDE_TITLES[side]}: FAILED, left out from here on: {e}")
                    continue
                self.say(f"  run {run + 1}/{self.runs} {SIDE_TITLES[side]}: "
                         + "; ".join(notes))
        self._build_metrics()

    # ------------------------------------------------------------- results
    def _median(self, side: str, id: str) -> float | None:
        xs = self.figures[side].get(id)
        return statistics.median(xs) if xs else None

    def _build_metrics(self) -> None:
        for id, (label, unit, better) in MEASURES.items():
            self.metrics.append(Metric("smallio", id, label, unit, better,
                                       curvine=list(self.figures["curvine"].get(id, [])),
                                       plain=list(self.figures["plain"].get(id, []))))
        for id, (label, unit, better) in MEASURES.items():
            if id == "workload_unexpected":
                continue
            self.metrics.append(Metric("smallio", f"{id}_vs_moosefs",
                                       f"{label}: curvine / MooseFS (plain column)", unit,
                                       better,
                                       curvine=list(self.figures["curvine"].get(id, [])),
                                       plain=list(self.figures["moosefs"].get(id, []))))
        self.raw = {"file_size": self.file_size, "ops": self.ops, "procs": self.procs,
                    "workload_ops": self.workload_ops, "figures": self.figures,
                    "available": self.available, "workload_latency_ms": self.latency,
                    "workload_expected_errors": self.expected_errors,
                    "workload_unexpected_first": self.unexpected,
                    "dirs": {s: list(d) for s, d in self.dirs.items()}}

    def op_latency(self) -> dict[str, dict[str, float]]:
        """Per workload operation and side: the median over runs of the mean ms."""
        out: dict[str, dict[str, float]] = {}
        for side in SIDES:
            per_op: dict[str, list[float]] = {}
            for run in self.latency[side]:
                for op, fig in run.items():
                    if fig.get("count"):
                        per_op.setdefault(op, []).append(fig["mean_ms"])
            for op, xs in per_op.items():
                out.setdefault(op, {})[side] = statistics.median(xs)
        return out

    def report(self) -> str:
        rows = [("measure", "curvine", "MooseFS", "local dir", "curvine/MooseFS",
                 "curvine/local", "target", "")]
        by_id = {m.id: m for m in self.metrics}

        def fmt(x: float | None, unit: str) -> str:
            if x is None:
                return "-"
            if unit in ("ops/s", "count"):
                return f"{x:,.0f}"
            return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"

        def ratio(a: float | None, b: float | None) -> str:
            return "-" if a is None or not b else f"{a / b:.2f}x"

        for id, (label, unit, _better) in MEASURES.items():
            c, m, p = (self._median(s, id) for s in SIDES)
            vs = by_id.get(f"{id}_vs_moosefs")
            t = vs.target if vs is not None else None
            rows.append((label, fmt(c, unit), fmt(m, unit), fmt(p, unit), ratio(c, m),
                         ratio(c, p), str(t) if t else "", (vs.status or "") if t else ""))
        lines = [format_table(rows, left=1)]
        for side in SIDES:
            why = self.available.get(side)
            if why:
                lines.append(f"  {SIDE_TITLES[side]}: {why}")
        lat = self.op_latency()
        if lat:
            lines += ["", "  multi-process workload, mean ms per operation (median of runs):"]
            op_rows = [("op", "curvine", "MooseFS", "local dir", "curvine/MooseFS")]
            for op in sorted(lat, key=lambda o: -(lat[o].get("curvine") or 0)):
                c, m, p = (lat[op].get(s) for s in SIDES)
                op_rows.append((op, *(f"{x:.2f}" if x is not None else "-" for x in (c, m, p)),
                                ratio(c, m)))
            lines.append(format_table(op_rows, left=1))
        for side in SIDES:
            if self.unexpected[side]:
                lines.append(f"  {SIDE_TITLES[side]}: unexpected errors in the workload "
                             f"(first of them): " + "; ".join(self.unexpected[side][:5]))
        lines += ["", "  MB/s, ops/s and s are medians; curvine writes through mount A and "
                  "reads through mount B (MooseFS: mount 1 and 2); target: curvine within "
                  "2x of MooseFS (time ratio <= 2, rate ratio >= 0.5)"]
        return "\n".join(lines)
