"""Typed ids and name rules shared by every process."""

from __future__ import annotations

import functools
import os
import socket
import uuid
from typing import NewType

from .errors import CurvineError, ErrorKind, invalid

InodeId = NewType("InodeId", int)
BlockId = NewType("BlockId", int)
WorkerId = NewType("WorkerId", int)
HandleId = NewType("HandleId", int)

ROOT_INO = InodeId(1)  # equals pyfuse3.ROOT_INODE, so master inode ids are FUSE inode ids
NAME_MAX = 255
U64_MAX = (1 << 64) - 1
MIB = 1 << 20
# Blocks (and holes) one file may have.  A file's block list lives in one LMDB value and
# travels in one CompleteFile, and a writer keeps an extent per block: a bound here keeps
# a sparse 2**62-byte truncate or fallocate from growing a master or a mount without
# limit.  64 MiB blocks: 4 TiB.
MAX_FILE_BLOCKS = 1 << 16


def max_file_size(block_size: int) -> int:
    """The largest file a cluster of ``block_size`` blocks holds (larger: EFBIG)."""
    return MAX_FILE_BLOCKS * block_size


def check_file_size(size: int, block_size: int, field: str = "size") -> None:
    if size > max_file_size(block_size):
        raise CurvineError(ErrorKind.FILE_TOO_BIG,
                           f"{field}: {size} is past the largest file "
                           f"({max_file_size(block_size)} bytes)")


def check_name(name: bytes, field: str = "name") -> bytes:
    """Validate one path component: bytes, 1..255, no '/', no NUL, not '.' or '..'."""
    if not isinstance(name, (bytes, bytearray)):
        raise invalid(field, "must be bytes")
    if len(name) == 0:
        raise invalid(field, "empty")
    if len(name) > NAME_MAX:
        raise CurvineError(ErrorKind.NAME_TOO_LONG, f"{field}: longer than {NAME_MAX} bytes")
    if b"/" in name or b"\0" in name:
        raise invalid(field, "contains '/' or NUL")
    if name in (b".", b".."):
        raise invalid(field, "'.' and '..' are not names")
    return bytes(name)


def check_ino(ino: int, field: str = "ino") -> InodeId:
    if not 1 <= ino <= U64_MAX:
        raise invalid(field, f"inode id {ino} out of range")
    return InodeId(ino)


def new_request_id() -> bytes:
    """A fresh id for a mutating RPC; retries of the same call reuse it."""
    return uuid.uuid4().bytes


def put_request_id(request_id: bytes, index: int) -> bytes:
    """The request id of file ``index`` of a PutFiles call ``request_id``: what the
    master's retry cache keeps for it, so a retried call finds each file it stored."""
    return request_id + index.to_bytes(4, "big") if request_id else b""


def host_id() -> str:
    """Identifies this machine, so a client can tell which workers are local.

    CURVINE_HOST_ID overrides (containers sharing a node set the same value)."""
    env = os.environ.get("CURVINE_HOST_ID")
    if env:
        return env
    return _machine_id()


@functools.lru_cache(maxsize=1)
def _machine_id() -> str:
    """/etc/machine-id, else the host name (read once: every reader asks)."""
    try:
        with open("/etc/machine-id", encoding="ascii") as f:
            mid = f.read().strip()
        if mid:
            return mid
    except OSError:
        pass
    return socket.gethostname()
