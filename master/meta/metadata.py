"""Opening the master's metadata: the journal, the LMDB store brought in line with it,
and the replay of the durable records LMDB does not hold yet.

The one way in, for the master (``Master.__init__``) and for the checkpoint of a
stopped master (``curvine journal checkpoint --offline``), so that both recover the
same way: a store behind the journal's oldest record is restored from a checkpoint,
one ahead of the journal's end is rebuilt, and a crc-valid record that cannot be
replayed is reported as damage naming its segment and offset, not as a traceback.

Layout under the meta dir: ``lmdb/`` (the store), ``checkpoints/`` (copies of it,
journal/checkpoint.py); the journal has its own directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import Callable

from curvine.common.config import Config
from curvine.common.errors import CurvineError, ErrorKind
from curvine.journal import Journal
from curvine.journal.checkpoint import latest_checkpoint

from .committer import Committer
from .namespace import Effects, Namespace, RetryCache
from .store import Store

log = logging.getLogger(__name__)


def lmdb_dir(meta_dir: str) -> str:
    return os.path.join(meta_dir, "lmdb")


def checkpoint_root(meta_dir: str) -> str:
    return os.path.join(meta_dir, "checkpoints")


class NoBridge(CurvineError):
    """The store is behind the journal's oldest record and no local checkpoint fills
    the gap: a checkpoint at ``min_seq`` or later is needed (a member of a master
    group fetches one from the leader)."""

    def __init__(self, message: str, min_seq: int):
        super().__init__(ErrorKind.IO, message)
        self.min_seq = min_seq


def _no_effects(fx: Effects) -> None:
    pass


@dataclass
class Metadata:
    """The journal (its directory locked: one process at a time), the store and the
    namespace and committer over them, with every durable record applied; the
    committer is not started."""

    journal: Journal
    store: Store
    ns: Namespace
    committer: Committer
    replayed: int  # records applied at open
    owns_store: bool = True  # False: a view made by over(), closing stops its committer
    cfg: Config | None = None  # what over() makes committers with
    meta_dir: str = ""

    @classmethod
    def open(cls, cfg: Config, meta_dir: str, journal_dir: str,
             on_effects: Callable[[Effects], None] = _no_effects,
             journal=None) -> "Metadata":
        """Open and recover.  ``on_effects`` (the master's registry and pending blocks)
        hears of the workers the store knows first, then of what the replay did, so
        that the blocks the replay frees find their workers.  ``journal``: the one to
        recover from instead of the local one in ``journal_dir`` (a master group's, in
        etcd: master/group/etcd_journal.py)."""
        if journal is None:
            journal = Journal(journal_dir, segment_size=int(cfg.journal.segment_size),
                              fsync=cfg.journal.fsync)
        try:
            store = _store_in_line(journal, journal_dir, meta_dir)
        except BaseException:
            journal.close()
            raise
        try:
            ns = Namespace(store, RetryCache(cfg.master.retry_cache_entries),
                           int(cfg.cluster.block_size),
                           inline_max=min(int(cfg.master.inline_max), int(cfg.cluster.block_size)),
                           inline_capacity=int(cfg.master.inline_capacity))
            committer, replayed = _recovered(cfg, meta_dir, store, journal, ns, on_effects)
        except BaseException:
            store.close()
            journal.close()
            raise
        return cls(journal, store, ns, committer, replayed, cfg=cfg, meta_dir=meta_dir)

    def over(self, journal, on_effects: Callable[[Effects], None]) -> "Metadata":
        """The same store and namespace (its retry cache too) with a new committer over
        ``journal``, caught up with it the way open() recovers: what a member of a
        master group does when it changes role (master/member.py).  Closing the view
        stops only its committer."""
        committer, replayed = _recovered(self.cfg, self.meta_dir, self.store, journal, self.ns,
                                         on_effects)
        return Metadata(journal, self.store, self.ns, committer, replayed, owns_store=False,
                        cfg=self.cfg, meta_dir=self.meta_dir)

    def close(self) -> None:
        """Stop the committer, sync and close LMDB, then release the journal's lock."""
        self.committer.stop()
        if not self.owns_store:
            return
        try:
            self.store.close()
        finally:
            self.journal.close()


def _recovered(cfg: Config, meta_dir: str, store: Store, journal, ns: Namespace,
               on_effects: Callable[[Effects], None]) -> tuple[Committer, int]:
    """A committer over ``journal``, the workers the store knows told to
    ``on_effects``, and the records LMDB lacks replayed (how many)."""
    committer = Committer(store, journal, ns, on_effects, checkpoint_root(meta_dir),
                          cfg.journal.checkpoint_every,
                          checkpoint_bytes=int(cfg.journal.checkpoint_bytes))
    with store.read() as txn:
        on_effects(Effects(workers=list(store.workers(txn))))
    return committer, _replay(committer, journal)


def _replay(committer: Committer, journal: Journal) -> int:
    try:
        return committer.replay()
    except Exception as e:
        # A crc-valid record that does not decode or cannot be applied is damage: name
        # its segment and offset (the master exits 2, the CLI 4).
        damage = journal.unreplayable(e)
        if damage is None:
            raise
        raise damage from e


# counters of ids handed out to clients (store.py's meta keys)
_NEVER_AGAIN = (b"next_ino", b"block_ids_reserved")


def _store_in_line(journal: Journal, journal_dir: str, meta_dir: str) -> Store:
    """Open LMDB and make sure the journal can bring it up to date.

    LMDB is synced lazily, so an OS crash can take it back behind the oldest journal
    record: then the newest checkpoint is restored first.  If LMDB is *ahead* of the
    journal (the journal lost records it had made durable, e.g. a damaged tail), the
    journal is the truth: LMDB is rebuilt from a checkpoint at or below the journal's
    end, or from nothing when the journal still starts at seq 1, keeping the id
    counters it had reached.
    """
    path = lmdb_dir(meta_dir)
    store = Store(path)
    with store.read() as txn:
        applied = store.get_u64(txn, b"applied_seq")
        handed_out = {k: store.get_u64(txn, k) for k in _NEVER_AGAIN}
    end = journal.durable_seq
    behind = end >= journal.first_seq and applied + 1 < journal.first_seq
    ahead = applied > end
    if not (behind or ahead):
        return store
    store.env.close()
    if end == 0:
        raise CurvineError(ErrorKind.IO,
                           f"the journal in {journal_dir} is empty but the metadata in "
                           f"{path} is at seq {applied}: is --journal-dir right?")
    ckpt = latest_checkpoint(checkpoint_root(meta_dir), at_most=end)
    if ckpt is not None and ckpt[0] + 1 < journal.first_seq:
        ckpt = None  # the journal no longer holds the records after it
    if ckpt is None and journal.first_seq > 1:
        raise NoBridge(f"metadata in {path} is at seq {applied}, the journal holds "
                       f"seqs {journal.first_seq}..{end}, and no checkpoint bridges the two",
                       journal.first_seq - 1)
    if ahead:
        log.error("metadata in %s is at seq %d but the journal ends at seq %d: records "
                  "%d..%d are lost; rebuilding the metadata from the journal",
                  path, applied, end, end + 1, applied)
    else:
        log.warning("metadata at seq %d is older than the journal (first seq %d): "
                    "restoring it", applied, journal.first_seq)
    aside = f"{path}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"
    os.replace(path, aside)  # kept for forensics; the operator may delete it
    log.warning("previous metadata moved to %s", aside)
    if ckpt is not None:
        log.warning("restoring checkpoint %s (seq %d)", ckpt[1], ckpt[0])
        shutil.copytree(ckpt[1], path)
    store = Store(path)
    if ahead:
        # The lost records may have handed out inode and block ids that clients still
        # hold (a mount's kernel keeps an inode by its number: one reused for a file
        # of another type is EIO there).  Replay only raises these counters, so
        # numbers from the lost records are never handed out again.
        with store.env.begin(write=True) as txn:
            for key, value in handed_out.items():
                store.put_u64(txn, key, max(value, store.get_u64(txn, key)))
    return store
