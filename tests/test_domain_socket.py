"""Short-circuit I/O through the worker's Unix domain socket (worker/domain_socket.py,
client/blocks/domain_socket.py): block descriptors passed by the worker after it checked the
block token, so a local client needs no access to the data dirs.

In-process: the real master and worker (tests/inproc.py) with the worker's
DomainSocketServer on a socket in tmp_path, driven by the client's LocalSockets and
by hand-made frames.  Daemons: `curvine local` workers' sockets, SIGTERM, and a
process of another uid that cannot open the data dir but reads through the socket.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import zlib

import pytest

from inproc import InprocCluster, wait_until
from curvine.client.blocks.domain_socket import LocalSockets
from curvine.client.files.fs import CurvineFS
from curvine.client.master.master_client import MasterClient
from curvine.common import block_tokens, local_wire
from curvine.common import config as config_mod
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import MIB, ROOT_INO
from curvine.devtools.local import LocalCluster
from curvine.proto import common_pb2, worker_pb2
from curvine.worker.domain_socket import DomainSocketServer

BLOCK = 16 * MIB
CHUNK = 14 * MIB  # a KV chunk of Qwen2.5-7B's shape: one block
IDLE = 1.0


@pytest.fixture
def inproc(tmp_path):
    c = InprocCluster(tmp_path / "c", [("host-a", 1 << 30, tmp_path / "d1")], BLOCK)
    w = c.worker(1)
    run = tmp_path / "run"
    server = DomainSocketServer(str(run / "w1.sock"), w.servicer,
                                identity=lambda: (w.link.uuid, w.link.worker_id),
                                max_connections=4, idle_timeout=IDLE)
    server.start()
    sockets = LocalSockets(str(run), timeout=5.0)
    try:
        yield c, server, sockets
    finally:
        sockets.close()
        server.close()
        c.close()


def _new_block(c: InprocCluster, name: bytes, size: int = 0):
    """(ino, block id, its worker, write token) of a new file's first block."""
    ino = c.client.create(ROOT_INO, name).ino
    block_id, workers, token = c.client.add_block(ino, "host-a", size_hint=size)
    return ino, block_id, workers[0], token


def _store(c, sockets, name: bytes, data: bytes, pieces: int = 3):
    """A file ``name`` of one block written through the socket; returns its worker and
    the block as the master hands it to readers (with a read token)."""
    ino, block_id, worker, token = _new_block(c, name, len(data))
    step = max(1, len(data) // pieces)
    view = memoryview(data)
    buffers = [bytes(view[:step]), bytearray(view[step:2 * step]), view[2 * step:]]
    crc = zlib.crc32(data)
    assert sockets.write(worker, block_id, token, buffers, crc) == (len(data), crc)
    c.client.complete_file(ino, [common_pb2.Block(block_id=block_id, length=len(data),
                                                  checksum=crc, worker_ids=[worker.worker_id])],
                           len(data))
    _, blocks, workers = c.client.get_blocks(ino)
    assert len(blocks) == 1 and blocks[0].block_id == block_id
    return workers[blocks[0].worker_ids[0]], blocks[0]


def _read_fd(fd: int, length: int) -> bytearray:
    buf = bytearray(length)
    view = memoryview(buf)
    done = 0
    while done < length:
        n = os.preadv(fd, [view[done:]], done)
        assert n > 0
        done += n
    return buf


class Raw:
    """A hand-driven connection to the socket."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        with local_wire.reachable(path) as address:
            self.sock.connect(address)

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def call(self, request=None, raw: bytes | None = None, want_fd: bool = False):
        if raw is None:
            raw = local_wire.encode(request)
        try:
            self.sock.sendall(raw)
        except BrokenPipeError:
            pass  # refused before reading (BUSY): the reply is there to be read
        frame = local_wire.receive(self.sock, time.monotonic() + 5, max_fds=1 if want_fd else 0,
                                   limit=local_wire.MAX_REPLY)
        assert frame is not None, "the worker closed the connection"
        body, fds = frame
        return worker_pb2.LocalReply.FromString(body), fds

    def closed(self, within: float = 5.0) -> bool:
        """Whether the worker ends the connection within ``within`` seconds."""
        self.sock.settimeout(within)
        try:
            while True:
                data = self.sock.recv(4096)
                if not data:
                    return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def _staging_is_empty(c) -> bool:
    w = c.worker(1)
    return not w.staging_files() and w.store._reserved == 0


# -- data: byte-exact, tokens -----------------------------------------------------------


def test_write_and_read_through_the_socket_are_byte_exact(inproc):
    c, server, sockets = inproc
    data = os.urandom(CHUNK)
    worker, block = _store(c, sockets, b"chunk", data)
    assert sockets.has(worker)
    assert c.block_bytes(block.block_id) == data  # what the worker itself serves
    assert c.worker(1).staging_files() == []
    fd, length = sockets.open_read(worker, block.block_id, block.token)
    try:
        assert length == len(data)
        assert _read_fd(fd, length) == data
        assert os.fstat(fd).st_size == len(data)
        # read-only: the pod cannot change the block through its descriptor
        with pytest.raises(OSError):
            os.pwrite(fd, b"x", 0)
    finally:
        os.close(fd)
    assert server.served["write"] == [1, len(data)]
    assert server.served["read"] == [1, len(data)]
    # a tiny block too
    for name, payload in ((b"tiny", b"x"),):
        w2, b2 = _store(c, sockets, name, payload, pieces=1)
        fd, length = sockets.open_read(w2, b2.block_id, b2.token)
        try:
            assert length == len(payload) and _read_fd(fd, length) == payload
        finally:
            os.close(fd)


def test_missing_or_wrong_tokens_are_refused(inproc):
    c, server, sockets = inproc
    worker, block = _store(c, sockets, b"a", b"secret bytes")
    _, other_id, _, other_token = _new_block(c, b"b")
    key = c.worker(1).servicer.block_key
    for token in (b"", b"r" + b"\0" * 16, other_token,
                  block_tokens.mint(os.urandom(32), block.block_id, block_tokens.READ)):
        with pytest.raises(CurvineError) as e:
            sockets.open_read(worker, block.block_id, token)
        assert e.value.kind == ErrorKind.PERMISSION, e.value
        assert "open_read.token" in str(e.value)
    # a read token does not allow writing; nothing is left behind
    read_token = block_tokens.mint(key, other_id, block_tokens.READ)
    with pytest.raises(CurvineError) as e:
        sockets.write(worker, other_id, read_token, [b"data"], zlib.crc32(b"data"))
    assert e.value.kind == ErrorKind.PERMISSION and "open_write.token" in str(e.value)
    assert _staging_is_empty(c)
    # a block that is not on this worker
    missing = 1 << 40
    with pytest.raises(CurvineError) as e:
        sockets.open_read(worker, missing, block_tokens.mint(key, missing, block_tokens.READ))
    assert e.value.kind == ErrorKind.NOT_FOUND
    assert server.refused["permission"] >= 5
    # the connections are still good after refusals
    fd, _ = sockets.open_read(worker, block.block_id, block.token)
    os.close(fd)


def test_adopt_on_the_socket_takes_a_staging_file_like_the_rpc(inproc, tmp_path):
    """A writer that may open the data dirs writes its staging file itself and has the
    worker adopt it on the socket (the mount's small files): the same checks as the
    AdoptBlock RPC, the block byte-exact; a read token, another block's token or a
    path outside the worker's staging dirs is refused and nothing is left behind."""
    from curvine.client.blocks import block_client
    c, server, sockets = inproc
    data = os.urandom(100_000)
    crc = zlib.crc32(data)
    dirs = block_client.local_dirs([str(tmp_path / "d1")])
    key = c.worker(1).servicer.block_key
    ino, block_id, worker, token = _new_block(c, b"adopted", len(data))
    fd, path = block_client.create_local_staging(worker, block_id, dirs)
    os.pwrite(fd, data, 0)
    os.close(fd)
    for bad, field in ((block_tokens.mint(key, block_id, block_tokens.READ), "adopt.token"),
                       (_new_block(c, b"other")[3], "adopt.token")):
        with pytest.raises(CurvineError) as e:
            sockets.adopt(worker, block_id, bad, path, len(data), crc)
        assert e.value.kind == ErrorKind.PERMISSION and field in str(e.value)
    outside = tmp_path / "outside"
    outside.write_bytes(data)
    with pytest.raises(CurvineError) as e:
        sockets.adopt(worker, block_id, token, str(outside), len(data), crc)
    assert e.value.kind in (ErrorKind.INVALID, ErrorKind.PERMISSION, ErrorKind.NOT_FOUND)
    assert outside.read_bytes() == data  # not taken
    assert sockets.adopt(worker, block_id, token, path, len(data), crc) == (len(data), crc)
    c.client.complete_file(ino, [common_pb2.Block(block_id=block_id, length=len(data),
                                                  checksum=crc, worker_ids=[worker.worker_id])],
                           len(data))
    _, blocks, workers = c.client.get_blocks(ino)
    fd, length = sockets.open_read(workers[blocks[0].worker_ids[0]], block_id,
                                   blocks[0].token)
    try:
        assert length == len(data) and bytes(_read_fd(fd, length)) == data
    finally:
        os.close(fd)
    assert server.served["write"][0] >= 1 and _staging_is_empty(c)


def test_block_calls_wait_for_the_registration(inproc):
    c, _, sockets = inproc
    worker, block = _store(c, sockets, b"a", b"data")
    servicer = c.worker(1).servicer
    key, servicer.block_key = servicer.block_key, b""  # as before the first registration
    try:
        with pytest.raises(CurvineError) as e:
            sockets.open_read(worker, block.block_id, block.token)
        assert e.value.kind == ErrorKind.UNAVAILABLE
        raw = Raw(os.path.join(sockets.socket_dir, "w1.sock"))
        reply, _ = raw.call(worker_pb2.LocalRequest(hello={}))
        assert reply.error_kind == 0 and reply.uuid == worker.uuid
        raw.close()
    finally:
        servicer.block_key = key


# -- bad input, dead and silent clients, limits -------------------------------------------


def test_bad_input_gets_an_error_naming_the_field(inproc):
    c, server, sockets = inproc
    path = server.path
    raw = Raw(path)
    invalid, refused = ErrorKind.INVALID, ErrorKind.PERMISSION
    cases = [
        (local_wire.encode(worker_pb2.LocalRequest()), invalid, "request"),
        (b"\0\0\0\x03\xff\xff\xff", invalid, "request"),
        (local_wire.encode(worker_pb2.LocalRequest(open_read={"block_id": 0})), invalid,
         "open_read.block_id"),
        (local_wire.encode(worker_pb2.LocalRequest(open_write={"block_id": 1 << 63})), invalid,
         "open_write.block_id"),
        (local_wire.encode(worker_pb2.LocalRequest(open_write={
            "block_id": 5, "expected_length": BLOCK + 1})), invalid,
         "open_write.expected_length"),
        (local_wire.encode(worker_pb2.LocalRequest(finish_write={"block_id": 5})), refused,
         "finish_write.token"),
    ]
    for data, kind, field in cases:
        reply, fds = raw.call(raw=data)
        assert fds == []
        assert reply.error_kind == kind, reply
        assert reply.error.startswith(field), (field, reply.error)
        assert "Traceback" not in reply.error
    # still serving this connection
    reply, _ = raw.call(worker_pb2.LocalRequest(hello={}))
    assert reply.uuid == c.worker(1).link.uuid and reply.worker_id == 1
    # a message over the limit: an error, then the connection ends (cannot resync)
    reply, _ = raw.call(raw=b"\x7f\xff\xff\xff")
    assert reply.error_kind == ErrorKind.INVALID and reply.error.startswith("message")
    assert raw.closed()
    raw.close()
    # finishing a write the connection never opened
    _, block_id, worker, token = _new_block(c, b"x")
    raw = Raw(path)
    reply, _ = raw.call(worker_pb2.LocalRequest(finish_write={
        "block_id": block_id, "token": token, "length": 1}))
    assert reply.error_kind == ErrorKind.INVALID and "finish_write.block_id" in reply.error
    raw.close()


def test_a_descriptor_kept_after_finish_writes_into_nothing_the_worker_serves(inproc):
    """A local client keeps the staging descriptor after FinishWrite and goes on
    writing: the worker finds its block file changed when it next opens it, serves no
    byte of it (not found), removes it and reports the copy bad; the master drops it
    (the file had no other copy: removed, a clean miss).  Before, 1 GiB written that
    way grew the finished block file while the worker's ``used`` stayed at 1 MiB."""
    c, server, sockets = inproc
    store = c.worker(1).store
    data = os.urandom(4096)
    ino, block_id, worker, token = _new_block(c, b"kept", len(data))
    raw = Raw(server.path)
    reply, fds = raw.call(worker_pb2.LocalRequest(open_write={
        "block_id": block_id, "token": token, "expected_length": len(data)}), want_fd=True)
    fd = fds[0]
    try:
        os.pwrite(fd, data, 0)
        reply, _ = raw.call(worker_pb2.LocalRequest(finish_write={
            "block_id": block_id, "token": token, "length": len(data),
            "checksum": zlib.crc32(data)}))
        assert reply.error_kind == 0, reply
        c.client.complete_file(ino, [common_pb2.Block(
            block_id=block_id, length=len(data), checksum=zlib.crc32(data),
            worker_ids=[worker.worker_id])], len(data))
        _, [block], workers = c.client.get_blocks(ino)
        os.pwrite(fd, b"\0" * MIB, len(data))  # after the finish
    finally:
        os.close(fd)
        raw.close()
    with pytest.raises(CurvineError) as e:
        sockets.open_read(workers[block.worker_ids[0]], block_id, block.token)
    assert e.value.kind == ErrorKind.CHECKSUM
    assert block_id not in store
    wait_until(lambda: _gone(c, ino), what="the master to drop the bad copy (the file)")


def _gone(c, ino) -> bool:
    try:
        c.client.get_blocks(ino)
    except CurvineError as e:
        return e.kind == ErrorKind.NOT_FOUND
    return False


def test_a_connection_closed_mid_write_leaves_no_staging_file(inproc):
    c, server, sockets = inproc
    store = c.worker(1).store
    used = store.used
    _, block_id, worker, token = _new_block(c, b"a", CHUNK)
    raw = Raw(server.path)
    reply, fds = raw.call(worker_pb2.LocalRequest(open_write={
        "block_id": block_id, "token": token, "expected_length": CHUNK}), want_fd=True)
    assert reply.error_kind == 0 and len(fds) == 1
    assert len(c.worker(1).staging_files()) == 1
    assert store._reserved == CHUNK
    fd = fds[0]
    assert os.fstat(fd).st_mode & 0o777 == 0o600
    with pytest.raises(OSError):
        os.pread(fd, 1, 0)  # write-only
    os.pwrite(fd, b"half a block" * 1000, 0)
    os.close(fd)
    raw.close()  # the client dies before FinishWrite
    wait_until(lambda: _staging_is_empty(c), what="the staging file removed")
    assert store.used == used and block_id not in store
    # AbortWrite, and a FinishWrite whose length is not the file's, do the same
    for how in ("abort", "short"):
        _, block_id, worker, token = _new_block(c, b"b" + how.encode(), 100)
        raw = Raw(server.path)
        reply, fds = raw.call(worker_pb2.LocalRequest(open_write={
            "block_id": block_id, "token": token, "expected_length": 100}), want_fd=True)
        os.pwrite(fds[0], b"y" * 50, 0)
        os.close(fds[0])
        if how == "abort":
            reply, _ = raw.call(worker_pb2.LocalRequest(abort_write={"block_id": block_id}))
            assert reply.error_kind == 0
        else:
            reply, _ = raw.call(worker_pb2.LocalRequest(finish_write={
                "block_id": block_id, "token": token, "length": 100, "checksum": 1}))
            assert reply.error_kind == ErrorKind.INVALID, reply
            assert "length" in reply.error and "50 bytes" in reply.error
        assert _staging_is_empty(c) and block_id not in store
        raw.close()
    # the client's own failure to write the descriptor aborts too
    _, block_id, worker, token = _new_block(c, b"c")
    import curvine.client.blocks.domain_socket as client_module

    def full_disk(fd, views):
        os.pwrite(fd, b"some", 0)
        raise OSError(28, "No space left on device")

    real, client_module._pwrite_all = client_module._pwrite_all, full_disk
    try:
        with pytest.raises(CurvineError) as e:
            sockets.write(worker, block_id, token, [b"data"], zlib.crc32(b"data"))
        assert e.value.kind == ErrorKind.NO_SPACE
    finally:
        client_module._pwrite_all = real
    assert _staging_is_empty(c) and block_id not in store
    # a connection may not hold many writes at once
    raw = Raw(server.path)
    opened = []
    for i in range(5):
        _, block_id, worker, token = _new_block(c, b"many%d" % i, 10)
        reply, fds = raw.call(worker_pb2.LocalRequest(open_write={
            "block_id": block_id, "token": token, "expected_length": 10}), want_fd=True)
        for fd in fds:
            os.close(fd)
        opened.append(reply.error_kind)
    assert opened == [0, 0, 0, 0, ErrorKind.BUSY]
    raw.close()
    wait_until(lambda: _staging_is_empty(c), what="the staging files removed")


def test_a_silent_or_trickling_client_is_dropped(inproc):
    _, server, _ = inproc
    silent = Raw(server.path)
    t0 = time.monotonic()
    assert silent.closed(within=IDLE + 4)
    assert IDLE * 0.9 <= time.monotonic() - t0 < IDLE + 4
    silent.close()
    # one byte now and then does not keep a connection: the whole request has a deadline
    trickle = Raw(server.path)
    t0 = time.monotonic()
    dropped = False
    for b in local_wire.encode(worker_pb2.LocalRequest(hello={})) * 10:
        try:
            trickle.send_bytes(bytes([b]))
        except OSError:  # EPIPE: the worker closed it
            dropped = True
            break
        time.sleep(IDLE / 3)
    assert dropped and time.monotonic() - t0 < IDLE + 3
    trickle.close()
    wait_until(lambda: server.connections == 0, what="connections closed")
    assert server.refused["idle"] == 2


def test_too_many_connections_are_refused_not_hung(inproc):
    c, server, sockets = inproc
    worker, block = _store(c, sockets, b"a", b"data")
    sockets.close()  # its pooled connections count too
    wait_until(lambda: server.connections == 0, what="pooled connections closed")
    held = []
    for _ in range(server.max_connections):
        r = Raw(server.path)
        assert r.call(worker_pb2.LocalRequest(hello={}))[0].error_kind == 0
        held.append(r)
    t0 = time.monotonic()
    fresh = LocalSockets(sockets.socket_dir, timeout=5.0)
    try:
        assert not fresh.has(worker)  # the scan's Hello was refused: not found
        extra = Raw(server.path)
        reply, _ = extra.call(worker_pb2.LocalRequest(hello={}))
        assert reply.error_kind == ErrorKind.BUSY and "connections" in reply.error
        assert extra.closed(within=2)
        extra.close()
        assert time.monotonic() - t0 < 3
        assert server.refused["busy"] >= 2
        held.pop().close()
        wait_until(lambda: server.connections < server.max_connections, what="a free slot")
        again = LocalSockets(sockets.socket_dir, timeout=5.0)
        try:
            fd, length = again.open_read(worker, block.block_id, block.token)
            assert _read_fd(fd, length) == b"data"
            os.close(fd)
        finally:
            again.close()
    finally:
        fresh.close()
        for r in held:
            r.close()


def test_the_socket_file_is_never_stolen(inproc, tmp_path):
    c, server, _ = inproc
    st = os.stat(server.path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
    assert stat.S_IMODE(os.stat(os.path.dirname(server.path)).st_mode) == 0o755
    w = c.worker(1)
    ident = lambda: (w.link.uuid, w.link.worker_id)  # noqa: E731
    # a live socket: refused
    with pytest.raises(CurvineError) as e:
        DomainSocketServer(server.path, w.servicer, ident).start()
    assert e.value.kind == ErrorKind.EXISTS and "another process" in str(e.value)
    # not a socket: refused, left alone
    other = tmp_path / "run2" / "w.sock"
    other.parent.mkdir()
    other.write_text("mine")
    with pytest.raises(CurvineError) as e:
        DomainSocketServer(str(other), w.servicer, ident).start()
    assert "not a socket" in str(e.value) and other.read_text() == "mine"
    # a stale socket (its worker was killed): replaced
    other.unlink()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with local_wire.reachable(str(other)) as a:
        s.bind(a)
    s.close()
    srv = DomainSocketServer(str(other), w.servicer, ident)
    srv.start()
    assert srv.serving is None
    srv.close()
    assert not other.exists()
    # health: a socket removed from under the worker is reported
    os.unlink(server.path)
    assert "removed" in server.serving


# -- daemons ---------------------------------------------------------------------------------


def test_local_workers_serve_their_sockets_and_sigterm_removes_them(make_cluster):
    c = make_cluster(workers=2, mounts=0)
    cfg = config_mod.load(c.client_conf)
    assert cfg.client.domain_socket_dir == c.socket_dir
    paths = [c.socket_path(i) for i in range(2)]
    for p in paths:
        assert stat.S_ISSOCK(os.stat(p).st_mode)
    assert stat.S_IMODE(os.stat(c.socket_dir).st_mode) == 0o755
    with CurvineFS(cfg=cfg, master=MasterClient(c.master_addr, timeout=10, wait=5,
                                                security=c.security)) as fs:
        data = os.urandom(3 * MIB)
        fs.write_bytes("/f", data)
        ino = fs.stat("/f").ino
        _, blocks, workers = fs.master.get_blocks(ino)
        with LocalSockets(cfg.client.domain_socket_dir) as sockets:
            assert all(sockets.has(w) for w in workers.values())
            b = blocks[0]
            fd, length = sockets.open_read(workers[b.worker_ids[0]], b.block_id, b.token)
            try:
                assert _read_fd(fd, length) == data
            finally:
                os.close(fd)
    c.kill("worker", 0, signal.SIGTERM)
    wait_until(lambda: not os.path.exists(paths[0]), timeout=30, what="socket removed")
    assert os.path.exists(paths[1])


_CHILD = r"""
import hashlib, json, os, sys, time
from curvine.client.blocks.domain_socket import LocalSockets
from curvine.client.master.master_client import MasterClient
from curvine.common import config
from curvine.common.blocks import block_path
from curvine.common.ids import ROOT_INO
from curvine.common.security import Security

conf, name, data_dir = sys.argv[1:4]
cfg = config.load(conf)
security = Security.load(cfg)  # the client token: read while still root, like a pod's secret
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
out = {"uid": os.getuid()}
master = MasterClient(cfg.cluster.master_addr, timeout=10, wait=5, security=security)
ino = master.lookup(ROOT_INO, name.encode()).ino
_, blocks, workers = master.get_blocks(ino)
b = blocks[0]
try:
    open(block_path(data_dir, b.block_id), "rb").close()
    out["by_path"] = "opened"
except OSError as e:
    out["by_path"] = e.errno
sockets = LocalSockets(cfg.client.domain_socket_dir)
fd, length = sockets.open_read(workers[b.worker_ids[0]], b.block_id, b.token)
buf = bytearray(length)
t0 = time.perf_counter()
n = os.preadv(fd, [buf], 0)
out["seconds"] = time.perf_counter() - t0
os.close(fd)
out.update(n=n, sha=hashlib.sha256(buf).hexdigest())
sockets.close()
master.close()
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another uid")
def test_another_uid_without_the_data_dir_reads_through_the_socket():
    # BASE must be traversable by uid 65534 to reach BASE/run (a pod mounts only that
    # dir); tmp_path's parents are private to root, so the cluster lives in /tmp.
    base = tempfile.mkdtemp(prefix="curvine-fd-")
    c = LocalCluster(base, workers=1, mounts=0)
    try:
        c.up(timeout=60)
        os.chmod(base, 0o711)  # others may pass through, not list
        data_dir = os.path.join(base, "worker", "0", "data")
        assert stat.S_IMODE(os.stat(data_dir).st_mode) == 0o700
        assert os.stat(data_dir).st_uid == 0
        data = os.urandom(CHUNK)
        cfg = config_mod.load(c.client_conf)
        with CurvineFS(cfg=cfg, master=MasterClient(c.master_addr, timeout=10, wait=5,
                                                    security=c.security)) as fs:
            fs.write_bytes("/chunk", data)
        child = subprocess.run([sys.executable, "-c", _CHILD, c.client_conf, "chunk", data_dir],
                               capture_output=True, text=True, timeout=60,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert child.returncode == 0, child.stderr
        import json
        out = json.loads(child.stdout)
        assert out["uid"] == 65534
        assert out["by_path"] == 13  # EACCES: the data dir is root's, 0700
        assert out["n"] == len(data)
        assert out["sha"] == hashlib.sha256(data).hexdigest()
    finally:
        c.down()
        shutil.rmtree(base, ignore_errors=True)
