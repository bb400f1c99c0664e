"""What TLS costs on the remote data path: `python bench/tls_overhead.py`.

Two local clusters in turn (1 master, 1 worker, no mounts), the first plaintext, the
second with mutual TLS (`curvine local up --tls`).  The client library writes 8 values
of 32 MiB and reads them back with short-circuit off, so every byte crosses a worker's
gRPC stream; 5 rounds per mode, medians printed with the TLS/plain ratio.  About a
minute; the clusters live in temporary directories that are removed afterwards.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import tempfile
import time

from curvine.client.files.fs import CurvineFS
from curvine.common.config import Config
from curvine.devtools.local import LocalCluster

VALUES, SIZE, ROUNDS = 8, 32 << 20, 5


def run(mode: str, data: bytes) -> tuple[list[float], list[float]]:
    base = tempfile.mkdtemp(prefix=f"curvine-tls-bench-{mode}-")
    conf = os.path.join(base, "c.toml")
    with open(conf, "w") as f:
        f.write("[client]\nshort_circuit = false\n")
    c = LocalCluster(os.path.join(base, "c"), workers=1, mounts=0, conf=conf,
                     tls=(mode == "tls"))
    c.up()
    try:
        cfg = Config()
        cfg.client.short_circuit = False
        cfg.security = dataclasses.replace(cfg.security, token_file=c.token_file,
                                           **(c.tls_keys or {}))
        writes, reads = [], []
        with CurvineFS(c.master_addr, cfg=cfg) as fs:
            for rnd in range(ROUNDS):
                t = time.perf_counter()
                for i in range(VALUES):
                    fs.write_bytes(f"/v{rnd}-{i}", data)
                writes.append(VALUES * SIZE / (time.perf_counter() - t) / 1e6)
                t = time.perf_counter()
                for i in range(VALUES):
                    if fs.read_bytes(f"/v{rnd}-{i}") != data:
                        raise SystemExit(f"{mode}: /v{rnd}-{i} read back wrong")
                reads.append(VALUES * SIZE / (time.perf_counter() - t) / 1e6)
        return writes, reads
    finally:
        c.down()
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    data = os.urandom(SIZE)
    medians = {}
    for mode in ("plain", "tls"):
        writes, reads = run(mode, data)
        print(f"{mode:5s} write MB/s {[round(x) for x in writes]}  "
              f"read MB/s {[round(x) for x in reads]}", flush=True)
        medians[mode] = statistics.median(writes), statistics.median(reads)
    (pw, pr), (tw, tr) = medians["plain"], medians["tls"]
    print(f"median write: plain {pw:.0f} MB/s, tls {tw:.0f} MB/s ({tw / pw:.2f}x)")
    print(f"median read:  plain {pr:.0f} MB/s, tls {tr:.0f} MB/s ({tr / pr:.2f}x)")
    print("load average", " ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
