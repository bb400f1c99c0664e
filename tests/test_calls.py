"""Namespace calls on the Calls stream (fuse_client/calls.py) against a real master
served in-process: same answers as the unary RPCs, errors by kind, and the unary
fallback with the very same request when the stream cannot carry a call."""

from __future__ import annotations

import pytest
import trio

from curvine.client.master.master_client import MasterClient
from curvine.common import rpc
from curvine.common.config import Config
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO
from curvine.common.security import NO_SECURITY
from curvine.client.master.route import StreamDown
from curvine.fuse_client.calls import Calls, CallStream
from curvine.master.master import Master
from curvine.master.ports.service import MasterServicer
from curvine.proto import master_pb2_grpc


@pytest.fixture
def served(tmp_path):
    cfg = Config()
    cfg.master.meta_dir = str(tmp_path / "meta")
    cfg.journal.dir = str(tmp_path / "journal")
    m = Master(cfg, security=NO_SECURITY)
    server = rpc.make_server(16, security=NO_SECURITY)
    master_pb2_grpc.add_MasterServicer_to_server(MasterServicer(m, call_threads=4), server)
    port = rpc.bind(server, "127.0.0.1", 0, NO_SECURITY)
    server.start()
    client = MasterClient(f"127.0.0.1:{port}", timeout=10, wait=2, security=NO_SECURITY)
    yield m, client, server
    client.close()
    server.stop(0)
    m.close()


async def _to_thread(fn):
    return await trio.to_thread.run_sync(fn)


def test_calls_on_the_stream_answer_like_unary_rpcs(served):
    m, client, _ = served
    stream = CallStream(client, timeout=10)
    stream.start()
    calls = Calls(client, _to_thread, stream)

    async def go():
        while stream._out is None:  # the stream thread opens it
            await trio.sleep(0.01)
        d, lease, parent = await calls.run(client.requests.mkdir(ROOT_INO, b"d", 0o755))
        assert d.type and parent.ino == ROOT_INO
        f, _, parent = await calls.run(client.requests.create(d.ino, b"f.tmp", 0o644))
        assert parent.ino == d.ino
        assert (await calls.run(client.requests.lookup(d.ino, b"f.tmp")))[0].ino == f.ino
        assert await calls.run(client.requests.lookup(d.ino, b"missing")) == (None, 0)
        assert (await calls.run(client.requests.getattr(f.ino)))[0].ino == f.ino
        node = await calls.run(client.requests.complete(f.ino, [], 0, 0, True))
        assert node.version == 1
        moved = await calls.run(client.requests.rename(d.ino, b"f.tmp", d.ino, b"f.data",
                                require_published=True))
        assert moved[2].ino == f.ino and moved[0].ino == d.ino
        with pytest.raises(CurvineError) as e:
            await calls.run(client.requests.create(d.ino, b"f.data", 0o644, exclusive=True))
        assert e.value.kind == ErrorKind.EXISTS
        with pytest.raises(CurvineError) as e:
            await calls.run(client.requests.unlink(d.ino, b"nope"))
        assert e.value.kind == ErrorKind.NOT_FOUND
        async with trio.open_nursery() as n:  # many in flight at once, out of order
            for i in range(50):
                n.start_soon(calls.run, client.requests.create(d.ino, b"c%d" % i, 0o644))
        assert (await calls.run(client.requests.unlink(d.ino, b"f.data")))[0].ino == d.ino

    try:
        trio.run(go)
    finally:
        stream.stop()
    assert len(list(client.iterdir(m.lookup(ROOT_INO, b"d").ino))) == 50


def test_a_call_the_stream_cannot_carry_goes_unary_with_the_same_request(served):
    m, client, _ = served
    sent = []

    class DownStream:
        async def call(self, prepared):
            sent.append(prepared)
            raise StreamDown()

    real_unary = client.unary

    def unary(prepared, timeout, wait):
        sent.append(prepared)
        return real_unary(prepared, timeout, wait)

    client.unary = unary
    calls = Calls(client, _to_thread, DownStream())

    async def go():
        f, _, _ = await calls.run(client.requests.create(ROOT_INO, b"x", 0o644, exclusive=True))
        return f

    f = trio.run(go)
    assert len(sent) == 2 and sent[0] is sent[1]  # one request id for both tries
    assert m.lookup(ROOT_INO, b"x").ino == f.ino
