"""The requests of master calls, built by one explicit method each (:class:`Requests`),
with the conversion of each reply: a :class:`Prepared` call that any carrier of the route
(client/master/route.py: the call port, the Calls stream, the unary RPC) sends as it is.

A mutation's request id is made here, once: every carrier and every retry sends the same
request, so one the master did apply is answered from its retry cache.  Requests name the
mount's lease session (``session``, 0 = none) where the master records leases or spares
this mount their revocation.

May import: ``curvine.common``, ``curvine.proto``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

from curvine.common.ids import new_request_id
from curvine.proto import common_pb2, master_pb2

Inode = common_pb2.Inode
Block = common_pb2.Block

LISTDIR_PAGE = 1000


def _field(msg, name: str):
    return getattr(msg, name) if msg.HasField(name) else None


class Prepared(NamedTuple):
    method: str  # the unary RPC
    op: str  # its field in master.Call (the call port and the Calls stream)
    request: Any
    convert: Callable  # reply -> result


def _inode_or_miss(reply: master_pb2.InodeReply) -> tuple[Inode | None, int]:
    """(the inode or None for a miss, the lease ms of the entry or of its absence)"""
    return (reply.inode if reply.HasField("inode") else None), reply.lease_ms


def _inode_lease(reply: master_pb2.InodeReply) -> tuple[Inode, int]:
    return reply.inode, reply.lease_ms


def _inode_lease_parent(reply: master_pb2.InodeReply) -> tuple[Inode, int, Inode | None]:
    return reply.inode, reply.lease_ms, _field(reply, "parent")


def _created_to_write(reply: master_pb2.InodeReply
                      ) -> tuple[Inode, int, Inode | None, tuple | None]:
    """``_inode_lease_parent`` and the first block (as ``add_block`` returns it), or
    None when the master placed none."""
    block = reply.block if reply.block.block_id else None
    return (*_inode_lease_parent(reply),
            (block.block_id, list(block.workers), block.block_token) if block else None)


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


def _reply(reply):
    return reply


def _inode_or_none(reply: master_pb2.InodeReply) -> Inode | None:
    return reply.inode if reply.HasField("inode") else None


class Requests:
    """One method per master call: its Prepared request (with ``session``, and one request
    id for a mutation) and how to convert its reply."""

    def __init__(self) -> None:
        self.session = 0  # the mount's lease session while one is up (0 = none)

    def lookup(self, parent: int, name: bytes, lease_miss: bool = False) -> Prepared:
        """``lease_miss``: a miss is leased too (a negative entry the session caches)."""
        return Prepared("Lookup", "lookup", master_pb2.LookupRequest(
            parent=parent, name=name, miss_ok=True, session=self.session,
            lease_miss=lease_miss and bool(self.session)), _inode_or_miss)

    def getattr(self, ino: int) -> Prepared:
        return Prepared("GetAttr", "getattr",
                        master_pb2.GetAttrRequest(ino=ino, session=self.session), _inode_lease)

    def mkdir(self, parent: int, name: bytes, mode: int = 0o755, uid: int = 0,
              gid: int = 0) -> Prepared:
        return Prepared("Mkdir", "mkdir", master_pb2.MkdirRequest(
            request_id=new_request_id(), parent=parent, name=name, mode=mode & 0o7777,
            uid=uid, gid=gid, session=self.session), _inode_lease_parent)

    def mkdir_listed(self, parent: int, name: bytes, mode: int = 0o755, uid: int = 0,
                     gid: int = 0) -> Prepared:
        """mkdir for a mount: also the lease on the new directory's (empty) listing."""
        prepared = self.mkdir(parent, name, mode, uid, gid)
        return prepared._replace(convert=_mkdir_reply)

    def create(self, parent: int, name: bytes, mode: int = 0o644, uid: int = 0,
               gid: int = 0, exclusive: bool = False) -> Prepared:
        return Prepared("Create", "create", master_pb2.CreateRequest(
            request_id=new_request_id(), parent=parent, name=name, mode=mode & 0o7777,
            uid=uid, gid=gid, exclusive=exclusive, session=self.session), _inode_lease_parent)

    def create_to_write(self, parent: int, name: bytes, mode: int, uid: int, gid: int,
                        exclusive: bool, host_id: str) -> Prepared:
        """create for a writer on ``host_id``: also its file's first block (the result's
        fourth item, or None), so that the writer needs no AddBlock for it."""
        prepared = self.create(parent, name, mode, uid, gid, exclusive)
        prepared.request.block_host_id = host_id
        return prepared._replace(convert=_created_to_write)

    def unlink(self, parent: int, name: bytes, open_inos: Sequence[int] = ()
               ) -> Prepared:
        """``open_inos``: inodes this mount has open; if the name was the last of one of
        them, the master keeps it (the result's held ino) until ``release_inode``."""
        return Prepared("Unlink", "unlink", master_pb2.UnlinkRequest(
            request_id=new_request_id(), parent=parent, name=name, session=self.session,
            open_inos=list(open_inos)), _parent_held)

    def rmdir(self, parent: int, name: bytes) -> Prepared:
        return Prepared("Rmdir", "rmdir", master_pb2.RmdirRequest(
            request_id=new_request_id(), parent=parent, name=name, session=self.session),
            _parent)

    def rename(self, parent: int, name: bytes, new_parent: int, new_name: bytes,
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

    def complete(self, ino: int, blocks: Sequence[Block], size: int, mtime_ns: int = 0,
                 if_unpublished: bool = False,
                 abandoned: Sequence[int] = (), open_id: int = 0) -> Prepared:
        return Prepared("CompleteFile", "complete", master_pb2.CompleteFileRequest(
            request_id=new_request_id(), ino=ino, blocks=list(blocks), size=size,
            mtime_ns=mtime_ns, if_unpublished=if_unpublished, session=self.session,
            abandoned_block_ids=list(abandoned), open_id=open_id if self.session else 0),
            _inode)

    def getattr_unleased(self, ino: int) -> Prepared:
        """GetAttr without the session: an answer the kernel keeps only for
        fuse.attr_timeout, so the master has no lease of this mount to revoke."""
        return Prepared("GetAttr", "getattr", master_pb2.GetAttrRequest(ino=ino), _inode)

    def add_block(self, ino: int, client_host_id: str, size_hint: int = 0,
                  exclude: Sequence[int] = ()) -> Prepared:
        # No request id: a retried AddBlock only allocates another id, and an id
        # that is never completed is garbage-collected by the master.
        return Prepared("AddBlock", "add_block", master_pb2.AddBlockRequest(
            ino=ino, client_host_id=client_host_id, size_hint=size_hint,
            exclude_workers=list(exclude)),
            lambda reply: (reply.block_id, list(reply.workers), reply.block_token))

    def setattr(self, ino: int, **fields) -> Prepared:
        return Prepared("SetAttr", "setattr", master_pb2.SetAttrRequest(
            request_id=new_request_id(), ino=ino, session=self.session, **fields), _inode)

    def listdir(self, ino: int, start_after: bytes = b"",
                limit: int = LISTDIR_PAGE) -> Prepared:
        return Prepared("ListDir", "listdir", master_pb2.ListDirRequest(
            ino=ino, start_after=start_after, limit=limit),
            lambda reply: (list(reply.entries), reply.has_more))

    def listdir_leased(self, ino: int, start_after: bytes = b"",
                       limit: int = LISTDIR_PAGE) -> Prepared:
        """A page leased to this session, if one is up: (entries, has_more, lease ms of
        the names and files' attributes, lease ms of the whole listing; 0s without a
        session).  A first page that is the whole directory may lease the listing."""
        return Prepared("ListDir", "listdir", master_pb2.ListDirRequest(
            ino=ino, start_after=start_after, limit=limit, session=self.session,
            lease_listing=not start_after),
            lambda reply: (list(reply.entries), reply.has_more, reply.lease_ms,
                           reply.listing_lease_ms))

    def listing(self, ino: int, limit: int) -> Prepared:
        """The names of directory ``ino`` if it has at most ``limit``, with a lease on
        that listing for this session: (names or None when there are more or the
        directory is busy, lease ms; 0 without a session or when the master denies it)."""
        return Prepared("ListDir", "listdir", master_pb2.ListDirRequest(
            ino=ino, limit=limit, session=self.session, names_only=True,
            lease_listing=True),
            lambda reply: (None if reply.has_more else [e.name for e in reply.entries],
                           reply.listing_lease_ms))

    def statfs(self) -> Prepared:
        return Prepared("StatFs", "statfs", master_pb2.StatFsRequest(), _reply)

    def get_blocks(self, ino: int, session: int = 0, open_id: int = 0,
                   write: bool = False) -> Prepared:
        return Prepared("GetBlocks", "get_blocks", master_pb2.GetBlocksRequest(
            ino=ino, session=session if open_id else 0, open_id=open_id if session else 0,
            write=write),
            lambda reply: (reply.inode, list(reply.blocks),
                           {w.worker_id: w for w in reply.workers}))

    # POSIX beyond files and directories (issue 15)

    def symlink(self, parent: int, name: bytes, target: bytes, uid: int = 0,
                gid: int = 0) -> Prepared:
        return Prepared("Symlink", "symlink", master_pb2.SymlinkRequest(
            request_id=new_request_id(), parent=parent, name=name, target=target, uid=uid,
            gid=gid, session=self.session), _inode_lease_parent)

    def make_node(self, parent: int, name: bytes, type: int, mode: int, rdev: int = 0,
                  uid: int = 0, gid: int = 0) -> Prepared:
        """A FIFO, socket or device (``type``: common_pb2.FIFO, ...)."""
        return Prepared("MakeNode", "make_node", master_pb2.MakeNodeRequest(
            request_id=new_request_id(), parent=parent, name=name, type=type,
            mode=mode & 0o7777, rdev=rdev, uid=uid, gid=gid, session=self.session),
            _inode_lease_parent)

    def link(self, ino: int, new_parent: int, new_name: bytes) -> Prepared:
        """A hard link: (the inode with its new nlink, lease ms, new parent)."""
        return Prepared("Link", "link", master_pb2.LinkRequest(
            request_id=new_request_id(), ino=ino, new_parent=new_parent, new_name=new_name,
            session=self.session), _inode_lease_parent)

    def release_inode(self, ino: int) -> Prepared:
        return Prepared("ReleaseInode", "release_inode", master_pb2.ReleaseInodeRequest(
            request_id=new_request_id(), ino=ino, session=self.session), lambda reply: None)

    def set_xattr(self, ino: int, name: bytes, value: bytes, flags: int = 0
                  ) -> Prepared:
        """``flags``: 1 create only (EXISTS if set), 2 replace only (NO_DATA if not)."""
        return Prepared("SetXattr", "set_xattr", master_pb2.SetXattrRequest(
            request_id=new_request_id(), ino=ino, name=name, value=value, flags=flags,
            session=self.session), _inode)

    def get_xattr(self, ino: int, name: bytes) -> Prepared:
        return Prepared("GetXattr", "get_xattr", master_pb2.GetXattrRequest(ino=ino, name=name),
                        lambda reply: reply.value)

    def list_xattr(self, ino: int) -> Prepared:
        return Prepared("ListXattr", "list_xattr", master_pb2.ListXattrRequest(ino=ino),
                        lambda reply: list(reply.names))

    def remove_xattr(self, ino: int, name: bytes) -> Prepared:
        return Prepared("RemoveXattr", "remove_xattr", master_pb2.RemoveXattrRequest(
            request_id=new_request_id(), ino=ino, name=name, session=self.session), _inode)

    # the path client's and the connector's calls (no lease session of their own)

    def lookup_unleased(self, parent: int, name: bytes) -> Prepared:
        """The inode of ``name`` or None (a miss is one cheap reply, not an error)."""
        return Prepared("Lookup", "lookup", master_pb2.LookupRequest(
            parent=parent, name=name, miss_ok=True), _inode_or_none)

    def lookup_many(self, parent: int, names: Sequence[bytes], with_blocks: bool = True
                    ) -> Prepared:
        return Prepared("LookupMany", "lookup_many", master_pb2.LookupManyRequest(
            parent=parent, names=list(names), with_blocks=with_blocks), _reply)

    def add_block_for_put(self, parent: int, name: bytes, client_host_id: str,
                          size_hint: int = 0, exclude: Sequence[int] = ()) -> Prepared:
        return Prepared("AddBlock", "add_block", master_pb2.AddBlockRequest(
            put_parent=parent, put_name=name, client_host_id=client_host_id,
            size_hint=size_hint, exclude_workers=list(exclude)), _reply)

    def put_file(self, parent: int, name: bytes, blocks: Sequence[Block], size: int,
                 mode: int = 0o644, uid: int = 0, gid: int = 0, mtime_ns: int = 0
                 ) -> Prepared:
        return Prepared("PutFile", "put_file", master_pb2.PutFileRequest(
            request_id=new_request_id(), parent=parent, name=name, mode=mode & 0o7777,
            uid=uid, gid=gid, blocks=list(blocks), size=size, mtime_ns=mtime_ns,
            session=self.session), lambda reply: (reply.inode, reply.existed))

    def add_blocks_for_put(self, parent: int, names: Sequence[bytes], sizes: Sequence[int],
                           client_host_id: str) -> Prepared:
        return Prepared("AddBlocksForPut", "add_blocks_for_put",
                        master_pb2.AddBlocksForPutRequest(
                            parent=parent, names=list(names), sizes=list(sizes),
                            client_host_id=client_host_id), _reply)

    def put_files(self, parent: int, files: Sequence[master_pb2.PutFileEntry],
                  abandoned: Sequence[Block] = ()) -> Prepared:
        return Prepared("PutFiles", "put_files", master_pb2.PutFilesRequest(
            request_id=new_request_id(), parent=parent, files=list(files),
            session=self.session, abandoned=list(abandoned)),
            lambda reply: list(reply.results))
