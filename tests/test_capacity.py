"""Capacity (master/cluster/capacity.py): LRU eviction under the watermarks, TTL expiry, orphaned
``*.tmp`` files, a worker on a full file system, and replay of all of it.

In-process tests drive a real Master round by round (its background loop stopped);
cluster tests run real daemons and FUSE mounts with small capacities and short
intervals (each prints its numbers).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from cluster_util import wait_for
from curvine.client.master.master_client import MasterClient
from curvine.common.config import Config, apply_dict
from curvine.common.errors import ConfigError, CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO, new_request_id
from curvine.common.security import NO_SECURITY
from curvine.master.master import Master
from curvine.proto import common_pb2, master_pb2

MiB = 1 << 20


# ---------------------------------------------------------------------- in-process
def make_master(tmp_path, **master_cfg) -> Master:
    cfg = Config()
    cfg.master.meta_dir = str(tmp_path / "meta")
    cfg.journal.dir = str(tmp_path / "journal")
    cfg.cluster.block_size = MiB  # small pools: the block headroom stays below 10%
    cfg.master.evict_interval = 3600.0  # rounds run when the test says so
    for k, v in master_cfg.items():
        setattr(cfg.master, k, v)
    m = Master(cfg, security=NO_SECURITY)
    assert m.capacity.ready.wait(10)
    return m


def add_worker(m, capacity: int) -> int:
    wid = m.register_worker(common_pb2.WorkerInfo(
        uuid="w1", host_id="h1", address="127.0.0.1:1", data_dirs=["/d"],
        capacity=capacity)).worker_id
    m.heartbeat(master_pb2.HeartbeatRequest(worker_id=wid, capacity=capacity, used=0))
    return wid


def create(m, parent, name, session=0):
    return m.create(master_pb2.CreateRequest(request_id=new_request_id(), parent=parent,
                                             name=name, mode=0o644, session=session)).inode


def publish(m, ino, length) -> tuple[common_pb2.Inode, int]:
    r = m.add_block(master_pb2.AddBlockRequest(ino=ino, client_host_id="h1", size_hint=length))
    block = common_pb2.Block(block_id=r.block_id, length=length, checksum=1,
                             worker_ids=[w.worker_id for w in r.workers])
    node = m.complete(master_pb2.CompleteFileRequest(
        request_id=new_request_id(), ino=ino, blocks=[block], size=length)).inode
    return node, r.block_id


def names(m, ino=ROOT_INO) -> list[bytes]:
    return [e.name for e in m.listdir(ino, b"", 0).entries]


def test_a_creates_block_counts_its_length_once_published(tmp_path):
    """A block placed with its create (before anything is written) counts nothing in
    the estimate; the publish that names its length counts that (issue 36: counted
    whole, 64 MiB per open LMCache chunk of 14 MiB, four writers' creates evicted their
    newest chunks from a 512 MiB pool)."""
    m = make_master(tmp_path)
    try:
        m.capacity.close()
        add_worker(m, 10 * MiB)
        m.add_block(master_pb2.AddBlockRequest(ino=create(m, ROOT_INO, b"first").ino,
                                               client_host_id="h1"))  # block ids reserved
        before = m.capacity.status().estimated_used
        r = m.create(master_pb2.CreateRequest(request_id=new_request_id(), parent=ROOT_INO,
                                              name=b"k.tmp", mode=0o644, block_host_id="h1"))
        assert r.block.block_id and [w.worker_id for w in r.block.workers]
        assert m.capacity.status().estimated_used == before  # nothing written yet
        block = common_pb2.Block(block_id=r.block.block_id, length=100 << 10, checksum=1,
                                 worker_ids=[w.worker_id for w in r.block.workers])
        m.complete(master_pb2.CompleteFileRequest(request_id=new_request_id(),
                                                  ino=r.inode.ino, blocks=[block],
                                                  size=100 << 10))
        assert m.capacity.status().estimated_used == before + (100 << 10)
    finally:
        m.close()


def test_watermark_config_is_validated():
    with pytest.raises(ConfigError, match="evict_low"):
        apply_dict(Config(), {"master": {"evict_high": 0.5, "evict_low": 0.6}})
    with pytest.raises(ConfigError, match="evict_low"):
        apply_dict(Config(), {"master": {"evict_high": 1.5}})
    with pytest.raises(ConfigError, match="evict_high"):
        apply_dict(Config(), {"master": {"evict_high": "lots"}})
    cfg = apply_dict(Config(), {"master": {"evict_high": 0.95, "evict_low": 0.5,
                                           "orphan_timeout": "2s"}})
    assert (cfg.master.evict_high, cfg.master.evict_low, cfg.master.orphan_timeout) == (0.95, 0.5, 2.0)


def test_lru_eviction_plan_watermarks_and_replay(tmp_path):
    m = make_master(tmp_path)
    try:
        m.capacity.close()  # no background rounds: this test drives them
        m.deleter.close()  # nor deliveries of deletes (this one tries, below)
        wid = add_worker(m, 10 * MiB)
        files, blocks = [], {}
        for i in range(10):
            node, block_id = publish(m, create(m, ROOT_INO, b"f%d" % i).ino, MiB)
            files.append(node.ino)
            blocks[node.ino] = block_id
        # placed blocks count before any heartbeat reports them
        assert m.capacity.status().estimated_used == 10 * MiB
        # the heartbeat after the writes: 100% used, those ten blocks included
        m.heartbeat(master_pb2.HeartbeatRequest(worker_id=wid, capacity=10 * MiB, used=10 * MiB,
                                                added_block_ids=list(blocks.values())))
        assert m.capacity.status().estimated_used == 10 * MiB
        m.capacity.report_access(files[:3])  # f0..f2 were read: most recently used now
        m.capacity.run_round()
        # 100% -> 80% (low): exactly the two least recently used files go
        assert names(m) == [b"f%d" % i for i in (0, 1, 2, 5, 6, 7, 8, 9)]
        st = m.capacity.status()
        print(f"\nafter one round: stats {dict(st.stats)}, estimated {st.estimated_used / MiB:.0f} MiB")
        assert st.stats["evicted_files"] == 2 and st.stats["evicted_bytes"] == 2 * MiB
        # their blocks are still on the worker's disk until it confirms the deletes
        assert st.estimated_used == 10 * MiB
        # this worker does not answer DeleteBlocks (its address is fake): the deletes
        # go back to the queue, and the next heartbeat reply carries them
        assert not m.deleter.deliver()
        deletes = m.heartbeat(master_pb2.HeartbeatRequest(
            worker_id=wid, capacity=10 * MiB, used=10 * MiB)).delete_block_ids
        assert sorted(deletes) == sorted(blocks[i] for i in files[3:5])
        m.capacity.run_round()  # nothing more is evicted: that space is on its way out
        assert len(names(m)) == 8
        m.heartbeat(master_pb2.HeartbeatRequest(worker_id=wid, capacity=10 * MiB, used=8 * MiB,
                                                removed_block_ids=deletes))
        m.capacity.run_round()
        assert len(names(m)) == 8 and m.capacity.status().estimated_used == 8 * MiB
        # new data above the high watermark, before any heartbeat reports it
        for i in range(10, 12):
            publish(m, create(m, ROOT_INO, b"f%d" % i).ino, MiB)
        assert m.capacity.status().estimated_used == 10 * MiB
        m.capacity.run_round()
        assert b"f5" not in names(m) and b"f6" not in names(m) and b"f0" in names(m)
        before = names(m)
    finally:
        m.close()
    # a restarted master: same namespace; LRU order from the inodes' times
    m = make_master(tmp_path)
    try:
        assert names(m) == before
        order = [ino for ino, _ in m.capacity.lru.oldest(100)]
        assert order.index(files[7]) < order.index(files[9])
    finally:
        m.close()
    shutil.rmtree(tmp_path / "meta")  # and from the journal alone
    m = make_master(tmp_path)
    try:
        assert names(m) == before
    finally:
        m.close()


def test_ttl_policy_expires_new_files_of_the_directory(tmp_path):
    m = make_master(tmp_path)
    try:
        m.capacity.close()
        add_worker(m, 1 << 40)
        d = m.mkdir(master_pb2.MkdirRequest(request_id=new_request_id(), parent=ROOT_INO,
                                            name=b"d", mode=0o755)).inode
        old, _ = publish(m, create(m, d.ino, b"old").ino, MiB)
        with pytest.raises(CurvineError) as e:
            m.set_policy(master_pb2.SetPolicyRequest(ino=d.ino, replicas=9))
        assert e.value.kind == ErrorKind.INVALID and "replicas" in e.value.message
        with pytest.raises(CurvineError) as e:
            m.set_policy(master_pb2.SetPolicyRequest(ino=d.ino))
        assert e.value.kind == ErrorKind.INVALID
        node = m.set_policy(master_pb2.SetPolicyRequest(request_id=new_request_id(), ino=d.ino,
                                                        ttl_ms=300, replicas=2)).inode
        assert (node.ttl_ms, node.replicas) == (300, 2)
        new = create(m, d.ino, b"new")
        assert (new.ttl_ms, new.replicas) == (300, 2)
        publish(m, new.ino, MiB)
        sub = m.mkdir(master_pb2.MkdirRequest(request_id=new_request_id(), parent=d.ino,
                                              name=b"sub", mode=0o755)).inode
        publish(m, create(m, sub.ino, b"deep").ino, MiB)
        publish(m, create(m, ROOT_INO, b"other").ino, MiB)
        writing = create(m, d.ino, b"writing")  # never completed: TTL does not apply
        m.capacity.run_round()
        assert sorted(names(m, d.ino)) == [b"new", b"old", b"sub", b"writing"]
        time.sleep(0.4)
        m.capacity.run_round()
        assert sorted(names(m, d.ino)) == [b"old", b"sub", b"writing"]
        assert names(m, sub.ino) == [] and b"other" in names(m)
        assert m.capacity.stats["expired_files"] == 2
        assert m.getattr(writing.ino).state == common_pb2.WRITING
        # an expired file open for reading on a mount stays until that reader closes it
        sid = 77
        m.sessions.opened(sid, [])
        held = create(m, d.ino, b"held")
        publish(m, held.ino, MiB)
        assert m.get_blocks(held.ino, sid, 1).inode.ino == held.ino  # opened for reading
        with pytest.raises(CurvineError):  # an open of a missing inode records nothing
            m.get_blocks(held.ino + 1000, sid, 2)
        assert m.opens.open_files() == 1
        time.sleep(0.4)
        m.capacity.run_round()
        assert b"held" in names(m, d.ino)
        m.capacity.report_access([], sid, [1])  # closed
        time.sleep(1.1)  # an expired file that was open is looked at again after 1 s
        m.capacity.run_round()
        assert b"held" not in names(m, d.ino)
        # clearing the TTL: later files stay
        m.set_policy(master_pb2.SetPolicyRequest(request_id=new_request_id(), ino=d.ino, ttl_ms=0))
        publish(m, create(m, d.ino, b"kept").ino, MiB)
        time.sleep(0.4)
        m.capacity.run_round()
        assert b"kept" in names(m, d.ino)
        before = (sorted(names(m, d.ino)), m.getattr(d.ino).ttl_ms, m.getattr(d.ino).replicas)
    finally:
        m.close()
    m = make_master(tmp_path)
    try:
        assert (sorted(names(m, d.ino)), m.getattr(d.ino).ttl_ms, m.getattr(d.ino).replicas) == before
    finally:
        m.close()


def test_orphans_follow_the_writers_sessions(tmp_path):
    m = make_master(tmp_path, orphan_timeout=0.3)
    try:
        m.capacity.close()
        add_worker(m, 1 << 40)
        cap = m.capacity
        for sid in (11, 22, 33):
            m.sessions.opened(sid, [])
        dead = create(m, ROOT_INO, b"dead.tmp", session=11)
        alive = create(m, ROOT_INO, b"alive.tmp", session=22)
        moved = create(m, ROOT_INO, b"moved.tmp", session=33)
        anon = create(m, ROOT_INO, b"anon.tmp")  # no session: never an orphan
        done = create(m, ROOT_INO, b"done.tmp", session=11)
        publish(m, done.ino, MiB)
        m.sessions.closed(11)
        m.sessions.closed(33)
        m.sessions.opened(44, [33])  # mount of session 33 reconnected
        time.sleep(0.4)
        cap.run_round()
        assert sorted(names(m)) == [b"alive.tmp", b"anon.tmp", b"done.tmp", b"moved.tmp"]
        assert cap.stats["orphans_removed"] == 1
        # a slow writer adding a block keeps its file, even with its mount gone
        m.sessions.closed(44)
        m.add_block(master_pb2.AddBlockRequest(ino=moved.ino, client_host_id="h1", size_hint=MiB))
        cap.run_round()
        assert b"moved.tmp" in names(m)
        time.sleep(0.4)
        cap.run_round()
        assert b"moved.tmp" not in names(m)
        assert {dead.ino, alive.ino, anon.ino} and m.getattr(alive.ino).state == common_pb2.WRITING
    finally:
        m.close()
    # the writer table survives a restart: the old session counts as closed from the
    # start, unless its mount comes back with it in `dropped`
    m = make_master(tmp_path, orphan_timeout=0.3)
    try:
        m.capacity.close()
        m.sessions.opened(55, [22])
        time.sleep(0.4)
        m.capacity.run_round()
        assert sorted(names(m)) == [b"alive.tmp", b"anon.tmp", b"done.tmp"]
        m.sessions.closed(55)
        time.sleep(0.4)
        m.capacity.run_round()
        assert sorted(names(m)) == [b"anon.tmp", b"done.tmp"]
    finally:
        m.close()


# ---------------------------------------------------------------------- real clusters
CHUNK = 14 * MiB  # one LMCache chunk of a 7B model


def write_conf(tmp_path, **sections) -> str:
    lines = []
    for sec, values in sections.items():
        lines.append(f"[{sec}]")
        for k, v in values.items():
            lines.append(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"')
    path = tmp_path / "capacity.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def chunk(i: int, size: int = CHUNK) -> bytes:
    stamp = b"%08d" % i
    return stamp * (size // len(stamp))


def store(directory: str, key: str, data: bytes) -> None:
    """LMCache's put: write <key>.tmp, close, rename it to <key>.data."""
    tmp = os.path.join(directory, key + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.rename(tmp, os.path.join(directory, key + ".data"))


def usage(mnt: str) -> float:
    st = os.statvfs(mnt)
    return (st.f_blocks - st.f_bfree) / st.f_blocks if st.f_blocks else 0.0


def exists(path: str) -> bool:
    try:
        os.stat(path)
        return True
    except FileNotFoundError:
        return False


def master_client(c) -> MasterClient:
    return MasterClient(c.master_addr, timeout=10.0, wait=10.0, security=c.security)


def test_lmcache_stores_five_times_the_pool(make_cluster, tmp_path):
    high, low = 0.7, 0.4
    conf = write_conf(tmp_path, cluster={"block_size": "16MiB"},
                      master={"evict_high": high, "evict_low": low, "evict_interval": "200ms"},
                      worker={"heartbeat_interval": "100ms"},
                      client={"access_report_interval": "100ms"})
    c = make_cluster(workers=2, mounts=2, worker_capacity=256 * MiB, conf=conf)
    a, b = (os.path.join(m, "l2cache") for m in c.mounts)
    os.mkdir(a)
    mc = master_client(c)
    try:
        pool = mc.capacity_status().capacity
        assert pool == 512 * MiB
        n = 5 * pool // CHUNK + 1
        hot = ["key%04d" % i for i in range(2)]
        samples: list[tuple[float, float]] = []
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                samples.append((time.monotonic(), usage(c.mounts[0])))
                stop.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        enospc_before, enospc_after = 0, 0
        started = time.monotonic()
        try:
            for i in range(n):
                key = "key%04d" % i
                try:
                    store(a, key, chunk(i))
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    if mc.capacity_status().stats["evicted_files"]:
                        enospc_after += 1
                    else:
                        enospc_before += 1
                if i >= len(hot) and i % 2 == 0:
                    for k in hot:  # LMCache hits on the hot prefix: opened and read on B
                        with open(os.path.join(b, k + ".data"), "rb") as f:
                            f.read(MiB)
        finally:
            elapsed = time.monotonic() - started
            stop.set()
            sampler.join()
        wait_for(lambda: usage(c.mounts[0]) <= high, timeout=15,
                 what="pool usage below the high watermark after the writes")
        st = mc.capacity_status()
        # the longest stretch of samples above the high watermark
        longest, since = 0.0, None
        for t, u in samples:
            if u > high and since is None:
                since = t
            elif u <= high and since is not None:
                longest, since = max(longest, t - since), None
        if since is not None:
            longest = max(longest, samples[-1][0] - since)
        survivors = sorted(k[:-5] for k in os.listdir(b) if k.endswith(".data"))
        print(f"\n{n} stores of 14 MiB ({n * CHUNK / MiB:.0f} MiB) into a {pool / MiB:.0f} MiB "
              f"pool in {elapsed:.1f}s; evicted {st.stats['evicted_files']} files "
              f"({st.stats['evicted_bytes'] / MiB:.0f} MiB) in {st.stats['rounds']} rounds; "
              f"ENOSPC before/after the first eviction: {enospc_before}/{enospc_after}; "
              f"max usage seen {max(u for _, u in samples):.2f}, longest above {high}: "
              f"{longest:.2f}s; {len(survivors)} files left; access reports "
              f"{st.stats['access_reports']} ({st.stats['accesses']} opens)")
        assert enospc_after == 0
        assert st.stats["evicted_files"] >= n - pool // CHUNK
        assert longest < 15, "usage stayed above the high watermark"
        for k in hot:  # read throughout: kept, intact
            with open(os.path.join(b, k + ".data"), "rb") as f:
                assert f.read() == chunk(int(k[3:])), k
        unread = [k for k in survivors if k not in hot]
        # the survivors that nobody read are the newest ones
        assert all(int(k[3:]) >= n - pool // CHUNK for k in unread), unread
        assert not exists(os.path.join(b, "key%04d.data" % len(hot)))
    finally:
        mc.close()


def test_placement_makes_room_without_background_rounds(make_cluster, tmp_path):
    """With evict_high = 1.0 the background round (almost) never finds the pool above
    its mark, so stores into a full pool rely on AddBlock making room itself (evicting
    synchronously, delivering the deletes, then placing).  Defaults otherwise; the
    default-setting fills are in test_capacity_defaults.py."""
    conf = write_conf(tmp_path, master={"evict_high": 1.0, "evict_low": 0.99})
    c = make_cluster(workers=2, mounts=1, worker_capacity=128 * MiB, conf=conf)
    d = os.path.join(c.mounts[0], "l2cache")
    os.mkdir(d)
    mc = master_client(c)
    try:
        n = 5 * 256 * MiB // CHUNK + 1
        failed = []
        started = time.monotonic()
        for i in range(n):
            try:
                store(d, "key%04d" % i, chunk(i))
            except OSError as e:
                failed.append((i, e.errno))
        elapsed = time.monotonic() - started
        st = dict(mc.capacity_status().stats)
        print(f"\n{n} stores of 14 MiB into 2 x 128 MiB with no background eviction in "
              f"{elapsed:.1f}s: failed {failed}; room made {st['room_made']} times "
              f"({st['room_evicted_files']} files), background evictions "
              f"{st['evicted_files'] - st['room_evicted_files']}")
        assert failed == []
        assert st["evicted_files"] >= n - 256 * MiB // CHUNK
        # (a stream in flight at a heartbeat counts in used and in its reservation, so
        # the account may pass 1.0 briefly and a background round evict a few files)
        assert st["room_made"] > 0 and st["room_evicted_files"] > st["evicted_files"] // 2
        for i in range(n - 3, n):
            with open(os.path.join(d, "key%04d.data" % i), "rb") as f:
                assert f.read() == chunk(i)
    finally:
        mc.close()


def curvine_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "curvine.cli.main", *args],
                          capture_output=True, text=True, timeout=60)


def sessions_opened(c) -> int:
    with open(c.log_path("master"), errors="replace") as f:
        return sum(1 for line in f if "session" in line and "opened by" in line)


@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master restarted
def test_ttl_orphans_and_replay(make_cluster, tmp_path):
    conf = write_conf(tmp_path, master={"evict_interval": "200ms", "orphan_timeout": "2s",
                                        "lease_time": "3s"})
    c = make_cluster(workers=1, mounts=2, conf=conf)
    cli_conf = os.path.join(c.base, "conf", "master-0.toml")  # names the cluster token
    a, b = c.mounts
    wait_for(lambda: sessions_opened(c) >= 2, timeout=20, what="both mounts' lease sessions")
    for d in ("ttl", "keep", "tmp"):
        os.mkdir(os.path.join(a, d))
    # --- TTL, set through the CLI (a path on a mount; the namespace path works too)
    r = curvine_cli("fs", "ttl", os.path.join(a, "ttl"), "2s", "--master", c.master_addr, "--conf", cli_conf)
    assert r.returncode == 0 and r.stdout.strip() == "/ttl: ttl 2s", r
    r = curvine_cli("fs", "replicas", "/keep", "1", "--master", c.master_addr, "--conf", cli_conf)
    assert r.returncode == 0 and r.stdout.strip() == "/keep: replicas 1", r
    r = curvine_cli("fs", "ttl", "/nope/deeper", "2s", "--master", c.master_addr, "--conf", cli_conf)
    assert r.returncode == 3 and "Traceback" not in r.stderr  # 3: not found (docs/cli.md)
    assert r.stderr.strip() == "curvine: error: /nope: no such file or directory", r.stderr
    r = curvine_cli("fs", "replicas", "/keep", "9", "--master", c.master_addr, "--conf", cli_conf)
    assert r.returncode == 2 and "between 0 and 8" in r.stderr
    for d in ("ttl", "keep"):
        with open(os.path.join(a, d, "f"), "wb") as f:
            f.write(b"x" * 100_000)
    assert all(exists(os.path.join(m, d, "f")) for m in (a, b) for d in ("ttl", "keep"))
    t0 = time.monotonic()
    wait_for(lambda: not exists(os.path.join(a, "ttl", "f")) and not exists(os.path.join(b, "ttl", "f")),
             timeout=20, interval=0.1, what="the expired file to disappear from both mounts")
    expired_after = time.monotonic() - t0
    assert exists(os.path.join(a, "keep", "f")) and exists(os.path.join(b, "keep", "f"))
    # --- orphans: a writer on mount A whose mount is SIGKILLed, a slow one on mount B
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "f = open(sys.argv[1], 'wb')\n"
        "f.write(b'y' * (1 << 20)); f.flush()\n"
        "print('written', flush=True)\n"
        "time.sleep(600)\n"), os.path.join(a, "tmp", "x.tmp")],
        stdout=subprocess.PIPE, text=True)
    slow_stop = threading.Event()
    slow_written = []

    def slow_writer():
        with open(os.path.join(b, "tmp", "slow.tmp"), "wb", buffering=0) as f:
            while not slow_stop.wait(0.3):
                f.write(b"z")
                slow_written.append(1)

    slow = threading.Thread(target=slow_writer, daemon=True)
    slow.start()
    try:
        assert writer.stdout.readline().strip() == "written"
        wait_for(lambda: {"x.tmp", "slow.tmp"} <= set(os.listdir(os.path.join(b, "tmp"))),
                 timeout=10, what="both files being written")
        c.kill("fuse", 0, sig=signal.SIGKILL)
        t0 = time.monotonic()
        wait_for(lambda: "x.tmp" not in os.listdir(os.path.join(b, "tmp")), timeout=30,
                 interval=0.2, what="the orphaned x.tmp to be removed")
        orphan_after = time.monotonic() - t0
        time.sleep(2.5)  # another orphan timeout: the slow writer's mount is alive
        assert "slow.tmp" in os.listdir(os.path.join(b, "tmp"))
    finally:
        writer.kill()
        writer.wait(timeout=10)
        slow_stop.set()
        slow.join(timeout=10)
    assert os.stat(os.path.join(b, "tmp", "slow.tmp")).st_size == len(slow_written)
    mc = master_client(c)
    try:  # counted once the removal's lease revocations are done
        stats = wait_for(lambda: (lambda st: st["orphans_removed"] and st)(
            dict(mc.capacity_status().stats)), timeout=15, what="the orphan count")
    finally:
        mc.close()
    print(f"\nexpired file gone {expired_after:.1f}s after its 2s TTL was due to start; "
          f"orphan removed {orphan_after:.1f}s after its mount was killed (timeout 2s, "
          f"lease 3s); slow writer wrote {len(slow_written)} bytes; stats {stats}")
    assert stats["expired_files"] == 1 and stats["orphans_removed"] == 1

    # --- replay: a master restarted after the removals has the same namespace
    def listing():
        return {d: sorted(os.listdir(os.path.join(b, d))) for d in ("ttl", "keep", "tmp")}

    before = listing()
    assert before == {"ttl": [], "keep": ["f"], "tmp": ["slow.tmp"]}
    c.kill("master", sig=signal.SIGKILL)
    c.start("master")
    assert wait_for(listing, timeout=30, what="the restarted master") == before


@contextlib.contextmanager
def worker_on_tmpfs(c, index: int = 0, size: str = "64m"):
    """Worker ``index`` of cluster ``c`` (not up yet) keeps its data on a tmpfs of
    ``size``; yields its data root.  Afterwards the cluster is taken down, then the
    tmpfs unmounted.  Skips without root or when the tmpfs cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    data_root = os.path.join(c.base, "worker", str(index))
    os.makedirs(data_root)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", data_root],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield data_root
    finally:
        try:
            c.down()
        finally:
            subprocess.run(["umount", "-l", data_root], capture_output=True)


# readers hold both stored files open while big.tmp fills the disk: an eviction round
# that runs then has nothing it may take, and says so
@pytest.mark.expect_log(r"WARNING curvine\.master\.cluster\.capacity: pool above the high "
                        r"watermark \(\d+ of \d+ bytes\) but no file to evict")
def test_worker_on_a_full_tmpfs(make_cluster, tmp_path):
    conf = write_conf(tmp_path, cluster={"block_size": "16MiB"},
                      master={"evict_interval": "200ms"}, worker={"heartbeat_interval": "100ms"})
    c = make_cluster(workers=1, mounts=1, conf=conf, up=False)
    with worker_on_tmpfs(c):
        _full_tmpfs(c)


def _full_tmpfs(c):
    mc = None
    held: dict = {}
    try:
        c.up(timeout=60)
        mnt = os.path.join(c.mounts[0], "kv")
        os.mkdir(mnt)
        mc = master_client(c)
        # automatic capacity = what the worker's file system can hold: the tmpfs
        st = wait_for(lambda: (lambda s: s.capacity and s)(mc.capacity_status()), timeout=10,
                      what="the worker's capacity")
        assert 56 * MiB <= st.capacity <= 64 * MiB, st.capacity
        assert os.statvfs(c.mounts[0]).f_blocks * 4096 == st.capacity  # statfs: the same
        before = {f"a{i}": chunk(100 + i, 8 * MiB) for i in range(2)}
        for key, data in before.items():
            store(mnt, key, data)
        # Readers that opened the earlier values before the disk fills: eviction may
        # remove the names afterwards (they are the only complete files), but what these
        # readers get must still be exactly the stored bytes (or a clean error).
        held.clear()
        for key in before:
            f = open(os.path.join(mnt, key + ".data"), "rb")
            held[key] = f
            assert f.read(1) == before[key][:1]
        # a value larger than the whole disk: ENOSPC reaches the writer
        big = os.path.join(mnt, "big.tmp")
        failed_at = None
        try:
            with open(big, "wb") as f:
                for i in range(80):
                    f.write(b"b" * MiB)
            failed_at = "nowhere"
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
            failed_at = "write/close"
        assert failed_at == "write/close"
        os.unlink(big)  # LMCache drops its failed .tmp
        # nothing stored before is damaged: the open readers read every byte back ...
        for key, f in held.items():
            f.seek(0)
            assert f.read() == before[key], f"{key}: other bytes through a handle opened before"
            f.close()
        held.clear()
        # ... and so does a new open of every name eviction left (a removed one is a miss)
        intact = 0
        for key, data in before.items():
            path = os.path.join(mnt, key + ".data")
            if exists(path):
                with open(path, "rb") as f:
                    assert f.read() == data, key
                intact += 1
        # eviction (and the freed blocks of big.tmp) make room for the next store again
        attempts = []

        def store_again():
            try:
                store(mnt, "after", chunk(7, 8 * MiB))
                return True
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                attempts.append(e)
                return False

        wait_for(store_again, timeout=30, interval=0.5, what="a store after the disk filled")
        with open(os.path.join(mnt, "after.data"), "rb") as f:
            assert f.read() == chunk(7, 8 * MiB)
        st = mc.capacity_status()
        print(f"\ntmpfs capacity {st.capacity / MiB:.1f} MiB; the 80 MiB value failed at "
              f"{failed_at}; earlier values read back intact through handles opened before; "
              f"{intact}/{len(before)} still listed, all intact; the next "
              f"store succeeded after {len(attempts)} ENOSPC; stats {dict(st.stats)}")
    finally:
        for f in held.values():
            f.close()
        if mc is not None:
            mc.close()
