"""What a master group keeps in etcd besides the journal and the leader key.

- ``leases``: the lease state a single master keeps in ``leases.json`` (until when
  mounts may hold leases, and whose: master/cluster/leases.py), written by the leader.
  A new leader reads it like a restarted master reads its file, so it holds back
  revocations until those leases ran out or their mounts came back (DESIGN rule 2
  across a failover): the next leader has no access to the old one's disk.
- ``block_key``: the key block tokens are signed with (common/block_tokens.py).  Every
  member signs with the same key, so that tokens handed out by one leader (or read
  tokens from a standby) are good on workers after a failover.  The first member
  to start puts its own key (a create-only Txn); the others take it.  Whoever can
  read etcd can read it: etcd belongs on the masters' private network (docs/security.md).
"""

from __future__ import annotations

import json

from curvine.common import block_tokens

from .etcd import Etcd, created_at, get_op, put_op


class EtcdLeaseState:
    """LeaseTable's restart state (load/save) under ``prefix + 'leases'``."""

    def __init__(self, etcd: Etcd, prefix: bytes):
        self.etcd = etcd
        self.key = prefix + b"leases"

    def __str__(self) -> str:
        return f"etcd key {self.key.decode(errors='replace')}"

    def load(self) -> dict | None:
        kv = self.etcd.get(self.key)
        return json.loads(kv.value) if kv is not None else None

    def save(self, state: dict) -> None:
        self.etcd.put(self.key, json.dumps(state).encode())


def shared_block_key(etcd: Etcd, prefix: bytes, meta_dir: str) -> bytes:
    """The group's block key, written into ``meta_dir`` where the master loads it."""
    key_name = prefix + b"block_key"
    mine = block_tokens.load_or_create_key(meta_dir)
    reply = etcd.txn([created_at(key_name, 0)], [put_op(key_name, mine)], [get_op(key_name)])
    if reply.succeeded:
        return mine
    group_key = reply.responses[0].response_range.kvs[0].value
    if group_key != mine:
        block_tokens.write_key(f"{meta_dir}/{block_tokens.BLOCK_KEY_FILE}", group_key)
    return group_key
