"""A real etcd for the master group's tests: one member or three, on free loopback ports.

``EtcdCluster(base, members=1|3).start()`` starts Debian's ``etcd`` binary (installed
by scripts/setup.sh, package etcd-server) with its data and logs under ``base``, and
waits until every member answers ``/health``; ``stop()`` ends every member it started
(SIGTERM, then SIGKILL).  ``endpoints`` is what ``master.etcd_endpoints`` takes.
``kill(i)`` / ``restart(i)`` take one member away and bring it back (a quorum test).

Fixtures (import them into a test module: ``from etcd_util import etcd  # noqa: F401``):
``etcd`` (one member) and ``etcd3`` (three), each stopped at teardown.  Both skip the
test, saying why, when no etcd binary is installed; nothing else skips.

TLS and authentication (the master group's etcd as deployments run it): pass
``tls=EtcdTLS(ca, cert, key, client_cert_auth=True)`` and the members serve their
client port over TLS (with --client-cert-auth, a client certificate signed by ``ca``
is required); ``client_tls`` is then the (ca, cert, key) files this module's own calls
use (health checks, ``enable_auth``).  ``auth_token_ttl`` sets etcd's
--auth-token-ttl (seconds a simple token lives unused).  ``enable_auth(cluster, ...)``
creates root, a user with a role granted readwrite on one key prefix only, and turns
authentication on, through etcd's Auth service (what `etcdctl user add`, `role add`,
`role grant-permission --prefix`, `user grant-role`, `auth enable` do).

etcd's own logs go to ``<base>/etcd-<i>.log``: not a curvine daemon log, so the log
check of tests/conftest.py leaves them alone (etcd logs a WARNING for a slow fsync
on a busy machine, which is not the test's business).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass

import grpc
import pytest

from curvine.devtools.local import free_ports

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
START_TIMEOUT = 20.0
STOP_WAIT = 2.0  # seconds after SIGTERM before SIGKILL
HOST = "127.0.0.1"


def etcd_missing() -> str | None:
    """Why the etcd binary cannot be used here, or None."""
    if not os.access(ETCD, os.X_OK):
        return "etcd is not installed (scripts/setup.sh installs Debian's etcd-server)"
    return None


@dataclass(frozen=True)
class EtcdTLS:
    """The files of an etcd serving TLS on its client port."""
    ca: str  # --trusted-ca-file: the CA of client certificates (and of cert, here)
    cert: str  # --cert-file: the server certificate (names 127.0.0.1)
    key: str  # --key-file
    client_cert_auth: bool = True  # --client-cert-auth
    # this module's own client certificate (cert, key): needed with client_cert_auth
    client: tuple[str, str] | None = None


class EtcdCluster:
    """``members`` etcd processes forming one cluster, on loopback."""

    def __init__(self, base: str, members: int = 1, tls: EtcdTLS | None = None,
                 auth_token_ttl: int | None = None):
        self.tls = tls
        self.auth_token_ttl = auth_token_ttl
        self.base = os.path.abspath(base)
        ports = free_ports(2 * members)
        self.client_ports = ports[:members]
        self.peer_ports = ports[members:]
        self.names = [f"e{i}" for i in range(members)]
        self.procs: list[subprocess.Popen | None] = [None] * members
        self._logs: list = [None] * members

    @property
    def endpoints(self) -> list[str]:
        return [f"{HOST}:{p}" for p in self.client_ports]

    def _argv(self, i: int, state: str) -> list[str]:
        cluster = ",".join(f"{n}=http://{HOST}:{p}" for n, p in zip(self.names, self.peer_ports))
        client = f"{self._scheme}://{HOST}:{self.client_ports[i]}"
        peer = f"http://{HOST}:{self.peer_ports[i]}"
        argv = [ETCD, "--name", self.names[i], "--data-dir", os.path.join(self.base, self.names[i]),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", cluster, "--initial-cluster-state", state,
                "--initial-cluster-token", os.path.basename(self.base),
                # a leader election within ~1 s on loopback (defaults: 100 ms / 1 s)
                "--heartbeat-interval", "100", "--election-timeout", "1000"]
        if self.tls is not None:
            argv += ["--cert-file", self.tls.cert, "--key-file", self.tls.key,
                     "--trusted-ca-file", self.tls.ca]
            if self.tls.client_cert_auth:
                argv.append("--client-cert-auth")
        if self.auth_token_ttl is not None:
            argv += ["--auth-token-ttl", str(self.auth_token_ttl)]
        return argv

    @property
    def _scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        ctx = ssl.create_default_context(cafile=self.tls.ca)
        if self.tls.client is not None:
            ctx.load_cert_chain(*self.tls.client)
        return ctx

    def channel(self, i: int = 0) -> grpc.Channel:
        """A gRPC channel to member ``i`` as this module's own client (TLS with the
        module's client certificate when the cluster serves TLS)."""
        target = self.endpoints[i]
        if self.tls is None:
            return grpc.insecure_channel(target)
        read = lambda path: open(path, "rb").read()  # noqa: E731
        cert, key = self.tls.client or (None, None)
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(
            read(self.tls.ca), read(key) if key else None, read(cert) if cert else None))

    def _spawn(self, i: int, state: str) -> None:
        os.makedirs(self.base, exist_ok=True)
        log = open(os.path.join(self.base, f"etcd-{i}.log"), "ab")
        self._logs[i] = log
        self.procs[i] = subprocess.Popen(self._argv(i, state), stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL)

    def start(self) -> "EtcdCluster":
        missing = etcd_missing()
        if missing:
            raise RuntimeError(missing)
        for i in range(len(self.names)):
            self._spawn(i, "new")
        try:
            for i in range(len(self.names)):
                self.wait_healthy(i)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, i: int, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        url = f"{self._scheme}://{HOST}:{self.client_ports[i]}/health"
        ctx = self._ssl_context()
        last = ""
        while time.monotonic() < deadline:
            proc = self.procs[i]
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"etcd {self.names[i]} exited with {proc.returncode}; "
                                   f"see {self.base}/etcd-{i}.log")
            try:
                with urllib.request.urlopen(url, timeout=1.0, context=ctx) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return
            except (OSError, ValueError) as e:
                last = str(e)
            time.sleep(0.1)
        raise RuntimeError(f"etcd {self.names[i]} not healthy within {timeout}s ({last})")

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (its data dir stays: restart() brings it back)."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        self.procs[i] = None
        if self._logs[i] is not None:
            self._logs[i].close()
            self._logs[i] = None

    def restart(self, i: int) -> None:
        self.kill(i)
        self._spawn(i, "existing")
        self.wait_healthy(i)

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for i, proc in enumerate(self.procs):
            if proc is None:
                continue
            try:
                # a member whose peer is gone may try to hand over its leadership for
                # seconds before it exits: its data dir is thrown away anyway
                proc.wait(timeout=STOP_WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            self.procs[i] = None
        for i, log in enumerate(self._logs):
            if log is not None:
                log.close()
                self._logs[i] = None


def enable_auth(cluster: EtcdCluster, user: str, password: str, prefix: bytes,
                root_password: str = "root-secret") -> None:
    """Turn authentication on in ``cluster``: a root user (etcd needs one first), and
    ``user`` with a role of its name granted readwrite on the keys under ``prefix``
    only.  The etcdctl equivalent is in docs/operations.md ("Master group")."""
    from curvine.proto import etcd_auth_pb2 as auth_pb
    from curvine.proto import etcd_rpc_pb2 as pb
    from curvine.proto import etcd_rpc_pb2_grpc as pb_grpc
    channel = cluster.channel()
    try:
        a = pb_grpc.AuthStub(channel)
        a.UserAdd(pb.AuthUserAddRequest(name="root", password=root_password), timeout=5)
        a.UserGrantRole(pb.AuthUserGrantRoleRequest(user="root", role="root"), timeout=5)
        a.UserAdd(pb.AuthUserAddRequest(name=user, password=password), timeout=5)
        a.RoleAdd(pb.AuthRoleAddRequest(name=user), timeout=5)
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        a.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(name=user, perm=auth_pb.Permission(
            permType=auth_pb.Permission.READWRITE, key=prefix, range_end=end)), timeout=5)
        a.UserGrantRole(pb.AuthUserGrantRoleRequest(user=user, role=user), timeout=5)
        a.AuthEnable(pb.AuthEnableRequest(), timeout=5)
    finally:
        channel.close()


def _etcd_fixture(tmp_path, members: int):
    missing = etcd_missing()
    if missing:
        pytest.skip(missing)
    cluster = EtcdCluster(str(tmp_path / f"etcd{members}"), members).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def etcd(tmp_path):
    """One etcd member, stopped at teardown."""
    yield from _etcd_fixture(tmp_path, 1)


@pytest.fixture
def etcd3(tmp_path):
    """Three etcd members (a quorum survives one killed), stopped at teardown."""
    yield from _etcd_fixture(tmp_path, 3)
