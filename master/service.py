"""gRPC servicer of the master: parse the request, call the master, convert the result."""

from __future__ import annotations

from curvine.common.ids import check_ino
from curvine.common.rpc import handler
from curvine.proto import common_pb2, master_pb2, master_pb2_grpc

from .master import Master

EMPTY = common_pb2.Empty()
EMPTY_INODE_REPLY = master_pb2.InodeReply()  # Lookup with miss_ok: no such name


class MasterServicer(master_pb2_grpc.MasterServicer):
    def __init__(self, master: Master):
        self.m = master

    @handler
    def Lookup(self, req, ctx):
        if req.miss_ok:
            node = self.m.lookup_or_none(req.parent, req.name)
            return master_pb2.InodeReply(inode=node) if node is not None else EMPTY_INODE_REPLY
        return master_pb2.InodeReply(inode=self.m.lookup(req.parent, req.name))

    @handler
    def GetAttr(self, req, ctx):
        return master_pb2.InodeReply(inode=self.m.getattr(req.ino))

    @handler
    def SetAttr(self, req, ctx):
        return self.m.setattr(req)

    @handler
    def Mkdir(self, req, ctx):
        check_ino(req.parent, "parent")
        return self.m.mkdir(req)

    @handler
    def Create(self, req, ctx):
        check_ino(req.parent, "parent")
        return self.m.create(req)

    @handler
    def Unlink(self, req, ctx):
        check_ino(req.parent, "parent")
        self.m.unlink(req, rmdir=False)
        return EMPTY

    @handler
    def Rmdir(self, req, ctx):
        check_ino(req.parent, "parent")
        self.m.unlink(req, rmdir=True)
        return EMPTY

    @handler
    def Rename(self, req, ctx):
        check_ino(req.parent, "parent")
        check_ino(req.new_parent, "new_parent")
        self.m.rename(req)
        return EMPTY

    @handler
    def ListDir(self, req, ctx):
        return self.m.listdir(check_ino(req.ino), req.start_after, req.limit)

    @handler
    def StatFs(self, req, ctx):
        return self.m.statfs()

    @handler
    def GetBlocks(self, req, ctx):
        return self.m.get_blocks(req.ino)

    @handler
    def AddBlock(self, req, ctx):
        return self.m.add_block(req)

    @handler
    def CompleteFile(self, req, ctx):
        return self.m.complete(req)

    @handler
    def RegisterWorker(self, req, ctx):
        return self.m.register_worker(req.worker)

    @handler
    def BlockReport(self, req, ctx):
        return self.m.block_report(req)

    @handler
    def WorkerHeartbeat(self, req, ctx):
        return self.m.heartbeat(req)
