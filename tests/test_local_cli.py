"""`curvine local` and LocalCluster: state file, ports, process life cycle, CLI.

Three levels: pure parts (ports, state file, stale state, argument errors) need
nothing; the life-cycle tests run LocalCluster against stand-in daemons
(tests/cluster_util.py), so they check the machinery itself; the last tests drive
the real `curvine` command against the real master, workers and FUSE client.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from cluster_util import fake_commands, fuse_available, tracebacks_in_logs, wait_for
from curvine.common import config
from curvine.devtools.local import (STATE_FILE, ClusterError, LocalCluster, free_ports,
                                    is_mounted, mounted_paths, pid_alive, proc_start_time)

needs_fuse = pytest.mark.skipif(fuse_available() is not None,
                                reason=f"needs FUSE mounts: {fuse_available()}")


def _mounts_under(base) -> list[str]:
    return [m for m in mounted_paths() if m.startswith(str(base) + os.sep)]


def _spawn_sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def _planned(tmp_path, **kw) -> LocalCluster:
    """A cluster with ports and command lines chosen and saved, but nothing started."""
    c = LocalCluster(str(tmp_path / "c"), **kw)
    c._layout()
    c._plan()
    c._save()
    return c


# --------------------------------------------------------------------------- pure parts

def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(20)
    assert len(set(ports)) == 20
    for p in ports:
        assert 1024 <= p <= 65535
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_state_file_records_every_process(tmp_path):
    c = _planned(tmp_path, workers=3, mounts=2, short_circuit=[True, False],
                 env={"CURVINE_HOST_ID": "node-a"})
    state = json.loads((tmp_path / "c" / STATE_FILE).read_text())
    roles = [(p["role"], p["index"]) for p in state["procs"]]
    assert roles == [("master", 0), ("worker", 0), ("worker", 1), ("worker", 2),
                     ("fuse", 0), ("fuse", 1)]
    assert state["env"] == {"CURVINE_HOST_ID": "node-a"}
    assert state["master_addr"] == c.master_addr
    # Nothing but the state file and its directories: the write was temp + rename.
    assert sorted(n for n in os.listdir(c.base) if n != ".lock") == sorted(
        [STATE_FILE, "conf", "logs", "master", "mnt", "token", "worker", "worker-token"])

    procs = {(p["role"], p["index"]): p for p in state["procs"]}
    base = c.base
    m = procs[("master", 0)]["argv"]
    assert m[:3] == [sys.executable, "-m", "curvine.master.server"]
    assert m[m.index("--host") + 1] == "127.0.0.1"
    assert c.master_addr == f"127.0.0.1:{m[m.index('--port') + 1]}"
    assert m[m.index("--meta-dir") + 1] == f"{base}/master/meta"
    assert m[m.index("--journal-dir") + 1] == f"{base}/master/journal"
    w = procs[("worker", 2)]["argv"]
    assert w[:3] == [sys.executable, "-m", "curvine.worker.server"]
    assert w[w.index("--master") + 1] == c.master_addr
    assert w[w.index("--data-dir") + 1] == f"{base}/worker/2/data"
    f0, f1 = procs[("fuse", 0)]["argv"], procs[("fuse", 1)]["argv"]
    assert f0[:4] == [sys.executable, "-m", "curvine.fuse_client.main", f"{base}/mnt/0"]
    assert "--no-short-circuit" not in f0 and "--no-short-circuit" in f1
    assert c.mounts == [f"{base}/mnt/0", f"{base}/mnt/1"]
    assert c.log_path("worker", 1) == f"{base}/logs/worker-1.log"

    # Every gRPC and HTTP port is distinct, and each daemon's config file is valid.
    grpc_ports = [int(p["address"].rsplit(":", 1)[1]) for p in state["procs"] if p["address"]]
    http_ports = [p["http_port"] for p in state["procs"]]
    assert len(set(grpc_ports + http_ports)) == len(grpc_ports) + len(http_ports)
    for p in state["procs"]:
        argv = p["argv"]
        cfg = config.load(argv[argv.index("--conf") + 1])
        assert cfg.cluster.master_addr == c.master_addr
        section = {"master": cfg.master, "worker": cfg.worker, "fuse": cfg.fuse}[p["role"]]
        assert section.http_port == p["http_port"]
        if p["address"]:
            assert f"{section.host}:{section.port}" == p["address"]
    assert config.load(f0[f0.index("--conf") + 1]).client.short_circuit is True
    assert config.load(f1[f1.index("--conf") + 1]).client.short_circuit is False
    assert config.load(f1[f1.index("--conf") + 1]).fuse.mountpoint == f"{base}/mnt/1"
    assert config.load(w[w.index("--conf") + 1]).worker.data_dirs == [f"{base}/worker/2/data"]
    mconf = config.load(m[m.index("--conf") + 1])
    assert (mconf.master.meta_dir, mconf.journal.dir) == (f"{base}/master/meta",
                                                          f"{base}/master/journal")


def test_client_config_reaches_the_cluster_without_the_worker_token(tmp_path):
    """BASE/conf/client.toml (CURVINE_CONF, or --base of the other commands) names the
    master, the cluster token and the short-circuit dirs, never the worker token."""
    c = _planned(tmp_path, workers=2, mounts=0)
    assert LocalCluster.client_conf_of(c.base) == c.client_conf == f"{c.base}/conf/client.toml"
    cfg = config.load(c.client_conf)
    assert cfg.cluster.master_addr == c.master_addr
    assert cfg.security.token_file == f"{c.base}/token"
    assert cfg.security.worker_token_file == ""
    assert cfg.client.short_circuit_dirs == [f"{c.base}/worker/0/data", f"{c.base}/worker/1/data"]
    with pytest.raises(ClusterError, match="no cluster in .*cluster.json not found"):
        LocalCluster.client_conf_of(str(tmp_path / "none"))


def test_a_group_gets_a_master_token_for_its_masters_only(tmp_path):
    """`curvine local up --masters 3` writes BASE/master-token (0600) beside the other
    two and names it in the masters' configs only; one master gets none."""
    c = _planned(tmp_path, workers=1, mounts=1, masters=3)
    path = f"{c.base}/master-token"
    assert os.stat(path).st_mode & 0o777 == 0o600
    token = open(path).read().strip()
    assert token and token not in (open(f"{c.base}/token").read(),
                                   open(f"{c.base}/worker-token").read())
    confs = sorted(os.listdir(f"{c.base}/conf"))
    assert [n for n in confs if n.startswith("master")] == [f"master-{i}.toml" for i in range(3)]
    for name in confs:
        cfg = config.load(f"{c.base}/conf/{name}")
        assert cfg.security.master_token_file == (path if name.startswith("master") else ""), \
            name
    single = _planned(tmp_path / "one", workers=1, mounts=0)
    assert not os.path.exists(f"{single.base}/master-token")
    assert config.load(f"{single.base}/conf/master-0.toml").security.master_token_file == ""


def test_user_config_is_copied_and_passed_on(tmp_path):
    conf = tmp_path / "my.toml"
    conf.write_text('[cluster]\nblock_size = "32MiB"\n[fuse]\nattr_timeout = "5s"\n')
    c = _planned(tmp_path, workers=1, mounts=1, conf=str(conf))
    assert (tmp_path / "c" / "conf.toml").read_text() == conf.read_text()
    for p in c._procs.values():
        cfg = config.load(p.argv[p.argv.index("--conf") + 1])
        assert cfg.cluster.block_size == 32 << 20 and cfg.fuse.attr_timeout == 5.0


def test_worker_capacity_and_replicas_override_the_config(tmp_path):
    conf = tmp_path / "my.toml"
    conf.write_text('[cluster]\nreplicas = 1\n[worker]\ncapacity = "1GiB"\n')
    c = _planned(tmp_path, workers=2, mounts=1, conf=str(conf),
                 worker_capacity=96 << 20, replicas=2)
    for p in c._procs.values():
        cfg = config.load(p.argv[p.argv.index("--conf") + 1])
        assert (cfg.cluster.replicas, cfg.worker.capacity) == (2, 96 << 20)
    kept = _planned(tmp_path / "k", workers=1, mounts=0, conf=str(conf))
    for p in kept._procs.values():
        cfg = config.load(p.argv[p.argv.index("--conf") + 1])
        assert (cfg.cluster.replicas, cfg.worker.capacity) == (1, 1 << 30)
    with pytest.raises(ClusterError, match="replicas"):
        LocalCluster(str(tmp_path / "r"), replicas=9)


def test_down_stops_a_daemon_the_state_does_not_name(tmp_path):
    """A daemon started in the instant an interrupted `up` was stopped is in no state
    file; `down` finds it by its --conf in BASE/conf/ and stops it."""
    c = _planned(tmp_path, workers=0, mounts=0)
    master = c._procs[("master", 0)]
    os.makedirs(os.path.dirname(master.log), exist_ok=True)
    with open(master.log, "ab") as log:
        stray = subprocess.Popen(master.argv, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        wait_for(lambda: "master serving" in open(master.log).read() or stray.poll() is not None,
                 timeout=30, what="the stray master to start")
        assert stray.poll() is None, open(master.log).read()
        c._procs.clear()  # as if its pid was never recorded
        c.down(timeout=10)
        assert stray.wait(timeout=10) == 0  # SIGTERM: a clean stop
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()


def test_bad_user_config_is_a_cluster_error(tmp_path):
    conf = tmp_path / "bad.toml"
    conf.write_text("[worker]\nno_such_key = 1\n")
    with pytest.raises(ClusterError, match="no_such_key"):
        LocalCluster(str(tmp_path / "c"), conf=str(conf)).up()
    assert not (tmp_path / "c" / STATE_FILE).exists()


def test_attach_reads_state_back(tmp_path):
    c = _planned(tmp_path, workers=2, mounts=1, short_circuit=[False], env={"X": "1"})
    a = LocalCluster.attach(c.base)
    assert a.master_addr == c.master_addr and a.mounts == c.mounts
    assert a.short_circuit == [False] and a.env == {"X": "1"}
    assert [(s["role"], s["index"], s["alive"]) for s in a.status()] == [
        ("master", 0, False), ("worker", 0, False), ("worker", 1, False), ("fuse", 0, False)]


def test_attach_without_state_is_a_clear_error(tmp_path):
    with pytest.raises(ClusterError, match="no cluster in .*cluster.json not found"):
        LocalCluster.attach(str(tmp_path))
    (tmp_path / STATE_FILE).write_text("{not json")
    with pytest.raises(ClusterError, match="cannot read"):
        LocalCluster.attach(str(tmp_path))


def test_pid_liveness_checks_start_time():
    me = os.getpid()
    assert pid_alive(me) and pid_alive(me, proc_start_time(me))
    assert not pid_alive(me, proc_start_time(me) + 1)  # a recycled pid is not ours
    p = subprocess.Popen(["true"])
    p.wait()
    assert not pid_alive(p.pid) and not pid_alive(None)


def test_up_refuses_a_base_with_a_live_cluster(tmp_path):
    c = _planned(tmp_path, workers=0, mounts=0)
    sleeper = _spawn_sleeper()
    try:
        c._procs[("master", 0)].pid = sleeper.pid
        c._procs[("master", 0)].start_time = proc_start_time(sleeper.pid)
        c._save()
        with pytest.raises(ClusterError) as e:
            LocalCluster(c.base, workers=0, mounts=0).up()
        msg = str(e.value)
        assert "already running" in msg and str(sleeper.pid) in msg
        assert f"curvine local down --base {c.base}" in msg
        assert sleeper.poll() is None, "a refused `up` must not touch the running cluster"
        assert (tmp_path / "c" / STATE_FILE).exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stale_state_is_cleaned_up(tmp_path):
    c = _planned(tmp_path, workers=1, mounts=0)
    dead = subprocess.Popen(["true"])
    dead.wait()
    for p in c._procs.values():
        p.pid, p.start_time = dead.pid, 12345
    c._save()
    assert LocalCluster.attach(c.base).pids() == []
    fresh = LocalCluster(c.base, workers=1, mounts=0)
    fresh._refuse_if_running()
    assert not (tmp_path / "c" / STATE_FILE).exists()


# --------------------------------------------------------------------------- CLI, no daemons

def _run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "curvine.cli.main", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, usage", [
    ([], True),
    (["nosuch"], True),
    (["local"], True),
    (["local", "up"], True),  # --base missing
    (["local", "up", "--base", "B", "--workers", "-1"], True),
    (["local", "up", "--base", "B", "--workers", "two"], True),
    (["local", "up", "--base", "B", "--mounts", "2", "--no-short-circuit-mount", "2"], True),
    (["local", "up", "--base", "B", "--replicas", "0"], True),
    (["local", "up", "--base", "B", "--worker-capacity", "lots"], True),
    (["demo", "--chunk-size", "14XB"], True),
    (["demo", "--chunks", "0"], True),
    (["local", "status", "--base", "B"], False),  # no cluster there
    (["local", "up", "--base", "B", "--conf", "missing.toml"], False),
    (["report", "--base", "B"], False),  # no cluster there
    (["fs", "ls", "--base", "B", "--conf", "c.toml"], True),  # one or the other
])
def test_cli_errors_are_one_line_without_traceback(tmp_path, args, usage):
    args = [str(tmp_path / "B") if a == "B" else a for a in args]
    r = subprocess.run([sys.executable, "-m", "curvine.cli.main", *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == (2 if usage else 1), r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines and "error:" in lines[-1]
    if not usage:
        assert len(lines) == 1 and lines[0].startswith("curvine: error: ")
    assert not (tmp_path / "B" / STATE_FILE).exists()


def test_down_without_a_cluster_is_fine(tmp_path):
    r = _run_cli("local", "down", "--base", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "no cluster" in r.stderr


def test_console_script_is_installed():
    exe = os.path.join(os.path.dirname(sys.executable), "curvine")
    r = subprocess.run([exe, "local", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "{up,down,status}" in r.stdout


# --------------------------------------------------------------------------- life cycle (stand-in daemons)

@pytest.fixture
def fake_daemons(monkeypatch):
    monkeypatch.setattr(LocalCluster, "COMMANDS", fake_commands())


def _assert_all_gone(c: LocalCluster, pids: list[int]):
    for pid in pids:
        assert proc_start_time(pid) is None, f"pid {pid} still running"
    assert _mounts_under(c.base) == []
    assert not os.path.exists(c.state_path)


def test_lifecycle_without_mounts(tmp_path, fake_daemons):
    c = LocalCluster(str(tmp_path / "c"), workers=2, mounts=0)
    assert c.up(timeout=30) == []
    try:
        st = c.status()
        assert [(s["role"], s["index"]) for s in st] == [("master", 0), ("worker", 0),
                                                        ("worker", 1)]
        assert all(s["alive"] for s in st)
        pids = [s["pid"] for s in st]
        assert len(set(pids)) == 3
        # Each daemon runs in its own session, so it outlives the caller.
        assert all(os.getsid(p) == p for p in pids)

        with pytest.raises(ClusterError, match="already running"):
            LocalCluster(c.base, workers=1, mounts=0).up()

        old = c.status()[1]["pid"]
        c.kill("worker", 0)
        assert not c.status()[1]["alive"]
        with pytest.raises(ClusterError, match="not running"):
            c.kill("worker", 0)
        c.start("worker", 0)
        new = c.status()[1]
        assert new["alive"] and new["pid"] != old
        assert LocalCluster.attach(c.base).status()[1]["pid"] == new["pid"]
        with pytest.raises(ClusterError, match="already running"):
            c.start("worker", 0)

        c.kill("master", sig=signal.SIGTERM)
        c.start("master", wait_ready=False)
        wait_for(lambda: c.status()[0]["alive"], what="master restart")
        pids = c.pids()
    finally:
        LocalCluster.attach(c.base).down(timeout=10)  # as `curvine local down` does
    _assert_all_gone(c, pids)
    c.down()  # idempotent
    LocalCluster(c.base).down()


def test_failed_daemon_stops_everything_and_shows_its_log(tmp_path, fake_daemons):
    c = LocalCluster(str(tmp_path / "c"), workers=2, mounts=0, env={"FAKE_FAIL": "worker"})
    t0 = time.monotonic()
    with pytest.raises(ClusterError) as e:
        c.up(timeout=30)
    assert time.monotonic() - t0 < 15, "must fail fast when a daemon exits"
    msg = str(e.value)
    assert "worker 0 exited with code 1" in msg and "simulated start-up failure" in msg
    assert c.log_path("worker", 0) in msg
    _assert_all_gone(c, [p.pid for p in c._procs.values() if p.pid])


def test_daemon_that_never_gets_ready_times_out(tmp_path, fake_daemons):
    c = LocalCluster(str(tmp_path / "c"), workers=1, mounts=0, env={"FAKE_HANG": "master"})
    with pytest.raises(ClusterError, match="master 0 did not report READY=1"):
        c.up(timeout=3)
    _assert_all_gone(c, [p.pid for p in c._procs.values() if p.pid])


@pytest.mark.expect_log(r"^Traceback \(most recent call last\):\n  simulated")  # FAKE_TRACEBACK
def test_tracebacks_in_logs_are_found(tmp_path, fake_daemons):
    c = LocalCluster(str(tmp_path / "c"), workers=1, mounts=0, env={"FAKE_TRACEBACK": "worker"})
    c.up(timeout=30)
    c.down()
    found = tracebacks_in_logs(c)
    assert len(found) == 1 and "worker-0.log" in found[0]


@needs_fuse
@pytest.mark.fuse
def test_lifecycle_with_mounts(tmp_path, fake_daemons):
    c = LocalCluster(str(tmp_path / "c"), workers=1, mounts=2)
    mounts = c.up(timeout=30)
    try:
        assert mounts == c.mounts and all(os.path.ismount(m) for m in mounts)
        c.kill("fuse", 1)  # SIGKILL leaves a dead mount behind ...
        assert is_mounted(mounts[1])
        c.start("fuse", 1)  # ... which start() clears before mounting again
        assert os.path.ismount(mounts[1])
        c.kill("fuse", 0, signal.SIGTERM)  # a clean shutdown unmounts
        assert not is_mounted(mounts[0])
        c.start("fuse", 0)
        pids = c.pids()
        assert len(pids) == 4
    finally:
        c.down(timeout=10)
    _assert_all_gone(c, pids)


@needs_fuse
@pytest.mark.fuse
def test_down_unmounts_a_busy_mount(tmp_path, fake_daemons):
    c = LocalCluster(str(tmp_path / "c"), workers=0, mounts=1)
    (m,) = c.up(timeout=30)
    busy = subprocess.Popen(["sleep", "60"], cwd=m)  # keeps the mount busy
    try:
        c.down(timeout=10)
        assert _mounts_under(c.base) == []
    finally:
        busy.kill()
        busy.wait()


# --------------------------------------------------------------------------- real daemons

@needs_fuse
@pytest.mark.fuse
def test_curvine_local_up_status_down(tmp_path):
    base = str(tmp_path / "cl")
    r = _run_cli("local", "up", "--base", base)
    try:
        assert r.returncode == 0, r.stderr
        mounts = r.stdout.split()
        assert mounts == [f"{base}/mnt/0", f"{base}/mnt/1"]
        assert all(os.path.ismount(m) for m in mounts)

        # The mounts answer and share one namespace.
        with open(os.path.join(mounts[0], "hello.data"), "wb") as f:
            f.write(b"x" * 100_000)
        with open(os.path.join(mounts[1], "hello.data"), "rb") as f:
            assert f.read() == b"x" * 100_000

        r = _run_cli("local", "status", "--base", base, "--json")
        assert r.returncode == 0, r.stderr
        rows = json.loads(r.stdout)
        assert [(x["role"], x["index"]) for x in rows] == [
            ("master", 0), ("worker", 0), ("worker", 1), ("fuse", 0), ("fuse", 1)]
        assert all(x["alive"] and x["pid"] for x in rows)
        assert [x["mount"] for x in rows if x["role"] == "fuse"] == mounts
        assert rows[0]["address"].startswith("127.0.0.1:")
        pids = [x["pid"] for x in rows]

        table = _run_cli("local", "status", "--base", base)
        assert table.returncode == 0 and table.stdout.count("running") == 5

        again = _run_cli("local", "up", "--base", base)
        assert again.returncode == 1
        assert "already running" in again.stderr and "Traceback" not in again.stderr
        assert all(pid_alive(p) for p in pids), "a refused `up` must not disturb the cluster"
    finally:
        down = _run_cli("local", "down", "--base", base)
    assert down.returncode == 0, down.stderr
    for pid in pids:
        assert proc_start_time(pid) is None, f"pid {pid} survived `curvine local down`"
    assert _mounts_under(base) == []
    with open("/proc/mounts") as f:
        assert base not in f.read()
    assert tracebacks_in_logs(LocalCluster(base)) == []


@needs_fuse
@pytest.mark.fuse
@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master is restarted on purpose
def test_cluster_fixture_restarts(make_cluster):
    c = make_cluster(workers=1, mounts=1)
    (m,) = c.mounts
    with open(os.path.join(m, "a.data"), "wb") as f:
        f.write(os.urandom(3 << 20))
    c.kill("master")
    c.start("master")
    assert os.path.getsize(os.path.join(m, "a.data")) == 3 << 20
    c.kill("fuse")
    c.start("fuse")
    assert os.path.getsize(os.path.join(m, "a.data")) == 3 << 20


def _up_without_mounts(base: str) -> tuple[str, list[dict]]:
    """`curvine local up` of a master and one worker: the CURVINE_CONF it printed
    (on stderr) and the rows of `curvine local status --json`."""
    r = _run_cli("local", "up", "--base", base, "--workers", "1", "--mounts", "0",
                 "--timeout", "60", timeout=90)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    exports = [line for line in r.stderr.splitlines() if line.startswith("export ")]
    assert len(exports) == 1, r.stderr
    name, _, value = shlex.split(exports[0])[1].partition("=")
    assert name == "CURVINE_CONF"
    st = _run_cli("local", "status", "--base", base, "--json")
    assert st.returncode == 0, st.stderr
    return value, json.loads(st.stdout)


def test_commands_find_the_local_cluster_with_base(tmp_path):
    """`curvine report` and `curvine fs` reach the cluster of `local up --base B` with
    `--base B` (its master, token and config), and `local status` names each daemon's
    metrics URL, which answers."""
    base = str(tmp_path / "cl")
    try:
        _, rows = _up_without_mounts(base)
        assert [(x["role"], x["index"]) for x in rows] == [("master", 0), ("worker", 0)]
        for x in rows:
            assert x["metrics"].startswith("http://127.0.0.1:") and x["metrics"].endswith("/metrics")
            with urllib.request.urlopen(x["metrics"], timeout=10) as resp:
                assert resp.status == 200 and b"curvine_" in resp.read()
        table = _run_cli("local", "status", "--base", base)
        assert table.returncode == 0 and all(x["metrics"] in table.stdout for x in rows)

        r = _run_cli("report", "--base", base, "--json", timeout=30)
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["master"] == rows[0]["address"] and report["workers_live"] == 1
        r = subprocess.run([sys.executable, "-m", "curvine.cli.main", "fs", "put", "-q", "-",
                            "/hello", "--base", base], input=b"hello", capture_output=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        r = _run_cli("fs", "ls", "/", "--base", base, timeout=30)
        assert r.returncode == 0 and r.stdout.split() == ["hello"], r.stderr
    finally:
        down = _run_cli("local", "down", "--base", base)
    assert down.returncode == 0, down.stderr
    assert tracebacks_in_logs(LocalCluster(base)) == []


def test_commands_find_the_local_cluster_with_curvine_conf(tmp_path):
    """The CURVINE_CONF line `local up` prints is all the other commands need."""
    base = str(tmp_path / "cl")
    try:
        conf, rows = _up_without_mounts(base)
        env = {k: v for k, v in os.environ.items() if k != "CURVINE_CONF"}
        env["CURVINE_CONF"] = conf

        def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "curvine.cli.main", *args],
                                  input=stdin, capture_output=True, env=env, timeout=30)

        r = cli("report", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["master"] == rows[0]["address"]
        assert cli("fs", "put", "-q", "-", "/kv.data", stdin=b"x" * 4096).returncode == 0
        r = cli("fs", "get", "-q", "/kv.data", "-")
        assert r.returncode == 0 and r.stdout == b"x" * 4096, r.stderr
        r = cli("fs", "df", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["live_workers"] == 1, r.stderr
    finally:
        down = _run_cli("local", "down", "--base", base)
    assert down.returncode == 0, down.stderr
    assert tracebacks_in_logs(LocalCluster(base)) == []


# --------------------------------------------------------------------------- demo

def test_demo_workload_on_plain_directories(tmp_path):
    from curvine.devtools import demo
    keys = demo.chunk_keys(4)
    assert len(set(keys)) == 4 and keys == demo.chunk_keys(4)  # seeded
    assert all(k.startswith("vllm@Qwen2.5-7B@1@0@") for k in keys)
    r = demo.run_phase("plain", str(tmp_path / "a"), str(tmp_path / "a"), keys, 1 << 20)
    assert (r.hits, r.bad, len(r.read_ms)) == (4, [], 4)
    assert sorted(os.listdir(tmp_path / "a")) == sorted(k + ".data" for k in keys)
    # A reader that finds other bytes, or nothing, is reported.
    with open(tmp_path / "a" / (keys[1] + ".data"), "r+b") as f:
        f.write(b"X")
    os.remove(tmp_path / "a" / (keys[2] + ".data"))
    os.makedirs(tmp_path / "b")
    _, digests = demo.write_chunks(str(tmp_path / "b"), keys, 1 << 20)
    r2 = demo.PhaseResult("again", 4, 1 << 20)
    demo.read_chunks(str(tmp_path / "a"), keys, digests, 1 << 20, r2)
    assert r2.hits == 3 and r2.bad == [keys[1]]
    table = demo.format_results([r, r2])
    assert "hit rate" in table and "4/4 (100%)" in table and "3/4 (75%)" in table


@needs_fuse
@pytest.mark.fuse
def test_curvine_demo_runs_and_cleans_up(tmp_path):
    base = str(tmp_path / "demo")
    r = _run_cli("demo", "--base", base, "--chunks", "3", "--chunk-size", "3MiB", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3/3 (100%)" in r.stdout and "identical bytes" in r.stdout
    assert _mounts_under(base) == [] and not os.path.exists(os.path.join(base, STATE_FILE))
    assert tracebacks_in_logs(LocalCluster(base)) == []


@needs_fuse
@pytest.mark.fuse
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_up_leaves_nothing_behind(tmp_path, sig):
    base = str(tmp_path / "cl")
    p = subprocess.Popen([sys.executable, "-m", "curvine.cli.main", "local", "up", "--base", base],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Interrupt once the first daemon has been started.
        wait_for(lambda: os.path.exists(os.path.join(base, "logs", "master-0.log")),
                 timeout=30, what="the master to be started")
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        if p.returncode == 0:
            pytest.skip("`up` finished before the signal arrived")
        assert p.returncode == 130 and "interrupted" in err and "Traceback" not in err
        assert not os.path.exists(os.path.join(base, STATE_FILE))
        assert _mounts_under(base) == []
        out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert base not in out
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        _run_cli("local", "down", "--base", base)
