"""A standby's read index (master/group/read_index.py) without servers: reads that
arrive while a Range of ``commit`` is in flight share ONE next Range; a read waits
until the member applied the commit read after it arrived; an etcd error, a read
waiting past its timeout and a close answer the reads with an error, none is left
waiting.  (End to end: tests/test_master_group.py, tests/test_group_masters.py.)"""

from __future__ import annotations

import threading

from curvine.common.errors import CurvineError, ErrorKind
from curvine.master.group.read_index import ReadIndex

from cluster_util import wait_for


class FakeEtcd:
    """``commit`` as etcd would answer it; ``gate`` holds every Range until set."""

    def __init__(self, commit: int = 0):
        self.commit = commit
        self.gate = threading.Event()
        self.gate.set()
        self.in_flight = threading.Event()
        self.error: CurvineError | None = None

    def read_commit(self) -> int:
        self.in_flight.set()
        self.gate.wait(10)
        self.in_flight.clear()
        if self.error is not None:
            raise self.error
        return self.commit


class Reads:
    def __init__(self):
        self.lock = threading.Lock()
        self.outcomes: list[CurvineError | None] = []

    def done(self, error: CurvineError | None) -> None:
        with self.lock:
            self.outcomes.append(error)


def test_reads_during_a_range_share_the_next_one():
    etcd, applied, wakes = FakeEtcd(commit=7), [7], []
    index = ReadIndex(etcd.read_commit, lambda: applied[0], lambda: wakes.append(1))
    try:
        first = Reads()
        etcd.gate.clear()
        index.wait_async(first.done)
        wait_for(etcd.in_flight.is_set, 5, what="the first Range sent")
        later = Reads()
        for _ in range(20):  # all arrive while the first Range is in flight
            index.wait_async(later.done)
        etcd.gate.set()
        wait_for(lambda: len(later.outcomes) == 20, 5, what="the 20 reads answered")
        assert first.outcomes == [None] and later.outcomes == [None] * 20
        assert index.ranges == 2  # the first, and ONE for the 20 that came during it
        assert not wakes  # applied already: nothing to follow
        index.wait()  # a blocking reader (a unary RPC's thread) gets its own Range
        assert index.ranges == 3
    finally:
        index.close()


def test_a_read_waits_until_the_commit_read_after_it_is_applied():
    etcd, applied, wakes = FakeEtcd(commit=10), [5], []
    index = ReadIndex(etcd.read_commit, lambda: applied[0], lambda: wakes.append(1))
    try:
        reads = Reads()
        index.wait_async(reads.done)
        wait_for(lambda: wakes, 5, what="the follower woken")
        applied[0] = 9
        index.applied_up_to(9)
        assert reads.outcomes == []  # 9 < 10: still waiting
        applied[0] = 10
        index.applied_up_to(10)
        assert reads.outcomes == [None]
    finally:
        index.close()


def test_errors_timeouts_and_close_answer_every_read():
    etcd, applied = FakeEtcd(commit=10), [0]
    # 0.3 s instead of READ_INDEX_WAIT (5 s): the same code path, a constant apart
    index = ReadIndex(etcd.read_commit, lambda: applied[0], lambda: None, timeout=0.3)
    try:
        late = Reads()
        index.wait_async(late.done)
        wait_for(lambda: late.outcomes, 5, what="the read given up")
        assert late.outcomes[0].kind == ErrorKind.UNAVAILABLE
        assert "applied seq 0 of 10" in late.outcomes[0].message

        etcd.error = CurvineError(ErrorKind.UNAVAILABLE, "etcd down")
        failed = Reads()
        index.wait_async(failed.done)
        wait_for(lambda: failed.outcomes, 5, what="the read failed")
        assert failed.outcomes == [etcd.error]
        etcd.error = None
    finally:
        index.timeout = 60
        pending = Reads()
        index.wait_async(pending.done)
        wait_for(lambda: index.ranges >= 3, 5, what="its Range")
        index.close()
    assert len(pending.outcomes) == 1 and pending.outcomes[0].kind == ErrorKind.UNAVAILABLE
    closed = Reads()
    index.wait_async(closed.done)  # after close: at once
    assert closed.outcomes[0].kind == ErrorKind.UNAVAILABLE
