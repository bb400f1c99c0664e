"""OwnedFd (common/fds.py): one owner closes a descriptor once, never under a use."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from curvine.common.fds import FdClosed, OwnedFd, close_fd


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def test_close_waits_for_the_last_borrower():
    fd = os.open("/dev/null", os.O_RDONLY)
    owned = OwnedFd(fd, "a test file")
    with owned.borrow() as got:
        assert got == fd
        owned.close()  # the owner lets go while a use is under way
        assert owned.closed and _is_open(fd)  # ...the number stays ours
        os.read(got, 1)
    assert not _is_open(fd)


def test_a_borrow_after_close_is_refused_and_a_second_close_does_nothing():
    fd = os.open("/dev/null", os.O_RDONLY)
    owned = OwnedFd(fd, "a test file")
    owned.close()
    assert not _is_open(fd)
    other = os.open("/dev/null", os.O_RDONLY)  # most likely the same number again
    try:
        with pytest.raises(FdClosed):
            with owned.borrow():
                pass
        owned.close()
        assert _is_open(other)  # not closed in the old one's name
    finally:
        os.close(other)


def test_borrowers_in_threads_close_it_exactly_once():
    fd = os.open("/dev/null", os.O_RDONLY)
    owned = OwnedFd(fd, "a test file")
    inside, release = threading.Barrier(5), threading.Event()

    def use():
        with owned.borrow() as got:
            inside.wait(5)
            release.wait(5)
            os.fstat(got)

    threads = [threading.Thread(target=use) for _ in range(4)]
    for t in threads:
        t.start()
    inside.wait(5)
    owned.close()
    assert _is_open(fd)
    release.set()
    for t in threads:
        t.join(5)
    assert not _is_open(fd)


def test_a_close_that_finds_the_number_closed_is_an_error_naming_the_owner(caplog):
    fd = os.open("/dev/null", os.O_RDONLY)
    os.close(fd)
    with caplog.at_level(logging.ERROR, logger="curvine.common.fds"):
        close_fd(fd, "the staging dir of worker 1")
    assert "the staging dir of worker 1" in caplog.text and "closed elsewhere" in caplog.text
