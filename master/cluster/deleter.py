"""Delivers block deletes to the workers as soon as they are queued.

A heartbeat comes once a second; a pod writes 1-2 GB/s.  Space that eviction (or an
unlink) freed must be usable at once, so one thread of the master calls each worker's
``DeleteBlocks`` (with a write token per block, minted with the master's block key)
within ``GATHER`` seconds of deletes being queued, and records the worker's answer:
from then on those bytes are free in the master's account (master/cluster/workers.py).
Deletes that cannot be delivered go back to their queue and reach the worker with a
later heartbeat reply.

The calls carry the worker token (the master's ``Security.as_worker()``), the
credential of the daemons' calls to each other.

``deliver()`` runs the same delivery on the caller's thread, for a placement that
waits for room (master/cluster/capacity.py ``make_room``): when it returns, every delete
queued before it was delivered and confirmed (or failed); it returns how many the
workers confirmed.
"""

from __future__ import annotations

import logging
import threading
import time

from curvine.common import block_tokens
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.rpc import RpcClient
from curvine.common.security import Security
from curvine.proto import worker_pb2, worker_pb2_grpc

from .workers import WorkerRegistry

log = logging.getLogger(__name__)

BATCH = 1000  # block ids per DeleteBlocks call
RETRY_AFTER = 1.0  # seconds before a worker that failed a delivery is tried again
# Seconds the thread waits after deletes are queued before delivering them, so that the
# deletes of many publishes go in one call: each new version frees its old blocks, and
# a call per freed block cost the master ~12% of its CPU (and the worker a gRPC call)
# in a small-file workload.  A placement that needs the room now does not wait for
# this: it calls deliver() itself (master/cluster/capacity.py).
GATHER = 0.05


class DeletePusher:
    """Takes the deletes queued in ``registry`` to the workers, each with a write token
    minted with ``block_key`` (the master's), a call at most ``rpc_timeout`` (and 10 s)
    long."""

    def __init__(self, registry: WorkerRegistry, block_key: bytes, security: Security,
                 rpc_timeout: float):
        self.registry = registry
        self.block_key = block_key
        self.security = security.as_worker()
        self.timeout = min(rpc_timeout, 10.0)
        self._clients: dict[str, RpcClient] = {}
        self._failed_at: dict[int, float] = {}  # worker id -> monotonic time it failed
        self._deliver_lock = threading.Lock()  # one delivery at a time: waiters see it done
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="block-deletes", daemon=True)
        self.stats = {"calls": 0, "blocks": 0, "failures": 0}

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        registry = self.registry
        with registry.deletes_queued:
            registry.deletes_queued.notify_all()
        if self._thread.is_alive():  # a standby's (master/member.py) never started
            self._thread.join(timeout=15)
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    def _run(self) -> None:
        registry = self.registry
        while not self._stop.is_set():
            with registry.deletes_queued:
                registry.deletes_queued.wait(timeout=RETRY_AFTER)
            if self._stop.wait(GATHER):
                break
            try:
                self.deliver()
            except Exception:  # noqa: BLE001 - the thread must survive a bug in one round
                log.exception("delivering block deletes failed")

    def deliver(self, deadline: float | None = None) -> int:
        """Deliver every queued delete of the live workers now; returns how many the
        workers confirmed (those that could not be delivered in time, by ``deadline``
        (monotonic), stay queued)."""
        if deadline is None:
            acquired = self._deliver_lock.acquire()
        else:
            acquired = self._deliver_lock.acquire(timeout=max(deadline - time.monotonic(), 0))
        if not acquired:
            return 0
        try:
            confirmed = 0
            now = time.monotonic()
            for wid, (address, ids) in self.registry.take_deletes().items():
                if deadline is None and now - self._failed_at.get(wid, 0.0) < RETRY_AFTER:
                    self.registry.give_back_deletes(wid, ids)  # the heartbeat may get them
                    continue
                confirmed += self._push(wid, address, ids, deadline)
            return confirmed
        finally:
            self._deliver_lock.release()

    def _push(self, wid: int, address: str, ids: list[int], deadline: float | None) -> int:
        """DeleteBlocks of ``ids`` on worker ``wid``; how many it confirmed."""
        key = self.block_key
        registry = self.registry
        for i in range(0, len(ids), BATCH):
            batch = ids[i:i + BATCH]
            timeout = self.timeout
            if deadline is not None:
                timeout = min(timeout, deadline - time.monotonic())
            try:
                if timeout <= 0:
                    raise CurvineError(ErrorKind.TIMEOUT, "no time left to deliver block deletes")
                req = worker_pb2.DeleteBlocksRequest(
                    block_ids=batch,
                    tokens=[block_tokens.mint(key, b, block_tokens.WRITE) for b in batch])
                self._client(address).call("DeleteBlocks", req, timeout=timeout, wait=0)
            except CurvineError as e:
                self.stats["failures"] += 1
                self._failed_at[wid] = time.monotonic()
                registry.give_back_deletes(wid, ids[i:])
                log.info("cannot deliver %d block deletes to worker %d (%s): %s; they go "
                         "with its next heartbeat", len(ids) - i, wid, address, e)
                return i
            self.stats["calls"] += 1
            self.stats["blocks"] += len(batch)
            registry.confirm_deletes(wid, batch)
        self._failed_at.pop(wid, None)
        return len(ids)

    def _client(self, address: str) -> RpcClient:
        c = self._clients.get(address)
        if c is None:
            c = self._clients[address] = RpcClient(address, worker_pb2_grpc.WorkerStub,
                                                   security=self.security,
                                                   timeout=self.timeout, wait=0)
        return c
