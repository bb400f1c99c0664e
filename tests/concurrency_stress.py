"""A concurrency stress workload for curvine mounts (issue 31), fsstress-like, checked.

Several processes work for a bounded time in ONE directory tree on two (or more) mounts
of one cluster: create, write (sequential, at random offsets, into holes of sparse
files made by ftruncate), read back, truncate (down and up), rename (across directories,
over existing targets), hard-link, unlink, mkdir/rmdir, fsync; LMCache-style chunk
stores (``<key>.tmp`` written with O_TRUNC, renamed to ``<key>.data``) read from the
other mount; and many short-lived readers of multi-block files (the background
prefetch of the next block racing the handle's close: issue 31).

Every byte is checkable.  File contents are a function of (seed, absolute offset)
(:func:`gen`); each process owns its files and keeps a model of each (extents of
seeds, holes read as zeros), so every read of its own files is compared byte for byte.
Shared files are touched only in ways whose outcome is checkable: a chunk carries a
header (magic, seed, length) and a reader checks that it sees one whole version; a
published multi-block file never changes until it is unlinked.

Any mismatch, any unexpected errno (EIO, EBADF, ENOENT on an own file, ...) and any
operation that takes longer than ``--op-timeout`` (a watchdog) is a failure.  At the
end every process reads all its files back through every mount.

    python tests/concurrency_stress.py --mounts M0 M1 --seconds 60 --procs 4

prints one JSON line ``RESULT {...}`` (ops per kind, failures) and exits 1 on any
failure.
"""

from __future__ import annotations

import argparse
import bisect
import errno
import faulthandler
import hashlib
import json
import multiprocessing
import os
import random
import signal
import sys
import threading
import time
import traceback

MIB = 1 << 20
KIB = 1 << 10
CHUNK = 64 * KIB  # unit of generated content
PERIOD = 61  # bytes of a chunk's pattern (not a power of two: page shifts show)
MAGIC = b"CVSTRESS"
HEADER = 32  # MAGIC, seed id (u64), length (u64), crc of the first 8 bytes... (u64)
INLINE_MAX = 256 * KIB
BLOCK = 64 * MIB  # the default block size
SHARED_DIRS = ("d0", "d1", "d2", "d3")
CHUNK_KEYS = 12
MAX_FAILURES = 40  # recorded per process


# --------------------------------------------------------------------------- content

def _chunk(seed: bytes, k: int) -> bytes:
    d = hashlib.blake2b(seed + k.to_bytes(8, "little"), digest_size=PERIOD).digest()
    return (d * (CHUNK // PERIOD + 1))[:CHUNK]


def gen(seed: bytes, start: int, end: int) -> bytes:
    """The bytes at absolute offsets [start, end) of content ``seed``."""
    if end <= start:
        return b""
    out = []
    k = start // CHUNK
    pos = start
    while pos < end:
        c = _chunk(seed, k)
        lo = pos - k * CHUNK
        hi = min(CHUNK, end - k * CHUNK)
        out.append(c[lo:hi])
        pos = k * CHUNK + hi
        k += 1
    return b"".join(out)


class Model:
    """What one file (inode) holds: extents (start, end, seed) over zeros, and its size."""

    def __init__(self):
        self.size = 0
        self.ext: list[tuple[int, int, bytes]] = []  # sorted, disjoint
        self.names: set[str] = set()

    def _cut(self, a: int, b: int) -> None:
        out = []
        for s, e, seed in self.ext:
            if e <= a or s >= b:
                out.append((s, e, seed))
                continue
            if s < a:
                out.append((s, a, seed))
            if e > b:
                out.append((b, e, seed))
        self.ext = sorted(out)

    def write(self, off: int, n: int, seed: bytes) -> None:
        if n <= 0:
            return
        self._cut(off, off + n)
        bisect.insort(self.ext, (off, off + n, seed))
        self.size = max(self.size, off + n)

    def truncate(self, n: int) -> None:
        if n < self.size:
            self._cut(n, self.size)
        self.size = n

    def expected(self, a: int, b: int) -> bytes:
        b = min(b, self.size)
        if b <= a:
            return b""
        out, pos = [], a
        for s, e, seed in self.ext:
            if e <= a or s >= b:
                continue
            s2, e2 = max(s, a), min(e, b)
            if s2 > pos:
                out.append(bytes(s2 - pos))
            out.append(gen(seed, s2, e2))
            pos = e2
        if pos < b:
            out.append(bytes(b - pos))
        return b"".join(out)


def chunk_bytes(seed_id: int, length: int) -> bytes:
    """An LMCache-style chunk: a header naming its version and length, then content."""
    head = MAGIC + seed_id.to_bytes(8, "little") + length.to_bytes(8, "little")
    head += hashlib.blake2b(head, digest_size=8).digest()
    return head + gen(b"chunk%d" % seed_id, HEADER, length)


def check_chunk(data: bytes) -> str | None:
    """None if ``data`` is one whole chunk version (or empty: a name renamed while its
    writer had not published yet), else what is wrong."""
    if not data:
        return None
    if len(data) < HEADER or data[:8] != MAGIC:
        return f"no chunk header ({len(data)} bytes, starts {data[:16]!r})"
    if hashlib.blake2b(data[:24], digest_size=8).digest() != data[24:32]:
        return "chunk header damaged"
    seed_id = int.from_bytes(data[8:16], "little")
    length = int.from_bytes(data[16:24], "little")
    if length != len(data):
        return f"chunk version {seed_id} says {length} bytes, read {len(data)}"
    want = gen(b"chunk%d" % seed_id, HEADER, length)
    if data[HEADER:] != want:
        return f"chunk version {seed_id}: content differs at {first_diff(data[HEADER:], want) + HEADER}"
    return None


def first_diff(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    lo = 0
    step = 1 << 16
    while lo < n and a[lo:lo + step] == b[lo:lo + step]:
        lo += step
    for i in range(lo, min(n, lo + step)):
        if a[i] != b[i]:
            return i
    return n


# --------------------------------------------------------------------------- one process

class Failure(Exception):
    pass


class Worker:
    def __init__(self, idx: int, mounts: list[str], root: str, deadline: float, seed: int,
                 out: str, op_timeout: float, big: bool):
        self.i = idx
        self.mounts = mounts
        self.root = root
        self.deadline = deadline
        self.rng = random.Random(seed * 1000 + idx)
        self.out = open(out, "a", buffering=1)
        self.op_timeout = op_timeout
        self.big = big
        self.files: dict[str, Model] = {}  # own name (relative to root) -> its model
        self.dirs: set[str] = set()  # own dirs (relative), removable
        self.tally: dict[str, int] = {}
        self.failures = 0
        self.n = 0
        self.current: tuple[str, str, float] | None = None
        self.big_files: list[tuple[str, int]] = []  # own published multi-block files

    # ---- helpers
    def p(self, rel: str, mount: str | None = None) -> str:
        return os.path.join(mount or self.rng.choice(self.mounts), self.root, rel)

    def seed(self) -> bytes:
        self.n += 1
        return b"p%d.%d" % (self.i, self.n)

    def new_name(self, d: str | None = None) -> str:
        self.n += 1
        if d is None:
            d = self.rng.choice(list(SHARED_DIRS) + sorted(self.dirs))
        return f"{d}/p{self.i}-f{self.n}"

    def count(self, kind: str, k: int = 1) -> None:
        self.tally[kind] = self.tally.get(kind, 0) + k

    def fail(self, what: str, **detail) -> None:
        self.failures += 1
        self.count("FAILURES")
        if self.failures <= MAX_FAILURES:
            rec = {"proc": self.i, "t": round(time.monotonic() - self.t0, 2), "fail": what, **detail}
            self.out.write(json.dumps(rec, default=str) + "\n")

    def size_pick(self) -> int:
        r = self.rng.random()
        if r < 0.08:
            return 0
        if r < 0.45:
            return self.rng.randint(1, INLINE_MAX)
        if r < 0.55:
            return self.rng.randint(INLINE_MAX + 1, MIB)
        if r < 0.97:
            return self.rng.randint(MIB, 20 * MIB)
        return self.rng.randint(BLOCK + 1, BLOCK + 16 * MIB)

    def write_all(self, fd: int, off: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view[:4 * MIB], off)
            if n <= 0:
                raise Failure(f"pwrite returned {n}")
            view, off = view[n:], off + n

    def read_all(self, fd: int, off: int, n: int) -> bytes:
        parts = []
        while n > 0:
            b = os.pread(fd, min(n, 4 * MIB), off)
            if not b:
                break
            parts.append(b)
            off += len(b)
            n -= len(b)
        return b"".join(parts)

    def verify(self, m: Model, fd: int, off: int, n: int, what: str, path: str) -> None:
        """Read [off, off+n) from ``fd`` and compare it with the model (what lies past
        the end must not be read)."""
        data = self.read_all(fd, off, n)
        want = m.expected(off, off + n)
        if data != want:
            self.fail("content mismatch", op=what, path=path, offset=off, got_len=len(data),
                      want_len=len(want), first_diff=off + first_diff(data, want),
                      got=data[first_diff(data, want):][:16].hex() if data else "",
                      want=want[first_diff(data, want):][:16].hex() if want else "",
                      model_size=m.size)
            self.count("mismatch")
        else:
            self.count("verified_bytes", len(data))

    # ---- own files
    def op_create(self) -> None:
        rel = self.new_name()
        m = Model()
        size = self.size_pick()
        seed = self.seed()
        path = self.p(rel)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            if self.rng.random() < 0.3 and size > 2 * MIB:
                # pieces in reverse order: more than one block, cheaply
                piece = self.rng.choice([256 * KIB, 512 * KIB, MIB])
                starts = list(range(0, size, piece))[::-1]
                for s in starts:
                    self.write_all(fd, s, gen(seed, s, min(size, s + piece)))
            else:
                self.write_all(fd, 0, gen(seed, 0, size))
            m.write(0, size, seed)
            if self.rng.random() < 0.2:
                os.fsync(fd)
        finally:
            os.close(fd)
        m.names.add(rel)
        self.files[rel] = m
        self.count("create")
        self.count("written_bytes", size)

    def op_sparse(self) -> None:
        rel = self.new_name()
        m = Model()
        path = self.p(rel)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        try:
            size = self.rng.choice([1 << 30, 256 * MIB, 70 * MIB])
            os.ftruncate(fd, size)
            m.truncate(size)
            for _ in range(self.rng.randint(1, 4)):
                off = self.rng.randrange(0, size - MIB)
                n = self.rng.randint(1, MIB)
                seed = self.seed()
                self.write_all(fd, off, gen(seed, off, off + n))
                m.write(off, n, seed)
            # a write past the end through a seek: a hole before it
            end = size + self.rng.randint(0, 3 * MIB)
            os.lseek(fd, end, os.SEEK_SET)
            seed = self.seed()
            data = gen(seed, end, end + 4096)
            os.write(fd, data)
            m.write(end, len(data), seed)
            if self.rng.random() < 0.5:
                os.fsync(fd)
        finally:
            os.close(fd)
        m.names.add(rel)
        self.files[rel] = m
        self.count("sparse_create")

    def pick(self) -> tuple[str, Model] | None:
        if not self.files:
            return None
        rel = self.rng.choice(list(self.files))
        return rel, self.files[rel]

    def op_overwrite(self) -> None:
        got = self.pick()
        if not got:
            return
        rel, m = got
        if m.size > 4 * BLOCK:
            return
        path = self.p(rel)
        size = self.size_pick()
        seed = self.seed()
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            self.write_all(fd, 0, gen(seed, 0, size))
        finally:
            os.close(fd)
        m.truncate(0)
        m.write(0, size, seed)
        self.count("overwrite_trunc")
        self.count("written_bytes", size)

    def op_pwrite(self) -> None:
        got = self.pick()
        if not got:
            return
        rel, m = got
        path = self.p(rel)
        rdwr = self.rng.random() < 0.6
        fd = os.open(path, os.O_RDWR if rdwr else os.O_WRONLY)
        try:
            for _ in range(self.rng.randint(1, 3)):
                limit = max(m.size, 1) + self.rng.choice([0, 0, 64 * KIB, 2 * MIB])
                off = self.rng.randrange(0, limit)
                n = self.rng.choice([1, 17, 4096, 65536, 300 * KIB, MIB, 3 * MIB])
                seed = self.seed()
                self.write_all(fd, off, gen(seed, off, off + n))
                m.write(off, n, seed)
                self.count("written_bytes", n)
            if self.rng.random() < 0.25:
                os.fsync(fd)
                self.count("fsync")
            if rdwr and self.rng.random() < 0.5:
                # its own writes, read back through the same descriptor
                off = self.rng.randrange(0, max(1, m.size))
                n = min(self.rng.choice([4096, MIB]), m.size - off)
                self.verify(m, fd, off, n, "read-own-writes", path)
                self.count("read_own_writes")
        finally:
            os.close(fd)
        self.count("pwrite")

    def op_truncate(self) -> None:
        got = self.pick()
        if not got:
            return
        rel, m = got
        path = self.p(rel)
        if self.rng.random() < 0.5:
            n = self.rng.randrange(0, max(1, m.size))  # down
        else:
            n = m.size + self.rng.randint(1, 8 * MIB)  # up: a hole
        if self.rng.random() < 0.5:
            os.truncate(path, n)
        else:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, n)
            finally:
                os.close(fd)
        self.count("truncate_down" if n < m.size else "truncate_up")
        m.truncate(n)

    def op_read(self) -> None:
        got = self.pick()
        if not got:
            return
        rel, m = got
        mount = self.rng.choice(self.mounts)
        path = self.p(rel, mount)
        st = os.stat(path)
        if st.st_size != m.size:
            self.fail("size mismatch", path=path, stat_size=st.st_size, model_size=m.size)
        fd = os.open(path, os.O_RDONLY)
        try:
            if m.size <= 24 * MIB:
                self.verify(m, fd, 0, m.size + 1, "read-whole", path)
            else:
                for _ in range(4):
                    off = self.rng.randrange(0, m.size)
                    n = self.rng.choice([4096, 100_000, MIB, 2 * MIB])
                    self.verify(m, fd, off, n, "read-range", path)
        finally:
            os.close(fd)
        self.count("read")

    def op_rename(self) -> None:
        got = self.pick()
        if not got:
            return
        rel, m = got
        targets = [t for t in self.files if t != rel and self.files[t] is not m]
        if targets and self.rng.random() < 0.4:
            dst = self.rng.choice(targets)  # over an existing target
            victim = self.files[dst]
            victim.names.discard(dst)
            kind = "rename_over"
        else:
            dst = self.new_name()
            victim = None
            kind = "rename"
        mount = self.rng.choice(self.mounts)  # both names on one mount (else EXDEV)
        os.rename(self.p(rel, mount), self.p(dst, mount))
        del self.files[rel]
        m.names.discard(rel)
        m.names.add(dst)
        self.files[dst] = m
        del victim
        self.count(kind)

    def op_link(self) -> None:
        got = self.pick()
        if not got:
            return
        rel, m = got
        dst = self.new_name()
        mount = self.rng.choice(self.mounts)
        os.link(self.p(rel, mount), self.p(dst, mount))
        m.names.add(dst)
        self.files[dst] = m
        self.count("link")

    def op_unlink(self) -> None:
        got = self.pick()
        if not got:
            return
        rel, m = got
        os.unlink(self.p(rel))
        m.names.discard(rel)
        del self.files[rel]
        self.count("unlink")

    def op_dirs(self) -> None:
        empty = [d for d in self.dirs if not any(f.startswith(d + "/") for f in self.files)]
        if empty and (len(self.dirs) > 3 or self.rng.random() < 0.4):
            d = self.rng.choice(empty)
            os.rmdir(self.p(d))
            self.dirs.discard(d)
            self.count("rmdir")
            return
        self.n += 1
        d = f"{self.rng.choice(SHARED_DIRS)}/p{self.i}-dir{self.n}"
        os.mkdir(self.p(d))
        self.dirs.add(d)
        self.count("mkdir")
        if self.files and self.rng.random() < 0.5:  # move a file into it
            rel, m = self.pick()
            dst = self.new_name(d)
            mount = self.rng.choice(self.mounts)
            os.rename(self.p(rel, mount), self.p(dst, mount))
            del self.files[rel]
            m.names.discard(rel)
            m.names.add(dst)
            self.files[dst] = m
            self.count("rename_into_dir")

    # ---- shared: LMCache-style chunks
    def op_chunk_store(self) -> None:
        key = self.rng.randrange(CHUNK_KEYS)
        self.n += 1
        seed_id = self.i * 10_000_000 + self.n
        length = self.rng.choice([HEADER + 100, 200 * KIB, MIB, 4 * MIB, 16 * MIB])
        data = chunk_bytes(seed_id, length)
        mount = self.rng.choice(self.mounts)
        tmp = self.p(f"chunks/k{key}.tmp", mount)
        fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
        try:
            self.write_all(fd, 0, data)
        finally:
            os.close(fd)
        try:
            os.rename(tmp, self.p(f"chunks/k{key}.data", mount))
            self.count("chunk_store")
        except FileNotFoundError:  # another store renamed the shared tmp name first
            self.count("chunk_store_tmp_gone")

    def op_chunk_read(self) -> None:
        key = self.rng.randrange(CHUNK_KEYS)
        path = self.p(f"chunks/k{key}.data")
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            self.count("chunk_miss")
            return
        try:
            data = self.read_all(fd, 0, 64 * MIB)
        finally:
            os.close(fd)
        problem = check_chunk(data)
        if problem:
            self.fail("chunk not one whole version", path=path, problem=problem)
        self.count("chunk_read" if data else "chunk_read_empty")

    def op_chunk_evict(self) -> None:
        key = self.rng.randrange(CHUNK_KEYS)
        try:
            os.unlink(self.p(f"chunks/k{key}.data"))
            self.count("chunk_evict")
        except FileNotFoundError:
            self.count("chunk_miss")

    # ---- shared: published multi-block files, read by short-lived readers
    def op_big_publish(self) -> None:
        """A multi-block file, immutable once under big/ (written under another name and
        renamed there), its content a function of its name."""
        self.n += 1
        name = f"p{self.i}-b{self.n}"
        size = self.rng.choice([BLOCK + 24 * MIB, BLOCK + 32 * MIB, 2 * BLOCK + 8 * MIB])
        if self.rng.random() < 0.5:
            size = self.rng.choice([6 * MIB, 12 * MIB])  # reverse-written: several blocks
        seed = name.encode()
        mount = self.rng.choice(self.mounts)
        tmp = self.p(f"big/.{name}.tmp", mount)
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            if size < BLOCK:
                piece = 512 * KIB
                for s in list(range(0, size, piece))[::-1]:
                    self.write_all(fd, s, gen(seed, s, min(size, s + piece)))
            else:
                self.write_all(fd, 0, gen(seed, 0, size))
        finally:
            os.close(fd)
        os.rename(tmp, self.p(f"big/{name}-{size}", mount))
        self.big_files.append((f"big/{name}-{size}", size))
        self.count("big_publish")
        self.count("written_bytes", size)
        while len(self.big_files) > 3:
            old, _ = self.big_files.pop(0)
            os.unlink(self.p(old))
            self.count("big_unlink")

    def op_big_read(self) -> None:
        """A short-lived reader: open a published multi-block file (anyone's), read a
        little at a random place (usually in its first block, so that the next block
        is prefetched in the background), close at once."""
        mount = self.rng.choice(self.mounts)
        d = os.path.join(mount, self.root, "big")
        names = [n for n in os.listdir(d) if not n.startswith(".")]
        if not names:
            return
        name = self.rng.choice(names)
        size = int(name.rsplit("-", 1)[1])
        own = any(rel == f"big/{name}" for rel, _ in self.big_files)
        path = os.path.join(d, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if own:
                raise
            self.count("big_read_gone")
            return
        try:
            with_cache = self.rng.random() < 0.3
            if not with_cache:  # a read the kernel must ask the mount for
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            first = min(size, BLOCK) if self.rng.random() < 0.8 else size
            off = self.rng.randrange(0, first)
            n = self.rng.choice([4096, 64 * KIB, MIB])
            data = self.read_all(fd, off, n)
        finally:
            os.close(fd)
        want = gen(name.encode().rsplit(b"-", 1)[0], off, min(size, off + n))
        if data != want:
            self.fail("content mismatch", op="big-read", path=path, offset=off,
                      got_len=len(data), want_len=len(want),
                      first_diff=off + first_diff(data, want))
        else:
            self.count("verified_bytes", len(data))
        self.count("big_read")

    def op_big_hold(self) -> None:
        """A reader that keeps a multi-block file open for a while and reads pieces of
        it, each one asked of the mount (a descriptor of the mount closed under it, or
        reused for another file, shows as an error or as other bytes)."""
        mount = self.rng.choice(self.mounts)
        d = os.path.join(mount, self.root, "big")
        names = [n for n in os.listdir(d) if not n.startswith(".")]
        if not names:
            return
        name = self.rng.choice(names)
        size = int(name.rsplit("-", 1)[1])
        own = any(rel == f"big/{name}" for rel, _ in self.big_files)
        path = os.path.join(d, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if own:
                raise
            self.count("big_read_gone")
            return
        seed = name.encode().rsplit(b"-", 1)[0]
        try:
            for _ in range(self.rng.randint(3, 10)):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                off = self.rng.randrange(0, size)
                n = self.rng.choice([4096, 64 * KIB, 256 * KIB])
                data = self.read_all(fd, off, n)
                want = gen(seed, off, min(size, off + n))
                if data != want:
                    self.fail("content mismatch", op="big-hold", path=path, offset=off,
                              got_len=len(data), want_len=len(want),
                              first_diff=off + first_diff(data, want))
                    break
                self.count("verified_bytes", len(data))
                time.sleep(self.rng.random() * 0.05)
        finally:
            os.close(fd)
        self.count("big_hold")

    # ---- the loop
    def ops(self):
        mixed = [(self.op_create, 10), (self.op_sparse, 1), (self.op_overwrite, 4),
                 (self.op_pwrite, 10), (self.op_truncate, 5), (self.op_read, 14),
                 (self.op_rename, 5), (self.op_link, 2), (self.op_unlink, 4),
                 (self.op_dirs, 3), (self.op_chunk_store, 5), (self.op_chunk_read, 8),
                 (self.op_chunk_evict, 1), (self.op_big_read, 10), (self.op_big_hold, 3)]
        big = [(self.op_big_publish, 6), (self.op_big_read, 40), (self.op_big_hold, 4),
               (self.op_chunk_read, 3), (self.op_create, 2), (self.op_read, 2)]
        return big if self.big else mixed

    def run(self) -> None:
        self.t0 = time.monotonic()
        ops = self.ops()
        fns = [f for f, _ in ops]
        weights = [w for _, w in ops]
        threading.Thread(target=self.watchdog, daemon=True).start()
        if self.big:
            self.guard("big_publish", self.op_big_publish)
        while time.monotonic() < self.deadline:
            fn = self.rng.choices(fns, weights)[0]
            if len(self.files) > 40 and fn in (self.op_create, self.op_sparse):
                fn = self.op_unlink
            self.guard(fn.__name__[3:], fn)
        self.guard("final_verify", self.final_verify)
        self.current = None
        self.out.write(json.dumps({"proc": self.i, "tally": self.tally}) + "\n")

    def guard(self, kind: str, fn) -> None:
        self.current = (kind, "", time.monotonic())
        try:
            fn()
        except Failure as e:
            self.fail(str(e), op=kind)
        except OSError as e:
            self.fail(f"{kind}: {type(e).__name__} errno {e.errno} "
                      f"({errno.errorcode.get(e.errno, '?')}): {e}", op=kind,
                      tb=traceback.format_exc(limit=4))
            self.count(f"errno_{errno.errorcode.get(e.errno, e.errno)}")
            # the model no longer knows what this op did: forget the file it touched
            self.resync()
        finally:
            self.current = None

    def resync(self) -> None:
        """After a failed op on own files: drop the models whose state is unknown (their
        names stay on the mount; they are no longer checked)."""
        for rel in list(self.files):
            try:
                st = os.stat(self.p(rel, self.mounts[0]))
            except OSError:
                del self.files[rel]
                continue
            if st.st_size != self.files[rel].size:
                del self.files[rel]

    def final_verify(self) -> None:
        for rel, m in list(self.files.items()):
            for mount in self.mounts:
                path = self.p(rel, mount)
                self.current = ("final_verify", path, time.monotonic())
                fd = os.open(path, os.O_RDONLY)
                try:
                    if m.size <= 24 * MIB:
                        self.verify(m, fd, 0, m.size + 1, "final", path)
                    else:
                        for off in (0, m.size // 2, max(0, m.size - MIB)):
                            self.verify(m, fd, off, MIB, "final", path)
                finally:
                    os.close(fd)
        self.count("final_verified_files", len(self.files))

    def watchdog(self) -> None:
        while True:
            time.sleep(1.0)
            cur = self.current
            if cur is not None and time.monotonic() - cur[2] > self.op_timeout:
                self.fail("hang", op=cur[0], seconds=round(time.monotonic() - cur[2], 1))
                self.out.write(json.dumps({"proc": self.i, "tally": self.tally,
                                           "hung": cur[0]}) + "\n")
                self.out.flush()
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                os._exit(4)


def _worker_main(idx, mounts, root, deadline, seed, out, op_timeout, big):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    w = Worker(idx, mounts, root, deadline, seed, out, op_timeout, big)
    try:
        w.run()
    except BaseException as e:  # noqa: BLE001 - reported, never silent
        w.fail(f"worker crashed: {e!r}", tb=traceback.format_exc())
        w.out.write(json.dumps({"proc": idx, "tally": w.tally}) + "\n")
        raise


# --------------------------------------------------------------------------- driver

def run(mounts: list[str], seconds: float, procs: int = 4, root: str = "stress",
        seed: int | None = None, op_timeout: float = 60.0, big_procs: int = 1,
        outdir: str | None = None, log=print) -> dict:
    """Run the workload; returns {"ops": {kind: n}, "failures": [...], "hung": [...],
    "seconds": elapsed, "seed": seed}."""
    import tempfile
    seed = int(time.time()) if seed is None else seed
    outdir = outdir or tempfile.mkdtemp(prefix="curvine-stress-")
    top = os.path.join(mounts[0], root)
    os.makedirs(top, exist_ok=True)
    for d in (*SHARED_DIRS, "chunks", "big"):
        os.makedirs(os.path.join(top, d), exist_ok=True)
    ctx = multiprocessing.get_context("fork")
    t0 = time.monotonic()
    deadline = t0 + seconds
    ps = []
    for i in range(procs):
        out = os.path.join(outdir, f"p{i}.jsonl")
        p = ctx.Process(target=_worker_main, name=f"stress-{i}",
                        args=(i, mounts, root, deadline, seed, out, op_timeout, i < big_procs))
        p.start()
        ps.append(p)
    # every process ends by itself (the deadline, then its final check; the watchdog
    # ends one that hangs); this is the last resort
    hard = deadline + op_timeout + 120
    for p in ps:
        p.join(max(0.0, hard - time.monotonic()))
    hung = []
    for p in ps:
        if p.is_alive():
            hung.append(p.name)
            p.kill()
            p.join(10)
    ops: dict[str, int] = {}
    failures, exits = [], {}
    for i, p in enumerate(ps):
        exits[p.name] = p.exitcode
        path = os.path.join(outdir, f"p{i}.jsonl")
        tallied = False
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if "tally" in rec:
                    tallied = True
                    for k, v in rec["tally"].items():
                        ops[k] = ops.get(k, 0) + v
                    if rec.get("hung"):
                        hung.append(f"{p.name} in {rec['hung']}")
                else:
                    failures.append(rec)
        if p.exitcode != 0 and not tallied:
            failures.append({"proc": i, "fail": f"exited {p.exitcode} without a report"})
    result = {"seconds": round(time.monotonic() - t0, 1), "seed": seed, "procs": procs,
              "ops": dict(sorted(ops.items())), "failures": failures, "hung": hung,
              "exits": exits, "outdir": outdir}
    return result


def summary(result: dict) -> str:
    lines = [f"{result['procs']} processes, {result['seconds']} s, seed {result['seed']}"]
    ops = result["ops"]
    width = max((len(k) for k in ops), default=0)
    lines += [f"  {k.ljust(width)} {v}" for k, v in ops.items()]
    if result["hung"]:
        lines.append("HUNG: " + ", ".join(result["hung"]))
    for f in result["failures"][:30]:
        lines.append("FAIL " + json.dumps(f, default=str)[:1500])
    if len(result["failures"]) > 30:
        lines.append(f"... {len(result['failures']) - 30} more failures")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mounts", nargs="+", required=True, help="mount points of one cluster")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--big-procs", type=int, default=1,
                    help="of them, processes that publish multi-block files and read them "
                         "with short-lived readers (the others run the mixed workload)")
    ap.add_argument("--root", default="stress", help="directory (on the mounts) to work in")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--op-timeout", type=float, default=60.0,
                    help="an operation taking longer is a hang (the process is stopped)")
    ap.add_argument("--outdir", help="where the processes' reports go (default: a temp dir)")
    args = ap.parse_args(argv)
    result = run(args.mounts, args.seconds, args.procs, args.root, args.seed,
                 args.op_timeout, args.big_procs, args.outdir)
    print(summary(result), flush=True)
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return 1 if result["failures"] or result["hung"] else 0


if __name__ == "__main__":
    sys.exit(main())
