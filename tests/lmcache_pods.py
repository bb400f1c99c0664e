"""LMCache's own engine in a fresh interpreter: the "pods" of the LMCache tests.

Each pod builds LMCache's cache engine (``LMCacheEngineBuilder``, the object vLLM's
``LMCacheConnectorV1`` drives) on CPU.  The only stand-in is the GPU side,
``CPUKVConnector``, which copies between a CPU tensor and LMCache's memory objects
where vLLM copies from paged GPU memory; everything from the token hashing down to
the L2 backend's connector is LMCache's (and, for ``curvine``, ours).

tests/test_lmcache.py uses ``build_engine`` and ``remote_backend`` for its write/read
pods; tests/test_connector.py runs this file as a script with a JSON spec:

    python tests/lmcache_pods.py SPEC.json OUT.json

- ``{"kind": "engine", "lmcache": {...LMCacheEngineConfig.from_dict...},
  "model": {"name", "layers", "heads", "head_dim"}, "tokens": N, "steps": [...],
  "master_metrics": URL, "sync_dir": DIR}``: the steps run in order, each one's
  result (with the master RPCs it caused, by method, when ``master_metrics`` is given)
  goes to ``OUT["steps"]``.  A step is ``{"do": ..., "prompt": P}`` where P names a
  prompt: ``"a"`` (tokens made from the seed string), ``"a|b"`` (the first half of
  a's tokens, then b's); ``"tokens"`` in a step overrides the spec's prompt length.  ``do`` is one of: ``store`` (with ``kv_seed``: the engine
  stores the prompt, the step ends when every put handed to the connector has
  finished and the backend contains every chunk), ``async_contains`` (the async
  lookup path's ``batched_async_contains``, optionally repeated ``until`` that many
  chunks hit, for ``timeout`` seconds), ``lookup`` (``engine.lookup``),
  ``get_non_blocking`` (the async path's ``batched_get_non_blocking``: the chunks
  read and their sha256), ``retrieve``
  (``engine.retrieve`` into zeros: tokens retrieved and sha256 of each chunk), and
  ``pause`` (writes ``sync_dir/<name>.ready``, waits for ``sync_dir/<name>.go``).
  ``drop_to_uid``: the pod becomes that uid before it reads anything else;
  ``probe_paths``: ``OUT["probe"]`` says for each whether the pod could list it.
  ``OUT["connector"]`` has the curvine connector's stats, ``OUT["put_failed"]``
  LMCache's count of failed puts and ``OUT["put_errors"]`` the puts the connector
  raised on.
- ``{"kind": "l2", ...}``: see ``run_l2`` (the multiprocess mode's L2 adapters).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import sys
import threading
import time

CHUNK_TOKENS = 256
STORE_WAIT_S = 120.0  # a store must reach the L2 backend within this long
PAUSE_WAIT_S = 120.0


# --------------------------------------------------------------------------- the engine

# (the same CPU stand-in for vLLM's GPU connector as the benchmark's pods)
from curvine.devtools.lmcache_pod import cpu_kv_connector, master_rpcs, rpc_delta  # noqa: E402


def build_engine(instance: str, config, model_name: str, layers: int, heads: int,
                 head_dim: int):
    """LMCache's engine for a bf16 model of that shape, post-initialised."""
    import torch
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.metadata import LMCacheMetadata
    metadata = LMCacheMetadata(
        model_name=model_name, world_size=1, local_world_size=1, worker_id=0,
        local_worker_id=0, kv_dtype=torch.bfloat16,
        kv_shape=(layers, 2, CHUNK_TOKENS, heads, head_dim), chunk_size=CHUNK_TOKENS)
    engine = LMCacheEngineBuilder.get_or_create(
        instance, config, metadata, cpu_kv_connector(layers, heads * head_dim),
        broadcast_fn=lambda tensor, rank: None, broadcast_object_fn=lambda obj, rank: obj)
    engine.post_init()
    return engine


def remote_backend(engine):
    """The engine's one L2 (remote) backend."""
    remotes = [b for name, b in engine.storage_manager.storage_backends.items()
               if name.startswith("RemoteBackend")]
    assert len(remotes) == 1, \
        f"expected one remote (L2) backend, have {list(engine.storage_manager.storage_backends)}"
    return remotes[0]


def sha256_hex(data) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- master RPCs

def _rpcs_since(before: dict | None, url: str | None) -> dict | None:
    """The client RPCs the master answered since the scrape ``before``, by method
    (devtools/lmcache_pod.py scrapes; None while the master is down)."""
    delta = rpc_delta(before, master_rpcs(url))
    return None if delta is None else delta["by_method"]


# --------------------------------------------------------------------------- engine pod

class _Puts:
    """Wraps a connector's put and batched_put: puts in flight, and those that raised
    (LMCache's remote backend counts failed single puts only, and logs batched ones)."""

    def __init__(self, conn):
        self._lock = threading.Lock()
        self.pending = 0
        self.errors: list[str] = []
        for name in ("put", "batched_put"):
            setattr(conn, name, self._wrap(getattr(conn, name)))

    def _wrap(self, orig):
        def wrapped(*args, **kw):
            with self._lock:
                self.pending += 1

            async def run():
                try:
                    return await orig(*args, **kw)
                except BaseException as e:
                    with self._lock:
                        self.errors.append(repr(e))
                    raise
                finally:
                    with self._lock:
                        self.pending -= 1
            return run()
        return wrapped


def run_engine(spec: dict) -> dict:
    import asyncio

    import torch
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig

    m = spec["model"]
    layers, heads, head_dim = m["layers"], m["heads"], m["head_dim"]
    hidden = heads * head_dim
    n_tokens = spec["tokens"]
    url = spec.get("master_metrics")
    config = LMCacheEngineConfig.from_dict(spec["lmcache"])
    config.validate()
    instance = spec.get("instance", "pod")
    engine = build_engine(instance, config, m["name"], layers, heads, head_dim)
    out: dict = {"steps": []}
    try:
        remote = remote_backend(engine)
        assert remote.connection is not None, "LMCache's remote backend has no connection"
        inner = remote.connection.getWrappedConnector()
        puts = _Puts(inner)

        def tokens_of(name: str, n: int):
            def one(seed: str):
                s = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:3], "big")
                return (torch.arange(n, dtype=torch.long) * (2 * s + 7) + 11 + s) % 150_000
            parts = name.split("|")
            if len(parts) == 1:
                return one(name)
            half = n // 2 // CHUNK_TOKENS * CHUNK_TOKENS
            return torch.cat([one(parts[0])[:half], one(parts[1])[half:]])

        def keys_of(tokens):
            return [k for _, _, k in engine.token_database.process_tokens(tokens)]

        def chunk_shas(kv) -> list[str]:
            return [sha256_hex(kv[:, :, i:i + CHUNK_TOKENS, :].contiguous().view(torch.uint8)
                               .numpy()) for i in range(0, kv.shape[2], CHUNK_TOKENS)]

        def async_contains(keys) -> int:
            fut = asyncio.run_coroutine_threadsafe(
                remote.batched_async_contains(f"lookup-{time.monotonic_ns()}", keys),
                remote.loop)
            return fut.result(timeout=60)

        for step in spec["steps"]:
            do = step["do"]
            res: dict = {"do": do, "prompt": step.get("prompt")}
            if do == "pause":
                res["prompt"] = step["name"]
                ready = os.path.join(spec["sync_dir"], step["name"] + ".ready")
                go = os.path.join(spec["sync_dir"], step["name"] + ".go")
                open(ready, "w").close()
                deadline = time.monotonic() + PAUSE_WAIT_S
                while not os.path.exists(go):
                    if time.monotonic() > deadline:
                        raise SystemExit(f"pause {step['name']}: no {go} within {PAUSE_WAIT_S:g} s")
                    time.sleep(0.02)
                out["steps"].append(res)
                continue
            n = step.get("tokens", n_tokens)
            tokens = tokens_of(step["prompt"], n)
            keys = keys_of(tokens)
            res["keys"] = [k.to_string() for k in keys]
            before = master_rpcs(url)
            t0 = time.monotonic()
            if do == "store":
                kv = torch.randn(2, layers, n, hidden, generator=torch.Generator()
                                 .manual_seed(step.get("kv_seed", 1))).to(torch.bfloat16)
                engine.store(tokens, kvcaches=kv)
                deadline = time.monotonic() + STORE_WAIT_S
                while puts.pending or remote.batched_contains(keys) < len(keys):
                    if time.monotonic() > deadline:
                        raise SystemExit(f"the chunks did not reach the L2 backend within "
                                         f"{STORE_WAIT_S:g} s ({puts.pending} puts pending)")
                    time.sleep(0.02)
                res["chunk_sha256"] = chunk_shas(kv)
            elif do == "async_contains":
                until = step.get("until")
                deadline = time.monotonic() + step.get("timeout", 0)
                attempts = 0
                while True:
                    attempts += 1
                    res["hit_chunks"] = async_contains(keys)
                    if until is None or res["hit_chunks"] >= until or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
                res["attempts"] = attempts
            elif do == "lookup":
                res["hit_tokens"] = engine.lookup(tokens)
            elif do == "get_non_blocking":
                # the async loading path's read of what batched_async_contains found
                fut = asyncio.run_coroutine_threadsafe(remote.batched_get_non_blocking(
                    f"get-{time.monotonic_ns()}", keys), remote.loop)
                objs = fut.result(timeout=60)
                res["got_chunks"] = len(objs)
                res["chunk_sha256"] = [sha256_hex(o.byte_array) for o in objs]
                for o in objs:
                    o.ref_count_down()
            elif do == "retrieve":
                kv = torch.zeros(2, layers, n, hidden, dtype=torch.bfloat16)
                mask = engine.retrieve(tokens, kvcaches=kv)
                res["retrieved_tokens"] = int(mask.sum())
                res["chunk_sha256"] = chunk_shas(kv)
            else:
                raise SystemExit(f"unknown step {do!r}")
            res["s"] = time.monotonic() - t0
            res["rpcs"] = _rpcs_since(before, url)
            out["steps"].append(res)
        store = getattr(inner, "store", None)
        out["connector"] = dict(store.stats) if store is not None else None
        out["put_failed"] = remote.put_failed_count
        out["put_errors"] = puts.errors
        out["pending_puts"] = puts.pending
    finally:
        LMCacheEngineBuilder.destroy(instance)
    return out


# --------------------------------------------------------------------------- L2 pod

EVENT_WAIT_S = 60.0


def run_l2(spec: dict) -> dict:
    """The multiprocess mode's L2 adapters through ``L2AdapterInterface`` directly:
    ``spec["adapters"]`` maps a name to an adapter's JSON config (as LMCache's
    ``--l2-adapter`` takes it); ``spec["steps"]`` are ``{"do": "store"|"lookup"|"load",
    "adapter": name, "keys": [key id, ...]}``.  A key id names an ObjectKey of
    ``spec["model"]`` (chunk hash = sha256 of the id) and its object: ``obj_bytes``
    bytes derived from the id (``"fill": id`` to store another object's bytes under
    it).  Results: the store's L2StoreResult, the lookup bitmap, the load bitmap and
    the sha256 of every loaded object."""
    import argparse

    import torch
    from lmcache.v1.distributed.api import ObjectKey
    from lmcache.v1.distributed.l2_adapters import create_l2_adapter
    from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
    from lmcache.v1.platform import consume_fd

    names = list(spec["adapters"])
    parsed = parse_args_to_l2_adapters_config(argparse.Namespace(
        l2_adapter=[json.dumps(spec["adapters"][n]) for n in names]))
    adapters = {n: create_l2_adapter(c) for n, c in zip(names, parsed.adapters)}
    size = spec["obj_bytes"]
    out: dict = {"steps": [], "types": {n: type(a).__name__ for n, a in adapters.items()}}

    def key(kid: str) -> ObjectKey:
        return ObjectKey(chunk_hash=hashlib.sha256(kid.encode()).digest()[:16],
                         model_name=spec["model"], kv_rank=spec.get("kv_rank", 0),
                         cache_salt=spec.get("cache_salt", ""))

    def memory_obj(data: torch.Tensor) -> TensorMemoryObj:
        meta = MemoryObjMetadata(shape=torch.Size([data.numel()]), dtype=data.dtype,
                                 address=data.data_ptr(), phy_size=data.numel(),
                                 fmt=MemoryFormat.KV_2LTD, ref_count=1)
        return TensorMemoryObj(data, meta, parent_allocator=None)

    def content(kid: str) -> torch.Tensor:
        g = torch.Generator().manual_seed(int.from_bytes(
            hashlib.sha256(kid.encode()).digest()[:4], "big"))
        return torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g)

    def wait(efd: int) -> None:
        p = select.poll()
        p.register(efd, select.POLLIN)
        if not p.poll(EVENT_WAIT_S * 1000):
            raise SystemExit(f"no event on fd {efd} within {EVENT_WAIT_S:g} s")
        try:
            consume_fd(efd)
        except BlockingIOError:
            pass

    def result(query, task_id):
        # one event may cover several tasks: poll the result (bounded)
        deadline = time.monotonic() + EVENT_WAIT_S
        while True:
            r = query(task_id)
            if r is not None:
                return r
            if time.monotonic() > deadline:
                raise SystemExit(f"task {task_id}: no result within {EVENT_WAIT_S:g} s")
            time.sleep(0.01)

    try:
        for step in spec["steps"]:
            a = adapters[step["adapter"]]
            kids = step["keys"]
            keys = [key(k) for k in kids]
            res: dict = {"do": step["do"], "adapter": step["adapter"], "keys": kids}
            if step["do"] == "store":
                objs = [memory_obj(content(step.get("fill", k))) for k in kids]
                task = a.submit_store_task(keys, objs)
                wait(a.get_store_event_fd())
                done = {}
                deadline = time.monotonic() + EVENT_WAIT_S
                while task not in done:
                    done.update(a.pop_completed_store_tasks())
                    if task not in done:
                        if time.monotonic() > deadline:
                            raise SystemExit("store task never completed")
                        time.sleep(0.01)
                r = done[task]
                res["ok"] = bool(r.is_successful())
            elif step["do"] == "lookup":
                task = a.submit_lookup_and_lock_task(keys, {})
                wait(a.get_lookup_and_lock_event_fd())
                bm = result(a.query_lookup_and_lock_result, task)
                res["bitmap"] = [bool(bm.test(i)) for i in range(len(keys))]
                a.submit_unlock(keys)
            elif step["do"] == "load":
                bufs = [torch.zeros(size, dtype=torch.uint8) for _ in kids]
                task = a.submit_load_task(keys, [memory_obj(b) for b in bufs])
                wait(a.get_load_event_fd())
                bm = result(a.query_load_result, task)
                res["bitmap"] = [bool(bm.test(i)) for i in range(len(keys))]
                res["sha256"] = [sha256_hex(b.numpy()) for b in bufs]
                res["want_sha256"] = [sha256_hex(content(k).numpy()) for k in kids]
            out["steps"].append(res)
        out["names"] = {k: _l2_name(key(k)) for s in spec["steps"] for k in s["keys"]}
        out["status"] = {n: _jsonable(a.report_status()) for n, a in adapters.items()}
    finally:
        for a in adapters.values():
            a.close()
    return out


def _l2_name(key) -> str:
    from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import _object_key_to_filename
    return _object_key_to_filename(key)


def _jsonable(d: dict) -> dict:
    return {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
            for k, v in d.items()}


# What a pod imports, loaded before it drops to another uid (``drop_to_uid``): this
# machine's interpreter may live where that uid cannot read (root's 0700 home).
PRELOAD = ("asyncio", "concurrent.futures", "argparse", "torch", "grpc",
           "lmcache.v1.cache_engine", "lmcache.v1.config", "lmcache.v1.metadata",
           "lmcache.v1.gpu_connector.gpu_connectors", "lmcache.v1.storage_backend",
           "lmcache.v1.storage_backend.connector", "lmcache.v1.storage_backend.remote_backend",
           "lmcache.v1.storage_backend.connector.fs_connector",
           "curvine.connector.lmcache_remote", "curvine.connector.store")


def drop_to(uid: int) -> None:
    """Import what the pod needs, then become ``uid`` (no groups) for good: from here
    on the pod can open only what that uid may (not the workers' data dirs)."""
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    os.environ["HOME"] = os.getcwd()


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    if spec.get("drop_to_uid") is not None:
        drop_to(spec["drop_to_uid"])
    probe = {}
    for path in spec.get("probe_paths", []):  # what this pod may open (errno if not)
        try:
            os.listdir(path)
            probe[path] = "ok"
        except OSError as e:
            probe[path] = e.errno
    out = run_l2(spec) if spec.get("kind") == "l2" else run_engine(spec)
    out["uid"] = os.getuid()
    out["probe"] = probe
    with open(out_path + ".part", "w") as f:
        json.dump(out, f)
    os.replace(out_path + ".part", out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
