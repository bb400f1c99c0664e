"""Every `curvine` command finds its cluster the same way (cli/connect.py): --base,
--conf, $CURVINE_CONF, /etc/curvine/curvine.toml, in that order; `curvine local
status|down` too.  A master that cannot be reached is named with the address tried and
where that address came from."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from curvine.common import config as config_mod

NOWHERE = "no --base, --conf, CURVINE_CONF or /etc/curvine/curvine.toml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def curvine(*args: str, env: dict | None = None, cwd: str | None = None):
    base_env = {k: v for k, v in os.environ.items() if k != "CURVINE_CONF"}
    return subprocess.run([sys.executable, "-m", "curvine.cli.main", *args],
                          env={**base_env, **(env or {})}, capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def conf_with_master(tmp_path, name: str, port: int | None) -> str:
    path = tmp_path / name
    path.write_text(f'[cluster]\nmaster_addr = "127.0.0.1:{port}"\n' if port else
                    '[client]\nshort_circuit = true\n')
    return str(path)


def test_no_config_anywhere_names_the_default_and_what_was_looked_for():
    if os.path.exists(config_mod.DEFAULT_PATH):
        pytest.skip(f"{config_mod.DEFAULT_PATH} exists on this machine")
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", 8995)) == 0:
            pytest.skip("something listens on 127.0.0.1:8995 here")
    for cmd in (["fs", "ls", "/"], ["report"], ["journal", "checkpoint"]):
        r = curvine(*cmd)
        assert r.returncode == 1, r
        assert r.stderr.startswith("curvine: error: cannot reach the master at 127.0.0.1:8995 "
                                   f"(the default; {NOWHERE}): "), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_the_address_and_its_source_in_the_error(tmp_path):
    env_port, conf_port, flag_port = free_port(), free_port(), free_port()
    env_conf = conf_with_master(tmp_path, "env.toml", env_port)
    flag_conf = conf_with_master(tmp_path, "flag.toml", conf_port)
    bare = conf_with_master(tmp_path, "bare.toml", None)

    r = curvine("fs", "ls", "/", env={"CURVINE_CONF": env_conf})
    assert (f"cannot reach the master at 127.0.0.1:{env_port} (cluster.master_addr of "
            f"{env_conf}, from CURVINE_CONF): ") in r.stderr, r.stderr
    # --conf comes before CURVINE_CONF
    r = curvine("report", "--conf", flag_conf, env={"CURVINE_CONF": env_conf})
    assert (f"cannot reach the master at 127.0.0.1:{conf_port} (cluster.master_addr of "
            f"{flag_conf}, from --conf): ") in r.stderr, r.stderr
    # --master over either
    r = curvine("fs", "stat", "/", "--master", f"127.0.0.1:{flag_port}", "--conf", flag_conf)
    assert f"cannot reach the master at 127.0.0.1:{flag_port} (--master): " in r.stderr, r.stderr
    # a config that names no master: the default, and which file said nothing
    r = curvine("fs", "ls", "/", env={"CURVINE_CONF": bare})
    assert (f"cannot reach the master at 127.0.0.1:8995 (the default; {bare} (CURVINE_CONF) "
            "sets no cluster.master_addr): ") in r.stderr, r.stderr
    # config show reads the same file
    r = curvine("config", "show", env={"CURVINE_CONF": env_conf})
    assert r.returncode == 0 and f"127.0.0.1:{env_port}" in r.stdout
    assert f"from {env_conf} (CURVINE_CONF)" in r.stdout.splitlines()[0]


def test_local_status_and_down_follow_curvine_conf(make_cluster, tmp_path):
    c = make_cluster(workers=1, mounts=0)
    env = {"CURVINE_CONF": c.client_conf}
    r = curvine("local", "status", env=env)
    assert r.returncode == 0, r.stderr
    assert "master" in r.stdout and "running" in r.stdout
    r = curvine("fs", "ls", "/", env=env)
    assert r.returncode == 0, r.stderr
    r = curvine("config", "show", "--base", c.base)
    assert r.returncode == 0 and c.master_addr in r.stdout
    # a config that is not a local cluster's: said so, with where it came from
    other = conf_with_master(tmp_path, "other.toml", free_port())
    r = curvine("local", "status", env={"CURVINE_CONF": other})
    assert r.returncode == 1
    assert f"{other} (CURVINE_CONF) is not a config that `curvine local up` wrote" in r.stderr
    # and nothing at all
    if not os.path.exists(config_mod.DEFAULT_PATH):
        r = curvine("local", "status")
        assert r.returncode == 1 and NOWHERE in r.stderr and "--base" in r.stderr
    r = curvine("local", "down", env=env)
    assert r.returncode == 0, r.stderr
    r = curvine("local", "status", env=env)
    assert r.returncode == 1 and f"no cluster in {os.path.realpath(c.base)}" in r.stderr, r.stderr
