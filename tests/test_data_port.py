"""The workers' bulk read port (worker/data_port.py, client/blocks/data_port.py) with a real
master and worker servicer in this process: byte-exact ranges straight into the
caller's buffers, the block token checked like the gRPC service checks it, and the
bounds (connections, idle and malformed peers)."""

from __future__ import annotations

import os
import socket
import struct
import time

import pytest

from curvine.client.blocks import block_client
from curvine.client.blocks.data_port import DataPorts
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO
from curvine.common.security import NO_SECURITY
from curvine.proto import common_pb2
from curvine.common.data_wire import REQUEST
from curvine.worker.data_port import DataPortServer

from inproc import InprocCluster, empty_data_dir, wait_until

MiB = 1 << 20


@pytest.fixture
def cluster(tmp_path):
    with InprocCluster(tmp_path, [("h1", 1 << 30, empty_data_dir(tmp_path / "w1"))],
                       block_size=16 * MiB) as c:
        yield c


def stored_block(c: InprocCluster, data: bytes) -> common_pb2.Block:
    """A file of one block holding ``data``; its block as GetBlocks gives it (read token)."""
    m = c.client
    f = m.create(ROOT_INO, b"f%d" % len(data))
    block_id, workers, token = m.add_block(f.ino, "h1", len(data))
    length, crc = block_client.write_block(workers[0], block_id, data, token=token,
                                           security=NO_SECURITY)
    m.complete_file(f.ino, [common_pb2.Block(block_id=block_id, length=length, checksum=crc,
                                             worker_ids=[workers[0].worker_id])], length)
    _, blocks, _ = m.get_blocks(f.ino)
    return blocks[0]


@pytest.fixture
def port(cluster):
    server = DataPortServer(cluster.worker(1).servicer, "127.0.0.1", 0, max_connections=4,
                            idle_timeout=1.0)
    server.start()
    yield server
    server.close()


def test_ranges_arrive_byte_exact_in_the_callers_buffers(cluster, port):
    data = os.urandom(14 * MiB + 123)  # more than the socket buffers hold
    block = stored_block(cluster, data)
    ports = DataPorts(timeout=10)
    address = f"127.0.0.1:{port.port}"
    try:
        whole = bytearray(len(data))
        assert ports.read_into(address, block.block_id, block.token, 0, [memoryview(whole)]) \
            == len(data)
        assert whole == data
        # scattered over two buffers, from an offset, and past the end (a short read)
        a, b = bytearray(100), bytearray(MiB)
        assert ports.read_into(address, block.block_id, block.token, 7,
                               [memoryview(a), memoryview(b)]) == 100 + MiB
        assert bytes(a) + bytes(b) == data[7:7 + 100 + MiB]
        tail = bytearray(1000)
        assert ports.read_into(address, block.block_id, block.token, len(data) - 10,
                               [memoryview(tail)]) == 10
        assert bytes(tail[:10]) == data[-10:]
        # the connection was reused for all of them
        assert len(ports._idle[address]) == 1
    finally:
        ports.close()


def test_the_block_token_is_checked(cluster, port):
    block = stored_block(cluster, b"x" * 1000)
    ports = DataPorts(timeout=10)
    address = f"127.0.0.1:{port.port}"
    buf = memoryview(bytearray(1000))
    try:
        for token in (b"", b"0" * len(block.token)):
            with pytest.raises(CurvineError) as e:
                ports.read_into(address, block.block_id, token, 0, [buf])
            assert e.value.kind == ErrorKind.PERMISSION and "token" in str(e.value)
        with pytest.raises(CurvineError) as e:  # a token for another block
            ports.read_into(address, block.block_id + 1, block.token, 0, [buf])
        assert e.value.kind == ErrorKind.PERMISSION
        assert port.served_bytes == 0
        # after refusals the connection is still good
        assert ports.read_into(address, block.block_id, block.token, 0, [buf]) == 1000
    finally:
        ports.close()


def test_bounds_busy_idle_and_malformed_peers(cluster, port):
    address = ("127.0.0.1", port.port)
    held = [socket.create_connection(address) for _ in range(4)]
    try:
        wait_until(lambda: len(port._conns) == 4, what="4 connections served")
        extra = socket.create_connection(address, timeout=5)
        status, = struct.unpack(">I", extra.recv(4))
        assert status == ErrorKind.BUSY
        extra.close()
    finally:
        for s in held:
            s.close()
    wait_until(lambda: not port._conns, what="closed connections released")
    # a silent peer is dropped after the idle timeout (1 s here)
    silent = socket.create_connection(address, timeout=5)
    t = time.monotonic()
    assert silent.recv(1) == b""
    assert time.monotonic() - t < 4.5
    silent.close()
    # a request that is not ours gets INVALID and the connection ends
    junk = socket.create_connection(address, timeout=5)
    junk.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"\0" * REQUEST.size)
    status, = struct.unpack(">I", junk.recv(4))
    assert status == ErrorKind.INVALID
    junk.settimeout(5)
    try:
        while junk.recv(4096):
            pass
    except ConnectionResetError:
        pass  # closed with the rest of our junk unread: also the end
    junk.close()


def test_close_ends_connections_and_the_client_reports_unavailable(cluster, port):
    block = stored_block(cluster, b"y" * 4096)
    ports = DataPorts(timeout=5)
    address = f"127.0.0.1:{port.port}"
    buf = memoryview(bytearray(4096))
    try:
        assert ports.read_into(address, block.block_id, block.token, 0, [buf]) == 4096
        port.close()
        with pytest.raises(CurvineError) as e:
            ports.read_into(address, block.block_id, block.token, 0, [buf])
        assert e.value.kind == ErrorKind.UNAVAILABLE
    finally:
        ports.close()


def test_the_daemon_serves_no_data_port_with_tls_on_or_port_0(cluster):
    """With TLS the port would bypass it: the worker daemon does not open it (readers
    use gRPC); worker.data_port 0 turns it off."""
    from types import SimpleNamespace
    from curvine.common.config import WorkerConfig
    from curvine.worker.server import start_data_port
    servicer = cluster.worker(1).servicer
    tls_on = SimpleNamespace(material=object())
    assert start_data_port(WorkerConfig(host="127.0.0.1", data_port=0), servicer,
                           NO_SECURITY) is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert start_data_port(WorkerConfig(host="127.0.0.1", data_port=port), servicer,
                           tls_on) is None
    server = start_data_port(WorkerConfig(host="127.0.0.1", data_port=port), servicer,
                             NO_SECURITY)
    try:
        assert server is not None and server.port == port
        # a port in use: one error line, no port, the worker serves on
        assert start_data_port(WorkerConfig(host="127.0.0.1", data_port=port), servicer,
                               NO_SECURITY) is None
    finally:
        server.close()
