"""How a `curvine` command finds its cluster and connects to it: the one client set-up
of every command that talks to a master (fs, report, journal checkpoint, doctor) or
reads a cluster's config (config show, local status/down).

The config is found the same way by every command (common/cluster_config.py: --base,
--conf, $CURVINE_CONF, /etc/curvine/curvine.toml, else the defaults).

``--master H:P`` replaces the config's masters (``cluster.master_addr``, or every
member of ``cluster.master_addrs``: the command then asks that member only).  Channels then carry the
token and speak TLS as the config says, and a call fails within MASTER_WAIT when the
master is down rather than wait ``cluster.master_wait``; that error names the address
and where it came from (:func:`master_origin`, added by cli/main.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib

from curvine.client.files.fs import CurvineFS
from curvine.client.master.master_client import MasterClient
from curvine.common import config as config_mod
# the commands find their config with these (re-exported: connect is their one client set-up)
from curvine.common.cluster_config import NOWHERE, Found, add_options, find  # noqa: F401
from curvine.common.master_group import GroupRpc, master_rpc
from curvine.common.rpc import RpcClient
from curvine.common.security import Security
from curvine.proto import master_pb2_grpc

MASTER_WAIT = 2.0  # seconds: a command should fail fast when the master is down


def master_origin(args: argparse.Namespace, found: Found, address: str) -> str:
    """``address`` and where it came from, for an error that cannot reach it, e.g.
    "127.0.0.1:8995 (the default; no --base, --conf, CURVINE_CONF or ...)"."""
    if getattr(args, "master", None):
        return f"{address} (--master)"
    if found.path is None:
        return f"{address} (the default; {found.origin})"
    source = found.path if found.origin == found.path else f"{found.path}, from {found.origin}"
    try:
        with open(found.path, "rb") as f:
            cluster = tomllib.load(f).get("cluster") or {}
        key = ("master_addrs" if cluster.get("master_addrs") else
               "master_addr" if "master_addr" in cluster else None)
    except (OSError, ValueError, AttributeError):
        key = "master_addr"
    if key:
        return f"{address} (cluster.{key} of {source})"
    given = found.path if found.origin == found.path else f"{found.path} ({found.origin})"
    return f"{address} (the default; {given} sets no cluster.master_addr)"


def load_config(args: argparse.Namespace) -> config_mod.Config:
    """The config the options name, with ``--master`` and MASTER_WAIT applied.  Records
    on ``args`` the master's address and where it came from (``args.master_addr``,
    ``args.master_origin``), which cli/main.py adds to an error that cannot reach it."""
    found = find(args)
    cfg = config_mod.load(found.path) if found.path else config_mod.Config()
    named = getattr(args, "master", None)
    cfg.cluster = dataclasses.replace(cfg.cluster,
                                      master_addr=named or cfg.cluster.master_addr,
                                      master_addrs=[] if named else cfg.cluster.master_addrs,
                                      master_wait=config_mod.Duration(MASTER_WAIT))
    args.master_addr = " or ".join(config_mod.master_addrs(cfg))
    args.master_origin = master_origin(args, found, args.master_addr)
    return cfg


def master_client(args: argparse.Namespace) -> MasterClient:
    """A client of the master (close it when done)."""
    cfg = load_config(args)
    # its channels send the cluster token and speak TLS as the config says
    return MasterClient(config_mod.master_addrs(cfg), timeout=float(cfg.cluster.rpc_timeout),
                        wait=float(cfg.cluster.master_wait), security=Security.load(cfg))


def admin_rpc(args: argparse.Namespace) -> RpcClient | GroupRpc:
    """The master's gRPC service for the group's admin calls (GetGroup, StepDown): the
    leader of a group once a call finds it, else the one master (close it when done)."""
    cfg = load_config(args)
    return master_rpc(config_mod.master_addrs(cfg), master_pb2_grpc.MasterStub,
                      security=Security.load(cfg), timeout=float(cfg.cluster.rpc_timeout),
                      wait=float(cfg.cluster.master_wait))


def curvine_fs(args: argparse.Namespace) -> CurvineFS:
    """The path API over the master and its workers (a context manager: close it)."""
    return CurvineFS(cfg=load_config(args))
