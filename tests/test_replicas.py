"""Replicas and worker loss.

In-process (a real Master, workers played by the test through the same calls the
worker daemon makes): placement of ``replicas`` workers, a silent worker declared
lost, its locations dropped (a file without a replica left disappears), copies
planned from a surviving replica and admitted when confirmed, never more replicas
than wanted, a rejoining worker's blocks re-admitted or deleted, replay after a
restart.

Real processes (master, workers, FUSE mounts): reads through a mount while one of
two replicas' workers is SIGKILLed (no error, no wrong byte), re-replication after
a worker is lost for good, and files whose only replica was lost vanishing cleanly.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from curvine.common.config import Config
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO, new_request_id
from curvine.master.master import Master
from curvine.proto import common_pb2, master_pb2

from fs_helpers import wait_until

MiB = 1 << 20
LOST_AFTER = 0.6  # seconds without heartbeats before the in-process master declares a worker lost


# ---------------------------------------------------------------------- in-process
def make_master(tmp_path, replicas: int = 2) -> Master:
    cfg = Config()
    cfg.master.meta_dir = str(tmp_path / "meta")
    cfg.journal.dir = str(tmp_path / "journal")
    cfg.cluster.block_size = 4 * MiB
    cfg.cluster.replicas = replicas
    cfg.master.worker_lost_after = LOST_AFTER
    cfg.master.orphan_block_grace = 0.0
    return Master(cfg)


def add_worker(m, name: str) -> int:
    wid = m.register_worker(common_pb2.WorkerInfo(
        uuid=name, host_id=f"host-{name}", address=f"127.0.0.1:{1000 + len(name)}",
        data_dirs=["/d"], capacity=1 << 40)).worker_id
    m.block_report(master_pb2.BlockReportRequest(worker_id=wid))
    return wid


def beat(m, wid, replicated=(), failed=()) -> master_pb2.HeartbeatReply:
    return m.heartbeat(master_pb2.HeartbeatRequest(
        worker_id=wid, capacity=1 << 40, used=0, replicated_block_ids=list(replicated),
        failed_block_ids=list(failed)))


def write_file(m, name: bytes, length: int = MiB, parent: int = ROOT_INO):
    """Create and publish a one-block file on the workers AddBlock picks."""
    node = m.create(master_pb2.CreateRequest(request_id=new_request_id(), parent=parent,
                                             name=name, mode=0o644)).inode
    r = m.add_block(master_pb2.AddBlockRequest(ino=node.ino, size_hint=length))
    block = common_pb2.Block(block_id=r.block_id, length=length, checksum=7,
                             worker_ids=[w.worker_id for w in r.workers])
    m.complete(master_pb2.CompleteFileRequest(request_id=new_request_id(), ino=node.ino,
                                              blocks=[block], size=length))
    return node.ino, r.block_id, list(block.worker_ids)


def locations(m, ino) -> list[int]:
    return list(m.get_blocks(ino).blocks[0].worker_ids)


def keep_alive(m, wids, until, collect=None):
    """Heartbeat ``wids`` until ``until()`` holds (bounded); replies go to ``collect``."""
    deadline = time.monotonic() + 15
    while True:
        for w in wids:
            reply = beat(m, w)
            if collect is not None:
                collect.setdefault(w, []).extend(reply.replicate)
        v = until()
        if v:
            return v
        assert time.monotonic() < deadline, "timed out (15 s)"
        time.sleep(0.05)


def test_add_block_places_replicas(tmp_path):
    m = make_master(tmp_path, replicas=2)
    try:
        ws = [add_worker(m, n) for n in ("a", "b", "c")]
        for w in ws:
            beat(m, w)
        _, _, locs = write_file(m, b"f")
        assert len(locs) == 2 and len(set(locs)) == 2
        # a directory's own count wins for files created in it afterwards
        d = m.mkdir(master_pb2.MkdirRequest(request_id=new_request_id(), parent=ROOT_INO,
                                            name=b"three", mode=0o755)).inode
        with m.store.env.begin(write=True) as txn:  # (the RPC that sets it is not ours)
            node = m.store.get_inode(txn, d.ino)
            node.replicas = 3
            m.store.put_inode(txn, node)
        _, _, locs3 = write_file(m, b"g", parent=d.ino)
        assert sorted(locs3) == sorted(ws)
    finally:
        m.close()


def test_lost_worker_copies_and_rejoin(tmp_path):
    m = make_master(tmp_path, replicas=2)
    try:
        a, b, c = (add_worker(m, n) for n in ("a", "b", "c"))
        for w in (a, b, c):
            beat(m, w)
        files = [write_file(m, f"f{i}".encode()) for i in range(6)]
        on_a = [(ino, bid, locs) for ino, bid, locs in files if a in locs]
        assert on_a, "placement never picked worker a"
        m.replication.run_round()
        assert m.replication.status().under_replicated_blocks == 0

        # a goes silent: lost, its locations dropped, copies planned onto the third worker
        commands: dict[int, list] = {}
        keep_alive(m, (b, c), lambda: a in m.replication.status().lost_workers, commands)
        for ino, bid, locs in on_a:
            assert a not in locations(m, ino)
        keep_alive(m, (b, c), lambda: sum(len(v) for v in commands.values()) >= len(on_a),
                   commands)
        by_block = {cmd.block_id: (w, cmd) for w, cmds in commands.items() for cmd in cmds}
        assert set(by_block) == {bid for _, bid, _ in on_a}
        for ino, bid, locs in on_a:
            target, cmd = by_block[bid]
            survivor = next(w for w in locs if w != a)
            assert target not in locs and [s.worker_id for s in cmd.sources] == [survivor]
            assert cmd.length == MiB and cmd.checksum == 7
        status = m.replication.status()
        assert status.under_replicated_blocks == len(on_a)
        assert status.copies_in_flight == len(on_a)

        # one copy fails, the rest are confirmed: admitted as locations (journaled)
        first = on_a[0][1]
        done = [bid for _, bid, _ in on_a[1:]]
        for w in (b, c):
            beat(m, w, replicated=[x for x in done if by_block[x][0] == w],
                 failed=[first] if by_block[first][0] == w else [])
        for ino, bid, _ in on_a[1:]:
            assert sorted(locations(m, ino)) == sorted(
                {by_block[bid][0]} | {w for w in files[[f[1] for f in files].index(bid)][2]
                                      if w != a})
        # the failed one is planned again after the back-off, and then confirmed
        commands.clear()
        keep_alive(m, (b, c), lambda: any(cmd.block_id == first
                                          for cmds in commands.values() for cmd in cmds),
                   commands)
        target = next(w for w, cmds in commands.items() if any(x.block_id == first for x in cmds))
        beat(m, target, replicated=[first])
        assert keep_alive(m, (b, c), lambda: m.replication.status().under_replicated_blocks == 0)

        # a comes back: told to register again; its stale copies are not wanted any more
        assert beat(m, a).reregister
        m.register_worker(common_pb2.WorkerInfo(uuid="a", host_id="host-a",
                                                address="127.0.0.1:1001", data_dirs=["/d"]))
        m.block_report(master_pb2.BlockReportRequest(
            worker_id=a, block_ids=[bid for _, bid, _ in on_a], block_lengths=[MiB] * len(on_a)))
        assert a not in m.replication.status().lost_workers
        reply = beat(m, a)
        assert not reply.reregister
        assert sorted(reply.delete_block_ids) == sorted(bid for _, bid, _ in on_a)
        for ino, _, _ in files:
            assert len(locations(m, ino)) == 2
    finally:
        m.close()


def test_rejoin_readmits_when_short_and_extra_copies_are_deleted(tmp_path):
    m = make_master(tmp_path, replicas=2)
    try:
        a, b = add_worker(m, "a"), add_worker(m, "b")
        for w in (a, b):
            beat(m, w)
        ino, bid, locs = write_file(m, b"f")
        assert sorted(locs) == sorted([a, b])
        keep_alive(m, (b,), lambda: a in m.replication.status().lost_workers)
        assert locations(m, ino) == [b]
        # no third worker: nothing to copy to; the block stays under-replicated
        assert m.replication.status().under_replicated_inos == [ino]
        # a rejoins with its copy (a short copy would not do): a location again
        m.register_worker(common_pb2.WorkerInfo(uuid="a", host_id="host-a",
                                                address="127.0.0.1:1001", data_dirs=["/d"]))
        m.block_report(master_pb2.BlockReportRequest(worker_id=a, block_ids=[bid],
                                                     block_lengths=[MiB]))
        assert sorted(locations(m, ino)) == sorted([a, b])
        assert m.replication.status().under_replicated_blocks == 0
        # a late confirmation of a copy nobody needs: deleted, not a third location
        c = add_worker(m, "c")
        beat(m, c, replicated=[bid])
        assert sorted(locations(m, ino)) == sorted([a, b])
        assert list(beat(m, c).delete_block_ids) == [bid]
    finally:
        m.close()
    # the admitted location survives a restart (journal replay)
    m = make_master(tmp_path, replicas=2)
    try:
        assert sorted(locations(m, ino)) == sorted([a, b])
    finally:
        m.close()


def test_lost_only_replica_removes_file(tmp_path):
    m = make_master(tmp_path, replicas=1)
    try:
        a, b = add_worker(m, "a"), add_worker(m, "b")
        for w in (a, b):
            beat(m, w)
        files = [write_file(m, f"f{i}".encode()) for i in range(8)]
        keep_alive(m, (b,), lambda: a in m.replication.status().lost_workers)
        names = {e.name for e in m.listdir(ROOT_INO, b"", 0).entries}
        for i, (ino, bid, locs) in enumerate(files):
            name = f"f{i}".encode()
            if locs == [a]:
                assert name not in names
                with pytest.raises(CurvineError) as e:
                    m.lookup(ROOT_INO, name)
                assert e.value.kind == ErrorKind.NOT_FOUND
            else:
                assert name in names and locations(m, ino) == [b]
        assert any(locs == [a] for _, _, locs in files)
    finally:
        m.close()
