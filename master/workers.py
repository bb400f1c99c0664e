"""Workers as the master sees them: registrations, liveness, capacity, placement,
and the queue of block deletes each worker picks up with its next heartbeat.

Registrations are journaled (worker ids are named by block locations); liveness,
capacity and the delete queues live in memory and are rebuilt from heartbeats and
block reports after a master restart.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from curvine.proto import common_pb2


@dataclass
class WorkerState:
    info: common_pb2.WorkerInfo
    capacity: int = 0
    used: int = 0
    num_blocks: int = 0
    last_heartbeat: float = 0.0  # time.monotonic(); 0 = not heard from since master start
    deletes: set[int] = field(default_factory=set)

    def free(self) -> int:
        return max(self.capacity - self.used, 0)


class WorkerRegistry:
    def __init__(self, lost_after: float):
        self.lost_after = lost_after
        self._lock = threading.Lock()
        self._workers: dict[int, WorkerState] = {}
        self._reserved: dict[int, int] = {}  # bytes promised to writes since the last heartbeat

    def upsert(self, info: common_pb2.WorkerInfo) -> None:
        with self._lock:
            st = self._workers.get(info.worker_id)
            if st is None:
                self._workers[info.worker_id] = WorkerState(info=info)
            else:
                st.info = info

    def by_uuid(self, uuid: str) -> common_pb2.WorkerInfo | None:
        with self._lock:
            for st in self._workers.values():
                if st.info.uuid == uuid:
                    return st.info
        return None

    def known(self, worker_id: int) -> bool:
        with self._lock:
            return worker_id in self._workers

    def heartbeat(self, worker_id: int, capacity: int, used: int, num_blocks: int) -> list[int] | None:
        """Record a heartbeat; returns the blocks to delete, or None for an unknown worker."""
        with self._lock:
            st = self._workers.get(worker_id)
            if st is None:
                return None
            st.capacity, st.used, st.num_blocks = capacity, used, num_blocks
            st.last_heartbeat = time.monotonic()
            self._reserved[worker_id] = 0
            deletes = sorted(st.deletes)
            st.deletes.clear()
            return deletes

    def queue_deletes(self, pairs: list[tuple[int, int]]) -> None:
        with self._lock:
            for worker_id, block_id in pairs:
                st = self._workers.get(worker_id)
                if st is not None:
                    st.deletes.add(block_id)

    def alive(self, st: WorkerState, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return st.last_heartbeat > 0 and now - st.last_heartbeat < self.lost_after

    def snapshot(self) -> list[tuple[common_pb2.WorkerInfo, bool]]:
        """Every registered worker with capacity/used filled in, and whether it is alive."""
        now = time.monotonic()
        out = []
        with self._lock:
            for st in self._workers.values():
                info = common_pb2.WorkerInfo()
                info.CopyFrom(st.info)
                info.capacity, info.used = st.capacity, st.used
                alive = self.alive(st, now)
                info.lost = not alive and st.last_heartbeat > 0
                out.append((info, alive))
        return out

    def silent(self, since: float) -> list[int]:
        """Workers that missed heartbeats for ``lost_after``: silent since their last
        one, or never heard from although the master has run (since ``since``, a
        time.monotonic()) for that long."""
        now = time.monotonic()
        with self._lock:
            return [wid for wid, st in self._workers.items()
                    if not self.alive(st, now)
                    and (st.last_heartbeat > 0 or now - since >= self.lost_after)]

    def alive_ids(self) -> set[int]:
        now = time.monotonic()
        with self._lock:
            return {wid for wid, st in self._workers.items() if self.alive(st, now)}

    def info(self, worker_id: int) -> common_pb2.WorkerInfo | None:
        with self._lock:
            st = self._workers.get(worker_id)
            return st.info if st is not None else None

    def choose(self, count: int, host_id: str, size: int, exclude: set[int]) -> list[common_pb2.WorkerInfo]:
        """Pick up to ``count`` live workers with room for ``size`` bytes: one on the
        client's host first, then the ones with the most free space."""
        now = time.monotonic()
        with self._lock:
            candidates = []
            for wid, st in self._workers.items():
                if wid in exclude or not self.alive(st, now):
                    continue
                free = st.free() - self._reserved.get(wid, 0)
                if st.capacity and free < size:
                    continue
                local = bool(host_id) and st.info.host_id == host_id
                candidates.append((not local, -free, wid, st))
            candidates.sort(key=lambda c: c[:3])
            chosen = [c[3] for c in candidates[:count]]
            for st in chosen:
                wid = st.info.worker_id
                self._reserved[wid] = self._reserved.get(wid, 0) + size
            return [st.info for st in chosen]
