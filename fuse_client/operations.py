"""The FUSE request handlers: one ``Operations`` class, thin handlers.

Each handler resolves its handle or inode, checks what the kernel cannot, and
delegates to the client library (master_client, file_reader, file_writer).  Master
inode numbers are the FUSE inode numbers (root = 1).  Every master or worker call
and every disk read runs in a thread through one capacity limiter, so the trio
loop never blocks.  Errors leave a handler only as ``FUSEError(errno)``, translated
in one place (:func:`_fuse_op`).

Publication follows DESIGN consistency rule 1: each open-for-write is its own
version (direct_io, so the kernel page cache never merges two handles), published
by CompleteFile at flush (close), fsync and release.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import pyfuse3
import trio

from curvine.client.file_reader import FileReader
from curvine.client.file_writer import FileWriter, LocalWorker
from curvine.client.master_client import AccessReporter, LeaseSession, MasterClient
from curvine.common.config import Config
from curvine.common.errors import CurvineError, ErrorKind, to_errno
from curvine.common.ids import MIB, check_name, host_id
from curvine.common.metrics import FUSE_LOOKUP_ERROR, FUSE_LOOKUP_HIT, FUSE_LOOKUP_MISS
from curvine.proto import common_pb2

from .calls import Calls, CallStream
from .kernel import Epoch, fuse_device_fd

log = logging.getLogger(__name__)

Inode = common_pb2.Inode
DIRECTORY = common_pb2.DIRECTORY
COMPLETE = common_pb2.COMPLETE

STATFS_BLOCK = 4096
LISTDIR_PAGE = 1000
VERSION_CACHE = 100_000  # inodes whose last opened version this mount remembers
LEASE_SAFETY = 0.2  # seconds the kernel's copy expires before the master's lease
DIR_CACHE = 100_000  # directories whose attributes this mount keeps (fuse.attr_timeout)
_LOUD_KINDS = {ErrorKind.IO, ErrorKind.UNAVAILABLE, ErrorKind.CHECKSUM, ErrorKind.TIMEOUT,
               ErrorKind.UNAUTHENTICATED}


def _fuse_op(fn):
    """The one place where failures become errnos.

    User errors (ENOENT, EEXIST, ...) are logged at DEBUG; cluster trouble as one
    WARNING line; anything unexpected once with its traceback, as EIO."""

    @functools.wraps(fn)
    async def wrapper(self, *args):
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError:
            raise
        except CurvineError as e:
            level = logging.WARNING if e.kind in _LOUD_KINDS else logging.DEBUG
            log.log(level, "%s%s: %s", fn.__name__, _brief(args), e)
            raise pyfuse3.FUSEError(to_errno(e.kind)) from None
        except Exception:  # noqa: BLE001 - a bug must not take the mount down
            log.exception("%s%s failed", fn.__name__, _brief(args))
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


def _brief(args) -> str:
    """Inode/handle numbers and names of a request, for a log line (never data)."""
    shown = []
    for a in args[:3]:
        if isinstance(a, int):
            shown.append(str(a))
        elif isinstance(a, bytes):
            shown.append(repr(a) if len(a) <= 255 else f"<{len(a)} bytes>")
    return "(" + ", ".join(shown) + ")"


@dataclass
class _File:
    ino: int
    reader: FileReader | None = None
    writer: FileWriter | None = None
    inode: Inode | None = None  # as of open (or the handle's last publish)
    tgid: int = 0  # the process that opened it (writers)
    # Created by this handle and never published: it reads as empty everywhere already,
    # so close publishes nothing and release publishes the empty version afterwards
    # (if_unpublished), unless the handle wrote and published something.
    publish_empty: bool = False
    empty_closed: bool = False  # flushed with publish_empty: counted in _empty_pending
    # (lease session, open id) this reader's open was recorded with at the master: the
    # file is not evicted until release reports it closed
    recorded_open: tuple[int, int] = (0, 0)


def _tgid(pid: int) -> int:
    """The process (thread group) of a request's thread id."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return pid


def _close_file(f: _File) -> None:
    if f.writer is not None:
        f.writer.close()
    if f.reader is not None:
        f.reader.close()


@dataclass
class _Dir:
    ino: int
    entries: list = field(default_factory=list)  # (name, Inode), in listing order
    after: bytes = b""  # the last name loaded from the master
    done: bool = False


class Operations(pyfuse3.Operations):
    """curvine as a FUSE file system."""

    supports_dot_lookup = True

    def __init__(self, cfg: Config, master: MasterClient | None = None):
        super().__init__()
        self.cfg = cfg
        self.enable_writeback_cache = cfg.fuse.writeback_cache
        self.master = master or MasterClient(cfg.cluster.master_addr,
                                             timeout=cfg.cluster.rpc_timeout,
                                             wait=cfg.cluster.master_wait)
        self.limiter = trio.CapacityLimiter(max(1, cfg.client.rpc_threads))
        self.host = host_id()
        self._fh = itertools.count(1)
        self._files: dict[int, _File] = {}
        self._dirs: dict[int, _Dir] = {}
        self._writers: dict[int, list[int]] = {}  # ino -> write handles, last used last
        self._handles: dict[int, set[int]] = {}  # ino -> every open file handle
        self._versions: OrderedDict[int, int] = OrderedDict()  # ino -> version last opened
        # ino -> handles closed (flushed) with their empty version still to publish
        self._empty_pending: dict[int, int] = {}
        self._block_size: int | None = None  # the master's, asked for at the first write
        self._local_worker = LocalWorker(self.host)  # shared by this mount's writers
        # Leases (master/leases.py): names and file attributes the kernel may keep for
        # the lease time; the master revokes them before another client changes them.
        self._leases: LeaseSession | None = None
        # namespace calls: on the Calls stream once start_streams() opened it
        self._calls = Calls(self.master, self._run)
        self._epoch: Epoch | None = None
        self._leased_inodes: dict[int, float] = {}  # ino -> when the kernel's copy expires
        self._kernel_lock = threading.Lock()  # notifications vs unmount (pyfuse3.close)
        self._unmounting = False
        self._prune_leased_at = 4096
        # Directory attributes as last seen from the master (a GETATTR, or the parent
        # attributes a create/unlink/rename here returned): the kernel drops its copy
        # after every change in the directory and needs it for each permission check
        # (default_permissions), so without this every create, stat and unlink in a
        # flat directory cost one more round trip.  Answered for at most
        # fuse.attr_timeout after they were fetched: the staleness the kernel's own
        # cache always had.
        self._dir_attrs: OrderedDict[int, tuple[Inode, float]] = OrderedDict()
        self._read_buf = bytearray(MIB)  # reads answered in the loop (read_cached)
        # opens for reading, reported to the master in batches (LRU eviction)
        self._access = AccessReporter(self.master, float(cfg.client.access_report_interval))

    # -- helpers --------------------------------------------------------------

    async def _run(self, fn, *args, **kwargs):
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs),
                                             limiter=self.limiter)

    def _writer_of(self, ino: int, fh: int | None = None) -> FileWriter | None:
        """The write handle ``fh`` if given, else the last-used one of ``ino`` here."""
        if fh is not None:
            f = self._files.get(fh)
            if f is not None and f.writer is not None:
                return f.writer
        fhs = self._writers.get(ino)
        # a handle being released is out of _files while it publishes
        f = self._files.get(fhs[-1]) if fhs else None
        return f.writer if f is not None else None

    def _touch_writer(self, fh: int, ino: int) -> None:
        fhs = self._writers.setdefault(ino, [])
        if not fhs or fhs[-1] != fh:
            if fh in fhs:
                fhs.remove(fh)
            fhs.append(fh)

    # -- leases -------------------------------------------------------------------

    def start_streams(self) -> bool:
        """After pyfuse3.init: open the Calls stream, and the lease session if the
        kernel can expire every cached name at once (fuse_client/kernel.py); True when
        leases are on."""
        self._access.start()
        if self._calls.stream is None and self.cfg.fuse.call_stream:
            stream = CallStream(self.master, float(self.cfg.cluster.rpc_timeout))
            stream.start()
            self._calls.stream = stream
        if not self.cfg.fuse.leases or self._leases is not None:
            return False
        self._epoch = Epoch(fuse_device_fd())
        if not self._epoch.supported:
            return False
        self._leases = LeaseSession(self.master, self._invalidate, self._drop_all)
        self._leases.start()
        return True

    def stop_streams(self) -> None:
        """Before unmounting: no kernel notification may follow (pyfuse3.close frees
        the session they go through)."""
        with self._kernel_lock:
            self._unmounting = True
        if self._leases is not None:
            self._leases.stop()
        if self._calls.stream is not None:
            self._calls.stream.stop()

    def _invalidate(self, names, inodes) -> None:
        """The master revokes leases (session thread): drop the kernel's copies before
        the ack.  Every cached name goes (one lock-free epoch bump; a lookup in flight
        is stale on arrival), plus the attributes of the inodes named."""
        with self._kernel_lock:
            if self._unmounting:
                return
            self._epoch.bump()
            for ino in inodes:
                self._leased_inodes.pop(ino, None)
                self._forget_attrs(ino)

    def _drop_all(self) -> None:
        """The session is lost (session thread): drop every leased copy."""
        self._invalidate((), list(self._leased_inodes))

    def _lease_inode(self, ino: int, lease: float) -> None:
        now = time.monotonic()
        leased = self._leased_inodes
        leased[ino] = now + lease
        if len(leased) > self._prune_leased_at:  # forget expired ones now and then
            for i, t in list(leased.items()):  # only this thread adds entries
                if t < now:
                    leased.pop(i, None)
            self._prune_leased_at = 2 * len(leased) + 4096

    @staticmethod
    def _forget_attrs(ino: int) -> None:
        try:
            pyfuse3.invalidate_inode(ino, attr_only=True)
        except OSError as e:
            if e.errno != errno.ENOENT:  # ENOENT: the kernel has no such inode cached
                raise

    def _note_dirs(self, *nodes: Inode | None) -> None:
        now = time.monotonic()
        cache = self._dir_attrs
        for n in nodes:
            if n is not None and n.type == DIRECTORY:
                cache[n.ino] = (n, now)
                cache.move_to_end(n.ino)
        while len(cache) > DIR_CACHE:
            cache.popitem(last=False)

    def _cached_dir(self, ino: int) -> pyfuse3.EntryAttributes | None:
        entry = self._dir_attrs.get(ino)
        if entry is None:
            return None
        left = self.cfg.fuse.attr_timeout - (time.monotonic() - entry[1])
        if left <= 0:
            self._dir_attrs.pop(ino, None)
            return None
        attrs = self._attrs(entry[0])
        attrs.attr_timeout = left
        return attrs

    @staticmethod
    def _lease_ttl(lease_ms: int, sent: float) -> float:
        """Seconds the kernel may keep a leased answer: the lease counts from when the
        master granted it, which is after ``sent``."""
        if not lease_ms:
            return 0.0
        return max(0.0, lease_ms / 1000 - (time.monotonic() - sent) - LEASE_SAFETY)

    def _attrs(self, inode: Inode, size: int | None = None,
               lease: float = 0.0) -> pyfuse3.EntryAttributes:
        """Entry attributes; ``lease``: seconds the master leased the name (and a file's
        attributes) to this mount, else the configured timeouts apply."""
        e = pyfuse3.EntryAttributes()
        is_dir = inode.type == DIRECTORY
        if size is None:
            size = inode.size
            if not is_dir and inode.state != COMPLETE:
                # Nothing is published yet (readers see an empty file): show the size
                # this mount is writing, as a local file system would.  Once a version
                # is published its size is reported, never a writer's partial one, or
                # a reader here would be cut short (consistency rule 1).
                w = self._writer_of(inode.ino)
                if w is not None:
                    size = w.size
        e.st_ino = inode.ino
        e.generation = 0
        e.entry_timeout = self.cfg.fuse.entry_timeout
        e.attr_timeout = self.cfg.fuse.attr_timeout
        if lease > 0:
            e.entry_timeout = max(lease, e.entry_timeout)
            # a directory's attributes change with every entry: never leased; nor the
            # size of a file this mount writes (computed here, see above)
            if not is_dir and not self._writers.get(inode.ino):
                e.attr_timeout = max(lease, e.attr_timeout)
                self._lease_inode(inode.ino, lease)
        e.st_mode = (stat.S_IFDIR if is_dir else stat.S_IFREG) | (inode.mode & 0o7777)
        e.st_nlink = inode.nlink or (2 if is_dir else 1)
        e.st_uid = inode.uid
        e.st_gid = inode.gid
        e.st_rdev = 0
        e.st_size = size
        e.st_blksize = MIB
        e.st_blocks = (size + 511) // 512
        e.st_atime_ns = inode.atime_ns
        e.st_mtime_ns = inode.mtime_ns
        e.st_ctime_ns = inode.ctime_ns
        return e

    def _remember_version(self, ino: int, version: int) -> bool:
        """Record the version opened; True if it equals the one opened before."""
        same = self._versions.get(ino) == version
        self._versions[ino] = version
        self._versions.move_to_end(ino)
        while len(self._versions) > VERSION_CACHE:
            self._versions.popitem(last=False)
        return same

    def _new_writer(self, ino: int, truncate: bool) -> FileWriter:
        """A private version of ``ino``: empty, or starting from its current blocks.
        Runs in a thread."""
        blocks, workers = [], {}
        if not truncate:
            inode, blocks, workers = self.master.get_blocks(ino)
            if inode.type == DIRECTORY:
                raise CurvineError(ErrorKind.IS_DIR, f"inode {ino} is a directory")
        if self._block_size is None:
            # Block lengths must not exceed the master's block size.
            fs = self.master.statfs()
            self._block_size = fs.block_size or self.cfg.cluster.block_size
            self._local_worker.note(fs.workers)  # where first blocks go
        w = FileWriter(self.master, ino, self._block_size, blocks, self.host,
                       workers=workers, short_circuit=self.cfg.client.short_circuit,
                       timeout=self.cfg.cluster.rpc_timeout, local_worker=self._local_worker)
        # An emptied (or new) file is published at close even without writes.
        w.dirty = truncate
        return w

    def _new_reader(self, ino: int) -> tuple[Inode, FileReader, tuple[int, int]]:
        session, open_id = self.master.session, self._access.new_open_id()
        inode, blocks, workers = self.master.get_blocks(ino, session, open_id)
        if inode.type == DIRECTORY:
            self._access.closed(session, open_id)
            raise CurvineError(ErrorKind.IS_DIR, f"inode {ino} is a directory")
        reader = FileReader(blocks, workers, short_circuit=self.cfg.client.short_circuit,
                            timeout=self.cfg.cluster.rpc_timeout,
                            readahead=self.cfg.client.readahead_blocks)
        return inode, reader, (session, open_id)

    def _add_file(self, f: _File) -> int:
        fh = next(self._fh)
        self._files[fh] = f
        self._handles.setdefault(f.ino, set()).add(fh)
        if f.writer is not None:
            self._touch_writer(fh, f.ino)
        return fh

    def _open_snapshot(self, ino: int) -> pyfuse3.EntryAttributes | None:
        """Attributes of an inode that is gone from the namespace but still open here:
        its readers keep going (DESIGN consistency rule 4), and the kernel asks for
        attributes before it reads past what it has cached."""
        for fh in self._handles.get(ino, ()):
            f = self._files[fh]
            if f.inode is not None:
                size = f.reader.size if f.reader is not None else f.writer.size
                attrs = self._attrs(f.inode, size)
                attrs.st_nlink = 0
                return attrs
        return None

    def _file(self, fh: int) -> _File:
        f = self._files.get(fh)
        if f is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return f

    async def _publish(self, f: _File) -> None:
        if f.writer is None or not f.writer.dirty:
            return
        try:
            inode = await self._run(self._flush_writer, f.writer, f.ino)
            if inode is not None:
                f.inode = inode
                f.publish_empty = False
        except CurvineError as e:
            if e.kind != ErrorKind.NOT_FOUND:
                raise
            # The file was unlinked (or replaced by a rename) while being written:
            # like writes to an unlinked local file, the data just goes away.
            log.debug("inode %d is gone, dropping its unpublished version: %s", f.ino, e)
            f.writer.dirty = False

    def _flush_writer(self, writer: FileWriter, ino: int) -> Inode | None:
        """Publish (in a thread); this mount's kernel may hold leased attributes of the
        old version, which the master does not revoke from the writer itself."""
        inode = writer.flush()
        if inode is not None and ino in self._leased_inodes:
            with self._kernel_lock:
                if not self._unmounting:
                    self._leased_inodes.pop(ino, None)
                    self._forget_attrs(ino)
        return inode

    async def _publish_empty(self, ino: int, mtime_ns: int = 0) -> None:
        """Publish the empty version of a file created here, unless some writer has
        published one meanwhile (theirs is newer than our create)."""
        try:
            await self._calls.run("complete", ino, [], 0, mtime_ns, True)
        except CurvineError as e:
            if e.kind != ErrorKind.NOT_FOUND:
                raise
            log.debug("inode %d is gone, nothing to publish: %s", ino, e)

    # -- names and attributes ----------------------------------------------------

    @_fuse_op
    async def lookup(self, parent_inode, name, ctx=None):
        if name == b".":
            inode = await self._run(self.master.getattr, parent_inode)
            self._note_dirs(inode)
        elif name == b"..":
            inode = await self._run(self.master.getattr, parent_inode)
            inode = await self._run(self.master.getattr, inode.parent or parent_inode)
            self._note_dirs(inode)
        else:
            check_name(name)
            # One RPC; a miss is a plain reply, not an error status (LMCache's miss path).
            sent = time.monotonic()
            try:
                inode, lease_ms = await self._calls.run("lookup", parent_inode, name)
            except Exception:
                FUSE_LOOKUP_ERROR.inc()
                raise
            if inode is None:
                FUSE_LOOKUP_MISS.inc()
                raise pyfuse3.FUSEError(errno.ENOENT)
            FUSE_LOOKUP_HIT.inc()
            self._note_dirs(inode)
            return self._attrs(inode, lease=self._lease_ttl(lease_ms, sent))
        return self._attrs(inode)

    @_fuse_op
    async def getattr(self, inode, ctx=None):
        cached = self._cached_dir(inode)
        if cached is not None:
            return cached
        try:
            sent = time.monotonic()
            node, lease_ms = await self._calls.run("getattr", inode)
            self._note_dirs(node)
            return self._attrs(node, lease=self._lease_ttl(lease_ms, sent))
        except CurvineError as e:
            attrs = self._open_snapshot(inode) if e.kind == ErrorKind.NOT_FOUND else None
            if attrs is None:
                raise
            return attrs

    @_fuse_op
    async def setattr(self, inode, attr, fields, fh, ctx):
        w = self._writer_of(inode, fh)
        size = None
        changes = {}
        if fields.update_size:
            if w is not None:
                await self._run(w.truncate, attr.st_size)
                size = w.size
            else:
                changes["size"] = attr.st_size
        if fields.update_mode:
            changes["mode"] = attr.st_mode & 0o7777
        if fields.update_uid:
            changes["uid"] = attr.st_uid
        if fields.update_gid:
            changes["gid"] = attr.st_gid
        if fields.update_atime:
            changes["atime_ns"] = attr.st_atime_ns
        if fields.update_mtime:
            changes["mtime_ns"] = attr.st_mtime_ns
            if w is not None:
                w.mtime_ns = attr.st_mtime_ns  # kept when the handle publishes
        if changes:
            node = await self._run(self.master.setattr, inode, **changes)
        else:
            node = await self._run(self.master.getattr, inode)
        self._note_dirs(node)
        return self._attrs(node, size)

    @_fuse_op
    async def mkdir(self, parent_inode, name, mode, ctx):
        check_name(name)
        sent = time.monotonic()
        inode, lease_ms, parent = await self._calls.run("mkdir", parent_inode, name,
                                                        mode & 0o7777, ctx.uid, ctx.gid)
        self._note_dirs(inode, parent)
        return self._attrs(inode, lease=self._lease_ttl(lease_ms, sent))

    @_fuse_op
    async def rmdir(self, parent_inode, name, ctx):
        check_name(name)
        self._note_dirs(await self._calls.run("rmdir", parent_inode, name))

    @_fuse_op
    async def unlink(self, parent_inode, name, ctx):
        check_name(name)
        self._note_dirs(await self._calls.run("unlink", parent_inode, name))

    @_fuse_op
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        if flags & pyfuse3.RENAME_EXCHANGE or flags & ~pyfuse3.RENAME_NOREPLACE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        check_name(name_old)
        check_name(name_new)
        # Only the process writing a never-published file may move it (see
        # RenameRequest.require_published, checked by the master with the rename): the
        # files the caller writes here, and files closed here without data whose empty
        # version release has yet to publish (so `touch a; mv a b` works at once).
        mine = list(self._empty_pending)
        if self._writers:
            caller = await self._run(_tgid, ctx.pid)
            mine += [f.ino for f in self._files.values()
                     if f.writer is not None and f.tgid == caller]
        changed = await self._calls.run(
            "rename", parent_inode_old, name_old, parent_inode_new, name_new,
            no_replace=bool(flags & pyfuse3.RENAME_NOREPLACE), require_published=True,
            writer_inos=mine)
        if changed:
            self._note_dirs(*changed)

    @_fuse_op
    async def statfs(self, ctx):
        r = await self._run(self.master.statfs)
        s = pyfuse3.StatvfsData()
        s.f_bsize = STATFS_BLOCK
        s.f_frsize = STATFS_BLOCK
        s.f_blocks = r.capacity // STATFS_BLOCK
        s.f_bfree = max(0, r.capacity - r.used) // STATFS_BLOCK
        s.f_bavail = s.f_bfree
        free_inodes = 1 << 32
        s.f_files = r.files + free_inodes
        s.f_ffree = free_inodes
        s.f_favail = free_inodes
        s.f_namemax = 255
        return s

    async def forget(self, inode_list):
        # Inode ids are the master's and stable: nothing to release.
        pass

    # -- files ----------------------------------------------------------------

    def _writer_and_tgid(self, ino: int, empty: bool, pid: int):
        """The handle's writer and the caller's process, in one thread hop."""
        return self._new_writer(ino, empty), _tgid(pid)

    @_fuse_op
    async def create(self, parent_inode, name, mode, flags, ctx):
        check_name(name)
        sent = time.monotonic()
        inode, lease_ms, parent = await self._calls.run(
            "create", parent_inode, name, mode & 0o7777, ctx.uid, ctx.gid,
            bool(flags & os.O_EXCL))
        self._note_dirs(parent)
        # Normally a new, empty file.  If another client created the name meanwhile,
        # O_CREAT without O_TRUNC opens its content.
        empty = bool(flags & os.O_TRUNC) or inode.size == 0
        writer, tgid = await self._run(self._writer_and_tgid, inode.ino, empty, ctx.pid)
        # A never-published file (the usual case: we just created it) reads as empty
        # on every mount already, so a close without writes needs no publish before it
        # returns (release publishes the empty version for the rename guard).  A
        # published one is replaced at close (rule 1: this handle's version).
        unpublished = inode.state != COMPLETE
        writer.dirty = not unpublished
        fh = self._add_file(_File(inode.ino, writer=writer, inode=inode, tgid=tgid,
                                  publish_empty=unpublished))
        ttl = self._lease_ttl(lease_ms, sent)
        attrs = self._attrs(inode, lease=ttl)
        if ttl and unpublished:
            # A new, empty file: the kernel may keep these attributes for the lease too.
            # Its own writes here invalidate them as they go, the publish at close
            # forgets them (_flush_writer), and an empty close changes none of them.
            attrs.attr_timeout = ttl
            self._lease_inode(inode.ino, ttl)
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False), attrs

    @_fuse_op
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        if not stat.S_ISREG(mode):
            raise pyfuse3.FUSEError(errno.EPERM)  # no devices, FIFOs or sockets
        check_name(name)
        inode = await self._run(self.master.create, parent_inode, name, mode & 0o7777,
                                ctx.uid, ctx.gid, True)
        inode = await self._run(self.master.complete_file, inode.ino, [], 0)
        return self._attrs(inode)

    @_fuse_op
    async def open(self, inode, flags, ctx):
        if flags & os.O_ACCMODE == os.O_RDONLY:
            node, reader, recorded = await self._run(self._new_reader, inode)
            self._access.note(inode)
            keep = node.state == COMPLETE and self._remember_version(inode, node.version)
            fh = self._add_file(_File(inode, reader=reader, inode=node, recorded_open=recorded))
            if self._writers.get(inode):
                # This mount also writes the inode: its O_TRUNC opens and direct
                # writes set the kernel's file size, which would cut this reader's
                # version short.  Without the page cache the size does not matter.
                return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)
            return pyfuse3.FileInfo(fh=fh, direct_io=False, keep_cache=keep)
        writer = await self._run(self._new_writer, inode, bool(flags & os.O_TRUNC))
        tgid = await self._run(_tgid, ctx.pid)
        fh = self._add_file(_File(inode, writer=writer, tgid=tgid))
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)

    @_fuse_op
    async def read(self, fh, off, size):
        f = self._file(fh)
        if f.writer is not None:
            return await self._run(f.writer.read, off, size)
        # Bytes of a local block already in the page cache: read here without blocking
        # (RWF_NOWAIT) and without a thread hop.  pyfuse3 sends the reply before this
        # loop runs anything else, so one buffer serves every such read.
        data = f.reader.read_cached(off, size, self._read_buf)
        if data is not None:
            return data
        return await self._run(f.reader.read, off, size)

    @_fuse_op
    async def write(self, fh, off, buf):
        f = self._file(fh)
        if f.writer is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        # Queued for the writer's own thread (write-behind): answered at once, without
        # a thread hop; an error surfaces at a later write or at close.
        if f.writer.write_behind(off, buf):
            n = len(buf)
        else:
            n = await self._run(f.writer.write, off, buf)
        self._touch_writer(fh, f.ino)
        return n

    @_fuse_op
    async def flush(self, fh):
        # close(2): publish before it returns (close-to-open).
        f = self._file(fh)
        await self._publish(f)
        if f.publish_empty and not f.writer.dirty and not f.empty_closed:
            # Closed without data: it reads as empty already, release publishes it.
            f.empty_closed = True
            self._empty_pending[f.ino] = self._empty_pending.get(f.ino, 0) + 1

    @_fuse_op
    async def fsync(self, fh, datasync):
        await self._publish(self._file(fh))

    @_fuse_op
    async def release(self, fh):
        f = self._files.pop(fh, None)
        if f is None:
            return
        try:
            await self._publish(f)
        finally:
            fhs = self._handles.get(f.ino)
            if fhs is not None:
                fhs.discard(fh)
                if not fhs:
                    del self._handles[f.ino]
            if f.writer is not None:
                fhs = self._writers.get(f.ino, [])
                if fh in fhs:
                    fhs.remove(fh)
                if not fhs:
                    self._writers.pop(f.ino, None)
            try:
                if f.publish_empty and not f.writer.dirty:  # closed without data (see create)
                    # with the creation's mtime: a close without writes changes no
                    # attribute, so nobody's cached copy goes stale
                    await self._publish_empty(f.ino, f.writer.mtime_ns or f.inode.mtime_ns)
            finally:
                if f.empty_closed:
                    n = self._empty_pending.pop(f.ino, 1) - 1
                    if n:
                        self._empty_pending[f.ino] = n
                await self._run(_close_file, f)
                self._access.closed(*f.recorded_open)

    # -- directories ----------------------------------------------------------------

    @_fuse_op
    async def opendir(self, inode, ctx):
        fh = next(self._fh)
        self._dirs[fh] = _Dir(inode)
        return fh

    @_fuse_op
    async def readdir(self, fh, start_id, token):
        d = self._dirs.get(fh)
        if d is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        i = start_id
        while True:
            if i >= len(d.entries):
                if d.done:
                    return
                page, more = await self._run(self.master.listdir, d.ino, d.after, LISTDIR_PAGE)
                d.entries.extend((e.name, e.inode) for e in page)
                self._note_dirs(*(e.inode for e in page))
                if page:
                    d.after = page[-1].name
                d.done = not more or not page
                continue
            name, inode = d.entries[i]
            if not pyfuse3.readdir_reply(token, name, self._attrs(inode), i + 1):
                return
            i += 1

    @_fuse_op
    async def releasedir(self, fh):
        self._dirs.pop(fh, None)

    @_fuse_op
    async def fsyncdir(self, fh, datasync):
        pass  # namespace changes are durable when the master acknowledges them

    # -- not supported ----------------------------------------------------------------

    async def link(self, inode, new_parent_inode, new_name, ctx):
        raise pyfuse3.FUSEError(errno.EPERM)  # no hard links (one parent per inode)

    async def symlink(self, parent_inode, name, target, ctx):
        raise pyfuse3.FUSEError(errno.EPERM)  # symlink(2): fs does not support them

    async def readlink(self, inode, ctx):
        raise pyfuse3.FUSEError(errno.EINVAL)  # nothing here is a symlink

    # xattrs keep pyfuse3's ENOSYS: the kernel then stops asking and answers
    # EOPNOTSUPP itself (notably the security.capability probe on every write).

    def close(self) -> None:
        """Drop every handle (unpublished versions are lost) and the master link."""
        for f in self._files.values():
            _close_file(f)
        self._files.clear()
        self._dirs.clear()
        if self._leases is not None:
            self._leases.close()
            self._end_sessions(self._leases.opened)
        if self._calls.stream is not None:
            self._calls.stream.stop()
        self._access.close()
        self.master.close()

    def _end_sessions(self, sessions: list[int]) -> None:
        """Unmounted: this mount's kernel caches nothing now, so nobody need wait for
        its leases (nor a restarted master).  On a link of its own: the mount's own may
        be closed already (SIGTERM), and a master that is down must not hold the exit."""
        if not sessions:
            return
        link = MasterClient(self.master.address, timeout=1.0, wait=0)
        try:
            link.end_sessions(sessions)
        except CurvineError as e:
            log.info("could not end lease sessions (the master waits for them to run out): %s", e)
        finally:
            link.close()
