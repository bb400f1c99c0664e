"""The worker's gRPC block service (``Worker`` in proto/src/curvine/proto/worker.proto):
the data path.

Thin handlers: validate the request (a bad field is INVALID naming it), call the
BlockStore, convert the result.  Data travels in messages of at most 1 MiB.
"""

from __future__ import annotations

import contextlib
import logging
import threading

import grpc

from curvine.common import block_tokens
from curvine.common.errors import CurvineError, ErrorKind, invalid
from curvine.common.ids import MIB
from curvine.common.rpc import handler, stream_handler
from curvine.proto import common_pb2, worker_pb2, worker_pb2_grpc

from curvine.common import checked_service, wire
from curvine.common.stream_guard import IdleStreams, Watched
from curvine.common.metrics import STREAMS_REFUSED_BUSY
from curvine.common.blocks import check_block_id

from .blockstore import READ_CHUNK, BlockStore
from .metrics import (BLOCK_TOKEN_REFUSED, WORKER_READ_REMOTE, WORKER_WRITTEN_REMOTE,
                      WORKER_WRITTEN_SHORT_CIRCUIT)

log = logging.getLogger(__name__)

# Data bytes one WriteBlock message may carry: the 1 MiB unit plus a little slack for
# clients that do not cut exactly at 1 MiB.  The transport accepts larger messages
# (common.rpc.MESSAGE_LIMIT, for block reports), so the limit is enforced here.
MAX_WRITE_MESSAGE = MIB + 64 * 1024


# The one value of WorkerServicer.block_key that turns block token checks off.
UNCHECKED = None


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    """Serves one BlockStore.  ``block_size`` is the largest block accepted and
    ``block_key`` the key of block tokens (common/block_tokens.py); the worker sets both
    from the master's RegisterWorkerReply.  Until then the key is b"" and every block
    call is refused UNAVAILABLE.  ``UNCHECKED`` turns the checks off: for tests of the
    block store plumbing without a master, never set by the worker daemon."""

    def __init__(self, store: BlockStore, block_size: int = 64 * MIB,
                 block_key: bytes | None = b"", stream_idle_timeout: float = 0.0,
                 max_streams: int = 0, worker_id: int = 0):
        self.store = store
        # Block streams open at once (0 = no limit).  The daemon sets it below its RPC
        # threads, so streams that send nothing (each held until the idle timeout) can
        # never take the threads that unary calls and refusals need: more are refused
        # BUSY at once instead of queueing behind them for minutes.
        self.max_streams = max_streams
        self._streams = 0
        self._streams_lock = threading.Lock()
        self.block_size = block_size
        self.block_key = block_key
        self.worker_id = worker_id  # this worker's (registration): write tokens name it
        # WriteBlock/ReadBlock streams silent this long are cancelled (0 = never)
        self.idle = IdleStreams(stream_idle_timeout, "worker")
        # add_to_server frames ReadBlock replies by hand and sets this; registered
        # with the generated add_WorkerServicer_to_server, replies stay messages.
        self.raw_read_replies = False

    def _authorize(self, block_id: int, token: bytes, access: bytes, field: str,
                   here: bool = True) -> None:
        """Refuse unless ``token`` is the master's grant of ``access`` to ``block_id``:
        a worker serves only block ids the master allocated and handed out, and writes
        only blocks the master placed on it (``here``: a write token must name this
        worker; False for deletes, which the master sends with unbound tokens)."""
        key = self.block_key
        if key is UNCHECKED:
            return
        if not key:
            raise CurvineError(ErrorKind.UNAVAILABLE, "this worker has not registered with "
                                                      "the master yet (no block token key)")
        if here and access == block_tokens.WRITE and not self.worker_id:
            raise CurvineError(ErrorKind.UNAVAILABLE, "this worker has not registered with "
                                                      "the master yet (writes wait for it)")
        worker_id = self.worker_id if here else None
        if not block_tokens.allows(key, block_id, token, access, worker_id):
            BLOCK_TOKEN_REFUSED.inc()
            what = "write" if access == block_tokens.WRITE else "read"
            raise CurvineError(ErrorKind.PERMISSION,
                               f"{field}: missing or wrong {what} token for block "
                               f"{block_id:016x} (tokens come from the master: GetBlocks, "
                               f"AddBlock)")

    def close(self) -> None:
        self.idle.close()

    def _next(self, requests, watched: Watched):
        """The next message of a client stream, or None at its end; an idle stream the
        watchdog cancelled is TIMEOUT (whatever gRPC makes of the cancellation)."""
        try:
            req = next(requests, None)
        except grpc.RpcError:
            if not watched.cancelled:
                raise
            req = None
        if watched.cancelled:
            raise CurvineError(ErrorKind.TIMEOUT, f"stream: no message for "
                                                  f"{self.idle.idle_timeout:g}s; cancelled")
        watched.touch()
        return req

    @contextlib.contextmanager
    def _stream_slot(self, method: str):
        with self._streams_lock:
            full = self.max_streams and self._streams >= self.max_streams
            if not full:
                self._streams += 1
        if full:
            STREAMS_REFUSED_BUSY.labels(method=method).inc()
            raise CurvineError(ErrorKind.BUSY, f"{method}: {self.max_streams} block streams "
                                               "open on this worker; try again")
        try:
            yield
        finally:
            with self._streams_lock:
                self._streams -= 1

    @handler
    def WriteBlock(self, request_iterator, context):
        with self._stream_slot("WriteBlock"), \
                self.idle.watch(context, "WriteBlock") as watched:
            return self._write_block(iter(request_iterator), watched)

    def _write_block(self, requests, watched: Watched):
        req = self._next(requests, watched)
        if req is None:
            raise invalid("header", "empty stream")
        if not req.HasField("header"):
            raise invalid("header", "missing from the first message")
        block_id = check_block_id(req.header.block_id, "header.block_id")
        expected = req.header.expected_length
        limit = self.block_size
        if expected > limit:
            raise invalid("header.expected_length",
                          f"{expected} exceeds the block size {limit}")
        self._authorize(block_id, req.header.token, block_tokens.WRITE, "header.token")
        with self.store.begin_write(block_id, expected) as writer:
            while True:
                data = req.data  # each access copies the field: read it once
                n = len(data)
                if n > MAX_WRITE_MESSAGE:
                    raise invalid("data", f"a message carries {n} bytes, at most "
                                          f"{MAX_WRITE_MESSAGE} are allowed")
                if writer.length + n > limit:
                    raise invalid("data", f"block {block_id:016x} grows beyond the block "
                                          f"size {limit}")
                writer.append(data)
                del data
                if req.finish:
                    break
                req = self._next(requests, watched)
                if req is None:
                    raise invalid("finish", "the stream ended without a finish message")
                if req.HasField("header"):
                    raise invalid("header", "allowed only in the first message")
            if expected and writer.length != expected:
                raise invalid("header.expected_length",
                              f"announced {expected} bytes, received {writer.length}")
            length, crc = writer.finish(req.checksum)
        WORKER_WRITTEN_REMOTE.inc(length)
        log.debug("wrote block %016x: %d bytes", block_id, length)
        return worker_pb2.WriteBlockReply(block_id=block_id, length=length, checksum=crc)

    @stream_handler
    def ReadBlock(self, request, context):
        block_id = check_block_id(request.block_id, "block_id")
        chunk = request.chunk_size or READ_CHUNK
        if chunk > READ_CHUNK:
            raise invalid("chunk_size", f"{chunk} is larger than {READ_CHUNK}")
        self._authorize(block_id, request.token, block_tokens.READ, "token")
        with self._stream_slot("ReadBlock"):
            yield from self._read_block(block_id, request, chunk, context)

    def _read_block(self, block_id: int, request, chunk: int, context):
        chunks = self.store.read(block_id, request.offset, request.length, chunk)
        sent = 0
        # A yield returns once gRPC has sent the message: a reader that stops reading
        # blocks it on flow control until the watchdog cancels the call.
        with self.idle.watch(context, "ReadBlock") as watched:
            try:
                # counted before each yield: a client that has what it asked for may end
                # the stream, and the generator is then closed at that yield
                for data in chunks:
                    sent += len(data)
                    # raw replies are framed by wire.encode_read_reply
                    yield data if self.raw_read_replies else worker_pb2.ReadBlockReply(data=data)
                    watched.touch()
            finally:
                chunks.close()
                WORKER_READ_REMOTE.inc(sent)  # once per stream: no lock per chunk

    @handler
    def AdoptBlock(self, request, context):
        block_id, length, crc = self.adopt(request, "")
        return worker_pb2.WriteBlockReply(block_id=block_id, length=length, checksum=crc)

    def adopt(self, request, where: str) -> tuple[int, int, int]:
        """Finalise the client's staging file as its block (AdoptBlock, and the domain
        socket's adopt): (block id, length, crc32).  ``where``: the fields' prefix in
        error messages."""
        block_id = check_block_id(request.block_id, f"{where}block_id")
        if request.length > self.block_size:
            raise invalid(f"{where}length", f"{request.length} exceeds the block size "
                                            f"{self.block_size}")
        self._authorize(block_id, request.token, block_tokens.WRITE, f"{where}token")
        length, crc = self.store.adopt(block_id, request.path, request.length, request.checksum)
        WORKER_WRITTEN_SHORT_CIRCUIT.inc(length)
        log.debug("adopted block %016x: %d bytes", block_id, length)
        return block_id, length, crc

    @handler
    def DeleteBlocks(self, request, context):
        ids = [check_block_id(b, f"block_ids[{i}]") for i, b in enumerate(request.block_ids)]
        if self.block_key is not UNCHECKED and len(request.tokens) != len(ids):
            raise invalid("tokens", f"{len(request.tokens)} tokens for {len(ids)} block ids "
                                    "(one write token per block id)")
        for i, b in enumerate(ids):
            self._authorize(b, request.tokens[i] if i < len(request.tokens) else b"",
                            block_tokens.WRITE, f"tokens[{i}]", here=False)
        removed = self.store.delete(ids)
        log.debug("deleted %d of %d blocks on request", removed, len(ids))
        return common_pb2.Empty()

    @handler
    def GetBlockInfo(self, request, context):
        block_id = check_block_id(request.block_id, "block_id")
        self._authorize(block_id, request.token, block_tokens.READ, "token")
        length, path = self.store.info(block_id)
        return worker_pb2.BlockInfoReply(block_id=block_id, length=length, path=path)



def add_to_server(servicer: WorkerServicer, server: grpc.Server) -> None:
    """Register the Worker service (instead of the generated add_WorkerServicer_to_server)
    with ReadBlock replies framed by hand (the servicer yields raw data bytes) and
    requests that do not parse refused as INVALID without a traceback."""
    servicer.raw_read_replies = True
    checked_service.add_service(server, worker_pb2.DESCRIPTOR.services_by_name["Worker"],
                                servicer, {"ReadBlock": wire.encode_read_reply})
