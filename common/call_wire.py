"""Framing of the master's call port (master/call_port.py, the server, which describes
the protocol; fuse_client/call_port.py, the mount's client).  Integers big-endian."""

from __future__ import annotations

import struct

MAGIC = b"CVC1"
HELLO = struct.Struct(">4sH")  # magic, token length; then the token
ANSWER = struct.Struct(">4sB")  # magic, status
FRAME = struct.Struct(">I")  # payload length; then a master.Call or master.CallResult
ACCEPTED, UNAUTHENTICATED, BUSY = 0, 1, 2  # the answer's status
