"""curvine's LMCache connector driven by LMCache's own engine, on a real local cluster.

Every LMCache process here is a fresh process (tests/lmcache_pods.py: LMCache's
engine on CPU, the GPU side a tensor copy), like one vLLM pod; it shares nothing with
another but the cluster.  Pods are forked from a process that has only imported torch
and LMCache (devtools/pod_fork.py): everything of ours and LMCache's engine is built
in the pod.  The connector is configured as docs/lmcache.md says:
``remote_storage_plugins: ["curvine"]`` with ``remote_storage_plugin.curvine.*`` keys
(the cluster's client config, the namespace, short-circuit on or off), and for the
multiprocess mode the ``plugin`` L2 adapter.  The master's RPCs are counted from its
/metrics (``curvine_rpc_server_handled_total``).

Blocks are 1 MiB (``cluster.block_size``), so every chunk file spans several blocks.
Skipped, with the reason, when torch and lmcache cannot be imported.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from cluster_util import wait_for
from curvine.connector.store import KVStore
from curvine.devtools import pod_fork
# a pod's environment: this one without LMCACHE_*, plus QUIET_ENV (one hash seed for
# every pod: chunk keys hash token ids with Python's hash())
from curvine.devtools.bench_lmcache import QUIET_ENV, pod_env
from curvine.devtools.local import LocalCluster

from test_kvstore import read_all

pytestmark = pytest.mark.lmcache

PODS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lmcache_pods.py")
POD_TIMEOUT = 180.0
TOKENS = 2048  # a prompt of 8 chunks of 256 tokens
CHUNKS = TOKENS // 256
# 5 layers, 4 KV heads, head dim 128, bf16: 2.5 MiB per chunk (3 blocks of 1 MiB)
TINY = {"name": "curvine-test/tiny-kv", "layers": 5, "heads": 4, "head_dim": 128}
# Qwen2.5-7B's shape: 14 MiB per chunk (15 blocks)
QWEN = {"name": "Qwen/Qwen2.5-7B-Instruct", "layers": 28, "heads": 4, "head_dim": 128}
NS = "/l2cache"


def chunk_bytes(model: dict) -> int:
    return 2 * model["layers"] * model["heads"] * model["head_dim"] * 2 * 256


@pytest.fixture(scope="module")
def lmcache_importable():
    probe = subprocess.run(
        [sys.executable, "-c", "import torch, lmcache.v1.cache_engine, "
         "lmcache.v1.storage_backend.connector.fs_connector, curvine.connector.lmcache_remote"],
        env={**os.environ, **QUIET_ENV}, capture_output=True, text=True, timeout=POD_TIMEOUT)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"lmcache is not importable ({last}); scripts/install-lmcache.sh installs it")


def _conf(directory, *lines: str) -> str:
    path = os.path.join(str(directory), "curvine.toml")
    with open(path, "w") as f:
        f.write('[cluster]\nblock_size = "1MiB"\n' + "".join(f"{x}\n" for x in lines))
    return path


@pytest.fixture
def lm_cluster(make_cluster, tmp_path, lmcache_importable):
    """make_cluster with 1 MiB blocks (keyword arguments as for make_cluster)."""
    def make(workers: int = 2, mounts: int = 0, **kw):
        return make_cluster(workers=workers, mounts=mounts, conf=_conf(tmp_path), **kw)
    return make


def master_metrics(c) -> str:
    return next(r for r in c.status() if r["role"] == "master")["metrics"]


def curvine_config(conf: str, namespace: str = NS, short_circuit: bool | None = None,
                   l1_gb: float = 0.5) -> dict:
    """LMCache's config for the curvine connector (docs/lmcache.md)."""
    extra = {"remote_storage_plugin.curvine.module_path": "curvine.connector.lmcache_remote",
             "remote_storage_plugin.curvine.class_name": "CurvineRemoteConnector",
             "remote_storage_plugin.curvine.conf": conf,
             "remote_storage_plugin.curvine.namespace": namespace}
    if short_circuit is not None:
        extra["remote_storage_plugin.curvine.short_circuit"] = short_circuit
    return {"chunk_size": 256, "local_cpu": True, "max_local_cpu_size": l1_gb,
            "remote_storage_plugins": ["curvine"], "remote_serde": "naive",
            "extra_config": extra}


def fs_config(directory: str, l1_gb: float = 0.5) -> dict:
    """LMCache's own fs:// connector on a directory of a mount."""
    return {"chunk_size": 256, "local_cpu": True, "max_local_cpu_size": l1_gb,
            "remote_url": f"fs://localhost:0{directory}", "remote_serde": "naive"}


class Pod:
    """One LMCache process (tests/lmcache_pods.py) running ``spec``; with ``user`` it
    runs as that uid (it drops to it after its imports, before it reads its spec's
    files or touches the cluster: this interpreter may be under root's 0700 home)."""

    def __init__(self, workdir, name: str, spec: dict, user: int | None = None,
                 env: dict | None = None):
        self.dir = os.path.join(str(workdir), name)
        os.makedirs(self.dir, exist_ok=True)
        self.name = name
        spec = {"sync_dir": self.dir, "tokens": TOKENS, "instance": name,
                "drop_to_uid": user, **spec}
        self.spec_path = os.path.join(self.dir, "spec.json")
        self.out_path = os.path.join(self.dir, "out.json")
        self.log_path = os.path.join(self.dir, "pod.log")
        with open(self.spec_path, "w") as f:
            json.dump(spec, f)
        full_env = pod_env(**(env or {}))
        if user is not None:
            for p in (self.dir, self.spec_path):
                os.chown(p, user, user)
        self._log = open(self.log_path, "wb")
        self.started = time.monotonic()
        # a fresh process, forked from one that imported torch and LMCache (~7.5 s of
        # CPU saved per pod: devtools/pod_fork.py)
        self.proc = pod_fork.popen([PODS, self.spec_path, self.out_path], self.dir, full_env,
                                   self._log, base_env=pod_env())

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def _fail(self, what: str):
        tail = "\n".join(self.log().splitlines()[-40:])
        pytest.fail(f"pod {self.name} {what}; last lines of {self.log_path}:\n{tail}",
                    pytrace=False)

    def pause(self, name: str, timeout: float = POD_TIMEOUT) -> None:
        """Wait until the pod reached its pause step ``name``."""
        ready = os.path.join(self.dir, name + ".ready")
        deadline = time.monotonic() + timeout
        while not os.path.exists(ready):
            if self.proc.poll() is not None:
                self._fail(f"exited with {self.proc.returncode} before pause {name}")
            if time.monotonic() > deadline:
                self.kill()
                self._fail(f"did not reach pause {name} within {timeout:g} s")
            time.sleep(0.05)

    def go(self, name: str) -> None:
        open(os.path.join(self.dir, name + ".go"), "w").close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def result(self, timeout: float = POD_TIMEOUT) -> dict:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self._fail(f"did not finish within {timeout:g} s")
        finally:
            self._log.close()
        if rc != 0 or not os.path.exists(self.out_path):
            self._fail(f"exited with {rc}")
        assert "Traceback" not in self.log(), f"pod {self.name} logged a traceback:\n{self.log()}"
        self.wall = time.monotonic() - self.started
        print(f"[pod {self.name}: {self.wall:.1f} s]", end=" ")
        with open(self.out_path) as f:
            return json.load(f)


def run_pod(workdir, name: str, spec: dict, **kw) -> dict:
    return Pod(workdir, name, spec, **kw).result()


def steps(out: dict, do: str) -> list[dict]:
    return [s for s in out["steps"] if s["do"] == do]


def file_names(keys: list[str]) -> list[str]:
    """LMCache's fs:// names of chunk keys (their to_string())."""
    return [k.replace("/", "-SEP-") + ".data" for k in keys]


def read_files(conf: str, names: list[str], namespace: str = NS) -> list[bytes | None]:
    """The files' bytes, read by the test itself through the core store."""
    with KVStore.open(conf, namespace) as kv:
        return read_all(kv, names)


def assert_chunk_files(data: list[bytes | None], shas: list[str], model: dict) -> None:
    """Each file is LMCache's metadata header and then exactly that chunk's KV bytes."""
    n = chunk_bytes(model)
    for i, (d, sha) in enumerate(zip(data, shas)):
        assert d is not None, f"chunk {i}: no file"
        assert n < len(d) <= n + 4096, f"chunk {i}: {len(d)} bytes for a {n}-byte chunk"
        assert hashlib.sha256(d[-n:]).hexdigest() == sha, f"chunk {i}: not the writer's bytes"


# --------------------------------------------------------------------------- 1. round trip

def test_a_prompt_stored_through_the_connector_is_found_with_one_lookup_and_identical(
        lm_cluster, tmp_path):
    c = lm_cluster()
    url = master_metrics(c)
    w = run_pod(tmp_path, "writer", {"model": QWEN, "lmcache": curvine_config(c.client_conf),
                                     "master_metrics": url,
                                     "steps": [{"do": "store", "prompt": "p", "kv_seed": 1}]})
    [store] = w["steps"]
    assert w["put_failed"] == 0 and w["put_errors"] == [] and w["pending_puts"] == 0
    assert w["connector"]["puts"] == CHUNKS
    # the prompt's chunks in one batched_put: one reservation and one publish (issue 36),
    # no per-chunk call, no Create/Complete/Rename (no temporary name)
    assert store["rpcs"]["AddBlocksForPut"] == 1 and store["rpcs"]["PutFiles"] == 1, \
        store["rpcs"]
    assert not {"Create", "CompleteFile", "Rename", "Unlink", "PutFile", "AddBlock"} & set(
        store["rpcs"]), store["rpcs"]

    r = run_pod(tmp_path, "reader", {
        "model": QWEN, "lmcache": curvine_config(c.client_conf), "master_metrics": url,
        "steps": [
            {"do": "async_contains", "prompt": "warm-up"},  # connection, namespace dir
            {"do": "async_contains", "prompt": "p"},
            {"do": "get_non_blocking", "prompt": "p"},
            {"do": "lookup", "prompt": "p"},
            {"do": "retrieve", "prompt": "p"},
            {"do": "async_contains", "prompt": "p|q"},
            {"do": "async_contains", "prompt": "q"},
            {"do": "lookup", "prompt": "p"},
            {"do": "lookup", "prompt": "p|q"},
            {"do": "lookup", "prompt": "q"},
        ]})
    warm, hit, half, miss = steps(r, "async_contains")
    assert warm["hit_chunks"] == 0
    assert hit["keys"] == store["keys"], "the reader computed other keys for the prompt"
    assert hit["hit_chunks"] == CHUNKS
    # ONE master round trip for the 8 keys: a LookupMany, no per-key Lookup or GetBlocks
    assert hit["rpcs"] == {"LookupMany": 1}, hit["rpcs"]
    # the async path's read of the hits needs no further master call
    [nb] = steps(r, "get_non_blocking")
    assert nb["got_chunks"] == CHUNKS and nb["chunk_sha256"] == store["chunk_sha256"]
    assert not {"LookupMany", "Lookup", "GetBlocks"} & set(nb["rpcs"]), nb["rpcs"]
    [got] = steps(r, "retrieve")
    assert got["retrieved_tokens"] == TOKENS
    assert got["chunk_sha256"] == store["chunk_sha256"]
    assert r["connector"]["short_circuit_blocks"] > 0
    assert half["hit_chunks"] == CHUNKS // 2 and half["rpcs"] == {"LookupMany": 1}
    assert miss["hit_chunks"] == 0 and miss["rpcs"] == {"LookupMany": 1}
    sync, full, prefix, never = steps(r, "lookup")
    assert sync["hit_tokens"] == TOKENS
    assert full["hit_tokens"] == TOKENS
    assert prefix["hit_tokens"] == TOKENS // 2
    assert never["hit_tokens"] == 0
    # the bytes the writer meant, under LMCache's names, nothing else in the namespace
    names = file_names(store["keys"])
    with KVStore.open(c.client_conf, NS) as kv:
        assert sorted(kv.list()) == sorted(names)
    assert_chunk_files(read_files(c.client_conf, names), store["chunk_sha256"], QWEN)
    print(f"\nreader's master RPCs: engine.lookup {sync['rpcs']}, retrieve {got['rpcs']}, "
          f"engine.lookup of the stored prompt (now in L1) {full['rpcs']}, of the "
          f"half-shared {prefix['rpcs']}")


def writer_spec(conf: str, url: str | None = None, prompt: str = "p", kv_seed: int = 1,
                model: dict = TINY, **cfg) -> dict:
    return {"model": model, "lmcache": curvine_config(conf, **cfg), "master_metrics": url,
            "steps": [{"do": "store", "prompt": prompt, "kv_seed": kv_seed}]}


def assert_stored_cleanly(w: dict) -> dict:
    """The writer's store step; no put failed, none is left in flight."""
    [store] = steps(w, "store")
    assert w["put_failed"] == 0 and w["put_errors"] == [] and w["pending_puts"] == 0, w
    return store


# --------------------------------------------------------------------------- 2. cross-way

def test_fs_connector_on_a_mount_and_the_curvine_connector_share_chunks_byte_identical(
        lm_cluster, tmp_path):
    c = lm_cluster(mounts=1)
    mnt_dir = os.path.join(c.mounts[0], NS.lstrip("/"))
    url = master_metrics(c)
    # LMCache's fs:// connector on the mount stores p1
    a = run_pod(tmp_path, "fs-writer", {"model": TINY, "lmcache": fs_config(mnt_dir),
                                        "steps": [{"do": "store", "prompt": "p1",
                                                   "kv_seed": 11}]})
    a_store = assert_stored_cleanly(a)
    # the connector finds p1 (one LookupMany), retrieves it, and stores p2
    b = run_pod(tmp_path, "curvine", {
        "model": TINY, "lmcache": curvine_config(c.client_conf), "master_metrics": url,
        "steps": [{"do": "async_contains", "prompt": "warm-up"},
                  {"do": "async_contains", "prompt": "p1"},
                  {"do": "retrieve", "prompt": "p1"},
                  {"do": "store", "prompt": "p2", "kv_seed": 12}]})
    _, hit = steps(b, "async_contains")
    assert hit["hit_chunks"] == CHUNKS and hit["rpcs"] == {"LookupMany": 1}, hit
    [got] = steps(b, "retrieve")
    assert got["retrieved_tokens"] == TOKENS
    assert got["chunk_sha256"] == a_store["chunk_sha256"]
    b_store = assert_stored_cleanly(b)
    # the fs:// connector on the mount finds p2 and retrieves it
    r = run_pod(tmp_path, "fs-reader", {"model": TINY, "lmcache": fs_config(mnt_dir), "steps": [
        {"do": "lookup", "prompt": "p2"}, {"do": "retrieve", "prompt": "p2"}]})
    [lk], [got] = steps(r, "lookup"), steps(r, "retrieve")
    assert lk["hit_tokens"] == TOKENS and got["retrieved_tokens"] == TOKENS
    assert got["chunk_sha256"] == b_store["chunk_sha256"]
    # one directory, the same names, the same file format: nothing else is there
    names1, names2 = file_names(a_store["keys"]), file_names(b_store["keys"])
    assert sorted(os.listdir(mnt_dir)) == sorted(names1 + names2)
    by_mount = {}
    for n in names1 + names2:
        with open(os.path.join(mnt_dir, n), "rb") as f:
            by_mount[n] = f.read()
    assert_chunk_files([by_mount[n] for n in names1], a_store["chunk_sha256"], TINY)
    assert_chunk_files([by_mount[n] for n in names2], b_store["chunk_sha256"], TINY)
    # the same header (LMCache's RemoteMetadata of the same chunk shape) in both
    # ways' files: with the same KV bytes after it, the files are byte-identical
    size = len(by_mount[names1[0]])
    header = by_mount[names1[0]][:size - chunk_bytes(TINY)]
    assert {len(d) for d in by_mount.values()} == {size}
    assert {d[:len(header)] for d in by_mount.values()} == {header}
    # and the connector's reads of every file equal the mount's
    assert read_files(c.client_conf, names1 + names2) == [by_mount[n] for n in names1 + names2]


# --------------------------------------------------------------------------- 3. remote path

def test_a_reader_without_short_circuit_reads_the_same_bytes_from_the_workers(
        lm_cluster, tmp_path):
    c = lm_cluster()
    w = run_pod(tmp_path, "writer", writer_spec(c.client_conf))
    store = assert_stored_cleanly(w)
    assert w["connector"]["bytes_written"] > 0
    r = run_pod(tmp_path, "remote-reader", {
        "model": TINY, "lmcache": curvine_config(c.client_conf, short_circuit=False),
        "steps": [{"do": "async_contains", "prompt": "p"}, {"do": "retrieve", "prompt": "p"}]})
    [hit], [got] = steps(r, "async_contains"), steps(r, "retrieve")
    assert hit["hit_chunks"] == CHUNKS
    assert got["retrieved_tokens"] == TOKENS
    assert got["chunk_sha256"] == store["chunk_sha256"]
    stats = r["connector"]
    assert stats["short_circuit_blocks"] == 0, stats
    assert stats["remote_blocks"] >= 3 * CHUNKS, stats  # 3 blocks per chunk, over gRPC


# --------------------------------------------------------------------------- partial chunks

def test_a_prompt_with_a_partial_last_chunk_round_trips_with_and_without_chunk_meta(
        lm_cluster, tmp_path):
    """save_unfull_chunk: the last chunk of a 1,000-token prompt is 232 tokens, a file
    of another size than the engine's chunk; with save_chunk_meta off the files are
    the raw KV bytes (no header), read into the engine's chunk shape and cut."""
    c = lm_cluster()
    n_tokens, per_token = 1000, chunk_bytes(TINY) // 256

    def cfg(meta: bool, **kw) -> dict:
        d = curvine_config(c.client_conf, namespace=f"/l2-meta-{meta}", **kw)
        d["save_unfull_chunk"] = True
        d["extra_config"]["save_chunk_meta"] = meta
        return d

    store = {"do": "store", "prompt": "u", "kv_seed": 5, "tokens": n_tokens}
    writers = [Pod(tmp_path, f"writer-{m}", {"model": TINY, "lmcache": cfg(m), "steps": [store]})
               for m in (True, False)]
    stored = [assert_stored_cleanly(w.result()) for w in writers]
    assert stored[0]["chunk_sha256"] == stored[1]["chunk_sha256"]
    assert len(stored[0]["keys"]) == 4
    read = [{"do": "async_contains", "prompt": "u", "tokens": n_tokens},
            {"do": "retrieve", "prompt": "u", "tokens": n_tokens}]
    # one reader by short-circuit, one over gRPC
    readers = [Pod(tmp_path, f"reader-{m}", {"model": TINY, "steps": read,
                                             "lmcache": cfg(m, short_circuit=m)})
               for m in (True, False)]
    for m, r, st in zip((True, False), readers, stored):
        out = r.result()
        [hit], [got] = steps(out, "async_contains"), steps(out, "retrieve")
        assert hit["hit_chunks"] == 4, (m, hit)
        assert got["retrieved_tokens"] == n_tokens, (m, got)
        assert got["chunk_sha256"] == st["chunk_sha256"], m
        names = file_names(st["keys"])
        with KVStore.open(c.client_conf, f"/l2-meta-{m}") as kv:
            sizes = [e.size for e in kv.lookup(names)]
        raw = [256 * per_token] * 3 + [(n_tokens - 768) * per_token]
        if m:
            assert all(28 <= s - r_ <= 4096 for s, r_ in zip(sizes, raw)), sizes
        else:
            assert sizes == raw


# --------------------------------------------------------------------------- 4. racing writers

def block_files(c) -> list[str]:
    out = []
    for i in range(c.n_workers):
        for d, _, files in os.walk(os.path.join(c.base, "worker", str(i), "data", "blocks")):
            out += [os.path.join(d, f) for f in files]
    return out


def staging_files(c) -> list[str]:
    out = []
    for i in range(c.n_workers):
        d = os.path.join(c.base, "worker", str(i), "data", "staging")
        out += os.listdir(d) if os.path.isdir(d) else []
    return out


def test_four_writers_of_the_same_prompt_store_each_chunk_once_and_leave_nothing_behind(
        lm_cluster, tmp_path):
    c = lm_cluster()
    pods = [Pod(tmp_path, f"writer{i}", writer_spec(c.client_conf, kv_seed=100 + i))
            for i in range(4)]
    outs = [p.result() for p in pods]
    stores = [assert_stored_cleanly(o) for o in outs]
    assert all(s["keys"] == stores[0]["keys"] for s in stores)
    assert len({s["chunk_sha256"][0] for s in stores}) == 4, "the writers' KV must differ"
    for p in pods:
        assert "Failed" not in p.log() and "not stored" not in p.log(), p.log()
    # each chunk was published by exactly one writer
    assert sum(o["connector"]["puts"] for o in outs) == CHUNKS
    names = file_names(stores[0]["keys"])
    with KVStore.open(c.client_conf, NS) as kv:
        assert sorted(kv.list()) == sorted(names)  # no .tmp, nothing extra
        entries = kv.lookup(names)
    data = read_files(c.client_conf, names)
    n = chunk_bytes(TINY)
    for i, d in enumerate(data):
        sha = hashlib.sha256(d[-n:]).hexdigest()
        owners = [w for w, s in enumerate(stores) if s["chunk_sha256"][i] == sha]
        assert len(owners) == 1, f"chunk {i}: its bytes are no single writer's"
    # the losers' blocks are freed: the workers end up with exactly the files' blocks
    want = sum(len(b.worker_ids) for e in entries for b in e.blocks)
    assert want == 3 * CHUNKS
    wait_for(lambda: len(block_files(c)) == want and not staging_files(c), timeout=60,
             interval=0.25, what=f"{want} block files (have {len(block_files(c))}, "
                                 f"staging {staging_files(c)})")


# --------------------------------------------------------------------------- 5. faults

def worker_index(c, address: str) -> int:
    return next(r["index"] for r in c.status()
                if r["role"] == "worker" and r["address"] == address)


def first_chunk_on_each_worker(c, names: list[str]) -> dict[int, int]:
    """Worker index -> the first chunk with a block on it (CHUNKS if none)."""
    with KVStore.open(c.client_conf, NS) as kv:
        entries = kv.lookup(names)
    first = {i: CHUNKS for i in range(c.n_workers)}
    for k, e in enumerate(entries):
        for b in e.blocks:
            for wid in b.worker_ids:
                i = worker_index(c, e.workers[wid].address)
                first[i] = min(first[i], k)
    return first


@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master is killed on purpose
def test_master_killed_between_lookups_then_a_worker_killed_before_the_get(
        lm_cluster, tmp_path):
    """replicas=1: lookups while the master is down are misses (no exception), then
    work again; a chunk whose only worker died after the lookup is a miss at the get:
    the retrieve returns the prefix before it, nothing raises into LMCache."""
    c = lm_cluster()
    w = run_pod(tmp_path, "writer", writer_spec(c.client_conf))
    store = assert_stored_cleanly(w)
    names = file_names(store["keys"])
    first = first_chunk_on_each_worker(c, names)
    # the worker whose loss leaves the longest prefix, among those that hold a chunk
    # (placement may put every chunk on one worker: then the prefix is empty)
    victim = max((i for i in first if first[i] < CHUNKS), key=first.get)
    r = Pod(tmp_path, "reader", {"model": TINY, "lmcache": curvine_config(c.client_conf),
                                 "steps": [
        {"do": "async_contains", "prompt": "p"},
        {"do": "pause", "name": "master-down"},
        {"do": "async_contains", "prompt": "p"},
        {"do": "lookup", "prompt": "p"},
        {"do": "pause", "name": "master-up"},
        {"do": "async_contains", "prompt": "p", "until": CHUNKS, "timeout": 60},
        {"do": "pause", "name": "worker-down"},
        {"do": "get_non_blocking", "prompt": "p"},
        {"do": "retrieve", "prompt": "p"},
        {"do": "lookup", "prompt": "p"}]})
    r.pause("master-down")
    c.kill("master", 0, signal.SIGKILL)
    r.go("master-down")
    r.pause("master-up")
    c.start("master", 0)
    r.go("master-up")
    r.pause("worker-down")
    c.kill("worker", victim, signal.SIGKILL)
    r.go("worker-down")
    out = r.result()
    before, during, after = steps(out, "async_contains")
    assert before["hit_chunks"] == CHUNKS
    assert during["hit_chunks"] == 0
    assert during["s"] < 30, "a lookup with the master down must be a quick miss"
    assert after["hit_chunks"] == CHUNKS
    lk_down, lk_end = steps(out, "lookup")
    assert lk_down["hit_tokens"] == 0
    k = first[victim]
    [nb] = steps(out, "get_non_blocking")  # the async path: the prefix before the loss
    assert nb["got_chunks"] == k and nb["chunk_sha256"] == store["chunk_sha256"][:k], nb
    [got] = steps(out, "retrieve")
    want = first[victim] * 256
    assert got["retrieved_tokens"] == want < TOKENS, (got["retrieved_tokens"], first)
    k = first[victim]
    assert got["chunk_sha256"][:k] == store["chunk_sha256"][:k]
    # the chunks retrieved are in L1 now; the lost one is still not found whole
    assert lk_end["hit_tokens"] >= want
    # the outages were logged (how often: test_kvstore.py's test of the outage log)
    log = r.log()
    assert "curvine master" in log and "curvine worker " in log and "failing" in log


def test_with_two_replicas_a_worker_killed_before_the_get_is_a_hit_from_the_other(
        lm_cluster, tmp_path):
    c = lm_cluster(replicas=2)
    w = run_pod(tmp_path, "writer", writer_spec(c.client_conf))
    store = assert_stored_cleanly(w)
    first = first_chunk_on_each_worker(c, file_names(store["keys"]))
    assert first == {0: 0, 1: 0}, "every block has a copy on both workers"
    r = Pod(tmp_path, "reader", {"model": TINY, "lmcache": curvine_config(c.client_conf),
                                 "steps": [
        {"do": "async_contains", "prompt": "p"},
        {"do": "pause", "name": "worker-down"},
        {"do": "get_non_blocking", "prompt": "p"},
        {"do": "retrieve", "prompt": "p"}]})
    r.pause("worker-down")
    c.kill("worker", 0, signal.SIGKILL)
    r.go("worker-down")
    out = r.result()
    [hit], [got] = steps(out, "async_contains"), steps(out, "retrieve")
    assert hit["hit_chunks"] == CHUNKS
    [nb] = steps(out, "get_non_blocking")
    assert nb["got_chunks"] == CHUNKS and nb["chunk_sha256"] == store["chunk_sha256"]
    assert got["retrieved_tokens"] == TOKENS
    assert got["chunk_sha256"] == store["chunk_sha256"]


# --------------------------------------------------------------------------- 6. another uid

NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a pod as another uid")
def test_a_pod_of_another_uid_without_the_data_dirs_gets_short_circuit_reads(
        lmcache_importable, tmp_path):
    # the pod must reach BASE/run (the socket dir a pod mounts) and its own dir:
    # tmp_path's parents are root's 0700, so this cluster lives in /tmp
    base = tempfile.mkdtemp(prefix="curvine-lm-uid-")
    c = LocalCluster(os.path.join(base, "c"), workers=2, mounts=0, conf=_conf(tmp_path))
    try:
        c.up(timeout=60)
        for d in (base, c.base):
            os.chmod(d, 0o711)  # others may pass through, not list
        data_dirs = [os.path.join(c.base, "worker", str(i), "data") for i in range(2)]
        for data_dir in data_dirs:
            st = os.stat(data_dir)
            assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
        for i in range(2):
            assert stat.S_IMODE(os.stat(c.socket_path(i)).st_mode) == 0o666
        w = run_pod(tmp_path, "writer", writer_spec(c.client_conf))
        store = assert_stored_cleanly(w)
        # the pod's own copy of the client config and token, readable by its uid only
        pod_root = os.path.join(base, "pods")
        os.makedirs(pod_root)
        os.chmod(pod_root, 0o711)
        token = os.path.join(pod_root, "token")
        shutil.copyfile(c.token_file, token)
        os.chown(token, NOBODY, NOBODY)
        os.chmod(token, 0o600)
        with open(c.client_conf) as f:
            text = f.read()
        assert c.token_file in text
        conf = os.path.join(pod_root, "client.toml")
        with open(conf, "w") as f:
            f.write(text.replace(c.token_file, token))
        os.chown(conf, NOBODY, NOBODY)
        r = run_pod(pod_root, "nobody-reader", {
            "model": TINY, "lmcache": curvine_config(conf),
            "steps": [{"do": "async_contains", "prompt": "p"},
                      {"do": "retrieve", "prompt": "p"}],
            "probe_paths": data_dirs + [c.socket_dir]}, user=NOBODY)
        assert r["uid"] == NOBODY
        assert r["probe"] == {**{d: errno.EACCES for d in data_dirs}, c.socket_dir: "ok"}
        [hit], [got] = steps(r, "async_contains"), steps(r, "retrieve")
        assert hit["hit_chunks"] == CHUNKS
        assert got["retrieved_tokens"] == TOKENS
        assert got["chunk_sha256"] == store["chunk_sha256"]
        stats = r["connector"]
        assert stats["short_circuit_blocks"] >= 3 * CHUNKS and stats["remote_blocks"] == 0, stats
    finally:
        c.down()
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------- 7. L2 adapter

def test_the_l2_adapter_stores_looks_up_and_loads_and_shares_files_with_lmcache_fs_adapter(
        lm_cluster, tmp_path):
    c = lm_cluster(mounts=1)
    mnt_dir = os.path.join(c.mounts[0], NS.lstrip("/"))
    os.makedirs(mnt_dir, exist_ok=True)
    obj = 3 * 1024 * 1024 - 5  # 3 blocks, the last one partial
    curvine = {"type": "plugin", "module_path": "curvine.connector.lmcache_l2",
               "class_name": "CurvineL2Adapter",
               "adapter_params": {"conf": c.client_conf, "namespace": NS,
                                  "short_circuit": True}}
    fs = {"type": "fs", "base_path": mnt_dir}
    out = run_pod(tmp_path, "l2", {"kind": "l2", "model": "curvine-test/tiny-kv",
                                   "cache_salt": "tenant-1", "obj_bytes": obj,
                                   "adapters": {"curvine": curvine, "fs": fs},
                                   "master_metrics": master_metrics(c), "steps": [
        {"do": "lookup", "adapter": "curvine", "keys": ["a", "b", "c"]},
        {"do": "store", "adapter": "curvine", "keys": ["a", "b", "c"]},
        {"do": "lookup", "adapter": "curvine", "keys": ["a", "x", "b", "c"]},
        {"do": "load", "adapter": "curvine", "keys": ["a", "b", "c"]},
        {"do": "lookup", "adapter": "fs", "keys": ["a", "b", "c", "x"]},
        {"do": "load", "adapter": "fs", "keys": ["a", "b", "c"]},
        {"do": "store", "adapter": "fs", "keys": ["d", "e"]},
        {"do": "lookup", "adapter": "curvine", "keys": ["d", "e", "x"]},
        {"do": "load", "adapter": "curvine", "keys": ["d", "e", "x"]},
        # a store of a key that exists does not rewrite it
        {"do": "store", "adapter": "curvine", "keys": ["a"], "fill": "other"},
        {"do": "load", "adapter": "curvine", "keys": ["a"]}]})
    assert out["types"] == {"curvine": "CurvineL2Adapter", "fs": "FSL2Adapter"}, out["types"]
    s = out["steps"]
    assert s[0]["bitmap"] == [False] * 3
    assert s[1]["ok"] is True
    assert s[2]["bitmap"] == [True, False, True, True]
    assert s[3]["bitmap"] == [True] * 3 and s[3]["sha256"] == s[3]["want_sha256"]
    assert s[4]["bitmap"] == [True, True, True, False]  # LMCache's fs adapter finds them
    assert s[5]["bitmap"] == [True] * 3 and s[5]["sha256"] == s[5]["want_sha256"]
    assert s[6]["ok"] is True
    assert s[7]["bitmap"] == [True, True, False]  # and the connector finds fs's files
    assert s[8]["bitmap"] == [True, True, False]
    assert s[8]["sha256"][:2] == s[8]["want_sha256"][:2]
    assert s[9]["ok"] is True
    assert s[10]["bitmap"] == [True] and s[10]["sha256"] == s[3]["sha256"][:1]
    # one directory, LMCache's fs adapter names (the connector's naming), raw bytes
    names = out["names"]
    assert sorted(os.listdir(mnt_dir)) == sorted(names[k] for k in "abcde")
    for k in "abcde":
        assert os.path.getsize(os.path.join(mnt_dir, names[k])) == obj
    status = out["status"]["curvine"]
    assert status["is_healthy"] is True and status["short_circuit_blocks"] > 0, status
