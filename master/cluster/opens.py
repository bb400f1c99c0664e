"""Mounts' lease sessions, the files they have open, and the blocks kept for them.

- **Sessions** (``MountSessions``): which mounts are alive, by their lease session
  (the Session stream opens and closes it; EndSessions closes it at unmount).  A mount
  that reconnects opens a new session listing its old ones (``SessionRequest.
  dropped``): those count as alive again.  A session of a previous master run counts
  as closed when this one started.  A session closed for less than
  ``master.orphan_timeout`` may still come back: its opens and its files being
  written (master/cluster/capacity.py: orphans, unlinked files kept open) stay.
- **Open files** (``OpenFiles``): a mount that opens a file records the open with
  GetBlocks (its session and an open id; for writing a version, GetBlocks.write or
  CompleteFile.open_id) and reports the close with its access reports.  A file open
  for reading on a live mount is never evicted nor expired (capacity.py asks
  ``is_open``, and marks the files it is journaling as evicted so that no new open
  succeeds meanwhile: ``begin_eviction``).  Opens by clients without a lease session
  are not recorded, and a restarted master knows none of the opens made before it
  started.
- **Kept blocks**: a block a file's new version (or a truncate, or its removal) drops
  is held from the moment the record is applied (``hold``, in the committer thread, so
  the next plan of the same batch can claim it), then kept while some mount has the
  file open (its readers still read it, its writers may publish it again: ``claim``),
  else deleted once the record is durable (``settle``); the rest at the file's last
  close, or once the mount's session is gone (``release_kept``).  In memory only.

Nothing here is journaled.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Callable

from ..meta.store import Store


class MountSessions:
    """The lease sessions of mounts, and since when each closed one is gone."""

    def __init__(self, orphan_timeout: float):
        # how long a closed session may still come back (master.orphan_timeout)
        self.orphan_timeout = orphan_timeout
        self.started = time.monotonic()  # sessions of a previous run count as closed now
        self._lock = threading.Lock()
        self._open: set[int] = set()
        self._closed_at: dict[int, float] = {}  # session -> monotonic time it closed
        self._alias: dict[int, int] = {}  # old session -> the session that replaced it

    def opened(self, sid: int, dropped) -> None:
        """Session ``sid`` opened; ``dropped``: the sessions its mount had before."""
        with self._lock:
            self._open.add(sid)
            self._closed_at.pop(sid, None)
            for old in dropped:
                if old and old != sid:
                    self._alias[old] = sid

    def closed(self, sid: int) -> None:
        with self._lock:
            if sid in self._open:
                self._open.discard(sid)
                self._closed_at[sid] = time.monotonic()

    def gone_since(self, sessions) -> float | None:
        """When the last of ``sessions`` closed (monotonic); None if one is open."""
        latest = 0.0
        with self._lock:
            for sid in sessions:
                seen = set()
                while sid in self._alias and sid not in seen:  # a reconnected mount
                    seen.add(sid)
                    sid = self._alias[sid]
                if sid in self._open:
                    return None
                latest = max(latest, self._closed_at.get(sid, self.started))
        return latest

    def gone_for_good(self, sessions, now: float) -> bool:
        """Whether every one of ``sessions`` is closed for ``orphan_timeout`` at
        ``now`` (monotonic): its mount cannot come back for what it held."""
        gone = self.gone_since(sessions)
        return gone is not None and now - gone >= self.orphan_timeout


class OpenFiles:
    """Opens recorded by mounts (GetBlocks) and the blocks kept for them.

    ``store``: read to check that a kept block no file holds again before it is freed;
    ``queue_deletes(pairs)`` (the registry's) takes (worker, block, bytes) to delete;
    ``sessions``: the mounts' liveness; ``accessed(inos, t_ns)``: an open is an access
    (the LRU order, master/cluster/capacity.py)."""

    def __init__(self, store: Store, queue_deletes: Callable[[list], None],
                 sessions: MountSessions, accessed: Callable[[list[int], int], None]):
        self._store = store
        self._queue_deletes = queue_deletes
        self.sessions = sessions
        self._accessed = accessed
        self._lock = threading.Lock()
        # files open for reading: ino -> {(session, open id)}, and session -> its opens
        self._opens: dict[int, set[tuple[int, int]]] = {}
        # files open for writing a version based on their blocks (same shape): they keep
        # the blocks a newer version drops, but do not hold off eviction
        self._write_opens: dict[int, set[tuple[int, int]]] = {}
        self._opens_of: dict[int, dict[int, int]] = {}  # session -> {open id: ino}
        self._evicting: set[int] = set()  # inos being journaled as evicted: no new opens
        # Blocks a file's new version (or a truncate) dropped while a mount had the file
        # open: ino -> {block id: [(worker, bytes)]}.  Its readers still read them and its
        # writers may publish them again (claim); freed when the last open closes.
        self._kept: dict[int, dict[int, list[tuple[int, int]]]] = {}
        self._settling: set[int] = set()  # kept blocks whose record is not durable yet

    # ------------------------------------------------------------------ opens
    def note_open(self, ino: int, session: int, open_id: int, write: bool = False) -> bool:
        """A mount opens ``ino`` for reading (GetBlocks, before it reads the blocks): not
        evicted until closed.  False if it is being evicted right now (a miss).
        ``write``: for writing a version (GetBlocks.write, CompleteFile.open_id): only
        the blocks newer versions drop are kept for it (``settle``)."""
        if not session or not open_id:
            return True
        with self._lock:
            if ino in self._evicting and not write:
                return False
            table = self._write_opens if write else self._opens
            table.setdefault(ino, set()).add((session, open_id))
            self._opens_of.setdefault(session, {})[open_id] = ino
        # an access now, not with the mount's next report: a full pool of 14 MiB chunks
        # written at 0.5 GB/s turns over in about a second
        self._accessed([ino], time.time_ns())
        return True

    def opened_by(self, session: int) -> set[int]:
        """The files ``session`` has recorded opens of."""
        with self._lock:
            return set(self._opens_of.get(session, {}).values())

    def note_closed(self, session: int, open_ids) -> None:
        """Opens recorded by ``note_open`` that are over."""
        with self._lock:
            mine = self._opens_of.get(session, {})
            for oid in open_ids:
                ino = mine.pop(oid, None)
                if ino is not None:
                    self._drop_open(ino, session, oid)
            if not mine:
                self._opens_of.pop(session, None)
        self.release_kept()

    def is_open(self, ino: int, now: float) -> bool:
        """Whether a live mount (or one gone for less than the orphan timeout: it may
        reconnect) has ``ino`` open for reading."""
        with self._lock:
            return self._is_open(ino, now)

    def begin_eviction(self, inos: list[int], now: float) -> list[int]:
        """Of ``inos``, those open for reading (returned); the others refuse new opens
        for reading until ``end_eviction``."""
        with self._lock:
            held = [i for i in inos if self._is_open(i, now)]
            self._evicting.update(i for i in inos if i not in held)
        return held

    def end_eviction(self, inos) -> None:
        with self._lock:
            self._evicting.difference_update(inos)

    def open_files(self) -> int:
        with self._lock:
            return len(self._opens)

    # ------------------------------------------------------------------ kept blocks
    def hold(self, replaced) -> None:
        """``replaced``: (ino, worker, block, bytes) just dropped from a file (a new
        version, a truncate, its removal); nothing deletes them before ``settle``."""
        with self._lock:
            for ino, w, b, n in replaced:
                self._kept.setdefault(ino, {}).setdefault(b, []).append((w, n))
                self._settling.add(b)

    def settle(self, replaced) -> None:
        """The records that dropped ``replaced`` are durable: delete the blocks of
        files no mount has open (a reader there finishes the version it opened, a
        writer that shares them can still publish them) unless a CompleteFile has
        claimed them meanwhile; keep the rest until the last open closes."""
        now = time.monotonic()
        free = []
        with self._lock:
            for ino, w, b, n in replaced:
                self._settling.discard(b)
                if b in self._kept.get(ino, ()) and not self._is_open(ino, now, True):
                    free.extend((w2, b, n2) for w2, n2 in self._pop_kept(ino, b))
        self._free_unowned(free)

    def claim(self, ino: int, block_id: int, claimed: dict) -> bool:
        """For a CompleteFile of ``ino`` being planned: take a kept block it publishes
        again (nothing frees it from now on) into ``claimed``; False if not kept."""
        with self._lock:
            if block_id not in self._kept.get(ino, ()):
                return False
            claimed[block_id] = self._pop_kept(ino, block_id)
            return True

    def unclaim(self, ino: int, claimed: dict) -> None:
        """The CompleteFile that claimed these failed: kept again, or deleted."""
        if claimed:
            replaced = [(ino, w, b, n) for b, locs in claimed.items() for w, n in locs]
            self.hold(replaced)
            self.settle(replaced)

    def release_kept(self) -> None:
        """Delete the kept blocks of files no live mount has open any more."""
        if not self._kept:
            return
        now = time.monotonic()
        free = []
        with self._lock:
            for ino in [i for i in self._kept if not self._is_open(i, now, True)]:
                for b in [b for b in self._kept[ino] if b not in self._settling]:
                    free.extend((w, b, n) for w, n in self._pop_kept(ino, b))
        self._free_unowned(free)

    def kept_blocks(self) -> int:
        with self._lock:
            return sum(len(k) for k in self._kept.values())

    # ------------------------------------------------------------------ (under _lock)
    def _pop_kept(self, ino: int, block_id: int) -> list[tuple[int, int]]:
        """(under _lock) Take a kept block's locations out, and ``ino`` once it has none."""
        kept = self._kept[ino]
        locs = kept.pop(block_id)
        if not kept:
            del self._kept[ino]
        return locs

    def _free_unowned(self, pairs) -> None:
        """Queue deletes of (worker, block, bytes), but never of a block a file holds
        (published again by a CompleteFile that claimed it, or retried)."""
        if not pairs:
            return
        store = self._store
        with store.read() as txn:
            pairs = [p for p in pairs if store.block_owner(txn, p[1]) is None]
        self._queue_deletes(pairs)

    def _drop_open(self, ino: int, session: int, open_id: int) -> None:
        """(under _lock)"""
        for table in (self._opens, self._write_opens):
            held = table.get(ino)
            if held is not None:
                held.discard((session, open_id))
                if not held:
                    del table[ino]

    def _is_open(self, ino: int, now: float, writers: bool = False) -> bool:
        """(under _lock) Whether a live mount (or one gone for less than the orphan
        timeout: it may reconnect) has ``ino`` open for reading (``writers``: or for
        writing a version)."""
        readers = self._opens.get(ino, ())
        held = itertools.chain(readers, self._write_opens.get(ino, ())) if writers else readers
        dead = []
        for sid, oid in held:
            if not self.sessions.gone_for_good({sid}, now):
                return True
            dead.append((sid, oid))
        for sid, oid in dead:  # that mount is gone for good: forget its opens
            self._drop_open(ino, sid, oid)
            mine = self._opens_of.get(sid)
            if mine is not None:
                mine.pop(oid, None)
                if not mine:
                    del self._opens_of[sid]
        return False
