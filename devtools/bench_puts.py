"""`curvine bench --workloads puts` (issue 36): 14 MiB chunk stores with several in
flight, through the connector (connector/store.py ``KVStore.put``) beside the same work
on a plain local directory, in the same run.

LMCache hands its puts to a thread pool or an event loop (the remote plugin, the L2
adapter's store tasks), so a prompt's chunks are stored concurrently.  Per round:

- ``x1``, ``x4``, ``x16``: 16 chunks of 14 MiB (16 source buffers, written once before
  the first round, as LMCache's reused tensor memory is), submitted at once to a pool
  of 1, 4 or 16 threads: on curvine one ``KVStore.put`` each; on the plain directory
  LMCache ``fs://``'s way, write ``<key>.tmp`` and rename it to ``<key>``.  Figures: the
  median time of a chunk from submission to its end (what a caller waits for), and
  the round's wall time.
- ``prompt``: the seed prompt's 8 chunks, all in flight at once.  The target of
  issue 36: no longer than writing its bytes into the page cache (the plain side)
  plus two master calls (``master calls ms``: the median of sequential empty
  ``KVStore.put`` calls, each one master call, times two).

The two sides alternate which goes first; every figure is the median over ``runs``
rounds.  The files are removed after each round, outside the timed part (their
pages go back to the kernel on both sides alike; the curvine side waits until the
workers deleted the blocks).  This machine backs guest memory
lazily (the first touch of a page costs ~10x, docs/measurements.md): before the
first round the benchmark writes over ``TOUCH_FRACTION`` of MemAvailable (at most
``TOUCH_MAX``) once and frees it, and one unmeasured round of each side goes first.

Master calls per chunk: the master's ``curvine_rpc_server_handled_total`` by method
(the call port's calls are counted there too), scraped around the curvine side.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import mmap
import os
import secrets
import shutil
import statistics
import sys
import time
import urllib.request
from typing import Callable

from .lmcache_pod import master_rpcs, rpc_delta
from .local import LocalCluster, bench_cluster

MiB = 1 << 20
CHUNK = 14 * MiB
CHUNKS = 16  # per x1/x4/x16 round
PROMPT_CHUNKS = 8
CONCURRENCY = (1, 4, 16)
TOUCH_FRACTION = 0.5
TOUCH_MAX = 8 << 30
SETTLE_S = 10.0
EMPTY_PUTS = 20  # sequential empty puts for the master-call allowance


def touch_memory(fraction: float = TOUCH_FRACTION, cap: int = TOUCH_MAX) -> int:
    """Write ``fraction`` of MemAvailable (at most ``cap`` bytes) once, then free it:
    the host backs those guest pages from here on.  Bytes touched."""
    avail = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    n = min(int(avail * fraction), cap) // mmap.PAGESIZE * mmap.PAGESIZE
    piece = 256 * MiB
    done = 0
    maps = []
    try:
        while done < n:
            m = mmap.mmap(-1, min(piece, n - done))
            for off in range(0, len(m), mmap.PAGESIZE):
                m[off] = 1
            maps.append(m)
            done += len(m)
    finally:
        for m in maps:
            m.close()
    return done


def _plain_store(directory: str, key: str, data: memoryview) -> None:
    """LMCache ``fs://``'s store: ``<key>.tmp`` (O_TRUNC), one write, close, rename."""
    tmp = os.path.join(directory, key + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = data
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(directory, key))


class PutsBench:
    """The rounds above on ``cluster`` (a KVStore of its client config) and ``plain``."""

    def __init__(self, cluster: LocalCluster, plain_root: str, say: Callable[[str], None],
                 runs: int = 5, chunk: int = CHUNK, concurrency: tuple[int, ...] = CONCURRENCY):
        from curvine.common import config as config_mod
        from curvine.connector.store import KVStore

        self.say = say
        self.runs = runs
        self.chunk = chunk
        self.concurrency = concurrency
        tag = f"bench-puts-{os.getpid()}-{secrets.token_hex(3)}"
        self.plain = os.path.join(plain_root, tag)
        os.makedirs(self.plain)
        self.kv = KVStore(config_mod.load(cluster.client_conf), namespace="/" + tag)
        rows = cluster.status()
        self.metrics_url = next(r["metrics"] for r in rows if r["role"] == "master")
        self.worker_urls = [r["metrics"] for r in rows if r["role"] == "worker"]
        # distinct source buffers, written once (LMCache's tensor memory is reused)
        self.buffers = [memoryview(bytearray(os.urandom(4096) * (chunk // 4096)))
                        for _ in range(CHUNKS)]
        self.figures: dict[str, list[float]] = {}
        self.calls: dict[str, dict] = {}  # measure -> master calls per chunk by method
        self._round = 0

    def close(self) -> None:
        self.kv.close()
        shutil.rmtree(self.plain, ignore_errors=True)

    def _add(self, key: str, value: float) -> None:
        self.figures.setdefault(key, []).append(value)

    # -- one round of one side ---------------------------------------------------------
    def _round_of(self, side: str, n: int, threads: int) -> tuple[float, list[float]]:
        """(wall seconds, seconds each chunk's store took) of ``n`` chunks on a pool of
        ``threads``; the files are removed afterwards."""
        self._round += 1
        keys = [f"r{self._round}-c{i}" for i in range(n)]
        if side == "curvine":
            def store(i: int) -> None:
                if not self.kv.put(keys[i], [self.buffers[i]]):
                    raise RuntimeError(f"{keys[i]}: existed")
        else:
            def store(i: int) -> None:
                _plain_store(self.plain, keys[i], self.buffers[i])
        took: list[float] = [0.0] * n

        def timed(i: int) -> None:
            t = time.perf_counter()
            store(i)
            took[i] = time.perf_counter() - t

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            t0 = time.perf_counter()
            futs = [pool.submit(timed, i) for i in range(n)]
            for f in futs:
                f.result()
            wall = time.perf_counter() - t0
        if side == "curvine":
            before = self._worker_blocks()
            for k in keys:
                self.kv.remove(k)
            self._settle(before - n)
        else:
            for k in keys:
                os.unlink(os.path.join(self.plain, k))
        return wall, took

    def _worker_blocks(self) -> int:
        total = 0
        for url in self.worker_urls:
            with urllib.request.urlopen(url, timeout=5) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith("curvine_worker_blocks "):
                        total += int(float(line.split()[1]))
        return total

    def _settle(self, blocks: int) -> None:
        """Wait (at most SETTLE_S) until the workers deleted the blocks of the removed
        files: the master sends the deletes later, and a worker's unlink of 14 MiB block
        files would fall into the next measure (the plain side unlinks before it)."""
        end = time.monotonic() + SETTLE_S
        while self._worker_blocks() > blocks and time.monotonic() < end:
            time.sleep(0.02)

    def _measure(self, name: str, n: int, threads: int, first: str) -> None:
        for side in (first, "plain" if first == "curvine" else "curvine"):
            before = master_rpcs(self.metrics_url) if side == "curvine" else None
            wall, chunks = self._round_of(side, n, threads)
            if side == "curvine":
                calls = rpc_delta(before, master_rpcs(self.metrics_url))
                if calls is not None:
                    # the removals after the round are not the store's
                    by = {m: c / n for m, c in calls["by_method"].items() if m != "Unlink"}
                    self.calls[name] = by
            self._add(f"{name} {side} chunk ms", statistics.median(chunks) * 1e3)
            self._add(f"{name} {side} wall ms", wall * 1e3)

    def _master_call_ms(self) -> float:
        """Median of sequential empty puts (one PutFile each, no block): one master call."""
        times = []
        for i in range(EMPTY_PUTS):
            t0 = time.perf_counter()
            self.kv.put(f"empty-{self._round}-{i}", [])
            times.append(time.perf_counter() - t0)
            self.kv.remove(f"empty-{self._round}-{i}")
        return statistics.median(times) * 1e3

    def run(self) -> dict[str, float]:
        t0 = time.perf_counter()
        touched = touch_memory()
        self.say(f"  touched {touched / MiB:,.0f} MiB of memory once in "
                 f"{time.perf_counter() - t0:.1f}s; a warm-up round per side")
        for side in ("curvine", "plain"):
            self._round_of(side, CHUNKS, max(self.concurrency))
        for run in range(self.runs):
            first = "curvine" if run % 2 == 0 else "plain"
            self.say(f"  run {run + 1}/{self.runs} ({first} first)")
            for c in self.concurrency:
                self._measure(f"x{c}", CHUNKS, c, first)
            self._measure("prompt", PROMPT_CHUNKS, PROMPT_CHUNKS, first)
            self._add("master calls ms", 2 * self._master_call_ms())
        medians = {k: statistics.median(v) for k, v in self.figures.items()}
        for name in [f"x{c}" for c in self.concurrency] + ["prompt"]:
            for what in ("chunk", "wall"):
                cur, pl = medians[f"{name} curvine {what} ms"], medians[f"{name} plain {what} ms"]
                medians[f"{name} {what} ratio"] = cur / pl if pl else float("nan")
        medians["prompt target ms"] = (medians["prompt plain wall ms"]
                                       + medians["master calls ms"])
        return medians


def report(medians: dict[str, float], calls: dict[str, dict]) -> str:
    rows = [f"{'measure':<10} {'curvine chunk ms':>17} {'plain chunk ms':>15} {'ratio':>6}"
            f" {'curvine wall ms':>16} {'plain wall ms':>14} {'ratio':>6}"]
    names = sorted({k.split()[0] for k in medians if k.split()[0].startswith("x")},
                   key=lambda s: int(s[1:])) + ["prompt"]
    for n in names:
        rows.append(f"{n:<10} {medians[f'{n} curvine chunk ms']:>17.1f} "
                    f"{medians[f'{n} plain chunk ms']:>15.1f} {medians[f'{n} chunk ratio']:>5.2f}x"
                    f" {medians[f'{n} curvine wall ms']:>16.1f} "
                    f"{medians[f'{n} plain wall ms']:>14.1f} {medians[f'{n} wall ratio']:>5.2f}x")
    rows.append(f"prompt target (plain wall + 2 master calls of "
                f"{medians['master calls ms'] / 2:.1f} ms): {medians['prompt target ms']:.1f} ms;"
                f" curvine {medians['prompt curvine wall ms']:.1f} ms")
    for name, by in calls.items():
        rows.append(f"master calls per chunk, {name}: {sum(by.values()):.2f} ("
                    + ", ".join(f"{m} {c:.2f}" for m, c in sorted(by.items())) + ")")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m curvine.devtools.bench_puts",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="a running `curvine local` cluster (default: start one "
                                   "with 2 workers and no mount)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--plain", help="plain directory (default: a temporary one beside the "
                                    "cluster)")
    args = ap.parse_args(argv)
    say = lambda s: print(s, flush=True)  # noqa: E731
    with bench_cluster(args.base, "curvine-bench-puts-", say, mounts=0) as (cluster, top):
        bench = PutsBench(cluster, args.plain or top, say, args.runs)
        try:
            medians = bench.run()
        finally:
            bench.close()
        print(report(medians, bench.calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
