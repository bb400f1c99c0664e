"""POSIX beyond files and directories, at the master (issue 15), in-process: symlinks,
special files, hard links (exact nlink, the ``links`` table), unlinked files kept open
(``held``, ReleaseInode, the holder's session ending), RENAME_EXCHANGE and user.*
extended attributes; their errors, the retry cache, the RPCs on the client port, and
journal replay after a restart (from LMDB, and from the journal alone)."""

from __future__ import annotations

import shutil
import stat
import time

import pytest

from curvine.client.master.master_client import MasterClient
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO, new_request_id
from curvine.common.security import NO_SECURITY
from curvine.master.meta import namespace
from curvine.master.meta.namespace import attr_mode
from curvine.proto import common_pb2, journal_pb2, master_pb2

from inproc import InprocMaster, master_config
from test_master import MiB, add_worker, create, kind_of, make_master, mkdir, names, publish

SESSION = 77  # the lease session of "this mount" in the requests below
SPECIAL = {common_pb2.FIFO: stat.S_IFIFO, common_pb2.SOCKET: stat.S_IFSOCK,
           common_pb2.CHAR_DEVICE: stat.S_IFCHR, common_pb2.BLOCK_DEVICE: stat.S_IFBLK}


@pytest.fixture
def master(tmp_path):
    m = make_master(tmp_path)
    m.capacity.close()  # no background rounds: a test drives them
    yield m
    m.close()


# ---------------------------------------------------------------------- helpers
def symlink(m, parent, name, target, rid=None):
    return m.symlink(master_pb2.SymlinkRequest(request_id=rid or new_request_id(),
                                               parent=parent, name=name, target=target,
                                               uid=5, gid=6))


def mknod(m, parent, name, kind, mode=0o640, rdev=0, rid=None):
    return m.make_node(master_pb2.MakeNodeRequest(request_id=rid or new_request_id(),
                                                  parent=parent, name=name, type=kind,
                                                  mode=mode, rdev=rdev))


def link(m, ino, new_parent, new_name, rid=None):
    return m.link(master_pb2.LinkRequest(request_id=rid or new_request_id(), ino=ino,
                                         new_parent=new_parent, new_name=new_name))


def unlink(m, parent, name, open_inos=(), session=SESSION, rid=None):
    return m.unlink(master_pb2.UnlinkRequest(request_id=rid or new_request_id(), parent=parent,
                                             name=name, session=session,
                                             open_inos=list(open_inos)), rmdir=False)


def rename(m, parent, name, new_parent, new_name, open_inos=(), exchange=False,
           no_replace=False, rid=None):
    return m.rename(master_pb2.RenameRequest(
        request_id=rid or new_request_id(), parent=parent, name=name, new_parent=new_parent,
        new_name=new_name, session=SESSION, open_inos=list(open_inos), exchange=exchange,
        no_replace=no_replace))


def release(m, ino, session=SESSION):
    m.release_inode(master_pb2.ReleaseInodeRequest(request_id=new_request_id(), ino=ino,
                                                   session=session))


def set_xattr(m, ino, name, value, flags=0, rid=None):
    return m.set_xattr(master_pb2.SetXattrRequest(request_id=rid or new_request_id(), ino=ino,
                                                  name=name, value=value, flags=flags)).inode


def get_xattr(m, ino, name):
    return m.get_xattr(master_pb2.GetXattrRequest(ino=ino, name=name)).value


def list_xattr(m, ino):
    return list(m.list_xattr(master_pb2.ListXattrRequest(ino=ino)).names)


def remove_xattr(m, ino, name, rid=None):
    return m.remove_xattr(master_pb2.RemoveXattrRequest(request_id=rid or new_request_id(),
                                                        ino=ino, name=name)).inode


def evict(m, reason, ino):
    """Journal the removal of ``ino`` for ``reason`` (as capacity.py does)."""
    return m.submit(lambda txn: m.ns.plan_evict(txn, reason, [ino], lambda node: True))[0]


def rows(m, db, ino):
    """The rows of inode ``ino`` in the store's table ``db`` (links, xattr or held)."""
    with m.store.read() as txn:
        if db == "held":
            return [] if m.store.held_by(txn, ino) is None else [ino]
        return m.store.links_of(txn, ino) if db == "links" else m.store.xattrs(txn, ino)


def names_of(m, ino, under=(ROOT_INO,)):
    """Every (directory, name) that names ``ino`` in the directories ``under``."""
    return sorted((d, n) for d in under for n in names(m, d) if m.lookup(d, n).ino == ino)


def deletes(m, wid):
    return sorted(m.heartbeat(master_pb2.HeartbeatRequest(worker_id=wid, capacity=1 << 40)
                              ).delete_block_ids)


# ---------------------------------------------------------------------- symlinks
def test_symlink_is_a_complete_inode_with_its_target(master):
    d = mkdir(master, ROOT_INO, b"d")
    reply = symlink(master, d.ino, b"ln", b"../some/where")
    node = reply.inode
    assert (node.type, node.mode, node.size, node.symlink_target, node.state, node.nlink,
            node.uid, node.gid) == (common_pb2.SYMLINK, 0o777, 13, b"../some/where",
                                    common_pb2.COMPLETE, 1, 5, 6)
    assert attr_mode(node) == stat.S_IFLNK | 0o777
    assert reply.parent.ino == d.ino and reply.parent.mtime_ns == node.ctime_ns
    assert master.lookup(d.ino, b"ln").symlink_target == b"../some/where"
    assert [e.inode.type for e in master.listdir(d.ino, b"", 0).entries] == [common_pb2.SYMLINK]
    assert master.get_blocks(node.ino).blocks == []  # no data
    assert symlink(master, d.ino, b"long", b"x" * 4095).inode.size == 4095
    for target, kind in [(b"", ErrorKind.INVALID), (b"x" * 4096, ErrorKind.NAME_TOO_LONG),
                         (b"a\0b", ErrorKind.INVALID)]:
        assert kind_of(symlink, master, d.ino, b"bad", target) == kind
    assert kind_of(symlink, master, d.ino, b"ln", b"t") == ErrorKind.EXISTS
    f = create(master, d.ino, b"f")
    assert kind_of(symlink, master, f.ino, b"x", b"t") == ErrorKind.NOT_DIR
    # a name: unlinked and renamed like a file, never followed by the master
    rename(master, d.ino, b"ln", ROOT_INO, b"moved")
    assert master.lookup(ROOT_INO, b"moved").ino == node.ino
    unlink(master, ROOT_INO, b"moved")
    assert kind_of(master.getattr, node.ino) == ErrorKind.NOT_FOUND


# ---------------------------------------------------------------------- special files
def test_make_node_of_each_special_type(master):
    for kind, ifmt in SPECIAL.items():
        rdev = 0x0801 if kind in (common_pb2.CHAR_DEVICE, common_pb2.BLOCK_DEVICE) else 0
        reply = mknod(master, ROOT_INO, b"n%d" % kind, kind, 0o640, rdev=rdev or 99)
        node = reply.inode
        assert (node.type, node.mode, node.rdev, node.state, node.size, node.nlink) == (
            kind, 0o640, rdev, common_pb2.COMPLETE, 0, 1)
        assert attr_mode(node) == ifmt | 0o640
        assert reply.parent.ino == ROOT_INO
        assert master.lookup(ROOT_INO, b"n%d" % kind).rdev == rdev
    for kind in (common_pb2.FILE, common_pb2.DIRECTORY, common_pb2.SYMLINK,
                 common_pb2.FILE_TYPE_UNSPECIFIED, 99):
        assert kind_of(mknod, master, ROOT_INO, b"bad", kind) == ErrorKind.INVALID
    assert kind_of(mknod, master, ROOT_INO, b"bad", common_pb2.FIFO, 0o170000) == ErrorKind.INVALID
    assert kind_of(mknod, master, ROOT_INO, b"n4", common_pb2.FIFO) == ErrorKind.EXISTS
    assert attr_mode(master.getattr(ROOT_INO)) == stat.S_IFDIR | 0o755
    assert attr_mode(create(master, ROOT_INO, b"f")) == stat.S_IFREG | 0o644


def test_inodes_without_data_refuse_data_operations(master):
    add_worker(master)
    d = mkdir(master, ROOT_INO, b"d")
    s = symlink(master, ROOT_INO, b"s", b"t").inode
    p = mknod(master, ROOT_INO, b"p", common_pb2.FIFO).inode
    for node, kind in [(d, ErrorKind.IS_DIR), (s, ErrorKind.INVALID), (p, ErrorKind.INVALID)]:
        assert kind_of(master.add_block, master_pb2.AddBlockRequest(
            ino=node.ino, client_host_id="h1")) == kind
        assert kind_of(master.complete, master_pb2.CompleteFileRequest(
            request_id=new_request_id(), ino=node.ino)) == kind
        assert kind_of(master.setattr, master_pb2.SetAttrRequest(
            request_id=new_request_id(), ino=node.ino, size=0)) == kind
    # their other attributes change like a file's
    node = master.setattr(master_pb2.SetAttrRequest(request_id=new_request_id(), ino=p.ino,
                                                    mode=0o600, uid=3)).inode
    assert (node.mode, node.uid, node.type) == (0o600, 3, common_pb2.FIFO)


def test_retries_answer_the_first_result_also_after_a_restart(tmp_path):
    m = make_master(tmp_path)
    rids = {k: new_request_id() for k in ("symlink", "mknod", "link", "unlink")}
    s = symlink(m, ROOT_INO, b"s", b"t", rid=rids["symlink"]).inode
    p = mknod(m, ROOT_INO, b"p", common_pb2.SOCKET, rid=rids["mknod"]).inode
    f = create(m, ROOT_INO, b"f")
    link(m, f.ino, ROOT_INO, b"f2", rid=rids["link"])
    g = create(m, ROOT_INO, b"g")
    assert unlink(m, ROOT_INO, b"g", open_inos=[g.ino], rid=rids["unlink"]).held == g.ino

    def retried(m):  # each would fail (EXISTS, NOT_FOUND) if it ran again
        assert symlink(m, ROOT_INO, b"s", b"t", rid=rids["symlink"]).inode.ino == s.ino
        assert mknod(m, ROOT_INO, b"p", common_pb2.SOCKET, rid=rids["mknod"]).inode.ino == p.ino
        reply = link(m, f.ino, ROOT_INO, b"f2", rid=rids["link"])
        assert reply.inode.ino == f.ino and reply.inode.nlink == 2
        assert unlink(m, ROOT_INO, b"g", open_inos=[g.ino], rid=rids["unlink"]).held == g.ino

    retried(m)
    m.close()
    m = make_master(tmp_path)
    try:
        retried(m)
    finally:
        m.close()


# ---------------------------------------------------------------------- hard links
def test_hard_links_count_every_name(master):
    wid = add_worker(master)
    a, b = mkdir(master, ROOT_INO, b"a"), mkdir(master, ROOT_INO, b"b")
    f, ids = publish(master, create(master, a.ino, b"f").ino, [MiB])
    before = master.getattr(f.ino)
    time.sleep(0.001)
    reply = link(master, f.ino, b.ino, b"g")
    assert reply.inode.ino == f.ino and reply.inode.nlink == 2
    assert reply.inode.ctime_ns > before.ctime_ns and reply.inode.mtime_ns == before.mtime_ns
    assert reply.parent.ino == b.ino and reply.parent.mtime_ns == reply.inode.ctime_ns
    assert master.lookup(b.ino, b"g").ino == f.ino
    link(master, f.ino, a.ino, b"h")
    assert master.getattr(f.ino).nlink == 3
    # the first name stays in the inode; the others are rows of the links table
    node = master.getattr(f.ino)
    assert (node.parent, node.name) == (a.ino, b"f")
    assert len(rows(master, "links", f.ino)) == 2
    # errors
    assert kind_of(link, master, f.ino, b.ino, b"g") == ErrorKind.EXISTS
    assert kind_of(link, master, a.ino, b.ino, b"dir") == ErrorKind.NOT_PERMITTED
    assert kind_of(link, master, f.ino, f.ino, b"x") == ErrorKind.NOT_DIR
    assert kind_of(link, master, 999999, b.ino, b"x") == ErrorKind.NOT_FOUND
    assert kind_of(link, master, f.ino, b.ino, b"a/b") == ErrorKind.INVALID
    # symlinks and special files have hard links too
    s = symlink(master, a.ino, b"s", b"f").inode
    assert link(master, s.ino, b.ino, b"s2").inode.nlink == 2
    p = mknod(master, a.ino, b"p", common_pb2.FIFO).inode
    assert link(master, p.ino, b.ino, b"p2").inode.nlink == 2
    # rename of a second name moves that name only
    rename(master, b.ino, b"g", ROOT_INO, b"g2")
    assert names_of(master, f.ino, (ROOT_INO, a.ino, b.ino)) == [
        (ROOT_INO, b"g2"), (a.ino, b"f"), (a.ino, b"h")]
    # one name onto another name of the same inode: nothing happens (POSIX)
    rename(master, a.ino, b"h", ROOT_INO, b"g2")
    assert master.getattr(f.ino).nlink == 3 and master.lookup(a.ino, b"h").ino == f.ino
    # rename of the first name: the inode follows it
    rename(master, a.ino, b"f", b.ino, b"f2")
    node = master.getattr(f.ino)
    assert (node.parent, node.name, node.nlink) == (b.ino, b"f2", 3)
    # unlink of a second name: one name fewer, the data stays
    unlink(master, ROOT_INO, b"g2")
    node = master.getattr(f.ino)
    assert node.nlink == 2 and (node.parent, node.name) == (b.ino, b"f2")
    # unlink of the first name: another name becomes the first
    t = node.ctime_ns
    unlink(master, b.ino, b"f2")
    node = master.getattr(f.ino)
    assert (node.parent, node.name, node.nlink) == (a.ino, b"h", 1) and node.ctime_ns > t
    assert rows(master, "links", f.ino) == []  # one name: nothing in the table
    assert [b.block_id for b in master.get_blocks(f.ino).blocks] == ids
    assert deletes(master, wid) == []
    # the last name: the inode and its blocks go
    unlink(master, a.ino, b"h")
    assert kind_of(master.getattr, f.ino) == ErrorKind.NOT_FOUND
    assert deletes(master, wid) == ids


def test_too_many_links(master, monkeypatch):
    monkeypatch.setattr(namespace, "MAX_LINKS", 3)
    f = create(master, ROOT_INO, b"f")
    link(master, f.ino, ROOT_INO, b"f2")
    link(master, f.ino, ROOT_INO, b"f3")
    assert kind_of(link, master, f.ino, ROOT_INO, b"f4") == ErrorKind.TOO_MANY_LINKS
    unlink(master, ROOT_INO, b"f2")
    assert link(master, f.ino, ROOT_INO, b"f4").inode.nlink == 3


def test_removing_an_inode_removes_all_its_names_and_rows(master):
    wid = add_worker(master)
    a, b = mkdir(master, ROOT_INO, b"a"), mkdir(master, ROOT_INO, b"b")

    def linked(name):
        node, ids = publish(master, create(master, a.ino, name).ino, [MiB])
        link(master, node.ino, b.ino, name + b".2")
        link(master, node.ino, ROOT_INO, name + b".3")
        set_xattr(master, node.ino, b"user.k", b"v")
        return node, ids

    for reason, name in [(journal_pb2.EVICT_LRU, b"lru"), (journal_pb2.EVICT_TTL, b"ttl")]:
        node, ids = linked(name)
        t = master.getattr(b.ino).mtime_ns
        assert evict(master, reason, node.ino) == [node.ino]
        assert kind_of(master.getattr, node.ino) == ErrorKind.NOT_FOUND
        assert names_of(master, node.ino, (ROOT_INO, a.ino, b.ino)) == []
        assert rows(master, "links", node.ino) == rows(master, "xattr", node.ino) == []
        assert master.getattr(b.ino).mtime_ns > t  # every directory that lost a name
        assert deletes(master, wid) == ids
    # the last replica lost (the worker registers again, its report lacks it): a clean
    # miss on every name
    node, ids = linked(b"lost")
    assert add_worker(master) == wid
    master.block_report(master_pb2.BlockReportRequest(worker_id=wid, block_ids=[]))
    assert kind_of(master.getattr, node.ino) == ErrorKind.NOT_FOUND
    assert names_of(master, node.ino, (ROOT_INO, a.ino, b.ino)) == []
    assert rows(master, "links", node.ino) == rows(master, "xattr", node.ino) == []
    assert names(master, a.ino) == names(master, b.ino) == []
    assert names(master) == [b"a", b"b"]
    with master.store.read() as txn:
        assert master.store.get_u64(txn, b"inode_count") == 3  # root, a, b


# ---------------------------------------------------------------------- open, unlinked
def test_unlinked_file_open_on_the_mount_is_kept_until_released(master):
    wid = add_worker(master)
    f, ids = publish(master, create(master, ROOT_INO, b"f").ino, [MiB])
    set_xattr(master, f.ino, b"user.k", b"v")
    reply = unlink(master, ROOT_INO, b"f", open_inos=[123, f.ino])
    assert reply.held == f.ino and reply.parent.ino == ROOT_INO
    assert names(master) == []
    node = master.getattr(f.ino)  # still there by ino, without a name
    assert (node.nlink, node.parent, node.name) == (0, 0, b"")
    assert node.ctime_ns == reply.parent.mtime_ns
    # read, written and truncated by ino, like any file
    assert [b.block_id for b in master.get_blocks(f.ino, SESSION, 1).blocks] == ids
    master.setattr(master_pb2.SetAttrRequest(request_id=new_request_id(), ino=f.ino, size=10))
    assert master.getattr(f.ino).size == 10
    v, new_ids = publish(master, f.ino, [2 * MiB])
    assert v.size == 2 * MiB and v.nlink == 0
    assert get_xattr(master, f.ino, b"user.k") == b"v"
    assert kind_of(link, master, f.ino, ROOT_INO, b"back") == ErrorKind.NOT_FOUND
    # the replaced version's blocks, once the open that read them (GetBlocks) is over
    assert deletes(master, wid) == []
    master.opens.note_closed(SESSION, [1])
    assert deletes(master, wid) == ids
    # LRU eviction and TTL never take it
    assert evict(master, journal_pb2.EVICT_LRU, f.ino) == []
    assert evict(master, journal_pb2.EVICT_TTL, f.ino) == []
    master.capacity.lru.touch([f.ino], 1)
    assert master.capacity._victims(lambda freed: False)[0] == []
    # the mount's last close: removed, blocks freed
    release(master, f.ino, session=12345)  # whatever session: a reconnected mount's
    assert kind_of(master.getattr, f.ino) == ErrorKind.NOT_FOUND
    assert deletes(master, wid) == new_ids
    assert rows(master, "held", f.ino) == rows(master, "xattr", f.ino) == []
    release(master, f.ino)  # again, or for an inode that is not held: nothing
    g = create(master, ROOT_INO, b"g")
    release(master, g.ino)
    assert master.getattr(g.ino).nlink == 1


def _version(m, ino, blocks, open_id=0, **kw):
    """CompleteFile of ``blocks``: existing Block messages, or lengths of new blocks."""
    out = []
    for b in blocks:
        if isinstance(b, int):
            r = m.add_block(master_pb2.AddBlockRequest(ino=ino, client_host_id="h1", size_hint=b))
            b = common_pb2.Block(block_id=r.block_id, length=b, checksum=1,
                                 worker_ids=[w.worker_id for w in r.workers])
        out.append(b)
    return m.complete(master_pb2.CompleteFileRequest(
        request_id=new_request_id(), ino=ino, blocks=out, size=sum(b.length for b in out),
        session=SESSION if open_id else 0, open_id=open_id, **kw)).inode


def test_blocks_a_newer_version_drops_are_kept_while_the_file_is_open(master):
    """Two writers of one file on one mount (os.open O_RDWR twice): A's version shares
    the published blocks, B publishes first.  A's base stays readable and publishable
    until A closes; what no version holds is deleted then.  With nothing open, a
    dropped block goes at once, and publishing it again is ESTALE (not EINVAL)."""
    wid = add_worker(master)
    master.sessions.opened(SESSION, [])
    f, old = publish(master, create(master, ROOT_INO, b"f").ino, [MiB, MiB])
    base = list(master.get_blocks(f.ino, SESSION, 7, write=True).blocks)  # A opens
    _, b_ids = publish(master, f.ino, [MiB])  # B's version
    assert deletes(master, wid) == []  # A may still read them
    a = _version(master, f.ino, [base[0], MiB], open_id=7)  # A: first block kept, one new
    a_ids = [b.block_id for b in master.get_blocks(f.ino).blocks]
    assert a_ids[0] == old[0] and a.size == 2 * MiB and deletes(master, wid) == []
    master.opens.note_closed(SESSION, [7])  # A's last close
    assert deletes(master, wid) == sorted([old[1]] + b_ids)
    # a writer that truncated at open records it with its first publish (open 9)
    c = _version(master, f.ino, [MiB], open_id=9)
    c_ids = [b.block_id for b in master.get_blocks(f.ino).blocks]
    assert c.size == MiB and deletes(master, wid) == []  # A's version: kept, C is open
    _version(master, f.ino, [MiB])  # D replaces C's version while C is open
    assert deletes(master, wid) == []
    # the mount dies with C open: kept until its session is gone for the orphan timeout
    master.sessions.closed(SESSION)
    master.opens.release_kept()
    assert deletes(master, wid) == []
    master.sessions.orphan_timeout = 0
    master.opens.release_kept()
    assert deletes(master, wid) == sorted(a_ids + c_ids)
    # nothing open: deleted at once; publishing a freed block is stale
    gone = master.get_blocks(f.ino).blocks[0]
    _version(master, f.ino, [MiB])
    assert deletes(master, wid) == [gone.block_id]
    assert kind_of(_version, master, f.ino, [gone]) == ErrorKind.STALE
    assert master.opens.kept_blocks() == 0


def test_which_unlinks_keep_the_inode(master):
    f = create(master, ROOT_INO, b"f")
    assert unlink(master, ROOT_INO, b"f").held == 0  # not open here: removed
    assert kind_of(master.getattr, f.ino) == ErrorKind.NOT_FOUND
    f = create(master, ROOT_INO, b"f")
    # without a lease session nothing could remove it once the mount is gone
    assert unlink(master, ROOT_INO, b"f", open_inos=[f.ino], session=0).held == 0
    assert kind_of(master.getattr, f.ino) == ErrorKind.NOT_FOUND
    f = create(master, ROOT_INO, b"f")
    link(master, f.ino, ROOT_INO, b"f2")
    assert unlink(master, ROOT_INO, b"f", open_inos=[f.ino]).held == 0  # not its last name
    assert master.getattr(f.ino).nlink == 1
    assert unlink(master, ROOT_INO, b"f2", open_inos=[f.ino]).held == f.ino
    # a rename that replaces an open file keeps it the same way
    old = create(master, ROOT_INO, b"k.data")
    new = create(master, ROOT_INO, b"k.tmp")
    reply = rename(master, ROOT_INO, b"k.tmp", ROOT_INO, b"k.data", open_inos=[old.ino])
    assert reply.held == old.ino and reply.moved.ino == new.ino
    assert master.getattr(old.ino).nlink == 0 and master.lookup(ROOT_INO, b"k.data").ino == new.ino
    other = create(master, ROOT_INO, b"other")
    assert rename(master, ROOT_INO, b"other", ROOT_INO, b"k.data").held == 0
    assert kind_of(master.getattr, new.ino) == ErrorKind.NOT_FOUND
    # a retried unlink answers from the retry cache, the kept inode included
    g = create(master, ROOT_INO, b"g")
    rid = new_request_id()
    assert unlink(master, ROOT_INO, b"g", open_inos=[g.ino], rid=rid).held == g.ino
    assert unlink(master, ROOT_INO, b"g", open_inos=[g.ino], rid=rid).held == g.ino
    with master.store.read() as txn:
        held = dict(master.store.held(txn))
    assert held == {f.ino: SESSION, old.ino: SESSION, g.ino: SESSION}
    assert other.ino not in held


def test_kept_inodes_go_when_their_session_is_gone(tmp_path):
    m = make_master(tmp_path, {"orphan_timeout": 0.2})
    try:
        m.capacity.close()
        wid = add_worker(m)
        cap = m.capacity
        for sid in (11, 22):
            m.sessions.opened(sid, [])
        kept = {}
        for sid in (11, 22):
            f, ids = publish(m, create(m, ROOT_INO, b"f%d" % sid).ino, [MiB])
            assert m.unlink(master_pb2.UnlinkRequest(
                request_id=new_request_id(), parent=ROOT_INO, name=b"f%d" % sid, session=sid,
                open_inos=[f.ino]), rmdir=False).held == f.ino
            kept[sid] = (f.ino, ids)
        m.sessions.closed(11)
        m.sessions.closed(22)
        m.sessions.opened(33, [22])  # the mount of session 22 reconnected
        cap.run_round()  # not yet: gone for less than the orphan timeout
        assert m.getattr(kept[11][0]).nlink == 0
        time.sleep(0.3)
        cap.run_round()
        assert kind_of(m.getattr, kept[11][0]) == ErrorKind.NOT_FOUND
        assert m.getattr(kept[22][0]).nlink == 0
        assert cap.stats["unlinked_removed"] == 1 and cap.stats["unlinked_bytes"] == MiB
        assert deletes(m, wid) == kept[11][1]
    finally:
        m.close()


# ---------------------------------------------------------------------- RENAME_EXCHANGE
def test_rename_exchange_swaps_two_names(master):
    a, b = mkdir(master, ROOT_INO, b"a"), mkdir(master, ROOT_INO, b"b")
    f = create(master, a.ino, b"f")
    g = create(master, b.ino, b"g")
    time.sleep(0.001)
    reply = rename(master, a.ino, b"f", b.ino, b"g", exchange=True)
    assert master.lookup(a.ino, b"f").ino == g.ino and master.lookup(b.ino, b"g").ino == f.ino
    nf, ng = master.getattr(f.ino), master.getattr(g.ino)
    assert (nf.parent, nf.name, ng.parent, ng.name) == (b.ino, b"g", a.ino, b"f")
    assert nf.ctime_ns == ng.ctime_ns > f.ctime_ns
    assert reply.parent.ino == a.ino and reply.new_parent.ino == b.ino
    assert reply.moved.ino == f.ino  # what new_name names now
    # a directory and a file, across parents: the directories' link counts follow
    d = mkdir(master, a.ino, b"d")
    mkdir(master, d.ino, b"inside")
    assert master.getattr(a.ino).nlink == 3 and master.getattr(b.ino).nlink == 2
    rename(master, a.ino, b"d", b.ino, b"g", exchange=True)
    assert master.lookup(b.ino, b"g").ino == d.ino and master.lookup(a.ino, b"d").ino == f.ino
    assert master.getattr(a.ino).nlink == 2 and master.getattr(b.ino).nlink == 3
    assert master.getattr(d.ino).parent == b.ino
    assert names(master, d.ino) == [b"inside"]  # a directory moves with its entries
    # errors
    assert kind_of(rename, master, a.ino, b"d", b.ino, b"nope", (), True) == ErrorKind.NOT_FOUND
    assert kind_of(rename, master, a.ino, b"nope", b.ino, b"g", (), True) == ErrorKind.NOT_FOUND
    assert kind_of(rename, master, a.ino, b"d", b.ino, b"g", (), True, True) == ErrorKind.INVALID
    inside = master.lookup(d.ino, b"inside")
    # a directory may not land below itself, whichever of the two it is
    assert kind_of(rename, master, ROOT_INO, b"b", d.ino, b"inside", (), True) == ErrorKind.INVALID
    assert kind_of(rename, master, d.ino, b"inside", ROOT_INO, b"b", (), True) == ErrorKind.INVALID
    assert master.lookup(d.ino, b"inside").ino == inside.ino
    # two names of one inode: nothing to swap
    link(master, f.ino, a.ino, b"f2")
    rename(master, a.ino, b"d", a.ino, b"f2", exchange=True)
    assert master.lookup(a.ino, b"d").ino == master.lookup(a.ino, b"f2").ino == f.ino
    # hard links are exchanged name by name: the links table follows
    rename(master, a.ino, b"f2", d.ino, b"inside", exchange=True)
    assert master.lookup(d.ino, b"inside").ino == f.ino
    assert master.lookup(a.ino, b"f2").ino == inside.ino
    assert master.getattr(inside.ino).parent == a.ino
    unlink(master, d.ino, b"inside")
    unlink(master, a.ino, b"d")
    assert kind_of(master.getattr, f.ino) == ErrorKind.NOT_FOUND
    assert rows(master, "links", f.ino) == []


# ---------------------------------------------------------------------- xattrs
def test_xattrs_set_get_list_remove(master):
    f = create(master, ROOT_INO, b"f")
    t = master.getattr(f.ino).ctime_ns
    node = set_xattr(master, f.ino, b"user.b", b"2")
    assert node.ctime_ns > t
    set_xattr(master, f.ino, b"user.a", b"")  # empty values are values
    assert list_xattr(master, f.ino) == [b"user.a", b"user.b"]
    assert get_xattr(master, f.ino, b"user.a") == b""
    assert get_xattr(master, f.ino, b"user.b") == b"2"
    set_xattr(master, f.ino, b"user.b", b"\0\xff" * 10)
    assert get_xattr(master, f.ino, b"user.b") == b"\0\xff" * 10
    # flags: create only, replace only
    assert kind_of(set_xattr, master, f.ino, b"user.a", b"x", 1) == ErrorKind.EXISTS
    assert kind_of(set_xattr, master, f.ino, b"user.c", b"x", 2) == ErrorKind.NO_DATA
    assert kind_of(set_xattr, master, f.ino, b"user.c", b"x", 3) == ErrorKind.INVALID
    set_xattr(master, f.ino, b"user.c", b"x", 1)
    set_xattr(master, f.ino, b"user.c", b"y", 2)
    assert get_xattr(master, f.ino, b"user.c") == b"y"
    node = remove_xattr(master, f.ino, b"user.c")
    assert node.ino == f.ino and list_xattr(master, f.ino) == [b"user.a", b"user.b"]
    assert kind_of(remove_xattr, master, f.ino, b"user.c") == ErrorKind.NO_DATA
    assert kind_of(get_xattr, master, f.ino, b"user.c") == ErrorKind.NO_DATA
    # names: the user namespace only, 1..255 bytes
    for name, kind in [(b"trusted.x", ErrorKind.NOT_SUPPORTED),
                       (b"security.capability", ErrorKind.NOT_SUPPORTED),
                       (b"", ErrorKind.INVALID), (b"user.", ErrorKind.INVALID),
                       (b"user." + b"n" * 251, ErrorKind.NAME_TOO_LONG)]:
        assert kind_of(set_xattr, master, f.ino, name, b"v") == kind
        assert kind_of(get_xattr, master, f.ino, name) == kind
        assert kind_of(remove_xattr, master, f.ino, name) == kind
    set_xattr(master, f.ino, b"user." + b"n" * 250, b"v")
    # sizes: a value up to 64 KiB, all of an inode's names and values up to 64 KiB
    g = create(master, ROOT_INO, b"g")
    assert kind_of(set_xattr, master, g.ino, b"user.big", b"v" * 65537) == ErrorKind.TOO_BIG
    assert kind_of(set_xattr, master, g.ino, b"user.big", b"v" * 65536) == ErrorKind.TOO_BIG
    set_xattr(master, g.ino, b"user.big", b"v" * (65536 - 8))
    assert kind_of(set_xattr, master, g.ino, b"user.x", b"") == ErrorKind.TOO_BIG
    set_xattr(master, g.ino, b"user.big", b"v" * 100)  # replacing counts the new value
    set_xattr(master, g.ino, b"user.x", b"")
    # any inode: a directory, a symlink
    d = mkdir(master, ROOT_INO, b"d")
    set_xattr(master, d.ino, b"user.dir", b"1")
    s = symlink(master, ROOT_INO, b"s", b"f").inode
    set_xattr(master, s.ino, b"user.s", b"1")
    assert list_xattr(master, d.ino) == [b"user.dir"] and list_xattr(master, s.ino) == [b"user.s"]
    assert kind_of(get_xattr, master, 999999, b"user.a") == ErrorKind.NOT_FOUND
    assert kind_of(list_xattr, master, 999999) == ErrorKind.NOT_FOUND
    # retried: the first result, not EXISTS / NO_DATA
    rid = new_request_id()
    set_xattr(master, f.ino, b"user.once", b"1", 1, rid=rid)
    assert set_xattr(master, f.ino, b"user.once", b"1", 1, rid=rid).ino == f.ino
    rid = new_request_id()
    remove_xattr(master, f.ino, b"user.once", rid=rid)
    assert remove_xattr(master, f.ino, b"user.once", rid=rid).ino == f.ino
    # the attributes go with the inode
    unlink(master, ROOT_INO, b"f")
    assert rows(master, "xattr", f.ino) == []


# ---------------------------------------------------------------------- the RPCs
def test_rpcs_on_the_client_port(tmp_path):
    service = InprocMaster(master_config(tmp_path))
    client = MasterClient(service.address(), timeout=10, wait=2, security=NO_SECURITY)
    on_worker_port = MasterClient(service.address("worker"), timeout=10, wait=2,
                                  security=NO_SECURITY)
    try:
        for call in (lambda c: c.symlink(ROOT_INO, b"s", b"t"),
                     lambda c: c.list_xattr(ROOT_INO), lambda c: c.release_inode(5)):
            with pytest.raises(CurvineError) as e:  # client calls: the client port only
                call(on_worker_port)
            assert e.value.kind == ErrorKind.NOT_SUPPORTED
        d = client.mkdir(ROOT_INO, b"d")
        node, lease, parent = client.symlink(d.ino, b"s", b"target", 1, 2)
        assert node.symlink_target == b"target" and parent.ino == d.ino and lease == 0
        node, _, parent = client.make_node(d.ino, b"c", common_pb2.CHAR_DEVICE, 0o600, 0x0103)
        assert (node.type, node.rdev, node.mode) == (common_pb2.CHAR_DEVICE, 0x0103, 0o600)
        f = client.create(d.ino, b"f")
        node, _, parent = client.link(f.ino, ROOT_INO, b"f2")
        assert node.nlink == 2 and parent.ino == ROOT_INO
        assert client.set_xattr(f.ino, b"user.k", b"v").ino == f.ino
        assert client.get_xattr(f.ino, b"user.k") == b"v"
        assert client.list_xattr(f.ino) == [b"user.k"]
        assert client.remove_xattr(f.ino, b"user.k").ino == f.ino
        with pytest.raises(CurvineError) as e:
            client.get_xattr(f.ino, b"user.k")
        assert e.value.kind == ErrorKind.NO_DATA
        with pytest.raises(CurvineError) as e:
            client.set_xattr(f.ino, b"user.k", b"v" * 70000)
        assert e.value.kind == ErrorKind.TOO_BIG
        with pytest.raises(CurvineError) as e:
            client.link(d.ino, ROOT_INO, b"d2")
        assert e.value.kind == ErrorKind.NOT_PERMITTED
        # the mount's calls: open inodes sent, the kept one answered
        client.session = SESSION
        parent, held = client.call(client.requests.unlink(ROOT_INO, b"f2", open_inos=[f.ino]))
        assert parent.ino == ROOT_INO and held == 0  # not its last name
        g = client.create(d.ino, b"g")
        *dirs, held = client.call(client.requests.rename(d.ino, b"f", d.ino, b"g",
                                                         open_inos=[g.ino]))
        assert held == g.ino and dirs[0].ino == d.ino and dirs[2].ino == f.ino
        client.call(client.requests.rename(d.ino, b"g", d.ino, b"s", exchange=True))
        assert client.lookup(d.ino, b"s").ino == f.ino
        assert client.rename(d.ino, b"s", d.ino, b"s2")[2].ino == f.ino  # 3 values, as before
        client.release_inode(g.ino)
        with pytest.raises(CurvineError) as e:
            client.getattr(g.ino)
        assert e.value.kind == ErrorKind.NOT_FOUND
        assert client.unlink(d.ino, b"s2").ino == d.ino  # the parent, as before
    finally:
        on_worker_port.close()
        client.close()
        service.stop()


# ---------------------------------------------------------------------- restart
def dump(m) -> dict:
    """Every table of the store, row by row."""
    out = {}
    with m.store.read() as txn:
        for name, db in m.store.db.items():
            out[name] = list(txn.cursor(db=db))
    return out


def populate(m, wid):
    """One mutation of every kind; returns (the kept inode, its blocks)."""
    d = mkdir(m, ROOT_INO, b"d")
    symlink(m, d.ino, b"ln", b"../somewhere/else")
    for kind in SPECIAL:
        mknod(m, d.ino, b"n%d" % kind, kind, 0o600, rdev=0x0801)
    f, _ = publish(m, create(m, d.ino, b"f").ino, [MiB])
    link(m, f.ino, ROOT_INO, b"f2")
    link(m, f.ino, d.ino, b"f3")
    unlink(m, d.ino, b"f")  # the first of three names
    set_xattr(m, f.ino, b"user.a", b"1")
    set_xattr(m, f.ino, b"user.b", b"2")
    remove_xattr(m, f.ino, b"user.a")
    x, y = create(m, ROOT_INO, b"x"), mkdir(m, d.ino, b"y")
    rename(m, ROOT_INO, b"x", d.ino, b"y", exchange=True)
    kept, ids = publish(m, create(m, ROOT_INO, b"open").ino, [2 * MiB])
    set_xattr(m, kept.ino, b"user.k", b"v")
    assert unlink(m, ROOT_INO, b"open", open_inos=[kept.ino]).held == kept.ino
    assert m.getattr(x.ino).parent == d.ino and m.getattr(y.ino).parent == ROOT_INO
    return kept.ino, ids


def test_restart_replays_every_kind_of_mutation(tmp_path):
    m = make_master(tmp_path)
    wid = add_worker(m)
    kept, ids = populate(m, wid)
    d = m.lookup(ROOT_INO, b"d").ino
    f = m.lookup(ROOT_INO, b"f2")
    before = dump(m)
    m.close()

    def reopened():
        m = make_master(tmp_path)
        m.capacity.close()
        assert dump(m) == before
        assert m.lookup(d, b"ln").symlink_target == b"../somewhere/else"
        for kind in SPECIAL:
            node = m.lookup(d, b"n%d" % kind)
            assert node.type == kind and node.rdev == (
                0x0801 if kind in (common_pb2.CHAR_DEVICE, common_pb2.BLOCK_DEVICE) else 0)
        node = m.getattr(f.ino)
        assert node.nlink == 2 and (node.parent, node.name) == (ROOT_INO, b"f2")
        assert m.lookup(d, b"f3").ino == f.ino
        assert list_xattr(m, f.ino) == [b"user.b"]
        assert m.lookup(d, b"y").type == common_pb2.FILE  # exchanged
        assert m.lookup(ROOT_INO, b"x").type == common_pb2.DIRECTORY
        held = m.getattr(kept)
        assert held.nlink == 0 and held.size == 2 * MiB
        assert get_xattr(m, kept, b"user.k") == b"v"
        return m

    reopened().close()  # from LMDB
    shutil.rmtree(tmp_path / "meta")  # LMDB lost: replay applies every record again
    m = reopened()
    try:
        # the kept inode survived both; its mount's last close removes it now
        add_worker(m)
        release(m, kept)
        assert kind_of(m.getattr, kept) == ErrorKind.NOT_FOUND
        assert deletes(m, wid) == ids
        assert rows(m, "held", kept) == rows(m, "xattr", kept) == []
    finally:
        m.close()
