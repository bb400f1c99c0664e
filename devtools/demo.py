"""`curvine demo`: the LMCache file pattern across two mounts of a local cluster.

Mount 0 plays the pod that stores KV chunks: for each chunk it opens
``<key>.tmp``, writes the whole chunk in one call, closes it and renames it to
``<key>.data`` (what LMCache's fs connector does).  Mount 1 plays another pod: it
``stat``s each ``<key>.data`` (hit or miss), reads it and checks its hash.  The same
workload on a plain local directory is printed next to it for comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

from curvine.common import argtypes

from .local import LocalCluster, mounted_paths

MODEL = "Qwen2.5-7B"
SEED = 20240601
CACHE_DIR = "l2cache"


@dataclass
class PhaseResult:
    """Figures of one write-then-read run."""

    label: str
    chunks: int
    chunk_size: int
    write_s: float = 0.0
    read_s: float = 0.0
    hits: int = 0
    bad: list[str] = field(default_factory=list)  # keys whose bytes differ
    read_ms: list[float] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return self.chunks * self.chunk_size

    @property
    def write_mbs(self) -> float:
        return self.total_bytes / 1e6 / self.write_s if self.write_s else 0.0

    @property
    def read_mbs(self) -> float:
        return self.hits * self.chunk_size / 1e6 / self.read_s if self.read_s else 0.0

    @property
    def p50_read_ms(self) -> float:
        return statistics.median(self.read_ms) if self.read_ms else 0.0


def chunk_keys(n: int, seed: int = SEED) -> list[str]:
    """Keys shaped like LMCache's: ``fmt@model@world_size@worker_id@chunk_hash``."""
    rng = random.Random(seed)
    keys = []
    for _ in range(n):
        tokens = rng.randbytes(256 * 4)  # a 256-token chunk
        keys.append(f"vllm@{MODEL}@1@0@{hashlib.sha256(tokens).hexdigest()[:16]}")
    return keys


@functools.lru_cache(maxsize=8)
def _pattern(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def chunk_data(i: int, size: int, seed: int = SEED) -> bytes:
    """The bytes of chunk ``i``: distinct for every ``i``, the same on every call.

    A seeded random pattern rotated by an offset of the chunk's own, with ``i`` stamped
    over its first 8 bytes: one copy per chunk (~10 ms for 16 MiB), where a fresh
    random draw costs ~10x that and would dominate a benchmark's set-up."""
    pattern = memoryview(_pattern(size, seed))
    k = min(8, size)
    rot = random.Random(seed * 1_000_003 + i).randrange(size - k + 1)
    return b"".join((i.to_bytes(8, "little")[:k], pattern[rot + k:], pattern[:rot]))


def _digest(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=32).digest()


def put_chunk(directory: str, key: str, data: bytes) -> None:
    """Store one chunk the way LMCache's fs connector does: open ``<key>.tmp``, one
    write of the whole chunk, close, rename to ``<key>.data``."""
    tmp = os.path.join(directory, key + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.rename(tmp, os.path.join(directory, key + ".data"))


def get_chunk(directory: str, key: str) -> bytes | None:
    """Look one chunk up the LMCache way (``stat``, then read it whole); None on a miss."""
    path = os.path.join(directory, key + ".data")
    try:
        os.stat(path)
    except FileNotFoundError:
        return None
    with open(path, "rb") as f:
        return f.read()


def write_chunks(directory: str, keys: list[str], size: int) -> tuple[float, list[bytes]]:
    """Store every chunk the LMCache way; return seconds spent in file I/O and digests."""
    spent, digests = 0.0, []
    for i, key in enumerate(keys):
        data = chunk_data(i, size)
        digests.append(_digest(data))
        t0 = time.perf_counter()
        put_chunk(directory, key, data)
        spent += time.perf_counter() - t0
        del data
    return spent, digests


def read_chunks(directory: str, keys: list[str], digests: list[bytes], size: int,
                result: PhaseResult) -> None:
    """Look each chunk up with stat (hit/miss), read it and compare its hash."""
    for key, want in zip(keys, digests):
        t0 = time.perf_counter()
        data = get_chunk(directory, key)
        dt = time.perf_counter() - t0
        result.read_s += dt
        if data is None:
            continue
        result.read_ms.append(dt * 1000)
        result.hits += 1
        if len(data) != size or _digest(data) != want:
            result.bad.append(key)


def run_phase(label: str, write_dir: str, read_dir: str, keys: list[str],
              size: int) -> PhaseResult:
    os.makedirs(write_dir, exist_ok=True)
    result = PhaseResult(label, len(keys), size)
    result.write_s, digests = write_chunks(write_dir, keys, size)
    read_chunks(read_dir, keys, digests, size, result)
    return result


def format_table(rows: list[tuple[str, ...]], left: int = 1) -> str:
    """Rows as aligned columns: the first ``left`` columns flush left, the rest right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [c.ljust(w) if i < left else c.rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def format_results(results: list[PhaseResult]) -> str:
    rows = [("", "hit rate", "write MB/s", "read MB/s", "p50 read ms")]
    for r in results:
        rows.append((r.label, f"{r.hits}/{r.chunks} ({100 * r.hits / max(1, r.chunks):.0f}%)",
                     f"{r.write_mbs:.1f}", f"{r.read_mbs:.1f}", f"{r.p50_read_ms:.2f}"))
    return format_table(rows)


def run_demo(base: str | None = None, chunks: int = 16, chunk_size: int = 14 << 20,
             keep: bool = False, out=sys.stdout) -> int:
    """Run the demo; return 0 if every chunk was a hit with identical bytes, else 1."""
    def say(msg: str = "") -> None:
        print(msg, file=out, flush=True)

    own_base = base is None
    base = base or tempfile.mkdtemp(prefix="curvine-demo-")
    cluster = LocalCluster(base, workers=2, mounts=2)
    say(f"starting a local cluster in {base}: 1 master, 2 workers, 2 mounts ...")
    t0 = time.perf_counter()
    mounts = cluster.up()
    say(f"up in {time.perf_counter() - t0:.1f}s: {mounts[0]} (pod A), {mounts[1]} (pod B)")
    ok = False
    try:
        keys = chunk_keys(chunks)
        mib = chunk_size / (1 << 20)
        say(f"pod A stores {chunks} KV chunks of {mib:g} MiB: open <key>.tmp, one write, "
            f"close, rename to <key>.data")
        say("pod B looks each one up with stat, reads it and checks its hash")
        say(f"e.g. {CACHE_DIR}/{keys[0]}.data")
        curvine = run_phase("curvine (mount 0 -> 1)", os.path.join(mounts[0], CACHE_DIR),
                            os.path.join(mounts[1], CACHE_DIR), keys, chunk_size)
        local_dir = os.path.join(base, "plain-dir")
        local = run_phase("plain local directory", local_dir, local_dir, keys, chunk_size)
        shutil.rmtree(local_dir, ignore_errors=True)
        say()
        say(format_results([curvine, local]))
        say()
        misses = curvine.chunks - curvine.hits
        if curvine.bad:
            say(f"FAILED: {len(curvine.bad)} chunk(s) read back with different bytes: "
                + ", ".join(curvine.bad[:5]))
        if misses:
            say(f"FAILED: {misses} chunk(s) written on mount 0 were not found on mount 1")
        ok = not curvine.bad and not misses
        if ok:
            say(f"all {chunks} chunks found on the other mount with identical bytes")
    finally:
        if keep:
            say(f"cluster left running; stop it with: curvine local down --base {base}")
        else:
            cluster.down()
            if own_base and not any(m.startswith(base + os.sep) for m in mounted_paths()):
                shutil.rmtree(base, ignore_errors=True)
    return 0 if ok else 1


# --------------------------------------------------------------------------- `curvine demo`

HELP = "write KV chunks on one mount and read them on another"
DESCRIPTION = ("Start a local cluster (2 workers, 2 mounts), store KV-cache chunks "
               "through mount 0 the way LMCache does, read them back through mount 1, "
               "print hit rate and timings next to a plain local directory, tear down.")


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", help="cluster directory (default: a new temporary directory)")
    p.add_argument("--chunks", type=argtypes.positive, default=16, metavar="N",
                   help="number of chunks (default 16)")
    p.add_argument("--chunk-size", type=argtypes.size, default=14 << 20, metavar="SIZE",
                   help="bytes per chunk, e.g. 14MiB (default; a 256-token chunk of a 7B model)")
    p.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    p.set_defaults(func=_cmd_demo, _parser=p)


def _cmd_demo(args, parser) -> int:
    with contextlib.suppress(AttributeError):
        sys.stdout.reconfigure(line_buffering=True)
    return run_demo(args.base, args.chunks, args.chunk_size, args.keep)
