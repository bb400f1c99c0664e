"""Metadata micro-benchmark: one flat directory on a curvine mount vs a plain dir.

    .venv/bin/python scripts/meta_bench.py [--files 5000] [--missing 1000]
        [--procs 1,8] [--runs 3] [--mount PATH --mount2 PATH] [--plain DIR]
        [--conf FILE] [--json OUT]

Without --mount it starts a local cluster (1 worker, 2 mounts) under a temp dir.
Per run and per process count: create+close (os.close(os.open(O_CREAT|O_WRONLY)))
of N files, stat of each, unlink of each, stat of M missing names; ops/s are
total ops / wall time.  Prints medians of --runs and ratios to the plain dir.
``--mount2`` (a second mount of the same cluster) adds a cross-mount check: every
name created on mount 1 must be found by stat on mount 2 at once (rule 2).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

OPS = ("create", "stat", "unlink", "miss")
OPS_ORDER = ("create", "stat", "miss", "unlink")  # as the workers run them


def _worker(d: str, names: list[str], missing: list[str], barrier, q) -> None:
    res = {}
    flags = os.O_CREAT | os.O_WRONLY
    paths = [os.path.join(d, n) for n in names]
    miss = [os.path.join(d, n) for n in missing]
    barrier.wait()
    t = time.perf_counter()
    for p in paths:
        os.close(os.open(p, flags, 0o644))
    res["create"] = (t, time.perf_counter())
    barrier.wait()
    t = time.perf_counter()
    for p in paths:
        os.stat(p)
    res["stat"] = (t, time.perf_counter())
    barrier.wait()
    t = time.perf_counter()
    for p in miss:
        try:
            os.stat(p)
            raise SystemExit(f"{p} exists")
        except FileNotFoundError:
            pass
    res["miss"] = (t, time.perf_counter())
    barrier.wait()
    t = time.perf_counter()
    for p in paths:
        os.unlink(p)
    res["unlink"] = (t, time.perf_counter())
    barrier.wait()
    q.put(res)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (and their threads)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def run_once(root: str, files: int, missing: int, procs: int, tag: str,
             daemons: dict[str, list[int]] | None = None) -> dict[str, float]:
    d = os.path.join(root, f"mb-{tag}-{os.getpid()}-{time.monotonic_ns()}")
    os.mkdir(d)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(procs + 1)  # the parent too: it samples daemon CPU per phase
    q = ctx.Queue()
    per = files // procs
    mper = missing // procs
    ps = []
    for i in range(procs):
        names = [f"key{i:02d}_{j:06d}.data" for j in range(per)]
        miss = [f"none{i:02d}_{j:06d}.data" for j in range(mper)]
        p = ctx.Process(target=_worker, args=(d, names, miss, barrier, q))
        p.start()
        ps.append(p)
    daemons = daemons or {}
    marks = []  # daemon CPU seconds at the start of each phase and at the end
    for _ in range(len(OPS_ORDER) + 1):
        barrier.wait()
        marks.append({role: cpu_seconds(pids) for role, pids in daemons.items()})
    results = [q.get() for _ in ps]
    for p in ps:
        p.join()
    os.rmdir(d)
    out = {}
    for k, op in enumerate(OPS_ORDER):
        start = min(r[op][0] for r in results)
        end = max(r[op][1] for r in results)
        n = mper * procs if op == "miss" else per * procs
        out[op] = n / (end - start)
        for role in daemons:  # daemon CPU microseconds per operation
            out[f"{op}_cpu_{role}"] = (marks[k + 1][role] - marks[k][role]) / n * 1e6
    return out


def cross_mount_check(m1: str, m2: str, n: int = 200) -> int:
    """Names created on m1 are found on m2 at once; returns the failures."""
    d = f"xm-{os.getpid()}-{time.monotonic_ns()}"
    os.mkdir(os.path.join(m1, d))
    bad = 0
    for i in range(n):
        name = f"k{i}.data"
        try:  # a miss first, so a negative entry would be cached if it were
            os.stat(os.path.join(m2, d, name))
            bad += 1
        except FileNotFoundError:
            pass
        os.close(os.open(os.path.join(m1, d, name), os.O_CREAT | os.O_WRONLY, 0o644))
        try:
            os.stat(os.path.join(m2, d, name))
        except FileNotFoundError:
            bad += 1
        os.unlink(os.path.join(m1, d, name))
        try:
            os.stat(os.path.join(m2, d, name))
            # an unlink on m1 may stay visible on m2 for the positive attr/entry timeout
        except FileNotFoundError:
            pass
    for name in os.listdir(os.path.join(m1, d)):
        os.unlink(os.path.join(m1, d, name))
    os.rmdir(os.path.join(m1, d))
    return bad


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--missing", type=int, default=1000)
    ap.add_argument("--procs", default="1,8")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mount")
    ap.add_argument("--mount2")
    ap.add_argument("--plain")
    ap.add_argument("--conf")
    ap.add_argument("--base")
    ap.add_argument("--json")
    ap.add_argument("--only", choices=("fs", "plain", "both"), default="both")
    args = ap.parse_args()
    procs_list = [int(x) for x in args.procs.split(",")]

    cluster = None
    if args.mount is None and args.only != "plain":
        from curvine.devtools.local import LocalCluster
        base = args.base or tempfile.mkdtemp(prefix="meta-bench-")
        cluster = LocalCluster(base, workers=1, mounts=2, conf=args.conf)
        cluster.up()
        args.mount, args.mount2 = cluster.mounts[0], cluster.mounts[1]
        print(f"cluster under {base}: mounts {cluster.mounts}", file=sys.stderr)
    daemons: dict[str, list[int]] = {}
    if cluster is not None:
        with open(cluster.state_path) as f:
            for p in json.load(f)["procs"]:
                if p["role"] == "master" or (p["role"] == "fuse" and p["index"] == 0):
                    daemons[p["role"]] = [p["pid"]]
    plain = args.plain or tempfile.mkdtemp(prefix="meta-bench-plain-", dir="/tmp")
    try:
        targets = []
        if args.only in ("plain", "both"):
            targets.append(("plain", plain))
        if args.only in ("fs", "both"):
            targets.append(("curvine", args.mount))
        table: dict = {}
        load = []
        for procs in procs_list:
            for run in range(args.runs):
                for name, root in targets:
                    r = run_once(root, args.files, args.missing, procs, name,
                                 daemons if name == "curvine" else None)
                    load.append(os.getloadavg()[0])
                    for op in OPS:
                        table.setdefault((name, procs, op), []).append(r[op])
                        for role in daemons:
                            if f"{op}_cpu_{role}" in r:
                                table.setdefault((role, procs, op), []).append(
                                    r[f"{op}_cpu_{role}"])
                    print(f"  run {run} {name} p={procs}: " +
                          " ".join(f"{op}={r[op]:.0f}/s" for op in OPS), file=sys.stderr)
        xm = None
        if args.mount2 and args.only != "plain":
            xm = cross_mount_check(args.mount, args.mount2)
        out = {"files": args.files, "missing": args.missing, "runs": args.runs,
               "load_avg_1m": {"min": min(load), "median": statistics.median(load),
                               "max": max(load)},
               "cross_mount_failures": xm, "results": []}
        print(f"\n{'procs':>5} {'op':>7} {'plain/s':>10} {'curvine/s':>10} {'ratio':>7} "
              f"{'fuse us/op':>10} {'master us/op':>12}  (daemon CPU per op)")
        for procs in procs_list:
            for op in OPS:
                p = statistics.median(table.get(("plain", procs, op), [0])) or None
                c = statistics.median(table.get(("curvine", procs, op), [0])) or None
                ratio = c / p if (c and p) else None
                cpu = {role: statistics.median(table[(role, procs, op)])
                       for role in daemons if (role, procs, op) in table}
                out["results"].append({"procs": procs, "op": op, "plain": p, "curvine": c,
                                       "ratio": ratio, "cpu_us_per_op": cpu})
                fmt = lambda v: f"{v:10.0f}" if v else f"{'-':>10}"  # noqa: E731
                print(f"{procs:>5} {op:>7} {fmt(p)} {fmt(c)} "
                      f"{(f'{ratio:7.3f}' if ratio else '-'):>7} "
                      f"{cpu.get('fuse', 0):10.0f} {cpu.get('master', 0):12.0f}")
        print(f"load average (1 min) during runs: min {min(load):.2f} median "
              f"{statistics.median(load):.2f} max {max(load):.2f}; cross-mount failures: {xm}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    finally:
        if cluster is not None:
            cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
