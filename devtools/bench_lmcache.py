"""`curvine bench --workloads lmcache`: LMCache's own engine storing and retrieving the
seed prompt through every way to reach an L2 cache on this machine, in the same run.

The seed prompt: ``--lmcache-tokens`` tokens (1,925: 7 full 256-token chunks and a
partial one, stored because ``save_unfull_chunk`` is on) of Qwen2-7B's KV cache (28
layers, 4 KV heads, head dim 128, bf16: 14 MiB per full chunk, about 110 MB with
LMCache's 28-byte metadata header per file).  The paths, each its own L2:

1. ``plain``: ``fs://`` on a plain local directory (the baseline of every ratio);
2. ``curvine_fs``: ``fs://`` on curvine, the writer on mount A, the reader on mount B;
3. ``connector_sc``: the curvine connector (``remote_storage_plugins: ["curvine"]``),
   short-circuit reads of the local blocks;
4. ``connector_remote``: the connector with ``short_circuit: false`` for writer and
   reader (all bytes over the workers' gRPC streams, as on a node without a worker);
5. ``moosefs``: ``fs://`` on MooseFS 3.0, writer on its mount 1, reader on mount 2
   (``--moosefs-mounts``, or ``--moosefs-up SCRIPT`` to start it; else skipped).

Per run and path, twice (cold, then warm): a writer pod (a fresh process,
devtools/lmcache_pod.py, forked from one that imported torch and LMCache:
devtools/pod_fork.py) stores the prompt: *store* is ``engine.store`` until the
remote backend contains every chunk.  Then ``sync`` and, for *cold*, the page cache
is dropped (PageCache); a fresh reader pod looks up the prompt and retrieves it:
*lookup hit/miss* is LMCache's ``batched_async_contains`` over the 8 keys of the
stored prompt and of one never stored (every key is checked), *engine.lookup* its
sync lookup, *retrieve* ``engine.retrieve``.  *warm*: the files (blocks) are in the
page cache, but the reader never opened them (every run and mode has its own
directory).  Both pods first store/retrieve a one-chunk warm-up prompt, as a
long-running pod would have its connections and thread pools up.

Master RPCs per prompt: the master's ``curvine_rpc_server_handled_total`` (all
methods but the workers' registration and heartbeats), scraped by the pod just
before and after each lookup, the retrieve and the store.

Skipped, with the reason, when torch and lmcache are not importable; the connector
paths are "not available" while ``curvine.connector.lmcache_remote`` does not import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
from typing import Callable

from .bench_common import BenchError, CpuMeter, Metric, PageCache
from .demo import format_table
from . import pod_fork
from .local import ClusterError, LocalCluster, is_mounted

MODEL = "Qwen/Qwen2-7B-Instruct"
LAYERS, KV_HEADS, HEAD_DIM = 28, 4, 128
POD_TIMEOUT_S = 300.0
PROBE_TIMEOUT_S = 120.0
MOOSEFS_TIMEOUT_S = 300.0  # moosefs-up.sh may apt-get install MooseFS first
# LMCache reports usage to a remote service unless told not to; the chunk keys hash
# token ids with Python's hash(): the same seed in every pod.
QUIET_ENV = {"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "PYTHONHASHSEED": "0"}
CONNECTOR_MODULE = "curvine.connector.lmcache_remote"
CONNECTOR_CLASS = "CurvineRemoteConnector"

PATHS = {
    "plain": "fs:// plain dir",
    "curvine_fs": "fs:// curvine A->B",
    "connector_sc": "connector short-circuit",
    "connector_remote": "connector remote",
    "moosefs": "fs:// MooseFS 1->2",
}
MEASURES = {  # id -> label (all in ms)
    "store": "store ms",
    "retrieve_cold": "retrieve cold ms",
    "retrieve_warm": "retrieve warm ms",
    "lookup_hit": "lookup hit ms (8 keys)",
    "lookup_miss": "lookup miss ms (8 keys)",
}
RPC_MEASURES = {  # id -> (what the pod recorded, label)
    "rpcs_lookup_hit": ("lookup hit", "master RPCs, lookup hit"),
    "rpcs_lookup_miss": ("lookup miss", "master RPCs, lookup miss"),
    "rpcs_retrieve": ("retrieve", "master RPCs, retrieve"),
    "rpcs_store": ("store", "master RPCs, store"),
}


def _probe(code: str) -> str | None:
    """None if ``code`` runs in a fresh interpreter of this Python, else the reason."""
    try:
        r = subprocess.run([sys.executable, "-c", code], env=pod_env(), capture_output=True,
                           text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"`{code}` did not finish within {PROBE_TIMEOUT_S:g} s"
    if r.returncode == 0:
        return None
    return (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]


def lmcache_missing() -> str | None:
    """Why LMCache's engine cannot run here (None: it can)."""
    why = _probe("import torch, lmcache.v1.cache_engine, "
                 "lmcache.v1.storage_backend.connector.fs_connector")
    return None if why is None else (f"torch/lmcache not importable ({why}); "
                                     "scripts/install-lmcache.sh installs them")


def connector_missing() -> str | None:
    why = _probe(f"import {CONNECTOR_MODULE} as m; m.{CONNECTOR_CLASS}")
    return None if why is None else f"{CONNECTOR_MODULE} not importable ({why})"


def pod_env(**extra: str) -> dict[str, str]:
    """This environment without the caller's LMCACHE_*, plus QUIET_ENV and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_")}
    env.update(QUIET_ENV)
    env.update(extra)
    return env


def chunk_sizes(tokens: int) -> list[int]:
    """KV bytes of each chunk file of a prompt (without LMCache's metadata header)."""
    per_token = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2
    full, rest = divmod(tokens, 256)
    return [256 * per_token] * full + ([rest * per_token] if rest else [])


# --------------------------------------------------------------------------- MooseFS

@dataclasses.dataclass
class MooseFs:
    """MooseFS mounts for path 5: given, found at moosefs-up.sh's paths, or started
    with its script (and then stopped with the moosefs-down.sh beside it)."""

    mounts: tuple[str, str] | None = None
    up_script: str | None = None
    reason: str = ""  # why there are no mounts
    started: bool = False
    DEFAULT_MOUNTS = ("/tmp/peers/mnt_mfs_a", "/tmp/peers/mnt_mfs_b")

    def setup(self, say: Callable[[str], None]) -> None:
        if self.mounts:
            bad = [m for m in self.mounts if not os.path.isdir(m)]
            if bad:
                self.reason, self.mounts = f"{bad[0]} is not a directory", None
            return
        if all(is_mounted(m) for m in self.DEFAULT_MOUNTS):
            self.mounts = self.DEFAULT_MOUNTS
            return
        if not self.up_script:
            self.reason = ("not set up: give --moosefs-mounts A B, or --moosefs-up SCRIPT "
                           "(e.g. bench/moosefs-up.sh)")
            return
        say(f"  starting MooseFS with {self.up_script} ...")
        try:
            r = subprocess.run(["bash", self.up_script], capture_output=True, text=True,
                               timeout=MOOSEFS_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.reason = f"{self.up_script} failed: {e}"
            self.teardown()
            return
        self.started = True
        if r.returncode != 0 or not all(is_mounted(m) for m in self.DEFAULT_MOUNTS):
            tail = (r.stderr.strip().splitlines() or r.stdout.strip().splitlines()
                    or [f"exit status {r.returncode}"])[-1]
            self.reason = f"{self.up_script} failed: {tail}"
            self.teardown()
            return
        self.mounts = self.DEFAULT_MOUNTS

    def teardown(self) -> None:
        if not self.started or not self.up_script:
            return
        down = os.path.join(os.path.dirname(self.up_script), "moosefs-down.sh")
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["bash", down], capture_output=True, timeout=MOOSEFS_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
        self.started = False


# --------------------------------------------------------------------------- the workload

@dataclasses.dataclass
class PathSetup:
    """Where one path's writer and reader keep their L2 for one run and mode."""

    name: str
    write_dir: str | None = None  # fs:// paths: the directory the writer's URL names
    read_dir: str | None = None  # ... and the reader's (the same files)
    cleanup_dir: str | None = None  # what to remove afterwards
    namespace: str | None = None  # connector paths
    short_circuit: bool = True
    plain_files: bool = False  # fadvise these files before a cold read (plain side)


class LmcacheBench:
    """Runs path 1-5 ``runs`` times each, cold and warm, interleaved per run."""

    def __init__(self, runs: int, tokens: int, plain_root: str, mounts: tuple[str, str],
                 cache: PageCache, procs: dict[str, int], workdir: str,
                 say: Callable[[str], None], moosefs: MooseFs | None = None,
                 cluster_base: str | None = None):
        self.runs = runs
        self.tokens = tokens
        self.cache = cache
        self.procs = procs
        self.say = say
        self.moosefs = moosefs or MooseFs()
        self.tag = f"lmbench-{os.getpid()}-{secrets.token_hex(3)}"
        self.plain_top = os.path.join(plain_root, self.tag)
        self.mount_a, self.mount_b = mounts
        self.pod_dir = os.path.join(workdir, self.tag + "-pods")
        self.client_conf, self.master_metrics = self._cluster_of(cluster_base, mounts)
        self.metrics: list[Metric] = []
        self.raw: dict = {"paths": {}, "pod_logs": self.pod_dir}
        self.available: dict[str, str | None] = {}  # path -> None or why not
        self.figures: dict[str, dict[str, list[float]]] = {p: {} for p in PATHS}
        self.cpu: dict[str, dict[str, float]] = {p: {} for p in PATHS}
        self._seq = 0

    @staticmethod
    def _cluster_of(base: str | None, mounts) -> tuple[str | None, str | None]:
        """Client config and the master's /metrics URL of the mounts' `curvine local`
        cluster (None, None for mounts of another cluster)."""
        if base is None:
            guess = os.path.dirname(os.path.dirname(os.path.realpath(mounts[0])))
            base = guess if os.path.isfile(os.path.join(guess, "cluster.json")) else None
        if base is None:
            return None, None
        with contextlib.suppress(ClusterError, OSError):
            rows = LocalCluster.attach(base).status()
            url = next((r["metrics"] for r in rows if r["role"] == "master"), None)
            return LocalCluster.client_conf_of(base), url
        return None, None

    # ------------------------------------------------------------- setup
    def setup(self) -> str | None:
        """Probe what can run; None, or why the whole workload is skipped."""
        why = lmcache_missing()
        if why:
            return why
        self.available["plain"] = None
        self.available["curvine_fs"] = None
        conn = connector_missing()
        self.available["connector_sc"] = self.available["connector_remote"] = (
            None if conn is None else f"not available: {conn}")
        self.moosefs.setup(self.say)
        self.available["moosefs"] = (None if self.moosefs.mounts
                                     else f"skipped: MooseFS {self.moosefs.reason}")
        os.makedirs(self.pod_dir)
        os.makedirs(self.plain_top)
        os.makedirs(os.path.join(self.mount_a, self.tag))
        if self.moosefs.mounts:
            try:
                os.makedirs(os.path.join(self.moosefs.mounts[0], self.tag))
            except OSError as e:
                self.available["moosefs"] = f"skipped: MooseFS mount 1: {e}"
        for p, why in self.available.items():
            if why:
                self.say(f"  {PATHS[p]}: {why}")
        return None

    def cleanup(self) -> None:
        for d in (self.plain_top, os.path.join(self.mount_a, self.tag), self.pod_dir):
            shutil.rmtree(d, ignore_errors=True)
        if self.moosefs.mounts:
            shutil.rmtree(os.path.join(self.moosefs.mounts[0], self.tag), ignore_errors=True)
        self.moosefs.teardown()

    # ------------------------------------------------------------- one path
    def _where(self, path: str, run: int, mode: str) -> PathSetup:
        sub = f"{path}-r{run}-{mode}"
        if path == "plain":
            d = os.path.join(self.plain_top, sub)
            return PathSetup(path, d, d, d, plain_files=True)
        if path in ("curvine_fs", "connector_sc", "connector_remote"):
            a = os.path.join(self.mount_a, self.tag, sub)
            if path == "curvine_fs":
                return PathSetup(path, a, os.path.join(self.mount_b, self.tag, sub), a)
            return PathSetup(path, cleanup_dir=a, namespace=f"/{self.tag}/{sub}",
                             short_circuit=path == "connector_sc")
        m1, m2 = self.moosefs.mounts
        d1 = os.path.join(m1, self.tag, sub)
        return PathSetup(path, d1, os.path.join(m2, self.tag, sub), d1)

    def _lmcache_config(self, where: PathSetup, role: str) -> dict:
        l1_gb = max(1, -(-sum(chunk_sizes(self.tokens)) * 3 // (1 << 30)))
        conf = {"chunk_size": 256, "local_cpu": True, "max_local_cpu_size": l1_gb,
                "save_unfull_chunk": True, "remote_serde": "naive"}
        if where.namespace is None:
            d = where.write_dir if role == "write" else where.read_dir
            conf["remote_url"] = f"fs://localhost:0{d}"
            return conf
        extra = {"remote_storage_plugin.curvine.module_path": CONNECTOR_MODULE,
                 "remote_storage_plugin.curvine.class_name": CONNECTOR_CLASS,
                 "remote_storage_plugin.curvine.namespace": where.namespace,
                 "remote_storage_plugin.curvine.short_circuit": where.short_circuit}
        if self.client_conf:
            extra["remote_storage_plugin.curvine.conf"] = self.client_conf
        conf["remote_storage_plugins"] = ["curvine"]
        conf["extra_config"] = extra
        return conf

    def _pod(self, role: str, where: PathSetup, seed: int) -> dict:
        self._seq += 1
        stem = os.path.join(self.pod_dir, f"{self._seq:03d}-{where.name}-{role}")
        spec = {"role": role, "model_name": MODEL, "layers": LAYERS, "kv_heads": KV_HEADS,
                "head_dim": HEAD_DIM, "tokens": self.tokens, "seed": seed,
                "master_metrics": self.master_metrics if where.name != "plain"
                and where.name != "moosefs" else None,
                "lmcache": self._lmcache_config(where, role)}
        with open(stem + ".spec.json", "w") as f:
            json.dump(spec, f, indent=1)
        env = pod_env(**({"CURVINE_CONF": self.client_conf} if self.client_conf else {}))
        out = stem + ".out.json"
        with open(stem + ".log", "w") as log:
            # forked from a process that imported torch and LMCache (devtools/pod_fork.py)
            proc = pod_fork.popen(["-m", "curvine.devtools.lmcache_pod", stem + ".spec.json",
                                   out], self.pod_dir, env, log, base_env=pod_env())
            try:
                code = proc.wait(POD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = f"no exit within {POD_TIMEOUT_S:g} s"
        if code != 0 or not os.path.exists(out):
            with open(stem + ".log", errors="replace") as f:
                lines = [x.rstrip() for x in f if x.strip()]
            tail = [x for x in lines if "Error" in x or "error" in x][-3:] or lines[-3:]
            raise BenchError(f"{where.name} {role} pod failed ({code}); {stem}.log: "
                             + " | ".join(tail))
        with open(out) as f:
            res = json.load(f)
        res["log"] = stem + ".log"
        return res

    @staticmethod
    def _first_complaint(log: str) -> str | None:
        """The first line of a pod's log where curvine or LMCache says something failed."""
        with contextlib.suppress(OSError), open(log, errors="replace") as f:
            for line in f:
                if line.startswith("curvine:") or " ERROR" in line or "failed" in line:
                    return line.strip()[:300]
        return None

    def _check(self, where: PathSetup, w: dict, r: dict) -> None:
        n_chunks = len(w["keys"])
        problems = []
        if w.get("put_failed"):
            problems.append(f"{w['put_failed']} puts failed in the writer")
        if r["keys"] != w["keys"]:
            problems.append("the reader computed other chunk keys")
        lk = r["lookups"]
        if lk["async_hit"]["hit_chunks"] != n_chunks:
            problems.append(f"lookup found {lk['async_hit']['hit_chunks']} of {n_chunks} chunks")
        if lk["sync_hit"]["hit_tokens"] != self.tokens:
            problems.append(f"engine.lookup hit {lk['sync_hit']['hit_tokens']} tokens")
        if lk["async_miss"]["hit_chunks"] or lk["sync_miss"]["hit_tokens"]:
            problems.append("a never-stored prompt was a hit")
        if r.get("warmup_retrieved_tokens") != 256:
            problems.append(f"the warm-up retrieve got {r.get('warmup_retrieved_tokens')} "
                            "of 256 tokens")
        if r["retrieved_tokens"] != self.tokens:
            problems.append(f"retrieved {r['retrieved_tokens']} of {self.tokens} tokens")
        elif r["kv_sha256"] != w["kv_sha256"]:
            problems.append("the retrieved KV cache differs from the stored one")
        if problems:
            said = self._first_complaint(r["log"]) or self._first_complaint(w["log"])
            raise BenchError(f"{where.name}: " + "; ".join(problems)
                             + (f" (pod log: {said})" if said else ""))

    def _one(self, path: str, run: int, mode: str, add: Callable[[str, float], None],
             by_method: dict) -> str:
        where = self._where(path, run, mode)
        seed = 1 + run
        try:
            w = self._pod("write", where, seed)
            add("store", w["store"]["s"] * 1000)
            os.sync()  # no writeback of the writer's pages during the read
            if mode == "cold":
                files = []
                if where.plain_files:
                    files = [os.path.join(where.read_dir, n) for n in os.listdir(where.read_dir)]
                self.cache.drop(files)
            r = self._pod("read", where, seed)
            self._check(where, w, r)
        finally:
            if where.cleanup_dir:
                shutil.rmtree(where.cleanup_dir, ignore_errors=True)
        add(f"retrieve_{mode}", r["retrieve"]["s"] * 1000)
        # where the time goes: the pod's own CPU time in it (all its threads)
        add(f"pod_cpu_retrieve_{mode}", r["retrieve"]["cpu_s"] * 1000)
        add("pod_cpu_store", w["store"]["cpu_s"] * 1000)
        lk = r["lookups"]
        if mode == "cold":  # lookups are metadata: one sample per run (the cold one)
            add("lookup_hit", lk["async_hit"]["s"] * 1000)
            add("lookup_miss", lk["async_miss"]["s"] * 1000)
            add("engine_lookup_hit", lk["sync_hit"]["s"] * 1000)
            add("engine_lookup_miss", lk["sync_miss"]["s"] * 1000)
            for id, rec in (("rpcs_lookup_hit", lk["async_hit"]),
                            ("rpcs_lookup_miss", lk["async_miss"]),
                            ("rpcs_engine_lookup_hit", lk["sync_hit"]),
                            ("rpcs_engine_lookup_miss", lk["sync_miss"]),
                            ("rpcs_retrieve", r["retrieve"]), ("rpcs_store", w["store"])):
                if rec.get("rpcs") is not None:
                    add(id, rec["rpcs"]["total"])
                    by_method.setdefault(id, []).append(rec["rpcs"]["by_method"])
        return f"{mode} store {w['store']['s'] * 1000:.0f} ms, retrieve " \
               f"{r['retrieve']['s'] * 1000:.0f} ms"

    def run(self) -> None:
        sizes = chunk_sizes(self.tokens)
        self.raw.update({"tokens": self.tokens, "chunk_bytes": sizes,
                         "total_kv_bytes": sum(sizes), "model": MODEL,
                         "client_conf": self.client_conf, "master_metrics": self.master_metrics})
        self.say(f"  {self.tokens} tokens of {MODEL}'s KV: {len(sizes)} chunk files, "
                 f"{sum(sizes) / 1e6:.0f} MB; writer and reader are fresh processes")
        if not self.master_metrics:
            self.say("  note: no master /metrics known for these mounts: master RPCs are not "
                     "counted")
        cpu = CpuMeter(self.procs)
        for run in range(self.runs):
            for path in PATHS:
                if self.available.get(path):
                    continue
                figures, got, by_method = [], {}, {}

                def add(id: str, value: float) -> None:
                    got.setdefault(id, []).append(value)

                cpu.start()
                try:
                    for mode in ("cold", "warm"):
                        figures.append(self._one(path, run, mode, add, by_method))
                except BenchError as e:
                    if path == "plain":
                        raise
                    self.available[path] = f"failed: {e}"
                    self.say(f"  {PATHS[path]}: FAILED, left out from here on: {e}")
                    continue
                finally:
                    for k, v in cpu.stop().items():
                        self.cpu[path][k] = round(self.cpu[path].get(k, 0.0) + v, 2)
                # a run counts only when all of it worked
                for id, xs in got.items():
                    self.figures[path].setdefault(id, []).extend(xs)
                rpcs = self.raw["paths"].setdefault(path, {}).setdefault("rpcs_by_method", {})
                for id, xs in by_method.items():
                    rpcs.setdefault(id, []).extend(xs)
                self.say(f"  run {run + 1}/{self.runs} {PATHS[path]}: " + "; ".join(figures))
        self._build_metrics()

    # ------------------------------------------------------------- results
    def _median(self, path: str, id: str) -> float | None:
        xs = self.figures[path].get(id)
        return statistics.median(xs) if xs else None

    def _build_metrics(self) -> None:
        base = self.figures["plain"]
        for path in PATHS:
            if path == "plain":
                continue
            for id, label in MEASURES.items():
                m = Metric("lmcache", f"{path}_{id}", f"{PATHS[path]}: {label}", "ms", "lower",
                           curvine=list(self.figures[path].get(id, [])),
                           plain=list(base.get(id, [])))
                self.metrics.append(m)
            for id, (_, label) in RPC_MEASURES.items():
                if path in ("curvine_fs", "connector_sc", "connector_remote"):
                    self.metrics.append(Metric(
                        "lmcache", f"{path}_{id}", f"{PATHS[path]}: {label}", "count", "lower",
                        curvine=list(self.figures[path].get(id, []))))
        # the connector's remote read against MooseFS's remote read of the same files
        for mode in ("cold", "warm"):
            self.metrics.append(Metric(
                "lmcache", f"connector_remote_vs_moosefs_retrieve_{mode}",
                f"retrieve {mode} ms: connector remote / MooseFS (plain column)", "ms", "lower",
                curvine=list(self.figures["connector_remote"].get(f"retrieve_{mode}", [])),
                plain=list(self.figures["moosefs"].get(f"retrieve_{mode}", []))))
        self.raw["figures"] = self.figures
        self.raw["cpu_seconds"] = self.cpu
        self.raw["available"] = self.available

    def report(self) -> str:
        """The per-path table (medians, ratio to path 1) and the targets as pass/miss."""
        rows = [("path", "store ms", "retrieve cold", "retrieve warm", "lookup hit",
                 "lookup miss", "engine.lookup hit", "RPCs lookup hit/miss", "RPCs retrieve",
                 "RPCs store", "pod CPU store/cold/warm")]

        def cell(path: str, id: str) -> str:
            v = self._median(path, id)
            if v is None:
                return "-"
            b = self._median("plain", id)
            text = f"{v:.1f}" if v < 100 else f"{v:.0f}"
            return text if path == "plain" or not b else f"{text} ({v / b:.2f}x)"

        def count(path: str, id: str) -> str:
            v = self._median(path, id)
            return "-" if v is None else f"{v:g}"

        def whole(path: str, id: str) -> str:
            v = self._median(path, id)
            return "-" if v is None else f"{v:.0f}"

        notes = []
        for path, title in PATHS.items():
            why = self.available.get(path)
            if why and not self.figures[path]:
                rows.append((title,) + ("n/a",) * 3 + ("",) * 7)
                notes.append(f"  {title}: {why}")
                continue
            if why:
                notes.append(f"  {title}: {why} (figures of the runs before)")
            rows.append((title, cell(path, "store"), cell(path, "retrieve_cold"),
                         cell(path, "retrieve_warm"), cell(path, "lookup_hit"),
                         cell(path, "lookup_miss"), cell(path, "engine_lookup_hit"),
                         f"{count(path, 'rpcs_lookup_hit')}/{count(path, 'rpcs_lookup_miss')}",
                         count(path, "rpcs_retrieve"), count(path, "rpcs_store"),
                         "/".join(whole(path, f"pod_cpu_{x}") for x in
                                  ("store", "retrieve_cold", "retrieve_warm"))))
        lines = [format_table(rows, left=2), *notes, "",
                 "  ms are medians; (x) = time / fs:// plain dir's in the same run; lookup = "
                 "batched_async_contains of the prompt's keys (all checked), engine.lookup = "
                 "the sync lookup after it; RPCs = the master's per prompt; pod CPU = ms of "
                 "CPU the writer/reader process used in store/retrieve", "  targets:"]
        for m in self.metrics:
            t = m.target
            if t is None:
                continue
            x = m.ratio if t.on == "ratio" else m.curvine_median
            shown = "-" if x is None else (f"{x:.2f}x" if t.on == "ratio" else f"{x:.4g}")
            line = f"    {m.status or 'n/a':4}  {m.label}: {shown} (target {t})"
            if m.status is None:
                line += " - " + (self._why_none(m) or "no figures")
            lines.append(line)
        return "\n".join(lines)

    def _why_none(self, m: Metric) -> str | None:
        """Why a targeted metric has no figure: a path that did not run."""
        paths = [p for p in PATHS if m.id.startswith(p + "_")]
        if "_vs_moosefs_" in m.id:
            paths.append("moosefs")
        return next((self.available[p] for p in paths
                     if self.available.get(p) and not self.figures[p]), None)
