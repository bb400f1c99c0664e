"""Leader election of the master group on etcd, and the leader's fence.

Keys (``prefix`` = ``/curvine/<cluster.name>/``):

- ``leader``: JSON ``{"id", "grpc", "call_port", "http", "worker"}`` of the leader, put with its
  etcd lease by the campaign Txn ``create_revision(leader) == 0 -> put``.  The
  revision of that Txn names this term: the journal's Txns compare the leader key's
  create revision with it (etcd_journal.py), so no write of an earlier term can
  land once the key was deleted (lease expired, revoked) and created again.
- ``members/<id>``: JSON ``{"id", "grpc", "applied", "role"}`` of every live member,
  held by its own lease (GetGroup, and the journal's compaction: the lowest applied
  seq of the members).  It is also the claim on ``master.member_id``: created only
  where absent (``create_revision == 0``) with a new lease, rewritten each round only
  while our lease holds it.  Held by another lease for longer than a dead holder's
  lease can outlive it (``claim_wait``), it is another live member's: at start the
  master refuses to start (``wait_id_free``), later the member does not campaign and
  says so (``duplicate``; the process exits, master/server.py).

One thread per member (``leadership``) keeps the lease alive every ``ttl / 3`` and,
while it does not lead, tries the campaign Txn every ``ttl / 6``.

The fence.  etcd expires the lease ``ttl`` after the last keepalive it *received*; the
leader counts its own ``ttl`` from the moment it *sent* the last keepalive that was
answered (``valid_until``), which is earlier.  Past it the leader acknowledges
nothing (``fence()`` raises NOT_LEADER), even if it has not heard yet that it lost:
a leader stopped (SIGSTOP) or cut off from etcd cannot answer as leader after another
member may have been elected.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

from curvine.common.errors import CurvineError, ErrorKind


from .etcd import Etcd, created_at, get_op, leased_by, put_op, prefix_end

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemberAddress:
    """What a member publishes about itself (the leader record's fields)."""

    id: str
    grpc: str
    call_port: int = 0
    http: int = 0
    worker: str = ""  # host:port of its worker port (another member's FetchCheckpoint)

    def record(self) -> dict:
        return {"id": self.id, "grpc": self.grpc, "call_port": self.call_port,
                "http": self.http, "worker": self.worker}


def id_in_use(member_id: str, key: bytes, holder: bytes) -> CurvineError:
    """Another live member holds ``member_id`` (its record ``holder``)."""
    try:
        record = json.loads(holder)
        where = f"the member at {record.get('grpc', '?')}"
    except (ValueError, AttributeError):
        where = "another member"
    return CurvineError(ErrorKind.EXISTS, (
        f"master.member_id {member_id!r} is in use by {where}, a live member of the "
        f"group (etcd key {key.decode(errors='replace')} held by its lease): give every "
        f"master its own master.member_id"))


def not_leader(leader_grpc: str) -> CurvineError:
    """The contract's answer of a member that cannot serve a call: the leader's gRPC
    address ("" when unknown) as the message."""
    return CurvineError(ErrorKind.NOT_LEADER, leader_grpc)


class Leadership:
    """Campaigns for ``prefix + 'leader'`` and keeps this member's lease.

    ``on_change()`` is called (in the leadership thread; it must not block) whenever
    ``leading`` changes; ``applied()`` is the member's applied seq, published under
    ``members/<id>``."""

    def __init__(self, etcd: Etcd, prefix: bytes, me: MemberAddress, ttl: float,
                 applied: Callable[[], int], on_change: Callable[[], None]):
        self.etcd = etcd
        self.prefix = prefix
        self.leader_key = prefix + b"leader"
        self.members_prefix = prefix + b"members/"
        self.member_key = self.members_prefix + me.id.encode()
        self.me = me
        self.ttl = max(1, math.ceil(ttl))  # etcd leases are whole seconds
        self.applied = applied
        self.on_change = on_change
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._lease = 0
        self._valid_until = 0.0  # monotonic; the fence (module docstring)
        self._term = 0  # create revision of our leader key while we lead
        self._drop_lease = False  # revoke the lease in the thread (lost())
        self._no_campaign_until = 0.0  # monotonic; after resign()
        self._failing = False  # etcd calls failing (logged once per outage)
        self._claimed = False  # members/<id> is held by our lease (module docstring)
        self._refused_since = 0.0  # monotonic: since when another lease holds it
        # another live member has our id: we never campaign; the process stops
        self.duplicate: CurvineError | None = None
        self.leader: dict = {}  # the leader record last seen (ours while we lead)
        self.role = "standby"  # published in members/<id>
        self.stats = {"renewals": 0, "renew_failures": 0, "elected": 0, "lost": 0}
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ state
    @property
    def term(self) -> int:
        """The create revision of our leader key while we lead, else 0."""
        with self._lock:
            return self._term

    def fence(self) -> int:
        """The term, if this member leads and its lease is surely still valid; else
        NOT_LEADER naming the leader it knows."""
        with self._lock:
            if self._term and time.monotonic() < self._valid_until:
                return self._term
        raise not_leader(self.leader_grpc())

    def leading(self) -> bool:
        try:
            self.fence()
        except CurvineError:
            return False
        return True

    def leader_record(self) -> dict:
        """The leader record as last seen ({} when unknown)."""
        with self._lock:
            return dict(self.leader)

    def leader_grpc(self) -> str:
        """The leader's gRPC address as last seen ("" when unknown or this member)."""
        with self._lock:
            leader = self.leader
            if self._term:
                return self.me.grpc
        return str(leader.get("grpc", ""))

    def lost(self, reason: str) -> None:
        """This member no longer leads (a fenced Txn failed, the lease is gone): log
        once, stop acknowledging, let the member step down."""
        with self._lock:
            if not self._term:
                return
            self._term = 0
            self.leader = {}
            self.stats["lost"] += 1
            # our key may still stand (our own timer ran out first): the lease that
            # holds it is given up, so that a member (maybe this one) is elected anew
            self._drop_lease = True
        log.warning("lost leadership: %s", reason)
        self.on_change()

    def claim_wait(self) -> float:
        """How long a key held by a dead member's lease can stand: its lease runs
        ``ttl`` from the last keepalive etcd received, plus etcd's own expiry rounds."""
        return 2 * self.ttl + 1.0

    def wait_id_free(self) -> None:
        """At start, before this member opens anything: return once no lease holds
        ``members/<id>``; EXISTS (naming master.member_id) if one still does after
        ``claim_wait`` (a live member with the same id, not this member's previous run,
        whose lease runs out meanwhile)."""
        deadline = time.monotonic() + self.claim_wait()
        waiting = False
        while True:
            kv = self.etcd.get(self.member_key)
            if kv is None:
                if waiting:
                    log.info("master.member_id %r is free", self.me.id)
                return
            if time.monotonic() >= deadline:
                raise id_in_use(self.me.id, self.member_key, kv.value)
            if not waiting:
                waiting = True
                log.info("master.member_id %r is held in etcd (this member's previous run, "
                         "until its lease runs out, or another member): waiting up to "
                         "%.0f s", self.me.id, self.claim_wait())
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leadership", daemon=True)
        self._thread.start()

    def close(self, resign: bool = True) -> None:
        """Stop campaigning; with ``resign`` revoke the lease, so that another member
        takes over at once instead of after the TTL."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.etcd.timeout + 1)
        if resign and self._lease:
            try:
                self.etcd.lease_revoke(self._lease, timeout=1.0)
            except CurvineError as e:
                log.info("could not revoke the etcd lease at close: %s", e)

    def resign(self) -> None:
        """Give up leadership now (planned switchover): the lease is revoked and this
        member sits out campaigns for a TTL, so that another one is elected."""
        self._no_campaign_until = time.monotonic() + self.ttl
        self.lost("resigned (planned switchover)")

    def _run(self) -> None:
        next_keepalive = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if self._drop_lease:
                    self._revoke()
                if not self._lease:
                    self._grant()
                    next_keepalive = time.monotonic() + self.ttl / 3
                elif now >= next_keepalive:
                    self._keepalive()
                    next_keepalive = now + self.ttl / 3
                if self._lease and not self._claimed and self.duplicate is None:
                    self._claim()
                # never a key without our lease (it would outlive us): only with one,
                # and with our id ours
                if (self._lease and self._claimed and not self.term
                        and time.monotonic() >= self._no_campaign_until):
                    self._campaign()
                if self._lease and self._claimed:
                    self._publish()
            except CurvineError as e:
                self.stats["renew_failures"] += 1
                if not self._failing:  # once per outage
                    log.info("leadership: etcd does not answer (%s)", e)
                self._failing = True
                next_keepalive = min(next_keepalive, time.monotonic() + self.ttl / 6)
            else:
                if self._failing:
                    log.info("leadership: etcd answers again")
                self._failing = False
            if self.term and time.monotonic() >= self._valid_until:
                self.lost(f"no answer from etcd for the lease's {self.ttl}s")
            self._stop.wait(self.ttl / 6)

    def _revoke(self) -> None:
        self._drop_lease = False
        lease, self._lease = self._lease, 0
        if lease:
            try:
                self.etcd.lease_revoke(lease)
            except CurvineError as e:  # it expires by itself: nobody keeps it alive
                log.info("could not revoke the old etcd lease: %s", e)

    def _grant(self) -> None:
        sent = time.monotonic()
        lease = self.etcd.lease_grant(self.ttl)
        with self._lock:
            self._lease = lease
            self._valid_until = sent + self.ttl
        self._claimed = False  # a new lease holds nothing yet

    def _keepalive(self) -> None:
        sent = time.monotonic()
        left = self.etcd.lease_keepalive(self._lease)
        if left <= 0:  # the lease expired in etcd: every key it held is gone
            self._lease = 0
            self.lost("the etcd lease expired")
            return
        with self._lock:
            self._valid_until = sent + self.ttl
        self.stats["renewals"] += 1

    def _campaign(self) -> None:
        record = json.dumps(self.me.record()).encode()
        reply = self.etcd.txn([created_at(self.leader_key, 0)],
                              [put_op(self.leader_key, record, self._lease)],
                              [get_op(self.leader_key)])
        if reply.succeeded:
            with self._lock:
                self._term = reply.header.revision
                self.leader = self.me.record()
                self.stats["elected"] += 1
            self.on_change()
            return
        kvs = reply.responses[0].response_range.kvs
        try:
            leader = json.loads(kvs[0].value) if kvs else {}
        except ValueError:
            leader = {}
        with self._lock:
            self.leader = leader if isinstance(leader, dict) else {}

    def _record(self) -> bytes:
        return json.dumps({"id": self.me.id, "grpc": self.me.grpc, "applied": self.applied(),
                           "role": self.role}).encode()

    def _claim(self) -> None:
        """Create ``members/<id>`` with our lease where no lease holds it."""
        reply = self.etcd.txn([created_at(self.member_key, 0)],
                              [put_op(self.member_key, self._record(), self._lease)],
                              [get_op(self.member_key)])
        kvs = () if reply.succeeded else reply.responses[0].response_range.kvs
        if reply.succeeded or (kvs and kvs[0].lease == self._lease):  # (a lost reply)
            self._claimed = True
            if self._refused_since:
                log.info("master.member_id %r is ours again", self.me.id)
            self._refused_since = 0.0
            return
        now = time.monotonic()
        if not self._refused_since:
            self._refused_since = now
            log.info("master.member_id %r is held in etcd by another lease: not "
                     "campaigning until it is ours", self.me.id)
        elif now - self._refused_since > self.claim_wait() and kvs:
            self.duplicate = id_in_use(self.me.id, self.member_key, kvs[0].value)
            log.error("%s", self.duplicate.message)
            self.on_change()

    def _publish(self) -> None:
        reply = self.etcd.txn([leased_by(self.member_key, self._lease)],
                              [put_op(self.member_key, self._record(), self._lease)])
        if not reply.succeeded:  # (our lease is gone: the next keepalive finds out)
            self._claimed = False

    def members(self) -> list[dict]:
        """Every live member's record (linearizable read)."""
        reply = self.etcd.range(self.members_prefix, prefix_end(self.members_prefix))
        out = []
        for kv in reply.kvs:
            try:
                out.append(json.loads(kv.value))
            except ValueError:
                continue
        return out
