"""Block tokens (common/block_tokens.py): a worker serves a block id only with the
master's grant for it.

In-process master: AddBlock hands out a write token and GetBlocks read tokens that
verify with the master's key; tokens a client sends back with CompleteFile are
stored nowhere (neither LMDB nor journal holds their bytes); the key survives a
restart, and a damaged key file stops the master with a message naming it.

Real cluster (master + worker processes, cluster token on): every block method of the
worker refuses a call without a token, with another block's token, with a read token
where writing is asked, and with a token signed by another key: PERMISSION_DENIED
naming the field, counted in ``curvine_block_token_refused_total``, no data changed.
The same calls with the master's tokens work.
"""

from __future__ import annotations

import os
import signal
import stat
import zlib

import grpc
import pytest

from curvine.common import block_tokens as bt
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO, new_request_id
from curvine.common.rpc import make_channel
from curvine.proto import common_pb2, master_pb2, master_pb2_grpc, worker_pb2, worker_pb2_grpc
from curvine.worker.blockstore import BlockStore
from curvine.worker.service import WorkerServicer

from cluster_util import metric_samples
from test_master import add_worker, create, make_master

DEADLINE = 10.0


# ------------------------------------------------------------------ the token itself
def test_tokens_grant_exactly_what_they_say():
    key, other_key = b"a" * 32, b"b" * 32
    w, r = bt.mint(key, 42, bt.WRITE), bt.mint(key, 42, bt.READ)
    assert len(w) == len(r) == bt.TOKEN_BYTES and w != r
    assert bt.allows(key, 42, w, bt.WRITE) and bt.allows(key, 42, w, bt.READ)
    assert bt.allows(key, 42, r, bt.READ) and not bt.allows(key, 42, r, bt.WRITE)
    assert not bt.allows(key, 43, w, bt.READ)  # another block
    assert not bt.allows(other_key, 42, w, bt.READ)  # another cluster's key
    # the access byte is covered by the MAC: a read token relabelled as write fails
    assert not bt.allows(key, 42, bt.WRITE + r[1:], bt.WRITE)
    for junk in (b"", w[:-1], w + b"\0", b"w" + b"\0" * bt.MAC_BYTES, b"x" + w[1:],
                 bytes(bt.TOKEN_BYTES)):
        assert not bt.allows(key, 42, junk, bt.READ), junk
    assert not bt.allows(key, -1, w, bt.READ) and not bt.allows(key, 1 << 64, w, bt.READ)
    with pytest.raises(ValueError):
        bt.mint(key, 42, b"x")


def test_a_write_token_writes_only_on_the_workers_it_names():
    """AddBlock's write token names the workers the master placed the block on: any
    other worker refuses to write with it (no stray copy); reading and the master's own
    check take it anywhere.  The master's unbound write tokens (its deletes) write
    nowhere."""
    key = b"a" * 32
    bound = bt.mint(key, 42, bt.WRITE, [7, 3])
    assert bound[:1] == bt.BOUND and bound == bt.mint(key, 42, bt.WRITE, [3, 7, 3])
    assert bt.allows(key, 42, bound, bt.WRITE, 3) and bt.allows(key, 42, bound, bt.WRITE, 7)
    assert not bt.allows(key, 42, bound, bt.WRITE, 5)  # a worker it does not name
    assert bt.allows(key, 42, bound, bt.WRITE)  # the master checking a PutFile's token
    assert bt.allows(key, 42, bound, bt.READ, 5)  # the writer reads its block anywhere
    assert not bt.allows(key, 43, bound, bt.WRITE, 3)
    # the named ids are under the MAC: naming another worker breaks it
    forged = bound[:2] + (5).to_bytes(4, "big") + bound[6:]
    assert not bt.allows(key, 42, forged, bt.WRITE, 5)
    unbound = bt.mint(key, 42, bt.WRITE)
    assert not bt.allows(key, 42, unbound, bt.WRITE, 3)
    assert bt.allows(key, 42, unbound, bt.WRITE) and bt.allows(key, 42, unbound, bt.READ, 3)
    for junk in (bound[:-1], bound + b"\0", bt.BOUND + bytes(3), bt.BOUND):
        assert not bt.allows(key, 42, junk, bt.READ), junk


def test_a_worker_not_yet_registered_serves_no_block(tmp_path):
    servicer = WorkerServicer(BlockStore([str(tmp_path)], capacity=1 << 30))
    with pytest.raises(CurvineError) as e:
        type(servicer).GetBlockInfo.__wrapped__(
            servicer, worker_pb2.GetBlockInfoRequest(block_id=5, token=b"r" * 17), None)
    assert e.value.kind == ErrorKind.UNAVAILABLE and "registered" in e.value.message


# ------------------------------------------------------------------ master side
def _files_under(*roots):
    for root in roots:
        for d, _dirs, files in os.walk(root):
            for f in files:
                yield os.path.join(d, f)


def test_master_hands_out_tokens_and_never_stores_them(tmp_path):
    m = make_master(tmp_path)
    try:
        add_worker(m)
        f = create(m, ROOT_INO, b"f")
        reply = m.add_block(master_pb2.AddBlockRequest(ino=f.ino, client_host_id="h1",
                                                       size_hint=10))
        key = m.block_key
        assert bt.allows(key, reply.block_id, reply.block_token, bt.WRITE)
        # The client sends the block back with its token (as a writer that reuses blocks
        # of a version it read does): published, but the token is not kept.
        block = common_pb2.Block(block_id=reply.block_id, length=10, checksum=1,
                                 worker_ids=[w.worker_id for w in reply.workers],
                                 token=reply.block_token)
        m.complete(master_pb2.CompleteFileRequest(request_id=new_request_id(), ino=f.ino,
                                                  blocks=[block], size=10))
        with m.store.read() as txn:
            stored = m.store.get_blocks(txn, f.ino)
        assert [b.block_id for b in stored] == [reply.block_id] and stored[0].token == b""
        got = m.get_blocks(f.ino)
        read_token = got.blocks[0].token
        assert bt.allows(key, reply.block_id, read_token, bt.READ)
        assert not bt.allows(key, reply.block_id, read_token, bt.WRITE)
        meta, journal = m.meta_dir, m.journal_dir
        key_path = os.path.join(meta, bt.BLOCK_KEY_FILE)
    finally:
        m.close()
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
    for path in _files_under(meta, journal):
        with open(path, "rb") as fh:
            data = fh.read()
        for token in (reply.block_token, read_token):
            assert token not in data, f"a block token was stored in {path}"

    # The key survives a restart: tokens handed out before it still verify.  A key
    # left readable by others (a careless restore) is made 0600 again.
    os.chmod(key_path, 0o644)
    m = make_master(tmp_path)
    try:
        assert m.block_key == key
        assert m.get_blocks(f.ino).blocks[0].token == read_token
    finally:
        m.close()
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600

    # A damaged key file stops the master with a message naming it (not a new key
    # that would void every token in silence).
    with open(key_path, "wb") as fh:
        fh.write(b"short")
    with pytest.raises(CurvineError) as e:
        make_master(tmp_path)
    assert bt.BLOCK_KEY_FILE in e.value.message and "5 bytes" in e.value.message


# ------------------------------------------------------------------ real cluster
def refused_count(http_port: int) -> float:
    return sum(s.value for s in metric_samples(http_port, "curvine_block_token_refused_total"))


def _create_and_allocate(master):
    """Create /kv.data and allocate its first block: (inode, AddBlockReply with the
    block's write token)."""
    node = master.Create(master_pb2.CreateRequest(
        request_id=new_request_id(), parent=ROOT_INO, name=b"kv.data", mode=0o644),
        timeout=DEADLINE).inode
    alloc = master.AddBlock(master_pb2.AddBlockRequest(ino=node.ino, size_hint=3),
                            timeout=DEADLINE)
    return node, alloc


def test_a_worker_the_master_did_not_choose_refuses_the_write(make_cluster):
    """Two workers, one replica: the token of a block placed on one worker does not
    write it on the other (before, that worker took it, and the stray copy stayed on
    its disk after the file was unlinked)."""
    c = make_cluster(workers=2, mounts=0)
    with make_channel(c.master_addr, c.security) as mch:
        master = master_pb2_grpc.MasterStub(mch)
        _node, alloc = _create_and_allocate(master)
    [chosen] = alloc.workers
    other = next(r for r in c.status() if r["role"] == "worker"
                 and r["address"] != chosen.address)
    data = b"stray"
    req = lambda: iter([worker_pb2.WriteBlockRequest(  # noqa: E731
        header=worker_pb2.WriteBlockHeader(block_id=alloc.block_id, token=alloc.block_token),
        data=data, finish=True, checksum=zlib.crc32(data))])
    with make_channel(other["address"], c.security) as wch:
        _denied(lambda: worker_pb2_grpc.WorkerStub(wch).WriteBlock(req(), timeout=DEADLINE),
                "header.token")
    with make_channel(chosen.address, c.security) as wch:
        reply = worker_pb2_grpc.WorkerStub(wch).WriteBlock(req(), timeout=DEADLINE)
        assert reply.length == len(data)


def _denied(fn, field: str):
    with pytest.raises(grpc.RpcError) as e:
        fn()
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, (e.value.code(),
                                                                 e.value.details())
    assert e.value.details().startswith(f"{field}:"), e.value.details()


def test_worker_serves_only_blocks_the_master_handed_out(make_cluster):
    c = make_cluster(workers=1, mounts=0)
    worker = c._proc("worker", 0)
    data_dir = os.path.join(c.base, "worker", "0", "data")
    with make_channel(c.master_addr, c.security) as mch, \
            make_channel(worker.address, c.security) as wch:
        master = master_pb2_grpc.MasterStub(mch)
        stub = worker_pb2_grpc.WorkerStub(wch)
        node, alloc = _create_and_allocate(master)
        bid, wtoken = alloc.block_id, alloc.block_token
        other = master.AddBlock(master_pb2.AddBlockRequest(ino=node.ino, size_hint=3),
                                timeout=DEADLINE)
        foreign = bt.mint(b"\x07" * 32, bid, bt.WRITE)  # another cluster's key

        def write(block_id, token, data=b"abc"):
            return stub.WriteBlock(iter([worker_pb2.WriteBlockRequest(
                header=worker_pb2.WriteBlockHeader(block_id=block_id, token=token),
                data=data, finish=True, checksum=zlib.crc32(data))]), timeout=DEADLINE)

        before = refused_count(worker.http_port)
        bad_write_tokens = [b"", other.block_token, foreign, wtoken[:-1]]
        for t in bad_write_tokens:
            _denied(lambda: write(bid, t), "header.token")
        assert not any(files for _d, _s, files in os.walk(os.path.join(data_dir, "blocks")))
        assert write(bid, wtoken).length == 3

        master.CompleteFile(master_pb2.CompleteFileRequest(
            request_id=new_request_id(), ino=node.ino, size=3,
            blocks=[common_pb2.Block(block_id=bid, length=3, checksum=zlib.crc32(b"abc"),
                                     worker_ids=[alloc.workers[0].worker_id])],
            abandoned_block_ids=[other.block_id]), timeout=DEADLINE)
        rtoken = master.GetBlocks(master_pb2.GetBlocksRequest(ino=node.ino),
                                  timeout=DEADLINE).blocks[0].token
        assert rtoken and rtoken != wtoken

        def read(token):
            return b"".join(r.data for r in stub.ReadBlock(
                worker_pb2.ReadBlockRequest(block_id=bid, token=token), timeout=DEADLINE))

        bad_read_tokens = [b"", other.block_token, foreign, bt.WRITE + rtoken[1:]]
        for t in bad_read_tokens:
            _denied(lambda: read(t), "token")
            _denied(lambda: stub.GetBlockInfo(worker_pb2.GetBlockInfoRequest(
                block_id=bid, token=t), timeout=DEADLINE), "token")
        assert read(rtoken) == b"abc" and read(wtoken) == b"abc"
        assert stub.GetBlockInfo(worker_pb2.GetBlockInfoRequest(block_id=bid, token=rtoken),
                                 timeout=DEADLINE).length == 3

        # A read token does not allow writing, adopting or deleting.
        _denied(lambda: write(bid + 1000, rtoken), "header.token")
        _denied(lambda: stub.AdoptBlock(worker_pb2.AdoptBlockRequest(
            block_id=bid, path=os.path.join(data_dir, "staging", "x"), length=0,
            token=rtoken), timeout=DEADLINE), "token")
        _denied(lambda: stub.DeleteBlocks(worker_pb2.DeleteBlocksRequest(
            block_ids=[bid], tokens=[rtoken]), timeout=DEADLINE), "tokens[0]")
        with pytest.raises(grpc.RpcError) as e:  # one token per id
            stub.DeleteBlocks(worker_pb2.DeleteBlocksRequest(block_ids=[bid]), timeout=DEADLINE)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert read(rtoken) == b"abc"  # still there after all of it

        refused = refused_count(worker.http_port) - before
        expected = len(bad_write_tokens) + 2 * len(bad_read_tokens) + 3
        assert refused == expected, (refused, expected)
        print(f"{expected} calls without a valid block token refused and counted")

        stub.DeleteBlocks(worker_pb2.DeleteBlocksRequest(block_ids=[bid], tokens=[wtoken]),
                          timeout=DEADLINE)
        with pytest.raises(grpc.RpcError) as e:
            read(rtoken)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master is stopped on purpose
def test_a_restarted_worker_serves_before_the_master_is_back(make_cluster):
    """The worker keeps its key in its data dir: SIGKILLed and started again while
    the master is down, it serves the blocks it holds to the tokens clients already
    have (as it did before block tokens existed), not UNAVAILABLE until the master
    returns."""
    c = make_cluster(workers=1, mounts=0)
    worker = c._proc("worker", 0)
    data_dir = os.path.join(c.base, "worker", "0", "data")
    key_file = os.path.join(data_dir, bt.BLOCK_KEY_FILE)
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    with open(os.path.join(c.base, "master", "meta", bt.BLOCK_KEY_FILE), "rb") as f:
        assert open(key_file, "rb").read() == f.read()
    with make_channel(c.master_addr, c.security) as mch:
        master = master_pb2_grpc.MasterStub(mch)
        _node, alloc = _create_and_allocate(master)
    c.kill("master", 0, signal.SIGTERM)
    c.kill("worker", 0)
    c.start("worker", 0, wait_ready=False)  # ready = registered: not while the master is down
    with make_channel(worker.address, c.security) as wch:
        stub = worker_pb2_grpc.WorkerStub(wch)
        header = worker_pb2.WriteBlockHeader(block_id=alloc.block_id, token=alloc.block_token)
        reply = stub.WriteBlock(iter([worker_pb2.WriteBlockRequest(
            header=header, data=b"abc", finish=True, checksum=zlib.crc32(b"abc"))]),
            timeout=DEADLINE, wait_for_ready=True)
        assert reply.length == 3
        got = b"".join(r.data for r in stub.ReadBlock(worker_pb2.ReadBlockRequest(
            block_id=alloc.block_id, token=alloc.block_token), timeout=DEADLINE))
        assert got == b"abc"
        _denied(lambda: stub.GetBlockInfo(worker_pb2.GetBlockInfoRequest(
            block_id=alloc.block_id), timeout=DEADLINE), "token")
    c.start("master", 0)
