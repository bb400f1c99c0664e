"""In-process services for tests: the real master and real workers on loopback.

- ``InprocMaster``: a ``Master`` and its ``MasterServicer``, served by
  ``rpc.make_server`` on 127.0.0.1 in the roles the real daemon serves
  (master/ports/service.py ``add_to_server``: the client port, the worker port);
  ``stop()`` and ``start()`` again are a master restart on the same ports and state.
- ``InprocWorker``: a ``BlockStore`` and a ``WorkerServicer`` on a gRPC server of their
  own, registered by the worker's own ``MasterLink`` (registration, block report, the
  block token key, heartbeats); ``stop_serving()`` and ``serve()`` take its server away
  and bring it back on the same port (the worker gone, for its clients).
- ``InprocCluster``: one master, its workers (ids 1, 2, ... in order) and a
  ``MasterClient``.

All of it is an open cluster over plaintext (``NO_SECURITY``): tests of tokens and TLS
start real daemons.

Nothing here repeats a rule of the master or of the workers: a test observes their
state, and where it needs to see a call or hold it, ``tap`` wraps one method of the
real object.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from curvine.client.blocks import block_client
from curvine.client.master.master_client import MasterClient
from curvine.common import rpc
from curvine.common.blocks import block_path
from curvine.common.config import Config
from curvine.common.errors import CurvineError
from curvine.common.security import CLIENT, NO_SECURITY, WORKER
from curvine.master.master import Master
from curvine.master.ports.service import MasterServicer
from curvine.master.ports.service import add_to_server as add_master_service
from curvine.worker import server as worker_server
from curvine.worker.blockstore import BlockStore
from curvine.worker.service import WorkerServicer
from curvine.worker.service import add_to_server as add_worker_service

LOOPBACK = "127.0.0.1"
ROLES = {"client": (CLIENT,), "worker": (WORKER,)}  # whose calls each master port takes
RPC_TIMEOUT = 10.0
HEARTBEAT = 0.1  # seconds between a worker's heartbeats
READY_TIMEOUT = 10.0


def wait_until(pred: Callable[[], object], timeout: float = 10.0, what: str = "condition"):
    """``pred()`` once it is true; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def tap(obj, name: str) -> list:
    """Record every call of ``obj.<name>`` (the real method still answers it): the list
    returned gets each call's first argument (the request) once the call returned."""
    calls: list = []
    real = getattr(obj, name)

    def tapped(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(args[0] if args else kwargs)
        return result

    setattr(obj, name, tapped)
    return calls


def master_config(base: Path, block_size: int | None = None) -> Config:
    """A master's configuration with its state in ``base``."""
    cfg = Config()
    cfg.master.meta_dir = str(base / "meta")
    cfg.journal.dir = str(base / "journal")
    cfg.journal.fsync = False  # a test's metadata need not survive a power cut
    cfg.cluster.rpc_timeout = RPC_TIMEOUT
    if block_size is not None:
        cfg.cluster.block_size = block_size
    return cfg


class InprocMaster:
    """A master serving its client port and/or its worker port (``None``: that port is
    not served; 0: any free port; once bound, a restart binds the same one).
    ``on_open(master)`` is called with each new Master before its ports open (for taps
    that must see the first call)."""

    def __init__(self, cfg: Config, client_port: int | None = 0, worker_port: int | None = 0,
                 on_open: Callable[[Master], object] | None = None):
        self.cfg = cfg
        self.ports = {"client": client_port, "worker": worker_port}
        self.on_open = on_open
        self.master: Master | None = None
        self._servers: list = []
        self.start()

    def start(self) -> None:
        self.master = Master(self.cfg, security=NO_SECURITY)
        if self.on_open is not None:
            self.on_open(self.master)
        self.servicer = MasterServicer(self.master, call_threads=4)
        try:
            for role, port in self.ports.items():
                if port is None:
                    continue
                server = rpc.make_server(16, security=NO_SECURITY, accept=ROLES[role])
                add_master_service(self.servicer, server, role)
                self.ports[role] = rpc.bind(server, LOOPBACK, port, NO_SECURITY)
                server.start()
                self._servers.append(server)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """The master goes away: its ports close, calls in flight fail (again: nothing)."""
        if self.master is None:
            return
        for server in self._servers:
            server.stop(None).wait()
        self._servers = []
        self.servicer.close()
        self.master.close()
        self.master = None

    def address(self, role: str = "client") -> str:
        return f"{LOOPBACK}:{self.ports[role]}"


class WorkerStore(BlockStore):
    """The worker's BlockStore, which also lists the blocks it adopted and can refuse
    adoptions with ``refuse_adopt`` (a worker that cannot take the file, e.g. full)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.adopted: list[int] = []
        self.refuse_adopt: CurvineError | None = None

    def adopt(self, block_id: int, path: str, length: int, checksum: int):
        if self.refuse_adopt is not None:
            raise self.refuse_adopt
        result = super().adopt(block_id, path, length, checksum)
        self.adopted.append(block_id)
        return result


_host_lock = threading.Lock()


class _Link(worker_server.MasterLink):
    """The worker's own MasterLink, registering as a worker of ``host``: workers in one
    process would otherwise all report this machine's host id."""

    def __init__(self, *args, host: str):
        super().__init__(*args)
        self.host = host

    def _register(self) -> None:
        with _host_lock:
            real = worker_server.host_id
            worker_server.host_id = lambda: self.host
            try:
                super()._register()
            finally:
                worker_server.host_id = real


class InprocWorker:
    """A worker of ``host`` with one data dir, registered with the master at
    ``master_addr`` (its worker port)."""

    def __init__(self, data_dir: Path, master_addr: str, host: str, capacity: int,
                 block_size: int):
        self.data_dir = str(data_dir)
        self.store = WorkerStore([self.data_dir], capacity=capacity)
        self.servicer = WorkerServicer(self.store, block_size=block_size)
        self.port = 0
        self._server = None
        self.serve()
        cfg = Config()
        cfg.cluster.master_worker_addr = master_addr
        cfg.cluster.rpc_timeout = RPC_TIMEOUT
        cfg.worker.heartbeat_interval = HEARTBEAT
        self._stop = threading.Event()
        self.link = _Link(cfg, self.store, self.servicer, self.address, self._stop,
                          NO_SECURITY, host=host)
        self.link.start()

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def worker_id(self) -> int:
        return self.link.worker_id

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        if not self.link.ready.wait(timeout):
            raise AssertionError(f"worker {self.address} did not register: "
                                 f"{self.link.last_failure}")

    def serve(self, drop_channels: bool = False) -> None:
        """Serve (again, on the same port).  Clients' channels to it are in their
        reconnect backoff from the outage, as a real client's would be (the client waits
        that out: block_client.wait_ready); ``drop_channels`` closes them instead."""
        restart = self.port != 0
        # clients, and the master's deletes (as a worker), call it
        server = rpc.make_server(16, security=NO_SECURITY, accept=(CLIENT, WORKER))
        add_worker_service(self.servicer, server)
        self.port = rpc.bind(server, LOOPBACK, self.port, NO_SECURITY)
        server.start()
        self._server = server
        if restart and drop_channels:
            block_client.close_channels()

    def stop_serving(self) -> None:
        """Its server goes away (calls in flight fail); the worker keeps heartbeating."""
        if self._server is not None:
            self._server.stop(None).wait()
            self._server = None

    def close(self) -> None:
        self._stop.set()
        self.link.close()
        self.stop_serving()
        self.servicer.close()

    # -- what is on its disk ------------------------------------------------------------

    def block_path(self, block_id: int) -> str:
        return block_path(self.data_dir, block_id)

    def block_files(self) -> list[str]:
        """Names of the finalised block files."""
        blocks = os.path.join(self.data_dir, "blocks")
        return sorted(name for _, _, names in os.walk(blocks) for name in names)

    def staging_files(self) -> list[str]:
        return sorted(os.listdir(os.path.join(self.data_dir, "staging")))

    def block_bytes(self, block_id: int) -> bytes:
        """What the worker serves as the block."""
        chunks = self.store.read(block_id)
        try:
            return b"".join(bytes(c) for c in chunks)
        finally:
            chunks.close()


def empty_data_dir(data_dir: Path) -> Path:
    """``data_dir`` without any file, its directories kept: a worker that never ran
    there (a new BlockStore creates 259 directories, slow on a busy disk)."""
    for root, _, names in os.walk(data_dir):
        for name in names:
            os.unlink(os.path.join(root, name))
    return data_dir


class InprocCluster:
    """A master in ``base`` and workers ``(host, capacity, data dir)`` (ids 1, 2, ... in
    order), and a ``MasterClient`` of it (``client``).  A context manager."""

    def __init__(self, base: Path, workers: Iterable[tuple[str, int, Path]], block_size: int):
        self.service = InprocMaster(master_config(Path(base) / "master", block_size))
        self.workers: list[InprocWorker] = []
        self.client: MasterClient | None = None
        try:
            for i, (host, capacity, data_dir) in enumerate(workers, 1):
                w = InprocWorker(data_dir, self.service.address("worker"), host, capacity,
                                 block_size)
                self.workers.append(w)
                w.wait_ready()  # one at a time: worker ids follow the order
                assert w.worker_id == i, (w.worker_id, i)
            self.client = MasterClient(self.service.address(), timeout=RPC_TIMEOUT, wait=2,
                                       security=NO_SECURITY)
        except BaseException:
            self.close()
            raise

    @property
    def master(self) -> Master:
        return self.service.master

    def worker(self, worker_id: int) -> InprocWorker:
        return self.workers[worker_id - 1]

    def block_bytes(self, block_id: int) -> bytes:
        """The block as the (first) worker that holds it serves it."""
        for w in self.workers:
            if block_id in w.store:
                return w.block_bytes(block_id)
        raise KeyError(f"no worker holds block {block_id:016x}")

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        for w in self.workers:
            w.close()
        self.service.stop()
        block_client.close_channels()

    def __enter__(self) -> "InprocCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
