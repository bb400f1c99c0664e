"""Writers on two mounts replace one file with versions of random sizes (in place
with O_TRUNC from O_WRONLY or O_RDWR handles, or by rename); readers on both mounts
read it whole, again and again: every read must be exactly one version (DESIGN
consistency rule 1).  Not a test: a bounded script for chasing what the kernel's one
page cache and one size per inode let through, e.g. on a `curvine local up --mounts 2`
cluster:

    python tests/version_fuzz.py BASE/mnt/0/vf BASE/mnt/1/vf 20 trunc   (or rdwr, rename)

(the directory must exist on the first mount).  Prints, per reader: (index, whole
versions read, bad reads, errors, examples).
"""
import multiprocessing as mp
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fs_helpers import MIB, identify, pattern  # noqa: E402

SIZES = (100_000, MIB + 7, 3 * MIB, 6 * MIB + 5)


def writer(w: int, d: str, secs: float, mode: str) -> None:
    rnd = random.Random(w)
    end = time.monotonic() + secs
    r = 0
    while time.monotonic() < end:
        data = pattern(w, r, rnd.choice(SIZES))
        if mode in ("trunc", "rdwr"):  # O_WRONLY or O_RDWR (page cache), with O_TRUNC
            with open(os.path.join(d, "f"), "wb" if mode == "trunc" else "w+b") as f:
                f.write(data)
        else:
            tmp = os.path.join(d, f"f.tmp{w}")
            with open(tmp, "wb") as f:
                f.write(data)
            os.rename(tmp, os.path.join(d, "f"))
        r += 1


def reader(i: int, d: str, secs: float, q) -> None:
    """Even readers read a whole file in one call, odd ones 256 KiB at a time."""
    end = time.monotonic() + secs
    ok = bad = err = 0
    examples: list[str] = []
    while time.monotonic() < end:
        try:
            with open(os.path.join(d, "f"), "rb") as f:
                if i % 2 == 0:
                    data = f.read()
                else:
                    data = b"".join(iter(lambda: f.read(256 * 1024), b""))
        except FileNotFoundError:
            continue
        except OSError as e:
            err += 1
            examples.append(repr(e))
            continue
        try:
            identify(data)
            ok += 1
        except AssertionError as e:
            bad += 1
            examples.append(str(e)[:200])
    q.put((i, ok, bad, err, examples[:3]))


def main() -> None:
    a, b, secs, mode = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    with open(os.path.join(a, "f"), "wb") as f:
        f.write(pattern(99, 0, MIB))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=writer, args=(w, (a, b)[w % 2], secs, mode)) for w in range(2)]
    procs += [ctx.Process(target=reader, args=(i, (a, b, b, b)[i], secs, q)) for i in range(4)]
    for p in procs:
        p.start()
    results = [q.get(timeout=secs + 120) for _ in range(4)]
    for p in procs:
        p.join(60)
    for r in sorted(results):
        print(r)


if __name__ == "__main__":
    main()
