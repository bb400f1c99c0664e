"""Random I/O on one file, checked after every operation against an in-memory model.

``check_file_ops(path_dir, ops, seed, profile, drop_caches, size_max)`` creates one
file in ``path_dir`` and runs a random sequence of pread, pwrite (1 B..256 KiB at
random offsets, sometimes past the end so a hole is left), ftruncate (shrink and
grow), mmap reads and MAP_SHARED mmap writes (within the current size; msync
sometimes), fallocate mode 0 and FALLOC_FL_KEEP_SIZE, fsync, close + reopen
(O_RDWR), and every ``drop_every`` operations ``drop_caches()`` (the page cache is
dropped, so the next reads come from the file system, not from memory).

The model is a bytearray.  After EVERY operation fstat().st_size must equal the
model's size and a window of the content (overlapping what the operation touched,
or random) must equal the model's; the whole file is compared every
``full_every`` operations and at the end (through the open handle, and again after
close and reopen).  The first disagreement raises ``RandomIOError`` (an
AssertionError) naming the operation index, the operation, the first differing
offset and the last 20 operations.

fallocate is called through ctypes (glibc's posix_fallocate would silently emulate
it with writes where the file system refuses it); if the file system answers
EOPNOTSUPP (or ENOSYS) for a mode, that mode is recorded in ``Report.unsupported``
and not tried again.  Any other error of any operation is a failure.

Profiles: ``mixed`` (everything), ``small`` (4 KiB-aligned 4 KiB reads and writes,
many), ``mmap`` (mostly mmap reads and writes), ``truncate`` (heavy truncate and
extend, with writes and reads around the end).

Run as a script (the tests do that, so a SIGBUS in an mmap access or a hang kills a
child, not pytest)::

    python tests/random_io_checker.py DIR --ops 10000 --seed 0 --profile mixed \\
        [--drop-caches] [--size-max BYTES] [--json OUT] [--dump FINAL_BYTES_FILE]
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import dataclasses
import errno
import hashlib
import json
import mmap
import os
import random
import sys
import time

KIB = 1 << 10
MIB = 1 << 20
PAGE = mmap.ALLOCATIONGRANULARITY
FALLOC_FL_KEEP_SIZE = 0x01

PROFILES: dict[str, dict[str, int]] = {
    "mixed": {"pread": 20, "pwrite": 25, "truncate": 8, "mmap_read": 6, "mmap_write": 6,
              "fallocate": 4, "fallocate_keep": 3, "fsync": 3, "reopen": 3},
    "small": {"pread": 40, "pwrite": 45, "truncate": 2, "mmap_read": 2, "mmap_write": 1,
              "fallocate": 2, "fsync": 5, "reopen": 3},
    "mmap": {"mmap_read": 35, "mmap_write": 35, "pread": 8, "pwrite": 8, "truncate": 6,
             "fallocate": 2, "fsync": 3, "reopen": 3},
    "truncate": {"truncate": 40, "pwrite": 20, "pread": 20, "fallocate": 6,
                 "fallocate_keep": 4, "mmap_read": 3, "mmap_write": 3, "fsync": 2,
                 "reopen": 2},
}

_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS}


class RandomIOError(AssertionError):
    pass


@dataclasses.dataclass
class Report:
    path: str
    profile: str
    seed: int
    ops: int                       # operations done
    seconds: float
    counts: dict[str, int]         # operation -> how many times it ran
    unsupported: dict[str, str]    # operation -> errno name the file system answered
    drops: int                     # page-cache drops
    size: int                      # final size
    sha256: str                    # of the final content
    data: bytes | None = None      # the final content (None when read back from JSON)

    def summary(self) -> str:
        unsup = (", unsupported: " + ", ".join(f"{k} ({v})" for k, v in self.unsupported.items())
                 if self.unsupported else "")
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        return (f"{self.profile} seed {self.seed}: {self.ops} ops in {self.seconds:.1f}s "
                f"({self.ops / max(self.seconds, 1e-9):.0f}/s), final size {self.size}, "
                f"{self.drops} cache drops{unsup}; {counts}")

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("data")
        return d


def drop_page_cache() -> None:
    """os.sync(), then drop the page cache, dentries and inodes (needs root)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


_libc = ctypes.CDLL(None, use_errno=True)
_fallocate = _libc.fallocate64
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_fallocate.restype = ctypes.c_int


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    if _fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _first_diff(a, b) -> int:
    """First offset where ``a`` and ``b`` differ (the shorter length if one is a
    prefix of the other); -1 if equal."""
    if a == b:
        return -1
    n = min(len(a), len(b))
    lo, hi = 0, n
    while hi - lo > 4096:  # bisect on slices (C-speed compares), then scan
        mid = (lo + hi) // 2
        if a[lo:mid] != b[lo:mid]:
            hi = mid
        else:
            lo = mid
    for i in range(lo, hi):
        if a[i] != b[i]:
            return i
    return n


def _errname(e: OSError) -> str:
    return errno.errorcode.get(e.errno, str(e.errno)) if e.errno is not None else "?"


class _Checker:
    def __init__(self, path_dir: str, ops: int, seed: int, profile: str, drop_caches,
                 size_max: int, drop_every: int, full_every: int, window: int):
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r} (one of {', '.join(PROFILES)})")
        self.rnd = random.Random(f"{profile}-{seed}")
        self.ops, self.seed, self.profile = ops, seed, profile
        self.drop_caches, self.drop_every = drop_caches, drop_every
        self.full_every, self.window = full_every, window
        self.size_max = size_max
        self.path = os.path.join(path_dir, f"rio-{profile}-{seed}")
        self.model = bytearray()
        self.history: collections.deque[str] = collections.deque(maxlen=20)
        self.counts: collections.Counter[str] = collections.Counter()
        self.unsupported: dict[str, str] = {}
        self.weights = dict(PROFILES[profile])
        self.index = -1
        self.touched = (0, 0)  # the range the last operation touched
        self.drops = 0
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    # ------------------------------------------------------------- failures
    def fail(self, what: str, offset: int | None = None) -> None:
        lines = [f"{self.path}: {what}",
                 f"  at op #{self.index} of {self.ops} (profile {self.profile}, seed "
                 f"{self.seed}); model size {len(self.model)}"]
        if offset is not None:
            lines.append(f"  first differing offset {offset} "
                         f"(block {offset // MIB} of 1 MiB, page {offset // 4096})")
        lines.append("  last operations (oldest first):")
        lines.extend(f"    {h}" for h in self.history)
        raise RandomIOError("\n".join(lines))

    def call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OSError as e:
            self.fail(f"{what} failed: {_errname(e)} ({e.strerror})")

    # ------------------------------------------------------------- reading back
    def pread_all(self, n: int, off: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.call("pread", os.pread, self.fd, n - len(out), off + len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def check_size(self, where: str = "") -> None:
        st = self.call("fstat", os.fstat, self.fd)
        if st.st_size != len(self.model):
            self.fail(f"fstat().st_size is {st.st_size}, expected {len(self.model)}{where}")

    def check_range(self, off: int, n: int, where: str) -> None:
        want = self.model[off:off + n]
        got = self.pread_all(n, off)
        if got != want:
            d = _first_diff(got, want)
            extra = (f" (read returned {len(got)} bytes, expected {len(want)})"
                     if len(got) != len(want) else "")
            self.fail(f"{where}: content at [{off}, {off + n}) differs{extra}", off + d)

    def check_window(self) -> None:
        size = len(self.model)
        if size == 0:
            return
        a, b = self.touched
        if b > a and self.rnd.random() < 0.5:
            lo = max(0, min(a, size) - 512)
            hi = min(size, b + 512)
            if hi - lo > self.window:
                lo = self.rnd.randrange(lo, hi - self.window + 1)
                hi = lo + self.window
        else:
            lo = self.rnd.randrange(0, size)
            hi = min(size, lo + self.rnd.randrange(1, self.window + 1))
        # reading 1 past the end also checks that nothing is there
        self.check_range(lo, hi - lo + (1 if hi == size else 0), "window check")

    def check_full(self, where: str) -> None:
        size = len(self.model)
        off = 0
        while True:
            n = min(MIB, size - off)
            last = off + n >= size
            # the last chunk reads 1 byte more: nothing may be past the end
            got = self.pread_all(n + (1 if last else 0), off)
            want = self.model[off:off + n]
            if got != want:
                d = _first_diff(got, want)
                extra = (f" (read returned {len(got)} bytes where {len(want)} were expected)"
                         if len(got) != len(want) else "")
                self.fail(f"{where}: whole-file check differs{extra}", off + d)
            off += n
            if last:
                return

    # ------------------------------------------------------------- choices
    def io_size(self) -> int:
        if self.profile == "small":
            return 4096
        return max(1, min(256 * KIB, int(2 ** self.rnd.uniform(0, 18))))

    def write_offset(self, n: int) -> int:
        size = len(self.model)
        limit = max(0, self.size_max - n)
        if self.profile == "small":
            top = min(limit, size + 4 * 4096) // 4096
            return self.rnd.randint(0, top) * 4096
        r = self.rnd.random()
        if self.profile == "truncate" and r < 0.5:  # around the end
            off = size + self.rnd.randint(-64 * KIB, 64 * KIB)
        elif r < 0.12:  # past the end: a hole, then data
            off = size + self.rnd.randint(1, 2 * MIB)
        elif r < 0.2 and size:  # across a 1 MiB block boundary
            off = (self.rnd.randint(0, size) // MIB) * MIB - self.rnd.randint(0, n)
        else:
            off = self.rnd.randint(0, size)
        return max(0, min(off, limit))

    def read_range(self) -> tuple[int, int]:
        size = len(self.model)
        n = self.io_size()
        if self.profile == "small":
            off = self.rnd.randint(0, max(0, size + 4096) // 4096) * 4096
        elif self.rnd.random() < 0.1:
            off = size + self.rnd.randint(-n, 4096)  # across / past the end
        else:
            off = self.rnd.randint(0, size)
        return max(0, off), n

    def new_size(self) -> int:
        size = len(self.model)
        r = self.rnd.random()
        if self.profile == "small":
            s = self.rnd.randint(0, self.size_max // 4096) * 4096
        elif r < 0.15:  # exactly at / one off a block or page boundary
            unit = self.rnd.choice((MIB, 4096))
            s = self.rnd.randint(0, self.size_max // unit) * unit + self.rnd.choice((-1, 0, 1))
        elif r < 0.2:
            s = 0
        elif (r < 0.6 and size < 0.75 * self.size_max) or size == 0:  # grow
            s = size + int(2 ** self.rnd.uniform(0, 21))
        else:  # shrink
            s = self.rnd.randint(0, size)
        return max(0, min(s, self.size_max))

    def map_range(self) -> tuple[int, int] | None:
        """(offset, length) inside the current size, or None for an empty file."""
        size = len(self.model)
        if size == 0:
            return None
        off = self.rnd.randrange(0, size)
        n = min(size - off, self.io_size() if self.profile != "mmap"
                else int(2 ** self.rnd.uniform(0, 19)))
        return off, max(1, n)

    # ------------------------------------------------------------- operations
    def op_pread(self) -> None:
        off, n = self.read_range()
        self.history.append(f"#{self.index} pread off={off} n={n}")
        self.touched = (off, off + n)
        got = self.call("pread", os.pread, self.fd, n, off)
        want = self.model[off:off + n]
        if got != want:
            if len(got) < len(want) and got == want[:len(got)]:
                # a short read of a regular file is legal only at the end
                rest = self.pread_all(len(want) - len(got), off + len(got))
                if got + rest == want:
                    return
            d = _first_diff(got, want)
            self.fail(f"pread(n={n}, off={off}) returned {len(got)} bytes, expected "
                      f"{len(want)}; content differs", off + d)

    def op_pwrite(self) -> None:
        n = self.io_size()
        off = self.write_offset(n)
        data = self.rnd.randbytes(n)
        size = len(self.model)
        self.history.append(f"#{self.index} pwrite off={off} n={n}"
                            + (f" (hole of {off - size})" if off > size else ""))
        self.touched = (off, off + n)
        got = self.call("pwrite", os.pwrite, self.fd, data, off)
        if got != n:
            self.fail(f"pwrite(n={n}, off={off}) returned {got}")
        if off > size:
            self.model.extend(bytes(off - size))
        self.model[off:off + n] = data

    def op_truncate(self) -> None:
        old, new = len(self.model), self.new_size()
        self.history.append(f"#{self.index} ftruncate {old} -> {new}")
        self.touched = (min(old, new) - 4096, max(old, new) + 4096)
        self.call("ftruncate", os.ftruncate, self.fd, new)
        if new < old:
            del self.model[new:]
        else:
            self.model.extend(bytes(new - old))

    def op_mmap_read(self) -> None:
        r = self.map_range()
        if r is None:
            return self.op_pwrite()
        off, n = r
        base = off - off % PAGE
        self.history.append(f"#{self.index} mmap read off={off} n={n} (map [{base}, {off + n}))")
        self.touched = (off, off + n)
        m = self.call("mmap", mmap.mmap, self.fd, off + n - base, mmap.MAP_SHARED,
                      mmap.PROT_READ, offset=base)
        try:
            got = m[off - base:off - base + n]
        finally:
            m.close()
        want = self.model[off:off + n]
        if got != want:
            self.fail(f"mmap read of [{off}, {off + n}) differs", off + _first_diff(got, want))

    def op_mmap_write(self) -> None:
        r = self.map_range()
        if r is None:
            return self.op_pwrite()
        off, n = r
        base = off - off % PAGE
        data = self.rnd.randbytes(n)
        sync = self.rnd.random() < 0.3
        self.history.append(f"#{self.index} mmap write off={off} n={n} (map [{base}, "
                            f"{off + n})){' + msync' if sync else ''}")
        self.touched = (off, off + n)
        m = self.call("mmap", mmap.mmap, self.fd, off + n - base, mmap.MAP_SHARED,
                      mmap.PROT_READ | mmap.PROT_WRITE, offset=base)
        try:
            m[off - base:off - base + n] = data
            if sync:
                self.call("msync", m.flush)
        finally:
            m.close()
        self.model[off:off + n] = data

    def _fallocate(self, name: str, mode: int) -> None:
        if name in self.unsupported:
            return self.op_pwrite()
        size = len(self.model)
        n = max(1, int(2 ** self.rnd.uniform(0, 21)))
        off = self.rnd.randint(0, size + MIB) if self.rnd.random() < 0.5 else \
            self.rnd.randint(max(0, size - n), size + 4096)
        off = max(0, min(off, self.size_max - n))
        n = max(1, min(n, self.size_max - off))
        self.history.append(f"#{self.index} fallocate mode={mode:#x} off={off} n={n}")
        self.touched = (off, off + n)
        try:
            fallocate(self.fd, mode, off, n)
        except OSError as e:
            if e.errno in _UNSUPPORTED:
                self.unsupported[name] = _errname(e)
                self.history.append(f"#{self.index}   -> {_errname(e)}: not tried again")
                return
            self.fail(f"fallocate(mode={mode:#x}, off={off}, len={n}) failed: "
                      f"{_errname(e)} ({e.strerror})")
        if not mode & FALLOC_FL_KEEP_SIZE and off + n > size:
            self.model.extend(bytes(off + n - size))

    def op_fallocate(self) -> None:
        self._fallocate("fallocate", 0)

    def op_fallocate_keep(self) -> None:
        self._fallocate("fallocate_keep", FALLOC_FL_KEEP_SIZE)

    def op_fsync(self) -> None:
        self.history.append(f"#{self.index} fsync")
        self.touched = (0, 0)
        self.call("fsync", os.fsync, self.fd)

    def op_reopen(self) -> None:
        self.history.append(f"#{self.index} close + open O_RDWR")
        self.touched = (0, 0)
        self.call("close", os.close, self.fd)
        self.fd = -1
        self.fd = self.call("open", os.open, self.path, os.O_RDWR)

    # ------------------------------------------------------------- run
    def run(self) -> Report:
        t0 = time.monotonic()
        names = list(self.weights)
        try:
            for self.index in range(self.ops):
                if self.drop_caches is not None and self.index and \
                        self.index % self.drop_every == 0:
                    self.history.append(f"#{self.index} drop page cache")
                    self.drop_caches()
                    self.drops += 1
                weights = [0 if (n in self.unsupported) else self.weights[n] for n in names]
                name = self.rnd.choices(names, weights)[0]
                self.counts[name] += 1
                getattr(self, "op_" + name)()
                self.check_size(f" after {name}")
                self.check_window()
                if (self.index + 1) % self.full_every == 0:
                    self.check_full(f"after op #{self.index}")
            self.index = self.ops
            self.history.append("end: whole-file check through the open handle")
            self.check_size(" at the end")
            self.check_full("at the end")
            self.history.append("end: close, reopen O_RDONLY, whole-file check")
            self.call("close", os.close, self.fd)
            self.fd = self.call("open", os.open, self.path, os.O_RDONLY)
            self.check_size(" after close and reopen")
            self.check_full("after close and reopen")
        finally:
            if self.fd >= 0:
                os.close(self.fd)
        data = bytes(self.model)
        return Report(path=self.path, profile=self.profile, seed=self.seed, ops=self.ops,
                      seconds=time.monotonic() - t0, counts=dict(self.counts),
                      unsupported=dict(self.unsupported), drops=self.drops, size=len(data),
                      sha256=hashlib.sha256(data).hexdigest(), data=data)


def check_file_ops(path_dir: str, ops: int = 10_000, seed: int = 0, profile: str = "mixed",
                   drop_caches=None, size_max: int = 8 << 20, *, drop_every: int = 500,
                   full_every: int = 100, window: int = 64 * KIB) -> Report:
    """Run ``ops`` random operations of ``profile`` on one new file in ``path_dir``,
    checking size and content after each; RandomIOError on the first divergence."""
    return _Checker(path_dir, ops, seed, profile, drop_caches, size_max, drop_every,
                    full_every, window).run()


# --------------------------------------------------------------------------- subprocess

def run_in_subprocess(path_dir: str, ops: int = 10_000, seed: int = 0,
                      profile: str = "mixed", drop_caches: bool = False,
                      size_max: int = 8 << 20, timeout: float = 300.0,
                      dump: str | None = None, workdir: str | None = None,
                      ) -> tuple[Report | None, str]:
    """check_file_ops in a child process (an mmap access that gets SIGBUS, or a hung
    call, then kills the child, not the caller).  (report, "") when it passed; (None,
    what went wrong) otherwise.  ``dump``: the child writes the final bytes there."""
    import shutil
    import signal
    import subprocess
    import tempfile
    tmp = tempfile.mkdtemp(prefix="rio-", dir=workdir)
    try:
        out = os.path.join(tmp, "report.json")
        argv = [sys.executable, "-X", "faulthandler", os.path.abspath(__file__), path_dir,
                "--ops", str(ops), "--seed", str(seed), "--profile", profile,
                "--size-max", str(size_max), "--json", out]
        if drop_caches:
            argv.append("--drop-caches")
        if dump:
            argv += ["--dump", dump]
        cmd = " ".join(argv)
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            try:
                text, _ = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                text = b"(the child did not die of SIGKILL within 30 s: stuck in the kernel)"
            return None, (f"timed out after {timeout:g}s (a hung call, or far too slow)\n"
                          f"  command: {cmd}\n{text.decode(errors='replace')[-3000:]}")
        text = text.decode(errors="replace")
        if p.returncode == 0 and os.path.exists(out):
            with open(out) as f:
                return Report(**json.load(f)), ""
        how = (f"killed by {signal.Signals(-p.returncode).name}" if p.returncode < 0
               else f"exit status {p.returncode}")
        return None, f"{how}\n  command: {cmd}\n{text[-6000:]}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="mixed", choices=sorted(PROFILES))
    ap.add_argument("--size-max", type=int, default=8 << 20)
    ap.add_argument("--drop-caches", action="store_true",
                    help="drop the page cache every 500 operations (root)")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--dump", help="write the final content here")
    a = ap.parse_args(argv)
    try:
        rep = check_file_ops(a.dir, a.ops, a.seed, a.profile,
                             drop_page_cache if a.drop_caches else None, a.size_max)
    except RandomIOError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    if a.dump:
        with open(a.dump, "wb") as f:
            f.write(rep.data)
    if a.json:
        tmp = a.json + ".part"
        with open(tmp, "w") as f:
            json.dump(rep.to_json(), f)
        os.replace(tmp, a.json)
    print(rep.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
