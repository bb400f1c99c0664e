"""Two or three real ``curvine-master`` processes on one real etcd (the master group's core).

Each test starts etcd (tests/etcd_util.py) and the masters as processes with their own
meta dirs, at the default group timers (master.ha_lease_ttl 3 s), and talks to them
with plain gRPC stubs, so that what a client library does with NOT_LEADER (follow the
leader) is not part of what is checked here:

- a standby applies what the leader journals, and its LMDB ends up the same;
- the leader SIGKILLed: a standby takes over, and every acknowledged create is there;
- the leader SIGSTOPped past its lease: another is elected; SIGCONTed, the calls it had
  taken fail NOT_LEADER, it steps down, and nothing it acknowledged after the takeover
  is lost or seen as a second truth;
- a name created on the leader is found at once by a lookup on a standby (read index).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import grpc
import lmdb
import pytest

from curvine.client.master.call_port_blocking import BlockingCallPort
from curvine.common import auth
from curvine.common.errors import LEADER_KEY, CurvineError, ErrorKind, from_rpc_error
from curvine.common.master_group import GroupRpc
from curvine.common.security import NO_SECURITY
from curvine.devtools.local import free_ports
from curvine.master.group.etcd import Etcd, prefix_end
from curvine.proto import master_pb2, master_pb2_grpc

from cluster_util import metric_samples, wait_for
from etcd_util import etcd  # noqa: F401 - the fixture

ROOT_INO = 1
START_TIMEOUT = 20.0
TAKEOVER_TIMEOUT = 15.0  # lease TTL 3 s + campaign round + replay, with room on a busy box


class MasterProc:
    """One curvine-master of the group, its config written under ``base`` (with
    ``master_extra``: more [master] lines, e.g. how it reaches etcd; ``extra``: more
    sections, e.g. [security]).  ``token``: the client token its channel sends."""

    def __init__(self, base: str, index: int, etcd_endpoints: list[str],
                 advertise_host: str = "", member_id: str = "", master_extra: str = "",
                 extra: str = "", token: str = ""):
        self.base = os.path.join(base, f"m{index}")
        os.makedirs(self.base, exist_ok=True)
        self.id = member_id or f"m{index}"
        self.port, worker_port, self.http_port, self.call_port = free_ports(4)
        self.addr = f"127.0.0.1:{self.port}"
        # the address it names itself by in the group (master.advertise_addr)
        self.advertised = f"{advertise_host}:{self.port}" if advertise_host else self.addr
        advertise = f'advertise_addr = "{self.advertised}"\n' if advertise_host else ""
        self.meta_dir = os.path.join(self.base, "meta")
        self.conf = os.path.join(self.base, "curvine.toml")
        endpoints = ", ".join(f'"{e}"' for e in etcd_endpoints)
        with open(self.conf, "w") as f:
            f.write(f'[cluster]\nname = "group-test"\nmaster_addr = "{self.addr}"\n'
                    f'[master]\nhost = "127.0.0.1"\nport = {self.port}\n'
                    f'worker_port = {worker_port}\nhttp_port = {self.http_port}\n'
                    f'call_port = {self.call_port}\nmeta_dir = "{self.meta_dir}"\n'
                    f'etcd_endpoints = [{endpoints}]\nmember_id = "{self.id}"\n{advertise}'
                    f'{master_extra}'
                    f'[journal]\ndir = "{os.path.join(self.base, "journal")}"\n{extra}')
        self.worker_addr = f"127.0.0.1:{worker_port}"
        self.log_path = os.path.join(self.base, "master.log")
        self.proc: subprocess.Popen | None = None
        self.token = token
        self.connect()

    def connect(self) -> None:
        """A channel to its client port (again, after ``stop``)."""
        self.channel = auth.with_token(grpc.insecure_channel(self.addr), self.token)
        self.stub = master_pb2_grpc.MasterStub(self.channel)

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "curvine.master.server",
                                      "--conf", self.conf], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL)
        log.close()
        wait_for(self._answers, START_TIMEOUT, what=f"{self.id} serving")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.id} exited {self.proc.returncode}: "
                                 f"{open(self.log_path).read()[-3000:]}")
        try:
            self.group()
            return True
        except grpc.RpcError:
            return False

    def group(self) -> master_pb2.GetGroupReply:
        return self.stub.GetGroup(master_pb2.GetGroupRequest(), timeout=5)

    def role(self) -> str:
        reply = self.group()
        return next((m.role for m in reply.members if m.id == self.id), "")

    def applied(self) -> int:
        reply = self.group()
        return next((m.applied_seq for m in reply.members if m.id == self.id), 0)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.channel.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def group(tmp_path, etcd):  # noqa: F811
    made: list[MasterProc] = []

    def start(n: int, **kw) -> list[MasterProc]:
        for i in range(n):
            m = MasterProc(str(tmp_path), len(made), etcd.endpoints, **kw)
            made.append(m)
            m.start()
            if i == 0:  # the first one leads: the others start as its standbys
                wait_for(lambda: m.role() == "leader", TAKEOVER_TIMEOUT, what="a leader")
        return made

    yield start
    for m in made:
        m.stop()


def create(m: MasterProc, name: bytes, request_id: bytes = b"") -> int:
    reply = m.stub.Create(master_pb2.CreateRequest(
        parent=ROOT_INO, name=name, mode=0o644, request_id=request_id or os.urandom(16)),
        timeout=10)
    return reply.inode.ino


def lookup(m: MasterProc, name: bytes) -> int:
    reply = m.stub.Lookup(master_pb2.LookupRequest(parent=ROOT_INO, name=name, miss_ok=True),
                          timeout=10)
    return reply.inode.ino if reply.HasField("inode") else 0


def leader_of(members: list[MasterProc], skip=()) -> MasterProc:
    for m in members:
        if m not in skip and m.proc.poll() is None and m.role() == "leader":
            return m
    raise AssertionError("no leader")


def _lmdb_dump(path: str) -> dict:
    """Every named database's records (the main database holds only where they are
    on disk, which differs between two copies)."""
    env = lmdb.open(path, readonly=True, lock=False, max_dbs=64, subdir=True)
    out = {}
    try:
        with env.begin() as txn:
            names = [k for k, _ in txn.cursor()]
        for name in names:
            try:
                db = env.open_db(name, create=False)
            except lmdb.Error:
                continue  # a plain key of the main database, not a named one
            with env.begin(db=db) as txn:
                out[name] = dict(txn.cursor())
    finally:
        env.close()
    return out


def test_standby_applies_what_the_leader_journals(group):
    leader, standby = group(2)
    assert standby.role() == "standby"
    for i in range(200):
        create(leader, b"f%03d" % i)
    seq = leader.applied()
    wait_for(lambda: standby.applied() >= seq, 10, what="the standby applied the journal")
    reply = standby.group()
    assert {m.id: m.role for m in reply.members} == {"m0": "leader", "m1": "standby"}
    assert reply.leader == leader.addr and reply.commit_seq == seq
    # each reports its role in its metrics, and a standby is healthy
    for m, role in ((leader, 1), (standby, 0)):
        assert [s.value for s in metric_samples(m.http_port, "curvine_master_role")] == [role]
        with urllib.request.urlopen(f"http://127.0.0.1:{m.http_port}/healthz", timeout=10) as r:
            assert r.status == 200
    assert metric_samples(standby.http_port, "curvine_master_applied_seq")[0].value == seq
    assert metric_samples(leader.http_port, "curvine_master_failovers_total")[0].value == 1
    # the admin report is answered by any member, each with its own view
    assert standby.stub.Report(master_pb2.ReportRequest(), timeout=10).inodes >= 201
    # a mutation on the standby: NOT_LEADER, naming the leader (message and trailer)
    with pytest.raises(grpc.RpcError) as err:
        create(standby, b"refused")
    error = from_rpc_error(err.value)
    assert error.kind == ErrorKind.NOT_LEADER and error.message == leader.addr
    assert (LEADER_KEY, leader.addr) in tuple(err.value.trailing_metadata())
    leader.stop()
    standby.stop()
    a, b = (_lmdb_dump(os.path.join(m.meta_dir, "lmdb")) for m in (leader, standby))
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], f"LMDB database {name!r} differs"


def test_a_standby_names_the_leader_by_the_address_clients_know(group):
    """Members that bind 127.0.0.1 but are known to clients as localhost:<port>
    (master.advertise_addr; on Kubernetes a pod IP and the pod's DNS name): a standby's
    NOT_LEADER names the leader's known address, so a client sent to a standby moves
    straight to the leader instead of trying each member in turn."""
    leader, first, second = group(3, advertise_host="localhost")
    reply = first.group()
    assert reply.leader == leader.advertised
    assert {m.id: m.grpc for m in reply.members} == {m.id: m.advertised
                                                     for m in (leader, first, second)}
    with pytest.raises(grpc.RpcError) as err:
        create(first, b"refused")
    assert from_rpc_error(err.value).message == leader.advertised
    # a client of the group as configured (cluster.master_addrs: the names), sent to
    # a standby first, the leader last
    names = [first.advertised, second.advertised, leader.advertised]
    rpc = GroupRpc(names, master_pb2_grpc.MasterStub, security=NO_SECURITY, timeout=10,
                   wait=20)
    try:
        rpc.call("Create", master_pb2.CreateRequest(parent=ROOT_INO, name=b"moved",
                                                    mode=0o644, request_id=os.urandom(16)),
                 idempotent=False)
        assert rpc.address == leader.advertised
        assert rpc.masters.moves == 1  # straight there: the second standby never asked
    finally:
        rpc.close()
    assert lookup(leader, b"moved")


# the duplicate names the id it cannot have; the killed standby's restart waits out
# its previous run's lease, an INFO line
@pytest.mark.expect_log(r"CRITICAL curvine\.master: cannot start: master\.member_id 'm1' "
                        r"is in use by the member at 127\.0\.0\.1:\d+")
def test_a_second_master_with_a_live_members_id_refuses_to_start(group, tmp_path, etcd):  # noqa: F811
    leader, standby = group(2)
    dup = MasterProc(str(tmp_path), 2, etcd.endpoints, member_id=standby.id)
    log = open(dup.log_path, "ab")
    started = time.monotonic()
    dup.proc = subprocess.Popen([sys.executable, "-m", "curvine.master.server", "--conf",
                                 dup.conf], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    log.close()
    try:
        assert dup.proc.wait(timeout=30) == 2
    finally:
        dup.stop()
    print(f"the duplicate refused after {time.monotonic() - started:.1f}s")
    assert "give every master its own master.member_id" in open(dup.log_path).read()
    # the member that holds the id is untouched: the group as it was
    reply = leader.group()
    assert {m.id: m.grpc for m in reply.members} == {"m0": leader.addr, "m1": standby.addr}
    create(leader, b"after")
    assert lookup(standby, b"after")
    # a member's own restart is no duplicate: SIGKILLed (its lease still holds the id
    # for up to a TTL), started again at once, it waits that out and serves
    standby.kill()
    standby.channel = grpc.insecure_channel(standby.addr)
    standby.stub = master_pb2_grpc.MasterStub(standby.channel)
    standby.start()
    wait_for(lambda: standby.role() == "standby", TAKEOVER_TIMEOUT, what="the restarted standby")
    assert lookup(standby, b"after")


def test_leader_killed_a_standby_takes_over_with_every_acknowledged_create(group):
    first, second = group(2)
    acked = [b"k%03d" % i for i in range(100)]
    for name in acked:
        create(first, name)
    killed_at = time.monotonic()
    first.kill()
    wait_for(lambda: second.role() == "leader", TAKEOVER_TIMEOUT, what="the standby leads")
    create(second, b"after")
    print(f"takeover and first acknowledged create: {time.monotonic() - killed_at:.2f}s")
    for name in acked + [b"after"]:
        assert lookup(second, name), name


# the stopped leader finds it lost, and that it was stalled itself
@pytest.mark.expect_log(r"WARNING curvine\.master\.group\.leadership: lost leadership",
                        r"WARNING curvine\.master\.cluster\.lag: the master stalled for")
def test_a_stopped_leader_is_fenced_and_steps_down(group):
    old, new, third = group(3)
    create(old, b"before")
    results: dict[bytes, object] = {}

    def call(name: bytes) -> None:
        try:
            results[name] = create(old, name)
        except grpc.RpcError as e:
            results[name] = from_rpc_error(e)

    old.proc.send_signal(signal.SIGSTOP)
    try:
        # calls sent to the stopped leader wait in its sockets
        callers = [threading.Thread(target=call, args=(b"inflight%d" % i,)) for i in range(8)]
        for t in callers:
            t.start()
        others = [new, third]
        wait_for(lambda: any(m.role() == "leader" for m in others), TAKEOVER_TIMEOUT,
                 what="another member leads")
        leader = leader_of(others)
        create(leader, b"during")
    finally:
        old.proc.send_signal(signal.SIGCONT)
    for t in callers:
        t.join(timeout=20)
    wait_for(lambda: old.role() == "standby", TAKEOVER_TIMEOUT, what="the old leader steps down")
    for name, result in results.items():
        if isinstance(result, CurvineError):
            assert result.kind == ErrorKind.NOT_LEADER, result
        else:  # acknowledged (by whoever answered): must be the one truth
            assert lookup(leader, name) == result, name
    assert any(isinstance(r, CurvineError) for r in results.values()), results
    assert lookup(leader, b"before") and lookup(leader, b"during")
    # the old one, a standby now, follows the new leader's journal
    create(leader, b"later")
    # (just after its step-down it may still answer NOT_LEADER while its standby
    # Master is built: a client then reads from another member)
    assert wait_for(lambda: _read_on(old, b"later"), TAKEOVER_TIMEOUT,
                    what="the old leader, a standby now, to find a name made after")


def _read_on(m: MasterProc, name: bytes) -> int:
    try:
        return lookup(m, name)
    except grpc.RpcError as e:
        if from_rpc_error(e).kind != ErrorKind.NOT_LEADER:
            raise
        return 0


def test_a_read_on_a_standby_finds_what_the_leader_just_created(group):
    leader, standby = group(2)
    port = BlockingCallPort("127.0.0.1", standby.call_port, "", timeout=10)
    try:
        for i in range(300):
            name = b"r%03d" % i
            ino = create(leader, name)
            if i % 2:  # the mounts' way: the call port
                reply = port.call("lookup", master_pb2.LookupRequest(parent=ROOT_INO, name=name))
                assert reply.inode.ino == ino, name
            else:
                assert lookup(standby, name) == ino, name
        # a mutation on the standby's call port: NOT_LEADER naming the leader, at once
        with pytest.raises(CurvineError) as err:
            port.call("create", master_pb2.CreateRequest(parent=ROOT_INO, name=b"x",
                                                         mode=0o644, request_id=b"r1"))
        assert err.value.kind == ErrorKind.NOT_LEADER and err.value.message == leader.addr
    finally:
        port.close()


# the planned switchover is a lost leadership like any other, for the logs
@pytest.mark.expect_log(r"WARNING curvine\.master\.group\.leadership: lost leadership: "
                        r"resigned")
def test_step_down_hands_over_to_a_standby(group):
    first, second = group(2)
    create(first, b"before")
    with pytest.raises(grpc.RpcError) as err:  # only the leader can step down
        second.stub.StepDown(master_pb2.StepDownRequest(), timeout=5)
    assert from_rpc_error(err.value).kind == ErrorKind.NOT_LEADER
    first.stub.StepDown(master_pb2.StepDownRequest(), timeout=5)
    wait_for(lambda: second.role() == "leader", TAKEOVER_TIMEOUT, what="the standby leads")
    wait_for(lambda: first.role() == "standby", TAKEOVER_TIMEOUT, what="the old one follows")
    create(second, b"after")
    assert lookup(first, b"before") and lookup(first, b"after")


def test_a_checkpoint_retires_what_every_member_applied(group, etcd):  # noqa: F811
    leader, standby = group(2)
    for i in range(50):
        create(leader, b"c%02d" % i)
    seq = leader.group().commit_seq
    wait_for(lambda: standby.applied() >= seq, 10, what="the standby applied the journal")
    time.sleep(1.0)  # the standby publishes its applied seq every campaign round
    reply = leader.stub.Checkpoint(master_pb2.CheckpointRequest(), timeout=30)
    assert reply.seq >= seq and reply.retired_segments > 0
    client = Etcd(etcd.endpoints)
    try:
        prefix = b"/curvine/group-test/journal/"
        oldest = client.range(prefix, prefix_end(prefix), limit=1).kvs[0].key
        assert int(oldest[len(prefix):]) > 1
    finally:
        client.close()
    create(leader, b"after")  # the standby follows on from the retired prefix
    assert lookup(standby, b"after") and lookup(standby, b"c00")


# what a member restarted behind the compacted journal logs as it restores the leader's
# checkpoint
TAKES_THE_CHECKPOINT = (
    r"WARNING curvine\.master\.member: took the checkpoint at seq",
    r"WARNING curvine\.master\.meta\.metadata: metadata at seq \d+ is older than the journal",
    r"WARNING curvine\.master\.meta\.metadata: previous metadata moved",
    r"WARNING curvine\.master\.meta\.metadata: restoring checkpoint")


def restart_behind_the_journal(leader: MasterProc, standby: MasterProc) -> None:
    """``standby`` stopped while ``leader`` makes 100 names and its checkpoint retires
    every journal key, then started again: behind the compacted journal, it takes the
    leader's checkpoint before it serves; every name, and one made after, is found
    through it."""
    create(leader, b"early")
    wait_for(lambda: lookup(standby, b"early"), 10, what="the standby has the first name")
    standby.stop()
    for i in range(100):
        create(leader, b"g%03d" % i)
    # with the standby gone, the leader's checkpoint retires every journal key before it
    assert leader.stub.Checkpoint(master_pb2.CheckpointRequest(), timeout=30).retired_segments
    standby.connect()
    standby.start()
    create(leader, b"late")
    for name in (b"early", b"g000", b"g099", b"late"):
        assert lookup(standby, name), name
    assert standby.role() == "standby"


@pytest.mark.expect_log(*TAKES_THE_CHECKPOINT)
def test_a_member_gone_past_the_compacted_journal_takes_the_leaders_checkpoint(group):
    restart_behind_the_journal(*group(2))


# a standby stopped past its lease leaves the members; the leader compacts without it
@pytest.mark.expect_log(r"WARNING curvine\.master\.member: standby behind the journal",
                        r"WARNING curvine\.master\.member: took the checkpoint at seq",
                        r"WARNING curvine\.master\.meta\.metadata: metadata at seq \d+ is "
                        r"older than the journal",
                        r"WARNING curvine\.master\.meta\.metadata: previous metadata moved",
                        r"WARNING curvine\.master\.meta\.metadata: restoring checkpoint",
                        r"WARNING curvine\.master\.cluster\.lag: the master stalled for")
def test_a_standby_stalled_past_the_compacted_journal_catches_up_while_running(group):
    leader, standby = group(2)
    standby.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: [m.id for m in leader.group().members] == [leader.id], 10,
                 what="the stopped standby's lease runs out")
        for i in range(100):
            create(leader, b"s%03d" % i)
        assert leader.stub.Checkpoint(master_pb2.CheckpointRequest(), timeout=30).retired_segments
    finally:
        standby.proc.send_signal(signal.SIGCONT)
    create(leader, b"late")
    wait_for(lambda: standby.applied() >= leader.group().commit_seq, 15,
             what="the standby catches up from the leader's checkpoint")
    for name in (b"s000", b"s099", b"late"):
        assert lookup(standby, name), name


# etcd gone past the lease: the leader stops answering as leader by its own timer, or
# first by its journal write that the closing fence stopped (whichever sees it first
# names the reason)
@pytest.mark.expect_log(r"WARNING curvine\.master\.group\.leadership: lost leadership: "
                        r"(no answer from etcd|a journal write failed)")
def test_etcd_down_the_leader_stops_acknowledging_and_the_group_comes_back(group, etcd):  # noqa: F811
    leader, standby = group(2)
    acked = []
    for i in range(20):
        create(leader, b"e%02d" % i)
        acked.append(b"e%02d" % i)
    etcd.kill(0)
    lost_at = time.monotonic() + 3.0 + 1.0  # ha_lease_ttl, and a round of its thread

    def refused() -> bool:
        try:
            create(leader, b"during%f" % time.monotonic())
        except grpc.RpcError as e:
            return from_rpc_error(e).kind in (ErrorKind.NOT_LEADER, ErrorKind.UNAVAILABLE,
                                              ErrorKind.TIMEOUT)
        return False
    wait_for(refused, 20, what="the leader refuses once its lease may be gone")
    assert time.monotonic() < lost_at + 10
    with pytest.raises(grpc.RpcError):  # and reads, on either: nothing stale
        lookup(standby, b"e00")
    etcd.restart(0)

    def led() -> bool:
        try:
            return any(m.role() == "leader" for m in (leader, standby))
        except grpc.RpcError:  # GetGroup reads etcd, which they reach again soon
            return False
    wait_for(led, 30, what="a leader again")
    now = leader_of([leader, standby])
    create(now, b"after")
    other = standby if now is leader else leader
    wait_for(lambda: other.role() == "standby", 15, what="the other one follows")
    for name in acked + [b"after"]:
        assert lookup(now, name) and lookup(other, name), name


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "curvine.cli.main", *args],
                          capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def test_journal_dump_and_verify_read_the_groups_journal_in_etcd(group, etcd):  # noqa: F811
    """A member's journal.dir holds no segments: with the member's config `curvine
    journal verify` and `dump` read the batches the leader wrote to etcd (before, they
    reported "an empty journal"); a damaged batch is named (exit 4); an offline
    checkpoint refuses, saying where the journal is and what to run instead."""
    leader, standby = group(2)
    for i in range(5):
        create(leader, b"j%d" % i)
    commit = leader.group().commit_seq
    r = _cli("journal", "verify", "--conf", standby.conf)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"journal in etcd {etcd.endpoints[0]} "
                               f"(/curvine/group-test/journal/): "), r.stdout
    assert f"records (seq 1..{commit})" in r.stdout and r.stdout.endswith(": OK\n"), r.stdout
    r = _cli("journal", "dump", "--json", "--conf", standby.conf)
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in r.stdout.splitlines()]
    assert [rec["seq"] for rec in records] == list(range(1, commit + 1))
    assert [rec["record"]["name"] for rec in records if rec["type"] == "create"] == [
        "j0", "j1", "j2", "j3", "j4"]
    r = _cli("journal", "dump", "--from", "2", "--limit", "2", "--conf", leader.conf)
    assert [int(line.split()[0]) for line in r.stdout.splitlines()] == [2, 3], r
    r = _cli("journal", "checkpoint", "--offline", "--conf", standby.conf)
    assert r.returncode != 0 and "its journal is in etcd" in r.stderr, r
    assert "curvine journal checkpoint` (online)" in r.stderr
    # a batch damaged in etcd (the masters stopped first: nothing reads it again)
    leader.stop()
    standby.stop()
    client = Etcd(etcd.endpoints)
    try:
        prefix = b"/curvine/group-test/journal/"
        last = client.range(prefix, prefix_end(prefix)).kvs[-1]
        value = bytearray(last.value)
        value[-1] ^= 0xFF  # the last payload byte of its last record
        client.put(last.key, bytes(value))
    finally:
        client.close()
    r = _cli("journal", "verify", "--conf", standby.conf)
    assert r.returncode == 4, r
    assert f"batch {last.key.decode()} at byte offset " in r.stderr and (
        "checksum mismatch" in r.stderr), r.stderr
    r = _cli("journal", "dump", "--conf", standby.conf)
    assert r.returncode == 4 and "checksum mismatch" in r.stderr, r
