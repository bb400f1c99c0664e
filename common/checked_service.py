"""Register a gRPC service whose requests are parsed without tracebacks.

gRPC's own registration parses requests with ``Message.FromString``; bytes that are
not a valid message (truncated, bad UTF-8 in a string field) make it log a traceback
and answer INTERNAL.  Here a request that cannot be parsed becomes a ``Malformed``
marker, and the handler is never called with it: the client gets INVALID_ARGUMENT
naming ``request``, the daemon logs nothing.
"""

from __future__ import annotations

from typing import Callable, Iterator

import grpc
from google.protobuf import message as pb_message
from google.protobuf import message_factory

from .errors import invalid
from .rpc import abort


class Malformed:
    """A request whose bytes did not parse as ``type_name``."""

    __slots__ = ("type_name", "reason")

    def __init__(self, type_name: str, reason: str):
        self.type_name = type_name
        self.reason = reason

    def error(self):
        return invalid("request", f"not a valid {self.type_name}: {self.reason}")


def parser(cls) -> Callable[[bytes], object]:
    """``cls.FromString`` that returns a :class:`Malformed` instead of raising."""
    name = cls.DESCRIPTOR.name

    def parse(data: bytes):
        try:
            return cls.FromString(data)
        except (pb_message.DecodeError, ValueError, RuntimeError) as e:
            return Malformed(name, str(e) or type(e).__name__)

    return parse


def _checked_unary(fn):
    def call(request, context):
        if isinstance(request, Malformed):
            abort(context, request.error())
        return fn(request, context)
    return call


def _checked_stream(fn):
    def call(request, context):
        if isinstance(request, Malformed):
            abort(context, request.error())
        yield from fn(request, context)
    return call


def checked_requests(requests) -> Iterator:
    """A request stream that raises INVALID (a CurvineError) at a malformed message."""
    for r in requests:
        if isinstance(r, Malformed):
            raise r.error()
        yield r


def add_service(server: grpc.Server, service, servicer,
                serializers: dict[str, Callable] | None = None, methods=None) -> dict:
    """Register every method of ``service`` (a ServiceDescriptor), or those named in
    ``methods``, on ``server``, bound to the same-named methods of ``servicer``.
    ``serializers`` replaces the response serializer of named methods.
    Client-streaming methods receive their stream through :func:`checked_requests`.
    Returns the handlers by method name."""
    serializers = serializers or {}
    handlers = {}
    for method in service.methods:
        if methods is not None and method.name not in methods:
            continue
        req_cls = message_factory.GetMessageClass(method.input_type)
        reply_cls = message_factory.GetMessageClass(method.output_type)
        fn = getattr(servicer, method.name)
        kw = dict(request_deserializer=parser(req_cls),
                  response_serializer=serializers.get(method.name,
                                                      reply_cls.SerializeToString))
        if method.client_streaming:
            def streamed(requests, context, fn=fn):
                return fn(checked_requests(requests), context)
            make = (grpc.stream_stream_rpc_method_handler if method.server_streaming
                    else grpc.stream_unary_rpc_method_handler)
            handlers[method.name] = make(streamed, **kw)
        elif method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                _checked_stream(fn), **kw)
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _checked_unary(fn), **kw)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
    return handlers
