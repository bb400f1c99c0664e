"""Lookups through a standby of a master group, 16 client processes (issue 35).

A group of 2 masters over 1 etcd member (`curvine local`, default settings, no workers
or mounts): every client's unleased reads go to the standby (`client.read_member`
picks a standby), each waiting for its read index (a linearizable read of `commit`
from etcd).  bench_meta_scale.py's lookup clients (a quarter hits, the rest misses)
for ``seconds``, ``runs`` times; printed: lookups/s (median) and the standby's CPU per
lookup.  ``--masters 1``: the same on one master, for comparison.

    .venv/bin/python -m curvine.devtools.bench_standby_reads [--runs 3] [--masters 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from curvine.common.ids import ROOT_INO

from .bench_meta_scale import HITS, MetaScale, cluster_client
from .local import LocalCluster

CLIENTS = 16


def run(top: str, masters: int, runs: int, seconds: float, clients: int) -> dict[str, float]:
    c = LocalCluster(os.path.join(top, f"reads-{masters}"), workers=0, mounts=0,
                     masters=masters)
    c.up()
    try:
        leader = c.leader()
        reader = leader if masters == 1 else 1 - leader
        ms = MetaScale(c, top, print, runs=runs, seconds=seconds, clients=(clients,),
                       mount_procs=())
        ms.watch_master(reader)
        mc = cluster_client(c)
        try:
            look = mc.mkdir(ROOT_INO, b"lookups")
            for i in range(HITS):
                mc.create(look.ino, b"hit-%d" % i)
        finally:
            mc.close()
        for _ in range(runs):
            ms.measure_clients(f"lookup x{clients}", "lookup", look.ino, clients)
        return {k: statistics.median(v) for k, v in ms.figures.items()}
    finally:
        c.down()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--masters", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=CLIENTS)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="standby-reads-") as top:
        for k, v in run(top, args.masters, args.runs, args.seconds, args.clients).items():
            print(f"{k:<40} {v:>12,.2f}")


if __name__ == "__main__":
    main()
