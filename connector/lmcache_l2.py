"""LMCache's multiprocess mode on curvine: an L2 adapter of the ``plugin`` type.

    {"type": "plugin",
     "module_path": "curvine.connector.lmcache_l2",
     "class_name": "CurvineL2Adapter",
     "adapter_params": {"conf": "/etc/curvine/curvine.toml",   # optional
                        "namespace": "/l2cache",               # optional
                        "short_circuit": true}}                # optional

LMCache finds ``CurvineL2AdapterConfig`` by its name (class name + "Config").  Objects
are stored as their raw bytes under the names of LMCache's own ``fs`` L2 adapter
(``connector.naming.object_key_name``), so a process using that adapter on a mount of
the same cluster shares the files.  Batched by design: a lookup or load task of N keys
costs one LookupMany, a store task two master calls (``KVStore.put_many``: one
reservation that also answers which keys another instance stored, one publish in one
journal record), and its objects move in parallel.  Tasks run in this adapter's threads; completion is signalled on the three
event fds.  "Lock" is a lookup: the master does not pin what it found, and an object
evicted before its load is a miss in the load's bitmap, as the interface allows.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
from typing import Any

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase
from lmcache.v1.platform import create_event_notifier

from . import naming
from .entries import EntryCache
from .store import DEFAULT_NAMESPACE, KVStore

log = logging.getLogger("curvine.connector")


class CurvineL2AdapterConfig(L2AdapterConfigBase):
    """adapter_params of the curvine L2 adapter (all optional)."""

    shared = True  # one namespace for every LMCache instance of the cluster

    def __init__(self, conf: str | None = None, namespace: str = DEFAULT_NAMESPACE,
                 short_circuit: bool | None = None, threads: int = 16):
        self.conf = conf
        self.namespace = namespace
        self.short_circuit = short_circuit
        self.threads = threads

    @classmethod
    def from_dict(cls, d: dict) -> "CurvineL2AdapterConfig":
        unknown = set(d) - {"conf", "namespace", "short_circuit", "threads"}
        if unknown:
            raise ValueError(f"curvine L2 adapter: unknown adapter_params {sorted(unknown)}")
        conf = d.get("conf")
        if conf is not None and (not isinstance(conf, str) or not conf):
            raise ValueError("conf must be a non-empty string (a curvine config file)")
        namespace = d.get("namespace", DEFAULT_NAMESPACE)
        if not isinstance(namespace, str) or not namespace.startswith("/"):
            raise ValueError("namespace must be an absolute path in the cluster")
        sc = d.get("short_circuit")
        if sc is not None and not isinstance(sc, bool):
            raise ValueError("short_circuit must be a boolean")
        threads = d.get("threads", 16)
        if not isinstance(threads, int) or not 1 <= threads <= 256:
            raise ValueError("threads must be an integer in 1..256")
        return cls(conf, namespace, sc, threads)

    @classmethod
    def help(cls) -> str:
        return ("curvine L2 adapter fields (adapter_params):\n"
                "- conf (str): curvine config file (default $CURVINE_CONF, else "
                "/etc/curvine/curvine.toml)\n"
                "- namespace (str): directory in the cluster (default /l2cache)\n"
                "- short_circuit (bool): read and write this host's blocks through the "
                "local worker's socket (default: client.short_circuit)\n"
                "- threads (int): objects moved at once (default 16)")


class CurvineL2Adapter(L2AdapterInterface):
    """L2AdapterInterface over curvine.connector.store.KVStore."""

    def __init__(self, config: CurvineL2AdapterConfig | dict | None = None,
                 store: KVStore | None = None, **_kwargs: Any):
        super().__init__()
        if not isinstance(config, CurvineL2AdapterConfig):
            config = CurvineL2AdapterConfig.from_dict(config or {})
        self._config = config
        self.store = store or KVStore.open(config.conf, config.namespace, config.short_circuit)
        self._threads = concurrent.futures.ThreadPoolExecutor(
            config.threads, thread_name_prefix="curvine-l2")
        self._store_efd = create_event_notifier()
        self._lookup_efd = create_event_notifier()
        self._load_efd = create_event_notifier()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._stored: dict[L2TaskId, L2StoreResult] = {}
        self._looked_up: dict[L2TaskId, Bitmap] = {}
        self._loaded: dict[L2TaskId, Bitmap] = {}
        self._entries = EntryCache()  # what lookup-and-lock found, for the load after it
        self._closed = False

    # -- event fds ---------------------------------------------------------------------

    def get_store_event_fd(self) -> int:
        return self._store_efd.fileno()

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._lookup_efd.fileno()

    def get_load_event_fd(self) -> int:
        return self._load_efd.fileno()

    def _submit(self, fn, *args) -> L2TaskId:
        task_id = next(self._ids)
        self._threads.submit(fn, task_id, *args)
        return task_id

    # -- store -------------------------------------------------------------------------

    def submit_store_task(self, keys, objects) -> L2TaskId:
        if len(keys) != len(objects):
            raise ValueError(f"{len(keys)} keys, {len(objects)} objects")
        return self._submit(self._store_task, list(keys), list(objects))

    def _store_task(self, task_id: L2TaskId, keys, objects) -> None:
        ok, written, stored, sizes = True, 0, [], []
        try:
            names = [naming.object_key_name(k) for k in keys]
            # one reservation (names another instance stored come back as such: False)
            # and one publish for the task; failures are logged by the store
            results = self.store.put_many_quietly(
                [(n, [o.byte_array]) for n, o in zip(names, objects)])
            for key, obj, result in zip(keys, objects, results):
                if result is None:
                    ok = False
                elif result:
                    n = len(obj.byte_array)
                    written += n
                    stored.append(key)
                    sizes.append(n)
        except Exception as e:  # noqa: BLE001 - the task fails, nothing raises
            ok = False
            log.warning("curvine L2: store task %d failed: %s", task_id, e)
        if stored:
            self._notify_keys_stored(stored, sizes)
        with self._lock:
            self._stored[task_id] = L2StoreResult(ok, written)
        self._store_efd.notify()

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        with self._lock:
            done, self._stored = self._stored, {}
        return done

    # -- lookup and lock ------------------------------------------------------------------

    def submit_lookup_and_lock_task(self, keys, group_layout_descs=None) -> L2TaskId:
        return self._submit(self._lookup_task, list(keys))

    def _lookup_task(self, task_id: L2TaskId, keys) -> None:
        bitmap = Bitmap(len(keys))
        try:
            entries = self.store.lookup_quietly([naming.object_key_name(k) for k in keys])
            self._entries.put(entries)
            for i, e in enumerate(entries):
                if e is not None:
                    bitmap.set(i)
        except Exception as e:  # noqa: BLE001 - all misses
            log.warning("curvine L2: lookup task %d failed: %s", task_id, e)
        with self._lock:
            self._looked_up[task_id] = bitmap
        self._lookup_efd.notify()

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._looked_up.pop(task_id, None)

    def submit_unlock(self, keys) -> None:
        """Nothing is pinned at the master (module doc), so nothing to undo."""

    # -- load ------------------------------------------------------------------------------

    def submit_load_task(self, keys, objects) -> L2TaskId:
        if len(keys) != len(objects):
            raise ValueError(f"{len(keys)} keys, {len(objects)} objects")
        return self._submit(self._load_task, list(keys), list(objects))

    def _load_task(self, task_id: L2TaskId, keys, objects) -> None:
        bitmap = Bitmap(len(keys))
        try:
            names = [naming.object_key_name(k) for k in keys]
            entries = [self._entries.pop(n) for n in names]
            missing = [i for i, e in enumerate(entries) if e is None]
            if missing:
                for i, e in zip(missing, self.store.lookup_quietly([names[i] for i in missing])):
                    entries[i] = e
            futs = [(i, self.store.pool.submit(self.store.get_quietly, e,
                                               [objects[i].byte_array]))
                    for i, e in enumerate(entries) if e is not None]
            for i, fut in futs:
                if fut.result() == len(objects[i].byte_array) == entries[i].size:
                    bitmap.set(i)
                elif fut.result() is not None:
                    log.warning("curvine L2: %s holds %d bytes, the load buffer %d",
                                names[i], entries[i].size, len(objects[i].byte_array))
        except Exception as e:  # noqa: BLE001 - all misses
            log.warning("curvine L2: load task %d failed: %s", task_id, e)
        loaded = [keys[i] for i in bitmap.get_indices_list()]
        if loaded:
            self._notify_keys_accessed(loaded)
        with self._lock:
            self._loaded[task_id] = bitmap
        self._load_efd.notify()

    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._loaded.pop(task_id, None)

    # -- the rest ----------------------------------------------------------------------------

    def delete(self, keys) -> None:
        keys = list(keys)
        names = [naming.object_key_name(k) for k in keys]
        entries = self.store.lookup_quietly(names)  # the sizes, for LMCache's accounting
        gone = [(k, e.size) for k, n, e in zip(keys, names, entries)
                if e is not None and self.store.remove(n)]
        if gone:
            self._notify_keys_deleted([k for k, _ in gone], [n for _, n in gone])

    def report_status(self) -> dict:
        return {"is_healthy": not self._closed, "type": "CurvineL2Adapter",
                "master": self.store.master.address, "namespace": self.store.namespace,
                "short_circuit": self.store.sockets is not None, **self.store.stats}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._threads.shutdown(wait=True, cancel_futures=True)
        self.store.close()
        for efd in (self._store_efd, self._lookup_efd, self._load_efd):
            efd.close()
        log.info("curvine L2 adapter closed")
