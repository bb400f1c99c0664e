"""The master's guards against its clients' mistakes and malice, and against itself.

- CompleteFile publishes only blocks allocated to that file: another file's pending
  block is refused (a reader of the attacker's file would get the victim's bytes),
  also after a master restart, when the master no longer knows the pending blocks
  and the write token from AddBlock is the proof.
- A master that was stalled does not blame its workers: a real master process is
  stopped (SIGSTOP) for longer than worker_lost_after and continued; no worker is
  declared lost, no file removed (master/cluster/lag.py).
- Losing more than master.max_lost_share of the workers at once is held: at the
  default settings, both workers of a cluster killed (SIGKILL) for longer than
  worker_lost_after: every file is still there, the master says so loudly, and the
  files read back when the workers return.
- The mass-loss hold ends after master.mass_loss_hold (in-process, short timers).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

import test_master
from cluster_util import wait_for
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO, new_request_id
from curvine.common.rpc import make_channel
from curvine.master.master import Master
from curvine.proto import common_pb2, master_pb2, master_pb2_grpc

MiB = 1 << 20


def make_master(tmp_path, **master) -> Master:
    return test_master.make_master(tmp_path, master=master)


def add_worker(m, uuid: str) -> int:
    wid = m.register_worker(common_pb2.WorkerInfo(
        uuid=uuid, host_id="h-" + uuid, address="127.0.0.1:1", data_dirs=["/d"],
        capacity=1 << 40)).worker_id
    m.heartbeat(master_pb2.HeartbeatRequest(worker_id=wid, capacity=1 << 40, used=0))
    return wid


def create(m, name: bytes) -> common_pb2.Inode:
    return m.create(master_pb2.CreateRequest(request_id=new_request_id(), parent=ROOT_INO,
                                             name=name, mode=0o644)).inode


def complete(m, ino: int, block: common_pb2.Block):
    return m.complete(master_pb2.CompleteFileRequest(
        request_id=new_request_id(), ino=ino, blocks=[block], size=block.length))


def test_complete_accepts_only_blocks_allocated_to_the_file(tmp_path):
    m = make_master(tmp_path)
    try:
        wid = add_worker(m, "w1")
        victim, attacker = create(m, b"victim.tmp"), create(m, b"attacker.tmp")
        r = m.add_block(master_pb2.AddBlockRequest(ino=victim.ino, size_hint=MiB))
        stolen = common_pb2.Block(block_id=r.block_id, length=MiB, checksum=1,
                                  worker_ids=[wid])
        with pytest.raises(CurvineError) as e:
            complete(m, attacker.ino, stolen)
        assert e.value.kind == ErrorKind.INVALID
        assert "blocks[0].block_id" in e.value.message and "not allocated" in e.value.message
        # with the victim's write token it is still not the attacker's block
        stolen.token = r.block_token
        with pytest.raises(CurvineError):
            complete(m, attacker.ino, stolen)
        assert m.getattr(attacker.ino).size == 0
        # the block's own file publishes it
        assert complete(m, victim.ino, stolen).inode.size == MiB
        # a block id never allocated at all
        with pytest.raises(CurvineError):
            complete(m, attacker.ino, common_pb2.Block(block_id=r.block_id + 1000, length=MiB,
                                                       worker_ids=[wid]))
        # pending across a restart: the master forgets what it allocated
        r2 = m.add_block(master_pb2.AddBlockRequest(ino=victim.ino, size_hint=MiB))
    finally:
        m.close()
    m = make_master(tmp_path)
    try:
        add_worker(m, "w1")
        block = common_pb2.Block(block_id=r2.block_id, length=MiB, checksum=2,
                                 worker_ids=[wid])
        with pytest.raises(CurvineError) as e:
            complete(m, attacker.ino, block)  # no proof: refused
        assert "not allocated" in e.value.message
        block.token = r2.block_token  # the writer that got it from AddBlock
        assert complete(m, victim.ino, block).inode.size == MiB
    finally:
        m.close()


def test_mass_loss_is_held_then_declared(tmp_path):
    m = make_master(tmp_path, worker_lost_after=0.5, mass_loss_hold=3.0)
    try:
        a, b, c = add_worker(m, "a"), add_worker(m, "b"), add_worker(m, "c")
        f = create(m, b"f")
        r = m.add_block(master_pb2.AddBlockRequest(ino=f.ino, size_hint=MiB))
        complete(m, f.ino, common_pb2.Block(block_id=r.block_id, length=MiB, checksum=1,
                                            worker_ids=[w.worker_id for w in r.workers]))

        def beat(*wids):
            for w in wids:
                m.heartbeat(master_pb2.HeartbeatRequest(worker_id=w, capacity=1 << 40))

        # one of three silent (33% <= 50%): declared lost at once
        started = time.monotonic()
        while time.monotonic() - started < 1.5:
            beat(b, c)
            m.replication.run_round()
            time.sleep(0.1)
        assert list(m.replication.status().lost_workers) == [a]
        # then the other two as well (3 of 3): held, nothing more dropped
        held_from = time.monotonic()
        while time.monotonic() - held_from < 2.0:
            m.replication.run_round()
            time.sleep(0.1)
        assert list(m.replication.status().lost_workers) == [a]
        # past mass_loss_hold, still silent: declared
        wait_for(lambda: (m.replication.run_round(),
                          len(m.replication.status().lost_workers) == 3)[1],
                 timeout=10, what="the held loss declared after mass_loss_hold")
        assert time.monotonic() - held_from >= 3.0
    finally:
        m.close()


def names_in(mount: str) -> list[str]:
    return sorted(os.listdir(mount))


@pytest.mark.expect_log(r"ERROR curvine\.master\.cluster\.replication: HOLDING a mass loss")  # every worker SIGKILLed on purpose
def test_losing_every_worker_at_the_defaults_keeps_the_files(make_cluster):
    cluster = make_cluster(workers=2, mounts=1)
    mount = cluster.mounts[0]
    files = {}
    for i in range(6):
        data = os.urandom(500_000 + i)
        with open(os.path.join(mount, f"kv{i}.data"), "wb") as f:
            f.write(data)
        files[f"kv{i}.data"] = data
    for i in range(2):
        cluster.kill("worker", i, signal.SIGKILL)
    time.sleep(36)  # worker_lost_after (30 s) and some rounds
    assert names_in(mount) == sorted(files)
    with make_channel(cluster.master_addr, cluster.security) as ch:
        report = master_pb2_grpc.MasterStub(ch).Report(master_pb2.ReportRequest(), timeout=20)
    assert report.files_with_data == len(files)
    log = open(cluster.log_path("master")).read()
    assert "HOLDING a mass loss: 2 of 2 registered workers silent" in log, log[-3000:]
    assert "declared lost" not in log
    for i in range(2):
        cluster.start("worker", i)
    for name, data in files.items():
        with open(os.path.join(mount, name), "rb") as f:
            assert f.read() == data, name


@pytest.mark.expect_log(r"WARNING curvine\.master\.cluster\.lag: the master stalled for", r"WARNING curvine\.master\.cluster\.replication: worker \d+ \(\S+\) missed heartbeats for \S+: declared lost")  # master SIGSTOPped, then worker 1 SIGKILLed, on purpose
def test_a_stalled_master_declares_no_worker_lost(make_cluster, tmp_path):
    """The master process is stopped for 3 x worker_lost_after (short timers here, so
    the test takes seconds; the lag monitor's threshold does not depend on them) with
    the mass-loss hold off (max_lost_share 1.0), so that only the lag monitor stands
    between the stall and the loss of both workers."""
    conf = tmp_path / "c.toml"
    conf.write_text('[master]\nworker_lost_after = "2s"\nmax_lost_share = 1.0\n')
    cluster = make_cluster(workers=2, mounts=1, conf=str(conf))
    mount = cluster.mounts[0]
    with open(os.path.join(mount, "kv.data"), "wb") as f:
        f.write(b"x" * 300_000)
    master = cluster._proc("master", 0)
    os.kill(master.pid, signal.SIGSTOP)
    try:
        time.sleep(6)
    finally:
        os.kill(master.pid, signal.SIGCONT)
    time.sleep(3)  # rounds after the stall
    log = open(cluster.log_path("master")).read()
    assert "the master stalled for" in log, log[-3000:]
    assert "declared lost" not in log, log[-3000:]
    with open(os.path.join(mount, "kv.data"), "rb") as f:
        assert f.read() == b"x" * 300_000
    # a worker that really stops is still declared lost
    cluster.kill("worker", 1, signal.SIGKILL)
    wait_for(lambda: "declared lost" in open(cluster.log_path("master")).read(),
             timeout=20, what="a killed worker declared lost")
