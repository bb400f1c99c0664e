"""Typed client of the master's metadata service.

Every method is synchronous (call it from a thread when you are in an event loop)
and raises ``CurvineError``.  Each mutating call generates one request id and
reuses it for all of its retries, so a retry after a lost reply returns the first
result from the master's retry cache instead of e.g. EEXIST.

A FUSE mount also runs a :class:`LeaseSession` (master/leases.py): while it is up,
``MasterClient.session`` is set, the ``*_leased`` reads return how long their
answer may be cached, and mutations name the session so that the master does not
wait for this mount to drop what it changed itself.
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import grpc

from curvine.common.call_wire import PortDown
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import new_request_id
from curvine.common.rpc import RETRY_MAX, RpcClient
from curvine.common.security import Security
from curvine.proto import common_pb2, master_pb2, master_pb2_grpc

from .call_port import BlockingCallPort, for_security

Inode = common_pb2.Inode
Block = common_pb2.Block
WorkerInfo = common_pb2.WorkerInfo

LISTDIR_PAGE = 1000
PORT_RECHECK = 30.0  # seconds before asking again a master that had no call port

log = logging.getLogger(__name__)


def _field(msg, name: str):
    return getattr(msg, name) if msg.HasField(name) else None


class Prepared(NamedTuple):
    method: str  # the unary RPC
    op: str  # its field in master.Call (the Calls stream)
    request: Any
    convert: Callable  # reply -> result


def _inode_or_miss(reply: master_pb2.InodeReply) -> tuple[Inode | None, int]:
    """(the inode or None for a miss, the lease ms of the entry or of its absence)"""
    return (reply.inode if reply.HasField("inode") else None), reply.lease_ms


def _inode_lease(reply: master_pb2.InodeReply) -> tuple[Inode, int]:
    return reply.inode, reply.lease_ms


def _inode_lease_parent(reply: master_pb2.InodeReply) -> tuple[Inode, int, Inode | None]:
    return reply.inode, reply.lease_ms, _field(reply, "parent")


def _mkdir_reply(reply: master_pb2.InodeReply) -> tuple[Inode, int, Inode | None, int]:
    return reply.inode, reply.lease_ms, _field(reply, "parent"), reply.listing_lease_ms


def _inode(reply: master_pb2.InodeReply) -> Inode:
    return reply.inode


def _parent(reply: master_pb2.ParentReply) -> Inode | None:
    return _field(reply, "parent")


def _parent_held(reply: master_pb2.ParentReply) -> tuple[Inode | None, int]:
    """(the parent after the change, the inode kept unlinked for this mount or 0)"""
    return _field(reply, "parent"), reply.held


def _parents_held(reply: master_pb2.ParentReply
                  ) -> tuple[Inode | None, Inode | None, Inode | None, int]:
    """(parent, new parent or None, the moved inode, the replaced inode kept or 0)"""
    return (_field(reply, "parent"), _field(reply, "new_parent"), _field(reply, "moved"),
            reply.held)


class MasterClient:
    """The master's namespace and block API, one method per RPC.

    ``security``: the credentials of its channel (common/security.py); objects built
    from this client (writers, readers) use ``.security`` for their own channels."""

    def __init__(self, address: str, timeout: float = 30.0, wait: float = 60.0, *,
                 security: Security, call_port: bool = False):
        self.address = address
        self.security = security
        self.timeout = timeout
        self._rpc = RpcClient(address, master_pb2_grpc.MasterStub, security=security,
                              timeout=timeout, wait=wait)
        self.session = 0  # lease session id while a LeaseSession is up (0 = none)
        # ``call_port``: namespace calls on the master's call port when it has one
        # (client/call_port.py; learned from StatFs at the first call), else unary
        self._port: BlockingCallPort | None = None
        self._port_checked = 0.0 if call_port else None  # monotonic time of the last StatFs
        self._port_lock = threading.Lock()

    def _call(self, method: str, request):
        # Reads are naturally idempotent; mutations carry a request id that the
        # master's retry cache recognises, so every call may be retried.
        return self._rpc.call(method, request, idempotent=True)

    def _call_op(self, method: str, op: str, request, timeout: float | None = None,
                 wait: float | None = None):
        """Namespace call ``op`` (its field in master.Call): on the call port when there
        is one, else (or when the port cannot carry it) the unary RPC ``method`` with
        the same request."""
        end = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:  # the caller's deadline covers the whole route
            return None if end is None else max(end - time.monotonic(), 0.001)

        port = self._call_port(timeout, wait)
        if port is not None:
            try:
                return port.call(op, request, left())
            except PortDown:
                pass
        return self._rpc.call(method, request, idempotent=True, timeout=left(), wait=wait)

    def _call_port(self, timeout: float | None, wait: float | None
                   ) -> BlockingCallPort | None:
        """The call port, once StatFs named one (asked with the caller's deadline and
        wait: a connector that must not wait for a master that is down does not)."""
        if self._port is not None or self._port_checked is None:
            return self._port
        now = time.monotonic()
        if self._port_checked and now - self._port_checked < PORT_RECHECK:
            return None
        with self._port_lock:
            if self._port is None and now - self._port_checked >= PORT_RECHECK:
                self._port_checked = now
                try:
                    number = self._rpc.call("StatFs", master_pb2.StatFsRequest(),
                                            timeout=timeout, wait=wait).call_port
                except CurvineError as e:
                    log.debug("asking the master for its call port: %s", e)
                    return None
                if number:
                    host = self.address.rpartition(":")[0].strip("[]")
                    self._port = for_security(host, number, self.security, self.timeout)
        return self._port

    # -- namespace -------------------------------------------------------------

    # Namespace calls the FUSE handlers make: each one is a request built here (with the
    # session, and one request id reused by every retry) and a conversion of the reply,
    # so that fuse_client/calls.py can send the same request on the mount's Calls
    # stream and fall back to the unary RPC with it.

    def prepare(self, op: str, *args, **kwargs) -> Prepared:
        """The request of namespace call ``op`` (a field of master.Call) and how to
        convert its reply; ``call(prepared)`` runs it as a unary RPC."""
        return getattr(self, "_prep_" + op)(*args, **kwargs)

    def call(self, prepared: Prepared, timeout: float | None = None,
             wait: float | None = None):
        return prepared.convert(self._call_op(prepared.method, prepared.op, prepared.request,
                                              timeout, wait))

    def _prep_lookup(self, parent: int, name: bytes, lease_miss: bool = False) -> Prepared:
        """``lease_miss``: a miss is leased too (a negative entry the session caches)."""
        return Prepared("Lookup", "lookup", master_pb2.LookupRequest(
            parent=parent, name=name, miss_ok=True, session=self.session,
            lease_miss=lease_miss and bool(self.session)), _inode_or_miss)

    def _prep_getattr(self, ino: int) -> Prepared:
        return Prepared("GetAttr", "getattr",
                        master_pb2.GetAttrRequest(ino=ino, session=self.session), _inode_lease)

    def _prep_mkdir(self, parent: int, name: bytes, mode: int = 0o755, uid: int = 0,
                    gid: int = 0) -> Prepared:
        return Prepared("Mkdir", "mkdir", master_pb2.MkdirRequest(
            request_id=new_request_id(), parent=parent, name=name, mode=mode & 0o7777,
            uid=uid, gid=gid, session=self.session), _inode_lease_parent)

    def _prep_mkdir_listed(self, parent: int, name: bytes, mode: int = 0o755, uid: int = 0,
                           gid: int = 0) -> Prepared:
        """mkdir for a mount: also the lease on the new directory's (empty) listing."""
        prepared = self._prep_mkdir(parent, name, mode, uid, gid)
        return prepared._replace(convert=_mkdir_reply)

    def _prep_create(self, parent: int, name: bytes, mode: int = 0o644, uid: int = 0,
                     gid: int = 0, exclusive: bool = False) -> Prepared:
        return Prepared("Create", "create", master_pb2.CreateRequest(
            request_id=new_request_id(), parent=parent, name=name, mode=mode & 0o7777,
            uid=uid, gid=gid, exclusive=exclusive, session=self.session), _inode_lease_parent)

    def _prep_unlink(self, parent: int, name: bytes, open_inos: Sequence[int] = ()
                     ) -> Prepared:
        """``open_inos``: inodes this mount has open; if the name was the last of one of
        them, the master keeps it (the result's held ino) until ``release_inode``."""
        return Prepared("Unlink", "unlink", master_pb2.UnlinkRequest(
            request_id=new_request_id(), parent=parent, name=name, session=self.session,
            open_inos=list(open_inos)), _parent_held)

    def _prep_rmdir(self, parent: int, name: bytes) -> Prepared:
        return Prepared("Rmdir", "rmdir", master_pb2.RmdirRequest(
            request_id=new_request_id(), parent=parent, name=name, session=self.session),
            _parent)

    def _prep_rename(self, parent: int, name: bytes, new_parent: int, new_name: bytes,
                     no_replace: bool = False, source_ino: int = 0,
                     require_published: bool = False, writer_inos: Sequence[int] = (),
                     open_inos: Sequence[int] = (), exchange: bool = False) -> Prepared:
        """``open_inos``: as for unlink, for a replaced target; ``exchange``:
        RENAME_EXCHANGE (both names exist and swap)."""
        return Prepared("Rename", "rename", master_pb2.RenameRequest(
            request_id=new_request_id(), parent=parent, name=name, new_parent=new_parent,
            new_name=new_name, no_replace=no_replace, source_ino=source_ino,
            require_published=require_published, session=self.session,
            writer_inos=list(writer_inos), open_inos=list(open_inos), exchange=exchange),
            _parents_held)

    def _prep_complete(self, ino: int, blocks: Sequence[Block], size: int, mtime_ns: int = 0,
                       if_unpublished: bool = False,
                       abandoned: Sequence[int] = (), open_id: int = 0) -> Prepared:
        return Prepared("CompleteFile", "complete", master_pb2.CompleteFileRequest(
            request_id=new_request_id(), ino=ino, blocks=list(blocks), size=size,
            mtime_ns=mtime_ns, if_unpublished=if_unpublished, session=self.session,
            abandoned_block_ids=list(abandoned), open_id=open_id if self.session else 0),
            _inode)

    def _prep_getattr_unleased(self, ino: int) -> Prepared:
        """GetAttr without the session: an answer the kernel keeps only for
        fuse.attr_timeout, so the master has no lease of this mount to revoke."""
        return Prepared("GetAttr", "getattr", master_pb2.GetAttrRequest(ino=ino), _inode)

    def _prep_add_block(self, ino: int, client_host_id: str, size_hint: int = 0,
                        exclude: Sequence[int] = ()) -> Prepared:
        # No request id: a retried AddBlock only allocates another id, and an id
        # that is never completed is garbage-collected by the master.
        return Prepared("AddBlock", "add_block", master_pb2.AddBlockRequest(
            ino=ino, client_host_id=client_host_id, size_hint=size_hint,
            exclude_workers=list(exclude)),
            lambda reply: (reply.block_id, list(reply.workers), reply.block_token))

    def _prep_setattr(self, ino: int, **fields) -> Prepared:
        return Prepared("SetAttr", "setattr", master_pb2.SetAttrRequest(
            request_id=new_request_id(), ino=ino, session=self.session, **fields), _inode)

    def _prep_listdir(self, ino: int, start_after: bytes = b"",
                      limit: int = LISTDIR_PAGE) -> Prepared:
        return Prepared("ListDir", "listdir", master_pb2.ListDirRequest(
            ino=ino, start_after=start_after, limit=limit),
            lambda reply: (list(reply.entries), reply.has_more))

    def _prep_listdir_leased(self, ino: int, start_after: bytes = b"",
                             limit: int = LISTDIR_PAGE) -> Prepared:
        """A page leased to this session, if one is up: (entries, has_more, lease ms of
        the names and files' attributes, lease ms of the whole listing; 0s without a
        session).  A first page that is the whole directory may lease the listing."""
        return Prepared("ListDir", "listdir", master_pb2.ListDirRequest(
            ino=ino, start_after=start_after, limit=limit, session=self.session,
            lease_listing=not start_after),
            lambda reply: (list(reply.entries), reply.has_more, reply.lease_ms,
                           reply.listing_lease_ms))

    def _prep_listing(self, ino: int, limit: int) -> Prepared:
        """The names of directory ``ino`` if it has at most ``limit``, with a lease on
        that listing for this session: (names or None when there are more or the
        directory is busy, lease ms; 0 without a session or when the master denies it)."""
        return Prepared("ListDir", "listdir", master_pb2.ListDirRequest(
            ino=ino, limit=limit, session=self.session, names_only=True,
            lease_listing=True),
            lambda reply: (None if reply.has_more else [e.name for e in reply.entries],
                           reply.listing_lease_ms))

    def _prep_statfs(self) -> Prepared:
        return Prepared("StatFs", "statfs", master_pb2.StatFsRequest(), lambda reply: reply)

    def _prep_get_blocks(self, ino: int, session: int = 0, open_id: int = 0,
                         write: bool = False) -> Prepared:
        return Prepared("GetBlocks", "get_blocks", master_pb2.GetBlocksRequest(
            ino=ino, session=session if open_id else 0, open_id=open_id if session else 0,
            write=write),
            lambda reply: (reply.inode, list(reply.blocks),
                           {w.worker_id: w for w in reply.workers}))

    # POSIX beyond files and directories (issue 15)

    def _prep_symlink(self, parent: int, name: bytes, target: bytes, uid: int = 0,
                      gid: int = 0) -> Prepared:
        return Prepared("Symlink", "symlink", master_pb2.SymlinkRequest(
            request_id=new_request_id(), parent=parent, name=name, target=target, uid=uid,
            gid=gid, session=self.session), _inode_lease_parent)

    def _prep_make_node(self, parent: int, name: bytes, type: int, mode: int, rdev: int = 0,
                        uid: int = 0, gid: int = 0) -> Prepared:
        """A FIFO, socket or device (``type``: common_pb2.FIFO, ...)."""
        return Prepared("MakeNode", "make_node", master_pb2.MakeNodeRequest(
            request_id=new_request_id(), parent=parent, name=name, type=type,
            mode=mode & 0o7777, rdev=rdev, uid=uid, gid=gid, session=self.session),
            _inode_lease_parent)

    def _prep_link(self, ino: int, new_parent: int, new_name: bytes) -> Prepared:
        """A hard link: (the inode with its new nlink, lease ms, new parent)."""
        return Prepared("Link", "link", master_pb2.LinkRequest(
            request_id=new_request_id(), ino=ino, new_parent=new_parent, new_name=new_name,
            session=self.session), _inode_lease_parent)

    def _prep_release_inode(self, ino: int) -> Prepared:
        return Prepared("ReleaseInode", "release_inode", master_pb2.ReleaseInodeRequest(
            request_id=new_request_id(), ino=ino, session=self.session), lambda reply: None)

    def _prep_set_xattr(self, ino: int, name: bytes, value: bytes, flags: int = 0
                        ) -> Prepared:
        """``flags``: 1 create only (EXISTS if set), 2 replace only (NO_DATA if not)."""
        return Prepared("SetXattr", "set_xattr", master_pb2.SetXattrRequest(
            request_id=new_request_id(), ino=ino, name=name, value=value, flags=flags,
            session=self.session), _inode)

    def _prep_get_xattr(self, ino: int, name: bytes) -> Prepared:
        return Prepared("GetXattr", "get_xattr", master_pb2.GetXattrRequest(ino=ino, name=name),
                        lambda reply: reply.value)

    def _prep_list_xattr(self, ino: int) -> Prepared:
        return Prepared("ListXattr", "list_xattr", master_pb2.ListXattrRequest(ino=ino),
                        lambda reply: list(reply.names))

    def _prep_remove_xattr(self, ino: int, name: bytes) -> Prepared:
        return Prepared("RemoveXattr", "remove_xattr", master_pb2.RemoveXattrRequest(
            request_id=new_request_id(), ino=ino, name=name, session=self.session), _inode)

    # -- namespace -------------------------------------------------------------

    def lookup(self, parent: int, name: bytes, timeout: float | None = None) -> Inode:
        node = self.lookup_or_none(parent, name, timeout)
        if node is None:
            raise CurvineError(ErrorKind.NOT_FOUND, "no such file or directory")
        return node

    def lookup_or_none(self, parent: int, name: bytes, timeout: float | None = None
                       ) -> Inode | None:
        """The inode of ``name`` in ``parent``, or None when there is none (one cheap
        reply, not an error status: a miss is LMCache's hot path)."""
        reply = self._call_op("Lookup", "lookup", master_pb2.LookupRequest(
            parent=parent, name=name, miss_ok=True), timeout)
        return reply.inode if reply.HasField("inode") else None

    def lookup_leased(self, parent: int, name: bytes, lease_miss: bool = False
                      ) -> tuple[Inode | None, int]:
        """lookup_or_none, plus the milliseconds this session may cache the answer (a
        miss: 0, unless ``lease_miss``)."""
        return self.call(self._prep_lookup(parent, name, lease_miss))

    def getattr(self, ino: int, timeout: float | None = None) -> Inode:
        return self.call(self._prep_getattr_unleased(ino), timeout)

    def getattr_leased(self, ino: int) -> tuple[Inode, int]:
        return self.call(self._prep_getattr(ino))

    def setattr(self, ino: int, **fields) -> Inode:
        """Change mode, uid, gid, size (truncate/extend), atime_ns, mtime_ns."""
        return self.call(self._prep_setattr(ino, **fields))

    def mkdir(self, parent: int, name: bytes, mode: int = 0o755, uid: int = 0, gid: int = 0,
              timeout: float | None = None) -> Inode:
        return self.call(self._prep_mkdir(parent, name, mode, uid, gid), timeout)[0]

    def mkdir_leased(self, parent: int, name: bytes, mode: int = 0o755, uid: int = 0,
                     gid: int = 0) -> tuple[Inode, int, Inode | None]:
        """(new directory, lease ms, the parent's attributes after the change)"""
        return self.call(self._prep_mkdir(parent, name, mode, uid, gid))

    def create(self, parent: int, name: bytes, mode: int = 0o644, uid: int = 0, gid: int = 0,
               exclusive: bool = False) -> Inode:
        return self.create_leased(parent, name, mode, uid, gid, exclusive)[0]

    def create_leased(self, parent: int, name: bytes, mode: int = 0o644, uid: int = 0,
                      gid: int = 0, exclusive: bool = False) -> tuple[Inode, int, Inode | None]:
        """(the file, lease ms, the parent's attributes after the change)"""
        return self.call(self._prep_create(parent, name, mode, uid, gid, exclusive))

    def unlink(self, parent: int, name: bytes) -> Inode | None:
        """Returns the parent's attributes after the change."""
        return self.call(self._prep_unlink(parent, name))[0]

    def rmdir(self, parent: int, name: bytes) -> Inode | None:
        return self.call(self._prep_rmdir(parent, name))

    def rename(self, parent: int, name: bytes, new_parent: int, new_name: bytes,
               no_replace: bool = False, source_ino: int = 0,
               require_published: bool = False, writer_inos: Sequence[int] = ()
               ) -> tuple[Inode | None, Inode | None, Inode | None]:
        """Returns both directories' attributes after the change (the second None when
        they are the same directory) and the moved inode's."""
        return self.call(self._prep_rename(parent, name, new_parent, new_name, no_replace,
                                           source_ino, require_published, writer_inos))[:3]

    def symlink(self, parent: int, name: bytes, target: bytes, uid: int = 0, gid: int = 0
                ) -> tuple[Inode, int, Inode | None]:
        """(the symlink, lease ms, the parent after the change)"""
        return self.call(self._prep_symlink(parent, name, target, uid, gid))

    def make_node(self, parent: int, name: bytes, type: int, mode: int, rdev: int = 0,
                  uid: int = 0, gid: int = 0) -> tuple[Inode, int, Inode | None]:
        """(the special file, lease ms, the parent after the change)"""
        return self.call(self._prep_make_node(parent, name, type, mode, rdev, uid, gid))

    def link(self, ino: int, new_parent: int, new_name: bytes
             ) -> tuple[Inode, int, Inode | None]:
        """(the inode with its new nlink, lease ms, the new parent after the change)"""
        return self.call(self._prep_link(ino, new_parent, new_name))

    def release_inode(self, ino: int) -> None:
        """This mount's last descriptor of ``ino`` (kept unlinked: a held ino) closed."""
        return self.call(self._prep_release_inode(ino))

    def set_xattr(self, ino: int, name: bytes, value: bytes, flags: int = 0) -> Inode:
        return self.call(self._prep_set_xattr(ino, name, value, flags))

    def get_xattr(self, ino: int, name: bytes) -> bytes:
        return self.call(self._prep_get_xattr(ino, name))

    def list_xattr(self, ino: int) -> list[bytes]:
        return self.call(self._prep_list_xattr(ino))

    def remove_xattr(self, ino: int, name: bytes) -> Inode:
        return self.call(self._prep_remove_xattr(ino, name))

    def listdir(self, ino: int, start_after: bytes = b"", limit: int = LISTDIR_PAGE
                ) -> tuple[list[master_pb2.DirEntry], bool]:
        """One page of entries in name order after ``start_after``; (entries, has_more)."""
        return self.call(self._prep_listdir(ino, start_after, limit))

    def iterdir(self, ino: int, page: int = LISTDIR_PAGE) -> Iterable[master_pb2.DirEntry]:
        """All entries of a directory, page by page."""
        start = b""
        while True:
            entries, more = self.listdir(ino, start, page)
            yield from entries
            if not more or not entries:
                return
            start = entries[-1].name

    def end_sessions(self, sessions: Sequence[int]) -> None:
        """Tell the master these lease sessions' mount is gone (after unmounting)."""
        self._rpc.call("EndSessions", master_pb2.EndSessionsRequest(sessions=list(sessions)),
                       idempotent=True)

    def statfs(self, timeout: float | None = None) -> master_pb2.StatFsReply:
        return self.call(self._prep_statfs(), timeout)

    # -- data ----------------------------------------------------------------

    def get_blocks(self, ino: int, session: int = 0, open_id: int = 0, write: bool = False,
                   ) -> tuple[Inode, list[Block], dict[int, WorkerInfo]]:
        """The file's blocks and their workers; with ``session`` and ``open_id`` this is an
        open, recorded until ReportAccess reports it closed (AccessReporter.closed): the
        master keeps these blocks readable, and does not evict the file unless ``write``
        (a writer's open)."""
        return self.call(self._prep_get_blocks(ino, session, open_id, write))

    def add_block(self, ino: int, client_host_id: str, size_hint: int = 0,
                  exclude: Sequence[int] = ()) -> tuple[int, list[WorkerInfo], bytes]:
        """(block id, target workers, write token for the block)."""
        return self.call(self._prep_add_block(ino, client_host_id, size_hint, exclude))

    def complete_file(self, ino: int, blocks: Sequence[Block], size: int,
                      mtime_ns: int = 0, if_unpublished: bool = False,
                      abandoned: Sequence[int] = (), open_id: int = 0) -> Inode:
        """Publish a version; with ``if_unpublished`` only if none was ever published.
        ``abandoned``: blocks this writer was given and dropped (the master frees them);
        ``open_id``: the writer's open (GetBlocks), recorded now if it was not yet."""
        return self.call(self._prep_complete(ino, blocks, size, mtime_ns, if_unpublished,
                                             abandoned, open_id))

    # -- the connector's calls (connector/store.py) ------------------------------

    def lookup_many(self, parent: int, names: Sequence[bytes], with_blocks: bool = True,
                    timeout: float | None = None, wait: float | None = None,
                    ) -> master_pb2.LookupManyReply:
        """Every name of ``names`` in ``parent`` in one round trip (results parallel to
        names; a miss has no inode); with ``with_blocks`` complete files' blocks with read
        tokens and their workers."""
        return self._call_op("LookupMany", "lookup_many", master_pb2.LookupManyRequest(
            parent=parent, names=list(names), with_blocks=with_blocks), timeout, wait)

    def add_block_for_put(self, parent: int, name: bytes, client_host_id: str,
                          size_hint: int = 0, exclude: Sequence[int] = (),
                          timeout: float | None = None, wait: float | None = None,
                          ) -> master_pb2.AddBlockReply:
        """A block for PutFile of ``name`` into ``parent``; ``reply.existing`` set (and
        no block) if the name exists already."""
        return self._call_op("AddBlock", "add_block", master_pb2.AddBlockRequest(
            put_parent=parent, put_name=name, client_host_id=client_host_id,
            size_hint=size_hint, exclude_workers=list(exclude)), timeout, wait)

    def put_file(self, parent: int, name: bytes, blocks: Sequence[Block], size: int,
                 mode: int = 0o644, uid: int = 0, gid: int = 0, mtime_ns: int = 0,
                 timeout: float | None = None, wait: float | None = None,
                 ) -> tuple[Inode, bool]:
        """Publish a whole new file (blocks with their write tokens) under ``name`` in
        one journaled step: (inode, existed); existed means another writer's file was
        there and nothing changed."""
        reply = self._call_op("PutFile", "put_file", master_pb2.PutFileRequest(
            request_id=new_request_id(), parent=parent, name=name, mode=mode & 0o7777,
            uid=uid, gid=gid, blocks=list(blocks), size=size, mtime_ns=mtime_ns,
            session=self.session), timeout, wait)
        return reply.inode, reply.existed

    def add_blocks_for_put(self, parent: int, names: Sequence[bytes], sizes: Sequence[int],
                           client_host_id: str, timeout: float | None = None,
                           wait: float | None = None) -> master_pb2.AddBlocksForPutReply:
        """The blocks of many puts into ``parent`` in one call: per name (results
        parallel to ``names``) its existing inode, or its blocks (ids, lengths, targets
        and write tokens) for PutFiles; ``reply.workers`` lists the targets."""
        return self._call_op("AddBlocksForPut", "add_blocks_for_put",
                             master_pb2.AddBlocksForPutRequest(
                                 parent=parent, names=list(names), sizes=list(sizes),
                                 client_host_id=client_host_id), timeout, wait)

    def put_files(self, parent: int, files: Sequence[master_pb2.PutFileEntry],
                  abandoned: Sequence[Block] = (), timeout: float | None = None,
                  wait: float | None = None) -> list[master_pb2.PutFileResult]:
        """Publish many new files of ``parent`` in one journaled step, each whole or not
        at all: a result per file (PutStatus, inode, why).  ``abandoned``: blocks of
        this caller's reservation it does not publish (with their tokens: freed now)."""
        reply = self._call_op("PutFiles", "put_files", master_pb2.PutFilesRequest(
            request_id=new_request_id(), parent=parent, files=list(files),
            session=self.session, abandoned=list(abandoned)), timeout, wait)
        return list(reply.results)

    # -- capacity (master/capacity.py) ------------------------------------------

    def report_access(self, inos: Sequence[int], timeout: float | None = None,
                      session: int = 0, closed_opens: Sequence[int] = (),
                      bad_copies: Sequence[tuple[int, int]] = ()) -> None:
        """Files opened for reading, opens of ``session`` closed since, and copies
        found not intact, (block id, worker id) each (see AccessReporter); not retried
        for long."""
        self._rpc.call("ReportAccess", master_pb2.ReportAccessRequest(
            inos=list(inos), session=session, closed_opens=list(closed_opens),
            bad_copies=[master_pb2.BadCopy(block_id=b, worker_id=w) for b, w in bad_copies]),
            idempotent=True, timeout=timeout, wait=0)

    def set_policy(self, ino: int, ttl_ms: int | None = None,
                   replicas: int | None = None) -> Inode:
        """Set the TTL and/or the replica override of a directory (inherited by files
        created in it afterwards) or of a file."""
        req = master_pb2.SetPolicyRequest(request_id=new_request_id(), ino=ino,
                                          session=self.session)
        if ttl_ms is not None:
            req.ttl_ms = ttl_ms
        if replicas is not None:
            req.replicas = replicas
        return self._call("SetPolicy", req).inode

    def capacity_status(self) -> master_pb2.CapacityStatusReply:
        return self._call("CapacityStatus", master_pb2.CapacityStatusRequest())

    # -- admin (master/report.py) ----------------------------------------------

    def report(self) -> master_pb2.ReportReply:
        return self._call("Report", master_pb2.ReportRequest())

    def checkpoint(self, timeout: float = 600.0) -> master_pb2.CheckpointReply:
        """Ask the master to checkpoint now; returns once the checkpoint exists (a
        large namespace takes a while to copy, hence the long deadline)."""
        return self._rpc.call("Checkpoint", master_pb2.CheckpointRequest(), idempotent=True,
                              timeout=timeout)

    def close(self) -> None:
        if self._port is not None:
            self._port.close()
        self._rpc.close()


class StreamThread:
    """One daemon thread that keeps a stream to the master open (``_run``, which
    stores the stream's call in ``_call``) until ``stop()``."""

    def __init__(self, name: str):
        self._stop = threading.Event()
        self._call = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end (without waiting for it)."""
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()


class LeaseSession(StreamThread):
    """A mount's lease session with the master, kept up by one thread.

    While the stream is up ``client.session`` is set.  Each invalidation calls
    ``invalidate(names, inodes)`` (names: (parent, name) pairs) and is acked once it
    returns.  Whenever the stream is lost ``client.session`` is cleared first and
    ``drop_all()`` runs before a new session is opened; the new session tells the
    master which old ones were dropped, so its mutations need not wait for their
    leases to run out.  A master without leases (lease_time 0) answers session 0:
    then nothing is cached and the thread asks again after ``retry_idle`` seconds.
    """

    def __init__(self, client: MasterClient, invalidate: Callable[[list, list], None],
                 drop_all: Callable[[], None], retry_idle: float = 30.0):
        super().__init__("lease-session")
        self.client = client
        self.invalidate = invalidate
        self.drop_all = drop_all
        self.retry_idle = retry_idle
        self.lease_time = 0.0
        self.up = threading.Event()  # set while a session with leases is open
        self._dropped: list[int] = []
        self.opened: list[int] = []  # every session id this mount had

    def close(self) -> None:
        self.stop()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        delay = 0.1
        while not self._stop.is_set() and not self.client._rpc.closed:
            acks: queue.SimpleQueue = queue.SimpleQueue()
            dropped = list(self._dropped)

            def requests():
                yield master_pb2.SessionRequest(dropped=dropped)
                while True:
                    ack = acks.get()
                    if ack is None:
                        return
                    yield master_pb2.SessionRequest(ack=ack)

            idle = False
            call = None
            try:
                self._call = call = self.client._rpc.stub.Session(requests())
                events = iter(call)
                first = next(events)
                if not first.session_id:
                    idle = True  # the master grants no leases
                else:
                    self._dropped = []
                    self.lease_time = first.lease_ms / 1000
                    self.opened.append(first.session_id)
                    self.client.session = first.session_id
                    self.up.set()
                    delay = 0.1
                    log.info("lease session %x open (%.1fs leases)", first.session_id,
                             self.lease_time)
                    for ev in events:
                        self.invalidate([(k.parent, k.name) for k in ev.names], list(ev.inodes))
                        acks.put(ev.invalidate_id)
            except StopIteration:
                pass
            except grpc.RpcError as e:
                if not self._stop.is_set():
                    # once per outage; the retries while the master is down go quietly
                    log.log(logging.INFO if self.client.session else logging.DEBUG,
                            "lease session lost: %s (reopening it)",
                            e.code() if hasattr(e, "code") else e)
            except Exception:  # noqa: BLE001 - keep the mount going, without leases
                # closing: the channel was closed under the call (ValueError), not a fault
                if not (self._stop.is_set() or self.client._rpc.closed):
                    log.exception("lease session failed")
            finally:
                acks.put(None)
                self._call = None
                if call is not None:
                    call.cancel()
                sid, self.client.session = self.client.session, 0
                self.up.clear()
                if sid:
                    self._dropped.append(sid)
                    try:
                        self.drop_all()
                    except Exception:  # noqa: BLE001
                        log.exception("dropping cached entries failed")
            self._stop.wait(self.retry_idle if idle else delay)
            delay = min(delay * 2, RETRY_MAX)


class AccessReporter:
    """Batches file accesses (opens for reading) and closes of recorded opens into
    ReportAccess calls, for the master's LRU eviction: at most every ``interval``
    seconds, or sooner once ``batch`` are waiting, from its own thread.  ``note`` and
    ``closed`` are cheap enough for the FUSE loop (a deque append).  A report that
    fails drops its accesses (logged once); closes are kept and sent again, since the
    master keeps a file that it thinks open."""

    def __init__(self, client: MasterClient, interval: float = 1.0, batch: int = 1000,
                 max_pending: int = 100_000):
        self.client = client
        self.interval = interval
        self.batch = batch
        self._pending: collections.deque[int] = collections.deque(maxlen=max_pending)
        self._closed: collections.deque[tuple[int, int]] = collections.deque()  # (session, open id)
        # (block id, worker id) of copies readers found not intact: the master has the
        # workers check them (a few; more are dropped: the next read reports them again)
        self._bad: collections.deque[tuple[int, int]] = collections.deque(maxlen=1000)
        self._next_open = itertools.count(1)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failed = False
        self.sent = 0  # accesses reported
        self._thread = threading.Thread(target=self._run, name="access-reports", daemon=True)

    def start(self) -> None:
        """Start the reporting thread (once; later calls do nothing)."""
        if self._thread.ident is None:
            self._thread.start()

    def new_open_id(self) -> int:
        return next(self._next_open)

    def closed(self, session: int, open_id: int) -> None:
        """An open recorded with GetBlocks(session, open_id) is closed."""
        if session and open_id:
            self._closed.append((session, open_id))

    def bad_copy(self, block_id: int, worker_id: int) -> None:
        """A reader found the copy of ``block_id`` on ``worker_id`` not intact."""
        self._bad.append((block_id, worker_id))
        self._wake.set()

    def note(self, ino: int) -> None:
        self._pending.append(ino)
        if len(self._pending) >= self.batch:
            self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            self.flush()

    def flush(self) -> None:
        while (self._pending or self._closed or self._bad) and not self.client._rpc.closed:
            inos: dict[int, None] = {}  # each inode once per report, in access order
            while self._pending and len(inos) < self.batch:
                inos[self._pending.popleft()] = None
            session, closes = 0, []
            if self._closed:  # one session per report (a mount has one at a time)
                session = self._closed[0][0]
                while self._closed and self._closed[0][0] == session and len(closes) < self.batch:
                    closes.append(self._closed.popleft()[1])
            bad = [self._bad.popleft() for _ in range(len(self._bad))]
            try:
                self.client.report_access(list(inos), timeout=5.0, session=session,
                                          closed_opens=closes, bad_copies=bad)
                self.sent += len(inos)
                self._failed = False
            except CurvineError as e:
                self._closed.extendleft((session, oid) for oid in reversed(closes))
                self._bad.extendleft(reversed(bad))
                if not self._failed:
                    log.info("access report dropped (eviction order is less exact): %s", e)
                self._failed = True
                return