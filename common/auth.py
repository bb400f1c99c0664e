"""Credentials: every RPC carries ``authorization: Bearer <token>``.

Three roles hold different tokens (docs/security.md, "Roles"):

- the **client** token (``security.token_file``): every mount, connector and CLI, and
  the daemons themselves; namespace and data calls;
- the **worker** token (``security.worker_token_file``): masters and workers only;
  the master serves registration, heartbeats and block reports (and so the block-token
  key) on its worker port to this token alone.  Required whenever a client token is
  set, and must differ from it;
- the **master** token (``security.master_token_file``, optional): the masters of a
  group only; the one credential a master's worker port takes for ``FetchCheckpoint``
  (the whole namespace) when set.  Without it, that call takes the worker token.

The tokens live in files (never on a command line, never logged).  This module reads
and writes those files and holds the two interceptors: :func:`with_token` makes a
channel send a token, :class:`TokenServerInterceptor` refuses calls without one of
the tokens a server accepts (UNAUTHENTICATED, counted in
``curvine_rpc_unauthenticated_total``).  Which tokens a process holds, sends and
accepts is its ``common.security.Security``, which ``common.rpc`` is given.

No token configured = no checks: the default for a trusted single-tenant network.
"""

from __future__ import annotations

import collections
import hmac
import os

import grpc

from .metrics import RPC_UNAUTHENTICATED

METADATA_KEY = "authorization"
SCHEME = "Bearer "
TOKEN_FILE_KEY = "security.token_file"
TOKEN_FILE_NAME = "token"  # `curvine local up` writes BASE/token
WORKER_TOKEN_FILE_KEY = "security.worker_token_file"
WORKER_TOKEN_FILE_NAME = "worker-token"  # and BASE/worker-token
MASTER_TOKEN_FILE_KEY = "security.master_token_file"
MASTER_TOKEN_FILE_NAME = "master-token"  # and, with several masters, BASE/master-token


class TokenError(Exception):
    """The token file named in the config cannot be used (one line, names key and file)."""


def read_token_file(path: str, key: str = TOKEN_FILE_KEY) -> str:
    """The token in ``path`` with surrounding whitespace stripped; TokenError (naming
    ``key``) if the file is unreadable, empty, or holds more than one line (never says
    what it holds)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(4097)
    except OSError as e:
        raise TokenError(f"{key}: cannot read {path}: "
                         f"{e.strerror or e}") from None
    if len(raw) > 4096:
        raise TokenError(f"{key}: {path} is larger than 4096 bytes")
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenError(f"{key}: {path} must hold printable ASCII") from None
    if not token:
        raise TokenError(f"{key}: {path} is empty")
    if not all(33 <= ord(ch) <= 126 for ch in token):
        raise TokenError(f"{key}: {path} must hold one word of printable "
                         "ASCII (no spaces or control characters)")
    return token


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    import secrets
    return secrets.token_urlsafe(32)


def write_token_file(path: str, token: str | None = None) -> str:
    """Create ``path`` (mode 0600) holding a token; returns the token."""
    token = token or new_token()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    return token


# -- client side ----------------------------------------------------------------------
class _TokenClientInterceptor(grpc.UnaryUnaryClientInterceptor,
                              grpc.UnaryStreamClientInterceptor,
                              grpc.StreamUnaryClientInterceptor,
                              grpc.StreamStreamClientInterceptor):
    """Adds ``token`` to every call's metadata."""

    def __init__(self, token: str):
        self._value = SCHEME + token

    def _details(self, details):
        metadata = [m for m in (details.metadata or ()) if m[0] != METADATA_KEY]
        metadata.append((METADATA_KEY, self._value))
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata",
                                                          "credentials", "wait_for_ready",
                                                          "compression")),
                   grpc.ClientCallDetails):
    """A call's details with other metadata (grpc's own type cannot be built)."""


def with_token(channel: grpc.Channel, token: str) -> grpc.Channel:
    """``channel`` sending ``token`` on every call (``channel`` itself when it is "")."""
    if not token:
        return channel
    return grpc.intercept_channel(channel, _TokenClientInterceptor(token))


# -- server side ----------------------------------------------------------------------
class TokenServerInterceptor(grpc.ServerInterceptor):
    """Refuses every call (unary and streaming) whose metadata carries none of
    ``tokens`` (a server accepts the tokens of the roles it serves).

    ``methods`` maps full method names (``/package.Service/Method``) to the tokens
    that method takes instead, and the credential they are, as a message names it
    ("the master credential (security.master_token_file)").  A call carrying a token
    this server knows, but not one its method takes, is PERMISSION_DENIED saying
    which credential it needs; a call carrying none of them is UNAUTHENTICATED."""

    def __init__(self, tokens, methods=None):
        tokens = [tokens] if isinstance(tokens, str) else [t for t in tokens if t]
        if not tokens or not all(tokens):
            raise ValueError("TokenServerInterceptor needs non-empty tokens")
        self._expected = [(SCHEME + t).encode() for t in tokens]
        self._methods = {}
        for name, (taken, what) in (methods or {}).items():
            taken = [t for t in taken if t]
            if not taken:
                raise ValueError(f"TokenServerInterceptor: no token for {name}")
            self._methods[name] = ([(SCHEME + t).encode() for t in taken], what)
        known = list(self._expected)
        for taken, _ in self._methods.values():
            known += [t for t in taken if t not in known]
        self._known = known
        self._only = ", ".join(sorted(n.rsplit("/", 1)[-1] for n in self._methods))

    @staticmethod
    def _matches(got: bytes | None, expected) -> bool:
        # every candidate compared: the time taken says nothing of which matched
        return got is not None and sum(hmac.compare_digest(got, e) for e in expected) > 0

    @staticmethod
    def _presented(metadata) -> bytes | None:
        for key, value in metadata or ():
            if key == METADATA_KEY:
                return value.encode() if isinstance(value, str) else bytes(value)
        return None

    def intercept_service(self, continuation, handler_call_details):
        got = self._presented(handler_call_details.invocation_metadata)
        full = handler_call_details.method
        expected, what = self._methods.get(full, (self._expected, ""))
        if self._matches(got, expected):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        method = full.rsplit("/", 1)[-1] if handler else "unknown"
        if self._matches(got, self._known):  # a credential of this server, another role's
            if what:
                message = f"{method} takes {what} only"
            else:
                message = f"this credential is taken here for {self._only} only"
            return _refusal(handler, _denier(message))
        # Label by known method only: random names must not grow the metric.
        RPC_UNAUTHENTICATED.labels(method=method).inc()
        return _refusal(handler)


def _refuse(request_or_iterator, context):
    context.abort(grpc.StatusCode.UNAUTHENTICATED,
                  "missing or wrong cluster token (metadata 'authorization: Bearer ...'; "
                  f"see {TOKEN_FILE_KEY})")


def _denier(message: str):
    def deny(request_or_iterator, context):
        context.abort(grpc.StatusCode.PERMISSION_DENIED, message)
    return deny


def _refusal(handler, refuse=_refuse) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that only refuses (the request, which
    may be large or endless, is never read)."""
    if handler is None or not (handler.request_streaming or handler.response_streaming):
        return grpc.unary_unary_rpc_method_handler(refuse)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    return grpc.unary_stream_rpc_method_handler(refuse)
