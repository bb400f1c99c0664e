"""The etcd v3 client of the master group: the few KV and lease calls it needs.

Sync gRPC stubs from etcd 3.4's own protos (proto/src/curvine/proto/etcd_rpc.proto): the committer and
the leadership thread are plain threads, and the only maintained Python client of
etcd v3 (aetcd) is asyncio-only.  Every call carries a deadline.  With several
endpoints a call that finds its endpoint unreachable moves the next call to the next
one (etcd forwards writes to its own leader, so any member will do); the call itself
fails with UNAVAILABLE and its caller decides whether to retry.

TLS and authentication (master/group/etcd_access.py builds an Etcd from [master]):
``credentials`` make every channel a TLS one (etcd's CA, and a client certificate for
an etcd with --client-cert-auth).  With ``user`` the client authenticates (etcd's Auth
service) before its first call and sends the token as the gRPC metadata ``token`` on
every call.  etcd's simple tokens expire after --auth-token-ttl unused and are
forgotten when etcd restarts (they live in its memory): a call that etcd answers
"invalid auth token" authenticates again, once, and is sent again.  The
errors name the [master] key to look at: a TLS handshake that failed, a wrong
password, a user without the permission.
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


# etcd's answers (etcdserver/api/v3rpc/rpctypes) that the client acts on
_INVALID_TOKEN = "invalid auth token"  # expired, or etcd restarted since
_NO_USER = "user name is empty"  # auth is on and the call carried no token
_AUTH_FAILED = "authentication failed"  # wrong user or password
_AUTH_OFF = "authentication is not enabled"


_NONE = object()


class _AuthenticateFailed(Exception):
    """The Authenticate a call needed failed with ``error`` (reported as such)."""

    def __init__(self, error: grpc.RpcError):
        super().__init__(error)
        self.error = error


def _details(e: grpc.RpcError) -> str:
    return str(e.details() if hasattr(e, "details") else e)


def _token_refused(e: grpc.RpcError) -> bool:
    """etcd refused the call's auth token (or its lack of one): authenticating again
    may help."""
    details = _details(e)
    return _INVALID_TOKEN in details or _NO_USER in details


def _tls_hint(details: str, tls: bool) -> str:
    """What to check when a connection to etcd failed the way TLS mismatches fail (the
    call itself only says UNAVAILABLE, as for an etcd that is down)."""
    d = details.lower()
    if tls and "certificate_verify_failed" in d:
        return (" (TLS: etcd's server certificate does not verify with master.etcd_ca_file:"
                " not the CA that signed it, or it does not name this endpoint)")
    if tls and ("unwrap failed" in d or "bad_certificate" in d
                or "certificate_required" in d):
        return (" (TLS: etcd refused this master's client certificate: with etcd's "
                "--client-cert-auth, master.etcd_cert_file and master.etcd_key_file must "
                "name a certificate signed by etcd's --trusted-ca-file)")
    if tls and ("handshake" in d or "ssl" in d):
        return (" (TLS handshake with etcd failed: does etcd serve TLS there? see "
                "master.etcd_ca_file, master.etcd_cert_file, master.etcd_key_file)")
    if not tls and "socket closed" in d:
        return (" (if etcd serves TLS there, set master.etcd_ca_file, and "
                "master.etcd_cert_file and master.etcd_key_file for --client-cert-auth)")
    return ""


def prefix_end(prefix: bytes) -> bytes:
    """The range_end that makes a Range or DeleteRange cover every key under ``prefix``."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


class Etcd:
    """Channels to ``endpoints`` ("host:port"), one in use at a time."""

    def __init__(self, endpoints: list[str], timeout: float = CALL_TIMEOUT, *,
                 credentials: grpc.ChannelCredentials | None = None, user: str = "",
                 password: str = ""):
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self.tls = credentials is not None
        self.user = user
        self._password = password
        self._lock = threading.Lock()
        self._index = 0
        options = CHANNEL_OPTIONS + [("grpc.max_receive_message_length", MAX_REPLY_BYTES)]
        self._channels = [grpc.secure_channel(e, credentials, options=options) if credentials
                          else grpc.insecure_channel(e, options=options)
                          for e in self.endpoints]
        self._kv = [pb_grpc.KVStub(c) for c in self._channels]
        self._lease = [pb_grpc.LeaseStub(c) for c in self._channels]
        self._auth = [pb_grpc.AuthStub(c) for c in self._channels]
        # the token's metadata, taken under _auth_lock (one Authenticate at a time;
        # the calls waiting for it would need it anyway)
        self._auth_lock = threading.Lock()
        self._authed = False  # False: authenticate before the next call
        self._token_md: tuple | None = None  # None: no token (no user, or auth off)
        self.authentications = 0  # Authenticate calls that returned a token
        self._auth_off_logged = False

    def close(self) -> None:
        for c in self._channels:
            c.close()

    def _call(self, stubs: list, method: str, request, timeout: float | None):
        return self._attempt(method, lambda i, md: getattr(stubs[i], method)(
            request, timeout=timeout or self.timeout, metadata=md), timeout)

    def _attempt(self, method: str, call, timeout: float | None = None):
        """``call(i, metadata)`` on endpoint i; an unreachable endpoint moves the next
        call on; an expired or unknown auth token is renewed once and the call sent
        again."""
        with self._lock:
            i = self._index
        try:
            md = self._metadata(i, timeout)
            try:
                return call(i, md)
            except grpc.RpcError as e:
                if not self.user or not _token_refused(e):
                    raise
                log.debug("etcd %s refused the auth token (%s): authenticating again",
                          self.endpoints[i], _details(e))
                return call(i, self._metadata(i, timeout, refused=md))
        except (grpc.RpcError, _AuthenticateFailed) as failure:
            e = failure
            if isinstance(failure, _AuthenticateFailed):
                e, method = failure.error, "Authenticate"
            code = e.code() if hasattr(e, "code") else None
            if code in _UNREACHABLE and len(self.endpoints) > 1:
                with self._lock:
                    if self._index == i:
                        self._index = (i + 1) % len(self.endpoints)
            kind, hint = self._explain(code, _details(e))
            raise CurvineError(kind, f"etcd {self.endpoints[i]} {method}: "
                                     f"{code.name if code else 'error'}: "
                                     f"{_details(e)}{hint}") from None

    def _metadata(self, i: int, timeout: float | None, refused=_NONE):
        """The metadata of a call on endpoint i: the auth token, got first if there is
        none yet or etcd refused the metadata ``refused`` that is still the current
        (another thread may have renewed it meanwhile)."""
        if not self.user:
            return None
        with self._auth_lock:
            if not self._authed or (refused is not _NONE and self._token_md == refused):
                try:
                    self._authenticate(i, timeout)
                except grpc.RpcError as e:
                    raise _AuthenticateFailed(e) from None
            return self._token_md

    def _authenticate(self, i: int, timeout: float | None) -> None:
        try:
            reply = self._auth[i].Authenticate(
                pb.AuthenticateRequest(name=self.user, password=self._password),
                timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            if _AUTH_OFF not in _details(e):
                raise
            # an etcd without `auth enable` takes calls without a token; it would
            # refuse them once auth is on ("user name is empty"), and then this
            # client authenticates
            self._authed, self._token_md = True, None
            if not self._auth_off_logged:
                self._auth_off_logged = True
                log.warning("master.etcd_user is set but etcd %s has authentication off "
                            "(etcdctl auth enable): whoever reaches it may read and "
                            "change the group's keys", self.endpoints[i])
            return
        self._authed, self._token_md = True, (("token", reply.token),)
        self.authentications += 1

    def _explain(self, code, details: str) -> tuple[ErrorKind, str]:
        """The ErrorKind of a failed call and a hint naming what to check."""
        if code in _UNREACHABLE:
            return ErrorKind.UNAVAILABLE, _tls_hint(details, self.tls)
        if code == grpc.StatusCode.PERMISSION_DENIED:
            who = (f"etcd user {self.user!r} (master.etcd_user)" if self.user
                   else "the etcd user of this master's client certificate")
            return ErrorKind.PERMISSION, (f" ({who} needs a role with readwrite on the "
                                          "group's key prefix /curvine/<cluster.name>/)")
        if _AUTH_FAILED in details:
            return ErrorKind.UNAUTHENTICATED, (
                f" (etcd user {self.user!r} of master.etcd_user with the password in "
                "master.etcd_password_file)")
        if code == grpc.StatusCode.UNAUTHENTICATED or _NO_USER in details:
            if not self.user:
                return ErrorKind.UNAUTHENTICATED, (
                    " (etcd has authentication on: set master.etcd_user and "
                    "master.etcd_password_file)")
            return ErrorKind.UNAUTHENTICATED, f" (etcd user {self.user!r}, master.etcd_user)"
        return ErrorKind.IO, ""

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
        def once(i: int, md) -> int:
            replies = self._lease[i].LeaseKeepAlive(iter([pb.LeaseKeepAliveRequest(ID=lease)]),
                                                    timeout=timeout or self.timeout,
                                                    metadata=md)
            reply = next(iter(replies), None)
            return reply.TTL if reply is not None else 0
        return self._attempt("LeaseKeepAlive", once, timeout)

    def lease_revoke(self, lease: int, timeout: float | None = None) -> None:
        self._call(self._lease, "LeaseRevoke", pb.LeaseRevokeRequest(ID=lease), timeout)


# Txn building blocks
def created_at(key: bytes, revision: int) -> pb.Compare:
    """The compare that holds while ``key`` is the one created at ``revision`` (0: absent)."""
    return pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.CREATE, key=key,
                      create_revision=revision)


def leased_by(key: bytes, lease: int) -> pb.Compare:
    """The compare that holds while ``key`` exists and is held by ``lease``."""
    return pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.LEASE, key=key, lease=lease)


def put_op(key: bytes, value: bytes, lease: int = 0) -> pb.RequestOp:
    return pb.RequestOp(request_put=pb.PutRequest(key=key, value=value, lease=lease))


def get_op(key: bytes) -> pb.RequestOp:
    return pb.RequestOp(request_range=pb.RangeRequest(key=key))
