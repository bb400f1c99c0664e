"""The file system rules of a mount: names and attributes, open handles and their
versions, publish on close.

Master inode numbers are the FUSE inode numbers (root = 1).  Every master call made
here, and the CompleteFile of every writer, goes through :class:`~.calls.Calls`;
other blocking work (workers, disks) runs in a thread through the mount's ``run``
(one capacity limiter), so the trio loop never blocks.  Errors leave as
``CurvineError`` (or plain values: a lookup miss is None); the adapter
(operations.py) turns them into errnos.

Publication follows consistency rule 1 (docs/consistency.md): each open-for-write is its own
version (direct_io, so the kernel page cache never merges two handles), published
by CompleteFile at flush (close), fsync and release.  What a handle still owes is
its writer's unpublished changes plus its :class:`State`, which only
:class:`Handle`'s methods change.
"""

from __future__ import annotations

import collections
import enum
import functools
import itertools
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Awaitable, Callable, NamedTuple

import trio

from curvine.client.blocks.domain_socket import LocalSockets
from curvine.client.files.file_reader import FileReader
from curvine.client.files.file_writer import FileWriter, LocalWorker
from curvine.client.master.master_client import AccessReporter, MasterClient
from curvine.common.config import Config
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import MIB, check_name, host_id
from curvine.proto import common_pb2, master_pb2

from .calls import Calls
from .kernel_cache import KernelCache
from .listings import LISTING_MAX
from .metrics import (FUSE_GETATTR_LOCAL, FUSE_LOOKUP_ERROR, FUSE_LOOKUP_HIT, FUSE_LOOKUP_LOCAL,
                      FUSE_LOOKUP_MISS)
from .page_cache import WRITERS_SIZE, PageCache, process_of

log = logging.getLogger(__name__)

Inode = common_pb2.Inode
DIRECTORY = common_pb2.DIRECTORY
COMPLETE = common_pb2.COMPLETE

VERSION_CACHE = 100_000  # inodes whose last opened version this mount remembers
SYMLINK_CACHE = 10_000  # symlink targets kept (a symlink's target never changes)
OPEN_INOS_SENT = 1024  # open inodes listed in an unlink/rename; more: the target's only
XATTR_PREFIX = b"user."  # the only namespace stored (others: ENODATA / EOPNOTSUPP)
XATTR_VALUE_MAX = 65536
READDIR_BATCH = 64  # listing entries made into attributes per step of a readdir
# entries per ListDir of a readdir: a directory of up to LISTING_MAX names comes in one
# page, so that its listing can be leased with it (and kept by the kernel, listings.py)
READDIR_PAGE = LISTING_MAX
# writes up to this size into a block held in memory are copied in the trio loop
# (~10 us for 64 KiB) rather than queued for a thread
WRITE_NOW_MAX = 128 * 1024

# fallocate(2) modes (linux/falloc.h)
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10


class Attributes(NamedTuple):
    """What the kernel is told about an inode, and for how long it may keep it."""

    inode: Inode
    size: int
    entry_timeout: float
    attr_timeout: float
    nlink: int | None = None  # None: the inode's own (0: gone, but still open here)


class Absent(NamedTuple):
    """No such name; the kernel may remember that for ``entry_timeout`` seconds (a
    negative entry the master leased to this mount; 0: not at all)."""

    entry_timeout: float


class Opened(NamedTuple):
    """A new file handle and how the kernel may cache its pages."""

    fh: int
    direct_io: bool
    keep_cache: bool


class State(enum.Enum):
    """Where a handle stands in the publish rules (see :class:`Handle`)."""

    READING = "reading"
    NEW = "new"
    CLOSED_EMPTY = "closed empty"
    WRITING = "writing"
    GONE = "gone"


@dataclass(eq=False)
class Handle:
    """One open file: its version (a reader of a published one, or a writer of its
    own), the inode as of open (or its last publish), and its publish state:

    - READING: a reader; nothing to publish.
    - NEW: a file this handle created that nobody has published: it reads as empty
      on every mount already, so a close without writes publishes nothing.
    - CLOSED_EMPTY: NEW and closed (flushed) without data: release publishes the
      empty version afterwards (if_unpublished: unless some writer published first);
      until then anyone may rename it (the rename guard), so `touch a; mv a b` works.
    - WRITING: any other writer (of a file this handle did not create, or one it
      has published): published at flush, fsync and release whenever it has changes.
    - GONE: the inode left the namespace while written: its version was discarded.

    A publish moves NEW, CLOSED_EMPTY and WRITING to WRITING, a flush without data
    moves NEW to CLOSED_EMPTY, and a publish that finds no inode moves any writing
    state to GONE.
    """

    fh: int
    ino: int
    state: State
    reader: FileReader | None = None
    writer: FileWriter | None = None
    inode: Inode | None = None
    tgid: int = 0  # the process that opened it (writers)
    # (lease session, open id) this reader's open was recorded with at the master: the
    # file is not evicted until release reports it closed
    recorded_open: tuple[int, int] = (0, 0)
    # a writer opened O_RDWR: it goes through the kernel's page cache (not direct_io),
    # so that mmap works; the kernel then takes the file's size from this handle.  A
    # reader: the kernel reads its version through the page cache, up to the kernel's
    # size of the inode
    page_cache: bool = False
    pid: int = 0  # the thread that opened it (readers; page_cache.process_of: its process)

    @property
    def size(self) -> int:
        return self.reader.size if self.reader is not None else self.writer.size

    @property
    def cached_reader(self) -> bool:
        """A reader that reads through the kernel's page cache."""
        return self.reader is not None and self.page_cache

    @property
    def publish_due(self) -> bool:
        """The writer has changes to publish."""
        return self.writer is not None and self.writer.dirty

    @property
    def empty_publish_due(self) -> bool:
        """At release: the empty version is still to publish (closed without data)."""
        return self.state in (State.NEW, State.CLOSED_EMPTY) and not self.writer.dirty

    def published(self, inode: Inode) -> None:
        self.inode = inode
        self.state = State.WRITING

    def flushed(self) -> None:
        """close(2) returned: a new file closed without data waits for release."""
        if self.state is State.NEW and not self.writer.dirty:
            self.state = State.CLOSED_EMPTY

    def gone(self) -> None:
        """The inode is gone: forget the unpublished version."""
        self.writer.discard()
        self.state = State.GONE

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.reader is not None:
            self.reader.close()

    def close_nowait(self) -> bool:
        """``close`` if it need not wait for another thread nor do disk I/O (a reader,
        or a writer whose version is published); False: call ``close`` from a thread."""
        if self.writer is None:
            return self.reader.close_nowait()
        return self.writer.close_nowait()


@dataclass
class OpenDirectory:
    """An open directory: the entries loaded from the master so far."""

    ino: int
    # (name, Inode, monotonic end of the name's lease or 0), in listing order
    entries: list = field(default_factory=list)
    after: bytes = b""  # the last name loaded from the master
    done: bool = False


class FileSystem:
    """The file system of one mount, called from the trio loop.

    ``run(fn, *args)`` runs a blocking callable in a thread; ``access`` reports opens
    for reading to the master (LRU eviction)."""

    def __init__(self, cfg: Config, master: MasterClient, calls: Calls, kernel: KernelCache,
                 access: AccessReporter, run: Callable[..., Awaitable]):
        self.cfg = cfg
        self.master = master
        self.calls = calls
        self.kernel = kernel
        self._access = access
        self._run = run
        self.host = host_id()
        self._fh = itertools.count(1)  # file and directory handles
        self._handles: dict[int, Handle] = {}  # fh -> handle, until its release starts
        # fh -> write handle, until its release is over (the rename guard reads them)
        self._write_handles: dict[int, Handle] = {}
        self._writers: dict[int, list[int]] = {}  # ino -> write handles, last used last
        self._of_inode: dict[int, dict[int, Handle]] = {}  # ino -> its handles (fh -> handle)
        self._dirs: dict[int, OpenDirectory] = {}
        self._versions: OrderedDict[int, int] = OrderedDict()  # ino -> version last opened
        self._block_size: int | None = None  # the master's, asked for at the first write
        self._inline_max = 0  # the master's, with the block size
        self._local_worker = LocalWorker(self.host)  # shared by this mount's writers
        # the local workers' domain sockets: writers' staging files are adopted there
        self._sockets = (LocalSockets(cfg.client.domain_socket_dir,
                                      timeout=float(cfg.cluster.rpc_timeout))
                         if cfg.client.short_circuit and cfg.client.domain_socket_dir else None)
        self._read_buf = bytearray(MIB)  # reads answered in the loop (read_cached)
        # inodes unlinked (or replaced) while open here, kept by the master until this
        # mount's last handle of them closes (ReleaseInode)
        self._held: set[int] = set()
        # inodes being opened here, whose handle does not exist yet (the open's thread
        # hop): an unlink or rename meanwhile must hold them like open ones
        self._opening: collections.Counter[int] = collections.Counter()
        # of those, the opens for writing (a reader opened meanwhile must not go
        # through the page cache: _open)
        self._write_opening: collections.Counter[int] = collections.Counter()
        # held inodes whose ReleaseInode is on its way: an open of one (the kernel may
        # still know the inode) waits for it and then finds it gone: ESTALE, and the
        # kernel looks the name up again (operations._BY_INODE)
        self._releasing: dict[int, trio.Event] = {}
        # the page-cache version rule: the size each inode was told, the readers of a
        # version through the page cache (a reader of another version makes the kernel
        # ask again, _open)
        self.page_cache = PageCache(self._of_inode, self._handles)
        self._symlinks: OrderedDict[int, bytes] = OrderedDict()  # ino -> target
        self.requests = master.requests  # of every master call, sent on self.calls

    # a writer's publish and its uploads' AddBlock, from their threads: on the Calls
    # route like every master call

    def _complete(self, *args, **kwargs):
        return self.calls.from_thread(self.requests.complete(*args, **kwargs))

    def _add_block(self, *args, **kwargs):
        return self.calls.from_thread(self.requests.add_block(*args, **kwargs))

    # -- attributes -------------------------------------------------------------------

    def attributes(self, inode: Inode, size: int | None = None,
                   lease: float = 0.0) -> Attributes:
        """``lease``: seconds the master leased the name (and a file's attributes) to
        this mount, else the configured timeouts apply."""
        writing = bool(self._writers.get(inode.ino))
        told = inode.version
        if size is None:
            size = inode.size
            # only a writer here shows another size (one dict lookup for the rest: a
            # listing makes thousands of these)
            pc = self._page_cache_writer(inode.ino) if writing else None
            if pc is not None:
                # The kernel reads this mount's O_RDWR handles through its page cache,
                # up to the size it is told: theirs, as a local file system would.
                size, told = pc.size, WRITERS_SIZE
            elif writing and inode.type != DIRECTORY and inode.state != COMPLETE:
                # Nothing is published yet (readers see an empty file): show the size
                # this mount is writing, as a local file system would.  Once a version
                # is published its size is reported, never a writer's partial one, or
                # a reader here would be cut short (consistency rule 1).
                w = self.writer_of(inode.ino)
                if w is not None:
                    size, told = w.size, WRITERS_SIZE
        entry_timeout, attr_timeout = self.kernel.timeouts(inode, lease, writing=writing)
        if inode.ino in self._of_inode and inode.type != DIRECTORY:
            cached = self.page_cache.reader(inode.ino)
            if cached is not None and cached.inode.version != inode.version:
                # Readers here still read a replaced version through the page cache,
                # and the kernel's one size of the inode bounds their reads: keep
                # telling it that version's size until they close (kept for no time,
                # so the next answer after that is the new version's).  A stat here
                # shows the old size meanwhile; readers of the new version read
                # without the page cache (_open), whatever the size.
                size, told = cached.size, cached.inode.version
                attr_timeout = 0.0
        if inode.type != DIRECTORY:
            self.page_cache.told(inode.ino, told)
        return Attributes(inode, size, entry_timeout, attr_timeout)

    def _open_snapshot(self, ino: int) -> Attributes | None:
        """Attributes of an inode that is gone from the namespace but still open here:
        its readers keep going (consistency rule 4, docs/consistency.md), and the kernel asks for
        attributes before it reads past what it has cached."""
        for h in self._of_inode.get(ino, {}).values():
            if h.inode is not None:
                return self.attributes(h.inode, h.size)._replace(nlink=0)
        return None

    # -- names ------------------------------------------------------------------------

    async def lookup(self, parent: int, name: bytes) -> Attributes | Absent:
        """The entry ``name`` of ``parent``, or Absent."""
        if name == b".":
            inode = await self.calls.run(self.requests.getattr_unleased(parent))
            self.kernel.note_dirs(inode)
        elif name == b"..":
            inode = await self.calls.run(self.requests.getattr_unleased(parent))
            inode = await self.calls.run(self.requests.getattr_unleased(inode.parent or parent))
            self.kernel.note_dirs(inode)
        else:
            check_name(name)
            known = self.kernel.listings.absent(parent, name)
            if known:  # a leased listing of parent has no such name (listings.py)
                FUSE_LOOKUP_MISS.inc()
                FUSE_LOOKUP_LOCAL.inc()
                return Absent(known)
            # One RPC; a miss is a plain reply, not an error status (LMCache's miss path).
            sent = time.monotonic()
            generation = self.kernel.listings.generation
            try:
                # a miss leased too (fuse.negative_leases): only with a lease session,
                # which runs only where the kernel's epoch expires negative entries
                inode, lease_ms = await self.calls.run(
                    self.requests.lookup(parent, name, lease_miss=self.cfg.fuse.negative_leases))
            except Exception:
                FUSE_LOOKUP_ERROR.inc()
                raise
            if inode is None:
                FUSE_LOOKUP_MISS.inc()
                ttl = self.kernel.lease_ttl(lease_ms, sent)
                if ttl:  # the kernel keeps it, and may still ask again (listings.py)
                    self.kernel.listings.missing(parent, name, ttl, generation)
                if lease_ms and self.kernel.listings.missed(parent):
                    await self._fetch_listing(parent)
                return Absent(ttl)
            FUSE_LOOKUP_HIT.inc()
            self.kernel.note_dirs(inode)
            return self.attributes(inode, lease=self.kernel.lease_ttl(lease_ms, sent))
        return self.attributes(inode)

    async def _fetch_listing(self, parent: int) -> None:
        """Ask for the leased listing of ``parent``, which keeps missing (listings.py)."""
        listings = self.kernel.listings
        generation, sent = listings.generation, time.monotonic()
        names, lease_ms = None, 0
        try:
            names, lease_ms = await self.calls.run(self.requests.listing(parent, LISTING_MAX))
        except CurvineError as e:
            log.debug("listing of %d not leased: %s", parent, e)
        finally:
            listings.fetched(parent, names, self.kernel.lease_ttl(lease_ms, sent), generation)

    async def getattr(self, ino: int) -> Attributes:
        published = self.kernel.published(ino)
        if published is not None:  # this mount's publish, still leased: as the master
            FUSE_GETATTR_LOCAL.inc()
            return self.attributes(published[0], lease=published[1])
        cached = self.kernel.cached_dir(ino)
        if cached is not None:
            node, left = cached
            return self.attributes(node)._replace(attr_timeout=left)
        try:
            sent = time.monotonic()
            node, lease_ms = await self.calls.run(self.requests.getattr(ino))
            self.kernel.note_dirs(node)
            return self.attributes(node, lease=self.kernel.lease_ttl(lease_ms, sent))
        except CurvineError as e:
            attrs = self._open_snapshot(ino) if e.kind == ErrorKind.NOT_FOUND else None
            if attrs is None:
                raise
            return attrs

    async def setattr(self, ino: int, fh: int | None, *, size: int | None = None,
                      mode: int | None = None, uid: int | None = None,
                      gid: int | None = None, atime_ns: int | None = None,
                      mtime_ns: int | None = None) -> Attributes:
        """Change what is given (None: unchanged).  A size goes to the writer of the
        handle ``fh`` (else the last-used one of ``ino`` here), if any."""
        h = self._write_handle(ino, fh)
        w = h.writer if h is not None else None
        shown = None
        changes = {}
        if size is not None:
            if w is not None and await self._truncate_version(h, size):
                shown = w.size
            else:
                changes["size"] = size  # the published file's
        if mode is not None:
            changes["mode"] = mode & 0o7777
        if uid is not None:
            changes["uid"] = uid
        if gid is not None:
            changes["gid"] = gid
        if atime_ns is not None:
            changes["atime_ns"] = atime_ns
        if mtime_ns is not None:
            changes["mtime_ns"] = mtime_ns
            if w is not None:
                w.mtime_ns = mtime_ns  # kept when the handle publishes
        if changes:
            with self.kernel.changing(ino):
                node = await self.calls.run(self.requests.setattr(ino, **changes))
        else:
            node = await self.calls.run(self.requests.getattr_unleased(ino))
        self.kernel.note_dirs(node)
        return self.attributes(node, shown)

    async def _truncate_version(self, h: Handle, size: int) -> bool:
        """Truncate ``h``'s version (published at its close); False when that handle
        was closed meanwhile: a truncate by path (another process's handle was the
        last-used one) racing with that handle's release.  Its last publish may then
        predate the truncate, so the caller truncates the published file instead."""
        try:
            await self._run(h.writer.truncate, size)
        except CurvineError as e:
            if e.kind != ErrorKind.STALE:  # STALE: the writer was closed first
                raise
            return False
        return self._handles.get(h.fh) is h

    async def mkdir(self, parent: int, name: bytes, mode: int, uid: int,
                    gid: int) -> Attributes:
        check_name(name)
        sent = time.monotonic()
        listings = self.kernel.listings
        with listings.adding(parent, name):
            generation = listings.generation
            inode, lease_ms, parent_node, listing_ms = await self.calls.run(
                self.requests.mkdir_listed(parent, name, mode & 0o7777, uid, gid))
            # the new directory is empty: misses there are answered here at once
            listings.install(inode.ino, [], self.kernel.lease_ttl(listing_ms, sent),
                             generation)
        self.kernel.note_dirs(inode, parent_node)
        return self.attributes(inode, lease=self.kernel.lease_ttl(lease_ms, sent))

    async def rmdir(self, parent: int, name: bytes) -> None:
        check_name(name)
        with self.kernel.listings.removing(parent, name):
            parent_node = await self.calls.run(self.requests.rmdir(parent, name))
        self.kernel.note_dirs(parent_node)

    async def unlink(self, parent: int, name: bytes) -> None:
        check_name(name)
        with self.kernel.listings.removing(parent, name), self.kernel.changing((parent, name)):
            parent_node, held = await self.calls.run(
                self.requests.unlink(parent, name,
                                     open_inos=await self._open_inos(parent, name)))
        await self._note_held(held)
        self.kernel.note_dirs(parent_node)

    async def _open_inos(self, parent: int, name: bytes) -> list[int]:
        """The inodes open here that an unlink or rename of ``name`` may take the last
        name of: all of them, or (when many are open) the one ``name`` names."""
        if len(self._of_inode) + len(self._opening) <= OPEN_INOS_SENT:
            return list(self._of_inode.keys() | self._opening.keys())
        inode, _ = await self.calls.run(self.requests.lookup(parent, name))
        return [inode.ino] if inode is not None and self._is_open(inode.ino) else []

    def _is_open(self, ino: int) -> bool:
        return ino in self._of_inode or ino in self._opening

    async def _note_held(self, ino: int) -> None:
        if not ino:
            return
        if self._is_open(ino):
            self._held.add(ino)
        else:  # its last handle closed while the call was on its way
            await self._release_inode(ino)

    async def _closed_here(self, ino: int) -> None:
        """The last handle of ``ino`` here closed (or its open failed): an inode held
        for this mount goes now."""
        if ino in self._held and not self._is_open(ino):
            self._held.discard(ino)
            await self._release_inode(ino)

    async def _release_inode(self, ino: int) -> None:
        if ino in self._releasing:  # already on its way
            await self._releasing[ino].wait()
            return
        done = self._releasing[ino] = trio.Event()
        try:
            await self.calls.run(self.requests.release_inode(ino))
        except CurvineError as e:
            # the master removes it when this mount's session ends
            log.warning("inode %d: unlinked and closed, but the master was not told "
                        "(%s); it is removed when this mount's session ends", ino, e)
        finally:
            del self._releasing[ino]
            done.set()

    async def rename(self, parent: int, name: bytes, new_parent: int, new_name: bytes,
                     no_replace: bool, pid: int, exchange: bool = False) -> None:
        check_name(name)
        check_name(new_name)
        # Only the process writing a never-published file may move it (see
        # RenameRequest.require_published, checked by the master with the rename): the
        # files the caller writes here, and files closed here without data whose empty
        # version release has yet to publish (so `touch a; mv a b` works at once).
        mine = [h.ino for h in self._write_handles.values() if h.state is State.CLOSED_EMPTY]
        if self._writers:
            caller = process_of(pid)  # a /proc read: never waits on a disk, so no thread hop
            mine += [h.ino for h in self._write_handles.values()
                     if h.tgid == caller and h.fh in self._handles]
        opened = [] if exchange else await self._open_inos(new_parent, new_name)
        self.kernel.listings.making(new_parent, new_name)
        with (self.kernel.listings.changing(parent, new_parent),
              self.kernel.changing((parent, name), (new_parent, new_name))):
            *changed, held = await self.calls.run(
                self.requests.rename(parent, name, new_parent, new_name, no_replace=no_replace,
                                     require_published=True, writer_inos=mine,
                                     open_inos=opened, exchange=exchange))
        if not exchange:  # an exchange leaves both names in place
            self.kernel.listings.removed(parent, name)
            self.kernel.listings.added(new_parent, new_name)
        await self._note_held(held)
        self.kernel.note_dirs(*changed)

    async def link(self, ino: int, new_parent: int, new_name: bytes) -> Attributes:
        check_name(new_name)
        sent = time.monotonic()
        with self.kernel.listings.adding(new_parent, new_name), self.kernel.changing(ino):
            inode, lease_ms, parent_node = await self.calls.run(
                self.requests.link(ino, new_parent, new_name))
        self.kernel.note_dirs(parent_node)
        return self.attributes(inode, lease=self.kernel.lease_ttl(lease_ms, sent))

    async def symlink(self, parent: int, name: bytes, target: bytes, uid: int,
                      gid: int) -> Attributes:
        check_name(name)
        sent = time.monotonic()
        with self.kernel.listings.adding(parent, name):
            inode, lease_ms, parent_node = await self.calls.run(
                self.requests.symlink(parent, name, target, uid, gid))
        self.kernel.note_dirs(parent_node)
        self._remember_symlink(inode)
        return self.attributes(inode, lease=self.kernel.lease_ttl(lease_ms, sent))

    async def readlink(self, ino: int) -> bytes:
        target = self._symlinks.get(ino)
        if target is None:
            inode = await self.calls.run(self.requests.getattr_unleased(ino))
            if inode.type != common_pb2.SYMLINK:
                raise CurvineError(ErrorKind.INVALID, f"inode {ino} is not a symlink")
            target = self._remember_symlink(inode)
        return target

    def _remember_symlink(self, inode: Inode) -> bytes:
        self._symlinks[inode.ino] = inode.symlink_target
        while len(self._symlinks) > SYMLINK_CACHE:
            self._symlinks.popitem(last=False)
        return inode.symlink_target

    async def make_node(self, parent: int, name: bytes, kind: int, mode: int, rdev: int,
                        uid: int, gid: int) -> Attributes:
        """A FIFO, socket or device: metadata only (its I/O is the kernel's)."""
        check_name(name)
        sent = time.monotonic()
        with self.kernel.listings.adding(parent, name):
            inode, lease_ms, parent_node = await self.calls.run(
                self.requests.make_node(parent, name, kind, mode & 0o7777, rdev, uid, gid))
        self.kernel.note_dirs(parent_node)
        return self.attributes(inode, lease=self.kernel.lease_ttl(lease_ms, sent))

    # -- extended attributes: user.* stored by the master; the kernel's probes of
    # -- other namespaces (security.capability at every write) answered here

    async def getxattr(self, ino: int, name: bytes) -> bytes:
        if not name.startswith(XATTR_PREFIX):
            raise CurvineError(ErrorKind.NO_DATA, "no such attribute")
        return await self.calls.run(self.requests.get_xattr(ino, name))

    async def setxattr(self, ino: int, name: bytes, value: bytes) -> None:
        if not name.startswith(XATTR_PREFIX):
            raise CurvineError(ErrorKind.NOT_SUPPORTED, "only user.* attributes are stored")
        if len(value) > XATTR_VALUE_MAX:
            raise CurvineError(ErrorKind.TOO_BIG, "attribute value too large")
        with self.kernel.changing(ino):  # its ctime
            await self.calls.run(self.requests.set_xattr(ino, name, value))

    async def listxattr(self, ino: int) -> list[bytes]:
        return await self.calls.run(self.requests.list_xattr(ino))

    async def removexattr(self, ino: int, name: bytes) -> None:
        if not name.startswith(XATTR_PREFIX):
            raise CurvineError(ErrorKind.NO_DATA, "no such attribute")
        with self.kernel.changing(ino):
            await self.calls.run(self.requests.remove_xattr(ino, name))

    async def statfs(self) -> master_pb2.StatFsReply:
        return await self.calls.run(self.requests.statfs())

    async def mknod(self, parent: int, name: bytes, mode: int, uid: int,
                    gid: int) -> Attributes:
        """An empty regular file, published at once."""
        check_name(name)
        with self.kernel.listings.adding(parent, name):
            inode, _, _ = await self.calls.run(
                self.requests.create(parent, name, mode & 0o7777, uid, gid, True))
        inode = await self.calls.run(self.requests.complete(inode.ino, [], 0))
        return self.attributes(inode)

    # -- files ------------------------------------------------------------------------

    def handle(self, fh: int) -> Handle | None:
        return self._handles.get(fh)

    def _page_cache_writer(self, ino: int) -> FileWriter | None:
        """The last-used O_RDWR (page cache) writer of ``ino`` here, if any."""
        for fh in reversed(self._writers.get(ino, ())):
            h = self._write_handles.get(fh)
            if h is not None and h.page_cache:
                return h.writer
        return None

    def writer_of(self, ino: int, fh: int | None = None) -> FileWriter | None:
        """The write handle ``fh``'s writer if given, else the last-used one of ``ino``
        here."""
        h = self._write_handle(ino, fh)
        return h.writer if h is not None else None

    def _write_handle(self, ino: int, fh: int | None = None) -> Handle | None:
        if fh is not None:
            h = self._handles.get(fh)
            if h is not None and h.writer is not None:
                return h
        fhs = self._writers.get(ino)
        # a handle being released is out of _handles while it publishes
        return self._handles.get(fhs[-1]) if fhs else None

    async def create(self, parent: int, name: bytes, mode: int, flags: int, uid: int,
                     gid: int, pid: int) -> tuple[Opened, Attributes]:
        check_name(name)
        sent = time.monotonic()
        with self.kernel.listings.adding(parent, name):
            if flags & os.O_TRUNC:
                # opened to be written (LMCache's <key>.tmp): the create also places
                # the first block, which saves the writer its AddBlock at close
                inode, lease_ms, parent_node, granted = await self.calls.run(
                    self.requests.create_to_write(parent, name, mode & 0o7777, uid, gid,
                                                  bool(flags & os.O_EXCL), self.host))
            else:
                inode, lease_ms, parent_node = await self.calls.run(
                    self.requests.create(parent, name, mode & 0o7777, uid, gid,
                                         bool(flags & os.O_EXCL)))
                granted = None
        self.kernel.note_dirs(parent_node)
        # Normally a new, empty file.  If another client created the name meanwhile,
        # O_CREAT without O_TRUNC opens its content.
        empty = bool(flags & os.O_TRUNC) or inode.size == 0
        # A never-published file (the usual case: we just created it) reads as empty
        # on every mount already, so a close without writes needs no publish before it
        # returns (release publishes the empty version for the rename guard).  A
        # published one is replaced at close (rule 1: this handle's version).
        unpublished = inode.state != COMPLETE
        writer, recorded = await self._new_writer(inode.ino, empty, not unpublished, granted)
        tgid = process_of(pid)
        page_cache = flags & os.O_ACCMODE == os.O_RDWR
        h = self._add(inode.ino, State.NEW if unpublished else State.WRITING, writer=writer,
                      inode=inode, tgid=tgid, page_cache=page_cache, recorded_open=recorded)
        if flags & os.O_TRUNC or page_cache:  # an existing file: emptied, or written
            await self.page_cache.wait_for_readers(inode.ino, tgid)  # in the page cache
        ttl = self.kernel.lease_ttl(lease_ms, sent)
        attrs = self.attributes(inode, lease=ttl)
        if ttl and unpublished:
            # A new, empty file: the kernel may keep these attributes for the lease too.
            # Its own writes here invalidate them as they go, the publish at close
            # forgets them (KernelCache.forget_published), and an empty close changes
            # none of them.
            attrs = attrs._replace(attr_timeout=ttl)
            self.kernel.lease_inode(inode.ino, ttl)
        return Opened(h.fh, direct_io=not page_cache, keep_cache=False), attrs

    async def open(self, ino: int, flags: int, pid: int) -> Opened:
        releasing = self._releasing.get(ino)
        if releasing is not None:
            await releasing.wait()
        writing = flags & os.O_ACCMODE != os.O_RDONLY
        self._opening[ino] += 1
        if writing:
            self._write_opening[ino] += 1
        try:
            return await self._open(ino, flags, pid)
        finally:
            if writing:
                self._write_opening[ino] -= 1
                if not self._write_opening[ino]:
                    del self._write_opening[ino]
            self._opening[ino] -= 1
            if not self._opening[ino]:
                del self._opening[ino]
                await self._closed_here(ino)

    async def _open(self, ino: int, flags: int, pid: int) -> Opened:
        if flags & os.O_ACCMODE == os.O_RDONLY:
            node, reader, recorded = await self._new_reader(ino)
            self._access.note(ino)
            if (self._writers.get(ino) or self._write_opening[ino]
                    or self.page_cache.readers_of_another_version(ino, node.version)):
                # This mount also writes the inode (or is opening it to write): its
                # O_TRUNC opens and direct writes set the kernel's file size, which
                # would cut this reader's version short (the kernel drops the GETATTR
                # answers that race with writes).  Without the page cache the size
                # does not matter.  Or a reader here still reads an older version
                # through the page cache: one page cache cannot hold both versions
                # (each reader would be served the other's pages).  Not remembered as
                # the version in the page cache (_remember_version): it is not.
                h = self._add(ino, State.READING, reader=reader, inode=node,
                              recorded_open=recorded)
                return Opened(h.fh, direct_io=True, keep_cache=False)
            keep = node.state == COMPLETE and self._remember_version(ino, node.version)
            # A writer opened later waits for it if it empties the file (O_TRUNC) or
            # writes it through the page cache (O_RDWR): PageCache.wait_for_readers.
            h = self._add(ino, State.READING, reader=reader, inode=node, recorded_open=recorded,
                          page_cache=True, pid=pid)
            if not keep or self.page_cache.told_version(ino) != node.version:
                # The kernel may hold another size than this version's: another
                # version's, kept for up to attr_timeout without a lease or told while
                # this open fetched its version, or the one a writer here left (the
                # kernel drops answers that race with writes).  Reads through the page
                # cache stop at that size: make the kernel ask again.  Answers from now
                # on give this version's size while this reader is open (attributes);
                # ones already on their way predate the invalidation, and the kernel
                # drops them.
                try:
                    self.kernel.drop_attributes(ino)
                except OSError as e:  # the open stands: its handle exists
                    log.warning("inode %d: the kernel's attributes could not be dropped "
                                "(%s); a read may stop at a stale size", ino, e)
            return Opened(h.fh, direct_io=False, keep_cache=keep)
        truncate = bool(flags & os.O_TRUNC)
        tgid = process_of(pid)
        # O_RDWR: through the page cache, so that mmap works (O_WRONLY cannot map);
        # O_WRONLY (LMCache's writers) keeps direct_io: one request per buffer, no copy
        page_cache = flags & os.O_ACCMODE == os.O_RDWR
        if truncate or page_cache:
            # Before the handle exists: until then the kernel is told the published
            # size (attributes gives an O_RDWR writer's own), which those readers'
            # reads stop at.
            await self.page_cache.wait_for_readers(ino, tgid)
        # an emptied file is published at close even without writes
        writer, recorded = await self._new_writer(ino, truncate, truncate)
        h = self._add(ino, State.WRITING, writer=writer, tgid=tgid, page_cache=page_cache,
                      recorded_open=recorded)
        return Opened(h.fh, direct_io=not page_cache, keep_cache=False)

    async def read(self, h: Handle, off: int, size: int):
        if h.writer is not None:
            return await self._run(h.writer.read, off, size)
        # Bytes of a local block already in the page cache: read here without blocking
        # (RWF_NOWAIT) and without a thread hop.  pyfuse3 sends the reply before this
        # loop runs anything else, so one buffer serves every such read.
        data = h.reader.read_cached(off, size, self._read_buf)
        if data is not None:
            return data
        return await self._run(h.reader.read, off, size)

    async def write(self, h: Handle, off: int, buf: bytes) -> int:
        # A small write into the block in memory is a copy, done here; others are
        # queued for the writer's own thread (write-behind): answered at once, without
        # a thread hop; an error surfaces at a later write or at close.
        if len(buf) <= WRITE_NOW_MAX and h.writer.write_now(off, buf):
            n = len(buf)
        elif h.writer.write_behind(off, buf):
            n = len(buf)
        else:
            n = await self._run(h.writer.write, off, buf)
        self._touch_writer(h)
        return n

    async def fallocate(self, h: Handle, mode: int, offset: int, length: int) -> None:
        """Mode 0 and KEEP_SIZE: the range reads as before, or as zeros past the end
        (space is not reserved ahead: blocks are written at publish); PUNCH_HOLE and
        ZERO_RANGE: the range reads as zeros (written as zeros)."""
        known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE
        if mode & ~known or (mode & FALLOC_FL_PUNCH_HOLE and mode & FALLOC_FL_ZERO_RANGE):
            raise CurvineError(ErrorKind.NOT_SUPPORTED, f"fallocate mode {mode:#x}")
        if offset < 0 or length <= 0:
            raise CurvineError(ErrorKind.INVALID, "fallocate: bad offset or length")
        await self._run(h.writer.allocate, offset, length,
                        zero=bool(mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)),
                        keep_size=bool(mode & FALLOC_FL_KEEP_SIZE))
        self._touch_writer(h)

    async def flush(self, h: Handle) -> None:
        """close(2): publish before it returns (close-to-open)."""
        await self._publish(h)
        h.flushed()

    async def fsync(self, h: Handle) -> None:
        await self._publish(h)

    async def release(self, fh: int) -> None:
        h = self._handles.pop(fh, None)
        if h is None:
            return
        if h.cached_reader:
            self.page_cache.reader_closed(h)
        try:
            await self._publish(h)
        finally:
            handles = self._of_inode.get(h.ino)
            if handles is not None:
                handles.pop(fh, None)
                if not handles:
                    del self._of_inode[h.ino]
                    await self._closed_here(h.ino)
            if h.writer is not None:
                self.page_cache.writer_closed(h.ino)
                fhs = self._writers.get(h.ino, [])
                if fh in fhs:
                    fhs.remove(fh)
                if not fhs:
                    self._writers.pop(h.ino, None)
            try:
                if h.empty_publish_due:
                    # with the creation's mtime: a close without writes changes no
                    # attribute, so nobody's cached copy goes stale
                    await self._publish_empty(h.ino, h.writer.mtime_ns or h.inode.mtime_ns,
                                              h.writer.take_granted())
            finally:
                self._write_handles.pop(fh, None)
                if not h.close_nowait():  # most handles close here, without a thread hop
                    await self._run(h.close)
                self._access.closed(*h.recorded_open)

    def _add(self, ino: int, state: State, **kwargs) -> Handle:
        h = Handle(next(self._fh), ino, state, **kwargs)
        self._handles[h.fh] = h
        self._of_inode.setdefault(ino, {})[h.fh] = h
        if h.writer is not None:
            self._write_handles[h.fh] = h
            self._touch_writer(h)
        return h

    def _touch_writer(self, h: Handle) -> None:
        fhs = self._writers.setdefault(h.ino, [])
        if not fhs or fhs[-1] != h.fh:
            if h.fh in fhs:
                fhs.remove(h.fh)
            fhs.append(h.fh)

    def _remember_version(self, ino: int, version: int) -> bool:
        """Record the version opened; True if it equals the one opened before."""
        same = self._versions.get(ino) == version
        self._versions[ino] = version
        self._versions.move_to_end(ino)
        while len(self._versions) > VERSION_CACHE:
            self._versions.popitem(last=False)
        return same

    async def _new_writer(self, ino: int, truncate: bool, changed: bool,
                          granted: tuple | None = None) -> tuple[FileWriter, tuple[int, int]]:
        """A private version of ``ino``: empty, or starting from its current blocks;
        ``changed``: published at close even without writes; ``granted``: the block
        the create placed for it (FileWriter).  Also the (session, open
        id) its open is recorded with at the master: while it is open, blocks another
        writer's version drops stay readable and publishable by this one (at GetBlocks,
        or with a truncated start at its first publish).  In the loop: its master
        calls go on the call port, and making a writer does no I/O."""
        blocks, workers = [], {}
        session, open_id = self.master.session, self._access.new_open_id()
        published = None if truncate else self.kernel.published_version(ino)
        if published is not None:
            # a small file this mount published: its inline blocks are the base (no
            # worker holds a block to keep for this open; CompleteFile records it)
            blocks = list(published[1])
        elif not truncate:
            inode, blocks, workers = await self.calls.run(
                self.requests.get_blocks(ino, session, open_id, write=True))
            if inode.type == DIRECTORY:
                self._access.closed(session, open_id)
                raise CurvineError(ErrorKind.IS_DIR, f"inode {ino} is a directory")
        if self._block_size is None:
            # Block lengths must not exceed the master's block size.
            fs = await self.calls.run(self.requests.statfs())
            self._inline_max = fs.inline_max  # small files' bytes go to the master
            self._block_size = fs.block_size or self.cfg.cluster.block_size
            self._local_worker.note(fs.workers)  # where first blocks go
        writer = FileWriter(self.master, ino, self._block_size, blocks, self.host,
                            workers=workers, short_circuit=self.cfg.client.short_circuit,
                            timeout=self.cfg.cluster.rpc_timeout,
                            local_worker=self._local_worker, changed=changed,
                            complete=functools.partial(self._complete, open_id=open_id),
                            add_block=self._add_block, sockets=self._sockets,
                            inline_max=self._inline_max, granted=granted)
        return writer, (session, open_id)

    async def _new_reader(self, ino: int) -> tuple[Inode, FileReader, tuple[int, int]]:
        published = self.kernel.published_version(ino)
        if published is not None:
            # a small file this mount published, its bytes at hand and its lease held:
            # no GetBlocks (nor an open recorded at the master: no worker holds a block
            # of it, and the bytes are in this reader's memory)
            inode, blocks = published
            return inode, FileReader(blocks, {}, security=self.master.security), (0, 0)
        session, open_id = self.master.session, self._access.new_open_id()
        inode, blocks, workers = await self.calls.run(
            self.requests.get_blocks(ino, session, open_id))
        if inode.type == DIRECTORY:
            self._access.closed(session, open_id)
            raise CurvineError(ErrorKind.IS_DIR, f"inode {ino} is a directory")
        make = functools.partial(FileReader, blocks, workers,
                                 short_circuit=self.cfg.client.short_circuit,
                                 timeout=self.cfg.cluster.rpc_timeout,
                                 readahead=self.cfg.client.readahead_blocks,
                                 security=self.master.security,
                                 on_bad_copy=self._access.bad_copy)
        # A file on workers: the reader opens its local block files and starts their
        # readahead, in a thread.  A small file's bytes came with its blocks (inline)
        # and an empty one has none: nothing to open, made here.
        try:
            reader = await self._run(make) if any(b.block_id for b in blocks) else make()
        except BaseException:
            self._access.closed(session, open_id)  # nothing was opened
            raise
        return inode, reader, (session, open_id)

    async def _publish(self, h: Handle) -> None:
        if not h.publish_due:
            return
        try:
            inline = h.writer.inline_nowait()
            if inline is not None:  # a small file: one CompleteFile, from the loop
                sent = time.monotonic()
                try:
                    inode = await self.calls.run(self.requests.complete(
                        h.ino, inline.blocks, inline.size, inline.mtime_ns,
                        abandoned=inline.abandoned, open_id=h.recorded_open[1]))
                except CurvineError as e:
                    if e.kind != ErrorKind.NO_SPACE:
                        raise
                    h.writer.no_inline_room(e)  # stored on workers instead, below
                    inline = None
                else:
                    h.writer.inline_published(inline)
                    self.kernel.forget_published(h.ino, inode, sent, inline.blocks)
            if inline is None:
                inode = await self._run(self._flush_writer, h)
            if inode is not None:
                h.published(inode)
        except CurvineError as e:
            if e.kind != ErrorKind.NOT_FOUND:
                raise
            # The file was unlinked (or replaced by a rename) while being written:
            # like writes to an unlinked local file, the data just goes away.
            log.debug("inode %d is gone, dropping its unpublished version: %s", h.ino, e)
            h.gone()

    def _flush_writer(self, h: Handle) -> Inode | None:
        """Publish (in a thread), then forget the kernel's leased attributes of the
        old version."""
        sent = time.monotonic()
        inode = h.writer.flush()
        if inode is not None:
            self.kernel.forget_published(h.ino, inode, sent)
        return inode

    async def _publish_empty(self, ino: int, mtime_ns: int = 0,
                             abandoned: list[int] = ()) -> None:
        """Publish the empty version of a file created here, unless some writer has
        published one meanwhile (theirs is newer than our create); ``abandoned``: the
        block the create placed, unused."""
        try:
            await self.calls.run(self.requests.complete(ino, [], 0, mtime_ns, True, abandoned))
        except CurvineError as e:
            if e.kind != ErrorKind.NOT_FOUND:
                raise
            log.debug("inode %d is gone, nothing to publish: %s", ino, e)

    # -- directories ------------------------------------------------------------------

    def opendir(self, ino: int) -> int:
        fh = next(self._fh)
        self._dirs[fh] = OpenDirectory(ino)
        return fh

    def listing(self, fh: int) -> OpenDirectory | None:
        return self._dirs.get(fh)

    async def dir_entries(self, d: OpenDirectory, i: int,
                          n: int = READDIR_BATCH) -> list[tuple[bytes, Attributes]]:
        """Up to ``n`` entries of the listing from entry ``i`` (loaded from the master
        page by page); [] past the last.  A readdir request takes a few dozen."""
        if i == 0 and d.entries:
            # a rewind (rewinddir, or lseek to 0): POSIX wants the directory as it is
            # now, as a new opendir would read it, not this handle's first reading
            d.entries, d.after, d.done = [], b"", False
        while i >= len(d.entries):
            if d.done:
                return []
            # leased like lookups while the lease session is up (ls -l then stats from
            # the kernel); lease_ms 0 without one
            sent = time.monotonic()
            generation = self.kernel.listings.generation
            page, more, lease_ms, listing_ms = await self.calls.run(
                self.requests.listdir_leased(d.ino, d.after, READDIR_PAGE))
            if listing_ms:  # the whole directory, leased: misses in it are answered here
                self.kernel.listings.install(d.ino, [e.name for e in page],
                                             self.kernel.lease_ttl(listing_ms, sent),
                                             generation)
            ttl = self.kernel.lease_ttl(lease_ms, sent)
            until = time.monotonic() + ttl if ttl else 0.0
            entries, dirs = d.entries, []
            for e in page:  # one pass: a listing has thousands
                inode = e.inode
                entries.append((e.name, inode, until))
                if inode.type == DIRECTORY:
                    dirs.append(inode)
            self.kernel.note_dirs(*dirs)
            if page:
                d.after = page[-1].name
            d.done = not more or not page
        return self._listed(d.entries[i:i + n])

    def _listed(self, items: list[tuple[bytes, Inode, float]]
                ) -> list[tuple[bytes, Attributes]]:
        """``attributes`` of listed entries, the timeouts worked out once per lease (a
        listing makes thousands: ~1 us each instead of ~3)."""
        now = time.monotonic()
        writers = self._writers
        out = []
        last_until, leased = None, []
        for name, inode, until in items:
            if until != last_until:
                if leased:
                    self.kernel.lease_inodes(leased, lease)
                    leased = []
                last_until, lease = until, until - now if until > now else 0.0
                entry_timeout, file_attr, dir_attr = self.kernel.leased_timeouts(lease)
            if writers.get(inode.ino):  # the size this mount writes (attributes)
                out.append((name, self.attributes(inode, lease=lease)))
            elif inode.type == DIRECTORY:
                out.append((name, Attributes(inode, inode.size, entry_timeout, dir_attr)))
            else:
                out.append((name, Attributes(inode, inode.size, entry_timeout, file_attr)))
                if lease > 0:
                    leased.append(inode.ino)
        if leased:
            self.kernel.lease_inodes(leased, lease)
        return out

    def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    def close(self) -> None:
        """Drop every handle (unpublished versions are lost)."""
        for h in self._handles.values():
            h.close()
        self._handles.clear()
        self._dirs.clear()
        if self._sockets is not None:
            self._sockets.close()

