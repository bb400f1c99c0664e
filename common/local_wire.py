"""Framing of the worker's domain socket protocol (worker/domain_socket.py, the
server; client/blocks/domain_socket.py, the client): a 4-byte big-endian length, then a
protobuf message (LocalRequest or LocalReply, proto/src/curvine/proto/worker.proto).
A reply may carry file descriptors (SCM_RIGHTS) on its first byte.

Every receive has a deadline for the whole message, so a peer that trickles bytes is
as dead as a silent one; a server may also give the message a shorter time from its
first byte (``whole_within``) than it gives an idle connection to start one."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time

from .errors import CurvineError, ErrorKind, invalid

MAX_REQUEST = 4096  # requests are a block id and a token: anything bigger is garbage
MAX_REPLY = 1 << 16
SEND_TIMEOUT = 5.0  # a message is a few bytes: a peer that cannot take it is gone
_HEADER = struct.Struct(">I")
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class PeerClosed(Exception):
    """The peer closed the connection mid-message, or sent something unreadable."""


class SlowMessage(TimeoutError):
    """A message begun but not whole within ``whole_within`` of its first byte."""


def encode(msg) -> bytes:
    body = msg.SerializeToString()
    return _HEADER.pack(len(body)) + body


def send(sock: socket.socket, msg, fd: int | None = None,
         timeout: float = SEND_TIMEOUT) -> None:
    """Send one message, with ``fd`` passed along if given."""
    data = encode(msg)
    sock.settimeout(timeout)
    if fd is None:
        sock.sendall(data)
        return
    sent = socket.send_fds(sock, [data], [fd])
    if sent < len(data):
        sock.sendall(data[sent:])


def receive(sock: socket.socket, deadline: float, max_fds: int = 0,
            limit: int = MAX_REQUEST, whole_within: float | None = None
            ) -> tuple[bytes, list[int]] | None:
    """One message's body and the descriptors that came with it, before the monotonic
    ``deadline``; None at a clean end of stream before its first byte.  TimeoutError
    past the deadline, PeerClosed if the stream ends mid-message, CurvineError
    (INVALID) for a message over ``limit`` bytes.  ``whole_within``: the message's
    first byte by ``deadline``, the rest by then and within that many seconds of it
    (SlowMessage when that is the deadline passed).  On any error no descriptor is left open."""
    fds: list[int] = []
    slow = False  # the deadline is whole_within's, not the caller's
    try:
        if whole_within is None:
            header = _exact(sock, _HEADER.size, deadline, max_fds, fds, eof_ok=True)
        else:
            first = _exact(sock, 1, deadline, max_fds, fds, eof_ok=True)
            if first is None:
                return None
            if time.monotonic() + whole_within < deadline:
                deadline, slow = time.monotonic() + whole_within, True
            try:
                header = first + _exact(sock, _HEADER.size - 1, deadline, max_fds, fds,
                                        eof_ok=False)
            except TimeoutError:
                if not slow:
                    raise
                raise SlowMessage("a message not whole within its time") from None
        if header is None:
            return None
        (n,) = _HEADER.unpack(header)
        if n > limit:
            raise invalid("message", f"{n} bytes, at most {limit} are allowed")
        try:
            body = _exact(sock, n, deadline, max_fds, fds, eof_ok=False) if n else b""
        except TimeoutError:
            if not slow:
                raise
            raise SlowMessage("a message not whole within its time") from None
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return body, fds


def _exact(sock: socket.socket, n: int, deadline: float, max_fds: int, fds: list[int],
           eof_ok: bool) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no complete message before the deadline")
        sock.settimeout(left)
        if max_fds:
            data, got, flags, _ = socket.recv_fds(sock, n - len(buf), max_fds)
            fds.extend(got)
            if flags & socket.MSG_CTRUNC:
                raise CurvineError(ErrorKind.IO, "a passed file descriptor was dropped "
                                                 "(out of descriptors?)")
        else:
            # without a control buffer the kernel closes any descriptor sent along
            data = sock.recv(n - len(buf))
        if not data:
            if eof_ok and not buf:
                return None
            raise PeerClosed("the peer closed the connection mid-message")
        buf += data
    return bytes(buf)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the connected peer (SO_PEERCRED)."""
    return _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                            _PEERCRED.size))


MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the terminating NUL


@contextlib.contextmanager
def reachable(path: str):
    """``path`` as a socket address bind/connect accept: a path longer than sun_path
    (a deep test directory) goes through /proc/self/fd of its directory instead."""
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        yield path
        return
    fd = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{os.path.basename(path)}"
    finally:
        os.close(fd)
