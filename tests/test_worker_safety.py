"""A hostile client against a real worker process over gRPC: path traversal through
AdoptBlock, out-of-range block ids sent as raw protobuf, oversized messages.

Every attempt must be refused with a status naming the field, nothing outside the
worker's data dir may be read, created or moved, and the worker must stay up (the
cluster fixture also fails the test if a daemon logged a traceback).

The attempts carry valid block tokens (signed with the master's key, read from its
meta dir as only an insider could): the checks behind the token must hold on their
own.  tests/test_block_tokens.py covers calls without them.
"""

from __future__ import annotations

import os
import zlib

import grpc
import pytest

from curvine.common import block_tokens
from curvine.common.errors import ERROR_KIND_KEY
from curvine.common.rpc import MESSAGE_LIMIT, make_channel
from curvine.proto import master_pb2, master_pb2_grpc, worker_pb2, worker_pb2_grpc

DEADLINE = 10.0
BAD_BLOCK_IDS = [0, 1 << 63, (1 << 64) - 1]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _uint64_field(number: int, value: int) -> bytes:
    """A varint field as the wire carries it; ``value`` -1 is what an int64 -1 encodes to."""
    return _varint(number << 3) + _varint(value & ((1 << 64) - 1))


@pytest.fixture
def worker(make_cluster, tmp_path):
    c = make_cluster(workers=1, mounts=0)
    data_dir = os.path.join(c.base, "worker", "0", "data")
    channel = make_channel(c._proc("worker", 0).address, c.security)
    yield c, data_dir, channel
    channel.close()


def _key(c) -> bytes:
    with open(os.path.join(c.base, "master", "meta", block_tokens.BLOCK_KEY_FILE), "rb") as f:
        return f.read()


def _w(c, block_id: int) -> bytes:
    """A valid write token for the cluster's worker (the master would hand it out with
    AddBlock, naming the worker it placed the block on)."""
    from curvine.worker.server import load_worker_id
    wid = load_worker_id(os.path.join(c.base, "worker", "0", "data"))
    return block_tokens.mint(_key(c), block_id & ((1 << 64) - 1), block_tokens.WRITE, [wid])


def _raw_unary(channel, method: str, payload: bytes):
    call = channel.unary_unary(f"/curvine.Worker/{method}",
                               request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
    return call(payload, timeout=DEADLINE)


def _refused(fn, codes, field: str | None) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    err = e.value
    assert err.code() in codes, (err.code(), err.details())
    if field is not None:
        assert err.details().startswith(f"{field}:"), err.details()
    return err


def _tree(root: str) -> dict[str, int]:
    """Every file under ``root`` with its size: what the worker may have touched."""
    found = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            found[p] = os.lstat(p).st_size
    return found


def _assert_alive(c, stub):
    assert c._proc("worker", 0).alive()
    with pytest.raises(grpc.RpcError) as e:  # a well-formed call still answers
        stub.GetBlockInfo(worker_pb2.GetBlockInfoRequest(block_id=12345, token=_w(c, 12345)),
                          timeout=DEADLINE)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_adopt_block_path_traversal_is_refused(worker, tmp_path):
    c, data_dir, channel = worker
    stub = worker_pb2_grpc.WorkerStub(channel)
    staging = os.path.join(data_dir, "staging")
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret"
    secret.write_bytes(b"another tenant's KV cache")
    block_id = 0x1234
    name = f"{block_id:016x}.c{'ab' * 8}.tmp"
    # A symlink and a hard link in the staging area with a valid client staging name,
    # both pointing at the file outside.
    os.symlink(str(secret), os.path.join(staging, name))
    hard_name = f"{block_id:016x}.c{'cd' * 8}.tmp"
    hard_ok = True
    try:
        os.link(str(secret), os.path.join(staging, hard_name))
    except OSError:  # tmp_path and the data dir on different file systems
        hard_ok = False
    before_outside = _tree(str(outside))
    size = len(b"another tenant's KV cache")
    attempts = [
        "../../etc/passwd",
        "/etc/passwd",
        f"{staging}/../../../../etc/passwd",
        f"{staging}/../../{name}",  # a valid name, the wrong directory
        str(secret),
        f"{outside}/{name}",
        f"{staging}/sub/{name}",
        os.path.join(staging, f"{block_id:016x}.tmp"),  # the worker's own staging name
        os.path.join(staging, f"{block_id + 1:016x}.c{'ab' * 8}.tmp"),  # another block
        "",
        os.path.join(staging, name),  # the symlink
    ]
    if hard_ok:
        attempts.append(os.path.join(staging, hard_name))  # two links
    for path in attempts:
        _refused(lambda: stub.AdoptBlock(
            worker_pb2.AdoptBlockRequest(block_id=block_id, path=path, length=size,
                                         token=_w(c, block_id)),
            timeout=DEADLINE), {grpc.StatusCode.INVALID_ARGUMENT}, "path")
    # Nothing outside was touched, no block was made of it.
    assert _tree(str(outside)) == before_outside
    assert secret.read_bytes() == b"another tenant's KV cache"
    assert not os.path.exists(os.path.join(data_dir, "blocks", f"{block_id % 256:02x}",
                                           f"{block_id:016x}.blk"))
    _refused(lambda: stub.ReadBlock(worker_pb2.ReadBlockRequest(block_id=block_id,
                                                                token=_w(c, block_id)),
                                    timeout=DEADLINE).__next__(),
             {grpc.StatusCode.NOT_FOUND}, None)
    # a missing staging file of the right shape is NOT_FOUND, not a crash
    _refused(lambda: stub.AdoptBlock(worker_pb2.AdoptBlockRequest(
        block_id=block_id, path=os.path.join(staging, f"{block_id:016x}.c{'ef' * 8}.tmp"),
        length=0, token=_w(c, block_id)), timeout=DEADLINE), {grpc.StatusCode.NOT_FOUND}, None)
    _assert_alive(c, stub)


def test_bad_block_ids_are_refused_on_every_method(worker):
    c, data_dir, channel = worker
    stub = worker_pb2_grpc.WorkerStub(channel)
    before = _tree(data_dir)
    for bad in BAD_BLOCK_IDS:
        t = _w(c, bad)
        _refused(lambda: stub.GetBlockInfo(worker_pb2.GetBlockInfoRequest(block_id=bad,
                                                                          token=t),
                                           timeout=DEADLINE),
                 {grpc.StatusCode.INVALID_ARGUMENT}, "block_id")
        _refused(lambda: next(stub.ReadBlock(worker_pb2.ReadBlockRequest(block_id=bad, token=t),
                                             timeout=DEADLINE)),
                 {grpc.StatusCode.INVALID_ARGUMENT}, "block_id")
        _refused(lambda: stub.DeleteBlocks(worker_pb2.DeleteBlocksRequest(
            block_ids=[5, bad], tokens=[_w(c, 5), t]), timeout=DEADLINE),
                 {grpc.StatusCode.INVALID_ARGUMENT}, "block_ids[1]")
        _refused(lambda: stub.AdoptBlock(worker_pb2.AdoptBlockRequest(
            block_id=bad, path=os.path.join(data_dir, "staging", "x"), length=0, token=t),
            timeout=DEADLINE), {grpc.StatusCode.INVALID_ARGUMENT}, "block_id")
        header = worker_pb2.WriteBlockHeader(block_id=bad, token=t)
        _refused(lambda: stub.WriteBlock(iter([worker_pb2.WriteBlockRequest(
            header=header, data=b"x", finish=True)]), timeout=DEADLINE),
            {grpc.StatusCode.INVALID_ARGUMENT}, "header.block_id")
    # -1 as an int64 encodes to the same ten-byte varint; send it by hand
    raw = _uint64_field(1, -1)
    for method in ("GetBlockInfo",):
        err = _refused(lambda: _raw_unary(channel, method, raw),
                       {grpc.StatusCode.INVALID_ARGUMENT}, "block_id")
        assert ERROR_KIND_KEY in dict(err.trailing_metadata() or ())
    # offsets and lengths past the end of a real block
    stub.WriteBlock(iter([worker_pb2.WriteBlockRequest(
        header=worker_pb2.WriteBlockHeader(block_id=77, token=_w(c, 77)), data=b"abc",
        finish=True,
        checksum=zlib.crc32(b"abc"))]),
        timeout=DEADLINE)
    for off, length, field in [((1 << 64) - 1, 0, "offset"), (0, (1 << 64) - 1, "length"),
                               (4, 0, "offset"), (1, 3, "length")]:
        _refused(lambda: next(stub.ReadBlock(worker_pb2.ReadBlockRequest(
            block_id=77, offset=off, length=length, token=_w(c, 77)), timeout=DEADLINE)),
            {grpc.StatusCode.INVALID_ARGUMENT}, field)
    after = _tree(data_dir)
    new = set(after) - set(before)
    assert new == {os.path.join(data_dir, "blocks", "4d", f"{77:016x}.blk")}, new
    _assert_alive(c, stub)


def test_malformed_and_oversized_messages_are_refused(worker):
    c, data_dir, channel = worker
    stub = worker_pb2_grpc.WorkerStub(channel)
    # bytes that are not a protobuf message, and a string field with invalid UTF-8
    for payload in (b"\xff\xff\xff", b"\x12\x02\xc3\x28"):
        _refused(lambda: _raw_unary(channel, "AdoptBlock", payload),
                 {grpc.StatusCode.INVALID_ARGUMENT}, "request")
    # the same inside a client stream (WriteBlock), after a valid first message
    first = worker_pb2.WriteBlockRequest(
        header=worker_pb2.WriteBlockHeader(block_id=98, token=_w(c, 98)),
        data=b"x").SerializeToString()
    write = channel.stream_unary("/curvine.Worker/WriteBlock",
                                 request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)
    _refused(lambda: write(iter([first, b"\xff\xff\xff"]), timeout=DEADLINE),
             {grpc.StatusCode.INVALID_ARGUMENT}, "request")
    # A message larger than the server accepts is refused by the transport before
    # it reaches a handler: RESOURCE_EXHAUSTED, and the worker stays up.
    # (a channel without a send limit, so the server's limit is what refuses it)
    big = _varint((2 << 3) | 2) + _varint(MESSAGE_LIMIT + 1) + b"\0" * (MESSAGE_LIMIT + 1)
    with grpc.insecure_channel(c._proc("worker", 0).address,
                               options=[("grpc.max_send_message_length", -1)]) as unlimited:
        err = _refused(lambda: _raw_unary(unlimited, "AdoptBlock", big),
                       {grpc.StatusCode.RESOURCE_EXHAUSTED}, None)
    del big
    print(f"oversized message: {err.code().name}: {err.details()}")
    # one WriteBlock message above the 1 MiB data unit is refused by the handler
    _refused(lambda: stub.WriteBlock(iter([worker_pb2.WriteBlockRequest(
        header=worker_pb2.WriteBlockHeader(block_id=99, token=_w(c, 99)), data=b"\0" * (2 << 20),
        finish=True)]), timeout=DEADLINE), {grpc.StatusCode.INVALID_ARGUMENT}, "data")
    assert not os.path.exists(os.path.join(data_dir, "blocks", "63", f"{99:016x}.blk"))
    _assert_alive(c, stub)
    # the master refuses unparsable requests the same way (unary and in a Calls stream)
    with make_channel(c.master_addr, c.security) as master:
        for method in ("Create", "GetAttr", "RegisterWorker"):
            call = master.unary_unary(f"/curvine.Master/{method}",
                                      request_serializer=lambda b: b,
                                      response_deserializer=lambda b: b)
            _refused(lambda: call(b"\x12\x02\xc3", timeout=DEADLINE),
                     {grpc.StatusCode.INVALID_ARGUMENT}, "request")
        calls = master.stream_stream("/curvine.Master/Calls",
                                     request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)
        replies = list(calls(iter([b"\xff\xff\xff"]), timeout=DEADLINE))
        assert replies == []  # the stream just ends
        stub = master_pb2_grpc.MasterStub(master)
        assert stub.StatFs(master_pb2.StatFsRequest(), timeout=DEADLINE) is not None


def test_adopt_refuses_a_staging_file_swapped_after_its_checks(tmp_path, monkeypatch):
    """A client on the worker's host owns the staging area and could swap its file for
    a symlink to a secret between the worker's checks and its rename.  That window
    cannot be hit on purpose from outside, so the swap is made inside os.replace."""
    from curvine.common.errors import CurvineError, ErrorKind
    from curvine.worker import blockstore as bs

    store = bs.BlockStore([str(tmp_path / "data")], capacity=1 << 30)
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 10)
    staging = os.path.join(store.data_dirs[0], "staging", f"{7:016x}.c{'ab' * 8}.tmp")
    with open(staging, "wb") as f:
        f.write(b"y" * 10)
    real_replace = os.replace

    def swap_then_replace(src, dst):
        os.unlink(src)
        os.symlink(str(secret), src)
        real_replace(src, dst)

    monkeypatch.setattr(bs.os, "replace", swap_then_replace)
    with pytest.raises(CurvineError) as e:
        store.adopt(7, staging, 10, 0)
    monkeypatch.undo()
    assert e.value.kind == ErrorKind.INVALID and e.value.message.startswith("path:")
    assert 7 not in store and store.used == 0
    assert not os.path.lexists(bs.block_path(store.data_dirs[0], 7))
    assert secret.read_bytes() == b"x" * 10
    with pytest.raises(CurvineError) as e:
        store.read(7)
    assert e.value.kind == ErrorKind.NOT_FOUND
