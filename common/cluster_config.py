"""Which config file a `curvine` command reads, and where `curvine local up` keeps a
cluster's: shared by the operator commands (cli/) and the developer tools (devtools/),
which do not import each other.

The config is found the same way by every command, first match wins:

1. ``--base DIR``: the client config of the cluster that `curvine local up --base DIR`
   started (BASE/conf/client.toml: its master, the cluster token, the TLS keys);
2. ``--conf FILE``;
3. ``$CURVINE_CONF``;
4. /etc/curvine/curvine.toml, when it exists;
5. none: the defaults (master 127.0.0.1:8995).

May import: ``curvine.common`` only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from . import config as config_mod
from .errors import ClusterError

# a local cluster's base directory (devtools/local.py writes it)
STATE_FILE = "cluster.json"
CLIENT_CONF = os.path.join("conf", "client.toml")
STATE_VERSION = 1

NOWHERE = f"no --base, --conf, CURVINE_CONF or {config_mod.DEFAULT_PATH}"


@dataclasses.dataclass(frozen=True)
class Found:
    """The config file a command reads (None: the defaults) and why that one."""
    path: str | None
    origin: str  # "--base DIR", "--conf", "CURVINE_CONF", DEFAULT_PATH, or NOWHERE


def add_options(parser: argparse.ArgumentParser, master: bool = True) -> None:
    """``--master`` (unless ``master`` is False), and ``--conf`` or ``--base`` (not both)."""
    if master:
        parser.add_argument("--master", metavar="H:P", help="master address "
                            "(default: cluster.master_addr of the config)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--conf", metavar="FILE", help="config file (default $CURVINE_CONF "
                       f"or {config_mod.DEFAULT_PATH})")
    where.add_argument("--base", metavar="DIR", help="the cluster `curvine local up --base "
                       "DIR` started: its master, token and TLS keys")


def find(args: argparse.Namespace) -> Found:
    """The config file of the command's cluster, in the order of the module docstring."""
    base = getattr(args, "base", None)
    if base:
        return Found(client_conf_of(base), f"--base {base}")
    conf = getattr(args, "conf", None)
    if conf:
        return Found(conf, "--conf")
    env = os.environ.get("CURVINE_CONF")
    if env:
        return Found(env, "CURVINE_CONF")
    if os.path.exists(config_mod.DEFAULT_PATH):
        return Found(config_mod.DEFAULT_PATH, config_mod.DEFAULT_PATH)
    return Found(None, NOWHERE)


def read_state(base: str) -> dict | None:
    """The state file of the local cluster in ``base``; None when there is none."""
    path = os.path.join(base, STATE_FILE)
    try:
        with open(path, "rb") as f:
            state = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ClusterError(f"cannot read {path}: {e}") from None
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ClusterError(f"{path}: not a curvine local state file (version "
                           f"{state.get('version') if isinstance(state, dict) else '?'})")
    return state


def recorded_state(base: str) -> dict:
    """The state file of ``base``; ClusterError when no cluster was started there."""
    state = read_state(base)
    if state is None:
        raise ClusterError(f"no cluster in {base} ({STATE_FILE} not found)")
    return state


def client_conf_of(base: str) -> str:
    """The client config of the cluster started in ``base`` (``--base`` of the curvine
    commands)."""
    base = os.path.realpath(base)
    recorded_state(base)
    return os.path.join(base, CLIENT_CONF)
