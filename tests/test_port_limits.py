"""What one client's requests may cost the master and the workers (issue 32 items 1, 2
and the ports of 7; docs/security.md, "Limits"), against real daemons at the default
settings, on loopback.  A client with the client token:

- repeats one 256 KiB inline file in a LookupMany: the reply is cut at
  master.lookup_reply_max (4 MiB) and the rest asked again, on the call port and on
  gRPC alike (before: a reply of every repeat, ~268 MB for 1,024, and the master's
  memory with it);
- asks for a file of 65,536 hole blocks (GetBlocks, LookupMany x200): another client's
  calls on the call port are still answered within milliseconds (before: the loop
  thread built each reply, seconds per call);
- announces frames and sends part of them: a frame over master.client_message_max is
  refused at once, a partial frame is cut master.call_frame_timeout (10 s) after its
  first byte, and frames arriving share master.call_port_buffer (64 MiB) (before: 16
  x 60 MiB held for good); on gRPC a message over the limit is refused from its
  length prefix;
- leaves connections idle: every port closes them after its idle timeout (60 s; the
  HTTP port 10 s) (before: the call port and gRPC never did);
- opens many connections from one address: each port keeps the peer to its share;
- trickles request bytes to the data port and the domain socket: cut 10 s after the
  first byte, so an honest reader gets a slot (before: 64 tricklers held every slot).

The master's memory is read from /proc/<pid>/status (VmHWM, the peak).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import grpc
import pytest

from cluster_util import daemon_metric, wait_for
from tcp_proxy import TcpProxy
from curvine.client.master.master_client import MasterClient
from curvine.common import config as config_mod, local_wire
from curvine.common.call_wire import ANSWER, FRAME, hello
from curvine.common.errors import ErrorKind
from curvine.common.ids import ROOT_INO
from curvine.common.rpc import make_channel
from curvine.proto import common_pb2, master_pb2, master_pb2_grpc, worker_pb2

MiB = 1 << 20
CUT = "curvine_connections_cut_total"


# -- helpers ----------------------------------------------------------------------------

def _pid(cluster, role: str = "master", index: int = 0) -> int:
    return next(r["pid"] for r in cluster.status() if r["role"] == role and r["index"] == index)


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _peak_mb(pid: int) -> float:
    return _status_kb(pid, "VmHWM") / 1024


def _conf(cluster, role: str, index: int = 0) -> config_mod.Config:
    return config_mod.load(os.path.join(cluster.base, "conf", f"{role}-{index}.toml"))


def _token(cluster) -> bytes:
    with open(cluster.token_file, "rb") as f:
        return f.read().strip()


def _http_port(cluster, role: str, index: int = 0) -> int:
    url = next(r["metrics"] for r in cluster.status() if r["role"] == role and r["index"] == index)
    return int(url.rsplit(":", 1)[1].split("/")[0])


def _connect(port: int, src: str = "127.0.0.1", timeout: float = 10.0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


def _call_port(cluster, src: str = "127.0.0.1", accepted: bool = True) -> socket.socket:
    """A connection to the master's call port with its hello answered (accepted)."""
    s = _connect(_conf(cluster, "master").master.call_port, src)
    s.sendall(hello(_token(cluster)))
    answer = _recv_exact(s, ANSWER.size)
    if accepted:
        assert answer[4] == 0, f"refused: {answer!r}"
    return s


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        data = s.recv(min(n - len(buf), 1 << 20))
        if not data:
            raise ConnectionError("closed")
        buf += data
    return bytes(buf)


def _send_call(s: socket.socket, call: master_pb2.Call) -> None:
    data = call.SerializeToString()
    s.sendall(FRAME.pack(len(data)) + data)


def _read_result(s: socket.socket, limit: int = 64 * MiB) -> tuple[int, master_pb2.CallResult | None]:
    """(frame size, the result, or None when the frame is over ``limit``: not read)."""
    (n,) = FRAME.unpack(_recv_exact(s, FRAME.size))
    if n > limit:
        return n, None
    return n, master_pb2.CallResult.FromString(_recv_exact(s, n))


def _skip_result(s: socket.socket) -> int:
    """Read one result frame without parsing it; its size."""
    (n,) = FRAME.unpack(_recv_exact(s, FRAME.size))
    scratch = memoryview(bytearray(min(n, 1 << 20) or 1))
    left = n
    while left:
        k = s.recv_into(scratch[:min(left, len(scratch))])
        if not k:
            raise ConnectionError("closed")
        left -= k
    return n


def _closed_by_peer(s: socket.socket, within: float) -> float | None:
    """Seconds until the server closes ``s`` (reading and dropping what it sends), or
    None if it is still open after ``within``."""
    t0 = time.monotonic()
    s.settimeout(0.5)
    while time.monotonic() - t0 < within:
        try:
            if not s.recv(65536):
                return time.monotonic() - t0
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


def _files(cluster) -> MasterClient:
    return MasterClient(cluster.master_addr, timeout=60, wait=10, security=cluster.security)


# -- LookupMany ---------------------------------------------------------------------------

@pytest.mark.expect_log(r"curvine\.master\.ports\.call_port_server.*frame")
def test_a_repeated_inline_file_does_not_blow_up_a_lookup_many(make_cluster):
    """1,024 repeats of a 256 KiB inline file: before, the master built the whole reply
    (~268 MB, several copies of it at once) on the call port and on gRPC; now each reply
    ends at master.lookup_reply_max (4 MiB) and the client asks again for the rest."""
    c = make_cluster(workers=1, mounts=0)
    mc = _files(c)
    d = mc.mkdir(ROOT_INO, b"l2")
    data = os.urandom(256 << 10)
    mc.put_file(d.ino, b"chunk", [common_pb2.Block(block_id=0, length=len(data), data=data)],
                len(data))
    names = [b"chunk"] * 1024
    reply_max = int(_conf(c, "master").master.lookup_reply_max)
    assert reply_max == 4 * MiB  # the default
    pid = _pid(c)
    peak0 = _peak_mb(pid)

    # the call port
    s = _call_port(c)
    _send_call(s, master_pb2.Call(id=1, lookup_many=master_pb2.LookupManyRequest(
        parent=d.ino, names=names, with_blocks=True)))
    n, result = _read_result(s)
    print(f"call port: a {n}-byte reply; master peak RSS {peak0:.0f} -> {_peak_mb(pid):.0f} MB")
    assert n <= reply_max + 512 * 1024, f"a {n}-byte reply for {len(names)} repeats"
    got = list(result.lookup_many.results)
    assert 0 < len(got) < len(names)  # cut short: ask again from there
    while len(got) < len(names):  # a client that asks again gets every name
        _send_call(s, master_pb2.Call(id=2, lookup_many=master_pb2.LookupManyRequest(
            parent=d.ino, names=names[len(got):], with_blocks=True)))
        n, more = _read_result(s)
        assert n <= reply_max + 512 * 1024 and more.lookup_many.results
        got += more.lookup_many.results
        if len(got) > 200:
            break  # enough pages to show it: the rest would be the same
    assert all(r.blocks[0].data == data for r in got)
    s.close()

    # gRPC (the unary RPC; before: built whole, then refused RESOURCE_EXHAUSTED past
    # the 64 MiB send limit)
    stub = master_pb2_grpc.MasterStub(make_channel(c.master_addr, c.security))
    reply = stub.LookupMany(master_pb2.LookupManyRequest(parent=d.ino, names=names,
                                                         with_blocks=True), timeout=60)
    assert 0 < len(reply.results) < len(names) and reply.ByteSize() <= reply_max + 512 * 1024
    grown = _peak_mb(pid) - peak0
    print(f"master peak RSS {peak0:.0f} -> {_peak_mb(pid):.0f} MB")
    assert grown < 100, f"the master's peak memory grew by {grown:.0f} MB"
    assert daemon_metric(c, "master", "curvine_requests_limited_total", method="LookupMany",
                         limit="reply_bytes") >= 2
    # more names than a batch may hold: refused, naming the field
    with pytest.raises(grpc.RpcError) as e:
        stub.LookupMany(master_pb2.LookupManyRequest(parent=d.ino, names=[b"x"] * 4097),
                        timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "names" in e.value.details()


def test_a_file_of_many_holes_does_not_stall_the_call_port(make_cluster):
    """A file of 65,536 hole blocks (4 TiB), asked for by GetBlocks and by LookupMany of
    200 repeats over and over: before, the call port's one loop thread built each reply
    (0.1-0.2 s per name), and every mount's calls waited behind it; now those reads go
    to the heavy-read threads, and another client's calls are answered meanwhile."""
    c = make_cluster(workers=1, mounts=0)
    mc = _files(c)
    d = mc.mkdir(ROOT_INO, b"sparse")
    block = _conf(c, "master").cluster.block_size
    holes = [common_pb2.Block(block_id=0, length=block)] * 65536
    node, _ = mc.put_file(d.ino, b"holes", holes, block * 65536)
    stop = threading.Event()
    answered = {"get_blocks": 0, "lookup_many": 0, "errors": []}

    def attack():
        s = _call_port(c)
        s.settimeout(120)
        cid = 0
        try:
            while not stop.is_set():
                for op, req in (("get_blocks", master_pb2.GetBlocksRequest(ino=node.ino)),
                                ("lookup_many", master_pb2.LookupManyRequest(
                                    parent=d.ino, names=[b"holes"] * 200, with_blocks=True))):
                    cid += 1
                    _send_call(s, master_pb2.Call(id=cid, **{op: req}))
                for _ in range(2):  # read, not parsed: this process's GIL is the honest
                    n = _skip_result(s)  # client's too (GetBlocks: ~1.7 MB, the other small)
                    answered["get_blocks" if n > 100_000 else "lookup_many"] += 1
        except (OSError, ConnectionError) as e:
            answered["errors"].append(repr(e))
        finally:
            s.close()

    attackers = [threading.Thread(target=attack, daemon=True) for _ in range(2)]
    honest = _call_port(c)
    honest.settimeout(120)  # a stalled loop is measured, not given up on
    cid = 0

    def getattrs(seconds: float) -> list[float]:
        nonlocal cid
        latencies = []
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            cid += 1
            t0 = time.perf_counter()
            _send_call(honest, master_pb2.Call(id=cid, getattr=master_pb2.GetAttrRequest(
                ino=ROOT_INO)))
            _, r = _read_result(honest)
            latencies.append(time.perf_counter() - t0)
            assert r.HasField("inode")
            time.sleep(0.005)
        latencies.sort()
        return latencies

    def describe(lat: list[float]) -> str:
        return (f"{len(lat)} calls, p50 {lat[len(lat) // 2] * 1e3:.1f} ms, p99 "
                f"{lat[int(len(lat) * 0.99)] * 1e3:.1f} ms, max {lat[-1] * 1e3:.1f} ms")

    quiet = getattrs(2)
    for t in attackers:
        t.start()
    latencies = getattrs(8)
    stop.set()
    for t in attackers:
        t.join(60)
    honest.close()
    worst, p99 = latencies[-1], latencies[int(len(latencies) * 0.99)]
    print(f"honest getattr on the call port: alone {describe(quiet)}; during the attack "
          f"{describe(latencies)}; attack answered {answered}")
    assert answered["get_blocks"] >= 1, answered
    assert worst < 0.5, f"an honest call waited {worst * 1e3:.0f} ms"
    assert p99 < 0.15, f"p99 {p99 * 1e3:.0f} ms"
    assert answered["lookup_many"] >= 1 and not answered["errors"], answered
    # the LookupMany of a file of more blocks than a result carries is refused naming it
    with pytest.raises(Exception) as e:
        mc.lookup_many(d.ino, [b"holes"])
    assert "names[0]" in str(e.value) and "GetBlocks" in str(e.value)


# -- partial frames -------------------------------------------------------------------------

@pytest.mark.expect_log(r"call port: .*frame")
def test_partial_frames_are_cut_and_their_bytes_bounded(make_cluster):
    """Before: a frame announced up to 64 MiB was buffered for as long as its sender
    liked (16 x 60 MiB: 131 -> 1,096 MB, held).  Now a frame over
    master.client_message_max (16 MiB) closes its connection at once, a partial frame
    is cut master.call_frame_timeout (10 s) after its first byte, and frames still
    arriving hold at most master.call_port_buffer (64 MiB) together (the others wait,
    unread, and are cut in their turn)."""
    c = make_cluster(workers=1, mounts=0)
    mcfg = _conf(c, "master").master
    assert (mcfg.client_message_max, mcfg.call_frame_timeout, mcfg.call_port_buffer) == (
        16 * MiB, 10.0, 64 * MiB)  # the defaults
    pid = _pid(c)
    peak0 = _peak_mb(pid)
    conns = [_call_port(c) for _ in range(8)]
    sent = [0] * len(conns)
    closed_at: list[float | None] = [None] * len(conns)
    t0 = time.monotonic()

    def feed(i: int) -> None:
        """Announce a 16 MiB frame, send 15.5 MiB of it (as far as the master reads),
        then nothing; note when the master closes the connection."""
        s = conns[i]
        s.settimeout(0.5)
        payload = memoryview(struct.pack(">I", 16 * MiB) + b"\1" * (31 * MiB // 2))
        while time.monotonic() - t0 < 40:
            try:
                if sent[i] < len(payload):
                    sent[i] += s.send(payload[sent[i]:sent[i] + MiB])
                elif not s.recv(1):
                    break
            except socket.timeout:
                continue
            except OSError:
                break
        else:
            return
        closed_at[i] = time.monotonic() - t0

    feeders = [threading.Thread(target=feed, args=(i,), daemon=True) for i in range(len(conns))]
    for t in feeders:
        t.start()
    time.sleep(5)  # the first four frames are arriving, the others wait for room
    assert daemon_metric(c, "master", "curvine_call_port_buffered_bytes") == 4 * 16 * MiB
    for t in feeders:
        t.join(60)
    peak = _peak_mb(pid)
    print(f"master peak RSS {peak0:.0f} -> {peak:.0f} MB; connections closed at "
          f"{[round(x, 1) if x else None for x in closed_at]} s; sent "
          f"{[round(x / MiB, 1) for x in sent]} MiB")
    assert all(x is not None for x in closed_at), "partial frames were kept past 40 s"
    assert sorted(closed_at)[0] >= 9.0  # not before the frame's time
    assert peak - peak0 < 110, f"the master's peak memory grew by {peak - peak0:.0f} MB"
    assert daemon_metric(c, "master", CUT, port="call_port", reason="partial_frame") == 8
    for s in conns:
        s.close()
    big = _call_port(c)
    big.sendall(struct.pack(">I", 64 * MiB) + b"\0" * 65536)
    assert _closed_by_peer(big, 5) is not None, "a 64 MiB frame was taken"
    big.close()
    assert daemon_metric(c, "master", CUT, port="call_port", reason="frame_too_large") == 1


def test_a_grpc_message_over_the_limit_is_refused_before_it_is_buffered(make_cluster):
    """Before: the master's client port took messages up to 64 MiB and buffered a
    partial one whole for as long as its connection lived (59 MiB: the master +60 MB,
    held).  Now master.port receives at most master.client_message_max (16 MiB): a
    larger message is refused from its length prefix."""
    c = make_cluster(workers=1, mounts=0)
    pid = _pid(c)
    peak0 = _peak_mb(pid)
    proxy = TcpProxy(c.master_addr, limit=40 * MiB)  # the client stalls after 40 MiB
    channel = make_channel(proxy.address, c.security)
    stub = master_pb2_grpc.MasterStub(channel)
    data = b"x" * (60 * MiB)
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        stub.PutFile(master_pb2.PutFileRequest(parent=ROOT_INO, name=b"big", blocks=[
            common_pb2.Block(block_id=0, length=len(data), data=data)], size=len(data)),
            timeout=20)
    took = time.monotonic() - t0
    grown = _peak_mb(pid) - peak0
    print(f"refused after {took:.1f}s ({e.value.code().name}); master peak +{grown:.0f} MB")
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
    assert took < 10 and grown < 20
    channel.close()
    proxy.close()


# -- idle connections -------------------------------------------------------------------------

def test_idle_connections_are_cut_on_every_port(make_cluster):
    """Connections that carry nothing: closed after each port's idle timeout at the
    defaults (60 s: master.stream_idle_timeout for the call port, the data port's and
    the domain socket's; gRPC's GOAWAY after 30 s, the close about 30 s later; 10 s for
    HTTP).
    Before: idle call port connections (4,093 of them kept new clients out) and gRPC
    connections were never closed."""
    c = make_cluster(workers=1, mounts=0)
    assert _conf(c, "master").master.stream_idle_timeout == 60.0
    wcfg = _conf(c, "worker")
    socks = {"call_port": _call_port(c)}
    used = _call_port(c)  # one that made a call first, then went quiet
    _send_call(used, master_pb2.Call(id=1, statfs=master_pb2.StatFsRequest()))
    _read_result(used)
    socks["call_port_used"] = used
    socks["data_port"] = _connect(wcfg.worker.data_port)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with local_wire.reachable(c.socket_path(0)) as address:
        unix.connect(address)
    socks["domain_socket"] = unix
    socks["http_master"] = _connect(_http_port(c, "master"))
    # gRPC: a channel (through a proxy that notes the master closing it) after a call
    proxy = TcpProxy(c.master_addr)
    channel = make_channel(proxy.address, c.security)
    master_pb2_grpc.MasterStub(channel).StatFs(master_pb2.StatFsRequest(), timeout=10)
    t0 = time.monotonic()
    closed: dict[str, float | None] = {}
    threads = []

    def watch(name, s):
        closed[name] = _closed_by_peer(s, 80)

    for name, s in socks.items():
        threads.append(threading.Thread(target=watch, args=(name, s), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join(90)
    if proxy.closed.wait(max(80 - (time.monotonic() - t0), 0.1)):
        closed["grpc_master"] = proxy.closed_at - t0
    else:
        closed["grpc_master"] = None
    print({k: (round(v, 1) if v is not None else None) for k, v in closed.items()})
    assert closed["http_master"] is not None and closed["http_master"] < 15
    for name in ("call_port", "call_port_used", "data_port", "domain_socket", "grpc_master"):
        assert closed[name] is not None, f"{name}: an idle connection was kept past 80 s"
        assert 50 <= closed[name] <= 75, f"{name}: closed after {closed[name]:.0f} s"
    assert daemon_metric(c, "master", CUT, port="call_port", reason="idle") == 2
    for s in socks.values():
        s.close()
    channel.close()
    proxy.close()


# -- connections per peer ----------------------------------------------------------------------

@pytest.mark.expect_log(r"call port: refused a connection of 127\.0\.0\.1")
def test_each_port_keeps_a_peer_to_its_share_of_connections(make_cluster):
    """At the defaults: 64 call port connections per address (master.call_port_per_peer),
    32 data port connections per address and 32 domain socket connections per process:
    one more is refused at once while another address is still served; 64 waiting HTTP
    connections per address: one more closes that address's oldest.  Before: one peer
    could take every slot."""
    c = make_cluster(workers=1, mounts=0)
    wcfg = _conf(c, "worker")
    held: list[socket.socket] = []
    try:
        # call port
        held += [_call_port(c) for _ in range(64)]
        extra = _connect(_conf(c, "master").master.call_port)
        extra.sendall(hello(_token(c)))
        assert _closed_by_peer(extra, 5) is not None, "a 65th connection of one address"
        extra.close()
        other = _call_port(c, src="127.0.0.2")  # another address is served
        _send_call(other, master_pb2.Call(id=1, statfs=master_pb2.StatFsRequest()))
        assert _read_result(other)[1].HasField("statfs")
        other.close()
        for s in held:
            s.close()
        held.clear()
        # data port: BUSY for the 33rd of one address
        held += [_connect(wcfg.worker.data_port) for _ in range(32)]
        time.sleep(0.5)
        extra = _connect(wcfg.worker.data_port)
        status, _ = struct.unpack(">IQ", _recv_exact(extra, 12))
        assert status == ErrorKind.BUSY, status
        extra.close()
        other = _connect(wcfg.worker.data_port, src="127.0.0.2")
        other.settimeout(1)
        with pytest.raises(socket.timeout):  # accepted: waits for a request
            other.recv(1)
        other.close()
        # domain socket: BUSY for the 33rd of this process
        unix = []
        for _ in range(33):
            u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            u.settimeout(5)
            with local_wire.reachable(c.socket_path(0)) as address:
                u.connect(address)
            unix.append(u)
            held.append(u)
        frame = local_wire.receive(unix[-1], time.monotonic() + 5, limit=local_wire.MAX_REPLY)
        reply = worker_pb2.LocalReply.FromString(frame[0])
        assert "connections of pid" in reply.error, reply
        # HTTP: the 65th waiting connection of one address closes its oldest
        http = _http_port(c, "master")
        first = _connect(http)
        held += [first] + [_connect(http) for _ in range(63)]
        time.sleep(0.5)
        held.append(_connect(http))
        assert _closed_by_peer(first, 3) is not None
        other = _connect(http, src="127.0.0.2")
        other.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200" in other.recv(100)
        other.close()
    finally:
        for s in held:
            s.close()
    assert daemon_metric(c, "master", CUT, port="call_port", reason="per_peer") == 1
    assert daemon_metric(c, "worker", CUT, port="data_port", reason="per_peer") == 1
    assert daemon_metric(c, "master", CUT, port="http", reason="per_peer") == 1
    assert daemon_metric(c, "worker", "curvine_worker_fd_refused_total", reason="per_peer") == 1


# -- slow senders -----------------------------------------------------------------------------

def test_slow_senders_do_not_hold_the_data_port_or_the_domain_socket(make_cluster):
    """64 data port connections (every slot, from two addresses) and a domain socket
    connection that send a request a byte at a time: cut 10 s after its first byte, so
    an honest reader is served within seconds.  Before: a byte now and then held a slot
    (66 connections sending a byte every 20 s kept every slot for 75 s)."""
    c = make_cluster(workers=1, mounts=0)
    port = _conf(c, "worker").worker.data_port
    tricklers = [_connect(port, src=f"127.0.0.{2 + i % 2}") for i in range(64)]
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with local_wire.reachable(c.socket_path(0)) as address:
        unix.connect(address)
    tricklers.append(unix)
    request = struct.pack(">4sQQQH", b"CVR1", 1, 0, 0, 17) + b"t" * 17
    local = local_wire.encode(worker_pb2.LocalRequest(open_read=worker_pb2.LocalOpenRead(
        block_id=1, token=b"t" * 17)))
    payloads = [request] * 64 + [local]
    stop = threading.Event()
    cut_at: dict[int, float] = {}
    t0 = time.monotonic()

    def trickle():
        for k in range(len(request)):
            for i, s in enumerate(tricklers):
                if i in cut_at or k >= len(payloads[i]):
                    continue
                try:
                    s.sendall(payloads[i][k:k + 1])
                except OSError:
                    cut_at[i] = time.monotonic() - t0
            if stop.wait(2.0) or len(cut_at) == len(tricklers):
                return

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    served = None
    while time.monotonic() - t0 < 30:
        s = _connect(port, src="127.0.0.4")
        s.sendall(request)
        status, _ = struct.unpack(">IQ", _recv_exact(s, 12))
        s.close()
        if status != ErrorKind.BUSY:  # a slot served it (PERMISSION: a made-up token)
            served = time.monotonic() - t0
            break
        time.sleep(0.5)
    stop.set()
    t.join(10)
    print(f"an honest request served after {served}s; tricklers cut at "
          f"{sorted(round(v, 1) for v in cut_at.values())[:3]}..")
    assert served is not None and served < 15, served
    wait_for(lambda: daemon_metric(c, "worker", CUT, port="data_port",
                                   reason="slow_request") == 64, 10, what="the cuts counted")
    wait_for(lambda: daemon_metric(c, "worker", "curvine_worker_fd_refused_total",
                                   reason="slow_request") == 1, 10, what="the socket's cut")
    for s in tricklers:
        s.close()
