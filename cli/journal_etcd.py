"""`curvine journal dump` and `verify` for a member of a master group: the journal in etcd.

A group member keeps no journal segments: the leader writes each batch of records to
etcd (``/curvine/<cluster.name>/journal/<first seq>``, master/group/etcd_journal.py)
and ``journal.dir`` stays empty.  With ``master.etcd_endpoints`` in the config (and no
``--journal-dir``), dump and verify read those keys instead, with linearizable Ranges
and nothing written: as safe next to a running group as reading segment files is next
to a running master.  Each batch is framed like a segment (length, crc, seq, type), so
verify checks the same things: every frame's checksum, seqs that follow on within and
across batches, that each record decodes as one the master can replay, and that the
last record is the group's ``commit``.  The checkpoint is another matter: a group's
is taken by its leader, online (``curvine journal checkpoint``).
"""

from __future__ import annotations

from collections.abc import Iterator

from curvine.common.config import Config
from curvine.journal.journal import Damage
from curvine.journal.segment import JournalCorruption, JournalRecord, decode_frames

from .journal_walk import Walk, replay_problem


class GroupJournal:
    """The group's journal in etcd as the config names it (read-only); a context
    manager that closes its etcd client."""

    def __init__(self, cfg: Config):
        from curvine.master.group.etcd_access import etcd_from_config
        from curvine.master.group.etcd_journal import EtcdJournal
        from curvine.master.member import key_prefix

        prefix = key_prefix(cfg)
        self.etcd = etcd_from_config(cfg)  # with the TLS and user the config names
        try:
            self.journal = EtcdJournal(self.etcd, prefix, prefix + b"leader")  # read-only
        except BaseException:
            self.etcd.close()
            raise
        self.where = (f"journal in etcd {','.join(cfg.master.etcd_endpoints)} "
                      f"({self.journal.prefix.decode(errors='replace')})")

    def __enter__(self) -> "GroupJournal":
        return self

    def __exit__(self, *exc) -> None:
        self.etcd.close()

    def records(self, from_seq: int) -> Iterator[JournalRecord]:
        """Every record from ``from_seq`` on (from the oldest kept when that is later)."""
        after = max(from_seq - 1, self.journal.first_seq - 1, 0)
        return self.journal.records(after)


def walk(group: GroupJournal):
    """verify's walk over the batches (``journal_walk.Walk``, a batch counted as a
    segment): the first damage stops it."""
    w = Walk()
    commit = group.journal.read_commit()
    expect = None
    where = group.where
    for where, first, frames in group.journal.batches():
        w.segments += 1
        w.bytes += len(frames)
        if expect is not None and first != expect:
            w.damage = Damage(where, 0, f"batch starts at seq {first} but the previous one "
                                        f"ends at {expect - 1}", False)
            return w
        try:
            for rec in decode_frames(frames, first, where):
                problem = replay_problem(rec.payload)
                if problem is not None:
                    w.damage = Damage(where, 0, f"record seq {rec.seq} passes its checksum "
                                                f"but cannot be replayed: {problem}", False)
                    return w
                w.records += 1
                w.first_seq = w.first_seq or rec.seq
                w.last_seq, expect = rec.seq, rec.seq + 1
        except JournalCorruption as e:
            w.damage = Damage(e.segment, e.offset, e.reason, False)
            return w
    # (the leader may append meanwhile: commit read before the walk and after it)
    if w.records and w.last_seq < commit:
        w.damage = Damage(where, 0, f"the group's commit is seq {commit} but the last "
                                    f"record kept is seq {w.last_seq}", False)
    elif w.records and w.last_seq > group.journal.read_commit():
        w.damage = Damage(where, 0, f"records up to seq {w.last_seq} are kept past the "
                                    f"group's commit", False)
    return w
