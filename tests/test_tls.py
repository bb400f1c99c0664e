"""TLS on every gRPC connection (common/tls.py), with certificates made here.

A real cluster (LocalCluster: master, 2 workers, a FUSE mount) runs with TLS and the
cluster token: the mount writes files whose blocks land on both workers, and the client
library of this process (server-only TLS: the CA, no certificate) reads them back.  A
plaintext client and a client trusting another CA are refused.  With mutual TLS the
daemons talk to each other with their certificates (workers register and heartbeat),
a client with a certificate from the cluster's CA works, and clients without one or
with one from another CA are refused.  Bad TLS configs stop a daemon at start with exit
2 and one line naming the key.  ``LocalCluster(tls=True)`` (`curvine local up --tls`)
makes its own CA and runs a mount over mutual TLS.  The master's call port speaks the
same TLS: the mount's and the path client's calls go there (the master's counter
moves), and in-process, a plaintext client, a client trusting another CA and (with
mutual TLS) one without a certificate are refused by the port and fall back.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import sys

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fs_helpers import log_text, wait_until
from test_call_port_mounts import CONNECTED, _master_metric

from curvine.client.master.call_port_blocking import BlockingCallPort, for_security
from curvine.client.files.fs import CurvineFS
from curvine.client.master.master_client import MasterClient
from curvine.common import auth, rpc, tls
from curvine.common.config import Config, SecurityConfig
from curvine.common.security import Security
from curvine.master import server as master_server
from curvine.proto import master_pb2, master_pb2_grpc

# -- certificates ---------------------------------------------------------------------
_NOW = datetime.datetime.now(datetime.timezone.utc)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path, key, cert) -> tuple[str, str]:
    key_path, cert_path = f"{path}.key", f"{path}.pem"
    with open(key_path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def make_ca(path, cn: str):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(_NOW - datetime.timedelta(hours=1))
            .not_valid_after(_NOW + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, _ = _write(path, key, cert)
    return key, cert, cert_path


def make_leaf(path, ca, cn: str, server: bool,
              names: list | None = None) -> tuple[str, str]:
    """(cert file, key file) of a certificate signed by ``ca`` = (key, cert, path);
    server certs name ``names`` (default 127.0.0.1 and localhost) and may also be used
    as client certificates (daemons are both)."""
    ca_key, ca_cert, _ = ca
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(_NOW - datetime.timedelta(hours=1))
         .not_valid_after(_NOW + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        names = names or [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                          x509.DNSName("localhost")]
        b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
    b = b.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return _write(path, key, b.sign(ca_key, hashes.SHA256()))


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d / "ca", "curvine test CA")
    other = make_ca(d / "other-ca", "some other CA")
    return {
        "ca": ca[2],
        "server": make_leaf(d / "server", ca, "curvine daemon", server=True),
        "client": make_leaf(d / "client", ca, "curvine client", server=False),
        "other_ca": other[2],
        "other_client": make_leaf(d / "other", other, "impostor", server=True),
        "named": make_leaf(d / "named", ca, "curvine master", server=True,
                           names=[x509.DNSName("master.curvine.test")]),
    }


def cluster_conf(tmp_path, pki, client_auth: bool = False) -> str:
    cert, key = pki["server"]
    path = tmp_path / "tls.toml"
    path.write_text(f"[security]\ntls_cert = '{cert}'\ntls_key = '{key}'\n"
                    f"tls_ca = '{pki['ca']}'\ntls_client_auth = {str(client_auth).lower()}\n")
    return str(path)


def client_config(token_file: str, ca: str, cert: tuple[str, str] | None = None) -> Config:
    """The config of a client with ``ca`` (and the client certificate ``cert``)."""
    cfg = Config()
    cfg.security = SecurityConfig(token_file=token_file, tls_ca=ca,
                                  tls_cert=cert[0] if cert else "",
                                  tls_key=cert[1] if cert else "")
    return cfg


def client_security(token_file: str, ca: str,
                    cert: tuple[str, str] | None = None) -> Security:
    """The credentials of a client with ``ca`` (and the client certificate ``cert``)."""
    return Security.load(client_config(token_file, ca, cert))


def statfs_code(address: str, security: Security) -> grpc.StatusCode:
    """StatFs over a channel made like every curvine channel (rpc.make_channel)."""
    with rpc.make_channel(address, security) as channel:
        try:
            master_pb2_grpc.MasterStub(channel).StatFs(master_pb2.StatFsRequest(), timeout=10)
        except grpc.RpcError as e:
            return e.code()
    return grpc.StatusCode.OK


def plaintext_code(address: str, token: str) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as channel:
        try:
            master_pb2_grpc.MasterStub(channel).StatFs(
                master_pb2.StatFsRequest(), timeout=10,
                metadata=[("authorization", "Bearer " + token)])
        except grpc.RpcError as e:
            return e.code()
    return grpc.StatusCode.OK


def write_and_read_back(fs: CurvineFS, files: dict[str, bytes]) -> set[int]:
    """Read ``files`` back through ``fs``; the ids of the workers holding their blocks."""
    holders = set()
    for path, data in files.items():
        assert fs.read_bytes(path) == data, path
        _, blocks, _ = fs.master.get_blocks(fs.stat(path).ino)
        for b in blocks:
            holders.update(b.worker_ids)
    return holders


# -- a cluster with TLS ---------------------------------------------------------------
@pytest.mark.fuse
def test_cluster_runs_with_tls(make_cluster, tmp_path, pki):
    c = make_cluster(workers=2, mounts=1, conf=cluster_conf(tmp_path, pki))
    token = auth.read_token_file(c.token_file)

    # The mount writes through TLS (master calls, lease session, worker streams or
    # adopt); enough files that the blocks land on both workers.
    files = {}
    for i in range(8):
        data = os.urandom((1 << 20) + i * 4099)
        with open(os.path.join(c.mounts[0], f"kv{i}.data"), "wb") as f:
            f.write(data)
        files[f"/kv{i}.data"] = data

    # This process: server-only TLS (it trusts the CA, has no certificate of its own).
    cfg = client_config(c.token_file, pki["ca"])
    with CurvineFS(c.master_addr, cfg=cfg) as fs:
        assert fs.master.security.material is not None and tls.load(cfg.security).cert is None
        fs.write_bytes("/from-client.data", files["/kv0.data"][::-1])
        files["/from-client.data"] = files["/kv0.data"][::-1]
        live = {w.worker_id for w in fs.master.statfs().workers if not w.lost}
        assert len(live) == 2
        assert write_and_read_back(fs, files) == live  # blocks on both workers
    with open(os.path.join(c.mounts[0], "from-client.data"), "rb") as f:
        assert f.read() == files["/from-client.data"]

    # The call port speaks TLS too: the mount is on it, and the path client's calls
    # (the LMCache connector's) went there, not to the unary RPCs.
    wait_until(lambda: CONNECTED in log_text(c.log_path("fuse", 0)), 20,
               "the mount on the TLS call port")
    before = _master_metric(c, "curvine_call_port_calls_total")
    for i in range(5):
        assert os.stat(os.path.join(c.mounts[0], f"kv{i}.data")).st_size > 0
        assert not os.path.exists(os.path.join(c.mounts[0], f"nothing{i}.data"))
    with CurvineFS(c.master_addr, cfg=cfg) as fs:
        assert fs.exists("/kv1.data") and not fs.exists("/absent.data")
        assert fs.master.route.thread_port is not None and fs.master.route.thread_port.calls >= 2
    assert _master_metric(c, "curvine_call_port_calls_total") - before >= 5 + 2

    for role, i in (("master", 0), ("worker", 0), ("worker", 1)):
        address = c._proc(role, i).address
        # A plaintext client cannot talk to a TLS port, even with the right token.
        assert plaintext_code(address, token) == grpc.StatusCode.UNAVAILABLE, role
    # A client that trusts another CA refuses the cluster's certificate.
    other = client_security(c.token_file, pki["other_ca"])
    assert statfs_code(c.master_addr, other) == grpc.StatusCode.UNAVAILABLE
    # ... and with the right CA the same call works (the refusals were TLS's).
    right = client_security(c.token_file, pki["ca"])
    assert statfs_code(c.master_addr, right) == grpc.StatusCode.OK


# -- mutual TLS -----------------------------------------------------------------------
def test_mutual_tls(make_cluster, tmp_path, pki):
    # The workers register and heartbeat presenting the daemon certificate: the
    # cluster coming up at all shows the daemons authenticate each other.
    c = make_cluster(workers=2, mounts=0, conf=cluster_conf(tmp_path, pki, client_auth=True))

    cfg = client_config(c.token_file, pki["ca"], pki["client"])
    with CurvineFS(c.master_addr, cfg=cfg) as fs:
        files = {f"/m{i}.data": os.urandom(300_000 + i) for i in range(6)}
        for path, data in files.items():
            fs.write_bytes(path, data)
        assert write_and_read_back(fs, files)  # blocks on the workers, read back

    # No client certificate (server-only TLS client): refused by the handshake.
    no_cert = client_security(c.token_file, pki["ca"])
    assert statfs_code(c.master_addr, no_cert) == grpc.StatusCode.UNAVAILABLE
    assert statfs_code(c._proc("worker", 0).address, no_cert) == grpc.StatusCode.UNAVAILABLE
    # A certificate from another CA (the client still trusts the cluster's CA).
    impostor = client_security(c.token_file, pki["ca"], pki["other_client"])
    assert statfs_code(c.master_addr, impostor) == grpc.StatusCode.UNAVAILABLE
    assert statfs_code(c._proc("worker", 1).address, impostor) == grpc.StatusCode.UNAVAILABLE
    # The cluster's client certificate gets through on each daemon (a worker does not
    # serve StatFs: UNIMPLEMENTED comes from past the handshake and the token check).
    member = client_security(c.token_file, pki["ca"], pki["client"])
    assert statfs_code(c.master_addr, member) == grpc.StatusCode.OK
    assert statfs_code(c._proc("worker", 1).address, member) == grpc.StatusCode.UNIMPLEMENTED


def test_client_library_with_tls_and_no_token(make_cluster, tmp_path, pki):
    """CurvineFS(cfg=...) takes TLS from its config even without a token file (it used
    to configure the process only when a token was set: plaintext to a TLS port,
    UNAVAILABLE)."""
    c = make_cluster(workers=1, mounts=0, conf=cluster_conf(tmp_path, pki), token=False)
    cfg = Config()
    cfg.cluster.master_wait = 5  # a plaintext client would wait the whole time, then fail
    cfg.security = SecurityConfig(tls_ca=pki["ca"])
    with CurvineFS(c.master_addr, cfg=cfg) as fs:
        fs.write_bytes("/lib.data", b"over tls")
        assert fs.read_bytes("/lib.data") == b"over tls"
        assert fs.master.security.material is not None


# -- bad configs ----------------------------------------------------------------------
def _bad_configs(tmp_path, pki):
    cert, key = pki["server"]
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    missing = str(tmp_path / "missing.pem")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    _, other_key = pki["other_client"]
    return [
        (f"tls_cert = '{missing}'\ntls_key = '{key}'\ntls_ca = '{pki['ca']}'",
         "security.tls_cert", "cannot read " + missing),
        (f"tls_cert = '{cert}'\ntls_key = '{key}'\ntls_ca = '{missing}'",
         "security.tls_ca", "cannot read " + missing),
        (f"tls_key = '{key}'\ntls_ca = '{pki['ca']}'", "security.tls_key", "tls_cert is not"),
        (f"tls_cert = '{cert}'\ntls_ca = '{pki['ca']}'", "security.tls_cert", "tls_key is not"),
        (f"tls_cert = '{cert}'\ntls_key = '{key}'", "security.tls_ca", "must be set"),
        (f"tls_cert = '{not_pem}'\ntls_key = '{key}'\ntls_ca = '{pki['ca']}'",
         "security.tls_cert", f"{not_pem} is not PEM"),
        (f"tls_cert = '{cert}'\ntls_key = '{not_pem}'\ntls_ca = '{pki['ca']}'",
         "security.tls_key", f"{not_pem} is not PEM"),
        (f"tls_cert = '{garbage}'\ntls_key = '{key}'\ntls_ca = '{pki['ca']}'",
         "security.tls_cert", f"{garbage}: cannot parse"),
        (f"tls_cert = '{cert}'\ntls_key = '{key}'\ntls_ca = '{garbage}'",
         "security.tls_ca", f"{garbage}: cannot parse"),
        (f"tls_cert = '{cert}'\ntls_key = '{encrypted}'\ntls_ca = '{pki['ca']}'",
         "security.tls_key", "is encrypted"),
        (f"tls_cert = '{cert}'\ntls_key = '{other_key}'\ntls_ca = '{pki['ca']}'",
         "security.tls_key", "is not the key of the certificate"),
        (f"tls_ca = '{pki['ca']}'\ntls_client_auth = true", "security.tls_client_auth",
         "needs security.tls_cert"),
        ("tls_server_name = 'curvine'", "security.tls_server_name", "TLS is off"),
    ]


def test_bad_tls_config_stops_the_master_with_one_line(tmp_path, capsys, pki):
    for n, (body, key, says) in enumerate(_bad_configs(tmp_path, pki)):
        conf = tmp_path / f"bad{n}.toml"
        conf.write_text(f"[security]\n{body}\n")
        meta = tmp_path / f"m{n}"
        assert master_server.main(["--conf", str(conf), "--meta-dir", str(meta),
                                   "--journal-dir", str(tmp_path / f"j{n}")]) == 2, body
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert f"{conf}:" in err and key in err and says in err, (body, err)
        assert not meta.exists()  # refused before touching anything


def test_bad_tls_config_stops_a_worker_and_a_ca_only_daemon_cannot_serve(tmp_path, pki):
    cert, _ = pki["server"]
    conf = tmp_path / "worker.toml"
    conf.write_text(f"[security]\ntls_cert = '{cert}'\ntls_ca = '{pki['ca']}'\n")
    run = subprocess.run([sys.executable, "-m", "curvine.worker.server", "--conf", str(conf),
                          "--data-dir", str(tmp_path / "data"), "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "security.tls_cert" in lines[0], run.stderr

    # tls_ca alone is a client config (server-only TLS): a daemon refuses to start with
    # it, like any bad config (exit 2, one line), before it touches its directories.
    conf.write_text(f"[security]\ntls_ca = '{pki['ca']}'\n")
    for argv in (["curvine.master.server", "--meta-dir", str(tmp_path / "m"),
                  "--journal-dir", str(tmp_path / "j")],
                 ["curvine.worker.server", "--data-dir", str(tmp_path / "d")]):
        run = subprocess.run([sys.executable, "-m", argv[0], "--conf", str(conf), "--port",
                              "0", *argv[1:]], capture_output=True, text=True, timeout=60)
        assert run.returncode == 2, run
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and "security.tls_cert" in lines[0] and "needs" in lines[0], (
            run.stderr)
    assert not any(os.path.exists(tmp_path / d) for d in ("m", "j", "d"))


def test_server_name_override(tmp_path, pki):
    """A server certificate that does not name the dialed address is refused, unless
    tls_server_name names what the certificate does name."""
    from curvine.master.master import Master
    from curvine.master.ports.service import MasterServicer
    cfg = Config()
    cfg.master.meta_dir, cfg.journal.dir = str(tmp_path / "meta"), str(tmp_path / "j")
    cert, key = pki["named"]  # names master.curvine.test only
    cfg.security = SecurityConfig(tls_cert=cert, tls_key=key, tls_ca=pki["ca"])
    security = Security.load(cfg)
    m = Master(cfg, security=security)
    server = rpc.make_server(4, security=security)
    master_pb2_grpc.add_MasterServicer_to_server(MasterServicer(m, call_threads=2), server)
    address = f"127.0.0.1:{rpc.bind(server, '127.0.0.1', 0, security)}"
    server.start()
    try:
        assert statfs_code(address, security) == grpc.StatusCode.UNAVAILABLE
        cfg.security.tls_server_name = "master.curvine.test"
        named = Security.load(cfg)
        assert statfs_code(address, named) == grpc.StatusCode.OK
        client = MasterClient(address, timeout=10, wait=1, security=named)  # same channels
        try:
            assert client.statfs().block_size > 0
        finally:
            client.close()
    finally:
        server.stop(0)
        m.close()


# -- curvine local up --tls -------------------------------------------------------------
@pytest.mark.fuse
def test_local_cluster_with_tls(make_cluster):
    c = make_cluster(workers=2, mounts=1, tls=True)
    d = os.path.join(c.base, "tls")
    assert sorted(os.listdir(d)) == ["ca.pem", "node.key", "node.pem"]  # no CA key left
    assert os.stat(os.path.join(d, "node.key")).st_mode & 0o777 == 0o600
    with open(os.path.join(c.base, "conf", "worker-1.toml")) as f:
        conf = f.read()
    assert f"tls_ca = \"{d}/ca.pem\"" in conf and "tls_client_auth = true" in conf

    data = os.urandom(2 << 20)
    with open(os.path.join(c.mounts[0], "a.data"), "wb") as f:
        f.write(data)
    # LocalCluster's Security is a client's of the cluster (token and certificate).
    with CurvineFS(master=MasterClient(c.master_addr, security=c.security)) as fs:
        assert fs.read_bytes("/a.data") == data
    token = auth.read_token_file(c.token_file)
    assert plaintext_code(c.master_addr, token) == grpc.StatusCode.UNAVAILABLE
    no_cert = client_security(c.token_file, os.path.join(d, "ca.pem"))  # mutual: no cert
    assert statfs_code(c.master_addr, no_cert) == grpc.StatusCode.UNAVAILABLE


# -- the call port with TLS, in-process ---------------------------------------------
@pytest.fixture
def tls_port(tmp_path, pki):
    """(master, start(client_auth) -> the port number of a CallPort with TLS)."""
    from curvine.common.security import NO_SECURITY
    from curvine.master.ports.call_port_server import CallPort
    from curvine.master.master import Master
    from curvine.master.ports.service import READ_CALLS, MasterServicer

    cfg = Config()
    cfg.master.meta_dir = str(tmp_path / "meta")
    cfg.journal.dir = str(tmp_path / "journal")
    m = Master(cfg, security=NO_SECURITY)
    servicer = MasterServicer(m, call_threads=4)
    ports = []

    def start(client_auth: bool) -> int:
        cert, key = pki["server"]
        material = tls.load(SecurityConfig(tls_ca=pki["ca"], tls_cert=cert, tls_key=key,
                                           tls_client_auth=client_auth))
        p = CallPort(servicer.run_call, READ_CALLS, servicer.call_pool, "127.0.0.1", 0,
                     mutations=servicer.mutations, ssl=tls.server_ssl_context(material))
        p.start()
        ports.append(p)
        return p.port

    yield m, start
    for p in ports:
        p.stop()
    servicer.close()
    m.close()


def _lookup_on(client: BlockingCallPort, name: bytes):
    return client.call("lookup", master_pb2.LookupRequest(parent=1, name=name))


def test_call_port_with_tls(tls_port, pki):
    import trio

    from curvine.common.call_wire import PortDown
    from curvine.common.ids import ROOT_INO
    from curvine.fuse_client.call_port_trio import TrioCallPort

    _, start = tls_port
    port = start(client_auth=False)
    ok = client_security("", pki["ca"])
    # the mount's client (trio; TLS over memory buffers): mutations and reads, many
    # frames each way through one TLS connection
    pc = TrioCallPort("127.0.0.1", port, "", timeout=10,
                        tls=tls.client_ssl_context(ok.material), server_name="127.0.0.1")
    made = {}

    async def go():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pc.run)
            with trio.fail_after(10):
                await pc.connected.wait()
            d = await pc.call(_prepared("mkdir", master_pb2.MkdirRequest(
                parent=ROOT_INO, name=b"d", mode=0o755, request_id=b"r" * 16)))
            made["d"] = d.inode.ino
            names = [b"k%02d" % i for i in range(50)]
            for n in names:
                await pc.call(_prepared("create", master_pb2.CreateRequest(
                    parent=d.inode.ino, name=n, mode=0o644, request_id=n * 6)))
            found = await pc.call(_prepared("lookup_many", master_pb2.LookupManyRequest(
                parent=d.inode.ino, names=names + [b"missing"])))
            assert [r.HasField("inode") for r in found.results] == [True] * 50 + [False]
            nursery.cancel_scope.cancel()

    trio.run(go)
    # the path client (blocking, ssl.SSLSocket) with the CA
    bp = for_security("127.0.0.1", port, ok, timeout=10)
    assert _lookup_on(bp, b"d").inode.ino == made["d"] and bp.calls == 1
    bp.close()
    # refused by TLS, so PortDown (the caller goes unary): a plaintext client, a client
    # that trusts another CA, a client that expects another server name
    for client in (BlockingCallPort("127.0.0.1", port, "", timeout=10),
                   for_security("127.0.0.1", port, client_security("", pki["other_ca"]), 10),
                   BlockingCallPort("127.0.0.1", port, "", timeout=10,
                                    tls=tls.client_ssl_context(ok.material),
                                    server_name="master.curvine.test")):
        with pytest.raises(PortDown):
            _lookup_on(client, b"d")
        assert client.calls == 0
        client.close()


def test_call_port_with_mutual_tls(tls_port, pki):
    from curvine.common.call_wire import PortDown

    m, start = tls_port
    port = start(client_auth=True)
    d = m.mkdir(master_pb2.MkdirRequest(parent=1, name=b"d", mode=0o755,
                                        request_id=b"m" * 16)).inode
    member = for_security("127.0.0.1", port, client_security("", pki["ca"], pki["client"]), 10)
    assert _lookup_on(member, b"d").inode.ino == d.ino
    assert member.calls == 1
    member.close()
    for sec in (client_security("", pki["ca"]),  # no certificate
                client_security("", pki["ca"], pki["other_client"])):  # another CA's
        client = for_security("127.0.0.1", port, sec, 10)
        with pytest.raises(PortDown):
            _lookup_on(client, b"d")
        assert client.calls == 0
        client.close()


def _prepared(op: str, request):
    """A Prepared call of ``op`` whose reply is returned as it is."""
    from curvine.client.master.requests import Prepared
    return Prepared(method=op, op=op, request=request, convert=lambda r: r)
