"""Typed client of the master's metadata service.

Every method is synchronous (call it from a thread when you are in an event loop)
and raises ``CurvineError``.  Each mutating call generates one request id and
reuses it for all of its retries, so a retry after a lost reply returns the first
result from the master's retry cache instead of e.g. EEXIST.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import new_request_id
from curvine.common.rpc import RpcClient
from curvine.proto import common_pb2, master_pb2, master_pb2_grpc

Inode = common_pb2.Inode
Block = common_pb2.Block
WorkerInfo = common_pb2.WorkerInfo

LISTDIR_PAGE = 1000


class MasterClient:
    """The master's namespace and block API, one method per RPC."""

    def __init__(self, address: str, timeout: float = 30.0, wait: float = 60.0):
        self.address = address
        self._rpc = RpcClient(address, master_pb2_grpc.MasterStub, timeout=timeout, wait=wait)

    def _call(self, method: str, request):
        # Reads are naturally idempotent; mutations carry a request id that the
        # master's retry cache recognises, so every call may be retried.
        return self._rpc.call(method, request, idempotent=True)

    # -- namespace -------------------------------------------------------------

    def lookup(self, parent: int, name: bytes) -> Inode:
        node = self.lookup_or_none(parent, name)
        if node is None:
            raise CurvineError(ErrorKind.NOT_FOUND, "no such file or directory")
        return node

    def lookup_or_none(self, parent: int, name: bytes) -> Inode | None:
        """The inode of ``name`` in ``parent``, or None when there is none (one cheap
        reply, not an error status: a miss is LMCache's hot path)."""
        reply = self._call("Lookup", master_pb2.LookupRequest(parent=parent, name=name,
                                                              miss_ok=True))
        return reply.inode if reply.HasField("inode") else None

    def getattr(self, ino: int) -> Inode:
        return self._call("GetAttr", master_pb2.GetAttrRequest(ino=ino)).inode

    def setattr(self, ino: int, **fields) -> Inode:
        """Change mode, uid, gid, size (truncate/extend), atime_ns, mtime_ns."""
        req = master_pb2.SetAttrRequest(request_id=new_request_id(), ino=ino, **fields)
        return self._call("SetAttr", req).inode

    def mkdir(self, parent: int, name: bytes, mode: int = 0o755, uid: int = 0, gid: int = 0) -> Inode:
        req = master_pb2.MkdirRequest(request_id=new_request_id(), parent=parent, name=name,
                                      mode=mode & 0o7777, uid=uid, gid=gid)
        return self._call("Mkdir", req).inode

    def create(self, parent: int, name: bytes, mode: int = 0o644, uid: int = 0, gid: int = 0,
               exclusive: bool = False) -> Inode:
        req = master_pb2.CreateRequest(request_id=new_request_id(), parent=parent, name=name,
                                       mode=mode & 0o7777, uid=uid, gid=gid, exclusive=exclusive)
        return self._call("Create", req).inode

    def unlink(self, parent: int, name: bytes) -> None:
        self._call("Unlink", master_pb2.UnlinkRequest(
            request_id=new_request_id(), parent=parent, name=name))

    def rmdir(self, parent: int, name: bytes) -> None:
        self._call("Rmdir", master_pb2.RmdirRequest(
            request_id=new_request_id(), parent=parent, name=name))

    def rename(self, parent: int, name: bytes, new_parent: int, new_name: bytes,
               no_replace: bool = False, source_ino: int = 0,
               require_published: bool = False) -> None:
        self._call("Rename", master_pb2.RenameRequest(
            request_id=new_request_id(), parent=parent, name=name, new_parent=new_parent,
            new_name=new_name, no_replace=no_replace, source_ino=source_ino,
            require_published=require_published))

    def listdir(self, ino: int, start_after: bytes = b"", limit: int = LISTDIR_PAGE
                ) -> tuple[list[master_pb2.DirEntry], bool]:
        """One page of entries in name order after ``start_after``; (entries, has_more)."""
        reply = self._call("ListDir", master_pb2.ListDirRequest(
            ino=ino, start_after=start_after, limit=limit))
        return list(reply.entries), reply.has_more

    def iterdir(self, ino: int, page: int = LISTDIR_PAGE) -> Iterable[master_pb2.DirEntry]:
        """All entries of a directory, page by page."""
        start = b""
        while True:
            entries, more = self.listdir(ino, start, page)
            yield from entries
            if not more or not entries:
                return
            start = entries[-1].name

    def statfs(self) -> master_pb2.StatFsReply:
        return self._call("StatFs", master_pb2.StatFsRequest())

    # -- data ----------------------------------------------------------------

    def get_blocks(self, ino: int) -> tuple[Inode, list[Block], dict[int, WorkerInfo]]:
        reply = self._call("GetBlocks", master_pb2.GetBlocksRequest(ino=ino))
        return reply.inode, list(reply.blocks), {w.worker_id: w for w in reply.workers}

    def add_block(self, ino: int, client_host_id: str, size_hint: int = 0,
                  exclude: Sequence[int] = ()) -> tuple[int, list[WorkerInfo]]:
        # No request id: a retried AddBlock only allocates another id, and an id
        # that is never completed is garbage-collected by the master.
        reply = self._call("AddBlock", master_pb2.AddBlockRequest(
            ino=ino, client_host_id=client_host_id, size_hint=size_hint,
            exclude_workers=list(exclude)))
        return reply.block_id, list(reply.workers)

    def complete_file(self, ino: int, blocks: Sequence[Block], size: int,
                      mtime_ns: int = 0, if_unpublished: bool = False) -> Inode:
        """Publish a version; with ``if_unpublished`` only if none was ever published."""
        req = master_pb2.CompleteFileRequest(request_id=new_request_id(), ino=ino,
                                             blocks=list(blocks), size=size, mtime_ns=mtime_ns,
                                             if_unpublished=if_unpublished)
        return self._call("CompleteFile", req).inode

    def close(self) -> None:
        self._rpc.close()
