"""``KVStore.put_many`` (issue 36): a prompt's chunks stored with two master calls, on a
real local cluster (master, workers, a mount where the test needs one).

Blocks are 1 MiB here, so chunks of a few MiB span several blocks.  The checks: every
name stored byte-exact with ONE AddBlocksForPut and ONE PutFiles (the master's
``curvine_rpc_server_handled_total``), names that exist skipped and reported; a chunk
whose worker is SIGKILLed between the reservation and the writes left out, the others
published, and no block file of it left on any worker; the names there, with the same
bytes, after the master is SIGKILLed right after put_many returned; a mount that found a
name missing finds it as soon as put_many returns (consistency rule 2).
"""

from __future__ import annotations

import hashlib
import os
import signal

import pytest

from cluster_util import master_calls, wait_for
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import MIB
from curvine.connector.store import KVStore

from test_kvstore import BLOCK, NS, _conf, block_files, read_all, staging_files

CALLS = ("AddBlocksForPut", "PutFiles", "AddBlock", "PutFile", "LookupMany")


def _calls(c) -> dict[str, float]:
    return {m: master_calls(c, m) for m in CALLS}


def _since(c, before: dict[str, float]) -> dict[str, float]:
    return {m: v - before[m] for m, v in _calls(c).items() if v - before[m]}


def _block_ids(c) -> set[int]:
    return {int(os.path.basename(p).partition(".")[0], 16) for p in block_files(c)}


def _stored_block_ids(kv: KVStore, names: list[str]) -> set[int]:
    return {b.block_id for e in kv.lookup(names) if e is not None for b in e.blocks
            if b.block_id}


@pytest.fixture
def kv_cluster(make_cluster, tmp_path):
    return make_cluster(workers=2, mounts=0, conf=_conf(tmp_path))


def test_put_many_stores_every_name_with_one_reserve_and_one_publish(kv_cluster):
    c = kv_cluster
    sizes = [0, 1, BLOCK, BLOCK + 1, 3 * BLOCK + 12345, 100, 2 * BLOCK, 7]
    data = [os.urandom(n) for n in sizes]
    names = [f"model@1@0@{i:064x}@bfloat16.data" for i in range(len(sizes))]
    with KVStore.open(c.client_conf, NS) as kv:
        kv.directory()
        kv.fs.block_size()
        before = _calls(c)
        # gather lists of several buffers, as LMCache's (metadata, tensor bytes)
        items = [(n, [d[:len(d) // 2], bytearray(d[len(d) // 2:])]) for n, d in zip(names, data)]
        assert kv.put_many(items) == [True] * len(names)
        assert _since(c, before) == {"AddBlocksForPut": 1, "PutFiles": 1}
        assert read_all(kv, names) == data
        assert staging_files(c) == []
        assert _block_ids(c) == _stored_block_ids(kv, names)
        assert kv.stats["puts"] == len(names)

        # names that exist are skipped (no block reserved or written) and reported
        files = sorted(block_files(c))
        more = [f"new-{i}.data" for i in range(3)]
        again = [(names[0], [b"x"]), (more[0], [b"a" * BLOCK]), (names[4], [b"y" * BLOCK]),
                 (more[1], [b"b"]), (more[2], [b""]), ("no/slash", [b"z"])]
        before = _calls(c)
        assert kv.put_many(again) == [False, True, False, True, True, None]
        assert _since(c, before) == {"AddBlocksForPut": 1, "PutFiles": 1}
        assert read_all(kv, names) == data  # unchanged
        assert read_all(kv, more) == [b"a" * BLOCK, b"b", b""]
        assert set(files) <= set(block_files(c))
        assert _block_ids(c) == _stored_block_ids(kv, names + more)
        # a batch of names that all exist costs the reservation only
        before = _calls(c)
        assert kv.put_many([(n, [b"q"]) for n in more]) == [False] * 3
        assert _since(c, before) == {"AddBlocksForPut": 1}
        assert kv.put_many([]) == []
    # without the worker's socket: the blocks go over gRPC
    remote = [os.urandom(n) for n in (BLOCK + 3, 5, 2 * BLOCK)]
    with KVStore.open(c.client_conf, NS, short_circuit=False) as kv:
        assert kv.sockets is None
        names = [f"remote-{i}.data" for i in range(len(remote))]
        assert kv.put_many([(n, [d]) for n, d in zip(names, remote)]) == [True] * 3
        assert read_all(kv, names) == remote


def test_a_chunk_whose_worker_dies_is_left_out_and_nothing_is_left_behind(kv_cluster,
                                                                          monkeypatch):
    c = kv_cluster
    names = [f"c{i}.data" for i in range(8)]
    # the first chunk spans three blocks (on both workers), the others one each
    data = [os.urandom(2 * BLOCK + 5)] + [os.urandom(BLOCK // 2 + i) for i in range(7)]
    with KVStore.open(c.client_conf, NS) as kv:
        reserve = kv.master.add_blocks_for_put
        killed: list[int] = []

        def reserve_then_kill(*args, **kw):
            # the reservation is made; the worker of the first chunk dies before any
            # byte is written to it
            reply = reserve(*args, **kw)
            victim = reply.results[0].blocks[0].worker_ids[0]
            placed = {r.blocks[0].worker_ids[0] for r in reply.results}
            assert len(placed) == 2, f"every chunk on one worker: {placed}"
            # the first chunk has a block on the worker that lives: written, then
            # deleted when its chunk is left out
            assert {b.worker_ids[0] for b in reply.results[0].blocks} == placed
            address = next(w.address for w in reply.workers if w.worker_id == victim)
            index = next(r["index"] for r in c.status()
                         if r["role"] == "worker" and r["address"] == address)
            c.kill("worker", index, signal.SIGKILL)
            killed.append(index)
            return reply

        monkeypatch.setattr(kv.master, "add_blocks_for_put", reserve_then_kill)
        got = kv.put_many(list(zip(names, [[d] for d in data])))
        monkeypatch.undo()
        assert True in got and None in got and False not in got
        stored = [n for n, g in zip(names, got) if g]
        lost = [n for n, g in zip(names, got) if g is None]
        # the others are published, byte-exact; the left-out ones are no names at all
        assert read_all(kv, stored) == [d for d, g in zip(data, got) if g]
        assert kv.lookup(lost) == [None] * len(lost)
        # nothing left behind on the live worker, and nothing on the dead one once it
        # is back (its reserved blocks were freed at the master by the publish call)
        c.start("worker", killed[0])
        keep = _stored_block_ids(kv, stored)
        wait_for(lambda: _block_ids(c) == keep and not staging_files(c), timeout=60,
                 what=f"only the stored chunks' blocks {sorted(keep)}: {sorted(_block_ids(c))}")
        # the names left out can be stored again
        assert kv.put_many([(n, [b"again"]) for n in lost]) == [True] * len(lost)


@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master is SIGKILLed on purpose
def test_names_stored_by_put_many_survive_a_master_crash(kv_cluster):
    c = kv_cluster
    names = [f"crash-{i}.data" for i in range(8)]
    data = [os.urandom(MIB + 1000 * i) for i in range(8)]
    digests = [hashlib.sha256(d).hexdigest() for d in data]
    with KVStore.open(c.client_conf, NS) as kv:
        assert kv.put_many(list(zip(names, [[d] for d in data]))) == [True] * 8
    c.kill("master", 0, signal.SIGKILL)  # right after put_many returned
    c.start("master", 0)
    with KVStore.open(c.client_conf, NS) as kv:
        wait_for(lambda: all(kv.lookup_quietly(names)), timeout=60,
                 what="every name after the master's restart")
        assert [hashlib.sha256(d).hexdigest() if d is not None else None
                for d in read_all(kv, names)] == digests


def test_a_mount_finds_a_name_put_many_stored_at_once(make_cluster, tmp_path):
    c = make_cluster(workers=1, mounts=1, conf=_conf(tmp_path))
    with KVStore.open(c.client_conf, NS) as kv:
        kv.directory()
        d = os.path.join(c.mounts[0], NS.lstrip("/"))
        names = [f"seen-{i}.data" for i in range(4)]
        assert os.listdir(d) == []  # the mount may hold the (empty) listing now
        for n in names:  # and the misses: each stat'ed as missing first
            assert not os.path.exists(os.path.join(d, n))
        assert kv.put_many([(n, [n.encode() * 10]) for n in names]) == [True] * 4
        for n in names:  # no wait: found as soon as put_many returned
            with open(os.path.join(d, n), "rb") as f:
                assert f.read() == n.encode() * 10
        assert sorted(os.listdir(d)) == names


@pytest.mark.parametrize("call", ["put_file", "put_files"])
def test_a_publish_whose_answer_was_lost_keeps_its_blocks(kv_cluster, call):
    """The master made the publish durable and its answer never came (a leader
    SIGKILLed once its record was in etcd): the client cannot tell it from a publish
    that never happened, so it deletes nothing; the names it may have made keep their
    bytes (before the fix, the blocks were deleted under the published names)."""
    c = kv_cluster
    names = ["lost-answer-0.data", "lost-answer-1.data"]
    data = [os.urandom(BLOCK + 1000), os.urandom(300_000)]
    with KVStore.open(c.client_conf, NS) as kv:
        publish = getattr(kv.master, call)

        def applied_then_lost(*args, **kw):
            publish(*args, **kw)
            raise CurvineError(ErrorKind.UNAVAILABLE, f"{call}: connection reset")

        setattr(kv.master, call, applied_then_lost)
        if call == "put_file":
            for name, d in zip(names, data):
                with pytest.raises(CurvineError):
                    kv.put(name, [d])
        else:
            with pytest.raises(CurvineError):
                kv.put_many([(name, [d]) for name, d in zip(names, data)])
        del kv.master.__dict__[call]
        assert read_all(kv, names) == data
