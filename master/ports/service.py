"""gRPC servicer of the master: parse the request, call the master, convert the result."""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent import futures

import grpc

from curvine.common.errors import CurvineError, ErrorKind, status_code
from curvine.common.ids import check_ino
from curvine.common import checked_service, metrics
from curvine.common.rpc import abort as rpc_abort, handler, stream_handler
from curvine.journal.checkpoint import checkpoint_chunks, latest_checkpoint
from curvine.common.stream_guard import IdleStreams
from curvine.proto import common_pb2, master_pb2, master_pb2_grpc

from ..master import Master, WouldBlock
from ..meta.steps import StepRunner
from . import report
from .call_port_server import AfterIndex

log = logging.getLogger(__name__)
# Calls of one Calls stream read but whose results the client has not yet taken: past
# this the master stops reading the stream (a client that sends without reading
# cannot grow the master's memory without bound).
MAX_CALLS_IN_FLIGHT = 256
# answered on the stream's reader thread: reads that never wait for a lock or the
# journal (the others go to the call pool, so a slow one holds up no other call)
READ_CALLS = frozenset(("lookup", "getattr", "listdir", "statfs", "get_xattr", "list_xattr",
                        "lookup_many", "get_blocks"))  # get_blocks: records an open in memory
# Reads whose cost depends on the data (a file's blocks, a page of names) are first
# tried in their cheap form (``light``: master.lookup_many, get_blocks; a ListDir page
# of at most LIGHT_LIST names), which refuses (WouldBlock) rather than cost more than a
# few milliseconds: the call port answers those in its loop thread, which every mount
# shares.  The rest run with one of HEAVY_READS slots (gRPC threads and the call
# port's heavy-read threads alike): they cannot take more of the master's CPU, nor
# hold the GIL from the call port's loop for longer, however many clients send them.
HEAVY_READS = 1
LIGHT_LIST = 1000
# Call field -> (the unary RPC it stands for, its CallResult field)
CALL_METHODS = {
    "lookup": ("Lookup", "inode"), "getattr": ("GetAttr", "inode"),
    "create": ("Create", "inode"), "mkdir": ("Mkdir", "inode"),
    "unlink": ("Unlink", "parents"), "rmdir": ("Rmdir", "parents"),
    "rename": ("Rename", "parents"), "complete": ("CompleteFile", "inode"),
    "setattr": ("SetAttr", "inode"), "listdir": ("ListDir", "listdir"),
    "statfs": ("StatFs", "statfs"), "get_blocks": ("GetBlocks", "blocks"),
    "add_block": ("AddBlock", "block"), "symlink": ("Symlink", "inode"),
    "make_node": ("MakeNode", "inode"), "link": ("Link", "inode"),
    "release_inode": ("ReleaseInode", "empty"), "set_xattr": ("SetXattr", "inode"),
    "get_xattr": ("GetXattr", "xattr"), "list_xattr": ("ListXattr", "xattrs"),
    "remove_xattr": ("RemoveXattr", "inode"),
    "lookup_many": ("LookupMany", "lookup_many"), "put_file": ("PutFile", "put_file"),
    "add_blocks_for_put": ("AddBlocksForPut", "put_reservations"),
    "put_files": ("PutFiles", "put_files"),
}


def _always(req) -> bool:
    return True


# What a standby of a master group answers (master/member.py), each after its read
# index: the read-only calls, by RPC name, with what makes this request one.  A
# GetBlocks that records an open (eviction must not take the file from its reader) or
# starts a version goes to the leader, which keeps the opens.  Anything else on a
# standby is NOT_LEADER naming the leader.
STANDBY_READS = {
    "Lookup": _always, "GetAttr": _always, "ListDir": _always, "StatFs": _always,
    "LookupMany": _always, "GetXattr": _always, "ListXattr": _always,
    "GetBlocks": lambda req: not (req.open_id or req.write),
}
# answered by any member as it is, without a read index
# (the Calls stream: each of its calls is admitted as its unary RPC would be)
ANY_MEMBER = frozenset(("GetGroup", "Report", "Calls"))


class MasterServicer(master_pb2_grpc.MasterServicer):
    def __init__(self, master: Master | None, max_sessions: int = 1024, call_threads: int = 64,
                 stream_idle_timeout: float = 0.0, member=None):
        # one master, or the member of a master group whose ``master`` plays its role
        # now (master/member.py): every call asks for it again
        self._master = master
        self.member = member
        self.max_sessions = max_sessions  # also the cap on open Calls streams
        self._calls_open = 0
        self._sessions_starting = 0  # Session streams whose first message is awaited
        self._calls_lock = threading.Lock()
        # Session and Calls streams whose client stops taking replies are cancelled
        self.idle = IdleStreams(stream_idle_timeout, "master")
        # mutations from Calls streams wait for the journal (and revocations) here
        self._call_pool = futures.ThreadPoolExecutor(max_workers=call_threads,
                                                     thread_name_prefix="call")
        self.lookups = report.LookupCounts()  # for the Report RPC
        # run_call_nowait's placements: Call op -> (Master method, its metrics)
        # (by name: the Master that answers may change, self.m)
        self._placements = {op: (method, metrics.MethodMetrics(CALL_METHODS[op][0]))
                            for op, method in (("add_block", Master.add_block),
                                               ("add_blocks_for_put", Master.add_blocks_for_put))}
        # heavy reads (see HEAVY_READS): the slots, and the call port's threads for them
        self._heavy_slots = threading.BoundedSemaphore(HEAVY_READS)
        self.heavy_pool = futures.ThreadPoolExecutor(max_workers=HEAVY_READS,
                                                     thread_name_prefix="heavy-read")
        self._local = threading.local()  # .mode: "light" (the loop) or "heavy" (a slot held)
        self._light = {"lookup_many": self._light_lookup_many,
                       "get_blocks": self._light_get_blocks, "listdir": self._light_listdir}
        self._light_metrics = {op: metrics.MethodMetrics(CALL_METHODS[op][0])
                               for op in self._light}

    @property
    def m(self) -> Master:
        return self._master if self.member is None else self.member.master

    def admit(self, method: str, req, wait: bool = True, indexed: bool = False) -> Master:
        """The Master that answers ``method`` now; NOT_LEADER on a member that cannot
        (master/member.py ``Member.admit``; ``wait`` False: WouldBlock rather than
        wait for a read index; ``indexed``: a read whose index was waited for)."""
        if self.member is None or method in ANY_MEMBER:
            return self.m
        read = STANDBY_READS.get(method)
        return self.member.admit(read is not None and read(req), wait, indexed)

    @handler
    def Lookup(self, req, ctx):
        try:
            reply = self.m.lookup_reply(req)
        except CurvineError as e:
            if e.kind == ErrorKind.NOT_FOUND:
                self.lookups.count(found=False)
            raise
        self.lookups.count(found=reply.HasField("inode"))
        return reply

    @handler
    def GetAttr(self, req, ctx):
        return self.m.getattr_reply(req)

    @handler
    def SetAttr(self, req, ctx):
        return self.m.setattr(req)

    @handler
    def Mkdir(self, req, ctx):
        return self.m.mkdir(req)

    @handler
    def Create(self, req, ctx):
        return self.m.create(req)

    @handler
    def Unlink(self, req, ctx):
        return self.m.unlink(req, rmdir=False)

    @handler
    def Rmdir(self, req, ctx):
        return self.m.unlink(req, rmdir=True)

    @handler
    def Rename(self, req, ctx):
        return self.m.rename(req)

    @handler
    def ListDir(self, req, ctx):
        return self._bounded(lambda: self._light_listdir(req), lambda: self._listdir(req))

    def _listdir(self, req):
        return self.m.listdir(check_ino(req.ino), req.start_after, req.limit, req.session,
                              req.names_only, req.lease_listing)

    def _light_listdir(self, req):
        if req.limit > LIGHT_LIST:
            raise WouldBlock()
        return self._listdir(req)

    @handler
    def StatFs(self, req, ctx):
        return self.m.statfs()

    @handler
    def GetBlocks(self, req, ctx):
        return self._bounded(lambda: self._light_get_blocks(req),
                             lambda: self.m.get_blocks(req.ino, req.session, req.open_id,
                                                       req.write))

    def _light_get_blocks(self, req):
        return self.m.get_blocks(req.ino, req.session, req.open_id, req.write, light=True)

    @handler
    def AddBlock(self, req, ctx):
        return self.m.add_block(req)

    @handler
    def CompleteFile(self, req, ctx):
        return self.m.complete(req)

    @handler
    def LookupMany(self, req, ctx):
        return self._bounded(lambda: self._light_lookup_many(req),
                             lambda: self._counted(self.m.lookup_many(req)))

    def _light_lookup_many(self, req):
        return self._counted(self.m.lookup_many(req, light=True))

    def _counted(self, reply):
        hits = sum(1 for r in reply.results if r.HasField("inode"))
        self.lookups.count_many(found=hits, missed=len(reply.results) - hits)
        return reply

    def _bounded(self, light, heavy):
        """A read whose cost depends on the data: its cheap form if that will do, else
        the whole of it with a heavy-read slot (see HEAVY_READS).  On the call port's
        loop (mode "light") only the cheap form: WouldBlock passes to the port."""
        mode = getattr(self._local, "mode", None)
        if mode == "heavy":  # a heavy-read thread: the slot is held
            return heavy()
        try:
            return light()
        except WouldBlock:
            if mode == "light":
                raise
        with self._heavy_slots:
            return heavy()

    @handler
    def PutFile(self, req, ctx):
        return self.m.put_file(req)

    @handler
    def AddBlocksForPut(self, req, ctx):
        return self.m.add_blocks_for_put(req)

    @handler
    def PutFiles(self, req, ctx):
        return self.m.put_files(req)

    # -- POSIX beyond files and directories (issue 15)
    @handler
    def Symlink(self, req, ctx):
        return self.m.symlink(req)

    @handler
    def MakeNode(self, req, ctx):
        return self.m.make_node(req)

    @handler
    def Link(self, req, ctx):
        return self.m.link(req)

    @handler
    def ReleaseInode(self, req, ctx):
        return self.m.release_inode(req)

    @handler
    def SetXattr(self, req, ctx):
        return self.m.set_xattr(req)

    @handler
    def GetXattr(self, req, ctx):
        return self.m.get_xattr(req)

    @handler
    def ListXattr(self, req, ctx):
        return self.m.list_xattr(req)

    @handler
    def RemoveXattr(self, req, ctx):
        return self.m.remove_xattr(req)

    @handler
    def RegisterWorker(self, req, ctx):
        return self.m.register_worker(req.worker, req.secret)

    # A worker's heartbeats and block reports name its live registration (made with
    # the worker's secret, master.register_worker): another holder of the worker
    # credential can neither keep a worker's entry alive nor drop its locations.
    @handler
    def BlockReport(self, req, ctx):
        if self.m.registry.known(req.worker_id) and not self.m.registry.registration_ok(
                req.worker_id, req.registration):
            raise CurvineError(ErrorKind.PERMISSION,
                               f"registration: not the live registration of worker "
                               f"{req.worker_id}; register first")
        return self.m.block_report(req)

    @handler
    def WorkerHeartbeat(self, req, ctx):
        if not self.m.registry.registration_ok(req.worker_id, req.registration):
            # unknown since the master started, registered again since, or not that
            # worker at all: nothing in it is believed; the worker registers again
            return master_pb2.HeartbeatReply(reregister=True)
        return self.m.heartbeat(req)

    def Session(self, request_iterator, ctx):
        """A mount's lease session: the first event names it, then invalidations; acks
        arrive on the request stream (read by a helper thread)."""
        leases = self.m.leases
        # The slot is taken before the first message is read: a stream that sends
        # nothing counts against max_sessions, and is cancelled after the idle timeout.
        with self._calls_lock:
            full = leases.open_sessions() + self._sessions_starting >= self.max_sessions
            if not full and leases.lease_time > 0:
                self._sessions_starting += 1
        if full or leases.lease_time <= 0:
            yield master_pb2.SessionEvent(session_id=0, lease_ms=0)  # no leases: cache nothing
            return
        try:
            with self.idle.watch(ctx, "Session") as watched:
                try:
                    first = next(request_iterator)
                except (StopIteration, grpc.RpcError):
                    return
                if watched.cancelled:
                    return
            sess = leases.open_session(ctx.peer(), first.dropped)
        finally:
            with self._calls_lock:
                self._sessions_starting -= 1
        self.m.sessions.opened(sess.id, first.dropped)  # writers' liveness
        ctx.add_callback(lambda: self.m.sessions.closed(sess.id))

        def read_acks():
            try:
                for req in request_iterator:
                    if req.ack:
                        sess.ack(req.ack)
            except Exception:  # noqa: BLE001 - the stream broke: the session ends
                pass
            finally:
                leases.close_session(sess)

        ctx.add_callback(lambda: leases.close_session(sess))
        threading.Thread(target=read_acks, name=f"session-{sess.id:x}", daemon=True).start()
        yield master_pb2.SessionEvent(session_id=sess.id, lease_ms=int(leases.lease_time * 1000))
        yield from self.idle.send_from(ctx, "Session", sess.events)

    @handler
    def ReplicationStatus(self, req, ctx):
        return self.m.replication.status(req.limit)

    @handler
    def EndSessions(self, req, ctx):
        self.m.leases.end_sessions(req.sessions)
        for sid in req.sessions:
            self.m.sessions.closed(sid)
        return common_pb2.Empty()

    def Calls(self, request_iterator, ctx):
        """Namespace calls multiplexed on one stream (see Call in master.proto): reads
        are answered by the thread reading the stream, mutations by the call pool; this
        generator sends the results as they come.  At most ``max_sessions`` streams are
        open (more: RESOURCE_EXHAUSTED; a mount then calls unary)."""
        with self._calls_lock:
            full = self._calls_open >= self.max_sessions
            if not full:
                self._calls_open += 1
        if full:
            ctx.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"too many Calls streams open ({self.max_sessions}, "
                      "master.max_sessions); use unary calls")
        try:
            yield from self._calls(request_iterator, ctx)
        finally:
            with self._calls_lock:
                self._calls_open -= 1

    def _calls(self, request_iterator, ctx):
        results: queue.SimpleQueue = queue.SimpleQueue()
        slots = threading.Semaphore(MAX_CALLS_IN_FLIGHT)
        started = threading.Event()  # the first call arrived

        def run(call):
            results.put(self._run_call(call))

        def read_calls():
            try:
                for call in request_iterator:
                    started.set()
                    while not slots.acquire(timeout=0.5):
                        if not ctx.is_active():
                            return
                    if call.WhichOneof("op") in READ_CALLS:
                        run(call)
                    else:
                        self._call_pool.submit(run, call)
            except Exception:  # noqa: BLE001 - the stream broke: it ends
                pass
            finally:
                results.put(None)

        ctx.add_callback(lambda: results.put(None))
        threading.Thread(target=read_calls, name="calls-reader", daemon=True).start()
        # until its first call, a stream is expected to move: one that never sends
        # anything is cancelled after the idle timeout, like one that stopped
        yield from self.idle.send_from(ctx, "Calls", results, after_send=slots.release,
                                       expecting=lambda: not started.is_set())

    def close(self) -> None:
        self.idle.close()
        self._call_pool.shutdown(wait=False, cancel_futures=True)
        self.heavy_pool.shutdown(wait=False, cancel_futures=True)

    @property
    def call_pool(self) -> futures.ThreadPoolExecutor:
        """Where mutations of Calls streams and of the call port wait for the journal."""
        return self._call_pool

    def run_call(self, call) -> master_pb2.CallResult:
        """One Call (the call port's entry)."""
        return self._run_call(call)

    def run_heavy(self, call) -> master_pb2.CallResult:
        """One read Call that ``run_call_nowait`` left (a heavy-read thread of the call
        port): run whole, with a heavy-read slot."""
        with self._heavy_slots:
            self._local.mode = "heavy"
            try:
                return self._run_call(call)
            finally:
                self._local.mode = None

    def run_call_nowait(self, call) -> master_pb2.CallResult | AfterIndex | None:
        """One Call answered at once if it need not wait and costs little (the call
        port's loop thread); None: run it elsewhere (``run_heavy`` for a read in
        READ_CALLS, ``run_call`` for the rest); AfterIndex: a read on a standby, which
        waits for its read index holding no thread, then runs here (AfterIndex.run:
        the same as this, admitted).  A read is answered here in its cheap
        form or not at all (see HEAVY_READS).  AddBlock and AddBlocksForPut wait only
        for a journal record every BLOCK_ID_CHUNK ids, or for eviction when no worker
        has room; a pool thread's hand-off both ways would cost more than the call
        itself."""
        op = call.WhichOneof("op")
        if self.member is not None:
            # the fence of a leader, or a standby's refusal, at once; a read on a
            # standby waits for its read index elsewhere (WouldBlock: not in the loop)
            method = CALL_METHODS.get(op, ("", ""))[0]
            try:
                self.admit(method, getattr(call, op), wait=False)
            except WouldBlock:
                return AfterIndex(self.member.read_index.wait_async,
                                  lambda error: self._run_indexed(call, op, error))
            except CurvineError as e:
                return _failed(call.id, op, e)
        return self._run_admitted(call, op)

    def _run_indexed(self, call, op: str, error: CurvineError | None
                     ) -> master_pb2.CallResult | None:
        """A standby's read after its read index (the loop): its answer, or None for
        a heavy read (which waits for an index of its own in a heavy-read thread)."""
        if error is not None:
            return _failed(call.id, op, error)
        return self._run_admitted(call, op, indexed=True)

    def _run_admitted(self, call, op: str, indexed: bool = False
                      ) -> master_pb2.CallResult | None:
        """run_call_nowait past the member's admission."""
        light = self._light.get(op)
        if light is not None:
            return self._run_light(call, op, light)
        if op in READ_CALLS:
            return self._run_call(call, indexed)  # cheap whatever the data
        placement = self._placements.get(op)
        if placement is None:
            return None
        place, m = placement  # counted as the unary RPC and the pool path are
        started = time.perf_counter()
        try:
            reply = place(self.m, getattr(call, op), wait=False)
        except WouldBlock:
            return None
        except Exception as e:  # noqa: BLE001 - converted for the caller
            m.finished(started, _status(e))
            return _failed(call.id, op, e)
        m.finished(started)
        return master_pb2.CallResult(id=call.id, **{CALL_METHODS[op][1]: reply})

    def _run_light(self, call, op: str, light) -> master_pb2.CallResult | None:
        """``light(request)`` in the loop, counted as its unary RPC; None on WouldBlock."""
        m = self._light_metrics[op]
        started = time.perf_counter()
        self._local.mode = "light"
        try:
            reply = light(getattr(call, op))
        except WouldBlock:
            return None
        except Exception as e:  # noqa: BLE001 - converted for the caller
            m.finished(started, _status(e))
            return _failed(call.id, op, e)
        finally:
            self._local.mode = None
        m.finished(started)
        return master_pb2.CallResult(id=call.id, **{CALL_METHODS[op][1]: reply})

    def _run_call(self, call, indexed: bool = False) -> master_pb2.CallResult:
        """One Call, by the same code as its unary RPC (the handler's undecorated body)."""
        op = call.WhichOneof("op")
        try:
            method, field = CALL_METHODS.get(op) or (None, None)
            if method is None:
                raise CurvineError(ErrorKind.INVALID, f"op: unknown call {op!r}")
            self.admit(method, getattr(call, op), indexed=indexed)
            reply = getattr(type(self), method).__wrapped__(self, getattr(call, op), None)
            return master_pb2.CallResult(id=call.id, **{field: reply})
        except Exception as e:  # noqa: BLE001 - converted for the caller
            return _failed(call.id, op, e)

    def mutations(self, call_soon_threadsafe) -> "CallMutations":
        """The mutations of Calls read by one event loop's thread, run there as steps
        (the call port's; master/meta/steps.py)."""
        # the Master is asked for at each call: a member of a group changes it
        return CallMutations(self, StepRunner(
            lambda *a: self.m.committer.submit_async(*a),
            lambda *a, **kw: self.m.leases.revoke_begin(*a, **kw),
            call_soon_threadsafe, self._call_pool))

    # -- capacity (master/cluster/capacity.py)
    @handler
    def ReportAccess(self, req, ctx):
        self.m.report_access(req)
        return common_pb2.Empty()

    @handler
    def SetPolicy(self, req, ctx):
        return self.m.set_policy(req)

    @handler
    def CapacityStatus(self, req, ctx):
        return self.m.capacity_status()

    # -- admin (master/ports/report.py)
    @handler
    def Report(self, req, ctx):
        return report.build(self.m, self.lookups)

    @handler
    def GetGroup(self, req, ctx):
        if self.member is not None:
            return self.member.group()
        applied = self.m.committer.applied_seq  # one master: the group of one
        return master_pb2.GetGroupReply(
            members=[master_pb2.GroupMember(id="", grpc="", role="leader",
                                            applied_seq=applied)],
            commit_seq=applied)

    @handler
    def StepDown(self, req, ctx):
        if self.member is None:
            raise CurvineError(ErrorKind.NOT_SUPPORTED, "this master is not one of a group "
                                                        "(master.etcd_endpoints is empty)")
        self.member.step_down()
        return common_pb2.Empty()

    @stream_handler
    def FetchCheckpoint(self, req, ctx):
        """The newest checkpoint at or after ``min_seq`` (written now if there is
        none), file by file, for a member of the group behind the journal in etcd."""
        m = self.m
        found = latest_checkpoint(m.ckpt_root)
        if found is None or found[0] < req.min_seq:
            report.checkpoint_now(m)
            found = latest_checkpoint(m.ckpt_root)
        if found is None or found[0] < req.min_seq:
            raise CurvineError(ErrorKind.UNAVAILABLE, f"no checkpoint at seq {req.min_seq} "
                                                      "or later")
        seq, path = found
        for name, data in checkpoint_chunks(path):
            yield master_pb2.CheckpointChunk(seq=seq, file=name, data=data)

    @handler
    def Checkpoint(self, req, ctx):
        remaining = ctx.time_remaining() if ctx is not None else None
        return report.checkpoint_now(self.m, remaining)


def _status(e: Exception) -> str:
    """The status code a failed call is counted under in the per-method metrics."""
    return status_code(e.kind).name if isinstance(e, CurvineError) else "INTERNAL"


def _failed(call_id: int, op: str, e: Exception) -> master_pb2.CallResult:
    if isinstance(e, CurvineError):
        return master_pb2.CallResult(id=call_id, error_kind=int(e.kind), error=e.message)
    # the one place unknown errors become EIO
    log.error("call %s failed", op, exc_info=e)
    return master_pb2.CallResult(id=call_id, error_kind=int(ErrorKind.IO),
                                 error=f"internal error in {op}: {e}")


# Call ops that are the master's mutations (Master methods of the same name, made with
# master/meta/steps.py's @mutation), run as steps by CallMutations; rmdir is Master.unlink's
MUTATION_OPS = frozenset(("create", "mkdir", "unlink", "rmdir", "rename", "complete",
                          "put_file", "put_files", "setattr", "symlink", "make_node", "link",
                          "release_inode", "set_xattr", "remove_xattr"))


def _mutation_steps(m: Master, op: str, req):
    if op in ("unlink", "rmdir"):
        return Master.unlink.steps(m, req, rmdir=op == "rmdir")
    return getattr(Master, op).steps(m, req)


class CallMutations:
    """Starts the namespace mutations among Calls as steps on one loop (StepRunner):
    the same master code as their unary RPCs, answered the same way, counted in the
    same per-method metrics."""

    def __init__(self, servicer: MasterServicer, runner: StepRunner):
        self.servicer = servicer
        self.runner = runner
        self._metrics = {op: metrics.MethodMetrics(CALL_METHODS[op][0]) for op in MUTATION_OPS}

    def start(self, call, answer) -> bool:
        """Start ``call`` if it is such a mutation; ``answer(CallResult)`` is called
        later in the loop thread.  False: not one (the caller runs it otherwise)."""
        op = call.WhichOneof("op")
        if op not in MUTATION_OPS:
            return False
        method, field = CALL_METHODS[op]
        m = self._metrics[op]
        started = time.perf_counter()
        try:
            master = self.servicer.admit(method, getattr(call, op))
        except CurvineError as e:  # a standby: NOT_LEADER, at once
            m.finished(started, _status(e))
            answer(_failed(call.id, op, e))
            return True

        def done(reply, error) -> None:
            if error is None:
                m.finished(started)
                answer(master_pb2.CallResult(id=call.id, **{field: reply}))
                return
            m.finished(started, _status(error))
            answer(_failed(call.id, op, error))

        self.runner.start(_mutation_steps(master, op, getattr(call, op)), done)
        return True


# Served on the master's worker port only (master.worker_port): client traffic can
# neither call them nor take the threads that answer them.  The workers' calls take the
# worker credential; MASTER_METHODS, another master of the group's, take the master
# credential (security.master_token_file), or the worker credential in a group
# without one (Security.masters_role; master/server.py makes the port).
MASTER_METHODS = frozenset(("FetchCheckpoint",))  # a checkpoint: the whole namespace
WORKER_METHODS = frozenset(("RegisterWorker", "BlockReport", "WorkerHeartbeat")) \
    | MASTER_METHODS


class _ClientPort:
    """The servicer as the client port serves it: the worker methods refuse."""

    def __init__(self, servicer: MasterServicer):
        self._servicer = servicer

    def __getattr__(self, name):
        if name in WORKER_METHODS:
            return _worker_only(name)
        return _gated(self._servicer, name)


class _WorkerPort:
    """The servicer as the worker port serves it."""

    def __init__(self, servicer: MasterServicer):
        self._servicer = servicer

    def __getattr__(self, name):
        return _gated(self._servicer, name)


def _gated(servicer: MasterServicer, name: str):
    """``name``'s handler, behind the member's admission when the master is one of a
    group (unary and streaming alike: the handler's iterator is returned as it is)."""
    method = getattr(servicer, name)
    if servicer.member is None:
        return method

    def admitted(req, ctx):
        try:
            servicer.admit(name, req)
        except CurvineError as e:
            rpc_abort(ctx, e)
        return method(req, ctx)
    return admitted


def _worker_only(name: str):
    credential = ("the master credential (security.master_token_file; the worker "
                  "credential, security.worker_token_file, where that is unset)"
                  if name in MASTER_METHODS
                  else "the worker credential (security.worker_token_file)")

    def refuse(req, ctx):
        ctx.abort(grpc.StatusCode.PERMISSION_DENIED,
                  f"{name} is served on the master's worker port (master.worker_port), "
                  f"to {credential} only")
    return refuse


def method_path(name: str) -> str:
    """The full gRPC name of the Master method ``name`` (what a server's interceptors
    see)."""
    return f"/{master_pb2.DESCRIPTOR.services_by_name['Master'].full_name}/{name}"


def add_to_server(servicer: MasterServicer, server: grpc.Server, port: str = "client") -> None:
    """Register the Master service (instead of the generated add_MasterServicer_to_server)
    so that requests which do not parse are refused as INVALID naming ``request``, not
    logged as a traceback and answered INTERNAL (common/checked_service.py).  ``port``
    "client": every method but WORKER_METHODS (which refuse); "worker": those only."""
    service = master_pb2.DESCRIPTOR.services_by_name["Master"]
    if port == "worker":
        checked_service.add_service(server, service, _WorkerPort(servicer),
                                    methods=WORKER_METHODS)
    else:
        checked_service.add_service(server, service, _ClientPort(servicer))
