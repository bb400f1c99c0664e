"""Block ids and the on-disk layout of block files, shared by the worker (which owns
the files) and the client (which reads local ones directly: short-circuit)."""

from __future__ import annotations

import os

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
