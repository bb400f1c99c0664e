"""The FUSE client without a kernel mount: FileWriter/FileReader logic and Operations
called directly from trio (errno mapping, readdir paging, publication at flush),
against a real master and real workers served in-process on loopback
(tests/inproc.py): worker 1 on this host ("test-host", short-circuit), worker 2 on
another.  Failures are real: a worker's server stops, its store refuses an
adoption, the master's placement finds a worker full.

The cross-mount tests against a real cluster live elsewhere (``curvine local``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import stat
import threading
import time
import zlib

import pyfuse3
import pytest
import trio

from curvine.client.blocks import block_client
from curvine.client.files.file_reader import FileReader
from curvine.client.files.file_writer import FileWriter, LocalWorker
from curvine.client.master.master_client import LeaseSession
from curvine.common.config import Config
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.security import NO_SECURITY
from curvine.fuse_client import operations as ops_mod
from curvine.fuse_client.operations import Operations
from curvine.proto import common_pb2

from inproc import InprocCluster, empty_data_dir, tap, wait_until

KIB = 1024
BS = 64 * KIB  # small blocks keep the tests fast
WORKER_CAPACITY = 1 << 39  # two workers: statfs shows 2**40 bytes

# -- the cluster -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory):
    """The workers' data dirs: made once, emptied for each test."""
    base = tmp_path_factory.mktemp("workers")
    return [base / "worker1", base / "worker2"]


@pytest.fixture
def cluster(tmp_path, data_dirs, monkeypatch):
    """A master in tmp_path, worker 1 on this host and worker 2 on another."""
    monkeypatch.setenv("CURVINE_HOST_ID", "test-host")
    local, other = (empty_data_dir(d) for d in data_dirs)
    with InprocCluster(tmp_path, [("test-host", WORKER_CAPACITY, local),
                                  ("other-host", WORKER_CAPACITY, other)], BS) as c:
        yield c


@pytest.fixture
def completes(cluster) -> list:
    """The CompleteFile requests the master answered (publishes)."""
    return tap(cluster.master, "complete")


class BlockCalls:
    """The client's block streams, recorded: the real block_client classes, which also
    note what they were asked for."""

    def __init__(self):
        self.reads: list[tuple[int, int, int]] = []  # (worker, block, offset) of each stream
        self.write_streams: list = []  # WriteBlock streams fed while blocks are written
        self.open_delay = 0.0  # widens races between threads opening streams
        calls = self

        class WriteStream(block_client.BlockWriteStream):
            def __init__(self, worker, block_id, *args, **kwargs):
                super().__init__(worker, block_id, *args, **kwargs)
                self.parts: list[bytes] = []
                self.cancelled = self.finished = False
                calls.write_streams.append(self)

            def send(self, data):
                super().send(data)
                self.parts.append(bytes(data))

            def finish(self, *args, **kwargs):
                result = super().finish(*args, **kwargs)
                self.finished = True
                return result

            def cancel(self):
                self.cancelled = True
                super().cancel()

            def failed(self) -> bool:
                """The call ended (its worker went away): the next send raises."""
                return self._call.done()

        class Reader(block_client.BlockReader):
            def __init__(self, worker, block_id, offset=0, *args, **kwargs):
                time.sleep(calls.open_delay)
                calls.reads.append((worker.worker_id, block_id, offset))
                super().__init__(worker, block_id, offset, *args, **kwargs)

        self.write_stream_class = WriteStream
        self.reader_class = Reader


@pytest.fixture
def block_calls(cluster, monkeypatch) -> BlockCalls:
    calls = BlockCalls()
    monkeypatch.setattr(block_client, "BlockWriteStream", calls.write_stream_class)
    monkeypatch.setattr(block_client, "BlockReader", calls.reader_class)
    return calls


def worker_infos(master) -> dict:
    """worker id -> WorkerInfo, as the master describes its workers."""
    return {w.worker_id: w for w in master.statfs().workers}


def blocks_of(master, ino) -> list:
    """The blocks of the file's published version."""
    return master.get_blocks(ino)[1]


def new_file(master, name=b"f"):
    return master.create(1, name).ino


def writer(master, ino, base=(), short_circuit=True, size_hint=0, local_dirs=None):
    """A FileWriter; with ``size_hint`` its first block is placed at the first byte (as
    every later block is), without it only once its size is known."""
    return FileWriter(master, ino, BS, base, "test-host", workers=worker_infos(master),
                      short_circuit=short_circuit, size_hint=size_hint,
                      local_dirs=local_dirs)


def new_writer(cluster):
    """The cluster's master client, a new empty file and a writer of it."""
    master = cluster.client
    ino = new_file(master)
    return master, ino, writer(master, ino)


def published(master, ino, short_circuit=True) -> bytes:
    inode, blocks, workers = master.get_blocks(ino)
    r = FileReader(blocks, workers, short_circuit=short_circuit, security=NO_SECURITY)
    try:
        data = bytes(r.read(0, inode.size + 10))
    finally:
        r.close()
    assert len(data) == inode.size
    return data


def rand_bytes(rng, n):
    return rng.randbytes(n)


# -- FileWriter ------------------------------------------------------------------------


def test_sequential_write_publish_blocks(cluster):
    master, ino, w = new_writer(cluster)
    data = rand_bytes(random.Random(1), 3 * BS + 1234)
    for i in range(0, len(data), 10_000):
        assert w.write(i, data[i:i + 10_000]) == len(data[i:i + 10_000])
    inode = w.publish()
    assert inode.size == len(data) and inode.state == common_pb2.COMPLETE
    lengths = [b.length for b in blocks_of(master, ino)]
    assert lengths == [BS, BS, BS, 1234]
    assert all(b.checksum == zlib.crc32(cluster.block_bytes(b.block_id))
               for b in blocks_of(master, ino))
    assert published(master, ino) == data
    assert published(master, ino, short_circuit=False) == data
    w.close()


def test_nothing_visible_before_publish(cluster, completes):
    master, ino, w = new_writer(cluster)
    w.write(0, b"x" * (2 * BS + 5))  # two blocks already went to the workers
    assert master.getattr(ino).size == 0 and completes == []
    assert w.read(0, 10) == b"x" * 10  # the handle reads its own version
    w.publish()
    assert published(master, ino) == b"x" * (2 * BS + 5)


def test_holes_between_written_ranges(cluster):
    master, ino, w = new_writer(cluster)
    w.write(0, b"a" * 100)
    w.write(5 * BS + 7, b"b" * 10)
    w.publish()
    blocks = blocks_of(master, ino)
    assert blocks[0].block_id != 0 and blocks[0].length == 100
    assert any(b.block_id == 0 for b in blocks)  # never-written ranges are holes
    expect = b"a" * 100 + bytes(5 * BS + 7 - 100) + b"b" * 10
    assert published(master, ino) == expect
    # a hole is free: the data uploaded is only what was written (plus a block's tail)
    assert sum(b.length for b in blocks if b.block_id) < 2 * BS


def test_random_offset_writes_truncates_and_publishes_match_a_model(cluster):
    master = cluster.client
    rng = random.Random(42)
    ino = new_file(master)
    w = writer(master, ino)
    model = bytearray()
    for step in range(300):
        op = rng.random()
        if op < 0.6:
            off = rng.randrange(0, max(1, len(model) + 2 * BS))
            n = rng.choice([1, 17, 4096, BS - 1, BS, BS + 3, 3 * BS])
            data = rand_bytes(rng, n)
            assert w.write(off, data) == n
            if off > len(model):
                model.extend(bytes(off - len(model)))
            model[off:off + n] = data
        elif op < 0.75:
            size = rng.randrange(0, len(model) + BS + 1)
            w.truncate(size)
            if size < len(model):
                del model[size:]
            else:
                model.extend(bytes(size - len(model)))
        elif op < 0.9:
            off = rng.randrange(0, len(model) + 10)
            n = rng.randrange(1, 2 * BS)
            assert bytes(w.read(off, n)) == bytes(model[off:off + n])
        else:
            w.publish()
            assert published(master, ino) == bytes(model)
        assert w.size == len(model)
    w.publish()
    assert published(master, ino) == bytes(model)
    assert published(master, ino, short_circuit=False) == bytes(model)
    w.close()


def test_truncate_into_an_uploaded_block_makes_a_new_block(cluster):
    master, ino, w = new_writer(cluster)
    w.write(0, b"z" * (2 * BS))
    w.publish()
    first = [b.block_id for b in blocks_of(master, ino)]
    w.truncate(BS + 10)
    w.publish()
    after = blocks_of(master, ino)
    assert after[0].block_id == first[0]  # untouched block reused
    assert after[1].block_id not in first and after[1].length == 10  # blocks are immutable
    assert published(master, ino) == b"z" * (BS + 10)
    w.truncate(3 * BS)  # extending adds a hole
    w.publish()
    assert published(master, ino) == b"z" * (BS + 10) + bytes(3 * BS - BS - 10)
    assert blocks_of(master, ino)[-1].block_id == 0


def test_writes_after_publish_start_from_the_published_version(cluster):
    master, ino, w = new_writer(cluster)
    w.write(0, b"1" * (BS + 100))
    v1 = w.publish().version
    w.write(10, b"2" * 5)
    v2 = w.publish()
    assert v2.version > v1
    assert published(master, ino) == b"1" * 10 + b"2" * 5 + b"1" * (BS + 100 - 15)
    w.write(BS + 100, b"3")  # appending to a short last block re-opens it
    w.publish()
    assert [b.length for b in blocks_of(master, ino)] == [BS, 101]


def test_open_without_truncate_modifies_the_base(cluster):
    master, ino, w = new_writer(cluster)
    w.write(0, b"a" * (2 * BS))
    w.publish()
    w.close()
    inode, blocks, _ = master.get_blocks(ino)
    w2 = writer(master, ino, blocks)
    assert w2.size == 2 * BS
    w2.write(BS + 1, b"b")
    w2.publish()
    assert published(master, ino) == b"a" * (BS + 1) + b"b" + b"a" * (BS - 2)


def test_two_writers_of_one_file_last_publish_wins(cluster):
    master = cluster.client
    ino = new_file(master)
    a, b = writer(master, ino), writer(master, ino)
    da, db = b"A" * (3 * BS + 1), b"B" * (2 * BS + 7)
    for i in range(0, max(len(da), len(db)), 5000):  # interleaved
        if i < len(da):
            a.write(i, da[i:i + 5000])
        if i < len(db):
            b.write(i, db[i:i + 5000])
    b.publish()
    assert published(master, ino) == db
    a.publish()
    assert published(master, ino) == da


def test_upload_fails_over_to_another_worker(cluster):
    master = cluster.client
    cluster.worker(1).stop_serving()  # the master still places blocks there
    ino = new_file(master)
    w = writer(master, ino)
    w.write(0, b"q" * (BS + 1))
    w.publish()
    assert all(b.worker_ids == [2] for b in blocks_of(master, ino))
    cluster.worker(1).serve()
    assert published(master, ino) == b"q" * (BS + 1)


def test_unpublished_writer_close_frees_memory(cluster):
    master, ino, w = new_writer(cluster)
    w.write(0, b"x" * (3 * BS))
    w.close()
    assert not w._extents and w._cur is None
    with pytest.raises(CurvineError):
        w.write(0, b"y")


def test_short_circuit_write_goes_to_a_staging_file_the_worker_adopts(cluster, monkeypatch):
    master, local = cluster.client, cluster.worker(1)
    streamed = []
    real_write_block = block_client.write_block
    monkeypatch.setattr(block_client, "write_block",
                        lambda *a, **k: streamed.append(a) or real_write_block(*a, **k))
    ino = new_file(master)
    w = writer(master, ino)
    data = os.urandom(2 * BS + 5)
    w.write(0, data[:BS - 3])
    # the first block waits in memory until its size is known (placement reserves it)
    assert local.staging_files() == [] and local.store.adopted == []
    w.write(BS - 3, data[BS - 3:])
    # later blocks are written straight into staging files as they come
    staged = local.staging_files()
    assert staged and all(n.endswith(".tmp") and ".c" in n for n in staged)
    # The writer holds the files' flock (the worker sweeps only unlocked files); the
    # first block's file may be adopted (renamed) meanwhile, the last one's stays.
    locked = 0
    for name in staged:
        try:
            fd = os.open(os.path.join(local.data_dir, "staging", name), os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked += 1
        finally:
            os.close(fd)
    assert locked >= 1
    assert w.read(0, len(data)) == data  # read back from the staging files and blocks
    w.publish()
    w.close()
    assert streamed == [] and len(local.store.adopted) == 3 and local.staging_files() == []
    assert all(b.checksum == zlib.crc32(local.block_bytes(b.block_id)) and b.worker_ids == [1]
               for b in blocks_of(master, ino))
    assert published(master, ino) == data


def test_first_block_written_unnamed_then_placed_with_its_size(cluster, monkeypatch):
    """A writer that knows this host's worker (LocalWorker, shared by a mount's writers)
    writes a first block into an unnamed file in that worker's staging area (nothing
    for the worker to sweep, no name before placement), asks for a block of exactly
    the bytes written at publish, and the worker adopts the file: nothing streamed."""
    master, local_worker = cluster.client, cluster.worker(1)
    streamed, hints = [], []
    real_write_block = block_client.write_block
    monkeypatch.setattr(block_client, "write_block",
                        lambda *a, **k: streamed.append(a) or real_write_block(*a, **k))
    add_block = master.add_block
    monkeypatch.setattr(master, "add_block",
                        lambda ino, host, size_hint=0, exclude=():
                        hints.append(size_hint) or add_block(ino, host, size_hint, exclude))
    made = {"unnamed": 0, "named": 0}
    for name, key in (("create_local_tmpfile", "unnamed"), ("create_local_staging", "named")):
        real = getattr(block_client, name)
        monkeypatch.setattr(block_client, name, lambda *a, _r=real, _k=key: (
            made.__setitem__(_k, made[_k] + 1), _r(*a))[1])
    workers = worker_infos(master)
    local = LocalWorker("test-host")
    local.note(workers.values())
    assert local.info.worker_id == 1
    ino = new_file(master)
    w = FileWriter(master, ino, BS, [], "test-host", workers=workers, local_worker=local)
    data = os.urandom(BS // 2 + 3)
    w.write(0, data[:100])
    w.write(100, data[100:])
    assert local_worker.staging_files() == [] and hints == []  # unnamed, not placed yet
    assert made == {"unnamed": 1, "named": 0}
    w.publish()
    w.close()
    assert made == {"unnamed": 1, "named": 0}  # named by a link, not copied into a new file
    assert hints == [len(data)] and streamed == [] and len(local_worker.store.adopted) == 1
    assert local_worker.staging_files() == [] and published(master, ino) == data
    assert blocks_of(master, ino)[0].checksum == zlib.crc32(data)


def test_first_block_placed_elsewhere_is_streamed_from_its_unnamed_file(cluster):
    """The master places the first block on another host's worker (this host's is
    full): the unnamed file's bytes are streamed there and the file vanishes with its
    descriptor."""
    master, full = cluster.client, cluster.worker(1)
    workers = worker_infos(master)
    local = LocalWorker("test-host")
    local.note(workers.values())
    full.store.capacity = 1  # reported with its next heartbeat
    wait_until(lambda: worker_infos(master)[1].capacity == 1, 10, "worker 1 to report it is full")
    ino = new_file(master)
    w = FileWriter(master, ino, BS, [], "test-host", workers=workers, local_worker=local)
    data = os.urandom(5000)
    w.write(0, data)
    w.publish()
    w.close()
    assert full.store.adopted == [] and full.staging_files() == []
    assert [b.worker_ids for b in blocks_of(master, ino)] == [[2]]
    assert published(master, ino) == data


def test_short_circuit_write_streams_when_the_worker_refuses_to_adopt(cluster):
    master, local = cluster.client, cluster.worker(1)
    local.store.refuse_adopt = CurvineError(ErrorKind.NO_SPACE, "worker full")
    ino = new_file(master)
    w = writer(master, ino)
    data = os.urandom(BS + 7)
    w.write(0, data)
    w.publish()
    w.close()
    assert local.store.adopted == [] and local.staging_files() == []
    assert all(b.worker_ids == [2] for b in blocks_of(master, ino))
    assert published(master, ino) == data


def test_short_circuit_write_without_a_usable_data_dir_uses_memory(cluster, tmp_path):
    master, local = cluster.client, cluster.worker(1)
    # e.g. a container without the worker's volume: none of the dirs this client may
    # open is the worker's
    ino = new_file(master)
    w = writer(master, ino, local_dirs=[str(tmp_path / "not-the-workers")])
    w.write(0, b"m" * (BS + 1))
    w.publish()
    w.close()
    assert local.store.adopted == [] and published(master, ino) == b"m" * (BS + 1)
    assert [b.worker_ids for b in blocks_of(master, ino)] == [[1], [1]]


def test_short_circuit_block_modified_while_adopted_continues_in_memory(cluster):
    master, local = cluster.client, cluster.worker(1)
    ino = new_file(master)
    w = writer(master, ino)
    w.write(0, b"a" * BS)
    w.write(BS, b"b" * 10)  # the first block goes off to be adopted
    w.write(5, b"c" * 3)  # ... and is modified again: never the adopted file itself
    w.publish()
    w.close()
    want = b"a" * 5 + b"c" * 3 + b"a" * (BS - 8) + b"b" * 10
    assert published(master, ino) == want
    pos = 0
    for b in blocks_of(master, ino):  # each block file holds what was published
        with open(local.block_path(b.block_id), "rb") as f:
            content = f.read()
        assert content == want[pos:pos + b.length] and zlib.crc32(content) == b.checksum
        pos += b.length
    assert local.staging_files() == []


def test_short_circuit_unpublished_writer_close_removes_its_staging_file(cluster):
    master, local = cluster.client, cluster.worker(1)
    ino = new_file(master)
    w = writer(master, ino, size_hint=100)
    w.write(0, b"x" * 100)
    assert len(local.staging_files()) == 1
    w.close()
    assert local.staging_files() == [] and local.store.adopted == []


def test_memory_blocks_stream_to_the_worker_while_written(cluster, block_calls):
    master = cluster.client
    ino = new_file(master)
    data = os.urandom(2 * BS + 100)
    w = writer(master, ino, short_circuit=False, size_hint=len(data))
    w.write(0, data[:BS + 50])
    streams = block_calls.write_streams
    assert [b"".join(st.parts) for st in streams] == [data[:BS], data[BS:BS + 50]]
    w.write(BS + 50, data[BS + 50:])
    w.publish()
    w.close()
    assert all(st.finished for st in streams) and len(streams) == 3
    assert [b.block_id for b in blocks_of(master, ino)] == [st.block_id for st in streams]
    assert all(b.checksum == zlib.crc32(cluster.block_bytes(b.block_id))
               for b in blocks_of(master, ino))
    assert published(master, ino) == data


def test_stream_survives_a_worker_error_mid_stream(cluster, block_calls):
    master = cluster.client
    ino = new_file(master)
    w = writer(master, ino, short_circuit=False, size_hint=2000)
    w.write(0, b"a" * 1000)
    cluster.worker(1).stop_serving()  # worker 1 goes away mid-block
    stream = block_calls.write_streams[0]
    wait_until(stream.failed, 10, "the stream to worker 1 to fail")
    w.write(1000, b"b" * 1000)
    assert stream.cancelled
    w.publish()  # the whole block goes to worker 2 instead
    cluster.worker(1).serve()
    assert [b.worker_ids for b in blocks_of(master, ino)] == [[2]]
    assert published(master, ino) == b"a" * 1000 + b"b" * 1000


def test_stream_with_every_worker_down_is_a_clean_error_at_close(cluster):
    master = cluster.client
    cluster.master.ns.inline_max = 0  # a file kept inline needs no worker (a test below)
    ops = make_ops(master)
    ops.cfg.client.short_circuit = False

    async def go():
        fi, attr = await ops.create(1, b"s", 0o100644, os.O_WRONLY | os.O_CREAT, Ctx())
        await ops.write(fi.fh, 0, b"x" * 5000)
        for w in cluster.workers:
            w.stop_serving()
        await ops.write(fi.fh, 5000, b"y" * 5000)
        assert await aerrno(ops.flush, fi.fh) in (errno.EIO, errno.EAGAIN, errno.ENOSPC)
        assert master.getattr(attr.st_ino).state == common_pb2.WRITING  # nothing published
        for w in cluster.workers:
            w.serve()
        await ops.release(fi.fh)  # the data is still there: release publishes it
        return attr.st_ino

    ino = trio.run(go)
    assert published(master, ino) == b"x" * 5000 + b"y" * 5000


def test_rewriting_streamed_bytes_ends_the_stream(cluster, block_calls):
    master = cluster.client
    ino = new_file(master)
    w = writer(master, ino, short_circuit=False, size_hint=3000)
    w.write(0, b"a" * 3000)
    w.write(10, b"b" * 10)  # bytes already sent change: the stream cannot be used
    assert block_calls.write_streams[0].cancelled
    w.truncate(2000)
    w.publish()
    w.close()
    want = b"a" * 10 + b"b" * 10 + b"a" * 1980
    assert published(master, ino) == want
    # a new id
    assert blocks_of(master, ino)[0].block_id != block_calls.write_streams[0].block_id


def test_write_behind_applies_in_order_and_publishes_everything(cluster):
    master, ino, w = new_writer(cluster)
    rng = random.Random(7)
    model = bytearray()
    for i in range(60):
        off = rng.randrange(0, len(model) + 1)
        data = rng.randbytes(rng.randrange(1, 3 * KIB))
        if i % 7 == 0:
            w.write(off, data)  # a blocking write between queued ones keeps the order
        else:
            assert w.write_behind(off, data)
        model[off:off + len(data)] = data
        assert w.size == len(model)  # queued bytes count at once (getattr)
    assert bytes(w.read(0, len(model) + 1)) == bytes(model)
    assert w.write_behind(len(model), b"tail") and w.dirty
    model += b"tail"
    w.publish()
    assert not w.dirty and published(master, ino) == bytes(model)
    assert not w.write_behind(0, bytearray(b"mutable"))  # the caller could reuse it
    w.close()
    assert not w.write_behind(0, b"x")  # closed: the blocking path reports it


def test_write_behind_error_fails_the_handle_cleanly(cluster, completes, monkeypatch):
    """A queued write that fails is reported by the next operation and at every
    publish (a clean error at close); nothing is published without it."""
    master, local = cluster.client, cluster.worker(1)
    ino = new_file(master)
    w = writer(master, ino)
    real_write = w._write

    def failing_write(offset, data):
        if offset >= BS:
            raise CurvineError(ErrorKind.IO, "worker w1: connection reset")
        return real_write(offset, data)

    monkeypatch.setattr(w, "_write", failing_write)
    assert w.write_behind(0, b"a" * BS)
    assert w.write_behind(BS, b"b" * 10)  # fails in the thread
    deadline = time.monotonic() + 10
    while w.write_behind(BS + 10, b"c") and time.monotonic() < deadline:
        time.sleep(0.01)  # accepted until the failure is known, then refused
    assert not w.write_behind(BS + 10, b"c")
    for op in (lambda: w.write(0, b"z"), w.publish, w.flush, lambda: w.read(0, 1)):
        with pytest.raises(CurvineError) as e:
            op()
        assert e.value.kind == ErrorKind.IO and "earlier write" in e.value.message
    assert completes == [] and master.getattr(ino).state == common_pb2.WRITING
    w.close()
    wait_until(lambda: local.staging_files() == [], 10, "the staging files to go")


def test_writes_go_on_when_the_file_vanished_before_its_first_block(cluster):
    """add_block at the first write finds the inode gone (another writer's rename
    replaced it): the writes still succeed (memory), publishing reports NOT_FOUND,
    which the FUSE layer drops like writes to an unlinked local file."""
    master = cluster.client
    ino = new_file(master, b"v")
    w = writer(master, ino)
    master.unlink(1, b"v")
    assert w.write(0, b"x" * (BS + 5)) == BS + 5
    assert w.write_behind(BS + 5, b"y") and bytes(w.read(BS, 6)) == b"x" * 5 + b"y"
    with pytest.raises(CurvineError) as e:
        w.publish()
    assert e.value.kind == ErrorKind.NOT_FOUND
    w.close()
    assert cluster.worker(1).staging_files() == []


def test_failing_staging_file_continues_in_memory(cluster, monkeypatch):
    master, local = cluster.client, cluster.worker(1)
    ino = new_file(master)
    w = writer(master, ino, size_hint=150)
    w.write(0, b"a" * 100)
    real_pwrite = os.pwrite

    def pwrite(fd, data, offset):
        if offset >= 100:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    w.write(100, b"b" * 50)  # the local disk is full: the block moves to memory
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    w.publish()
    w.close()
    assert published(master, ino) == b"a" * 100 + b"b" * 50
    assert local.store.adopted == [] and local.staging_files() == []


def test_write_behind_close_while_queued_drops_cleanly(cluster, completes, caplog):
    master, local = cluster.client, cluster.worker(1)
    for i in range(30):
        w = writer(master, new_file(master, b"d%d" % i))
        for k in range(20):
            assert w.write_behind(k * (BS // 4), b"x" * (BS // 4))
        w.close()
    deadline = time.monotonic() + 10
    while local.staging_files() and time.monotonic() < deadline:
        time.sleep(0.01)  # drains still finishing their current write
    assert local.staging_files() == [] and completes == []
    assert "Traceback" not in caplog.text and "failed" not in caplog.text


def test_ops_write_is_queued_and_close_publishes_it(cluster, monkeypatch):
    master = cluster.client
    ops = make_ops(master)
    hops = []

    async def go():
        fi, attr = await ops.create(1, b"q", 0o100644, os.O_WRONLY | os.O_CREAT, Ctx())
        real_run = ops._run
        monkeypatch.setattr(ops, "_run", lambda fn, *a, **k: hops.append(fn) or real_run(fn, *a, **k))
        data = os.urandom(3 * BS + 5)
        for off in range(0, len(data), 4 * KIB):
            assert await ops.write(fi.fh, off, data[off:off + 4 * KIB]) == len(data[off:off + 4 * KIB])
        assert hops == []  # no thread hop per write
        await ops.flush(fi.fh)
        await ops.release(fi.fh)
        assert published(master, attr.st_ino) == data

    trio.run(go)


# -- FileReader ------------------------------------------------------------------------


def _publish_bytes(master, data, name=b"r"):
    ino = new_file(master, name)
    w = writer(master, ino)
    w.write(0, data)
    w.publish()
    w.close()
    return ino


def test_short_circuit_reader_keeps_reading_after_the_block_is_deleted(cluster, block_calls):
    master, local = cluster.client, cluster.worker(1)
    data = rand_bytes(random.Random(3), 2 * BS + 99)
    ino = _publish_bytes(master, data)
    inode, blocks, ws = master.get_blocks(ino)
    r = FileReader(blocks, ws, short_circuit=True, security=NO_SECURITY)
    master.unlink(1, b"r")  # the master has the worker delete the block files
    wait_until(lambda: local.block_files() == [], 10, "every block file to be gone")
    assert bytes(r.read(0, len(data))) == data  # consistency rule 4
    assert block_calls.reads == []  # never went remote
    r.close()


def test_remote_reader_streams_sequentially_and_restarts_on_a_jump(cluster, block_calls):
    master = cluster.client
    data = rand_bytes(random.Random(4), BS)
    ino = _publish_bytes(master, data)
    inode, blocks, ws = master.get_blocks(ino)
    r = FileReader(blocks, ws, short_circuit=False, security=NO_SECURITY)
    for off in range(0, BS, 4096):
        assert bytes(r.read(off, 4096)) == data[off:off + 4096]
    assert len(block_calls.reads) == 1  # one stream for the sequential pass
    assert bytes(r.read(100, 50)) == data[100:150]  # behind the kept window? still right
    assert bytes(r.read(BS - 10, 100)) == data[BS - 10:]
    assert r.read(BS, 10) == b""
    r.close()


def test_remote_reader_concurrent_readahead_style_reads(cluster, block_calls):
    """Several threads read 4 KiB pieces slightly out of order, across blocks, as the
    kernel's async readahead does: every read is right and no stream is wasted."""
    import concurrent.futures
    master = cluster.client
    data = rand_bytes(random.Random(8), 6 * BS + 123)
    ino = _publish_bytes(master, data)
    inode, blocks, ws = master.get_blocks(ino)
    block_calls.open_delay = 0.002
    r = FileReader(blocks, ws, short_circuit=False, readahead=1, security=NO_SECURITY)
    offs = list(range(0, len(data), 4096))
    rng = random.Random(9)
    for i in range(0, len(offs) - 4, 4):  # local shuffles only
        window = offs[i:i + 4]
        rng.shuffle(window)
        offs[i:i + 4] = window

    def rd(off):
        return off, bytes(r.read(off, 4096))

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        for off, got in ex.map(rd, offs):
            assert got == data[off:off + 4096]
    assert len(block_calls.reads) < 4 * len(blocks)  # streams continued, not restarted per read
    r.close()


def test_reader_fails_over_to_another_replica(cluster, block_calls):
    master = cluster.client
    master.set_policy(1, replicas=2)  # files created in / from now on
    data = rand_bytes(random.Random(5), BS + 5)
    ino = _publish_bytes(master, data)
    inode, blocks, ws = master.get_blocks(ino)
    assert all(sorted(b.worker_ids) == [1, 2] for b in blocks)
    cluster.worker(1).stop_serving()
    r = FileReader(blocks, ws, short_circuit=False, security=NO_SECURITY)
    assert bytes(r.read(0, BS + 5)) == data
    read_from = {w for w, _, _ in block_calls.reads}
    assert read_from == {1, 2} or read_from == {2}
    r.close()


def test_reader_holes_are_zeros(cluster):
    blocks = [common_pb2.Block(block_id=0, length=BS), common_pb2.Block(block_id=0, length=10)]
    r = FileReader(blocks, {}, short_circuit=True, security=NO_SECURITY)
    assert bytes(r.read(BS - 5, 100)) == bytes(15)
    assert r.size == BS + 10


def test_reader_all_replicas_gone_is_a_clean_error(cluster):
    master = cluster.client
    ino = _publish_bytes(master, b"k" * 100)
    inode, blocks, ws = master.get_blocks(ino)
    cluster.worker(1).store.delete([blocks[0].block_id])  # the worker lost its only copy
    r = FileReader(blocks, ws, short_circuit=True, security=NO_SECURITY)
    with pytest.raises(CurvineError):
        r.read(0, 100)


# -- Operations -----------------------------------------------------------------------


class Ctx:
    uid = os.getuid()
    gid = os.getgid()
    pid = os.getpid()
    umask = 0o022


def make_ops(master) -> Operations:
    cfg = Config()
    cfg.cluster.block_size = BS
    return Operations(cfg, master=master)


def run(fn, *args):
    return trio.run(fn, *args)


def errno_of(coro_fn, *args):
    async def go():
        try:
            await coro_fn(*args)
        except pyfuse3.FUSEError as e:
            return e.errno
        return 0
    return trio.run(go)


def test_ops_errno_mapping(cluster):
    master = cluster.client
    ops = make_ops(master)
    ctx = Ctx()
    run(ops.mkdir, 1, b"d", 0o755, ctx)
    d = master.lookup(1, b"d").ino
    master.create(d, b"inner")
    assert errno_of(ops.lookup, 1, b"x" * 256, ctx) == errno.ENAMETOOLONG
    assert errno_of(ops.create, 1, b"x" * 256, 0o100644, os.O_WRONLY, ctx) == errno.ENAMETOOLONG
    assert errno_of(ops.lookup, 1, b"missing", ctx) == errno.ENOENT
    assert errno_of(ops.rmdir, 1, b"d", ctx) == errno.ENOTEMPTY
    assert errno_of(ops.mkdir, 1, b"d", 0o755, ctx) == errno.EEXIST
    f = master.lookup(d, b"inner").ino
    assert errno_of(ops.lookup, f, b"below", ctx) == errno.ENOTDIR  # a path through a file
    assert errno_of(ops.rename, 1, b"d", d, b"sub", 0, ctx) == errno.EINVAL  # into itself
    # an exchange needs both names; both flags at once is EINVAL (as the kernel says)
    assert errno_of(ops.rename, 1, b"d", 1, b"e", pyfuse3.RENAME_EXCHANGE, ctx) == errno.ENOENT
    assert errno_of(ops.rename, 1, b"d", 1, b"e",
                    pyfuse3.RENAME_EXCHANGE | pyfuse3.RENAME_NOREPLACE, ctx) == errno.EINVAL
    master.create(1, b"taken")
    master.complete_file(f, [], 0)
    assert errno_of(ops.rename, d, b"inner", 1, b"taken", pyfuse3.RENAME_NOREPLACE,
                    ctx) == errno.EEXIST
    assert errno_of(ops.rename, d, b"inner", 1, b"taken", 0, ctx) == 0
    assert errno_of(ops.link, d, 1, b"hard", ctx) == errno.EPERM  # of a directory
    assert errno_of(ops.link, f, 1, b"taken", ctx) == errno.EEXIST
    assert errno_of(ops.link, f, 1, b"hard", ctx) == 0
    assert errno_of(ops.symlink, 1, b"sym", b"target", ctx) == 0
    assert errno_of(ops.symlink, 1, b"sym", b"other", ctx) == errno.EEXIST
    assert errno_of(ops.readlink, f, ctx) == errno.EINVAL  # not a symlink
    assert errno_of(ops.mknod, 1, b"fifo", stat.S_IFIFO | 0o644, 0, ctx) == 0
    assert errno_of(ops.mknod, 1, b"odd", 0o170000 | 0o644, 0, ctx) == errno.EINVAL
    assert errno_of(ops.getxattr, f, b"security.capability", ctx) == errno.ENODATA
    assert errno_of(ops.setxattr, f, b"trusted.x", b"v", ctx) == errno.EOPNOTSUPP
    assert errno_of(ops.getxattr, f, b"user.none", ctx) == errno.ENODATA
    assert errno_of(ops.mknod, 1, b"plain", stat.S_IFREG | 0o644, 0, ctx) == 0
    assert master.lookup(1, b"plain").state == common_pb2.COMPLETE
    assert errno_of(ops.unlink, 1, b"missing", ctx) == errno.ENOENT
    assert errno_of(ops.read, 12345, 0, 10) == errno.EBADF


def test_ops_rename_of_a_file_someone_else_is_still_creating_is_refused(cluster):
    """LMCache: writer 1 closed its <key>.tmp, another writer renamed it already and
    writer 2 created a new, unpublished <key>.tmp.  Writer 1's rename must not move
    writer 2's empty file onto <key>.data."""
    master = cluster.client
    ops = make_ops(master)
    ctx = Ctx()

    async def go():
        master.create(1, b"k.tmp")  # created by a writer on another mount
        assert await aerrno(ops.rename, 1, b"k.tmp", 1, b"k.data", 0, ctx) == errno.ENOENT
        assert master.lookup(1, b"k.tmp")
        # the process writing the file may rename it before closing
        fi, attr = await ops.create(1, b"mine.tmp", 0o100644, os.O_WRONLY, ctx)
        await ops.write(fi.fh, 0, b"data")
        await ops.rename(1, b"mine.tmp", 1, b"mine.data", 0, ctx)
        await ops.release(fi.fh)
        assert published(master, master.lookup(1, b"mine.data").ino) == b"data"

    trio.run(go)


async def aerrno(coro_fn, *args):
    try:
        await coro_fn(*args)
    except pyfuse3.FUSEError as e:
        return e.errno
    return 0


def test_ops_unexpected_exception_is_eio_and_logged_once(cluster, caplog, monkeypatch):
    master = cluster.client
    ops = make_ops(master)
    real_unary = master.unary

    def boom(prepared, timeout, wait):  # a bug in the mount while it gets attributes
        if prepared.method == "GetAttr":
            raise ValueError("bug")
        return real_unary(prepared, timeout, wait)

    monkeypatch.setattr(master, "unary", boom)
    assert errno_of(ops.getattr, 1, Ctx()) == errno.EIO
    assert sum("getattr" in r.getMessage() for r in caplog.records) == 1


def test_ops_user_errors_log_no_tracebacks(cluster, caplog):
    """User errors are logged at DEBUG (_fuse_op), never with a traceback."""
    master = cluster.client
    ops = make_ops(master)
    ctx = Ctx()
    run(ops.mkdir, 1, b"d", 0o755, ctx)
    d = master.lookup(1, b"d").ino
    f = master.create(d, b"inner").ino
    caplog.set_level("DEBUG", logger="curvine.fuse_client")
    user_errors = [
        (ops.lookup, (1, b"missing", ctx), errno.ENOENT),
        (ops.lookup, (1, b"x" * 256, ctx), errno.ENAMETOOLONG),
        (ops.lookup, (f, b"below", ctx), errno.ENOTDIR),
        (ops.mkdir, (1, b"d", 0o755, ctx), errno.EEXIST),
        (ops.rmdir, (1, b"d", ctx), errno.ENOTEMPTY),
        (ops.unlink, (1, b"missing", ctx), errno.ENOENT),
        (ops.rename, (1, b"d", d, b"sub", 0, ctx), errno.EINVAL),
    ]
    for handler, args, expected in user_errors:
        assert errno_of(handler, *args) == expected, handler.__name__
    mine = [r for r in caplog.records if r.name.startswith("curvine.fuse_client")]
    # each handler that failed with a user error logged it (a miss is no error: none)
    assert {r.getMessage().split("(")[0] for r in mine} >= {"lookup", "mkdir", "rmdir",
                                                           "unlink", "rename"}
    assert [r.getMessage() for r in mine if r.levelname != "DEBUG"] == []
    # no traceback, from anyone
    assert [r.getMessage() for r in caplog.records if r.exc_info is not None] == []
    assert "Traceback" not in caplog.text


def test_ops_write_publishes_at_flush_and_each_handle_is_a_version(cluster):
    master = cluster.client
    ops = make_ops(master)
    ctx = Ctx()

    async def go():
        fi, attr = await ops.create(1, b"k.tmp", 0o100644, os.O_WRONLY | os.O_CREAT, ctx)
        assert fi.direct_io and stat.S_ISREG(attr.st_mode)
        ino = attr.st_ino
        fi2 = await ops.open(ino, os.O_WRONLY | os.O_TRUNC, ctx)
        await ops.write(fi.fh, 0, b"a" * (BS + 3))
        await ops.write(fi2.fh, 0, b"b" * 10)
        assert (await ops.getattr(ino, ctx)).st_size in (BS + 3, 10)  # unpublished: local size
        assert master.getattr(ino).size == 0
        await ops.flush(fi.fh)
        assert published(master, ino) == b"a" * (BS + 3)
        assert (await ops.getattr(ino, ctx)).st_size == BS + 3  # published size wins now
        await ops.flush(fi2.fh)
        await ops.release(fi.fh)
        await ops.release(fi2.fh)
        assert published(master, ino) == b"b" * 10
        await ops.rename(1, b"k.tmp", 1, b"k.data", 0, ctx)
        entry = await ops.lookup(1, b"k.data", ctx)
        assert entry.st_size == 10 and entry.st_ino == ino
        # read handle: keep_cache only when this mount opened the same version before
        r1 = await ops.open(ino, os.O_RDONLY, ctx)
        assert not r1.keep_cache and not r1.direct_io
        assert bytes(await ops.read(r1.fh, 0, 100)) == b"b" * 10
        r2 = await ops.open(ino, os.O_RDONLY, ctx)
        assert r2.keep_cache
        await ops.release(r1.fh)
        await ops.release(r2.fh)
        # a local writer (O_TRUNC) sets the kernel's size: readers then bypass the cache
        wt = await ops.open(ino, os.O_WRONLY | os.O_TRUNC, ctx)
        r4 = await ops.open(ino, os.O_RDONLY, ctx)
        assert r4.direct_io and not r4.keep_cache
        assert bytes(await ops.read(r4.fh, 0, 100)) == b"b" * 10
        await ops.release(r4.fh)
        await ops.release(wt.fh)  # publishes the emptied version
        assert published(master, ino) == b""
        w0 = await ops.open(ino, os.O_WRONLY, ctx)
        await ops.write(w0.fh, 0, b"b" * 10)
        await ops.release(w0.fh)
        # O_RDWR without O_TRUNC continues from the published version and reads it
        w = await ops.open(ino, os.O_RDWR, ctx)
        await ops.write(w.fh, 2, b"XY")
        assert bytes(await ops.read(w.fh, 0, 100)) == b"bbXY" + b"b" * 6
        # ftruncate on the handle applies to its version, not the master's file
        fields = Fields(update_size=True)
        a = pyfuse3.EntryAttributes()
        a.st_size = 3
        attr = await ops.setattr(ino, a, fields, w.fh, ctx)
        assert attr.st_size == 3 and master.getattr(ino).size == 10
        await ops.fsync(w.fh, False)
        assert published(master, ino) == b"bbX"
        await ops.release(w.fh)
        r3 = await ops.open(ino, os.O_RDONLY, ctx)
        assert not r3.keep_cache  # the version changed since this mount opened it
        await ops.release(r3.fh)

    trio.run(go)


def test_truncate_by_path_racing_the_writers_release(cluster, monkeypatch):
    """truncate(path) goes to the last-used writer of the file on this mount; when that
    handle is released (published and closed) before the truncate reaches it, the
    truncate applies to the published file: not ESTALE (CI saw it once in the random
    workload), and not lost."""
    master = cluster.client
    ops = make_ops(master)
    ctx = Ctx()

    async def go():
        fi, attr = await ops.create(1, b"t", 0o100644, os.O_RDWR | os.O_CREAT, ctx)
        ino = attr.st_ino
        await ops.write(fi.fh, 0, b"x" * 100)
        released = trio.Event()
        real_run = ops._run

        async def run(fn, *a, **k):
            if getattr(fn, "__name__", "") == "truncate":
                await released.wait()  # the writer is published and closed first
            return await real_run(fn, *a, **k)

        monkeypatch.setattr(ops, "_run", run)
        fields = Fields(update_size=True)
        a = pyfuse3.EntryAttributes()
        a.st_size = 10
        got = []

        async def truncate():
            got.append(await ops.setattr(ino, a, fields, None, ctx))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(truncate)
            await trio.sleep(0.05)  # the truncate has picked the writer and waits
            await ops.flush(fi.fh)
            await ops.release(fi.fh)
            released.set()
        assert got[0].st_size == 10
        assert published(master, ino) == b"x" * 10

    trio.run(go)


class Fields:
    """Stands in for pyfuse3.SetattrFields (read-only from Python)."""

    def __init__(self, **set_):
        for k in ("atime", "mtime", "ctime", "mode", "uid", "gid", "size"):
            setattr(self, "update_" + k, set_.get("update_" + k, False))


def test_ops_readdir_pages_large_directories(cluster, monkeypatch):
    from curvine.fuse_client import filesystem as fs_mod
    monkeypatch.setattr(fs_mod, "READDIR_PAGE", 1000)  # 2,500 entries: three master pages
    master = cluster.client
    n = 2500
    for i in range(n):
        master.create(1, b"e%05d" % i)
    ops = make_ops(master)
    seen = []

    def reply(token, name, attr, next_id):
        if len(token) >= 37:  # the kernel's buffer is full
            return False
        token.append(name)
        seen.append((name, next_id))
        return True

    monkeypatch.setattr(ops_mod.pyfuse3, "readdir_reply", reply)

    async def go():
        fh = (await ops.opendir(1, Ctx())).fh
        off = 0
        while True:
            token = []
            await ops.readdir(fh, off, token)
            if not token:
                break
            off = seen[-1][1]
        await ops.releasedir(fh)

    trio.run(go)
    names = [s[0] for s in seen]
    assert names == sorted(b"e%05d" % i for i in range(n))


def test_ops_statfs(cluster):
    master = cluster.client
    _publish_bytes(master, b"u" * 1000)
    # once worker 1's heartbeat reports the block, the master counts its bytes exactly
    wait_until(lambda: master.statfs().used == 1000, 10, "the master to count 1000 bytes used")
    ops = make_ops(master)
    s = run(ops.statfs, Ctx())
    assert s.f_frsize == 4096 and s.f_blocks == (1 << 40) // 4096
    assert s.f_bfree == ((1 << 40) - 1000) // 4096 and s.f_namemax == 255


def test_ops_unlinked_file_still_readable_through_an_open_handle(cluster):
    master = cluster.client
    ino = _publish_bytes(master, b"m" * (BS + 1), name=b"gone")
    ops = make_ops(master)

    async def go():
        fi = await ops.open(ino, os.O_RDONLY, Ctx())
        await ops.unlink(1, b"gone", Ctx())
        # the kernel asks for attributes before reading past its cache: still there
        attr = await ops.getattr(ino, Ctx())
        assert attr.st_size == BS + 1 and attr.st_nlink == 0
        assert bytes(await ops.read(fi.fh, 0, 2 * BS)) == b"m" * (BS + 1)
        await ops.release(fi.fh)
        with pytest.raises(pyfuse3.FUSEError):
            await ops.getattr(ino, Ctx())  # gone once nobody has it open

    trio.run(go)


def test_a_reader_closed_during_its_local_check_keeps_the_copy_and_every_descriptor(
        cluster, monkeypatch, caplog):
    """The handle's close (the FUSE loop's close_nowait) while a thread checks a local
    block file: the check still reads that file (the descriptor stays open until it is
    done), the sound copy is not rejected, and no other descriptor of the process is
    closed in its place (the number the kernel hands out next)."""
    from curvine.client.files import file_reader

    master = cluster.client
    data = os.urandom(BS + 100)
    ino = _publish_bytes(master, data, name=b"race")
    inode, blocks, ws = master.get_blocks(ino)
    entered, go_on = threading.Event(), threading.Event()
    fetchers = []
    real = file_reader._crc_of_file

    def slow_check(block, fd):
        entered.set()
        go_on.wait(10)
        return real(block, fd)

    monkeypatch.setattr(file_reader, "_crc_of_file", slow_check)
    # this process wrote the block: forget that, so that the open checks it
    monkeypatch.setattr(file_reader, "_verified", file_reader._VerifiedFiles())
    made = []
    real_init = file_reader.BlockFetcher.__init__

    def init(self, *args, **kw):
        real_init(self, *args, **kw)
        fetchers.append(self)

    monkeypatch.setattr(file_reader.BlockFetcher, "__init__", init)
    opener = threading.Thread(target=lambda: made.append(
        FileReader(blocks, ws, short_circuit=True, security=NO_SECURITY)))
    opener.start()
    assert entered.wait(10)
    fetcher = fetchers[0]
    assert fetcher.close_nowait()  # the release, while the check runs
    others = [os.open("/dev/null", os.O_RDONLY) for _ in range(4)]  # reuse freed numbers
    try:
        with caplog.at_level("WARNING", logger="curvine"):
            go_on.set()
            opener.join(10)
            assert made, "the reader was not made"
        for fd in others:
            os.fstat(fd)  # still ours: nothing closed them
        assert fetcher._bad_copies == {}
        assert not [r for r in caplog.records if "not intact" in r.getMessage()]
    finally:
        for fd in others:
            os.close(fd)
        for r in made:
            r.close()


def test_a_block_this_process_wrote_is_not_read_whole_again_to_check_it(cluster,
                                                                        monkeypatch):
    """The writer knows the crc32 of what it wrote into the staging file the worker
    adopted: a reader of that version here does not read the file whole to check it;
    once the file changes (another identity), it does."""
    from curvine.client.files import file_reader

    monkeypatch.setattr(file_reader, "_verified", file_reader._VerifiedFiles())
    checked = []
    real = file_reader._crc_of_file
    monkeypatch.setattr(file_reader, "_crc_of_file",
                        lambda block, fd: checked.append(block.block_id) or real(block, fd))
    master = cluster.client
    data = os.urandom(BS + 100)
    ino = _publish_bytes(master, data, name=b"own")
    inode, blocks, ws = master.get_blocks(ino)
    r = FileReader(blocks, ws, short_circuit=True, security=NO_SECURITY)
    try:
        assert bytes(r.read(0, len(data))) == data
    finally:
        r.close()
    assert checked == []
    [path] = [p for b in blocks[:1]
              for p in [block_client.local_block_path(ws[b.worker_ids[0]], b.block_id)]]
    os.utime(path)  # any change to the file: checked again
    r = FileReader(blocks, ws, short_circuit=True, security=NO_SECURITY)
    try:
        assert bytes(r.read(0, len(data))) == data
    finally:
        r.close()
    assert checked and checked[0] == blocks[0].block_id


def test_a_copy_a_reader_rejects_is_checked_by_its_worker_and_dropped(cluster, monkeypatch):
    """A block file changed on disk with its size and mtime kept (only its crc32 can
    tell): the reader rejects the copy and reports it; the master has the worker check
    it (never dropping a copy on a client's word), the worker finds it bad and removes
    it, and the master drops it (the file had no other copy: removed, a clean miss)."""
    from curvine.client.files import file_reader

    monkeypatch.setattr(file_reader, "_verified", file_reader._VerifiedFiles())
    master = cluster.client
    data = os.urandom(BS)
    ino = _publish_bytes(master, data, name=b"rot")
    inode, blocks, ws = master.get_blocks(ino)
    [block] = blocks
    w = ws[block.worker_ids[0]]
    path = block_client.local_block_path(w, block.block_id)
    # a client's word alone drops nothing: a sound copy reported bad stays
    master.report_access([], bad_copies=[(block.block_id, w.worker_id)])
    time.sleep(1.0)  # ten heartbeats: the worker checked it meanwhile
    assert os.path.exists(path) and master.get_blocks(ino)[1][0].worker_ids == [w.worker_id]
    st = os.stat(path)
    with open(path, "r+b") as f:  # bit rot: same size, same mtime
        f.seek(100)
        f.write(bytes([data[100] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    reported = []
    r = FileReader(blocks, ws, short_circuit=True, security=NO_SECURITY,
                   on_bad_copy=lambda b, wid: reported.append((b, wid)))
    try:
        with pytest.raises(CurvineError) as e:
            r.read(0, BS)
        assert e.value.kind == ErrorKind.CHECKSUM
    finally:
        r.close()
    assert reported == [(block.block_id, w.worker_id)]
    master.report_access([], bad_copies=reported)
    wait_until(lambda: not os.path.exists(path), 10, "the worker to remove the bad copy")
    def gone():
        try:
            master.get_blocks(ino)
        except CurvineError as e:
            return e.kind == ErrorKind.NOT_FOUND
        return False
    wait_until(gone, 10, "the master to drop it")


def test_readers_hold_at_most_their_share_of_local_files(cluster, monkeypatch):
    """Local block files held open by the readers of a process are bounded: past the
    bound a reader reads from the worker instead (same bytes), and every file given
    back frees its place.  Before, 3,000 open handles held 3,000 descriptors (and a
    file of many blocks one per block): a client could take every descriptor."""
    from curvine.client.files import file_reader

    master = cluster.client
    data = os.urandom(2 * BS + 7)
    ino = _publish_bytes(master, data, name=b"held")
    inode, blocks, ws = master.get_blocks(ino)
    held = file_reader.held_files
    base = held.held
    monkeypatch.setattr(held, "limit", base + 3)
    readers = [FileReader(blocks, ws, short_circuit=True, security=NO_SECURITY)
               for _ in range(3)]
    try:
        assert held.held == base + 3  # the first holds all 3 blocks, the others none
        assert [len(r._fetcher._files) for r in readers] == [3, 0, 0]
        for r in readers:
            assert bytes(r.read(0, len(data))) == data
    finally:
        for r in readers:
            r.close()
    assert held.held == base


def test_reader_read_cached_serves_only_cached_local_bytes(cluster):
    master = cluster.client
    data = os.urandom(BS + 100)
    ino = _publish_bytes(master, data, name=b"c")
    inode, blocks, ws = master.get_blocks(ino)
    out = bytearray(BS)
    r = FileReader(blocks, ws, short_circuit=True, security=NO_SECURITY)
    try:
        for b in blocks:  # the reader asked the kernel to read the local files ahead
            assert b.block_id in r._fetcher._prefetched
        assert bytes(r.read_cached(10, 1000, out)) == data[10:1010]
        assert bytes(r.read_cached(BS, 4096, out)) == data[BS:]  # short at the end
        assert r.read_cached(BS - 10, 20, out) is None  # across two blocks: thread path
        assert r.read_cached(0, BS + 1, out) is None  # larger than the buffer
        assert r.read_cached(len(data), 10, out) is None
    finally:
        r.close()
    remote = FileReader(blocks, ws, short_circuit=False, security=NO_SECURITY)
    try:  # a remote block: served from its stream (started at open), never from a file
        got = wait_until(lambda: remote.read_cached(0, 10, out), 10, "the stream's first bytes")
        assert bytes(got) == data[:10]
    finally:
        remote.close()


def test_remote_reader_serves_received_chunks_without_blocking(cluster, block_calls):
    master = cluster.client
    data = os.urandom(2 * BS + 3)
    ino = _publish_bytes(master, data, name=b"rr")
    inode, blocks, ws = master.get_blocks(ino)
    out = bytearray(BS)
    r = FileReader(blocks, ws, short_circuit=False, security=NO_SECURITY)
    try:
        assert block_calls.reads == [(1, blocks[0].block_id, 0)]  # streaming since open
        assert bytes(r.read(0, 100)) == data[:100]
        assert r.read_cached(BS + 10, 100, out) is None  # block 1 has no stream yet
        for off in range(100, BS - 5000, 5000):  # what the stream has received: no blocking
            got = r.read_cached(off, 5000, out)
            assert got is not None and bytes(got) == data[off:off + 5000]
        # block 0 was read once, by its first stream (past its middle, block 1's
        # stream may have started in the background: readahead, the next test)
        assert [c for c in block_calls.reads if c[1] == blocks[0].block_id] == \
            [(1, blocks[0].block_id, 0)]
    finally:
        r.close()


def test_remote_reader_streams_the_next_block_ahead(cluster, block_calls):
    master = cluster.client
    data = os.urandom(3 * BS)
    ino = _publish_bytes(master, data, name=b"ra")
    inode, blocks, ws = master.get_blocks(ino)
    r = FileReader(blocks, ws, short_circuit=False, security=NO_SECURITY)
    try:
        assert bytes(r.read(0, BS // 2)) == data[:BS // 2]
        assert [b for _, b, _ in block_calls.reads] == [blocks[0].block_id]
        assert bytes(r.read(BS // 2, BS // 4)) == data[BS // 2:3 * BS // 4]  # past the middle
        assert (1, blocks[1].block_id, 0) in block_calls.reads  # block 1 is streaming already
        assert bytes(r.read(0, 3 * BS)) == data
        assert sorted(b for _, b, _ in block_calls.reads) == sorted(b.block_id for b in blocks)
    finally:
        r.close()


def test_ops_read_of_cached_local_bytes_needs_no_thread(cluster, monkeypatch):
    master = cluster.client
    data = os.urandom(BS + 1)
    ino = _publish_bytes(master, data, name=b"n")
    ops = make_ops(master)
    hops = []

    async def go():
        fi = await ops.open(ino, os.O_RDONLY, Ctx())
        real_run = ops._run
        monkeypatch.setattr(ops, "_run", lambda fn, *a, **k: hops.append(fn) or real_run(fn, *a, **k))
        first = await ops.read(fi.fh, 0, 4096)
        assert bytes(first) == data[:4096] and hops == []
        assert bytes(await ops.read(fi.fh, BS - 1, 2)) == data[BS - 1:BS + 1]  # two blocks
        assert len(hops) == 1
        await ops.release(fi.fh)

    trio.run(go)


# -- fs.py ------------------------------------------------------------------------------


def test_fs_path_api(cluster, tmp_path):
    from curvine.client.files.fs import CurvineFS
    master = cluster.client
    fs = CurvineFS(master=master)
    fs.mkdir("/a/b", parents=True)
    src = tmp_path / "src.bin"
    data = random.Random(7).randbytes(3 * BS + 11)
    src.write_bytes(data)
    node = fs.put(str(src), "/a/b/x.tmp")
    assert node.size == len(data)
    fs.rename("/a/b/x.tmp", "/a/b/x.data")
    assert [n for n, _ in fs.listdir("/a/b")] == [b"x.data"]
    assert fs.read_bytes("/a/b/x.data") == data
    out = tmp_path / "out.bin"
    assert fs.get("/a/b/x.data", str(out)) == len(data) and out.read_bytes() == data
    with pytest.raises(CurvineError) as e:
        fs.stat("/a/b/x.data/below")
    assert e.value.kind == ErrorKind.NOT_DIR
    assert not fs.exists("/a/nope")
    fs.unlink("/a/b/x.data")
    fs.rmdir("/a/b")
    assert fs.listdir("/a") == []


def test_ops_create_and_close_without_writes_publishes_after_close(cluster, completes):
    """open(O_CREAT) + close of a new file: nothing to publish before close returns (it
    reads as empty already); release publishes the empty version, unless another
    writer published first; a rename right after close works (touch a; mv a b)."""
    master = cluster.client
    ops = make_ops(master)
    ctx = Ctx()

    async def go():
        fi, attr = await ops.create(1, b"t", 0o100644, os.O_WRONLY | os.O_CREAT, ctx)
        published_before = len(completes)
        await ops.flush(fi.fh)
        assert len(completes) == published_before  # close returned without a publish
        assert master.getattr(attr.st_ino).state == common_pb2.WRITING
        await ops.release(fi.fh)
        assert len(completes) == published_before + 1
        assert master.getattr(attr.st_ino).state == common_pb2.COMPLETE
        # another writer publishes data before this handle's release: theirs stays
        fi, attr = await ops.create(1, b"u", 0o100644, os.O_WRONLY | os.O_CREAT, ctx)
        await ops.flush(fi.fh)
        w = await ops.open(attr.st_ino, os.O_WRONLY, ctx)
        await ops.write(w.fh, 0, b"data")
        await ops.release(w.fh)
        await ops.release(fi.fh)
        assert published(master, attr.st_ino) == b"data"
        # touch v; mv v w: the rename comes before the release's publish
        fi, attr = await ops.create(1, b"v", 0o100644, os.O_WRONLY | os.O_CREAT, ctx)
        await ops.flush(fi.fh)

        class Other(Ctx):
            pid = 1  # another process (init): not the one that wrote the file

        await ops.rename(1, b"v", 1, b"w", 0, Other())
        assert master.lookup(1, b"w").ino == attr.st_ino
        await ops.release(fi.fh)
        # a file someone else is still creating stays guarded
        master.create(1, b"x")
        assert await aerrno(ops.rename, 1, b"x", 1, b"y", 0, Other()) == errno.ENOENT
        # the handle wrote: published at close as before
        fi, attr = await ops.create(1, b"z", 0o100644, os.O_WRONLY | os.O_CREAT, ctx)
        await ops.write(fi.fh, 0, b"zz")
        await ops.flush(fi.fh)
        assert published(master, attr.st_ino) == b"zz"
        await ops.release(fi.fh)
        # no handle is left waiting for its empty publish: another process's rename names
        # no file as this mount's own (RenameRequest.writer_inos)
        renames = tap(cluster.master, "rename")
        await ops.rename(1, b"z", 1, b"z.data", 0, Other())
        assert [list(r.writer_inos) for r in renames] == [[]]

    trio.run(go)


def test_ops_attributes_while_a_release_publishes(cluster):
    """A handle's release publishes after it left the handle table: lookups, getattr
    and renames of the inode meanwhile answer normally (no EIO)."""
    master = cluster.client
    ops = make_ops(master)
    ctx = Ctx()
    gate = threading.Event()
    real_complete = cluster.master.complete

    def slow_complete(req):  # the master takes its time to publish
        gate.wait(10)
        return real_complete(req)

    async def go():
        fi, attr = await ops.create(1, b"r", 0o100644, os.O_WRONLY | os.O_CREAT, ctx)
        await ops.flush(fi.fh)
        cluster.master.complete = slow_complete
        async with trio.open_nursery() as n:
            n.start_soon(ops.release, fi.fh)
            await trio.sleep(0.05)
            assert (await ops.lookup(1, b"r", ctx)).st_ino == attr.st_ino
            assert (await ops.getattr(attr.st_ino, ctx)).st_size == 0
            gate.set()
        cluster.master.complete = real_complete
        assert master.getattr(attr.st_ino).state == common_pb2.COMPLETE

    trio.run(go)


def test_ops_directory_attributes_come_with_changes_and_expire(cluster):
    """The kernel drops a directory's attributes after every create/unlink in it and
    needs them for the next permission check: the mount answers from the attributes
    the change itself returned, for at most fuse.attr_timeout."""
    master = cluster.client
    ops = make_ops(master)
    ops.cfg.fuse.attr_timeout = 0.2
    ctx = Ctx()
    asked = tap(cluster.master, "getattr_reply")  # every GetAttr the master answers

    def calls():
        return [req.ino for req in asked]

    async def go():
        d = await ops.mkdir(1, b"d", 0o755, ctx)
        fi, attr = await ops.create(d.st_ino, b"f", 0o100644, os.O_WRONLY | os.O_CREAT, ctx)
        await ops.release(fi.fh)
        before = cluster.master.getattr(d.st_ino).mtime_ns
        fi, _ = await ops.create(d.st_ino, b"g", 0o100644, os.O_WRONLY | os.O_CREAT, ctx)
        await ops.release(fi.fh)
        changed = cluster.master.getattr(d.st_ino).mtime_ns  # what the create of g changed
        assert changed != before
        got = await ops.getattr(d.st_ino, ctx)
        assert not calls() and got.st_mtime_ns == changed and got.attr_timeout <= 0.2
        await trio.sleep(0.3)  # past fuse.attr_timeout: asked again
        await ops.getattr(d.st_ino, ctx)
        assert calls() == [d.st_ino]
        await ops.getattr(attr.st_ino, ctx)  # files are never answered from it
        assert calls() == [d.st_ino, attr.st_ino]

    trio.run(go)


def test_ops_empty_close_publishes_with_the_creation_mtime(cluster, completes):
    """A close without writes changes no attribute (POSIX: creat sets the times), so
    the kernel may keep the create reply's attributes under a lease."""
    master = cluster.client
    # the mount's lease session (without a kernel to invalidate): creates are leased
    session = LeaseSession(master, lambda names, inodes: None, lambda: None)
    session.start()
    try:
        assert session.up.wait(10)
        ops = make_ops(master)

        async def go():
            fi, attr = await ops.create(1, b"e", 0o100644, os.O_WRONLY | os.O_CREAT, Ctx())
            assert attr.attr_timeout > 5  # leased: a new empty file
            await ops.flush(fi.fh)
            await ops.release(fi.fh)
            return attr

        attr = trio.run(go)
    finally:
        session.close()
    assert attr.st_mtime_ns > 0  # the time the master gave the file at its creation
    assert [(r.ino, r.size, r.mtime_ns, r.if_unpublished) for r in completes] == [
        (attr.st_ino, 0, attr.st_mtime_ns, True)]


def test_a_small_file_is_published_inline_until_the_master_has_no_room(cluster):
    """A version of at most master.inline_max is published with its bytes in
    CompleteFile (no AddBlock); when the master's inline space is full (NO_SPACE) the
    same close stores it on a worker instead, and the file reads the same either way."""
    master = cluster.client
    adds = tap(cluster.master, "add_block")
    ops = make_ops(master)
    data = os.urandom(5000)

    async def store(name: bytes) -> int:
        fi, attr = await ops.create(1, name, 0o100644, os.O_WRONLY | os.O_CREAT, Ctx())
        await ops.write(fi.fh, 0, data)
        await ops.flush(fi.fh)
        await ops.release(fi.fh)
        return attr.st_ino

    inline = run(store, b"inline")
    assert [(b.block_id, b.data) for b in blocks_of(master, inline)] == [(0, data)]
    assert not adds
    cluster.master.ns.inline_capacity = 4999  # full for these 5000 bytes
    stored = run(store, b"stored")
    [block] = blocks_of(master, stored)
    assert block.block_id and not block.data and block.worker_ids and adds
    assert published(master, inline) == published(master, stored) == data


def test_a_block_write_right_after_a_worker_restart_waits_out_the_backoff(cluster,
                                                                         monkeypatch, request):
    """A worker back from a restart is refused at once by a client channel still in its
    reconnect backoff from the outage: the write waits for the channel once
    (block_client._ready_again) instead of failing (seen in CI: a put right after both
    workers restarted failed UNAVAILABLE).  A 3 s backoff makes the window certain."""
    from curvine.common import rpc
    monkeypatch.setattr(rpc, "CHANNEL_OPTIONS", [
        (k, 3000 if k in ("grpc.initial_reconnect_backoff_ms", "grpc.min_reconnect_backoff_ms",
                          "grpc.max_reconnect_backoff_ms") else v)
        for k, v in rpc.CHANNEL_OPTIONS])
    block_client.close_channels()  # channels made with these options...
    request.addfinalizer(block_client.close_channels)  # ...and none left for later tests
    master = cluster.client
    w = cluster.workers[0]
    info = next(i for i in master.statfs().workers if i.worker_id == w.worker_id)

    def write(data: bytes) -> tuple[int, int]:
        r = master.add_block(new_file(master, os.urandom(4).hex().encode()), "test-host")
        return block_client.write_block(info, r[0], data, timeout=30, token=r[2],
                                        security=NO_SECURITY)

    assert write(b"a" * 100)[0] == 100
    w.stop_serving()
    monkeypatch.setattr(block_client, "RECONNECT_WAIT", 0.0, raising=False)  # backoff starts
    with pytest.raises(CurvineError) as e:
        write(b"b" * 100)
    assert e.value.kind == ErrorKind.UNAVAILABLE
    w.serve()  # back, while the channel backs off for 3 s
    monkeypatch.setattr(block_client, "RECONNECT_WAIT", 10.0, raising=False)
    t0 = time.monotonic()
    assert write(b"c" * 100)[0] == 100
    assert time.monotonic() - t0 < 10


def test_a_block_read_right_after_a_worker_restart_waits_out_the_backoff(cluster,
                                                                        monkeypatch, request):
    """The same for a reader of a block whose only replica is on the restarted worker:
    the read's last try waits for the channel (FileReader._fetched, wait_ready) instead
    of failing EIO while the channel backs off."""
    from curvine.common import rpc
    monkeypatch.setattr(rpc, "CHANNEL_OPTIONS", [
        (k, 3000 if k in ("grpc.initial_reconnect_backoff_ms", "grpc.min_reconnect_backoff_ms",
                          "grpc.max_reconnect_backoff_ms") else v)
        for k, v in rpc.CHANNEL_OPTIONS])
    block_client.close_channels()
    request.addfinalizer(block_client.close_channels)
    master = cluster.client
    data = rand_bytes(random.Random(9), BS + 7)
    ino = _publish_bytes(master, data, name=b"restarted")
    inode, blocks, ws = master.get_blocks(ino)
    [worker_id] = {w for b in blocks for w in b.worker_ids}
    w = cluster.worker(worker_id)

    def read() -> bytes:
        r = FileReader(blocks, ws, short_circuit=False, security=NO_SECURITY)
        try:
            return bytes(r.read(0, len(data)))
        finally:
            r.close()

    assert read() == data
    w.stop_serving()
    monkeypatch.setattr(block_client, "RECONNECT_WAIT", 0.0, raising=False)  # backoff starts
    with pytest.raises(CurvineError) as e:
        read()
    assert e.value.kind == ErrorKind.UNAVAILABLE
    w.serve()  # back, while the channel backs off for 3 s
    monkeypatch.setattr(block_client, "RECONNECT_WAIT", 10.0, raising=False)
    t0 = time.monotonic()
    assert read() == data
    assert time.monotonic() - t0 < 10
