"""Hand-framed data messages of the Worker service, shared by worker and client.

Building a 1 MiB protobuf message and serialising it copies the data twice into fresh
memory, and fresh pages copy at ~1 GB/s (docs/measurements.md); that alone halves the
streaming rate.  The data-carrying messages are therefore framed by hand: the small
fields go through protobuf, the ``bytes data`` field is appended as raw wire format
(tag, varint length, payload) in a single join.  The bytes on the wire are exactly
what protobuf would produce (a concatenation of encoded fields is a valid message),
so peers using the generated stubs interoperate.
"""

from __future__ import annotations

from curvine.proto import worker_pb2

_WRITE_DATA_TAG = b"\x12"  # WriteBlockRequest.data: field 2, wire type 2
_READ_DATA_TAG = b"\x0a"  # ReadBlockReply.data: field 1, wire type 2


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_write_request(data: bytes | memoryview, *, block_id: int = 0, expected_length: int = 0,
                         finish: bool = False, checksum: int = 0, token: bytes = b"") -> bytes:
    """A serialised WriteBlockRequest (with a header when ``block_id`` is set)."""
    head = worker_pb2.WriteBlockRequest(finish=finish, checksum=checksum)
    if block_id:
        head.header.block_id = block_id
        head.header.expected_length = expected_length
        head.header.token = token
    small = head.SerializeToString()
    if not len(data):
        return small
    return b"".join((small, _WRITE_DATA_TAG, _varint(len(data)), data))


def encode_read_reply(reply: bytes | memoryview | worker_pb2.ReadBlockReply) -> bytes:
    """Serialise a ReadBlockReply given as its data bytes (or as a message)."""
    if isinstance(reply, worker_pb2.ReadBlockReply):
        return reply.SerializeToString()
    if not len(reply):
        return b""
    return b"".join((_READ_DATA_TAG, _varint(len(reply)), reply))


def decode_read_reply(buf: bytes) -> bytes | memoryview:
    """The data of a serialised ReadBlockReply: a view into ``buf``, without a copy."""
    if buf[:1] == _READ_DATA_TAG:
        n, shift, pos = 0, 0, 1
        while pos < len(buf) and pos < 11:
            b = buf[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                if pos + n == len(buf):
                    return memoryview(buf)[pos:]
                break
    return worker_pb2.ReadBlockReply.FromString(buf).data  # anything unusual: let protobuf parse
