"""Leased listings: directories whose every name this mount knows, so that a lookup of
any other name is answered "absent" here, without a round trip to the master.

The master leases a directory's listing (master/cluster/leases.py, "Listings") to a mount that
read the whole directory in one page, unless its names changed in the last two
seconds.  A mount asks for one when a directory keeps missing (``MISSES_BEFORE_LISTING``
lookups of absent names in it), or gets one with the first page of a readdir that held
the whole directory.  Until the lease runs out or the master revokes it (another client
made or removed a name there: the session thread calls ``drop``), every miss in it is
local; this mount's own creates, links, renames and unlinks update the copy (the
master does not revoke the mutating mount's own listing).

The kernel keeps a leased directory's entries too (``opendir``): an opendir made while
the listing is held asks the kernel to cache what it reads (FOPEN_CACHE_DIR), and one
made under the same lease as the previous opendir lets it keep that cache
(FOPEN_KEEP_CACHE), so a second ``ls`` of a quiet directory needs no request at all.
An opendir without the lease, or under a newer one, lets the kernel drop its copy
first; a revocation drops it at once (``drop`` returns the directories to invalidate).
This mount's own changes go through the kernel, which then drops its copy itself.

Single names too: a miss the master leased to this mount (a negative entry the kernel
keeps, fuse.negative_leases) is remembered (``missing``) until the lease ends, the
mount makes the name itself (``making``, ``adding``) or a revocation names it
(``drop``).  The kernel asks again for a name it holds as absent when it is a rename's
target or before an O_EXCL create (fuse_dentry_revalidate); that lookup is answered
here as well: LMCache's ``<key>.tmp -> <key>.data`` after its ``stat`` of the key
costs no master lookup.

Threads: the trio thread reads and updates; the lease session's thread drops.  A drop
bumps ``generation``, and so does each change this mount makes (before it is sent and
when it is answered); a listing asked for before a bump is not installed: it may be
older than the revocation the mount has acked, or than its own change.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict

MISSES_BEFORE_LISTING = 8  # misses in a directory before its listing is asked for
LISTING_MAX = 4096  # names: a larger directory is not listed for this
MAX_NAMES = 1 << 18  # names kept over all listings (then the oldest listings go)
RETRY_AFTER = 30.0  # seconds before asking again for a listing denied or too large
SAFETY = 0.2  # seconds a listing is used less than its lease
KERNEL_RECORDS = 4 * LISTING_MAX  # directories whose entries the kernel may keep
MAX_MISSING = 1 << 16  # leased absences of single names kept (LeasedListings.missing)


class LeasedListings:
    """The leased listings of one mount (see the module's docstring)."""

    def __init__(self, max_names: int = MAX_NAMES):
        self.max_names = max_names
        # ino -> (names, until, serial); serial: which lease (one per install)
        self._dirs: OrderedDict[int, tuple[set[bytes], float, int]] = OrderedDict()
        self._serial = 0
        self._names = 0
        self._misses: dict[int, int] = {}  # dir -> misses since its listing went
        self._not_before: dict[int, float] = {}  # dir -> no listing asked before then
        self._fetching: set[int] = set()
        # dir -> serial of the lease held at its last opendir, which let the kernel
        # cache its entries: the kernel's copy is from that lease (or from before a
        # drop, which then invalidated it)
        self._kernel: dict[int, int] = {}
        self._lock = threading.Lock()  # the session thread drops while the loop updates
        self.generation = 0  # drops so far (session thread)
        self.answered = 0  # lookups answered "absent" from a listing
        # (dir, name) -> until when the master leased its absence to this mount (a miss
        # the kernel keeps as a negative entry): the lookups the kernel makes anyway
        # (of a rename's target, before an O_EXCL create) are answered here too
        self._missing: dict[tuple[int, bytes], float] = {}

    # -- answers ------------------------------------------------------------------------

    def absent(self, parent: int, name: bytes) -> float:
        """Seconds ``name`` is known absent from ``parent`` (0: not known; ask)."""
        entry = self._dirs.get(parent)
        if entry is not None:
            if name in entry[0]:
                return 0.0
            left = entry[1] - time.monotonic()
            if left > 0:
                self.answered += 1
                return left
            self._forget(parent)
        until = self._missing.get((parent, name))
        if until is None:
            return 0.0
        left = until - time.monotonic()
        if left <= 0:
            self._missing.pop((parent, name), None)
            return 0.0
        self.answered += 1
        return left

    def missing(self, parent: int, name: bytes, lease: float, generation: int) -> None:
        """The master leased the absence of ``name`` from ``parent`` for ``lease`` seconds
        to a lookup sent when ``generation`` was current (unless a revocation or a
        change of this mount came since, that answer is kept)."""
        with self._lock:
            if generation != self.generation or lease <= SAFETY:
                return
            missing = self._missing
            if len(missing) >= MAX_MISSING:  # expired ones go, else all
                now = time.monotonic()
                self._missing = missing = {k: t for k, t in missing.items() if t > now}
                if len(missing) >= MAX_MISSING // 2:
                    missing.clear()
            missing[(parent, name)] = time.monotonic() + lease - SAFETY

    def opendir(self, parent: int) -> tuple[bool, bool]:
        """(cache_readdir, keep_cache) for an opendir of ``parent``: cache what the
        kernel reads while the listing is leased, and keep that cache while the lease
        it was read under still holds."""
        with self._lock:
            entry = self._dirs.get(parent)
            if entry is None or entry[1] <= time.monotonic():
                self._kernel.pop(parent, None)
                return False, False
            keep = self._kernel.get(parent) == entry[2]
            self._kernel[parent] = entry[2]
            if len(self._kernel) > KERNEL_RECORDS:  # records of listings long gone
                self._kernel = {parent: entry[2]}
            return True, keep

    def missed(self, parent: int) -> bool:
        """The master said a name of ``parent`` is absent: True when its listing should
        be asked for now (the caller then calls ``fetched``)."""
        n = self._misses.get(parent, 0) + 1
        if n < MISSES_BEFORE_LISTING or parent in self._fetching or parent in self._dirs:
            self._misses[parent] = n
            if len(self._misses) > 4 * LISTING_MAX:
                self._misses.clear()
            return False
        self._misses.pop(parent, None)
        retry = self._not_before.get(parent)
        if retry is not None:
            if time.monotonic() < retry:
                return False
            del self._not_before[parent]
        self._fetching.add(parent)
        return True

    def fetched(self, parent: int, names: list[bytes] | None, lease: float,
                generation: int) -> None:
        """The listing of ``parent`` asked for when ``generation`` was current: its names
        (None: too many), leased for ``lease`` seconds from when it was asked (0: denied)."""
        self._fetching.discard(parent)
        if names is None or lease <= SAFETY:
            self._not_before[parent] = time.monotonic() + RETRY_AFTER
            if len(self._not_before) > 4 * LISTING_MAX:
                self._not_before.clear()
            return
        self.install(parent, names, lease, generation)

    def install(self, parent: int, names: list[bytes], lease: float, generation: int) -> None:
        """Keep ``names`` as all of ``parent``'s for ``lease`` seconds, unless a listing
        was dropped since ``generation`` (then this one may be stale)."""
        names = set(names)
        with self._lock:
            if generation != self.generation or lease <= SAFETY or len(names) > LISTING_MAX:
                return
            now = time.monotonic()
            old = self._dirs.get(parent)
            if old is not None and old[1] > now:
                # a renewal: the new lease began before the old one ended and nothing
                # was revoked in between (generation), so what the kernel keeps from
                # under the old lease stays good: same serial
                serial = old[2]
            else:
                self._serial += 1
                serial = self._serial
            self._forget_locked(parent)
            self._dirs[parent] = (names, now + lease - SAFETY, serial)
            self._names += len(names)
            while self._names > self.max_names and self._dirs:
                self._forget_locked(next(iter(self._dirs)))

    def _forget(self, parent: int) -> None:
        with self._lock:
            self._forget_locked(parent)

    def _forget_locked(self, parent: int) -> None:
        entry = self._dirs.pop(parent, None)
        if entry is not None:
            self._names -= len(entry[0])

    # -- this mount's own changes (trio thread) -------------------------------------------

    def added(self, parent: int, name: bytes) -> None:
        with self._lock:
            entry = self._dirs.get(parent)
            if entry is not None and name not in entry[0]:
                entry[0].add(name)
                self._names += 1

    def removed(self, parent: int, name: bytes) -> None:
        with self._lock:
            entry = self._dirs.get(parent)
            if entry is not None and name in entry[0]:
                entry[0].discard(name)
                self._names -= 1

    @contextlib.contextmanager
    def changing(self, *parents: int):
        """Around a change this mount makes in ``parents`` (then ``added`` or
        ``removed``): if it fails (or its outcome is unknown) their listings go.  A
        listing asked for while the change was on its way is not installed: it may
        have been read before the change, which then finds no copy to update."""
        self._bump()
        try:
            yield
        except BaseException:
            for p in parents:
                self._forget(p)
            raise
        finally:
            self._bump()

    @contextlib.contextmanager
    def adding(self, parent: int, name: bytes):
        """Around this mount's change that makes ``name`` in ``parent``: ``changing``,
        then ``added`` once it succeeded."""
        self.making(parent, name)
        with self.changing(parent):
            yield
        self.added(parent, name)

    def making(self, parent: int, name: bytes) -> None:
        """This mount is about to make ``name`` in ``parent``: its absence is not known
        any more (whatever the change's outcome)."""
        self._missing.pop((parent, name), None)

    @contextlib.contextmanager
    def removing(self, parent: int, name: bytes):
        """The same for a change that removes ``name`` from ``parent``."""
        with self.changing(parent):
            yield
        self.removed(parent, name)

    def _bump(self) -> None:
        with self._lock:
            self.generation += 1

    # -- revocations (lease session thread) ---------------------------------------------

    def drop(self, parents, names=()) -> list[int]:
        """Revoked listings go, and the absences of revoked ``names`` (dir, name);
        returns the listings the kernel may hold entries of (the caller invalidates
        them before the revocation is acknowledged)."""
        with self._lock:
            self.generation += 1
            for key in names:
                self._missing.pop(key, None)
            for p in parents:
                self._forget_locked(p)
            return [p for p in parents if self._kernel.pop(p, None) is not None]

    def drop_all(self) -> list[int]:
        with self._lock:
            self.generation += 1
            self._dirs.clear()
            self._missing.clear()
            self._names = 0
            cached, self._kernel = list(self._kernel), {}
            return cached

    def __len__(self) -> int:
        return len(self._dirs)
