"""The mount's leased listings (fuse_client/listings.py): when a directory's listing is
asked for, when a copy may be installed and used, and how this mount's own changes and
the master's revocations keep it right."""

from __future__ import annotations

import time

import pytest

from curvine.fuse_client import listings as listings_mod
from curvine.fuse_client.listings import MISSES_BEFORE_LISTING, LeasedListings


def _ask(ls: LeasedListings, parent: int) -> bool:
    """Misses in ``parent`` until the listing is due; True when it became due."""
    return any(ls.missed(parent) for _ in range(MISSES_BEFORE_LISTING))


def test_a_directory_that_keeps_missing_is_listed_once_then_answered_here():
    ls = LeasedListings()
    assert not any(ls.missed(7) for _ in range(MISSES_BEFORE_LISTING - 1))
    assert ls.missed(7)  # the MISSES_BEFORE_LISTING-th miss
    assert not _ask(ls, 7)  # already being fetched: not twice
    gen = ls.generation
    ls.fetched(7, [b"a", b"b"], 5.0, gen)
    assert 4.0 < ls.absent(7, b"zzz") <= 5.0
    assert ls.absent(7, b"a") == 0  # listed: ask (it exists)
    assert ls.absent(8, b"zzz") == 0  # another directory: ask
    assert ls.answered == 1
    assert not _ask(ls, 7)  # held: nothing to fetch


def test_a_denied_or_too_large_listing_is_not_asked_again_at_once(monkeypatch):
    ls = LeasedListings()
    assert _ask(ls, 7)
    ls.fetched(7, None, 5.0, ls.generation)  # more than LISTING_MAX names
    assert ls.absent(7, b"x") == 0 and not _ask(ls, 7)
    assert _ask(ls, 9)
    ls.fetched(9, [b"a"], 0.0, ls.generation)  # denied (the directory is busy)
    assert ls.absent(9, b"x") == 0 and not _ask(ls, 9)
    monkeypatch.setattr(listings_mod, "RETRY_AFTER", 0.0)
    assert _ask(ls, 8)
    ls.fetched(8, None, 5.0, ls.generation)
    assert _ask(ls, 8)  # retried once RETRY_AFTER passed


def test_a_listing_read_before_a_drop_or_an_own_change_is_not_installed():
    ls = LeasedListings()
    gen = ls.generation
    ls.drop([99])  # a revocation (of any listing) while the listing was on its way
    ls.install(7, [b"a"], 5.0, gen)
    assert ls.absent(7, b"x") == 0
    gen = ls.generation
    with ls.changing(7):  # this mount creates a name in 7 meanwhile
        pass
    ls.added(7, b"new")
    ls.install(7, [b"a"], 5.0, gen)  # read before the create: it would miss "new"
    assert ls.absent(7, b"new") == 0 and ls.absent(7, b"x") == 0
    ls.install(7, [b"a"], 5.0, ls.generation)
    assert ls.absent(7, b"x") > 0


def test_own_changes_update_the_copy_and_failures_drop_it():
    ls = LeasedListings()
    ls.install(7, [b"a", b"b"], 5.0, ls.generation)
    ls.install(8, [], 5.0, ls.generation)
    with ls.changing(7):
        pass
    ls.added(7, b"c")
    assert ls.absent(7, b"c") == 0
    with ls.changing(7, 8):  # a rename of b from 7 to 8
        pass
    ls.removed(7, b"b")
    ls.added(8, b"b")
    assert ls.absent(7, b"b") > 0 and ls.absent(8, b"b") == 0
    with pytest.raises(OSError):
        with ls.changing(8):  # outcome unknown: the copy goes
            raise OSError("timed out")
    assert ls.absent(8, b"zzz") == 0 and ls.absent(7, b"zzz") > 0


def test_revocations_expiry_and_the_size_bound():
    ls = LeasedListings(max_names=5)
    ls.install(1, [b"a", b"b"], 5.0, ls.generation)
    ls.install(2, [b"c", b"d"], 5.0, ls.generation)
    ls.install(3, [b"e", b"f"], 5.0, ls.generation)  # 6 names > 5: the oldest goes
    assert ls.absent(1, b"x") == 0 and ls.absent(2, b"x") > 0 and len(ls) == 2
    ls.drop([2])
    assert ls.absent(2, b"x") == 0 and ls.absent(3, b"x") > 0
    ls.drop_all()
    assert len(ls) == 0
    ls.install(4, [], listings_mod.SAFETY + 0.05, ls.generation)
    assert ls.absent(4, b"x") > 0
    time.sleep(0.1)
    assert ls.absent(4, b"x") == 0 and len(ls) == 0  # ran out


def test_adding_and_removing_update_the_copy_only_when_the_change_succeeds():
    ls = LeasedListings()
    ls.install(7, [b"a"], 5.0, ls.generation)
    with ls.adding(7, b"new"):
        pass
    with ls.removing(7, b"a"):
        pass
    assert ls.absent(7, b"new") == 0 and ls.absent(7, b"a") > 0
    with pytest.raises(OSError):
        with ls.adding(7, b"failed"):
            raise OSError("EEXIST")
    assert ls.absent(7, b"failed") == 0 and ls.absent(7, b"x") == 0  # the copy went


def test_the_kernel_keeps_a_directorys_entries_only_under_one_unbroken_lease(monkeypatch):
    """opendir's (cache_readdir, keep_cache): cache while the listing is held; keep the
    cache only when the previous opendir was under the same lease (a renewal before
    the end counts as the same); a drop names the directories to invalidate."""
    ls = LeasedListings()
    assert ls.opendir(7) == (False, False)  # no listing: the kernel neither caches nor keeps
    ls.install(7, [b"a"], 5.0, ls.generation)
    assert ls.opendir(7) == (True, False)  # fills its cache under this lease
    assert ls.opendir(7) == (True, True)  # and keeps it
    ls.install(7, [b"a"], 5.0, ls.generation)  # renewed before it ran out
    assert ls.opendir(7) == (True, True)
    assert ls.drop([7, 8]) == [7]  # revoked: the kernel's copy of 7 must go
    ls.install(7, [b"a"], 5.0, ls.generation)
    assert ls.opendir(7) == (True, False)  # a new lease: what the kernel has is older
    assert ls.opendir(7) == (True, True)
    now = time.monotonic()
    monkeypatch.setattr(listings_mod.time, "monotonic", lambda: now + 10)
    assert ls.opendir(7) == (False, False)  # ran out: no revocation reaches us now
    ls.install(7, [b"a"], 5.0, ls.generation)  # a lease after a gap is a new one
    assert ls.opendir(7) == (True, False)
    assert ls.drop_all() == [7] and ls.opendir(7) == (False, False)


def test_a_single_leased_absence_is_answered_here_until_made_or_revoked():
    """A miss the master leased (the kernel keeps it as a negative entry) is answered
    here when the kernel asks again anyway (a rename's target, an O_EXCL create),
    until this mount makes the name, a revocation names it, or the lease ends; one
    asked for before a drop or an own change is not kept."""
    ls = LeasedListings()
    gen = ls.generation
    ls.missing(7, b"k.data", 5.0, gen)
    assert 4.0 < ls.absent(7, b"k.data") <= 5.0
    assert ls.absent(7, b"other") == 0 and ls.absent(8, b"k.data") == 0
    with ls.adding(7, b"k.data"):  # made here: known no more, whatever the outcome
        assert ls.absent(7, b"k.data") == 0
    ls.missing(7, b"k.data", 5.0, gen)  # asked before that change: not kept
    assert ls.absent(7, b"k.data") == 0
    ls.missing(7, b"a", 5.0, ls.generation)
    ls.missing(7, b"b", 5.0, ls.generation)
    ls.drop([], [(7, b"a")])  # a revocation of that name (another client made it)
    assert ls.absent(7, b"a") == 0 and ls.absent(7, b"b") > 0
    ls.missing(7, b"c", 0.1, ls.generation)  # too short a lease to use
    assert ls.absent(7, b"c") == 0
    ls.drop_all()
    assert ls.absent(7, b"b") == 0
