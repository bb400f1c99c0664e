"""Framing of the workers' bulk read port, the data port (worker/data_port.py, the server;
client/blocks/data_port.py, the client).  Both sides build and read frames here only.

Wire (big-endian), many requests per connection, one at a time:
  request  b"CVR1" block_id:u64 offset:u64 length:u64 token_len:u16 token
  reply    status:u32 length:u64, then (status 0) length bytes of the block,
           or (status = an ErrorKind) message_len:u16 message (utf-8)
``length`` 0 = to the end of the block.
"""

from __future__ import annotations

import struct

from .errors import CurvineError

MAGIC = b"CVR1"
REQUEST = struct.Struct(">4sQQQH")
REPLY = struct.Struct(">IQ")
MESSAGE_LEN = struct.Struct(">H")  # before an error reply's message
MAX_TOKEN = 256  # a read token is well under this; a longer token_len is garbage
MAX_MESSAGE = 4000  # bytes of an error reply's message (the rest is cut)


def request(block_id: int, offset: int, length: int, token: bytes) -> bytes:
    """The request frame for bytes [offset, offset + length) of ``block_id``."""
    return REQUEST.pack(MAGIC, block_id, offset, length, len(token)) + token


def data_reply(length: int) -> bytes:
    """The header of a reply whose ``length`` bytes of the block follow."""
    return REPLY.pack(0, length)


def error_reply(e: CurvineError) -> bytes:
    """The whole reply refusing a request with ``e`` (its kind is the status)."""
    msg = str(e).encode()[:MAX_MESSAGE]
    return REPLY.pack(int(e.kind), 0) + MESSAGE_LEN.pack(len(msg)) + msg
