"""The master: assembles its metadata (journal, store, namespace and committer, opened
and recovered by metadata.py) and the worker registry, leases and background rounds.

Reads run on the caller's thread with an LMDB read transaction.  Mutations go to the
committer (see committer.py) and return once durable.  Block ids are handed out from
a journaled reservation, so no id is ever given twice, even across restarts.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from curvine.common import block_tokens, private_files
from curvine.common.config import Config
from curvine.common.errors import CurvineError, ErrorKind, invalid
from curvine.common.ids import check_file_size, check_ino, check_name
from curvine.common.metrics import REQUESTS_LIMITED
from curvine.common.security import Security
from curvine.proto import common_pb2, master_pb2

from .cluster.capacity import AccessLog, Capacity
from .cluster.deleter import DeletePusher
from .cluster.lag import LagMonitor
from .cluster.leases import LeaseTable
from .cluster.opens import MountSessions, OpenFiles
from .cluster.pending import PUT_BLOCK_TTL, PendingBlocks
from .cluster.replication import ReplicationMonitor
from .cluster.workers import WorkerRegistry
from .meta import listing
from .meta.committer import RetryHit, result_ino
from .meta.metadata import Metadata, checkpoint_root
from .meta.namespace import FILE, Effects, not_a_file
from .meta.steps import Submit, mutation

log = logging.getLogger(__name__)

BLOCK_ID_CHUNK = 10_000  # ids reserved per journal record
MAX_LIST = 10_000
MAX_LOOKUP_MANY = 4096  # names per LookupMany (a 1M-token prompt is 4096 chunks)
DEFAULT_LIST = 1000
# What one LookupMany reply may carry (docs/security.md, "Limits"; the byte budget is
# master.lookup_reply_max): the blocks of one file (a KV chunk is one block; a bigger
# file is read with GetBlocks) and of the whole reply.  A reply answers the names
# before the first that would pass one; the client asks again from there.
LOOKUP_FILE_BLOCKS = 1024
LOOKUP_REPLY_BLOCKS = 16384
TOKEN_COST = 24  # bytes a read token adds to a block of a reply
# The cheap form of a read (light=True: the call port answers it in its loop thread,
# which every mount shares): a read that would cost more raises WouldBlock before it
# does, and runs in a thread instead (master/ports/service.py, heavy reads).
LIGHT_NAMES = 128  # names of a LookupMany (~10 us each)
LIGHT_BLOCK_BYTES = 8 << 10  # one file's stored block list (~300 blocks, ~1 ms)
LIGHT_SLICE = 0.002  # seconds of one LookupMany
COPY_SLICE = 1024  # blocks copied by one protobuf call (~1 ms, holding the GIL)


def _held(value) -> int:
    """ParentReply.held from the value of plan_unlink/plan_rename (or of the retry cache:
    the record's held inode)."""
    return int(result_ino(value, value) or 0)


def _leasable(nodes) -> list[int]:
    """The inodes among ``nodes`` whose attributes a lease covers: regular files only
    (a directory's change with every entry in it)."""
    return [n.ino for n in nodes if n.type == FILE]


_LOOKUP_LIMITED = {limit: REQUESTS_LIMITED.labels("LookupMany", limit)
                   for limit in ("names", "reply_bytes", "reply_blocks", "file_blocks")}


def private_dirs(meta_dir: str, journal_dir: str) -> None:
    """Make the master's directories, this user's only: they hold the names and the
    block token key (common/private_files.py)."""
    try:
        private_files.private_dir(meta_dir, "master.meta_dir", scan_depth=2, durable=True)
        private_files.private_dir(journal_dir, "journal.dir", durable=True)
    except OSError as e:
        raise CurvineError(ErrorKind.IO, f"{e.filename}: {e.strerror}") from None


@dataclass(frozen=True)
class GroupRole:
    """What a member of a master group builds its Master with (master/member.py):
    the member's metadata (store, namespace), and this role's journal in etcd
    (writable while leading) and lease state.  A standby (``leading`` False) starts
    no committer and no background round and grants no lease: it answers reads."""

    metadata: Metadata
    journal: Any
    leading: bool
    lease_state: Any


class WouldBlock(Exception):
    """A call asked not to wait (``wait=False``) would have to: run it where it may."""


class Master:
    def __init__(self, cfg: Config, meta_dir: str | None = None, journal_dir: str | None = None,
                 *, security: Security, group: GroupRole | None = None):
        self.cfg = cfg
        # a standby of a master group answers reads only (GroupRole)
        self.leading = group is None or group.leading
        self.meta_dir = os.path.abspath(meta_dir or cfg.master.meta_dir)
        self.journal_dir = os.path.abspath(journal_dir or cfg.journal.dir)
        self.block_size = int(cfg.cluster.block_size)
        self.lookup_reply_max = int(cfg.master.lookup_reply_max)  # bytes of a LookupMany reply
        self.call_port_server = None  # the CallPort serving (master/server.py), if any
        self.ckpt_root = checkpoint_root(self.meta_dir)
        private_dirs(self.meta_dir, self.journal_dir)
        self.lag = LagMonitor()  # the master's own stalls (master/cluster/lag.py)
        self.lag.start()
        self.registry = WorkerRegistry(float(cfg.master.worker_lost_after), self.lag)
        # blocks placed, not yet in a published version (master/cluster/pending.py)
        self.pending = PendingBlocks(self.registry.queue_deletes)
        try:
            # the registry hears of the workers the store knows, then of the replay's
            # effects (master/meta/metadata.py)
            self.metadata = (Metadata.open(cfg, self.meta_dir, self.journal_dir,
                                           self._on_effects) if group is None
                             else group.metadata.over(group.journal, self._on_effects))
        except BaseException:
            self.lag.close()
            raise
        self.journal = self.metadata.journal
        self.store = self.metadata.store
        self.ns = self.metadata.ns
        self.committer = self.metadata.committer
        try:
            # workers accept a block id only with a token signed by this key
            self.block_key = block_tokens.load_or_create_key(self.meta_dir)
        except (OSError, ValueError) as e:
            self.metadata.close()
            self.lag.close()
            raise CurvineError(ErrorKind.IO, f"block token key: {e}") from None
        self.leases = LeaseTable(float(cfg.master.lease_time) if self.leading else 0.0,
                                 os.path.join(self.meta_dir, "leases.json"),
                                 absent_time=float(cfg.master.negative_lease_time),
                                 state=group.lease_state if group is not None else None)
        with self.store.read() as txn:
            self._reserved = self.store.get_u64(txn, b"block_ids_reserved", 1)
        self._next_block = max(self._reserved, 1)  # skip ids a previous run may have used
        self._alloc_lock = threading.Lock()
        self.started = time.monotonic()
        if self.leading:
            self.committer.start()
            self.submit(self.ns.plan_root)
        # block deletes to the workers at once (the master's calls to workers)
        self.deleter = DeletePusher(self.registry, self.block_key, security,
                                    float(cfg.cluster.rpc_timeout))
        # mounts' sessions, their open files and the blocks kept for them, and the
        # access order they feed (master/cluster/opens.py)
        self.sessions = MountSessions(float(cfg.master.orphan_timeout))
        lru = AccessLog()
        self.opens = OpenFiles(self.store, self.registry.queue_deletes, self.sessions,
                               lru.touch)
        # eviction, TTL, orphans (master/cluster/capacity.py)
        self.capacity = Capacity(self.store, self.ns, self.submit, self.registry,
                                 self.deleter, self.pending, self.opens, self.sessions, lru,
                                 cfg.master)
        self.committer.on_applied = self._on_applied
        self.replication = ReplicationMonitor(self.store, self.ns, self.registry, self.submit,
                                              self.started, cfg.master,
                                              int(cfg.cluster.replicas))
        if self.leading:
            self.deleter.start()
            self.capacity.start()
            self.replication.start()

    def close(self) -> None:
        if hasattr(self, "leases"):
            self.leases.close_sessions()  # their mounts go to whoever serves next
        if hasattr(self, "capacity"):
            self.capacity.close()
        if hasattr(self, "deleter"):
            self.deleter.close()
        if hasattr(self, "replication"):
            self.replication.close()
        if hasattr(self, "lag"):
            self.lag.close()
        self.metadata.close()

    # ------------------------------------------------------------------ plumbing
    def submit(self, plan, request_id: bytes = b"", timeout: float | None = None,
               session: int = 0):
        """Commit a mutation; once durable, revoke the leases of other mounts on what it
        changed (``session``: the caller's, which needs none) and return its value."""
        value, fx = self.committer.submit_fx(plan, request_id,
                                             timeout or float(self.cfg.cluster.rpc_timeout))
        if fx is not None and (fx.names or fx.inodes or fx.created):
            self.leases.revoke(fx.names, fx.inodes, exclude=session, created=fx.created)
        return value

    def _on_effects(self, fx: Effects) -> None:
        for w in fx.workers:
            self.registry.upsert(w)
        if fx.freed:
            self.registry.queue_deletes(fx.freed)
        if fx.replaced:
            opens = getattr(self, "opens", None)  # None while the journal replays
            if opens is not None:
                opens.settle(fx.replaced)
            else:
                self.registry.queue_deletes([(w, b, n) for _, w, b, n in fx.replaced])

    def _on_applied(self, fx: Effects) -> None:
        """A live record was applied (not yet durable): hold the blocks it dropped, so
        that a CompleteFile planned next, in the same batch, may claim them."""
        if fx.replaced:
            self.opens.hold(fx.replaced)
        if fx.completed:
            self.pending.completed(fx.completed)

    def _inode_reply(self, value, session: int = 0, since: int = 0,
                     name: tuple[int, bytes] | None = None) -> master_pb2.InodeReply:
        node = self.getattr(value.ino) if isinstance(value, RetryHit) else value
        reply = master_pb2.InodeReply(inode=node,
                                      lease_ms=self._grant(session, since, node, name))
        if name is not None:
            parent = self._inode_or_none(name[0])
            if parent is not None:
                reply.parent.CopyFrom(parent)
        return reply

    def _inode_or_none(self, ino: int) -> common_pb2.Inode | None:
        with self.store.read() as txn:
            return self.store.get_inode(txn, ino)

    def _parents_reply(self, parent: int, new_parent: int = 0,
                       moved: tuple[int, bytes] | None = None) -> master_pb2.ParentReply:
        """The directories a mutation changed (and a renamed inode), as they are now:
        what the mount's kernel asks for next."""
        reply = master_pb2.ParentReply()
        with self.store.read() as txn:
            for field, ino in (("parent", parent), ("new_parent", new_parent)):
                node = self.store.get_inode(txn, ino) if ino else None
                if node is not None:
                    getattr(reply, field).CopyFrom(node)
            if moved is not None:
                ino = self.store.lookup(txn, moved[0], moved[1])
                node = self.store.get_inode(txn, ino) if ino is not None else None
                if node is not None:
                    reply.moved.CopyFrom(node)
        return reply

    def _grant(self, session: int, since: int, node: common_pb2.Inode,
               name: tuple[int, bytes] | None) -> int:
        """Lease to ``session`` the entry ``name`` -> node and a file's attributes."""
        if not session:
            return 0
        return self.leases.grant(session, since, [name] if name else (), _leasable([node]))

    # ------------------------------------------------------------------ namespace reads
    def lookup(self, parent: int, name: bytes) -> common_pb2.Inode:
        with self.store.read() as txn:
            return self.ns.lookup(txn, check_ino(parent, "parent"), name)

    def lookup_or_none(self, parent: int, name: bytes) -> common_pb2.Inode | None:
        """Like lookup, but a missing name (or parent) is None, not an error."""
        with self.store.read() as txn:
            return self.ns.lookup_or_none(txn, check_ino(parent, "parent"), name)

    def getattr(self, ino: int) -> common_pb2.Inode:
        with self.store.read() as txn:
            return self.ns.inode(txn, ino)

    def lookup_reply(self, req: master_pb2.LookupRequest) -> master_pb2.InodeReply:
        since = self.leases.snapshot()
        if req.miss_ok:
            node = self.lookup_or_none(req.parent, req.name)
            if node is None:
                if not req.lease_miss:
                    return master_pb2.InodeReply()
                # a negative entry, revoked by whatever makes the name (fx.created)
                return master_pb2.InodeReply(lease_ms=self.leases.grant(
                    req.session, since, [(req.parent, req.name)], absent=True))
        else:
            node = self.lookup(req.parent, req.name)
        return master_pb2.InodeReply(
            inode=node, lease_ms=self._grant(req.session, since, node, (req.parent, req.name)))

    def getattr_reply(self, req: master_pb2.GetAttrRequest) -> master_pb2.InodeReply:
        since = self.leases.snapshot()
        node = self.getattr(req.ino)
        return master_pb2.InodeReply(inode=node, lease_ms=self._grant(req.session, since, node, None))

    def listdir(self, ino: int, start_after: bytes, limit: int, session: int = 0,
                names_only: bool = False, lease_listing: bool = False
                ) -> master_pb2.ListDirReply:
        """A page of entries; with ``session`` the names listed, and the files'
        attributes, are leased to it as a lookup of each would lease them (so ``ls -l``
        after a listing finds them in the mount's kernel).  ``names_only``: names
        alone, nothing leased but the listing.  ``lease_listing``: a first page that
        holds the whole directory leases the listing too (LeaseTable.grant_listing)."""
        if limit > MAX_LIST:
            raise invalid("limit", f"at most {MAX_LIST}")
        if start_after:
            check_name(start_after, "start_after")
        limit = limit or DEFAULT_LIST
        reply = master_pb2.ListDirReply()
        if names_only and lease_listing and self.leases.busy(ino, session):
            # names asked for only to be leased, which a busy directory is not: do
            # not scan it (LMCache's directories, where every pod keeps storing)
            reply.has_more = True
            return reply
        since = self.leases.snapshot()
        with self.store.read() as txn:
            self.ns.directory(txn, ino, "ino")
            if names_only:
                entries = reply.entries
                for name, _child in self.store.list_dir(txn, ino, start_after):
                    if len(entries) >= limit:
                        reply.has_more = True
                        break
                    entries.add(name=name)
                names: list[bytes] = []
                files: list[int] = []
            else:
                # the stored inodes framed as the reply's entries, parsed in one call
                encoded, names, files, reply.has_more = listing.read_page(
                    txn, self.store, ino, start_after, limit)
                reply.MergeFromString(encoded)
        if session and lease_listing and not start_after and not reply.has_more:
            reply.listing_lease_ms = self.leases.grant_listing(session, since, ino)
        if session and names:  # the names listed, and the files' attributes
            reply.lease_ms = self.leases.grant(session, since, [(ino, n) for n in names],
                                               files)
        return reply

    @property
    def call_port(self) -> int:
        """The bound call port told to mounts (StatFs); 0: none."""
        return self.call_port_server.port if self.call_port_server is not None else 0

    def statfs(self) -> master_pb2.StatFsReply:
        reply = master_pb2.StatFsReply(block_size=self.block_size, call_port=self.call_port,
                                       inline_max=self.ns.inline_max)
        for info, alive in self.registry.snapshot():
            reply.workers.append(info)
            if alive:
                reply.live_workers += 1
                reply.capacity += info.capacity
                reply.used += info.used
        with self.store.read() as txn:
            reply.files = self.store.get_u64(txn, b"inode_count")
        return reply

    def get_blocks(self, ino: int, session: int = 0, open_id: int = 0,
                   write: bool = False, light: bool = False) -> master_pb2.GetBlocksReply:
        """Blocks and locations of ``ino``; with ``open_id`` a mount opens it for reading
        (recorded first, so eviction cannot remove it between this read and the open),
        or with ``write`` to write a version based on these blocks.  ``light``:
        WouldBlock for a file of more than LIGHT_BLOCK_BYTES of blocks."""
        if open_id and not self.opens.note_open(check_ino(ino), session, open_id, write):
            raise CurvineError(ErrorKind.NOT_FOUND, f"ino: {ino} is being evicted")
        reply = master_pb2.GetBlocksReply()
        with self.store.read() as txn:
            try:
                node = self.ns.inode(txn, ino)
            except CurvineError:
                if open_id:  # no such file: nothing was opened
                    self.opens.note_closed(session, (open_id,))
                raise
            raw = self.store.blocks_bytes(txn, node.ino) if node.type == FILE else b""
        if light and len(raw) > LIGHT_BLOCK_BYTES:
            raise WouldBlock()  # (the open recorded stays recorded: it is a set)
        reply.inode.CopyFrom(node)
        blocks = common_pb2.BlockList.FromString(raw).blocks
        for b in blocks:
            if b.block_id:  # holes and inline data need no token
                b.token = block_tokens.mint(self.block_key, b.block_id, block_tokens.READ)
        # copied in slices: one copy of 65,536 blocks is ~65 ms in C, with the GIL held
        # all along (the call port's loop thread would wait for it)
        for i in range(0, len(blocks), COPY_SLICE):
            reply.blocks.extend(blocks[i:i + COPY_SLICE])
        reply.workers.extend(self._known_workers({w for b in blocks for w in b.worker_ids}))
        return reply

    def _known_workers(self, wids) -> list[common_pb2.WorkerInfo]:
        """The registered workers among ``wids``, by id: a read reply's locations."""
        return self.registry.for_readers(wids)

    def lookup_many(self, req: master_pb2.LookupManyRequest, light: bool = False
                    ) -> master_pb2.LookupManyReply:
        """Every name of ``req.names`` in directory ``req.parent`` from one read
        transaction; with ``with_blocks`` a complete file's blocks with read tokens.

        The reply's cost is bounded before it is built (docs/security.md, "Limits"): it
        answers the names in order while it stays within master.lookup_reply_max bytes
        and LOOKUP_REPLY_BLOCKS blocks, and a result carries at most LOOKUP_FILE_BLOCKS
        blocks.  It ends before the first name that would pass one (fewer results than
        names: the caller asks again for the rest); the first name is always answered,
        unless its file has too many blocks (INVALID naming it: read it with GetBlocks).
        ``light``: WouldBlock rather than take more than about LIGHT_SLICE."""
        if len(req.names) > MAX_LOOKUP_MANY:
            _LOOKUP_LIMITED["names"].inc()
            raise invalid("names", f"{len(req.names)} names, at most {MAX_LOOKUP_MANY}")
        if light and len(req.names) > LIGHT_NAMES:
            raise WouldBlock()
        names = [check_name(n, f"names[{i}]") for i, n in enumerate(req.names)]
        reply = master_pb2.LookupManyReply()
        wids: set[int] = set()
        budget = self.lookup_reply_max
        size = nblocks = 0
        started = time.perf_counter()
        with self.store.read() as txn:
            self.ns.directory(txn, check_ino(req.parent, "parent"))
            for i, name in enumerate(names):
                if light and time.perf_counter() - started > LIGHT_SLICE:
                    raise WouldBlock()
                ino = self.store.lookup(txn, req.parent, name)
                node = self.store.get_inode(txn, ino) if ino is not None else None
                if node is None:
                    reply.results.add()
                    size += 2
                    continue
                blocks = ()
                cost = node.ByteSize() + 8
                if req.with_blocks and node.type == FILE and node.state == common_pb2.COMPLETE:
                    raw = self.store.blocks_bytes(txn, node.ino)
                    if light and len(raw) > LIGHT_BLOCK_BYTES:
                        raise WouldBlock()
                    blocks = common_pb2.BlockList.FromString(raw).blocks
                    cost += len(raw) + TOKEN_COST * len(blocks)
                    if len(blocks) > LOOKUP_FILE_BLOCKS:
                        if i == 0:
                            _LOOKUP_LIMITED["file_blocks"].inc()
                            raise invalid(f"names[{i}]", f"{len(blocks)} blocks, more than a "
                                          f"LookupMany result carries ({LOOKUP_FILE_BLOCKS}); "
                                          "read them with GetBlocks")
                        _LOOKUP_LIMITED["file_blocks"].inc()
                        break
                    if i and nblocks + len(blocks) > LOOKUP_REPLY_BLOCKS:
                        _LOOKUP_LIMITED["reply_blocks"].inc()
                        break
                if i and size + cost > budget:
                    _LOOKUP_LIMITED["reply_bytes"].inc()
                    break
                size += cost
                nblocks += len(blocks)
                result = reply.results.add()
                result.inode.CopyFrom(node)
                for b in blocks:
                    if b.block_id:
                        b.token = block_tokens.mint(self.block_key, b.block_id,
                                                    block_tokens.READ)
                        wids.update(b.worker_ids)
                result.blocks.extend(blocks)
        reply.workers.extend(self._known_workers(wids))
        return reply

    # ------------------------------------------------------------------ namespace writes
    @mutation
    def mkdir(self, req) -> master_pb2.InodeReply:
        check_ino(req.parent, "parent")
        since = self.leases.snapshot()
        value = yield Submit(lambda t: self.ns.plan_mkdir(t, req), req.request_id, req.session)
        reply = self._inode_reply(value, req.session, since, (req.parent, req.name))
        if req.session and not isinstance(value, RetryHit):  # (a retry's may not be empty)
            reply.listing_lease_ms = self.leases.grant_listing(req.session, since,
                                                               reply.inode.ino)
        return reply

    @mutation
    def create(self, req) -> master_pb2.InodeReply:
        check_ino(req.parent, "parent")
        since = self.leases.snapshot()
        value = yield Submit(lambda t: self.ns.plan_create(t, req), req.request_id, req.session)
        reply = self._inode_reply(value, req.session, since, (req.parent, req.name))
        self.capacity.on_create(reply.inode, req.session)
        if req.block_host_id:
            self._first_block(reply, req.block_host_id)
        return reply

    def _first_block(self, reply: master_pb2.InodeReply, host_id: str) -> None:
        """The block a Create for writing carries (CreateRequest.block_host_id): placed
        as the file's AddBlock would place it, when that needs no waiting (on the call
        port's loop thread too); else none, and the writer asks AddBlock later."""
        if reply.inode.type != FILE:
            return
        try:
            reply.block.CopyFrom(self.add_block(master_pb2.AddBlockRequest(
                ino=reply.inode.ino, client_host_id=host_id), wait=False))
            self.registry.unsized(reply.block.block_id,
                                  [w.worker_id for w in reply.block.workers])
        except WouldBlock:
            pass
        except CurvineError as e:  # e.g. no live worker: the writer's AddBlock says so
            log.debug("no first block for inode %d: %s", reply.inode.ino, e)

    @mutation
    def unlink(self, req, rmdir: bool) -> master_pb2.ParentReply:
        check_ino(req.parent, "parent")

        def plan(txn):
            return self.ns.plan_unlink(txn, req if rmdir else self._with_recorded_opens(req),
                                       rmdir)

        value = yield Submit(plan, req.request_id, req.session)
        reply = self._parents_reply(req.parent)
        reply.held = _held(value)
        return reply

    @mutation
    def rename(self, req) -> master_pb2.ParentReply:
        check_ino(req.parent, "parent")
        check_ino(req.new_parent, "new_parent")
        value = yield Submit(lambda t: self.ns.plan_rename(t, self._with_recorded_opens(req)),
                             req.request_id, req.session)
        reply = self._parents_reply(req.parent,
                                    req.new_parent if req.new_parent != req.parent else 0,
                                    (req.new_parent, req.new_name))
        reply.held = _held(value)
        return reply

    def _with_recorded_opens(self, req):
        """``req`` (an unlink or rename, in its plan) with the files its session has
        recorded opens of (GetBlocks) among its open_inos: an open whose handle the
        mount had not made yet when it sent the request keeps the file all the same."""
        if req.session:
            listed = set(req.open_inos)
            req.open_inos.extend(sorted(self.opens.opened_by(req.session) - listed))
        return req

    @mutation
    def symlink(self, req: master_pb2.SymlinkRequest) -> master_pb2.InodeReply:
        check_ino(req.parent, "parent")
        since = self.leases.snapshot()
        value = yield Submit(lambda t: self.ns.plan_symlink(t, req), req.request_id,
                             req.session)
        return self._inode_reply(value, req.session, since, (req.parent, req.name))

    @mutation
    def make_node(self, req: master_pb2.MakeNodeRequest) -> master_pb2.InodeReply:
        check_ino(req.parent, "parent")
        since = self.leases.snapshot()
        value = yield Submit(lambda t: self.ns.plan_make_node(t, req), req.request_id,
                             req.session)
        return self._inode_reply(value, req.session, since, (req.parent, req.name))

    @mutation
    def link(self, req: master_pb2.LinkRequest) -> master_pb2.InodeReply:
        check_ino(req.ino)
        check_ino(req.new_parent, "new_parent")
        value = yield Submit(lambda t: self.ns.plan_link(t, req), req.request_id, req.session)
        # the inode is read after the link (whose own revocation of its attributes would
        # deny a lease snapshotted before it): the lease covers this read
        since = self.leases.snapshot()
        node = self.getattr(result_ino(value, req.ino))
        return self._inode_reply(node, req.session, since, (req.new_parent, req.new_name))

    @mutation
    def release_inode(self, req: master_pb2.ReleaseInodeRequest) -> common_pb2.Empty:
        """The mount's last descriptor of an unlinked file it keeps closed: remove it
        now (anything else: nothing).  Idempotent, so a retry needs no retry cache."""
        check_ino(req.ino)
        if (yield Submit(lambda t: self.ns.plan_release(t, req.ino), req.request_id,
                         req.session)) is True:
            self.capacity.on_released(req.ino)
        return common_pb2.Empty()

    # -- extended attributes (reads like GetAttr: one read transaction)
    def get_xattr(self, req: master_pb2.GetXattrRequest) -> master_pb2.GetXattrReply:
        with self.store.read() as txn:
            return master_pb2.GetXattrReply(value=self.ns.get_xattr(txn, req.ino, req.name))

    def list_xattr(self, req: master_pb2.ListXattrRequest) -> master_pb2.ListXattrReply:
        with self.store.read() as txn:
            return master_pb2.ListXattrReply(names=self.ns.list_xattr(txn, req.ino))

    @mutation
    def set_xattr(self, req: master_pb2.SetXattrRequest) -> master_pb2.InodeReply:
        check_ino(req.ino)
        value = yield Submit(lambda t: self.ns.plan_set_xattr(t, req), req.request_id,
                             req.session)
        return master_pb2.InodeReply(inode=self.getattr(result_ino(value, req.ino)))

    @mutation
    def remove_xattr(self, req: master_pb2.RemoveXattrRequest) -> master_pb2.InodeReply:
        check_ino(req.ino)
        value = yield Submit(lambda t: self.ns.plan_remove_xattr(t, req), req.request_id,
                             req.session)
        return master_pb2.InodeReply(inode=self.getattr(result_ino(value, req.ino)))

    @mutation
    def setattr(self, req) -> master_pb2.InodeReply:
        check_ino(req.ino)
        value = yield Submit(lambda t: self.ns.plan_setattr(t, req), req.request_id,
                             req.session)
        # no lease: the caller's kernel takes these attributes for fuse.attr_timeout
        return master_pb2.InodeReply(inode=self.getattr(result_ino(value, req.ino)))

    @mutation
    def complete(self, req) -> master_pb2.InodeReply:
        check_ino(req.ino)
        # A block no version holds yet must have been allocated to this file: by AddBlock
        # of this master run (``self.pending`` says for which inode), or, from before a
        # restart, proven by the write token AddBlock gave with it.
        pending = self.pending.owners(b.block_id for b in req.blocks)
        granted = {b.block_id for b in req.blocks if b.block_id not in pending and b.token
                   and block_tokens.allows(self.block_key, b.block_id, b.token,
                                           block_tokens.WRITE)}

        # Blocks another writer's version dropped while this writer had the file open:
        # kept for it (OpenFiles.hold, settle), so it may publish them again.
        if req.open_id and req.session:
            self.opens.note_open(req.ino, req.session, req.open_id, write=True)
        claimed: dict = {}

        def allocated_here(block_id: int) -> bool:  # (in the plan: the committer thread)
            owner = pending.get(block_id)
            if owner is not None:
                return owner == req.ino
            return block_id in granted or self.opens.claim(req.ino, block_id, claimed)

        def freed(block_id: int) -> bool:
            # neither in a file nor pending: freed since this writer read it
            return block_id not in pending

        for b in req.blocks:
            b.ClearField("token")  # a client sends back blocks it got: tokens are never stored
        try:
            value = yield Submit(lambda t: self.ns.plan_complete(t, req, self._reserved,
                                                                 allocated_here, freed),
                                 req.request_id, req.session)
        except CurvineError as e:
            self.opens.unclaim(req.ino, claimed)
            if e.kind == ErrorKind.NOT_FOUND:
                self.pending.free(b.block_id for b in req.blocks)
            raise
        if req.abandoned_block_ids:
            self.pending.free_abandoned(req.ino, req.abandoned_block_ids)
        self.registry.published(req.blocks)  # placed before its length was known
        node = self.getattr(result_ino(value, req.ino))
        self.replication.hint_completed(req.blocks, node)
        self.capacity.on_complete(node)
        return master_pb2.InodeReply(inode=node)

    def _granted_to_puts(self, blocks) -> set[int]:
        """The ids among ``blocks`` that a put may publish: each came with the write
        token AddBlock (or AddBlocksForPut) handed out for it, and is not pending for a
        file being written: proof that the caller allocated it (block ids are
        sequential; an id alone proves nothing).  Tokens are cleared: never stored."""
        owners = self.pending.owners(b.block_id for b in blocks)
        just_started = time.monotonic() - self.started < PUT_BLOCK_TTL
        granted = {b.block_id for b in blocks
                   if b.block_id and owners.get(b.block_id, 0 if just_started else None) == 0
                   and b.token and block_tokens.allows(self.block_key, b.block_id, b.token,
                                                       block_tokens.WRITE)}
        for b in blocks:
            b.ClearField("token")
        return granted

    @mutation
    def put_file(self, req: master_pb2.PutFileRequest) -> master_pb2.PutFileReply:
        """A whole file under its final name in one journaled step (PutFileRequest)."""
        check_ino(req.parent, "parent")
        granted = self._granted_to_puts(req.blocks)
        try:
            value = yield Submit(lambda t: self.ns.plan_put(t, req, self._reserved,
                                                            granted.__contains__),
                                 req.request_id, req.session)
        except CurvineError:
            self.pending.free(granted)
            raise
        if isinstance(value, RetryHit):  # this request was applied before: its file
            return master_pb2.PutFileReply(inode=self.getattr(value.ino))
        existed, node = value
        if existed:
            self.pending.free(granted)  # another writer stored this name first
            return master_pb2.PutFileReply(inode=node, existed=True)
        self.replication.hint_completed(req.blocks, node)
        self.capacity.on_complete(node)
        return master_pb2.PutFileReply(inode=node)

    @mutation
    def put_files(self, req: master_pb2.PutFilesRequest) -> master_pb2.PutFilesReply:
        """Many whole files of one directory in ONE journal record (PutFilesRequest):
        each file stored whole or left out with its reason; the blocks of every file
        not stored, and the ``abandoned`` ones, are freed once the record is durable."""
        check_ino(req.parent, "parent")
        if len(req.files) > MAX_LOOKUP_MANY:
            raise invalid("files", f"more than {MAX_LOOKUP_MANY}")
        granted = self._granted_to_puts([b for f in req.files for b in f.blocks])
        missing = {i for i, f in enumerate(req.files)
                   if any(b.block_id not in granted for b in f.blocks)}
        # abandoned blocks with their tokens: only a put's pending blocks can go
        abandoned = self._granted_to_puts(req.abandoned)
        try:
            value = yield Submit(lambda t: self.ns.plan_put_many(
                t, req, self._reserved, granted.__contains__, missing), b"", req.session)
        except CurvineError:
            self.pending.free(granted | abandoned)
            raise
        reply = master_pb2.PutFilesReply()
        unclaimed = set(abandoned)
        for f, (status, node, why) in zip(req.files, value):
            r = reply.results.add(status=status, error=why)
            if node is not None:
                r.inode.CopyFrom(node)
            if status != master_pb2.PUT_STORED:
                unclaimed.update(b.block_id for b in f.blocks if b.block_id in granted)
            elif f.blocks:
                self.replication.hint_completed(f.blocks, node)
        # (blocks stored by this record left ``pending`` when it was applied)
        self.pending.free(unclaimed)
        self.capacity.on_complete_many([r.inode for r in reply.results
                                        if r.status == master_pb2.PUT_STORED and r.inode.ino])
        return reply

    # ------------------------------------------------------------------ blocks
    def add_block(self, req: master_pb2.AddBlockRequest,
                  wait: bool = True) -> master_pb2.AddBlockReply:
        """A new block for ``req.ino`` (or a put) and its workers.  ``wait`` False:
        raise WouldBlock instead of waiting, for the call port's loop thread, when the
        block id needs a journal record or no worker has room (eviction)."""
        if req.ino == 0 and req.put_parent:  # for PutFile: no inode yet
            with self.store.read() as txn:
                node = self.ns.directory(txn, check_ino(req.put_parent, "put_parent"))
                ino = self.store.lookup(txn, node.ino, check_name(req.put_name, "put_name"))
                existing = self.store.get_inode(txn, ino) if ino is not None else None
            if existing is not None:
                return master_pb2.AddBlockReply(existing=existing)
            owner = 0
        else:
            node = self.getattr(req.ino)
            if node.type != FILE:
                raise not_a_file(node)
            owner = node.ino
        if req.size_hint > self.block_size:
            raise invalid("size_hint", f"larger than the block size {self.block_size}")
        replicas = node.replicas or self.cfg.cluster.replicas
        size = req.size_hint or self.block_size
        block_id = self._allocate_block_ids(1, wait)
        workers = self._place(block_id, owner, replicas, req.client_host_id, size,
                              set(req.exclude_workers), wait)
        self.capacity.on_add_block(owner)
        token = block_tokens.mint(self.block_key, block_id, block_tokens.WRITE,
                                  [w.worker_id for w in workers])
        return master_pb2.AddBlockReply(block_id=block_id, workers=workers, block_token=token)

    def add_blocks_for_put(self, req: master_pb2.AddBlocksForPutRequest,
                           wait: bool = True) -> master_pb2.AddBlocksForPutReply:
        """The blocks of many puts into one directory (AddBlocksForPutRequest): placed
        and granted as AddBlock's put form does for each, pending (owner 0) until
        PutFiles claims them.  ``wait`` False (the call port's loop thread): WouldBlock,
        before any block is left pending, when block ids need a journal record, some
        block finds no room, or the call is past the cheap form's LIGHT_NAMES names or
        blocks (a prompt is 8 to 64 chunks of one block)."""
        names, sizes = req.names, req.sizes
        if len(names) > MAX_LOOKUP_MANY:
            raise invalid("names", f"more than {MAX_LOOKUP_MANY}")
        if len(sizes) != len(names):
            raise invalid("sizes", f"{len(sizes)} sizes for {len(names)} names")
        if not wait and len(names) > LIGHT_NAMES:
            raise WouldBlock()
        bs = self.block_size
        for i, size in enumerate(sizes):
            check_file_size(size, bs, f"sizes[{i}]")
        reply = master_pb2.AddBlocksForPutReply()
        with self.store.read() as txn:
            node = self.ns.directory(txn, check_ino(req.parent, "parent"))
            for i, name in enumerate(names):
                ino = self.store.lookup(txn, node.ino, check_name(name, f"names[{i}]"))
                existing = self.store.get_inode(txn, ino) if ino is not None else None
                r = reply.results.add()
                if existing is not None:
                    r.existing.CopyFrom(existing)
        new = [i for i, r in enumerate(reply.results) if not r.HasField("existing")]
        count = sum(-(-sizes[i] // bs) for i in new)
        if count > LOOKUP_REPLY_BLOCKS:
            raise invalid("sizes", f"{count} blocks, more than {LOOKUP_REPLY_BLOCKS} in one call")
        if not count:
            return reply
        if not wait and count > LIGHT_NAMES:
            raise WouldBlock()
        replicas = node.replicas or self.cfg.cluster.replicas
        block_id = self._allocate_block_ids(count, wait)
        wids: set[int] = set()
        placed: list[int] = []
        try:
            for i in new:
                grants = reply.results[i].blocks
                for start in range(0, sizes[i], bs):
                    length = min(bs, sizes[i] - start)
                    workers = self._place(block_id, 0, replicas, req.client_host_id, length,
                                          set(), wait)
                    placed.append(block_id)
                    ids = [w.worker_id for w in workers]
                    wids.update(ids)
                    grants.add(block_id=block_id, length=length, worker_ids=ids,
                               block_token=block_tokens.mint(self.block_key, block_id,
                                                             block_tokens.WRITE, ids))
                    block_id += 1
        except BaseException:
            self.pending.free(placed)  # nothing granted: nothing left pending
            raise
        self.capacity.on_add_block(0)
        reply.workers.extend(self.registry.for_readers(wids))
        return reply

    def _place(self, block_id: int, owner: int, replicas: int, host_id: str, size: int,
               exclude: set[int], wait: bool) -> list[common_pb2.WorkerInfo]:
        """Place ``block_id`` (``size`` bytes reserved) on its workers and record it
        pending for inode ``owner`` (0: a put's, freed by Capacity if no PutFile claims
        it in time).  No room: WouldBlock (``wait`` False), else evict and place."""

        def place():
            return self.registry.choose(replicas, host_id, size, exclude, block_id)

        workers = place()
        if not workers and not wait:
            raise WouldBlock()
        if not workers:
            if not self.registry.alive_ids():
                raise CurvineError(ErrorKind.UNAVAILABLE, "no live workers")
            # No room: evict synchronously, leaving the reply time to reach the client.
            deadline = time.monotonic() + 0.8 * float(self.cfg.cluster.rpc_timeout)
            workers = self.capacity.make_room(place, size, exclude, deadline)
        self.pending.add(block_id, owner, [w.worker_id for w in workers], size)
        return workers

    def _allocate_block_ids(self, count: int, wait: bool = True) -> int:
        """``count`` consecutive new block ids; the first."""
        with self._alloc_lock:
            if self._next_block + count > self._reserved:
                if not wait:
                    raise WouldBlock()
                upto = max(self._reserved, self._next_block) + max(BLOCK_ID_CHUNK, count)
                self._reserved = self.submit(
                    lambda txn: self.ns.plan_reserve_block_ids(txn, upto))
            block_id = self._next_block
            self._next_block += count
            return block_id

    # ------------------------------------------------------------------ workers
    def register_worker(self, info: common_pb2.WorkerInfo,
                        secret: bytes = b"") -> master_pb2.RegisterWorkerReply:
        """Register (or re-register) the worker named by ``info.uuid``.  The first
        registration of a uuid with a ``secret`` binds it: later ones must carry the same
        secret (PERMISSION_DENIED otherwise), so no other holder of the worker credential
        can take over a registered worker's identity."""
        if not info.uuid or len(info.uuid) > 64:
            raise invalid("worker.uuid", "required, at most 64 characters")
        if not info.address or len(info.address) > 255 or ":" not in info.address:
            raise invalid("worker.address", "must be host:port")
        if info.data_address and (len(info.data_address) > 255 or ":" not in info.data_address):
            raise invalid("worker.data_address", "must be host:port (or empty)")
        if len(secret) > 64:
            raise invalid("secret", "at most 64 bytes")
        digest = hashlib.sha256(secret).digest() if secret else b""
        known = self.registry.by_uuid(info.uuid)
        wid = known.worker_id if known is not None else 0
        bound = self.registry.secret_digest(wid) if known is not None else b""
        if bound and not hmac.compare_digest(bound, digest):
            log.warning("refused a registration as worker %d (uuid %s) from %s: wrong "
                        "secret", wid, info.uuid, info.address)
            raise CurvineError(ErrorKind.PERMISSION,
                               f"worker.uuid: {info.uuid} is registered to another worker "
                               "(its secret differs); a worker with new data dirs needs a "
                               "new uuid")
        record = common_pb2.WorkerInfo(worker_id=wid, uuid=info.uuid, host_id=info.host_id,
                                       address=info.address, data_dirs=info.data_dirs,
                                       secret_digest=bound or digest,
                                       data_address=info.data_address)
        if known is None or (known.address, known.host_id, list(known.data_dirs),
                             known.data_address) != (
                info.address, info.host_id, list(info.data_dirs), info.data_address) or (
                digest and not bound):
            wid = self.submit(lambda txn: self.ns.plan_register_worker(txn, record))
            log.info("worker %d registered: %s (host %s)", wid, info.address, info.host_id)
        # read before the answer, so before the worker lists its blocks for the report
        with self.store.read() as txn:
            located = frozenset(self.store.blocks_on_worker(txn, wid))
        registration = self.registry.registered(wid, info.capacity, info.used, info.volumes,
                                                located)
        return master_pb2.RegisterWorkerReply(worker_id=wid, block_size=self.block_size,
                                              block_key=self.block_key,
                                              registration=registration)

    def block_report(self, req: master_pb2.BlockReportRequest) -> master_pb2.BlockReportReply:
        if not self.registry.known(req.worker_id):
            raise CurvineError(ErrorKind.NOT_FOUND, f"worker_id: {req.worker_id} is not registered")

        if req.block_mtimes_ns and len(req.block_mtimes_ns) != len(req.block_ids):
            raise invalid("block_mtimes_ns", "must be parallel to block_ids")
        reported = set(req.block_ids)
        wid = req.worker_id
        now = time.time_ns()
        grace_ns = int(float(self.cfg.master.orphan_block_grace) * 1e9)
        deletes = []
        # only blocks located there before the worker listed them: one finished and
        # published while the report was in flight is kept
        basis = self.registry.take_report_basis(wid)
        with self.store.read() as txn:
            missing = [b for b in self.store.blocks_on_worker(txn, wid)
                       if b in basis and b not in reported]
            for i, b in enumerate(req.block_ids):
                if self.store.block_owner(txn, b) is not None or b in self.pending:
                    continue
                mtime = req.block_mtimes_ns[i] if req.block_mtimes_ns else 0
                if b >= self._reserved or now - mtime > grace_ns:
                    deletes.append(b)
        if missing:
            log.warning("worker %d did not report %d blocks the master expected there; "
                        "dropping those locations (%s)", wid, len(missing),
                        ", ".join(f"{b:016x}" for b in missing[:8])
                        + (", ..." if len(missing) > 8 else ""))
            self.submit(lambda txn: self.ns.plan_drop_locations(txn, wid, missing))
            self.replication.hint(missing)  # the other replicas may need a copy
        if deletes:
            log.info("worker %d holds %d blocks no file uses; asking it to delete them",
                     wid, len(deletes))
        self.replication.on_block_report(req)
        return master_pb2.BlockReportReply(delete_block_ids=deletes)

    def heartbeat(self, req: master_pb2.HeartbeatRequest) -> master_pb2.HeartbeatReply:
        deletes = self.registry.heartbeat(req.worker_id, req.capacity, req.used, req.num_blocks,
                                          req.added_block_ids, req.removed_block_ids,
                                          req.failed_block_ids, req.changes_lost,
                                          volumes=req.volumes)
        if deletes is None:
            return master_pb2.HeartbeatReply(reregister=True)
        reply = master_pb2.HeartbeatReply(delete_block_ids=deletes)
        self.replication.on_heartbeat(req, reply)
        return reply

    # ------------------------------------------------------------------ capacity
    def report_access(self, req: master_pb2.ReportAccessRequest) -> None:
        self.capacity.report_access(req.inos, req.session, req.closed_opens)
        if req.bad_copies:
            self.replication.verify_copies([(c.block_id, c.worker_id)
                                            for c in req.bad_copies])

    def set_policy(self, req: master_pb2.SetPolicyRequest) -> master_pb2.InodeReply:
        check_ino(req.ino)
        value = self.submit(lambda t: self.ns.plan_set_policy(t, req), req.request_id,
                            session=req.session)
        node = self.getattr(result_ino(value, req.ino))
        self.capacity.on_policy(node)
        return master_pb2.InodeReply(inode=node)

    def capacity_status(self) -> master_pb2.CapacityStatusReply:
        return self.capacity.status()
