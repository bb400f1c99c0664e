"""What checking crc32s on reads costs: `python bench/verify_cost.py`.

One local cluster (1 master, 1 worker, no mounts).  The client library writes 8
values of 32 MiB (one block each), then reads them back, short-circuit (the client's
config names the worker's data dir) and remote (short-circuit off, every byte over the
worker's gRPC stream), with the readers' checks on and off
(``curvine.client.files.file_reader.VERIFY``, read when a reader is made), the four modes
interleaved in each of 5 rounds.  Whole files are read as ``CurvineFS.read_bytes``
does (1 MiB reads, copied and joined) and in one ``FileReader.read`` of the whole file
(fewer copies: the checks' share is larger); "pread" opens each value and reads 4 KiB
in its middle (the whole block is fetched and checked first).  Medians are printed with the on/off ratios.
The data is in the page cache after the writes, so this measures CPU cost, not disks;
the client's CPU time per GB (``time.process_time``, every thread of this process) is
printed too, as it is less sensitive than MB/s to other load on the machine.
With an older client that has no switch (no VERIFY), one mode per path is measured.
About a minute; the cluster lives in a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import tempfile
import time

from curvine.client.files import file_reader
from curvine.client.files.fs import CurvineFS
from curvine.common.config import Config
from curvine.devtools.local import LocalCluster

VALUES, SIZE, ROUNDS = 8, 32 << 20, 5


def client(c: LocalCluster, short_circuit: bool) -> CurvineFS:
    cfg = Config()
    cfg.client = dataclasses.replace(cfg.client, short_circuit=short_circuit,
                                     short_circuit_dirs=[c._path("worker", "0", "data")])
    cfg.security = dataclasses.replace(cfg.security, token_file=c.token_file)
    return CurvineFS(c.master_addr, cfg=cfg)


def main() -> None:
    switch = hasattr(file_reader, "VERIFY")
    verify_modes = (True, False) if switch else (None,)
    base = tempfile.mkdtemp(prefix="curvine-verify-bench-")
    c = LocalCluster(os.path.join(base, "c"), workers=1, mounts=0)
    c.up()
    try:
        values = [os.urandom(SIZE) for _ in range(VALUES)]
        with client(c, short_circuit=False) as fs:
            for i, v in enumerate(values):
                fs.write_bytes(f"/v{i}", v)
        fss = {sc: client(c, sc) for sc in (True, False)}
        whole: dict[tuple, list[float]] = {}
        cpu: dict[tuple, list[float]] = {}
        one: dict[tuple, list[float]] = {}
        pread: dict[tuple, list[float]] = {}
        for _ in range(ROUNDS):
            for sc in (True, False):
                for verify in verify_modes:
                    if switch:
                        file_reader.VERIFY = verify
                    fs = fss[sc]
                    t, t_cpu = time.perf_counter(), time.process_time()
                    for i, v in enumerate(values):
                        if fs.read_bytes(f"/v{i}") != v:
                            raise SystemExit(f"/v{i} read back wrong")
                    whole.setdefault((sc, verify), []).append(
                        VALUES * SIZE / (time.perf_counter() - t) / 1e6)
                    cpu.setdefault((sc, verify), []).append(
                        (time.process_time() - t_cpu) / (VALUES * SIZE / 1e9))
                    t = time.perf_counter()
                    for i, v in enumerate(values):
                        r = fs.open_reader(f"/v{i}")
                        try:
                            if r.read(0, SIZE) != v:
                                raise SystemExit(f"/v{i} read back wrong")
                        finally:
                            r.close()
                    one.setdefault((sc, verify), []).append(
                        VALUES * SIZE / (time.perf_counter() - t) / 1e6)
                    t = time.perf_counter()
                    for i, v in enumerate(values):
                        r = fs.open_reader(f"/v{i}")
                        try:
                            if bytes(r.read(SIZE // 2, 4096)) != v[SIZE // 2:SIZE // 2 + 4096]:
                                raise SystemExit(f"/v{i} pread wrong")
                        finally:
                            r.close()
                    pread.setdefault((sc, verify), []).append(
                        (time.perf_counter() - t) / VALUES * 1e3)
        if switch:
            file_reader.VERIFY = True
        for fs in fss.values():
            fs.close()
    finally:
        c.down()
        shutil.rmtree(base, ignore_errors=True)

    def name(sc, verify):
        path = "short-circuit" if sc else "remote"
        return path if verify is None else f"{path} {'checked' if verify else 'unchecked'}"

    for key in whole:
        print(f"{name(*key):26s} read_bytes MB/s {[round(x) for x in whole[key]]}  "
              f"client CPU s/GB {[round(x, 2) for x in cpu[key]]}  "
              f"one read MB/s {[round(x) for x in one[key]]}  "
              f"pread 4 KiB ms {[round(x, 1) for x in pread[key]]}")
    for sc in (True, False):
        if switch:
            on, off = statistics.median(whole[(sc, True)]), statistics.median(whole[(sc, False)])
            con, coff = statistics.median(cpu[(sc, True)]), statistics.median(cpu[(sc, False)])
            oon, ooff = statistics.median(one[(sc, True)]), statistics.median(one[(sc, False)])
            pon, poff = (statistics.median(pread[(sc, True)]),
                         statistics.median(pread[(sc, False)]))
            print(f"median {name(sc, None)}: read_bytes {on:.0f} MB/s checked, {off:.0f} "
                  f"unchecked ({on / off:.2f}x), client CPU {con:.2f} s/GB checked, "
                  f"{coff:.2f} unchecked ({con / coff:.2f}x); one read {oon:.0f} MB/s "
                  f"checked, {ooff:.0f} unchecked ({oon / ooff:.2f}x); pread {pon:.1f} ms "
                  f"checked, {poff:.1f} unchecked")
        else:
            print(f"median {name(sc, None)}: read_bytes "
                  f"{statistics.median(whole[(sc, None)]):.0f} MB/s, client CPU "
                  f"{statistics.median(cpu[(sc, None)]):.2f} s/GB; one read "
                  f"{statistics.median(one[(sc, None)]):.0f} MB/s; pread "
                  f"{statistics.median(pread[(sc, None)]):.1f} ms")
    print("load average", " ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
