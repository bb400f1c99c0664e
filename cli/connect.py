"""How a `curvine` command finds its cluster and connects to it: the one client set-up
of every command that talks to a master (fs, report, journal checkpoint).

The config is ``--conf FILE``, else ``$CURVINE_CONF``, else /etc/curvine/curvine.toml
when present; or, with ``--base DIR``, the client config of the cluster that
`curvine local up --base DIR` started (BASE/conf/client.toml: its master, the cluster
token, the TLS keys).  ``--master H:P`` replaces the config's ``cluster.master_addr``.
Channels then carry the token and speak TLS as the config says, and a call fails
within MASTER_WAIT when the master is down rather than wait ``cluster.master_wait``.
"""

from __future__ import annotations

import argparse
import dataclasses

from curvine.client.fs import CurvineFS
from curvine.client.master_client import MasterClient
from curvine.common import config as config_mod
from curvine.common.security import Security

MASTER_WAIT = 2.0  # seconds: a command should fail fast when the master is down


def add_options(parser: argparse.ArgumentParser) -> None:
    """``--master``, and ``--conf`` or ``--base`` (not both)."""
    parser.add_argument("--master", metavar="H:P", help="master address "
                        "(default: cluster.master_addr of the config)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--conf", metavar="FILE", help="config file (default $CURVINE_CONF "
                       f"or {config_mod.DEFAULT_PATH})")
    where.add_argument("--base", metavar="DIR", help="the cluster `curvine local up --base "
                       "DIR` started: its master, token and TLS keys")


def load_config(args: argparse.Namespace) -> config_mod.Config:
    """The config the options name, with ``--master`` and MASTER_WAIT applied."""
    base = args.base
    if base:
        from curvine.devtools.local import LocalCluster  # only such a cluster has a base
        path = LocalCluster.client_conf_of(base)
    else:
        path = args.conf
    cfg = config_mod.load(path)
    cfg.cluster = dataclasses.replace(cfg.cluster,
                                      master_addr=args.master or cfg.cluster.master_addr,
                                      master_wait=config_mod.Duration(MASTER_WAIT))
    return cfg


def master_client(args: argparse.Namespace) -> MasterClient:
    """A client of the master (close it when done)."""
    cfg = load_config(args)
    # its channels send the cluster token and speak TLS as the config says
    return MasterClient(cfg.cluster.master_addr, timeout=float(cfg.cluster.rpc_timeout),
                        wait=float(cfg.cluster.master_wait), security=Security.load(cfg))


def curvine_fs(args: argparse.Namespace) -> CurvineFS:
    """The path API over the master and its workers (a context manager: close it)."""
    return CurvineFS(cfg=load_config(args))
