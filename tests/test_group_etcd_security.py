"""The master group on an etcd with TLS and with authentication (master/group/etcd_access.py).

Real etcd (tests/etcd_util.py) and real ``curvine-master`` processes (test_group_masters'
MasterProc), certificates made here (test_tls's helpers):

- etcd serving TLS with --client-cert-auth: a group of two elects, stores, and a
  standby takes over from a SIGKILLed leader; a plaintext client gets nowhere;
- a master without a client certificate, or trusting another CA, exits at start with
  a message naming the key to fix, and the leader stays the only member; a TLS file
  that cannot be read stops the master before it touches anything;
- etcd with authentication (root, and a user whose role may only read and write the
  group's keys): the group elects, stores and fails over; the user cannot touch keys
  outside the group's prefix; a wrong password stops a master at start, naming
  master.etcd_user; a client whose token expired (--auth-token-ttl 2) while idle
  authenticates again, without a warning; so do the masters when a restarted etcd has
  forgotten every token.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import grpc
import pytest

from curvine.common.config import Config, MasterConfig
from curvine.common.errors import ConfigError, CurvineError, ErrorKind
from curvine.master.group import etcd_access
from curvine.master.group.etcd import Etcd
from curvine.master.group.etcd_access import etcd_from_config

from cluster_util import wait_for
from etcd_util import EtcdCluster, EtcdTLS, enable_auth, etcd_missing
from test_group_masters import TAKEOVER_TIMEOUT, MasterProc, create, lookup
from test_tls import make_ca, make_leaf

PREFIX = b"/curvine/group-test/"  # the group's keys (cluster.name of MasterProc's config)
EXIT_TIMEOUT = 20.0
# what a master refused by etcd's TLS logs: its own line, and gRPC's native ones
REFUSED_BY_TLS = (r"CRITICAL curvine\.master: cannot start: etcd .*master\.etcd_",
                  r"ssl_transport_security|secure_endpoint\.cc|Handshake failed")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("etcd-pki")
    ca = make_ca(d / "ca", "etcd test CA")
    other = make_ca(d / "other-ca", "some other CA")
    return {
        "ca": ca[2],
        "server": make_leaf(d / "etcd", ca, "etcd", server=True),
        "client": make_leaf(d / "master", ca, "curvine-master", server=False),
        "other_ca": other[2],
        "other_client": make_leaf(d / "other", other, "impostor", server=False),
    }


def _start(base, **kw) -> EtcdCluster:
    missing = etcd_missing()
    if missing:
        pytest.skip(missing)
    return EtcdCluster(str(base), **kw).start()


@pytest.fixture
def tls_etcd(tmp_path, pki):
    cluster = _start(tmp_path / "etcd", tls=EtcdTLS(pki["ca"], *pki["server"],
                                                     client_cert_auth=True, client=pki["client"]))
    yield cluster
    cluster.stop()


@pytest.fixture
def auth_etcd(tmp_path):
    """A plaintext etcd with authentication on (tokens live 2 s unused): the user
    ``curvine`` may read and write the group's keys only."""
    cluster = _start(tmp_path / "etcd", auth_token_ttl=2)
    enable_auth(cluster, "curvine", "s3cret-pw", PREFIX)
    yield cluster
    cluster.stop()


def tls_lines(ca: str, cert: tuple[str, str] | None) -> str:
    lines = f'etcd_ca_file = "{ca}"\n'
    if cert is not None:
        lines += f'etcd_cert_file = "{cert[0]}"\netcd_key_file = "{cert[1]}"\n'
    return lines


def auth_lines(tmp_path, password: str, name: str = "pw") -> str:
    path = tmp_path / name
    path.write_text(password + "\n")
    os.chmod(path, 0o600)
    return f'etcd_user = "curvine"\netcd_password_file = "{path}"\n'


def start_group(tmp_path, cluster: EtcdCluster, n: int, extra: str) -> list[MasterProc]:
    made = []
    for i in range(n):
        m = MasterProc(str(tmp_path), i, cluster.endpoints, master_extra=extra)
        made.append(m)
        m.start()
        if i == 0:
            wait_for(lambda: m.role() == "leader", TAKEOVER_TIMEOUT, what="a leader")
    return made


def refused_at_start(m: MasterProc) -> str:
    """Start ``m``, which must exit with 2 (bad configuration) without serving; its log."""
    with open(m.log_path, "ab") as log:
        m.proc = subprocess.Popen([sys.executable, "-m", "curvine.master.server",
                                   "--conf", m.conf], stdout=log, stderr=log,
                                  stdin=subprocess.DEVNULL)
    try:
        assert m.proc.wait(timeout=EXIT_TIMEOUT) == 2
    finally:
        m.stop()
    with open(m.log_path) as f:
        return f.read()


def elects_stores_and_fails_over(first: MasterProc, second: MasterProc) -> None:
    names = [b"n%03d" % i for i in range(50)]
    for name in names:
        create(first, name)
    seq = first.applied()
    wait_for(lambda: second.applied() >= seq, 10, what="the standby applied the journal")
    assert second.role() == "standby" and lookup(second, b"n049")
    first.kill()
    wait_for(lambda: second.role() == "leader", TAKEOVER_TIMEOUT, what="the standby leads")
    create(second, b"after")
    for name in names + [b"after"]:
        assert lookup(second, name), name


def test_a_group_over_mutual_tls_elects_stores_and_fails_over(tmp_path, pki, tls_etcd):
    # etcd takes no plaintext and no certificate it did not issue: the gap closed
    for client in (Etcd(tls_etcd.endpoints, timeout=1.0),
                   etcd_from_config(_cfg(tls_etcd, etcd_ca_file=pki["ca"]), timeout=1.0)):
        try:
            with pytest.raises(CurvineError) as e:
                client.get(PREFIX + b"leader")
            assert e.value.kind == ErrorKind.UNAVAILABLE
        finally:
            client.close()
    first, second = start_group(tmp_path, tls_etcd, 2, tls_lines(pki["ca"], pki["client"]))
    try:
        # the group's keys are in that etcd, read over TLS with the masters' settings
        client = etcd_from_config(_cfg(tls_etcd, etcd_ca_file=pki["ca"],
                                       etcd_cert_file=pki["client"][0],
                                       etcd_key_file=pki["client"][1]))
        try:
            assert b"m0" in client.get(PREFIX + b"leader").value
        finally:
            client.close()
        elects_stores_and_fails_over(first, second)
    finally:
        first.stop()
        second.stop()


@pytest.mark.expect_log(*REFUSED_BY_TLS)
def test_a_master_without_a_client_certificate_or_trusting_another_ca_is_refused(
        tmp_path, pki, tls_etcd):
    leader, = start_group(tmp_path, tls_etcd, 1, tls_lines(pki["ca"], pki["client"]))
    try:
        # no client certificate: etcd's --client-cert-auth refuses the handshake
        log = refused_at_start(MasterProc(str(tmp_path), 1, tls_etcd.endpoints,
                                          master_extra=tls_lines(pki["ca"], None)))
        assert "cannot start" in log and "master.etcd_cert_file" in log, log[-2000:]
        # another CA: etcd's server certificate does not verify
        log = refused_at_start(MasterProc(str(tmp_path), 2, tls_etcd.endpoints,
                                          master_extra=tls_lines(pki["other_ca"], pki["client"])))
        assert "cannot start" in log and "master.etcd_ca_file" in log, log[-2000:]
        # a client certificate of another CA: refused by etcd
        log = refused_at_start(MasterProc(str(tmp_path), 3, tls_etcd.endpoints,
                                          master_extra=tls_lines(pki["ca"], pki["other_client"])))
        assert "cannot start" in log and "master.etcd_cert_file" in log, log[-2000:]
        # plaintext to etcd's TLS port
        log = refused_at_start(MasterProc(str(tmp_path), 4, tls_etcd.endpoints))
        assert "cannot start" in log and "master.etcd_ca_file" in log, log[-2000:]
        # a file that cannot be used stops the master before it reaches etcd (one line)
        log = refused_at_start(MasterProc(str(tmp_path), 5, tls_etcd.endpoints, master_extra=tls_lines(
            pki["ca"], (str(tmp_path / "missing.pem"), pki["client"][1]))))
        assert "master.etcd_cert_file: cannot read" in log, log[-2000:]
        # none of them joined: the leader is still the only member, and leads
        reply = leader.group()
        assert [m.id for m in reply.members] == ["m0"] and leader.role() == "leader"
        create(leader, b"still")
    finally:
        leader.stop()


@pytest.mark.expect_log(r"CRITICAL curvine\.master: cannot start: etcd .*authentication "
                        r"failed.*master\.etcd_user")
def test_a_group_with_etcd_authentication(tmp_path, auth_etcd):
    # without the user, etcd refuses the calls
    client = Etcd(auth_etcd.endpoints)
    try:
        with pytest.raises(CurvineError) as e:
            client.get(PREFIX + b"leader")
        assert e.value.kind == ErrorKind.UNAUTHENTICATED
        assert "master.etcd_user" in e.value.message
    finally:
        client.close()
    extra = auth_lines(tmp_path, "s3cret-pw")
    first, second = start_group(tmp_path, auth_etcd, 2, extra)
    try:
        # a wrong password: the master stops at start, naming the key
        log = refused_at_start(MasterProc(str(tmp_path), 2, auth_etcd.endpoints,
                                          master_extra=auth_lines(tmp_path, "wrong", "bad-pw")))
        assert "master.etcd_user" in log and "authentication failed" in log, log[-2000:]
        # the user may touch the group's keys only
        client = etcd_from_config(_cfg(auth_etcd, **_auth_keys(tmp_path)))
        try:
            assert client.get(PREFIX + b"leader") is not None
            with pytest.raises(CurvineError) as e:
                client.get(b"/elsewhere")
            assert e.value.kind == ErrorKind.PERMISSION and "master.etcd_user" in e.value.message
        finally:
            client.close()
        time.sleep(2.5)  # past the token TTL: the members' calls keep theirs alive
        elects_stores_and_fails_over(first, second)
        assert [m.id for m in second.group().members] == ["m1"]
    finally:
        first.stop()
        second.stop()


def test_an_idle_client_authenticates_again_when_its_token_expired(tmp_path, auth_etcd, caplog):
    caplog.set_level(logging.DEBUG, logger="curvine.master.group.etcd")
    client = etcd_from_config(_cfg(auth_etcd, **_auth_keys(tmp_path)))
    try:
        client.put(PREFIX + b"k", b"v")
        assert client.authentications == 1
        time.sleep(3.0)  # unused past --auth-token-ttl 2: etcd forgot the token
        assert client.get(PREFIX + b"k").value == b"v"  # refused once, authenticated, sent again
        assert client.authentications == 2
        assert client.lease_keepalive(client.lease_grant(5)) > 0
        client.put(PREFIX + b"k", b"w")
        assert client.authentications == 2  # a live token is kept
    finally:
        client.close()
    assert any("refused the auth token" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_etcd_files_are_read_at_a_masters_start_and_named(tmp_path, pki):
    """Checked with the config: which keys go together; at start: the files."""
    missing = str(tmp_path / "nothing")
    m = MasterConfig(etcd_endpoints=["127.0.0.1:1"], etcd_ca_file=missing)
    with pytest.raises(ConfigError, match=r"^master\.etcd_ca_file: cannot read"):
        etcd_access.load(m)
    m = MasterConfig(etcd_endpoints=["127.0.0.1:1"], etcd_ca_file=pki["ca"],
                     etcd_cert_file=pki["client"][0], etcd_key_file=pki["other_client"][1])
    with pytest.raises(ConfigError, match=r"^master\.etcd_key_file: .* is not the key of"):
        etcd_access.load(m)
    m = MasterConfig(etcd_endpoints=["127.0.0.1:1"], etcd_user="u", etcd_password_file=missing)
    with pytest.raises(ConfigError, match=r"^master\.etcd_password_file: cannot read"):
        etcd_access.load(m)
    (tmp_path / "pw").write_text("pw\n")
    m = MasterConfig(etcd_endpoints=["127.0.0.1:1"], etcd_user="u",
                     etcd_password_file=str(tmp_path / "pw"), etcd_ca_file=pki["ca"],
                     etcd_cert_file=pki["client"][0], etcd_key_file=pki["client"][1])
    access = etcd_access.load(m)
    assert access.user == "u" and access.password == "pw" and access.credentials is not None
    assert "pw" not in repr(access)


def _auth_keys(tmp_path) -> dict:
    path = tmp_path / "client-pw"
    path.write_text("s3cret-pw\n")
    return {"etcd_user": "curvine", "etcd_password_file": str(path)}


def _cfg(cluster: EtcdCluster, **master) -> Config:
    cfg = Config()
    cfg.cluster.name = "group-test"
    cfg.master = MasterConfig(etcd_endpoints=cluster.endpoints, **master)
    return cfg


def test_a_group_with_authentication_goes_on_after_etcd_restarted(tmp_path, auth_etcd):
    """etcd keeps its simple tokens in memory: restarted, it answers every token the
    masters hold "invalid auth token"; they authenticate again and go on, without a
    warning.  The leader keeps its lease (15 s here: an etcd restart on a loaded
    machine took 4-6 s, past the default 3 s, and a lost lease is not this test's
    business)."""
    extra = auth_lines(tmp_path, "s3cret-pw") + 'ha_lease_ttl = "15s"\n'
    first, second = start_group(tmp_path, auth_etcd, 2, extra)
    try:
        create(first, b"before")
        wait_for(lambda: lookup(second, b"before"), 10, what="the standby follows")
        auth_etcd.restart(0)
        wait_for(lambda: _creates(first, b"after-restart"), 30, what="the leader stores again")
        for i in range(20):
            create(first, b"during%02d" % i)
        wait_for(lambda: lookup(second, b"during19"), 10, what="the standby follows again")
        assert first.role() == "leader" and second.role() == "standby"
    finally:
        first.stop()
        second.stop()


def _creates(m: MasterProc, name: bytes) -> bool:
    try:
        create(m, name)
        return True
    except grpc.RpcError:
        return False


def test_a_user_set_before_etcd_turns_authentication_on(tmp_path, caplog):
    """The order of a migration to authentication: the masters get master.etcd_user
    first, while etcd has it off (they work, and warn once), then `auth enable`: the
    first call refused for its missing token authenticates and is sent again."""
    cluster = _start(tmp_path / "etcd")
    try:
        client = etcd_from_config(_cfg(cluster, **_auth_keys(tmp_path)))
        try:
            with caplog.at_level(logging.WARNING, logger="curvine.master.group.etcd"):
                client.put(PREFIX + b"k", b"v")
                client.put(PREFIX + b"k", b"w")
            warned = [r.getMessage() for r in caplog.records]
            assert len(warned) == 1 and "authentication off" in warned[0], warned
            assert client.authentications == 0
            enable_auth(cluster, "curvine", "s3cret-pw", PREFIX)
            assert client.get(PREFIX + b"k").value == b"w"
            assert client.authentications == 1
        finally:
            client.close()
    finally:
        cluster.stop()
