"""A full cache takes every store: eviction that keeps up with writers, at the defaults.

Every cluster here runs with the DEFAULT configuration: no config file at all, only
the workers' capacity set through ``make_cluster(worker_capacity=...)`` (or not even
that, for the tmpfs test).  So the block size is 64 MiB, heartbeats and access reports
come every second, the eviction loop runs every second and the watermarks are
``evict_high`` 0.90 / ``evict_low`` 0.80; each test checks that these are indeed the
values in effect before it relies on them.

What is proven, with LMCache-style stores (``<key>.tmp``, one write of the whole 14 MiB
chunk, close, rename to ``<key>.data``) through real FUSE mounts:

- one writer, and four writers on two mounts, storing five times the pool get no
  ENOSPC at all, keep their newest chunks and the chunks that are read all along
  (byte-identical), never sit above the high watermark for more than a few seconds,
  and do not empty the pool;
- a worker whose data dir is a small, full tmpfs costs no store: the blocks go to the
  other worker instead;
- files that readers hold open are never evicted: once the pool is nothing but open
  files a store fails with ENOSPC, quickly (no hang), and a store succeeds again soon
  after the readers close.

Each test prints its numbers (run with ``-s``).  Every wait and loop is bounded.
"""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest

from cluster_util import wait_for
from test_capacity import chunk, exists, master_client, store, usage, worker_on_tmpfs

pytestmark = pytest.mark.fuse

MiB = 1 << 20
CHUNK = 14 * MiB  # one LMCache chunk of a 7B model
CAPACITY = 256 * MiB  # per worker; two workers: a 512 MiB pool
HIGH, LOW = 0.90, 0.80  # the default watermarks
BLOCK_SIZE = 64 * MiB  # the default block size
HOT = 10  # chunks re-read throughout
WRITE_BUDGET = 150.0  # seconds the writers of one test may take at most
STORE_TIMEOUT = 60.0  # one store that takes longer counts as hung


# ---------------------------------------------------------------------- helpers
def try_store(directory: str, key: str, data: bytes) -> int:
    """One LMCache put; 0 on success, else the errno.  A failed put's ``.tmp`` is
    removed, as LMCache does."""
    try:
        store(directory, key, data)
        return 0
    except OSError as e:
        try:
            os.unlink(os.path.join(directory, key + ".tmp"))
        except OSError:
            pass
        return e.errno or -1


def timed_store(directory: str, key: str, data: bytes,
                timeout: float = STORE_TIMEOUT) -> tuple[int, float]:
    """(errno or 0, seconds) of one put, run in a thread so that a hung store fails the
    test after ``timeout`` instead of hanging it."""
    result: list[int] = []
    t0 = time.monotonic()
    t = threading.Thread(target=lambda: result.append(try_store(directory, key, data)),
                         daemon=True, name=f"store-{key}")
    t.start()
    t.join(timeout)
    took = time.monotonic() - t0
    assert result, f"storing {key} hung: no answer after {took:.0f}s"
    return result[0], took


def read_all(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def check_chunks(directory: str, expected: dict[str, bytes]) -> list[str]:
    """Problems with ``<key>.data`` in ``directory`` for each key: missing or other bytes."""
    problems = []
    for key, data in expected.items():
        path = os.path.join(directory, key + ".data")
        try:
            got = read_all(path)
        except FileNotFoundError:
            problems.append(f"{key}: missing")
            continue
        except OSError as e:
            problems.append(f"{key}: {e}")
            continue
        if got != data:
            problems.append(f"{key}: other bytes ({len(got)} of {len(data)})")
    return problems


class Sampler:
    """statfs usage of one mount every 50 ms, in a thread, while it is open."""

    def __init__(self, mnt: str, interval: float = 0.05):
        self.mnt, self.interval = mnt, interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="usage-sampler")

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), usage(self.mnt)))
            except OSError:
                pass
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)

    def max(self) -> float:
        return max((u for _, u in self.samples), default=0.0)

    def longest_above(self, mark: float) -> float:
        """The longest stretch of consecutive samples above ``mark``, in seconds."""
        longest, since = 0.0, None
        for t, u in self.samples:
            if u > mark and since is None:
                since = t
            elif u <= mark and since is not None:
                longest, since = max(longest, t - since), None
        if since is not None:
            longest = max(longest, self.samples[-1][0] - since)
        return longest


def check_defaults(mc, workers: int, capacity: int | None = CAPACITY) -> int:
    """Assert the cluster runs at the defaults; return the pool's capacity."""
    st = wait_for(lambda: (lambda s: s.capacity and s)(mc.capacity_status()), timeout=15,
                  what="the workers' capacity")
    assert (st.high, st.low) == (HIGH, LOW), (st.high, st.low)
    fs = mc.statfs()
    assert fs.block_size == BLOCK_SIZE, fs.block_size
    assert fs.live_workers == workers
    if capacity is not None:
        assert st.capacity == workers * capacity, st.capacity
    return st.capacity


def evicted(mc) -> int:
    return dict(mc.capacity_status().stats).get("evicted_files", 0)


def settled_usage(mnt: str) -> float:
    """Usage once the writes are over: below the high mark, two heartbeats later."""
    wait_for(lambda: usage(mnt) <= HIGH, timeout=15, interval=0.1,
             what="pool usage below the high watermark after the writes")
    time.sleep(2.5)  # two heartbeats: the usage of the last evictions and stores
    return usage(mnt)


# ---------------------------------------------------------------------- tests
def test_fill_five_times_the_pool_one_writer(make_cluster):
    """One LMCache writer on mount 0 stores five times the pool (14 MiB chunks) while
    10 hot chunks are re-read through mount 1 every 4th store.  At the defaults (only
    worker capacity set): no store fails (no ENOSPC, before or after the first
    eviction), the newest 3 and the 10 hot chunks survive byte-identical, usage is
    above the 0.90 high watermark for under 5 s at a stretch, and the pool is not
    emptied (final usage > 0.5)."""
    c = make_cluster(workers=2, mounts=2, worker_capacity=CAPACITY)
    a, b = (os.path.join(m, "l2cache") for m in c.mounts)
    os.mkdir(a)
    mc = master_client(c)
    try:
        pool = check_defaults(mc, workers=2)
        n = -(-5 * pool // CHUNK)  # five times the pool, rounded up: 183
        keys = ["key%04d" % i for i in range(n)]
        hot = {k: chunk(i) for i, k in enumerate(keys[:HOT])}
        res = {"done": 0, "enospc_before": 0, "enospc_after": 0, "errors": [],
               "hot_reads": 0, "hot_problems": []}
        started = time.monotonic()

        def writer():
            for i, key in enumerate(keys):
                if time.monotonic() - started > WRITE_BUDGET - 10:
                    res["errors"].append(f"out of time after {i} stores")
                    return
                err = try_store(a, key, chunk(i))
                if err == errno.ENOSPC:
                    res["enospc_after" if evicted(mc) else "enospc_before"] += 1
                elif err:
                    res["errors"].append(f"{key}: {os.strerror(err)}")
                    if len(res["errors"]) > 5:
                        return
                res["done"] = i + 1
                if i >= HOT and i % 4 == 0:  # LMCache hits on the hot prefix, on mount 1
                    res["hot_reads"] += 1
                    res["hot_problems"].extend(f"after store {i}: {p}"
                                               for p in check_chunks(b, hot))

        with Sampler(c.mounts[0]) as sampler:
            t = threading.Thread(target=writer, daemon=True, name="writer")
            t.start()
            t.join(WRITE_BUDGET)
            elapsed = time.monotonic() - started
        assert not t.is_alive(), f"the writer hung after {res['done']} stores"
        final = settled_usage(c.mounts[0])
        st = mc.capacity_status()
        stats = dict(st.stats)
        longest = sampler.longest_above(HIGH)
        newest = {k: chunk(i) for i, k in list(enumerate(keys))[-3:]}
        survivors = [k for k in os.listdir(b) if k.endswith(".data")]
        print(f"\none writer: {res['done']} stores of 14 MiB ({res['done'] * CHUNK / MiB:.0f} "
              f"MiB) into a {pool / MiB:.0f} MiB pool in {elapsed:.1f}s "
              f"({res['done'] / elapsed:.1f} stores/s); ENOSPC before/after the first "
              f"eviction: {res['enospc_before']}/{res['enospc_after']}; other errors "
              f"{res['errors'][:5]}; evicted {stats.get('evicted_files', 0)} files "
              f"({stats.get('evicted_bytes', 0) / MiB:.0f} MiB) in {stats.get('rounds', 0)} "
              f"rounds; {res['hot_reads']} hot re-reads, problems {res['hot_problems'][:5]}; "
              f"max usage {sampler.max():.3f}, longest above {HIGH}: {longest:.2f}s "
              f"({len(sampler.samples)} samples); final usage {final:.3f}; "
              f"{len(survivors)} files left")
        assert res["enospc_before"] + res["enospc_after"] == 0, "a store got ENOSPC"
        assert not res["errors"], res["errors"]
        assert res["done"] == n
        assert stats.get("evicted_files", 0) >= n - pool // CHUNK
        assert not check_chunks(b, newest), check_chunks(b, newest)
        assert not check_chunks(b, hot), check_chunks(b, hot)
        assert not res["hot_problems"], res["hot_problems"][:10]
        assert longest < 5.0, f"usage stayed above {HIGH} for {longest:.2f}s"
        assert final > 0.5, f"the pool was emptied needlessly: usage {final:.3f}"
    finally:
        mc.close()


def test_fill_four_writers_two_mounts(make_cluster):
    """Four LMCache writers (two on each mount, each its own key prefix) together store
    five times the pool while a reader re-reads 10 hot chunks through the mount they
    were not written on.  At the defaults (only worker capacity set): no store of any
    writer fails (no ENOSPC), each writer's newest 3 chunks and the hot chunks survive
    byte-identical, usage is above the 0.90 high watermark for under 5 s at a stretch,
    and the pool is not emptied (final usage > 0.5)."""
    c = make_cluster(workers=2, mounts=2, worker_capacity=CAPACITY)
    dirs = [os.path.join(m, "l2cache") for m in c.mounts]
    os.mkdir(dirs[0])
    mc = master_client(c)
    try:
        pool = check_defaults(mc, workers=2)
        n = -(-5 * pool // CHUNK)
        hot = {"hot%02d" % i: chunk(100_000 + i) for i in range(HOT)}
        for i, (key, data) in enumerate(hot.items()):  # half through each mount
            err = try_store(dirs[i % 2], key, data)
            assert err == 0, f"storing hot chunk {key} into an empty pool: {os.strerror(err)}"
        hot_by_reader_mount = [{k: d for i, (k, d) in enumerate(hot.items()) if i % 2 != m}
                               for m in (0, 1)]
        lock = threading.Lock()
        counter = [0]  # stores begun, all writers together
        written: list[list[tuple[str, bytes]]] = [[] for _ in range(4)]  # attempted
        res = {"enospc": [0] * 4, "enospc_before": 0, "enospc_after": 0, "errors": [],
               "hot_reads": 0, "hot_problems": []}
        writers_done = threading.Event()
        passes = threading.Condition(lock)
        pass_at = [0]  # the store count at the reader's last pass
        started = time.monotonic()

        def writer(w: int):
            d = dirs[w // 2]  # writers 0, 1 on mount 0; 2, 3 on mount 1
            while time.monotonic() - started < WRITE_BUDGET - 10:
                with lock:
                    # "Hot" means read more often than the pool turns over: writers wait
                    # for a reader more than 8 stores behind (a pass reads 140 MiB, which
                    # can take longer than 4 writers need to store the whole pool).
                    passes.wait_for(lambda: counter[0] - pass_at[0] < 8, timeout=5)
                    i = counter[0]
                    if i >= n:
                        return
                    counter[0] += 1
                key, data = "w%d-%04d" % (w, i), chunk(i)
                written[w].append((key, data))
                err = try_store(d, key, data)
                if err == errno.ENOSPC:
                    ev = evicted(mc)
                    with lock:
                        res["enospc"][w] += 1
                        res["enospc_after" if ev else "enospc_before"] += 1
                elif err:
                    with lock:
                        res["errors"].append(f"{key}: {os.strerror(err)}")
                        if len(res["errors"]) > 5:
                            return
            with lock:
                res["errors"].append(f"writer {w} out of time")

        def reader():
            last = 0
            while not writers_done.is_set():
                if counter[0] - last < 4:  # a pass every 4 stores, as in the one-writer test
                    writers_done.wait(0.02)
                    continue
                last = counter[0]
                res["hot_reads"] += 1
                for m in (0, 1):  # each hot chunk through the mount it was not written on
                    problems = check_chunks(dirs[m], hot_by_reader_mount[m])
                    res["hot_problems"].extend(f"by store {counter[0]}: {p}" for p in problems)
                with lock:
                    pass_at[0] = last
                    passes.notify_all()

        with Sampler(c.mounts[0]) as sampler:
            threads = [threading.Thread(target=writer, args=(w,), daemon=True,
                                        name=f"writer-{w}") for w in range(4)]
            rd = threading.Thread(target=reader, daemon=True, name="hot-reader")
            for t in threads:
                t.start()
            rd.start()
            deadline = started + WRITE_BUDGET
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            writers_done.set()
            rd.join(30)
            elapsed = time.monotonic() - started
        hung = [t.name for t in threads + [rd] if t.is_alive()]
        assert not hung, f"hung: {hung} after {counter[0]} stores"
        final = settled_usage(c.mounts[0])
        stats = dict(mc.capacity_status().stats)
        longest = sampler.longest_above(HIGH)
        total = sum(len(x) for x in written)
        print(f"\nfour writers on two mounts: {total} stores of 14 MiB "
              f"({total * CHUNK / MiB:.0f} MiB, per writer {[len(x) for x in written]}) into "
              f"a {pool / MiB:.0f} MiB pool in {elapsed:.1f}s ({total / elapsed:.1f} stores/s); "
              f"ENOSPC per writer {res['enospc']}, before/after the first eviction "
              f"{res['enospc_before']}/{res['enospc_after']}; other errors {res['errors'][:5]}; "
              f"evicted {stats.get('evicted_files', 0)} files in {stats.get('rounds', 0)} rounds; "
              f"{res['hot_reads']} hot passes, problems {res['hot_problems'][:5]}; max usage "
              f"{sampler.max():.3f}, longest above {HIGH}: {longest:.2f}s; final usage {final:.3f}")
        assert sum(res["enospc"]) == 0, f"ENOSPC per writer: {res['enospc']}"
        assert not res["errors"], res["errors"]
        assert total == n
        assert stats.get("evicted_files", 0) >= n - pool // CHUNK
        for w in range(4):
            newest = dict(written[w][-3:])
            assert len(newest) == 3, f"writer {w} stored only {len(written[w])} chunks"
            other = dirs[1 - w // 2]  # read through the other mount
            problems = check_chunks(other, newest)
            assert not problems, f"writer {w}: {problems}"
        for m in (0, 1):
            assert not check_chunks(dirs[m], hot_by_reader_mount[m]), \
                check_chunks(dirs[m], hot_by_reader_mount[m])
        assert not res["hot_problems"], res["hot_problems"][:10]
        assert longest < 5.0, f"usage stayed above {HIGH} for {longest:.2f}s"
        assert final > 0.5, f"the pool was emptied needlessly: usage {final:.3f}"
    finally:
        mc.close()


def _bytes_under(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def test_tmpfs_worker_fills_placement_moves(make_cluster):
    """Worker 0's data root is a 64 MiB tmpfs on the mount's host, worker 1's the
    (large) disk of another host (CURVINE_HOST_ID), both with the automatic capacity,
    everything else at the defaults (no config at all).  12
    chunks of 14 MiB (168 MiB, more than the tmpfs) stored through the mount: no ENOSPC,
    all 12 read back byte-identical, and the blocks are on both workers (the tmpfs
    worker took what it could, the rest went to the other)."""
    # The tmpfs worker is the mount's local worker (placement prefers it); the disk
    # worker acts as another node's.
    c = make_cluster(workers=2, mounts=1, up=False, host_ids={"worker 1": "other-node"})
    with worker_on_tmpfs(c, 0, "64m") as data_root:
        _tmpfs_fills(c, data_root)


def _tmpfs_fills(c, data_root):
    mc = None
    try:
        c.up(timeout=60)
        mnt = os.path.join(c.mounts[0], "kv")
        os.mkdir(mnt)
        mc = master_client(c)
        check_defaults(mc, workers=2, capacity=None)

        def by_worker():
            """(tmpfs worker, disk worker) WorkerInfo, told apart by their data dirs."""
            root = os.path.realpath(data_root) + os.sep
            ws = list(mc.statfs().workers)
            tmpfs = [w for w in ws if any(os.path.realpath(d).startswith(root)
                                          for d in w.data_dirs)]
            other = [w for w in ws if w not in tmpfs]
            assert len(tmpfs) == 1 and len(other) == 1, ws
            return tmpfs[0], other[0]

        w0, w1 = by_worker()
        assert 0 < w0.capacity <= 64 * MiB, w0.capacity  # automatic: the tmpfs
        assert w1.capacity > 1024 * MiB, w1.capacity  # automatic: the disk
        expected = {"c%02d" % i: chunk(200 + i) for i in range(12)}
        results = {}
        t0 = time.monotonic()
        for key, data in expected.items():
            results[key] = timed_store(mnt, key, data)
        elapsed = time.monotonic() - t0
        failed = {k: os.strerror(e) for k, (e, _) in results.items() if e}
        enospc = sum(1 for e, _ in results.values() if e == errno.ENOSPC)
        problems = check_chunks(mnt, expected)
        # a heartbeat or two: the workers' usage includes the last stores
        wait_for(lambda: sum(w.used for w in by_worker()) >= len(expected) * CHUNK,
                 timeout=10, interval=0.2, what="heartbeats reporting the stored bytes")
        w0, w1 = by_worker()
        on_tmpfs = _bytes_under(data_root)
        on_disk = _bytes_under(os.path.join(c.base, "worker", "1"))
        print(f"\n12 stores of 14 MiB (168 MiB) in {elapsed:.1f}s (slowest "
              f"{max(s for _, s in results.values()):.1f}s); failed {failed}, ENOSPC {enospc}; "
              f"read-back problems {problems}; tmpfs worker {w0.worker_id}: used "
              f"{w0.used / MiB:.1f} of {w0.capacity / MiB:.1f} MiB ({on_tmpfs / MiB:.1f} MiB of "
              f"files); disk worker {w1.worker_id}: used {w1.used / MiB:.1f} MiB "
              f"({on_disk / MiB:.1f} MiB of files); stats {dict(mc.capacity_status().stats)}")
        assert enospc == 0, failed
        assert not failed, failed
        assert not problems, problems
        assert w0.used > 0, "the tmpfs worker got no block at all"
        assert w1.used > 0, "the disk worker got no block at all"
        assert w0.used <= w0.capacity
    finally:
        if mc is not None:
            mc.close()


@pytest.mark.expect_log(r"WARNING curvine\.master\.cluster\.capacity: pool above the high watermark \(\d+ of \d+ bytes\) but no file to evict")  # a full pool of open files, on purpose
def test_all_files_open_for_reading_then_closed(make_cluster):
    """Files open for reading are never evicted.  At the defaults (only worker capacity
    set): the pool is filled to about 0.85 with chunks, every stored chunk is opened for
    reading on mount 1 and kept open (as is every chunk stored later), so that the pool
    ends up holding nothing but open files: then a store fails with ENOSPC, and does
    so quickly (< 30 s, no hang); the open readers read every byte back identical and
    no open file's name disappeared; once they close, a store succeeds within 15 s and
    reads back identical."""
    c = make_cluster(workers=2, mounts=2, worker_capacity=CAPACITY)
    a, b = (os.path.join(m, "l2cache") for m in c.mounts)
    os.mkdir(a)
    mc = master_client(c)
    held: dict[str, tuple] = {}  # key -> (open file on mount 1, its bytes)
    try:
        pool = check_defaults(mc, workers=2)
        expected: dict[str, bytes] = {}

        def fill_level() -> float:
            st = mc.capacity_status()
            return max(usage(c.mounts[0]), st.estimated_used / st.capacity)

        # --- fill to about 0.85: every one of these stores must succeed
        t0 = time.monotonic()
        for i in range(34):
            key = "key%04d" % i
            expected[key] = chunk(i)
            err, took = timed_store(a, key, expected[key])
            assert err == 0, f"filling: store {i} failed ({os.strerror(err)}) after {took:.1f}s"
            if fill_level() >= 0.85:
                break
        fill_time = time.monotonic() - t0
        time.sleep(2.5)  # two heartbeats: the usage is reported, any eviction round ran
        fill = usage(c.mounts[0])
        evicted_while_filling = evicted(mc)

        def hold(key: str) -> bool:
            """Open ``key`` on mount 1, read one byte, keep it open; False if it is gone."""
            try:
                f = open(os.path.join(b, key + ".data"), "rb")
            except FileNotFoundError:
                return False
            held[key] = (f, expected[key])
            assert f.read(1) == expected[key][:1], key
            return True

        listed = sorted(k[:-5] for k in os.listdir(b) if k.endswith(".data"))
        for key in listed:
            hold(key)
        open_bytes = len(held) * CHUNK
        # --- keep storing, every new chunk held open too, until a store gets ENOSPC
        bound = -(-(pool - open_bytes) // CHUNK) + 4  # room left in chunks, and some
        extra_ok, fail_times, other_errors, vanished = [], [], [], []
        for j in range(bound):
            key = "new%04d" % j
            expected[key] = chunk(10_000 + j)
            err, took = timed_store(a, key, expected[key])
            if err == 0 and hold(key):
                extra_ok.append(took)
                continue
            if err in (0, errno.ENOENT):
                # Stored, but evicted before this test could open it (the only file not
                # open: eviction may take it); or its complete .tmp, before the rename.
                vanished.append(key)
                continue
            if err == errno.ENOSPC:
                fail_times.append(took)
                break
            other_errors.append(f"{key}: {os.strerror(err)} after {took:.1f}s")
            break
        # --- the open readers: every byte intact, every name still there
        reader_problems = []
        for key, (f, data) in held.items():
            if not exists(os.path.join(b, key + ".data")):
                reader_problems.append(f"{key}: evicted while open")
            try:
                f.seek(0)
                got = f.read()
            except OSError as e:
                reader_problems.append(f"{key}: {e}")
                continue
            if got != data:
                reader_problems.append(f"{key}: other bytes ({len(got)} of {len(data)})")
        for f, _ in held.values():
            f.close()
        n_held = len(held)
        held.clear()
        # --- closed: a store succeeds again soon
        attempts = []
        t_closed = time.monotonic()

        def store_again() -> bool:
            err, took = timed_store(a, "after", expected.setdefault("after", chunk(99_999)))
            attempts.append((err, took))
            assert err in (0, errno.ENOSPC), f"store after closing: {os.strerror(err)}"
            return err == 0

        recovered = None
        try:
            wait_for(store_again, timeout=15, interval=0.5,
                     what="a store after the readers closed")
            recovered = time.monotonic() - t_closed
        except AssertionError:
            pass
        after_ok = recovered is not None and not check_chunks(b, {"after": expected["after"]})
        stats = dict(mc.capacity_status().stats)
        print(f"\nfilled {len(listed)} chunks listed ({fill:.3f} of {pool / MiB:.0f} MiB) in "
              f"{fill_time:.1f}s, {evicted_while_filling} evicted while filling; held "
              f"{n_held} files open ({n_held * CHUNK / MiB:.0f} MiB); {len(extra_ok)} more "
              f"stores succeeded (bound {bound}; {[round(t, 2) for t in extra_ok]} s), "
              f"{len(vanished)} evicted before they could be opened, then "
              f"ENOSPC after {[round(t, 2) for t in fail_times]} s; other errors "
              f"{other_errors}; reader problems {reader_problems[:5]}; after closing: "
              f"{len(attempts)} attempts, succeeded after "
              f"{'never' if recovered is None else f'{recovered:.1f}s'}, read back "
              f"{'identical' if after_ok else 'NOT identical/missing'}; stats {stats}")
        assert not other_errors, other_errors
        assert fail_times, (f"no ENOSPC in {bound} stores into a pool of open files: "
                            f"{len(extra_ok)} succeeded and stayed, {len(vanished)} were "
                            f"evicted at once (open files evicted, or no ENOSPC when full)")
        assert fail_times[0] < 30.0, f"the first ENOSPC store took {fail_times[0]:.1f}s"
        assert not reader_problems, reader_problems[:10]
        assert recovered is not None, \
            f"no store succeeded within 15s of closing the readers: {attempts}"
        assert after_ok, check_chunks(b, {"after": expected["after"]})
    finally:
        for f, _ in held.values():
            f.close()
        mc.close()
