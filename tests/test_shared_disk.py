"""Workers whose data dirs share one file system count its space once.

Each such worker reports the free space of the whole disk as its own (worker.capacity
unset), so the pool used to be that disk times the number of workers on it, and
placement, eviction, statfs and `curvine report` trusted it.  Workers now report their data dirs' file systems (host id and device) and the
master divides a shared one's free space between them (master/cluster/workers.py).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from cluster_util import daemon_metric, wait_for
from curvine.master.cluster.workers import WorkerRegistry, apportion
from curvine.proto import common_pb2
from test_capacity import CHUNK, MiB, chunk, exists, master_client, store, write_conf


def disk_bytes(path: str) -> tuple[int, int]:
    """(free, size) of the file system of ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def test_apportion_hands_a_shared_disk_out_once():
    # two workers on one disk with 100 free: 50 each, plus what each stores
    cap, peers = apportion({1: (130, 30, {"h:8:1": 100}), 2: (110, 10, {"h:8:1": 100})},
                           {"h:8:1": 100})
    assert cap == {1: 80, 2: 60} and peers == {1: {2}, 2: {1}}
    # a worker limited below its half leaves the rest to the other
    cap, _ = apportion({1: (20, 0, {"d": 100}), 2: (100, 0, {"d": 100})}, {"d": 100})
    assert cap == {1: 20, 2: 80}
    # separate disks, or no volumes reported: as reported
    cap, peers = apportion({1: (100, 0, {"a": 100}), 2: (70, 0, {"b": 70}), 3: (5, 1, {})},
                           {"a": 100, "b": 70})
    assert cap == {1: 100, 2: 70, 3: 5} and peers == {1: set(), 2: set()}
    # workers sharing a disk are held to it together, whatever worker.capacity says;
    # a worker alone on its disk keeps its own number
    cap, _ = apportion({1: (1000, 0, {"a": 100}), 2: (1000, 0, {"a": 100})}, {"a": 100})
    assert cap == {1: 50, 2: 50}
    cap, _ = apportion({1: (1000, 0, {"a": 100})}, {"a": 100})
    assert cap == {1: 1000}


def _registry_with_two_workers_on_one_disk(free: int) -> WorkerRegistry:
    reg = WorkerRegistry(lost_after=60.0)
    disk = [common_pb2.Volume(fs_id="host:259:1", free=free)]
    for wid in (1, 2):
        reg.upsert(common_pb2.WorkerInfo(worker_id=wid, uuid=f"u{wid}", host_id="host",
                                         address=f"127.0.0.1:{9000 + wid}"))
        # worker.capacity unset: each reports the whole disk's free space as its own
        reg.registered(wid, capacity=free, used=0, volumes=disk)
    return reg


def test_placement_never_places_more_than_the_shared_disk_holds():
    reg = _registry_with_two_workers_on_one_disk(100 * MiB)
    placed = 0
    for block_id in range(1, 100):
        chosen = reg.choose(1, "", 10 * MiB, set(), block_id)
        if not chosen:
            break
        placed += 10 * MiB
    assert placed <= 100 * MiB, f"{placed // MiB} MiB placed on a disk with 100 MiB free"
    assert placed >= 90 * MiB  # and the disk is used


def test_eviction_reads_the_pool_of_the_disk():
    # master/cluster/capacity.py compares live workers' used with the sum of their capacities
    reg = _registry_with_two_workers_on_one_disk(100 * MiB)
    assert sum(u.capacity for u in reg.usage() if u.alive) == 100 * MiB
    assert sum(info.capacity for info, alive in reg.snapshot() if alive) == 100 * MiB  # statfs


def test_statfs_report_and_metrics_count_a_shared_disk_once(make_cluster):
    c = make_cluster(workers=2, mounts=1)
    free, _ = disk_bytes(c.base)
    st = os.statvfs(c.mounts[0])
    pool = st.f_blocks * st.f_frsize
    # other tests write to this disk meanwhile: within a fifth of its free space
    assert 0.8 * free <= pool <= 1.2 * free, (pool, free)

    env = {k: v for k, v in os.environ.items() if k != "CURVINE_CONF"}
    r = subprocess.run([sys.executable, "-m", "curvine.cli.main", "report", "--json",
                        "--base", c.base], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    workers = json.loads(r.stdout)["workers"]
    total = sum(w["capacity"] for w in workers)
    assert 0.8 * free <= total <= 1.2 * free, (workers, free)
    assert sorted(w["shares_disk_with"] for w in workers) == [[1], [2]], workers

    metric = daemon_metric(c, "master", "curvine_pool_capacity_bytes")
    assert 0.8 * free <= metric <= 1.2 * free, (metric, free)


def test_two_workers_on_one_small_disk_take_five_times_it_without_enospc(make_cluster, tmp_path):
    """Both workers' data dirs on one 96 MiB tmpfs: the pool is that disk (counted
    twice it was 192 MiB), and five times it goes through without ENOSPC."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    conf = write_conf(tmp_path, cluster={"block_size": "16MiB"},
                      master={"evict_interval": "200ms"}, worker={"heartbeat_interval": "100ms"},
                      client={"access_report_interval": "100ms"})
    c = make_cluster(workers=2, mounts=1, conf=conf, up=False)
    disk = os.path.join(c.base, "worker")  # worker/0/data and worker/1/data
    os.makedirs(disk)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", disk],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    mc = None
    try:
        c.up(timeout=60)
        mc = master_client(c)
        st = wait_for(lambda: (lambda s: s.capacity and s)(mc.capacity_status()), timeout=10,
                      what="the pool's capacity")
        assert st.capacity <= 96 * MiB, f"pool {st.capacity / MiB:.0f} MiB on a 96 MiB disk"
        kv = os.path.join(c.mounts[0], "kv")
        os.mkdir(kv)
        n = 5 * 96 * MiB // CHUNK
        failed = []
        for i in range(n):
            try:
                store(kv, "key%04d" % i, chunk(i))
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                failed.append(i)
        st = mc.capacity_status()
        assert not failed, (f"{len(failed)} of {n} stores failed with ENOSPC (pool "
                            f"{st.capacity / MiB:.0f} MiB on a 96 MiB disk)")
        assert st.stats["evicted_files"] > 0
        last = os.path.join(kv, "key%04d.data" % (n - 1))
        assert exists(last)
        with open(last, "rb") as f:
            assert f.read() == chunk(n - 1)
    finally:
        if mc is not None:
            mc.close()
        try:
            c.down()
        finally:
            subprocess.run(["umount", "-l", disk], capture_output=True)
