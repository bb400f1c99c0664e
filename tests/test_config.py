"""The config file: the documented sample, errors that name file:line:key, `curvine
config`, and the daemons refusing a bad file with one line and exit code 2."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import pytest

from curvine.common import config
from curvine.common.config import Config
from curvine.common.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(REPO, "conf", "curvine.toml")
VENV_BIN = os.path.dirname(sys.executable)


def _keys_by_section() -> dict[str, list[str]]:
    cfg = Config()
    return {sec.name: [f.name for f in dataclasses.fields(getattr(cfg, sec.name))]
            for sec in dataclasses.fields(cfg)}


def test_sample_config_is_the_defaults():
    assert config.load(SAMPLE) == Config()


def test_sample_config_documents_every_key():
    """A key added to a dataclass without a documented line in the sample fails here."""
    text = open(SAMPLE).read()
    lines = text.splitlines()
    missing, undocumented = [], []
    for section, keys in _keys_by_section().items():
        assert config._line_of(text, section, None), f"[{section}] missing from the sample"
        for key in keys:
            no = config._line_of(text, section, key)
            if not no:
                missing.append(f"{section}.{key}")
            elif not lines[no - 2].lstrip().startswith("#"):
                undocumented.append(f"{section}.{key} (line {no})")
    assert not missing, f"keys missing from conf/curvine.toml: {missing}"
    assert not undocumented, f"keys without a comment line above them: {undocumented}"


def _error(tmp_path, text: str) -> str:
    path = tmp_path / "curvine.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        config.load(str(path))
    return str(e.value).replace(str(path), "FILE")


# (file text, the error must start with this; FILE stands for the path)
BAD = [
    ("[cluster]\nname = 'x'\n[nosuch]\na = 1\n", "FILE:3: unknown section [nosuch]"),
    ("replicas = 2\n", "FILE:1: replicas: a key outside any section"),
    ("[worker]\n\nno_such_key = 1\n", "FILE:3: worker.no_such_key: unknown key"),
    ("[cluster]\nblock_size = '64 parsecs'\n", "FILE:2: cluster.block_size: bad size"),
    ("[cluster]\nblock_size = -1\n", "FILE:2: cluster.block_size: size must not be negative"),
    ("[master]\nlease_time = 'soon'\n", "FILE:2: master.lease_time: bad duration"),
    ("[journal]\nfsync = 'yes'\n", "FILE:2: journal.fsync: expected true or false"),
    ("[master]\nport = '8995'\n", "FILE:2: master.port: expected an integer"),
    ("[master]\nevict_high = 'lots'\n", "FILE:2: master.evict_high: expected a number"),
    ("[log]\nlevel = 3\n", "FILE:2: log.level: expected a string"),
    ("[worker]\ndata_dirs = '/nvme'\n", "FILE:2: worker.data_dirs: expected a list of strings"),
    # values that parse but cannot work (validate())
    ("[cluster]\n\nblock_size = '1000KiB'\n", "FILE:3: cluster.block_size: must be a positive multiple of 1MiB"),
    ("[cluster]\nreplicas = 9\n", "FILE:2: cluster.replicas: must be between 1 and 8, got 9"),
    ("[cluster]\nmaster_addr = 'master'\n", "FILE:2: cluster.master_addr: expected host:port"),
    ("[cluster]\nrpc_timeout = 0\n", "FILE:2: cluster.rpc_timeout: must be positive"),
    ("[master]\nevict_low = 0.5\nevict_high = 0.4\n",
     "FILE:2: master.evict_low / master.evict_high: need 0 < low < high <= 1"),
    ("[master]\nevict_high = 0.7\n", "FILE:2: master.evict_low / master.evict_high"),
    ("[master]\nhttp_port = 70000\n", "FILE:2: master.http_port: 70000 is not a port number"),
    ("[fuse]\nhttp_port = 65536\n", "FILE:2: fuse.http_port: 65536 is not a port number"),
    ("[worker]\nrpc_threads = 0\n", "FILE:2: worker.rpc_threads: must be at least 1"),
    ("[client]\nreadahead_blocks = -2\n", "FILE:2: client.readahead_blocks: must not be negative"),
    ("[worker]\ndata_dirs = []\n", "FILE:2: worker.data_dirs: needs at least one directory"),
    ("[worker]\nheartbeat_interval = '1min'\n",
     "FILE:2: master.worker_lost_after / worker.heartbeat_interval: a worker is declared lost"),
    ("[journal]\ndir = ''\n", "FILE:2: journal.dir: must not be empty"),
    ("[log]\nlevel = 'loud'\n", "FILE:2: log.level: 'loud' is not one of DEBUG"),
    ("[security]\ntls_cert = '/etc/curvine/cert.pem'\n",
     "FILE:2: security.tls_cert: is set but security.tls_key is not"),
    ("[security]\ntls_key = '/etc/curvine/key.pem'\n",
     "FILE:2: security.tls_key: is set but security.tls_cert is not"),
    ("[security]\ntls_cert = 'c.pem'\ntls_key = 'k.pem'\n",
     "FILE:1: security.tls_ca: must be set when security.tls_cert is"),
    ("[security]\ntls_ca = '/nonexistent/ca.pem'\n",
     "FILE:2: security.tls_ca: cannot read /nonexistent/ca.pem: No such file"),
    ("[security]\ntls_client_auth = true\n",
     "FILE:2: security.tls_client_auth: needs security.tls_ca"),
    ("[security]\ntls_server_name = 'master.example'\n",
     "FILE:2: security.tls_server_name: is set but TLS is off"),
]


@pytest.mark.parametrize("text,expected", BAD, ids=[e.split(": ", 1)[-1][:40] for _, e in BAD])
def test_bad_config_names_file_line_and_key(tmp_path, text, expected):
    message = _error(tmp_path, text)
    assert message.startswith(expected), message
    assert "\n" not in message


def test_toml_syntax_error_names_the_line(tmp_path):
    assert _error(tmp_path, "[cluster]\nreplicas = 2\nmaster_addr = [\n") == (
        "FILE:3: TOML syntax: Invalid value at the end of the file")
    assert _error(tmp_path, "[cluster]\nreplicas = 2\nmaster_addr 'x'\n[log]\n") == (
        "FILE:3: TOML syntax: Expected '=' after a key in a key/value pair (column 13)")


def test_validate_without_a_file_names_the_key():
    cfg = Config()
    cfg.worker.port = 99999  # e.g. from a command-line flag
    with pytest.raises(ConfigError, match=r"^worker\.port: 99999 is not a port number$"):
        config.validate(cfg)
    config.validate(Config())


def test_sizes_and_durations_are_parsed(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[cluster]\nblock_size = '128MiB'\nmaster_wait = '2min'\n"
                    "[worker]\ncapacity = '1.5GiB'\nheartbeat_interval = '500ms'\n"
                    "[master]\nworker_lost_after = '1d'\n")
    cfg = config.load(str(path))
    assert cfg.cluster.block_size == 128 << 20 and cfg.cluster.master_wait == 120.0
    assert cfg.worker.capacity == 3 << 29 and cfg.worker.heartbeat_interval == 0.5
    assert cfg.master.worker_lost_after == 86400.0


def test_env_var_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "env.toml"
    path.write_text("[fuse]\nmountpoint = '/mnt/other'\n")
    monkeypatch.setenv("CURVINE_CONF", str(path))
    assert config.load().fuse.mountpoint == "/mnt/other"
    assert config.load(SAMPLE).fuse.mountpoint == "/mnt/kv"  # --conf wins


def _curvine(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(VENV_BIN, "curvine"), *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_config_check_and_show(tmp_path):
    ok = _curvine("config", "check", SAMPLE)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"ok: {SAMPLE}\n")
    assert "changed from defaults: none" in ok.stdout

    mine = tmp_path / "node.toml"
    mine.write_text("[cluster]\nreplicas = 2\nmaster_addr = '10.0.0.5:8995'\n"
                    "[worker]\ndata_dirs = ['/nvme0/curvine', '/nvme1/curvine']\n"
                    "capacity = '500GiB'\n")
    ok = _curvine("config", "check", str(mine))
    assert ok.returncode == 0, ok.stderr
    assert "2 replicas" in ok.stdout and "capacity 500GiB" in ok.stdout
    assert ("changed from defaults: cluster.master_addr, cluster.replicas, "
            "worker.data_dirs, worker.capacity") in ok.stdout

    # show prints TOML that loads back to the same configuration
    shown = _curvine("config", "show", "--conf", str(mine))
    assert shown.returncode == 0, shown.stderr
    (tmp_path / "shown.toml").write_text(shown.stdout)
    assert config.load(str(tmp_path / "shown.toml")) == config.load(str(mine))

    bad = tmp_path / "bad.toml"
    bad.write_text("[worker]\nport = 8997\nrpc_threads = 0\n")
    err = _curvine("config", "check", str(bad))
    assert err.returncode == 1
    assert err.stdout == ""
    assert err.stderr == f"curvine: error: {bad}:3: worker.rpc_threads: must be at least 1\n"

    missing = _curvine("config", "check", str(tmp_path / "nope.toml"))
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1 and "nope.toml: cannot read config" in missing.stderr


DAEMONS = {
    "curvine-master": lambda tmp: ["--meta-dir", str(tmp / "meta"), "--journal-dir", str(tmp / "j")],
    "curvine-worker": lambda tmp: ["--data-dir", str(tmp / "data"), "--port", "0"],
    "curvine-fuse": lambda tmp: [str(tmp)],
}


@pytest.mark.parametrize("daemon", sorted(DAEMONS))
def test_daemons_refuse_a_bad_config_with_one_line(tmp_path, daemon):
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster]\nreplicas = 2\n\n[master]\nevict_low = 0.95\n")
    for how in ("--conf", "CURVINE_CONF"):
        env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
        args = [os.path.join(VENV_BIN, daemon), *DAEMONS[daemon](tmp_path)]
        if how == "--conf":
            args += ["--conf", str(bad)]
        else:
            env["CURVINE_CONF"] = str(bad)
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 2, (how, proc.stderr)
        lines = proc.stderr.splitlines()
        assert len(lines) == 1, (how, proc.stderr)
        assert re.search(rf"{re.escape(str(bad))}:5: master\.evict_low / master\.evict_high: "
                         r"need 0 < low < high <= 1", lines[0]), lines[0]
    # nothing was started on the way out
    assert not (tmp_path / "meta").exists() and not (tmp_path / "data").exists()
