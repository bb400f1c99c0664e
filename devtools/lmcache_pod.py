"""One LMCache engine pod for `curvine bench --workloads lmcache`, in its own interpreter.

``python -m curvine.devtools.lmcache_pod SPEC.json OUT.json``: SPEC says the role
(``write`` or ``read``), the model shape, the prompt and LMCache's configuration (a
dict given to ``LMCacheEngineConfig.from_dict``); OUT receives the figures.  The
engine is LMCache's own (``LMCacheEngineBuilder``, what vLLM's ``LMCacheConnectorV1``
drives); the only stand-in is the GPU side, a connector copying between a CPU tensor
and LMCache's memory objects (as in tests/test_lmcache.py).

- ``write``: stores a small warm-up prompt (connections, thread pools and allocator
  set up as in a long-running pod), then the measured prompt: ``store`` runs from
  ``engine.store`` until no put is in flight and the L2 (remote) backend contains
  every chunk key.
- ``read``: a fresh pod.  Lookups first (the async path's ``batched_async_contains``,
  which checks every key, then LMCache's sync ``engine.lookup``, on the stored prompt
  and on prompts never stored), each with the master RPCs it caused when the
  spec names the master's /metrics; then the timed ``engine.retrieve`` of the
  measured prompt, checked against the writer's sha256.  A lookup and a retrieve of
  the warm-up prompt come first.

torch and lmcache are imported only when the pod runs: `curvine bench` itself never
imports them.
"""

from __future__ import annotations

import hashlib
import json
import re
import resource
import sys
import threading
import time
import urllib.request

CHUNK_TOKENS = 256
L2_WAIT_S = 120.0  # a store must reach the L2 backend within this long
METRICS_TIMEOUT_S = 5.0
# Master RPCs that clients do not make (worker registration and heartbeats; the
# Session/Calls streams count their calls under the unary methods).
NOT_CLIENT_RPCS = frozenset({"RegisterWorker", "BlockReport", "WorkerHeartbeat", "Session",
                             "Calls"})
_HANDLED = re.compile(r'^curvine_rpc_server_handled_total\{([^}]*)\}\s+([0-9.eE+-]+)')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


# --------------------------------------------------------------------------- master RPCs

def master_rpcs(url: str | None) -> dict[str, float] | None:
    """The master's completed RPCs by method (all status codes), from its /metrics."""
    if not url:
        return None
    try:
        with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_S) as r:
            text = r.read().decode()
    except OSError:
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _HANDLED.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(1)))
            method = labels.get("method", "?")
            out[method] = out.get(method, 0.0) + float(m.group(2))
    return out


def rpc_delta(before: dict | None, after: dict | None) -> dict | None:
    """Client RPCs between two scrapes: {"total": n, "by_method": {...}}."""
    if before is None or after is None:
        return None
    by = {k: int(after[k] - before.get(k, 0.0)) for k in after
          if k not in NOT_CLIENT_RPCS and after[k] - before.get(k, 0.0) > 0}
    return {"total": sum(by.values()), "by_method": by}


class Timed:
    """Wall time of a block, the pod's CPU time and minor page faults in it (where the
    time goes), and the master RPCs made meanwhile (scraped outside it)."""

    def __init__(self, metrics_url: str | None):
        self.url = metrics_url
        self.seconds = 0.0
        self.rpcs: dict | None = None
        self.cpu_s = 0.0
        self.minflt = 0

    def __enter__(self) -> "Timed":
        self._before = master_rpcs(self.url)
        self._ru = resource.getrusage(resource.RUSAGE_SELF)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._t0
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu_s = (ru.ru_utime - self._ru.ru_utime) + (ru.ru_stime - self._ru.ru_stime)
        self.minflt = ru.ru_minflt - self._ru.ru_minflt
        self.rpcs = rpc_delta(self._before, master_rpcs(self.url))

    def record(self) -> dict:
        return {"s": self.seconds, "rpcs": self.rpcs, "cpu_s": round(self.cpu_s, 4),
                "minflt": self.minflt}


# --------------------------------------------------------------------------- the pod

class _PutCounter:
    """Puts handed to a connector and not finished yet."""

    def __init__(self):
        self._lock = threading.Lock()
        self._n = 0

    @property
    def pending(self) -> int:
        with self._lock:
            return self._n

    def add(self, d: int) -> None:
        with self._lock:
            self._n += d


def _count_puts(conn) -> _PutCounter:
    """Wrap ``conn.put`` and ``conn.batched_put`` to count puts in flight: LMCache's
    remote backend tracks single puts only, and polling ``contains`` until a batch
    shows up would add lookups (master RPCs, for curvine) to the store's figures.
    The count goes up when the backend creates the coroutine (before ``store()``
    returns), down when it finishes."""
    counter = _PutCounter()
    for name in ("put", "batched_put"):
        orig = getattr(conn, name)

        def wrapped(*args, _orig=orig, **kw):
            counter.add(1)

            async def run():
                try:
                    return await _orig(*args, **kw)
                finally:
                    counter.add(-1)
            return run()
        setattr(conn, name, wrapped)
    return counter


def cpu_kv_connector(layers: int, hidden: int):
    """vLLM's GPU connector copies between paged GPU memory and LMCache's memory
    objects; this one copies between a [2, layers, tokens, hidden] CPU tensor
    (``kvcaches=``) and them, in the same layout (KV_2LTD).  Also the tests' pods."""
    import torch
    from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface

    class CPUKVConnector(GPUConnectorInterface):
        def __init__(self):
            self.layers, self.hidden = layers, hidden

        def get_shape(self, num_tokens: int) -> torch.Size:
            return torch.Size([2, self.layers, num_tokens, self.hidden])

        def from_gpu(self, memory_obj, start, end, **kwargs):
            memory_obj.tensor.copy_(kwargs["kvcaches"][:, :, start:end, :])

        def to_gpu(self, memory_obj, start, end, **kwargs):
            kwargs["kvcaches"][:, :, start:end, :].copy_(memory_obj.tensor)

        def batched_from_gpu(self, memory_objs, starts, ends, **kwargs):
            for obj, start, end in zip(memory_objs, starts, ends):
                self.from_gpu(obj, start, end, **kwargs)

        def batched_to_gpu(self, memory_objs, starts, ends, **kwargs):
            for obj, start, end in zip(memory_objs, starts, ends):
                self.to_gpu(obj, start, end, **kwargs)

    return CPUKVConnector()


def run(spec: dict) -> dict:
    import torch
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata

    role = spec["role"]
    layers, heads, head_dim = spec["layers"], spec["kv_heads"], spec["head_dim"]
    n_tokens = spec["tokens"]
    url = spec.get("master_metrics")
    config = LMCacheEngineConfig.from_dict(spec["lmcache"])
    config.validate()
    metadata = LMCacheMetadata(
        model_name=spec["model_name"], world_size=1, local_world_size=1, worker_id=0,
        local_worker_id=0, kv_dtype=torch.bfloat16,
        kv_shape=(layers, 2, CHUNK_TOKENS, heads, head_dim), chunk_size=CHUNK_TOKENS)
    engine = LMCacheEngineBuilder.get_or_create(
        role, config, metadata, cpu_kv_connector(layers, heads * head_dim),
        broadcast_fn=lambda tensor, rank: None, broadcast_object_fn=lambda obj, rank: obj)
    try:
        engine.post_init()
        remotes = [b for name, b in engine.storage_manager.storage_backends.items()
                   if name.startswith("RemoteBackend")]
        if len(remotes) != 1:
            raise RuntimeError("expected one remote (L2) backend, have "
                               f"{list(engine.storage_manager.storage_backends)}")
        remote = remotes[0]
        if remote.connection is None:
            raise RuntimeError("LMCache's remote backend has no connection (see the log)")

        def tokens(salt: int, n: int):
            # any ids work: the keys hash them, no model sees them
            return (torch.arange(n, dtype=torch.long) * (2 * salt + 7) + 11 + salt) % 150_000

        prompt = tokens(spec["seed"], n_tokens)
        # one chunk warms connections and thread pools; LMCache's L1 is pinned memory,
        # faulted in when allocated (the retrieve's minflt shows it), so a longer
        # warm-up gains nothing
        n_warm = spec.get("warmup_tokens", CHUNK_TOKENS)
        warmup = tokens(spec["seed"] + 1_000_003, n_warm)
        never = [tokens(spec["seed"] + 2_000_003 + i, n_tokens) for i in range(2)]

        def keys_of(t):
            return [key for _, _, key in engine.token_database.process_tokens(t)]

        def kv_of(n: int, seed: int):
            g = torch.Generator().manual_seed(seed)
            return torch.randn(2, layers, n, heads * head_dim, generator=g).to(torch.bfloat16)

        def sha(kv) -> str:
            return hashlib.sha256(kv.contiguous().view(torch.uint8).numpy()).hexdigest()

        keys = keys_of(prompt)
        out: dict = {"role": role, "tokens": n_tokens, "chunks": len(keys),
                     "keys": [k.to_string() for k in keys]}
        if role == "write":
            puts = _count_puts(remote.connection)

            def store(t, kv) -> float:
                want = keys_of(t)
                t0 = time.perf_counter()
                engine.store(t, kvcaches=kv)
                # store() hands the chunks to the L2 backend's event loop: done when no
                # put is in flight and the backend finds every chunk.
                deadline = time.monotonic() + L2_WAIT_S
                while puts.pending or remote.batched_contains(want) < len(want):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the chunks did not reach the L2 backend "
                                           f"within {L2_WAIT_S:g} s")
                    time.sleep(0.0005)
                return time.perf_counter() - t0

            store(warmup, kv_of(n_warm, spec["seed"] + 1))
            kv = kv_of(n_tokens, spec["seed"])
            with Timed(url) as t:
                store(prompt, kv)
            out["store"] = t.record()
            out["kv_sha256"] = sha(kv)
            out["put_failed"] = remote.put_failed_count
        else:
            import asyncio
            never_keys = [keys_of(p) for p in never]

            def async_contains(ks) -> int:
                fut = asyncio.run_coroutine_threadsafe(
                    remote.batched_async_contains("curvine-bench", ks), remote.loop)
                return fut.result(timeout=60)

            # warm-up (connections, the namespace, thread pools), on other keys
            async_contains(keys_of(warmup))
            got = engine.retrieve(warmup, kvcaches=torch.zeros(
                2, layers, n_warm, heads * head_dim, dtype=torch.bfloat16))
            out["warmup_retrieved_tokens"] = int(got.sum())
            lookups = {}
            # First touch of the stored keys in this pod: the async path's check of
            # every key (what vLLM's async loading asks), then LMCache's sync lookup
            # (stops at the first miss; the mount's caches may answer it now).
            with Timed(url) as t:
                hit = async_contains(keys)
            lookups["async_hit"] = {**t.record(), "hit_chunks": hit}
            with Timed(url) as t:
                hit = async_contains(never_keys[0])
            lookups["async_miss"] = {**t.record(), "hit_chunks": hit}
            with Timed(url) as t:
                hit = engine.lookup(prompt)
            lookups["sync_hit"] = {**t.record(), "hit_tokens": hit}
            with Timed(url) as t:
                hit = engine.lookup(never[1])
            lookups["sync_miss"] = {**t.record(), "hit_tokens": hit}
            out["lookups"] = lookups

            kv = torch.zeros(2, layers, n_tokens, heads * head_dim, dtype=torch.bfloat16)
            with Timed(url) as t:
                got = engine.retrieve(prompt, kvcaches=kv)
            out["retrieve"] = t.record()
            out["retrieved_tokens"] = int(got.sum())
            out["kv_sha256"] = sha(kv)
        return out
    finally:
        LMCacheEngineBuilder.destroy(role)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m curvine.devtools.lmcache_pod SPEC.json OUT.json",
              file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        spec = json.load(f)
    out = run(spec)
    with open(argv[1], "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
