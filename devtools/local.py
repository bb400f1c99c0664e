"""A whole cluster on one machine: master(s), workers and FUSE mounts on 127.0.0.1.

``LocalCluster`` is what ``curvine local``, ``curvine demo``, the benchmark and the
integration tests use.  Everything lives under one base directory::

    BASE/cluster.json          state: ports, pids, argv and env extras of every process
    BASE/conf.toml             copy of the user's --conf (if given)
    BASE/conf/<role>-<i>.toml  config handed to each daemon (user conf + its own HTTP port)
    BASE/conf/client.toml      config for the other curvine commands (`--base BASE`, or
                               CURVINE_CONF): master address, token, TLS keys
    BASE/token                 the cluster token every RPC carries (mode 0600; see --no-token)
    BASE/tls/                  with --tls: ca.pem and node.pem/node.key (made by openssl)
    BASE/master/meta           master LMDB
    BASE/master/journal        master write-ahead journal
    BASE/master/<i>/{meta,journal}  the same for master i of a group (--masters N > 1)
    BASE/etcd/<i>              data of etcd member i (a group's consensus; --masters N > 1)
    BASE/worker/<i>/data       block files of worker i
    BASE/mnt/<i>               FUSE mount i
    BASE/logs/<role>-<i>.log   stdout+stderr of each daemon (appended across restarts)

Daemons run in their own sessions, so they outlive the ``curvine local up`` that
started them; ``cluster.json`` is how a later ``curvine local down`` finds them.
Readiness uses systemd's protocol: every daemon gets its own NOTIFY_SOCKET and is up
when it sends READY=1 (a worker sends it once registered with the master, a mount
once mounted).  A pid in the state file counts as alive only while its start time
matches, so a recycled pid is never mistaken for (or killed as) one of ours.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import random
import secrets
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

from curvine.common import argtypes
from curvine.common import auth
from curvine.common import config as _config
from curvine.common import cluster_config
from curvine.common.cluster_config import CLIENT_CONF, STATE_FILE, STATE_VERSION
from curvine.common.errors import ClusterError, ConfigError
from curvine.common.security import NO_SECURITY, Security
from curvine.common.mounts import mount_table

ROLES = ("etcd", "master", "worker", "fuse")
ETCD = shutil.which("etcd") or "/usr/bin/etcd"  # Debian's etcd-server (scripts/setup.sh)
LOG_TAIL_LINES = 30
HOST = "127.0.0.1"


# --------------------------------------------------------------------------- helpers
def make_tls_files(directory: str, days: int = 30) -> dict[str, str]:
    """A fresh CA and one certificate for 127.0.0.1 and localhost, usable by servers
    and clients alike, in ``directory`` (keys mode 0600; the CA's key is deleted once it
    has signed); the ``security.tls_*`` paths.  Made with the openssl command."""
    if not shutil.which("openssl"):
        raise ClusterError("--tls needs the openssl command (apt-get install openssl)")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    ca, ca_key = os.path.join(directory, "ca.pem"), os.path.join(directory, "ca.key")
    cert, key = os.path.join(directory, "node.pem"), os.path.join(directory, "node.key")
    csr, ext = os.path.join(directory, "node.csr"), os.path.join(directory, "node.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                "extendedKeyUsage=serverAuth,clientAuth\n"
                "basicConstraints=critical,CA:FALSE\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    steps = [
        ["openssl", "req", "-x509", *ec, "-days", str(days), "-subj", "/CN=curvine local CA",
         "-keyout", ca_key, "-out", ca],
        ["openssl", "req", *ec, "-subj", "/CN=curvine local node", "-keyout", key, "-out", csr],
        ["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-set_serial",
         str(int.from_bytes(secrets.token_bytes(8), "big")), "-days", str(days),
         "-extfile", ext, "-out", cert],
    ]
    old_umask = os.umask(0o077)  # keys are created 0600
    try:
        for argv in steps:
            run = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
            if run.returncode != 0:
                last = (run.stderr.strip().splitlines() or ["?"])[-1]
                raise ClusterError(f"making TLS certificates in {directory} failed: "
                                   f"{' '.join(argv[:2])}: {last}")
    finally:
        os.umask(old_umask)
        for path in (ca_key, csr, ext):  # nothing else can be signed with this CA
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return {"tls_ca": ca, "tls_cert": cert, "tls_key": key}



def free_ports(n: int, host: str = HOST) -> list[int]:
    """``n`` distinct free TCP ports on ``host``, below the kernel's ephemeral range: a
    port from that range may be taken as the source port of any outgoing connection on
    the machine between this check and the daemon's bind (a master once failed to
    start that way).  Each is checked by binding it; random, so that clusters started
    side by side do not pick the same ones."""
    low, high = 10000, _ephemeral_low() - 1
    if high - low < 1000:  # an unusual ip_local_port_range: let the kernel pick
        return _kernel_ports(n, host)
    rng = random.SystemRandom()
    socks: list[socket.socket] = []
    try:
        for _ in range(100 * n):
            if len(socks) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, rng.randint(low, high)))
            except OSError:
                s.close()
                continue
            socks.append(s)
        if len(socks) < n:
            return _kernel_ports(n, host)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _kernel_ports(n: int, host: str) -> list[int]:
    """``n`` distinct free ports the kernel picks (bound to port 0 together, then closed)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def proc_stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (the state first), or None
    if ``pid`` is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    return data[data.rfind(b")") + 2:].split()


def proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if it is gone or a zombie."""
    fields = proc_stat(pid)
    if not fields or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])  # field 22 overall


def pid_alive(pid: int | None, start_time: int | None = None) -> bool:
    if not pid:
        return False
    st = proc_start_time(pid)
    if st is None:
        return False
    return start_time is None or st == start_time


def mounted_paths() -> set[str]:
    """Mount points currently in the mount table (never touches the file systems)."""
    return {m.point for m in mount_table()}


@contextlib.contextmanager
def bench_cluster(base: str | None, prefix: str, say, workers: int = 2, mounts: int = 1):
    """A benchmark's cluster: the running `curvine local` cluster at ``base`` (left
    running), else one started here and stopped afterwards.  Yields (the cluster, a
    temporary directory removed afterwards: the started cluster's, and room for the
    benchmark's own files)."""
    import tempfile
    top = tempfile.mkdtemp(prefix=prefix)
    cluster = None
    try:
        if base:
            cluster = LocalCluster.attach(base)
        else:
            cluster = LocalCluster(os.path.join(top, "cluster"), workers=workers,
                                   mounts=mounts)
            say(f"starting a local cluster in {cluster.base} ...")
            cluster.up()
        yield cluster, top
    finally:
        if cluster is not None and not base:
            cluster.down()
        shutil.rmtree(top, ignore_errors=True)


def is_mounted(path: str) -> bool:
    return os.path.realpath(path) in mounted_paths()


def _answers(path: str, timeout: float) -> bool:
    """True if ``stat(path)`` returns within ``timeout`` (a hung FUSE daemon never does)."""
    done = threading.Event()
    result: list[bool] = []

    def probe():
        try:
            os.stat(path)
            result.append(True)
        except OSError:
            result.append(False)
        done.set()

    threading.Thread(target=probe, daemon=True, name="mount-probe").start()
    return done.wait(timeout) and result[0]


def fusermount_unmount(path: str, timeout: float = 10.0) -> bool:
    """Unmount ``path``: ``fusermount3 -u``, then the lazy ``-uz``. True if it is gone."""
    if not is_mounted(path):
        return True
    exe = shutil.which("fusermount3") or shutil.which("fusermount")
    attempts = [[exe, "-u", path], [exe, "-uz", path]] if exe else []
    if os.geteuid() == 0:
        attempts.append(["umount", "-l", path])
    for argv in attempts:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=timeout, check=False)
        if not is_mounted(path):
            return True
    return False


START_MARKER = "--- curvine local: starting "


def log_tail(path: str, lines: int = LOG_TAIL_LINES, last_run: bool = False) -> str:
    """The last ``lines`` lines of a log, indented; ``last_run``: only the latest start."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError as e:
        return f"    (cannot read {path}: {e.strerror})"
    text = data.decode("utf-8", "replace").splitlines()
    if last_run:
        starts = [i for i, line in enumerate(text) if line.startswith(START_MARKER)]
        if starts:
            text = text[starts[-1] + 1:]
    text = text[-lines:]
    return "\n".join("    " + line for line in text) if text else "    (log is empty)"


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class _Notify:
    """A systemd-style notification socket (abstract namespace: no path length limit)."""

    def __init__(self):
        self.name = f"curvine-local-{os.getpid()}-{secrets.token_hex(6)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind("\0" + self.name)
        self.sock.setblocking(False)
        self.ready = False
        self.status = ""

    @property
    def env_value(self) -> str:
        return "@" + self.name

    def poll(self, timeout: float) -> bool:
        """Read pending messages (waiting up to ``timeout``); True once READY=1 arrived."""
        r, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        while r:
            try:
                msg = self.sock.recv(4096)
            except BlockingIOError:
                break
            for line in msg.decode("utf-8", "replace").splitlines():
                if line == "READY=1":
                    self.ready = True
                elif line.startswith("STATUS="):
                    self.status = line[7:]
        return self.ready

    def close(self):
        self.sock.close()


@dataclasses.dataclass
class _Proc:
    """One daemon as recorded in the state file."""

    role: str
    index: int
    argv: list[str]
    log: str
    address: str | None = None  # gRPC host:port (master, worker)
    http_port: int | None = None
    mount: str | None = None
    pid: int | None = None
    start_time: int | None = None

    @property
    def name(self) -> str:
        return f"{self.role} {self.index}"

    @property
    def metrics_url(self) -> str | None:
        # every daemon serves /metrics on HOST at its http_port (common/metrics.py)
        return f"http://{HOST}:{self.http_port}/metrics" if self.http_port else None

    def alive(self) -> bool:
        return pid_alive(self.pid, self.start_time)


# --------------------------------------------------------------------------- cluster

class LocalCluster:
    """Master, workers and FUSE mounts on 127.0.0.1, all kept under ``base``."""

    # argv prefix of each role; tests may point these at stand-ins.
    COMMANDS: dict[str, list[str]] = {
        "master": [sys.executable, "-m", "curvine.master.server"],
        "worker": [sys.executable, "-m", "curvine.worker.server"],
        "fuse": [sys.executable, "-m", "curvine.fuse_client.main"],
        "etcd": [ETCD],
    }

    def __init__(self, base: str, workers: int = 2, mounts: int = 2, conf: str | None = None,
                 short_circuit: list[bool] | None = None, env: dict | None = None,
                 worker_capacity: int = 0, replicas: int = 0, token: bool = True,
                 tls: bool = False, host_ids: dict[str, str] | None = None,
                 masters: int = 1, etcd: int = 0):
        if workers < 0 or mounts < 0:
            raise ClusterError("workers and mounts must not be negative")
        if masters < 1 or etcd < 0:
            raise ClusterError("a cluster needs at least one master, and etcd members must "
                               "not be negative")
        if etcd and masters == 1:
            raise ClusterError("etcd members serve a group of masters: use --masters N > 1")
        if etcd not in (0, 1, 3, 5):
            raise ClusterError(f"etcd members: 1, 3 or 5 (a quorum of an even number "
                               f"tolerates no more failures than one fewer), got {etcd}")
        # masters > 1: a group (docs/operations.md, "Master group") over ``etcd``
        # members (default one: a local box has no failure domains to spread them over;
        # none when the config names master.etcd_endpoints: an etcd already running)
        self.n_masters = masters
        self.n_etcd = etcd or (1 if masters > 1 else 0)
        self._etcd_asked = etcd
        if worker_capacity < 0:
            raise ClusterError("worker_capacity must not be negative")
        if replicas and not 1 <= replicas <= 8:
            raise ClusterError("replicas must be between 1 and 8")
        # override the config's worker.capacity / cluster.replicas when non-zero
        self.worker_capacity = worker_capacity
        self.replicas = replicas
        # token=True: every daemon requires the cluster token in BASE/token (made at
        # `up` unless the config names a token file); False: an open cluster.
        self.token = token
        self.token_file = ""
        # tls=True: mutual TLS with a CA and one certificate made in BASE/tls at `up`
        # (unless the config sets security.tls_ca); the TLS keys every daemon got
        self.tls = tls
        self.tls_keys: dict[str, Any] = {}
        self.security: Security = NO_SECURITY  # what clients of this cluster pass (_load_security)
        if short_circuit is not None and len(short_circuit) != mounts:
            raise ClusterError(f"short_circuit has {len(short_circuit)} entries for {mounts} mounts")
        self.base = os.path.realpath(base)
        self.n_workers = workers
        self.n_mounts = mounts
        self.conf = os.path.abspath(conf) if conf else None
        self.short_circuit = list(short_circuit) if short_circuit is not None else [True] * mounts
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        # process name ("worker 1", "fuse 0") -> CURVINE_HOST_ID: daemons that act as if
        # on another machine (placement prefers a worker of the writer's host)
        self.host_ids = {str(k): str(v) for k, v in (host_ids or {}).items()}
        self.master_addr = ""  # master 0's gRPC address (every one: master_addrs)
        self.master_addrs: list[str] = []
        self.master_worker_port = 0  # master 0's port for workers' calls
        self.etcd_endpoints: list[str] = []
        self.mounts: list[str] = [self._path("mnt", str(i)) for i in range(mounts)]
        self._procs: dict[tuple[str, int], _Proc] = {}
        self._popen: dict[tuple[str, int], subprocess.Popen] = {}
        self._lock = threading.RLock()

    # ----------------------------------------------------------------- paths & state
    def _path(self, *parts: str) -> str:
        return os.path.join(self.base, *parts)

    @property
    def state_path(self) -> str:
        return self._path(STATE_FILE)

    @property
    def client_conf(self) -> str:
        """The config of a client of this cluster: its master, the cluster token and
        the TLS keys (what `curvine local up` prints as CURVINE_CONF)."""
        return self._path(CLIENT_CONF)

    @property
    def socket_dir(self) -> str:
        """BASE/run: the workers' domain sockets (client.domain_socket_dir of every
        client config this cluster writes)."""
        return self._path("run")

    def socket_path(self, index: int) -> str:
        """Worker ``index``'s domain socket (worker.domain_socket)."""
        return os.path.join(self.socket_dir, f"worker-{index}.sock")

    def log_path(self, role: str, index: int = 0) -> str:
        self._check_role(role)
        return self._path("logs", f"{role}-{index}.log")

    def logs(self) -> list[str]:
        """Every daemon log file that exists under ``base/logs``."""
        d = self._path("logs")
        try:
            return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".log"))
        except OSError:
            return []

    @staticmethod
    def _check_role(role: str) -> None:
        if role not in ROLES:
            raise ClusterError(f"unknown role {role!r} (use one of {', '.join(ROLES)})")

    def _state(self) -> dict:
        return {
            "version": STATE_VERSION,
            "base": self.base,
            "master_addr": self.master_addr,
            "master_addrs": self.master_addrs,
            "master_worker_port": self.master_worker_port,
            "masters": self.n_masters,
            "etcd": self.n_etcd,
            "etcd_endpoints": self.etcd_endpoints,
            "workers": self.n_workers,
            "mounts": self.n_mounts,
            "conf": self.conf,
            "short_circuit": self.short_circuit,
            "env": self.env,
            "host_ids": self.host_ids,
            "token_file": self.token_file,
            "tls": self.tls_keys,
            "updated": time.time(),
            "procs": [dataclasses.asdict(p) for p in self._procs.values()],
        }

    def _save(self) -> None:
        with self._lock:
            _write_atomic(self.state_path,
                          (json.dumps(self._state(), indent=2) + "\n").encode())

    @staticmethod
    def client_conf_of(base: str) -> str:
        """The client config of the cluster started in ``base`` (``--base`` of the
        other curvine commands)."""
        return cluster_config.client_conf_of(base)

    @classmethod
    def attach(cls, base: str) -> "LocalCluster":
        """The cluster recorded in ``base/cluster.json`` (for `curvine local down/status`)."""
        base = os.path.realpath(base)
        state = cluster_config.recorded_state(base)
        try:
            c = cls(base, workers=int(state["workers"]), mounts=int(state["mounts"]),
                    conf=state.get("conf"), short_circuit=state.get("short_circuit"),
                    env=state.get("env") or {}, host_ids=state.get("host_ids") or {},
                    masters=int(state.get("masters", 1)))
            c.n_etcd = int(state.get("etcd", 0))  # 0 also when an outside etcd serves it
            c.master_addr = str(state.get("master_addr", ""))
            c.master_addrs = [str(a) for a in state.get("master_addrs") or [c.master_addr]]
            c.etcd_endpoints = [str(a) for a in state.get("etcd_endpoints") or []]
            c.master_worker_port = int(state.get("master_worker_port") or 0)
            c.token_file = str(state.get("token_file") or "")
            c.token = bool(c.token_file)
            c.tls_keys = dict(state.get("tls") or {})
            c.tls = bool(c.tls_keys.get("tls_ca"))
            with contextlib.suppress(ClusterError):  # `down` works without them
                c._load_security()
            for rec in state["procs"]:
                p = _Proc(**rec)
                c._procs[(p.role, p.index)] = p
        except (KeyError, TypeError, ValueError, ClusterError) as e:
            raise ClusterError(f"{os.path.join(base, STATE_FILE)}: damaged state file ({e}); "
                               "stop its processes by hand and remove it") from None
        return c

    @contextlib.contextmanager
    def _exclusive(self):
        """Only one `up`/`down` at a time per base (two `up`s must not both start)."""
        os.makedirs(self.base, exist_ok=True)
        fd = os.open(self._path(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ClusterError(f"another `curvine local` command is working on {self.base}; "
                                   "wait for it to finish") from None
            yield
        finally:
            os.close(fd)

    # ----------------------------------------------------------------- queries
    def status(self) -> list[dict]:
        """One dict per process: role, index, pid, alive, address, mount, metrics (the
        URL of its /metrics), log."""
        if not self._procs:
            procs = [_Proc(**rec) for rec in cluster_config.recorded_state(self.base)["procs"]]
        else:
            procs = list(self._procs.values())
        return [{"role": p.role, "index": p.index, "pid": p.pid, "alive": p.alive(),
                 "address": p.address, "mount": p.mount, "metrics": p.metrics_url,
                 "log": p.log} for p in procs]

    def leader(self, timeout: float = 30.0) -> int:
        """The index of the master that leads the group now (its /metrics say
        curvine_master_role 1), waiting up to ``timeout`` for one; a lone master leads."""
        from prometheus_client.parser import text_string_to_metric_families
        deadline = time.monotonic() + timeout
        while True:
            for p in self._procs.values():
                if p.role != "master" or not p.alive() or not p.metrics_url:
                    continue
                try:
                    with urllib.request.urlopen(p.metrics_url, timeout=2.0) as r:
                        text = r.read().decode()
                except OSError:
                    continue
                if any(s.name == "curvine_master_role" and s.value == 1
                       for fam in text_string_to_metric_families(text) for s in fam.samples):
                    return p.index
                if self.n_masters == 1:
                    return p.index
            if time.monotonic() > deadline:
                raise ClusterError(f"no master of {self.base} leads after {timeout:g}s")
            time.sleep(0.05)

    def pids(self) -> list[int]:
        """Pids of the processes of this cluster that are alive now."""
        return [p.pid for p in self._procs.values() if p.alive()]

    def _proc(self, role: str, index: int) -> _Proc:
        self._check_role(role)
        try:
            return self._procs[(role, index)]
        except KeyError:
            raise ClusterError(f"this cluster has no {role} {index}") from None

    # ----------------------------------------------------------------- up
    def up(self, timeout: float = 60.0) -> list[str]:
        """Start master, workers and mounts; return the mount paths once they answer.

        If anything fails to come up, everything started so far is stopped and a
        ``ClusterError`` names the process and shows the tail of its log."""
        deadline = time.monotonic() + timeout
        with self._exclusive():
            self._refuse_if_running()
            try:
                self._layout()
                self._plan()
                self._save()
                self._start_and_wait([("etcd", i) for i in range(self.n_etcd)], deadline)
                self._start_and_wait([("master", i) for i in range(self.n_masters)], deadline)
                self._start_and_wait([("worker", i) for i in range(self.n_workers)], deadline)
                self._start_and_wait([("fuse", i) for i in range(self.n_mounts)], deadline)
            except BaseException as e:
                try:
                    self._down_locked(timeout=10.0)
                except Exception as cleanup:  # noqa: BLE001 - report both failures
                    if isinstance(e, ClusterError):
                        raise ClusterError(f"{e}\n(cleaning up also failed: {cleanup})") from None
                raise
        return list(self.mounts)

    def _refuse_if_running(self) -> None:
        state = cluster_config.read_state(self.base)
        if state is not None:
            old = LocalCluster.attach(self.base)
            live = old.pids()
            if live:
                raise ClusterError(
                    f"a cluster is already running in {self.base} (pids "
                    f"{', '.join(map(str, live))}); run `curvine local down --base "
                    f"{self.base}` first")
            # Stale: every pid is gone. Clear what a crash may have left behind.
            old._down_locked(timeout=5.0)
        for m in self.mounts:
            if is_mounted(m) and not fusermount_unmount(m):
                raise ClusterError(f"{m} is still mounted and cannot be unmounted; "
                                   f"run `fusermount3 -uz {m}`")

    def _layout(self) -> None:
        # Private: blocks, names, keys, configs and logs are this user's only.  Modes
        # are set explicitly (makedirs of an existing dir changes nothing); BASE too,
        # unless it is a shared one (sticky, like /tmp) or another user's.
        os.makedirs(self.base, mode=0o700, exist_ok=True)
        st = os.stat(self.base)
        if st.st_uid == os.geteuid() and not st.st_mode & 0o1000:  # S_ISVTX
            os.chmod(self.base, 0o700)
        private = [("master",), ("logs",), ("conf",), ("worker",)]
        private += [(*self._master_dir(i), d) for i in range(self.n_masters)
                    for d in ("meta", "journal")]
        if self.n_etcd:
            private += [("etcd",)] + [("etcd", str(i)) for i in range(self.n_etcd)]
        for i in range(self.n_workers):
            private += [("worker", str(i)), ("worker", str(i), "data")]
        for d in private:
            os.makedirs(self._path(*d), mode=0o700, exist_ok=True)
            os.chmod(self._path(*d), 0o700)
        for m in self.mounts:
            os.makedirs(m, exist_ok=True)
            with contextlib.suppress(OSError):
                if os.listdir(m):
                    raise ClusterError(f"mount point {m} is not empty")

    def _master_dir(self, index: int) -> tuple[str, ...]:
        """BASE/master for the one master (as always), BASE/master/<i> in a group."""
        return ("master",) if self.n_masters == 1 else ("master", str(index))

    def _plan(self) -> None:
        """Pick ports and build every daemon's argv and config file."""
        try:
            cfg = _config.load(self.conf) if self.conf else _config.Config()
        except ConfigError as e:
            raise ClusterError(f"bad config: {e}") from None
        if self.replicas:
            cfg.cluster = dataclasses.replace(cfg.cluster, replicas=self.replicas)
        if self.worker_capacity:
            cfg.worker = dataclasses.replace(cfg.worker,
                                             capacity=_config.Size(self.worker_capacity))
        if self.conf:
            shutil.copyfile(self.conf, self._path("conf.toml"))
        if self.token and not cfg.security.token_file:
            self.token_file = self._path(auth.TOKEN_FILE_NAME)
            auth.write_token_file(self.token_file)
            cfg.security = dataclasses.replace(cfg.security, token_file=self.token_file)
        else:
            self.token_file = cfg.security.token_file
        if self.token_file and not cfg.security.worker_token_file:
            # the worker credential: in the master's and the workers' configs only
            wtoken = self._path(auth.WORKER_TOKEN_FILE_NAME)
            auth.write_token_file(wtoken)
            cfg.security = dataclasses.replace(cfg.security, worker_token_file=wtoken)
        if self.token_file and self.n_masters > 1 and not cfg.security.master_token_file:
            # the master credential (FetchCheckpoint between members): masters' configs only
            mtoken = self._path(auth.MASTER_TOKEN_FILE_NAME)
            auth.write_token_file(mtoken)
            cfg.security = dataclasses.replace(cfg.security, master_token_file=mtoken)
        if self.tls and not cfg.security.tls_ca:
            cfg.security = dataclasses.replace(cfg.security, tls_client_auth=True,
                                               **make_tls_files(self._path("tls")))
        self.tls_keys = {f.name: getattr(cfg.security, f.name)
                         for f in dataclasses.fields(cfg.security) if f.name.startswith("tls_")}
        self._load_security()
        nm, n = self.n_masters, self.n_masters + self.n_workers
        ports = iter(free_ports(2 * n + self.n_mounts + 2 * nm + self.n_workers
                                + 2 * self.n_etcd))

        def take(k: int) -> list[int]:
            return [next(ports) for _ in range(k)]

        data_ports, call_ports, worker_ports = take(self.n_workers), take(nm), take(nm)
        grpc_ports, http_ports = take(n), take(n + self.n_mounts)
        etcd_client, etcd_peer = take(self.n_etcd), take(self.n_etcd)
        self.master_addrs = [f"{HOST}:{p}" for p in grpc_ports[:nm]]
        self.master_addr = self.master_addrs[0]
        self.master_worker_port = worker_ports[0]
        self.etcd_endpoints = [f"{HOST}:{p}" for p in etcd_client]
        if cfg.master.etcd_endpoints:
            if self._etcd_asked:
                raise ClusterError("the config names master.etcd_endpoints (an etcd of its "
                                   "own): leave out --etcd")
            self.n_etcd, etcd_client, etcd_peer = 0, [], []
            self.etcd_endpoints = list(cfg.master.etcd_endpoints)
        cfg.master = dataclasses.replace(cfg.master, worker_port=worker_ports[0],
                                         call_port=call_ports[0] if cfg.master.call_port else 0)
        if nm > 1:
            cfg.cluster = dataclasses.replace(
                cfg.cluster, master_addrs=self.master_addrs,
                master_worker_addrs=[f"{HOST}:{p}" for p in worker_ports])
            cfg.master = dataclasses.replace(cfg.master, etcd_endpoints=self.etcd_endpoints)
        self._procs.clear()

        def seen_by(role: str) -> _config.Config:
            c = dataclasses.replace(cfg, cluster=dataclasses.replace(
                cfg.cluster, master_addr=self.master_addr))
            if role not in ("master", "worker"):  # clients never hold the worker token
                c.security = dataclasses.replace(cfg.security, worker_token_file="")
            if role != "master":  # nor the master token, which workers do not hold either
                c.security = dataclasses.replace(c.security, master_token_file="")
            return c

        def conf_file(role: str, index: int, **section_values) -> str:
            # The flags below win anyway; the file repeats them so that it reads as the
            # daemon's whole effective configuration.
            c = seen_by(role)
            # [client] keys of a mount's own
            client = {k: section_values.pop(k) for k in ("short_circuit", "read_member")
                      if k in section_values}
            client = {k: v for k, v in client.items() if v is not None}
            if client:
                c.client = dataclasses.replace(cfg.client, **client)
            setattr(c, role, dataclasses.replace(getattr(cfg, role), **section_values))
            if role == "master":
                c.journal = dataclasses.replace(
                    cfg.journal, dir=self._path(*self._master_dir(index), "journal"))
            path = self._path("conf", f"{role}-{index}.toml")
            _write_atomic(path, _config.to_toml(c).encode())
            return path

        self._plan_etcd(etcd_client, etcd_peer)
        for i in range(nm):
            mport, mhttp = grpc_ports[i], http_ports[i]
            meta = self._path(*self._master_dir(i), "meta")
            journal = self._path(*self._master_dir(i), "journal")
            group = {"member_id": f"m{i}"} if nm > 1 else {}
            mconf = conf_file("master", i, host=HOST, port=mport, http_port=mhttp,
                              meta_dir=meta, worker_port=worker_ports[i],
                              call_port=call_ports[i] if cfg.master.call_port else 0, **group)
            self._add("master", i, ["--conf", mconf, "--host", HOST, "--port", str(mport),
                                    "--meta-dir", meta, "--journal-dir", journal],
                      address=self.master_addrs[i], http_port=mhttp)
        # one master: its address on the command line, as always; a group's members
        # are in every config (cluster.master_addrs)
        master_flag = ["--master", self.master_addr] if nm == 1 else []
        for i in range(self.n_workers):
            port, http = grpc_ports[nm + i], http_ports[nm + i]
            data = self._path("worker", str(i), "data")
            # its own socket in BASE/run, where this cluster's clients look for them
            sock = self.socket_path(i) if cfg.worker.domain_socket else ""
            wconf = conf_file("worker", i, host=HOST, port=port, http_port=http,
                              data_dirs=[data], domain_socket=sock,
                              data_port=data_ports[i] if cfg.worker.data_port else 0)
            self._add("worker", i, ["--conf", wconf, *master_flag,
                                    "--host", HOST, "--port", str(port), "--data-dir", data],
                      address=f"{HOST}:{port}", http_port=http)
        # Every worker is on this host: the mounts' short-circuit I/O may go to their
        # data dirs, and nowhere else (unless the given config names its own).
        cfg.client = dataclasses.replace(cfg.client, short_circuit_dirs=list(
            cfg.client.short_circuit_dirs) or [self._path("worker", str(j), "data")
                                               for j in range(self.n_workers)],
            domain_socket_dir=self.socket_dir if cfg.client.domain_socket_dir else "")
        # The other curvine commands (fs, report) reach this cluster with it.
        _write_atomic(self.client_conf, _config.to_toml(seen_by("client")).encode())
        for i, mnt in enumerate(self.mounts):
            http = http_ports[n + i]
            # a group: each mount reads from one member, round-robin by mount
            reads = (self.master_addrs[i % nm] if nm > 1 and not cfg.client.read_member
                     else None)
            fconf = conf_file("fuse", i, mountpoint=mnt, http_port=http,
                              short_circuit=self.short_circuit[i] and cfg.client.short_circuit,
                              read_member=reads)
            argv = [mnt, "--conf", fconf, *master_flag]
            if not self.short_circuit[i]:
                argv.append("--no-short-circuit")
            self._add("fuse", i, argv, mount=mnt, http_port=http)

    def _plan_etcd(self, client_ports: list[int], peer_ports: list[int]) -> None:
        """The etcd members of a group, on loopback; each tells systemd's READY=1 when it
        serves, like our daemons."""
        cluster = ",".join(f"e{i}=http://{HOST}:{p}" for i, p in enumerate(peer_ports))
        for i, (client, peer) in enumerate(zip(client_ports, peer_ports)):
            client_url, peer_url = f"http://{HOST}:{client}", f"http://{HOST}:{peer}"
            self._add("etcd", i, [
                "--name", f"e{i}", "--data-dir", self._path("etcd", str(i)),
                "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", cluster, "--initial-cluster-state", "new",
                "--initial-cluster-token", f"curvine-local-{secrets.token_hex(4)}"],
                address=f"{HOST}:{client}")

    def _load_security(self) -> None:
        """``self.security``: what clients of this cluster (tests, `curvine local`, the
        demo) pass to their channels: its client token and TLS keys (the daemons'
        certificate); NO_SECURITY for an open cluster over plaintext."""
        cfg = _config.Config()
        try:
            cfg.security = dataclasses.replace(cfg.security, token_file=self.token_file,
                                               **self.tls_keys)
            self.security = Security.load(cfg)
        except (TypeError, ConfigError, auth.TokenError) as e:
            raise ClusterError(f"credentials of {self.base}: {e}") from None

    def _add(self, role: str, index: int, args: list[str], **kw) -> None:
        self._procs[(role, index)] = _Proc(role=role, index=index,
                                           argv=[*self.COMMANDS[role], *args],
                                           log=self.log_path(role, index), **kw)

    # ----------------------------------------------------------------- processes
    def _environ(self, notify: _Notify | None, name: str = "") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "CURVINE_CONF")}
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env)
        if name in self.host_ids:
            env["CURVINE_HOST_ID"] = self.host_ids[name]
        if notify is not None:
            env["NOTIFY_SOCKET"] = notify.env_value
        return env

    def _spawn(self, p: _Proc, notify: _Notify | None) -> None:
        if p.mount:
            # A killed mount daemon leaves a dead mount ("transport endpoint is not
            # connected"); a new daemon cannot mount over it.
            if is_mounted(p.mount) and not fusermount_unmount(p.mount):
                raise ClusterError(f"{p.mount} is still mounted and cannot be unmounted")
        with os.fdopen(os.open(p.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600),
                       "ab") as log:
            log.write(f"{START_MARKER}{p.name} at "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(p.argv)}\n".encode())
            log.flush()
            try:
                proc = subprocess.Popen(p.argv, stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, env=self._environ(notify, p.name),
                                        cwd=self.base, start_new_session=True, close_fds=True)
            except OSError as e:
                raise ClusterError(f"cannot start {p.name} ({p.argv[0]}): {e.strerror}") from None
        p.pid = proc.pid
        p.start_time = proc_start_time(proc.pid)
        self._popen[(p.role, p.index)] = proc
        self._save()

    def _exited(self, p: _Proc) -> int | None:
        """Exit code if ``p`` has exited (None while it runs)."""
        proc = self._popen.get((p.role, p.index))
        if proc is not None and proc.pid == p.pid:
            return proc.poll()
        return None if p.alive() else -1

    def _failure(self, p: _Proc, what: str) -> ClusterError:
        return ClusterError(f"{p.name} {what}; last lines of {p.log}:\n{log_tail(p.log, last_run=True)}")

    def _start_and_wait(self, keys: list[tuple[str, int]], deadline: float,
                        wait_ready: bool = True) -> None:
        notes: dict[tuple[str, int], _Notify] = {}
        try:
            for key in keys:
                notes[key] = _Notify() if wait_ready else None
                self._spawn(self._procs[key], notes[key])
            if wait_ready:
                for key in keys:
                    self._wait_ready(self._procs[key], notes[key], deadline)
        finally:
            for n in notes.values():
                if n is not None:
                    n.close()

    def _wait_ready(self, p: _Proc, note: _Notify, deadline: float) -> None:
        while not note.ready:
            rc = self._exited(p)
            if rc is not None:
                how = (f"exited with code {rc}" if rc >= 0 else
                       f"was killed by {signal.Signals(-rc).name}" if rc < -1 else "exited")
                raise self._failure(p, f"{how} while starting")
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._failure(p, "did not report READY=1 in time"
                                    + (f" (last status: {note.status})" if note.status else ""))
            note.poll(min(left, 0.1))
        if p.mount:
            while not is_mounted(p.mount):
                if self._exited(p) is not None:
                    raise self._failure(p, "exited right after start-up")
                if time.monotonic() > deadline:
                    raise self._failure(p, f"reported ready but {p.mount} is not mounted")
                time.sleep(0.05)
            if not _answers(p.mount, max(1.0, deadline - time.monotonic())):
                raise self._failure(p, f"is mounted on {p.mount} but stat() on it fails or hangs")

    # ----------------------------------------------------------------- fault tests
    def kill(self, role: str, index: int = 0, sig: int = signal.SIGKILL,
             timeout: float = 30.0) -> None:
        """Send ``sig`` to one daemon and wait for it to exit."""
        p = self._proc(role, index)
        if not p.alive():
            raise ClusterError(f"{p.name} is not running")
        self._signal(p, sig)
        if not self._wait_exit([p], time.monotonic() + timeout):
            raise ClusterError(f"{p.name} (pid {p.pid}) did not exit within {timeout:g}s "
                               f"of {signal.Signals(sig).name}")

    def start(self, role: str, index: int = 0, wait_ready: bool = True,
              timeout: float = 60.0) -> None:
        """Start one daemon again with its original argv and environment."""
        p = self._proc(role, index)
        if p.alive():
            raise ClusterError(f"{p.name} is already running (pid {p.pid})")
        self._start_and_wait([(role, index)], time.monotonic() + timeout, wait_ready)

    def restart(self, role: str, index: int = 0, sig: int = signal.SIGKILL) -> None:
        self.kill(role, index, sig)
        self.start(role, index)

    def _signal(self, p: _Proc, sig: int) -> None:
        if not p.alive():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            # Each daemon leads its own session: signal its group, which is only it
            # and anything it spawned.
            if os.getpgid(p.pid) == p.pid:
                os.killpg(p.pid, sig)
            else:
                os.kill(p.pid, sig)

    def _wait_exit(self, procs: list[_Proc], deadline: float) -> bool:
        """Wait until every process in ``procs`` is gone (reaping our children)."""
        while True:
            left = [p for p in procs if self._exited(p) is None and p.alive()]
            if not left:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    # ----------------------------------------------------------------- down
    def down(self, timeout: float = 30.0) -> None:
        """Unmount every mount and stop every process; leaves neither behind.

        Idempotent.  SIGTERM first, SIGKILL for whatever is still alive after
        ``timeout``; raises ``ClusterError`` if a process or mount survives that."""
        with self._exclusive():
            if not self._procs:
                with contextlib.suppress(ClusterError):
                    other = LocalCluster.attach(self.base)
                    self._procs, self.master_addr = other._procs, other.master_addr
            self._down_locked(timeout)

    def _down_locked(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        procs = list(self._procs.values())
        # Also anything still mounted under base/mnt (e.g. from a crashed `up`).
        mnt_root = self._path("mnt") + os.sep
        mounts = sorted({p.mount for p in procs if p.mount} | set(self.mounts)
                        | {m for m in mounted_paths() if m.startswith(mnt_root)})
        by_role = {role: [p for p in procs if p.role == role] for role in ROLES}
        # Mounts first, while master and workers can still serve a final flush.  SIGTERM
        # makes curvine-fuse unmount itself and cut short calls that wait for a master
        # that is down (`fusermount3 -u` would stat the root and wait with them).  The
        # master last: a worker whose heartbeat finds it gone would warn of an outage.
        for group in (by_role["fuse"], by_role["worker"], by_role["master"], by_role["etcd"]):
            for p in group:
                self._signal(p, signal.SIGTERM)
            if not self._wait_exit(group, deadline):
                for p in group:
                    self._signal(p, signal.SIGKILL)
                self._wait_exit(group, time.monotonic() + 10.0)
        strays = self._stop_strays({p.pid for p in procs if p.pid}, deadline)
        for m in mounts:
            fusermount_unmount(m)
        alive = [f"{p.name} (pid {p.pid})" for p in procs if p.alive()]
        alive += [f"daemon pid {pid} (not in the state file)" for pid in strays]
        stuck = [m for m in mounts if is_mounted(m)]
        if alive or stuck:
            raise ClusterError("could not stop everything in " + self.base + ": "
                               + ", ".join(alive + [f"mount {m}" for m in stuck]))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.state_path)

    def _stray_pids(self, known: set[int]) -> list[int]:
        """Daemons of this base that the state does not name: one started in the instant
        an interrupted `up` was stopped, before its pid was recorded.  Every daemon is
        one of COMMANDS with its --conf in BASE/conf/."""
        conf_dir = (self._path("conf") + os.sep).encode()
        modules = {argv[-1].encode() for argv in self.COMMANDS.values()}
        out = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in known or int(name) == os.getpid():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            fields = proc_stat(int(name))
            if not fields:
                continue
            if fields[0] == b"Z":
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(int(name), os.WNOHANG)  # ours: reap it
                continue
            if modules & set(args) and any(a.startswith(conf_dir) for a in args):
                out.append(int(name))
        return out

    def _stop_strays(self, known: set[int], deadline: float) -> list[int]:
        """SIGTERM (then SIGKILL) every stray daemon; returns those still alive."""
        strays = self._stray_pids(known)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not strays:
                return []
            for pid in strays:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            until = max(deadline, time.monotonic() + 2.0) if sig == signal.SIGTERM \
                else time.monotonic() + 5.0
            while strays and time.monotonic() < until:
                time.sleep(0.05)
                strays = [pid for pid in strays if pid in self._stray_pids(known)]
        return strays

    # ----------------------------------------------------------------- context manager
    def __enter__(self) -> "LocalCluster":
        self.up()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.down()


# --------------------------------------------------------------------------- `curvine local`

HELP = "run a whole cluster on this machine"
DESCRIPTION = ("Run master, workers and FUSE mounts on 127.0.0.1, "
               "in the background, all under one directory.")


def register(p: argparse.ArgumentParser) -> None:
    """Add the `curvine local` command group."""
    sub = p.add_subparsers(dest="local_cmd", metavar="{up,down,status}", required=True)

    up = sub.add_parser("up", help="start a cluster and print its mount paths (and, on "
                                   "stderr, the CURVINE_CONF to use with the other commands)")
    up.add_argument("--base", required=True, help="directory for state, data, logs and mounts")
    up.add_argument("--workers", type=argtypes.non_negative, default=2, metavar="N",
                    help="number of workers (default 2)")
    up.add_argument("--mounts", type=argtypes.non_negative, default=2, metavar="M",
                    help="number of FUSE mounts, at BASE/mnt/0 ... (default 2)")
    up.add_argument("--conf", metavar="FILE", help="config file passed to every daemon")
    up.add_argument("--masters", type=argtypes.positive, default=1, metavar="N",
                    help="masters: 1 (default) runs one with its local journal; N > 1 runs a "
                         "group (one leader, standbys) over etcd (docs/operations.md)")
    up.add_argument("--etcd", type=int, choices=(1, 3, 5), default=0, metavar="E",
                    help="etcd members of a group, 1, 3 or 5 (default 1; needs --masters N > 1)")
    up.add_argument("--no-short-circuit-mount", type=int, nargs="+", action="extend",
                    default=[], metavar="K",
                    help="mount K reads local blocks through the worker instead of the file")
    up.add_argument("--worker-capacity", type=argtypes.size, default=0, metavar="SIZE",
                    help="bytes each worker may store, e.g. 2GiB (default: worker.capacity "
                         "of the config, else the free space of its disk)")
    up.add_argument("--replicas", type=argtypes.replicas, default=0, metavar="N",
                    help="copies of each block, 1..8 (default: cluster.replicas, 1)")
    up.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                    help="how long to wait for everything to come up (default 60)")
    up.add_argument("--no-token", dest="token", action="store_false",
                    help="run without a cluster token (default: generate BASE/token and "
                         "require it on every RPC, unless --conf names security.token_file)")
    up.add_argument("--tls", action="store_true",
                    help="mutual TLS on every gRPC connection: make a CA and a certificate "
                         "for 127.0.0.1 in BASE/tls (needs the openssl command; not when "
                         "--conf sets security.tls_ca)")
    up.set_defaults(func=_cmd_up, _parser=up)

    down = sub.add_parser("down", help="unmount and stop everything a cluster started")
    _add_where(down)
    down.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                      help="SIGKILL what is still running after this long (default 30)")
    down.set_defaults(func=_cmd_down, _parser=down)

    st = sub.add_parser("status", help="list the processes of a cluster, their "
                                      "addresses, mounts and metrics URLs")
    _add_where(st)
    st.add_argument("--json", action="store_true", help="print JSON instead of a table")
    st.set_defaults(func=_cmd_status, _parser=st)


def _add_where(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--base", help="the cluster's directory (default: the cluster whose "
                                      "config --conf, CURVINE_CONF or "
                                      f"{_config.DEFAULT_PATH} names)")
    where.add_argument("--conf", metavar="FILE",
                       help="a config `curvine local up` wrote (BASE/conf/*.toml)")


def base_of(args) -> str:
    """The base directory of `local down/status`: --base, else the cluster whose
    config the other commands would read (cli/connect.py: --conf, CURVINE_CONF,
    /etc/curvine/curvine.toml), when `curvine local up` wrote that config."""
    if args.base:
        return args.base
    found = cluster_config.find(args)
    if found.path is None:
        raise ClusterError(f"which cluster? {cluster_config.NOWHERE} names one (use --base "
                           "DIR)")
    conf_dir = os.path.dirname(os.path.abspath(found.path))
    base = os.path.dirname(conf_dir)
    if os.path.basename(conf_dir) == "conf" and (
            os.path.exists(os.path.join(base, STATE_FILE))
            or os.path.abspath(found.path) == os.path.join(base, CLIENT_CONF)):
        return base  # (a cluster since taken down: attach() says there is none)
    where = found.path if found.origin == found.path else f"{found.path} ({found.origin})"
    raise ClusterError(f"{where} is not a config that `curvine local up` wrote (no "
                       f"{os.path.join(base, STATE_FILE)}); use --base DIR")


def _cmd_up(args, parser) -> int:
    bad = [k for k in args.no_short_circuit_mount if not 0 <= k < args.mounts]
    if bad:
        parser.error(f"--no-short-circuit-mount {bad[0]}: there are only {args.mounts} mounts "
                     f"(0..{args.mounts - 1})" if args.mounts else
                     "--no-short-circuit-mount: there are no mounts")
    if args.conf and not os.path.isfile(args.conf):
        raise ClusterError(f"config file {args.conf} not found")
    sc = [i not in args.no_short_circuit_mount for i in range(args.mounts)]
    if args.etcd and args.masters == 1:
        parser.error("--etcd: etcd serves a group of masters; add --masters 3")
    cluster = LocalCluster(args.base, workers=args.workers, mounts=args.mounts,
                           conf=args.conf, short_circuit=sc,
                           masters=args.masters, etcd=args.etcd,
                           worker_capacity=args.worker_capacity, replicas=args.replicas,
                           token=args.token, tls=args.tls)
    for m in cluster.up(timeout=args.timeout):
        print(m)
    # stdout is the mount paths alone; how to reach the cluster goes to stderr
    print(f"curvine local: the other curvine commands reach this cluster with "
          f"--base {shlex.quote(cluster.base)}, or after:\n"
          f"export CURVINE_CONF={shlex.quote(cluster.client_conf)}", file=sys.stderr)
    return 0


def _cmd_down(args, parser) -> int:
    base = os.path.realpath(base_of(args))
    if not os.path.isdir(base):
        raise ClusterError(f"{base} does not exist")
    try:
        cluster = LocalCluster.attach(base)
    except ClusterError:
        if os.path.exists(os.path.join(base, STATE_FILE)):
            raise
        cluster = LocalCluster(base, workers=0, mounts=0)  # still sweeps stray mounts
        cluster.down(timeout=args.timeout)
        print(f"no cluster running in {base}", file=sys.stderr)
        return 0
    cluster.down(timeout=args.timeout)
    return 0


def _cmd_status(args, parser) -> int:
    rows = LocalCluster.attach(base_of(args)).status()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [("ROLE", "INDEX", "PID", "STATE", "ADDRESS", "MOUNT", "METRICS")]
    for r in rows:
        table.append((r["role"], str(r["index"]), str(r["pid"] or "-"),
                      "running" if r["alive"] else "dead", r["address"] or "-",
                      r["mount"] or "-", r["metrics"] or "-"))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0
