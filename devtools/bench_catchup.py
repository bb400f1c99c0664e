"""How fast a standby catches up from the journal in etcd (issue 35).

A group of 2 masters over 1 etcd member (`curvine local`, default settings, no workers
or mounts): the standby is stopped (SIGTERM), ``mutations`` PutFiles are acknowledged
by the leader from 16 threads, the standby is started again; printed: how long its
catch-up took and records/s, from its own log line ("replayed N journal records in
S s"; the replay at open) and from the first lookup it answered after its restart
(a read index: it has applied the leader's commit).

    .venv/bin/python -m curvine.devtools.bench_catchup [--mutations 10000] [--threads 16] [--dir D]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import signal
import tempfile
import time

from curvine.common.ids import ROOT_INO

from .bench_meta_scale import cluster_client
from .local import LocalCluster

THREADS = 16  # the leader's group commit puts many records in one etcd key


def _replay_line(path: str) -> str | None:
    with open(path, errors="replace") as f:
        lines = [ln for ln in f if "replayed" in ln and "journal records" in ln]
    return lines[-1].strip() if lines else None


def _journal_keys(c: LocalCluster) -> int:
    """How many batches (etcd keys) the journal is in now."""
    from curvine.master.group.etcd import prefix_end
    from curvine.master.group.etcd_access import etcd_from_config
    from curvine.master.member import key_prefix
    from curvine.common import config as config_mod
    # a master's own config: its etcd endpoints, and TLS and user if it has them
    cfg = config_mod.load(os.path.join(c.base, "conf", "master-0.toml"))
    prefix = key_prefix(cfg) + b"journal/"
    etcd = etcd_from_config(cfg)
    try:
        return etcd.range(prefix, prefix_end(prefix), keys_only=True).count
    finally:
        etcd.close()


def run(top: str, mutations: int, threads: int = THREADS) -> dict[str, float]:
    c = LocalCluster(os.path.join(top, "catchup"), workers=0, mounts=0, masters=2)
    c.up()
    try:
        leader = c.leader()
        standby = 1 - leader
        c.kill("master", standby, sig=signal.SIGTERM)
        mc = cluster_client(c)
        try:
            parent = mc.mkdir(ROOT_INO, b"catchup").ino
            names = [b"n%07d" % i for i in range(mutations)]

            def make(chunk):
                for n in chunk:
                    mc.put_file(parent, n, [], 0)

            t0 = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                list(pool.map(make, [names[i::threads] for i in range(threads)]))
            made = time.monotonic() - t0
            keys = _journal_keys(c)
        finally:
            mc.close()
        started = time.monotonic()
        c.start("master", standby)
        direct = cluster_client(c, standby)
        try:
            direct.lookup(parent, names[-1])  # a read index: everything applied
            served = time.monotonic() - started
        finally:
            direct.close()
        out = {"mutations": mutations, "journal keys in etcd": keys, "leader mutations/s": mutations / made,
               "start to first read on the standby s": served}
        line = _replay_line(c.log_path("master", standby))
        m = re.search(r"replayed (\d+) journal records in ([\d.]+)s", line or "")
        if m:
            n, s = int(m.group(1)), float(m.group(2))
            out["replayed records"] = n
            out["replay s"] = s
            out["replay records/s"] = n / s if s else float("inf")
        return out
    finally:
        c.down()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutations", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=THREADS,
                    help="client threads (1: one record per etcd key)")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="catchup-") as top:
        for k, v in run(top, args.mutations, args.threads).items():
            print(f"{k:<40} {v:>12,.2f}")


if __name__ == "__main__":
    main()
