"""`curvine bench --workloads meta-scale` (issue 16): how many metadata operations one
master answers, and the CPU each costs the master and the mount.

On a `curvine local` cluster (the bench's own, or ``--base`` of a running one, e.g.
one started from another checkout to compare two versions in one sitting):

a. ``lookup``: 1, 4 and 16 client processes, each with its own channel (a pod's
   connector), look names up in one directory for ``seconds``; 3 of 4 miss.
b. ``store``: the same processes store empty chunks: create ``<key>.tmp``, publish
   (CompleteFile), rename to ``<key>.data`` (three master calls, as LMCache's
   connector makes through a mount); ``put``: the same chunks as curvine's connector
   stored them one at a time (one PutFile under ``<key>.data``); ``put_many``: prompts
   of PROMPT_CHUNKS empty chunks through ``KVStore.put_many`` (issue 36: one
   AddBlocksForPut and one PutFiles per prompt).  Counted per chunk, with the
   master's client calls per prompt (its ``curvine_rpc_server_handled_total``).
c. ``mount stat miss``: 1 and 8 processes stat missing names through mount A, each
   name once; then 1 process stats the same 256 missing names over and over.  The
   directory is quiet, so the mount soon holds its listing and answers the misses
   itself (fuse_client/listings.py); ``stat-miss-busy x1`` is the same while another
   client creates a name there every 0.2 s, so that every miss asks the master (as in
   LMCache's directories, where every pod keeps storing).
d. ``mount ops``: one process creates+closes, stats, lists and unlinks ``files``
   files through mount A, beside the plain directory and MooseFS (when mounted).
   ``listdir ms`` is the first listing; ``listdir again ms`` the median of 5 more
   (a mount's kernel keeps a leased directory's entries from the second on).

e. ``seed``: the seed prompt's shape, PROMPT_CHUNKS chunks of SEED_CHUNK bytes, stored
   by the connector (``KVStore.put_many``: the local worker through the descriptor it
   passes) against LMCache ``fs://``'s way on the plain directory (each chunk written
   to ``<key>.tmp`` and renamed, the chunks at once), alternating which goes first,
   ``max(5, 2 x runs)`` times; memory is touched once before (``touch_memory``: this
   machine backs memory lazily, the first touch of a page costs ~10x).

Each figure is ops/s and, for curvine, master and mount CPU microseconds per
operation (from /proc: user + system of the daemon during the measure; for client
processes, from the start signal to the last count).  ``--parts`` runs some of
lookup, store, put, put_many, mount, ops, seed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import secrets
import shutil
import statistics
import sys
import time
from typing import Callable

from .lmcache_pod import master_rpcs, rpc_delta
from .local import LocalCluster, bench_cluster, proc_stat

PARTS = ("lookup", "store", "put", "put_many", "mount", "ops", "seed")
PROMPT_CHUNKS = 8  # chunks of a prompt (the seed prompt's 1,925 tokens)
SEED_CHUNK = 14 << 20  # bytes of one of its chunks
TOUCH_SHARE = 0.6  # of MemAvailable written once before the seed comparison
TOUCH_MAX = 8 << 30
CLIENTS = (1, 4, 16)
MOUNT_PROCS = (1, 8)
HITS = 1000  # existing names per lookup directory
REPEATED_MISSES = 256  # missing names stat'ed over and over (c.)
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    f = proc_stat(pid)
    return (int(f[11]) + int(f[12])) / _TICK if f else 0.0


# -- client processes (spawned: each imports the client and opens its own channel) ----------

def cluster_client(c: LocalCluster, index: int | None = None, call_port: bool = False):
    """A path client of ``c``'s masters (every member of a group, following the leader;
    only member ``index`` when given); ``call_port``: namespace calls on the masters'
    call port as the cluster's config says, else unary gRPC."""
    from curvine.client.master.master_client import MasterClient
    from curvine.common import config as config_mod
    from curvine.common.security import Security
    cfg = config_mod.load(c.client_conf)
    addrs = config_mod.master_addrs(cfg) if index is None else [c.master_addrs[index]]
    return MasterClient(addrs, timeout=30, wait=60, security=Security.load(cfg),
                        call_port=call_port and cfg.client.call_port)


def _client_loop(conf: str, what: str, parent: int, seconds: float, start, seed: int, out):
    from curvine.client.master.master_client import MasterClient
    from curvine.common import config as config_mod
    from curvine.common.security import Security

    cfg = config_mod.load(conf)
    mc = MasterClient(config_mod.master_addrs(cfg), timeout=30, wait=10,
                      security=Security.load(cfg), call_port=cfg.client.call_port,
                      read_from=config_mod.read_members(cfg))
    n = 0
    try:
        start.wait()
        deadline = time.monotonic() + seconds
        if what == "lookup":
            i = seed
            while time.monotonic() < deadline:
                for _ in range(32):
                    name = (b"hit-%d" % (i % HITS) if i % 4 == 0
                            else b"miss-%d-%d" % (seed, i))
                    mc.lookup_or_none(parent, name)
                    i += 1
                n += 32
        elif what == "prompt":
            # the connector's lookup of a prompt: PROMPT_CHUNKS names in one LookupMany
            # (with their blocks), half of the prompts stored; counted per name
            i = seed
            while time.monotonic() < deadline:
                names = [b"hit-%d" % ((i + j) % HITS) if i % 2 == 0
                         else b"miss-%d-%d-%d" % (seed, i, j) for j in range(PROMPT_CHUNKS)]
                mc.lookup_many(parent, names)
                i += 1
                n += PROMPT_CHUNKS
        elif what == "busy":
            # another client (no session) makes a name in ``parent`` every 0.2 s: the
            # directory is never quiet, so no mount gets its listing leased; its names
            # are not the measure
            while time.monotonic() < deadline + 1.0:
                mc.create(parent, b"busy-%d-%d" % (seed, n))
                n += 1
                time.sleep(0.2)
            n = 0
        elif what == "put":
            while time.monotonic() < deadline:
                mc.put_file(parent, b"k-%d-%d.data" % (seed, n), [], 0)
                n += 1
        else:
            while time.monotonic() < deadline:
                key = b"k-%d-%d" % (seed, n)
                node = mc.create(parent, key + b".tmp")
                mc.complete_file(node.ino, [], 0)
                mc.rename(parent, key + b".tmp", parent, key + b".data")
                n += 1
    finally:
        mc.close()
        out.put(n)


def _put_many_loop(conf: str, namespace: str, seconds: float, start, seed: int, out) -> None:
    """A pod's connector storing prompts of PROMPT_CHUNKS empty chunks (put_many)."""
    from curvine.common.errors import CurvineError
    from curvine.connector.store import KVStore

    n, reported = 0, False
    try:
        with KVStore.open(conf, namespace) as kv:
            # the connector does not wait for the master (fail-open): on a loaded
            # machine its first connection may take a few tries
            for attempt in range(60):
                try:
                    kv.directory()
                    kv.fs.block_size()  # (learned once per store: not a prompt's cost)
                    break
                except CurvineError:
                    if attempt == 59:
                        raise
                    time.sleep(0.5)
            start.wait()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                kv.put_many([(f"k-{seed}-{n + j}.data", [b""]) for j in range(PROMPT_CHUNKS)])
                n += PROMPT_CHUNKS
            out.put(n)  # before the store closes: its threads' end is no prompt's time
            reported = True
    finally:
        if not reported:
            out.put(n)  # (the measure waits for every process's count)


def touch_memory(share: float = TOUCH_SHARE, limit: int = TOUCH_MAX) -> int:
    """Write ``share`` of MemAvailable (at most ``limit`` bytes) once and free it: pages
    the VM backs lazily are backed afterwards.  Bytes touched."""
    import ctypes
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f
                     if line.startswith("MemAvailable:"))
    total, piece, held = min(int(avail * share), limit), 256 << 20, []
    for _ in range(total // piece):
        buf = bytearray(piece)
        ctypes.memset((ctypes.c_char * piece).from_buffer(buf), 0xA5, piece)
        held.append(buf)
    del held
    return total // piece * piece


def _write_plain(directory: str, name: str, buffers) -> None:
    """LMCache fs://'s put: ``<key>.tmp`` written, closed, renamed to the key."""
    tmp = os.path.join(directory, name + ".tmp")
    with open(tmp, "wb") as f:
        for b in buffers:
            f.write(b)
    os.replace(tmp, os.path.join(directory, name))


def _stat_loop(root: str, seconds: float, repeat: int, start, seed: int, out) -> None:
    """stat of missing names: each new (``repeat`` 0), or ``repeat`` names over and over
    (a negative entry the mount may cache, fuse.negative_leases)."""
    n = 0
    start.wait()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for j in range(64):
            i = (n + j) % repeat if repeat else n + j
            try:
                os.stat(os.path.join(root, f"missing-{seed}-{i}"))
            except FileNotFoundError:
                pass
        n += 64
    out.put(n)


def _stat_or_client(role: str, *args) -> None:
    """One process of a row that mixes stat loops and a client loop."""
    if role == "client":
        _client_loop(*args)
    else:
        _stat_loop(*args)


class MetaScale:
    """Runs a-d on ``cluster`` (its master and fuse processes measured) ``runs`` times."""

    def __init__(self, cluster: LocalCluster, plain_root: str, say: Callable[[str], None],
                 runs: int = 3, seconds: float = 5.0, files: int = 2000,
                 moosefs_root: str | None = None, clients: tuple[int, ...] = CLIENTS,
                 mount_procs: tuple[int, ...] = MOUNT_PROCS, parts: tuple[str, ...] = PARTS,
                 seed_chunk: int = SEED_CHUNK, touch_share: float = TOUCH_SHARE):
        self.cluster = cluster
        self.plain_root = plain_root
        self.say = say
        self.runs = runs
        self.seconds = seconds
        self.files = files
        self.moosefs_root = moosefs_root
        self.clients = clients
        self.mount_procs = mount_procs
        self.parts = parts
        self.seed_chunk = seed_chunk  # e.: bytes of a chunk, share of memory touched first
        self.touch_share = touch_share
        rows = cluster.status()
        self.watch_master(0)
        fuse = [r for r in rows if r["role"] == "fuse"]
        self.mount = fuse[0]["mount"] if fuse else None
        self.fuse_pid = fuse[0]["pid"] if fuse else None
        self.tag = f"meta-scale-{os.getpid()}-{secrets.token_hex(3)}"
        self.figures: dict[str, list[float]] = {}
        self._window = None  # the (begin, end) snapshots _processes marked for _measure
        # daemons whose CPU is summed beside the master's ("others us/op"; bench_ha.py:
        # a group's other members and etcd)
        self.others: list[int] = []
        self.ctx = multiprocessing.get_context("spawn")

    def _add(self, key: str, value: float) -> None:
        self.figures.setdefault(key, []).append(value)

    def _snapshot(self) -> tuple[float, float, float, float]:
        """(now, master CPU seconds, mount CPU seconds, CPU seconds of ``others``)."""
        return (time.perf_counter(), _cpu(self.master_pid),
                _cpu(self.fuse_pid) if self.fuse_pid else 0.0,
                sum(_cpu(pid) for pid in self.others))

    # A measure's ends, with the master's calls by method: asked for (over HTTP, slow on
    # a loaded machine) before the window opens and after it closes, never inside it.
    def _begin(self) -> tuple:
        calls = master_rpcs(self.master_metrics)
        return (*self._snapshot(), calls)

    def _end(self) -> tuple:
        snap = self._snapshot()
        return (*snap, master_rpcs(self.master_metrics))

    def _measure(self, key: str, run: Callable[[], int]) -> None:
        """Rate and CPU per operation of ``run()``, over the window it ran in: all of
        it, or what ``_processes`` marked (from the start signal to the last count, so
        that starting interpreters is neither time nor CPU of the operations)."""
        self._window = None
        begin = self._begin()
        ops = run()
        begin, (t1, m1, f1, o1, c1) = self._window or (begin, self._end())
        t0, m0, f0, o0, c0 = begin
        wall = t1 - t0
        self._add(f"{key} ops/s", ops / wall)
        if ops:
            self._add(f"{key} master us/op", (m1 - m0) / ops * 1e6)
            if self.fuse_pid and key.startswith("mount"):
                self._add(f"{key} mount us/op", (f1 - f0) / ops * 1e6)
            if self.others:
                self._add(f"{key} others us/op", (o1 - o0) / ops * 1e6)
            calls = rpc_delta(c0, c1)
            if calls is not None and key.startswith(("store", "put")):  # ops are chunks
                self._add(f"{key} master calls/prompt",
                          calls["total"] / ops * PROMPT_CHUNKS)

    # -- a, b -------------------------------------------------------------------------
    def _processes(self, target, args: Callable[[int], tuple], n: int, helpers: int = 0) -> int:
        """``n`` processes of ``target(*args(i), start, seed, out)``, started together
        once all are up; the operations they counted.  The measured window ends with
        the counts of all but ``helpers`` of them (a helper runs on after the others
        and counts nothing: the busy directory's maker)."""
        start, out = self.ctx.Event(), self.ctx.Queue()
        procs = [self.ctx.Process(target=target, daemon=True,
                                  args=(*args(i), start, i * 1_000_003 + secrets.randbelow(1 << 20),
                                        out))
                 for i in range(n)]
        for p in procs:
            p.start()
        time.sleep(1.0 + 0.1 * n)  # interpreters up, channels made
        begin = self._begin()
        start.set()
        total = sum(out.get(timeout=self.seconds + 120) for _ in range(n - helpers))
        self._window = (begin, self._end())
        total += sum(out.get(timeout=self.seconds + 120) for _ in range(helpers))
        for p in procs:
            p.join(30)
        return total

    def measure_clients(self, key: str, what: str, parent: int, n: int) -> None:
        """``n`` client processes doing ``what`` ("lookup", "prompt", "store", "put") in
        ``parent``: ops/s and master CPU per op under ``key`` (bench_ha.py)."""
        self._measure(key, lambda: self._clients(what, parent, n))

    def watch_master(self, index: int) -> None:
        """Count the CPU and the calls of master ``index`` (of a group: the leader, or
        the standby the reads go to)."""
        row = next(r for r in self.cluster.status()
                   if r["role"] == "master" and r["index"] == index)
        self.master_pid, self.master_metrics = row["pid"], row["metrics"]

    def measure_put_many(self, key: str, namespace: str, n: int) -> None:
        """``n`` connector processes storing prompts through ``KVStore.put_many`` in
        ``namespace`` (a path): chunks/s and master CPU per chunk under ``key``."""
        self._measure(key, lambda: self._put_many_clients(namespace, n))

    def _clients(self, what: str, parent: int, n: int) -> int:
        return self._processes(_client_loop, lambda i: (self.cluster.client_conf, what,
                                                        parent, self.seconds), n)

    def _put_many_clients(self, namespace: str, n: int) -> int:
        return self._processes(_put_many_loop, lambda i: (self.cluster.client_conf,
                                                          namespace, self.seconds), n)

    # -- e ----------------------------------------------------------------------------
    def _seed(self, namespace: str) -> None:
        """The seed prompt through the connector and fs://'s way on the plain directory,
        alternating (see e. in the module doc)."""
        import concurrent.futures
        from curvine.connector.store import KVStore

        if self.touch_share:
            touched = touch_memory(self.touch_share)
            self.say(f"  seed: touched {touched >> 20} MiB of memory once")
        chunks = [bytearray(os.urandom(self.seed_chunk)) for _ in range(PROMPT_CHUNKS)]
        plain = os.path.join(self.plain_root, f"{self.tag}-seed")
        os.makedirs(plain, exist_ok=True)
        pool = concurrent.futures.ThreadPoolExecutor(PROMPT_CHUNKS)
        with KVStore.open(self.cluster.client_conf, namespace) as kv:
            kv.directory()
            kv.fs.block_size()

            def connector(run: int) -> None:
                names = [f"seed-{run}-{j}.data" for j in range(PROMPT_CHUNKS)]
                got = kv.put_many([(n, [c]) for n, c in zip(names, chunks)])
                if got != [True] * PROMPT_CHUNKS:
                    raise RuntimeError(f"seed prompt not stored: {got}")

            def fs_plain(run: int) -> None:
                list(pool.map(lambda j: _write_plain(plain, f"seed-{run}-{j}.data",
                                                     [chunks[j]]), range(PROMPT_CHUNKS)))

            sides = (("seed put_many", connector), ("seed plain fs://", fs_plain))
            connector(-1)  # warm-up of both: connections, worker threads, directory
            fs_plain(-1)
            for run in range(max(5, 2 * self.runs)):
                for key, side in (sides if run % 2 == 0 else sides[::-1]):
                    t0 = time.perf_counter()
                    side(run)
                    self._add(f"{key} ms", (time.perf_counter() - t0) * 1e3)
            ratios = [a / b for a, b in zip(self.figures["seed put_many ms"],
                                            self.figures["seed plain fs:// ms"])]
            self.figures["seed put_many/plain"] = ratios
            for run in range(-1, max(5, 2 * self.runs)):  # the cluster's disk back
                for j in range(PROMPT_CHUNKS):
                    kv.remove(f"seed-{run}-{j}.data")
        pool.shutdown()
        shutil.rmtree(plain, ignore_errors=True)

    def _mount_stats(self, n: int, repeat: int = 0, busy_parent: int = 0) -> int:
        """``busy_parent``: the inode of the directory (as seen by the master), which
        one more process keeps making names in meanwhile."""
        root = os.path.join(self.mount, self.tag)
        if not busy_parent:
            return self._processes(_stat_loop, lambda i: (root, self.seconds, repeat), n)
        conf = self.cluster.client_conf
        return self._processes(
            _stat_or_client, lambda i: (("client", conf, "busy", busy_parent, self.seconds)
                                        if i == n else ("stat", root, self.seconds, repeat)),
            n + 1, helpers=1)

    # -- d ----------------------------------------------------------------------------
    def _fs_ops(self, side: str, root: str) -> None:
        d = os.path.join(root, f"{self.tag}-ops")
        os.makedirs(d, exist_ok=True)
        paths = [os.path.join(d, f"f{i:06d}") for i in range(self.files)]
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC

        def timed(key: str, fn: Callable[[], int]) -> None:
            if side == "curvine":
                self._measure(f"mount {key}", fn)
            else:
                t0 = time.perf_counter()
                ops = fn()
                self._add(f"{side} {key} ops/s", ops / (time.perf_counter() - t0))

        def create() -> int:
            for p in paths:
                os.close(os.open(p, flags, 0o644))
            return len(paths)

        def stat() -> int:
            for p in paths:
                os.stat(p)
            return len(paths)

        def listdir() -> int:
            n = len(os.listdir(d))
            assert n == len(paths), f"{d}: {n} entries, {len(paths)} made"
            return 1

        def unlink() -> int:
            for p in paths:
                os.unlink(p)
            return len(paths)

        timed("create", create)
        timed("stat", stat)
        name = side if side != "curvine" else "mount"
        t0 = time.perf_counter()
        timed("listdir", listdir)
        self._add(f"{name} listdir ms", (time.perf_counter() - t0) * 1e3)
        # the same listing 5 more times (the second may fill the kernel's copy of a
        # leased directory: fuse_client/listings.py): the median
        again = []
        for _ in range(5):
            t0 = time.perf_counter()
            listdir()
            again.append((time.perf_counter() - t0) * 1e3)
        self._add(f"{name} listdir again ms", statistics.median(again))
        timed("unlink", unlink)
        os.rmdir(d)

    # -- all --------------------------------------------------------------------------
    def run(self) -> dict[str, float]:
        from curvine.common.ids import ROOT_INO

        mc = cluster_client(self.cluster)
        try:
            top = mc.mkdir(ROOT_INO, self.tag.encode())
            look = mc.mkdir(top.ino, b"lookups")
            for i in range(HITS):
                mc.create(look.ino, b"hit-%d" % i)
            if self.mount:
                os.makedirs(os.path.join(self.mount, self.tag), exist_ok=True)
            for run in range(self.runs):
                self.say(f"  run {run + 1}/{self.runs}")
                if "lookup" in self.parts:
                    for n in self.clients:
                        self._measure(f"lookup x{n}",
                                      lambda: self._clients("lookup", look.ino, n))
                for what in ("store", "put", "put_many"):
                    if what not in self.parts:
                        continue
                    for n in self.clients:
                        name = b"%s-%d-%d" % (what.encode(), run, n)
                        store = mc.mkdir(top.ino, name)
                        if what == "put_many":  # today's per-chunk put beside it
                            path = f"/{self.tag}/{name.decode()}"
                            self._measure(f"{what} x{n}",
                                          lambda: self._put_many_clients(path, n))
                        else:
                            self._measure(f"{what} x{n}",
                                          lambda: self._clients(what, store.ino, n))
                if self.mount and "mount" in self.parts:
                    for n in self.mount_procs:
                        self._measure(f"mount stat-miss x{n}", lambda: self._mount_stats(n))
                    self._measure("mount stat-same-miss x1",
                                  lambda: self._mount_stats(1, REPEATED_MISSES))
                    self._measure("mount stat-miss-busy x1",
                                  lambda: self._mount_stats(1, busy_parent=top.ino))
                if "ops" in self.parts:
                    if self.mount:
                        self._fs_ops("curvine", os.path.join(self.mount, self.tag))
                    self._fs_ops("plain", self.plain_root)
                    if self.moosefs_root:
                        self._fs_ops("moosefs", self.moosefs_root)
            if "seed" in self.parts:
                self._seed(f"/{self.tag}/seed")
        finally:
            mc.close()
        return {k: statistics.median(v) for k, v in self.figures.items()}


def report(medians: dict[str, float]) -> str:
    lines = [f"{'measure':<34} {'median':>12}"]
    for k in sorted(medians):
        lines.append(f"{k:<34} {medians[k]:>12,.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m curvine.devtools.bench_meta_scale",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="a running `curvine local` cluster (default: start one)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--plain", help="plain directory (default: a temporary one)")
    ap.add_argument("--moosefs", help="a MooseFS mount to compare d. with")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated, of {', '.join(PARTS)} (default: all)")
    args = ap.parse_args(argv)
    parts = tuple(p for p in args.parts.split(",") if p)
    unknown = set(parts) - set(PARTS)
    if unknown:
        ap.error(f"--parts: unknown {', '.join(sorted(unknown))}")
    say = lambda s: print(s, flush=True)  # noqa: E731
    with bench_cluster(args.base, "curvine-meta-scale-", say) as (cluster, top):
        plain = args.plain or os.path.join(top, f"plain-{os.getpid()}")
        os.makedirs(plain, exist_ok=True)
        ms = MetaScale(cluster, plain, say, args.runs, args.seconds, args.files, args.moosefs,
                       parts=parts)
        print(report(ms.run()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
