"""The limits of issue 32 that need no daemon (docs/security.md, "Limits"), against an
in-process master, its call port and the HTTP endpoint: how a LookupMany reply is cut
and resumed, reads too big for the call port's loop answered by the heavy-read
threads, garbage frames counted and logged once, a gRPC connection's age cutting a
message that never finishes arriving, and the HTTP port's share per peer.
(tests/test_port_limits.py has the same limits at work in real daemons.)"""

from __future__ import annotations

import logging
import socket
import threading
import time

import grpc
import pytest

from curvine.common import metrics, rpc
from curvine.common.call_wire import ANSWER, FRAME, hello
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO, new_request_id
from curvine.common.security import NO_SECURITY
from curvine.master import master as master_mod
from curvine.master.ports.call_port_server import CallPort
from curvine.master.ports.service import READ_CALLS, MasterServicer
from curvine.proto import common_pb2, master_pb2

from tcp_proxy import TcpProxy
from test_master import MiB, make_master, mkdir

CUT = metrics.CONNECTIONS_CUT
LIMITED = metrics.REQUESTS_LIMITED


def _value(counter, *labels) -> float:
    return counter.labels(*labels)._value.get()


@pytest.fixture
def master(tmp_path):
    m = make_master(tmp_path)
    yield m
    m.close()


def _put(m, parent: int, name: bytes, blocks) -> common_pb2.Inode:
    return m.put_file(master_pb2.PutFileRequest(
        request_id=new_request_id(), parent=parent, name=name, mode=0o644, blocks=blocks,
        size=sum(b.length for b in blocks))).inode


def _lookup(m, parent: int, names, **kw) -> master_pb2.LookupManyReply:
    return m.lookup_many(master_pb2.LookupManyRequest(parent=parent, names=names,
                                                      with_blocks=True), **kw)


# -- LookupMany ---------------------------------------------------------------------------

def test_a_lookup_many_reply_ends_at_its_budget_and_the_rest_is_asked_again(master):
    """1,024 repeats of a 256 KiB inline file: the reply answers the first names up to
    master.lookup_reply_max (4 MiB at the defaults), the caller asks again from the
    first name left out, and every page is as small (before: one reply of ~268 MB)."""
    m = master
    assert m.lookup_reply_max == 4 * MiB
    d = mkdir(m, ROOT_INO, b"l2")
    data = bytes(range(256)) * 1024
    _put(m, d.ino, b"chunk", [common_pb2.Block(block_id=0, length=len(data), data=data)])
    names = [b"chunk"] * 1024
    before = _value(LIMITED, "LookupMany", "reply_bytes")
    got = []
    pages = 0
    while len(got) < len(names):
        reply = _lookup(m, d.ino, names[len(got):])
        assert reply.ByteSize() <= m.lookup_reply_max + (300 << 10)
        assert reply.results, "a reply answers its first name at least"
        got += reply.results
        pages += 1
    assert pages == -(-1024 // 15)  # 15 results of ~262 KB fit in 4 MiB
    assert all(r.blocks[0].data == data for r in got)
    assert _value(LIMITED, "LookupMany", "reply_bytes") - before == pages - 1


def test_block_limits_of_a_lookup_many(master):
    """A result carries at most LOOKUP_FILE_BLOCKS (1,024) blocks: a file with more is
    INVALID naming it when it is the first name (read it with GetBlocks), and ends the
    reply before it otherwise; a reply carries at most LOOKUP_REPLY_BLOCKS (16,384); at
    most MAX_LOOKUP_MANY (4,096) names.  Holes count as blocks."""
    m = master
    d = mkdir(m, ROOT_INO, b"sparse")
    hole = common_pb2.Block(block_id=0, length=4 * MiB)
    _put(m, d.ino, b"big", [hole] * (1024 + 1))
    _put(m, d.ino, b"k", [hole] * 1024)
    _put(m, d.ino, b"small", [hole])
    with pytest.raises(CurvineError) as e:
        _lookup(m, d.ino, [b"big", b"small"])
    assert e.value.kind == ErrorKind.INVALID and e.value.message.startswith("names[0]")
    reply = _lookup(m, d.ino, [b"small", b"missing", b"big", b"small"])
    assert len(reply.results) == 2 and not reply.results[1].HasField("inode")
    # 16 files of 1,024 blocks fill a reply: the 17th is left for the next
    reply = _lookup(m, d.ino, [b"k"] * 17)
    assert len(reply.results) == 16
    with pytest.raises(CurvineError) as e:
        _lookup(m, d.ino, [b"small"] * (4096 + 1))
    assert e.value.kind == ErrorKind.INVALID and e.value.message.startswith("names")


def test_the_cheap_form_of_a_read_refuses_rather_than_costs(master):
    """What the call port's loop may answer (``light``): at most LIGHT_NAMES (128)
    names, files of at most LIGHT_BLOCK_BYTES (8 KiB) of stored blocks; more is
    WouldBlock, before the work, and the same read in full gives the answer."""
    m = master
    d = mkdir(m, ROOT_INO, b"d")
    hole = common_pb2.Block(block_id=0, length=4 * MiB)
    # 1,000 holes with a checksum each: ~13 KB stored (light: at most 8 KiB)
    node = _put(m, d.ino, b"holes", [common_pb2.Block(block_id=0, length=4 * MiB,
                                                      checksum=0xFFFFFFFF)] * 1000)
    _put(m, d.ino, b"one", [hole])
    with pytest.raises(master_mod.WouldBlock):
        _lookup(m, d.ino, [b"one"] * (128 + 1), light=True)
    with pytest.raises(master_mod.WouldBlock):
        _lookup(m, d.ino, [b"holes"], light=True)
    with pytest.raises(master_mod.WouldBlock):
        m.get_blocks(node.ino, light=True)
    assert len(_lookup(m, d.ino, [b"one"] * 10, light=True).results) == 10
    assert len(m.get_blocks(node.ino).blocks) == 1000
    assert len(_lookup(m, d.ino, [b"holes"]).results[0].blocks) == 1000


# -- the call port ---------------------------------------------------------------------------

@pytest.fixture
def plain_port(master):
    """A call port on ``master`` with its defaults (no heavy-read threads of its own)."""
    servicer = MasterServicer(master, call_threads=4)
    p = CallPort(servicer.run_call, READ_CALLS, servicer.call_pool, "127.0.0.1", 0,
                 mutations=servicer.mutations, run_nowait=servicer.run_call_nowait)
    p.start()
    yield p
    p.stop()
    servicer.close()


@pytest.fixture
def port(master):
    """A call port on ``master`` wired as master/server.py wires it."""
    from curvine.master.ports.service import HEAVY_READS
    servicer = MasterServicer(master, call_threads=4)
    p = CallPort(servicer.run_call, READ_CALLS, servicer.call_pool, "127.0.0.1", 0,
                 mutations=servicer.mutations, run_nowait=servicer.run_call_nowait,
                 heavy=(servicer.heavy_pool, servicer.run_heavy, HEAVY_READS))
    p.start()
    yield p
    p.stop()
    servicer.close()


def _connect(port: CallPort, src: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    s.settimeout(10)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port.port))
    s.sendall(hello(b""))
    assert s.recv(ANSWER.size)[4] == 0
    return s


def _call(s: socket.socket, call: master_pb2.Call) -> None:
    data = call.SerializeToString()
    s.sendall(FRAME.pack(len(data)) + data)


def _result(s: socket.socket) -> master_pb2.CallResult:
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            assert chunk, "closed"
            buf += chunk
        return buf
    (n,) = FRAME.unpack(exact(FRAME.size))
    return master_pb2.CallResult.FromString(exact(n))


def test_heavy_reads_leave_the_loop_one_at_a_time_per_connection(master, port):
    """GetBlocks of a file of 20,000 blocks and a LookupMany of 300 names are answered
    by the heavy-read thread, not the loop (the loop meanwhile answers another
    connection at once); a connection's heavy reads are answered one after another."""
    m = master
    d = mkdir(m, ROOT_INO, b"d")
    hole = common_pb2.Block(block_id=0, length=4 * MiB)
    node = _put(m, d.ino, b"holes", [hole] * 20000)
    s, other = _connect(port), _connect(port)
    loop_thread = port._thread.ident
    ran_in: list[int] = []
    real = port._run_heavy

    def spy(call):
        ran_in.append(threading.get_ident())
        time.sleep(0.2)  # long enough for the other connection to be answered meanwhile
        return real(call)

    port._run_heavy = spy
    _call(s, master_pb2.Call(id=1, get_blocks=master_pb2.GetBlocksRequest(ino=node.ino)))
    _call(s, master_pb2.Call(id=2, lookup_many=master_pb2.LookupManyRequest(
        parent=d.ino, names=[b"holes"] * 300)))
    t0 = time.monotonic()
    _call(other, master_pb2.Call(id=9, getattr=master_pb2.GetAttrRequest(ino=ROOT_INO)))
    assert _result(other).HasField("inode") and time.monotonic() - t0 < 0.15
    first, second = _result(s), _result(s)
    assert (first.id, second.id) == (1, 2)
    assert len(first.blocks.blocks) == 20000 and len(second.lookup_many.results) == 300
    assert len(ran_in) == 2 and loop_thread not in ran_in
    s.close()
    other.close()


def test_heavy_reads_take_turns_by_peer(master, port):
    """One peer's queue of heavy reads does not keep another peer's out: the heavy-read
    thread serves the waiting peers in turn."""
    m = master
    d = mkdir(m, ROOT_INO, b"d")
    node = _put(m, d.ino, b"holes", [common_pb2.Block(block_id=0, length=4 * MiB)] * 2000)
    order: list[str] = []
    gate = threading.Event()
    real = port._run_heavy

    def spy(call):
        gate.wait(10)
        order.append("a" if call.id < 100 else "b")
        return real(call)

    port._run_heavy = spy
    greedy = [_connect(port, "127.0.0.2") for _ in range(4)]
    for i, s in enumerate(greedy):
        _call(s, master_pb2.Call(id=i, get_blocks=master_pb2.GetBlocksRequest(ino=node.ino)))
    time.sleep(0.3)
    late = _connect(port, "127.0.0.3")
    _call(late, master_pb2.Call(id=100, get_blocks=master_pb2.GetBlocksRequest(ino=node.ino)))
    time.sleep(0.3)
    gate.set()
    assert _result(late).id == 100
    for s in greedy:
        assert _result(s).HasField("blocks")
        s.close()
    late.close()
    # the first in flight, then each waiting peer in turn: 'b' before the greedy
    # peer's other two
    assert order.index("b") <= 2, order


def test_garbage_frames_are_counted_and_logged_once(plain_port, caplog):
    """Before: every frame that did not parse logged a full traceback.  Now each
    closes its connection, is counted, and the port logs one line per QuietLog
    interval (10 s) for all of them."""
    before = _value(CUT, "call_port", "garbage")
    caplog.set_level(logging.INFO, logger="curvine.master.ports.call_port_server")
    for _ in range(30):
        s = _connect(plain_port)
        s.sendall(FRAME.pack(8) + b"\xff" * 8)
        assert s.recv(1) == b""  # closed
        s.close()
    assert _value(CUT, "call_port", "garbage") - before == 30
    records = [r for r in caplog.records if r.name == "curvine.master.ports.call_port_server"]
    assert len(records) == 1 and records[0].exc_info is None, [r.getMessage() for r in records]
    assert "not a master.Call" in records[0].getMessage()


def test_a_partial_frame_is_cut_after_its_deadline(plain_port):
    """A frame whose bytes stop coming is cut call_frame_timeout (10 s by default)
    after its first byte, even while its sender trickles a byte per second."""
    before = _value(CUT, "call_port", "partial_frame")
    s = _connect(plain_port)
    s.sendall(FRAME.pack(1000) + b"\0" * 10)
    t0 = time.monotonic()
    s.settimeout(0.2)
    closed = None
    while time.monotonic() - t0 < 15:
        try:
            s.send(b"\0")
            if s.recv(1) == b"":
                closed = time.monotonic() - t0
                break
        except socket.timeout:
            continue
        except OSError:
            closed = time.monotonic() - t0
            break
        time.sleep(0.8)
    s.close()
    assert closed is not None and 9.5 <= closed <= 12.5, closed
    assert _value(CUT, "call_port", "partial_frame") - before == 1


# -- gRPC -----------------------------------------------------------------------------------

def test_a_grpc_connection_is_closed_at_its_age_with_a_partial_message(monkeypatch):
    """gRPC buffers a message that never finishes arriving for as long as its
    connection lives: max_connection_age (+ grace) is what ends it.  The defaults (10
    min + 60 s) are too long for a test: shortened here to 3 + 2 s (before: no age,
    held until the test gave up)."""
    defaults = dict(rpc.SERVER_OPTIONS)
    assert (defaults["grpc.max_connection_age_ms"], defaults["grpc.max_connection_age_grace_ms"],
            defaults["grpc.max_connection_idle_ms"]) == (600_000, 60_000, 30_000)
    monkeypatch.setattr(rpc, "SERVER_OPTIONS", [
        (k, {"grpc.max_connection_age_ms": 3000, "grpc.max_connection_age_grace_ms": 2000}
         .get(k, v)) for k, v in rpc.SERVER_OPTIONS])
    handler = grpc.method_handlers_generic_handler("t.T", {
        "Echo": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"ok")})
    server = rpc.make_server(4, security=NO_SECURITY)
    server.add_generic_rpc_handlers((handler,))
    port = rpc.bind(server, "127.0.0.1", 0, NO_SECURITY)
    server.start()
    # passes the first 4 MiB of the client's bytes, then swallows the rest
    proxy = TcpProxy(f"127.0.0.1:{port}", limit=4 * MiB)
    channel = grpc.insecure_channel(proxy.address,
                                    options=[("grpc.max_send_message_length", 64 * MiB)])
    t0 = time.monotonic()
    future = channel.unary_unary("/t.T/Echo").future(b"x" * (8 * MiB), timeout=30)
    assert proxy.closed.wait(15), "the server kept the connection of a partial message"
    took = time.monotonic() - t0
    assert 2.5 <= took <= 8, took
    with pytest.raises(grpc.RpcError):
        future.result(timeout=10)
    channel.close()
    server.stop(0)
    proxy.close()


# -- HTTP -----------------------------------------------------------------------------------

def test_the_http_port_keeps_a_peer_to_its_share():
    """At most HTTP_MAX_PER_PEER (64) connections of one address wait for their request:
    one more closes that address's oldest (counted), so a prompt client behind the same
    address is still served, and so is another address.  Before: 256 of one address."""
    server = metrics.MetricsServer("127.0.0.1", 0, metrics.registry(), lambda: None, "test")
    server.start()
    port = server.port
    before = _value(CUT, "http", "per_peer")
    held = []
    try:
        for _ in range(64):  # HTTP_MAX_PER_PEER
            held.append(socket.create_connection(("127.0.0.1", port)))
        time.sleep(0.5)
        prompt = socket.create_connection(("127.0.0.1", port))
        prompt.settimeout(5)
        time.sleep(0.5)
        held[0].settimeout(3)
        assert held[0].recv(1) == b"", "the address's oldest connection stays"
        prompt.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 200 " in prompt.recv(200)
        prompt.close()
        other = socket.socket()
        other.bind(("127.0.0.2", 0))
        other.connect(("127.0.0.1", port))
        other.settimeout(5)
        other.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 200 " in other.recv(200)
        other.close()
    finally:
        for s in held:
            s.close()
        server.close()
    assert _value(CUT, "http", "per_peer") - before == 1
