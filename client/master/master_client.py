"""Typed client of the master's metadata service.

Every method is synchronous (call it from a thread when you are in an event loop)
and raises ``CurvineError``.  Each mutating call generates one request id and
reuses it for all of its retries, so a retry after a lost reply returns the first
result from the master's retry cache instead of e.g. EEXIST.

A FUSE mount also runs a :class:`LeaseSession` (master/cluster/leases.py): while it is up,
``MasterClient.session`` is set, the ``*_leased`` reads return how long their
answer may be cached, and mutations name the session so that the master does not
wait for this mount to drop what it changed itself.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Iterable, Sequence

import grpc

from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import new_request_id
from curvine.common import master_group
from curvine.common.rpc import RETRY_MAX
from curvine.common.security import Security
from curvine.proto import common_pb2, master_pb2, master_pb2_grpc

from .call_port_blocking import MAX_CONNECTIONS as CALL_PORT_CONNECTIONS, for_security
from .requests import LISTDIR_PAGE, Prepared, Requests
from .route import Route

Inode = common_pb2.Inode
Block = common_pb2.Block
WorkerInfo = common_pb2.WorkerInfo
PORT_RECHECK = 30.0  # seconds before asking again a master that had no call port

log = logging.getLogger(__name__)


class MasterClient:
    """The master's namespace and block API, one method per RPC.

    ``security``: the credentials of its channel (common/security.py); objects built
    from this client (writers, readers) use ``.security`` for their own channels."""

    def __init__(self, address: str | Sequence[str], timeout: float = 30.0,
                 wait: float = 60.0, *, security: Security, call_port: bool = False,
                 call_port_connections: int = CALL_PORT_CONNECTIONS,
                 read_from: Sequence[str] = ()):
        self.security = security
        self.timeout = timeout
        # one master, or every master of a group (config.master_addrs): its calls follow
        # the leader (common/master_group.py)
        self._rpc = master_group.master_rpc(
            [address] if isinstance(address, str) else list(address),
            master_pb2_grpc.MasterStub, security=security, timeout=timeout, wait=wait)
        self._port_moves = 0  # master_group.moves() when the call port was learned
        self.requests = Requests()  # they name the lease session (``session``)
        self.route = Route(self.unary, self._learn_call_port)
        # ``call_port``: namespace calls on the master's call port when it has one
        # (client/master/call_port_blocking.py; learned from StatFs at the first call, then
        # the route's thread_port), else unary
        self._port_checked = 0.0 if call_port else None  # monotonic time of the last StatFs
        self._port_lock = threading.Lock()
        # calls in flight on the port at once: as many as the caller's threads that call
        # (a call past them goes as a unary RPC, which costs both sides several times more)
        self._port_connections = call_port_connections
        # a master group: the member this client's unleased reads go to first
        # (config.read_members; client/master/route.py), with its own call port
        member = self._read_member(list(read_from))
        self.reader = (MasterClient(member, timeout, 0, security=security,
                                    call_port=call_port,
                                    call_port_connections=call_port_connections)
                       if member else None)
        if self.reader is not None:
            self.route.reads = self.read

    @property
    def address(self) -> str:
        """The master its calls go to now (of a group: the leader once a call found it)."""
        return self._rpc.address

    def _call(self, method: str, request):
        # Reads are naturally idempotent; mutations carry a request id that the
        # master's retry cache recognises, so every call may be retried.
        return self._rpc.call(method, request, idempotent=True)

    @property
    def session(self) -> int:
        """The lease session id while a LeaseSession is up (0 = none)."""
        return self.requests.session

    @session.setter
    def session(self, session: int) -> None:
        self.requests.session = session

    def call(self, prepared: Prepared, timeout: float | None = None,
             wait: float | None = None):
        """Run a call of ``self.requests`` on the route (client/master/route.py); its
        converted result.  ``timeout`` covers the whole route."""
        return prepared.convert(self.route.call_blocking(prepared, timeout, wait))

    def _read_member(self, candidates: list[str]) -> str | None:
        """The member to read from: the one named, else a standby (the group as any
        member tells it, asked once without waiting), one by process id so that a
        node's clients spread over the standbys; any member if none answers."""
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        try:
            group = self._rpc.call("GetGroup", master_pb2.GetGroupRequest(),
                                   timeout=min(self.timeout, 2.0), wait=0)
            standbys = [a for a in candidates if a != group.leader]
        except CurvineError as e:
            log.debug("no member told the group (%s): reading from any", e)
            standbys = []
        pool = standbys or candidates
        return pool[os.getpid() % len(pool)]

    def read(self, prepared: Prepared, timeout: float | None) -> Any:
        """The reply of a spreadable read from the group member this client reads from
        (``reader``): its call port, else its unary RPC, never waiting for it."""
        return self.reader.route.call_blocking(prepared, timeout, 0)

    def unary(self, prepared: Prepared, timeout: float | None, wait: float | None):
        """The reply of ``prepared`` as its unary RPC (the last carrier of a route)."""
        return self._rpc.call(prepared.method, prepared.request, idempotent=True,
                              timeout=timeout, wait=wait)

    def _learn_call_port(self, route: Route, timeout: float | None, wait: float | None
                         ) -> None:
        """Put the call port on the route once StatFs named one (asked with the caller's
        deadline and wait: a connector that must not wait for a master that is down does
        not)."""
        if self._port_checked is None:
            return
        if route.thread_port is not None and master_group.moves(self._rpc) != self._port_moves:
            # the calls moved to another master of the group: its port, not this one
            with self._port_lock:
                port, route.thread_port = route.thread_port, None
                self._port_checked = 0.0
            if port is not None:
                port.close()
        if route.thread_port is not None:
            return
        now = time.monotonic()
        if self._port_checked and now - self._port_checked < PORT_RECHECK:
            return
        with self._port_lock:
            if route.thread_port is None and now - self._port_checked >= PORT_RECHECK:
                self._port_checked = now
                try:
                    number = self._rpc.call("StatFs", master_pb2.StatFsRequest(),
                                            timeout=timeout, wait=wait).call_port
                except CurvineError as e:
                    log.debug("asking the master for its call port: %s", e)
                    return
                self._port_moves = master_group.moves(self._rpc)
                if number:
                    host = self.address.rpartition(":")[0].strip("[]")
                    route.thread_port = for_security(host, number, self.security,
                                                     self.timeout, self._port_connections)

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
        return self.call(self.requests.lookup_unleased(parent, name), timeout)

    def getattr(self, ino: int, timeout: float | None = None) -> Inode:
        return self.call(self.requests.getattr_unleased(ino), timeout)

    def setattr(self, ino: int, **fields) -> Inode:
        """Change mode, uid, gid, size (truncate/extend), atime_ns, mtime_ns."""
        return self.call(self.requests.setattr(ino, **fields))

    def mkdir(self, parent: int, name: bytes, mode: int = 0o755, uid: int = 0, gid: int = 0,
              timeout: float | None = None) -> Inode:
        return self.call(self.requests.mkdir(parent, name, mode, uid, gid), timeout)[0]

    def mkdir_leased(self, parent: int, name: bytes, mode: int = 0o755, uid: int = 0,
                     gid: int = 0) -> tuple[Inode, int, Inode | None]:
        """(new directory, lease ms, the parent's attributes after the change)"""
        return self.call(self.requests.mkdir(parent, name, mode, uid, gid))

    def create(self, parent: int, name: bytes, mode: int = 0o644, uid: int = 0, gid: int = 0,
               exclusive: bool = False) -> Inode:
        return self.create_leased(parent, name, mode, uid, gid, exclusive)[0]

    def create_leased(self, parent: int, name: bytes, mode: int = 0o644, uid: int = 0,
                      gid: int = 0, exclusive: bool = False) -> tuple[Inode, int, Inode | None]:
        """(the file, lease ms, the parent's attributes after the change)"""
        return self.call(self.requests.create(parent, name, mode, uid, gid, exclusive))

    def unlink(self, parent: int, name: bytes) -> Inode | None:
        """Returns the parent's attributes after the change."""
        return self.call(self.requests.unlink(parent, name))[0]

    def rmdir(self, parent: int, name: bytes) -> Inode | None:
        return self.call(self.requests.rmdir(parent, name))

    def rename(self, parent: int, name: bytes, new_parent: int, new_name: bytes,
               no_replace: bool = False, source_ino: int = 0,
               require_published: bool = False, writer_inos: Sequence[int] = ()
               ) -> tuple[Inode | None, Inode | None, Inode | None]:
        """Returns both directories' attributes after the change (the second None when
        they are the same directory) and the moved inode's."""
        return self.call(self.requests.rename(parent, name, new_parent, new_name, no_replace,
                                           source_ino, require_published, writer_inos))[:3]

    def symlink(self, parent: int, name: bytes, target: bytes, uid: int = 0, gid: int = 0
                ) -> tuple[Inode, int, Inode | None]:
        """(the symlink, lease ms, the parent after the change)"""
        return self.call(self.requests.symlink(parent, name, target, uid, gid))

    def make_node(self, parent: int, name: bytes, type: int, mode: int, rdev: int = 0,
                  uid: int = 0, gid: int = 0) -> tuple[Inode, int, Inode | None]:
        """(the special file, lease ms, the parent after the change)"""
        return self.call(self.requests.make_node(parent, name, type, mode, rdev, uid, gid))

    def link(self, ino: int, new_parent: int, new_name: bytes
             ) -> tuple[Inode, int, Inode | None]:
        """(the inode with its new nlink, lease ms, the new parent after the change)"""
        return self.call(self.requests.link(ino, new_parent, new_name))

    def release_inode(self, ino: int) -> None:
        """This mount's last descriptor of ``ino`` (kept unlinked: a held ino) closed."""
        return self.call(self.requests.release_inode(ino))

    def set_xattr(self, ino: int, name: bytes, value: bytes, flags: int = 0) -> Inode:
        return self.call(self.requests.set_xattr(ino, name, value, flags))

    def get_xattr(self, ino: int, name: bytes) -> bytes:
        return self.call(self.requests.get_xattr(ino, name))

    def list_xattr(self, ino: int) -> list[bytes]:
        return self.call(self.requests.list_xattr(ino))

    def remove_xattr(self, ino: int, name: bytes) -> Inode:
        return self.call(self.requests.remove_xattr(ino, name))

    def listdir(self, ino: int, start_after: bytes = b"", limit: int = LISTDIR_PAGE
                ) -> tuple[list[master_pb2.DirEntry], bool]:
        """One page of entries in name order after ``start_after``; (entries, has_more)."""
        return self.call(self.requests.listdir(ino, start_after, limit))

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
        return self.call(self.requests.statfs(), timeout)

    # -- data ----------------------------------------------------------------

    def get_blocks(self, ino: int, session: int = 0, open_id: int = 0, write: bool = False,
                   ) -> tuple[Inode, list[Block], dict[int, WorkerInfo]]:
        """The file's blocks and their workers; with ``session`` and ``open_id`` this is an
        open, recorded until ReportAccess reports it closed (AccessReporter.closed): the
        master keeps these blocks readable, and does not evict the file unless ``write``
        (a writer's open)."""
        return self.call(self.requests.get_blocks(ino, session, open_id, write))

    def add_block(self, ino: int, client_host_id: str, size_hint: int = 0,
                  exclude: Sequence[int] = ()) -> tuple[int, list[WorkerInfo], bytes]:
        """(block id, target workers, write token for the block)."""
        return self.call(self.requests.add_block(ino, client_host_id, size_hint, exclude))

    def complete_file(self, ino: int, blocks: Sequence[Block], size: int,
                      mtime_ns: int = 0, if_unpublished: bool = False,
                      abandoned: Sequence[int] = (), open_id: int = 0) -> Inode:
        """Publish a version; with ``if_unpublished`` only if none was ever published.
        ``abandoned``: blocks this writer was given and dropped (the master frees them);
        ``open_id``: the writer's open (GetBlocks), recorded now if it was not yet."""
        return self.call(self.requests.complete(ino, blocks, size, mtime_ns, if_unpublished,
                                             abandoned, open_id))

    # -- the connector's calls (connector/store.py) ------------------------------

    def lookup_many(self, parent: int, names: Sequence[bytes], with_blocks: bool = True,
                    timeout: float | None = None, wait: float | None = None,
                    ) -> master_pb2.LookupManyReply:
        """Every name of ``names`` in ``parent`` in one round trip (results parallel to
        names; a miss has no inode); with ``with_blocks`` complete files' blocks with read
        tokens and their workers."""
        return self.call(self.requests.lookup_many(parent, names, with_blocks), timeout, wait)

    def add_block_for_put(self, parent: int, name: bytes, client_host_id: str,
                          size_hint: int = 0, exclude: Sequence[int] = (),
                          timeout: float | None = None, wait: float | None = None,
                          ) -> master_pb2.AddBlockReply:
        """A block for PutFile of ``name`` into ``parent``; ``reply.existing`` set (and
        no block) if the name exists already."""
        return self.call(self.requests.add_block_for_put(parent, name, client_host_id,
                                                         size_hint, exclude), timeout, wait)

    def put_file(self, parent: int, name: bytes, blocks: Sequence[Block], size: int,
                 mode: int = 0o644, uid: int = 0, gid: int = 0, mtime_ns: int = 0,
                 timeout: float | None = None, wait: float | None = None,
                 ) -> tuple[Inode, bool]:
        """Publish a whole new file (blocks with their write tokens) under ``name`` in
        one journaled step: (inode, existed); existed means another writer's file was
        there and nothing changed."""
        return self.call(self.requests.put_file(parent, name, blocks, size, mode, uid, gid,
                                                mtime_ns), timeout, wait)

    def add_blocks_for_put(self, parent: int, names: Sequence[bytes], sizes: Sequence[int],
                           client_host_id: str, timeout: float | None = None,
                           wait: float | None = None) -> master_pb2.AddBlocksForPutReply:
        """The blocks of many puts into ``parent`` in one call: per name (results
        parallel to ``names``) its existing inode, or its blocks (ids, lengths, targets
        and write tokens) for PutFiles; ``reply.workers`` lists the targets."""
        return self.call(self.requests.add_blocks_for_put(parent, names, sizes,
                                                          client_host_id), timeout, wait)

    def put_files(self, parent: int, files: Sequence[master_pb2.PutFileEntry],
                  abandoned: Sequence[Block] = (), timeout: float | None = None,
                  wait: float | None = None) -> list[master_pb2.PutFileResult]:
        """Publish many new files of ``parent`` in one journaled step, each whole or not
        at all: a result per file (PutStatus, inode, why).  ``abandoned``: blocks of
        this caller's reservation it does not publish (with their tokens: freed now)."""
        return self.call(self.requests.put_files(parent, files, abandoned), timeout, wait)

    # -- capacity (master/cluster/capacity.py) ----------------------------------

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

    # -- admin (master/ports/report.py) ----------------------------------------

    def get_group(self, wait: float | None = None) -> master_pb2.GetGroupReply:
        """The master group as a member has it (a single master: itself, as leader)."""
        return self._rpc.call("GetGroup", master_pb2.GetGroupRequest(), wait=wait)

    def report(self) -> master_pb2.ReportReply:
        return self._call("Report", master_pb2.ReportRequest())

    def checkpoint(self, timeout: float = 600.0) -> master_pb2.CheckpointReply:
        """Ask the master to checkpoint now; returns once the checkpoint exists (a
        large namespace takes a while to copy, hence the long deadline)."""
        return self._rpc.call("Checkpoint", master_pb2.CheckpointRequest(), idempotent=True,
                              timeout=timeout)

    def close(self) -> None:
        if self.route.thread_port is not None:
            self.route.thread_port.close()
        if self.reader is not None:
            self.reader.close()
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
            moves = master_group.moves(self.client._rpc)
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
                    # a standby or a master that is down: reopen it on the leader
                    master_group.stream_failed(self.client._rpc, e, moves)
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