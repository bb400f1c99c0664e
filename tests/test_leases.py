"""Leases on cached names and file attributes (master/cluster/leases.py): the table, the
master's revocations, and cross-mount visibility on real mounts with caching on."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from curvine.common.config import Config
from curvine.common.ids import ROOT_INO, new_request_id
from curvine.common.security import NO_SECURITY
from curvine.master.cluster import leases as leases_mod
from curvine.master.cluster.leases import LISTING, LeaseTable
from curvine.master.master import Master
from curvine.proto import common_pb2, master_pb2

from cluster_util import daemon_metric

FIFO = common_pb2.FIFO

MiB = 1 << 20


def drain(session):
    """The invalidations queued for a session so far."""
    out = []
    while not session.events.empty():
        ev = session.events.get_nowait()
        if ev is not None:
            out.append(ev)
    return out


def test_revocation_waits_for_the_holders_ack(tmp_path):
    t = LeaseTable(30.0, str(tmp_path / "leases.json"))
    a, b = t.open_session("a"), t.open_session("b")
    since = t.snapshot()
    assert t.grant(a.id, since, [(1, b"x")], [5]) == 30_000
    assert t.grant(b.id, since, [(1, b"x")], []) == 30_000
    done = threading.Event()

    def mutate():  # b removes x: a must drop it first, b (the caller) need not
        t.revoke([(1, b"x")], [5], exclude=b.id)
        done.set()

    th = threading.Thread(target=mutate)
    th.start()
    ev = a.events.get(timeout=10)
    assert [(k.parent, k.name) for k in ev.names] == [(1, b"x")] and list(ev.inodes) == [5]
    assert not drain(b)
    assert not done.wait(0.2)  # not acknowledged before a acks
    a.ack(ev.invalidate_id)
    th.join(10)
    assert done.is_set()
    # revoked leases are gone: the next mutation of x waits for nobody
    t.revoke([(1, b"x")], [5])
    assert not drain(a)


def test_a_read_racing_a_revocation_gets_no_lease(tmp_path):
    t = LeaseTable(30.0, str(tmp_path / "leases.json"))
    a = t.open_session("a")
    since = t.snapshot()  # a lookup starts reading (the old state)...
    t.revoke([(1, b"x")], [])  # ...a mutation of x commits and revokes meanwhile
    assert t.grant(a.id, since, [(1, b"x")], []) == 0  # what it read may be stale
    assert t.grant(a.id, since, [(1, b"other")], []) == 30_000  # other keys are fine
    assert t.grant(a.id, t.snapshot(), [(1, b"x")], []) == 30_000
    assert t.grant(0, t.snapshot(), [(1, b"x")], []) == 0  # no session: no lease
    assert LeaseTable(0).grant(a.id, 0, [(1, b"x")]) == 0  # leases off


def test_a_lost_session_is_waited_out_unless_it_comes_back(tmp_path):
    t = LeaseTable(0.6, str(tmp_path / "leases.json"))
    a = t.open_session("a")
    t.grant(a.id, t.snapshot(), [(1, b"x")], [])
    t.close_session(a)  # stream broke: a may still have x cached until its lease ends
    t0 = time.monotonic()
    t.revoke([(1, b"x")], [])
    assert time.monotonic() - t0 >= 0.5
    b = t.open_session("b")
    t.grant(b.id, t.snapshot(), [(1, b"y")], [])
    t.close_session(b)
    t.open_session("b again", dropped=[b.id])  # b dropped its caches and says so
    t0 = time.monotonic()
    t.revoke([(1, b"y")], [])
    assert time.monotonic() - t0 < 0.5


def test_restart_holds_revocations_until_old_sessions_return(tmp_path):
    path = str(tmp_path / "leases.json")
    t = LeaseTable(30.0, path)
    a = t.open_session("a")
    t.grant(a.id, t.snapshot(), [(1, b"x")], [])
    # the master restarts: the table is gone, the mount's kernel still has x
    t2 = LeaseTable(30.0, path)
    assert t2.grace_until > time.monotonic() + 20
    done = threading.Event()
    th = threading.Thread(target=lambda: (t2.revoke([(1, b"x")], []), done.set()))
    th.start()
    assert not done.wait(0.3)
    t2.open_session("a again", dropped=[a.id])
    th.join(10)
    assert done.is_set() and t2.grace_until == 0
    # a master that never had a session starts without grace
    assert LeaseTable(30.0, str(tmp_path / "fresh.json")).grace_until == 0


def test_ended_sessions_need_no_waiting_now_or_after_a_restart(tmp_path):
    path = str(tmp_path / "leases.json")
    t = LeaseTable(30.0, path)
    a = t.open_session("a")
    t.grant(a.id, t.snapshot(), [(1, b"x")], [])
    t.close_session(a)
    t.end_sessions([a.id])  # the mount unmounted: its kernel caches nothing
    t.revoke([(1, b"x")], [])  # no wait for a's lease
    assert LeaseTable(30.0, path).grace_until == 0  # nor after a restart
    b = t.open_session("b")
    t.grant(b.id, t.snapshot(), [(1, b"y")], [])
    t2 = LeaseTable(30.0, path)  # restart while b is mounted
    assert t2.grace_until
    t2.end_sessions([b.id])
    assert t2.grace_until == 0


def _acked(session) -> list:
    """Invalidations sent to ``session``, each acked at once by a thread (a mount)."""
    seen: list = []

    def run():
        while True:
            ev = session.events.get()
            if ev is None:
                return
            seen.append(ev)
            session.ack(ev.invalidate_id)
    threading.Thread(target=run, daemon=True).start()
    return seen


def make_master(tmp_path, lease_time=30.0) -> Master:
    cfg = Config()
    cfg.master.meta_dir = str(tmp_path / "meta")
    cfg.journal.dir = str(tmp_path / "journal")
    cfg.master.lease_time = lease_time
    return Master(cfg, security=NO_SECURITY)


def test_master_revokes_what_a_mutation_changed(tmp_path):
    m = make_master(tmp_path)
    try:
        a, b = m.leases.open_session("a"), m.leases.open_session("b")
        create = m.create(master_pb2.CreateRequest(request_id=new_request_id(), parent=ROOT_INO,
                                                   name=b"k.tmp", mode=0o644, session=a.id))
        assert create.lease_ms == 30_000
        ino = create.inode.ino
        hit = m.lookup_reply(master_pb2.LookupRequest(parent=ROOT_INO, name=b"k.tmp",
                                                      miss_ok=True, session=b.id))
        assert hit.lease_ms == 30_000
        miss = m.lookup_reply(master_pb2.LookupRequest(parent=ROOT_INO, name=b"k.data",
                                                       miss_ok=True, session=b.id))
        assert not miss.HasField("inode") and miss.lease_ms == 0  # never a negative lease
        d = m.mkdir(master_pb2.MkdirRequest(request_id=new_request_id(), parent=ROOT_INO,
                                            name=b"d", mode=0o755, session=b.id))
        attrs = m.getattr_reply(master_pb2.GetAttrRequest(ino=d.inode.ino, session=b.id))
        assert attrs.lease_ms == 0  # a directory's attributes are never leased

        seen_a, seen_b = _acked(a), _acked(b)
        # a (the writer) renames k.tmp onto k.data: b cached k.tmp, a's own kernel
        # moves its entry itself
        m.rename(master_pb2.RenameRequest(request_id=new_request_id(), parent=ROOT_INO,
                                          name=b"k.tmp", new_parent=ROOT_INO, new_name=b"k.data",
                                          session=a.id))
        assert not seen_a
        assert [(k.parent, k.name) for k in seen_b[0].names] == [(ROOT_INO, b"k.tmp")]
        assert list(seen_b[0].inodes) == [ino]
        # a publish revokes the attributes the other mount cached
        m.getattr_reply(master_pb2.GetAttrRequest(ino=ino, session=b.id))
        m.complete(master_pb2.CompleteFileRequest(request_id=new_request_id(), ino=ino, size=0,
                                                  session=a.id))
        assert list(seen_b[1].inodes) == [ino] and not seen_b[1].names
        # an unlink by a client without a session revokes every holder
        m.lookup_reply(master_pb2.LookupRequest(parent=ROOT_INO, name=b"k.data", miss_ok=True,
                                                session=a.id))
        m.unlink(master_pb2.UnlinkRequest(request_id=new_request_id(), parent=ROOT_INO,
                                          name=b"k.data"), rmdir=False)
        assert [(k.parent, k.name) for k in seen_a[0].names] == [(ROOT_INO, b"k.data")]
        assert len(seen_b) == 2  # b's lease on k.data was never granted (it missed)
    finally:
        m.close()


def test_a_mutating_mount_keeps_its_attribute_lease_and_a_new_link_is_leased(tmp_path):
    """The mount that publishes has the new version in its reply: the master keeps its
    lease on the attributes (that mount answers its next GETATTR from the reply), so
    another mount's change still revokes it.  A link's reply is leased to its maker
    (the link's own revocation of the inode does not deny it)."""
    m = make_master(tmp_path)
    try:
        a, b = m.leases.open_session("a"), m.leases.open_session("b")
        ino = m.create(master_pb2.CreateRequest(request_id=new_request_id(), parent=ROOT_INO,
                                                name=b"f", mode=0o644, session=a.id)).inode.ino
        seen_a = _acked(a)
        m.complete(master_pb2.CompleteFileRequest(request_id=new_request_id(), ino=ino, size=0,
                                                  session=a.id))
        assert not seen_a  # its own publish: nothing to drop
        m.setattr(master_pb2.SetAttrRequest(request_id=new_request_id(), ino=ino,
                                            mode=0o600, session=b.id))
        assert [list(ev.inodes) for ev in seen_a] == [[ino]]
        link = m.link(master_pb2.LinkRequest(request_id=new_request_id(), ino=ino,
                                             new_parent=ROOT_INO, new_name=b"g", session=a.id))
        assert link.lease_ms == 30_000 and link.inode.nlink == 2
    finally:
        m.close()


def test_a_miss_is_leased_on_request_and_revoked_by_whatever_makes_the_name(tmp_path):
    """lease_miss: a miss is leased (a mount's negative entry); create, mkdir, symlink,
    mknod, link, a rename onto the name and PutFile (the connector's, no session)
    each revoke it from every other holder before they return, not from the maker;
    a miss read before a name was made gets no lease; the maker's own lease on its new
    name is not denied by its own revocation."""
    m = make_master(tmp_path)
    try:
        a, b = m.leases.open_session("a"), m.leases.open_session("b")
        seen_a, seen_b = _acked(a), _acked(b)

        def miss(name: bytes, lease_miss: bool = True):
            return m.lookup_reply(master_pb2.LookupRequest(
                parent=ROOT_INO, name=name, miss_ok=True, session=b.id, lease_miss=lease_miss))

        assert miss(b"plain", lease_miss=False).lease_ms == 0  # only when asked
        f = m.create(master_pb2.CreateRequest(request_id=new_request_id(), parent=ROOT_INO,
                                              name=b"src.tmp", mode=0o644, session=a.id))
        makers = {
            b"c": lambda n: m.create(master_pb2.CreateRequest(
                request_id=new_request_id(), parent=ROOT_INO, name=n, mode=0o644,
                session=a.id)),
            b"d": lambda n: m.mkdir(master_pb2.MkdirRequest(
                request_id=new_request_id(), parent=ROOT_INO, name=n, mode=0o755,
                session=a.id)),
            b"s": lambda n: m.symlink(master_pb2.SymlinkRequest(
                request_id=new_request_id(), parent=ROOT_INO, name=n, target=b"c",
                session=a.id)),
            b"p": lambda n: m.make_node(master_pb2.MakeNodeRequest(
                request_id=new_request_id(), parent=ROOT_INO, name=n, type=FIFO, mode=0o644,
                session=a.id)),
            b"l": lambda n: m.link(master_pb2.LinkRequest(
                request_id=new_request_id(), ino=f.inode.ino, new_parent=ROOT_INO,
                new_name=n, session=a.id)),
            b"r": lambda n: m.rename(master_pb2.RenameRequest(
                request_id=new_request_id(), parent=ROOT_INO, name=b"src.tmp",
                new_parent=ROOT_INO, new_name=n, session=a.id)),
            b"put": lambda n: m.put_file(master_pb2.PutFileRequest(
                request_id=new_request_id(), parent=ROOT_INO, name=n, mode=0o644)),
        }
        for name, make in makers.items():
            reply = miss(name)
            assert not reply.HasField("inode") and reply.lease_ms == 5_000  # negative_lease_time
            before = len(seen_b)
            make(name)
            assert len(seen_b) == before + 1, name
            assert [(k.parent, k.name) for k in seen_b[-1].names] == [(ROOT_INO, name)]
        assert not any((ROOT_INO, n) in [(k.parent, k.name) for ev in seen_a for k in ev.names]
                       for n in makers if n != b"put")  # the maker's own kernel knows
        # a miss read before the name was made, leased after: denied
        since = m.leases.snapshot()
        m.create(master_pb2.CreateRequest(request_id=new_request_id(), parent=ROOT_INO,
                                          name=b"late", mode=0o644, session=a.id))
        assert m.leases.grant(b.id, since, [(ROOT_INO, b"late")], absent=True) == 0
        # ... while the maker's own lease on its new name is granted
        made = m.create(master_pb2.CreateRequest(request_id=new_request_id(), parent=ROOT_INO,
                                                 name=b"mine", mode=0o644, session=a.id))
        assert made.lease_ms == 30_000
    finally:
        m.close()


def _sessions_and_files(m: Master, names):
    """Sessions a and b (b's invalidations acked and recorded), and a directory d in
    which a made the files ``names``: (a, b, b's invalidations, d, {name: ino})."""
    a, b = m.leases.open_session("a"), m.leases.open_session("b")
    seen_b = _acked(b)
    d = m.mkdir(master_pb2.MkdirRequest(request_id=new_request_id(), parent=ROOT_INO,
                                        name=b"d", mode=0o755, session=a.id)).inode
    files = {n: m.create(master_pb2.CreateRequest(
        request_id=new_request_id(), parent=d.ino, name=n, mode=0o644,
        session=a.id)).inode.ino for n in names}
    return a, b, seen_b, d, files


def test_a_listing_leases_its_names_and_files_like_lookups(tmp_path):
    """ListDir with a session leases the names listed and the files' attributes (the
    mount's ls -l then stats from its kernel); an unlink and a publish by another
    mount revoke them; without a session nothing is leased."""
    m = make_master(tmp_path)
    try:
        a, b, seen_b, d, files = _sessions_and_files(m, (b"f1", b"f2"))
        m.mkdir(master_pb2.MkdirRequest(request_id=new_request_id(), parent=d.ino,
                                        name=b"sub", mode=0o755, session=a.id))
        assert m.listdir(d.ino, b"", 0).lease_ms == 0
        page = m.listdir(d.ino, b"", 0, session=b.id)
        assert page.lease_ms == 30_000 and [e.name for e in page.entries] == [b"f1", b"f2", b"sub"]
        m.unlink(master_pb2.UnlinkRequest(request_id=new_request_id(), parent=d.ino,
                                          name=b"f1", session=a.id), rmdir=False)
        assert [(k.parent, k.name) for k in seen_b[-1].names] == [(d.ino, b"f1")]
        m.complete(master_pb2.CompleteFileRequest(request_id=new_request_id(),
                                                  ino=files[b"f2"], size=0, session=a.id))
        assert list(seen_b[-1].inodes) == [files[b"f2"]]
        # a listing read before a change, leased after it: denied
        since = m.leases.snapshot()
        m.unlink(master_pb2.UnlinkRequest(request_id=new_request_id(), parent=d.ino,
                                          name=b"f2", session=a.id), rmdir=False)
        assert m.leases.grant(b.id, since, [(d.ino, b"f2")], [files[b"f2"]]) == 0
    finally:
        m.close()


def test_a_quiet_directorys_listing_is_leased_and_revoked_by_every_name_change(
        tmp_path, monkeypatch):
    """grant_listing: (dir, LISTING) is granted for absent_time unless a name in the
    directory changed within LISTING_QUIET; any name made or removed there revokes it
    from every holder but the mutating session (whose mount updates its copy)."""
    t = LeaseTable(30.0, str(tmp_path / "leases.json"), absent_time=5.0)
    a, b = t.open_session("a"), t.open_session("b")
    seen_a = _acked(a)
    assert t.grant_listing(a.id, t.snapshot(), 7) == 5_000
    t.revoke([], [], exclude=b.id, created=[(7, b"x")])  # b makes 7/x
    assert [(k.parent, k.name) for k in seen_a[-1].names] == [(7, LISTING)]
    assert t.grant_listing(a.id, t.snapshot(), 7) == 0  # b changed 7 just now: busy
    assert t.grant_listing(b.id, t.snapshot(), 7) == 5_000  # for b itself it is not
    assert t.grant_listing(a.id, t.snapshot(), 8) == 5_000  # other directories are quiet
    t.revoke([], [], exclude=a.id, created=[(8, b"mine")])  # a's own change in 8...
    assert t.grant_listing(a.id, t.snapshot(), 8) == 5_000  # ...does not make 8 busy for a
    assert t.grant_listing(b.id, t.snapshot(), 8) == 0  # but does for b
    t.revoke([], [], created=[(9, b"x")])  # a client without a session (0)
    assert t.grant_listing(0, t.snapshot(), 9) == 0
    assert t.grant_listing(a.id, t.snapshot(), 9) == 0
    monkeypatch.setattr(leases_mod, "LISTING_QUIET", 0.0)
    since = t.snapshot()
    t.revoke([(7, b"x")], [], exclude=b.id)  # b removes 7/x after a read the listing
    assert t.grant_listing(a.id, since, 7) == 0  # what a read may be stale
    assert t.grant_listing(a.id, t.snapshot(), 7) == 5_000
    seen_b = _acked(b)
    n = len(seen_a)
    t.revoke([], [], exclude=a.id, created=[(7, b"y")])  # a's own change: kept, not sent
    assert len(seen_a) == n
    t.revoke([(7, b"y")], [], exclude=b.id)  # b's change: a's (kept) listing revoked
    assert [(k.parent, k.name) for k in seen_a[-1].names] == [(7, LISTING)]
    t.revoke([(7, b"z")], [], exclude=b.id)  # revoked already: nothing more to send
    assert len(seen_a) == n + 1
    # b's listing of 7 (granted above) went with a's change, not with b's own
    assert [ev for ev in seen_b if (7, LISTING) in [(k.parent, k.name) for k in ev.names]] \
        == seen_b[:1] and len(seen_b) == 1


def test_listdir_leases_a_whole_quiet_directory_to_a_session(tmp_path, monkeypatch):
    """ListDir(lease_listing) on a first page holding the whole directory leases its
    listing; not a partial page, not without a session; names_only lists names alone."""
    m = make_master(tmp_path)
    try:
        a, b, seen_b, d, _ = _sessions_and_files(m, (b"f1", b"f2", b"f3"))
        busy = m.listdir(d.ino, b"", 0, b.id, True, True)  # a just made names there
        assert busy.listing_lease_ms == 0 and busy.has_more and not busy.entries  # not read
        # a's own creates do not make it busy for a; a mkdir leases its new directory
        assert m.listdir(d.ino, b"", 0, a.id, True, True).listing_lease_ms == 5_000
        sub = m.mkdir(master_pb2.MkdirRequest(request_id=new_request_id(), parent=d.ino,
                                              name=b"sub", mode=0o755, session=b.id))
        assert sub.listing_lease_ms == 5_000
        m.unlink(master_pb2.UnlinkRequest(request_id=new_request_id(), parent=d.ino,
                                          name=b"sub", session=b.id), rmdir=True)
        assert m.mkdir(master_pb2.MkdirRequest(request_id=new_request_id(), parent=d.ino,
                                               name=b"nosession", mode=0o755)
                       ).listing_lease_ms == 0
        m.unlink(master_pb2.UnlinkRequest(request_id=new_request_id(), parent=d.ino,
                                          name=b"nosession"), rmdir=True)
        monkeypatch.setattr(leases_mod, "LISTING_QUIET", 0.0)
        page = m.listdir(d.ino, b"", 0, b.id, names_only=True, lease_listing=True)
        assert [e.name for e in page.entries] == [b"f1", b"f2", b"f3"]
        assert not any(e.HasField("inode") for e in page.entries) and page.lease_ms == 0
        assert page.listing_lease_ms == 5_000  # master.negative_lease_time
        assert m.listdir(d.ino, b"", 2, b.id, True, True).listing_lease_ms == 0  # partial
        assert m.listdir(d.ino, b"f1", 0, b.id, True, True).listing_lease_ms == 0  # later page
        assert m.listdir(d.ino, b"", 0, 0, True, True).listing_lease_ms == 0  # no session
        full = m.listdir(d.ino, b"", 0, b.id, lease_listing=True)  # a readdir's first page
        assert full.listing_lease_ms == 5_000 and full.lease_ms == 30_000
        # a PutFile (the connector's store) by a client without a session revokes it
        m.put_file(master_pb2.PutFileRequest(request_id=new_request_id(), parent=d.ino,
                                             name=b"k.data", mode=0o644))
        assert (d.ino, LISTING) in [(k.parent, k.name) for k in seen_b[-1].names]
    finally:
        m.close()


# --------------------------------------------------------------------------- real mounts

def _conf(tmp_path, lease="60s"):
    p = tmp_path / "leases.toml"
    p.write_text(f'[master]\nlease_time = "{lease}"\n')
    return str(p)


def _frozen(pid):
    """The master is stopped (SIGSTOP) inside the block: whatever a mount answers
    then, it answers from its kernel's cache."""
    class Freeze:
        def __enter__(self):
            os.kill(pid, signal.SIGSTOP)

        def __exit__(self, *exc):
            os.kill(pid, signal.SIGCONT)
    return Freeze()


def _in_thread(fn, timeout=20.0):
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        return "still waiting"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _master_pid(c):
    import json
    with open(c.state_path) as f:
        return next(p["pid"] for p in json.load(f)["procs"] if p["role"] == "master")


def test_cached_names_stay_correct_across_mounts(make_cluster, tmp_path):
    """With leases, a mount answers stat of names it looked up from its kernel cache
    (even with the master stopped), and still sees every change made on another mount
    as soon as that change returns: unlink, rename over a cached name, a new version,
    chmod, and a name made where it had cached a miss."""
    c = make_cluster(workers=1, mounts=2, conf=_conf(tmp_path))
    _sessions_up(c, 2)
    a, b = c.mounts
    os.mkdir(os.path.join(a, "l2"))
    da, db = os.path.join(a, "l2"), os.path.join(b, "l2")

    def put(name, data):
        with open(os.path.join(da, name + ".tmp"), "wb") as f:
            f.write(data)
        os.rename(os.path.join(da, name + ".tmp"), os.path.join(da, name + ".data"))

    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(db, "k1.data"))  # a miss first: cached, then revoked by A
    put("k1", b"one")
    assert os.stat(os.path.join(db, "k1.data")).st_size == 3
    time.sleep(0.5)  # let the lease session settle (no timing is asserted)
    st = os.stat(os.path.join(db, "k1.data"))
    with _frozen(_master_pid(c)):
        cached = _in_thread(lambda: os.stat(os.path.join(db, "k1.data")).st_ino)
    assert cached == st.st_ino, "a leased name should be answered from the kernel cache"
    # a new version published on A: B's cached attributes go at once
    put("k2", b"two-two")
    os.rename(os.path.join(da, "k2.data"), os.path.join(da, "k1.data"))
    assert os.stat(os.path.join(db, "k1.data")).st_size == 7
    with open(os.path.join(db, "k1.data"), "rb") as f:
        assert f.read() == b"two-two"
    with open(os.path.join(da, "k1.data"), "ab") as f:
        f.write(b"!")
    assert os.stat(os.path.join(db, "k1.data")).st_size == 8
    os.chmod(os.path.join(da, "k1.data"), 0o600)
    assert os.stat(os.path.join(db, "k1.data")).st_mode & 0o777 == 0o600
    # unlink on A: gone on B at once
    os.unlink(os.path.join(da, "k1.data"))
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(db, "k1.data"))
    # names created on B are found on A at once, both ways
    with open(os.path.join(db, "k3.data"), "wb") as f:
        f.write(b"3")
    assert os.stat(os.path.join(da, "k3.data")).st_size == 1
    os.rename(os.path.join(db, "k3.data"), os.path.join(db, "k4.data"))
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(da, "k3.data"))
    assert os.stat(os.path.join(da, "k4.data")).st_size == 1
    # directories: a cached directory entry removed on the other mount
    os.mkdir(os.path.join(db, "sub"))
    assert os.path.isdir(os.path.join(da, "sub"))
    os.rmdir(os.path.join(db, "sub"))
    assert not os.path.exists(os.path.join(da, "sub"))


@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master is restarted on purpose
def test_mounts_drop_leases_when_the_master_restarts(make_cluster, tmp_path):
    """Names, absences and listings B holds are all dropped when the master is
    SIGKILLed: each change A makes after the restart is seen on B.  (Leases of 60 s,
    absences and listings included, so that a copy B kept across the restart would
    still be in use when A's change returns.)"""
    conf = tmp_path / "leases.toml"
    conf.write_text('[master]\nlease_time = "60s"\nnegative_lease_time = "60s"\n')
    c = make_cluster(workers=1, mounts=2, conf=str(conf))
    _sessions_up(c, 2)
    a, b = c.mounts
    with open(os.path.join(a, "f"), "wb") as f:
        f.write(b"x")
    assert os.stat(os.path.join(b, "f")).st_size == 1  # B leases f
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(b, "g"))  # and g's absence
    os.mkdir(os.path.join(b, "q"))  # and the listing of q (empty), with the mkdir
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(b, "q", "x"))  # answered on B
    c.restart("master")
    open(os.path.join(a, "q", "x"), "wb").close()
    assert os.path.exists(os.path.join(b, "q", "x"))
    os.unlink(os.path.join(a, "f"))  # waits until B dropped (or its lease ran out)
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(b, "f"))
    with open(os.path.join(a, "g"), "wb") as f:
        f.write(b"g")
    assert os.stat(os.path.join(b, "g")).st_size == 1


def _two_mounts_and_a_file(make_cluster, name):
    """A cluster at the defaults with mounts A and B, and directory ``name`` holding
    ``file`` (5 bytes) made on A: (cluster, the directory on A, the same on B).
    Both mounts' lease sessions are up (lookups before that are not leased)."""
    c = make_cluster(workers=1, mounts=2)
    _sessions_up(c, 2)
    a, b = c.mounts
    os.mkdir(os.path.join(a, name))
    da, db = os.path.join(a, name), os.path.join(b, name)
    with open(os.path.join(da, "file"), "wb") as f:
        f.write(b"12345")
    return c, da, db


def test_a_miss_is_cached_until_the_name_is_made_on_another_mount(make_cluster):
    """At the defaults (leases of 30 s, fuse.negative_leases on): a mount answers a
    repeated miss from its kernel (the master stopped meanwhile), and every way of
    making that name on the other mount -- create, mkdir, symlink, mkfifo, link, rename
    onto it (LMCache's publish) -- is seen by stat there as soon as it returns."""
    c, da, db = _two_mounts_and_a_file(make_cluster, "neg")
    names = ["c", "d", "s", "p", "l", "k.data"]
    for n in names:
        with pytest.raises(FileNotFoundError):
            os.stat(os.path.join(db, n))
    time.sleep(0.5)  # let the lease session settle (no timing is asserted)
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(db, "c"))  # leased as absent now (the session is up)

    def cached_miss():
        try:
            os.stat(os.path.join(db, "c"))
        except FileNotFoundError:
            return "absent"
        return "found"

    with _frozen(_master_pid(c)):
        answer = _in_thread(cached_miss)
    assert answer == "absent", "a leased miss should be answered from the kernel cache"

    makers = {
        "c": lambda p: open(p, "wb").close(),
        "d": lambda p: os.mkdir(p),
        "s": lambda p: os.symlink("file", p),
        "p": lambda p: os.mkfifo(p),
        "l": lambda p: os.link(os.path.join(da, "file"), p),
        "k.data": lambda p: (open(os.path.join(da, "k.tmp"), "wb").close(),
                             os.rename(os.path.join(da, "k.tmp"), p)),
    }
    for n, make in makers.items():
        make(os.path.join(da, n))
        assert os.path.lexists(os.path.join(db, n)), f"{n} made on A, not seen on B"
    assert os.stat(os.path.join(db, "l")).st_size == 5
    assert os.readlink(os.path.join(db, "s")) == "file"


def test_a_listed_directory_is_stat_ed_from_the_kernel_and_kept_correct(make_cluster):
    """At the defaults: after B lists a directory, stat of every entry is answered by
    B's kernel (the master stopped meanwhile: ls -l costs no round trip), and an
    unlink, a rename and a new version made on A are seen on B as soon as they return."""
    c = make_cluster(workers=1, mounts=2)
    _sessions_up(c, 2)
    a, b = c.mounts
    os.mkdir(os.path.join(a, "ls"))
    da, db = os.path.join(a, "ls"), os.path.join(b, "ls")
    for i in range(20):
        with open(os.path.join(da, f"f{i:02d}"), "wb") as f:
            f.write(b"x" * i)
    time.sleep(0.5)  # let B's lease session settle (no timing is asserted)
    names = sorted(os.listdir(db))
    assert len(names) == 20

    def stat_all():  # what ls -l does after its listing
        return [(n, os.stat(os.path.join(db, n)).st_size) for n in names]

    with _frozen(_master_pid(c)):
        listed = _in_thread(stat_all)
    assert listed == [(f"f{i:02d}", i) for i in range(20)], listed
    os.unlink(os.path.join(da, "f03"))
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(db, "f03"))
    os.rename(os.path.join(da, "f04"), os.path.join(da, "g04"))
    assert not os.path.exists(os.path.join(db, "f04"))
    assert os.stat(os.path.join(db, "g04")).st_size == 4
    with open(os.path.join(da, "f05"), "wb") as f:
        f.write(b"new version, longer")
    assert os.stat(os.path.join(db, "f05")).st_size == len(b"new version, longer")


def test_a_quiet_directory_answers_misses_on_the_mount_and_sees_every_new_name(make_cluster):
    """At the defaults: once a quiet directory keeps missing on B (or B lists it), B
    answers a lookup of any name not there itself -- names it never asked about, with
    the master stopped -- and still sees a name made there on A (a create, a rename onto
    it: LMCache's publish, a hard link) as soon as that returns.  B's own creates,
    renames and unlinks keep its copy right (checked with its kernel's dentries
    dropped, so that the lookups reach the mount)."""
    from curvine.fuse_client.listings import MISSES_BEFORE_LISTING
    c, da, db = _two_mounts_and_a_file(make_cluster, "quiet")
    open(os.path.join(da, "k.tmp"), "wb").close()
    pid = _master_pid(c)
    fresh = iter(range(1_000_000))
    dir_fd = os.open(db, os.O_RDONLY | os.O_DIRECTORY)  # keeps the directory's dentry

    def state(name):
        try:
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return "absent"
        return "found"

    def misses_until_listed():
        time.sleep(leases_mod.LISTING_QUIET + 0.3)  # no name changed for that long
        for _ in range(MISSES_BEFORE_LISTING + 1):
            assert state(f"miss-{next(fresh)}") == "absent"

    def answered_here(name=None, wait=5.0):
        """What B answers with the master stopped: a miss from its listing, else
        "still waiting" (for the master)."""
        with _frozen(pid):
            return _in_thread(lambda: state(name or f"never-asked-{next(fresh)}"), wait)

    misses_until_listed()
    assert answered_here() == "absent", "a leased listing should answer a new miss"

    # B's own changes, each followed by lookups that reach the mount
    open(os.path.join(db, "own1"), "wb").close()
    os.rename(os.path.join(db, "own1"), os.path.join(db, "own2"))
    open(os.path.join(db, "own3"), "wb").close()
    os.unlink(os.path.join(db, "own3"))
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")  # the kernel forgets its dentries: lookups come to the mounts
    assert answered_here("own1") == "absent" and answered_here("own3") == "absent"
    assert answered_here("own2", 1.0) != "absent"  # listed: asked of the (stopped) master
    assert state("own2") == "found" and state("file") == "found"

    makers = [
        ("c", lambda p: open(p, "wb").close()),
        ("k.data", lambda p: os.rename(os.path.join(da, "k.tmp"), p)),
        ("l", lambda p: os.link(os.path.join(da, "file"), p)),
    ]
    for i, (name, make) in enumerate(makers):
        if i == 1:  # the other way to get a listing: a readdir of the whole directory
            time.sleep(leases_mod.LISTING_QUIET + 0.3)
            assert "file" in os.listdir(db)
        else:
            misses_until_listed()
        assert answered_here() == "absent"
        make(os.path.join(da, name))
        assert state(name) == "found", f"{name} made on A, not seen on B"
    assert os.stat(os.path.join(db, "l")).st_size == 5
    os.close(dir_fd)

    # a directory B makes is leased to B with the mkdir, and B's own creates there
    # keep it so: every miss in it is answered on B at once (what a create's lookup
    # of its new name is); A's create there is seen at once as well
    os.mkdir(os.path.join(db, "fresh"))
    dir_fd = os.open(os.path.join(db, "fresh"), os.O_RDONLY | os.O_DIRECTORY)
    assert answered_here() == "absent"
    for i in range(20):
        open(os.path.join(db, "fresh", f"f{i}"), "wb").close()
    assert answered_here() == "absent" and answered_here("f3", 1.0) != "absent"
    open(os.path.join(da, "fresh", "from-a"), "wb").close()
    assert state("from-a") == "found"
    os.close(dir_fd)


def test_a_quiet_directory_is_listed_from_the_kernel_and_every_change_is_seen(make_cluster):
    """At the defaults: while B holds a quiet directory's listing, B's kernel keeps its
    entries, so repeated listings send the master nothing; yet every name made or
    removed on A (create, LMCache's rename onto a name, link, symlink, mkdir, unlink,
    rmdir, rename away) is in or out of B's next listing at once, and so are B's own
    changes.  A change made on A after B's lease ran out (no revocation reaches B then)
    is seen too: B's next opendir does not let its kernel keep the old entries."""
    from cluster_util import master_calls
    c, da, db = _two_mounts_and_a_file(make_cluster, "ls")
    for i in range(50):
        open(os.path.join(da, f"f{i}"), "wb").close()
    expected = {"file"} | {f"f{i}" for i in range(50)}

    def listed_from_the_kernel():
        """B lists 3 times (the first leases the listing, the second fills the kernel's
        copy), then 5 more: those must send no ListDir."""
        time.sleep(leases_mod.LISTING_QUIET + 0.3)
        for _ in range(3):
            assert set(os.listdir(db)) == expected
        before = master_calls(c, "ListDir")
        for _ in range(5):
            assert set(os.listdir(db)) == expected
        return master_calls(c, "ListDir") - before

    assert listed_from_the_kernel() == 0, "repeated listings of a leased directory"

    def on_a(what, name, fn, gone=None):
        fn(os.path.join(da, name))
        if gone:
            expected.discard(gone)
        if what == "make":
            expected.add(name)
        else:
            expected.discard(name)
        assert set(os.listdir(db)) == expected, f"B's listing after A's {fn.__name__} {name}"

    def create(p):
        open(p, "wb").close()

    def publish(p):  # LMCache: <key>.tmp renamed onto <key>.data (which exists)
        create(os.path.join(da, "k.tmp"))
        os.rename(os.path.join(da, "k.tmp"), p)

    steps = [
        ("make", "c", create, None),
        ("make", "k.data", create, None),
        ("make", "k.data", publish, None),
        ("make", "l", lambda p: os.link(os.path.join(da, "file"), p), None),
        ("make", "s", lambda p: os.symlink("file", p), None),
        ("make", "d", os.mkdir, None),
        ("remove", "d", os.rmdir, None),
        ("remove", "c", os.unlink, None),
        ("make", "moved", lambda p: os.rename(os.path.join(da, "f0"), p), "f0"),
        ("remove", "f1", lambda p: os.rename(p, os.path.join(da, "..", "away")), None),
    ]
    for what, name, fn, gone in steps:
        assert listed_from_the_kernel() == 0
        on_a(what, name, fn, gone)

    # B's own changes: its kernel drops its copy itself
    assert listed_from_the_kernel() == 0
    for name in ("own1", "own2"):
        create(os.path.join(db, name))
        expected.add(name)
        assert set(os.listdir(db)) == expected
    os.rename(os.path.join(db, "own1"), os.path.join(db, "own3"))
    expected = (expected - {"own1"}) | {"own3"}
    os.unlink(os.path.join(db, "own2"))
    expected.discard("own2")
    assert set(os.listdir(db)) == expected

    # a change after B's lease ran out: the master has nobody to revoke from
    assert listed_from_the_kernel() == 0
    time.sleep(float(Config().master.negative_lease_time) + 1.0)  # the default: 5 s
    create(os.path.join(da, "late"))
    expected.add("late")
    assert set(os.listdir(db)) == expected, "a name made after B's lease ran out"


def test_a_rewound_directory_handle_lists_the_directory_as_it_is_now(make_cluster):
    """POSIX rewinddir: the stream then refers to the directory's current state.  B
    keeps a directory handle open (os.listdir of a descriptor rewinds it each time)
    while A makes and removes names; each listing is the directory then.  Once with
    a cold handle, once after B's kernel keeps the entries of the leased directory."""
    c, da, db = _two_mounts_and_a_file(make_cluster, "rewind")
    fd = os.open(db, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert os.listdir(fd) == ["file"]
        open(os.path.join(da, "x"), "wb").close()
        assert sorted(os.listdir(fd)) == ["file", "x"]
        time.sleep(leases_mod.LISTING_QUIET + 0.3)
        for _ in range(3):  # leased, then kept by B's kernel (new opendirs)
            assert sorted(os.listdir(db)) == ["file", "x"]
        assert sorted(os.listdir(fd)) == ["file", "x"]
        os.unlink(os.path.join(da, "x"))
        open(os.path.join(da, "y"), "wb").close()
        assert sorted(os.listdir(fd)) == ["file", "y"]
    finally:
        os.close(fd)


def test_names_made_on_one_mount_while_another_answers_misses_from_a_listing(make_cluster):
    """At the defaults, concurrently: A creates (and later unlinks) names in
    directories B made -- B holds their listings from its mkdirs -- while B's threads
    stat those names without pause, list the directory without pause and create names
    of their own there.  Every name whose create returned on A is found by every later
    stat and listing on B until its unlink starts, and every name whose unlink returned
    is gone; B's own names are always found.  Then, once the directory has been quiet
    long enough for B to hold its listing again (and its kernel to keep the entries), A
    makes one more name and removes one: B's next listings show both changes."""
    c = make_cluster(workers=1, mounts=2)
    _sessions_up(c, 2)
    a, b = c.mounts
    errors: list = []
    for round_ in range(4):
        os.mkdir(os.path.join(b, f"r{round_}"))  # B: listing of r<round> leased
        da, db = os.path.join(a, f"r{round_}"), os.path.join(b, f"r{round_}")
        # f0 .. f<made>: created (returned); f0 .. f<unlinking>: unlink started;
        # f0 .. f<gone>: unlink returned
        made, unlinking, gone = -1, -1, -1
        stop = threading.Event()

        def watch():
            while not stop.is_set() and not errors:
                m, u, g = made, unlinking, gone
                for i in range(u + 1, m + 1):
                    if not os.path.exists(os.path.join(db, f"f{i}")) and i > unlinking:
                        errors.append(f"round {round_}: f{i} made on A, missing on B")
                for i in range(0, g + 1, 7):
                    if os.path.exists(os.path.join(db, f"f{i}")):
                        errors.append(f"round {round_}: f{i} unlinked on A, still on B")

        own_made = -1

        def own():
            nonlocal own_made
            for i in range(30):
                p = os.path.join(db, f"own{i}")
                open(p, "wb").close()
                own_made = i
                if not os.path.exists(p):
                    errors.append(f"round {round_}: B's own {p} missing")
                if stop.is_set():
                    return

        late: dict[str, bool] = {}  # the quiet phase's changes: name -> there (returned)

        def lists():
            while not stop.is_set() and not errors:
                m, g, o, before = made, gone, own_made, dict(late)
                names = set(os.listdir(db))
                u = unlinking  # after the listing: an unlink begun meanwhile may show
                for i in range(u + 1, m + 1):
                    if f"f{i}" not in names:
                        errors.append(f"round {round_}: f{i} made on A, not listed on B")
                for i in range(g + 1):
                    if f"f{i}" in names:
                        errors.append(f"round {round_}: f{i} unlinked on A, listed on B")
                for i in range(o + 1):
                    if f"own{i}" not in names:
                        errors.append(f"round {round_}: B's own own{i} not listed")
                for name, there in before.items():
                    if (name in names) != there:
                        errors.append(f"round {round_}: {name} {'not ' if there else ''}"
                                      "listed on B after A's change returned")

        threads = [threading.Thread(target=watch) for _ in range(2)]
        threads += [threading.Thread(target=own), threading.Thread(target=lists)]
        for t in threads:
            t.start()
        open(os.path.join(da, f"stay{round_}"), "wb").close()  # removed in the quiet phase
        try:
            for i in range(40):
                open(os.path.join(da, f"f{i}"), "wb").close()
                made = i
            for i in range(20):
                unlinking = i
                os.unlink(os.path.join(da, f"f{i}"))
                gone = i
            time.sleep(leases_mod.LISTING_QUIET + 0.5)  # quiet: B lists from its kernel
            open(os.path.join(da, f"late{round_}"), "wb").close()
            late[f"late{round_}"] = True
            os.unlink(os.path.join(da, f"stay{round_}"))
            late[f"stay{round_}"] = False
            time.sleep(0.3)
        finally:
            time.sleep(0.2)
            stop.set()
            for t in threads:
                t.join(30)
        assert not errors, errors[:5]


def _sessions_up(c, n: int, timeout: float = 30.0) -> None:
    """Wait until the master has the lease sessions of ``n`` mounts (a mount opens its
    session just after it starts; lookups before that are not leased)."""
    deadline = time.monotonic() + timeout
    while daemon_metric(c, "master", "curvine_lease_sessions") < n:
        assert time.monotonic() < deadline, f"{n} lease sessions not up in {timeout}s"
        time.sleep(0.05)


def test_a_version_published_here_is_stat_ed_from_the_mount_and_kept_correct(make_cluster):
    """At the defaults: the stat after a write and close on the writing mount is
    answered by that mount from the version it published (its counter of such
    answers moves by one), and what changes the file afterwards is seen at once: an
    unlink of an open file (nlink 0), a rename (ctime), a link (nlink 2), and a new
    version from another mount (KernelCache.forget_published, published)."""
    c = make_cluster(workers=1, mounts=2)
    a, b = c.mounts
    _sessions_up(c, 2)
    os.mkdir(os.path.join(a, "pub"))
    pa, pb = os.path.join(a, "pub", "f"), os.path.join(b, "pub", "f")
    from cluster_util import master_calls

    def answered_locally() -> float:
        return daemon_metric(c, "fuse", "curvine_fuse_getattrs_answered_locally_total")

    def get_blocks() -> float:
        return master_calls(c, "GetBlocks")

    before = answered_locally()
    with open(pa, "wb") as f:
        f.write(b"x" * 1000)
    assert os.stat(pa).st_size == 1000
    assert answered_locally() == before + 1
    # a reader of that small file opens the bytes this mount published: no GetBlocks
    calls = get_blocks()
    with open(pa, "rb") as f:
        assert f.read() == b"x" * 1000
    assert get_blocks() == calls
    with open(pb, "rb") as f:  # the other mount asks the master
        assert f.read() == b"x" * 1000
    assert get_blocks() == calls + 1
    # a truncate here (by path) drops the kept version: the reader gets zeros
    os.truncate(pa, 0)
    os.truncate(pa, 1000)
    with open(pa, "rb") as f:
        assert f.read() == bytes(1000)
    # a writer of a small file published here starts from those bytes (an append)
    with open(pa, "wb") as f:
        f.write(b"p" * 100)
    calls = get_blocks()
    with open(pa, "ab") as f:
        f.write(b"q" * 10)
    assert get_blocks() == calls
    with open(pb, "rb") as f:
        assert f.read() == b"p" * 100 + b"q" * 10

    # a publish (fsync), then an unlink of the open file: its attributes go
    fd = os.open(pa, os.O_RDWR)
    try:
        os.write(fd, b"y" * 10)
        os.fsync(fd)
        os.unlink(pa)
        assert os.fstat(fd).st_nlink == 0
    finally:
        os.close(fd)

    # a publish, then a rename: the ctime the master set with the rename
    with open(pa, "wb") as f:
        f.write(b"z" * 20)
    fd = os.open(pa, os.O_RDWR)
    try:
        os.write(fd, b"w")
        os.fsync(fd)  # kept for the next GETATTR...
        time.sleep(0.01)
        before = time.time_ns()
        os.rename(pa, pa + ".2")  # ...until this
        assert os.fstat(fd).st_ctime_ns >= before
        # a publish, then a link: two names
        os.write(fd, b"v")
        os.fsync(fd)
        os.link(pa + ".2", pa + ".3")
        assert os.fstat(fd).st_nlink == 2
    finally:
        os.close(fd)

    # a version published here, then one from another mount: that one is seen
    with open(pa, "wb") as f:
        f.write(b"a" * 5)
    assert os.stat(pa).st_size == 5
    with open(pb, "wb") as f:
        f.write(b"b" * 7)
    assert os.stat(pa).st_size == 7
    with open(pa, "rb") as f:
        assert f.read() == b"b" * 7
    with open(pa, "ab") as f:  # from that version, not the one kept here
        f.write(b"c")
    with open(pb, "rb") as f:
        assert f.read() == b"b" * 7 + b"c"


def test_a_leased_miss_is_answered_on_the_mount_when_the_kernel_asks_again(make_cluster):
    """At the defaults, in a directory whose listing this mount does not hold (made on
    the other mount): the lookup the kernel makes anyway of a rename's target it knows
    to be absent (LMCache's <key>.tmp -> <key>.data) is answered by the mount
    (listings.py, LeasedListings.missing), and a name the other mount makes is seen at once."""
    c = make_cluster(workers=1, mounts=2)
    a, b = c.mounts
    _sessions_up(c, 2)
    os.mkdir(os.path.join(b, "kv"))
    da, db = os.path.join(a, "kv"), os.path.join(b, "kv")
    local = "curvine_fuse_lookups_answered_locally_total"
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(da, "k.data"))  # a miss the master leases to A
    with open(os.path.join(da, "k.tmp"), "wb") as f:
        f.write(b"x")
    before = daemon_metric(c, "fuse", local)
    os.rename(os.path.join(da, "k.tmp"), os.path.join(da, "k.data"))
    assert daemon_metric(c, "fuse", local) == before + 1
    assert os.stat(os.path.join(db, "k.data")).st_size == 1
    # absences A knows, then made on B: A sees them at once, however it asks
    for name in ("n1", "n2"):
        with pytest.raises(FileNotFoundError):
            os.stat(os.path.join(da, name))
    for name in ("n1", "n2"):
        with open(os.path.join(db, name), "wb") as f:
            f.write(b"12")
    assert os.stat(os.path.join(da, "n1")).st_size == 2
    with pytest.raises(FileExistsError):
        os.open(os.path.join(da, "n2"), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
