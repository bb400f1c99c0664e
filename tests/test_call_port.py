"""The master's call port (master/call_port.py) and the mount's client of it
(fuse_client/call_port.py), against a real master served in-process: the same answers
as the unary RPCs, the token checked, the connection cap, a client that takes no
replies cut off, and every pending call failed over (PortDown) when the port goes."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
import trio

from curvine.client.master_client import MasterClient
from curvine.common import rpc
from curvine.common.config import Config
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO
from curvine.common.metrics import RPC_UNAUTHENTICATED, STREAMS_CANCELLED_IDLE
from curvine.common.security import NO_SECURITY
from curvine.fuse_client.call_port import CallPortClient, PortDown, PortRefused
from curvine.fuse_client.calls import Calls
from curvine.common.call_wire import ANSWER, FRAME, HELLO, MAGIC
from curvine.master.call_port import CallPort
from curvine.master.master import Master
from curvine.master.service import READ_CALLS, MasterServicer
from curvine.proto import master_pb2, master_pb2_grpc

TOKEN = "call-port-test-token"


@pytest.fixture
def served(tmp_path):
    """(master, unary client, servicer, a function starting a CallPort on it)."""
    cfg = Config()
    cfg.master.meta_dir = str(tmp_path / "meta")
    cfg.journal.dir = str(tmp_path / "journal")
    m = Master(cfg, security=NO_SECURITY)
    servicer = MasterServicer(m, call_threads=4)
    server = rpc.make_server(16, security=NO_SECURITY)
    master_pb2_grpc.add_MasterServicer_to_server(servicer, server)
    port = rpc.bind(server, "127.0.0.1", 0, NO_SECURITY)
    server.start()
    client = MasterClient(f"127.0.0.1:{port}", timeout=10, wait=2, security=NO_SECURITY)
    ports = []

    def start_port(**kw) -> CallPort:
        kw.setdefault("tokens", (TOKEN,))
        p = CallPort(servicer.run_call, READ_CALLS, servicer.call_pool, "127.0.0.1", 0, **kw)
        p.start()
        ports.append(p)
        return p

    yield m, client, servicer, start_port
    for p in ports:
        p.stop()
    client.close()
    server.stop(0)
    servicer.close()
    m.close()


async def _to_thread(fn):
    return await trio.to_thread.run_sync(fn)


async def _connected(port_client: CallPortClient, nursery) -> None:
    nursery.start_soon(port_client.run)
    with trio.fail_after(10):
        await port_client.connected.wait()


def test_calls_on_the_port_answer_like_unary_rpcs(served):
    m, client, _, start_port = served
    port = start_port()
    pc = CallPortClient("127.0.0.1", port.port, TOKEN, timeout=10)
    calls = Calls(client, _to_thread, port=pc)

    async def go():
        async with trio.open_nursery() as nursery:
            await _connected(pc, nursery)
            d, _, parent = await calls.run("mkdir", ROOT_INO, b"d", 0o755)
            assert parent.ino == ROOT_INO
            f, _, parent = await calls.run("create", d.ino, b"f.tmp", 0o644)
            assert parent.ino == d.ino
            assert (await calls.run("lookup", d.ino, b"f.tmp"))[0].ino == f.ino
            assert await calls.run("lookup", d.ino, b"missing") == (None, 0)
            # AddBlock from a writer's thread: no worker registered here (UNAVAILABLE goes
            # unary, which retries it for the client's wait, 2 s here)
            with pytest.raises(CurvineError) as e:
                await trio.to_thread.run_sync(calls.from_thread, "add_block", f.ino, "h", 0)
            assert e.value.kind == ErrorKind.UNAVAILABLE
            node = await calls.run("complete", f.ino, [], 0, 0, True)
            assert node.version == 1
            inode, blocks, _ = await calls.run("get_blocks", f.ino)
            assert inode.version == 1 and blocks == []
            _, _, moved, _ = await calls.run("rename", d.ino, b"f.tmp", d.ino, b"f.data")
            assert moved.ino == f.ino
            entries, more = await calls.run("listdir", d.ino)
            assert [e.name for e in entries] == [b"f.data"] and not more
            await calls.run("set_xattr", f.ino, b"user.k", b"v")
            assert await calls.run("get_xattr", f.ino, b"user.k") == b"v"
            assert await calls.run("list_xattr", f.ino) == [b"user.k"]
            assert (await calls.run("statfs")).files >= 3
            # errors come back by kind, from the loop and from a thread
            with pytest.raises(CurvineError) as e:
                await calls.run("create", d.ino, b"f.data", 0o644, 0, 0, True)
            assert e.value.kind == ErrorKind.EXISTS
            with pytest.raises(CurvineError) as e:
                await trio.to_thread.run_sync(calls.from_thread, "getattr", 999_999)
            assert e.value.kind == ErrorKind.NOT_FOUND
            assert (await trio.to_thread.run_sync(
                calls.from_thread, "getattr", f.ino))[0].ino == f.ino
            nursery.cancel_scope.cancel()

    trio.run(go)
    # what the port did is the master's state, as seen by a unary RPC
    d = client.lookup(ROOT_INO, b"d")
    assert client.lookup(d.ino, b"f.data").version == 1


def test_many_calls_at_once_from_tasks_and_threads(served):
    """Pipelined calls (more than the socket takes at once, and more than the per-
    connection limit in flight) all get their own answer."""
    m, client, _, start_port = served
    port = start_port(max_in_flight=8)
    pc = CallPortClient("127.0.0.1", port.port, TOKEN, timeout=20)
    calls = Calls(client, _to_thread, port=pc)
    names = [b"n%04d-" % i + b"x" * 200 for i in range(600)]

    async def go():
        async with trio.open_nursery() as nursery:
            await _connected(pc, nursery)
            d, _, _ = await calls.run("mkdir", ROOT_INO, b"many", 0o755)
            created = {}

            async def make(name):
                f, _, _ = await calls.run("create", d.ino, name, 0o644)
                created[name] = f.ino

            async with trio.open_nursery() as inner:
                for name in names[:300]:
                    inner.start_soon(make, name)
            looked = {}

            def look(name):
                looked[name] = calls.from_thread("lookup", d.ino, name)[0].ino

            async with trio.open_nursery() as inner:
                for name in names[:300]:
                    inner.start_soon(trio.to_thread.run_sync, look, name)
            assert looked == created
            misses = [await calls.run("lookup", d.ino, n) for n in names[300:]]
            assert misses == [(None, 0)] * 300
            nursery.cancel_scope.cancel()

    trio.run(go)


def _raw_connect(port: int, token: bytes, rcvbuf: int = 0) -> tuple[socket.socket, int]:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    s.sendall(HELLO.pack(MAGIC, len(token)) + token)
    magic, status = ANSWER.unpack(_recv(s, ANSWER.size))
    assert magic == MAGIC
    return s, status


def _recv(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        data = s.recv(n - len(buf))
        if not data:
            raise ConnectionError("closed")
        buf += data
    return buf


def test_a_wrong_or_missing_token_is_refused_and_counted(served):
    _, _, _, start_port = served
    port = start_port()
    before = RPC_UNAUTHENTICATED.labels("CallPort")._value.get()
    for token in (b"", b"not-the-token"):
        s, status = _raw_connect(port.port, token)
        assert status == 1
        assert s.recv(1) == b""  # and closed
        s.close()
    assert RPC_UNAUTHENTICATED.labels("CallPort")._value.get() == before + 2
    pc = CallPortClient("127.0.0.1", port.port, "wrong", timeout=10)

    async def go():
        with trio.fail_after(10):
            await pc.run()  # gives up at once: a wrong token does not get better

    trio.run(go)
    assert not pc.connected.is_set()
    with pytest.raises(PortRefused):
        trio.run(pc._connect)


def test_connections_are_capped(served):
    _, _, _, start_port = served
    port = start_port(max_connections=2)
    held = [_raw_connect(port.port, TOKEN.encode()) for _ in range(2)]
    assert [status for _, status in held] == [0, 0]
    s, status = _raw_connect(port.port, TOKEN.encode())
    assert status == 2  # busy
    s.close()
    held[0][0].close()
    deadline = time.monotonic() + 10
    while True:  # the master notices the close, then takes a new one
        s, status = _raw_connect(port.port, TOKEN.encode())
        s.close()
        if status == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status == 0
    held[1][0].close()


def test_a_client_that_takes_no_replies_is_cut_off(served):
    """It asks for big directory pages without reading: the master stops reading it
    once its replies pile up, and closes it after the idle timeout
    (master.stream_idle_timeout, 60 s by default; 1 s here)."""
    _, client, _, start_port = served
    for i in range(100):
        client.create(ROOT_INO, b"%03d" % i + b"x" * 200)
    port = start_port(idle_timeout=1.0, max_in_flight=16)
    before = STREAMS_CANCELLED_IDLE.labels("CallPort")._value.get()
    s, status = _raw_connect(port.port, TOKEN.encode(), rcvbuf=4096)
    assert status == 0
    call = master_pb2.Call(id=1, listdir=master_pb2.ListDirRequest(
        ino=ROOT_INO, limit=1000)).SerializeToString()
    frame = FRAME.pack(len(call)) + call
    s.settimeout(0.5)
    t0 = time.monotonic()
    closed = False
    while time.monotonic() - t0 < 30:
        try:
            s.sendall(frame * 64)
        except (socket.timeout, BlockingIOError):
            pass  # the master stopped reading: wait for it to give up
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        if STREAMS_CANCELLED_IDLE.labels("CallPort")._value.get() > before:
            closed = True
            break
    s.close()
    assert closed, "the master kept a client that reads nothing"
    assert STREAMS_CANCELLED_IDLE.labels("CallPort")._value.get() == before + 1
    # the port still serves everyone else
    s, status = _raw_connect(port.port, TOKEN.encode())
    assert status == 0
    s.close()


def test_an_oversized_frame_closes_the_connection(served):
    _, _, _, start_port = served
    port = start_port()
    s, status = _raw_connect(port.port, TOKEN.encode())
    assert status == 0
    s.sendall(struct.pack(">I", (64 << 20) + 1))
    s.settimeout(10)
    assert s.recv(1) == b""
    s.close()


def test_pending_calls_fail_over_when_the_port_goes(served):
    """A mutation waiting in the master when its port stops: the caller gets PortDown,
    and Calls sends the same request as a unary RPC (the retry cache answers it once
    applied), so the create happens exactly once."""
    m, client, servicer, start_port = served
    port = start_port()
    pc = CallPortClient("127.0.0.1", port.port, TOKEN, timeout=10)
    calls = Calls(client, _to_thread, port=pc)
    gate = threading.Event()
    real = servicer._run_call

    def slow(call):
        if call.WhichOneof("op") == "create":
            gate.wait(10)
        return real(call)

    servicer._run_call = slow
    results = []

    async def go():
        async with trio.open_nursery() as nursery:
            await _connected(pc, nursery)

            async def create():
                results.append(await calls.run("create", ROOT_INO, b"once", 0o644))

            nursery.start_soon(create)
            await trio.sleep(0.3)
            pc.stop()  # the connection goes with the create in flight
            gate.set()
            while not results:
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    trio.run(go)
    servicer._run_call = real
    f = results[0][0]
    assert client.lookup(ROOT_INO, b"once").ino == f.ino
    with pytest.raises(PortDown):
        trio.run(pc.call, client.prepare("getattr", ROOT_INO))


def test_the_master_closing_the_port_leaves_the_mount_working(served):
    """The master side goes (a master stopping or killed): the client's task survives,
    calls go unary meanwhile, and it reconnects once a port is back on that port."""
    m, client, _, start_port = served
    port = start_port()
    number = port.port
    pc = CallPortClient("127.0.0.1", number, TOKEN, timeout=10)
    calls = Calls(client, _to_thread, port=pc)

    async def go():
        async with trio.open_nursery() as nursery:
            await _connected(pc, nursery)
            assert (await calls.run("getattr", ROOT_INO))[0].ino == ROOT_INO
            await trio.to_thread.run_sync(port.stop)
            with trio.fail_after(10):
                while pc._sock is not None:  # the client notices
                    await trio.sleep(0.02)
            # meanwhile: unary, same answers
            assert (await calls.run("getattr", ROOT_INO))[0].ino == ROOT_INO
            pc.connected = trio.Event()
            again = await trio.to_thread.run_sync(
                lambda: CallPort(port._run_call, READ_CALLS, port._pool, "127.0.0.1",
                                 number, tokens=(TOKEN,)))
            await trio.to_thread.run_sync(again.start)
            try:
                with trio.fail_after(20):
                    await pc.connected.wait()
                assert (await calls.run("getattr", ROOT_INO))[0].ino == ROOT_INO
            finally:
                await trio.to_thread.run_sync(again.stop)
            nursery.cancel_scope.cancel()

    trio.run(go)
