"""The master's call port (master/ports/call_port_server.py), the mount's client of it
(fuse_client/call_port_trio.py) and the path client's (client/master/call_port_blocking.py), against a real
master served in-process: the same answers as the unary RPCs, the token checked, the
connection cap, a client that takes no replies cut off, every pending call failed over
(PortDown) when the port goes, a path client's calls unary when the port cannot
carry them, and a mutation (run as steps in the port's loop) answered only after the
revocation it needs while the port answers other calls."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from concurrent import futures

import pytest
import trio

from curvine.client.master.call_port_blocking import BlockingCallPort
from curvine.client.master.master_client import MasterClient
from curvine.common import rpc
from curvine.common.config import Config
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO
from curvine.common.metrics import RPC_UNAUTHENTICATED, STREAMS_CANCELLED_IDLE
from curvine.common.security import NO_SECURITY, Security
from curvine.fuse_client.call_port_trio import Outage, TrioCallPort, PortDown, PortRefused
from curvine.fuse_client.calls import Calls
from curvine.common.call_wire import ANSWER, FRAME, HELLO, MAGIC
from curvine.master.ports.call_port_server import CallPort
from curvine.master.master import Master
from curvine.master.ports.service import READ_CALLS, MasterServicer
from curvine.proto import common_pb2, master_pb2, master_pb2_grpc

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
        kw.setdefault("mutations", servicer.mutations)  # as the master serves it
        kw.setdefault("run_nowait", servicer.run_call_nowait)
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


async def _connected(port_client: TrioCallPort, nursery) -> None:
    nursery.start_soon(port_client.run)
    with trio.fail_after(10):
        await port_client.connected.wait()


def test_calls_on_the_port_answer_like_unary_rpcs(served):
    m, client, _, start_port = served
    port = start_port()
    pc = TrioCallPort("127.0.0.1", port.port, TOKEN, timeout=10)
    calls = Calls(client, _to_thread, port=pc)

    async def go():
        async with trio.open_nursery() as nursery:
            await _connected(pc, nursery)
            d, _, parent = await calls.run(client.requests.mkdir(ROOT_INO, b"d", 0o755))
            assert parent.ino == ROOT_INO
            f, _, parent = await calls.run(client.requests.create(d.ino, b"f.tmp", 0o644))
            assert parent.ino == d.ino
            assert (await calls.run(client.requests.lookup(d.ino, b"f.tmp")))[0].ino == f.ino
            assert await calls.run(client.requests.lookup(d.ino, b"missing")) == (None, 0)
            # AddBlock from a writer's thread: no worker registered here (UNAVAILABLE goes
            # unary, which retries it for the client's wait, 2 s here)
            with pytest.raises(CurvineError) as e:
                await trio.to_thread.run_sync(calls.from_thread,
                                              client.requests.add_block(f.ino, "h", 0))
            assert e.value.kind == ErrorKind.UNAVAILABLE
            node = await calls.run(client.requests.complete(f.ino, [], 0, 0, True))
            assert node.version == 1
            inode, blocks, _ = await calls.run(client.requests.get_blocks(f.ino))
            assert inode.version == 1 and blocks == []
            _, _, moved, _ = await calls.run(client.requests.rename(d.ino, b"f.tmp", d.ino,
                                                                    b"f.data"))
            assert moved.ino == f.ino
            entries, more = await calls.run(client.requests.listdir(d.ino))
            assert [e.name for e in entries] == [b"f.data"] and not more
            await calls.run(client.requests.set_xattr(f.ino, b"user.k", b"v"))
            assert await calls.run(client.requests.get_xattr(f.ino, b"user.k")) == b"v"
            assert await calls.run(client.requests.list_xattr(f.ino)) == [b"user.k"]
            assert (await calls.run(client.requests.statfs())).files >= 3
            # errors come back by kind, from the loop and from a thread
            with pytest.raises(CurvineError) as e:
                await calls.run(client.requests.create(d.ino, b"f.data", 0o644, 0, 0, True))
            assert e.value.kind == ErrorKind.EXISTS
            with pytest.raises(CurvineError) as e:
                await trio.to_thread.run_sync(calls.from_thread,
                                              client.requests.getattr(999_999))
            assert e.value.kind == ErrorKind.NOT_FOUND
            assert (await trio.to_thread.run_sync(
                calls.from_thread, client.requests.getattr(f.ino)))[0].ino == f.ino
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
    pc = TrioCallPort("127.0.0.1", port.port, TOKEN, timeout=20)
    calls = Calls(client, _to_thread, port=pc)
    names = [b"n%04d-" % i + b"x" * 200 for i in range(600)]

    async def go():
        async with trio.open_nursery() as nursery:
            await _connected(pc, nursery)
            d, _, _ = await calls.run(client.requests.mkdir(ROOT_INO, b"many", 0o755))
            created = {}

            async def make(name):
                f, _, _ = await calls.run(client.requests.create(d.ino, name, 0o644))
                created[name] = f.ino

            async with trio.open_nursery() as inner:
                for name in names[:300]:
                    inner.start_soon(make, name)
            looked = {}

            def look(name):
                looked[name] = calls.from_thread(client.requests.lookup(d.ino, name))[0].ino

            async with trio.open_nursery() as inner:
                for name in names[:300]:
                    inner.start_soon(trio.to_thread.run_sync, look, name)
            assert looked == created
            misses = [await calls.run(client.requests.lookup(d.ino, n)) for n in names[300:]]
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
    pc = TrioCallPort("127.0.0.1", port.port, "wrong", timeout=10)

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
    pc = TrioCallPort("127.0.0.1", port.port, TOKEN, timeout=10)
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
                results.append(await calls.run(client.requests.create(ROOT_INO, b"once", 0o644)))

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
        trio.run(pc.call, client.requests.getattr(ROOT_INO))


def test_the_master_closing_the_port_leaves_the_mount_working(served):
    """The master side goes (a master stopping or killed): the client's task survives,
    calls go unary meanwhile, and it reconnects once a port is back on that port."""
    m, client, _, start_port = served
    port = start_port()
    number = port.port
    pc = TrioCallPort("127.0.0.1", number, TOKEN, timeout=10)
    calls = Calls(client, _to_thread, port=pc)

    async def go():
        async with trio.open_nursery() as nursery:
            await _connected(pc, nursery)
            assert (await calls.run(client.requests.getattr(ROOT_INO)))[0].ino == ROOT_INO
            await trio.to_thread.run_sync(port.stop)
            with trio.fail_after(10):
                while pc._sock is not None:  # the client notices
                    await trio.sleep(0.02)
            # meanwhile: unary, same answers
            assert (await calls.run(client.requests.getattr(ROOT_INO)))[0].ino == ROOT_INO
            pc.connected = trio.Event()
            again = await trio.to_thread.run_sync(
                lambda: CallPort(port._run_call, READ_CALLS, port._pool, "127.0.0.1",
                                 number, tokens=(TOKEN,), mutations=port._make_mutations))
            await trio.to_thread.run_sync(again.start)
            try:
                with trio.fail_after(20):
                    await pc.connected.wait()
                assert (await calls.run(client.requests.getattr(ROOT_INO)))[0].ino == ROOT_INO
            finally:
                await trio.to_thread.run_sync(again.stop)
            nursery.cancel_scope.cancel()

    trio.run(go)


# -- the blocking client (client/master/call_port_blocking.py) of MasterClient(call_port=True) --------------

def _port_client(servicer, port: CallPort, token: str = TOKEN, **kw) -> MasterClient:
    """A path client whose master advertises ``port`` (StatFs) and whose token is ``token``."""
    servicer.m.call_port_server = port
    sec = Security(client_token=token)
    return MasterClient(servicer.m_address, timeout=kw.get("timeout", 10), wait=2,
                        security=sec, call_port=True)


@pytest.fixture
def served_addr(served):
    m, client, servicer, start_port = served
    servicer.m_address = client.address
    return served


def test_a_path_client_sends_its_namespace_calls_on_the_port(served_addr):
    """Every namespace call of MasterClient (the connector's lookup_many, put_file and
    add_block_for_put too) goes on the port and answers as the unary RPC does."""
    m, unary, servicer, start_port = served_addr
    port = start_port()
    mc = _port_client(servicer, port)
    try:
        d = mc.mkdir(ROOT_INO, b"cp")
        f = mc.create(d.ino, b"a.tmp")
        mc.complete_file(f.ino, [], 0)
        mc.rename(d.ino, b"a.tmp", d.ino, b"a.data")
        assert mc.lookup_or_none(d.ino, b"a.data").ino == f.ino
        assert mc.lookup_or_none(d.ino, b"nope") is None
        many = mc.lookup_many(d.ino, [b"a.data", b"nope"])
        assert [r.HasField("inode") for r in many.results] == [True, False]
        assert unary.lookup_many(d.ino, [b"a.data", b"nope"]) == many
        node, existed = mc.put_file(d.ino, b"b.data", [], 0)
        assert not existed and unary.lookup(d.ino, b"b.data").ino == node.ino
        assert mc.add_block_for_put(d.ino, b"b.data", "host").existing.ino == node.ino
        with pytest.raises(CurvineError) as e:
            mc.create(d.ino, b"a.data", exclusive=True)
        assert e.value.kind == ErrorKind.EXISTS
        assert [e.name for e in mc.iterdir(d.ino)] == [b"a.data", b"b.data"]
        port_client = mc.route.thread_port
        assert port_client is not None and port_client.calls == 11  # every call above
        assert port.calls == 11
    finally:
        mc.close()


def test_a_path_client_without_a_usable_port_calls_unary(served_addr):
    """No port advertised, a wrong token, or the port gone under a pooled connection:
    every call still gets its answer, as a unary RPC (same request id)."""
    m, unary, servicer, start_port = served_addr
    d = unary.mkdir(ROOT_INO, b"fallback")
    mc = MasterClient(unary.address, timeout=10, wait=2, security=NO_SECURITY, call_port=True)
    assert mc.lookup_or_none(d.ino, b"x") is None
    assert mc.route.thread_port is None  # StatFs: no port
    mc.close()

    port = start_port()
    wrong = _port_client(servicer, port, token="wrong")
    assert wrong.create(d.ino, b"w").ino and wrong.lookup_or_none(d.ino, b"w") is not None
    assert wrong.route.thread_port._refused and port.calls == 0
    wrong.close()

    mc = _port_client(servicer, port)
    try:
        assert mc.lookup_or_none(d.ino, b"w") is not None and port.calls == 1
        port.stop()  # the master closes the port and its connections
        created = mc.create(d.ino, b"after")  # the pooled connection fails: unary
        assert unary.lookup(d.ino, b"after").ino == created.ino
        assert mc.route.thread_port.calls == 1
    finally:
        mc.close()


def test_a_path_client_calls_from_many_threads(served_addr):
    """Threads share a few pooled connections (at most max_connections); past that a
    call goes unary; every call gets its own answer."""
    m, unary, servicer, start_port = served_addr
    port = start_port()
    mc = _port_client(servicer, port)
    d = unary.mkdir(ROOT_INO, b"threads")
    made = {b"f%d" % i: unary.create(d.ino, b"f%d" % i).ino for i in range(50)}
    errors, answers = [], []

    def work(t: int) -> None:
        try:
            for i in range(100):
                name = b"f%d" % ((t * 7 + i) % 100)
                node = mc.lookup_or_none(d.ino, name)
                answers.append((name, node.ino if node else None))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        assert len(answers) == 1200 and all(made.get(n) == ino for n, ino in answers)
        port_client = mc.route.thread_port
        assert 0 < port_client.calls <= 1200 and port_client._open <= port_client.max_connections
        assert port.calls == port_client.calls
    finally:
        mc.close()


def test_a_path_client_call_the_master_does_not_answer_times_out(served_addr):
    """A call port that takes the hello and then never answers: the call ends with
    TIMEOUT at its deadline (not a hang), as a gRPC deadline would."""
    m, unary, servicer, start_port = served_addr
    with _silent_port(token=b"") as number:

        class Fixed:
            port = number

        mc = _port_client(servicer, Fixed, token="")
        try:
            t0 = time.monotonic()
            with pytest.raises(CurvineError) as e:
                mc.lookup_many(ROOT_INO, [b"x"], timeout=1.0)
            assert e.value.kind == ErrorKind.TIMEOUT
            assert time.monotonic() - t0 < 5
        finally:
            mc.close()


@contextlib.contextmanager
def _silent_port(token: bytes):
    """A call port (its number) that takes one client's hello with ``token``, accepts
    it and then never answers."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    held = []

    def accept():
        conn, _ = silent.accept()
        held.append(conn)
        _recv(conn, HELLO.size + len(token))
        conn.sendall(ANSWER.pack(MAGIC, 0))

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield silent.getsockname()[1]
    finally:
        for c in held:
            c.close()
        silent.close()


def test_add_block_is_answered_in_the_loop_unless_it_must_wait(served):
    """AddBlock on the port: answered in the loop thread while the pool is busy; one
    that needs a journal record for its block id (or finds no worker) goes to the pool
    and is answered there, the same as the unary RPC."""
    m, client, servicer, _ = served
    wid = m.register_worker(common_pb2.WorkerInfo(
        uuid="w1", host_id="h1", address="127.0.0.1:1", data_dirs=["/d"],
        capacity=1 << 40)).worker_id
    m.heartbeat(master_pb2.HeartbeatRequest(worker_id=wid, capacity=1 << 40, used=0))
    f = client.create(ROOT_INO, b"blocks")
    client.add_block(f.ino, "h1")  # the first id reserves a chunk of them (a record)
    gate = threading.Event()
    pool = futures.ThreadPoolExecutor(1)
    pool.submit(gate.wait, 30)  # the pool's one thread is taken
    port = CallPort(servicer.run_call, READ_CALLS, pool, "127.0.0.1", 0, tokens=(TOKEN,),
                    mutations=servicer.mutations, run_nowait=servicer.run_call_nowait)
    port.start()
    bp = BlockingCallPort("127.0.0.1", port.port, TOKEN, timeout=5)
    req = master_pb2.AddBlockRequest(ino=f.ino, client_host_id="h1")
    try:
        first = bp.call("add_block", req)
        assert [w.worker_id for w in first.workers] == [wid] and first.block_token
        # the reserved ids are used up: this one waits for a journal record, in the pool
        m._next_block = m._reserved
        got = []
        t = threading.Thread(target=lambda: got.append(bp.call("add_block", req)))
        t.start()
        t.join(0.5)
        assert t.is_alive() and not got  # the pool is busy: not answered in the loop
        gate.set()
        t.join(10)
        assert got and got[0].block_id > first.block_id
        assert bp.call("add_block", req).block_id == got[0].block_id + 1  # the loop again
    finally:
        gate.set()
        bp.close()
        port.stop()
        pool.shutdown()


def test_a_mount_call_the_master_does_not_answer_times_out(served):
    """The mount's client on a port that takes the hello and then never answers: a
    call from the loop and one from a thread each end with TIMEOUT soon after their
    deadline (the expiry check), not a hang; the connection stays up for others."""
    m, client, _, _ = served
    prepared = client.requests.getattr(ROOT_INO)
    took = []

    async def go(number):
        pc = TrioCallPort("127.0.0.1", number, TOKEN, timeout=1.0)
        async with trio.open_nursery() as nursery:
            await _connected(pc, nursery)
            for call in (lambda: pc.call(prepared),
                         lambda: trio.to_thread.run_sync(pc.call_blocking, prepared)):
                t0 = time.monotonic()
                with pytest.raises(CurvineError) as e:
                    with trio.fail_after(10):
                        await call()
                assert e.value.kind == ErrorKind.TIMEOUT
                assert "GetAttr" in str(e.value)
                took.append(time.monotonic() - t0)
            assert pc._sock is not None and not pc._pending
            nursery.cancel_scope.cancel()

    with _silent_port(TOKEN.encode()) as number:
        trio.run(go, number)
    assert all(0.9 <= s < 3.0 for s in took), took


def test_a_mounts_thread_calls_use_their_own_connections(served):
    """Calls.from_thread (a writer publishing at close) goes on the blocking client's
    connections when the mount has one, without the trio loop; with the port gone it
    still gets its answer (the trio client, then unary)."""
    m, client, _, start_port = served
    port = start_port()
    bp = BlockingCallPort("127.0.0.1", port.port, TOKEN, timeout=10)
    pc = TrioCallPort("127.0.0.1", port.port, TOKEN, timeout=10)  # never connected
    calls = Calls(client, _to_thread, port=pc, thread_port=bp)
    try:
        f, _, _ = calls.from_thread(client.requests.create(ROOT_INO, b"from-thread", 0o644))
        assert calls.from_thread(client.requests.getattr(f.ino))[0].ino == f.ino
        assert bp.calls == 2 and port.calls == 2
        port.stop()
        assert calls.from_thread(client.requests.getattr(f.ino))[0].ino == f.ino  # unary
        assert bp.calls == 2
    finally:
        bp.close()


def test_a_mutation_on_the_port_waits_for_the_revocation_it_needs(served):
    """The port runs mutations as steps (master/meta/steps.py): a rename whose source name
    another session holds a lease on is answered only once that session acked the
    invalidation; meanwhile the port answers other calls (no thread of it waits)."""
    m, _, _, start_port = served
    port = start_port()
    holder = m.leases.open_session("holder")
    f = m.create(master_pb2.CreateRequest(request_id=b"c" * 16, parent=ROOT_INO,
                                          name=b"k.tmp", mode=0o644)).inode
    leased = m.lookup_reply(master_pb2.LookupRequest(parent=ROOT_INO, name=b"k.tmp",
                                                     miss_ok=True, session=holder.id))
    assert leased.lease_ms > 0
    bp = BlockingCallPort("127.0.0.1", port.port, TOKEN, timeout=20)
    other = BlockingCallPort("127.0.0.1", port.port, TOKEN, timeout=20)
    answered = threading.Event()

    def rename():
        bp.call("rename", master_pb2.RenameRequest(
            request_id=b"r" * 16, parent=ROOT_INO, name=b"k.tmp", new_parent=ROOT_INO,
            new_name=b"k.data"))
        answered.set()

    t = threading.Thread(target=rename)
    t.start()
    try:
        event = holder.events.get(timeout=10)  # the invalidation, sent after the commit
        assert [(k.parent, k.name) for k in event.names] == [(ROOT_INO, b"k.tmp")]
        assert not answered.wait(0.5)  # held back until the holder acks
        # the port goes on answering: a read and another mutation
        got = other.call("lookup", master_pb2.LookupRequest(parent=ROOT_INO, name=b"k.data"))
        assert got.inode.ino == f.ino  # committed, durable, only not yet acknowledged
        other.call("mkdir", master_pb2.MkdirRequest(request_id=b"m" * 16, parent=ROOT_INO,
                                                    name=b"d", mode=0o755))
        assert not answered.is_set()
        holder.ack(event.invalidate_id)
        assert answered.wait(10)
    finally:
        holder.ack(1 << 30)
        t.join(20)
        bp.close()
        other.close()


def test_a_mount_logs_one_outage_of_its_call_port_not_each_reconnect(served, caplog):
    """The mount replaces its TrioCallPort each time its calls move to another master
    (an election: dead leader, standbys, the next leader).  One Outage per mount keeps
    the INFO lines to the first connection, the loss that starts the outage and the
    first call answered after it; every reconnect and move in between is DEBUG.
    (Before, each port's first connection or refusal was an INFO line: six here.)"""
    import logging
    m, client, _, start_port = served
    first, standby, leader = start_port(), start_port(), start_port()
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: connections refused
    outage = Outage()
    ok = client.requests.getattr(ROOT_INO)
    missing = client.requests.getattr(999_999)  # an answer, but an error

    async def visit(number: int, call=None, stay: float = 0.0) -> None:
        pc = TrioCallPort("127.0.0.1", number, TOKEN, timeout=10, outage=outage)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pc.run)
            if call is not None:
                with trio.fail_after(10):
                    await pc.connected.wait()
                try:
                    await pc.call(call)
                except CurvineError:
                    pass
            await trio.sleep(stay)
            nursery.cancel_scope.cancel()
        pc.stop()

    async def go() -> None:
        pc = TrioCallPort("127.0.0.1", first.port, TOKEN, timeout=10, outage=outage)
        async with trio.open_nursery() as nursery:
            await _connected(pc, nursery)
            await pc.call(ok)
            await trio.to_thread.run_sync(first.stop)  # the leader dies
            await trio.sleep(1.0)  # its reconnects fail
            nursery.cancel_scope.cancel()
        pc.stop()
        for _ in range(2):  # the calls move on: refused, then a standby's errors
            outage.moved()
            await visit(dead.getsockname()[1], stay=0.4)
            outage.moved()
            await visit(standby.port, call=missing)
        outage.moved()
        await visit(leader.port, call=ok)  # the new leader answers

    logger = "curvine.fuse_client.call_port_trio"
    with caplog.at_level(logging.DEBUG, logger=logger):
        trio.run(go)
    dead.close()
    records = [r for r in caplog.records if r.name == logger]
    info = [r.getMessage() for r in records if r.levelno >= logging.INFO]
    assert len(info) == 3, info
    assert info[0] == f"namespace calls on the master's call port 127.0.0.1:{first.port}"
    assert info[1].startswith(f"call port 127.0.0.1:{first.port}: "), info
    assert info[2].startswith(f"namespace calls on the master's call port "
                              f"127.0.0.1:{leader.port} again (after "), info
    assert len([r for r in records if r.levelno == logging.DEBUG]) >= 6
    assert outage.since == 0.0


# -- answers handed to the loop (common/loop_inbox.py) ----------------------------------------

def test_answers_handed_to_the_loop_share_its_wake_ups_and_keep_their_order(caplog):
    """Other threads (the committer, a standby's read index) answer a batch at once:
    every answer runs in the loop, each thread's in the order posted, with fewer loop
    wake-ups than answers; one that raises is logged and the rest still run; once the
    loop is closed a post is dropped, not raised."""
    import asyncio
    from curvine.common.loop_inbox import LoopInbox

    loop = asyncio.new_event_loop()
    wakeups = [0]

    def call_soon_threadsafe(fn, *args):
        wakeups[0] += 1
        return loop.call_soon_threadsafe(fn, *args)

    inbox = LoopInbox(call_soon_threadsafe, "a test answer")
    ran: dict[int, list[int]] = {t: [] for t in range(4)}
    in_loop: list[bool] = []
    loop_thread = threading.Thread(target=loop.run_forever)
    loop_thread.start()

    def note(t: int, i: int) -> None:
        in_loop.append(threading.current_thread() is loop_thread)
        ran[t].append(i)

    def producer(t: int) -> None:
        for i in range(2000):
            inbox.post(note, t, i)
            if i == 1000:
                inbox.post(lambda: 1 / 0)  # a bug in one answer

    threads = [threading.Thread(target=producer, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    done = threading.Event()
    inbox.post(done.set)
    assert done.wait(10)
    loop.call_soon_threadsafe(loop.stop)
    loop_thread.join(10)
    assert all(ran[t] == list(range(2000)) for t in range(4))
    assert all(in_loop) and len(in_loop) == 8000
    assert wakeups[0] < 8000 + 4 + 1, wakeups[0]  # shared: fewer than one per answer
    assert caplog.text.count("a test answer handed to the loop failed") == 4
    loop.close()
    inbox.post(note, 0, -1)  # closed: dropped, nothing raised
    assert ran[0][-1] == 1999
