"""LMCache's in-process engine (what vLLM's LMCacheConnectorV1 drives) on curvine,
through LMCache's remote storage plugin framework:

    remote_storage_plugins: ["curvine"]
    remote_serde: naive
    extra_config:
      remote_storage_plugin.curvine.module_path: curvine.connector.lmcache_remote
      remote_storage_plugin.curvine.class_name: CurvineRemoteConnector
      # optional:
      remote_storage_plugin.curvine.conf: /etc/curvine/curvine.toml
      remote_storage_plugin.curvine.namespace: /l2cache
      remote_storage_plugin.curvine.short_circuit: true

The files are those of LMCache's ``fs://`` connector on a mount of the same cluster
(same names, same metadata header when ``save_chunk_meta`` is on, LMCache's default),
so pods using either way hit each other's chunks.  Every method that LMCache awaits on
its event loop runs the blocking work in this connector's threads; failures are misses
(``None``/``False``; a failed put leaves nothing behind), logged once per outage,
never exceptions.  docs/lmcache.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import List, Optional

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from curvine.common.errors import CurvineError

from . import naming
from .entries import EntryCache
from .store import DEFAULT_NAMESPACE, Entry, KVStore

log = logging.getLogger("curvine.connector")

PLUGIN = "curvine"


def _bool(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def store_from_extra_config(extra: dict | None, plugin: str = PLUGIN) -> KVStore:
    """The KVStore that ``remote_storage_plugin.<plugin>.*`` keys name."""
    extra = extra or {}
    prefix = f"remote_storage_plugin.{plugin}."
    sc = extra.get(prefix + "short_circuit")
    return KVStore.open(conf_path=extra.get(prefix + "conf") or None,
                        namespace=extra.get(prefix + "namespace") or DEFAULT_NAMESPACE,
                        short_circuit=None if sc is None else _bool(sc))


class CurvineRemoteConnector(RemoteConnector):
    """A RemoteConnector over curvine.connector.store.KVStore."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend, config,
                 plugin_name: Optional[str] = None, store: KVStore | None = None):
        super().__init__(local_cpu_backend.config, local_cpu_backend.metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.plugin_name = plugin_name or PLUGIN
        self.store = store or store_from_extra_config(
            getattr(config, "extra_config", None), self.plugin_name)
        # LMCache's calls wait here, never on its event loop
        self._threads = concurrent.futures.ThreadPoolExecutor(
            16, thread_name_prefix="curvine-lmcache")
        self._entries = EntryCache()
        log.info("curvine connector on %s%s (short-circuit %s)", self.store.master.address,
                 self.store.namespace, "on" if self.store.sockets is not None else "off")

    def _run(self, fn, *args):
        return self.loop.run_in_executor(self._threads, fn, *args)

    # -- lookups ---------------------------------------------------------------------

    def _lookup(self, keys: List[CacheEngineKey]) -> list[Entry | None]:
        entries = self.store.lookup_quietly([naming.engine_key_name(k) for k in keys])
        self._entries.put(entries)
        return entries

    def _entry(self, key: CacheEngineKey) -> Entry | None:
        name = naming.engine_key_name(key)
        return self._entries.pop(name) or self.store.lookup_quietly([name])[0]

    async def exists(self, key: CacheEngineKey) -> bool:
        return (await self._run(self._lookup, [key]))[0] is not None

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self._lookup([key])[0] is not None

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey],
                                     pin: bool = False) -> int:
        """How many keys from the first are stored: one master round trip."""
        entries = await self._run(self._lookup, keys)
        return next((i for i, e in enumerate(entries) if e is None), len(entries))

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: List[CacheEngineKey]) -> int:
        entries = self._lookup(keys)
        return next((i for i, e in enumerate(entries) if e is None), len(entries))

    # -- reads -----------------------------------------------------------------------

    def _get(self, key: CacheEngineKey, entry: Entry | None = None) -> Optional[MemoryObj]:
        entry = entry or self._entry(key)
        if entry is None:
            return None
        try:
            return self._read(entry)
        except Exception as e:  # noqa: BLE001 - a miss, never an exception into LMCache
            log.warning("curvine: reading %s failed (a miss): %s", entry.name, e)
            return None

    def _read_into(self, entry: Entry, shapes, dtypes, fmt, header: bytearray | None,
                   offset: int = 0) -> tuple[Optional[MemoryObj], int]:
        """A memory object of this layout filled from the file (after ``header``, if
        given): (object, bytes read), or (None, 0) with the object released."""
        obj = self.local_cpu_backend.allocate(shapes, dtypes, fmt)
        if obj is None:
            return None, 0
        try:
            buffers = [obj.byte_array] if header is None else [header, obj.byte_array]
            n = self.store.get_quietly(entry, buffers, offset)
        except BaseException:
            obj.ref_count_down()
            raise
        if n is None:
            obj.ref_count_down()
            return None, 0
        return obj, n

    def _read(self, entry: Entry) -> Optional[MemoryObj]:
        if not self.save_chunk_meta:
            obj, n = self._read_into(entry, self.meta_shapes, self.meta_dtypes,
                                     self.meta_fmt, None)
            if obj is None:
                return None
            try:
                return self.reshape_partial_chunk(obj, n)
            except ValueError as e:
                obj.ref_count_down()
                log.warning("curvine: %s: %s", entry.name, e)
                return None
        hdr_len = self.remote_metadata_bytes
        if entry.size == hdr_len + self.full_chunk_size_bytes:
            # a full chunk (all but a prompt's last): allocate as the engine's chunk
            # shape and read header and data in one pass, then check the header agrees
            header = bytearray(hdr_len)
            obj, n = self._read_into(entry, self.meta_shapes, self.meta_dtypes,
                                     self.meta_fmt, header)
            if obj is None:
                return None
            meta = RemoteMetadata.deserialize(header)
            if (n == entry.size and meta.length == len(obj.byte_array)
                    and list(meta.shapes) == list(obj.get_shapes())
                    and list(meta.dtypes) == list(obj.get_dtypes())
                    and meta.fmt == obj.get_memory_format()):
                return obj
            obj.ref_count_down()  # another layout: read it as the header says
        header = bytearray(hdr_len)
        if self.store.get_quietly(entry, [header]) != hdr_len:
            return None
        meta = RemoteMetadata.deserialize(header)
        if meta.length != entry.size - hdr_len:
            log.warning("curvine: %s: header says %d bytes, the file holds %d", entry.name,
                        meta.length, entry.size - hdr_len)
            return None
        obj, n = self._read_into(entry, meta.shapes, meta.dtypes, meta.fmt, None, hdr_len)
        if obj is not None and n != len(obj.byte_array):
            obj.ref_count_down()
            return None
        return obj

    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return await self._run(self._get, key)

    def support_batched_get(self) -> bool:
        return True

    def _batched_get(self, keys: List[CacheEngineKey]) -> list[Optional[MemoryObj]]:
        """Entries not cached are looked up in one call; the chunks are read at once."""
        names = [naming.engine_key_name(k) for k in keys]
        entries = [self._entries.pop(n) for n in names]
        missing = [i for i, e in enumerate(entries) if e is None]
        if missing:
            found = self.store.lookup_quietly([names[i] for i in missing])
            for i, e in zip(missing, found):
                entries[i] = e
        futs = [self._threads.submit(self._get, k, e) if e is not None else None
                for k, e in zip(keys, entries)]
        return [f.result() if f is not None else None for f in futs]

    async def batched_get(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        return await self._run(self._batched_get, keys)

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: List[CacheEngineKey]
                                       ) -> List[MemoryObj]:
        """The prefix of keys read; what was read after the first miss is released."""
        objs = await self._run(self._batched_get, keys)
        out: list[MemoryObj] = []
        missed = False
        for obj in objs:
            missed = missed or obj is None
            if missed:
                if obj is not None:
                    obj.ref_count_down()
            else:
                out.append(obj)
        return out

    # -- writes ----------------------------------------------------------------------

    def _buffers(self, memory_obj: MemoryObj) -> list:
        """What a chunk file holds: LMCache's metadata header (when it saves one), then
        the tensor bytes."""
        buf = memory_obj.byte_array
        if not self.save_chunk_meta:
            return [buf]
        meta = RemoteMetadata(len(buf), memory_obj.get_shapes(), memory_obj.get_dtypes(),
                              memory_obj.get_memory_format())
        return [meta.serialize(), buf]

    def _put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        # a failure is logged once per outage and the chunk is simply not in L2 (nothing
        # is left behind); no exception goes back into LMCache's event loop
        self.store.put_quietly(naming.engine_key_name(key), self._buffers(memory_obj))

    def _put_many(self, keys: List[CacheEngineKey], memory_objs: List[MemoryObj]) -> None:
        # one reservation and one publish for the whole batch (KVStore.put_many); the
        # same quiet failures as _put
        self.store.put_many_quietly([(naming.engine_key_name(k), self._buffers(o))
                                     for k, o in zip(keys, memory_objs)])

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj):
        await self._run(self._put, key, memory_obj)

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: List[CacheEngineKey], memory_objs: List[MemoryObj]):
        await self._run(self._put_many, list(keys), list(memory_objs))

    # -- the rest --------------------------------------------------------------------

    def remove_sync(self, key: CacheEngineKey) -> bool:
        return self.store.remove(naming.engine_key_name(key))

    async def list(self) -> List[str]:
        names = await self._run(self.store.list, naming.DATA_SUFFIX)
        return [naming.engine_key_of_name(n) for n in names]

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        def ping() -> int:
            try:
                self.store.lookup([])
                self.store.master.getattr(self.store.directory())
                return 0
            except CurvineError:
                return 1
        return await self._run(ping)

    def _close(self) -> None:
        self._threads.shutdown(wait=True, cancel_futures=True)
        self.store.close()
        log.info("curvine connector closed")

    async def close(self):
        # waits for reads and writes in flight: in a thread of its own, not the loop's
        await self.loop.run_in_executor(None, self._close)


class CurvineConnectorAdapter(ConnectorAdapter):
    """The same connector as a ConnectorAdapter (class_name: CurvineConnectorAdapter):
    it is handed the plugin's instance name, so several instances (``curvine.a``,
    ``curvine.b``) can read their own ``remote_storage_plugin.<name>.*`` keys."""

    def __init__(self) -> None:
        super().__init__("plugin://curvine")

    def can_parse(self, url: str) -> bool:
        return url.startswith("plugin://curvine")

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        return CurvineRemoteConnector(context.loop, context.local_cpu_backend, context.config,
                                      plugin_name=context.plugin_name)
