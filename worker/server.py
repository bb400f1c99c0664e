"""``curvine-worker``: serve the block files of this node's data dirs.

Start order: open the block store (removes staging leftovers, scans blocks), serve
gRPC, then register with the master in a background thread (retrying quietly while
the master is down), send the full block report, and only then tell systemd
READY=1.  Reads are served from the moment the gRPC server is up.  A heartbeat every
``worker.heartbeat_interval`` carries capacity and usage (and the outcome of block
copies); the master answers with blocks to delete, blocks to copy from other workers
(re-replication, worker/replication.py), or asks the worker to register again.  With
``worker.domain_socket`` set, local clients also get block descriptors over that Unix
socket (worker/domain_socket.py; one that cannot be served is an ERROR line, and the
worker serves gRPC alone).  SIGTERM stops cleanly and removes the socket file.

Exit codes: 0 clean shutdown, 1 cannot start (data dir, port), 2 bad config or flags,
or a data dir owned by another user (common/private_files.py).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import secrets
import socket
import threading
import time
import uuid

from curvine.common import auth, block_tokens
from curvine.common import config as config_mod
from curvine.common import daemon, private_files, stacks
from curvine.common import log as log_mod
from curvine.common import metrics
from curvine.common.errors import ConfigError, CurvineError, ErrorKind
from curvine.common.ids import host_id
from curvine.common.rpc import RpcClient, bind, make_server
from curvine.common.security import CLIENT, WORKER, Security
from curvine.common.master_group import MasterGroup
from curvine.proto import common_pb2, master_pb2, master_pb2_grpc

from curvine.common.blocks import MAX_BLOCK_ID

from .blockstore import BlockStore
from .domain_socket import IDLE_TIMEOUT, DomainSocketServer
from .data_port import DataPortServer
from . import metrics as worker_metrics
from .replication import BlockCopier
from .service import WorkerServicer, add_to_server

log = logging.getLogger(__name__)

UUID_FILE = "worker.uuid"
SECRET_FILE = "worker.secret"  # binds the uuid at the master (RegisterWorkerRequest.secret)
STAGING_SWEEP_INTERVAL = 30.0  # seconds between sweeps of abandoned client staging files
_MASTER_DOWN = (ErrorKind.UNAVAILABLE, ErrorKind.TIMEOUT)


def _size_arg(value: str) -> int:
    try:
        return config_mod.parse_size(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="curvine-worker",
                                description="Serve this node's cache blocks to curvine clients.")
    p.add_argument("--conf",
                   help="config file (default $CURVINE_CONF or /etc/curvine/curvine.toml)")
    p.add_argument("--master", metavar="H:P", help="master gRPC address (cluster.master_addr)")
    p.add_argument("--master-worker", metavar="H:P",
                   help="where workers reach the master (cluster.master_worker_addr; "
                        "default: the master's host, port master.worker_port)")
    p.add_argument("--host", help="address to listen on and to advertise (worker.host)")
    p.add_argument("--port", type=int, help="gRPC port, 0 = any free port (worker.port)")
    p.add_argument("--data-dir", action="append", dest="data_dirs", metavar="DIR",
                   help="data dir; repeat for several (worker.data_dirs)")
    p.add_argument("--capacity", type=_size_arg, metavar="SIZE",
                   help="bytes this worker may hold, e.g. 500GiB; 0 = free disk space")
    return p.parse_args(argv)


def load_config(args: argparse.Namespace) -> config_mod.Config:
    cfg = config_mod.load(args.conf)
    if args.master is not None:
        cfg.cluster.master_addr = args.master
    if args.master_worker is not None:
        cfg.cluster.master_worker_addr = args.master_worker
    if args.host is not None:
        cfg.worker.host = args.host
    if args.port is not None:
        cfg.worker.port = args.port
    if args.data_dirs:
        cfg.worker.data_dirs = args.data_dirs
    if args.capacity is not None:
        cfg.worker.capacity = config_mod.Size(args.capacity)
    config_mod.validate(cfg)
    return cfg


def worker_uuid(data_dir: str) -> str:
    """The worker's stable identity, created once in its first data dir."""
    path = os.path.join(data_dir, UUID_FILE)
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except FileNotFoundError:
        value = str(uuid.uuid4())
        private_files.write_file(path, (value + "\n").encode("ascii"))
        log.info("new worker identity %s in %s", value, path)
        return value
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise CurvineError(ErrorKind.INVALID, f"{path}: not a UUID; remove the file to give "
                                              "this worker a new identity") from None


def worker_secret(data_dir: str) -> bytes:
    """The worker's secret (32 random bytes, mode 0600 beside its uuid, made once): the
    master binds the uuid to the first secret it registers with and refuses any other,
    so another holder of the worker credential cannot take over this worker's identity.
    Losing the file means the uuid must go too (remove worker.uuid as well)."""
    path = os.path.join(data_dir, SECRET_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read(129)
    except FileNotFoundError:
        value = secrets.token_bytes(32)
        private_files.write_file(path, (value.hex() + "\n").encode("ascii"))
        return value
    try:
        value = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        value = b""
    if len(value) != 32:
        raise CurvineError(ErrorKind.INVALID, f"{path}: not a worker secret (64 hex digits); "
                                              f"remove it and {UUID_FILE} to give this "
                                              "worker a new identity")
    return value


def load_block_key(data_dir: str) -> bytes:
    """The block token key this worker was last given (b"": none yet, or unusable)."""
    path = os.path.join(data_dir, block_tokens.BLOCK_KEY_FILE)
    try:
        return block_tokens.read_key(path) or b""
    except (OSError, ValueError) as e:
        log.warning("ignoring the saved block token key (the master sends it again): %s", e)
        return b""


WORKER_ID_FILE = "worker_id"  # beside the key: write tokens name this id (block_tokens)


def load_worker_id(data_dir: str) -> int:
    """The id the master last gave this worker (0: none yet)."""
    try:
        with open(os.path.join(data_dir, WORKER_ID_FILE), "rb") as f:
            return int(f.read(32).strip() or b"0")
    except (OSError, ValueError):
        return 0


def save_worker_id(data_dir: str, worker_id: int) -> None:
    try:
        private_files.write_file(os.path.join(data_dir, WORKER_ID_FILE), b"%d\n" % worker_id)
    except OSError as e:
        log.warning("cannot save the worker id in %s: %s", data_dir, e)


def save_block_key(data_dir: str, key: bytes) -> None:
    try:
        block_tokens.write_key(os.path.join(data_dir, block_tokens.BLOCK_KEY_FILE), key)
    except OSError as e:
        log.warning("cannot save the block token key in %s: %s", data_dir, e)


def stream_limit(rpc_threads: int) -> int:
    """Block streams the worker serves at once: a quarter of its threads (at least
    two) stay free for unary calls, refusals and the master's deletes."""
    return max(1, rpc_threads - max(2, rpc_threads // 4))


def advertised_address(host: str, port: int) -> str:
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.gethostname()  # listening everywhere: clients need a real name
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


class MasterLink:
    """Registration, block reports and heartbeats, in one background thread.

    Never gives up while the master is down: one WARNING when it goes away, one INFO
    when it is back.  ``ready`` is set after the first registration and block report.
    """

    def __init__(self, cfg: config_mod.Config, store: BlockStore, servicer: WorkerServicer,
                 address: str, stop: threading.Event, security: Security,
                 data_address: str = ""):
        self.cfg = cfg
        self.data_address = data_address  # the bulk read port, "" = none
        self.security = security  # this worker's; its calls to the master go as_worker()
        self.store = store
        self.servicer = servicer
        self.address = address
        self.stop = stop
        self.ready = threading.Event()
        self.worker_id = 0
        self.uuid = worker_uuid(store.data_dirs[0])
        self.secret = worker_secret(store.data_dirs[0])
        self.registration = b""  # names the live registration in heartbeats and reports
        # the masters' worker ports, named by their gRPC addresses as standbys name the
        # leader (common/master_group.py); one master: a group of one
        self.masters = MasterGroup(config_mod.master_worker_addrs(cfg),
                                   config_mod.master_addrs(cfg))
        self.interval = max(float(cfg.worker.heartbeat_interval), 0.01)
        self.rpc = self._make_rpc()
        # copies of other workers' blocks the master asks for (re-replication)
        self.copier = BlockCopier(store, security, timeout=float(cfg.cluster.rpc_timeout),
                                  block_key=lambda: servicer.block_key)
        self._registered = False
        self._master_down = False
        self._last_error = ""
        self.last_contact = 0.0  # monotonic time the master last accepted a call (health)
        self.last_failure = ""  # why the last call failed, until one succeeds
        self._thread = threading.Thread(target=self._run, name="master-link", daemon=True)

    @property
    def master_addr(self) -> str:
        """The worker port of the master this link calls now."""
        return self.masters.current

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self.rpc.close()  # cancels an RPC in flight
        self._thread.join(timeout)
        self.copier.close()

    def _new_channel(self) -> None:
        # A gRPC channel that failed to connect backs off for up to two minutes before
        # trying again; a fresh channel notices a restarted master within one interval.
        old = self.rpc
        self.rpc = self._make_rpc()
        old.close()
        if self.stop.is_set():
            self.rpc.close()

    def _make_rpc(self) -> RpcClient:
        return RpcClient(self.master_addr, master_pb2_grpc.MasterStub,
                         security=self.security.as_worker(),
                         timeout=float(self.cfg.cluster.rpc_timeout))

    def _call(self, method: str, request):
        # wait=0: no retries inside RpcClient; this loop retries at its own pace.
        return self.rpc.call(method, request, wait=0)

    def _run(self) -> None:
        while not self.stop.is_set():
            at_once = False
            try:
                if not self._registered:
                    self._register()
                else:
                    self._heartbeat()
                self.masters.answered()
                if self._master_down:
                    log.info("master %s is reachable again", self.master_addr)
                self._master_down = False
                self._last_error = ""
                self.last_contact = time.monotonic()
                self.last_failure = ""
            except CurvineError as e:
                if self.stop.is_set():
                    break
                self.last_failure = str(e)
                if e.kind == ErrorKind.NOT_LEADER:
                    at_once = self._follow(e)
                elif e.kind in _MASTER_DOWN:
                    if not self._master_down:
                        log.warning("master %s unavailable (%s); retrying every %.1fs%s",
                                    self.master_addr, e, self.interval,
                                    " and trying the other masters" if len(self.masters) > 1
                                    else "")
                    self._master_down = True
                    at_once = self._follow(e)
                else:
                    if str(e) != self._last_error:
                        log.error("master %s refused %s: %s", self.master_addr,
                                  "heartbeat" if self._registered else "registration", e)
                        self._last_error = str(e)
                    # Whatever the master disliked (e.g. a worker id it no longer
                    # knows), registering again is safe: it is idempotent by uuid.
                    self._registered = False
            except Exception:  # noqa: BLE001 - the thread must survive anything
                log.exception("unexpected error talking to the master")
            if self._registered and not self.stop.is_set() and not self.ready.is_set():
                self._became_ready()
            if not at_once:
                self.stop.wait(self.interval)

    def _follow(self, err: CurvineError) -> bool:
        """A master failed a call (down, or a standby): call the leader it named, or
        the next master, on a fresh channel, registering there (a new leader knows this
        worker only from a registration and block report, as after a restart).  True:
        call again at once."""
        before = self.master_addr
        at_once = self.masters.after_failure(err)
        if self.master_addr != before:
            log.info("master %s %s; now calling %s", before,
                     "is a standby" if err.kind == ErrorKind.NOT_LEADER else "is unavailable",
                     self.master_addr)
            self._registered = False
        self._new_channel()
        return at_once

    def _register(self) -> None:
        # the master starts its account of this worker afresh from this usage
        capacity, used, _, _, _, _ = self.store.take_changes()
        info = common_pb2.WorkerInfo(
            worker_id=self.worker_id, uuid=self.uuid, host_id=host_id(), address=self.address, data_address=self.data_address,
            data_dirs=self.store.data_dirs, capacity=capacity, used=used, volumes=self._volumes())
        reply = self._call("RegisterWorker", master_pb2.RegisterWorkerRequest(
            worker=info, secret=self.secret))
        self.registration = reply.registration
        if reply.worker_id != self.worker_id:
            log.info("registered with master %s as worker %d", self.master_addr,
                     reply.worker_id)
        if reply.worker_id != self.servicer.worker_id:
            # kept on disk like the key: after a restart, writes with the tokens clients
            # hold (which name this id) are taken before the master answers
            save_worker_id(self.store.data_dirs[0], reply.worker_id)
        self.worker_id = self.servicer.worker_id = reply.worker_id
        if reply.block_size:
            self.servicer.block_size = reply.block_size
        if reply.block_key and reply.block_key != self.servicer.block_key:
            # kept on disk: after a restart the worker serves before the master answers
            save_block_key(self.store.data_dirs[0], reply.block_key)
            self.servicer.block_key = reply.block_key  # block calls are served from now on
        self._block_report()
        self._registered = True

    def _volumes(self) -> list[common_pb2.Volume]:
        """The data dirs' file systems, named by host and device, with their free space:
        workers of one host whose data dirs share a disk are counted once by the master."""
        try:
            volumes = self.store.volumes()
        except OSError as e:
            log.warning("cannot stat data dirs: %s", e)
            return []
        host = host_id()
        return [common_pb2.Volume(fs_id=f"{host}:{os.major(dev)}:{os.minor(dev)}", free=free)
                for dev, free in sorted(volumes.items())]

    def _block_report(self) -> None:
        blocks = self.store.report_sizes()
        req = master_pb2.BlockReportRequest(
            worker_id=self.worker_id, registration=self.registration,
            block_ids=[b for b, _, _ in blocks],
            block_mtimes_ns=[m for _, m, _ in blocks], block_lengths=[n for _, _, n in blocks])
        reply = self._call("BlockReport", req)
        log.info("block report: %d blocks, master asked to delete %d",
                 len(blocks), len(reply.delete_block_ids))
        self._delete(reply.delete_block_ids)

    def _heartbeat(self) -> None:
        capacity, used, num_blocks, added, removed, lost = self.store.take_changes()
        copied, failed = self.copier.take_outcomes()
        bad = self.store.take_bad()
        try:
            reply = self._call("WorkerHeartbeat", master_pb2.HeartbeatRequest(
                worker_id=self.worker_id, registration=self.registration,
                capacity=capacity, used=used, num_blocks=num_blocks,
                replicated_block_ids=copied, failed_block_ids=failed,
                added_block_ids=added, removed_block_ids=removed, changes_lost=lost,
                volumes=self._volumes(), bad_block_ids=bad))
        except BaseException:
            self.copier.give_back(copied, failed)
            self.store.give_back_changes(added, removed, lost)
            self.store.give_back_bad(bad)
            raise
        self._delete(reply.delete_block_ids)
        if reply.replicate:
            self.copier.submit(reply.replicate)
        if reply.verify:
            self.copier.verify(reply.verify)
        if reply.reregister:
            log.info("master asks worker %d to register again", self.worker_id)
            self._registered = False
            self._register()

    def _delete(self, ids) -> None:
        valid = [b for b in ids if 1 <= b <= MAX_BLOCK_ID]
        if len(valid) != len(ids):
            log.warning("master listed %d invalid block ids for deletion; ignored",
                        len(ids) - len(valid))
        if valid:
            removed = self.store.delete(valid)
            log.debug("deleted %d blocks (%d listed by the master)", removed, len(valid))

    def _became_ready(self) -> None:
        self.ready.set()
        log.info("worker serving on %s (worker id %d, %d blocks)", self.address,
                 self.worker_id, len(self.store))
        daemon.notify("READY=1")


def health(link: MasterLink, sockets: DomainSocketServer | None = None) -> str | None:
    """Healthy while the master has accepted this worker's registration or heartbeat
    within master.worker_lost_after (after that the master counts it lost), and the
    domain socket, if it was started, still serves (its file was not removed)."""
    if sockets is not None and sockets.serving is not None:
        return sockets.serving
    master = link.master_addr
    if not link.ready.is_set():
        return f"not registered with master {master} yet" + (
            f" ({link.last_failure})" if link.last_failure else "")
    lost_after = float(link.cfg.master.worker_lost_after)
    silent = time.monotonic() - link.last_contact
    if silent > lost_after:
        return (f"no heartbeat accepted by master {master} for {silent:.1f}s "
                f"(master.worker_lost_after {lost_after:g}s)"
                + (f": {link.last_failure}" if link.last_failure else ""))
    return None


def tune_malloc() -> None:
    """glibc: serve 1 MiB message buffers from the reused heap, not fresh mmaps.

    Fresh pages cost a fault and zeroing each (docs/measurements.md: ~1 GB/s against ~10 GB/s
    for reused memory); on loopback this lifts block writes by ~30%."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass  # not glibc: nothing to tune


def start_domain_socket(cfg: config_mod.Config, servicer: WorkerServicer,
                        link: MasterLink) -> DomainSocketServer | None:
    """The short-circuit socket (worker.domain_socket), serving; None when off or when
    it cannot be served (one ERROR: local clients then use the gRPC data path, which
    is slower but complete, so the worker still starts)."""
    path = cfg.worker.domain_socket
    if not path:
        return None
    sockets = DomainSocketServer(
        path, servicer, identity=lambda: (link.uuid, link.worker_id),
        idle_timeout=float(cfg.worker.stream_idle_timeout) or IDLE_TIMEOUT)
    try:
        sockets.start()
    except CurvineError as e:
        log.error("%s; serving without it (local clients read and write over gRPC)", e)
        return None
    return sockets


def start_data_port(wc, servicer: WorkerServicer, security: Security):
    """The bulk read port (worker/data_port.py), None when off (worker.data_port 0, or
    TLS on: it would bypass TLS), False when it cannot be bound (an error logged)."""
    if not wc.data_port:
        return None
    if security.material is not None:
        log.info("bulk read port off: TLS is on (remote readers use gRPC)")
        return None
    try:
        server = DataPortServer(servicer, wc.host, wc.data_port)
    except OSError as e:
        log.error("worker.data_port: cannot listen on %s:%d: %s; remote readers use gRPC",
                  wc.host, wc.data_port, e.strerror)
        return None
    server.start()
    return server


def run(cfg: config_mod.Config, stop: threading.Event, security: Security) -> int:
    wc = cfg.worker
    try:
        store = BlockStore(wc.data_dirs, capacity=int(wc.capacity))
    except private_files.NotOwnedError as e:
        log.error("%s", e)  # another user's data dir: restarting will not help
        return 2
    except (CurvineError, OSError) as e:
        log.error("cannot open data dirs: %s", e)
        return 1
    servicer = WorkerServicer(store, block_size=int(cfg.cluster.block_size),
                              block_key=load_block_key(store.data_dirs[0]),
                              worker_id=load_worker_id(store.data_dirs[0]),
                              stream_idle_timeout=float(wc.stream_idle_timeout),
                              max_streams=stream_limit(wc.rpc_threads))
    # clients (mounts, the client library) and the other daemons (the master's deletes,
    # other workers' re-replication copies) call the worker
    server = make_server(wc.rpc_threads, security=security, accept=(CLIENT, WORKER))
    add_to_server(servicer, server)
    try:
        port = bind(server, wc.host, wc.port, security)
    except CurvineError as e:
        log.error("%s", e)
        return 1
    server.start()
    address = advertised_address(wc.host, port)
    data_port = start_data_port(wc, servicer, security)
    data_address = advertised_address(wc.host, data_port.port) if data_port else ""
    log.info("worker listening on %s:%d%s, registering with master %s", wc.host, port,
             f" (bulk reads on {data_port.port})" if data_port else "",
             " or ".join(config_mod.master_worker_addrs(cfg)))
    try:
        link = MasterLink(cfg, store, servicer, address, stop, security, data_address)
    except (CurvineError, OSError) as e:
        log.error("cannot start: %s", e)
        server.stop(None)
        if data_port:
            data_port.close()
        return 1
    link.start()
    sockets = start_domain_socket(cfg, servicer, link)
    http = metrics.serve("worker", wc.host, wc.http_port, "worker.http_port",
                         worker_metrics.registry(store, link, sockets), lambda: health(link, sockets))
    try:
        next_sweep = time.monotonic() + STAGING_SWEEP_INTERVAL
        while not stop.wait(1.0):
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + STAGING_SWEEP_INTERVAL
                try:
                    store.sweep_client_staging()
                except Exception:  # noqa: BLE001 - the worker must keep serving
                    log.exception("sweeping client staging files failed")
    finally:
        daemon.notify("STOPPING=1")
        if http is not None:
            http.close()
        if sockets is not None:
            sockets.close()  # removes the socket file; open writes are aborted
        if data_port:
            data_port.close()
        link.close()
        server.stop(grace=5).wait()
        servicer.close()
    log.info("worker stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args)
        security = Security.load(cfg, role="worker")  # the tokens are never logged
        security.check_can_serve()  # before the data dirs are touched
    except (ConfigError, auth.TokenError) as e:
        log_mod.setup("INFO", "curvine-worker")
        log.error("%s", e)
        return 2
    log_mod.setup(cfg.log.level, "curvine-worker")
    tune_malloc()
    stop = daemon.stop_event()
    stacks.install_thread_dump()
    return run(cfg, stop, security)


if __name__ == "__main__":
    raise SystemExit(main())
