"""The FUSE client without a cluster: FileWriter/FileReader logic against an
in-process fake master and fake workers, and Operations called directly (errno
mapping, readdir paging, publication at flush).

The cross-mount tests against a real cluster live elsewhere (``curvine local``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import stat
import time
import zlib

import pyfuse3
import pytest
import trio

from curvine.client import block_client
from curvine.client.file_reader import FileReader
from curvine.client.file_writer import FileWriter, LocalWorker
from curvine.client.master_client import MasterClient
from curvine.common.config import Config
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import check_name
from curvine.fuse_client import operations as ops_mod
from curvine.fuse_client.operations import Operations
from curvine.proto import common_pb2, master_pb2

KIB = 1024
BS = 64 * KIB  # small blocks keep the tests fast

# -- fakes ---------------------------------------------------------------------------


def fake_token(block_id: int, access: str) -> bytes:
    """FakeMaster's block tokens (the real ones are HMACs: common/block_tokens.py)."""
    return f"{access}{block_id}".encode()


class FakeWorkers:
    """Block files of fake workers; patched into client.block_client."""

    def __init__(self, tmp_path, host="test-host"):
        self.blocks: dict[int, bytes] = {}
        self.dir = tmp_path / "data"
        self.dir.mkdir()
        (self.dir / "staging").mkdir()  # short-circuit writes put their files here
        self.failing: set[int] = set()  # worker ids that raise UNAVAILABLE
        self.adopted: list[int] = []  # blocks taken over from client staging files
        self.write_streams: list = []  # WriteBlock streams fed while blocks are written
        self.refuse_adopt: CurvineError | None = None
        self.reads: list[tuple[int, int, int]] = []  # (worker, block, offset) streams
        self.open_delay = 0.0
        self.workers = {
            1: common_pb2.WorkerInfo(worker_id=1, host_id=host, address="w1",
                                     data_dirs=[str(self.dir)]),
            2: common_pb2.WorkerInfo(worker_id=2, host_id="other-host", address="w2",
                                     data_dirs=["/nonexistent"]),
        }

    def path(self, block_id: int) -> str:
        return str(self.dir / f"{block_id:016x}.blk")

    def _check(self, worker, block_id=None, token=None, write=False):
        if worker.worker_id in self.failing:
            raise CurvineError(ErrorKind.UNAVAILABLE, f"worker {worker.address}: down")
        # Like the worker: a block call needs the token FakeMaster gave with the block.
        if block_id is not None and token not in ([fake_token(block_id, "w")] if write else
                                                  [fake_token(block_id, "w"),
                                                   fake_token(block_id, "r")]):
            raise CurvineError(ErrorKind.PERMISSION, f"block {block_id}: token {token!r}")

    def write_block(self, worker, block_id, data, timeout=30.0, token=b""):
        self._check(worker, block_id, token, write=True)
        data = bytes(data)
        self.blocks[block_id] = data
        if worker.worker_id == 1:
            with open(self.path(block_id), "wb") as f:
                f.write(data)
        return len(data), zlib.crc32(data)

    def adopt_block(self, worker, block_id, path, length, checksum, timeout=30.0, token=b""):
        """Like the worker: take over a client staging file as the block."""
        self._check(worker, block_id, token, write=True)
        if self.refuse_adopt is not None:
            raise self.refuse_adopt
        assert worker.worker_id == 1 and os.path.dirname(path) == str(self.dir / "staging")
        with open(path, "rb") as f:
            data = f.read()
        assert len(data) == length and zlib.crc32(data) == checksum
        os.replace(path, self.path(block_id))
        self.blocks[block_id] = data
        self.adopted.append(block_id)
        return length, checksum

    def read_block(self, worker, block_id, offset, length, timeout=30.0, token=b""):
        self._check(worker, block_id, token)
        data = self.blocks[block_id]
        return data[offset:offset + length] if length else data[offset:]

    def local_block_path(self, worker, block_id):
        p = self.path(block_id)
        return p if worker.worker_id == 1 and os.path.exists(p) else None

    def delete(self, block_id):
        self.blocks.pop(block_id, None)
        if os.path.exists(self.path(block_id)):
            os.unlink(self.path(block_id))

    def stream_class(self):
        fake = self

        class FakeWriteStream:
            """block_client.BlockWriteStream: pieces kept, the block stored at finish."""

            def __init__(self, worker, block_id, timeout=30.0, token=b""):
                fake._check(worker, block_id, token, write=True)
                self.worker, self.block_id, self.token = worker, block_id, token
                self.parts, self.cancelled, self.finished = [], False, False
                fake.write_streams.append(self)

            def send(self, data):
                fake._check(self.worker)
                self.parts.append(bytes(data))

            def finish(self, timeout=None):
                assert not self.cancelled
                fake._check(self.worker)
                self.finished = True
                return fake.write_block(self.worker, self.block_id, b"".join(self.parts),
                                        token=self.token)

            def cancel(self):
                self.cancelled = True

        return FakeWriteStream

    def reader_class(self):
        fake = self

        class FakeBlockReader:
            def __init__(self, worker, block_id, offset=0, length=0, timeout=30.0, readahead=4,
                         token=b""):
                fake._check(worker, block_id, token)
                time.sleep(fake.open_delay)  # widens races between threads opening streams
                fake.reads.append((worker.worker_id, block_id, offset))
                self.worker, self.block_id, self.offset = worker, block_id, offset
                self.closed = False
                self._gen = None

            def __iter__(self):
                if self._gen is None:
                    self._gen = self._chunks()
                return self._gen

            def poll(self):  # everything has "arrived" at once
                if self._gen is None or self.closed or self.worker.worker_id in fake.failing:
                    return None
                return next(self._gen, None)

            def _chunks(self):
                data = fake.blocks.get(self.block_id)
                if data is None:
                    raise CurvineError(ErrorKind.NOT_FOUND, "no such block")
                pos = self.offset
                while pos < len(data) and not self.closed:  # like the real one: close ends it
                    fake._check(self.worker)
                    yield data[pos:pos + 16 * KIB]
                    pos += 16 * KIB

            def close(self):
                self.closed = True

        return FakeBlockReader


class FakeMaster:
    """The master's API semantics (proto/master.proto comments), in memory."""

    def __init__(self, workers: FakeWorkers, replicas=(1,)):
        self.w = workers
        self.replicas = list(replicas)
        self.inodes: dict[int, common_pb2.Inode] = {}
        self.blocks: dict[int, list] = {}
        self.dentries: dict[int, dict[bytes, int]] = {1: {}}
        self.next_ino = 2
        self.next_block = 100
        self.session = 0  # no lease session: opens are not recorded
        self.completes = 0
        self.abandoned: list[int] = []  # block ids writers handed back at publish
        self.inodes[1] = common_pb2.Inode(ino=1, type=common_pb2.DIRECTORY, mode=0o755,
                                          nlink=2, state=common_pb2.COMPLETE, parent=1)

    def _err(self, kind, msg=""):
        raise CurvineError(kind, msg)

    def _dir(self, ino):
        if ino not in self.inodes:
            self._err(ErrorKind.NOT_FOUND, f"inode {ino}")
        if self.inodes[ino].type != common_pb2.DIRECTORY:
            self._err(ErrorKind.NOT_DIR, f"inode {ino}")
        return self.dentries[ino]

    def lookup(self, parent, name):
        node = self.lookup_or_none(parent, name)
        if node is None:
            self._err(ErrorKind.NOT_FOUND, repr(name))
        return node

    def lookup_or_none(self, parent, name):
        check_name(name)
        ino = self._dir(parent).get(name)
        return None if ino is None else self.getattr(ino)

    # Operations' namespace calls (MasterClient.prepare / call, fuse_client/calls.py)
    def prepare(self, op, *args, **kwargs):
        return op, args, kwargs

    def call(self, prepared):
        op, args, kwargs = prepared
        fn = {"lookup": self.lookup_leased, "getattr": self.getattr_leased,
              "create": self.create_leased, "mkdir": self.mkdir_leased,
              "unlink": self.unlink, "rmdir": self.rmdir, "rename": self.rename,
              "complete": self.complete_file}[op]
        return fn(*args, **kwargs)

    # leased reads: this fake grants no leases (0 ms); see test_leases.py for real ones
    def lookup_leased(self, parent, name):
        return self.lookup_or_none(parent, name), 0

    def getattr_leased(self, ino):
        return self.getattr(ino), 0

    def create_leased(self, parent, *a, **kw):
        node = self.create(parent, *a, **kw)
        return node, 0, self.getattr(parent)

    def mkdir_leased(self, parent, *a, **kw):
        node = self.mkdir(parent, *a, **kw)
        return node, 0, self.getattr(parent)

    def getattr(self, ino):
        if ino not in self.inodes:
            self._err(ErrorKind.NOT_FOUND, f"inode {ino}")
        i = common_pb2.Inode()
        i.CopyFrom(self.inodes[ino])
        return i

    def setattr(self, ino, **f):
        i = self.inodes[ino]
        for k, v in f.items():
            if k == "size":
                self._truncate(ino, v)
            else:
                setattr(i, k, v)
        return self.getattr(ino)

    def _truncate(self, ino, size):
        blocks, out, pos = self.blocks.get(ino, []), [], 0
        for b in blocks:
            if pos >= size:
                break
            if pos + b.length > size:
                b = common_pb2.Block(block_id=0, length=size - pos)  # good enough here
            out.append(b)
            pos += b.length
        if pos < size:
            out.append(common_pb2.Block(block_id=0, length=size - pos))
        self.blocks[ino] = out
        self.inodes[ino].size = size
        self.inodes[ino].version += 1

    def _new(self, parent, name, typ, mode, uid, gid):
        d = self._dir(parent)
        ino = self.next_ino
        self.next_ino += 1
        self.inodes[ino] = common_pb2.Inode(
            ino=ino, type=typ, mode=mode, uid=uid, gid=gid, parent=parent, name=name,
            nlink=2 if typ == common_pb2.DIRECTORY else 1,
            state=common_pb2.COMPLETE if typ == common_pb2.DIRECTORY else common_pb2.WRITING)
        d[name] = ino
        if typ == common_pb2.DIRECTORY:
            self.dentries[ino] = {}
        else:
            self.blocks[ino] = []
        return self.getattr(ino)

    def mkdir(self, parent, name, mode=0o755, uid=0, gid=0):
        check_name(name)
        if name in self._dir(parent):
            self._err(ErrorKind.EXISTS, repr(name))
        return self._new(parent, name, common_pb2.DIRECTORY, mode, uid, gid)

    def create(self, parent, name, mode=0o644, uid=0, gid=0, exclusive=False):
        check_name(name)
        ino = self._dir(parent).get(name)
        if ino is not None:
            if exclusive:
                self._err(ErrorKind.EXISTS, repr(name))
            if self.inodes[ino].type == common_pb2.DIRECTORY:
                self._err(ErrorKind.IS_DIR, repr(name))
            return self.getattr(ino)
        return self._new(parent, name, common_pb2.FILE, mode, uid, gid)

    def unlink(self, parent, name):
        d = self._dir(parent)
        ino = d.get(name)
        if ino is None:
            self._err(ErrorKind.NOT_FOUND, repr(name))
        if self.inodes[ino].type == common_pb2.DIRECTORY:
            self._err(ErrorKind.IS_DIR, repr(name))
        del d[name]
        for b in self.blocks.pop(ino, []):
            self.w.delete(b.block_id)
        del self.inodes[ino]

    def rmdir(self, parent, name):
        d = self._dir(parent)
        ino = d.get(name)
        if ino is None:
            self._err(ErrorKind.NOT_FOUND, repr(name))
        if self.inodes[ino].type != common_pb2.DIRECTORY:
            self._err(ErrorKind.NOT_DIR, repr(name))
        if self.dentries[ino]:
            self._err(ErrorKind.NOT_EMPTY, repr(name))
        del d[name], self.dentries[ino], self.inodes[ino]

    def rename(self, parent, name, new_parent, new_name, no_replace=False, source_ino=0,
               require_published=False, writer_inos=()):
        src, dst = self._dir(parent), self._dir(new_parent)
        ino = src.get(name)
        if ino is None or (source_ino and ino != source_ino):
            self._err(ErrorKind.NOT_FOUND, repr(name))
        if (require_published and self.inodes[ino].state == common_pb2.WRITING
                and ino not in writer_inos):
            self._err(ErrorKind.NOT_FOUND, "not published")
        p = new_parent
        while True:  # a directory must not move into itself
            if p == ino:
                self._err(ErrorKind.INVALID, "new_parent: inside the source")
            if p == 1:
                break
            p = self.inodes[p].parent
        if new_name in dst:
            if no_replace:
                self._err(ErrorKind.EXISTS, repr(new_name))
            old = dst[new_name]
            if self.inodes[old].type == common_pb2.DIRECTORY:
                self.rmdir(new_parent, new_name)
            else:
                self.unlink(new_parent, new_name)
        del src[name]
        dst[new_name] = ino
        self.inodes[ino].parent = new_parent
        self.inodes[ino].name = new_name

    def listdir(self, ino, start_after=b"", limit=1000):
        names = sorted(n for n in self._dir(ino) if n > start_after)
        page = names[:limit]
        entries = [master_pb2.DirEntry(name=n, inode=self.getattr(self.dentries[ino][n]))
                   for n in page]
        return entries, len(names) > limit

    iterdir = MasterClient.iterdir

    def statfs(self):
        return master_pb2.StatFsReply(capacity=1 << 40, used=1 << 30, files=len(self.inodes),
                                      live_workers=1, block_size=BS)

    def get_blocks(self, ino, session=0, open_id=0):
        inode = self.getattr(ino)
        blocks = [common_pb2.Block(block_id=b.block_id, length=b.length, checksum=b.checksum,
                                   worker_ids=list(b.worker_ids),
                                   token=fake_token(b.block_id, "r"))
                  for b in self.blocks.get(ino, [])]
        return inode, blocks, dict(self.w.workers)

    def add_block(self, ino, client_host_id, size_hint=0, exclude=()):
        if ino not in self.inodes:
            self._err(ErrorKind.NOT_FOUND, f"inode {ino}")
        self.next_block += 1
        targets = [self.w.workers[r] for r in self.replicas if r not in exclude]
        if not targets:
            targets = [w for i, w in self.w.workers.items() if i not in exclude]
        return self.next_block, targets, fake_token(self.next_block, "w")

    def complete_file(self, ino, blocks, size, mtime_ns=0, if_unpublished=False, abandoned=()):
        self.abandoned.extend(abandoned)
        if ino not in self.inodes:
            self._err(ErrorKind.NOT_FOUND, f"inode {ino}")
        if if_unpublished and self.inodes[ino].state == common_pb2.COMPLETE:
            return self.getattr(ino)
        if sum(b.length for b in blocks) != size:
            self._err(ErrorKind.INVALID, "size: not the sum of the block lengths")
        for b in blocks:
            if b.block_id and b.block_id not in self.w.blocks:
                self._err(ErrorKind.NOT_FOUND, f"block {b.block_id}")
        keep = {b.block_id for b in blocks}
        for b in self.blocks.get(ino, []):
            if b.block_id not in keep:
                self.w.delete(b.block_id)
        self.blocks[ino] = [common_pb2.Block(block_id=b.block_id, length=b.length,
                                             checksum=b.checksum, worker_ids=list(b.worker_ids))
                            for b in blocks]
        i = self.inodes[ino]
        i.size, i.state = size, common_pb2.COMPLETE
        i.version += 1
        self.completes += 1
        return self.getattr(ino)

    def close(self):
        pass


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    workers = FakeWorkers(tmp_path)
    monkeypatch.setenv("CURVINE_HOST_ID", "test-host")
    monkeypatch.setattr(block_client, "write_block", workers.write_block)
    monkeypatch.setattr(block_client, "adopt_block", workers.adopt_block)
    monkeypatch.setattr(block_client, "BlockWriteStream", workers.stream_class())
    monkeypatch.setattr(block_client, "read_block", workers.read_block)
    monkeypatch.setattr(block_client, "local_block_path", workers.local_block_path)
    monkeypatch.setattr(block_client, "BlockReader", workers.reader_class())
    return FakeMaster(workers), workers


def new_file(master, name=b"f"):
    return master.create(1, name).ino


def writer(master, ino, base=(), short_circuit=True, size_hint=0):
    """A FileWriter; with ``size_hint`` its first block is placed at the first byte (as
    every later block is), without it only once its size is known."""
    return FileWriter(master, ino, BS, base, "test-host", workers=master.w.workers,
                      short_circuit=short_circuit, size_hint=size_hint)


def published(master, ino, short_circuit=True) -> bytes:
    inode, blocks, workers = master.get_blocks(ino)
    r = FileReader(blocks, workers, short_circuit=short_circuit)
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
    master, workers = cluster
    ino = new_file(master)
    w = writer(master, ino)
    data = rand_bytes(random.Random(1), 3 * BS + 1234)
    for i in range(0, len(data), 10_000):
        assert w.write(i, data[i:i + 10_000]) == len(data[i:i + 10_000])
    inode = w.publish()
    assert inode.size == len(data) and inode.state == common_pb2.COMPLETE
    lengths = [b.length for b in master.blocks[ino]]
    assert lengths == [BS, BS, BS, 1234]
    assert all(b.checksum == zlib.crc32(workers.blocks[b.block_id]) for b in master.blocks[ino])
    assert published(master, ino) == data
    assert published(master, ino, short_circuit=False) == data
    w.close()


def test_nothing_visible_before_publish(cluster):
    master, _ = cluster
    ino = new_file(master)
    w = writer(master, ino)
    w.write(0, b"x" * (2 * BS + 5))  # two blocks already went to the workers
    assert master.getattr(ino).size == 0 and master.completes == 0
    assert w.read(0, 10) == b"x" * 10  # the handle reads its own version
    w.publish()
    assert published(master, ino) == b"x" * (2 * BS + 5)


def test_holes_between_written_ranges(cluster):
    master, _ = cluster
    ino = new_file(master)
    w = writer(master, ino)
    w.write(0, b"a" * 100)
    w.write(5 * BS + 7, b"b" * 10)
    w.publish()
    blocks = master.blocks[ino]
    assert blocks[0].block_id != 0 and blocks[0].length == 100
    assert any(b.block_id == 0 for b in blocks)  # never-written ranges are holes
    expect = b"a" * 100 + bytes(5 * BS + 7 - 100) + b"b" * 10
    assert published(master, ino) == expect
    # a hole is free: the data uploaded is only what was written (plus a block's tail)
    assert sum(b.length for b in blocks if b.block_id) < 2 * BS


def test_random_offset_writes_truncates_and_publishes_match_a_model(cluster):
    master, _ = cluster
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
    master, _ = cluster
    ino = new_file(master)
    w = writer(master, ino)
    w.write(0, b"z" * (2 * BS))
    w.publish()
    first = [b.block_id for b in master.blocks[ino]]
    w.truncate(BS + 10)
    w.publish()
    after = master.blocks[ino]
    assert after[0].block_id == first[0]  # untouched block reused
    assert after[1].block_id not in first and after[1].length == 10  # blocks are immutable
    assert published(master, ino) == b"z" * (BS + 10)
    w.truncate(3 * BS)  # extending adds a hole
    w.publish()
    assert published(master, ino) == b"z" * (BS + 10) + bytes(3 * BS - BS - 10)
    assert master.blocks[ino][-1].block_id == 0


def test_writes_after_publish_start_from_the_published_version(cluster):
    master, _ = cluster
    ino = new_file(master)
    w = writer(master, ino)
    w.write(0, b"1" * (BS + 100))
    v1 = w.publish().version
    w.write(10, b"2" * 5)
    v2 = w.publish()
    assert v2.version > v1
    assert published(master, ino) == b"1" * 10 + b"2" * 5 + b"1" * (BS + 100 - 15)
    w.write(BS + 100, b"3")  # appending to a short last block re-opens it
    w.publish()
    assert [b.length for b in master.blocks[ino]] == [BS, 101]


def test_open_without_truncate_modifies_the_base(cluster):
    master, _ = cluster
    ino = new_file(master)
    w = writer(master, ino)
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
    master, _ = cluster
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
    master, workers = cluster
    workers.failing.add(1)
    ino = new_file(master)
    w = writer(master, ino)
    w.write(0, b"q" * (BS + 1))
    w.publish()
    assert all(b.worker_ids == [2] for b in master.blocks[ino])
    workers.failing.clear()
    assert published(master, ino) == b"q" * (BS + 1)


def test_unpublished_writer_close_frees_memory(cluster):
    master, _ = cluster
    ino = new_file(master)
    w = writer(master, ino)
    w.write(0, b"x" * (3 * BS))
    w.close()
    assert w._extents == [] and w._cur is None
    with pytest.raises(CurvineError):
        w.write(0, b"y")


def _staging_files(workers):
    return sorted(os.listdir(workers.dir / "staging"))


def test_short_circuit_write_goes_to_a_staging_file_the_worker_adopts(cluster, monkeypatch):
    master, workers = cluster
    streamed = []
    monkeypatch.setattr(block_client, "write_block",
                        lambda *a, **k: streamed.append(a) or workers.write_block(*a, **k))
    ino = new_file(master)
    w = writer(master, ino)
    data = os.urandom(2 * BS + 5)
    w.write(0, data[:BS - 3])
    # the first block waits in memory until its size is known (placement reserves it)
    assert _staging_files(workers) == [] and workers.adopted == []
    w.write(BS - 3, data[BS - 3:])
    # later blocks are written straight into staging files as they come
    staged = _staging_files(workers)
    assert staged and all(n.endswith(".tmp") and ".c" in n for n in staged)
    # The writer holds the files' flock (the worker sweeps only unlocked files); the
    # first block's file may be adopted (renamed) meanwhile, the last one's stays.
    locked = 0
    for name in staged:
        try:
            fd = os.open(workers.dir / "staging" / name, os.O_RDONLY)
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
    assert streamed == [] and len(workers.adopted) == 3 and _staging_files(workers) == []
    assert all(b.checksum == zlib.crc32(workers.blocks[b.block_id]) and b.worker_ids == [1]
               for b in master.blocks[ino])
    assert published(master, ino) == data


def test_first_block_written_unnamed_then_placed_with_its_size(cluster, monkeypatch):
    """A writer that knows this host's worker (LocalWorker, shared by a mount's writers)
    writes a first block into an unnamed file in that worker's staging area (nothing
    for the worker to sweep, no name before placement), asks for a block of exactly
    the bytes written at publish, and the worker adopts the file: nothing streamed."""
    master, workers = cluster
    streamed, hints = [], []
    monkeypatch.setattr(block_client, "write_block",
                        lambda *a, **k: streamed.append(a) or workers.write_block(*a, **k))
    add_block = master.add_block
    monkeypatch.setattr(master, "add_block",
                        lambda ino, host, size_hint=0, exclude=():
                        hints.append(size_hint) or add_block(ino, host, size_hint, exclude))
    made = {"unnamed": 0, "named": 0}
    for name, key in (("create_local_tmpfile", "unnamed"), ("create_local_staging", "named")):
        real = getattr(block_client, name)
        monkeypatch.setattr(block_client, name, lambda *a, _r=real, _k=key: (
            made.__setitem__(_k, made[_k] + 1), _r(*a))[1])
    local = LocalWorker("test-host")
    local.note(workers.workers.values())
    assert local.info.worker_id == 1
    ino = new_file(master)
    w = FileWriter(master, ino, BS, [], "test-host", workers=workers.workers,
                   local_worker=local)
    data = os.urandom(BS // 2 + 3)
    w.write(0, data[:100])
    w.write(100, data[100:])
    assert _staging_files(workers) == [] and hints == []  # unnamed, not placed yet
    assert made == {"unnamed": 1, "named": 0}
    w.publish()
    w.close()
    assert made == {"unnamed": 1, "named": 0}  # named by a link, not copied into a new file
    assert hints == [len(data)] and streamed == [] and len(workers.adopted) == 1
    assert _staging_files(workers) == [] and published(master, ino) == data
    assert master.blocks[ino][0].checksum == zlib.crc32(data)


def test_first_block_placed_elsewhere_is_streamed_from_its_unnamed_file(cluster):
    """The master places the first block on another host's worker: the unnamed file's
    bytes are streamed there and the file vanishes with its descriptor."""
    master, workers = cluster
    master.replicas = [2]
    local = LocalWorker("test-host")
    local.note(workers.workers.values())
    ino = new_file(master)
    w = FileWriter(master, ino, BS, [], "test-host", workers=workers.workers,
                   local_worker=local)
    data = os.urandom(5000)
    w.write(0, data)
    w.publish()
    w.close()
    assert workers.adopted == [] and _staging_files(workers) == []
    assert [b.worker_ids for b in master.blocks[ino]] == [[2]]
    assert published(master, ino) == data


def test_short_circuit_write_streams_when_the_worker_refuses_to_adopt(cluster):
    master, workers = cluster
    workers.refuse_adopt = CurvineError(ErrorKind.NO_SPACE, "worker full")
    ino = new_file(master)
    w = writer(master, ino)
    data = os.urandom(BS + 7)
    w.write(0, data)
    w.publish()
    w.close()
    assert workers.adopted == [] and _staging_files(workers) == []
    assert all(b.worker_ids == [2] for b in master.blocks[ino])
    assert published(master, ino) == data


def test_short_circuit_write_without_a_usable_data_dir_uses_memory(cluster):
    master, workers = cluster
    os.rmdir(workers.dir / "staging")  # e.g. a container without the worker's volume
    ino = new_file(master)
    w = writer(master, ino)
    w.write(0, b"m" * (BS + 1))
    w.publish()
    w.close()
    assert workers.adopted == [] and published(master, ino) == b"m" * (BS + 1)
    assert [b.worker_ids for b in master.blocks[ino]] == [[1], [1]]


def test_short_circuit_block_modified_while_adopted_continues_in_memory(cluster):
    master, workers = cluster
    ino = new_file(master)
    w = writer(master, ino)
    w.write(0, b"a" * BS)
    w.write(BS, b"b" * 10)  # the first block goes off to be adopted
    w.write(5, b"c" * 3)  # ... and is modified again: never the adopted file itself
    w.publish()
    w.close()
    want = b"a" * 5 + b"c" * 3 + b"a" * (BS - 8) + b"b" * 10
    assert published(master, ino) == want
    for b in master.blocks[ino]:
        with open(workers.path(b.block_id), "rb") as f:
            assert f.read() == workers.blocks[b.block_id]
    assert _staging_files(workers) == []


def test_short_circuit_unpublished_writer_close_removes_its_staging_file(cluster):
    master, workers = cluster
    ino = new_file(master)
    w = writer(master, ino, size_hint=100)
    w.write(0, b"x" * 100)
    assert len(_staging_files(workers)) == 1
    w.close()
    assert _staging_files(workers) == [] and workers.adopted == []


def test_memory_blocks_stream_to_the_worker_while_written(cluster):
    master, workers = cluster
    ino = new_file(master)
    data = os.urandom(2 * BS + 100)
    w = writer(master, ino, short_circuit=False, size_hint=len(data))
    w.write(0, data[:BS + 50])
    assert [b"".join(st.parts) for st in workers.write_streams] == [data[:BS], data[BS:BS + 50]]
    w.write(BS + 50, data[BS + 50:])
    w.publish()
    w.close()
    assert all(st.finished for st in workers.write_streams) and len(workers.write_streams) == 3
    assert [b.block_id for b in master.blocks[ino]] == [st.block_id for st in workers.write_streams]
    assert all(b.checksum == zlib.crc32(workers.blocks[b.block_id]) for b in master.blocks[ino])
    assert published(master, ino) == data


def test_stream_survives_a_worker_error_mid_stream(cluster):
    master, workers = cluster
    ino = new_file(master)
    w = writer(master, ino, short_circuit=False, size_hint=2000)
    w.write(0, b"a" * 1000)
    workers.failing.add(1)  # worker 1 goes away mid-block
    w.write(1000, b"b" * 1000)
    assert workers.write_streams[0].cancelled
    w.publish()  # the whole block goes to worker 2 instead
    workers.failing.clear()
    assert [b.worker_ids for b in master.blocks[ino]] == [[2]]
    assert published(master, ino) == b"a" * 1000 + b"b" * 1000


def test_stream_with_every_worker_down_is_a_clean_error_at_close(cluster):
    master, workers = cluster
    ops = make_ops(master)
    ops.cfg.client.short_circuit = False

    async def go():
        fi, attr = await ops.create(1, b"s", 0o100644, os.O_WRONLY | os.O_CREAT, Ctx())
        await ops.write(fi.fh, 0, b"x" * 5000)
        workers.failing.update({1, 2})
        await ops.write(fi.fh, 5000, b"y" * 5000)
        assert await aerrno(ops.flush, fi.fh) in (errno.EIO, errno.EAGAIN, errno.ENOSPC)
        assert master.inodes[attr.st_ino].state == common_pb2.WRITING  # nothing published
        workers.failing.clear()
        await ops.release(fi.fh)  # the data is still there: release publishes it
        return attr.st_ino

    ino = trio.run(go)
    assert published(master, ino) == b"x" * 5000 + b"y" * 5000


def test_rewriting_streamed_bytes_ends_the_stream(cluster):
    master, workers = cluster
    ino = new_file(master)
    w = writer(master, ino, short_circuit=False, size_hint=3000)
    w.write(0, b"a" * 3000)
    w.write(10, b"b" * 10)  # bytes already sent change: the stream cannot be used
    assert workers.write_streams[0].cancelled
    w.truncate(2000)
    w.publish()
    w.close()
    want = b"a" * 10 + b"b" * 10 + b"a" * 1980
    assert published(master, ino) == want
    assert master.blocks[ino][0].block_id != workers.write_streams[0].block_id  # a new id


def test_write_behind_applies_in_order_and_publishes_everything(cluster):
    master, workers = cluster
    ino = new_file(master)
    w = writer(master, ino)
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


def test_write_behind_error_fails_the_handle_cleanly(cluster, monkeypatch):
    """A queued write that fails is reported by the next operation and at every
    publish (a clean error at close); nothing is published without it."""
    master, workers = cluster
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
    assert master.completes == 0 and master.inodes[ino].state == common_pb2.WRITING
    w.close()
    deadline = time.monotonic() + 10
    while _staging_files(workers) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _staging_files(workers) == []


def test_writes_go_on_when_the_file_vanished_before_its_first_block(cluster):
    """add_block at the first write finds the inode gone (another writer's rename
    replaced it): the writes still succeed (memory), publishing reports NOT_FOUND,
    which the FUSE layer drops like writes to an unlinked local file."""
    master, workers = cluster
    ino = new_file(master, b"v")
    w = writer(master, ino)
    master.unlink(1, b"v")
    assert w.write(0, b"x" * (BS + 5)) == BS + 5
    assert w.write_behind(BS + 5, b"y") and bytes(w.read(BS, 6)) == b"x" * 5 + b"y"
    with pytest.raises(CurvineError) as e:
        w.publish()
    assert e.value.kind == ErrorKind.NOT_FOUND
    w.close()
    assert _staging_files(workers) == []


def test_failing_staging_file_continues_in_memory(cluster, monkeypatch):
    master, workers = cluster
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
    assert workers.adopted == [] and _staging_files(workers) == []


def test_write_behind_close_while_queued_drops_cleanly(cluster, caplog):
    master, workers = cluster
    for i in range(30):
        w = writer(master, new_file(master, b"d%d" % i))
        for k in range(20):
            assert w.write_behind(k * (BS // 4), b"x" * (BS // 4))
        w.close()
    deadline = time.monotonic() + 10
    while _staging_files(workers) and time.monotonic() < deadline:
        time.sleep(0.01)  # drains still finishing their current write
    assert _staging_files(workers) == [] and master.completes == 0
    assert "Traceback" not in caplog.text and "failed" not in caplog.text


def test_ops_write_is_queued_and_close_publishes_it(cluster, monkeypatch):
    master, _ = cluster
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


def test_short_circuit_reader_keeps_reading_after_the_block_is_deleted(cluster):
    master, workers = cluster
    data = rand_bytes(random.Random(3), 2 * BS + 99)
    ino = _publish_bytes(master, data)
    inode, blocks, ws = master.get_blocks(ino)
    r = FileReader(blocks, ws, short_circuit=True)
    master.unlink(1, b"r")  # deletes the block files
    assert os.listdir(workers.dir) == ["staging"]  # every block file is gone
    assert bytes(r.read(0, len(data))) == data  # consistency rule 4
    assert workers.reads == []  # never went remote
    r.close()


def test_remote_reader_streams_sequentially_and_restarts_on_a_jump(cluster):
    master, workers = cluster
    data = rand_bytes(random.Random(4), BS)
    ino = _publish_bytes(master, data)
    inode, blocks, ws = master.get_blocks(ino)
    r = FileReader(blocks, ws, short_circuit=False)
    for off in range(0, BS, 4096):
        assert bytes(r.read(off, 4096)) == data[off:off + 4096]
    assert len(workers.reads) == 1  # one stream for the sequential pass
    assert bytes(r.read(100, 50)) == data[100:150]  # behind the kept window? still right
    assert bytes(r.read(BS - 10, 100)) == data[BS - 10:]
    assert r.read(BS, 10) == b""
    r.close()


def test_remote_reader_concurrent_readahead_style_reads(cluster):
    """Several threads read 4 KiB pieces slightly out of order, across blocks, as the
    kernel's async readahead does: every read is right and no stream is wasted."""
    import concurrent.futures
    master, workers = cluster
    data = rand_bytes(random.Random(8), 6 * BS + 123)
    ino = _publish_bytes(master, data)
    inode, blocks, ws = master.get_blocks(ino)
    workers.open_delay = 0.002
    r = FileReader(blocks, ws, short_circuit=False, readahead=1)
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
    assert len(workers.reads) < 4 * len(blocks)  # streams continued, not restarted per read
    r.close()


def test_reader_fails_over_to_another_replica(cluster):
    master, workers = cluster
    master.replicas = [1, 2]
    data = rand_bytes(random.Random(5), BS + 5)
    ino = _publish_bytes(master, data)
    inode, blocks, ws = master.get_blocks(ino)
    assert all(sorted(b.worker_ids) == [1, 2] for b in blocks)
    workers.failing.add(1)
    r = FileReader(blocks, ws, short_circuit=False)
    assert bytes(r.read(0, BS + 5)) == data
    assert {w for w, _, _ in workers.reads} == {1, 2} or {w for w, _, _ in workers.reads} == {2}
    r.close()


def test_reader_holes_are_zeros(cluster):
    master, _ = cluster
    blocks = [common_pb2.Block(block_id=0, length=BS), common_pb2.Block(block_id=0, length=10)]
    r = FileReader(blocks, {}, short_circuit=True)
    assert bytes(r.read(BS - 5, 100)) == bytes(15)
    assert r.size == BS + 10


def test_reader_all_replicas_gone_is_a_clean_error(cluster):
    master, workers = cluster
    ino = _publish_bytes(master, b"k" * 100)
    inode, blocks, ws = master.get_blocks(ino)
    workers.delete(blocks[0].block_id)
    r = FileReader(blocks, ws, short_circuit=True)
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
    master, _ = cluster
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
    assert errno_of(ops.rename, 1, b"d", 1, b"e", pyfuse3.RENAME_EXCHANGE, ctx) == errno.EINVAL
    master.create(1, b"taken")
    master.complete_file(f, [], 0)
    assert errno_of(ops.rename, d, b"inner", 1, b"taken", pyfuse3.RENAME_NOREPLACE,
                    ctx) == errno.EEXIST
    assert errno_of(ops.rename, d, b"inner", 1, b"taken", 0, ctx) == 0
    assert errno_of(ops.link, f, 1, b"hard", ctx) == errno.EPERM
    assert errno_of(ops.symlink, 1, b"sym", b"target", ctx) == errno.EPERM
    assert errno_of(ops.mknod, 1, b"fifo", stat.S_IFIFO | 0o644, 0, ctx) == errno.EPERM
    assert errno_of(ops.mknod, 1, b"plain", stat.S_IFREG | 0o644, 0, ctx) == 0
    assert master.lookup(1, b"plain").state == common_pb2.COMPLETE
    assert errno_of(ops.unlink, 1, b"missing", ctx) == errno.ENOENT
    assert errno_of(ops.read, 12345, 0, 10) == errno.EBADF


def test_ops_rename_of_a_file_someone_else_is_still_creating_is_refused(cluster):
    """LMCache: writer 1 closed its <key>.tmp, another writer renamed it already and
    writer 2 created a new, unpublished <key>.tmp.  Writer 1's rename must not move
    writer 2's empty file onto <key>.data."""
    master, _ = cluster
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


def test_ops_unexpected_exception_is_eio_and_logged_once(cluster, caplog):
    master, _ = cluster
    ops = make_ops(master)

    def boom(*a):
        raise ValueError("bug")

    master.getattr = boom
    assert errno_of(ops.getattr, 1, Ctx()) == errno.EIO
    assert sum("getattr" in r.getMessage() for r in caplog.records) == 1


def test_ops_user_errors_log_no_tracebacks(cluster, caplog):
    master, _ = cluster
    ops = make_ops(master)
    caplog.set_level("DEBUG")
    errno_of(ops.lookup, 1, b"missing", Ctx())
    assert all(r.exc_info is None and r.levelname == "DEBUG" for r in caplog.records)


def test_ops_write_publishes_at_flush_and_each_handle_is_a_version(cluster):
    master, _ = cluster
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


class Fields:
    """Stands in for pyfuse3.SetattrFields (read-only from Python)."""

    def __init__(self, **set_):
        for k in ("atime", "mtime", "ctime", "mode", "uid", "gid", "size"):
            setattr(self, "update_" + k, set_.get("update_" + k, False))


def test_ops_readdir_pages_large_directories(cluster, monkeypatch):
    master, _ = cluster
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
        fh = await ops.opendir(1, Ctx())
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
    master, _ = cluster
    ops = make_ops(master)
    s = run(ops.statfs, Ctx())
    assert s.f_frsize == 4096 and s.f_blocks == (1 << 40) // 4096
    assert s.f_bfree == ((1 << 40) - (1 << 30)) // 4096 and s.f_namemax == 255


def test_ops_unlinked_file_still_readable_through_an_open_handle(cluster):
    master, _ = cluster
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


def test_reader_read_cached_serves_only_cached_local_bytes(cluster):
    master, workers = cluster
    data = os.urandom(BS + 100)
    ino = _publish_bytes(master, data, name=b"c")
    inode, blocks, ws = master.get_blocks(ino)
    out = bytearray(BS)
    r = FileReader(blocks, ws, short_circuit=True)
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
    remote = FileReader(blocks, ws, short_circuit=False)
    try:  # a remote block: served from its stream (started at open), never from a file
        assert bytes(remote.read_cached(0, 10, out)) == data[:10]
    finally:
        remote.close()


def test_remote_reader_serves_received_chunks_without_blocking(cluster):
    master, workers = cluster
    data = os.urandom(2 * BS + 3)
    ino = _publish_bytes(master, data, name=b"rr")
    inode, blocks, ws = master.get_blocks(ino)
    out = bytearray(BS)
    r = FileReader(blocks, ws, short_circuit=False)
    try:
        assert workers.reads == [(1, blocks[0].block_id, 0)]  # streaming since open
        assert bytes(r.read(0, 100)) == data[:100]
        assert r.read_cached(BS + 10, 100, out) is None  # block 1 has no stream yet
        streams = len(workers.reads)
        for off in range(100, BS - 5000, 5000):  # what the stream has received: no blocking
            got = r.read_cached(off, 5000, out)
            assert got is not None and bytes(got) == data[off:off + 5000]
        assert len(workers.reads) == streams
    finally:
        r.close()


def test_remote_reader_streams_the_next_block_ahead(cluster):
    master, workers = cluster
    data = os.urandom(3 * BS)
    ino = _publish_bytes(master, data, name=b"ra")
    inode, blocks, ws = master.get_blocks(ino)
    r = FileReader(blocks, ws, short_circuit=False)
    try:
        assert bytes(r.read(0, BS // 2)) == data[:BS // 2]
        assert [b for _, b, _ in workers.reads] == [blocks[0].block_id]
        assert bytes(r.read(BS // 2, BS // 4)) == data[BS // 2:3 * BS // 4]  # past the middle
        assert (1, blocks[1].block_id, 0) in workers.reads  # block 1 is streaming already
        assert bytes(r.read(0, 3 * BS)) == data
        assert sorted(b for _, b, _ in workers.reads) == sorted(b.block_id for b in blocks)
    finally:
        r.close()


def test_ops_read_of_cached_local_bytes_needs_no_thread(cluster, monkeypatch):
    master, _ = cluster
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
    from curvine.client.fs import CurvineFS
    master, _ = cluster
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


def test_ops_create_and_close_without_writes_publishes_after_close(cluster):
    """open(O_CREAT) + close of a new file: nothing to publish before close returns (it
    reads as empty already); release publishes the empty version, unless another
    writer published first; a rename right after close works (touch a; mv a b)."""
    master, _ = cluster
    ops = make_ops(master)
    ctx = Ctx()

    async def go():
        fi, attr = await ops.create(1, b"t", 0o100644, os.O_WRONLY | os.O_CREAT, ctx)
        completes = master.completes
        await ops.flush(fi.fh)
        assert master.completes == completes  # close returned without a publish
        assert master.getattr(attr.st_ino).state == common_pb2.WRITING
        await ops.release(fi.fh)
        assert master.completes == completes + 1
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
        assert ops._empty_pending == {}

    trio.run(go)


def test_ops_attributes_while_a_release_publishes(cluster):
    """A handle's release publishes after it left the handle table: lookups, getattr
    and renames of the inode meanwhile answer normally (no EIO)."""
    import threading
    master, _ = cluster
    ops = make_ops(master)
    ctx = Ctx()
    gate = threading.Event()
    real_complete = master.complete_file

    def slow_complete(*a, **kw):
        gate.wait(10)
        return real_complete(*a, **kw)

    async def go():
        fi, attr = await ops.create(1, b"r", 0o100644, os.O_WRONLY | os.O_CREAT, ctx)
        await ops.flush(fi.fh)
        master.complete_file = slow_complete
        async with trio.open_nursery() as n:
            n.start_soon(ops.release, fi.fh)
            await trio.sleep(0.05)
            assert (await ops.lookup(1, b"r", ctx)).st_ino == attr.st_ino
            assert (await ops.getattr(attr.st_ino, ctx)).st_size == 0
            gate.set()
        master.complete_file = real_complete
        assert master.getattr(attr.st_ino).state == common_pb2.COMPLETE

    trio.run(go)


def test_ops_directory_attributes_come_with_changes_and_expire(cluster):
    """The kernel drops a directory's attributes after every create/unlink in it and
    needs them for the next permission check: the mount answers from the attributes
    the change itself returned, for at most fuse.attr_timeout."""
    master, _ = cluster
    ops = make_ops(master)
    ops.cfg.fuse.attr_timeout = 0.2
    ctx = Ctx()
    calls = []
    real = master.getattr_leased

    def counting(ino):
        calls.append(ino)
        return real(ino)

    master.getattr_leased = counting

    async def go():
        d = await ops.mkdir(1, b"d", 0o755, ctx)
        fi, attr = await ops.create(d.st_ino, b"f", 0o100644, os.O_WRONLY | os.O_CREAT, ctx)
        await ops.release(fi.fh)
        master.inodes[d.st_ino].mtime_ns = 42  # what the next create changes, in this fake
        fi, _ = await ops.create(d.st_ino, b"g", 0o100644, os.O_WRONLY | os.O_CREAT, ctx)
        await ops.release(fi.fh)
        got = await ops.getattr(d.st_ino, ctx)
        assert not calls and got.st_mtime_ns == 42 and got.attr_timeout <= 0.2
        await trio.sleep(0.3)  # past fuse.attr_timeout: asked again
        await ops.getattr(d.st_ino, ctx)
        assert calls == [d.st_ino]
        await ops.getattr(attr.st_ino, ctx)  # files are never answered from it
        assert calls == [d.st_ino, attr.st_ino]

    trio.run(go)


def test_ops_empty_close_publishes_with_the_creation_mtime(cluster):
    """A close without writes changes no attribute (POSIX: creat sets the times), so
    the kernel may keep the create reply's attributes under a lease."""
    master, _ = cluster
    ops = make_ops(master)
    seen = []
    real = master.complete_file

    def recording(ino, blocks, size, mtime_ns=0, if_unpublished=False):
        seen.append((ino, size, mtime_ns, if_unpublished))
        return real(ino, blocks, size, mtime_ns, if_unpublished)

    def create_leased(parent, *a, **kw):  # a master that grants leases, with times
        node = FakeMaster.create(master, parent, *a, **kw)
        master.inodes[node.ino].mtime_ns = 1_700_000_000_123_456_789
        return master.getattr(node.ino), 10_000, master.getattr(parent)

    master.complete_file = recording
    master.create_leased = create_leased

    async def go():
        fi, attr = await ops.create(1, b"e", 0o100644, os.O_WRONLY | os.O_CREAT, Ctx())
        assert attr.attr_timeout > 5  # leased: a new empty file
        await ops.flush(fi.fh)
        await ops.release(fi.fh)
        assert seen == [(attr.st_ino, 0, 1_700_000_000_123_456_789, True)]

    trio.run(go)
