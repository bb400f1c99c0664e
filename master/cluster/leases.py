"""Leases: which FUSE mounts may cache which names and file attributes, and for how long.

Consistency rule 2 (docs/consistency.md) with caching.  A mount keeps a session stream open to the
master.  A read that carries the session id (Lookup, GetAttr, ListDir -- each name of
the page, as a lookup of it -- and the replies of Create and Mkdir) may be granted a
lease: for ``lease_time`` seconds the mount may
keep the directory entry (parent, name) -> inode, and the attributes of a regular
file, in its kernel.  A mutation that removes or moves a name, or changes a file's
attributes, *revokes* the leases of every other mount on what it changed: the master
sends each holder an invalidation over its session and acknowledges the mutation
only when every holder has dropped its copy (acked) or its lease has run out.  A
miss is leased when the lookup asks for it (``lease_miss``: a mount's negative entry),
so a mutation that makes a name (create, mkdir, symlink, mknod, link, PutFile, the
target of a rename) revokes the leases on that name like one that removes it.
Directories' attributes (mtime, nlink change with every create in them) are never
leased: mounts cache them for the short ``fuse.attr_timeout`` as before.

Listings.  The key (dir, ``LISTING``) stands for the set of names in a directory.  A
mount that read a whole directory in one ListDir page may be granted a lease on it
(``grant_listing``, for ``absent_time`` like a negative entry): until it is revoked
the mount answers a lookup of a name it did not list with "absent", without asking.
Every mutation that makes or removes a name in a directory revokes its listing from
every holder but the mutating session, whose mount updates its own copy (its lease is
kept).  A directory where another client made or removed a name in the last
``LISTING_QUIET`` seconds gets no listing lease: where other clients keep creating, a
lease would only make each of their creates wait for a revocation.  A mkdir's reply
leases the new, empty directory's listing to its maker.

Races.  A read takes ``snapshot()`` before it opens its LMDB read transaction and
calls ``grant()`` after; a revocation runs after its mutation is committed.  A read
that saw the state before a mutation therefore started before that mutation's
revocation: either it registered its lease before the revocation looked at the
holders (and is revoked like any other), or the revocation ran in between and left
its sequence number on the keys' hash buckets, and the read is denied a lease.

Restarts.  The table lives in memory.  ``state_path`` records, durably, until when
leases may still be held and by which sessions; a restarted master holds back every
revocation (so every mutation that needs one) until that time, or until each of
those sessions has come back saying it dropped everything it cached (a mount drops
its caches whenever its session stream breaks).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import secrets
import threading
import time
from typing import Iterable

from curvine.proto import master_pb2

log = logging.getLogger(__name__)

BUCKETS = 1 << 14
MARGIN = 0.5  # seconds added to a lease before the master stops waiting for its holder
PURGE_EVERY = 256  # grants between purges of expired leases

NameKey = tuple  # (parent ino, name bytes)
LISTING = b""  # (dir, LISTING): the set of names in dir (no name is empty)
LISTING_QUIET = 2.0  # seconds without another client's name change before a listing lease


class Session:
    """One mount's session stream: invalidations out, acks (in order) back."""

    def __init__(self, sid: int, peer: str):
        self.id = sid
        self.peer = peer
        self.alive = True
        self.events: queue.SimpleQueue[master_pb2.SessionEvent | None] = queue.SimpleQueue()
        self._cv = threading.Condition()
        self._sent = 0
        self._acked = 0

    def send(self, names: list[NameKey], inodes: list[int]) -> int:
        with self._cv:
            self._sent += 1
            inv = self._sent
            # queued under the lock: invalidations go out in id order, acks come back so
            self.events.put(master_pb2.SessionEvent(
                invalidate_id=inv, inodes=inodes,
                names=[master_pb2.NameKey(parent=p, name=n) for p, n in names]))
        return inv

    def ack(self, inv: int) -> None:
        with self._cv:
            if inv > self._acked:
                self._acked = min(inv, self._sent)
                self._cv.notify_all()

    def wait_ack(self, inv: int, deadline: float) -> bool:
        with self._cv:
            while self._acked < inv and self.alive:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
            return self._acked >= inv

    def close(self) -> None:
        with self._cv:
            if not self.alive:
                return
            self.alive = False
            self._cv.notify_all()
        self.events.put(None)


class LeaseTable:
    def __init__(self, lease_time: float, state_path: str | None = None,
                 absent_time: float | None = None, state=None):
        self.lease_time = max(0.0, float(lease_time))
        # leases on a name's absence (negative entries): at most lease_time
        self.absent_time = min(self.lease_time, max(0.0, float(
            self.lease_time if absent_time is None else absent_time)))
        # where the restart state lives (load() -> dict | None, save(dict)): a file
        # in the meta dir (state_path), or what ``state`` names (a group's etcd)
        self.state = state if state is not None else (
            FileLeaseState(state_path) if state_path else None)
        self._lock = threading.Lock()
        self._names: dict[NameKey, dict[int, float]] = {}  # key -> {session: expiry}
        self._inodes: dict[int, dict[int, float]] = {}
        self._expiries: collections.deque = collections.deque()  # (expiry, names, inodes, sid)
        self._grants = 0
        self._seq = 0  # revocations so far
        self._buckets = [0] * BUCKETS  # last revocation seq per hash bucket of keys
        # the same for names made: only a lease on a name's absence is denied by them
        # (the maker's own lease on its new name is not)
        self._made_buckets = [0] * BUCKETS
        # dir -> {session: when it last made or removed a name there} (0: no session)
        self._changed: dict[int, dict[int, float]] = {}
        self._sessions: dict[int, Session] = {}
        self._gone_until: dict[int, float] = {}  # closed session -> when its leases end
        self._horizon = 0.0  # wall clock until which state_path says leases may exist
        self._state_lock = threading.Lock()
        self.grace_until = 0.0  # monotonic; revocations wait for it (leases of a past run)
        self._grace_sessions: set[int] = set()
        self._grace_cv = threading.Condition(self._lock)
        self.stats = {"granted": 0, "denied": 0, "revocations": 0, "invalidations": 0,
                      "waited_out": 0}
        self._load_state()

    # ------------------------------------------------------------------ sessions
    def open_session(self, peer: str, dropped: Iterable[int] = ()) -> Session:
        """A mount's new session; ``dropped``: its earlier sessions, whose cached
        entries it has dropped (their leases need no waiting any more)."""
        sid = 0
        while not sid:
            sid = secrets.randbits(63)
        s = Session(sid, peer)
        with self._lock:
            self._sessions[sid] = s
            for old in dropped:
                self._gone_until.pop(old, None)
                self._forget_session(old)
                if old in self._grace_sessions:
                    self._grace_sessions.discard(old)
                    if not self._grace_sessions and self.grace_until:
                        log.info("every mount of the previous run is back: lease grace over")
                        self.grace_until = 0.0
                        self._grace_cv.notify_all()
        self._save_state(force=True)
        log.info("session %x opened by %s", sid, peer)
        return s

    def end_sessions(self, sids: Iterable[int]) -> None:
        """These sessions' mount is gone (unmounted): nobody waits for their leases, and
        a restarted master needs no grace for them."""
        ended = []
        with self._lock:
            for sid in sids:
                s = self._sessions.pop(sid, None)
                if s is not None:
                    ended.append(s)
                self._gone_until.pop(sid, None)
                self._forget_session(sid)
                self._grace_sessions.discard(sid)
            if self.grace_until and not self._grace_sessions:
                self.grace_until = 0.0
                self._grace_cv.notify_all()
        for s in ended:
            s.close()
        self._save_state(force=True)

    def open_sessions(self) -> int:
        return len(self._sessions)

    def close_session(self, s: Session) -> None:
        """The stream ended: the mount drops its caches when it notices, but until its
        leases run out nobody can be sure it did."""
        with self._lock:
            if self._sessions.pop(s.id, None) is None:
                return
            self._gone_until[s.id] = time.monotonic() + self.lease_time + MARGIN
        s.close()
        log.info("session %x of %s closed", s.id, s.peer)

    def close_sessions(self) -> None:
        """End every session stream (a leader stepping down, master/member.py): each
        mount drops what it cached and opens its session with the next leader."""
        with self._lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            self.close_session(s)

    def _forget_session(self, sid: int) -> None:
        for table in (self._names, self._inodes):
            for holders in table.values():
                holders.pop(sid, None)

    # ------------------------------------------------------------------ reads
    def snapshot(self) -> int:
        """Call before reading the state a lease will cover."""
        return self._seq

    def grant(self, sid: int, since: int, names: Iterable[NameKey] = (),
              inodes: Iterable[int] = (), absent: bool = False) -> int:
        """Lease ``names`` and ``inodes`` to session ``sid``; returns the lease in
        milliseconds, 0 when denied (no session, leases off, or a revocation touched
        one of the keys since ``since``).  ``absent``: the names are leased as missing
        (a negative entry), which a name made since ``since`` denies too."""
        term = self.absent_time if absent else self.lease_time
        if not sid or term <= 0:
            return 0
        names, inodes = list(names), list(inodes)
        if not names and not inodes:
            return 0
        now = time.monotonic()
        with self._lock:
            s = self._sessions.get(sid)
            buckets = self._buckets
            made = self._made_buckets if absent else None
            # no revocation since the snapshot (the common case): no bucket to look at
            if s is None or not s.alive or (self._seq != since and (
                    any(buckets[hash(k) % BUCKETS] > since for k in names)
                    or any(buckets[hash(i) % BUCKETS] > since for i in inodes)
                    or (made and any(made[hash(k) % BUCKETS] > since for k in names)))):
                self.stats["denied"] += 1
                return 0
            exp = now + term
            for table, keys in ((self._names, names), (self._inodes, inodes)):
                get = table.get
                for k in keys:  # (no setdefault: it would make a dict per key)
                    holders = get(k)
                    if holders is None:
                        table[k] = {sid: exp}
                    else:
                        holders[sid] = exp
            # one expiry record per grant (a listing grants thousands of keys at once)
            self._expiries.append((exp, names, inodes, sid))
            self.stats["granted"] += 1
            self._grants += 1
            if self._grants % PURGE_EVERY == 0:
                self._purge(now)
        if time.time() + self.lease_time + MARGIN > self._horizon:
            self._save_state()
        return int(term * 1000)

    def grant_listing(self, sid: int, since: int, ino: int) -> int:
        """Lease to ``sid`` the set of names of directory ``ino`` as read after
        ``since`` (a whole listing); milliseconds, 0 when denied: as ``grant``, or
        another client made or removed a name there less than LISTING_QUIET seconds
        ago (changes by ``sid`` itself cost no revocation: its mount updates its copy)."""
        if self.busy(ino, sid):
            self.stats["denied"] += 1
            return 0
        return self.grant(sid, since, [(ino, LISTING)], absent=True)

    def busy(self, ino: int, sid: int) -> bool:
        """Another client than ``sid`` made or removed a name in ``ino`` less than
        LISTING_QUIET seconds ago: its listing would not be leased to ``sid``."""
        changed = self._changed.get(ino)
        if not changed:
            return False
        recent = time.monotonic() - LISTING_QUIET
        return any(t > recent for s, t in list(changed.items()) if s != sid or not sid)

    def _purge(self, now: float) -> None:
        q = self._expiries
        while q and q[0][0] < now:
            exp, names, inodes, sid = q.popleft()
            for table, keys in ((self._names, names), (self._inodes, inodes)):
                for key in keys:
                    holders = table.get(key)
                    if holders is not None and holders.get(sid) == exp:
                        del holders[sid]
                        if not holders:
                            del table[key]
        for sid in [s for s, t in self._gone_until.items() if t < now]:
            del self._gone_until[sid]
        if len(self._changed) > PURGE_EVERY:
            quiet = now - LISTING_QUIET
            self._changed = {d: by for d, by in self._changed.items()
                             if any(t > quiet for t in by.values())}

    # ------------------------------------------------------------------ mutations
    def revoke(self, names: Iterable[NameKey], inodes: Iterable[int], exclude: int = 0,
               created: Iterable[NameKey] = ()) -> None:
        """After a mutation is durable: make every other holder of a lease on what it
        changed drop it; returns when all have (acked) or their leases ran out.
        ``names``: removed or moved; ``created``: made (leased only as absent)."""
        wait = self.revoke_begin(names, inodes, exclude, created)
        if wait is not None:
            wait()

    def revoke_begin(self, names: Iterable[NameKey], inodes: Iterable[int], exclude: int = 0,
                     created: Iterable[NameKey] = ()):
        """The part of revoke that never blocks: the keys are marked and the holders
        sent their invalidations.  Returns None when nothing is left to wait for (no
        other holder, no restart grace), else the function that waits (blocking)."""
        names, inodes, created = list(names), list(inodes), list(created)
        if not names and not inodes and not created:
            return None
        now = time.monotonic()
        holders: dict[int, list] = {}  # sid -> [names, inodes, latest expiry]
        # the listings of the directories whose names these are
        listings = list({(k[0], LISTING) for k in names} | {(k[0], LISTING) for k in created})
        with self._lock:
            self._seq += 1
            seq = self._seq
            changed = self._changed
            for d, _ in listings:
                by = changed.get(d)
                if by is None:
                    changed[d] = {exclude: now}
                else:
                    by[exclude] = now
                    if len(by) > 64:  # many clients change it: forget the old changes
                        changed[d] = {c: t for c, t in by.items() if t > now - LISTING_QUIET}
            if len(changed) > 4 * PURGE_EVERY and seq % PURGE_EVERY == 0:
                self._purge(now)
            names += listings
            for k in names:
                self._buckets[hash(k) % BUCKETS] = seq
            for i in inodes:
                self._buckets[hash(i) % BUCKETS] = seq
            for k in created:
                self._made_buckets[hash(k) % BUCKETS] = seq
            for table, keys, slot in ((self._names, names + created, 0),
                                      (self._inodes, inodes, 1)):
                for k in keys:
                    for sid, exp in (table.pop(k, None) or {}).items():
                        if sid == exclude and exp > now and (slot == 1 or k[1] == LISTING):
                            # the mutating mount keeps its own copy current: the listing
                            # it updates, the attributes its reply gave it (a version it
                            # published: fuse_client/kernel_cache.py forget_published);
                            # still its lease, revoked by others' changes
                            table.setdefault(k, {})[sid] = exp
                            continue
                        if sid == exclude or exp <= now:
                            continue
                        h = holders.setdefault(sid, [[], [], 0.0])
                        h[slot].append(k)
                        h[2] = max(h[2], exp)
            sessions = {sid: self._sessions.get(sid) for sid in holders}
            grace = self.grace_until
        self.stats["revocations"] += 1
        waits = []
        for sid, (nm, ino, exp) in holders.items():
            s = sessions[sid]
            if s is not None and s.alive:
                waits.append((s, s.send(nm, ino), exp + MARGIN))
                self.stats["invalidations"] += 1
            else:
                waits.append((None, 0, exp + MARGIN))
        if not waits and not (grace and time.monotonic() < grace):
            return None
        return lambda: self._revoke_wait(waits, grace)

    def _revoke_wait(self, waits: list, grace: float) -> None:
        for s, inv, deadline in waits:
            if s is not None and s.wait_ack(inv, deadline):
                continue
            # dead or silent: its kernel forgets the entry when the lease runs out
            self.stats["waited_out"] += 1
            left = deadline - time.monotonic()
            if left > 0:
                log.warning("session %x did not drop a lease; waiting %.1fs for it to run out",
                            s.id if s is not None else 0, left)
                time.sleep(left)
        if grace and time.monotonic() < grace:
            self._wait_grace()

    def _wait_grace(self) -> None:
        with self._grace_cv:
            while self.grace_until:
                left = self.grace_until - time.monotonic()
                if left <= 0:
                    self.grace_until = 0.0
                    break
                self._grace_cv.wait(left)

    # ------------------------------------------------------------------ restart state
    def _load_state(self) -> None:
        if self.state is None:
            return
        try:
            state = self.state.load()
            if state is None:
                return
            until = float(state["until"])
            sessions = {int(s) for s in state["sessions"]}
        except (OSError, ValueError, TypeError, KeyError) as e:
            # unknown holders: wait for the longest lease any run may have granted
            log.warning("cannot read %s (%s): revocations wait %.0fs for leases of the "
                        "previous run", self.state, e, 1.25 * self.lease_time + MARGIN)
            until, sessions = time.time() + 1.25 * self.lease_time + MARGIN, {-1}
        left = until - time.time()
        if left > 0 and sessions:  # no session ever opened: nobody holds a lease
            self.grace_until = time.monotonic() + left
            self._grace_sessions = sessions
            log.info("leases of the previous run may last %.1fs more (%d sessions): "
                     "revocations wait for them or for those mounts to come back",
                     left, len(sessions))

    def _save_state(self, force: bool = False) -> None:
        """Durably record that leases may exist until ``_horizon`` (extended ahead of
        time, so this runs about once per lease time)."""
        if self.state is None or self.lease_time <= 0:
            return
        with self._state_lock:
            now = time.time()
            if not force and now + self.lease_time + MARGIN <= self._horizon:
                return
            horizon = max(self._horizon, now + 1.25 * self.lease_time + MARGIN)
            with self._lock:
                sessions = sorted(set(self._sessions) | set(self._gone_until)
                                  | self._grace_sessions)
            self.state.save({"until": horizon, "sessions": [str(s) for s in sessions]})
            self._horizon = horizon


class FileLeaseState:
    """The lease state of a single master: a JSON file in its meta dir, replaced
    atomically and fsynced.  (A master group keeps it in etcd instead, where the next
    leader finds it: master/group/etcd_state.py.)"""

    def __init__(self, path: str):
        self.path = path

    def __str__(self) -> str:
        return self.path

    def load(self) -> dict | None:
        try:
            with open(self.path, encoding="ascii") as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def save(self, state: dict) -> None:
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dfd = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
