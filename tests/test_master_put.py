"""The connector's master calls, in-process: LookupMany (a prompt's keys in one call,
blocks with read tokens) and PutFile (a whole file under its final name in one journal
record, AddBlock's put form before it), including replay after a restart."""

from __future__ import annotations

import shutil
import time

import pytest

from curvine.common import block_tokens
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO, new_request_id
from curvine.master.cluster import pending
from curvine.proto import common_pb2, master_pb2

from test_master import MiB, add_worker, create, kind_of, make_master, mkdir, publish


@pytest.fixture
def master(tmp_path):
    m = make_master(tmp_path)
    yield m
    m.close()


def put_blocks(m, parent, name, lengths):
    """AddBlock's put form for each block: (blocks with write tokens, existing inode)."""
    blocks = []
    for n in lengths:
        r = m.add_block(master_pb2.AddBlockRequest(put_parent=parent, put_name=name,
                                                   client_host_id="h1", size_hint=n))
        if r.HasField("existing"):
            return blocks, r.existing
        blocks.append(common_pb2.Block(block_id=r.block_id, length=n, checksum=7,
                                       worker_ids=[w.worker_id for w in r.workers],
                                       token=r.block_token))
    return blocks, None


def put(m, parent, name, blocks, rid=None):
    return m.put_file(master_pb2.PutFileRequest(
        request_id=rid or new_request_id(), parent=parent, name=name, mode=0o644,
        blocks=blocks, size=sum(b.length for b in blocks)))


def test_put_publishes_a_complete_file_in_one_step(master):
    wid = add_worker(master)
    d = mkdir(master, ROOT_INO, b"l2cache")
    blocks, existing = put_blocks(master, d.ino, b"k.data", [4 * MiB, MiB])
    assert existing is None
    # before PutFile the name does not exist: no temporary name, nothing half-written
    assert master.lookup_or_none(d.ino, b"k.data") is None
    reply = put(master, d.ino, b"k.data", blocks)
    assert not reply.existed
    node = reply.inode
    assert node.state == common_pb2.COMPLETE and node.size == 5 * MiB and node.version == 1
    assert master.lookup(d.ino, b"k.data").ino == node.ino
    got = master.get_blocks(node.ino)
    assert [b.block_id for b in got.blocks] == [b.block_id for b in blocks]
    assert all(not b.token or block_tokens.allows(master.block_key, b.block_id, b.token,
                                                  block_tokens.READ) for b in got.blocks)
    # published blocks are no longer pending (a block report keeps them, as a file's)
    assert not any(b.block_id in master.pending for b in blocks)
    assert [w.worker_id for w in got.workers] == [wid]


def test_put_of_an_existing_name_changes_nothing_and_frees_the_blocks(master):
    wid = add_worker(master)
    d = mkdir(master, ROOT_INO, b"l2cache")
    first, _ = put_blocks(master, d.ino, b"k.data", [MiB])
    second, _ = put_blocks(master, d.ino, b"k.data", [2 * MiB])  # a racing writer
    one = put(master, d.ino, b"k.data", first).inode
    reply = put(master, d.ino, b"k.data", second)
    assert reply.existed and reply.inode.ino == one.ino and reply.inode.size == MiB
    assert master.lookup(d.ino, b"k.data").size == MiB  # the first writer's bytes stay
    deletes = master.heartbeat(master_pb2.HeartbeatRequest(worker_id=wid, capacity=1 << 40)
                               ).delete_block_ids
    assert list(deletes) == [second[0].block_id]
    # and AddBlock's put form refuses to allocate for a name that exists
    blocks, existing = put_blocks(master, d.ino, b"k.data", [MiB])
    assert blocks == [] and existing.ino == one.ino


def test_put_checks_its_blocks(master):
    add_worker(master)
    d = mkdir(master, ROOT_INO, b"d")
    f = create(master, ROOT_INO, b"being-written")
    _, ids = publish(master, f.ino, [MiB])
    blocks, _ = put_blocks(master, d.ino, b"a", [MiB])
    for bad, what in [
        (common_pb2.Block(block_id=blocks[0].block_id, length=MiB,
                          worker_ids=blocks[0].worker_ids), "not allocated"),  # no token
        (common_pb2.Block(block_id=blocks[0].block_id, length=MiB, token=b"x" * 16,
                          worker_ids=blocks[0].worker_ids), "not allocated"),
        (common_pb2.Block(block_id=ids[0], length=MiB, worker_ids=blocks[0].worker_ids,
                          token=block_tokens.mint(master.block_key, ids[0],
                                                  block_tokens.WRITE)), "another file"),
    ]:
        with pytest.raises(CurvineError) as e:
            put(master, d.ino, b"a", [bad])
        assert e.value.kind == ErrorKind.INVALID and what in str(e.value), e.value
    # a block pending for a file being written cannot be published under another name
    r = master.add_block(master_pb2.AddBlockRequest(ino=f.ino, client_host_id="h1"))
    theirs = common_pb2.Block(block_id=r.block_id, length=MiB, token=r.block_token,
                              worker_ids=[w.worker_id for w in r.workers])
    assert kind_of(put, master, d.ino, b"b", [theirs]) == ErrorKind.INVALID
    assert master.lookup_or_none(d.ino, b"a") is None and master.lookup_or_none(d.ino, b"b") is None
    # bad names and parents
    assert kind_of(put, master, d.ino, b"x/y", blocks) == ErrorKind.INVALID
    assert kind_of(put, master, f.ino, b"z", blocks) == ErrorKind.NOT_DIR
    # an empty file is a put too
    assert put(master, d.ino, b"empty", []).inode.size == 0


def test_put_is_retried_once_and_replayed_after_a_restart(tmp_path):
    m = make_master(tmp_path)
    try:
        add_worker(m)
        d = mkdir(m, ROOT_INO, b"l2cache")
        blocks, _ = put_blocks(m, d.ino, b"k.data", [MiB, MiB])
        rid = new_request_id()
        node = put(m, d.ino, b"k.data", blocks, rid=rid).inode
        again = put(m, d.ino, b"k.data", blocks, rid=rid)  # a retry after a lost reply
        assert not again.existed and again.inode.ino == node.ino
        want = m.get_blocks(node.ino)
    finally:
        m.close()
    shutil.rmtree(tmp_path / "meta")  # from the journal alone
    m = make_master(tmp_path)
    try:
        got = m.get_blocks(m.lookup(d.ino, b"k.data").ino)
        assert got.inode.size == 2 * MiB and got.inode.state == common_pb2.COMPLETE
        assert [(b.block_id, b.length) for b in got.blocks] == \
            [(b.block_id, b.length) for b in want.blocks]
    finally:
        m.close()


def test_unclaimed_put_blocks_are_freed_after_the_put_ttl(master, monkeypatch):
    wid = add_worker(master)
    blocks, _ = put_blocks(master, ROOT_INO, b"k", [MiB])
    master.capacity._free_abandoned_blocks()
    assert blocks[0].block_id in master.pending  # a put in progress is left alone
    monkeypatch.setattr(pending, "PUT_BLOCK_TTL", -1.0)
    master.capacity._free_abandoned_blocks()
    assert blocks[0].block_id not in master.pending
    deletes = master.heartbeat(master_pb2.HeartbeatRequest(worker_id=wid, capacity=1 << 40)
                               ).delete_block_ids
    assert list(deletes) == [blocks[0].block_id]


def test_a_freed_put_block_is_refused_once_the_master_has_run_a_while(master, monkeypatch):
    add_worker(master)
    blocks, _ = put_blocks(master, ROOT_INO, b"k", [MiB])
    master.pending.free([blocks[0].block_id])  # as the TTL does
    master.started = time.monotonic() - pending.PUT_BLOCK_TTL - 1
    assert kind_of(put, master, ROOT_INO, b"k", blocks) == ErrorKind.INVALID
    assert master.lookup_or_none(ROOT_INO, b"k") is None


def test_lookup_many_answers_every_name_in_one_call(master):
    wid = add_worker(master)
    d = mkdir(master, ROOT_INO, b"l2cache")
    for i in range(3):
        blocks, _ = put_blocks(master, d.ino, b"k%d.data" % i, [MiB])
        put(master, d.ino, b"k%d.data" % i, blocks)
    writing = create(master, d.ino, b"w.tmp")
    names = [b"k0.data", b"nope", b"k2.data", b"w.tmp", b"k1.data"]
    reply = master.lookup_many(master_pb2.LookupManyRequest(parent=d.ino, names=names,
                                                            with_blocks=True))
    assert [r.HasField("inode") for r in reply.results] == [True, False, True, True, True]
    assert reply.results[3].inode.ino == writing.ino and not reply.results[3].blocks
    for r in (reply.results[0], reply.results[2], reply.results[4]):
        (b,) = r.blocks
        assert b.length == MiB and block_tokens.allows(master.block_key, b.block_id, b.token,
                                                       block_tokens.READ)
    assert [w.worker_id for w in reply.workers] == [wid]
    bare = master.lookup_many(master_pb2.LookupManyRequest(parent=d.ino, names=names))
    assert not any(r.blocks for r in bare.results) and not bare.workers
    # bad input names its field
    with pytest.raises(CurvineError) as e:
        master.lookup_many(master_pb2.LookupManyRequest(parent=d.ino, names=[b"ok", b""]))
    assert e.value.kind == ErrorKind.INVALID and "names[1]" in str(e.value)
    with pytest.raises(CurvineError) as e:
        master.lookup_many(master_pb2.LookupManyRequest(parent=d.ino, names=[b"a"] * 4097))
    assert e.value.kind == ErrorKind.INVALID and "names" in str(e.value)
    assert kind_of(master.lookup_many, master_pb2.LookupManyRequest(
        parent=10**9, names=[b"a"])) == ErrorKind.NOT_FOUND
