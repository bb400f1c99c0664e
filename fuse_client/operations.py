"""The pyfuse3 adapter: one ``Operations`` class, one thin handler per request.

Each handler takes pyfuse3's arguments, calls the file system layer
(filesystem.py: names, handles, versions, publish on close) and turns its answer into
pyfuse3's types (EntryAttributes, FileInfo, StatvfsData).  Errors leave a handler
only as ``FUSEError(errno)``, translated in one place (:func:`_fuse_op`).

The class also wires the mount together: one capacity limiter for every thread hop
(``_run``), the Calls route of every master call (calls.py), the kernel cache
(kernel_cache.py: leases, epoch, directory attributes), and the access reports.
"""

from __future__ import annotations

import errno
import functools
import logging
import stat

import pyfuse3
import trio

from curvine.client.master.call_port_blocking import BlockingCallPort
from curvine.client.master.master_client import AccessReporter, MasterClient
from curvine.common import master_group, tls
from curvine.common.config import Config
from curvine.common.errors import CurvineError, ErrorKind, to_errno
from curvine.common.ids import MIB
from curvine.proto import common_pb2

from . import features
from .call_port_trio import Outage, TrioCallPort

MOVE_CHECK = 0.1  # seconds between looks at whether the calls moved to another master
from .calls import Calls, CallStream
from .filesystem import XATTR_PREFIX, Absent, Attributes, FileSystem, Handle, Opened
from .kernel_cache import KernelCache

log = logging.getLogger(__name__)

DIRECTORY = common_pb2.DIRECTORY

# st_mode's file type of each inode type (regular files are the default)
_S_IFMT = {common_pb2.DIRECTORY: stat.S_IFDIR, common_pb2.SYMLINK: stat.S_IFLNK,
           common_pb2.FIFO: stat.S_IFIFO, common_pb2.SOCKET: stat.S_IFSOCK,
           common_pb2.CHAR_DEVICE: stat.S_IFCHR, common_pb2.BLOCK_DEVICE: stat.S_IFBLK}
_TYPE_OF_S_IFMT = {v: k for k, v in _S_IFMT.items() if k != common_pb2.DIRECTORY}

STATFS_BLOCK = 4096
_LOUD_KINDS = {ErrorKind.IO, ErrorKind.UNAVAILABLE, ErrorKind.CHECKSUM, ErrorKind.TIMEOUT,
               ErrorKind.UNAUTHENTICATED}


# Requests about an inode the kernel found by a path earlier (not a name in a
# directory): if the master no longer has it, another mount removed or replaced it
# since.  ESTALE, not ENOENT: the kernel then walks the path once more, with a fresh
# LOOKUP (as for NFS), so open(2) or stat(2) of a name that another mount has just
# renamed a new file over finds the new file instead of failing.
_BY_INODE = {"getattr", "setattr", "readlink", "link", "open", "opendir", "_getxattr",
             "setxattr", "listxattr", "removexattr"}


def _fuse_op(fn):
    """The one place where failures become errnos.

    User errors (ENOENT, EEXIST, ...) are logged at DEBUG; cluster trouble as one
    WARNING line; anything unexpected once with its traceback, as EIO."""
    gone = errno.ESTALE if fn.__name__ in _BY_INODE else errno.ENOENT

    @functools.wraps(fn)
    async def wrapper(self, *args):
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError:
            raise
        except CurvineError as e:
            level = logging.WARNING if e.kind in _LOUD_KINDS else logging.DEBUG
            if log.isEnabledFor(level):
                log.log(level, "%s%s: %s", fn.__name__, _brief(args), e)
            raise pyfuse3.FUSEError(gone if e.kind == ErrorKind.NOT_FOUND
                                    else to_errno(e.kind)) from None
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


def _entry_attributes(a: Attributes) -> pyfuse3.EntryAttributes:
    inode = a.inode
    is_dir = inode.type == DIRECTORY
    e = pyfuse3.EntryAttributes()
    e.st_ino = inode.ino
    e.generation = 0
    e.entry_timeout = a.entry_timeout
    e.attr_timeout = a.attr_timeout
    e.st_mode = _S_IFMT.get(inode.type, stat.S_IFREG) | (inode.mode & 0o7777)
    if a.nlink is not None:
        e.st_nlink = a.nlink
    elif is_dir:
        e.st_nlink = inode.nlink or 2
    else:  # 0: unlinked, still open (an inode from before hard links has 0 too: 1)
        e.st_nlink = inode.nlink if inode.nlink or inode.parent == 0 else 1
    e.st_uid = inode.uid
    e.st_gid = inode.gid
    e.st_rdev = inode.rdev
    e.st_size = a.size
    e.st_blksize = MIB
    # what is stored (holes are not), unless this mount's writer has its own size
    stored = (inode.stored if inode.HasField("stored") and a.size == inode.size
              else a.size)
    e.st_blocks = (stored + 511) // 512
    e.st_atime_ns = inode.atime_ns
    e.st_mtime_ns = inode.mtime_ns
    e.st_ctime_ns = inode.ctime_ns
    return e


def _file_info(o: Opened) -> pyfuse3.FileInfo:
    return pyfuse3.FileInfo(fh=o.fh, direct_io=o.direct_io, keep_cache=o.keep_cache)


class Operations(pyfuse3.Operations):
    """curvine as a FUSE file system."""

    supports_dot_lookup = True
    # a symlink's target never changes (and inode numbers are never reused): the
    # kernel may keep it in its page cache (scripts/pyfuse3/cache-symlinks.patch)
    # instead of sending a READLINK each time a path goes through the link; a stock
    # pyfuse3 never reads this
    enable_cache_symlinks = True

    def __init__(self, cfg: Config, master: MasterClient):
        """``master``: the mount's client of the master (made with its security by
        fuse_client/main.py); closed by :meth:`close`."""
        super().__init__()
        self.cfg = cfg
        self.features = features.detect()  # what this pyfuse3 build can do
        self.enable_writeback_cache = cfg.fuse.writeback_cache
        self.master = master
        self.limiter = trio.CapacityLimiter(max(1, cfg.client.rpc_threads))

        async def run(fn, *args, **kwargs):  # self._run at each call: a test may wrap it
            return await self._run(fn, *args, **kwargs)

        # master calls: on the Calls stream once start_streams() opened it
        self.calls = Calls(self.master, run)
        self.kernel = KernelCache(cfg, self.master)
        # opens for reading, reported to the master in batches (LRU eviction)
        self._access = AccessReporter(self.master, float(cfg.client.access_report_interval))
        self.fs = FileSystem(cfg, self.master, self.calls, self.kernel, self._access, run)

    async def _run(self, fn, *args, **kwargs):
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs),
                                             limiter=self.limiter)

    def _handle(self, fh: int) -> Handle:
        h = self.fs.handle(fh)
        if h is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return h

    # -- the mount's streams ------------------------------------------------------

    def start_streams(self) -> bool:
        """After pyfuse3.init: open the Calls stream, and the lease session if the
        kernel can expire every cached name at once (kernel_cache.py); True when
        leases are on."""
        self._access.start()
        if self.calls.route.stream is None and self.cfg.fuse.call_stream:
            stream = CallStream(self.master, float(self.cfg.cluster.rpc_timeout))
            stream.start()
            self.calls.route.stream = stream
        return self.kernel.start()

    async def run_call_port(self) -> None:
        """A task of the mount's nursery, after start_streams: learns the master's call
        port (StatFs) and keeps a connection to it up (fuse.call_port).  Of a master
        group, the port of the master the mount's calls go to: when they move to
        another (the leader), this connection is closed and that master's port used."""
        if not self.cfg.fuse.call_port or self.calls.route.port is not None:
            return
        outage = Outage()  # this mount's, over the ports of the masters it moves between
        while True:
            asked = False
            while True:
                try:
                    port = (await self.calls.run(self.master.requests.statfs())).call_port
                    break
                except CurvineError as e:
                    # once per outage, the retries at DEBUG
                    log.log(logging.DEBUG if asked or outage.since else logging.INFO,
                            "asking the master for its call port: %s (trying again)", e)
                    asked = True
                    await trio.sleep(5)
            moves = master_group.moves(self.master._rpc)
            if not port:
                log.info("the master has no call port: namespace calls go on the stream")
                if not isinstance(self.master._rpc, master_group.GroupRpc):
                    return
                await self._until_moved(moves)
                continue
            host = self.master.address.rpartition(":")[0].strip("[]")
            token, timeout = self.master.security.token, float(self.cfg.cluster.rpc_timeout)
            # TLS on: the port speaks it too (one context for both clients)
            context, name = tls.client_side(self.master.security.material, host)
            route = self.calls.route
            route.thread_port = thread_port = BlockingCallPort(host, port, token, timeout,
                                                               tls=context, server_name=name)
            route.port = trio_port = TrioCallPort(host, port, token, timeout,
                                                  tls=context, server_name=name,
                                                  outage=outage)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(trio_port.run)
                    await self._until_moved(moves)
                    outage.moved()
                    nursery.cancel_scope.cancel()
            finally:
                route.port = route.thread_port = None
                trio_port.stop()
                thread_port.close()

    async def _until_moved(self, moves: int) -> None:
        """Return once the mount's master calls went to another master of the group."""
        while master_group.moves(self.master._rpc) == moves:
            await trio.sleep(MOVE_CHECK)

    def stop_streams(self) -> None:
        """Before unmounting: no kernel notification may follow (pyfuse3.close frees
        the session they go through)."""
        self.kernel.stop()
        if self.calls.route.stream is not None:
            self.calls.route.stream.stop()
        if self.calls.route.port is not None:
            self.calls.route.port.stop()

    # -- names and attributes ----------------------------------------------------

    @_fuse_op
    async def lookup(self, parent_inode, name, ctx=None):
        attrs = await self.fs.lookup(parent_inode, name)
        if isinstance(attrs, Absent):
            if not attrs.entry_timeout:
                raise pyfuse3.FUSEError(errno.ENOENT)
            # a negative entry: inode 0, kept by the kernel until the lease's end or
            # the master's revocation (an epoch bump expires it with every name)
            e = pyfuse3.EntryAttributes()
            e.st_ino = 0
            e.entry_timeout = attrs.entry_timeout
            return e
        return _entry_attributes(attrs)

    @_fuse_op
    async def getattr(self, inode, ctx=None):
        return _entry_attributes(await self.fs.getattr(inode))

    @_fuse_op
    async def setattr(self, inode, attr, fields, fh, ctx):
        return _entry_attributes(await self.fs.setattr(
            inode, fh,
            size=attr.st_size if fields.update_size else None,
            mode=attr.st_mode if fields.update_mode else None,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None,
            atime_ns=attr.st_atime_ns if fields.update_atime else None,
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else None))

    @_fuse_op
    async def mkdir(self, parent_inode, name, mode, ctx):
        attrs = await self.fs.mkdir(parent_inode, name, mode, ctx.uid, ctx.gid)
        return _entry_attributes(attrs)

    @_fuse_op
    async def rmdir(self, parent_inode, name, ctx):
        await self.fs.rmdir(parent_inode, name)

    @_fuse_op
    async def unlink(self, parent_inode, name, ctx):
        await self.fs.unlink(parent_inode, name)

    @_fuse_op
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        known = pyfuse3.RENAME_EXCHANGE | pyfuse3.RENAME_NOREPLACE
        if flags & ~known or flags == known:
            raise pyfuse3.FUSEError(errno.EINVAL)  # as the kernel says for both at once
        await self.fs.rename(parent_inode_old, name_old, parent_inode_new, name_new,
                             no_replace=bool(flags & pyfuse3.RENAME_NOREPLACE),
                             exchange=bool(flags & pyfuse3.RENAME_EXCHANGE), pid=ctx.pid)

    @_fuse_op
    async def link(self, inode, new_parent_inode, new_name, ctx):
        return _entry_attributes(await self.fs.link(inode, new_parent_inode, new_name))

    @_fuse_op
    async def symlink(self, parent_inode, name, target, ctx):
        return _entry_attributes(await self.fs.symlink(parent_inode, name, target,
                                                       ctx.uid, ctx.gid))

    @_fuse_op
    async def readlink(self, inode, ctx):
        return await self.fs.readlink(inode)

    @_fuse_op
    async def statfs(self, ctx):
        r = await self.fs.statfs()
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

    @_fuse_op
    async def create(self, parent_inode, name, mode, flags, ctx):
        opened, attrs = await self.fs.create(parent_inode, name, mode, flags, ctx.uid,
                                             ctx.gid, ctx.pid)
        return _file_info(opened), _entry_attributes(attrs)

    @_fuse_op
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        if stat.S_ISREG(mode):
            attrs = await self.fs.mknod(parent_inode, name, mode, ctx.uid, ctx.gid)
        else:
            kind = _TYPE_OF_S_IFMT.get(stat.S_IFMT(mode))
            if kind is None:
                raise pyfuse3.FUSEError(errno.EINVAL)
            attrs = await self.fs.make_node(parent_inode, name, kind, mode, rdev,
                                            ctx.uid, ctx.gid)
        return _entry_attributes(attrs)

    @_fuse_op
    async def open(self, inode, flags, ctx):
        return _file_info(await self.fs.open(inode, flags, ctx.pid))

    @_fuse_op
    async def read(self, fh, off, size):
        return await self.fs.read(self._handle(fh), off, size)

    @_fuse_op
    async def write(self, fh, off, buf):
        h = self._handle(fh)
        if h.writer is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return await self.fs.write(h, off, buf)

    @_fuse_op
    async def fallocate(self, fh, mode, offset, length):
        # called by pyfuse3 with scripts/pyfuse3/fallocate.patch; stock pyfuse3 has no
        # handler (libfuse answers ENOSYS) and the kernel says EOPNOTSUPP to every caller
        h = self._handle(fh)
        if h.writer is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        await self.fs.fallocate(h, mode, offset, length)

    @_fuse_op
    async def flush(self, fh):
        await self.fs.flush(self._handle(fh))

    @_fuse_op
    async def fsync(self, fh, datasync):
        await self.fs.fsync(self._handle(fh))

    @_fuse_op
    async def release(self, fh):
        await self.fs.release(fh)

    # -- directories ----------------------------------------------------------------

    @_fuse_op
    async def opendir(self, inode, ctx):
        if not self.features.cache_readdir:
            # stock pyfuse3 takes a plain handle only (its FileInfo has no cache_readdir)
            return self.fs.opendir(inode)
        # while this mount holds the directory's listing the kernel may keep its
        # entries (listings.py): a second listing is answered without a request
        cache, keep = self.kernel.listings.opendir(inode)
        return pyfuse3.FileInfo(fh=self.fs.opendir(inode), cache_readdir=cache,
                                keep_cache=keep)

    @_fuse_op
    async def readdir(self, fh, start_id, token):
        listing = self.fs.listing(fh)
        if listing is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        i = start_id
        while batch := await self.fs.dir_entries(listing, i):
            for name, attrs in batch:
                if not pyfuse3.readdir_reply(token, name, _entry_attributes(attrs), i + 1):
                    return
                i += 1

    @_fuse_op
    async def releasedir(self, fh):
        self.fs.releasedir(fh)

    @_fuse_op
    async def fsyncdir(self, fh, datasync):
        pass  # namespace changes are durable when the master acknowledges them

    # -- extended attributes (the user. namespace; filesystem.py has the rules) ----------

    async def getxattr(self, inode, name, ctx):
        if not name.startswith(XATTR_PREFIX):
            # The kernel asks for security.capability before every write(2) to a FUSE
            # file: answered here, without the error path's logging
            raise pyfuse3.FUSEError(errno.ENODATA)
        return await self._getxattr(inode, name)

    @_fuse_op
    async def _getxattr(self, inode, name):
        return await self.fs.getxattr(inode, name)

    @_fuse_op
    async def setxattr(self, inode, name, value, ctx):
        # pyfuse3 3.5 passes no flags: XATTR_CREATE / XATTR_REPLACE are not known here
        await self.fs.setxattr(inode, name, value)

    @_fuse_op
    async def listxattr(self, inode, ctx):
        return await self.fs.listxattr(inode)

    @_fuse_op
    async def removexattr(self, inode, name, ctx):
        await self.fs.removexattr(inode, name)

    def close(self) -> None:
        """Drop every handle (unpublished versions are lost) and the master link."""
        self.fs.close()
        self.kernel.close()
        if self.calls.route.stream is not None:
            self.calls.route.stream.stop()
        if self.calls.route.thread_port is not None:
            self.calls.route.thread_port.close()
        self._access.close()
        self.master.close()
