"""The journal kept in etcd and the leader's fence, against a real etcd (tests/etcd_util.py).

The unit level of the master group (master/group/): a leader's batches are appended
by leader-guarded Txns and read back in order by another member; a leader whose
lease was revoked (another member may lead now) gets NOT_LEADER from its next write,
acknowledges nothing more, and the records it wrote before stay; a write after the
fence timer ran out is refused before it reaches etcd.
"""

from __future__ import annotations

import contextlib
import time

import pytest

from curvine.common.errors import CurvineError, ErrorKind
from curvine.journal import JournalError
from curvine.master.group.etcd import Etcd
from curvine.master.group.etcd_journal import EtcdJournal
from curvine.master.group.leadership import Leadership, MemberAddress

from cluster_util import wait_for
from etcd_util import etcd, etcd3  # noqa: F401 - the fixtures

PREFIX = b"/curvine/test/"


def _leader(client: Etcd, name: str, ttl: float = 3.0) -> Leadership:
    changes = []
    lead = Leadership(client, PREFIX, MemberAddress(name, f"127.0.0.1:{len(name)}"), ttl,
                      applied=lambda: 0, on_change=lambda: changes.append(1))
    return lead


def _writer(client: Etcd, lead: Leadership) -> EtcdJournal:
    return EtcdJournal(client, PREFIX, lead.leader_key, fence=lead.fence, term=lead.term,
                       on_fenced=lead.lost)


@contextlib.contextmanager
def _leading(endpoints: list[str], within: float = 5.0):
    """(client, leadership, its journal) of a member "m1" elected on ``endpoints``;
    both closed after."""
    client = Etcd(endpoints)
    lead = _leader(client, "m1")
    lead.start()
    try:
        wait_for(lead.leading, within, what="m1 leads")
        yield client, lead, _writer(client, lead)
    finally:
        lead.close()
        client.close()


def test_batches_are_appended_in_order_and_read_by_another_member(etcd):  # noqa: F811
    with _leading(etcd.endpoints) as (client, lead, journal):
        payloads = [b"r%d" % i for i in range(10)]
        for p in payloads[:3]:
            journal.append(7, p)
        assert journal.sync() == 3
        for p in payloads[3:]:
            journal.append(8, p)
        assert journal.sync() == 7
        reader = EtcdJournal(client, PREFIX, lead.leader_key)  # a standby's, read-only
        assert reader.durable_seq == 10 and reader.first_seq == 1
        assert [(r.seq, r.payload) for r in reader.records(0)] == list(
            zip(range(1, 11), payloads))
        assert [r.seq for r in reader.records(5)] == [6, 7, 8, 9, 10]  # mid-batch start
        with pytest.raises(JournalError, match="read-only"):
            reader.append(7, b"x")
        # compaction keeps the batch holding the next record
        assert journal.retire(5) == 1
        assert reader.records(3) is not None
        with pytest.raises(JournalError, match="compacted"):
            reader.records(2)


def test_many_batches_are_read_in_pages_from_any_seq(etcd):  # noqa: F811
    """More batch keys than one Range's page, and a batch longer than BATCH_SPAN: a
    reader starting inside the long batch, or at any later batch, gets every record
    after its seq once and in order; retire keeps the batch holding the next record."""
    from curvine.master.group.etcd_journal import BATCH_SPAN, PAGE
    with _leading(etcd.endpoints) as (client, lead, journal):
        long_batch = BATCH_SPAN + 100
        for i in range(long_batch):
            journal.append(7, b"%d" % i)
        assert journal.sync() == long_batch
        for i in range(2 * PAGE + 5):  # a key each, as under a steady load
            journal.append(7, b"one")
            journal.sync()
        last = journal.last_seq
        reader = EtcdJournal(client, PREFIX, lead.leader_key)
        for after in (0, long_batch - 1, long_batch, long_batch + PAGE + 1, last - 1, last):
            assert [r.seq for r in reader.records(after)] == list(range(after + 1, last + 1))
        assert journal.retire(long_batch - 1) == 0  # the long batch holds the next one
        assert journal.retire(long_batch + 10) == 11  # the long one and 10 single ones
        assert [r.seq for r in reader.records(long_batch + 10)] == list(
            range(long_batch + 11, last + 1))


def test_a_revoked_lease_fences_the_old_leader(etcd):  # noqa: F811
    client = Etcd(etcd.endpoints)
    old = _leader(client, "old")
    old.start()
    new = None
    try:
        wait_for(old.leading, 5, what="old leads")
        journal = _writer(client, old)
        journal.append(1, b"acked")
        journal.sync()
        # etcd drops the old leader's key (as a lease expiry would) and another
        # member is elected; the old one has not noticed yet
        client.lease_revoke(old._lease)
        new = _leader(client, "new")
        new.start()
        wait_for(new.leading, 5, what="new leads")
        journal.append(1, b"never acked")
        with pytest.raises(CurvineError) as err:
            journal.sync()
        assert err.value.kind == ErrorKind.NOT_LEADER
        assert not old.leading()
        with pytest.raises(JournalError):  # nothing more, ever
            journal.append(1, b"later")
        # the new leader writes on from what was acknowledged
        after = _writer(client, new)
        after.append(1, b"new term")
        after.sync()
        seen = [(r.seq, r.payload) for r in EtcdJournal(client, PREFIX, new.leader_key).records(0)]
        assert seen == [(1, b"acked"), (2, b"new term")]
    finally:
        old.close()
        if new is not None:
            new.close()
        client.close()


@pytest.mark.expect_log(r"WARNING curvine\.master\.group\.leadership: lost leadership")
def test_the_fence_timer_refuses_before_etcd_is_asked(etcd):  # noqa: F811
    with _leading(etcd.endpoints) as (client, lead, journal):
        lead._valid_until = time.monotonic() - 1  # as if no keepalive was answered for the TTL
        journal.append(1, b"x")
        with pytest.raises(CurvineError) as err:
            journal.sync()
        assert err.value.kind == ErrorKind.NOT_LEADER
        assert journal.stats["txns"] == 0
        assert EtcdJournal(client, PREFIX, lead.leader_key).durable_seq == 0


def test_the_journal_and_the_lease_survive_the_etcd_member_in_use(etcd3):  # noqa: F811
    with _leading(etcd3.endpoints, within=10) as (client, lead, journal):
        journal.append(1, b"one")
        journal.sync()
        etcd3.kill(0)  # the member this client talks to
        journal.append(1, b"two")
        assert journal.sync() == 1  # moved on to another member, within the fence
        time.sleep(lead.ttl + 1)  # past the fence unless keepalives went through the others
        assert lead.leading()
        seen = [r.payload for r in EtcdJournal(client, PREFIX, lead.leader_key).records(0)]
        assert seen == [b"one", b"two"]


def test_a_second_member_with_the_same_id_never_campaigns(etcd):  # noqa: F811
    """members/<id> is created only where absent and held by its member's lease: a
    second Leadership with the same id (started past the start-time check, e.g. while
    the first one's lease was renewing) does not campaign, and once the key has stayed
    another live lease's past ``claim_wait`` it reports the duplicate, naming
    master.member_id; the first one leads on.  At start the check refuses at once
    (after the wait) with the same error."""
    client = Etcd(etcd.endpoints)
    first = _leader(client, "same", ttl=1.0)
    second = Leadership(client, PREFIX, MemberAddress("same", "127.0.0.1:2"), 1.0,
                        applied=lambda: 0, on_change=lambda: None)
    first.start()
    try:
        wait_for(first.leading, 5, what="the first leads")
        first.resign()  # the leader key is free: only the id keeps the second out
        second.start()
        started = time.monotonic()
        wait_for(lambda: second.duplicate is not None, 15, what="the duplicate is found")
        assert time.monotonic() - started >= second.claim_wait() - 1
        assert second.stats["elected"] == 0 and not second.leading()
        assert second.duplicate.kind == ErrorKind.EXISTS
        assert "master.member_id 'same' is in use by the member at 127.0.0.1:4" in (
            second.duplicate.message)
        wait_for(first.leading, 5, what="the first leads again after its resignation")
        with pytest.raises(CurvineError) as err:
            second.wait_id_free()
        assert err.value.kind == ErrorKind.EXISTS and "master.member_id 'same'" in str(err.value)
    finally:
        second.close()
        first.close()
    # the first one closed (its lease revoked): the id is free at once
    third = Leadership(client, PREFIX, MemberAddress("same", "127.0.0.1:3"), 1.0,
                       applied=lambda: 0, on_change=lambda: None)
    try:
        started = time.monotonic()
        third.wait_id_free()
        assert time.monotonic() - started < 1.0
    finally:
        client.close()
