"""The master's metadata store: LMDB, a materialised view of the journal.

Key schema (all integers fixed-width big-endian, so LMDB's byte order is numeric order):

    db        key                                 value
    --------  ----------------------------------  ------------------------------------
    meta      b"applied_seq"                      u64: last journal seq applied here
              b"next_ino"                         u64: next inode id to hand out
              b"block_ids_reserved"               u64: block ids below this may be in use
              b"inode_count"                      u64: inodes in the namespace
              b"format"                           u32: schema version (1)
              b"inline_bytes"                     u64: bytes of inline data (Block.data)
                                                  in every file's block list
    inode     ino u64                             Inode (protobuf)
    dentry    parent ino u64 + name bytes         child ino u64
    fblocks   ino u64                             BlockList (protobuf): the file's blocks
                                                  (a small file's bytes inline: Block.data)
    block     block id u64                        ino u64 owning the block
    wblock    worker id u32 + block id u64        b"" (index: blocks located on a worker)
    worker    worker id u32                       WorkerInfo (protobuf): registrations
    writer    ino u64                             u64: lease session of the mount that
                                                  created the file, while it is being
                                                  written (orphan detection, capacity.py)
    links     ino u64 + parent u64 + name bytes   b"": the hard links of a non-directory
                                                  other than its first name (Inode.parent
                                                  and .name); a file with one name (every
                                                  LMCache chunk) has no row here
    held      ino u64                             u64: lease session of the mount that
                                                  keeps the inode after its last name
                                                  went (nlink 0, open there) until
                                                  ReleaseInode, or until that session is
                                                  gone for master.orphan_timeout
    xattr     ino u64 + name bytes                value bytes: extended attributes
                                                  (user.* only)

A directory lists as one range scan of ``dentry`` over its 8-byte prefix, in name
order, so one directory can hold millions of entries and pages resume by name.  Every
name of an inode is a ``dentry`` row; ``links`` and ``xattr`` are range scans over the
inode's 8-byte prefix, so removing an inode finds all of its rows.
Every write transaction that applies journal records also stores ``applied_seq``.
"""

from __future__ import annotations

import os
import struct
from typing import Iterator

import lmdb

from curvine.common import private_files
from curvine.proto import common_pb2

U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
WBLOCK = struct.Struct(">IQ")
FORMAT = 1
INLINE_BYTES = b"inline_bytes"

_DBS = ("meta", "inode", "dentry", "fblocks", "block", "wblock", "worker", "writer", "links",
        "held", "xattr")


def k64(n: int) -> bytes:
    return U64.pack(n)


def inline_size(blocks) -> int:
    """Bytes kept inline (Block.data) in ``blocks`` (their lengths: a block's data is
    checked to be its length when published; read without copying the bytes)."""
    return sum(b.length for b in blocks if not b.block_id and b.HasField("data"))


def stored_size(blocks) -> int:
    """Bytes of data ``blocks`` store (on workers or inline): holes are not counted."""
    return sum(b.length for b in blocks if b.block_id or b.HasField("data"))


class Store:
    """Typed access to the LMDB environment; methods take an open transaction."""

    def __init__(self, path: str, map_size: int = 1 << 36):
        # Private (common/private_files.py): the dir 0700, LMDB's files 0600.  No owner
        # check here: the master checks its meta dir at start, and an offline tool run
        # by root on the master's files must work.
        private_files.private_dir(path, "master.meta_dir (LMDB)", check_owner=False)
        for name in ("data.mdb", "lock.mdb"):  # made by an older version: 0644
            private_files.tighten_file(os.path.join(path, name), "master.meta_dir (LMDB)")
        # sync=False: the journal is the durable truth; LMDB is synced at checkpoints
        # and at shutdown, and replay covers whatever an OS crash takes back.
        self.path = path
        self.env = lmdb.open(path, map_size=map_size, max_dbs=len(_DBS) + 1, sync=False,
                             metasync=False, readahead=False, max_readers=512,
                             mode=private_files.FILE_MODE)
        self.db = {name: self.env.open_db(name.encode()) for name in _DBS}
        with self.env.begin(write=True) as txn:
            fmt = txn.get(b"format", db=self.db["meta"])
            if fmt is None:
                txn.put(b"format", U32.pack(FORMAT), db=self.db["meta"])
            elif U32.unpack(fmt)[0] != FORMAT:
                raise RuntimeError(f"{path}: unsupported metadata format {U32.unpack(fmt)[0]}")

    def close(self) -> None:
        self.env.sync(True)
        self.env.close()

    def read(self) -> lmdb.Transaction:
        return self.env.begin(buffers=False)

    # -- meta counters -------------------------------------------------------------
    def get_u64(self, txn, key: bytes, default: int = 0) -> int:
        v = txn.get(key, db=self.db["meta"])
        return U64.unpack(v)[0] if v is not None else default

    def put_u64(self, txn, key: bytes, value: int) -> None:
        txn.put(key, U64.pack(value), db=self.db["meta"])

    # -- inodes --------------------------------------------------------------------
    def get_inode(self, txn, ino: int) -> common_pb2.Inode | None:
        v = txn.get(k64(ino), db=self.db["inode"])
        if v is None:
            return None
        node = common_pb2.Inode()
        node.ParseFromString(v)
        return node

    def put_inode(self, txn, node: common_pb2.Inode) -> None:
        txn.put(k64(node.ino), node.SerializeToString(), db=self.db["inode"])

    def del_inode(self, txn, ino: int) -> None:
        txn.delete(k64(ino), db=self.db["inode"])

    # -- directory entries ---------------------------------------------------------
    def lookup(self, txn, parent: int, name: bytes) -> int | None:
        v = txn.get(k64(parent) + name, db=self.db["dentry"])
        return U64.unpack(v)[0] if v is not None else None

    def put_dentry(self, txn, parent: int, name: bytes, ino: int) -> None:
        txn.put(k64(parent) + name, k64(ino), db=self.db["dentry"])

    def del_dentry(self, txn, parent: int, name: bytes) -> None:
        txn.delete(k64(parent) + name, db=self.db["dentry"])

    def list_dir(self, txn, parent: int, start_after: bytes = b"") -> Iterator[tuple[bytes, int]]:
        for name, key in self._dentries(txn, parent, start_after):
            yield name, U64.unpack(key)[0]

    def list_dir_records(self, txn, parent: int, start_after: bytes = b""
                         ) -> Iterator[tuple[bytes, bytes, bytes]]:
        """(name, the child's inode key, its encoded Inode) of each entry, in name order:
        a listing frames the records as they are, without parsing them (listing.py)."""
        get, inodes = txn.get, self.db["inode"]
        for name, key in self._dentries(txn, parent, start_after):
            raw = get(key, db=inodes)
            if raw is not None:
                yield name, key, raw

    def _dentries(self, txn, parent: int, start_after: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(name, the child's inode key: k64 of its number) after ``start_after``."""
        prefix = k64(parent)
        cur = txn.cursor(db=self.db["dentry"])
        if not cur.set_range(prefix + start_after):
            return
        for key, val in cur:
            if not key.startswith(prefix):
                return
            name = key[8:]
            if start_after and name == start_after:
                continue
            yield name, val

    def _prefixed(self, txn, db: str, prefix: bytes, values: bool = False) -> Iterator:
        """Keys (without ``prefix``) of ``db`` that start with it, in order; with
        ``values`` (key, value) pairs."""
        cur = txn.cursor(db=self.db[db])
        if not cur.set_range(prefix):
            return
        for key, val in cur:
            if not key.startswith(prefix):
                return
            yield (key[len(prefix):], val) if values else key[len(prefix):]

    def dir_is_empty(self, txn, ino: int) -> bool:
        for _ in self.list_dir(txn, ino):
            return False
        return True

    # -- blocks --------------------------------------------------------------------
    def get_blocks(self, txn, ino: int) -> list[common_pb2.Block]:
        v = txn.get(k64(ino), db=self.db["fblocks"])
        if v is None:
            return []
        bl = common_pb2.BlockList()
        bl.ParseFromString(v)
        return list(bl.blocks)

    def blocks_bytes(self, txn, ino: int) -> bytes:
        """``ino``'s stored BlockList, unparsed: its size bounds the work of reading it
        (a read that must stay cheap checks it first: master.lookup_many)."""
        return txn.get(k64(ino), db=self.db["fblocks"]) or b""

    def put_blocks(self, txn, ino: int, blocks: list[common_pb2.Block],
                   old: list[common_pb2.Block] | None = None) -> None:
        """The one writer of ``fblocks``: it also keeps the total of inline bytes.
        ``old``: the blocks stored now, if the caller has just read them."""
        if old is None:
            old = self.get_blocks(txn, ino)
        delta = inline_size(blocks) - inline_size(old)
        if delta:
            self.put_u64(txn, INLINE_BYTES, self.get_u64(txn, INLINE_BYTES) + delta)
        if not blocks:
            txn.delete(k64(ino), db=self.db["fblocks"])
            return
        txn.put(k64(ino), common_pb2.BlockList(blocks=blocks).SerializeToString(),
                db=self.db["fblocks"])

    def inline_bytes(self, txn) -> int:
        """Bytes of inline data the namespace holds (master.inline_capacity bounds it)."""
        return self.get_u64(txn, INLINE_BYTES)

    def block_owner(self, txn, block_id: int) -> int | None:
        v = txn.get(k64(block_id), db=self.db["block"])
        return U64.unpack(v)[0] if v is not None else None

    def index_block(self, txn, block: common_pb2.Block, ino: int) -> None:
        txn.put(k64(block.block_id), k64(ino), db=self.db["block"])
        for wid in block.worker_ids:
            txn.put(WBLOCK.pack(wid, block.block_id), b"", db=self.db["wblock"])

    def unindex_block(self, txn, block: common_pb2.Block) -> None:
        txn.delete(k64(block.block_id), db=self.db["block"])
        for wid in block.worker_ids:
            txn.delete(WBLOCK.pack(wid, block.block_id), db=self.db["wblock"])

    def unindex_location(self, txn, worker_id: int, block_id: int) -> None:
        txn.delete(WBLOCK.pack(worker_id, block_id), db=self.db["wblock"])

    def blocks_on_worker(self, txn, worker_id: int) -> Iterator[int]:
        prefix = U32.pack(worker_id)
        cur = txn.cursor(db=self.db["wblock"])
        if not cur.set_range(prefix):
            return
        for key in cur.iternext(keys=True, values=False):
            if not key.startswith(prefix):
                return
            yield WBLOCK.unpack(key)[1]

    # -- workers -------------------------------------------------------------------
    def workers(self, txn) -> Iterator[common_pb2.WorkerInfo]:
        for _, v in txn.cursor(db=self.db["worker"]):
            w = common_pb2.WorkerInfo()
            w.ParseFromString(v)
            yield w

    def has_worker(self, txn, worker_id: int) -> bool:
        return txn.get(U32.pack(worker_id), db=self.db["worker"]) is not None

    def put_worker(self, txn, w: common_pb2.WorkerInfo) -> None:
        txn.put(U32.pack(w.worker_id), w.SerializeToString(), db=self.db["worker"])

    # -- capacity (master/cluster/capacity.py) ---------------------------------------------
    def put_writer(self, txn, ino: int, session: int) -> None:
        txn.put(k64(ino), k64(session), db=self.db["writer"])

    def del_writer(self, txn, ino: int) -> None:
        txn.delete(k64(ino), db=self.db["writer"])

    def writers(self, txn) -> Iterator[tuple[int, int]]:
        """(ino, session) of files whose creating mount's session is recorded."""
        for k, v in txn.cursor(db=self.db["writer"]):
            yield U64.unpack(k)[0], U64.unpack(v)[0]

    # -- hard links: the names of an inode beyond its first ---------------------------
    def put_link(self, txn, ino: int, parent: int, name: bytes) -> None:
        txn.put(k64(ino) + k64(parent) + name, b"", db=self.db["links"])

    def del_link(self, txn, ino: int, parent: int, name: bytes) -> None:
        txn.delete(k64(ino) + k64(parent) + name, db=self.db["links"])

    def has_link(self, txn, ino: int, parent: int, name: bytes) -> bool:
        return txn.get(k64(ino) + k64(parent) + name, db=self.db["links"]) is not None

    def links_of(self, txn, ino: int) -> list[tuple[int, bytes]]:
        """(parent, name) of every name of ``ino`` but its first, in key order."""
        return [(U64.unpack(k[:8])[0], k[8:])
                for k in self._prefixed(txn, "links", k64(ino))]

    # -- inodes kept after their last name went (nlink 0, open on a mount) -----------
    def put_held(self, txn, ino: int, session: int) -> None:
        txn.put(k64(ino), k64(session), db=self.db["held"])

    def del_held(self, txn, ino: int) -> None:
        txn.delete(k64(ino), db=self.db["held"])

    def held_by(self, txn, ino: int) -> int | None:
        """The session keeping ``ino``, or None if it is not held."""
        v = txn.get(k64(ino), db=self.db["held"])
        return U64.unpack(v)[0] if v is not None else None

    def held(self, txn) -> Iterator[tuple[int, int]]:
        """(ino, session) of every held inode."""
        for k, v in txn.cursor(db=self.db["held"]):
            yield U64.unpack(k)[0], U64.unpack(v)[0]

    # -- extended attributes ---------------------------------------------------------
    def get_xattr(self, txn, ino: int, name: bytes) -> bytes | None:
        return txn.get(k64(ino) + name, db=self.db["xattr"])

    def put_xattr(self, txn, ino: int, name: bytes, value: bytes) -> None:
        txn.put(k64(ino) + name, value, db=self.db["xattr"])

    def del_xattr(self, txn, ino: int, name: bytes) -> None:
        txn.delete(k64(ino) + name, db=self.db["xattr"])

    def xattrs(self, txn, ino: int) -> list[tuple[bytes, bytes]]:
        """(name, value) of every attribute of ``ino``, in name order."""
        return list(self._prefixed(txn, "xattr", k64(ino), values=True))
