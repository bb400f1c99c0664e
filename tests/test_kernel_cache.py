"""KernelCache (fuse_client/kernel_cache.py) without a kernel: its locks, as the trio
loop and a revocation in the session thread take them."""

from __future__ import annotations

import threading

import trio

from curvine.common.config import Config
from curvine.fuse_client.kernel_cache import KernelCache
from curvine.proto import common_pb2


def test_the_loop_never_waits_for_a_revocation_that_waits_for_the_loop(monkeypatch):
    """A revocation (session thread) holds the kernel lock while its page
    invalidations wait for a request that the trio loop serves.  Everything the loop
    does with the cache meanwhile (a change, a publish, an attribute drop, a kept
    version) must not wait for that lock: before, the loop blocked on it and the mount
    hung for good (fsstress, 2 runs of 3)."""
    notified = []
    monkeypatch.setattr(KernelCache, "_notify_inval",
                        staticmethod(lambda ino, attr_only: notified.append(ino)))
    kc = KernelCache(Config(), master=None)  # made in the loop's thread, as the mount's
    kc._attached = True
    kc.lease_inode(9, 30.0)
    served = threading.Event()
    holding = threading.Event()
    seen = []

    def revocation():
        with kc._kernel_lock:
            holding.set()
            # its invalidation waits for the loop to serve a request
            seen.append(served.wait(5))

    t = threading.Thread(target=revocation)
    t.start()
    assert holding.wait(5)

    async def loop():
        with kc.changing(5, (1, b"f")):
            pass
        kc.drop_attributes(7)
        node = common_pb2.Inode(ino=9, parent=1, name=b"g", nlink=1, size=3)
        kc.forget_published(9, node, sent=0.0)
        kc.published(9)
        served.set()  # the request the revocation waits for

    trio.run(loop)
    t.join(10)
    assert seen == [True], "the loop waited for the revocation's lock"
    assert notified == [7, 9]
