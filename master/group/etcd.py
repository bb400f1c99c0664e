"""The etcd v3 client of the master group: the few KV and lease calls it needs.

Sync gRPC stubs from etcd 3.4's own protos (proto/etcd_rpc.proto): the committer and
the leadership thread are plain threads, and the only maintained Python client of
etcd v3 (aetcd) is asyncio-only.  Every call carries a deadline.  With several
endpoints a call that finds its endpoint unreachable moves the next call to the next
one (etcd forwards writes to its own leader, so any member will do); the call itself
fails with UNAVAILABLE and its caller decides whether to retry.
"""

from __future__ import annotations

import logging
import threading

import grpc

from curvine.common.errors import CurvineError, ErrorKind
from curvine.proto import etcd_rpc_pb2 as pb
from curvine.proto import etcd_rpc_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

CALL_TIMEOUT = 2.0  # seconds: etcd on a healthy quorum answers in milliseconds
_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# gRPC backs off reconnecting up to 120 s by default: an etcd back after an outage
# would then stay unused for minutes.  A member retries within a second.
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000)]
# a reply may hold a page of journal batches (etcd_journal.PAGE keys of up to 1 MiB,
# etcd_journal.CHUNK_BYTES): gRPC's default 4 MiB would refuse a page of big batches
MAX_REPLY_BYTES = 160 << 20


def prefix_end(prefix: bytes) -> bytes:
    """The range_end that makes a Range or DeleteRange cover every key under ``prefix``."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


class Etcd:
    """Channels to ``endpoints`` ("host:port"), one in use at a time."""

    def __init__(self, endpoints: list[str], timeout: float = CALL_TIMEOUT):
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._index = 0
        self._channels = [grpc.insecure_channel(e, options=CHANNEL_OPTIONS + [
                              ("grpc.max_receive_message_length", MAX_REPLY_BYTES)])
                          for e in self.endpoints]
        self._kv = [pb_grpc.KVStub(c) for c in self._channels]
        self._lease = [pb_grpc.LeaseStub(c) for c in self._channels]

    def close(self) -> None:
        for c in self._channels:
            c.close()

    def _call(self, stubs: list, method: str, request, timeout: float | None):
        return self._attempt(method, lambda i: getattr(stubs[i], method)(
            request, timeout=timeout or self.timeout))

    def _attempt(self, method: str, call):
        """``call(i)`` on endpoint i; an unreachable endpoint moves the next call on."""
        with self._lock:
            i = self._index
        try:
            return call(i)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            if code in _UNREACHABLE and len(self.endpoints) > 1:
                with self._lock:
                    if self._index == i:
                        self._index = (i + 1) % len(self.endpoints)
            kind = ErrorKind.UNAVAILABLE if code in _UNREACHABLE else ErrorKind.IO
            raise CurvineError(kind, f"etcd {self.endpoints[i]} {method}: "
                                     f"{code.name if code else 'error'}: "
                                     f"{e.details() if hasattr(e, 'details') else e}") from None

    # -- KV
    def get(self, key: bytes, timeout: float | None = None):
        """The KeyValue at ``key`` (linearizable), or None."""
        kvs = self._call(self._kv, "Range", pb.RangeRequest(key=key), timeout).kvs
        return kvs[0] if kvs else None

    def range(self, key: bytes, range_end: bytes, limit: int = 0, descending: bool = False,
              keys_only: bool = False, timeout: float | None = None) -> pb.RangeResponse:
        """Keys in [key, range_end), by key (linearizable).

        Ascending asks for no sort order: etcd returns keys in key order anyway, and
        etcd 3.4 answers a Range with any sort order by reading EVERY key of the range
        (values included) and sorting before it applies ``limit`` (a page of 64
        journal keys out of 20,000 took 22 ms instead of 1.8).  ``descending`` pays
        that: keep its range small."""
        order = pb.RangeRequest.DESCEND if descending else pb.RangeRequest.NONE
        return self._call(self._kv, "Range", pb.RangeRequest(
            key=key, range_end=range_end, limit=limit, sort_order=order,
            sort_target=pb.RangeRequest.KEY, keys_only=keys_only), timeout)

    def put(self, key: bytes, value: bytes, lease: int = 0,
            timeout: float | None = None) -> pb.PutResponse:
        return self._call(self._kv, "Put", pb.PutRequest(key=key, value=value, lease=lease),
                          timeout)

    def delete_range(self, key: bytes, range_end: bytes = b"",
                     timeout: float | None = None) -> pb.DeleteRangeResponse:
        return self._call(self._kv, "DeleteRange",
                          pb.DeleteRangeRequest(key=key, range_end=range_end), timeout)

    def txn(self, compare: list, success: list, failure: list = (),
            timeout: float | None = None) -> pb.TxnResponse:
        return self._call(self._kv, "Txn", pb.TxnRequest(compare=compare, success=success,
                                                         failure=list(failure)), timeout)

    def compact(self, revision: int, timeout: float | None = None) -> None:
        self._call(self._kv, "Compact", pb.CompactionRequest(revision=revision), timeout)

    # -- leases
    def lease_grant(self, ttl: int, timeout: float | None = None) -> int:
        reply = self._call(self._lease, "LeaseGrant", pb.LeaseGrantRequest(TTL=ttl), timeout)
        if reply.error:
            raise CurvineError(ErrorKind.UNAVAILABLE, f"etcd LeaseGrant: {reply.error}")
        return reply.ID

    def lease_keepalive(self, lease: int, timeout: float | None = None) -> int:
        """Renew ``lease`` once; returns its new TTL (0: the lease is gone)."""
        def once(i: int) -> int:
            replies = self._lease[i].LeaseKeepAlive(iter([pb.LeaseKeepAliveRequest(ID=lease)]),
                                                    timeout=timeout or self.timeout)
            reply = next(iter(replies), None)
            return reply.TTL if reply is not None else 0
        return self._attempt("LeaseKeepAlive", once)

    def lease_revoke(self, lease: int, timeout: float | None = None) -> None:
        self._call(self._lease, "LeaseRevoke", pb.LeaseRevokeRequest(ID=lease), timeout)


# Txn building blocks
def created_at(key: bytes, revision: int) -> pb.Compare:
    """The compare that holds while ``key`` is the one created at ``revision`` (0: absent)."""
    return pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.CREATE, key=key,
                      create_revision=revision)


def put_op(key: bytes, value: bytes, lease: int = 0) -> pb.RequestOp:
    return pb.RequestOp(request_put=pb.PutRequest(key=key, value=value, lease=lease))


def get_op(key: bytes) -> pb.RequestOp:
    return pb.RequestOp(request_range=pb.RangeRequest(key=key))
