"""`curvine fs`: per-directory policy and capacity, talking to the master.

    curvine fs ttl PATH DURATION     # files created in PATH afterwards expire (0 clears)
    curvine fs replicas PATH N       # replicas of files created in PATH (0 = default)
    curvine fs status                # pool usage, watermarks, eviction counters

PATH is a path in the cluster's namespace (``/l2cache``), resolved at the master
name by name from the root; a path on a local curvine mount (``/mnt/kv/l2cache``)
works too and is translated.  The master is ``--master H:P``, else the config's
``cluster.master_addr`` (``--conf``, ``$CURVINE_CONF``).
"""

from __future__ import annotations

import argparse
import os

from curvine.client.master_client import MasterClient
from curvine.common import config as config_mod
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO

MOUNT_FS_TYPE = "fuse.curvine"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fs", help="TTL and replicas of directories, capacity status",
        description="Set the TTL or the replica count of a directory (inherited by files "
                    "created in it afterwards; on a file, its own TTL), or show the pool's "
                    "usage and eviction counters.")
    sub = p.add_subparsers(dest="fs_command", metavar="SUBCOMMAND", required=True)

    def common(sp):
        sp.add_argument("--master", metavar="H:P", help="master address "
                        "(default: cluster.master_addr of the config)")
        sp.add_argument("--conf", help="config file (default $CURVINE_CONF or "
                        f"{config_mod.DEFAULT_PATH})")

    t = sub.add_parser("ttl", help="set the TTL of a directory (or file)",
                       description="Files created in PATH afterwards are removed once "
                                   "DURATION has passed since they were last written. "
                                   "DURATION: e.g. 30s, 2h, 7d; 0 clears it.")
    t.add_argument("path", metavar="PATH")
    t.add_argument("duration", metavar="DURATION", type=_duration)
    common(t)
    t.set_defaults(func=_cmd_ttl, _parser=t)

    r = sub.add_parser("replicas", help="set the replica count of a directory",
                       description="Files created in PATH afterwards get N replicas "
                                   "(0 = the cluster default).")
    r.add_argument("path", metavar="PATH")
    r.add_argument("replicas", metavar="N", type=_replicas)
    common(r)
    r.set_defaults(func=_cmd_replicas, _parser=r)

    s = sub.add_parser("status", help="pool usage, watermarks and eviction counters")
    common(s)
    s.set_defaults(func=_cmd_status, _parser=s)
    p.set_defaults(_parser=p)


def _duration(text: str) -> float:
    try:
        return config_mod.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _replicas(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= n <= 8:
        raise argparse.ArgumentTypeError("must be between 0 and 8 (0 = the cluster default)")
    return n


def _client(args) -> MasterClient:
    cfg = config_mod.load(args.conf)
    address = args.master or cfg.cluster.master_addr
    # a CLI should fail fast when the master is down, not wait for it
    return MasterClient(address, timeout=float(cfg.cluster.rpc_timeout), wait=2.0)


def namespace_path(path: str) -> str:
    """``path`` as a path in the namespace: a path on a local curvine mount is taken
    relative to its mount point; anything else must be absolute in the namespace."""
    if os.path.exists(path):
        real = os.path.realpath(path)
        best = ""
        for mnt in _curvine_mounts():
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                best = mnt
        if best:
            return "/" + os.path.relpath(real, best).lstrip(".")
    if not path.startswith("/"):
        raise CurvineError(ErrorKind.INVALID, f"PATH: {path!r} is neither on a curvine mount "
                                              "nor absolute in the namespace")
    return path


def _curvine_mounts() -> list[str]:
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and parts[2] == MOUNT_FS_TYPE:
            out.append(parts[1].replace("\\040", " ").replace("\\011", "\t")
                       .replace("\\012", "\n").replace("\\134", "\\"))
    return out


def resolve(client: MasterClient, path: str) -> int:
    """The inode of a namespace path, walking from the root one name at a time."""
    ino = ROOT_INO
    walked = ""
    for part in path.split("/"):
        if part in ("", "."):
            continue
        walked += "/" + part
        node = client.lookup_or_none(ino, part.encode())
        if node is None:
            raise CurvineError(ErrorKind.NOT_FOUND, f"{walked}: no such file or directory")
        ino = node.ino
    return ino


def _cmd_ttl(args, parser) -> int:
    client = _client(args)
    try:
        path = namespace_path(args.path)
        node = client.set_policy(resolve(client, path), ttl_ms=int(round(args.duration * 1000)))
    finally:
        client.close()
    print(f"{path}: ttl {_fmt_ttl(node.ttl_ms)}")
    return 0


def _cmd_replicas(args, parser) -> int:
    client = _client(args)
    try:
        path = namespace_path(args.path)
        node = client.set_policy(resolve(client, path), replicas=args.replicas)
    finally:
        client.close()
    print(f"{path}: replicas {node.replicas or 'cluster default'}")
    return 0


def _cmd_status(args, parser) -> int:
    client = _client(args)
    try:
        st = client.capacity_status()
    finally:
        client.close()
    cap = st.capacity or 1
    print(f"capacity  {st.capacity} bytes (live workers)")
    print(f"used      {st.used} bytes ({100 * st.used / cap:.1f}%), estimated "
          f"{st.estimated_used} ({100 * st.estimated_used / cap:.1f}%)")
    print(f"evict     above {st.high:.2f} down to {st.low:.2f}; {st.tracked_files} files tracked")
    for k in sorted(st.stats):
        print(f"{k:16s}{st.stats[k]}")
    return 0


def _fmt_ttl(ms: int) -> str:
    if not ms:
        return "none"
    for unit, n in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % n == 0:
            return f"{ms // n}{unit}"
    return f"{ms}ms"
