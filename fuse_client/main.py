"""curvine-fuse: mount the cluster's namespace.

    curvine-fuse MOUNTPOINT [--conf FILE] [--master H:P] [--no-short-circuit] [--debug]

Exit codes: 0 after a clean unmount (SIGTERM, SIGINT or ``fusermount3 -u``),
1 when the mount fails or the loop dies, 2 for a bad command line or config.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import importlib.metadata
import logging
import os
import platform
import resource
import signal
import sys
import threading
import time

import pyfuse3
import trio

from curvine.client.blocks import block_client
from curvine.client.master.master_client import MasterClient
from curvine.common import auth, master_group
from curvine.common import config as config_mod
from curvine.common import daemon
from curvine.common import log as log_mod
from curvine.common import metrics, stacks
from curvine.common.errors import ConfigError, CurvineError
from curvine.common.ids import ROOT_INO
from curvine.common.mounts import mount_table
from curvine.common.security import Security
from curvine.proto import master_pb2, master_pb2_grpc

from . import features
from . import metrics as fuse_metrics
from .operations import Operations

log = logging.getLogger("curvine.fuse_client")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="curvine-fuse", description="Mount a curvine cluster.")
    p.add_argument("mountpoint")
    p.add_argument("--conf", help="config file (default $CURVINE_CONF or "
                                  f"{config_mod.DEFAULT_PATH})")
    p.add_argument("--master", help="master address host:port (overrides cluster.master_addr)")
    p.add_argument("--no-short-circuit", action="store_true",
                   help="read local blocks through the worker too")
    p.add_argument("--debug", action="store_true", help="log at DEBUG")
    p.add_argument("--version", action=_PrintVersion, nargs=0,
                   help="print the versions of curvine-py and pyfuse3, what the "
                        "pyfuse3 build lacks, and exit")
    return p.parse_args(argv)


class _PrintVersion(argparse.Action):
    """--version: version_text() as it is (argparse's own action rewraps it)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit(0)


def version_text() -> str:
    """curvine-py's and pyfuse3's versions and the start-up warning, if any."""
    try:
        own = importlib.metadata.version("curvine-py")
    except importlib.metadata.PackageNotFoundError:
        own = "?"
    found = features.detect()
    lines = [f"curvine-fuse {own} (curvine-py; Python {platform.python_version()})",
             found.summary()]
    warning = found.warning()
    if warning:
        lines.append(f"WARNING: {warning}")
    return "\n".join(lines)


def load_config(args: argparse.Namespace) -> config_mod.Config:
    cfg = config_mod.load(args.conf)
    if args.master:
        cfg.cluster.master_addr = args.master
    if args.no_short_circuit:
        cfg.client.short_circuit = False
    if args.debug:
        cfg.fuse.debug = True
    cfg.fuse.mountpoint = os.path.abspath(args.mountpoint)
    return cfg


def tune_malloc() -> None:
    """Large buffers from mmap'd, reused arenas (docs/measurements.md: fresh pages
    copy at ~1 GB/s, reused ones at ~10 GB/s)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
    except (OSError, AttributeError) as e:
        log.debug("mallopt not available: %s", e)


def raise_fd_limit() -> None:
    """Readers keep the files of local blocks open (consistency rule 4, docs/consistency.md)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as e:
        log.debug("cannot raise the open file limit: %s", e)


def set_readahead(mountpoint: str, kb: int) -> None:
    """Raise the mount's readahead so buffered reads arrive as 1 MiB requests.
    Best effort: needs root (or a writable sysfs)."""
    try:
        dev = os.stat(mountpoint).st_dev
        path = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
        with open(path, "w") as f:
            f.write(str(kb))
        log.debug("%s = %d", path, kb)
    except OSError as e:
        log.info("cannot set the mount's readahead to %d KiB: %s", kb, e)


PROBE_TIMEOUT = 2.0  # deadline of the master probe of one /healthz


def is_mounted(mountpoint: str) -> bool:
    """Whether ``mountpoint`` is a FUSE mount, from the mount table (a stat() of the
    mount from this process could wait on its own loop)."""
    return any(m.point == mountpoint and m.fstype.startswith("fuse")
               for m in mount_table())


class FuseHealth:
    """/healthz of a mount: mounted, and the master not unreachable for longer than
    cluster.master_wait (how long a file-system call waits for it before EIO).

    Each /healthz probes the master (GetAttr of the root, PROBE_TIMEOUT deadline, no
    retry); the outage is counted from the first failed probe after a good one, so an
    outage shorter than the wait, which calls ride out, leaves the mount healthy."""

    def __init__(self, cfg: config_mod.Config, security: Security):
        self.mountpoint = cfg.fuse.mountpoint
        self.master_addr = " or ".join(config_mod.master_addrs(cfg))
        self.wait = float(cfg.cluster.master_wait)
        self.ready = threading.Event()  # mounted and serving (set once READY=1 is sent)
        self._down_since: float | None = None
        self._lock = threading.Lock()
        # any member of a group answers it (a read)
        self._probe = master_group.master_rpc(
            config_mod.master_addrs(cfg), master_pb2_grpc.MasterStub, security=security,
            timeout=min(PROBE_TIMEOUT, float(cfg.cluster.rpc_timeout)), wait=0)

    def __call__(self) -> str | None:
        if not self.ready.is_set():
            return "not mounted yet (or unmounting)"
        if not is_mounted(self.mountpoint):
            return f"{self.mountpoint} is not mounted"
        try:
            self._probe.call("GetAttr", master_pb2.GetAttrRequest(ino=ROOT_INO), wait=0)
        except CurvineError as e:
            now = time.monotonic()
            with self._lock:
                if self._down_since is None:
                    self._down_since = now
                down = now - self._down_since
            if down < self.wait:
                return None  # calls still wait for the master: they may yet succeed
            return (f"master {self.master_addr} unreachable for {down:.1f}s, beyond "
                    f"cluster.master_wait {self.wait:g}s (calls fail with EIO): {e}")
        with self._lock:
            self._down_since = None
        return None

    def close(self) -> None:
        self._probe.close()


FUSE_CONF = "/etc/fuse.conf"


def mount_options(cfg: config_mod.Config) -> set[str]:
    """Options of the mount.  ``default_permissions`` is always on: the kernel then
    checks mode bits and ownership (which the master stores from each request's
    uid/gid) before a call reaches Operations, which does no checks of its own.
    ``allow_other`` (fuse.allow_other) lets users other than the mounting one in at
    all; without it the kernel refuses them every call with EACCES."""
    options = {"fsname=curvine", "subtype=curvine", "default_permissions"}
    if cfg.fuse.allow_other:
        options.add("allow_other")
    return options


def allow_other_hint(cfg: config_mod.Config) -> str:
    """Why a non-root mount with fuse.allow_other fails, if that is the likely cause."""
    if not cfg.fuse.allow_other or os.geteuid() == 0:
        return ""
    try:
        with open(FUSE_CONF, encoding="utf-8", errors="replace") as f:
            if any(line.strip() == "user_allow_other" for line in f):
                return ""
    except OSError:
        pass
    return (f" (fuse.allow_other = true needs 'user_allow_other' in {FUSE_CONF} "
            "when not mounting as root)")


async def serve(cfg: config_mod.Config, ops: Operations,
                health: FuseHealth | None = None) -> None:
    async with trio.open_nursery() as nursery:
        async def main_loop():
            try:
                await pyfuse3.main()
            finally:
                nursery.cancel_scope.cancel()

        async def on_signals():
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log.info("received %s, unmounting", signal.Signals(signum).name)
                    if health is not None:
                        health.ready.clear()
                    # Calls waiting for a master that is down would hold the unmount
                    # for up to cluster.master_wait: cut them short.
                    ops.stop_streams()
                    ops.master.close()
                    pyfuse3.terminate()
                    return

        async def ready():
            # The first stat waits for the kernel's INIT handshake, which the loop
            # answers: only then is the mount serving.
            if cfg.fuse.readahead_kb:
                await trio.to_thread.run_sync(set_readahead, cfg.fuse.mountpoint,
                                              cfg.fuse.readahead_kb)
            else:
                await trio.to_thread.run_sync(os.stat, cfg.fuse.mountpoint)
            log.info("mounted %s (master %s)", cfg.fuse.mountpoint,
                     " or ".join(config_mod.master_addrs(cfg)))
            if await trio.to_thread.run_sync(ops.start_streams):
                log.info("caching leased names and file attributes (fuse.leases)")
            nursery.start_soon(ops.run_call_port)
            if health is not None:
                health.ready.set()
            daemon.notify("READY=1")

        nursery.start_soon(main_loop)
        nursery.start_soon(on_signals)
        nursery.start_soon(stacks.dump_on_signal)
        nursery.start_soon(ready)


def run(cfg: config_mod.Config, security: Security) -> int:
    tune_malloc()
    raise_fd_limit()
    # Short-circuit I/O of this mount's readers and writers goes only to the data dirs
    # its own configuration names (client.short_circuit_dirs, else worker.data_dirs),
    # never to paths a worker reports over the network.
    dirs = block_client.set_local_dirs(block_client.LocalDirs.from_config(cfg))
    if cfg.client.short_circuit:
        log.info("short-circuit data dirs: %s", ", ".join(dirs.dirs) or "(none)")
    master = MasterClient(config_mod.master_addrs(cfg), timeout=cfg.cluster.rpc_timeout,
                          wait=cfg.cluster.master_wait, security=security,
                          read_from=config_mod.read_members(cfg))
    ops = Operations(cfg, master)  # closes the master client with itself
    try:
        pyfuse3.init(ops, cfg.fuse.mountpoint, mount_options(cfg))
    except (RuntimeError, OSError) as e:
        log.error("cannot mount %s: %s%s", cfg.fuse.mountpoint, e, allow_other_hint(cfg))
        ops.close()
        return 1
    # The FUSE client has no host of its own in the config: it listens where this
    # node's worker does (worker.host; 127.0.0.1 by default).
    health = FuseHealth(cfg, security)
    http = metrics.serve("fuse", cfg.worker.host, cfg.fuse.http_port, "fuse.http_port",
                         fuse_metrics.registry(), health)
    code = 0
    try:
        trio.run(serve, cfg, ops, health)
    except BaseException as e:  # noqa: BLE001 - unmount whatever killed the loop
        if isinstance(e, KeyboardInterrupt):
            log.info("interrupted, unmounting")
        else:
            log.exception("the FUSE loop failed")
            code = 1
    finally:
        health.ready.clear()
        if http is not None:
            http.close()
        health.close()
        ops.stop_streams()
        pyfuse3.close(unmount=True)
        ops.close()
    log.info("unmounted %s", cfg.fuse.mountpoint)
    return code


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args)
        security = Security.load(cfg)  # every channel sends the cluster token
    except (ConfigError, CurvineError, auth.TokenError) as e:
        print(f"curvine-fuse: {e}", file=sys.stderr)
        return 2
    log_mod.setup("DEBUG" if cfg.fuse.debug else cfg.log.level, role="curvine-fuse")
    stacks.install_thread_dump()  # until the loop runs (it then adds its tasks' stacks)
    warning = features.detect().warning()
    if warning:
        log.warning("%s", warning)  # the mount works; `curvine doctor` says the same
    if not os.path.isdir(cfg.fuse.mountpoint):
        log.error("mount point %s is not a directory", cfg.fuse.mountpoint)
        return 2
    return run(cfg, security)


if __name__ == "__main__":
    sys.exit(main())
