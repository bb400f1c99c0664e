"""A ListDir page made straight from the stored records.

A listing of thousands of names is the master's most expensive read.  Parsing each
stored Inode into the reply (and serialising it again to send) cost ~1 us an entry in
Python.  The stored value already *is* an encoded Inode, so each entry is framed
around it as bytes in protobuf's wire format (a DirEntry is field 1, the name, and
field 2, the inode; a ListDirReply's entries are its field 1) and the whole page is
parsed into the reply in one call, in C.
"""
from __future__ import annotations

from curvine.proto import common_pb2

from .store import U64

_TAG_ENTRY = b"\x0a"  # ListDirReply.entries: field 1, length-delimited
_TAG_NAME = b"\x0a"  # DirEntry.name: field 1, length-delimited
_TAG_INODE = b"\x12"  # DirEntry.inode: field 2, length-delimited
_TAG_TYPE = 0x10  # Inode.type: field 2, varint
_FILE = common_pb2.FILE


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# lengths of names (<= 255) and of most inodes: one table lookup, not a loop
_VARINT = [_encode_varint(n) for n in range(1 << 14)]


def varint(n: int) -> bytes:
    return _VARINT[n] if n < 16384 else _encode_varint(n)


def inode_type(raw: bytes) -> int:
    """The FileType of an encoded Inode, read from its first two fields (the encoder
    writes fields in number order: ino, then type unless it is 0).  Anything else reads
    as 0 (unknown), never as FILE by mistake."""
    if not raw or raw[0] != 0x08:
        return 0
    i = 1
    n = len(raw)
    while i < n and raw[i] & 0x80:
        i += 1
    i += 1
    if i + 1 < n and raw[i] == _TAG_TYPE and raw[i + 1] < 0x80:
        return raw[i + 1]
    return 0


def read_page(txn, store, parent: int, start_after: bytes, limit: int
              ) -> tuple[bytes, list[bytes], list[int], bool]:
    """Up to ``limit`` entries of directory ``parent`` after ``start_after``:
    (the encoded entries, ready for ``ListDirReply.MergeFromString``, their names, the
    inode numbers of the regular files among them, whether more follow)."""
    parts: list[bytes] = []
    names: list[bytes] = []
    files: list[int] = []
    for name, key, raw in store.list_dir_records(txn, parent, start_after):
        if len(names) >= limit:
            return b"".join(parts), names, files, True
        body = b"".join((_TAG_NAME, varint(len(name)), name, _TAG_INODE, varint(len(raw)), raw))
        parts.append(_TAG_ENTRY + varint(len(body)) + body)
        names.append(name)
        if inode_type(raw) == _FILE:
            files.append(U64.unpack(key)[0])
    return b"".join(parts), names, files, False
