"""Small files kept inline at the master (Block.data, master.inline_max): the master's
checks, its count of inline bytes against master.inline_capacity, replay from the
journal; and through real mounts, a small file written and read with every worker
down, after a master SIGKILL, and growing past inline_max onto a worker.
"""

from __future__ import annotations

import os
import shutil
import signal

import pytest

from cluster_util import master_calls
from curvine.common.errors import ErrorKind
from curvine.common.ids import ROOT_INO, new_request_id
from curvine.proto import common_pb2, master_pb2

from test_master import MiB, add_worker, create, kind_of, make_master, publish, unlink

KIB = 1 << 10


def complete_inline(m, ino: int, data: bytes, holes: int = 0) -> common_pb2.Inode:
    blocks = [common_pb2.Block(block_id=0, length=len(data), data=data)]
    if holes:
        blocks.append(common_pb2.Block(block_id=0, length=holes))
    return m.complete(master_pb2.CompleteFileRequest(
        request_id=new_request_id(), ino=ino, blocks=blocks, size=len(data) + holes)).inode


def content(m, ino: int) -> bytes:
    """The published bytes of an inline file (holes read as zeros)."""
    return b"".join(b.data or bytes(b.length) for b in m.get_blocks(ino).blocks)


def inline_bytes(m) -> int:
    with m.store.read() as txn:
        return m.store.inline_bytes(txn)


# ------------------------------------------------------------------ the master

def test_a_small_version_is_kept_inline_and_replayed(tmp_path):
    m = make_master(tmp_path)
    try:
        f = create(m, ROOT_INO, b"small")
        g = create(m, ROOT_INO, b"cut")
        node = complete_inline(m, f.ino, b"hello" * 100, holes=1000)
        assert node.size == 1500 and node.state == common_pb2.COMPLETE
        assert content(m, f.ino) == b"hello" * 100 + bytes(1000)
        complete_inline(m, g.ino, b"z" * 4000)
        # a truncate cuts the inline bytes (and their count) like a block's length
        m.setattr(master_pb2.SetAttrRequest(request_id=new_request_id(), ino=g.ino, size=10))
        assert content(m, g.ino) == b"z" * 10
        assert inline_bytes(m) == 500 + 10
    finally:
        m.close()
    shutil.rmtree(tmp_path / "meta")  # from the journal alone
    m = make_master(tmp_path)
    try:
        assert content(m, f.ino) == b"hello" * 100 + bytes(1000)
        assert content(m, g.ino) == b"z" * 10
        assert inline_bytes(m) == 510
    finally:
        m.close()


def test_inline_blocks_are_checked(tmp_path):
    m = make_master(tmp_path, master={"inline_max": 4 * KIB})
    try:
        wid = add_worker(m)
        f = create(m, ROOT_INO, b"f")

        def complete(*blocks, size=None):
            return m.complete(master_pb2.CompleteFileRequest(
                request_id=new_request_id(), ino=f.ino, blocks=list(blocks),
                size=sum(b.length for b in blocks) if size is None else size))

        Block = common_pb2.Block
        # bytes and length disagree
        assert kind_of(complete, Block(length=5, data=b"abc")) == ErrorKind.INVALID
        # more than master.inline_max, also when split into several inline blocks
        assert kind_of(complete, Block(length=5000, data=bytes(5000))) == ErrorKind.INVALID
        assert kind_of(complete, Block(length=3000, data=bytes(3000)),
                       Block(length=3000, data=bytes(3000))) == ErrorKind.INVALID
        # a block on workers carries no bytes
        r = m.add_block(master_pb2.AddBlockRequest(ino=f.ino, client_host_id="h1"))
        assert kind_of(complete, Block(block_id=r.block_id, length=3, data=b"abc",
                                       worker_ids=[wid])) == ErrorKind.INVALID
        assert m.getattr(f.ino).state == common_pb2.WRITING  # nothing was published
        assert inline_bytes(m) == 0
        complete(Block(length=4 * KIB, data=b"k" * 4 * KIB))  # exactly inline_max
        assert content(m, f.ino) == b"k" * 4 * KIB
    finally:
        m.close()


def test_inline_capacity_bounds_the_bytes_and_frees_with_the_files(tmp_path):
    m = make_master(tmp_path, master={"inline_capacity": 10_000})
    try:
        add_worker(m)
        a, b = create(m, ROOT_INO, b"a"), create(m, ROOT_INO, b"b")
        complete_inline(m, a.ino, b"a" * 8000)
        assert kind_of(complete_inline, m, b.ino, b"b" * 8000) == ErrorKind.NO_SPACE
        assert m.getattr(b.ino).state == common_pb2.WRITING
        # a new version of a replaces its bytes: the room is counted once
        complete_inline(m, a.ino, b"A" * 9000)
        assert inline_bytes(m) == 9000
        # stored on a worker instead, a's bytes go: b fits now
        publish(m, a.ino, [MiB])
        assert inline_bytes(m) == 0
        complete_inline(m, b.ino, b"b" * 8000)
        unlink(m, ROOT_INO, b"b")
        assert inline_bytes(m) == 0
    finally:
        m.close()


def test_journal_bytes_make_a_checkpoint_due(tmp_path):
    """Inline bytes travel in the journal records, so journal.checkpoint_bytes (not
    only checkpoint_every records) makes a checkpoint due, and the restart from it
    keeps every byte."""
    m = make_master(tmp_path, checkpoint_bytes=200 * KIB)
    try:
        f = create(m, ROOT_INO, b"f")
        for i in range(5):  # 5 versions of 60 KiB: ~300 KiB of records
            complete_inline(m, f.ino, bytes([i]) * 60 * KIB)
        assert m.committer._last_checkpoint_seq > 0  # one was taken on the way
    finally:
        m.close()
    m = make_master(tmp_path)
    try:
        assert content(m, f.ino) == bytes([4]) * 60 * KIB
    finally:
        m.close()


# ------------------------------------------------------------------ through mounts

def test_small_files_through_mounts_need_no_worker_and_survive_a_master_kill(make_cluster):
    """A file of at most master.inline_max (default 256 KiB) is published with its
    bytes in CompleteFile: written on one mount and read on the other while every
    worker is down, kept across a master SIGKILL (journal replay), and moved to a
    worker when it grows past inline_max."""
    c = make_cluster(workers=1, mounts=2)
    a, b = (os.path.join(m, "small") for m in c.mounts)
    os.mkdir(a)
    added = master_calls(c, "AddBlock")
    c.kill("worker", 0, sig=signal.SIGKILL)
    files = {f"f{i}": os.urandom(i * 37 * KIB + 1) for i in range(8)}  # 1 B .. 259 KiB
    files.pop("f7")  # 259 KiB: past inline_max, needs a worker (below)
    for name, data in files.items():
        with open(os.path.join(a, name + ".tmp"), "wb") as f:
            f.write(data)
        os.rename(os.path.join(a, name + ".tmp"), os.path.join(a, name))
    with open(os.path.join(a, "f1"), "r+b") as f:  # a write inside a published file
        f.seek(100)
        f.write(b"inside")
    files["f1"] = files["f1"][:100] + b"inside" + files["f1"][106:]
    for name, data in files.items():
        with open(os.path.join(b, name), "rb") as f:
            assert f.read() == data, name
    assert master_calls(c, "AddBlock") == added  # no block for any of them

    c.kill("master", sig=signal.SIGKILL)
    c.start("master")
    for name, data in files.items():
        with open(os.path.join(b, name), "rb") as f:
            assert f.read() == data, f"{name} after the master's restart"

    c.start("worker", 0)
    big = os.urandom(300 * KIB)
    with open(os.path.join(a, "f1"), "ab") as f:  # grows past inline_max
        f.write(big)
    with open(os.path.join(b, "f1"), "rb") as f:
        assert f.read() == files["f1"] + big
    assert master_calls(c, "AddBlock") > added
