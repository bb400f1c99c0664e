"""LMCache's own cache engine and fs connector on two mounts of a real local cluster.

A writer process (a fresh Python, like one vLLM pod) builds LMCache's engine
(``LMCacheEngineBuilder``, the object vLLM's ``LMCacheConnectorV1`` drives) from a
YAML file given in ``LMCACHE_CONFIG_FILE`` whose L2 is the fs connector on mount A,
and stores the KV cache of a prompt: LMCache cuts it into 256-token chunks, hashes
them into keys and its fs connector writes ``<key>.tmp``, renames it to
``<key>.data``.  Then a fresh reader process (another pod) configured only through
``LMCACHE_*`` environment variables, with the fs connector on mount B, asks the engine
for the same prompt: every key must be found (``contains``, ``lookup``), the retrieved
KV cache must be byte-identical (sha256 printed by the writer), a prompt that shares
only its first half must hit exactly that half, and a prompt never stored must miss.

The only stand-in is the GPU side: a connector that copies between a CPU tensor and
LMCache's memory objects, where vLLM's copies from paged GPU memory.  Everything from
the token hashing down to the files is LMCache's own code.

Skipped, with the reason, when torch and lmcache cannot be imported
(``scripts/install-lmcache.sh`` installs them; ``scripts/test.sh`` runs it).
Run as a script, this file is the writer or the reader:
``python tests/test_lmcache.py write|read MODEL CHUNKS OUT.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

MIB = 1 << 20
CHUNK_TOKENS = 256
# The KV cache of one token in bf16 is 2 (K and V) x layers x kv_heads x head_dim x 2 bytes.
MODELS = {
    # 28 layers, 4 KV heads, head dim 128: 56 KiB per token, 14 MiB per chunk
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", 28, 4, 128),
    # 32 layers, 8 KV heads, head dim 128: 128 KiB per token, 32 MiB per chunk
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B-Instruct", 32, 8, 128),
}
# LMCache logs its usage to a remote service unless told not to; this machine has no
# network for that, and tests send nothing off the host.
QUIET_ENV = {"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1",
             # the chunk keys hash token ids with Python's hash(): the same seed on every pod
             "PYTHONHASHSEED": "0"}
PROCESS_TIMEOUT = 300.0


def chunk_bytes(model: str) -> int:
    _, layers, heads, head_dim = MODELS[model]
    return 2 * layers * heads * head_dim * 2 * CHUNK_TOKENS


def sha256_hex(data) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- the pods

def _pod(role: str, model: str, n_chunks: int, out_path: str) -> None:
    """One LMCache engine on CPU: ``write`` stores a prompt's KV cache, ``read``
    looks it (and two other prompts) up and retrieves it.  Results go to ``out_path``."""
    import torch
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig

    from lmcache_pods import build_engine, remote_backend

    # The way LMCache's vLLM integration loads its config (lmcache_get_or_create_config).
    if "LMCACHE_CONFIG_FILE" in os.environ:
        config = LMCacheEngineConfig.from_file(os.environ["LMCACHE_CONFIG_FILE"])
        config.update_config_from_env()
    else:
        config = LMCacheEngineConfig.from_env()
        config.validate()

    model_name, layers, heads, head_dim = MODELS[model]
    # LMCache's engine with a CPU tensor where vLLM has paged GPU memory
    # (tests/lmcache_pods.py: CPUKVConnector)
    engine = build_engine(role, config, model_name, layers, heads, head_dim)
    remote = remote_backend(engine)

    n_tokens = n_chunks * CHUNK_TOKENS
    # A prompt's token ids (any ids work: the keys hash them, the model never sees them).
    prompt = torch.arange(n_tokens, dtype=torch.long) * 7 + 11
    other = torch.arange(n_tokens, dtype=torch.long) * 13 + 5   # never stored

    def keys_of(tokens):
        return [key for _, _, key in engine.token_database.process_tokens(tokens)]

    def kv_sha(kv) -> str:
        return sha256_hex(kv.contiguous().view(torch.uint8).numpy())

    result: dict = {"model": model_name, "tokens": n_tokens}
    keys = keys_of(prompt)
    result["keys"] = [k.to_string() for k in keys]
    if role == "write":
        kv = torch.randn(2, layers, n_tokens, heads * head_dim,
                         generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        t0 = time.monotonic()
        engine.store(prompt, kvcaches=kv)
        # store() hands the chunks to the L2 backend asynchronously: wait (bounded)
        # until LMCache itself finds every one of them there.
        deadline = time.monotonic() + 120
        while not all(remote.contains(k) for k in keys):
            if time.monotonic() > deadline:
                raise SystemExit("the writer's chunks did not reach the fs connector within 120 s")
            time.sleep(0.05)
        result["store_s"] = time.monotonic() - t0
        result["kv_sha256"] = kv_sha(kv)
        result["chunk_sha256"] = [kv_sha(kv[:, :, i:i + CHUNK_TOKENS, :])
                                  for i in range(0, n_tokens, CHUNK_TOKENS)]
    else:
        # Before anything is retrieved (this process's L1 is empty): every answer
        # comes from the files on the mount.
        result["contains"] = [remote.contains(k) for k in keys]
        result["miss_contains"] = remote.contains(keys_of(other)[0])
        t0 = time.monotonic()
        result["lookup_hit_tokens"] = engine.lookup(prompt)
        result["lookup_s"] = time.monotonic() - t0
        half = n_tokens // 2 // CHUNK_TOKENS * CHUNK_TOKENS
        result["prefix_tokens"] = half
        result["prefix_hit_tokens"] = engine.lookup(torch.cat([prompt[:half], other[half:]]))
        result["miss_hit_tokens"] = engine.lookup(other)
        kv = torch.zeros(2, layers, n_tokens, heads * head_dim, dtype=torch.bfloat16)
        t0 = time.monotonic()
        retrieved = engine.retrieve(prompt, kvcaches=kv)
        result["retrieve_s"] = time.monotonic() - t0
        result["retrieved_tokens"] = int(retrieved.sum())
        result["kv_sha256"] = kv_sha(kv)
    LMCacheEngineBuilder.destroy(role)
    with open(out_path, "w") as f:
        json.dump(result, f)


# --------------------------------------------------------------------------- the test

import pytest  # noqa: E402  (the pods above run without pytest's plugins)

pytestmark = pytest.mark.lmcache


@pytest.fixture(scope="module")
def lmcache_importable():
    """Skip (with the reason) unless torch and LMCache's engine import here."""
    probe = subprocess.run(
        [sys.executable, "-c", "import torch, lmcache.v1.cache_engine, "
         "lmcache.v1.storage_backend.connector.fs_connector"],
        env={**os.environ, **QUIET_ENV}, capture_output=True, text=True, timeout=PROCESS_TIMEOUT)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"lmcache is not importable ({last}); scripts/install-lmcache.sh installs it")


def pod_env(**lmcache_vars: str) -> dict[str, str]:
    """This environment without any LMCACHE_* of the caller's, plus ``lmcache_vars``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_")}
    env.update(QUIET_ENV)
    env.update(lmcache_vars)
    return env


def run_pod(role: str, model: str, n_chunks: int, env: dict[str, str], workdir) -> dict:
    out = workdir / f"{role}.json"
    log = workdir / f"{role}.log"
    with open(log, "w") as logf:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), role, model,
                               str(n_chunks), str(out)],
                              env=env, cwd=workdir, stdout=logf, stderr=subprocess.STDOUT,
                              timeout=PROCESS_TIMEOUT)
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        pytest.fail(f"the {role} process exited with {proc.returncode}; last lines of {log}:\n{tail}",
                    pytrace=False)
    return json.loads(out.read_text())


def local_cpu_gb(model: str, n_chunks: int) -> str:
    """LMCache's L1 (max_local_cpu_size, GB) large enough for the whole prompt."""
    return str(max(1, -(-chunk_bytes(model) * n_chunks * 3 // 2 // (1 << 30))))


def check_l2_round_trip(make_cluster, tmp_path, model: str, n_chunks: int) -> None:
    c = make_cluster(workers=2, mounts=2)
    a_dir = os.path.join(c.mounts[0], "l2cache")
    b_dir = os.path.join(c.mounts[1], "l2cache")
    per_chunk = chunk_bytes(model)
    l1_gb = local_cpu_gb(model, n_chunks)

    # Writer: the YAML of docs/lmcache.md, L2 on mount A.
    conf = tmp_path / "lmcache-a.yaml"
    conf.write_text(
        "chunk_size: 256\n"
        "local_cpu: true\n"
        f"max_local_cpu_size: {l1_gb}\n"
        "remote_storage_plugins: [\"fs\"]\n"
        "extra_config:\n"
        f"  remote_storage_plugin.fs.base_path: \"{a_dir}\"\n"
        "remote_serde: naive\n")
    t0 = time.monotonic()
    w = run_pod("write", model, n_chunks, pod_env(LMCACHE_CONFIG_FILE=str(conf)), tmp_path)
    write_wall = time.monotonic() - t0
    assert len(w["keys"]) == n_chunks

    # What curvine holds, seen from mount B: one <key>.data per chunk (LMCache's name
    # for a key: its string with '/' as '-SEP-'), no .tmp left behind.
    names = [k.replace("/", "-SEP-") + ".data" for k in w["keys"]]
    assert sorted(os.listdir(b_dir)) == sorted(names)
    for name in names:
        size = os.stat(os.path.join(b_dir, name)).st_size
        assert per_chunk <= size <= per_chunk + 4096, f"{name}: {size} bytes for a {per_chunk}-byte chunk"

    # Reader: another pod, configured only through environment variables (the
    # legacy remote_url form), L2 on mount B.
    t0 = time.monotonic()
    r = run_pod("read", model, n_chunks, pod_env(
        LMCACHE_CHUNK_SIZE="256", LMCACHE_LOCAL_CPU="True", LMCACHE_MAX_LOCAL_CPU_SIZE=l1_gb,
        LMCACHE_REMOTE_URL=f"fs://localhost:0{b_dir}", LMCACHE_REMOTE_SERDE="naive"), tmp_path)
    read_wall = time.monotonic() - t0
    n_tokens = n_chunks * CHUNK_TOKENS
    assert r["keys"] == w["keys"], "the reader computed other chunk keys for the same prompt"
    assert r["contains"] == [True] * n_chunks
    assert r["lookup_hit_tokens"] == n_tokens
    assert r["prefix_hit_tokens"] == r["prefix_tokens"] == n_tokens // 2
    assert r["miss_hit_tokens"] == 0
    assert r["miss_contains"] is False
    assert r["retrieved_tokens"] == n_tokens
    assert r["kv_sha256"] == w["kv_sha256"], "the retrieved KV cache differs from the stored one"
    # Each file's tail is that chunk's KV bytes (its head is LMCache's small metadata
    # record); read after the reader pod, so that its reads were the mount's first.
    for name, digest in zip(names, w["chunk_sha256"]):
        with open(os.path.join(b_dir, name), "rb") as f:
            data = f.read()
        assert sha256_hex(data[-per_chunk:]) == digest, f"{name}: bytes differ from the writer's chunk"

    mb = n_chunks * per_chunk / 1e6
    print(f"\nlmcache {model}: {n_chunks} chunks x {per_chunk / MIB:g} MiB ({mb:.0f} MB); "
          f"store to L2 {w['store_s']:.2f} s ({mb / w['store_s']:.0f} MB/s), "
          f"lookup of {n_chunks} keys on the other mount {r['lookup_s'] * 1000:.1f} ms, "
          f"retrieve {r['retrieve_s']:.2f} s ({mb / r['retrieve_s']:.0f} MB/s); "
          f"writer process {write_wall:.1f} s, reader process {read_wall:.1f} s")


def test_lmcache_kv_cache_stored_on_one_mount_is_found_and_identical_on_the_other(
        lmcache_importable, make_cluster, tmp_path):
    """8 chunks of Qwen2.5-7B's KV cache (2,048 tokens, 14 MiB each) across two mounts."""
    check_l2_round_trip(make_cluster, tmp_path, "qwen2.5-7b", 8)


@pytest.mark.slow
def test_lmcache_large_chunks_across_mounts(lmcache_importable, make_cluster, tmp_path):
    """16 chunks of Llama-3.1-8B's KV cache (4,096 tokens, 32 MiB each)."""
    check_l2_round_trip(make_cluster, tmp_path, "llama-3.1-8b", 16)


if __name__ == "__main__":
    _pod(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
