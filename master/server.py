"""`curvine-master`: serve the namespace over gRPC until SIGTERM.

Exit codes: 0 clean shutdown, 1 runtime failure, 2 bad configuration or a journal /
metadata that cannot be recovered (the message names the file and offset).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import sys
import threading

from curvine.common import config as config_mod
from curvine.common import argtypes, auth, daemon, log as log_mod, metrics as metrics_mod, rpc, stacks, tls
from curvine.common.errors import ConfigError, CurvineError
from curvine.common.security import CLIENT, MASTER, WORKER, Security
from curvine.journal import JournalError

from .group import etcd_access
from .master import Master
from .member import CurrentMaster, Member, member_address
from .ports import metrics as master_metrics
from .ports.call_port_server import CallPort
from .ports.service import (HEAVY_READS, MASTER_METHODS, READ_CALLS, MasterServicer,
                            add_to_server, method_path)

log = logging.getLogger("curvine.master")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="curvine-master", description="curvine metadata master")
    p.add_argument("--conf", help="TOML config file (default: $CURVINE_CONF or /etc/curvine/curvine.toml)")
    p.add_argument("--host", help="address to bind (config master.host)")
    p.add_argument("--port", type=int, help="gRPC port (config master.port)")
    p.add_argument("--advertise", metavar="HOST:PORT", type=argtypes.host_port,
                   help="this master's gRPC address as clients know it, in a group "
                        "(config master.advertise_addr; default host:port)")
    p.add_argument("--worker-port", type=int,
                   help="gRPC port for workers' calls (config master.worker_port)")
    p.add_argument("--meta-dir", help="LMDB and checkpoints (config master.meta_dir)")
    p.add_argument("--journal-dir", help="write-ahead journal, on a durable volume (config journal.dir)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = config_mod.load(args.conf)
        security = Security.load(cfg, role="master")  # the tokens are never logged
        security.check_can_serve()  # before the journal or LMDB is touched
        if cfg.master.etcd_endpoints:  # the etcd TLS files and password, read at start
            etcd_access.load(cfg.master)
    except (ConfigError, auth.TokenError) as e:
        print(f"curvine-master: {e}", file=sys.stderr)
        return 2
    if args.host:
        cfg.master.host = args.host
    if args.port is not None:
        cfg.master.port = args.port
    if args.advertise:
        cfg.master.advertise_addr = args.advertise
    if args.worker_port is not None:
        cfg.master.worker_port = args.worker_port
    if args.meta_dir:
        cfg.master.meta_dir = args.meta_dir
    if args.journal_dir:
        cfg.journal.dir = args.journal_dir
    log_mod.setup(cfg.log.level, "master")
    stop = daemon.stop_event()
    stacks.install_thread_dump()
    # The call port's loop thread answers every mount: a thread doing CPU work (a
    # heavy read, a listing) holds the GIL for up to the switch interval each time the
    # loop wants it (Python's 5 ms default: ~10 ms per call under such load, 4 ms with 1)
    sys.setswitchinterval(SWITCH_INTERVAL)
    _fixed_mmap_threshold()
    member = None
    try:
        if cfg.master.etcd_endpoints:  # one member of a master group (master/member.py)
            me = member_address(cfg)
            addrs = config_mod.master_addrs(cfg)
            if len(addrs) > 1 and me.grpc not in addrs:
                log.warning("this member advertises %s, which is not one of "
                            "cluster.master_addrs: clients that a standby sends to it "
                            "try each master in turn instead (set master.advertise_addr "
                            "or --advertise to this master's entry)", me.grpc)
            member = Member(cfg, security, me)
            master = CurrentMaster(member)
        else:
            master = Master(cfg, security=security)
    except JournalError as e:
        log.critical("cannot recover the journal: %s", e)
        return 2
    except (CurvineError, ConfigError) as e:
        log.critical("cannot start: %s", e)
        return 2
    # each mount's lease session and Calls stream hold one server thread each for their
    # lifetime
    streams = 2 * cfg.master.max_sessions
    server = rpc.make_server(cfg.master.rpc_threads + streams,
                             max_concurrent=cfg.master.rpc_threads * 4 + streams,
                             security=security, accept=(CLIENT,),
                             max_message=int(cfg.master.client_message_max),
                             max_age=False)  # mounts' lease sessions (common/rpc.py)
    servicer = MasterServicer(master if member is None else None, cfg.master.max_sessions,
                              cfg.master.rpc_threads, float(cfg.master.stream_idle_timeout),
                              member=member)
    add_to_server(servicer, server, "client")
    # Workers' registrations, heartbeats and block reports have a server of their own
    # (port, threads, credential): a flood of client calls or streams cannot delay
    # them and so make the master declare healthy workers lost.  The other masters of
    # a group fetch checkpoints there too, with the master credential if there is one.
    wthreads = cfg.master.worker_rpc_threads
    masters = security.masters_role
    worker_server = rpc.make_server(
        wthreads, max_concurrent=wthreads * 4, security=security, accept=(WORKER,),
        accept_methods={method_path(m): (masters,) for m in MASTER_METHODS})
    if member is not None and security.client_token:
        _log_masters_credential(masters)
    add_to_server(servicer, worker_server, "worker")
    try:
        port = rpc.bind(server, cfg.master.host, cfg.master.port, security)
        wport = rpc.bind(worker_server, cfg.master.host, cfg.master.worker_port, security)
    except CurvineError as e:
        log.critical("%s", e)
        (member or master).close()
        return 1
    try:
        calls = _start_call_port(cfg, servicer, security)
    except OSError as e:  # an optimisation: mounts then use the Calls stream
        log.error("master.call_port %d: cannot bind %s (%s); serving without it: mounts "
                  "send namespace calls on the slower gRPC stream", cfg.master.call_port,
                  cfg.master.host, e.strerror or e)
        calls = None
    master.call_port_server = calls
    worker_server.start()
    server.start()
    serving = threading.Event()
    http = metrics_mod.serve("master", cfg.master.host, cfg.master.http_port,
                             "master.http_port", master_metrics.registry(master, member),
                             lambda: master_metrics.health(master, serving, member))
    serving.set()
    if member is not None:
        member.start()  # campaigns once its ports answer
    log.info("master serving on %s:%d, workers on port %d, call port %s (meta %s, journal "
             "%s, applied seq %d)", cfg.master.host, port, wport, master.call_port or "off",
             master.meta_dir, master.journal_dir, master.committer.applied_seq)
    daemon.notify("READY=1")
    code = 0
    try:
        while not stop.wait(1.0):
            if member is None and master.committer.fatal is not None:
                log.critical("stopping: journal failure")
                if calls is not None:
                    calls.stop()
                server.stop(0)
                worker_server.stop(0)
                return 1
            if member is not None and member.fatal() is not None:
                log.critical("stopping: %s", member.fatal().message)
                code = 2  # a configuration error, found late
                break
    finally:
        serving.clear()
        if http is not None:
            http.close()  # before the store closes under a scrape
    daemon.notify("STOPPING=1")
    if calls is not None:
        calls.stop()
    stopped = server.stop(grace=5), worker_server.stop(grace=5)
    for event in stopped:
        event.wait(6)
    servicer.close()
    (member or master).close()
    log.info("master stopped")
    return code


def _log_masters_credential(role: str) -> None:
    """Say once, at start, which credential the group's checkpoint fetches take
    (docs/security.md, "Roles"): without a master credential, every worker's."""
    if role == MASTER:
        log.info("FetchCheckpoint (the whole namespace, to another member of the group) "
                 "takes the master credential (security.master_token_file) only")
    else:
        log.info("FetchCheckpoint (the whole namespace, to another member of the group) "
                 "takes the worker credential, which every worker holds: set "
                 "security.master_token_file on every master of the group to keep it "
                 "to the masters")


CALL_PORT_CONNECTIONS_PER_SESSION = 4
SWITCH_INTERVAL = 0.001


def _fixed_mmap_threshold() -> None:
    """glibc: buffers of 1 MiB and more (a frame arriving, a big reply) in their own
    mappings, returned to the system when freed.  By default the threshold follows the
    largest block freed (up to 32 MiB), and buffers below it come from the heap, which
    keeps what it once held: two rounds of 4 partial 16 MiB frames, each within
    master.call_port_buffer, grew the master by 127 MB instead of 65."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD (fixes it)
    except (OSError, AttributeError):
        pass  # not glibc


def _start_call_port(cfg, servicer: MasterServicer, security: Security) -> CallPort | None:
    """The call port of mounts and path clients (master/ports/call_port_server.py), unless it is
    off; with TLS on it speaks TLS with the same material as the gRPC ports.  OSError
    if it cannot bind."""
    if not cfg.master.call_port:
        return None
    material = security.material
    port = CallPort(servicer.run_call, READ_CALLS, servicer.call_pool, cfg.master.host,
                    cfg.master.call_port, tokens=security.accepted((CLIENT,)),
                    # a connection holds no thread (one protocol object in the loop),
                    # and a path client (a pod's connector) may open up to 4
                    max_connections=CALL_PORT_CONNECTIONS_PER_SESSION * cfg.master.max_sessions,
                    idle_timeout=float(cfg.master.stream_idle_timeout),
                    mutations=servicer.mutations, run_nowait=servicer.run_call_nowait,
                    heavy=(servicer.heavy_pool, servicer.run_heavy, HEAVY_READS),
                    frame_max=int(cfg.master.client_message_max),
                    frame_timeout=float(cfg.master.call_frame_timeout),
                    per_peer=cfg.master.call_port_per_peer,
                    buffer_max=int(cfg.master.call_port_buffer),
                    ssl=tls.server_ssl_context(material) if material is not None else None)
    port.start()
    return port


if __name__ == "__main__":
    sys.exit(main())
