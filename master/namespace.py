"""The namespace state machine: plan a mutation, then apply its journal record.

``plan_*`` runs on the live path only: it validates a request against the current
state (including records planned earlier in the same batch), picks ids and
timestamps, and returns the journal record that says exactly what to do.  It never
writes.  ``apply`` performs a record; the live path and journal replay both call it,
so a replayed journal rebuilds exactly the state that was acknowledged.

Side effects outside LMDB (block deletes for workers, retry-cache entries, new
worker registrations) are collected in an ``Effects`` and handed on only after the
batch is durable.
"""

from __future__ import annotations

import collections
import stat
import time
from dataclasses import dataclass, field

from curvine.common.errors import CurvineError, ErrorKind, invalid
from curvine.common.ids import ROOT_INO, check_ino, check_name
from curvine.proto import common_pb2, journal_pb2, master_pb2

from .store import Store

FILE = common_pb2.FILE
DIRECTORY = common_pb2.DIRECTORY
MAX_BLOCKS_PER_FILE = 1 << 20
MAX_TTL_MS = 100 * 365 * 86400 * 1000  # SetPolicy: 100 years
MAX_REPLICAS = 8


@dataclass
class Effects:
    """What a batch did outside LMDB, acted on once the batch is durable."""

    freed: list[tuple[int, int, int]] = field(default_factory=list)  # (worker, block, bytes)
    completed: list[int] = field(default_factory=list)  # block ids now owned by files
    workers: list[common_pb2.WorkerInfo] = field(default_factory=list)
    # what mounts may have cached and must drop (master/leases.py): names removed or
    # moved, and inodes whose attributes changed
    names: list[tuple[int, bytes]] = field(default_factory=list)
    inodes: list[int] = field(default_factory=list)


class RetryCache:
    """request id -> inode id of the result, for mutations retried after a lost reply."""

    def __init__(self, capacity: int = 200_000):
        self.capacity = capacity
        self._entries: collections.OrderedDict[bytes, int] = collections.OrderedDict()

    def get(self, request_id: bytes) -> int | None:
        return self._entries.get(request_id) if request_id else None

    def put(self, request_id: bytes, ino: int) -> None:
        if not request_id:
            return
        self._entries[request_id] = ino
        if len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def __contains__(self, request_id: bytes) -> bool:
        return bool(request_id) and request_id in self._entries


def now_ns() -> int:
    return time.time_ns()


class Namespace:
    def __init__(self, store: Store, retry: RetryCache, block_size: int):
        self.store = store
        self.retry = retry
        self.block_size = block_size

    # ------------------------------------------------------------------ reads
    def inode(self, txn, ino: int, field_name: str = "ino") -> common_pb2.Inode:
        node = self.store.get_inode(txn, check_ino(ino, field_name))
        if node is None:
            raise CurvineError(ErrorKind.NOT_FOUND, f"{field_name}: no inode {ino}")
        return node

    def directory(self, txn, ino: int, field_name: str = "parent") -> common_pb2.Inode:
        node = self.inode(txn, ino, field_name)
        if node.type != DIRECTORY:
            raise CurvineError(ErrorKind.NOT_DIR, f"{field_name}: inode {ino} is not a directory")
        return node

    def lookup(self, txn, parent: int, name: bytes) -> common_pb2.Inode:
        node = self.lookup_or_none(txn, parent, name)
        if node is None:
            raise CurvineError(ErrorKind.NOT_FOUND, "no such file or directory")
        return node

    def lookup_or_none(self, txn, parent: int, name: bytes) -> common_pb2.Inode | None:
        """The inode named ``name`` in directory ``parent``; None if either is missing."""
        pnode = self.store.get_inode(txn, check_ino(parent, "parent"))
        if pnode is None:
            return None
        if pnode.type != DIRECTORY:
            raise CurvineError(ErrorKind.NOT_DIR, f"parent: inode {parent} is not a directory")
        name = check_name(name)
        ino = self.store.lookup(txn, parent, name)
        if ino is None:
            return None
        node = self.store.get_inode(txn, ino)
        if node is None:
            raise CurvineError(ErrorKind.IO, f"dangling entry {name!r} -> inode {ino}")
        return node

    # ------------------------------------------------------------------ plans
    def plan_root(self, txn):
        if self.store.get_inode(txn, ROOT_INO) is not None:
            return None, None
        t = now_ns()
        root = common_pb2.Inode(ino=ROOT_INO, type=DIRECTORY, mode=0o755, nlink=2,
                                state=common_pb2.COMPLETE, atime_ns=t, mtime_ns=t, ctime_ns=t)
        return journal_pb2.JournalEntry(mkdir=journal_pb2.MkdirRecord(parent=0, inode=root)), root

    def _new_inode(self, txn, parent: common_pb2.Inode, name: bytes, kind: int, mode: int,
                   uid: int, gid: int) -> common_pb2.Inode:
        if mode & ~0o7777:
            raise invalid("mode", f"{mode:#o} has bits outside 07777")
        t = now_ns()
        return common_pb2.Inode(
            ino=max(self.store.get_u64(txn, b"next_ino", ROOT_INO + 1), ROOT_INO + 1),
            type=kind, mode=mode, uid=uid, gid=gid, atime_ns=t, mtime_ns=t, ctime_ns=t,
            nlink=2 if kind == DIRECTORY else 1,
            state=common_pb2.COMPLETE if kind == DIRECTORY else common_pb2.WRITING,
            ttl_ms=parent.ttl_ms, parent=parent.ino, name=name, replicas=parent.replicas)

    def plan_mkdir(self, txn, req: master_pb2.MkdirRequest):
        parent = self.directory(txn, req.parent)
        name = check_name(req.name)
        if self.store.lookup(txn, parent.ino, name) is not None:
            raise CurvineError(ErrorKind.EXISTS, "file exists")
        node = self._new_inode(txn, parent, name, DIRECTORY, req.mode, req.uid, req.gid)
        rec = journal_pb2.MkdirRecord(request_id=req.request_id, parent=parent.ino, name=name,
                                      inode=node)
        return journal_pb2.JournalEntry(mkdir=rec), node

    def plan_create(self, txn, req: master_pb2.CreateRequest):
        parent = self.directory(txn, req.parent)
        name = check_name(req.name)
        existing = self.store.lookup(txn, parent.ino, name)
        if existing is not None:
            if req.exclusive:
                raise CurvineError(ErrorKind.EXISTS, "file exists")
            node = self.inode(txn, existing)
            if node.type == DIRECTORY:
                raise CurvineError(ErrorKind.IS_DIR, "is a directory")
            return None, node  # opening an existing file for write changes nothing yet
        node = self._new_inode(txn, parent, name, FILE, req.mode, req.uid, req.gid)
        rec = journal_pb2.CreateRecord(request_id=req.request_id, parent=parent.ino, name=name,
                                       inode=node, writer_session=req.session)
        return journal_pb2.JournalEntry(create=rec), node

    def plan_unlink(self, txn, req, rmdir: bool):
        parent = self.directory(txn, req.parent)
        name = check_name(req.name)
        ino = self.store.lookup(txn, parent.ino, name)
        if ino is None:
            raise CurvineError(ErrorKind.NOT_FOUND, "no such file or directory")
        node = self.inode(txn, ino)
        if rmdir:
            if node.type != DIRECTORY:
                raise CurvineError(ErrorKind.NOT_DIR, "not a directory")
            if not self.store.dir_is_empty(txn, ino):
                raise CurvineError(ErrorKind.NOT_EMPTY, "directory not empty")
        elif node.type == DIRECTORY:
            raise CurvineError(ErrorKind.IS_DIR, "is a directory")
        rec = journal_pb2.UnlinkRecord(request_id=req.request_id, parent=parent.ino, name=name,
                                       time_ns=now_ns())
        return journal_pb2.JournalEntry(unlink=rec), None

    def plan_rename(self, txn, req: master_pb2.RenameRequest):
        src_parent = self.directory(txn, req.parent, "parent")
        dst_parent = self.directory(txn, req.new_parent, "new_parent")
        name = check_name(req.name, "name")
        new_name = check_name(req.new_name, "new_name")
        ino = self.store.lookup(txn, src_parent.ino, name)
        if ino is None or (req.source_ino and ino != req.source_ino):
            raise CurvineError(ErrorKind.NOT_FOUND, "no such file or directory")
        node = self.inode(txn, ino)
        if (req.require_published and node.type == FILE and node.state == common_pb2.WRITING
                and node.ino not in req.writer_inos):
            raise CurvineError(ErrorKind.NOT_FOUND, "source not published by any writer yet")
        if node.type == DIRECTORY:
            # A directory may not move below itself.
            walk = dst_parent
            while True:
                if walk.ino == node.ino:
                    raise invalid("new_parent", "cannot move a directory into itself")
                if walk.ino == ROOT_INO or not walk.parent:
                    break
                walk = self.inode(txn, walk.parent)
        target = self.store.lookup(txn, dst_parent.ino, new_name)
        if target is not None:
            if req.no_replace:
                raise CurvineError(ErrorKind.EXISTS, "file exists")
            if target == ino:
                return None, None  # rename onto itself: nothing to do, like POSIX
            tnode = self.inode(txn, target)
            if node.type == DIRECTORY and tnode.type != DIRECTORY:
                raise CurvineError(ErrorKind.NOT_DIR, "not a directory")
            if node.type != DIRECTORY and tnode.type == DIRECTORY:
                raise CurvineError(ErrorKind.IS_DIR, "is a directory")
            if tnode.type == DIRECTORY and not self.store.dir_is_empty(txn, target):
                raise CurvineError(ErrorKind.NOT_EMPTY, "directory not empty")
        rec = journal_pb2.RenameRecord(request_id=req.request_id, parent=src_parent.ino, name=name,
                                       new_parent=dst_parent.ino, new_name=new_name,
                                       time_ns=now_ns())
        return journal_pb2.JournalEntry(rename=rec), None

    def plan_setattr(self, txn, req: master_pb2.SetAttrRequest):
        node = self.inode(txn, req.ino)
        rec = journal_pb2.SetAttrRecord(request_id=req.request_id, ino=node.ino, time_ns=now_ns())
        if req.HasField("mode"):
            if req.mode & ~0o7777:
                raise invalid("mode", f"{req.mode:#o} has bits outside 07777")
            rec.mode = req.mode
        for f in ("uid", "gid", "atime_ns", "mtime_ns"):
            if req.HasField(f):
                setattr(rec, f, getattr(req, f))
        if req.HasField("size"):
            if node.type == DIRECTORY:
                raise CurvineError(ErrorKind.IS_DIR, "is a directory")
            if req.size >= 1 << 62:
                raise invalid("size", "too large")
            rec.size = req.size
        return journal_pb2.JournalEntry(set_attr=rec), None

    def plan_complete(self, txn, req: master_pb2.CompleteFileRequest, block_ids_reserved: int,
                      allocated_here=lambda block_id: True):
        """``allocated_here(block_id)``: whether a block no file holds yet was allocated
        to this file (so a writer cannot publish another file's pending block)."""
        node = self.inode(txn, req.ino)
        if node.type != FILE:
            raise CurvineError(ErrorKind.IS_DIR, "ino: not a regular file")
        if req.if_unpublished and node.state == common_pb2.COMPLETE:
            return None, None  # another writer published a version already: keep it
        self._check_blocks(txn, req.blocks, req.size, node.ino, block_ids_reserved,
                           allocated_here)
        rec = journal_pb2.CompleteRecord(request_id=req.request_id, ino=node.ino,
                                         blocks=req.blocks, size=req.size,
                                         mtime_ns=req.mtime_ns or now_ns())
        return journal_pb2.JournalEntry(complete=rec), None

    def plan_put(self, txn, req: master_pb2.PutFileRequest, block_ids_reserved: int,
                 allocated_here=lambda block_id: True):
        """A new complete file in one record.  Value: (existed, inode); an existing name
        changes nothing (the caller frees the request's blocks)."""
        parent = self.directory(txn, req.parent)
        name = check_name(req.name)
        existing = self.store.lookup(txn, parent.ino, name)
        if existing is not None:
            return None, (True, self.inode(txn, existing))
        self._check_blocks(txn, req.blocks, req.size, 0, block_ids_reserved, allocated_here)
        node = self._new_inode(txn, parent, name, FILE, req.mode, req.uid, req.gid)
        node.state = common_pb2.COMPLETE
        node.size = req.size
        node.version = 1
        if req.mtime_ns:
            node.mtime_ns = req.mtime_ns
        rec = journal_pb2.PutRecord(request_id=req.request_id, parent=parent.ino, name=name,
                                    inode=node, blocks=req.blocks)
        return journal_pb2.JournalEntry(put=rec), (False, node)

    def _check_blocks(self, txn, blocks, size: int, ino: int, block_ids_reserved: int,
                      allocated_here) -> None:
        """The blocks of a version to publish for inode ``ino`` (0: a new file): each
        allocated to it and held by no other file, known workers, lengths summing to
        ``size``."""
        if len(blocks) > MAX_BLOCKS_PER_FILE:
            raise invalid("blocks", "too many blocks")
        total = 0
        seen = set()
        for i, b in enumerate(blocks):
            if b.length == 0 or b.length > self.block_size:
                raise invalid(f"blocks[{i}].length", f"{b.length} not in 1..{self.block_size}")
            total += b.length
            if b.block_id == 0:
                if b.worker_ids:
                    raise invalid(f"blocks[{i}].worker_ids", "a hole has no locations")
                continue
            if b.block_id in seen:
                raise invalid(f"blocks[{i}].block_id", "listed twice")
            seen.add(b.block_id)
            if b.block_id >= block_ids_reserved:
                raise invalid(f"blocks[{i}].block_id", f"{b.block_id} was never allocated")
            owner = self.store.block_owner(txn, b.block_id)
            if owner is not None and (not ino or owner != ino):
                raise invalid(f"blocks[{i}].block_id", f"{b.block_id} belongs to another file")
            if owner is None and not allocated_here(b.block_id):
                raise invalid(f"blocks[{i}].block_id",
                              f"{b.block_id} was not allocated to this file")
            if not b.worker_ids:
                raise invalid(f"blocks[{i}].worker_ids", "no locations")
            for wid in b.worker_ids:
                if not self.store.has_worker(txn, wid):
                    raise invalid(f"blocks[{i}].worker_ids", f"unknown worker {wid}")
        if total != size:
            raise invalid("size", f"{size} differs from the sum of block lengths {total}")

    # ------------------------------------------------------------------ apply
    def remember(self, entry: journal_pb2.JournalEntry) -> None:
        """Put a record's request id in the retry cache (live path and replay, including
        records older than LMDB's applied seq, so retries survive a restart)."""
        rec = getattr(entry, entry.WhichOneof("op"))
        request_id = getattr(rec, "request_id", b"")
        if request_id:
            fields = rec.DESCRIPTOR.fields_by_name
            ino = rec.inode.ino if "inode" in fields else rec.ino if "ino" in fields else 0
            self.retry.put(request_id, ino)

    def apply(self, txn, entry: journal_pb2.JournalEntry, fx: Effects) -> None:
        op = entry.WhichOneof("op")
        getattr(self, "_apply_" + op)(txn, getattr(entry, op), fx)

    def _apply_mkdir(self, txn, rec, fx: Effects) -> None:
        self._link_new(txn, rec, fx)

    def _apply_create(self, txn, rec, fx: Effects) -> None:
        self._link_new(txn, rec, fx)
        if rec.writer_session:  # until complete: who writes it (orphans, capacity.py)
            self.store.put_writer(txn, rec.inode.ino, rec.writer_session)

    def _link_new(self, txn, rec, fx: Effects) -> None:
        s = self.store
        node = rec.inode
        s.put_inode(txn, node)
        if rec.parent:  # the root has none
            s.put_dentry(txn, rec.parent, rec.name, node.ino)
            parent = s.get_inode(txn, rec.parent)
            parent.mtime_ns = parent.ctime_ns = node.ctime_ns
            if node.type == DIRECTORY:
                parent.nlink += 1
            s.put_inode(txn, parent)
        s.put_u64(txn, b"next_ino", max(s.get_u64(txn, b"next_ino", ROOT_INO + 1), node.ino + 1))
        s.put_u64(txn, b"inode_count", s.get_u64(txn, b"inode_count") + 1)

    def _remove(self, txn, node: common_pb2.Inode, fx: Effects) -> None:
        """Forget an inode whose entry is already gone, freeing its blocks."""
        s = self.store
        for b in s.get_blocks(txn, node.ino):
            if b.block_id:
                s.unindex_block(txn, b)
                fx.freed.extend((w, b.block_id, b.length) for w in b.worker_ids)
        s.put_blocks(txn, node.ino, [])
        s.del_writer(txn, node.ino)
        s.del_inode(txn, node.ino)
        s.put_u64(txn, b"inode_count", max(s.get_u64(txn, b"inode_count") - 1, 0))

    def _touch_parent(self, txn, parent_ino: int, t: int, nlink_delta: int = 0) -> None:
        parent = self.store.get_inode(txn, parent_ino)
        if parent is None:
            return
        parent.mtime_ns = parent.ctime_ns = t
        parent.nlink = max(parent.nlink + nlink_delta, 2)
        self.store.put_inode(txn, parent)

    def _apply_unlink(self, txn, rec, fx: Effects) -> None:
        s = self.store
        ino = s.lookup(txn, rec.parent, rec.name)
        if ino is None:
            return
        node = s.get_inode(txn, ino)
        s.del_dentry(txn, rec.parent, rec.name)
        fx.names.append((rec.parent, rec.name))
        fx.inodes.append(ino)
        self._touch_parent(txn, rec.parent, rec.time_ns,
                           -1 if node is not None and node.type == DIRECTORY else 0)
        if node is not None:
            self._remove(txn, node, fx)

    def _apply_rename(self, txn, rec, fx: Effects) -> None:
        s = self.store
        ino = s.lookup(txn, rec.parent, rec.name)
        if ino is None:
            return
        node = s.get_inode(txn, ino)
        is_dir = node.type == DIRECTORY
        target = s.lookup(txn, rec.new_parent, rec.new_name)
        fx.names += [(rec.parent, rec.name), (rec.new_parent, rec.new_name)]
        fx.inodes.append(ino)
        if target is not None and target != ino:
            fx.inodes.append(target)
            tnode = s.get_inode(txn, target)
            if tnode is not None:
                self._remove(txn, tnode, fx)
                if tnode.type == DIRECTORY:
                    self._touch_parent(txn, rec.new_parent, rec.time_ns, -1)
        s.del_dentry(txn, rec.parent, rec.name)
        s.put_dentry(txn, rec.new_parent, rec.new_name, ino)
        node.parent = rec.new_parent
        node.name = rec.new_name
        node.ctime_ns = rec.time_ns
        s.put_inode(txn, node)
        moved = is_dir and rec.parent != rec.new_parent
        self._touch_parent(txn, rec.parent, rec.time_ns, -1 if moved else 0)
        if rec.new_parent != rec.parent:
            self._touch_parent(txn, rec.new_parent, rec.time_ns, 1 if moved else 0)

    def _apply_set_attr(self, txn, rec, fx: Effects) -> None:
        s = self.store
        node = s.get_inode(txn, rec.ino)
        if node is None:
            return
        fx.inodes.append(rec.ino)
        if rec.HasField("mode"):
            node.mode = rec.mode
        if rec.HasField("uid"):
            node.uid = rec.uid
        if rec.HasField("gid"):
            node.gid = rec.gid
        if rec.HasField("atime_ns"):
            node.atime_ns = rec.atime_ns
        if rec.HasField("size") and rec.size != node.size:
            self._truncate(txn, node, rec.size, fx)
            node.size = rec.size
            node.version += 1
            node.state = common_pb2.COMPLETE
            node.mtime_ns = rec.time_ns
        if rec.HasField("mtime_ns"):
            node.mtime_ns = rec.mtime_ns
        node.ctime_ns = rec.time_ns
        s.put_inode(txn, node)

    def _truncate(self, txn, node: common_pb2.Inode, size: int, fx: Effects) -> None:
        s = self.store
        old = s.get_blocks(txn, node.ino)
        new: list[common_pb2.Block] = []
        pos = 0
        for b in old:
            if pos >= size:
                if b.block_id:
                    s.unindex_block(txn, b)
                    fx.freed.extend((w, b.block_id, b.length) for w in b.worker_ids)
                continue
            keep = common_pb2.Block()
            keep.CopyFrom(b)
            if pos + b.length > size:
                keep.length = size - pos
                keep.checksum = 0  # the stored block is longer; its checksum no longer applies
            new.append(keep)
            pos += keep.length
        while pos < size:  # extend with holes
            n = min(size - pos, self.block_size)
            new.append(common_pb2.Block(block_id=0, length=n))
            pos += n
        s.put_blocks(txn, node.ino, new)

    def _apply_complete(self, txn, rec, fx: Effects) -> None:
        s = self.store
        node = s.get_inode(txn, rec.ino)
        if node is None:
            for b in rec.blocks:
                if b.block_id and s.block_owner(txn, b.block_id) is None:
                    fx.freed.extend((w, b.block_id, b.length) for w in b.worker_ids)
            return
        new_ids = {b.block_id for b in rec.blocks if b.block_id}
        for b in s.get_blocks(txn, node.ino):
            if b.block_id:
                s.unindex_block(txn, b)
                if b.block_id not in new_ids:
                    fx.freed.extend((w, b.block_id, b.length) for w in b.worker_ids)
        for b in rec.blocks:
            if b.block_id:
                s.index_block(txn, b, node.ino)
        s.put_blocks(txn, node.ino, list(rec.blocks))
        fx.inodes.append(node.ino)
        node.size = rec.size
        node.state = common_pb2.COMPLETE
        node.version += 1
        node.mtime_ns = node.ctime_ns = rec.mtime_ns
        s.put_inode(txn, node)
        s.del_writer(txn, node.ino)
        fx.completed.extend(new_ids)

    def _apply_put(self, txn, rec, fx: Effects) -> None:
        s = self.store
        self._link_new(txn, rec, fx)
        for b in rec.blocks:
            if b.block_id:
                s.index_block(txn, b, rec.inode.ino)
        s.put_blocks(txn, rec.inode.ino, list(rec.blocks))
        fx.completed.extend(b.block_id for b in rec.blocks if b.block_id)

    # ------------------------------------------------------------------ capacity
    # (master/capacity.py decides what to remove; these plan and apply it)

    def plan_evict(self, txn, reason: int, inos, still_wanted):
        """Remove the files ``inos`` that still exist and for which
        ``still_wanted(node)`` holds (checked against the state of this batch).
        Value: (removed inos, {worker id: bytes freed there})."""
        removed: list[int] = []
        freed: dict[int, int] = {}
        for ino in inos:
            node = self.store.get_inode(txn, ino)
            if node is None or node.type != FILE or not still_wanted(node):
                continue
            for b in self.store.get_blocks(txn, ino):
                if b.block_id:
                    for w in b.worker_ids:
                        freed[w] = freed.get(w, 0) + b.length
            removed.append(ino)
        if not removed:
            return None, ([], {})
        rec = journal_pb2.EvictRecord(reason=reason, inos=removed, time_ns=now_ns())
        return journal_pb2.JournalEntry(evict=rec), (removed, freed)

    def _apply_evict(self, txn, rec, fx: Effects) -> None:
        s = self.store
        for ino in rec.inos:
            node = s.get_inode(txn, ino)
            if node is None:
                continue
            if s.lookup(txn, node.parent, node.name) == ino:
                s.del_dentry(txn, node.parent, node.name)
                fx.names.append((node.parent, node.name))
                self._touch_parent(txn, node.parent, rec.time_ns)
            fx.inodes.append(ino)
            self._remove(txn, node, fx)

    def plan_set_policy(self, txn, req: master_pb2.SetPolicyRequest):
        node = self.inode(txn, req.ino)
        if not req.HasField("ttl_ms") and not req.HasField("replicas"):
            raise invalid("ttl_ms", "give ttl_ms, replicas or both")
        rec = journal_pb2.SetPolicyRecord(request_id=req.request_id, ino=node.ino,
                                          time_ns=now_ns())
        if req.HasField("ttl_ms"):
            if req.ttl_ms > MAX_TTL_MS:
                raise invalid("ttl_ms", f"{req.ttl_ms} is more than {MAX_TTL_MS} (100 years)")
            rec.ttl_ms = req.ttl_ms
        if req.HasField("replicas"):
            if req.replicas > MAX_REPLICAS:
                raise invalid("replicas", f"{req.replicas} not in 0..{MAX_REPLICAS} "
                                          "(0 = the cluster default)")
            rec.replicas = req.replicas
        return journal_pb2.JournalEntry(set_policy=rec), None

    def _apply_set_policy(self, txn, rec, fx: Effects) -> None:
        node = self.store.get_inode(txn, rec.ino)
        if node is None:
            return
        if rec.HasField("ttl_ms"):
            node.ttl_ms = rec.ttl_ms
        if rec.HasField("replicas"):
            node.replicas = rec.replicas
        node.ctime_ns = rec.time_ns
        self.store.put_inode(txn, node)
        fx.inodes.append(node.ino)

    def _apply_reserve_block_ids(self, txn, rec, fx: Effects) -> None:
        s = self.store
        s.put_u64(txn, b"block_ids_reserved", max(rec.upto, s.get_u64(txn, b"block_ids_reserved")))

    def _apply_register_worker(self, txn, rec, fx: Effects) -> None:
        self.store.put_worker(txn, rec.worker)
        fx.workers.append(rec.worker)

    def _apply_drop_locations(self, txn, rec, fx: Effects) -> None:
        s = self.store
        for block_id in rec.block_ids:
            s.unindex_location(txn, rec.worker_id, block_id)
            ino = s.block_owner(txn, block_id)
            if ino is None:
                continue
            blocks = s.get_blocks(txn, ino)
            lost = False
            for b in blocks:
                if b.block_id == block_id and rec.worker_id in b.worker_ids:
                    b.worker_ids.remove(rec.worker_id)
                    lost = lost or not b.worker_ids
            s.put_blocks(txn, ino, blocks)
            node = s.get_inode(txn, ino)
            if lost and node is not None:
                # The last replica is gone: remove the name, so readers get a clean miss.
                s.del_dentry(txn, node.parent, node.name)
                fx.names.append((node.parent, node.name))
                fx.inodes.append(node.ino)
                self._touch_parent(txn, node.parent, rec.time_ns)
                self._remove(txn, node, fx)

    # ------------------------------------------------------------------ replicas
    def wanted_replicas(self, node: common_pb2.Inode, default: int) -> int:
        """Replicas a file wants: its own count (from its directory at create), else the
        cluster's."""
        return node.replicas or default

    def plan_add_locations(self, txn, worker_id: int, lengths: dict[int, int], default: int):
        """Admit replicas that worker ``worker_id`` holds (block id -> stored length) as
        locations of blocks whose file still has them, is short of replicas and that
        the stored copy covers.  Value: (added, unwanted) block ids; the caller deletes
        the unwanted copies (never more replicas than wanted)."""
        added, unwanted = [], []
        if not self.store.has_worker(txn, worker_id):
            return None, ([], list(lengths))
        for block_id, length in lengths.items():
            ino = self.store.block_owner(txn, block_id)
            node = self.store.get_inode(txn, ino) if ino is not None else None
            block = None
            if node is not None:
                block = next((b for b in self.store.get_blocks(txn, ino)
                              if b.block_id == block_id), None)
            if block is None:
                unwanted.append(block_id)
            elif worker_id in block.worker_ids:
                continue  # already a location: nothing to add, nothing to delete
            elif (len(block.worker_ids) >= self.wanted_replicas(node, default)
                  or length < block.length):
                unwanted.append(block_id)
            else:
                added.append(block_id)
        if not added:
            return None, (added, unwanted)
        rec = journal_pb2.AddLocationsRecord(worker_id=worker_id, block_ids=added)
        return journal_pb2.JournalEntry(add_locations=rec), (added, unwanted)

    def _apply_add_locations(self, txn, rec, fx: Effects) -> None:
        s = self.store
        for block_id in rec.block_ids:
            ino = s.block_owner(txn, block_id)
            if ino is None:
                continue
            blocks = s.get_blocks(txn, ino)
            for b in blocks:
                if b.block_id == block_id and rec.worker_id not in b.worker_ids:
                    b.worker_ids.append(rec.worker_id)
                    s.index_block(txn, common_pb2.Block(block_id=block_id,
                                                        worker_ids=[rec.worker_id]), ino)
            s.put_blocks(txn, ino, blocks)


def attr_mode(node: common_pb2.Inode) -> int:
    return (stat.S_IFDIR if node.type == DIRECTORY else stat.S_IFREG) | node.mode
