"""A starved master never declares workers lost (issue 12, the stream-starvation attack).

A real cluster at the default settings (LocalCluster: master, 2 workers, a FUSE
mount; worker_lost_after 30 s, stream idle timeouts 60 s, max_sessions 1024), files
written through the mount.  Then a pod's worth of malice with the client token
(tests/stream_flood.py, its own process): 1,500 Session and 1,500 Calls streams to
the master and 200 WriteBlock streams to a worker, each sending HTTP/2 HEADERS and no
message, held for longer than worker_lost_after.

Before the fix the Session streams took all of the master's RPC threads (they blocked
before the max_sessions check), heartbeats timed out, both workers were declared lost
and every file was removed.  Now each stream counts against its limit from its first
frame (streams past the limits are refused at once), heartbeats are served on the
master's worker port with threads of their own, and the worker keeps threads free of
block streams.  During the attack an honest stat through the mount, an honest unary
call to the worker and the workers' heartbeats are answered; afterwards no worker was
declared lost and every file reads back.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time

import grpc

from cluster_util import metric_samples
from curvine.common import auth
from curvine.common.rpc import make_channel
from curvine.proto import master_pb2, master_pb2_grpc, worker_pb2, worker_pb2_grpc

HERE = os.path.dirname(os.path.abspath(__file__))
SESSIONS, CALLS, WRITES = 1500, 1500, 200
HOLD = 36.0  # seconds: longer than master.worker_lost_after (30 s by default)
DEADLINE = 20.0  # bounds every honest call


def contact_age(http_port: int) -> float:
    return metric_samples(http_port, "curvine_worker_master_contact_age_seconds")[0].value


def test_stream_starvation_loses_no_worker_and_no_file(make_cluster):
    cluster = make_cluster(workers=2, mounts=1)
    mount = cluster.mounts[0]
    files = {}
    for i in range(8):
        path = os.path.join(mount, f"kv{i}.data")
        data = os.urandom(2_000_000 + i)
        with open(path, "wb") as f:
            f.write(data)
        files[path] = data
    token = auth.read_token_file(os.path.join(cluster.base, auth.TOKEN_FILE_NAME))
    worker = cluster._proc("worker", 0)
    workers_http = [cluster._proc("worker", i).http_port for i in range(2)]

    with make_channel(cluster.master_addr, cluster.security) as mch:
        master = master_pb2_grpc.MasterStub(mch)
        ino = master.Lookup(master_pb2.LookupRequest(parent=1, name=b"kv0.data"),
                            timeout=DEADLINE).inode.ino
        located = master.GetBlocks(master_pb2.GetBlocksRequest(ino=ino), timeout=DEADLINE)
    block = located.blocks[0]
    holder = {w.worker_id: w.address for w in located.workers}[block.worker_ids[0]]

    attacker = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "stream_flood.py"), cluster.master_addr,
         worker.address, token, str(SESSIONS), str(CALLS), str(WRITES), str(HOLD)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stat_times, worker_times, ages = [], [], []
    try:
        time.sleep(5)  # the streams are open
        ends = time.monotonic() + HOLD - 8
        with make_channel(holder, cluster.security) as wch:
            wstub = worker_pb2_grpc.WorkerStub(wch)
            while time.monotonic() < ends:
                for path in files:
                    t = time.monotonic()
                    assert os.stat(path).st_size == len(files[path])
                    stat_times.append(time.monotonic() - t)
                t = time.monotonic()
                info = wstub.GetBlockInfo(worker_pb2.GetBlockInfoRequest(
                    block_id=block.block_id, token=block.token), timeout=DEADLINE)
                worker_times.append(time.monotonic() - t)
                assert info.length == block.length
                ages.append(max(contact_age(p) for p in workers_http))
                time.sleep(1.0)
        out, err = attacker.communicate(timeout=HOLD + 120)
    finally:
        if attacker.poll() is None:
            attacker.kill()
            attacker.wait()
    assert attacker.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    print(f"\nattack (held {HOLD:.0f}s): {result}")
    print(f"during it: stat through the mount median {statistics.median(stat_times) * 1000:.1f} ms "
          f"max {max(stat_times) * 1000:.0f} ms ({len(stat_times)}); worker GetBlockInfo "
          f"median {statistics.median(worker_times) * 1000:.1f} ms max "
          f"{max(worker_times) * 1000:.0f} ms; oldest heartbeat age seen {max(ages):.1f}s")
    # the attack was real: the limits held the streams they admit, refused the rest
    assert result["Session"]["open"] >= 1000 and result["Calls"]["open"] >= 1000, result
    assert result["WriteBlock"]["open"] >= 1, result
    # the workers' heartbeats kept being answered (one per second)
    assert max(ages) < 10, ages

    time.sleep(2)
    with make_channel(cluster.master_addr, cluster.security) as mch:
        master = master_pb2_grpc.MasterStub(mch)
        report = master.Report(master_pb2.ReportRequest(), timeout=DEADLINE)
        status = master.ReplicationStatus(master_pb2.ReplicationStatusRequest(),
                                          timeout=DEADLINE)
    assert [w.state for w in report.workers] == ["live", "live"], report.workers
    assert list(status.lost_workers) == []
    assert report.files_with_data == len(files)
    for path, data in files.items():
        with open(path, "rb") as f:
            assert f.read() == data, path
    master_log = open(cluster.log_path("master")).read()
    assert "declared lost" not in master_log
