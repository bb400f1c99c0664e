"""gRPC plumbing shared by every process: servers, channels, error mapping, retries.

Servicer methods are wrapped with :func:`handler`, which turns a ``CurvineError``
into a gRPC status plus the ``curvine-error-kind`` trailer, and anything unexpected
into INTERNAL after logging it once.  Clients call through :class:`RpcClient`, which
puts a deadline on every call, retries idempotent calls while the peer is
unavailable, and raises ``CurvineError``.

Servers, ports and channels are made with the process's ``Security``
(common/security.py), always passed by the caller: the tokens a server accepts, TLS on
ports and channels, the token a channel sends.  None of them has a default: a caller
that forgets it fails at once instead of running without a credential
(``NO_SECURITY`` says "open cluster, plaintext" where that is meant).  The one default
is ``make_server``'s ``accept=("client",)``, which can only refuse more.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from concurrent import futures
from typing import Any, Callable, Iterable, Mapping

import grpc

from . import auth, metrics, tls
from .errors import ERROR_KIND_KEY, LEADER_KEY, CurvineError, ErrorKind, from_rpc_error, status_code
from .security import CLIENT, CREDENTIAL_KEYS, Role, Security

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 64 << 20  # block reports and big directory pages; data messages are 1 MiB
# Keepalive: clients ping every KEEPALIVE_MS (also while no call is open), and servers
# accept pings that often.  gRPC servers by default allow one ping without data per
# 5 minutes and send GOAWAY "too_many_pings" after two more: a mount's quiet lease
# session was cut that way twice in 5 minutes.  The two numbers must agree.
KEEPALIVE_MS = 30_000
SERVER_MIN_PING_INTERVAL_MS = KEEPALIVE_MS // 2  # some slack for timer jitter
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MESSAGE_LIMIT),
    ("grpc.max_send_message_length", MESSAGE_LIMIT),
    ("grpc.keepalive_time_ms", KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),  # pings keep an idle connection checked
    ("grpc.enable_retries", 0),  # we retry ourselves, with request ids
    # A restarted master or worker must be found again within seconds, not the
    # default two minutes of reconnect backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# Backoff of retries while a peer is unavailable: a restarted master is found again
# within about RETRY_MAX (plus the channel's reconnect backoff above) of its start.
RETRY_FIRST = 0.05
RETRY_MAX = 0.5
# Connections (docs/security.md, "Limits"): one that carries no call for
# CONNECTION_IDLE_MS is sent a GOAWAY, and gRPC closes it about as long again after
# (measured: 30 s -> closed at 61 s, 60 s -> 110 s), so an idle connection goes after
# about a minute, like the call port's (master.stream_idle_timeout); the client's
# channel reconnects at its next call.  Every connection is closed CONNECTION_AGE_MS
# after it opened (+-10%, gRPC's jitter): new calls go to a new one at once, the calls
# open on it get CONNECTION_AGE_GRACE_MS to end, then are cut.  The age is the only
# bound gRPC offers on a message that never finishes arriving (it is buffered whole,
# up to the port's message limit, until its connection closes).  Not on the master's
# client port (``make_server(max_age=False)``): a mount's lease session lives there,
# and a session cut makes the master wait out its leases (lease_time, 30 s) before the
# mutations that must revoke them (measured: an unlink waited 30 s).
CONNECTION_IDLE_MS = 30_000
CONNECTION_AGE_MS = 600_000
CONNECTION_AGE_GRACE_MS = 60_000
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MESSAGE_LIMIT),
    ("grpc.max_send_message_length", MESSAGE_LIMIT),
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", SERVER_MIN_PING_INTERVAL_MS),
    ("grpc.http2.min_ping_interval_without_data_ms", SERVER_MIN_PING_INTERVAL_MS),
    ("grpc.max_connection_idle_ms", CONNECTION_IDLE_MS),
    ("grpc.max_connection_age_ms", CONNECTION_AGE_MS),
    ("grpc.max_connection_age_grace_ms", CONNECTION_AGE_GRACE_MS),
]


def abort(context: grpc.ServicerContext, err: CurvineError) -> None:
    trailers = [(ERROR_KIND_KEY, str(int(err.kind)))]
    if err.kind == ErrorKind.NOT_LEADER:
        trailers.append((LEADER_KEY, err.message))
    context.set_trailing_metadata(tuple(trailers))
    context.abort(status_code(err.kind), err.message)


def handler(fn: Callable) -> Callable:
    """Wrap a unary servicer method: domain errors become statuses, no tracebacks leak.

    Each call is counted and timed (common/metrics.py) by method and status code.
    ``wrapper.__wrapped__`` is the body plus that accounting, without the error
    mapping: callers that map errors themselves (the master's Calls stream) call it and
    so are counted under the same method."""
    timed = _timed(fn)

    @functools.wraps(fn)
    def wrapper(self, request, context):
        try:
            return timed(self, request, context)
        except CurvineError as e:
            abort(context, e)
        except Exception as e:  # noqa: BLE001 - the one place unknown errors become EIO
            if isinstance(e, grpc.RpcError) or _is_abort(e):
                raise
            log.exception("%s failed", fn.__name__)
            abort(context, CurvineError(ErrorKind.IO, f"internal error in {fn.__name__}: {e}"))

    wrapper.__wrapped__ = timed
    return wrapper


def stream_handler(fn: Callable) -> Callable:
    """Like :func:`handler` for server-streaming methods (generators); the time counted
    is the whole stream's."""
    m = metrics.MethodMetrics(fn.__name__)

    @functools.wraps(fn)
    def wrapper(self, request, context):
        started = time.perf_counter()
        code = "OK"
        try:
            yield from fn(self, request, context)
        except CurvineError as e:
            code = status_code(e.kind).name
            abort(context, e)
        except GeneratorExit:
            code = "CANCELLED"  # the client went away mid-stream
            raise
        except Exception as e:  # noqa: BLE001
            if isinstance(e, grpc.RpcError) or _is_abort(e):
                code = _abort_code(context, e)
                raise
            code = "INTERNAL"
            log.exception("%s failed", fn.__name__)
            abort(context, CurvineError(ErrorKind.IO, f"internal error in {fn.__name__}: {e}"))
        finally:
            m.finished(started, code)

    return wrapper


def _timed(fn: Callable) -> Callable:
    """``fn`` counted and timed per method and status code; exceptions pass through."""
    m = metrics.MethodMetrics(fn.__name__)

    @functools.wraps(fn)
    def timed(self, request, context):
        started = time.perf_counter()
        try:
            reply = fn(self, request, context)
        except CurvineError as e:
            m.finished(started, status_code(e.kind).name)
            raise
        except BaseException as e:
            m.finished(started, _abort_code(context, e)
                       if isinstance(e, grpc.RpcError) or _is_abort(e) else "INTERNAL")
            raise
        m.finished(started)
        return reply

    return timed


def _abort_code(context, e: BaseException) -> str:
    """The status of a call the handler aborted itself (context.abort) or whose own
    client call failed."""
    if isinstance(e, grpc.RpcError) and hasattr(e, "code"):
        return e.code().name
    code = getattr(context, "code", None)
    try:
        value = code() if callable(code) else None
    except Exception:  # noqa: BLE001 - older grpc: no code() on the context
        value = None
    return value.name if isinstance(value, grpc.StatusCode) else "UNKNOWN"


def _is_abort(e: Exception) -> bool:
    # grpc's context.abort raises a bare Exception subclass we cannot import by name.
    return type(e).__name__ == "_AbortedError" or (type(e) is Exception and not e.args)


def make_server(threads: int, interceptors: list | None = None,
                max_concurrent: int | None = None, *, security: Security,
                accept: Iterable[Role] = (CLIENT,),
                accept_methods: Mapping[str, Iterable[Role]] | None = None,
                max_message: int = MESSAGE_LIMIT, max_age: bool = True) -> grpc.Server:
    """A server for the calls of the roles ``accept`` ("client", "worker", "master"):
    with tokens in ``security``, every method refuses calls that carry none of those
    roles' tokens (common/auth.py).  ``accept_methods``: full method names
    (``/package.Service/Method``) that take the tokens of other roles instead (a token
    of the server's that its method does not take: PERMISSION_DENIED).
    ``max_message``: the largest message it receives (a larger one is refused
    RESOURCE_EXHAUSTED from its length prefix, before it is buffered).  ``max_age``:
    close connections CONNECTION_AGE_MS after they opened (see there)."""
    interceptors = list(interceptors or [])
    accepted = security.accepted(accept)
    if accepted:
        methods = {}
        for name, roles in (accept_methods or {}).items():
            roles = tuple(roles)
            what = " or ".join(f"the {r} credential ({CREDENTIAL_KEYS[r]})" for r in roles)
            methods[name] = (security.accepted(roles), what)
        interceptors.insert(0, auth.TokenServerInterceptor(accepted, methods))
    options = [(k, max_message if k == "grpc.max_receive_message_length" else v)
               for k, v in SERVER_OPTIONS
               if max_age or not k.startswith("grpc.max_connection_age")]
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rpc"),
        interceptors=interceptors,
        options=options,
        maximum_concurrent_rpcs=max_concurrent or threads * 4,
    )


def bind(server: grpc.Server, host: str, port: int, security: Security) -> int:
    """Bind ``host:port``, with TLS when ``security`` has it; returns the bound port."""
    if security.material is not None:
        try:
            creds = tls.server_credentials(security.material)
        except tls.TLSError as e:  # TLS on but no certificate to serve with
            raise CurvineError(ErrorKind.UNAVAILABLE, f"cannot serve {host}:{port}: {e}") from None
        bound = server.add_secure_port(f"{host}:{port}", creds)
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise CurvineError(ErrorKind.UNAVAILABLE, f"cannot bind {host}:{port}")
    return bound


def make_channel(address: str, security: Security) -> grpc.Channel:
    """The one place channels are made: TLS when ``security`` has it, and each call
    sends ``security.token`` (the client token, the worker token of
    ``security.as_worker()``, the master token of ``security.as_master()``; none in an
    open cluster)."""
    if security.channel_credentials is None:
        channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    else:
        channel = grpc.secure_channel(address, security.channel_credentials,
                                      options=CHANNEL_OPTIONS
                                      + tls.channel_options(security.material))
    return auth.with_token(channel, security.token)


class RpcClient:
    """A stub plus deadlines and retries, on a channel made with ``security``;
    thread-safe.

    ``call(name, request, idempotent=...)``: idempotent calls (reads, and mutations
    carrying a request id) are retried with backoff while the peer is UNAVAILABLE,
    for ``wait`` seconds in all, then raise UNAVAILABLE; ``close()`` ends the waiting
    at once.
    """

    def __init__(self, address: str, stub_cls: Any, *, security: Security,
                 timeout: float = 30.0, wait: float = 60.0):
        self.address = address
        self.timeout = timeout
        self.wait = wait
        self._channel = make_channel(address, security)
        self._stub = stub_cls(self._channel)
        self._closed = threading.Event()

    @property
    def stub(self) -> Any:
        return self._stub

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def call(self, method: str, request: Any, *, idempotent: bool = True,
             timeout: float | None = None, wait: float | None = None) -> Any:
        fn = getattr(self._stub, method)
        wait_s = self.wait if wait is None else wait
        deadline = time.monotonic() + wait_s
        delay = RETRY_FIRST
        while True:
            try:
                return fn(request, timeout=timeout or self.timeout)
            except ValueError:
                # grpc's answer to a call on a channel that ``close`` closed meanwhile (a
                # reporting thread racing its owner's shutdown): the caller's own error
                if self._closed.is_set():
                    raise CurvineError(ErrorKind.UNAVAILABLE,
                                       f"{method}: the client of {self.address} is closed"
                                       ) from None
                raise
            except grpc.RpcError as e:
                err = from_rpc_error(e)
                retry = idempotent and err.kind in (ErrorKind.UNAVAILABLE,) and not self._closed.is_set()
                left = deadline - time.monotonic()
                if not retry or left <= 0:
                    if retry and delay > RETRY_FIRST:  # it was retried: say for how long
                        err = CurvineError(err.kind, f"{method}: {self.address} unavailable "
                                                     f"for {wait_s:g}s ({err.message})")
                    raise err from None
                # The last attempt is made at the deadline itself: a caller waits the
                # whole ``wait`` (not up to one backoff step less) before it gives up.
                pause = min(delay * (0.5 + random.random()), left)
                log.debug("%s to %s unavailable, retrying in %.2fs", method, self.address, pause)
                if self._closed.wait(pause):
                    raise err from None
                delay = min(delay * 2, RETRY_MAX)

    def close(self) -> None:
        self._closed.set()
        self._channel.close()
