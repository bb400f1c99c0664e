"""Block ids and the on-disk layout of block files, shared by the worker (which owns
the files) and the client (which reads local ones directly: short-circuit)."""

from __future__ import annotations

import os
import re
import secrets

from .errors import invalid
from .ids import BlockId

MAX_BLOCK_ID = (1 << 63) - 1  # ids fit a signed 64-bit integer (LMDB keys, journal)


def check_block_id(block_id: object, field: str = "block_id") -> BlockId:
    """A block id is an int in 1..2^63-1 (0 is a hole and never stored)."""
    if (isinstance(block_id, bool) or not isinstance(block_id, int)
            or not 1 <= block_id <= MAX_BLOCK_ID):
        raise invalid(field, f"{block_id!r} is not a block id (1..2^63-1)")
    return BlockId(block_id)


def block_relpath(block_id: int) -> str:
    """``blocks/<id % 256 as 2 hex>/<id as 16 hex>.blk``: the one definition of the layout."""
    b = check_block_id(block_id)
    return os.path.join("blocks", f"{b % 256:02x}", f"{b:016x}.blk")


def block_path(data_dir: str, block_id: int) -> str:
    return os.path.join(data_dir, block_relpath(block_id))


# Short-circuit writes: a client on the worker's host writes a block into the worker's
# staging area itself and the worker adopts it (AdoptBlock).  Such files are named
# ``staging/<id as 16 hex>.c<16 hex>.tmp``; the worker's own in-progress writes never
# match (no "c"), so a client cannot adopt them.
CLIENT_STAGING_NAME = re.compile(r"([0-9a-f]{16})\.c[0-9a-f]{16}\.tmp")


def client_staging_path(data_dir: str, block_id: int) -> str:
    """A fresh staging path for a client-written block in ``data_dir``."""
    b = check_block_id(block_id)
    return os.path.join(data_dir, "staging", f"{b:016x}.c{secrets.token_hex(8)}.tmp")
