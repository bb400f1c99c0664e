"""Writers on two mounts replace one file with versions of random sizes; readers on
both mounts read it whole, again and again: every read must be exactly one version
(consistency rule 1, docs/consistency.md).  Not a test: a bounded script for chasing what the
kernel's one page cache and one size per inode let through, e.g. on a
`curvine local up --mounts 2` cluster:

    python tests/version_fuzz.py BASE/mnt/0/vf BASE/mnt/1/vf 20 MODE [mmap]

(the directory must exist on the first mount).  MODE, how the writers replace it:
``trunc`` in place, O_WRONLY|O_TRUNC; ``rdwr`` in place, O_RDWR|O_TRUNC (through the
page cache); ``ftrunc`` O_RDWR then ftruncate(0); ``chunks`` O_TRUNC and 256 KiB
writes with pauses; ``rename`` a temporary name renamed over it (LMCache's way);
``mixed`` one writer ftrunc, the other rename.  ``mmap``: the whole-file readers map
``st_size`` bytes instead of reading (a size that changes between their fstat and
the map, or a mapping refused, counts as an error, as it can on a local disk).
Prints, per reader: (index, whole versions read, bad reads, errors, examples).
"""
import errno
import mmap
import multiprocessing as mp
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fs_helpers import MIB, identify, pattern  # noqa: E402

SIZES = (100_000, MIB + 7, 3 * MIB, 6 * MIB + 5)
MODES = ("trunc", "rdwr", "ftrunc", "chunks", "rename", "mixed")


def replace(path: str, data: bytes, how: str, tmp: str) -> None:
    if how in ("trunc", "rdwr"):
        with open(path, "wb" if how == "trunc" else "w+b") as f:
            f.write(data)
    elif how == "ftrunc":
        fd = os.open(path, os.O_RDWR)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, data)
        finally:
            os.close(fd)
    elif how == "chunks":
        with open(path, "wb", buffering=0) as f:
            for o in range(0, len(data), 256 * 1024):
                f.write(data[o:o + 256 * 1024])
                time.sleep(0.001)
    else:
        with open(tmp, "wb") as f:
            f.write(data)
        os.rename(tmp, path)


def writer(w: int, d: str, secs: float, mode: str) -> None:
    rnd = random.Random(w)
    end = time.monotonic() + secs
    how = ("ftrunc", "rename")[w % 2] if mode == "mixed" else mode
    r = 0
    while time.monotonic() < end:
        try:
            replace(os.path.join(d, "f"), pattern(w, r, rnd.choice(SIZES)), how,
                    os.path.join(d, f"f.tmp{w}"))
        except OSError as e:
            # an open file that another mount renames a file over is gone for the
            # writer that has it open: a clean error (ESTALE), its version is lost
            if e.errno != errno.ESTALE:
                raise
        r += 1


def read_whole(f, mapped: bool) -> bytes:
    if not mapped:
        return f.read()
    n = os.fstat(f.fileno()).st_size
    if not n:
        return b""
    with mmap.mmap(f.fileno(), n, prot=mmap.PROT_READ) as m:
        return bytes(m)


def reader(i: int, d: str, secs: float, mapped: bool, q) -> None:
    """Even readers read a whole file in one call (or map it), odd ones 256 KiB at a
    time."""
    end = time.monotonic() + secs
    ok = bad = err = 0
    examples: list[str] = []
    while time.monotonic() < end:
        try:
            with open(os.path.join(d, "f"), "rb") as f:
                if i % 2 == 0:
                    data = read_whole(f, mapped)
                else:
                    data = b"".join(iter(lambda: f.read(256 * 1024), b""))
        except (OSError, ValueError) as e:  # ENOENT too: the name always exists
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
    mapped = sys.argv[5:] == ["mmap"]
    if mode not in MODES:
        sys.exit(f"MODE is one of {', '.join(MODES)}")
    with open(os.path.join(a, "f"), "wb") as f:
        f.write(pattern(99, 0, MIB))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=writer, args=(w, (a, b)[w % 2], secs, mode)) for w in range(2)]
    procs += [ctx.Process(target=reader, args=(i, (a, b, b, b)[i], secs, mapped, q))
              for i in range(4)]
    for p in procs:
        p.start()
    try:
        results = [q.get(timeout=secs + 120) for _ in range(4)]
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
        print("exit codes:", [p.exitcode for p in procs])
    for r in sorted(results):
        print(r)


if __name__ == "__main__":
    main()
