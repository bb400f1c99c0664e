"""A member of a master group: its role, and the Master that plays it.

``master.etcd_endpoints`` set: the process is one member of a group (docs/architecture.md,
"The master group").  The member owns what outlives a role: the etcd client, its
``Leadership`` (master/group/leadership.py), and its metadata (the LMDB store and the
namespace with its retry cache), opened once and recovered from the journal in etcd
like a restarted master's.  The role is a ``Master`` built over them (``GroupRole``):

- standby: the journal read-only; one thread (``member``) applies what the leader
  appends (``Committer.follow``: the same apply as replay) and answers reads once it
  has applied everything committed when the read arrived (``read_index``,
  master/group/read_index.py);
- leader: the journal writable and fenced (master/group/etcd_journal.py); built like
  a master that has just restarted: it catches up with ``commit`` (the replay), then
  workers register again and report their blocks, mounts' sessions are unknown to it
  (their leases are waited out through the lease state in etcd), open files are
  reported again, placed blocks of a put are trusted for the same grace.

Changing role replaces the Master: the old one is closed (its committer and rounds
stop; the store stays open), the new one built over the same store.  Losing
leadership is found by the leadership thread (lease gone, fence timer) or by a
journal write (NOT_LEADER); either way the member steps down to standby without
restarting the process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time

import grpc

from curvine.common import rpc
from curvine.common.config import Config, advertise_addr
from curvine.common.errors import CurvineError, ErrorKind, from_rpc_error
from curvine.common.security import Security
from curvine.journal import JournalError
from curvine.journal.checkpoint import receive_checkpoint
from curvine.proto import master_pb2, master_pb2_grpc

from .group.etcd_access import etcd_from_config
from .group.etcd_journal import CHECKPOINT_BYTES_MAX, CHECKPOINT_EVERY_MAX, EtcdJournal
from .group.etcd_state import EtcdLeaseState, shared_block_key
from .group.leadership import Leadership, MemberAddress, not_leader
from .group.read_index import ReadIndex
from .master import GroupRole, Master, WouldBlock, private_dirs
from .meta.metadata import Metadata, NoBridge, checkpoint_root

log = logging.getLogger(__name__)

FOLLOW_INTERVAL = 0.1  # seconds between a standby's looks at etcd for new records (a read wakes it)
FETCH_TIMEOUT = 600.0  # a checkpoint from the leader (a copy of its LMDB)
READ_DRAIN = 0.2  # seconds for reads already admitted to finish before a store closes


def key_prefix(cfg: Config) -> bytes:
    return f"/curvine/{cfg.cluster.name or 'default'}/".encode()


def default_member_id(cfg: Config) -> str:
    return cfg.master.member_id or advertise_addr(cfg)


def member_address(cfg: Config) -> MemberAddress:
    """What this member publishes about itself: its id, and the addresses others reach
    it at, all under the advertised host (``master.advertise_addr``, docs/architecture.md
    "Clients of a master group"): a client follows a named leader only to an address it
    has in ``cluster.master_addrs``."""
    grpc_addr = advertise_addr(cfg)
    host = grpc_addr.rsplit(":", 1)[0]
    return MemberAddress(default_member_id(cfg), grpc_addr, cfg.master.call_port,
                         cfg.master.http_port, f"{host}:{cfg.master.worker_port}")


class Member:
    """One master of a group; ``master`` is the Master of its current role."""

    def __init__(self, cfg: Config, security: Security, me: MemberAddress):
        # etcd holds the journal until a checkpoint retires it: checkpoint often enough
        # to stay well within etcd's quota
        cfg = dataclasses.replace(cfg, journal=dataclasses.replace(
            cfg.journal,
            checkpoint_every=min(cfg.journal.checkpoint_every or CHECKPOINT_EVERY_MAX,
                                 CHECKPOINT_EVERY_MAX),
            checkpoint_bytes=min(int(cfg.journal.checkpoint_bytes) or CHECKPOINT_BYTES_MAX,
                                 CHECKPOINT_BYTES_MAX)))
        self.cfg = cfg
        self.security = security
        self.me = me
        self.prefix = key_prefix(cfg)
        self.etcd = etcd_from_config(cfg, timeout=min(2.0, float(cfg.master.ha_lease_ttl)))
        self._closed = False
        self._wake = threading.Event()
        self.failovers = 0
        self.behind: str | None = None  # why this standby cannot follow the journal
        self.call_port_server = None  # the CallPort serving (server.py), told to each Master
        self._term = 0  # the leadership term the current Master leads in (0: standby)
        self._retired: Master | None = None  # a leader closed, its standby not built yet
        self._etcd_down = False  # logged once per outage
        self.leadership = Leadership(self.etcd, self.prefix, me, float(cfg.master.ha_lease_ttl),
                                     applied=self.applied_seq, on_change=self._wake.set)
        try:
            # a second master with a live member's id would publish, campaign and
            # compact as that member: refuse before touching anything
            self.leadership.wait_id_free()
            private_dirs(os.path.abspath(cfg.master.meta_dir), os.path.abspath(cfg.journal.dir))
            shared_block_key(self.etcd, self.prefix, cfg.master.meta_dir)
            try:
                self.metadata = self._open_metadata()
            except NoBridge as e:  # gone for longer than the journal in etcd reaches back
                self._fetch_checkpoint(e.min_seq)
                self.metadata = self._open_metadata()
        except BaseException:
            self.etcd.close()
            raise
        self.master = self._build(leading=False)
        # (reads the commit through the journal of the Master of the moment)
        self.read_index = ReadIndex(lambda: self.master.journal.read_commit(),
                                    self.applied_seq, self._wake.set)
        self._thread = threading.Thread(target=self._run, name="member", daemon=True)

    def _open_metadata(self) -> Metadata:
        return Metadata.open(self.cfg, self.cfg.master.meta_dir, self.cfg.journal.dir,
                             journal=self._journal(leading=False))

    def _fetch_checkpoint(self, min_seq: int) -> None:
        """Take the leader's newest checkpoint (at ``min_seq`` or later) into this
        member's checkpoints, where the recovery at open restores it from."""
        kv = self.etcd.get(self.prefix + b"leader")
        try:
            leader = json.loads(kv.value) if kv is not None else {}
        except ValueError:
            leader = {}
        address = str(leader.get("worker", "")) if isinstance(leader, dict) else ""
        if not address or leader.get("id") == self.me.id:
            raise CurvineError(ErrorKind.UNAVAILABLE, "this member is behind the journal "
                                                      "in etcd and no other member leads to "
                                                      "take a checkpoint from")
        # the master credential (the worker one in a group without it: masters_role)
        channel = rpc.make_channel(address, self.security.as_master())
        try:
            stream = master_pb2_grpc.MasterStub(channel).FetchCheckpoint(
                master_pb2.FetchCheckpointRequest(min_seq=min_seq), timeout=FETCH_TIMEOUT)
            chunks = iter(stream)
            head = next(chunks)

            def pieces():
                yield head.file, head.data
                for chunk in chunks:
                    yield chunk.file, chunk.data
            path = receive_checkpoint(checkpoint_root(self.cfg.master.meta_dir), head.seq,
                                      pieces())
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            channel.close()
        log.warning("took the checkpoint at seq %d from the leader %s into %s: this member "
                    "was behind the oldest record of the journal kept in etcd", head.seq,
                    leader.get("id", "?"), path)

    def _catch_up(self, why: JournalError) -> None:
        """A standby behind the journal kept in etcd: take a checkpoint from the
        leader and open the metadata again from it (reads are refused meanwhile)."""
        if self.behind is None:
            log.warning("standby behind the journal in etcd: %s", why)
        self.behind = str(why)
        try:
            self._fetch_checkpoint(self.master.journal.first_seq - 1)
        except CurvineError as e:
            log.info("no checkpoint from the leader yet: %s", e)
            return
        time.sleep(READ_DRAIN)  # reads admitted before ``behind`` was set finish
        self.master.close()
        self.metadata.close()
        while True:  # (reads are refused meanwhile: ``behind``)
            try:
                self.metadata = self._open_metadata()
                self.master = self._build(leading=False)
                break
            except CurvineError as e:
                if self._closed:
                    raise
                log.info("reopening from the checkpoint: %s; trying again", e)
                time.sleep(0.5)
        self.behind = None
        self.read_index.applied_up_to(self.applied_seq())

    def _journal(self, leading: bool) -> EtcdJournal:
        lead = self.leadership
        return EtcdJournal(self.etcd, self.prefix, lead.leader_key,
                           fence=lead.fence if leading else None,
                           term=self._term if leading else 0,
                           on_fenced=lead.lost if leading else (lambda reason: None),
                           retire_floor=self._lowest_applied)

    def _build(self, leading: bool) -> Master:
        role = GroupRole(self.metadata, self._journal(leading), leading,
                         EtcdLeaseState(self.etcd, self.prefix))
        master = Master(self.cfg, security=self.security, group=role)
        master.call_port_server = self.call_port_server
        return master

    def start(self) -> None:
        self.leadership.start()
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=30)
        self.read_index.close()
        self.leadership.close(resign=True)
        if self._retired is None:  # (a retired leader is closed already)
            self.master.close()
        self.metadata.close()
        self.etcd.close()

    # ------------------------------------------------------------------ state
    def applied_seq(self) -> int:
        return self.master.committer.applied_seq

    def _lowest_applied(self) -> int:
        """The lowest applied seq of the live members (journal compaction's floor)."""
        try:
            others = [int(m.get("applied", 0)) for m in self.leadership.members()
                      if m.get("id") != self.me.id]
        except CurvineError:
            return 0
        return min(others + [self.applied_seq()])  # this member's own, as it is now

    def fatal(self) -> CurvineError | None:
        """Why this process must stop: another live member has its master.member_id."""
        return self.leadership.duplicate

    def problem(self) -> str | None:
        """Why this member cannot serve its role now (/healthz), or None: a standby
        serves reads; a leader must be able to commit."""
        master = self.master
        return master.committer.problem() if master.leading else self.behind

    def step_down(self) -> None:
        """Planned switchover (StepDown): give up the lease now; another member is
        elected within a campaign round, this one becomes its standby."""
        self.leadership.resign()
        self._wake.set()

    def role(self) -> str:
        """"leader" while this member leads and its leader Master serves (not while a
        lost leader waits to become a standby), else "standby"."""
        leading = (self.master.leading and self._retired is None and self._term != 0
                   and self.leadership.term == self._term)
        return "leader" if leading else "standby"

    def group(self) -> master_pb2.GetGroupReply:
        """The members as etcd has them (GetGroup)."""
        commit = self.master.journal.read_commit()
        reply = master_pb2.GetGroupReply(commit_seq=commit,
                                         leader=self.leadership.leader_grpc(),
                                         answered_by=self.me.id)
        members = {str(m.get("id", "")): m for m in self.leadership.members()}
        # this member as it is now (the others as they last published: every
        # campaign round)
        members[self.me.id] = {"grpc": self.me.grpc, "role": self.role(),
                               "applied": self.applied_seq()}
        for mid, m in sorted(members.items()):
            applied = int(m.get("applied", 0))
            reply.members.add(id=mid, grpc=str(m.get("grpc", "")),
                              role=str(m.get("role", "standby")), applied_seq=applied,
                              lag_records=max(0, commit - applied))
        return reply

    # ------------------------------------------------------------------ calls
    def admit(self, read: bool, wait: bool = True, indexed: bool = False) -> Master:
        """The Master to answer a call with, or NOT_LEADER (naming the leader) for a
        call this member cannot answer now: anything but a read on a standby, and
        anything on a leader whose fence closed.  A read on a standby first waits
        to have applied what the group had committed when it arrived (``wait``
        False: WouldBlock instead, for the call port's loop, which waits with
        ``read_index.wait_async`` and comes back ``indexed``)."""
        master = self.master
        if master.leading:
            self.leadership.fence()
            return master
        if not read:
            raise not_leader(self.leadership.leader_grpc())
        if self.behind is not None:
            raise CurvineError(ErrorKind.UNAVAILABLE, f"this standby cannot catch up: "
                                                      f"{self.behind}")
        if indexed:
            return master
        if not wait:
            raise WouldBlock()
        self.read_index.wait()
        return master

    # ------------------------------------------------------------------ the role thread
    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(FOLLOW_INTERVAL)
            self._wake.clear()
            if self._closed:
                return
            try:
                self._step()
                if self._etcd_down:
                    self._etcd_down = False
                    log.info("etcd answers again")
            except CurvineError as e:  # etcd unreachable: once per outage
                if not self._etcd_down:
                    self._etcd_down = True
                    log.info("master group: etcd does not answer (%s); trying again", e)
                time.sleep(FOLLOW_INTERVAL)
            except Exception:  # noqa: BLE001 - a bug: the member keeps trying
                log.exception("master group: role step failed")
                time.sleep(0.5)

    def _step(self) -> None:
        if self._retired is not None:
            self._become_standby()  # a step down that could not finish (etcd unreachable)
            return
        term = self.leadership.term
        if self.master.leading and (term != self._term
                                    or self.master.committer.fatal is not None):
            # lost, or lost and elected again since: either way this Master's state
            # may lack another leader's records
            self._step_down()
        elif term and not self.master.leading:
            self._take_over(term)
        elif not self.master.leading:
            try:
                if self.master.committer.follow():
                    self.read_index.applied_up_to(self.applied_seq())
            except JournalError as e:
                # behind the oldest record kept in etcd (compacted after every live
                # member had applied it: this one was gone, or stalled, that long)
                self._catch_up(e)

    def _take_over(self, term: int) -> None:
        started = time.monotonic()
        self._term = term
        try:
            leader = self._build(leading=True)
        except BaseException as e:
            self._term = 0
            self.leadership.lost(f"the takeover failed: {e}")
            raise
        self._swap(leader)
        self.failovers += 1
        self.leadership.role = "leader"
        log.info("became leader at seq %d after %.2f s", self.applied_seq(),
                 time.monotonic() - started)

    def _step_down(self) -> None:
        if self.leadership.term == self._term:  # the journal found another leader first
            self.leadership.lost("a journal write failed")
        self._term = 0
        self.leadership.role = "standby"
        self.master.close()  # its committer and rounds stop; in-flight calls fail
        # it answers nothing more (its fence is closed: NOT_LEADER) until replaced
        self._retired = self.master
        self._become_standby()

    def _become_standby(self) -> None:
        standby = self._build(leading=False)  # reads etcd: may fail, then tried again
        self._retired = None
        self._swap(standby)
        log.info("stepped down to standby at seq %d", self.applied_seq())

    def _swap(self, master: Master) -> None:
        old, self.master = self.master, master
        if old.leading:
            return  # closed by _step_down
        old.close()
        self.read_index.applied_up_to(self.applied_seq())


class CurrentMaster:
    """The Master of the member's role at each moment, for what holds a master across
    role changes (the process's metrics collectors and health)."""

    def __init__(self, member: Member):
        self._member = member

    def __getattr__(self, name: str):
        return getattr(self._member.master, name)

    def __setattr__(self, name: str, value) -> None:
        if name == "call_port_server":  # server.py: the port, for every role's Master
            self._member.call_port_server = value
            self._member.master.call_port_server = value
            return
        object.__setattr__(self, name, value)
