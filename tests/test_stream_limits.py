"""A slow or hostile client cannot pin a worker's threads forever.

A real worker process with four RPC threads (so at most two block streams,
worker/server.stream_limit) and ``worker.stream_idle_timeout = 1s``.  Two WriteBlock
streams that send a header and then nothing (no client deadline) take both stream
slots: a third stream is refused BUSY at once instead of queueing behind them, an
honest unary call is served at once (the streams cannot take the threads it needs),
and the worker cancels the idle streams.  A ReadBlock stream whose client stops reading is cancelled
the same way.  A slow writer that keeps sending (total time well past the timeout) is
not cancelled: the limit is on silence, not on duration.  Every cancellation is counted
in ``curvine_streams_cancelled_idle_total{method}`` and leaves no staging file.
"""

from __future__ import annotations

import os
import threading
import time
import zlib

import grpc

from cluster_util import metric_samples
from curvine.common import auth
from curvine.common.ids import MIB, ROOT_INO, new_request_id
from curvine.common.rpc import make_channel
from curvine.proto import master_pb2, master_pb2_grpc, worker_pb2, worker_pb2_grpc

DEADLINE = 30.0  # bounds every honest call: a hang fails the test instead of the suite
# A stream unread for longer than client/files/file_reader.QUIET_STREAM is not blamed on
# its worker when it turns out cut
QUIET_WAIT = 5.5


def cancelled_idle(http_port: int) -> dict[str, float]:
    return {s.labels["method"]: s.value
            for s in metric_samples(http_port, "curvine_streams_cancelled_idle_total")}


def test_idle_streams_are_cancelled_and_free_their_threads(make_cluster, tmp_path):
    conf = tmp_path / "limits.toml"
    conf.write_text('[worker]\nrpc_threads = 4\nstream_idle_timeout = "1s"\n')
    c = make_cluster(workers=1, mounts=0, conf=str(conf))
    worker = c._proc("worker", 0)
    staging = os.path.join(c.base, "worker", "0", "data", "staging")
    with make_channel(c.master_addr, c.security) as mch, \
            make_channel(worker.address, c.security) as wch:
        master = master_pb2_grpc.MasterStub(mch)
        stub = worker_pb2_grpc.WorkerStub(wch)
        node = master.Create(master_pb2.CreateRequest(
            request_id=new_request_id(), parent=ROOT_INO, name=b"f", mode=0o644),
            timeout=DEADLINE).inode

        def alloc():
            r = master.AddBlock(master_pb2.AddBlockRequest(ino=node.ino), timeout=DEADLINE)
            return r.block_id, r.block_token

        release = threading.Event()

        def stalled(block_id, token):
            yield worker_pb2.WriteBlockRequest(
                header=worker_pb2.WriteBlockHeader(block_id=block_id, token=token),
                data=b"x" * MIB)
            release.wait(60)  # a client that goes silent (ended by the test's cleanup)

        stalls = [stub.WriteBlock.future(stalled(*alloc())) for _ in range(2)]  # no deadline
        try:
            deadline = time.monotonic() + DEADLINE
            while len(os.listdir(staging)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(os.listdir(staging)) == 2, "both stalled writers hold a slot"
            # A third stream is refused at once, not queued behind them.
            started = time.monotonic()
            try:
                stub.WriteBlock(stalled(*alloc()), timeout=DEADLINE)
                raise AssertionError("a third block stream was served")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.ABORTED, (e.code(), e.details())
                assert "block streams open" in e.details()
            refused_after = time.monotonic() - started
            # An honest unary call is served while they hold their slots.
            started = time.monotonic()
            with_token = alloc()
            info = stub.GetBlockInfo.future(worker_pb2.GetBlockInfoRequest(
                block_id=with_token[0], token=with_token[1]), timeout=DEADLINE)
            try:
                info.result()
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.NOT_FOUND, (e.code(), e.details())
            waited = time.monotonic() - started
            assert len(os.listdir(staging)) == 2, "answered while both writers stalled"
            for f in stalls:
                try:
                    f.result(timeout=DEADLINE)
                    raise AssertionError("a silent WriteBlock stream succeeded")
                except grpc.RpcError as e:
                    assert e.code() in (grpc.StatusCode.CANCELLED,
                                        grpc.StatusCode.DEADLINE_EXCEEDED), e.code()
        finally:
            release.set()
        print(f"beside two silent writers: a third stream refused after "
              f"{refused_after:.2f}s, an honest unary call answered after {waited:.2f}s")
        assert cancelled_idle(worker.http_port).get("WriteBlock") == 2
        deadline = time.monotonic() + DEADLINE
        while os.listdir(staging) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.listdir(staging) == []

        # A slow writer that keeps sending for well over the timeout is served.
        block_id, token = alloc()

        def slow():
            data = b""
            yield worker_pb2.WriteBlockRequest(
                header=worker_pb2.WriteBlockHeader(block_id=block_id, token=token))
            for i in range(8):
                time.sleep(0.4)
                data += b"s" * 1000
                yield worker_pb2.WriteBlockRequest(data=b"s" * 1000)
            yield worker_pb2.WriteBlockRequest(finish=True, checksum=zlib.crc32(data))

        assert stub.WriteBlock(slow(), timeout=DEADLINE).length == 8000
        assert cancelled_idle(worker.http_port).get("WriteBlock") == 2

        # A reader that stops reading: the worker's send blocks on flow control until
        # the stream is cancelled.
        block_id, token = alloc()
        data = os.urandom(32 * MIB)

        def pieces():
            yield worker_pb2.WriteBlockRequest(
                header=worker_pb2.WriteBlockHeader(block_id=block_id, token=token))
            for pos in range(0, len(data), MIB):
                yield worker_pb2.WriteBlockRequest(data=data[pos:pos + MIB])
            yield worker_pb2.WriteBlockRequest(finish=True, checksum=zlib.crc32(data))

        stub.WriteBlock(pieces(), timeout=DEADLINE)
        stream = stub.ReadBlock(worker_pb2.ReadBlockRequest(block_id=block_id, token=token))
        assert len(next(stream).data) == MIB  # then read nothing more
        deadline = time.monotonic() + DEADLINE
        while (cancelled_idle(worker.http_port).get("ReadBlock", 0) < 1
               and time.monotonic() < deadline):
            time.sleep(0.2)
        assert cancelled_idle(worker.http_port).get("ReadBlock") == 1
        received = MIB
        try:
            for msg in stream:  # what was in flight, then the cancellation
                received += len(msg.data)
            raise AssertionError("a stalled ReadBlock stream ended normally")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.CANCELLED, e.code()
        assert received < len(data)
        # and the worker still serves whole reads
        got = b"".join(m.data for m in stub.ReadBlock(
            worker_pb2.ReadBlockRequest(block_id=block_id, token=token), timeout=DEADLINE))
        assert got == data
    with open(c.log_path("worker", 0)) as f:
        log = f.read()
    assert log.count("no progress for") == 3, log[-2000:]


def handled(http_port: int, method: str) -> float:
    return sum(s.value for s in metric_samples(http_port, "curvine_rpc_server_handled_total")
               if s.labels.get("method") == method)


def test_master_streams_are_bounded_and_stalled_ones_cancelled(make_cluster, tmp_path):
    """A Calls stream whose client sends lookups and reads no reply: the master stops
    reading it once MAX_CALLS_IN_FLIGHT results wait unsent (the client's sends then
    block on flow control instead of the master's memory growing), and cancels it once
    it has owed replies for ``master.stream_idle_timeout``.  A quiet stream owing
    nothing is left alone once it has sent a call (as a mount's does at once); one that
    never sends anything is cancelled like one that stopped.  Calls streams beyond
    ``master.max_sessions`` are refused."""
    from curvine.master.ports.service import MAX_CALLS_IN_FLIGHT
    conf = tmp_path / "limits.toml"
    conf.write_text('[master]\nmax_sessions = 2\nstream_idle_timeout = "2s"\n')
    c = make_cluster(workers=0, mounts=0, conf=str(conf))
    http_port = c._proc("master", 0).http_port
    stop = threading.Event()

    def flood():
        for i in range(1_000_000):
            if stop.is_set():
                return
            yield master_pb2.Call(id=i + 1, lookup=master_pb2.LookupRequest(
                parent=ROOT_INO, name=b"kv.data"))

    quiet_stop = threading.Event()

    def quiet():
        yield master_pb2.Call(id=1, getattr=master_pb2.GetAttrRequest(ino=ROOT_INO))
        quiet_stop.wait(60)  # then nothing: a quiet mount

    # The client's receive window stays at 64 KiB (no BDP probing): a client that does
    # not read stops taking replies after ~64 KiB of them.
    small_window = auth.with_token(grpc.insecure_channel(
        c.master_addr, options=[("grpc.http2.bdp_probe", 0)]), c.security.token)
    with make_channel(c.master_addr, c.security) as channel, small_window:
        master = master_pb2_grpc.MasterStub(channel)
        master.Create(master_pb2.CreateRequest(
            request_id=new_request_id(), parent=ROOT_INO, name=b"kv.data", mode=0o644),
            timeout=DEADLINE)  # lookups of it answer with a whole inode (~100 bytes)

        def open_calls(ch, requests):
            return ch.stream_stream(
                "/curvine.Master/Calls",
                request_serializer=master_pb2.Call.SerializeToString,
                response_deserializer=master_pb2.CallResult.FromString)(requests)

        quiet_stream = open_calls(channel, quiet())  # open, owes nothing: must survive
        assert next(quiet_stream).id == 1
        before = handled(http_port, "Lookup")
        flood_stream = open_calls(small_window, flood())  # no deadline, never read
        try:
            deadline = time.monotonic() + DEADLINE
            while (cancelled_idle(http_port).get("Calls", 0) < 1
                   and time.monotonic() < deadline):
                time.sleep(0.2)
            assert cancelled_idle(http_port).get("Calls") == 1
            answered = handled(http_port, "Lookup") - before
            print(f"the master answered {answered:.0f} lookups of a stream that read none "
                  f"(cap {MAX_CALLS_IN_FLIGHT} unsent), then cancelled it")
            # ~64 KiB of replies plus the cap; without the cap the master reads and
            # answers on for the whole 2 s (tens of thousands of lookups).
            assert answered < 5_000
            try:
                for _ in flood_stream:
                    pass
                raise AssertionError("the flood stream ended normally")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.CANCELLED, e.code()
            stop.set()

            # The quiet stream and a new one are open: a third is refused.
            second_stop = threading.Event()

            def one_lookup(stop_event):
                yield master_pb2.Call(id=1, lookup=master_pb2.LookupRequest(
                    parent=ROOT_INO, name=b"kv.data"))
                stop_event.wait(60)

            second = open_calls(channel, one_lookup(second_stop))
            assert next(second).id == 1  # served: the cap counts open streams
            third = open_calls(channel, one_lookup(threading.Event()))
            try:
                next(third)
                raise AssertionError("a third Calls stream was accepted")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.code()
                assert "master.max_sessions" in e.details()
            second_stop.set()
            second.cancel()
            time.sleep(3)  # longer than the timeout: the quiet stream is not cancelled
            assert cancelled_idle(http_port).get("Calls") == 1
            assert quiet_stream.is_active()

            # A stream that never sends a call holds a slot and a thread: cancelled
            # after the timeout like one that stopped.
            silent_stop = threading.Event()

            def silent():
                silent_stop.wait(60)
                return
                yield

            silent_stream = open_calls(channel, silent())
            started = time.monotonic()
            try:
                for _ in silent_stream:
                    pass
                raise AssertionError("a silent Calls stream ended normally")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.CANCELLED, e.code()
            finally:
                silent_stop.set()
            assert 1.5 < time.monotonic() - started < DEADLINE
            assert cancelled_idle(http_port).get("Calls") == 2
            assert quiet_stream.is_active()
        finally:
            stop.set()
            quiet_stop.set()
            flood_stream.cancel()
            quiet_stream.cancel()
        assert master.StatFs(master_pb2.StatFsRequest(), timeout=DEADLINE) is not None


def remote_client(make_cluster, tmp_path, extra: str = ""):
    """A one-worker cluster whose worker cuts streams idle for 1 s, and a client
    library instance that reads and writes remotely (short-circuit off); returns
    (CurvineFS, the worker's HTTP port)."""
    import dataclasses

    from curvine.client.files.fs import CurvineFS
    from curvine.common.config import Config
    conf = tmp_path / "limits.toml"
    conf.write_text('[worker]\nstream_idle_timeout = "1s"\n' + extra)
    c = make_cluster(workers=1, mounts=0, conf=str(conf))
    cfg = Config()
    cfg.client = dataclasses.replace(cfg.client, short_circuit=False)
    cfg.security = dataclasses.replace(cfg.security, token_file=c.token_file)
    return CurvineFS(c.master_addr, cfg=cfg), c._proc("worker", 0).http_port


def test_a_writer_that_pauses_past_the_idle_timeout_still_publishes(make_cluster, tmp_path):
    """A remote writer (short-circuit off) streams its block while writing; a pause
    longer than worker.stream_idle_timeout gets the stream cut.  The writer must then
    upload the block whole at publish, to the same worker if it is the only one (it
    used to exclude it, and the master had no other: ENOSPC and the data lost)."""
    fs, http_port = remote_client(make_cluster, tmp_path)
    with fs:
        # placed (and streamed) at once; past master.inline_max, so kept on a worker
        w = fs.open_writer("/slow.data", size_hint=600_000)
        try:
            w.write(0, b"a" * 300_000)
            deadline = time.monotonic() + DEADLINE
            while (cancelled_idle(http_port).get("WriteBlock", 0) < 1
                   and time.monotonic() < deadline):
                time.sleep(0.1)
            assert cancelled_idle(http_port).get("WriteBlock") == 1  # the stream was cut
            w.write(300_000, b"b" * 300_000)
            w.publish()
        finally:
            w.close()
        assert fs.read_bytes("/slow.data") == b"a" * 300_000 + b"b" * 300_000


def test_a_reader_that_pauses_past_the_idle_timeout_reads_on(make_cluster, tmp_path,
                                                             caplog):
    """A remote reader's stream, left unread past worker.stream_idle_timeout, is cut by
    the worker; the next read opens another stream and returns the right bytes, and
    the worker is not counted as failing (it would be avoided for the rest of the
    reader's life).  Blocks of 32 MiB: a reader fetches (and checks the crc32 of) a
    block whole before it serves from it, so the stream left unread is the one of the
    next block, read ahead."""
    import logging

    fs, http_port = remote_client(make_cluster, tmp_path,
                                  '[cluster]\nblock_size = "32MiB"\n')
    data = os.urandom(64 * MIB)
    caplog.set_level(logging.INFO, logger="curvine.client.files.file_reader")
    with fs:
        fs.write_bytes("/r.data", data)
        r = fs.open_reader("/r.data")
        try:
            first = bytes(r.read(0, 17 * MIB))  # past the middle: block 1 is streamed
            deadline = time.monotonic() + DEADLINE
            while (cancelled_idle(http_port).get("ReadBlock", 0) < 1
                   and time.monotonic() < deadline):
                time.sleep(0.1)
            assert cancelled_idle(http_port).get("ReadBlock", 0) >= 1
            time.sleep(QUIET_WAIT)
            rest = bytes(r.read(17 * MIB, 24 * MIB))  # into block 1, whose stream was cut
        finally:
            r.close()
    assert first + rest == data[:41 * MIB]
    messages = [rec.getMessage() for rec in caplog.records]
    assert any("unread for" in m for m in messages), messages
    assert not any(m.startswith("reading block") for m in messages), messages
