"""/metrics and /healthz of every daemon (common/metrics.py), scraped over HTTP.

A real cluster: 2 workers, mount 0 without short-circuit (its data goes through the
workers' streams) and mount 1 with it.  Work through the mounts must move the
counters it should: RPC counts per method and code at the master, journal fsyncs,
namespace size, bytes by path at the workers and at each mount, lookups that hit and
missed.  /healthz is 200 while serving; a mount's /healthz turns 503 once its master
has been gone longer than cluster.master_wait, and 200 again when it is back.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from curvine.common import metrics
from curvine.fuse_client import metrics as fuse_metrics
from fs_helpers import MIB, log_text, wait_until

pytestmark = pytest.mark.fuse


def http_get(port: int, path: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(port: int) -> dict[tuple, float]:
    """{(sample name, sorted label items): value} of one /metrics page."""
    status, text = http_get(port, "/metrics")
    assert status == 200, text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def http_ports(cluster) -> dict[tuple[str, int], int]:
    with open(cluster.state_path) as f:
        procs = json.load(f)["procs"]
    return {(p["role"], p["index"]): p["http_port"] for p in procs}


def write_file(path: str, data: bytes) -> None:
    """LMCache's way: write <key>.tmp, rename it to the final name."""
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.rename(path + ".tmp", path)


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_counters_move_with_work(make_cluster):
    c = make_cluster(workers=2, mounts=2, short_circuit=[False, True])
    ports = http_ports(c)
    for (role, i), port in ports.items():
        status, body = http_get(port, "/healthz")
        assert (status, body) == (200, "ok\n"), f"{role} {i}: {status} {body!r}"
    assert http_get(ports["master", 0], "/nope")[0] == 404

    before = {k: scrape(p) for k, p in ports.items()}
    rnd = random.Random(7)
    a_data, b_data = rnd.randbytes(3 * MIB + 5), rnd.randbytes(2 * MIB + 9)
    m0, m1 = c.mounts
    os.mkdir(os.path.join(m0, "kv"))
    # a: written through the workers' streams, read straight from the block file
    write_file(os.path.join(m0, "kv", "a.data"), a_data)
    assert read_file(os.path.join(m1, "kv", "a.data")) == a_data
    # b: written as a local staging file the worker adopts, read through a stream
    write_file(os.path.join(m1, "kv", "b.data"), b_data)
    assert read_file(os.path.join(m0, "kv", "b.data")) == b_data
    assert not os.path.exists(os.path.join(m1, "kv", "missing.data"))  # an LMCache miss
    with pytest.raises(OSError):
        os.rmdir(os.path.join(m1, "kv"))  # not empty: an error status at the master
    after = {k: scrape(p) for k, p in ports.items()}

    def delta(key, name, **labels):
        return value(after[key], name, **labels) - value(before[key], name, **labels)

    # master: RPCs per method and code (mount calls travel on the Calls stream)
    master = ("master", 0)
    handled = "curvine_rpc_server_handled_total"
    for method, n in (("Create", 2), ("Rename", 2), ("CompleteFile", 2), ("Mkdir", 1)):
        assert delta(master, handled, method=method, code="OK") >= n, method
    assert delta(master, handled, method="Rmdir", code="FAILED_PRECONDITION") == 1
    assert delta(master, handled, method="Rmdir", code="OK") == 0
    assert delta(master, "curvine_rpc_server_duration_seconds_count", method="Create") >= 2
    assert delta(master, "curvine_journal_fsync_duration_seconds_count") >= 1
    assert delta(master, "curvine_journal_batch_records_sum") >= 5  # mkdir, 2 create, 2 rename...
    assert value(after[master], "curvine_namespace_inodes") == 4  # root, kv, a, b
    assert value(after[master], "curvine_namespace_files") == 2
    assert value(after[master], "curvine_namespace_directories") == 2
    assert value(after[master], "curvine_pool_workers", state="live") == 2
    assert value(after[master], "curvine_pool_capacity_bytes") > 0
    assert value(after[master], "curvine_lease_sessions") == 2
    assert delta(master, "curvine_lease_grants_total") >= 1
    assert value(after[master], "curvine_evicted_files_total", reason="lru") == 0
    assert value(after[master], "curvine_under_replicated_blocks") == 0
    assert value(after[master], "process_resident_memory_bytes") > 0

    # workers: bytes by path, summed over both workers
    workers = [("worker", 0), ("worker", 1)]
    wsum = lambda name, **kw: sum(delta(w, name, **kw) for w in workers)  # noqa: E731
    assert wsum("curvine_worker_written_bytes_total", path="remote") == len(a_data)
    assert wsum("curvine_worker_written_bytes_total", path="short_circuit") == len(b_data)
    # A stream's bytes are counted when the worker's stream ends: a reader that has every
    # byte may cancel it at close (the mount closes readers at once), and the worker's
    # generator counts in its finally, which can come just after this scrape.
    def remote_reads() -> float:
        return sum(value(scrape(ports[w]), "curvine_worker_read_bytes_total", path="remote")
                   - value(before[w], "curvine_worker_read_bytes_total", path="remote")
                   for w in workers)

    wait_until(lambda: remote_reads() >= len(b_data), 10, "the workers' remote reads")
    assert wsum(handled, method="WriteBlock", code="OK") == 1
    # the short-circuit block: adopted on the worker's domain socket (AdoptBlock RPC
    # only when the worker has none here)
    assert wsum("curvine_worker_fd_blocks_total", op="write") == 1
    assert wsum(handled, method="AdoptBlock", code="OK") == 0
    assert sum(value(after[w], "curvine_worker_used_bytes") for w in workers) \
        >= len(a_data) + len(b_data)
    assert all(value(after[w], "curvine_worker_registered") == 1 for w in workers)

    # mounts: bytes by path, lookups that found a name or not
    f0, f1 = ("fuse", 0), ("fuse", 1)
    assert delta(f0, "curvine_client_written_bytes_total", path="remote") == len(a_data)
    assert delta(f0, "curvine_client_read_bytes_total", path="remote") >= len(b_data)
    assert delta(f0, "curvine_client_read_bytes_total", path="short_circuit") == 0
    assert delta(f1, "curvine_client_written_bytes_total", path="short_circuit") == len(b_data)
    assert delta(f1, "curvine_client_read_bytes_total", path="short_circuit") >= len(a_data)
    assert delta(f1, "curvine_fuse_lookups_total", result="hit") >= 1  # kv/a.data
    assert delta(f1, "curvine_fuse_lookups_total", result="miss") >= 2  # b.data.tmp, missing
    assert delta(f0, "curvine_fuse_lookups_total", result="error") == 0
    for k in ports:
        print(f"{k[0]} {k[1]}: {len(after[k])} samples")
    print("master Create latency buckets:",
          {s[1]: v for s, v in after[master].items()
           if s[0] == "curvine_rpc_server_duration_seconds_bucket"
           and ("method", "Create") in s[1] and v})


@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master is stopped on purpose
def test_mount_health_follows_the_master(make_cluster, tmp_path):
    wait = 2.0
    conf = tmp_path / "curvine.toml"
    conf.write_text(f'[cluster]\nmaster_wait = "{wait}s"\nrpc_timeout = "5s"\n')
    c = make_cluster(workers=1, mounts=1, conf=str(conf))
    ports = http_ports(c)
    fuse = ports["fuse", 0]
    assert http_get(fuse, "/healthz") == (200, "ok\n")

    c.kill("master", sig=signal.SIGTERM)
    assert "master stopped" in log_text(c.log_path("master"))
    # the master's endpoint went with it
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{ports['master', 0]}/healthz", timeout=5)
    started = time.monotonic()
    status, reason = wait_until(lambda: (r := http_get(fuse, "/healthz"))[0] == 503 and r,
                                30, "the mount's /healthz to report the master gone")
    print(f"mount unhealthy {time.monotonic() - started:.1f}s after the master stopped "
          f"(cluster.master_wait {wait:g}s): {reason.strip()}")
    assert "master" in reason and "cluster.master_wait" in reason and "\n" == reason[-1]
    assert reason.count("\n") == 1

    c.start("master")
    wait_until(lambda: http_get(fuse, "/healthz") == (200, "ok\n"), 30,
               "the mount's /healthz to be ok with the master back")
    wait_until(lambda: http_get(ports["master", 0], "/healthz") == (200, "ok\n"), 30,
               "the restarted master's /healthz")
    wait_until(lambda: http_get(ports["worker", 0], "/healthz") == (200, "ok\n"), 30,
               "the worker's /healthz")


# -- the endpoint itself, in process --------------------------------------------------

def test_endpoint_health_reasons_and_shutdown():
    reasons = iter([None, "journal not writable: disk full\nsecond line", RuntimeError("boom")])

    def health():
        r = next(reasons)
        if isinstance(r, Exception):
            raise r
        return r

    server = metrics.serve("test", "127.0.0.1", free_port(), "test.http_port",
                           metrics.registry(groups=(fuse_metrics.FUSE_METRICS,)), health)
    assert server is not None
    try:
        assert http_get(server.port, "/healthz") == (200, "ok\n")
        assert http_get(server.port, "/healthz") == (503, "journal not writable: disk full "
                                                          "second line\n")
        assert http_get(server.port, "/healthz") == (503, "health check failed: boom\n")
        status, text = http_get(server.port, "/metrics")
        assert status == 200 and "curvine_fuse_lookups_total" in text
        assert "curvine_rpc_server" not in text  # only the groups this daemon registered
    finally:
        server.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5)


def test_port_in_use_is_an_error_not_a_crash(caplog):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = metrics.serve("test", "127.0.0.1", port, "worker.http_port",
                               metrics.registry(), lambda: None)
    assert server is None
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "worker.http_port" in errors[0].getMessage()
    assert errors[0].exc_info is None
    assert metrics.serve("test", "127.0.0.1", 0, "worker.http_port",
                         metrics.registry(), lambda: None) is None  # 0 = off


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
