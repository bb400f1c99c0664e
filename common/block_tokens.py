"""Block tokens: a worker serves a block id only to a caller the master gave it to.

The master holds a random key (``BLOCK_KEY_FILE`` in its meta dir, made at first start)
and hands it to each worker when it registers.  With every block id it gives a client
(GetBlocks: read tokens; AddBlock: a write token) it sends a token

    access (1 byte, b"r" or b"w") + HMAC-SHA256(key, DOMAIN + block_id + access)[:16]

and the worker recomputes the MAC before it reads, writes, adopts or deletes that
block.  A write token also allows reading and deleting (the writer re-reads and drops
its own blocks).  Block ids are never reused, so a token names one block's data for as
long as it exists; tokens do not expire, and changing the key (delete the file, restart
the master; workers get the new key when they register again) voids all of them.

A write token a client gets (AddBlock) names the workers the master chose for the
block (``BOUND``: b"W" + their count + their ids + the MAC over them too): any other
worker refuses to write that block with it, so a client cannot leave a stray copy on a
worker nobody placed it on.  The master's own deletes carry unbound write tokens
(b"w"), which allow deleting and reading, never writing.

A worker keeps the last key it was given in its first data dir (same file name), so
after a restart it serves the blocks it holds before the master answers again.

What this adds to the cluster token: a request for a block id the master never
allocated, or never handed out, is refused (PERMISSION_DENIED, counted in
``curvine_block_token_refused_total``) even when it carries the cluster token.  It is
not a boundary between token holders: any process with the cluster token can register
as a worker and learn the key (docs/security.md).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from typing import Iterable

from . import private_files

log = logging.getLogger(__name__)

READ = b"r"
WRITE = b"w"
BOUND = b"W"  # a write token naming its workers
MAX_BOUND = 16  # workers one write token can name (replicas)
KEY_BYTES = 32
MAC_BYTES = 16
TOKEN_BYTES = 1 + MAC_BYTES
BLOCK_KEY_FILE = "block_token.key"
_DOMAIN = b"curvine-block-token/1\0"


def _mac(key: bytes, block_id: int, access: bytes, named: bytes = b"") -> bytes:
    msg = _DOMAIN + block_id.to_bytes(8, "big") + access + named
    return hmac.new(key, msg, hashlib.sha256).digest()[:MAC_BYTES]


def mint(key: bytes, block_id: int, access: bytes, workers: Iterable[int] = ()) -> bytes:
    """The token granting ``access`` (READ or WRITE) to ``block_id``; a WRITE token
    with ``workers`` is good for writing on those workers only (BOUND)."""
    if access not in (READ, WRITE):
        raise ValueError(f"access must be READ or WRITE, not {access!r}")
    ids = sorted(set(workers))
    if access == READ or not ids:
        return access + _mac(key, block_id, access)
    if len(ids) > MAX_BOUND:
        raise ValueError(f"a write token names at most {MAX_BOUND} workers")
    named = bytes([len(ids)]) + b"".join(w.to_bytes(4, "big") for w in ids)
    return BOUND + named + _mac(key, block_id, BOUND, named)


def allows(key: bytes, block_id: int, token: bytes, access: bytes,
           worker_id: int | None = None) -> bool:
    """Whether ``token`` grants ``access`` to ``block_id`` (a write token grants read).
    ``worker_id``: the worker asking, for a WRITE: only a token naming it (BOUND)
    grants writing there; None (the master checking a client's token, a delete): any
    genuine write token does."""
    if not 0 <= block_id < 1 << 64 or not token:
        return False
    granted = token[:1]
    if granted == BOUND:
        n = token[1] if len(token) > 1 else 0
        named = token[1:2 + 4 * n]
        if not 0 < n <= MAX_BOUND or len(token) != 2 + 4 * n + MAC_BYTES:
            return False
        if worker_id is not None and access == WRITE:
            ids = {int.from_bytes(named[1 + 4 * i:5 + 4 * i], "big") for i in range(n)}
            if worker_id not in ids:
                return False
        return hmac.compare_digest(token[-MAC_BYTES:], _mac(key, block_id, BOUND, named))
    if len(token) != TOKEN_BYTES or granted not in (READ, WRITE):
        return False
    if access == WRITE and (granted != WRITE or worker_id is not None):
        return False  # an unbound write token writes nowhere
    return hmac.compare_digest(token, granted + _mac(key, block_id, granted))


def load_or_create_key(meta_dir: str) -> bytes:
    """The master's key in ``meta_dir``, created (mode 0600, fsynced) if missing."""
    path = os.path.join(meta_dir, BLOCK_KEY_FILE)
    key = read_key(path)
    if key is None:
        key = secrets.token_bytes(KEY_BYTES)
        write_key(path, key)
    return key


def read_key(path: str) -> bytes | None:
    """The key in ``path``; None if there is no such file, ValueError if it is not one.

    A key readable by group or others (restored from a backup, copied with ``cp -r``)
    is made 0600 again, with a warning: whoever reads it can sign tokens for every
    block."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o077:
            try:
                os.fchmod(fd, 0o600)
            except OSError as e:
                raise ValueError(f"{path}: mode {st.st_mode & 0o777:o} lets others read "
                                 f"the key, and it cannot be made 0600: {e.strerror}") from None
            log.warning("%s had mode %o: made it 0600 (whoever read it can sign block "
                        "tokens; delete it to make a new key)", path, st.st_mode & 0o777)
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise ValueError(f"{path}: holds {len(key)} bytes, expected {KEY_BYTES} "
                         "(delete it to make a new key: outstanding block tokens "
                         "become invalid)")
    return key


def write_key(path: str, key: bytes) -> None:
    """Replace ``path`` with ``key`` (mode 0600), durably: a key lost in a crash
    would void every token handed out with it."""
    private_files.write_file(path, key)
