"""The namespace state machine: plan a mutation, then apply its journal record.

``plan_*`` runs on the live path only: it validates a request against the current
state (including records planned earlier in the same batch), picks ids and
timestamps, and returns the journal record that says exactly what to do.  It never
writes.  ``apply`` performs a record; the live path and journal replay both call it,
so a replayed journal rebuilds exactly the state that was acknowledged.  Every kind
of record, its apply function and the plans that make it: the table ``APPLY`` at the
end of this module.

Side effects outside LMDB (block deletes for workers, retry-cache entries, new
worker registrations) are collected in an ``Effects`` and handed on only after the
batch is durable.
"""

from __future__ import annotations

import collections
import stat
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from curvine.common.errors import CurvineError, ErrorKind, invalid
from curvine.common.ids import (MAX_FILE_BLOCKS, ROOT_INO, check_file_size, check_ino,
                                check_name, put_request_id)
from curvine.proto import common_pb2, journal_pb2, master_pb2

from .store import Store, inline_size, stored_size

FILE = common_pb2.FILE
DIRECTORY = common_pb2.DIRECTORY
SYMLINK = common_pb2.SYMLINK
SPECIAL = frozenset((common_pb2.FIFO, common_pb2.SOCKET, common_pb2.CHAR_DEVICE,
                     common_pb2.BLOCK_DEVICE))  # MakeNode's types: metadata only
DEVICES = frozenset((common_pb2.CHAR_DEVICE, common_pb2.BLOCK_DEVICE))
MAX_LINKS = 65000  # names of one inode (ext4's limit)
SYMLINK_MAX = 4095  # bytes of a symlink's target (PATH_MAX less its NUL)
XATTR_PREFIX = b"user."  # the one namespace stored (the client refuses the others)
XATTR_NAME_MAX = 255
XATTR_VALUE_MAX = 65536
XATTR_TOTAL_MAX = 65536  # all names and values of one inode
XATTR_CREATE, XATTR_REPLACE = 1, 2  # SetXattrRequest.flags, as setxattr(2)
MAX_TTL_MS = 100 * 365 * 86400 * 1000  # SetPolicy: 100 years
MAX_REPLICAS = 8


@dataclass
class Effects:
    """What a batch did outside LMDB, acted on once the batch is durable."""

    freed: list[tuple[int, int, int]] = field(default_factory=list)  # (worker, block, bytes)
    # (ino, worker, block, bytes): dropped from a file (a new version, a truncate, its
    # removal); a mount that has the file open may still need them (OpenFiles.hold)
    replaced: list[tuple[int, int, int, int]] = field(default_factory=list)
    completed: list[int] = field(default_factory=list)  # block ids now owned by files
    workers: list[common_pb2.WorkerInfo] = field(default_factory=list)
    # what mounts may have cached and must drop (master/cluster/leases.py): names removed or
    # moved, and inodes whose attributes changed
    names: list[tuple[int, bytes]] = field(default_factory=list)
    inodes: list[int] = field(default_factory=list)
    # names made (create, mkdir, symlink, mknod, link, put): a mount may have their
    # absence leased (a negative entry)
    created: list[tuple[int, bytes]] = field(default_factory=list)


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

    def forget(self, request_id: bytes) -> None:
        self._entries.pop(request_id, None)

    def __contains__(self, request_id: bytes) -> bool:
        return bool(request_id) and request_id in self._entries


def _request_results(entry: journal_pb2.JournalEntry):
    """(request id, inode a retry is answered with) of each request in a record."""
    rec = getattr(entry, entry.WhichOneof("op"))
    # a record of many puts carries each one's request id
    for rec in (rec.puts if "puts" in rec.DESCRIPTOR.fields_by_name else (rec,)):
        request_id = getattr(rec, "request_id", b"")
        if request_id:
            fields = rec.DESCRIPTOR.fields_by_name
            # the result a retry gets: the new inode, the inode changed, or (unlink,
            # rename) the inode kept by the caller
            yield request_id, (rec.inode.ino if "inode" in fields else rec.ino if "ino" in fields
                               else rec.held if "held" in fields else 0)


def now_ns() -> int:
    return time.time_ns()


def not_a_file(node: common_pb2.Inode) -> CurvineError:
    """The error of a data operation (blocks, size) on an inode without data."""
    if node.type == DIRECTORY:
        return CurvineError(ErrorKind.IS_DIR, "ino: is a directory")
    return invalid("ino", f"inode {node.ino} is not a regular file")


class Namespace:
    def __init__(self, store: Store, retry: RetryCache, block_size: int,
                 inline_max: int = 0, inline_capacity: int = 0):
        self.store = store
        self.retry = retry
        self.block_size = block_size
        # small files' bytes kept in their block list (Block.data): at most inline_max
        # per file, inline_capacity in all (checked when planned, not at replay)
        self.inline_max = inline_max
        self.inline_capacity = inline_capacity

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
                   uid: int, gid: int, ino: int = 0) -> common_pb2.Inode:
        """``ino``: its number when the caller picks it (0: the next free one)."""
        if mode & ~0o7777:
            raise invalid("mode", f"{mode:#o} has bits outside 07777")
        t = now_ns()
        return common_pb2.Inode(
            ino=ino or max(self.store.get_u64(txn, b"next_ino", ROOT_INO + 1), ROOT_INO + 1),
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
        if not rmdir and self._keeps(txn, node, req):
            rec.hold_session, rec.held = req.session, node.ino
        return journal_pb2.JournalEntry(unlink=rec), rec.held

    def _keeps(self, txn, node: common_pb2.Inode, req) -> bool:
        """Whether removing a name of ``node`` keeps it, held by the caller's session: it
        is its last name and the caller's mount has it open (``req.open_inos``).  Without
        a session nothing could remove it once that mount is gone: not kept."""
        return (bool(req.session) and node.type != DIRECTORY and node.ino in req.open_inos
                and not self.store.links_of(txn, node.ino))

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
        if req.exchange and req.no_replace:
            raise invalid("no_replace", "not with exchange (both names must exist)")
        if node.type == DIRECTORY:
            self._check_not_below(txn, node, dst_parent, "new_parent")
        target = self.store.lookup(txn, dst_parent.ino, new_name)
        rec = journal_pb2.RenameRecord(request_id=req.request_id, parent=src_parent.ino, name=name,
                                       new_parent=dst_parent.ino, new_name=new_name,
                                       time_ns=now_ns(), exchange=req.exchange)
        if req.exchange:
            if target is None:
                raise CurvineError(ErrorKind.NOT_FOUND, "new_name: no such file or directory")
            if target == ino:
                return None, 0  # two names of one inode: nothing to swap
            tnode = self.inode(txn, target)
            if tnode.type == DIRECTORY:  # it moves to parent
                self._check_not_below(txn, tnode, src_parent, "parent")
            return journal_pb2.JournalEntry(rename=rec), 0
        if target is not None:
            if req.no_replace:
                raise CurvineError(ErrorKind.EXISTS, "file exists")
            if target == ino:
                return None, 0  # rename onto itself (or another name of it): POSIX does nothing
            tnode = self.inode(txn, target)
            if node.type == DIRECTORY and tnode.type != DIRECTORY:
                raise CurvineError(ErrorKind.NOT_DIR, "not a directory")
            if node.type != DIRECTORY and tnode.type == DIRECTORY:
                raise CurvineError(ErrorKind.IS_DIR, "is a directory")
            if tnode.type == DIRECTORY and not self.store.dir_is_empty(txn, target):
                raise CurvineError(ErrorKind.NOT_EMPTY, "directory not empty")
            if self._keeps(txn, tnode, req):
                rec.hold_session, rec.held = req.session, tnode.ino
        return journal_pb2.JournalEntry(rename=rec), rec.held

    def _check_not_below(self, txn, directory: common_pb2.Inode, dest: common_pb2.Inode,
                         field_name: str) -> None:
        """A directory may not move into itself or below itself (into ``dest``)."""
        walk = dest
        while True:
            if walk.ino == directory.ino:
                raise invalid(field_name, "cannot move a directory into itself")
            if walk.ino == ROOT_INO or not walk.parent:
                return
            walk = self.inode(txn, walk.parent)

    def plan_symlink(self, txn, req: master_pb2.SymlinkRequest):
        parent = self.directory(txn, req.parent)
        name = check_name(req.name)
        target = req.target
        if not target:
            raise invalid("target", "empty")
        if len(target) > SYMLINK_MAX:
            raise CurvineError(ErrorKind.NAME_TOO_LONG,
                               f"target: longer than {SYMLINK_MAX} bytes")
        if b"\0" in target:
            raise invalid("target", "contains NUL")
        if self.store.lookup(txn, parent.ino, name) is not None:
            raise CurvineError(ErrorKind.EXISTS, "file exists")
        node = self._new_inode(txn, parent, name, SYMLINK, 0o777, req.uid, req.gid)
        node.state = common_pb2.COMPLETE
        node.size = len(target)
        node.symlink_target = target
        rec = journal_pb2.MakeNodeRecord(request_id=req.request_id, parent=parent.ino,
                                         name=name, inode=node)
        return journal_pb2.JournalEntry(make_node=rec), node

    def plan_make_node(self, txn, req: master_pb2.MakeNodeRequest):
        parent = self.directory(txn, req.parent)
        name = check_name(req.name)
        if req.type not in SPECIAL:
            raise invalid("type", f"{req.type} is not FIFO, SOCKET, CHAR_DEVICE or "
                                  "BLOCK_DEVICE (regular files: Create)")
        if self.store.lookup(txn, parent.ino, name) is not None:
            raise CurvineError(ErrorKind.EXISTS, "file exists")
        node = self._new_inode(txn, parent, name, req.type, req.mode, req.uid, req.gid)
        node.state = common_pb2.COMPLETE
        if req.type in DEVICES:
            node.rdev = req.rdev
        rec = journal_pb2.MakeNodeRecord(request_id=req.request_id, parent=parent.ino,
                                         name=name, inode=node)
        return journal_pb2.JournalEntry(make_node=rec), node

    def plan_link(self, txn, req: master_pb2.LinkRequest):
        node = self.inode(txn, req.ino)
        if node.type == DIRECTORY:
            raise CurvineError(ErrorKind.NOT_PERMITTED, "ino: a hard link to a directory")
        if node.nlink == 0:  # unlinked, kept open: linkat(2) refuses it too
            raise CurvineError(ErrorKind.NOT_FOUND, f"ino: inode {node.ino} has no name left")
        parent = self.directory(txn, req.new_parent, "new_parent")
        name = check_name(req.new_name, "new_name")
        if self.store.lookup(txn, parent.ino, name) is not None:
            raise CurvineError(ErrorKind.EXISTS, "file exists")
        if node.nlink >= MAX_LINKS:
            raise CurvineError(ErrorKind.TOO_MANY_LINKS, f"ino: {MAX_LINKS} names already")
        rec = journal_pb2.LinkRecord(request_id=req.request_id, ino=node.ino,
                                     new_parent=parent.ino, new_name=name, time_ns=now_ns())
        return journal_pb2.JournalEntry(link=rec), None

    def plan_release(self, txn, ino: int):
        """The holder's last descriptor of ``ino`` closed (ReleaseInode): remove it if it
        is unlinked and held (by any session: a mount that reconnected has a new one).
        Value: whether it was removed."""
        node = self.store.get_inode(txn, check_ino(ino))
        if node is None or node.nlink != 0 or self.store.held_by(txn, node.ino) is None:
            return None, False
        rec = journal_pb2.EvictRecord(reason=journal_pb2.EVICT_UNLINKED, inos=[node.ino],
                                      time_ns=now_ns())
        return journal_pb2.JournalEntry(evict=rec), True

    # -- extended attributes
    def _xattr_name(self, name: bytes) -> bytes:
        if not name:
            raise invalid("name", "empty")
        if len(name) > XATTR_NAME_MAX:
            raise CurvineError(ErrorKind.NAME_TOO_LONG,
                               f"name: longer than {XATTR_NAME_MAX} bytes")
        if not name.startswith(XATTR_PREFIX):
            raise CurvineError(ErrorKind.NOT_SUPPORTED, "name: only user.* attributes")
        if name == XATTR_PREFIX or b"\0" in name:
            raise invalid("name", "nothing after 'user.', or a NUL")
        return bytes(name)

    def get_xattr(self, txn, ino: int, name: bytes) -> bytes:
        node = self.inode(txn, ino)
        value = self.store.get_xattr(txn, node.ino, self._xattr_name(name))
        if value is None:
            raise CurvineError(ErrorKind.NO_DATA, "no such attribute")
        return value

    def list_xattr(self, txn, ino: int) -> list[bytes]:
        node = self.inode(txn, ino)
        return [name for name, _ in self.store.xattrs(txn, node.ino)]

    def plan_set_xattr(self, txn, req: master_pb2.SetXattrRequest):
        node = self.inode(txn, req.ino)
        name = self._xattr_name(req.name)
        if req.flags & ~(XATTR_CREATE | XATTR_REPLACE) or req.flags == (
                XATTR_CREATE | XATTR_REPLACE):
            raise invalid("flags", f"{req.flags}: 0, 1 (create) or 2 (replace)")
        if len(req.value) > XATTR_VALUE_MAX:
            raise CurvineError(ErrorKind.TOO_BIG, f"value: more than {XATTR_VALUE_MAX} bytes")
        others = 0
        exists = False
        for n, v in self.store.xattrs(txn, node.ino):
            if n == name:
                exists = True
            else:
                others += len(n) + len(v)
        if exists and req.flags == XATTR_CREATE:
            raise CurvineError(ErrorKind.EXISTS, "attribute exists")
        if not exists and req.flags == XATTR_REPLACE:
            raise CurvineError(ErrorKind.NO_DATA, "no such attribute")
        if others + len(name) + len(req.value) > XATTR_TOTAL_MAX:
            raise CurvineError(ErrorKind.TOO_BIG, f"the inode's attributes would take more "
                                                  f"than {XATTR_TOTAL_MAX} bytes")
        rec = journal_pb2.XattrRecord(request_id=req.request_id, ino=node.ino, name=name,
                                      value=req.value, time_ns=now_ns())
        return journal_pb2.JournalEntry(xattr=rec), None

    def plan_remove_xattr(self, txn, req: master_pb2.RemoveXattrRequest):
        node = self.inode(txn, req.ino)
        name = self._xattr_name(req.name)
        if self.store.get_xattr(txn, node.ino, name) is None:
            raise CurvineError(ErrorKind.NO_DATA, "no such attribute")
        rec = journal_pb2.XattrRecord(request_id=req.request_id, ino=node.ino, name=name,
                                      remove=True, time_ns=now_ns())
        return journal_pb2.JournalEntry(xattr=rec), None

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
            if node.type != FILE:
                raise not_a_file(node)
            check_file_size(req.size, self.block_size)
            rec.size = req.size
        return journal_pb2.JournalEntry(set_attr=rec), None

    def plan_complete(self, txn, req: master_pb2.CompleteFileRequest, block_ids_reserved: int,
                      allocated_here=lambda block_id: True, freed=lambda block_id: False):
        """``allocated_here(block_id)``: whether a block no file holds yet was allocated
        to this file (so a writer cannot publish another file's pending block);
        ``freed(block_id)``: whether such a block was freed (the writer is stale)."""
        node = self.inode(txn, req.ino)
        if node.type != FILE:
            raise not_a_file(node)
        if req.if_unpublished and node.state == common_pb2.COMPLETE:
            return None, None  # another writer published a version already: keep it
        self._check_blocks(txn, req.blocks, req.size, node.ino, block_ids_reserved,
                           allocated_here, freed)
        self._check_inline_room(txn, req.blocks, node.ino)
        entry = journal_pb2.JournalEntry()  # filled in place: the blocks are copied once
        rec = entry.complete
        rec.request_id, rec.ino, rec.size = req.request_id, node.ino, req.size
        rec.mtime_ns = req.mtime_ns or now_ns()
        rec.blocks.extend(req.blocks)
        return entry, None

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
        self._check_inline_room(txn, req.blocks, 0)
        node = self._new_inode(txn, parent, name, FILE, req.mode, req.uid, req.gid)
        node.state = common_pb2.COMPLETE
        node.size = req.size
        node.version = 1
        if req.mtime_ns:
            node.mtime_ns = req.mtime_ns
        rec = journal_pb2.PutRecord(request_id=req.request_id, parent=parent.ino, name=name,
                                    inode=node, blocks=req.blocks)
        return journal_pb2.JournalEntry(put=rec), (False, node)

    def plan_put_many(self, txn, req: master_pb2.PutFilesRequest, block_ids_reserved: int,
                      allocated_here=lambda block_id: True, missing=frozenset()):
        """Many new complete files of one directory in ONE record (PutManyRecord), each
        file checked on its own as plan_put checks one: a wrong one is left out, the
        others stored.  ``missing``: indexes of files with a block not granted to a put
        (the caller checked the tokens).  Value: per file (PutStatus, the inode or None,
        why); an entry without files when nothing is stored."""
        parent = self.directory(txn, req.parent)
        entry = journal_pb2.JournalEntry()
        puts = entry.put_many.puts
        results: list[tuple[int, common_pb2.Inode | None, str]] = []
        next_ino = max(self.store.get_u64(txn, b"next_ino", ROOT_INO + 1), ROOT_INO + 1)
        named: set[bytes] = set()  # names stored by this record
        used: set[int] = set()  # block ids stored by this record
        for i, f in enumerate(req.files):
            rid = put_request_id(req.request_id, i)
            hit = self.retry.get(rid)
            if hit is not None:  # this file was stored by an earlier attempt of the call
                results.append((master_pb2.PUT_STORED, self.store.get_inode(txn, hit), ""))
                continue
            try:
                name = check_name(f.name, f"files[{i}].name")
                existing = self.store.lookup(txn, parent.ino, name)
                if existing is not None or name in named:
                    node = self.store.get_inode(txn, existing) if existing is not None else None
                    results.append((master_pb2.PUT_EXISTS, node, ""))
                    continue
                if i in missing:
                    results.append((master_pb2.PUT_BLOCKS_MISSING, None, "a block is not "
                                    "granted to a put (freed after the put TTL, or no token)"))
                    continue
                ids = [b.block_id for b in f.blocks]
                if not all(ids) or used.intersection(ids):
                    raise invalid(f"files[{i}].blocks", "a block on no worker (inline, hole), "
                                  "or one another file of the call stores")
                self._check_blocks(txn, f.blocks, f.size, 0, block_ids_reserved, allocated_here)
                node = self._new_inode(txn, parent, name, FILE, f.mode, f.uid, f.gid, next_ino)
            except CurvineError as e:
                results.append((master_pb2.PUT_INVALID, None, e.message))
                continue
            next_ino += 1
            node.state = common_pb2.COMPLETE
            node.size = f.size
            node.version = 1
            if f.mtime_ns:
                node.mtime_ns = f.mtime_ns
            named.add(name)
            used.update(ids)
            puts.add(request_id=rid, parent=parent.ino, name=name, inode=node, blocks=f.blocks)
            results.append((master_pb2.PUT_STORED, node, ""))
        return (entry if puts else None), results

    def _check_blocks(self, txn, blocks, size: int, ino: int, block_ids_reserved: int,
                      allocated_here, freed=lambda block_id: False) -> None:
        """The blocks of a version to publish for inode ``ino`` (0: a new file): each
        allocated to it and held by no other file, known workers, lengths summing to
        ``size``."""
        if len(blocks) > MAX_FILE_BLOCKS:
            raise invalid("blocks", "too many blocks")
        total = inline = 0
        seen = set()
        for i, b in enumerate(blocks):
            if b.length == 0 or b.length > self.block_size:
                raise invalid(f"blocks[{i}].length", f"{b.length} not in 1..{self.block_size}")
            total += b.length
            if b.block_id == 0:
                if b.worker_ids:
                    raise invalid(f"blocks[{i}].worker_ids", "a hole has no locations")
                if b.HasField("data"):
                    n = len(b.data)
                    if n != b.length:
                        raise invalid(f"blocks[{i}].data", f"{n} bytes inline, length {b.length}")
                    inline += n
                continue
            if b.HasField("data"):
                raise invalid(f"blocks[{i}].data", "a block on workers has no inline data")
            if b.block_id in seen:
                raise invalid(f"blocks[{i}].block_id", "listed twice")
            seen.add(b.block_id)
            if b.block_id >= block_ids_reserved:
                raise invalid(f"blocks[{i}].block_id", f"{b.block_id} was never allocated")
            owner = self.store.block_owner(txn, b.block_id)
            if owner is not None and (not ino or owner != ino):
                raise invalid(f"blocks[{i}].block_id", f"{b.block_id} belongs to another file")
            if owner is None and not allocated_here(b.block_id):
                if freed(b.block_id):
                    raise CurvineError(ErrorKind.STALE, f"blocks[{i}].block_id: {b.block_id} "
                                       "is in no file and not allocated to this one (freed: "
                                       "the file was replaced, truncated or removed while "
                                       "this version was written)")
                raise invalid(f"blocks[{i}].block_id",
                              f"{b.block_id} was not allocated to this file")
            if not b.worker_ids:
                raise invalid(f"blocks[{i}].worker_ids", "no locations")
            for wid in b.worker_ids:
                if not self.store.has_worker(txn, wid):
                    raise invalid(f"blocks[{i}].worker_ids", f"unknown worker {wid}")
        if total != size:
            raise invalid("size", f"{size} differs from the sum of block lengths {total}")
        if inline > self.inline_max:
            raise invalid("blocks", f"{inline} bytes inline, more than master.inline_max "
                                    f"({self.inline_max})")

    def _check_inline_room(self, txn, blocks, ino: int) -> None:
        """A version with inline data fits in master.inline_capacity (NO_SPACE: the
        writer stores it on workers instead)."""
        new = inline_size(blocks)
        if not new:
            return
        old = inline_size(self.store.get_blocks(txn, ino)) if ino else 0
        if self.store.inline_bytes(txn) + new - old > self.inline_capacity:
            raise CurvineError(ErrorKind.NO_SPACE, "inline data: master.inline_capacity "
                                                   f"({self.inline_capacity}) is full")

    # ------------------------------------------------------------------ apply
    def remember(self, entry: journal_pb2.JournalEntry) -> None:
        """Put a record's request id in the retry cache (live path and replay, including
        records older than LMDB's applied seq, so retries survive a restart)."""
        for request_id, ino in _request_results(entry):
            self.retry.put(request_id, ino)

    def forget(self, entry: journal_pb2.JournalEntry) -> None:
        """Take back ``remember(entry)``: its batch did not become durable here (a
        member that lost the lead keeps this namespace; were the record durable after
        all, replaying it from the journal remembers it again before a retry can be
        answered by a leader)."""
        for request_id, _ in _request_results(entry):
            self.retry.forget(request_id)

    def apply(self, txn, entry: journal_pb2.JournalEntry, fx: Effects) -> None:
        """Perform one record, on the live path and at replay alike: the function
        ``APPLY`` (after this class) names for its kind."""
        op = entry.WhichOneof("op")
        APPLY[op](self, txn, getattr(entry, op), fx)

    def _apply_mkdir(self, txn, rec, fx: Effects) -> None:
        self._link_new(txn, rec, fx)

    def _apply_make_node(self, txn, rec, fx: Effects) -> None:
        self._link_new(txn, rec, fx)

    def _apply_create(self, txn, rec, fx: Effects) -> None:
        self._link_new(txn, rec, fx)
        if rec.writer_session:  # until complete: who writes it (orphans, capacity.py)
            self.store.put_writer(txn, rec.inode.ino, rec.writer_session)

    def _link_new(self, txn, rec, fx: Effects) -> None:
        self._link_all_new(txn, [rec], fx)

    def _link_all_new(self, txn, recs, fx: Effects) -> None:
        """New inodes under their names, all in one directory (or the root alone): each
        inode and entry, then the directory's times and the counters once, as they
        would be after linking one after another."""
        s = self.store
        for rec in recs:
            s.put_inode(txn, rec.inode)
            if rec.parent:  # the root has none
                s.put_dentry(txn, rec.parent, rec.name, rec.inode.ino)
                fx.created.append((rec.parent, rec.name))
        last = recs[-1]
        if last.parent:
            parent = s.get_inode(txn, last.parent)
            parent.mtime_ns = parent.ctime_ns = last.inode.ctime_ns
            parent.nlink += sum(rec.inode.type == DIRECTORY for rec in recs)
            s.put_inode(txn, parent)
        top = max(rec.inode.ino for rec in recs)
        s.put_u64(txn, b"next_ino", max(s.get_u64(txn, b"next_ino", ROOT_INO + 1), top + 1))
        s.put_u64(txn, b"inode_count", s.get_u64(txn, b"inode_count") + len(recs))

    def _names(self, txn, node: common_pb2.Inode) -> list[tuple[int, bytes]]:
        """Every (parent, name) that names ``node`` now: its first name, if still
        linked, and its hard links."""
        s = self.store
        names = [(node.parent, node.name)] + s.links_of(txn, node.ino)
        return [(p, n) for p, n in names if p and s.lookup(txn, p, n) == node.ino]

    def _remove(self, txn, node: common_pb2.Inode, fx: Effects, t: int,
                keep_for_opens: bool = True) -> None:
        """Forget an inode: every name it still has (none when its last name was just
        removed; all of them when it is evicted or lost), its blocks (freed; unless
        ``keep_for_opens`` is False, kept while a mount has it open: an open that read
        the blocks just before this record was committed, OpenFiles.settle), its hard
        link, xattr, writer and held rows."""
        s = self.store
        for parent, name in self._names(txn, node):
            s.del_dentry(txn, parent, name)
            fx.names.append((parent, name))
            self._touch_parent(txn, parent, t, -1 if node.type == DIRECTORY else 0)
        for parent, name in s.links_of(txn, node.ino):
            s.del_link(txn, node.ino, parent, name)
        for name, _ in s.xattrs(txn, node.ino):
            s.del_xattr(txn, node.ino, name)
        old = s.get_blocks(txn, node.ino)
        for b in old:
            if b.block_id:
                s.unindex_block(txn, b)
                if keep_for_opens:
                    fx.replaced.extend((node.ino, w, b.block_id, b.length)
                                       for w in b.worker_ids)
                else:
                    fx.freed.extend((w, b.block_id, b.length) for w in b.worker_ids)
        s.put_blocks(txn, node.ino, [], old)
        s.del_writer(txn, node.ino)
        s.del_held(txn, node.ino)
        s.del_inode(txn, node.ino)
        s.put_u64(txn, b"inode_count", max(s.get_u64(txn, b"inode_count") - 1, 0))

    def _unname(self, txn, node: common_pb2.Inode, parent: int, name: bytes, t: int,
                hold_session: int, fx: Effects) -> None:
        """``(parent, name)`` no longer names ``node`` (its dentry is gone or names
        another inode now): one name fewer.  Its last name gone, the inode is removed,
        or kept with nlink 0 for ``hold_session`` (UnlinkRecord.hold_session)."""
        s = self.store
        if node.type == DIRECTORY:
            self._remove(txn, node, fx, t)
            return
        if s.has_link(txn, node.ino, parent, name):  # not its first name
            s.del_link(txn, node.ino, parent, name)
        else:
            others = s.links_of(txn, node.ino)
            if others:  # another name becomes the first one
                s.del_link(txn, node.ino, *others[0])
                node.parent, node.name = others[0]
            elif hold_session:
                node.parent, node.name = 0, b""
                s.put_held(txn, node.ino, hold_session)
            else:
                self._remove(txn, node, fx, t)
                return
        node.nlink = max(node.nlink - 1, 1) if node.parent else 0
        node.ctime_ns = t
        s.put_inode(txn, node)

    def _rename_name(self, txn, node: common_pb2.Inode, old: tuple[int, bytes],
                     new: tuple[int, bytes]) -> None:
        """Name ``old`` of ``node`` is ``new`` now (the caller moved the dentry)."""
        if self.store.has_link(txn, node.ino, *old):  # not its first name
            self.store.del_link(txn, node.ino, *old)
            self.store.put_link(txn, node.ino, *new)
        else:
            node.parent, node.name = new

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
            self._unname(txn, node, rec.parent, rec.name, rec.time_ns, rec.hold_session, fx)

    def _apply_rename(self, txn, rec, fx: Effects) -> None:
        if rec.exchange:
            self._apply_exchange(txn, rec, fx)
            return
        s = self.store
        ino = s.lookup(txn, rec.parent, rec.name)
        if ino is None:
            return
        node = s.get_inode(txn, ino)
        target = s.lookup(txn, rec.new_parent, rec.new_name)
        if target == ino:
            return  # two names of one inode (never planned: POSIX does nothing)
        is_dir = node.type == DIRECTORY
        fx.names += [(rec.parent, rec.name), (rec.new_parent, rec.new_name)]
        fx.inodes.append(ino)
        s.del_dentry(txn, rec.parent, rec.name)
        s.put_dentry(txn, rec.new_parent, rec.new_name, ino)
        self._rename_name(txn, node, (rec.parent, rec.name), (rec.new_parent, rec.new_name))
        node.ctime_ns = rec.time_ns
        s.put_inode(txn, node)
        if target is not None:  # replaced: that inode lost this name
            fx.inodes.append(target)
            tnode = s.get_inode(txn, target)
            if tnode is not None:
                if tnode.type == DIRECTORY:
                    self._touch_parent(txn, rec.new_parent, rec.time_ns, -1)
                self._unname(txn, tnode, rec.new_parent, rec.new_name, rec.time_ns,
                             rec.hold_session, fx)
        moved = is_dir and rec.parent != rec.new_parent
        self._touch_parent(txn, rec.parent, rec.time_ns, -1 if moved else 0)
        if rec.new_parent != rec.parent:
            self._touch_parent(txn, rec.new_parent, rec.time_ns, 1 if moved else 0)

    def _apply_exchange(self, txn, rec, fx: Effects) -> None:
        """RENAME_EXCHANGE: the two names swap their inodes."""
        s = self.store
        old, new = (rec.parent, rec.name), (rec.new_parent, rec.new_name)
        a, b = s.lookup(txn, *old), s.lookup(txn, *new)
        if a is None or b is None or a == b:
            return
        na, nb = s.get_inode(txn, a), s.get_inode(txn, b)
        s.put_dentry(txn, *old, b)
        s.put_dentry(txn, *new, a)
        for node, was, now in ((na, old, new), (nb, new, old)):
            self._rename_name(txn, node, was, now)
            node.ctime_ns = rec.time_ns
            s.put_inode(txn, node)
        fx.names += [old, new]
        fx.inodes += [a, b]
        # a directory moving to the other parent takes its ".." link along
        delta = (nb.type == DIRECTORY) - (na.type == DIRECTORY)
        if rec.parent == rec.new_parent:
            delta = 0
        self._touch_parent(txn, rec.parent, rec.time_ns, delta)
        if rec.new_parent != rec.parent:
            self._touch_parent(txn, rec.new_parent, rec.time_ns, -delta)

    def _apply_link(self, txn, rec, fx: Effects) -> None:
        s = self.store
        node = s.get_inode(txn, rec.ino)
        if node is None or s.lookup(txn, rec.new_parent, rec.new_name) is not None:
            return
        s.put_dentry(txn, rec.new_parent, rec.new_name, node.ino)
        fx.created.append((rec.new_parent, rec.new_name))
        if node.parent:
            s.put_link(txn, node.ino, rec.new_parent, rec.new_name)
        else:  # no first name (never planned: a held inode cannot be linked)
            node.parent, node.name = rec.new_parent, rec.new_name
        node.nlink += 1
        node.ctime_ns = rec.time_ns
        s.put_inode(txn, node)
        self._touch_parent(txn, rec.new_parent, rec.time_ns)
        fx.inodes.append(node.ino)

    def _apply_xattr(self, txn, rec, fx: Effects) -> None:
        s = self.store
        node = s.get_inode(txn, rec.ino)
        if node is None:
            return
        if rec.remove:
            s.del_xattr(txn, node.ino, rec.name)
        else:
            s.put_xattr(txn, node.ino, rec.name, rec.value)
        node.ctime_ns = rec.time_ns
        s.put_inode(txn, node)
        fx.inodes.append(node.ino)

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
                    fx.replaced.extend((node.ino, w, b.block_id, b.length)
                                       for w in b.worker_ids)
                continue
            keep = common_pb2.Block()
            keep.CopyFrom(b)
            if pos + b.length > size:
                keep.length = size - pos
                keep.checksum = 0  # the stored block is longer; its checksum no longer applies
                if keep.HasField("data"):  # (presence without copying the bytes)
                    keep.data = keep.data[:keep.length]
            new.append(keep)
            pos += keep.length
        while pos < size:  # extend with holes
            n = min(size - pos, self.block_size)
            new.append(common_pb2.Block(block_id=0, length=n))
            pos += n
        s.put_blocks(txn, node.ino, new, old)
        node.stored = stored_size(new)

    def _apply_complete(self, txn, rec, fx: Effects) -> None:
        s = self.store
        node = s.get_inode(txn, rec.ino)
        if node is None:
            for b in rec.blocks:
                if b.block_id and s.block_owner(txn, b.block_id) is None:
                    fx.freed.extend((w, b.block_id, b.length) for w in b.worker_ids)
            return
        new_ids = {b.block_id for b in rec.blocks if b.block_id}
        old = s.get_blocks(txn, node.ino)
        for b in old:
            if b.block_id:
                s.unindex_block(txn, b)
                if b.block_id not in new_ids:
                    fx.replaced.extend((node.ino, w, b.block_id, b.length)
                                       for w in b.worker_ids)
        for b in rec.blocks:
            if b.block_id:
                s.index_block(txn, b, node.ino)
        s.put_blocks(txn, node.ino, list(rec.blocks), old)
        fx.inodes.append(node.ino)
        node.size = rec.size
        node.stored = stored_size(rec.blocks)
        node.state = common_pb2.COMPLETE
        node.version += 1
        node.mtime_ns = node.ctime_ns = rec.mtime_ns
        s.put_inode(txn, node)
        s.del_writer(txn, node.ino)
        fx.completed.extend(new_ids)

    def _apply_put(self, txn, rec, fx: Effects) -> None:
        self._store_new_files(txn, [rec], fx)

    def _apply_put_many(self, txn, rec, fx: Effects) -> None:
        if rec.puts:
            self._store_new_files(txn, rec.puts, fx)

    def _store_new_files(self, txn, puts, fx: Effects) -> None:
        """New complete files with their blocks, all in one directory (PutRecords)."""
        s = self.store
        for put in puts:
            put.inode.stored = stored_size(put.blocks)
        self._link_all_new(txn, puts, fx)
        for put in puts:
            if not put.blocks:
                continue
            for b in put.blocks:
                if b.block_id:
                    s.index_block(txn, b, put.inode.ino)
            s.put_blocks(txn, put.inode.ino, list(put.blocks), old=[])  # a new inode
            fx.completed.extend(b.block_id for b in put.blocks if b.block_id)

    # ------------------------------------------------------------------ capacity
    # (master/cluster/capacity.py decides what to remove; these plan and apply it)

    def plan_evict(self, txn, reason: int, inos, still_wanted):
        """Remove the files ``inos`` that still exist and for which
        ``still_wanted(node)`` holds (checked against the state of this batch).
        Value: (removed inos, {worker id: bytes freed there})."""
        removed: list[int] = []
        freed: dict[int, int] = {}
        for ino in inos:
            node = self.store.get_inode(txn, ino)
            if node is None or node.type == DIRECTORY or not still_wanted(node):
                continue
            # an unlinked file kept open goes only for that reason (EVICT_UNLINKED), and
            # that only while it is held
            held = node.nlink == 0 and self.store.held_by(txn, ino) is not None
            if held != (reason == journal_pb2.EVICT_UNLINKED):
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
            fx.inodes.append(ino)
            # every name it has (none: held); its space back at once (a reader's open
            # keeps a file from eviction, a writer's does not)
            self._remove(txn, node, fx, rec.time_ns, keep_for_opens=False)

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

    # ------------------------------------------------------------------ blocks and workers
    def plan_reserve_block_ids(self, txn, upto: int):
        """Block ids below ``upto`` may be handed out (Master._allocate_block_ids).
        Value: ``upto``."""
        rec = journal_pb2.ReserveBlockIdsRecord(upto=upto)
        return journal_pb2.JournalEntry(reserve_block_ids=rec), upto

    def _apply_reserve_block_ids(self, txn, rec, fx: Effects) -> None:
        s = self.store
        s.put_u64(txn, b"block_ids_reserved", max(rec.upto, s.get_u64(txn, b"block_ids_reserved")))

    def plan_register_worker(self, txn, record: common_pb2.WorkerInfo):
        """Register ``record`` (Master.register_worker); without a worker id it gets
        its uuid's, else the next free one.  Value: the worker id."""
        if not record.worker_id:
            # From the store inside this transaction, not the registry: workers
            # registering at the same time are planned in one batch, and the
            # registry learns of each only after the batch commits.
            known = list(self.store.workers(txn))
            same = [w.worker_id for w in known if w.uuid == record.uuid]
            record.worker_id = same[0] if same else max(
                (w.worker_id for w in known), default=0) + 1
        return journal_pb2.JournalEntry(
            register_worker=journal_pb2.RegisterWorkerRecord(worker=record)), record.worker_id

    def _apply_register_worker(self, txn, rec, fx: Effects) -> None:
        self.store.put_worker(txn, rec.worker)
        fx.workers.append(rec.worker)

    def plan_drop_locations(self, txn, worker_id: int, block_ids):
        """Worker ``worker_id`` no longer holds ``block_ids`` (its block report left
        them out, or it was lost past master.lost_grace): drop those still in a file as
        its locations.  Value: None."""
        still = [b for b in block_ids if self.store.block_owner(txn, b) is not None]
        if not still:
            return None, None
        rec = journal_pb2.DropLocationsRecord(worker_id=worker_id, block_ids=still,
                                              time_ns=now_ns())
        return journal_pb2.JournalEntry(drop_locations=rec), None

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
            s.put_blocks(txn, ino, blocks, old=blocks)  # locations only: inline bytes as they were
            node = s.get_inode(txn, ino)
            if lost and node is not None:
                # The last replica is gone: remove every name, so readers get a clean miss.
                fx.inodes.append(node.ino)
                self._remove(txn, node, fx, rec.time_ns, keep_for_opens=False)

    # ------------------------------------------------------------------ replicas
    def wanted_replicas(self, node: common_pb2.Inode, default: int) -> int:
        """Replicas a file wants: its own count (from its directory at create), else the
        cluster's."""
        return node.replicas or default

    def plan_add_locations(self, txn, worker_id: int, lengths: dict[int, int], default: int,
                           lost=frozenset()):
        """Admit replicas that worker ``worker_id`` holds (block id -> stored length) as
        locations of blocks whose file still has them, is short of replicas (locations
        on ``lost`` workers not counted) and that the stored copy covers.  Value:
        (added, unwanted) block ids; the caller deletes the unwanted copies (never more
        replicas than wanted)."""
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
            elif (len([w for w in block.worker_ids if w not in lost])
                  >= self.wanted_replicas(node, default) or length < block.length):
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
            s.put_blocks(txn, ino, blocks, old=blocks)  # locations only


# ------------------------------------------------------------------ record kinds
# Every kind of journal record, in the order of its number: JournalEntry's ``op``
# (proto/src/curvine/proto/journal.proto; the field number is the record's type in
# the journal's frames, never renumbered), the one function that applies it
# (``Namespace.apply``: the live path and the replay), and the plans that make it.
# A kind is added to the proto and here together: tests/test_layers.py checks that
# this table names every kind the proto has, in its order.
APPLY: dict[str, Callable[[Namespace, Any, Any, Effects], None]] = {
    # kind: apply function                                    number: planned by
    "mkdir": Namespace._apply_mkdir,                          # 1: plan_root, plan_mkdir
    "create": Namespace._apply_create,                        # 2: plan_create
    "unlink": Namespace._apply_unlink,                        # 3: plan_unlink
    "rename": Namespace._apply_rename,                        # 4: plan_rename
    "set_attr": Namespace._apply_set_attr,                    # 5: plan_setattr
    "complete": Namespace._apply_complete,                    # 6: plan_complete
    "reserve_block_ids": Namespace._apply_reserve_block_ids,  # 7: plan_reserve_block_ids
    "register_worker": Namespace._apply_register_worker,      # 8: plan_register_worker
    "drop_locations": Namespace._apply_drop_locations,        # 9: plan_drop_locations
    "add_locations": Namespace._apply_add_locations,          # 10: plan_add_locations
    "put": Namespace._apply_put,                              # 11: plan_put
    "make_node": Namespace._apply_make_node,                  # 12: plan_symlink, plan_make_node
    "link": Namespace._apply_link,                            # 13: plan_link
    "xattr": Namespace._apply_xattr,                          # 14: plan_set_xattr, plan_remove_xattr
    "evict": Namespace._apply_evict,                          # 20: plan_evict, plan_release
    "set_policy": Namespace._apply_set_policy,                # 21: plan_set_policy
    "put_many": Namespace._apply_put_many,                    # 22: plan_put_many
}


_S_IFMT = {FILE: stat.S_IFREG, DIRECTORY: stat.S_IFDIR, SYMLINK: stat.S_IFLNK,
           common_pb2.FIFO: stat.S_IFIFO, common_pb2.SOCKET: stat.S_IFSOCK,
           common_pb2.CHAR_DEVICE: stat.S_IFCHR, common_pb2.BLOCK_DEVICE: stat.S_IFBLK}


def attr_mode(node: common_pb2.Inode) -> int:
    """st_mode of ``node``: its type's S_IF* bits and its permission bits."""
    return _S_IFMT.get(node.type, stat.S_IFREG) | (node.mode & 0o7777)
