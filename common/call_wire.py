"""Framing of the master's call port (master/ports/call_port_server.py, the server, which describes
the protocol; fuse_client/call_port_trio.py, the mount's client in its trio loop;
client/master/call_port_blocking.py, the blocking client of the connector and the CLI), and what both
clients share.  Integers big-endian."""

from __future__ import annotations

import errno
import struct

from curvine.common.errors import CurvineError, ErrorKind

MAGIC = b"CVC1"
HELLO = struct.Struct(">4sH")  # magic, token length; then the token
ANSWER = struct.Struct(">4sB")  # magic, status
FRAME = struct.Struct(">I")  # payload length; then a master.Call or master.CallResult
ACCEPTED, UNAUTHENTICATED, BUSY = 0, 1, 2  # the answer's status


def hello(token: bytes) -> bytes:
    """A client's hello with its token."""
    return HELLO.pack(MAGIC, len(token)) + token


def check_answer(data: bytes) -> None:
    """The server's ANSWER to a hello: returns if accepted, else raises (OSError: not a
    call port; PortRefused: a wrong token or too many connections)."""
    magic, status = ANSWER.unpack(data)
    if magic != MAGIC:
        raise OSError(errno.EPROTO, "not a call port")
    if status != ACCEPTED:
        raise PortRefused(status)


class PortDown(Exception):
    """The call port cannot carry this call (nothing is known of its fate): the caller
    sends the same request another way (mutations keep their request id)."""


class PortRefused(Exception):
    def __init__(self, status: int):
        super().__init__({UNAUTHENTICATED: "wrong token", BUSY: "too many connections"}
                         .get(status, f"refused ({status})"))
        self.status = status


def reply_of(result):
    """The reply in a master.CallResult, or the master's error raised as a CurvineError."""
    if result.error_kind:
        raise CurvineError(ErrorKind(result.error_kind), result.error)
    return getattr(result, result.WhichOneof("result"))
