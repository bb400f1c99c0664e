"""A small synchronous, path-based API over the client library (CLI and tests).

    fs = CurvineFS("127.0.0.1:8995")
    fs.mkdir("/l2cache", parents=True)
    fs.put("/tmp/chunk.bin", "/l2cache/chunk.data")
    data = fs.read_bytes("/l2cache/chunk.data")

Paths are absolute, ``str`` (encoded with the file system encoding) or ``bytes``.
Every failure is a ``CurvineError``.  Writes follow the FUSE client's rules: one
private version per write, published atomically at the end.
"""

from __future__ import annotations

import os
import time
from typing import Iterator

from curvine.common.config import Config, master_addrs, read_members
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import MIB, ROOT_INO, check_name, host_id
from curvine.common.security import Security
from curvine.proto import common_pb2

from ..blocks import block_client
from .file_reader import FileReader
from .file_writer import FileWriter, LocalWorker
from ..master.master_client import MasterClient

Inode = common_pb2.Inode
CHUNK = MIB


def split(path: str | bytes) -> list[bytes]:
    p = os.fsencode(path)
    if not p.startswith(b"/"):
        raise CurvineError(ErrorKind.INVALID, f"path: {os.fsdecode(p)!r} is not absolute")
    return [check_name(c, "path") for c in p.split(b"/") if c and c != b"."]


class CurvineFS:
    """Path operations against one master; thread-safe like the clients it wraps."""

    def __init__(self, master_addr: str | list[str] | None = None, cfg: Config | None = None,
                 master: MasterClient | None = None):
        self.cfg = cfg or Config()
        # the token and TLS keys every channel of this client uses: the given master
        # client's, else those ``cfg`` names
        self.master = master or MasterClient(master_addr or master_addrs(self.cfg),
                                             timeout=self.cfg.cluster.rpc_timeout,
                                             wait=self.cfg.cluster.master_wait,
                                             security=Security.load(self.cfg),
                                             call_port=self.cfg.client.call_port,
                                             read_from=read_members(self.cfg))
        self.security = self.master.security
        self.host = host_id()
        # The only dirs short-circuit reads and writes may open: this configuration's
        # (client.short_circuit_dirs, else worker.data_dirs), never a worker's report.
        self.local_dirs = block_client.LocalDirs.from_config(self.cfg)
        # shared by this client's writers
        self._local_worker = LocalWorker(self.host, self.local_dirs)
        self._block_size: int | None = None
        self._inline_max = 0  # the master's (StatFs), with the block size

    def __enter__(self) -> "CurvineFS":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.master.close()

    # -- names ------------------------------------------------------------------

    def resolve(self, path: str | bytes) -> Inode:
        """The inode at ``path``, one Lookup per name from the root.  An error names
        the part of the path that is missing or not a directory (``/a: no such file or
        directory`` for ``/a/b``)."""
        node = self.master.getattr(ROOT_INO)
        walked = b""
        for name in split(path):
            if node.type != common_pb2.DIRECTORY:
                raise CurvineError(ErrorKind.NOT_DIR, f"{os.fsdecode(walked)}: not a directory")
            walked += b"/" + name
            child = self.master.lookup_or_none(node.ino, name)
            if child is None:
                raise CurvineError(ErrorKind.NOT_FOUND,
                                   f"{os.fsdecode(walked)}: no such file or directory")
            node = child
        return node

    def parent(self, path: str | bytes) -> tuple[Inode, bytes]:
        """The directory that holds ``path`` (not the root), and the last name of it."""
        parts = split(path)
        if not parts:
            raise CurvineError(ErrorKind.INVALID, "path: the root has no parent")
        directory = b"/" + b"/".join(parts[:-1])
        parent = self.resolve(directory)
        if parent.type != common_pb2.DIRECTORY:
            raise CurvineError(ErrorKind.NOT_DIR, f"{os.fsdecode(directory)}: not a directory")
        return parent, parts[-1]

    def stat(self, path: str | bytes) -> Inode:
        return self.resolve(path)

    def exists(self, path: str | bytes) -> bool:
        try:
            self.resolve(path)
            return True
        except CurvineError as e:
            if e.kind in (ErrorKind.NOT_FOUND, ErrorKind.NOT_DIR):
                return False
            raise

    def listdir(self, path: str | bytes = "/") -> list[tuple[bytes, Inode]]:
        """(name, inode) of every entry, in name order."""
        node = self.resolve(path)
        if node.type != common_pb2.DIRECTORY:
            raise CurvineError(ErrorKind.NOT_DIR, f"{os.fsdecode(path)}: not a directory")
        return [(e.name, e.inode) for e in self.master.iterdir(node.ino)]

    def mkdir(self, path: str | bytes, mode: int = 0o755, parents: bool = False,
              exist_ok: bool = False, timeout: float | None = None) -> Inode:
        """``timeout``: for the whole of a ``parents`` walk (None: each call's own)."""
        if parents:
            end = None if timeout is None else time.monotonic() + timeout

            def left() -> float | None:
                if end is None:
                    return None
                t = end - time.monotonic()
                if t <= 0:
                    raise CurvineError(ErrorKind.TIMEOUT, f"mkdir {os.fsdecode(path)}: no "
                                                          f"answer within {timeout:g}s")
                return t

            node = self.master.getattr(ROOT_INO, left())
            for name in split(path):
                try:
                    node = self.master.lookup(node.ino, name, left())
                except CurvineError as e:
                    if e.kind != ErrorKind.NOT_FOUND:
                        raise
                    try:
                        node = self.master.mkdir(node.ino, name, mode, os.getuid(),
                                                 os.getgid(), timeout=left())
                    except CurvineError as e2:  # made meanwhile by someone else
                        if e2.kind != ErrorKind.EXISTS:
                            raise
                        node = self.master.lookup(node.ino, name, left())
            if node.type != common_pb2.DIRECTORY:
                raise CurvineError(ErrorKind.NOT_DIR, f"{os.fsdecode(path)}: not a directory")
            return node
        parent, name = self.parent(path)
        try:
            return self.master.mkdir(parent.ino, name, mode, os.getuid(), os.getgid())
        except CurvineError as e:
            if exist_ok and e.kind == ErrorKind.EXISTS:
                node = self.master.lookup(parent.ino, name)
                if node.type == common_pb2.DIRECTORY:
                    return node
            raise

    def unlink(self, path: str | bytes) -> None:
        parent, name = self.parent(path)
        self.master.unlink(parent.ino, name)

    def rmdir(self, path: str | bytes) -> None:
        parent, name = self.parent(path)
        self.master.rmdir(parent.ino, name)

    def rename(self, src: str | bytes, dst: str | bytes, no_replace: bool = False) -> None:
        sp, sn = self.parent(src)
        dp, dn = self.parent(dst)
        self.master.rename(sp.ino, sn, dp.ino, dn, no_replace=no_replace)

    # -- data -------------------------------------------------------------------

    def block_size(self, timeout: float | None = None) -> int:
        if self._block_size is None:
            fs = self.master.statfs(timeout)
            self._inline_max = fs.inline_max
            self._block_size = fs.block_size or self.cfg.cluster.block_size
        return self._block_size

    def open_reader(self, path: str | bytes) -> FileReader:
        """A reader of the file's current version (close it when done)."""
        node = self.resolve(path)
        if node.type == common_pb2.DIRECTORY:
            raise CurvineError(ErrorKind.IS_DIR, f"{os.fsdecode(path)}: is a directory")
        if node.type != common_pb2.FILE:  # symlinks are not followed here; specials
            raise CurvineError(ErrorKind.INVALID, f"{os.fsdecode(path)}: not a regular file")
        _, blocks, workers = self.master.get_blocks(node.ino)
        return FileReader(blocks, workers, short_circuit=self.cfg.client.short_circuit,
                          timeout=self.cfg.cluster.rpc_timeout,
                          readahead=self.cfg.client.readahead_blocks,
                          local_dirs=self.local_dirs, security=self.security)

    def iter_read(self, path: str | bytes, chunk: int = CHUNK) -> Iterator[bytes]:
        reader = self.open_reader(path)
        try:
            off = 0
            while off < reader.size:
                data = reader.read(off, chunk)
                if not data:
                    break
                yield bytes(data)
                off += len(data)
        finally:
            reader.close()

    def read_bytes(self, path: str | bytes) -> bytes:
        return b"".join(self.iter_read(path))

    def open_writer(self, path: str | bytes, mode: int = 0o644,
                    size_hint: int = 0) -> FileWriter:
        """An empty new version of ``path`` (created if missing); ``publish()`` it.
        ``size_hint``: the bytes that will be written, if known (placement reserves
        them; without it the first block is placed once its size is known)."""
        parent, name = self.parent(path)
        node = self.master.create(parent.ino, name, mode, os.getuid(), os.getgid())
        return FileWriter(self.master, node.ino, self.block_size(), [], self.host,
                          short_circuit=self.cfg.client.short_circuit,
                          timeout=self.cfg.cluster.rpc_timeout, size_hint=size_hint,
                          local_worker=self._local_worker, local_dirs=self.local_dirs,
                          inline_max=self._inline_max)

    def write_bytes(self, path: str | bytes, data: bytes, mode: int = 0o644) -> Inode:
        w = self.open_writer(path, mode, size_hint=len(data))
        try:
            w.write(0, data)
            return w.publish()
        finally:
            w.close()

    def put(self, local_path: str, remote_path: str | bytes, mode: int | None = None) -> Inode:
        """Copy a local file in; published when complete, so readers see all or nothing."""
        with open(local_path, "rb") as f:
            st = os.fstat(f.fileno())
            perm = mode if mode is not None else st.st_mode & 0o7777
            w = self.open_writer(remote_path, perm, size_hint=st.st_size)
            try:
                off = 0
                buf = bytearray(CHUNK)
                while True:
                    n = f.readinto(buf)
                    if not n:
                        break
                    w.write(off, memoryview(buf)[:n])
                    off += n
                return w.publish()
            finally:
                w.close()

    def get(self, remote_path: str | bytes, local_path: str) -> int:
        """Copy a file out; returns the bytes written."""
        n = 0
        with open(local_path, "wb") as f:
            for data in self.iter_read(remote_path):
                f.write(data)
                n += len(data)
        return n
