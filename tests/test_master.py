"""The master's namespace and block map, in-process (no FUSE, no network).

Every operation and its errors, versions published by CompleteFile, journal replay
after a restart, the retry cache, group commit and checkpoint restore.
"""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest

from curvine.common.config import Config
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO, new_request_id
from curvine.common.security import NO_SECURITY
from curvine.master.master import Master
from curvine.proto import common_pb2, master_pb2

MiB = 1 << 20


def make_master(tmp_path, master: dict | None = None, **journal) -> Master:
    """An in-process master in ``tmp_path``; ``master`` and ``journal``: config keys of
    those sections."""
    cfg = Config()
    cfg.master.meta_dir = str(tmp_path / "meta")
    cfg.journal.dir = str(tmp_path / "journal")
    cfg.cluster.block_size = 4 * MiB
    cfg.master.orphan_block_grace = 0.0
    for k, v in (master or {}).items():
        setattr(cfg.master, k, v)
    for k, v in journal.items():
        setattr(cfg.journal, k, v)
    m = Master(cfg, security=NO_SECURITY)
    # its workers are addresses only: deletes go with the heartbeat replies, as to a
    # worker that DeleteBlocks cannot reach
    m.deleter.close()
    return m


@pytest.fixture
def master(tmp_path):
    m = make_master(tmp_path)
    yield m
    m.close()


def kind_of(fn, *args):
    with pytest.raises(CurvineError) as e:
        fn(*args)
    return e.value.kind


def mkdir(m, parent, name, mode=0o755, rid=None):
    return m.mkdir(master_pb2.MkdirRequest(request_id=rid or new_request_id(), parent=parent,
                                           name=name, mode=mode, uid=0, gid=0)).inode


def create(m, parent, name, exclusive=False, rid=None):
    return m.create(master_pb2.CreateRequest(request_id=rid or new_request_id(), parent=parent,
                                             name=name, mode=0o644, exclusive=exclusive)).inode


def unlink(m, parent, name, rmdir=False, rid=None):
    cls = master_pb2.RmdirRequest if rmdir else master_pb2.UnlinkRequest
    m.unlink(cls(request_id=rid or new_request_id(), parent=parent, name=name), rmdir=rmdir)


def rename(m, parent, name, new_parent, new_name, no_replace=False, rid=None):
    m.rename(master_pb2.RenameRequest(request_id=rid or new_request_id(), parent=parent, name=name,
                                      new_parent=new_parent, new_name=new_name,
                                      no_replace=no_replace))


def add_worker(m, uuid="w1", host="h1") -> int:
    wid = m.register_worker(common_pb2.WorkerInfo(uuid=uuid, host_id=host, address="127.0.0.1:1",
                                                  data_dirs=["/d"], capacity=1 << 40)).worker_id
    m.heartbeat(master_pb2.HeartbeatRequest(worker_id=wid, capacity=1 << 40, used=0))
    return wid


def publish(m, ino, lengths, rid=None) -> tuple[common_pb2.Inode, list[int]]:
    blocks, ids = [], []
    for n in lengths:
        r = m.add_block(master_pb2.AddBlockRequest(ino=ino, client_host_id="h1", size_hint=n))
        ids.append(r.block_id)
        blocks.append(common_pb2.Block(block_id=r.block_id, length=n, checksum=1,
                                       worker_ids=[w.worker_id for w in r.workers]))
    node = m.complete(master_pb2.CompleteFileRequest(request_id=rid or new_request_id(), ino=ino,
                                                     blocks=blocks, size=sum(lengths))).inode
    return node, ids


def names(m, ino=ROOT_INO, limit=0):
    out, after = [], b""
    while True:
        page = m.listdir(ino, after, limit)
        out += [e.name for e in page.entries]
        if not page.has_more:
            return out
        after = out[-1]


# ---------------------------------------------------------------------- namespace
def test_root_exists(master):
    root = master.getattr(ROOT_INO)
    assert root.type == common_pb2.DIRECTORY and root.mode == 0o755


def test_mkdir_lookup_and_errors(master):
    d = mkdir(master, ROOT_INO, b"a")
    assert master.lookup(ROOT_INO, b"a").ino == d.ino
    assert master.getattr(ROOT_INO).nlink == 3
    assert kind_of(mkdir, master, ROOT_INO, b"a") == ErrorKind.EXISTS
    assert kind_of(master.lookup, ROOT_INO, b"missing") == ErrorKind.NOT_FOUND
    f = create(master, d.ino, b"f")
    assert kind_of(mkdir, master, f.ino, b"x") == ErrorKind.NOT_DIR  # a path through a file
    assert kind_of(master.lookup, f.ino, b"x") == ErrorKind.NOT_DIR
    assert kind_of(mkdir, master, 999999, b"x") == ErrorKind.NOT_FOUND


def test_a_batch_that_failed_leaves_nothing_in_the_retry_cache(master):
    """A batch whose journal write fails (a group's leader fenced: NOT_LEADER) was never
    applied: its request ids must not stay in the retry cache, which a member keeps
    across a step down (a retry answered from it, on that member leading again, named
    an inode LMDB never had: "no inode 3" in test_master_group, etcd member killed)."""
    journal = master.committer.journal
    good = new_request_id()
    mkdir(master, ROOT_INO, b"durable", rid=good)

    def fenced() -> int:
        raise CurvineError(ErrorKind.NOT_LEADER, "")
    journal.sync = fenced
    lost = new_request_id()
    assert kind_of(mkdir, master, ROOT_INO, b"lost", 0o755, lost) == ErrorKind.NOT_LEADER
    retry = master.committer.ns.retry
    assert lost not in retry
    assert good in retry  # what was durable stays


@pytest.mark.parametrize("name,kind", [
    (b"x" * 256, ErrorKind.NAME_TOO_LONG), (b"", ErrorKind.INVALID), (b"a/b", ErrorKind.INVALID),
    (b"a\0b", ErrorKind.INVALID), (b".", ErrorKind.INVALID), (b"..", ErrorKind.INVALID)])
def test_bad_names(master, name, kind):
    assert kind_of(create, master, ROOT_INO, name) == kind
    assert kind_of(mkdir, master, ROOT_INO, name) == kind
    if name:
        assert kind_of(master.lookup, ROOT_INO, name) == kind


def test_name_of_255_bytes_and_binary_names(master):
    long = b"k" * 255
    create(master, ROOT_INO, long)
    binary = bytes(range(1, 47)) + b"\xff\xfe"
    create(master, ROOT_INO, binary)
    assert master.lookup(ROOT_INO, long).name == long
    assert sorted(names(master)) == sorted([long, binary])


def test_create_semantics(master):
    f = create(master, ROOT_INO, b"f")
    assert f.state == common_pb2.WRITING and f.size == 0
    assert create(master, ROOT_INO, b"f").ino == f.ino  # open existing for write
    assert kind_of(create, master, ROOT_INO, b"f", True) == ErrorKind.EXISTS
    mkdir(master, ROOT_INO, b"d")
    assert kind_of(create, master, ROOT_INO, b"d") == ErrorKind.IS_DIR


def test_unlink_and_rmdir(master):
    d = mkdir(master, ROOT_INO, b"d")
    create(master, d.ino, b"f")
    assert kind_of(unlink, master, ROOT_INO, b"d") == ErrorKind.IS_DIR
    assert kind_of(unlink, master, ROOT_INO, b"d", True) == ErrorKind.NOT_EMPTY
    assert kind_of(unlink, master, d.ino, b"f", True) == ErrorKind.NOT_DIR
    assert kind_of(unlink, master, d.ino, b"nope") == ErrorKind.NOT_FOUND
    unlink(master, d.ino, b"f")
    unlink(master, ROOT_INO, b"d", True)
    assert names(master) == []
    assert master.getattr(ROOT_INO).nlink == 2
    assert kind_of(master.getattr, d.ino) == ErrorKind.NOT_FOUND


def test_rename_rules(master):
    a = mkdir(master, ROOT_INO, b"a")
    b = mkdir(master, a.ino, b"b")
    f = create(master, ROOT_INO, b"f")
    g = create(master, ROOT_INO, b"g")
    # into itself / below itself
    assert kind_of(rename, master, ROOT_INO, b"a", a.ino, b"x") == ErrorKind.INVALID
    assert kind_of(rename, master, ROOT_INO, b"a", b.ino, b"x") == ErrorKind.INVALID
    # type clashes
    assert kind_of(rename, master, ROOT_INO, b"f", ROOT_INO, b"a") == ErrorKind.IS_DIR
    assert kind_of(rename, master, a.ino, b"b", ROOT_INO, b"f") == ErrorKind.NOT_DIR
    c = mkdir(master, ROOT_INO, b"c")
    create(master, c.ino, b"inside")
    assert kind_of(rename, master, a.ino, b"b", ROOT_INO, b"c") == ErrorKind.NOT_EMPTY
    assert kind_of(rename, master, ROOT_INO, b"f", ROOT_INO, b"g", True) == ErrorKind.EXISTS
    assert kind_of(rename, master, ROOT_INO, b"zz", ROOT_INO, b"g") == ErrorKind.NOT_FOUND
    # replace a file atomically
    rename(master, ROOT_INO, b"f", ROOT_INO, b"g")
    assert master.lookup(ROOT_INO, b"g").ino == f.ino
    assert kind_of(master.getattr, g.ino) == ErrorKind.NOT_FOUND
    assert kind_of(master.lookup, ROOT_INO, b"f") == ErrorKind.NOT_FOUND
    rename(master, ROOT_INO, b"g", ROOT_INO, b"g")  # onto itself: no-op
    # move a directory: link counts follow
    rename(master, a.ino, b"b", c.ino, b"b2")
    assert master.getattr(a.ino).nlink == 2 and master.getattr(c.ino).nlink == 3
    assert master.getattr(b.ino).parent == c.ino and master.getattr(b.ino).name == b"b2"
    # empty dir replaces empty dir
    e = mkdir(master, ROOT_INO, b"e")
    rename(master, c.ino, b"b2", ROOT_INO, b"e")
    assert master.lookup(ROOT_INO, b"e").ino == b.ino
    assert kind_of(master.getattr, e.ino) == ErrorKind.NOT_FOUND


def test_listdir_pages_in_name_order(master):
    want = sorted(b"f%05d" % i for i in range(2500))
    for n in want[::-1]:
        create(master, ROOT_INO, n)
    assert names(master, limit=1000) == want
    page = master.listdir(ROOT_INO, b"", 7)
    assert [e.name for e in page.entries] == want[:7] and page.has_more
    assert kind_of(master.listdir, ROOT_INO, b"", 10**6) == ErrorKind.INVALID
    f = master.lookup(ROOT_INO, want[0])
    assert kind_of(master.listdir, f.ino, b"", 0) == ErrorKind.NOT_DIR


def test_setattr(master):
    f = create(master, ROOT_INO, b"f")
    r = master.setattr(master_pb2.SetAttrRequest(request_id=new_request_id(), ino=f.ino, mode=0o600,
                                                 uid=7, gid=8, mtime_ns=123))
    assert (r.inode.mode, r.inode.uid, r.inode.gid, r.inode.mtime_ns) == (0o600, 7, 8, 123)
    with pytest.raises(CurvineError) as e:
        master.setattr(master_pb2.SetAttrRequest(ino=f.ino, mode=0o170000))
    assert e.value.kind == ErrorKind.INVALID and "mode" in str(e.value)
    d = mkdir(master, ROOT_INO, b"d")
    with pytest.raises(CurvineError) as e:
        master.setattr(master_pb2.SetAttrRequest(ino=d.ino, size=0))
    assert e.value.kind == ErrorKind.IS_DIR


# ---------------------------------------------------------------------- data versions
def test_complete_publishes_and_last_writer_wins(master):
    wid = add_worker(master)
    f = create(master, ROOT_INO, b"k.tmp")
    v1, ids1 = publish(master, f.ino, [4 * MiB, MiB])
    assert v1.size == 5 * MiB and v1.state == common_pb2.COMPLETE and v1.version == 1
    got = master.get_blocks(f.ino)
    assert [b.block_id for b in got.blocks] == ids1 and [w.worker_id for w in got.workers] == [wid]
    v2, ids2 = publish(master, f.ino, [3 * MiB])
    assert v2.version == 2 and v2.size == 3 * MiB
    assert [b.block_id for b in master.get_blocks(f.ino).blocks] == ids2
    # the first version's blocks go to the worker as deletes
    deletes = master.heartbeat(master_pb2.HeartbeatRequest(worker_id=wid, capacity=1 << 40)).delete_block_ids
    assert sorted(deletes) == sorted(ids1)


def test_complete_validation(master):
    add_worker(master)
    f = create(master, ROOT_INO, b"f")
    g = create(master, ROOT_INO, b"g")
    _, ids = publish(master, f.ino, [MiB])

    def complete(ino, blocks, size):
        return master.complete(master_pb2.CompleteFileRequest(request_id=new_request_id(), ino=ino,
                                                              blocks=blocks, size=size))

    wid = master.get_blocks(f.ino).blocks[0].worker_ids[0]
    stolen = common_pb2.Block(block_id=ids[0], length=MiB, worker_ids=[wid])
    for blocks, size, field in [
        ([stolen], MiB, "belongs to another file"),
        ([common_pb2.Block(block_id=10**12, length=MiB, worker_ids=[wid])], MiB, "never allocated"),
        ([common_pb2.Block(block_id=0, length=MiB)], 2 * MiB, "size"),
        ([common_pb2.Block(block_id=0, length=8 * MiB)], 8 * MiB, "length"),
    ]:
        with pytest.raises(CurvineError) as e:
            complete(g.ino, blocks, size)
        assert e.value.kind == ErrorKind.INVALID and field in str(e.value)
    # holes are fine
    assert complete(g.ino, [common_pb2.Block(block_id=0, length=MiB)], MiB).inode.size == MiB


def test_complete_after_unlink_frees_blocks(master):
    wid = add_worker(master)
    f = create(master, ROOT_INO, b"f")
    r = master.add_block(master_pb2.AddBlockRequest(ino=f.ino, client_host_id="h1"))
    unlink(master, ROOT_INO, b"f")
    with pytest.raises(CurvineError) as e:
        master.complete(master_pb2.CompleteFileRequest(
            request_id=new_request_id(), ino=f.ino, size=MiB,
            blocks=[common_pb2.Block(block_id=r.block_id, length=MiB, worker_ids=[wid])]))
    assert e.value.kind == ErrorKind.NOT_FOUND
    deletes = master.heartbeat(master_pb2.HeartbeatRequest(worker_id=wid, capacity=1 << 40)).delete_block_ids
    assert list(deletes) == [r.block_id]


def test_truncate_and_extend(master):
    add_worker(master)
    f = create(master, ROOT_INO, b"f")
    publish(master, f.ino, [4 * MiB, 4 * MiB])
    r = master.setattr(master_pb2.SetAttrRequest(request_id=new_request_id(), ino=f.ino, size=5 * MiB))
    assert r.inode.size == 5 * MiB
    blocks = master.get_blocks(f.ino).blocks
    assert [b.length for b in blocks] == [4 * MiB, MiB]
    r = master.setattr(master_pb2.SetAttrRequest(request_id=new_request_id(), ino=f.ino, size=10 * MiB))
    blocks = master.get_blocks(f.ino).blocks
    assert sum(b.length for b in blocks) == 10 * MiB and blocks[-1].block_id == 0


def test_add_block_without_workers(master):
    f = create(master, ROOT_INO, b"f")
    with pytest.raises(CurvineError) as e:
        master.add_block(master_pb2.AddBlockRequest(ino=f.ino))
    assert e.value.kind == ErrorKind.UNAVAILABLE


def test_workers_registering_at_once_get_distinct_ids(tmp_path):
    """Registrations planned in one journal batch must not share an id (they did: the
    id came from the registry, which learns of a worker only after its batch commits)."""
    import threading
    m = make_master(tmp_path)
    try:
        ids, start = {}, threading.Barrier(12)

        def register(i):
            start.wait()
            ids[i] = m.register_worker(common_pb2.WorkerInfo(
                uuid=f"w{i}", host_id="h", address=f"127.0.0.1:{1000 + i}",
                data_dirs=["/d"])).worker_id

        threads = [threading.Thread(target=register, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(ids.values()) == list(range(1, 13)), ids
        again = m.register_worker(common_pb2.WorkerInfo(uuid="w3", host_id="h",
                                                        address="127.0.0.1:9", data_dirs=["/d"]))
        assert again.worker_id == ids[3]  # same uuid, new address: same worker
    finally:
        m.close()
    m = make_master(tmp_path)  # and so after replay
    try:
        assert sorted(w.worker_id for w, _ in m.registry.snapshot()) == list(range(1, 13))
    finally:
        m.close()


def test_block_report_reconciles(master):
    wid = add_worker(master)
    f = create(master, ROOT_INO, b"keep")
    g = create(master, ROOT_INO, b"lost")
    _, keep = publish(master, f.ino, [MiB])
    _, lost = publish(master, g.ino, [MiB])
    # a report answers a registration (the worker restarted): what the master located
    # there by then and the report lacks is gone
    assert add_worker(master) == wid
    reply = master.block_report(master_pb2.BlockReportRequest(
        worker_id=wid, block_ids=[keep[0], 424242 % 1000 + 1],
        block_mtimes_ns=[0, 0]))
    # the unknown block is deleted, the unreported block's file is gone (clean miss)
    assert list(reply.delete_block_ids) == [424242 % 1000 + 1]
    assert kind_of(master.lookup, ROOT_INO, b"lost") == ErrorKind.NOT_FOUND
    assert master.lookup(ROOT_INO, b"keep").ino == f.ino
    with pytest.raises(CurvineError) as e:
        master.block_report(master_pb2.BlockReportRequest(worker_id=99, block_ids=[1]))
    assert e.value.kind == ErrorKind.NOT_FOUND


def test_block_report_keeps_young_unknown_blocks_at_the_default_grace(tmp_path):
    """At the default master.orphan_block_grace (300 s) an unknown block on a worker is
    deleted only once its file is older than the grace (a write may still be on its
    way to a CompleteFile); an id this master never handed out goes at once."""
    default = Config().master.orphan_block_grace
    assert float(default) == 300.0
    m = make_master(tmp_path, master={"orphan_block_grace": default})
    try:
        wid = add_worker(m)
        f = create(m, ROOT_INO, b"f")
        _, (block,) = publish(m, f.ino, [MiB])
        unlink(m, ROOT_INO, b"f")  # the block is no file's now
        never_issued = block + 1_000_000
        now = time.time_ns()

        def report(mtime_ns):
            return list(m.block_report(master_pb2.BlockReportRequest(
                worker_id=wid, block_ids=[block, never_issued],
                block_mtimes_ns=[mtime_ns, mtime_ns])).delete_block_ids)

        assert report(now - 10 * 10**9) == [never_issued]  # 10 s old: within the grace
        assert report(now - 301 * 10**9) == [block, never_issued]  # past it
    finally:
        m.close()


# ---------------------------------------------------------------------- durability
def snapshot(m):
    out = {}

    def walk(ino, path):
        for name in names(m, ino):
            node = m.lookup(ino, name)
            blocks = [(b.block_id, b.length) for b in m.get_blocks(node.ino).blocks]
            out[path + name] = (node.ino, node.type, node.size, node.version, blocks)
            if node.type == common_pb2.DIRECTORY:
                walk(node.ino, path + name + b"/")

    walk(ROOT_INO, b"/")
    return out


def populate(m):
    add_worker(m)
    d = mkdir(m, ROOT_INO, b"dir")
    for i in range(20):
        f = create(m, d.ino, b"c%d.tmp" % i)
        publish(m, f.ino, [MiB + i])
        rename(m, d.ino, b"c%d.tmp" % i, d.ino, b"c%d.data" % i)
    unlink(m, d.ino, b"c3.data")
    m.setattr(master_pb2.SetAttrRequest(request_id=new_request_id(),
                                        ino=m.lookup(d.ino, b"c4.data").ino, size=10))


def test_restart_replays_to_identical_state(tmp_path):
    m = make_master(tmp_path)
    populate(m)
    before = snapshot(m)
    m.close()
    m = make_master(tmp_path)
    assert snapshot(m) == before
    # and from the journal alone, with the LMDB view deleted
    m.close()
    shutil.rmtree(tmp_path / "meta")
    m = make_master(tmp_path)
    try:
        assert snapshot(m) == before
        f = create(m, ROOT_INO, b"after")  # new ids do not collide with replayed ones
        assert f.ino not in {v[0] for v in before.values()}
    finally:
        m.close()


def test_checkpoint_retires_segments_and_restores(tmp_path):
    m = make_master(tmp_path, segment_size=4096)
    populate(m)
    before = snapshot(m)
    m.committer.request_checkpoint()
    create(m, ROOT_INO, b"after-checkpoint")  # waits behind the checkpoint
    before[b"/after-checkpoint"] = None
    m.close()
    segs = os.listdir(tmp_path / "journal")
    # LMDB lost (OS crash): restore from the checkpoint, replay the rest
    shutil.rmtree(tmp_path / "meta" / "lmdb")
    m = make_master(tmp_path, segment_size=4096)
    try:
        after = snapshot(m)
        assert after.pop(b"/after-checkpoint")[2] == 0
        before.pop(b"/after-checkpoint")
        assert after == before
        assert m.journal.first_seq > 1, segs
    finally:
        m.close()


def test_retry_cache_survives_restart(tmp_path):
    m = make_master(tmp_path)
    rid_create, rid_rename = new_request_id(), new_request_id()
    f = create(m, ROOT_INO, b"x", exclusive=True, rid=rid_create)
    rename(m, ROOT_INO, b"x", ROOT_INO, b"y", rid=rid_rename)
    # a retry after a lost reply returns the first result instead of EEXIST / ENOENT
    assert create(m, ROOT_INO, b"x", exclusive=True, rid=rid_create).ino == f.ino
    rename(m, ROOT_INO, b"x", ROOT_INO, b"y", rid=rid_rename)
    m.close()
    m = make_master(tmp_path)
    try:
        assert create(m, ROOT_INO, b"x", exclusive=True, rid=rid_create).ino == f.ino
        rename(m, ROOT_INO, b"x", ROOT_INO, b"y", rid=rid_rename)
        assert kind_of(rename, m, ROOT_INO, b"x", ROOT_INO, b"y") == ErrorKind.NOT_FOUND
    finally:
        m.close()


def test_group_commit_batches_concurrent_mutations(master):
    syncs_before = master.journal.stats["syncs"]
    errors = []
    barrier = threading.Barrier(32)

    def work(i):
        try:
            barrier.wait()
            for j in range(10):
                mkdir(master, ROOT_INO, b"d%d-%d" % (i, j))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(names(master)) == 320
    syncs = master.journal.stats["syncs"] - syncs_before
    assert syncs < 320, "every mutation paid its own fsync: no group commit"
    assert master.committer.stats["max_batch"] > 1


def test_lost_journal_tail_rebuilds_metadata_from_the_journal(tmp_path):
    m = make_master(tmp_path)
    populate(m)
    before = snapshot(m)
    lost = mkdir(m, ROOT_INO, b"last")  # the record that will be torn
    m.close()
    seg = sorted((tmp_path / "journal").glob("seg-*.wal"))[-1]
    size = seg.stat().st_size
    os.truncate(seg, size - 5)
    m = make_master(tmp_path)
    try:
        # LMDB had applied the cut record; the journal is the truth, so it is gone
        assert snapshot(m) == before
        again = mkdir(m, ROOT_INO, b"again")
        assert m.lookup(ROOT_INO, b"again").type == common_pb2.DIRECTORY
        # but its inode number was handed out (a mount may still know it): not again
        assert again.ino > lost.ino
    finally:
        m.close()
    assert any(p.name.startswith("lmdb.replaced-") for p in (tmp_path / "meta").iterdir())


def test_empty_journal_with_old_metadata_refuses_to_start(tmp_path):
    m = make_master(tmp_path)
    populate(m)
    m.close()
    shutil.rmtree(tmp_path / "journal")
    with pytest.raises(CurvineError) as e:
        make_master(tmp_path)
    assert "journal" in str(e.value) and "empty" in str(e.value)


def test_rename_guards_are_atomic_with_the_rename(master):
    add_worker(master)
    old = create(master, ROOT_INO, b"k.tmp")
    publish(master, old.ino, [MiB])
    rename(master, ROOT_INO, b"k.tmp", ROOT_INO, b"k.data")
    new = create(master, ROOT_INO, b"k.tmp")  # another writer's, not yet published

    def guarded(**kw):
        master.rename(master_pb2.RenameRequest(request_id=new_request_id(), parent=ROOT_INO,
                                               name=b"k.tmp", new_parent=ROOT_INO,
                                               new_name=b"k.data", **kw))

    assert kind_of(lambda: guarded(source_ino=old.ino)) == ErrorKind.NOT_FOUND
    assert kind_of(lambda: guarded(require_published=True)) == ErrorKind.NOT_FOUND
    assert master.lookup(ROOT_INO, b"k.data").ino == old.ino  # untouched
    guarded(source_ino=new.ino)  # its own writer may move it
    assert master.lookup(ROOT_INO, b"k.data").ino == new.ino


def test_lookup_miss_is_a_reply_not_an_error(master):
    from curvine.master.ports.service import MasterServicer

    class Ctx:
        def abort(self, *a):
            raise AssertionError("a miss must not abort the call")

        def set_trailing_metadata(self, *a):
            raise AssertionError("a miss must not set error trailers")

    svc = MasterServicer(master)
    d = mkdir(master, ROOT_INO, b"d")
    f = create(master, d.ino, b"f")
    miss = svc.Lookup(master_pb2.LookupRequest(parent=d.ino, name=b"nope", miss_ok=True), Ctx())
    assert not miss.HasField("inode")
    hit = svc.Lookup(master_pb2.LookupRequest(parent=d.ino, name=b"f", miss_ok=True), Ctx())
    assert hit.inode.ino == f.ino
    assert master.lookup_or_none(12345, b"f") is None  # no such parent: a miss too
    assert kind_of(master.lookup_or_none, f.ino, b"x") == ErrorKind.NOT_DIR
    assert kind_of(master.lookup_or_none, d.ino, b"a/b") == ErrorKind.INVALID
    assert kind_of(master.lookup, d.ino, b"nope") == ErrorKind.NOT_FOUND  # without miss_ok


def test_complete_if_unpublished(tmp_path):
    """The empty version of a file created and closed without writes is published after
    close returned (if_unpublished): it never replaces a version another writer
    published meanwhile; it is journaled, replayed and retry-cached like any complete."""
    m = make_master(tmp_path)
    add_worker(m)
    a = create(m, ROOT_INO, b"a")
    b = create(m, ROOT_INO, b"b")
    rid = new_request_id()
    req = master_pb2.CompleteFileRequest(request_id=rid, ino=a.ino, size=0, if_unpublished=True)
    seq = m.journal.last_seq
    v = m.complete(req).inode
    assert v.state == common_pb2.COMPLETE and v.version == 1 and v.size == 0
    assert m.journal.last_seq == seq + 1
    assert m.complete(req).inode.version == 1  # a retry returns the first result
    # b: another writer published data first; the late empty publish changes nothing
    data, _ = publish(m, b.ino, [MiB])
    seq = m.journal.last_seq
    late = m.complete(master_pb2.CompleteFileRequest(request_id=new_request_id(), ino=b.ino,
                                                     size=0, if_unpublished=True)).inode
    assert (late.version, late.size) == (data.version, MiB)
    assert m.journal.last_seq == seq  # nothing journaled
    # the rename guard sees a published file now
    m.rename(master_pb2.RenameRequest(request_id=new_request_id(), parent=ROOT_INO, name=b"a",
                                      new_parent=ROOT_INO, new_name=b"a2",
                                      require_published=True))
    before = snapshot(m)
    m.close()
    m = make_master(tmp_path)
    try:
        assert snapshot(m) == before
        assert m.getattr(a.ino).state == common_pb2.COMPLETE
        assert m.complete(req).inode.version == 1  # retry cache refilled from the journal
    finally:
        m.close()


def test_rename_guard_lets_the_callers_own_unpublished_files_move(master):
    """require_published refuses a never-published source unless the caller lists it in
    writer_inos (it writes that file, or closed it empty): one RPC, checked atomically."""
    f = create(master, ROOT_INO, b"k.tmp")
    other = create(master, ROOT_INO, b"o.tmp")

    def mv(name, new, inos):
        return master.rename(master_pb2.RenameRequest(
            request_id=new_request_id(), parent=ROOT_INO, name=name, new_parent=ROOT_INO,
            new_name=new, require_published=True, writer_inos=inos))

    assert kind_of(mv, b"k.tmp", b"k.data", [other.ino]) == ErrorKind.NOT_FOUND
    reply = mv(b"k.tmp", b"k.data", [f.ino])
    assert reply.moved.ino == f.ino and reply.parent.ino == ROOT_INO
    assert not reply.HasField("new_parent")  # same directory
    assert master.lookup(ROOT_INO, b"k.data").ino == f.ino
