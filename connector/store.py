"""The KV store every LMCache adapter of curvine uses: whole chunk files by name in one
namespace directory, without the FUSE hop.

- ``lookup(names)``: every key of a prompt in ONE master round trip (LookupMany), with
  the blocks, their workers and read tokens, so a hit needs no second call.
- ``get_into(entry, buffers)``: the file's bytes straight into the caller's buffers
  (LMCache's tensor memory): from a block file of a worker on this host through a file
  descriptor that worker passes over its Unix socket (os.preadv, no copy in Python),
  else streamed from a worker over gRPC (one copy, out of the received messages);
  replicas are tried in turn; every block's crc32 is checked.
- ``put(name, buffers)``: blocks written to their workers (the local one through a
  staging fd it hands out, os.pwritev), then PutFile publishes the whole file under its
  final name in one journaled step: there is no temporary name, a key that exists is
  not written again, a failed put leaves no name (its blocks are deleted, or freed by
  the master after PUT_BLOCK_TTL).
- ``put_many(items)``: a batch of chunks with two master calls: one reserves the blocks
  of every name not stored yet (AddBlocksForPut; names that exist are skipped), the
  blocks are written with several in flight, one publishes every chunk whose blocks were
  stored in ONE journal record (PutFiles); a chunk whose blocks failed is left out and
  its blocks handed back to the master in the same call (docs/lmcache.md).

Failures of the master or of a worker never raise out of the get/lookup/put helpers
the adapters use (``*_quietly``): they are misses, logged once per outage.  Every call
has a deadline.  Thread-safe; blocking: adapters call it from threads (``pool``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence

import grpc

from curvine.client.blocks import block_client
from curvine.client.blocks.data_port import DataPorts
from curvine.client.blocks.domain_socket import LocalSockets
from curvine.client.files.file_reader import check_block_file
from curvine.client.files.fs import CurvineFS
from curvine.client.master.master_client import AccessReporter, MasterClient
from curvine.common.checksum import crc32
from curvine.common import config as config_mod
from curvine.common.errors import CurvineError, ErrorKind, from_rpc_error
from curvine.common.fds import close_fd
from curvine.common.ids import MIB, host_id
from curvine.common.security import Security
from curvine.proto import common_pb2, master_pb2, worker_pb2

log = logging.getLogger("curvine.connector")

DEFAULT_NAMESPACE = "/l2cache"
# A lookup is on the prompt's critical path: a master that does not answer soon is a
# miss (the prefill recomputes), not a stall of the inference server.
LOOKUP_TIMEOUT = 5.0
MAX_LOOKUP_MANY = 4096  # names per LookupMany (and PutFiles), as the master allows
MAX_PUT_BLOCKS = 16384  # blocks per AddBlocksForPut (master/master.py LOOKUP_REPLY_BLOCKS)
# Blocks read or written at once by one store (several chunks of a prompt in flight).
DEFAULT_THREADS = 16
READ_CHUNK = MIB  # ReadBlock message size
DATA_PORT_RETRY = 60.0  # seconds a worker whose data port failed is read over gRPC
# a block read over a data port that makes no progress this long fails over to the
# next replica (a chunk takes well under a second)
DATA_PORT_TIMEOUT = 10.0
# Checking crc32s on reads.  Always on; the switch exists for measuring what the
# checks cost.
VERIFY = True

Buffer = memoryview | bytearray | bytes


@dataclasses.dataclass(frozen=True)
class Entry:
    """A chunk file as LookupMany found it: what get_into needs, no further lookup."""

    name: str
    ino: int
    size: int
    blocks: tuple[common_pb2.Block, ...]
    workers: dict  # worker id -> WorkerInfo


class _WorkersFailed(CurvineError):
    """Every target worker of a block refused it (each logged by its own _Outage)."""


# A publish (PutFile, PutFiles) that failed so may have been applied all the same: the
# master (or a leader SIGKILLed once its record was in etcd) made it durable and the
# answer was lost.  Its blocks are then left where they are: deleting them would leave
# a published file without its bytes (a new leader found them missing at the worker's
# next block report and dropped the file).  Blocks no file took are the master's to
# free (a put's after PUT_BLOCK_TTL; a master that never knew them at a worker's block
# report, after master.orphan_block_grace).
_OUTCOME_UNKNOWN = frozenset((ErrorKind.UNAVAILABLE, ErrorKind.TIMEOUT))


@contextlib.contextmanager
def _publishing(written: list):
    """Around the master call that publishes the blocks in ``written`` (worker, block
    id, token): once it answered they are the master's (published, or freed by it),
    and so they are when its outcome is unknown; after a definite refusal they stay
    in ``written``, for the caller to delete."""
    try:
        yield
    except CurvineError as e:
        if e.kind in _OUTCOME_UNKNOWN:
            written.clear()
        raise
    written.clear()


class _Outage:
    """One master's or worker's outage: logged once (the first failure after a
    success) with its recovery; while it lasts, calls are answered at once (misses,
    skipped stores) and one call per ``retry`` seconds tries again."""

    def __init__(self, what: str, retry: float):
        self.what = what
        self.retry = retry
        self._down = False
        self._retry_at = 0.0
        self._lock = threading.Lock()

    def may_try(self) -> bool:
        """Whether a call should go out now (always, unless the outage is on and this
        is not the one call per ``retry`` that probes it)."""
        if not self._down:
            return True
        with self._lock:
            now = time.monotonic()
            if not self._down or now >= self._retry_at:
                self._retry_at = now + self.retry
                return True
            return False

    def failed(self, err: Exception) -> None:
        with self._lock:
            first, self._down = not self._down, True
            self._retry_at = time.monotonic() + self.retry
        if first:
            log.warning("%s failing (treated as misses until it recovers; logged once): %s",
                        self.what, err)

    def ok(self) -> None:
        if self._down:
            with self._lock:
                was, self._down = self._down, False
            if was:
                log.info("%s works again", self.what)


class _Budget:
    """The time left for one connector call (``client.fail_open_timeout`` for the
    quiet calls the adapters make); every master and worker call inside takes what is
    left as its deadline, so the whole call returns within it."""

    __slots__ = ("end",)

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left; TIMEOUT once there are none."""
        t = self.end - time.monotonic()
        if t <= 0:
            raise CurvineError(ErrorKind.TIMEOUT, "the call's time (client.fail_open_timeout "
                                                  "or rpc_timeout) is up")
        return t


# answers that say the request was wrong, not that the master is failing
_REFUSALS = (ErrorKind.INVALID, ErrorKind.NAME_TOO_LONG, ErrorKind.PERMISSION,
             ErrorKind.NOT_DIR, ErrorKind.TOO_BIG)


def _encode_name(name: str) -> bytes | None:
    """The name as the master stores it (UTF-8, as LMCache's fs:// connector writes
    it), or None when no file can have it (a lone surrogate, a slash, NUL, empty or
    longer than 255 bytes)."""
    try:
        b = name.encode()
    except UnicodeEncodeError:
        return None
    if not 0 < len(b) <= 255 or b"/" in b or b"\0" in b or b in (b".", b".."):
        return None
    return b


def _views(buffers: Sequence[Buffer]) -> list[memoryview]:
    out = []
    for b in buffers:
        v = b if isinstance(b, memoryview) else memoryview(b)
        if v.format != "B" or v.ndim != 1:  # e.g. ctypes arrays ("<B"): plain bytes
            v = v.cast("B")
        out.append(v)
    return out


def _slice(views: Sequence[memoryview], start: int, end: int) -> list[memoryview]:
    """The views covering bytes [start, end) of the concatenation of ``views``."""
    out, pos = [], 0
    for v in views:
        n = len(v)
        lo, hi = max(start - pos, 0), min(end - pos, n)
        if lo < hi:
            out.append(v[lo:hi])
        pos += n
        if pos >= end:
            break
    return out


def _crc(views: Iterable[memoryview], crc: int = 0) -> int:
    for v in views:
        crc = crc32(v, crc)
    return crc


def preadv_full(fd: int, views: list[memoryview], offset: int) -> int:
    """Read until ``views`` are full or the file ends; bytes read."""
    total, views = 0, [v for v in views if len(v)]
    while views:
        n = os.preadv(fd, views, offset + total)
        if n == 0:
            break
        total += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]
    return total


class KVStore:
    """Chunk files in one namespace directory of a curvine cluster (see module doc)."""

    def __init__(self, cfg: config_mod.Config, namespace: str = DEFAULT_NAMESPACE,
                 short_circuit: bool | None = None, threads: int = DEFAULT_THREADS,
                 fs: CurvineFS | None = None):
        self.cfg = cfg
        self.namespace = namespace
        self.timeout = float(cfg.cluster.rpc_timeout)
        self.fail_open = min(float(cfg.client.fail_open_timeout), self.timeout)
        # The connector never waits for a master that is down (no master_wait): a
        # lookup or store that cannot be answered now is a miss or a skipped store.
        self.fs = fs or CurvineFS(cfg=cfg, master=MasterClient(
            config_mod.master_addrs(cfg), timeout=self.timeout, wait=0,
            security=Security.load(cfg), call_port=cfg.client.call_port,
            call_port_connections=threads, read_from=config_mod.read_members(cfg)))
        self.master = self.fs.master
        self.security = self.fs.security
        self.host = host_id()
        if short_circuit is None:
            short_circuit = bool(cfg.client.short_circuit)
        self.short_circuit = short_circuit
        # a connection kept per thread that reads or writes: a put or a read in flight
        # never opens one (a worker thread, a Hello) nor closes it afterwards
        self.sockets = (LocalSockets(cfg.client.domain_socket_dir, timeout=self.timeout,
                                     pool_size=threads)
                        if short_circuit and cfg.client.domain_socket_dir else None)
        # for callers that move several chunks at once (the adapters' batches)
        # remote reads: the workers' bulk read ports (plain TCP + sendfile, straight
        # into the caller's buffer) when the cluster runs without TLS, else gRPC
        self.data_ports = (DataPorts(min(DATA_PORT_TIMEOUT, self.timeout))
                           if self.security.material is None else None)
        self._no_data_port: dict[str, float] = {}  # address -> until when gRPC is used
        self.pool = concurrent.futures.ThreadPoolExecutor(threads,
                                                          thread_name_prefix="curvine-kv")
        # a block's replicas written at once: its own threads, so a put running in
        # ``pool`` never waits for a thread of ``pool`` (no deadlock when it is full)
        self._fanout = concurrent.futures.ThreadPoolExecutor(threads,
                                                             thread_name_prefix="curvine-rep")
        self.access = AccessReporter(self.master)
        self.access.start()
        self.master_outage = _Outage(f"curvine master {self.master.address}", self.fail_open)
        self._worker_outages: dict[str, _Outage] = {}  # by worker address
        self._outages_lock = threading.Lock()
        self._dir: int | None = None
        self._dir_lock = threading.Lock()
        self._closed = False
        self.stats = {"lookups": 0, "hits": 0, "gets": 0, "short_circuit_blocks": 0,
                      "remote_blocks": 0, "data_port_blocks": 0, "puts": 0, "put_existed": 0, "bytes_read": 0,
                      "bytes_written": 0}

    @classmethod
    def open(cls, conf_path: str | None = None, namespace: str = DEFAULT_NAMESPACE,
             short_circuit: bool | None = None, **kw) -> "KVStore":
        """The store of the cluster that ``conf_path`` names, else $CURVINE_CONF, else
        /etc/curvine/curvine.toml (as every curvine process finds its config)."""
        if not namespace.startswith("/"):
            raise CurvineError(ErrorKind.INVALID, f"namespace: {namespace!r} is not an "
                                                  "absolute path")
        return cls(config_mod.load(conf_path), namespace, short_circuit, **kw)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.pool.shutdown(wait=True, cancel_futures=True)
        self._fanout.shutdown(wait=True, cancel_futures=True)
        self.access.close()
        if self.data_ports is not None:
            self.data_ports.close()
        if self.sockets is not None:
            self.sockets.close()
        self.fs.close()

    def __enter__(self) -> "KVStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the namespace directory ------------------------------------------------------

    def directory(self, budget: _Budget | None = None) -> int:
        """The inode of the namespace directory (made, mode 0777 like a shared /tmp
        without its sticky bit, on first use, within ``budget``)."""
        with self._dir_lock:
            if self._dir is None:
                timeout = budget.left() if budget is not None else self.timeout
                self._dir = self.fs.mkdir(self.namespace, mode=0o777, parents=True,
                                          timeout=timeout).ino
            return self._dir

    def _forget_directory(self) -> None:
        with self._dir_lock:
            self._dir = None

    # -- lookups --------------------------------------------------------------------

    def worker_outage(self, worker) -> _Outage:
        """The outage log of one worker: a dead worker among live ones is logged once,
        however many reads of other workers succeed in between."""
        with self._outages_lock:
            o = self._worker_outages.get(worker.address)
            if o is None:
                o = self._worker_outages[worker.address] = _Outage(
                    f"curvine worker {worker.worker_id} ({worker.address})", self.fail_open)
            return o

    def lookup(self, names: Sequence[str], budget: _Budget | None = None
               ) -> list[Entry | None]:
        """Every name's entry (None: not there, still being written by a FUSE writer,
        or a name no file can have): one LookupMany per MAX_LOOKUP_MANY names (one for
        any real prompt), within ``budget`` (None: LOOKUP_TIMEOUT).  Raises
        CurvineError on a master failure."""
        budget = budget or _Budget(min(LOOKUP_TIMEOUT, self.timeout))
        encoded = [_encode_name(n) for n in names]
        valid = [i for i, b in enumerate(encoded) if b is not None]
        out: list[Entry | None] = [None] * len(names)
        for start in range(0, len(valid), MAX_LOOKUP_MANY):
            page = valid[start:start + MAX_LOOKUP_MANY]
            found = self._lookup_page([names[i] for i in page], [encoded[i] for i in page],
                                      budget)
            for i, entry in zip(page, found):
                out[i] = entry
        self.stats["lookups"] += len(names)
        self.stats["hits"] += sum(1 for e in out if e is not None)
        return out

    def _lookup_page(self, names: Sequence[str], encoded: list[bytes],
                     budget: _Budget) -> list[Entry | None]:
        out: list[Entry | None] = []
        while len(out) < len(names):
            # the master answers the names in order within its reply limits
            # (master.lookup_reply_max): the rest are asked for again
            got = self._lookup_part(names[len(out):], encoded[len(out):], budget)
            if not got:
                raise CurvineError(ErrorKind.IO, "LookupMany answered no name")
            out.extend(got)
        return out

    def _lookup_part(self, names: Sequence[str], encoded: list[bytes],
                     budget: _Budget) -> list[Entry | None]:
        for attempt in (0, 1):
            parent = self.directory(budget)
            try:
                reply = self.master.lookup_many(parent, encoded, timeout=budget.left(),
                                                wait=0)
                break
            except CurvineError as e:
                if e.kind == ErrorKind.NOT_FOUND and attempt == 0:  # the dir was removed
                    self._forget_directory()
                    continue
                raise
        workers = {w.worker_id: w for w in reply.workers}
        out: list[Entry | None] = []
        for name, r in zip(names, reply.results):
            node = r.inode if r.HasField("inode") else None
            if node is None or node.type != common_pb2.FILE or node.state != common_pb2.COMPLETE:
                out.append(None)
                continue
            if any(b.block_id and not any(w in workers and not workers[w].lost
                                          for w in b.worker_ids) for b in r.blocks):
                # a block whose every copy is on a lost worker (kept for its grace):
                # a miss now, not a read that waits for it
                out.append(None)
                continue
            out.append(Entry(name, node.ino, node.size, tuple(r.blocks),
                             {w: workers[w] for b in r.blocks for w in b.worker_ids
                              if w in workers}))
        return out

    def lookup_quietly(self, names: Sequence[str]) -> list[Entry | None]:
        """lookup within ``client.fail_open_timeout``, with a master failure as misses
        (logged once per outage; during one, misses at once but for a probe)."""
        if not self.master_outage.may_try():
            return [None] * len(names)
        try:
            out = self.lookup(names, _Budget(self.fail_open))
        except CurvineError as e:
            self._master_failed(e)
            return [None] * len(names)
        self.master_outage.ok()
        return out

    def _master_failed(self, e: CurvineError) -> None:
        """A quiet call's failure: an outage, unless the master refused the request
        itself (a bad name, a permission): that is this call's miss only."""
        if e.kind in _REFUSALS:
            log.info("the master refused a connector request (a miss): %s", e)
        else:
            self.master_outage.failed(e)

    def exists_many(self, names: Sequence[str]) -> list[bool]:
        return [e is not None for e in self.lookup_quietly(names)]

    def prefix_hits(self, names: Sequence[str]) -> int:
        """How many names from the first are all present (LMCache's prefix match)."""
        hits = self.exists_many(names)
        return hits.index(False) if False in hits else len(hits)

    # -- reads ---------------------------------------------------------------------

    def get_into(self, entry: Entry, buffers: Sequence[Buffer], offset: int = 0,
                 budget: _Budget | None = None) -> int:
        """Read the file from ``offset`` into ``buffers`` (filled in order) until they
        are full or the file ends, within ``budget`` (None: rpc_timeout); bytes read.
        Every block read is checked against its crc32, whole or in part.  Raises
        CurvineError if no replica of a block can be read (then what the buffers hold
        is undefined)."""
        if offset < 0:
            raise CurvineError(ErrorKind.INVALID, f"offset: {offset} is negative")
        budget = budget or _Budget(self.timeout)
        views = _views(buffers)
        want = min(sum(len(v) for v in views), max(entry.size - offset, 0))
        start, end = offset, offset + want
        pos = 0
        for block in entry.blocks:
            b_start, b_end = pos, pos + block.length
            pos = b_end
            lo, hi = max(start, b_start), min(end, b_end)
            if lo >= hi:
                continue
            targets = _slice(views, lo - start, hi - start)
            self._read_block(entry, block, lo - b_start, targets, budget)
        self.stats["gets"] += 1
        self.stats["bytes_read"] += want
        self.access.note(entry.ino)
        return want

    def get_quietly(self, entry: Entry, buffers: Sequence[Buffer], offset: int = 0
                    ) -> int | None:
        """get_into within ``client.fail_open_timeout``, with failures as a miss (None),
        logged once per outage."""
        try:
            return self.get_into(entry, buffers, offset, _Budget(self.fail_open))
        except CurvineError as e:  # each failed worker was logged (once per outage)
            log.debug("%s: a miss: %s", entry.name, e)
            return None

    def _replicas(self, entry: Entry, block) -> list:
        """The block's workers to try: this host's first (short-circuit), lost ones
        last, those in an outage only when it is their turn to be probed."""
        ws = [entry.workers[w] for w in block.worker_ids if w in entry.workers]
        ws = [w for w in ws if self.worker_outage(w).may_try()]
        ws.sort(key=lambda w: (w.lost, not self._local(w)))
        return ws

    def _local(self, worker) -> bool:
        return (self.sockets is not None and worker.host_id == self.host
                and self.sockets.has(worker))

    def _read_block(self, entry: Entry, block, skip: int, targets: list[memoryview],
                    budget: _Budget) -> None:
        """Bytes [skip, skip + len(targets)) of ``block`` into ``targets``, checked: a
        local block file whose bytes matched the crc32 before (unchanged since) is read
        in place, else the whole block is read (what the caller does not want into
        scratch memory) and its crc32 compared."""
        if block.block_id == 0:  # inline data (kept by the master), or a hole
            data = memoryview(block.data) if block.HasField("data") else None
            pos = skip
            for t in targets:
                t[:] = data[pos:pos + len(t)] if data is not None else bytes(len(t))
                pos += len(t)
            return
        verify = block.checksum != 0 and VERIFY
        errors = []
        for w in self._replicas(entry, block):
            budget.left()  # time up: a miss, no replica's fault
            try:
                if self._local(w):
                    self._read_local(w, block, skip, targets, verify, budget)
                    self.stats["short_circuit_blocks"] += 1
                else:
                    self._read_remote(w, block, skip, targets, verify, budget)
                    self.stats["remote_blocks"] += 1
                self.worker_outage(w).ok()
                return
            except CurvineError as e:
                if e.kind == ErrorKind.CHECKSUM:
                    log.warning("block %016x of %s: the copy of worker %d (%s) is not "
                                "intact: %s", block.block_id, entry.name, w.worker_id,
                                w.address, e.message)
                    self.access.bad_copy(block.block_id, w.worker_id)  # checked, then dropped
                else:
                    self.worker_outage(w).failed(e)
                errors.append(f"worker {w.worker_id} ({w.address}): {e}")
        raise CurvineError(ErrorKind.UNAVAILABLE,
                           f"{entry.name}: block {block.block_id:016x}: no replica could be "
                           f"read ({'; '.join(errors) or 'no live location'})")

    def _read_local(self, worker, block, skip: int, targets: list[memoryview], verify: bool,
                    budget: _Budget) -> None:
        fd, _length = self.sockets.open_read(worker, block.block_id, block.token,
                                             timeout=budget.left())
        n = sum(len(t) for t in targets)
        try:
            problem = check_block_file(block, fd) if verify else None
            if problem is not None:
                raise CurvineError(ErrorKind.CHECKSUM, problem)
            got = preadv_full(fd, list(targets), skip)
        except OSError as e:
            raise CurvineError(ErrorKind.IO, f"reading block fd: {e.strerror}") from None
        finally:
            close_fd(fd, f"the block file of {block.block_id:016x} a worker passed")
        if got != n:
            raise CurvineError(ErrorKind.IO, f"got {got} of {n} bytes")

    def _read_remote(self, worker, block, skip: int, targets: list[memoryview],
                     verify: bool, budget: _Budget) -> None:
        """The block from another node; when it is checked, the bytes before and after
        the wanted range are read too (into scratch memory), so the crc32 covers it."""
        n = sum(len(t) for t in targets)
        views, first = list(targets), skip
        if verify:
            before, after = bytearray(skip), bytearray(block.length - skip - n)
            views = [memoryview(before), *views, memoryview(after)]
            first = 0
        want = sum(len(v) for v in views)
        got = self._receive(worker, block, first, want, views, budget)
        if got != want:
            raise CurvineError(ErrorKind.IO, f"got {got} of {want} bytes")
        if verify and _crc(views) != block.checksum:
            raise CurvineError(ErrorKind.CHECKSUM, "crc32 differs from the master's record")

    def _receive(self, worker, block, offset: int, n: int, views: list[memoryview],
                 budget: _Budget) -> int:
        """[offset, offset+n) of ``block`` from ``worker`` into ``views``: its data port,
        else (no data port, or it refuses or fails) gRPC."""
        address = worker.data_address
        if (self.data_ports is not None and address
                and self._no_data_port.get(address, 0) < time.monotonic()):
            try:
                got = self.data_ports.read_into(address, block.block_id, block.token, offset,
                                                views, timeout=budget.left())
                self.stats["data_port_blocks"] += 1
                return got
            except CurvineError as e:
                if e.kind == ErrorKind.BUSY:  # every connection slot taken: gRPC this once
                    log.debug("worker %d: data port %s busy; reading over gRPC",
                              worker.worker_id, address)
                    return self._read_grpc(worker, block, offset, n, views, budget)
                if e.kind != ErrorKind.UNAVAILABLE:
                    raise
                failed = e
            got = self._read_grpc(worker, block, offset, n, views, budget)
            # the worker answers gRPC but not its data port (a firewall?): gRPC for a while
            log.info("worker %d: data port %s unreachable, reading over gRPC for %gs: %s",
                     worker.worker_id, address, DATA_PORT_RETRY, failed)
            self._no_data_port[address] = time.monotonic() + DATA_PORT_RETRY
            return got
        return self._read_grpc(worker, block, offset, n, views, budget)

    def _read_grpc(self, worker, block, skip: int, n: int, targets: list[memoryview],
                   budget: _Budget) -> int:
        stream = block_client._calls(worker.address, self.security).read(
            worker_pb2.ReadBlockRequest(block_id=block.block_id, offset=skip, length=n,
                                        token=block.token),
            timeout=budget.left())
        ti, tpos, got = 0, 0, 0
        try:
            for data in stream:  # a view into the received message
                dpos, dn = 0, len(data)
                while dpos < dn:
                    if ti >= len(targets):
                        raise CurvineError(ErrorKind.IO, "the worker sent more than asked")
                    t = targets[ti]
                    k = min(len(t) - tpos, dn - dpos)
                    t[tpos:tpos + k] = data[dpos:dpos + k]
                    tpos += k
                    dpos += k
                    if tpos == len(t):
                        ti, tpos = ti + 1, 0
                got += dn
        except grpc.RpcError as e:
            err = from_rpc_error(e)
            raise CurvineError(err.kind, err.message) from None
        finally:
            stream.cancel()
        return got

    # -- writes --------------------------------------------------------------------

    def put(self, name: str, buffers: Sequence[Buffer], mode: int = 0o644,
            budget: _Budget | None = None) -> bool:
        """Store the concatenation of ``buffers`` as ``name`` within ``budget`` (None:
        rpc_timeout): True if stored, False if the name existed (nothing written).
        Raises CurvineError on failure; then no name was made and the blocks written
        are deleted (best effort; the master frees what is left after
        PUT_BLOCK_TTL), but for a PutFile whose outcome is unknown (``_publishing``:
        the name may exist)."""
        bname = _encode_name(name)
        if bname is None:
            raise CurvineError(ErrorKind.INVALID, f"name: {name!r} cannot be a file name")
        budget = budget or _Budget(self.timeout)
        views = _views(buffers)
        size = sum(len(v) for v in views)
        parent = self.directory(budget)
        block_size = self.fs.block_size(budget.left())
        blocks: list[common_pb2.Block] = []
        written: list[tuple] = []  # (worker, block id, token): undone on failure
        try:
            for start in range(0, size, block_size):
                piece = _slice(views, start, min(start + block_size, size))
                block = self._put_block(parent, bname, piece, written, budget)
                if block is None:  # another writer stored the name meanwhile
                    break
                blocks.append(block)
            else:
                with _publishing(written):  # published, or (existed) freed by the master
                    node, existed = self.master.put_file(
                        parent, bname, blocks, size, mode=mode, uid=os.getuid(),
                        gid=os.getgid(), timeout=budget.left(), wait=0)
                if not existed:
                    self.stats["puts"] += 1
                    self.stats["bytes_written"] += size
                    return True
                self.stats["put_existed"] += 1
                return False
            # existed before all blocks were written: hand the written ones back
            if blocks:
                with _publishing(written):
                    self.master.put_file(parent, bname, blocks, sum(b.length for b in blocks),
                                         timeout=budget.left(), wait=0)
            self.stats["put_existed"] += 1
            return False
        finally:
            if written:
                self._delete_blocks(written)

    def put_quietly(self, name: str, buffers: Sequence[Buffer]) -> bool | None:
        """put within ``client.fail_open_timeout``, with failures as None (logged once
        per outage; during a master outage, None at once but for a probe)."""
        if not self.master_outage.may_try():
            return None
        try:
            stored = self.put(name, buffers, budget=_Budget(self.fail_open))
        except _WorkersFailed as e:  # each worker's failure was logged already
            log.debug("%s: not stored: %s", name, e)
            return None
        except CurvineError as e:  # the master's
            self._master_failed(e)
            return None
        self.master_outage.ok()
        return stored

    def put_many(self, items: Sequence[tuple[str, Sequence[Buffer]]], mode: int = 0o644,
                 budget: _Budget | None = None) -> list[bool | None]:
        """Store many chunks (``items``: name, buffers) within ``budget`` (None:
        rpc_timeout) with two master calls per MAX_LOOKUP_MANY names: one reserves the
        blocks of every name not stored yet (AddBlocksForPut), one publishes all the
        chunks written (PutFiles, one journal record).  Blocks are written with several
        in flight.  Per item: True stored, False the name existed (nothing written),
        None not stored: a name no file can have, a block no worker took (its chunk is
        left out, its blocks freed; logged once per worker outage), or refused by the
        master (logged).  Raises CurvineError when the master fails; then nothing of the
        failed call is published and the blocks written for it are deleted."""
        budget = budget or _Budget(self.timeout)
        out: list[bool | None] = [None] * len(items)
        todo = []  # (index, encoded name, views, size)
        for i, (name, buffers) in enumerate(items):
            bname = _encode_name(name)
            if bname is None:
                log.debug("%r cannot be a file name: not stored", name)
                continue
            views = _views(buffers)
            todo.append((i, bname, views, sum(len(v) for v in views)))
        if not todo:
            return out
        parent = self.directory(budget)
        block_size = self.fs.block_size(budget.left())
        page: list = []
        blocks = 0
        for t in todo:  # pages within the master's limits on names and blocks
            n = -(-t[3] // block_size)
            if page and (len(page) == MAX_LOOKUP_MANY or blocks + n > MAX_PUT_BLOCKS):
                self._put_page(parent, page, mode, out, budget)
                page, blocks = [], 0
            page.append(t)
            blocks += n
        self._put_page(parent, page, mode, out, budget)
        return out

    def put_many_quietly(self, items: Sequence[tuple[str, Sequence[Buffer]]]
                         ) -> list[bool | None]:
        """put_many within ``client.fail_open_timeout``, with a master failure as None
        for every item (logged once per outage; during one, at once but for a probe)."""
        if not self.master_outage.may_try():
            return [None] * len(items)
        try:
            stored = self.put_many(items, budget=_Budget(self.fail_open))
        except CurvineError as e:
            self._master_failed(e)
            return [None] * len(items)
        self.master_outage.ok()
        return stored

    def _put_page(self, parent: int, page: list, mode: int, out: list,
                  budget: _Budget) -> None:
        """One reservation, the writes, one publish: put_many's results of ``page``
        into ``out``."""
        reply = self.master.add_blocks_for_put(parent, [t[1] for t in page],
                                               [t[3] for t in page], self.host,
                                               timeout=budget.left(), wait=0)
        workers = {w.worker_id: w for w in reply.workers}
        writes = []  # per chunk to publish: (index, name, size, [(grant, future)])
        for (i, bname, views, size), res in zip(page, reply.results):
            if res.HasField("existing"):
                out[i] = False
                self.stats["put_existed"] += 1
                continue
            futs, pos = [], 0
            for g in res.blocks:
                piece = _slice(views, pos, pos + g.length)
                pos += g.length
                futs.append((g, self._fanout.submit(self._write_grant, g, workers, piece,
                                                    budget)))
            writes.append((i, bname, size, futs))
        files, abandoned, written, sent = [], [], [], []
        uid, gid = os.getuid(), os.getgid()
        try:
            for i, bname, size, futs in writes:
                blocks = []
                for g, fut in futs:
                    crc, stored_on = fut.result()
                    written += [(workers[w], g.block_id, g.block_token) for w in stored_on]
                    blocks.append(common_pb2.Block(block_id=g.block_id, length=g.length,
                                                   checksum=crc, worker_ids=stored_on,
                                                   token=g.block_token))
                if all(b.worker_ids for b in blocks):
                    files.append(master_pb2.PutFileEntry(name=bname, mode=mode, uid=uid,
                                                         gid=gid, blocks=blocks, size=size))
                    sent.append((i, size))
                else:  # left out: the master frees its blocks (pending) now
                    abandoned += [common_pb2.Block(block_id=b.block_id, token=b.token)
                                  for b in blocks]
            with _publishing(written):  # published, or freed by the master
                results = self.master.put_files(parent, files, abandoned,
                                                timeout=budget.left(),
                                                wait=0) if files or abandoned else []
        finally:
            if written:
                self._delete_blocks(written)
        for (i, size), (f, r) in zip(sent, zip(files, results)):
            if r.status == master_pb2.PUT_STORED:
                out[i] = True
                self.stats["puts"] += 1
                self.stats["bytes_written"] += size
            elif r.status == master_pb2.PUT_EXISTS:
                out[i] = False
                self.stats["put_existed"] += 1
            else:
                log.warning("%s: not stored, the master refused it (%s): %s",
                            f.name.decode(errors="replace"),
                            master_pb2.PutStatus.Name(r.status), r.error)

    def _write_grant(self, grant, workers: dict, piece: list[memoryview],
                     budget: _Budget) -> tuple[int, list[int]]:
        """One block of put_many on each of its targets: (its crc32, the workers that
        stored it).  Never raises: a worker that failed is logged by its _Outage."""
        targets = [workers[w] for w in grant.worker_ids if w in workers]
        # one local target takes the crc32 as it writes (_write_to): one pass over the
        # caller's memory; any other is checked against the one taken here
        crc = None if len(targets) == 1 and self._local(targets[0]) else _crc(piece)
        stored_on = []
        for w in targets:
            try:
                crc = self._write_to(w, grant.block_id, grant.block_token, piece, crc, budget)
                stored_on.append(w.worker_id)
                self.worker_outage(w).ok()
            except CurvineError as e:
                self.worker_outage(w).failed(e)
        return crc or 0, stored_on

    def _put_block(self, parent: int, bname: bytes, piece: list[memoryview],
                   written: list, budget: _Budget) -> common_pb2.Block | None:
        """One block of a put on its workers (every target; the failed ones excluded on
        one retry).  None if the name exists."""
        n = sum(len(v) for v in piece)
        crc: int | None = None  # one local target takes it as it writes (_write_to)
        exclude: list[int] = []
        errors: list[str] = []
        for _attempt in range(2):
            r = self.master.add_block_for_put(parent, bname, self.host, size_hint=n,
                                              exclude=exclude, timeout=budget.left(), wait=0)
            if r.HasField("existing"):
                return None
            if crc is None and (len(r.workers) != 1 or not self._local(r.workers[0])):
                crc = _crc(piece)  # what every target's copy is checked against
            futs = {w.worker_id: self._fanout.submit(self._write_to, w, r.block_id,
                                                  r.block_token, piece, crc, budget)
                    if len(r.workers) > 1 else None for w in r.workers}
            ok = []
            for w in r.workers:
                try:
                    fut = futs[w.worker_id]
                    crc = fut.result() if fut is not None else self._write_to(
                        w, r.block_id, r.block_token, piece, crc, budget)
                    ok.append(w.worker_id)
                    written.append((w, r.block_id, r.block_token))
                    self.worker_outage(w).ok()
                except CurvineError as e:
                    self.worker_outage(w).failed(e)
                    errors.append(f"worker {w.worker_id} ({w.address}): {e}")
                    exclude.append(w.worker_id)
            if ok:
                return common_pb2.Block(block_id=r.block_id, length=n, checksum=crc,
                                        worker_ids=ok, token=r.block_token)
        raise _WorkersFailed(ErrorKind.UNAVAILABLE, "no worker stored the block: "
                                                    + "; ".join(errors))

    def _write_to(self, worker, block_id: int, token: bytes, piece: list[memoryview],
                  crc: int | None, budget: _Budget) -> int:
        """The block on ``worker``; its crc32 (``crc``, or, None, the one a local write
        took of the bytes it wrote)."""
        if self._local(worker):
            length, got = self.sockets.write(worker, block_id, token, piece, crc,
                                             timeout=budget.left())
            if crc is None:
                return got
        else:
            data = piece[0] if len(piece) == 1 else b"".join(piece)
            length, got = block_client.write_block(worker, block_id, data,
                                                   timeout=budget.left(), token=token,
                                                   security=self.security)
        if got != crc:
            raise CurvineError(ErrorKind.CHECKSUM, f"block {block_id:016x} stored with crc32 "
                                                   f"{got:08x}, sent {crc:08x}")
        return crc

    def _delete_blocks(self, written: list) -> None:
        by_worker: dict[str, tuple] = {}
        for w, block_id, token in written:
            _, ids, tokens = by_worker.setdefault(w.address, (w, [], []))
            ids.append(block_id)
            tokens.append(token)
        for w, ids, tokens in by_worker.values():
            try:
                block_client._calls(w.address, self.security).stub.DeleteBlocks(
                    worker_pb2.DeleteBlocksRequest(block_ids=ids, tokens=tokens),
                    timeout=self.timeout)
            except grpc.RpcError as e:
                log.debug("deleting the blocks of a failed put on %s: %s", w.address,
                          from_rpc_error(e).message)

    # -- the rest of the interface -----------------------------------------------------

    def list(self, suffix: str = "") -> list[str]:
        """The names in the namespace directory (ending in ``suffix``)."""
        return [e.name.decode(errors="surrogateescape")
                for e in self.master.iterdir(self.directory())
                if e.name.endswith(suffix.encode())]

    def remove(self, name: str) -> bool:
        try:
            self.master.unlink(self.directory(), name.encode())
            return True
        except CurvineError as e:
            if e.kind != ErrorKind.NOT_FOUND:
                log.warning("removing %s: %s", name, e)
            return False
