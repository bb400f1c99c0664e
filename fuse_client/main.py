"""curvine-fuse: mount the cluster's namespace.

    curvine-fuse MOUNTPOINT [--conf FILE] [--master H:P] [--no-short-circuit] [--debug]

Exit codes: 0 after a clean unmount (SIGTERM, SIGINT or ``fusermount3 -u``),
1 when the mount fails or the loop dies, 2 for a bad command line or config.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import logging
import os
import resource
import signal
import sys

import pyfuse3
import trio

from curvine.common import config as config_mod
from curvine.common import daemon
from curvine.common import log as log_mod
from curvine.common.errors import CurvineError

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
    return p.parse_args(argv)


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
    """Large buffers from mmap'd, reused arenas (MEASURED.md: fresh pages copy at
    ~1 GB/s, reused ones at ~10 GB/s)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
    except (OSError, AttributeError) as e:
        log.debug("mallopt not available: %s", e)


def raise_fd_limit() -> None:
    """Readers keep the files of local blocks open (DESIGN consistency rule 4)."""
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


async def serve(cfg: config_mod.Config, ops: Operations) -> None:
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
            log.info("mounted %s (master %s)", cfg.fuse.mountpoint, cfg.cluster.master_addr)
            if await trio.to_thread.run_sync(ops.start_streams):
                log.info("caching leased names and file attributes (fuse.leases)")
            daemon.notify("READY=1")

        nursery.start_soon(main_loop)
        nursery.start_soon(on_signals)
        nursery.start_soon(ready)


def run(cfg: config_mod.Config) -> int:
    tune_malloc()
    raise_fd_limit()
    ops = Operations(cfg)
    options = {"fsname=curvine", "subtype=curvine", "default_permissions"}
    if cfg.fuse.allow_other:
        options.add("allow_other")
    try:
        pyfuse3.init(ops, cfg.fuse.mountpoint, options)
    except (RuntimeError, OSError) as e:
        log.error("cannot mount %s: %s", cfg.fuse.mountpoint, e)
        ops.close()
        return 1
    code = 0
    try:
        trio.run(serve, cfg, ops)
    except BaseException as e:  # noqa: BLE001 - unmount whatever killed the loop
        if isinstance(e, KeyboardInterrupt):
            log.info("interrupted, unmounting")
        else:
            log.exception("the FUSE loop failed")
            code = 1
    finally:
        ops.stop_streams()
        pyfuse3.close(unmount=True)
        ops.close()
    log.info("unmounted %s", cfg.fuse.mountpoint)
    return code


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args)
    except (config_mod.ConfigError, CurvineError) as e:
        print(f"curvine-fuse: {e}", file=sys.stderr)
        return 2
    log_mod.setup("DEBUG" if cfg.fuse.debug else cfg.log.level, role="curvine-fuse")
    if not os.path.isdir(cfg.fuse.mountpoint):
        log.error("mount point %s is not a directory", cfg.fuse.mountpoint)
        return 2
    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())
