"""Worker: block store, block service through the block client, and the daemon.

Levels: BlockStore on real directories -> a real WorkerServicer on an in-process gRPC
server driven through curvine.client.blocks.block_client -> `curvine-worker` as a
subprocess against a real master served in-process (tests/inproc.py; ``Heard`` taps
what the worker tells it), including SIGTERM and SIGKILL-mid-write recovery.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from concurrent import futures

import grpc
import pytest

from curvine.client.blocks import block_client
from curvine.common.errors import CurvineError, ErrorKind, from_rpc_error
from curvine.common.ids import MIB, ROOT_INO, new_request_id
from curvine.common.rpc import bind, make_server
from curvine.common.security import NO_SECURITY
from curvine.master.master import Master
from curvine.proto import common_pb2, master_pb2, worker_pb2, worker_pb2_grpc
from curvine.common import wire
from curvine.common.blocks import MAX_BLOCK_ID, block_path, check_block_id
from curvine.worker.blockstore import BlockStore
from curvine.worker.server import worker_secret, worker_uuid
from curvine.worker.service import UNCHECKED, WorkerServicer, add_to_server

from inproc import InprocMaster, master_config, tap

VENV_BIN = os.path.dirname(sys.executable)


def _blk(block_id: int) -> str:
    return f"{block_id:016x}.blk"


def _kind(exc_info) -> ErrorKind:
    return exc_info.value.kind


def _write(store: BlockStore, block_id: int, data: bytes, chunk: int = MIB) -> tuple[int, int]:
    with store.begin_write(block_id, len(data)) as w:
        for i in range(0, len(data), chunk):
            w.append(data[i:i + chunk])
        return w.finish(zlib.crc32(data))


def _staging(d) -> list[str]:
    return os.listdir(os.path.join(d, "staging"))


def wait_until(pred, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


# -- BlockStore ----------------------------------------------------------------------------


def test_write_finalise_read(tmp_path):
    store = BlockStore([tmp_path])
    data = os.urandom(3 * MIB + 123)
    length, crc = _write(store, 0x1234, data, chunk=300_000)
    assert (length, crc) == (len(data), zlib.crc32(data))
    path = tmp_path / "blocks" / "34" / _blk(0x1234)
    assert path.read_bytes() == data
    assert store.info(0x1234) == (len(data), str(path))
    assert _staging(tmp_path) == []
    assert store.used == len(data) and len(store) == 1
    assert [b for b, _ in store.report()] == [0x1234]

    chunks = list(store.read(0x1234))
    assert all(len(c) <= MIB for c in chunks) and b"".join(chunks) == data
    assert b"".join(store.read(0x1234, MIB - 5, MIB + 10)) == data[MIB - 5:2 * MIB + 5]
    assert b"".join(store.read(0x1234, 10, 100, chunk=7)) == data[10:110]
    assert b"".join(store.read(0x1234, len(data))) == b""
    with pytest.raises(CurvineError) as e:
        store.read(0x1234, len(data) + 1)
    assert _kind(e) == ErrorKind.INVALID and "offset" in str(e.value)
    with pytest.raises(CurvineError) as e:
        store.read(0x1234, 10, len(data))
    assert _kind(e) == ErrorKind.INVALID and "length" in str(e.value)
    with pytest.raises(CurvineError) as e:
        store.read(0x999)
    assert _kind(e) == ErrorKind.NOT_FOUND

    # Reopening scans the block back in.
    again = BlockStore([tmp_path])
    assert again.info(0x1234)[0] == len(data) and again.used == len(data)

    # A reader keeps the data it opened after a delete; later opens miss; deleting
    # something absent is fine.
    reader = store.read(0x1234, 0, 10)
    assert store.delete([0x1234, 0x777]) == 1
    assert next(reader) == data[:10]
    assert not path.exists() and store.used == 0 and len(store) == 0
    with pytest.raises(CurvineError) as e:
        store.read(0x1234)
    assert _kind(e) == ErrorKind.NOT_FOUND


def test_checksum_mismatch_leaves_nothing(tmp_path):
    store = BlockStore([tmp_path])
    w = store.begin_write(5, 0)
    w.append(b"hello")
    with pytest.raises(CurvineError) as e:
        w.finish(zlib.crc32(b"hellO"))
    assert _kind(e) == ErrorKind.CHECKSUM
    assert _staging(tmp_path) == [] and 5 not in store and store.used == 0
    assert not os.path.exists(block_path(str(tmp_path), 5))


def test_capacity_no_space(tmp_path):
    store = BlockStore([tmp_path], capacity=3 * MIB)
    with pytest.raises(CurvineError) as e:
        store.begin_write(1, 4 * MIB)
    assert _kind(e) == ErrorKind.NO_SPACE
    _write(store, 2, b"x" * 2 * MIB)
    # Unknown length: refused on the append that would cross the capacity.
    w = store.begin_write(3)
    w.append(b"y" * MIB)
    with pytest.raises(CurvineError) as e:
        w.append(b"y")
    assert _kind(e) == ErrorKind.NO_SPACE
    assert _staging(tmp_path) == [] and store.used == 2 * MIB
    # A reservation counts against the capacity while its write is in progress.
    w = store.begin_write(4, MIB)
    with pytest.raises(CurvineError) as e:
        store.begin_write(5, 1)
    assert _kind(e) == ErrorKind.NO_SPACE
    w.abort()
    assert store.stats() == (3 * MIB, 2 * MIB, 1)
    _write(store, 5, b"z" * MIB)


def test_disk_full_is_no_space(tmp_path):
    """A real ENOSPC from the kernel (/dev/full under the staging fd) -> NO_SPACE."""
    store = BlockStore([tmp_path])
    w = store.begin_write(9, 0)
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        os.dup2(full, w._fd)
    finally:
        os.close(full)
    with pytest.raises(CurvineError) as e:
        w.append(b"a" * 4096)
    assert _kind(e) == ErrorKind.NO_SPACE
    assert _staging(tmp_path) == [] and store.used == 0


def test_auto_capacity_is_free_plus_used(tmp_path):
    store = BlockStore([tmp_path])
    st = os.statvfs(tmp_path)
    assert abs(store.capacity - st.f_bavail * st.f_frsize) < 64 * MIB
    _write(store, 1, b"q" * MIB)
    capacity, used, n = store.stats()
    assert used == MIB and n == 1 and abs(capacity - store.capacity) < 64 * MIB


def test_start_removes_staging_and_ignores_strays(tmp_path):
    store = BlockStore([tmp_path])
    _write(store, 0x42, b"data")
    (tmp_path / "staging" / f"{0x43:016x}.abc.tmp").write_bytes(b"partial")
    (tmp_path / "staging" / "junk").write_bytes(b"?")
    (tmp_path / "blocks" / "42" / "notes.txt").write_bytes(b"?")
    (tmp_path / "blocks" / "00" / _blk(0x42)).write_bytes(b"misplaced")
    store = BlockStore([tmp_path])
    assert _staging(tmp_path) == []
    assert [b for b, _ in store.report()] == [0x42] and store.used == 4
    assert (tmp_path / "blocks" / "42" / "notes.txt").exists()  # not ours: left alone


def test_several_data_dirs(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    store = BlockStore(dirs)
    for i in range(1, 9):
        _write(store, i, bytes([i]) * 1000)
    found = {int(name[:16], 16) for d in dirs for sub in os.listdir(d / "blocks")
             for name in os.listdir(d / "blocks" / sub)}
    assert found == set(range(1, 9))
    assert BlockStore(dirs).used == 8000
    with pytest.raises(CurvineError):
        BlockStore([tmp_path / "a", tmp_path / "a" / ".." / "a"])


@pytest.mark.parametrize("bad", [0, -1, -(1 << 70), 1 << 63, 1 << 64, 10 ** 40, True, "1", 1.0])
def test_block_ids_never_escape(tmp_path, bad):
    store = BlockStore([tmp_path])
    for call in (lambda: store.begin_write(bad), lambda: store.read(bad),
                 lambda: store.delete([bad]), lambda: store.info(bad),
                 lambda: block_client.local_block_path(
                     common_pb2.WorkerInfo(data_dirs=[str(tmp_path)]), bad)):
        with pytest.raises(CurvineError) as e:
            call()
        assert _kind(e) == ErrorKind.INVALID
    assert sorted(os.listdir(tmp_path)) == ["blocks", "staging"]


def test_largest_block_id_stays_inside(tmp_path):
    store = BlockStore([tmp_path])
    _write(store, MAX_BLOCK_ID, b"top")
    path = store.info(MAX_BLOCK_ID)[1]
    assert path == os.path.join(str(tmp_path), "blocks", "ff", "7fffffffffffffff.blk")
    assert check_block_id(1) == 1


def test_concurrent_writers(tmp_path):
    store = BlockStore([tmp_path], capacity=64 * MIB)
    payloads = {i: os.urandom(MIB + i) for i in range(1, 17)}
    with futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: _write(store, i, payloads[i], chunk=256 * 1024), payloads))
    assert store.used == sum(len(p) for p in payloads.values()) and len(store) == 16
    for i, p in payloads.items():
        assert b"".join(store.read(i)) == p


# -- the block service through block_client ------------------------------------------------


@pytest.fixture
def worker(tmp_path):
    data_dir = tmp_path / "data"
    store = BlockStore([data_dir])
    servicer = WorkerServicer(store, block_size=64 * MIB, block_key=UNCHECKED)
    server = make_server(8, security=NO_SECURITY)
    add_to_server(servicer, server)
    port = bind(server, "127.0.0.1", 0, NO_SECURITY)
    server.start()
    info = common_pb2.WorkerInfo(worker_id=1, address=f"127.0.0.1:{port}",
                                 data_dirs=[str(data_dir)], host_id="here")
    yield info, store, servicer
    block_client.close_channels()
    server.stop(None)


def _raw_write(info, messages, timeout=10.0):
    stub = worker_pb2_grpc.WorkerStub(block_client.get_channel(info.address, security=NO_SECURITY))
    try:
        return stub.WriteBlock(iter(messages), timeout=timeout)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None


def test_write_and_read_32mib(worker):
    info, store, _ = worker
    data = os.urandom(32 * MIB + 17)
    assert block_client.write_block(info, 77, data, security=NO_SECURITY) == (
        len(data), zlib.crc32(data))
    assert block_client.read_block(info, 77, 0, 0, security=NO_SECURITY) == data
    assert block_client.read_block(info, 77, 0, len(data), security=NO_SECURITY) == data
    with block_client.BlockReader(info, 77, security=NO_SECURITY) as reader:
        chunks = list(reader)
    assert all(len(c) <= MIB for c in chunks) and b"".join(chunks) == data
    # Ranged reads, across message boundaries.
    for off, n in [(0, 1), (MIB - 3, 6), (5 * MIB + 1, 3 * MIB), (len(data) - 10, 10),
                   (len(data) - 10, 0)]:
        expect = data[off:off + n] if n else data[off:]
        assert block_client.read_block(info, 77, off, n, security=NO_SECURITY) == expect
        assert b"".join(block_client.BlockReader(info, 77, off, n, security=NO_SECURITY)) == expect
    # memoryview and bytearray inputs; an empty block.
    assert (block_client.write_block(info, 78, memoryview(data)[:MIB], security=NO_SECURITY)
            == (MIB, zlib.crc32(data[:MIB])))
    assert block_client.write_block(info, 79, bytearray(b""), security=NO_SECURITY) == (0, 0)
    assert block_client.read_block(info, 79, 0, 0, security=NO_SECURITY) == b""
    assert len(store) == 3


def test_read_errors(worker):
    info, _, _ = worker
    with pytest.raises(CurvineError) as e:
        block_client.read_block(info, 12345, 0, 0, security=NO_SECURITY)
    assert _kind(e) == ErrorKind.NOT_FOUND and info.address in str(e.value)
    with pytest.raises(CurvineError) as e:
        list(block_client.BlockReader(info, 12345, security=NO_SECURITY))
    assert _kind(e) == ErrorKind.NOT_FOUND
    block_client.write_block(info, 5, b"abc", security=NO_SECURITY)
    for off, n, field in [(4, 0, "offset"), (1, 3, "length")]:
        with pytest.raises(CurvineError) as e:
            block_client.read_block(info, 5, off, n, security=NO_SECURITY)
        assert _kind(e) == ErrorKind.INVALID and field in str(e.value)
    for args, field in [((0, 0, 0), "block_id"), ((1 << 64, 0, 0), "block_id"),
                        ((5, -1, 0), "offset"), ((5, 0, -2), "length")]:
        for call in (lambda: block_client.read_block(info, *args, security=NO_SECURITY),
                     lambda: block_client.BlockReader(info, *args, security=NO_SECURITY)):
            with pytest.raises(CurvineError) as e:
                call()
            assert _kind(e) == ErrorKind.INVALID and field in str(e.value)
    with pytest.raises(CurvineError) as e:
        block_client.write_block(info, -5, b"x", security=NO_SECURITY)
    assert _kind(e) == ErrorKind.INVALID
    stub = worker_pb2_grpc.WorkerStub(block_client.get_channel(info.address, security=NO_SECURITY))
    for bad, field in [(worker_pb2.ReadBlockRequest(block_id=5, chunk_size=2 * MIB), "chunk_size"),
                       (worker_pb2.ReadBlockRequest(block_id=0), "block_id"),
                       (worker_pb2.ReadBlockRequest(block_id=1 << 63), "block_id")]:
        with pytest.raises(grpc.RpcError) as e:
            list(stub.ReadBlock(bad, timeout=5))
        err = from_rpc_error(e.value)
        assert err.kind == ErrorKind.INVALID and err.message.startswith(field + ":")


def test_generated_stub_interoperates(worker):
    """The hand-framed data messages are plain protobuf on the wire."""
    info, _, _ = worker
    stub = worker_pb2_grpc.WorkerStub(block_client.get_channel(info.address, security=NO_SECURITY))
    data = os.urandom(MIB + 5)
    reply = stub.WriteBlock(iter([
        worker_pb2.WriteBlockRequest(header=worker_pb2.WriteBlockHeader(block_id=3),
                                     data=data[:MIB]),
        worker_pb2.WriteBlockRequest(data=data[MIB:], finish=True, checksum=zlib.crc32(data)),
    ]), timeout=10)
    assert (reply.block_id, reply.length, reply.checksum) == (3, len(data), zlib.crc32(data))
    got = b"".join(r.data for r in stub.ReadBlock(worker_pb2.ReadBlockRequest(block_id=3)))
    assert got == data
    framed = worker_pb2.ReadBlockReply(data=b"xy").SerializeToString()
    assert wire.decode_read_reply(framed) == b"xy"


def test_generated_registration_still_works(tmp_path):
    """WorkerServicer registered with the generated helper sends ReadBlockReply messages."""
    store = BlockStore([tmp_path])
    server = make_server(4, security=NO_SECURITY)
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(store, block_key=UNCHECKED), server)
    port = bind(server, "127.0.0.1", 0, NO_SECURITY)
    server.start()
    try:
        info = common_pb2.WorkerInfo(address=f"127.0.0.1:{port}")
        data = os.urandom(2 * MIB + 1)
        block_client.write_block(info, 4, data, security=NO_SECURITY)
        assert block_client.read_block(info, 4, 0, 0, security=NO_SECURITY) == data
    finally:
        block_client.close_channels()
        server.stop(None)


def test_bad_writes_are_refused(worker):
    info, store, servicer = worker
    hdr = worker_pb2.WriteBlockHeader
    req = worker_pb2.WriteBlockRequest
    cases = [
        ([req(data=b"x", finish=True, checksum=zlib.crc32(b"x"))], "header"),
        ([req(header=hdr(block_id=0), finish=True)], "header.block_id"),
        ([req(header=hdr(block_id=1 << 63), finish=True)], "header.block_id"),
        ([req(header=hdr(block_id=1, expected_length=65 * MIB), finish=True)],
         "header.expected_length"),
        ([req(header=hdr(block_id=1, expected_length=5), data=b"abc", finish=True,
              checksum=zlib.crc32(b"abc"))], "header.expected_length"),
        ([req(header=hdr(block_id=1), data=b"a"), req(header=hdr(block_id=2), finish=True)],
         "header"),
        ([req(header=hdr(block_id=1), data=b"a")], "finish"),
        ([], "header"),
        # Oversized message: 2 MiB of data in one message.
        ([req(header=hdr(block_id=1), data=b"z" * 2 * MIB, finish=True,
              checksum=zlib.crc32(b"z" * 2 * MIB))], "data"),
    ]
    for messages, field in cases:
        with pytest.raises(CurvineError) as e:
            _raw_write(info, messages)
        assert _kind(e) == ErrorKind.INVALID, (field, e.value)
        assert str(e.value).startswith(field + ":"), (field, e.value)
    with pytest.raises(CurvineError) as e:
        _raw_write(info, [req(header=hdr(block_id=1), data=b"abc", finish=True, checksum=1)])
    assert _kind(e) == ErrorKind.CHECKSUM
    # The master's block size limits the total.
    servicer.block_size = 2 * MIB
    with pytest.raises(CurvineError) as e:
        block_client.write_block(info, 1, b"b" * (2 * MIB + 1), security=NO_SECURITY)
    assert _kind(e) == ErrorKind.INVALID
    assert len(store) == 0 and store.used == 0 and _staging(store.data_dirs[0]) == []


def test_no_space_reaches_the_client(tmp_path):
    store = BlockStore([tmp_path], capacity=2 * MIB)
    server = make_server(4, security=NO_SECURITY)
    add_to_server(WorkerServicer(store, block_key=UNCHECKED), server)
    port = bind(server, "127.0.0.1", 0, NO_SECURITY)
    server.start()
    try:
        info = common_pb2.WorkerInfo(address=f"127.0.0.1:{port}")
        block_client.write_block(info, 1, b"a" * MIB, security=NO_SECURITY)
        with pytest.raises(CurvineError) as e:
            block_client.write_block(info, 2, b"a" * (MIB + 1), security=NO_SECURITY)
        assert _kind(e) == ErrorKind.NO_SPACE and e.value.errno == 28
        assert store.used == MIB and _staging(tmp_path) == []
    finally:
        block_client.close_channels()
        server.stop(None)


def test_block_info_delete_and_short_circuit(worker):
    info, store, _ = worker
    block_client.write_block(info, 0x1FF, b"local", security=NO_SECURITY)
    stub = worker_pb2_grpc.WorkerStub(block_client.get_channel(info.address, security=NO_SECURITY))
    reply = stub.GetBlockInfo(worker_pb2.GetBlockInfoRequest(block_id=0x1FF), timeout=5)
    path = block_client.local_block_path(info, 0x1FF)
    assert reply.length == 5 and reply.path == path and path.endswith("/blocks/ff/" + _blk(0x1FF))
    assert open(path, "rb").read() == b"local"
    assert block_client.local_block_path(info, 0x200) is None
    stub.DeleteBlocks(worker_pb2.DeleteBlocksRequest(block_ids=[0x1FF, 0x200]), timeout=5)
    assert block_client.local_block_path(info, 0x1FF) is None and len(store) == 0
    with pytest.raises(grpc.RpcError) as e:
        stub.DeleteBlocks(worker_pb2.DeleteBlocksRequest(block_ids=[1, 0]), timeout=5)
    err = from_rpc_error(e.value)
    assert err.kind == ErrorKind.INVALID and "block_ids[1]" in err.message
    with pytest.raises(grpc.RpcError) as e:
        stub.GetBlockInfo(worker_pb2.GetBlockInfoRequest(block_id=0x1FF), timeout=5)
    assert from_rpc_error(e.value).kind == ErrorKind.NOT_FOUND


def test_write_stream_fed_piece_by_piece(worker):
    info, store, _ = worker
    data = os.urandom(5 * MIB + 123)
    st = block_client.BlockWriteStream(info, 0x33, security=NO_SECURITY)
    for pos in range(0, len(data), 700 * 1024):  # pieces of any size, sent as they come
        st.send(data[pos:pos + 700 * 1024])
    assert st.finish() == (len(data), zlib.crc32(data))
    assert block_client.read_block(info, 0x33, 0, 0, security=NO_SECURITY) == data
    empty = block_client.BlockWriteStream(info, 0x34, security=NO_SECURITY)
    assert empty.finish() == (0, 0) and 0x34 in store


def test_write_stream_cancel_and_worker_error_leave_nothing(worker):
    info, store, servicer = worker
    st = block_client.BlockWriteStream(info, 0x35, security=NO_SECURITY)
    st.send(b"x" * MIB)
    st.cancel()
    wait_until(lambda: not _staging(info.data_dirs[0]), what="staging file removed")
    assert 0x35 not in store
    servicer.block_size = 2 * MIB  # the worker refuses the block when it grows too big
    st = block_client.BlockWriteStream(info, 0x36, security=NO_SECURITY)
    with pytest.raises(CurvineError) as e:
        for _ in range(50):  # the error reaches send() once the call has failed
            st.send(b"y" * MIB)
            time.sleep(0.02)
        st.finish()
    assert _kind(e) == ErrorKind.INVALID and "block size" in e.value.message
    with pytest.raises(CurvineError):
        st.finish()
    wait_until(lambda: not _staging(info.data_dirs[0]), what="staging file removed")
    assert 0x36 not in store and store.used == 0


def _stage(info, block_id: int, data: bytes) -> tuple[int, str]:
    fd, path = block_client.create_local_staging(info, block_id)
    os.pwrite(fd, data, 0)
    return fd, path


def test_adopt_block_finalises_a_client_staging_file(worker):
    info, store, _ = worker
    data = os.urandom(3 * MIB + 5)
    fd, path = _stage(info, 0x2A, data)
    try:
        assert os.path.dirname(path) == os.path.join(info.data_dirs[0], "staging")
        assert block_client.adopt_block(info, 0x2A, path, len(data), zlib.crc32(data),
                                        security=NO_SECURITY) == (len(data), zlib.crc32(data))
    finally:
        os.close(fd)
    assert not os.path.exists(path) and _staging(info.data_dirs[0]) == []
    assert block_client.read_block(info, 0x2A, 0, 0, security=NO_SECURITY) == data
    assert 0x2A in store and store.used == len(data)
    assert block_client.local_block_path(info, 0x2A).endswith(_blk(0x2A))


def test_adopt_block_refuses_foreign_paths(worker, tmp_path):
    info, store, _ = worker
    staging = os.path.join(info.data_dirs[0], "staging")
    outside = tmp_path / "secret"
    outside.write_bytes(b"not yours")
    name = "0000000000000007.c0123456789abcdef.tmp"

    def refused(path, block_id=7, length=9, kind=ErrorKind.INVALID):
        with pytest.raises(CurvineError) as e:
            block_client.adopt_block(info, block_id, str(path), length, 0, security=NO_SECURITY)
        assert _kind(e) == kind, e.value
        return e.value.message

    assert "path" in refused(outside)  # not in the staging area
    assert "path" in refused(tmp_path / name)  # the right name in another directory
    assert "path" in refused(os.path.join(staging, "..", "..", "secret"))
    assert "path" in refused("staging/" + name)  # relative
    os.symlink(outside, os.path.join(staging, name))  # a symlink out of the data dir
    assert "symbolic link" in refused(os.path.join(staging, name))
    os.unlink(os.path.join(staging, name))
    os.link(outside, os.path.join(staging, name))  # a hard link to a file elsewhere
    assert "links" in refused(os.path.join(staging, name))
    os.unlink(os.path.join(staging, name))
    assert outside.read_bytes() == b"not yours" and len(store) == 0
    fd, path = _stage(info, 8, b"x" * 9)
    try:
        assert "path" in refused(path, block_id=7)  # another block's file
        assert "length" in refused(path, block_id=8, length=10)
        own = store.begin_write(9)  # the worker's own in-progress staging file
        assert "path" in refused(own.staging_path, block_id=9, length=0)
        own.abort()
        assert "block_id" in refused(path, block_id=0)
    finally:
        os.close(fd)
    refused(os.path.join(staging, name), kind=ErrorKind.NOT_FOUND)
    assert len(store) == 0 and store.used == 0


def test_adopt_block_beyond_capacity_is_no_space(tmp_path):
    store = BlockStore([tmp_path / "d"], capacity=MIB)
    info = common_pb2.WorkerInfo(worker_id=1, data_dirs=store.data_dirs)
    fd, path = _stage(info, 5, b"y" * (MIB + 1))
    os.close(fd)
    with pytest.raises(CurvineError) as e:
        store.adopt(5, path, MIB + 1, 0)
    assert _kind(e) == ErrorKind.NO_SPACE
    assert not os.path.exists(path) and store.used == 0 and len(store) == 0


def test_sweep_removes_client_staging_files_whose_writer_is_gone(tmp_path):
    store = BlockStore([tmp_path / "d"])
    info = common_pb2.WorkerInfo(worker_id=1, data_dirs=store.data_dirs)
    live_fd, live = _stage(info, 1, b"a")  # still being written: flock held
    dead_fd, dead = _stage(info, 2, b"b")
    os.close(dead_fd)  # the writer died
    own = store.begin_write(3)  # the worker's own writes are never swept
    try:
        assert store.sweep_client_staging(min_age=60) == 0  # too young
        assert store.sweep_client_staging(min_age=0) == 1
        assert os.path.exists(live) and not os.path.exists(dead)
        assert os.path.exists(own.staging_path)
    finally:
        own.abort()
        os.close(live_fd)
    assert store.sweep_client_staging(min_age=0) == 1 and _staging(store.data_dirs[0]) == []


def test_reader_close_cancels(worker):
    info, _, _ = worker
    block_client.write_block(info, 8, os.urandom(16 * MIB), security=NO_SECURITY)
    reader = block_client.BlockReader(info, 8, readahead=2, security=NO_SECURITY)
    it = iter(reader)
    assert len(next(it)) == MIB
    reader.close()
    assert list(it) == []
    # Many abandoned readers do not pile up threads.
    for _ in range(5):
        r = block_client.BlockReader(info, 8, readahead=1, security=NO_SECURITY)
        next(iter(r))
        del r
    wait_until(lambda: sum(t.name == "block-readahead" for t in threading.enumerate()) == 0,
               5, "readahead threads to stop")


def test_unreachable_worker_is_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    info = common_pb2.WorkerInfo(address=f"127.0.0.1:{port}")
    with pytest.raises(CurvineError) as e:
        block_client.write_block(info, 1, b"x", timeout=5, security=NO_SECURITY)
    assert _kind(e) == ErrorKind.UNAVAILABLE
    with pytest.raises(CurvineError) as e:
        block_client.read_block(info, 1, 0, 0, timeout=5, security=NO_SECURITY)
    assert _kind(e) == ErrorKind.UNAVAILABLE
    block_client.close_channels()


# -- curvine-worker against a real master ---------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Heard:
    """What the worker told a (real, in-process) master: its registrations
    (WorkerInfo), block reports and the heartbeats of its live registration."""

    def __init__(self, master: Master):
        self.registrations = tap(master, "register_worker")
        self.reports = tap(master, "block_report")
        self.heartbeats = tap(master, "heartbeat")


def _master_config(tmp_path):
    """The master's state in tmp_path/master; unknown blocks on a worker are deleted at
    its block report (no grace for writes in flight)."""
    cfg = master_config(tmp_path / "master")
    cfg.master.orphan_block_grace = 0.0
    return cfg


def _serve_master(cfg, port: int, heard: list) -> InprocMaster:
    """A master serving its worker port on ``port`` (the one the worker calls); the
    ``Heard`` of each master run (a restart is a new one) is appended to ``heard``
    before its port opens."""
    return InprocMaster(cfg, client_port=None, worker_port=port,
                        on_open=lambda m: heard.append(Heard(m)))


def _allocate(m: Master, name: bytes, size: int):
    """A new file and a block for it, as a client's AddBlock gets them (the block id,
    its workers and its write token)."""
    node = m.create(master_pb2.CreateRequest(request_id=new_request_id(), parent=ROOT_INO,
                                             name=name, mode=0o644)).inode
    return node, m.add_block(master_pb2.AddBlockRequest(ino=node.ino,
                                                        client_host_id="test-host",
                                                        size_hint=size))


def _publish(m: Master, node, alloc, data: bytes) -> None:
    block = common_pb2.Block(block_id=alloc.block_id, length=len(data),
                             checksum=zlib.crc32(data),
                             worker_ids=[w.worker_id for w in alloc.workers])
    m.complete(master_pb2.CompleteFileRequest(request_id=new_request_id(), ino=node.ino,
                                              blocks=[block], size=len(data)))


def _earlier_run(cfg, data_dir) -> tuple[int, int, int]:
    """The master's state after an earlier run of the worker of ``data_dir`` (its own
    uuid and secret): files "kept" and "doomed" with a block each on that worker
    (content ``b"planted <id>"``), and a block allocated to a file that never published
    it.  Returns the block ids (kept, unpublished, doomed); the caller plants them."""
    m = Master(cfg, security=NO_SECURITY)
    try:
        d = str(data_dir)
        m.register_worker(common_pb2.WorkerInfo(uuid=worker_uuid(d), host_id="test-host",
                                                address="127.0.0.1:1", data_dirs=[d],
                                                capacity=1 << 30), worker_secret(d))
        ids = []
        for name in (b"kept", b"unpublished", b"doomed"):
            node, alloc = _allocate(m, name, 100)
            if name != b"unpublished":
                _publish(m, node, alloc, b"planted %d" % alloc.block_id)
            ids.append(alloc.block_id)
        return tuple(ids)
    finally:
        m.close()


class WorkerProcess:
    def __init__(self, tmp_path, data_dir, master_port, name):
        conf = tmp_path / "curvine.toml"
        conf.write_text('[worker]\nheartbeat_interval = "100ms"\n'
                        '[cluster]\nrpc_timeout = "5s"\n')
        self.log_path = tmp_path / f"{name}.log"
        self.notify_path = str(tmp_path / f"{name}.notify")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        env = {k: v for k, v in os.environ.items() if k != "CURVINE_CONF"}
        env.update(CURVINE_HOST_ID="test-host", NOTIFY_SOCKET=self.notify_path)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [os.path.join(VENV_BIN, "curvine-worker"), "--conf", str(conf),
                 "--master", f"127.0.0.1:{master_port}",
                 "--master-worker", f"127.0.0.1:{master_port}",
                 "--host", "127.0.0.1", "--port", "0",
                 "--data-dir", str(data_dir), "--capacity", "1GiB"],
                stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout=15.0) -> None:
        self.notify.settimeout(timeout)
        try:
            while True:
                msg = self.notify.recv(4096)
                if msg == b"READY=1":
                    return
        except socket.timeout:
            raise AssertionError(f"worker not READY; log:\n{self.log()}") from None

    def log(self) -> str:
        return self.log_path.read_text()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.notify.close()


def _plant(data_dir, block_id: int, data: bytes) -> None:
    path = data_dir / "blocks" / f"{block_id % 256:02x}" / _blk(block_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING curvine\.worker\.server: master \S+ unavailable \(UNAVAILABLE")  # started before its master, on purpose
def test_worker_daemon_against_a_real_master(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    cfg = _master_config(tmp_path)
    kept, unpublished, doomed = _earlier_run(cfg, data_dir)
    for b in (kept, unpublished, doomed):
        _plant(data_dir, b, b"planted %d" % b)
    (data_dir / "staging").mkdir(parents=True)
    (data_dir / "staging" / f"{0x104:016x}.dead.tmp").write_bytes(b"torn")
    for d, _, _ in os.walk(data_dir):  # private, as the worker keeps it: no warning
        os.chmod(d, 0o700)

    # The worker starts before its master is up and waits for it quietly.
    master_port = _free_port()
    worker = WorkerProcess(tmp_path, data_dir, master_port, "w1")
    service = None
    heard: list[Heard] = []
    try:
        wait_until(lambda: "unavailable" in worker.log(), 10, "the worker to miss its master")
        assert worker.proc.poll() is None
        service = _serve_master(cfg, master_port, heard)
        master = service.master
        worker.wait_ready()

        reg = heard[-1].registrations[0]
        wid = master.registry.by_uuid(reg.uuid).worker_id  # its id from the earlier run
        assert reg.worker_id == 0 and reg.host_id == "test-host"
        assert reg.data_dirs == [str(data_dir)] and reg.capacity == 1 << 30
        assert reg.used == sum(len(b"planted %d" % b) for b in (kept, unpublished, doomed))
        assert reg.uuid == (data_dir / "worker.uuid").read_text().strip()
        assert reg.address.startswith("127.0.0.1:")
        report = heard[-1].reports[0]
        reported = dict(zip(report.block_ids, report.block_mtimes_ns))
        assert report.worker_id == wid and set(reported) == {kept, unpublished, doomed}
        assert all(m > 0 for m in reported.values())
        assert os.listdir(data_dir / "staging") == []
        # no file holds it: the master had the worker delete it at the report
        assert not os.path.exists(block_path(str(data_dir), unpublished))

        # Serving: a block written now shows up in the heartbeats.
        info = common_pb2.WorkerInfo(address=reg.address, data_dirs=list(reg.data_dirs))
        node, fresh = _allocate(master, b"fresh", 5)
        with pytest.raises(CurvineError) as denied:  # no token: the master gives it
            block_client.write_block(info, fresh.block_id, b"fresh", security=NO_SECURITY)
        assert denied.value.kind == ErrorKind.PERMISSION and "token" in denied.value.message
        block_client.write_block(info, fresh.block_id, b"fresh", token=fresh.block_token,
                                 security=NO_SECURITY)
        _publish(master, node, fresh, b"fresh")
        wait_until(lambda: any(h.num_blocks == 3 and h.worker_id == wid
                               for h in heard[-1].heartbeats), 5, "a heartbeat with 3 blocks")

        # the file that holds it goes: the master has the worker delete the block
        master.unlink(master_pb2.UnlinkRequest(request_id=new_request_id(), parent=ROOT_INO,
                                               name=b"doomed"), rmdir=False)
        wait_until(lambda: not os.path.exists(block_path(str(data_dir), doomed)), 5,
                   "the doomed block to be deleted")
        # This worker's identity registers again (its uuid and secret): the running
        # worker's heartbeats no longer name the live registration, and the master asks
        # it to register again.
        Master.register_worker(master, master.registry.info(wid),  # (not tapped)
                               worker_secret(str(data_dir)))
        wait_until(lambda: len(heard[-1].reports) >= 2, 5, "a second block report")
        registrations = heard[-1].registrations
        assert len(registrations) == 2
        assert registrations[1].uuid == reg.uuid and registrations[1].worker_id == wid
        assert set(heard[-1].reports[1].block_ids) == {kept, fresh.block_id}

        # The master goes away and comes back (restarted on the same port and state):
        # the worker keeps serving, says so once each way, and carries on heartbeating.
        service.stop()
        wait_until(lambda: worker.log().count("WARNING") == 2, 10, "a second WARNING")
        assert block_client.read_block(info, fresh.block_id, 0, 0,
                                       token=fresh.block_token, security=NO_SECURITY) == b"fresh"
        time.sleep(0.5)
        service.start()
        wait_until(lambda: heard[-1].heartbeats, 10, "heartbeats to a restarted master")
        assert worker.proc.poll() is None

        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(10) == 0
        log = worker.log()
        assert "Traceback" not in log and "ERROR" not in log
        assert log.count("WARNING") == 2  # master away at start, and once later
        assert log.count("reachable again") == 2
        assert "removed 1 staging leftovers" in log
    finally:
        worker.close()
        block_client.close_channels()
        if service is not None:
            service.stop()


def test_worker_killed_mid_write_recovers(tmp_path):
    data_dir = tmp_path / "data"
    master_port = _free_port()
    heard: list[Heard] = []
    service = _serve_master(_master_config(tmp_path), master_port, heard)
    master = service.master
    worker = WorkerProcess(tmp_path, data_dir, master_port, "w1")
    try:
        worker.wait_ready()
        info = common_pb2.WorkerInfo(address=heard[-1].registrations[0].address)
        _, kept = _allocate(master, b"kept", 4000)
        block_client.write_block(info, kept.block_id, b"kept" * 1000, token=kept.block_token,
                                 security=NO_SECURITY)

        # A write that stalls after its first message: the staging file exists.
        _, torn = _allocate(master, b"torn", 4 * MIB)
        release = threading.Event()

        def stalled():
            yield wire.encode_write_request(b"p" * MIB, block_id=torn.block_id,
                                            expected_length=4 * MIB, token=torn.block_token)
            release.wait(20)

        calls = block_client._calls(info.address, NO_SECURITY)
        call = calls.write.future(stalled(), timeout=20)
        wait_until(lambda: os.listdir(data_dir / "staging"), 10, "a staging file")
        worker.proc.kill()
        worker.proc.wait(10)
        release.set()
        with pytest.raises(grpc.RpcError):
            call.result()
        assert os.listdir(data_dir / "staging")  # the crash left it behind
        worker.close()

        worker = WorkerProcess(tmp_path, data_dir, master_port, "w2")
        worker.wait_ready()
        assert os.listdir(data_dir / "staging") == []
        assert set(heard[-1].reports[-1].block_ids) == {kept.block_id}
        registrations = heard[-1].registrations
        assert registrations[-1].uuid == registrations[0].uuid
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(10) == 0
        assert "Traceback" not in worker.log()
    finally:
        worker.close()
        block_client.close_channels()
        service.stop()


def test_bad_flags_and_config_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[worker]\nno_such_key = 1\n")
    for args in (["--capacity", "lots"], ["--conf", str(bad)]):
        proc = subprocess.run([os.path.join(VENV_BIN, "curvine-worker"), *args,
                               "--data-dir", str(tmp_path / "d")],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
    assert "no_such_key" in proc.stderr
