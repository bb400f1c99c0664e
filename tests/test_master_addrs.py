"""The masters' addresses: cluster.master_addrs in the config, and which master a client
calls next (common/master_group.py).  Failover itself: tests/test_master_group.py."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from curvine.common import config
from curvine.common.errors import ConfigError, CurvineError, ErrorKind
from curvine.common.master_group import MasterGroup


ETCD = '[master]\netcd_endpoints = ["e:1"]\n'


def _load(tmp_path, text: str) -> config.Config:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return config.load(str(path))


def test_one_master_is_a_group_of_one(tmp_path):
    cfg = _load(tmp_path, '[cluster]\nmaster_addr = "m:7"\n[master]\nworker_port = 9\n')
    assert config.master_addrs(cfg) == ["m:7"]
    assert config.master_worker_addrs(cfg) == ["m:9"]


def test_group_addresses_and_worker_ports(tmp_path):
    cfg = _load(tmp_path, '[cluster]\nmaster_addrs = ["a:1", "b:1", "c:1"]\n'
                          '[master]\nworker_port = 2\netcd_endpoints = ["e:1"]\n')
    assert config.master_addrs(cfg) == ["a:1", "b:1", "c:1"]
    assert config.master_worker_addrs(cfg) == ["a:2", "b:2", "c:2"]
    cfg = _load(tmp_path, '[cluster]\nmaster_addrs = ["h:1", "h:3"]\n'
                          'master_worker_addrs = ["h:2", "h:4"]\n' + ETCD)
    assert config.master_worker_addrs(cfg) == ["h:2", "h:4"]


@pytest.mark.parametrize("text, message", [
    ('master_addrs = ["a:1", "b"]', "cluster.master_addrs: expected a list of host:port, got 'b'"),
    ('master_addrs = ["a:1", "a:1"]', "cluster.master_addrs: a:1 is listed twice"),
    ('master_addrs = ["a:1", "b:70000"]', "expected a list of host:port, got 'b:70000'"),
    ('master_addrs = ["a:1", "b:1"]\nmaster_worker_addrs = ["a:2"]',
     "one worker address per master: 1 for 2 masters"),
    ('master_worker_addrs = ["a:2", "b:2"]', "one worker address per master: 2 for 1 masters"),
    ('master_addrs = ["a:1"]\nmaster_worker_addrs = ["a:2"]\nmaster_worker_addr = "a:2"',
     "set one of them"),
    ('master_addrs = ["a:1", "b:1"]\nmaster_addr = "c:1"', "c:1 is not one of master_addrs"),
])
def test_bad_group_addresses_are_named(tmp_path, text, message):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, f"[cluster]\n{text}\n" + ETCD)
    assert message in str(e.value)
    assert str(e.value).startswith(f"{tmp_path / 'c.toml'}:")


def test_master_addr_may_repeat_one_of_the_group(tmp_path):
    cfg = _load(tmp_path, '[cluster]\nmaster_addr = "b:1"\nmaster_addrs = ["a:1", "b:1"]\n'
                + ETCD)
    assert config.master_addrs(cfg) == ["a:1", "b:1"]


def _not_leader(leader: str) -> CurvineError:
    return CurvineError(ErrorKind.NOT_LEADER, leader)


def test_follows_the_named_leader_at_once():
    g = MasterGroup(["a:2", "b:2", "c:2"], ["a:1", "b:1", "c:1"])
    assert g.current == "a:2"
    assert g.after_failure(_not_leader("c:1")) is True
    assert g.current == "c:2"


def test_each_member_in_turn_then_a_pause():
    g = MasterGroup(["a", "b", "c"])
    down = CurvineError(ErrorKind.UNAVAILABLE, "connection refused")
    # an election is on: a standby knows no leader yet
    assert g.after_failure(down) is True and g.current == "b"
    assert g.after_failure(_not_leader("")) is True and g.current == "c"
    assert g.after_failure(down) is False and g.current == "a"  # all failed: pause
    assert g.after_failure(down) is True and g.current == "b"  # a new round
    g.answered()
    assert g.after_failure(_not_leader("unknown:9")) is True and g.current == "c"


def test_other_errors_and_one_master_do_not_move():
    g = MasterGroup(["a", "b"])
    assert g.after_failure(CurvineError(ErrorKind.NOT_FOUND, "x")) is False
    assert g.current == "a"
    one = MasterGroup(["a"])
    assert one.after_failure(_not_leader("")) is False and one.current == "a"


@pytest.mark.parametrize("text, message", [
    ('[cluster]\nmaster_addrs = ["a:1", "b:1"]',
     "2 masters need master.etcd_endpoints"),
    ('[master]\netcd_endpoints = ["e"]', "master.etcd_endpoints: entry 0: expected host:port"),
    ('[master]\netcd_endpoints = ["e:1"]\nha_lease_ttl = "500ms"', "between 1s and 60s"),
    ('[master]\nmember_id = "a/b"', "master.member_id: at most 128 characters, no '/'"),
    ('[master]\nadvertise_addr = "m0"', "master.advertise_addr: expected host:port, got 'm0'"),
    # how the members reach etcd: keys that cannot go together (files: at a master's start)
    ('[master]\netcd_endpoints = ["e:1"]\netcd_cert_file = "c"\netcd_key_file = "k"',
     "master.etcd_ca_file: must be set when master.etcd_cert_file is"),
    ('[master]\netcd_endpoints = ["e:1"]\netcd_ca_file = "a"\netcd_cert_file = "c"',
     "master.etcd_cert_file: is set but master.etcd_key_file is not"),
    ('[master]\netcd_endpoints = ["e:1"]\netcd_ca_file = "a"\netcd_key_file = "k"',
     "master.etcd_key_file: is set but master.etcd_cert_file is not"),
    ('[master]\netcd_endpoints = ["e:1"]\netcd_user = "curvine"',
     "master.etcd_password_file: must be set when master.etcd_user is"),
    ('[master]\netcd_endpoints = ["e:1"]\netcd_password_file = "p"',
     "master.etcd_user: must be set when master.etcd_password_file is"),
    ('[master]\netcd_endpoints = ["e:1"]\netcd_user = "a b"\netcd_password_file = "p"',
     "master.etcd_user: 'a b' is not a user name"),
])
def test_bad_group_settings_are_named(tmp_path, text, message):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, text + "\n")
    assert message in str(e.value)


# --------------------------------------------------------------------------- GroupRpc

class _Member:
    """A gRPC server that answers StatFs as a group member would: as the leader (its
    files count), as a standby naming ``leader``, or not at all (stopped)."""

    def __init__(self, files: int):
        from curvine.common import rpc
        from curvine.common.security import NO_SECURITY
        from curvine.proto import master_pb2, master_pb2_grpc

        member = self

        class Servicer(master_pb2_grpc.MasterServicer):
            @rpc.handler
            def StatFs(self, request, context):
                member.calls += 1
                if member.leader is not None:
                    raise CurvineError(ErrorKind.NOT_LEADER, member.leader)
                return master_pb2.StatFsReply(files=files)

        self.calls = 0
        self.leader: str | None = None  # None: leads
        self.server = rpc.make_server(2, security=NO_SECURITY)
        master_pb2_grpc.add_MasterServicer_to_server(Servicer(), self.server)
        self.address = f"127.0.0.1:{rpc.bind(self.server, '127.0.0.1', 0, NO_SECURITY)}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait()


@pytest.fixture
def members():
    made = [_Member(files=i) for i in range(3)]
    yield made
    for m in made:
        m.stop()


def _statfs(group, **kw):
    from curvine.proto import master_pb2
    return group.call("StatFs", master_pb2.StatFsRequest(), **kw).files


def test_group_rpc_follows_the_named_leader(members):
    from curvine.common.master_group import GroupRpc
    from curvine.common.security import NO_SECURITY
    from curvine.proto import master_pb2_grpc
    a, b, c = members
    a.leader = b.leader = c.address
    with contextlib.closing(GroupRpc([m.address for m in members], master_pb2_grpc.MasterStub,
                                     security=NO_SECURITY, timeout=5, wait=5)) as group:
        assert _statfs(group) == 2 and group.address == c.address
        assert (a.calls, b.calls, c.calls) == (1, 0, 1)  # straight to the one named
        assert _statfs(group) == 2 and c.calls == 2  # and stays there
        # the leader dies; a standby leads; the other still names the dead one
        c.stop()
        b.leader, a.leader = None, c.address
        assert _statfs(group) == 1 and group.address == b.address


def test_group_rpc_waits_out_an_election_within_its_wait(members):
    from curvine.common.master_group import GroupRpc
    from curvine.common.security import NO_SECURITY
    from curvine.proto import master_pb2_grpc
    for m in members:
        m.leader = ""  # nobody knows a leader yet
    with contextlib.closing(GroupRpc([m.address for m in members], master_pb2_grpc.MasterStub,
                                     security=NO_SECURITY, timeout=5, wait=5)) as group:
        threading.Timer(0.5, lambda: setattr(members[1], "leader", None)).start()
        t0 = time.monotonic()
        assert _statfs(group) == 1
        assert 0.4 < time.monotonic() - t0 < 3
        # nobody leads for longer than the wait: UNAVAILABLE, naming the last answer
        members[1].leader = ""
        t0 = time.monotonic()
        with pytest.raises(CurvineError) as e:
            _statfs(group, wait=1.0)
        assert e.value.kind == ErrorKind.UNAVAILABLE and "within 1s" in str(e.value)
        assert 0.9 < time.monotonic() - t0 < 3
        # no wait at all (the connector's calls): each member once, then the answer
        before = sum(m.calls for m in members)
        with pytest.raises(CurvineError):
            _statfs(group, wait=0)
        assert sum(m.calls for m in members) - before == 3


def test_a_call_on_a_closed_client_is_unavailable_not_a_crash(members):
    """A reporting thread racing its owner's close (the mount's access reports at
    unmount): grpc answers a call on a closed channel with ValueError, which no caller
    catches; the client turns it into its own UNAVAILABLE."""
    from curvine.common.rpc import RpcClient
    from curvine.common.security import NO_SECURITY
    from curvine.proto import master_pb2_grpc
    from curvine.common.master_group import master_rpc
    for addresses in ([members[0].address], [m.address for m in members]):
        client = master_rpc(addresses, master_pb2_grpc.MasterStub, security=NO_SECURITY,
                            timeout=5, wait=5)
        assert _statfs(client) == 0
        client.close()
        with pytest.raises(CurvineError) as e:
            _statfs(client)
        assert e.value.kind == ErrorKind.UNAVAILABLE
    one = RpcClient(members[0].address, master_pb2_grpc.MasterStub, security=NO_SECURITY)
    one.close()
    with pytest.raises(CurvineError) as e:
        _statfs(one, wait=0)
    assert "is closed" in str(e.value)


def test_a_bad_advertised_address_on_the_command_line_is_a_usage_error(capsys):
    from curvine.master.server import parse_args
    assert parse_args(["--advertise", "m0.masters:8995"]).advertise == "m0.masters:8995"
    with pytest.raises(SystemExit) as e:
        parse_args(["--advertise", "m0"])
    assert e.value.code == 2
    assert "--advertise: expected host:port, got 'm0'" in capsys.readouterr().err
