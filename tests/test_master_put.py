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
from curvine.master.master import WouldBlock
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


# -- AddBlocksForPut and PutFiles (issue 36): a prompt's chunks in two calls ------------

STORED, EXISTS, INVALID, MISSING = (master_pb2.PUT_STORED, master_pb2.PUT_EXISTS,
                                    master_pb2.PUT_INVALID, master_pb2.PUT_BLOCKS_MISSING)


def reserve(m, parent, names, sizes):
    return m.add_blocks_for_put(master_pb2.AddBlocksForPutRequest(
        parent=parent, names=names, sizes=sizes, client_host_id="h1"))


def entries(reply, names, sizes):
    """PutFileEntry per reserved name: its granted blocks, as a writer sends them back."""
    out = []
    for name, size, r in zip(names, sizes, reply.results):
        out.append(master_pb2.PutFileEntry(name=name, mode=0o644, size=size, blocks=[
            common_pb2.Block(block_id=g.block_id, length=g.length, checksum=7,
                             worker_ids=g.worker_ids, token=g.block_token)
            for g in r.blocks]))
    return out


def put_files(m, parent, files, rid=None, abandoned=()):
    return [(r.status, r.inode.ino, r.error) for r in m.put_files(master_pb2.PutFilesRequest(
        request_id=rid or new_request_id(), parent=parent, files=files,
        abandoned=list(abandoned))).results]


def test_put_files_stores_each_file_whole_or_not_at_all_in_one_record(master):
    wid = add_worker(master)
    d = mkdir(master, ROOT_INO, b"l2cache")
    old = put(master, d.ino, b"old", put_blocks(master, d.ino, b"old", [MiB])[0]).inode
    names, sizes = [b"a", b"old", b"b", b"c", b"d", b"e"], [5 * MiB, MiB, 0, MiB, MiB, MiB]
    r = reserve(master, d.ino, names, sizes)
    assert [x.HasField("existing") for x in r.results] == [False, True] + [False] * 4
    assert r.results[1].existing.ino == old.ino and not r.results[1].blocks
    # 5 MiB in 4 MiB blocks: two grants; an empty file none
    assert [[g.length for g in x.blocks] for x in r.results] == \
        [[4 * MiB, MiB], [], [], [MiB], [MiB], [MiB]]
    assert [w.worker_id for w in r.workers] == [wid]
    for g in r.results[0].blocks:  # pending for a put, tokens bound to their workers
        assert g.block_id in master.pending
        assert block_tokens.allows(master.block_key, g.block_id, g.block_token,
                                   block_tokens.WRITE)
    files = entries(r, names, sizes)
    files[3].blocks[0].token = b"x" * 16  # c: a block without its grant
    files[4].mode = 0o10000  # d: a bad entry
    files.append(master_pb2.PutFileEntry(name=b"a", mode=0o644))  # twice in one call
    files.append(master_pb2.PutFileEntry(name=b"x/y", mode=0o644))
    records = master.committer.stats["records"]
    got = put_files(master, d.ino, files)
    assert master.committer.stats["records"] - records == 1  # one journal record
    assert [s for s, _, _ in got] == [STORED, EXISTS, STORED, MISSING, INVALID, STORED,
                                      EXISTS, INVALID]
    assert got[1][1] == old.ino and "mode" in got[4][2] and "name" in got[7][2]
    assert master.lookup(d.ino, b"a").size == 5 * MiB and got[0][1] == master.lookup(
        d.ino, b"a").ino
    assert master.lookup(d.ino, b"b").size == 0 and master.lookup(d.ino, b"e").size == MiB
    for name in (b"c", b"d"):
        assert master.lookup_or_none(d.ino, name) is None
    # stored blocks are no longer pending; those of files left out are freed at once,
    # but for a block sent without its token (c's: left to the put TTL)
    [c_block] = r.results[3].blocks
    assert [g.block_id for x in r.results for g in x.blocks
            if g.block_id in master.pending] == [c_block.block_id]
    deletes = master.heartbeat(master_pb2.HeartbeatRequest(worker_id=wid, capacity=1 << 40)
                               ).delete_block_ids
    assert sorted(deletes) == [g.block_id for g in r.results[4].blocks]


def test_put_files_is_retried_and_replayed_after_a_restart(tmp_path):
    m = make_master(tmp_path)
    try:
        add_worker(m)
        d = mkdir(m, ROOT_INO, b"l2cache")
        names, sizes = [b"k%d" % i for i in range(8)], [MiB + i for i in range(8)]
        files = entries(reserve(m, d.ino, names, sizes), names, sizes)
        rid = new_request_id()
        # (a copy: the master clears the tokens of the request it is given)
        first = put_files(m, d.ino, [master_pb2.PutFileEntry.FromString(
            f.SerializeToString()) for f in files], rid=rid)
        assert [s for s, _, _ in first] == [STORED] * 8
        # a retry after a lost reply: every file reported stored, as the first time
        assert put_files(m, d.ino, files, rid=rid) == first
        want = {n: m.get_blocks(m.lookup(d.ino, n).ino) for n in names}
    finally:
        m.close()
    shutil.rmtree(tmp_path / "meta")  # from the journal alone
    m = make_master(tmp_path)
    try:
        for n in names:
            got = m.get_blocks(m.lookup(d.ino, n).ino)
            assert got.inode == want[n].inode
            assert [(b.block_id, b.length) for b in got.blocks] == \
                [(b.block_id, b.length) for b in want[n].blocks]
        # the retry cache came back with the journal
        assert put_files(m, d.ino, files, rid=rid) == first
    finally:
        m.close()


def test_abandoned_blocks_are_freed_at_once_and_only_a_puts_with_its_token(master):
    wid = add_worker(master)
    d = mkdir(master, ROOT_INO, b"l2cache")
    r = reserve(master, d.ino, [b"a", b"b"], [MiB, MiB])
    f = create(master, ROOT_INO, b"being-written")
    theirs = master.add_block(master_pb2.AddBlockRequest(ino=f.ino, client_host_id="h1"))
    [a], [b] = r.results[0].blocks, r.results[1].blocks
    abandoned = [common_pb2.Block(block_id=a.block_id, token=a.block_token),
                 common_pb2.Block(block_id=b.block_id),  # no token: not freed
                 common_pb2.Block(block_id=theirs.block_id, token=theirs.block_token)]
    assert put_files(master, d.ino, [], abandoned=abandoned) == []
    assert a.block_id not in master.pending
    assert b.block_id in master.pending and theirs.block_id in master.pending
    deletes = master.heartbeat(master_pb2.HeartbeatRequest(worker_id=wid, capacity=1 << 40)
                               ).delete_block_ids
    assert list(deletes) == [a.block_id]


def test_add_blocks_for_put_checks_its_request(master):
    add_worker(master)
    d = mkdir(master, ROOT_INO, b"l2cache")
    assert kind_of(reserve, master, d.ino, [b"a", b"b"], [1]) == ErrorKind.INVALID
    assert kind_of(reserve, master, d.ino, [b"a/b"], [1]) == ErrorKind.INVALID
    assert kind_of(reserve, master, d.ino, [b"a"] * 4097, [0] * 4097) == ErrorKind.INVALID
    f = create(master, ROOT_INO, b"file")
    assert kind_of(reserve, master, f.ino, [b"a"], [1]) == ErrorKind.NOT_DIR
    # more blocks than one call grants (4 MiB blocks here)
    assert kind_of(reserve, master, d.ino, [b"big"], [16385 * 4 * MiB]) == ErrorKind.INVALID
    assert kind_of(reserve, master, d.ino, [b"huge"], [1 << 62]) == ErrorKind.FILE_TOO_BIG
    assert not master.pending.owners_and_overdue_puts()[0]  # nothing left pending
    # the call port's loop answers a prompt's reservation, not a big one (WouldBlock:
    # the pool runs it), and what it refuses leaves nothing pending
    def nowait(names, sizes):
        return master.add_blocks_for_put(master_pb2.AddBlocksForPutRequest(
            parent=d.ino, names=names, sizes=sizes, client_host_id="h1"), wait=False)
    reserve(master, d.ino, [b"first"], [1])  # (block ids reserved: a journal record)
    assert len(nowait([b"p%d" % i for i in range(8)], [MiB] * 8).results) == 8
    for names, sizes in (([b"n%d" % i for i in range(129)], [0] * 129),
                         ([b"one"], [129 * 4 * MiB])):
        with pytest.raises(WouldBlock):
            nowait(names, sizes)
    assert len(master.pending.of_owners({0})) == 9
