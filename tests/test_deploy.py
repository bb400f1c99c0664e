"""Deployment files: the systemd units (systemd-analyze verify, and the settings the
daemons rely on) and the Kubernetes manifests (schema, and agreement with the
config they carry).  Neither is run on a real init system or cluster here."""

from __future__ import annotations

import base64
import copy
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request

import pytest

from curvine.common import auth, config
from curvine.common.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEMD = os.path.join(REPO, "systemd")
K8S = os.path.join(REPO, "deploy", "k8s")
VENV_BIN = os.path.dirname(sys.executable)
INSTALLED_BIN = "/opt/curvine/venv/bin"  # where the units expect the venv (docs/deploy-gpu-node.md)
UNITS = ["curvine-master.service", "curvine-worker.service", "curvine-fuse@.service"]
FUSE_INSTANCE = "curvine-fuse@mnt-kv.service"  # mounts /mnt/kv

# ----------------------------------------------------------------------------- systemd


def _unit(name: str, text: str | None = None) -> dict[str, dict[str, list[str]]]:
    """A unit file (or ``text``) as {section: {key: [values, in order]}} (keys may
    repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in (text if text is not None else open(os.path.join(SYSTEMD, name)).read()).splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        else:
            key, _, value = line.partition("=")
            current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _values(unit: dict, section: str, key: str) -> list[str]:
    return unit.get(section, {}).get(key, [])


def _installable_copy(tmp_path, units: dict[str, str] | None = None) -> str:
    """The units with the installed venv path pointed at this checkout's venv (so that
    verify's "is ExecStart executable" check means something), plus the instance
    name of the FUSE template, in a fresh directory."""
    d = tmp_path / "units"
    d.mkdir()
    for name in UNITS:
        text = (units or {}).get(name) or open(os.path.join(SYSTEMD, name)).read()
        (d / name).write_text(text.replace(INSTALLED_BIN, VENV_BIN))
    os.symlink("curvine-fuse@.service", d / FUSE_INSTANCE)
    return str(d)


def _verify(directory: str, name: str) -> str:
    """systemd-analyze verify's complaints about ``name`` ("" = none).  It exits 0 on
    unknown keys and bad values (it only warns), so any output counts."""
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", name], cwd=directory,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SYSTEMD_LOG_COLOR": "0"})
    out = (proc.stdout + proc.stderr).strip()
    if proc.returncode and not out:
        out = f"exit code {proc.returncode}"
    return out


needs_systemd_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                           reason="systemd-analyze is not installed")


@needs_systemd_analyze
def test_units_pass_systemd_analyze_verify(tmp_path):
    d = _installable_copy(tmp_path)
    for name in ["curvine-master.service", "curvine-worker.service", FUSE_INSTANCE]:
        assert _verify(d, name) == "", name


BROKEN = {
    "unknown key": ("curvine-master.service", "\n[Service]\n", "\n[Service]\nRestartEvery=5s\n",
                    "Unknown key"),
    "bad value": ("curvine-worker.service", "Type=notify\n", "Type=notifyy\n",
                  "Failed to parse service type"),
    "missing binary": ("curvine-master.service", f"{INSTALLED_BIN}/curvine-master",
                       f"{INSTALLED_BIN}/curvine-mastr", "not executable"),
    "bad device rights": ("curvine-fuse@.service", "DeviceAllow=/dev/fuse rw\n",
                          "DeviceAllow=/dev/fuse rwz\n", "Invalid device rights"),
}


@needs_systemd_analyze
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_verify_catches_a_broken_unit(tmp_path, case):
    name, old, new, complaint = BROKEN[case]
    text = open(os.path.join(SYSTEMD, name)).read()
    assert old in text
    d = _installable_copy(tmp_path, {name: text.replace(old, new, 1)})
    target = FUSE_INSTANCE if name.startswith("curvine-fuse@") else name
    assert complaint in _verify(d, target)


def test_units_have_what_the_daemons_need():
    scripts = tomllib.load(open(os.path.join(REPO, "pyproject.toml"), "rb"))["project"]["scripts"]
    for name in UNITS:
        u = _unit(name)
        svc = lambda key: _values(u, "Service", key)  # noqa: E731
        unit = lambda key: " ".join(_values(u, "Unit", key)).split()  # noqa: E731
        assert svc("Type") == ["notify"] and svc("NotifyAccess") == ["main"], name
        assert svc("Restart") == ["on-failure"] and svc("RestartSec"), name
        assert svc("RestartPreventExitStatus") == ["2"], name  # bad config: no restart loop
        assert svc("KillSignal") == ["SIGTERM"] and svc("TimeoutStopSec"), name
        assert int(svc("LimitNOFILE")[0]) >= 65536, name
        assert "network-online.target" in unit("After") and "network-online.target" in unit("Wants")
        assert "CURVINE_CONF=/etc/curvine/curvine.toml" in svc("Environment"), name
        assert svc("EnvironmentFile") == ["-/etc/default/curvine"], name
        assert svc("NoNewPrivileges") == ["true"], name
        assert _values(u, "Install", "WantedBy") == ["multi-user.target"], name
        exe = svc("ExecStart")[0].split()[0]
        assert os.path.dirname(exe) == INSTALLED_BIN and os.path.basename(exe) in scripts, name
    for name in ("curvine-master.service", "curvine-worker.service"):
        u = _unit(name)
        svc = lambda key: _values(u, "Service", key)  # noqa: E731
        assert svc("ProtectSystem") == ["strict"] and svc("ProtectHome") == ["true"]
        assert svc("PrivateTmp") == ["true"] and svc("User") == ["curvine"]
        # the default meta, journal and data dirs are under the state directory
        assert svc("StateDirectory") == ["curvine"]
        defaults = config.Config()
        for path in (defaults.master.meta_dir, defaults.journal.dir, *defaults.worker.data_dirs):
            assert path.startswith("/var/lib/curvine/")
    worker = _unit("curvine-worker.service")
    assert "curvine-master.service" in " ".join(_values(worker, "Unit", "After"))
    assert "curvine-master.service" not in " ".join(_values(worker, "Unit", "Requires"))


TOKEN_FILE = "/etc/curvine/token"  # where docs/deploy-gpu-node.md puts the client token
# and the worker token (security.worker_token_file): read by master and worker only
WORKER_TOKEN_FILE = "/etc/curvine/worker-token"
MASTER_AND_WORKER_UNITS = ("curvine-master.service", "curvine-worker.service")
# where docs/deploy-gpu-node.md puts the TLS files (the key 0640 root:curvine)
TLS_FILES = ["/etc/curvine/tls/ca.pem", "/etc/curvine/tls/node.pem", "/etc/curvine/tls/node.key"]

# What each sandboxing setting hides from a service (systemd.exec(5)); ProtectSystem
# (any value) only makes /usr, /boot, /etc... read-only, which leaves them readable.
_HIDDEN_BY = {"ProtectHome": ("/home", "/root", "/run/user"),
              "PrivateTmp": ("/tmp", "/var/tmp")}


def _unreadable_because(unit: dict, path: str = TOKEN_FILE) -> list[str]:
    """The settings of ``unit`` that would keep its daemon from reading ``path``, a
    file mode 0640 root:curvine (empty: none)."""
    svc = lambda key: _values(unit, "Service", key)  # noqa: E731
    under = lambda d: path == d or path.startswith(d.rstrip("/") + "/")  # noqa: E731
    why = []
    for key, dirs in _HIDDEN_BY.items():
        if svc(key) and svc(key)[-1] not in ("false", "no", "read-only") and any(map(under, dirs)):
            why.append(f"{key}={svc(key)[-1]}")
    for key in ("InaccessiblePaths", "TemporaryFileSystem"):
        for value in svc(key):
            for d in value.split():
                d = d.lstrip("-+").split(":")[0]
                if under(d):
                    why.append(f"{key}={value}")
    if svc("RootDirectory") or svc("RootImage"):
        why.append("RootDirectory/RootImage")
    user, group = (svc("User") or ["root"])[-1], (svc("Group") or [""])[-1]
    if user not in ("root", "curvine") and group != "curvine":
        why.append(f"User={user} Group={group}: neither the owner nor the group curvine")
    return why


def test_units_can_read_the_token_and_tls_files():
    """Every daemon reads security.token_file and the security.tls_* files at start (it
    exits 2 if it cannot), master and worker also security.worker_token_file: the
    documented /etc/curvine/token, /etc/curvine/worker-token and /etc/curvine/tls/*
    (the key and tokens 0640 root:curvine) must be readable by each unit's user under
    its sandboxing."""
    for name in UNITS:
        for path in (TOKEN_FILE, *TLS_FILES):
            assert _unreadable_because(_unit(name), path) == [], (name, path)
    for name in MASTER_AND_WORKER_UNITS:
        assert _unreadable_because(_unit(name), WORKER_TOKEN_FILE) == [], name
        assert _values(_unit(name), "Service", "Group") == ["curvine"], name
    # the check sees what would hide the file
    master = _unit("curvine-master.service")
    for change in [{"InaccessiblePaths": ["/etc/curvine"]},
                   {"TemporaryFileSystem": ["/etc:ro"]},
                   {"User": ["nobody"], "Group": ["nogroup"]}]:
        broken = {**master, "Service": {**master["Service"], **change}}
        assert _unreadable_because(broken), change
        assert _unreadable_because(broken, TLS_FILES[-1]), change
    assert _unreadable_because(master, "/root/token") == ["ProtectHome=true"]
    assert _unreadable_because(master, "/tmp/token") == ["PrivateTmp=true"]


def _worker_token_settings(name: str, text: str | None = None) -> list[str]:
    """The settings (KEY=VALUE, comments left out) of a unit that name a worker token."""
    return [f"{key}={value}" for section in _unit(name, text).values()
            for key, values in section.items() for value in values
            if re.search(r"(?i)worker.?token", f"{key}={value}")]


def test_only_master_and_worker_units_name_the_worker_token():
    """The master and worker units say which worker token file they read (and the
    master's worker port); the FUSE unit has no setting, argument or credential for it:
    the mount never needs the file."""
    for name in MASTER_AND_WORKER_UNITS:
        text = open(os.path.join(SYSTEMD, name)).read()
        assert WORKER_TOKEN_FILE in text and "security.worker_token_file" in text, name
        assert "8996" in text and "master.worker_port" in text, name
    fuse = "curvine-fuse@.service"
    assert _worker_token_settings(fuse) == []
    # the check sees a FUSE unit handed the worker token
    text = open(os.path.join(SYSTEMD, fuse)).read()
    for setting in (f"LoadCredential=worker-token:{WORKER_TOKEN_FILE}",
                    "Environment=CURVINE_WORKER_TOKEN=x"):
        broken = text.replace("\n[Service]\n", f"\n[Service]\n{setting}\n", 1)
        assert _worker_token_settings(fuse, broken) == [setting]


DEPLOY_DOC = os.path.join(REPO, "docs", "deploy-gpu-node.md")


def _documented_config() -> str:
    """The config of docs/deploy-gpu-node.md, 2 (its first TOML block)."""
    section = open(DEPLOY_DOC).read().split("## 2. Configure", 1)[1]
    return section.split("```toml\n", 1)[1].split("```", 1)[0]


def _daemon_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "CURVINE_CONF")}


def _start(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run one of the venv's commands to its exit (for daemons that refuse to start)."""
    return subprocess.run([os.path.join(VENV_BIN, argv[0]), *argv[1:]], capture_output=True,
                          text=True, timeout=timeout, env=_daemon_env(),
                          stdin=subprocess.DEVNULL)


_CONFIGURE = """\
import sys
from curvine.common import auth, config
from curvine.common.errors import ConfigError
from curvine.common.security import Security
try:
    Security.load(config.load(sys.argv[1]), role=sys.argv[2])
except (ConfigError, auth.TokenError) as e:
    sys.exit(f"refused: {e}")
"""


def _refusal(role: str, conf) -> str:
    """What a process of ``role`` ("master", "worker", or "client": a mount, the CLI)
    says when it reads ``conf`` and the token files it needs, as each does first at
    start (its own process, as each daemon reads them at its start); "" = it goes on."""
    out = subprocess.run([sys.executable, "-c", _CONFIGURE, str(conf), role],
                         capture_output=True, text=True, timeout=60, env=_daemon_env())
    return (out.stderr.strip() or f"exit {out.returncode}") if out.returncode else ""


def test_documented_config_keeps_the_worker_token_from_the_mount(tmp_path):
    """docs/deploy-gpu-node.md's config names both token files where the units read
    them. Run with stand-in tokens at those paths: a node where the worker token file
    is missing still mounts (curvine-fuse gets past its config and tokens, to the check
    of its mount point), while curvine-master and curvine-worker refuse to start (exit
    2, naming security.worker_token_file), also when the file holds the client token;
    with both files they get past that check."""
    text = _documented_config()
    sec = tomllib.loads(text)["security"]
    assert sec["token_file"] == TOKEN_FILE and sec["worker_token_file"] == WORKER_TOKEN_FILE
    token, worker_token = tmp_path / "token", tmp_path / "worker-token"
    client = auth.write_token_file(str(token))
    for old, new in ((TOKEN_FILE, token), (WORKER_TOKEN_FILE, worker_token)):
        assert text.count(f'"{old}"') == 1, old
        text = text.replace(f'"{old}"', f'"{new}"')
    conf = tmp_path / "curvine.toml"
    conf.write_text(text)
    assert not worker_token.exists()
    mnt = tmp_path / "not-a-mount-point"
    fuse = _start(["curvine-fuse", str(mnt), "--conf", str(conf)])
    assert fuse.returncode == 2 and f"mount point {mnt} is not a directory" in fuse.stderr, \
        fuse.stderr
    assert "worker_token" not in fuse.stderr
    assert _refusal("client", conf) == ""  # the CLI's start too
    daemons = {"master": ["curvine-master", "--conf", str(conf)],
               "worker": ["curvine-worker", "--conf", str(conf)]}
    for argv in daemons.values():
        out = _start(argv)
        assert out.returncode == 2, (argv, out.stderr)
        assert f"security.worker_token_file: cannot read {worker_token}" in out.stderr, \
            out.stderr
    auth.write_token_file(str(worker_token), client)  # the client token again: refused
    for argv in daemons.values():
        out = _start(argv)
        assert out.returncode == 2 and "security.worker_token_file: must hold another token" \
            in out.stderr, (argv, out.stderr)
    auth.write_token_file(str(worker_token))
    for role in daemons:
        assert _refusal(role, conf) == "", role
    # with no worker token file named at all, the message says which key to set
    conf.write_text("\n".join(l for l in text.splitlines()
                              if not l.startswith("worker_token_file")))
    assert "security.worker_token_file: required" in _refusal("worker", conf)
    assert _refusal("client", conf) == ""


def test_fuse_unit_mounts_where_the_host_sees_it():
    u = _unit("curvine-fuse@.service")
    svc = lambda key: _values(u, "Service", key)  # noqa: E731
    # Each of these gives the service its own mount namespace: the mount would be
    # invisible to vLLM on the same node.
    for key in ("ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
                "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths", "TemporaryFileSystem",
                "BindPaths", "ProtectKernelTunables", "ProtectControlGroups", "MountFlags",
                "RootDirectory", "PrivateMounts", "User", "DynamicUser"):
        assert not svc(key), key
    assert svc("ExecStart") == [f"{INSTALLED_BIN}/curvine-fuse %f"]
    assert svc("DevicePolicy") == ["closed"] and svc("DeviceAllow") == ["/dev/fuse rw"]
    assert "CAP_SYS_ADMIN" in svc("CapabilityBoundingSet")[0].split()
    # a dead mount left by a killed daemon is cleared before a start and after a stop
    assert svc("ExecStartPre")[0] == "-/usr/bin/fusermount3 -u -z %f"
    assert svc("ExecStopPost") == ["-/usr/bin/fusermount3 -u -z %f"]
    if shutil.which("systemd-escape"):
        out = subprocess.run(["systemd-escape", "--path", "--template=curvine-fuse@.service",
                              "/mnt/kv"], capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == FUSE_INSTANCE

# -------------------------------------------------------------------------- Kubernetes

K8S_VERSIONS = ["1.28.0", "1.37.0"]  # the oldest still common on managed clusters, the newest
K8S_FILES = ["namespace.yaml", "configmap.yaml", "etcd.yaml", "master.yaml", "daemonset.yaml",
             "example-inference-pod.yaml"]


def _manifests(overrides: dict[str, str] | None = None) -> list[dict]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is a test dependency (pip install -e '.[test]')")
    docs = []
    for name in K8S_FILES:
        text = (overrides or {}).get(name) or open(os.path.join(K8S, name)).read()
        docs += [d for d in yaml.safe_load_all(text) if d is not None]
    return docs


def _schema_errors(docs: list[dict]) -> list[str]:
    kv = pytest.importorskip("kubernetes_validate",
                             reason="kubernetes-validate is a test dependency")
    errors = []
    for version in K8S_VERSIONS:
        for d in docs:
            try:
                kv.validate(d, version, strict=True)
            except kv.ValidationError as e:
                errors.append(f"{version} {d.get('kind')} {d['metadata'].get('name')}: "
                              f"{e.message if hasattr(e, 'message') else str(e).splitlines()[0]}")
    return errors


def _one(docs, kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def _container(pod_spec: dict, name: str) -> dict:
    return next(c for c in pod_spec["containers"] if c["name"] == name)


# [security] keys naming token files -> the Secret each must be, and its key
TOKEN_KEYS = {"token_file": "token", "worker_token_file": "worker-token",
              "master_token_file": "master-token"}
# [security] keys naming TLS files -> the key of the Secret curvine-tls each must be
TLS_KEYS = {"tls_ca": "ca.crt", "tls_cert": "tls.crt", "tls_key": "tls.key"}


def _config_of(docs, tmp_path, tls_dir: str | None = None) -> config.Config:
    """The ConfigMap's curvine.toml through curvine's own loader.  The loader reads the
    token and TLS files it names, which only exist in the pods (the Secrets): for the
    load, stand-in tokens (a client and a worker token) are put at temporary paths,
    and a TLS path is pointed at the file of the same name in ``tls_dir`` (the files
    the TLS Secret is made from; a name the Secret does not hold is a file that does
    not exist there).  The result keeps the paths the pods see."""
    cm = _one(docs, "ConfigMap", "curvine-config")
    text = cm["data"]["curvine.toml"]
    sec = tomllib.loads(text).get("security", {})
    in_pod = {key: sec.get(key, "") for key in (*TOKEN_KEYS, *TLS_KEYS)}
    for key, pod_path in in_pod.items():
        if not pod_path:
            continue
        if key in TOKEN_KEYS:
            stand_in = str(tmp_path / TOKEN_KEYS[key])
            auth.write_token_file(stand_in)
        else:
            assert tls_dir, f"security.{key} is set: the load needs the TLS files"
            stand_in = os.path.join(tls_dir, os.path.basename(pod_path))
        assert text.count(f'"{pod_path}"') == 1, pod_path
        text = text.replace(f'"{pod_path}"', f'"{stand_in}"')
    path = tmp_path / "curvine.toml"
    path.write_text(text)
    cfg = config.load(str(path))  # ConfigError (file:line: key) if the ConfigMap is wrong
    for key, pod_path in in_pod.items():
        setattr(cfg.security, key, pod_path)
    return cfg


def _http_probe_ports(container: dict) -> set:
    """The ports every probe of ``container`` checks (HTTP probes must ask /healthz)."""
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    out = set()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe in container:
            check = container[probe]
            if "tcpSocket" in check:
                port = check["tcpSocket"]["port"]
            else:
                port = check["httpGet"]["port"]
                assert check["httpGet"]["path"] == "/healthz", (container["name"], probe)
            out.add(ports.get(port, port))
    return out


def test_worker_and_fuse_liveness_does_not_depend_on_the_master():
    """Their /healthz reports a master outage; a liveness probe on it would restart the
    FUSE container during one and take the mount away from the inference pods."""
    for doc in _manifests():
        if doc.get("kind") != "DaemonSet":
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            live = c.get("livenessProbe")
            assert live is None or "httpGet" not in live, c["name"]
            assert c["readinessProbe"]["httpGet"]["path"] == "/healthz", c["name"]


def test_manifests_match_the_kubernetes_schema():
    docs = _manifests()
    assert {(d["apiVersion"], d["kind"]) for d in docs} == {
        ("v1", "Namespace"), ("v1", "ConfigMap"), ("v1", "Service"), ("apps/v1", "StatefulSet"),
        ("apps/v1", "DaemonSet"), ("v1", "Pod")}
    assert _schema_errors(docs) == []


def test_schema_check_catches_a_typo():
    text = open(os.path.join(K8S, "daemonset.yaml")).read()
    assert "mountPropagation: Bidirectional" in text
    broken = _manifests({"daemonset.yaml": text.replace("mountPropagation:", "mountPropogation:")})
    errors = _schema_errors(broken)
    assert len(errors) == len(K8S_VERSIONS) and "mountPropogation" in errors[0]


def test_configmap_is_a_valid_config_and_agrees_with_the_manifests(tmp_path):
    docs = _manifests()
    cfg = _config_of(docs, tmp_path)
    namespace = _one(docs, "Namespace")["metadata"]["name"]
    assert all(d["metadata"].get("namespace", namespace) == namespace for d in docs)

    # masters: a group, every member in cluster.master_addrs by its pod's name under
    # the StatefulSet's headless Service, ports from the config; workers reach each
    # member's worker port by the same name (cluster.master_worker_addrs); the group's
    # etcd is the etcd StatefulSet's members, by name
    svc = _one(docs, "Service", "curvine-master")
    assert {p["port"] for p in svc["spec"]["ports"]} == {
        cfg.master.port, cfg.master.worker_port, cfg.master.http_port, cfg.master.call_port}
    assert cfg.master.worker_port not in (cfg.master.port, cfg.master.http_port)
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert svc_ports["worker"]["port"] == cfg.master.worker_port
    assert svc_ports["calls"]["port"] == cfg.master.call_port
    sts = _one(docs, "StatefulSet", "curvine-master")
    assert sts["spec"]["replicas"] == 3
    headless = _one(docs, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == sts["spec"]["template"]["metadata"]["labels"]

    def members(statefulset: dict, service: dict, port: int) -> list[str]:
        return [f"{statefulset['metadata']['name']}-{i}.{service['metadata']['name']}."
                f"{namespace}.svc.cluster.local:{port}"
                for i in range(statefulset["spec"]["replicas"])]

    assert config.master_addrs(cfg) == members(sts, headless, cfg.master.port)
    assert config.master_worker_addrs(cfg) == members(sts, headless, cfg.master.worker_port)
    etcd_sts = _one(docs, "StatefulSet", "curvine-etcd")
    etcd_svc = _one(docs, "Service", etcd_sts["spec"]["serviceName"])
    assert etcd_sts["spec"]["replicas"] == 3 and etcd_svc["spec"]["clusterIP"] == "None"
    client_port = {p["name"]: p["port"] for p in etcd_svc["spec"]["ports"]}["client"]
    assert cfg.master.etcd_endpoints == members(etcd_sts, etcd_svc, client_port)
    etcd_args = " ".join(_container(etcd_sts["spec"]["template"]["spec"], "etcd")["command"])
    for i, peer in enumerate(members(etcd_sts, etcd_svc, 2380)):
        assert f"curvine-etcd-{i}=https://{peer}" in etcd_args
    assert _etcd_tls_problems(docs, cfg) == []
    master = _container(sts["spec"]["template"]["spec"], "master")
    assert {p["containerPort"] for p in master["ports"]} == {
        cfg.master.port, cfg.master.worker_port, cfg.master.http_port, cfg.master.call_port}
    # each Service port leads to the container port of the config's value
    container_ports = {p["name"]: p["containerPort"] for p in master["ports"]}
    for p in svc["spec"]["ports"]:
        assert container_ports[p["targetPort"]] == p["port"], p
    assert _http_probe_ports(master) == {cfg.master.http_port}
    assert cfg.master.host == "0.0.0.0"
    # each member binds its pod IP but advertises its own entry of cluster.master_addrs
    # (its pod's name), so that a standby's NOT_LEADER names an address clients dial;
    # that name is its member id too (one per member, stable across restarts)
    from curvine.master.member import member_address
    from curvine.master.server import parse_args
    fields = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
              for e in master["env"]}
    assert fields["POD_NAME"] == "metadata.name" and fields["POD_IP"] == "status.podIP"
    for i, (addr, worker_addr) in enumerate(zip(config.master_addrs(cfg),
                                                config.master_worker_addrs(cfg))):
        argv = [a.replace("$(POD_NAME)", f"{sts['metadata']['name']}-{i}")
                 .replace("$(POD_IP)", f"10.0.0.{i + 1}") for a in master["args"]]
        args = parse_args(argv)
        assert args.host == f"10.0.0.{i + 1}"
        me = member_address(dataclasses.replace(cfg, master=dataclasses.replace(
            cfg.master, host=args.host, advertise_addr=args.advertise)))
        assert (me.id, me.grpc, me.worker) == (addr, addr, worker_addr)
    # the journal and the LMDB are on the claim's volume, not in the container
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    state = [m for m in master["volumeMounts"] if m["name"] in claims]
    assert len(state) == 1
    for d in (cfg.journal.dir, cfg.master.meta_dir):
        assert d.startswith(state[0]["mountPath"].rstrip("/") + "/"), d
    assert cfg.journal.fsync

    # every container gets the ConfigMap at CURVINE_CONF
    ds = _one(docs, "DaemonSet", "curvine-node")
    pod = ds["spec"]["template"]["spec"]
    for spec, c in [(sts["spec"]["template"]["spec"], master),
                    *[(pod, c) for c in pod["containers"]]]:
        env = {e["name"]: e.get("value") for e in c["env"]}
        conf_dir = os.path.dirname(env["CURVINE_CONF"])
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == conf_dir)
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        assert volume["configMap"]["name"] == "curvine-config"
        assert os.path.basename(env["CURVINE_CONF"]) == "curvine.toml"

    # DaemonSet: GPU nodes, host network, worker and FUSE client side by side
    assert pod["nodeSelector"] and pod["tolerations"]
    assert pod["hostNetwork"] and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    worker, fuse = _container(pod, "worker"), _container(pod, "fuse")
    assert {p["containerPort"] for p in worker["ports"]} == {cfg.worker.port, cfg.worker.data_port,
                                                             cfg.worker.http_port}
    assert _http_probe_ports(worker) == {cfg.worker.http_port}
    assert _http_probe_ports(fuse) == {cfg.fuse.http_port}
    assert worker["args"] == ["--host", "$(NODE_IP)"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    # the NVMe hostPath at worker.data_dirs in both containers (short-circuit needs the
    # same path on both sides)
    for c in (worker, fuse):
        data = next(m for m in c["volumeMounts"] if m["mountPath"] == cfg.worker.data_dirs[0])
        assert "hostPath" in volumes[data["name"]]
    # the FUSE mount is made under a Bidirectional hostPath, by a privileged container
    assert fuse["securityContext"]["privileged"] is True
    bidi = [m for m in fuse["volumeMounts"] if m.get("mountPropagation") == "Bidirectional"]
    assert len(bidi) == 1
    assert cfg.fuse.mountpoint.startswith(bidi[0]["mountPath"].rstrip("/") + "/")
    assert cfg.fuse.mountpoint in " ".join(fuse["args"])
    assert volumes[[m for m in fuse["volumeMounts"] if m["mountPath"] == "/dev/fuse"][0]["name"]][
        "hostPath"]["type"] == "CharDevice"
    assert cfg.fuse.allow_other  # vLLM containers run as other uids

    # the inference pod sees the same host directory, HostToContainer, and LMCache's
    # URL points into the mount
    vllm_pod = _one(docs, "Pod")["spec"]
    vllm = vllm_pod["containers"][0]
    h2c = [m for m in vllm["volumeMounts"] if m.get("mountPropagation") == "HostToContainer"]
    assert len(h2c) == 1
    vol = next(v for v in vllm_pod["volumes"] if v["name"] == h2c[0]["name"])
    assert vol["hostPath"]["path"] == volumes[bidi[0]["name"]]["hostPath"]["path"]
    assert h2c[0]["mountPath"] == bidi[0]["mountPath"]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["LMCACHE_REMOTE_URL"].startswith(f"fs://localhost:0{cfg.fuse.mountpoint}/")
    assert env["PYTHONHASHSEED"] == "0"


def test_the_domain_socket_reaches_pods_without_the_data_dirs(tmp_path):
    """Issue 14: the worker's socket dir is a hostPath of the worker container, the
    inference pod mounts the same host dir at client.domain_socket_dir and nothing of
    the worker's data; the systemd worker unit creates that dir (RuntimeDirectory)."""
    docs = _manifests()
    cfg = _config_of(docs, tmp_path)
    sock_dir = os.path.dirname(cfg.worker.domain_socket)
    assert cfg.worker.domain_socket.endswith(".sock") and cfg.client.domain_socket_dir == sock_dir
    pod = _one(docs, "DaemonSet", "curvine-node")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    worker = _container(pod, "worker")
    mount = next(m for m in worker["volumeMounts"] if m["mountPath"] == sock_dir)
    host_dir = volumes[mount["name"]]["hostPath"]["path"]
    nvme = {volumes[m["name"]]["hostPath"]["path"] for m in worker["volumeMounts"]
            if m["mountPath"] in cfg.worker.data_dirs}
    vllm_pod = _one(docs, "Pod")["spec"]
    vllm_volumes = {v["name"]: v for v in vllm_pod["volumes"]}
    mounted = {m["mountPath"]: vllm_volumes[m["name"]].get("hostPath", {}).get("path")
               for m in vllm_pod["containers"][0]["volumeMounts"]}
    assert mounted.get(cfg.client.domain_socket_dir) == host_dir
    assert not nvme & set(mounted.values()), "the inference pod mounts the worker's data dir"
    assert not any(p in cfg.worker.data_dirs for p in mounted)
    unit = _unit("curvine-worker.service")
    assert config.Config().worker.domain_socket == "/run/curvine/worker.sock"
    assert _values(unit, "Service", "RuntimeDirectory") == ["curvine"]
    assert _values(unit, "Service", "RuntimeDirectoryMode") == ["0755"]


def test_a_bad_configmap_is_caught(tmp_path):
    text = open(os.path.join(K8S, "configmap.yaml")).read()
    assert "    replicas = 1\n" in text
    docs = _manifests({"configmap.yaml": text.replace("    replicas = 1\n", "    replicas = 0\n")})
    with pytest.raises(ConfigError, match=r"curvine\.toml:\d+: cluster\.replicas"):
        _config_of(docs, tmp_path)


TOKEN_SECRET = "curvine-token"  # made by the kustomization from deploy/k8s/token


def _pod_specs(docs) -> list[tuple[str, dict]]:
    out = []
    for d in docs:
        if d["kind"] == "Pod":
            out.append((d["metadata"]["name"], d["spec"]))
        elif d["kind"] in ("StatefulSet", "DaemonSet"):
            out.append((d["metadata"]["name"], d["spec"]["template"]["spec"]))
    return out


def test_every_daemon_mounts_the_token_secret(tmp_path):
    """Every container that gets the ConfigMap (a curvine daemon) also gets the token
    Secret, read-only, at the path the config names, readable by its user and by no
    one else; the inference pod gets neither."""
    docs = _manifests()
    cfg = _config_of(docs, tmp_path)
    token_dir, token_name = os.path.split(cfg.security.token_file)
    assert token_dir and token_name, "the ConfigMap sets no security.token_file"
    daemons = 0
    for pod_name, spec in _pod_specs(docs):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        config_vols = {n for n, v in volumes.items()
                       if v.get("configMap", {}).get("name") == "curvine-config"}
        token_vols = {n for n, v in volumes.items()
                      if v.get("secret", {}).get("secretName") == TOKEN_SECRET}
        for c in spec["containers"]:
            mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
            where = f"{pod_name}/{c['name']}"
            if not config_vols & set(mounts):
                assert not token_vols & set(mounts), f"{where} is no daemon but gets the token"
                continue
            daemons += 1
            [m] = [mounts[n] for n in token_vols & set(mounts)] or [None]
            assert m is not None, f"{where} mounts the config but not the token Secret"
            assert m["mountPath"] == token_dir and m.get("readOnly") is True, where
            assert "subPath" not in m, where
            secret = volumes[m["name"]]["secret"]
            # the key is required (a Secret without it keeps the pod from starting)
            assert secret["items"] == [{"key": "token", "path": token_name}], where
            mode = secret.get("defaultMode", 0o644)
            assert mode & 0o007 == 0, f"{where}: token readable by others ({mode:o})"
            user = (c.get("securityContext", {}).get("runAsUser")
                    or spec.get("securityContext", {}).get("runAsUser") or 0)
            if user != 0:  # not root: it reads the file through the pod's fsGroup
                assert spec["securityContext"].get("fsGroup") and mode & 0o040, where
    assert daemons == 3  # master, worker, fuse


WORKER_TOKEN_SECRET = "curvine-worker-token"  # made by the kustomization from deploy/k8s/worker-token
# the only containers that may read the worker token: whoever holds it can register
# fake workers (never the FUSE container, whose mount inference pods use, nor those pods)
WORKER_TOKEN_HOLDERS = {"curvine-master/master", "curvine-node/worker"}
MASTER_TOKEN_SECRET = "curvine-master-token"  # from deploy/k8s/master-token
# the only containers that may read the master token: whoever holds it can fetch a
# master's checkpoint, the whole namespace (FetchCheckpoint)
MASTER_TOKEN_HOLDERS = {"curvine-master/master"}


def _containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def _secrets_seen(spec: dict, c: dict) -> set[str]:
    """The Secrets container ``c`` of the pod ``spec`` can read: through its volume
    mounts (secret and projected volumes), env and envFrom."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    seen = set()
    for m in c.get("volumeMounts", []):
        v = volumes.get(m["name"], {})
        if "secret" in v:
            seen.add(v["secret"]["secretName"])
        seen.update(src["secret"]["name"] for src in v.get("projected", {}).get("sources", [])
                    if "secret" in src)
    seen.update(e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", [])
                if "secretKeyRef" in e.get("valueFrom", {}))
    seen.update(e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e)
    return seen


def _worker_token_problems(docs, cfg: config.Config) -> list[str]:
    """What is wrong with where the worker token goes ([] = nothing): the Secret is
    mounted read-only where security.worker_token_file points (its own directory, not
    the client token's), readable by its user and by no one else, in the master's and
    the workers' containers; no other container (the FUSE client, an inference pod)
    can read it in any way."""
    return _token_secret_problems(docs, cfg, "worker_token_file", WORKER_TOKEN_SECRET,
                                  WORKER_TOKEN_HOLDERS, "worker token")


def _master_token_problems(docs, cfg: config.Config) -> list[str]:
    """The same for the master token (security.master_token_file, the Secret
    curvine-master-token): in the master containers only."""
    return _token_secret_problems(docs, cfg, "master_token_file", MASTER_TOKEN_SECRET,
                                  MASTER_TOKEN_HOLDERS, "master token")


def _token_secret_problems(docs, cfg: config.Config, key: str, secret_name: str,
                           allowed: set[str], what: str) -> list[str]:
    """What is wrong with where the token of ``security.<key>`` (the Secret
    ``secret_name``, its key the file's name in TOKEN_KEYS) goes: mounted read-only
    where the key points (its own directory, not the client token's), readable by its
    user and by no one else, in the containers ``allowed``; no other container can
    read it in any way."""
    path = getattr(cfg.security, key)
    wdir, wname = os.path.split(path)
    item = TOKEN_KEYS[key]
    if not (wdir and wname):
        return [f"the ConfigMap sets no security.{key}"]
    if wdir == os.path.dirname(cfg.security.token_file):
        return [f"security.{key} {path} is in the "
                "client token's directory (where the client token Secret is mounted)"]
    problems, holders = [], set()
    for pod_name, spec in _pod_specs(docs):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in _containers(spec):
            where = f"{pod_name}/{c['name']}"
            if secret_name not in _secrets_seen(spec, c):
                continue
            holders.add(where)
            if where not in allowed:
                problems.append(f"{where} can read the {what}")
                continue
            mounts = [m for m in c.get("volumeMounts", []) if volumes.get(m["name"], {}).get(
                "secret", {}).get("secretName") == secret_name]
            if len(mounts) != 1:
                problems.append(f"{where}: {len(mounts)} mounts of the {what} Secret")
                continue
            [m] = mounts
            if m["mountPath"] != wdir or "subPath" in m:
                problems.append(f"{where}: the {what} at {m['mountPath']} "
                                f"{m.get('subPath', '')}, the config names {wdir}")
            if m.get("readOnly") is not True:
                problems.append(f"{where}: the {what} is not mounted read-only")
            secret = volumes[m["name"]]["secret"]
            # the key is required (a Secret without it keeps the pod from starting)
            if secret.get("items") != [{"key": item, "path": wname}]:
                problems.append(f"{where}: items {secret.get('items')}, not the Secret's key "
                                f"{item} at {wname}")
            mode = secret.get("defaultMode", 0o644)
            if mode & 0o007:
                problems.append(f"{where}: {what} readable by others ({mode:o})")
            user = (c.get("securityContext", {}).get("runAsUser")
                    or spec.get("securityContext", {}).get("runAsUser") or 0)
            if user != 0 and not (spec.get("securityContext", {}).get("fsGroup")
                                  and mode & 0o040):
                problems.append(f"{where}: uid {user} cannot read the {what} ({mode:o})")
    problems += [f"{where} does not get the {what}" for where in sorted(allowed - holders)]
    return problems


def test_worker_token_goes_to_the_master_and_the_workers_only(tmp_path):
    """The worker token Secret is mounted read-only, where security.worker_token_file
    points, into the master's and the worker's containers, and can be read by no other
    container: not the FUSE client's, not the inference pod's (which gets no Secret at
    all)."""
    docs = _manifests()
    cfg = _config_of(docs, tmp_path)
    assert cfg.security.worker_token_file and cfg.security.token_file
    assert _worker_token_problems(docs, cfg) == []
    pod = _one(docs, "DaemonSet", "curvine-node")["spec"]["template"]["spec"]
    assert _secrets_seen(pod, _container(pod, "fuse")) == {TOKEN_SECRET}
    vllm = _one(docs, "Pod")["spec"]
    assert [_secrets_seen(vllm, c) for c in _containers(vllm)] == [set()]


# the worker token's manifests broken one way each: (file, old, new, what catches it)
WORKER_TOKEN_BROKEN = {
    "fuse mounts it": ("daemonset.yaml",
                       "            - {name: nvme, mountPath: /var/lib/curvine/data}\n"
                       "            - {name: mnt,",
                       "            - {name: worker-token, mountPath: /etc/curvine-worker-token,"
                       " readOnly: true}\n"
                       "            - {name: nvme, mountPath: /var/lib/curvine/data}\n"
                       "            - {name: mnt,", "curvine-node/fuse can read the worker token"),
    "inference pod env": ("example-inference-pod.yaml",
                          '        - {name: PYTHONHASHSEED, value: "0"}\n',
                          '        - {name: PYTHONHASHSEED, value: "0"}\n'
                          "        - name: CURVINE_WORKER_TOKEN\n          valueFrom: "
                          "{secretKeyRef: {name: curvine-worker-token, key: worker-token}}\n",
                          "vllm-example/vllm can read the worker token"),
    "worker lacks it": ("daemonset.yaml",
                        "            - {name: worker-token, mountPath: /etc/curvine-worker-token,"
                        " readOnly: true}\n", "",
                        "curvine-node/worker does not get the worker token"),
    "writable": ("master.yaml", "{name: worker-token, mountPath: /etc/curvine-worker-token, "
                 "readOnly: true}", "{name: worker-token, mountPath: /etc/curvine-worker-token, "
                 "readOnly: false}", "curvine-master/master: the worker token is not mounted "
                 "read-only"),
    "master cannot read": ("master.yaml", "items: [{key: worker-token, path: worker-token}]\n"
                           "            defaultMode: 0440", "items: [{key: worker-token, path: "
                           "worker-token}]\n            defaultMode: 0400",
                           "curvine-master/master: uid 10001 cannot read the worker token"),
    "readable by others": ("daemonset.yaml", "items: [{key: worker-token, path: worker-token}]\n"
                           "            defaultMode: 0400", "items: [{key: worker-token, path: "
                           "worker-token}]\n            defaultMode: 0404",
                           "curvine-node/worker: worker token readable by others"),
    "wrong key": ("master.yaml", "items: [{key: worker-token, path: worker-token}]",
                  "items: [{key: token, path: worker-token}]",
                  "curvine-master/master: items"),
    "beside the client token": ("configmap.yaml", '"/etc/curvine-worker-token/worker-token"',
                                '"/etc/curvine-token/worker-token"',
                                "is in the client token's directory"),
}


@pytest.mark.parametrize("case", sorted(WORKER_TOKEN_BROKEN))
def test_worker_token_checks_catch_a_broken_manifest(tmp_path, case):
    name, old, new, caught = WORKER_TOKEN_BROKEN[case]
    text = open(os.path.join(K8S, name)).read()
    assert text.count(old) == 1, (name, old)
    docs = _manifests({name: text.replace(old, new)})
    problems = _worker_token_problems(docs, _config_of(docs, tmp_path))
    assert any(caught in p for p in problems), problems


def test_master_token_goes_to_the_masters_only(tmp_path):
    """The master token Secret is mounted read-only, where security.master_token_file
    points, into the master containers, and can be read by no other container: not
    the worker's (every GPU node has one), not the FUSE client's, not an inference
    pod's."""
    docs = _manifests()
    cfg = _config_of(docs, tmp_path)
    assert cfg.security.master_token_file
    assert _master_token_problems(docs, cfg) == []
    pod = _one(docs, "DaemonSet", "curvine-node")["spec"]["template"]["spec"]
    assert MASTER_TOKEN_SECRET not in _secrets_seen(pod, _container(pod, "worker"))


# the master token's manifests broken one way each: (file, old, new, what catches it)
MASTER_TOKEN_BROKEN = {
    "worker mounts it": ("daemonset.yaml",
                         "            - {name: worker-token, mountPath: /etc/curvine-worker-token,"
                         " readOnly: true}\n",
                         "            - {name: worker-token, mountPath: /etc/curvine-worker-token,"
                         " readOnly: true}\n"
                         "            - {name: mt, mountPath: /etc/curvine-master-token}\n",
                         None),  # its volume added below
    "master lacks it": ("master.yaml",
                        "            - {name: master-token, mountPath: /etc/curvine-master-token,"
                        " readOnly: true}\n", "",
                        "curvine-master/master does not get the master token"),
    "writable": ("master.yaml", "{name: master-token, mountPath: /etc/curvine-master-token, "
                 "readOnly: true}", "{name: master-token, mountPath: /etc/curvine-master-token, "
                 "readOnly: false}", "curvine-master/master: the master token is not mounted "
                 "read-only"),
    "wrong key": ("master.yaml", "items: [{key: master-token, path: master-token}]",
                  "items: [{key: worker-token, path: master-token}]",
                  "curvine-master/master: items"),
    "readable by others": ("master.yaml", "items: [{key: master-token, path: master-token}]\n"
                           "            defaultMode: 0440", "items: [{key: master-token, "
                           "path: master-token}]\n            defaultMode: 0444",
                           "curvine-master/master: master token readable by others"),
}


@pytest.mark.parametrize("case", sorted(MASTER_TOKEN_BROKEN))
def test_master_token_checks_catch_a_broken_manifest(tmp_path, case):
    name, old, new, caught = MASTER_TOKEN_BROKEN[case]
    text = open(os.path.join(K8S, name)).read()
    assert text.count(old) == 1, (name, old)
    docs = _manifests({name: text.replace(old, new)})
    if caught is None:
        pod = _one(docs, "DaemonSet", "curvine-node")["spec"]["template"]["spec"]
        pod["volumes"].append({"name": "mt", "secret": {"secretName": MASTER_TOKEN_SECRET}})
        caught = "curvine-node/worker can read the master token"
    problems = _master_token_problems(docs, _config_of(docs, tmp_path))
    assert any(caught in p for p in problems), problems


def _daemon_role(c: dict) -> str:
    """The role of the curvine daemon container ``c`` runs ("" = none)."""
    command = " ".join([*c.get("command", []), *c.get("args", [])])
    for name, role in (("curvine-master", "master"), ("curvine-worker", "worker"),
                       ("curvine-fuse", "client")):
        if name in command:
            return role
    return ""


def _view_of(docs, directory, spec: dict, c: dict) -> str:
    """The ConfigMap's curvine.toml as the container ``c`` of the pod ``spec`` has it,
    written in ``directory``: each token file the config names is a stand-in holding
    the token of the Secret the container mounts there (STAND_IN_TOKEN,
    STAND_IN_WORKER_TOKEN, STAND_IN_MASTER_TOKEN), or, where it mounts none, a path that
    does not exist."""
    directory.mkdir()
    text = _one(docs, "ConfigMap", "curvine-config")["data"]["curvine.toml"]
    sec = tomllib.loads(text).get("security", {})
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    tokens = {TOKEN_SECRET: STAND_IN_TOKEN, WORKER_TOKEN_SECRET: STAND_IN_WORKER_TOKEN,
              MASTER_TOKEN_SECRET: STAND_IN_MASTER_TOKEN}
    for key in TOKEN_KEYS:
        pod_path = sec.get(key, "")
        if not pod_path:
            continue
        stand_in = directory / "absent" / os.path.basename(pod_path)  # no such file
        for m in c.get("volumeMounts", []):
            secret = volumes.get(m["name"], {}).get("secret")
            if (secret and m["mountPath"] == os.path.dirname(pod_path) and
                    os.path.basename(pod_path) in {i["path"] for i in secret.get("items", [])}):
                stand_in = directory / os.path.basename(pod_path)
                auth.write_token_file(str(stand_in), tokens.get(secret["secretName"]))
        assert text.count(f'"{pod_path}"') == 1, pod_path
        text = text.replace(f'"{pod_path}"', f'"{stand_in}"')
    path = directory / "curvine.toml"
    path.write_text(text)
    return str(path)


def test_each_daemon_container_has_the_tokens_its_daemon_needs(tmp_path):
    """Each daemon container's view of the config (stand-ins for the token Secrets it
    mounts, nothing where it mounts none), read the way its daemon reads it at start:
    the master and the worker accept theirs; the FUSE container has no worker token
    file (a worker in its place would refuse to start) and curvine-fuse gets past its
    config and tokens anyway, to the check of its mount point."""
    docs = _manifests()
    roles = {}
    for pod_name, spec in _pod_specs(docs):
        for c in spec["containers"]:
            role = _daemon_role(c)
            if not role:
                continue
            where = f"{pod_name}/{c['name']}"
            roles[where] = role
            view = _view_of(docs, tmp_path / where.replace("/", "-"), spec, c)
            assert _refusal(role, view) == "", where
            if role == "client":
                assert "security.worker_token_file: cannot read" in _refusal("worker", view)
                mnt = tmp_path / "not-a-mount-point"
                fuse = _start(["curvine-fuse", str(mnt), "--conf", view])
                assert fuse.returncode == 2, fuse.stderr
                assert f"mount point {mnt} is not a directory" in fuse.stderr, fuse.stderr
    assert roles == {"curvine-master/master": "master", "curvine-node/worker": "worker",
                     "curvine-node/fuse": "client"}
    # the check sees a worker container without the worker token
    text = open(os.path.join(K8S, "daemonset.yaml")).read()
    old = ("            - {name: worker-token, mountPath: /etc/curvine-worker-token,"
           " readOnly: true}\n")
    assert text.count(old) == 1
    docs = _manifests({"daemonset.yaml": text.replace(old, "")})
    pod = _one(docs, "DaemonSet", "curvine-node")["spec"]["template"]["spec"]
    view = _view_of(docs, tmp_path / "broken", pod, _container(pod, "worker"))
    assert "security.worker_token_file: cannot read" in _refusal("worker", view)


# the Secrets of etcd's certificates (etcd.yaml): key in the Secret -> its file in
# deploy/k8s/etcd-tls/ (kustomization.yaml)
ETCD_TLS_FILES = {
    "curvine-etcd-server": {"tls.crt": "server.crt", "tls.key": "server.key", "ca.crt": "ca.crt"},
    "curvine-etcd-client": {"tls.crt": "master.crt", "tls.key": "master.key", "ca.crt": "ca.crt"},
}
# master.etcd_* -> the key of the Secret curvine-etcd-client each must be
ETCD_CLIENT_KEYS = {"etcd_ca_file": "ca.crt", "etcd_cert_file": "tls.crt",
                    "etcd_key_file": "tls.key"}


def _stand_in_etcd_tls(k8s_dir) -> None:
    """Stand-ins for the files etcd's Secrets are made from (kustomize only copies them)."""
    for files in ETCD_TLS_FILES.values():
        for file in files.values():
            path = os.path.join(k8s_dir, "etcd-tls", file)
            with open(path, "w") as f:
                f.write(f"stand-in {file}\n")


def _etcd_tls_problems(docs, cfg: config.Config) -> list[str]:
    """What keeps etcd from running with TLS and client certificates, the masters from
    reaching it, or its credentials from staying with etcd and the masters ([] =
    nothing): etcd's flags name the files of its Secret, mounted read-only; the
    masters' master.etcd_* name the files of theirs, mounted read-only in the master
    container only; no other container gets either; probes use the plaintext metrics
    port."""
    problems = []
    server, client = ETCD_TLS_FILES
    etcd_sts = _one(docs, "StatefulSet", "curvine-etcd")
    spec = etcd_sts["spec"]["template"]["spec"]
    etcd = _container(spec, "etcd")
    args = etcd["command"]
    flags = dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)
    for flag in ("--client-cert-auth", "--peer-client-cert-auth"):
        if flag not in args:
            problems.append(f"etcd runs without {flag}")
    for flag in ("--listen-client-urls", "--advertise-client-urls", "--listen-peer-urls",
                 "--initial-advertise-peer-urls"):
        if not flags.get(flag, "").startswith("https://"):
            problems.append(f"etcd {flag} is not https: {flags.get(flag)}")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = [m for m in etcd.get("volumeMounts", [])
              if volumes.get(m["name"], {}).get("secret", {}).get("secretName") == server]
    if len(mounts) != 1 or mounts[0].get("readOnly") is not True:
        problems.append(f"etcd: {len(mounts)} read-only mounts of the Secret {server}")
    else:
        items = {i["path"]: i["key"] for i in volumes[mounts[0]["name"]]["secret"]["items"]}
        for flag, key in (("--cert-file", "tls.crt"), ("--key-file", "tls.key"),
                          ("--trusted-ca-file", "ca.crt"), ("--peer-cert-file", "tls.crt"),
                          ("--peer-key-file", "tls.key"), ("--peer-trusted-ca-file", "ca.crt")):
            path = flags.get(flag, "")
            if (os.path.dirname(path) != mounts[0]["mountPath"]
                    or items.get(os.path.basename(path)) != key):
                problems.append(f"etcd {flag}={path} is not the Secret's {key}")
    for probe in ("readinessProbe", "livenessProbe"):
        check = etcd.get(probe, {})
        port = (check.get("httpGet") or check.get("tcpSocket") or {}).get("port")
        if port != "metrics" or not flags.get("--listen-metrics-urls", "").startswith("http://"):
            problems.append(f"etcd {probe} is not on the plaintext metrics port")
    m = cfg.master
    paths = {key: getattr(m, key) for key in ETCD_CLIENT_KEYS}
    if not all(paths.values()) or len({os.path.dirname(p) for p in paths.values()}) != 1:
        return problems + [f"master: etcd TLS keys not all set, in one directory: {paths}"]
    etcd_dir = os.path.dirname(paths["etcd_ca_file"])
    for pod_name, pod in _pod_specs(docs):
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            where = f"{pod_name}/{c['name']}"
            for mount in c.get("volumeMounts", []):
                name = vols.get(mount["name"], {}).get("secret", {}).get("secretName")
                if name == server and c is not etcd:
                    problems.append(f"{where} gets etcd's own certificate")
                if name != client:
                    continue
                if pod_name != "curvine-master" or c["name"] != "master":
                    problems.append(f"{where} gets the masters' etcd certificate")
                    continue
                secret = vols[mount["name"]]["secret"]
                items = {i["path"]: i["key"] for i in secret["items"]}
                if mount["mountPath"] != etcd_dir or mount.get("readOnly") is not True:
                    problems.append(f"{where}: {client} at {mount['mountPath']}, the config "
                                    f"names {etcd_dir} (read-only)")
                for key, want in ETCD_CLIENT_KEYS.items():
                    if items.get(os.path.basename(paths[key])) != want:
                        problems.append(f"{where}: master.{key} {paths[key]} is not the "
                                        f"Secret's {want}")
                if secret.get("defaultMode", 0o644) & 0o007:
                    problems.append(f"{where}: etcd client key readable by others")
    master_pod = _one(docs, "StatefulSet", "curvine-master")["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in master_pod.get("volumes", [])}
    if not any(vols.get(mnt["name"], {}).get("secret", {}).get("secretName") == client
               for mnt in _container(master_pod, "master").get("volumeMounts", [])):
        problems.append(f"curvine-master/master does not mount {client}")
    return problems


@pytest.mark.parametrize("name, old, new, problem", [
    ("etcd.yaml", "            - --client-cert-auth\n", "", "without --client-cert-auth"),
    ("etcd.yaml", "--listen-client-urls=https://", "--listen-client-urls=http://",
     "--listen-client-urls is not https"),
    ("etcd.yaml", "--trusted-ca-file=/etc/etcd-tls/ca.crt",
     "--trusted-ca-file=/etc/etcd-tls/tls.crt", "is not the Secret's ca.crt"),
    ("etcd.yaml", "httpGet: {path: /health, port: metrics}",
     "httpGet: {path: /health, port: client}",
     "readinessProbe is not on the plaintext metrics port"),
    ("master.yaml", "{name: etcd-tls, mountPath: /etc/curvine-etcd, readOnly: true}",
     "{name: etcd-tls, mountPath: /etc/curvine-etcd}", "(read-only)"),
    ("master.yaml",
     "            - {name: etcd-tls, mountPath: /etc/curvine-etcd, readOnly: true}\n", "",
     "does not mount curvine-etcd-client"),
    ("daemonset.yaml", "      volumes:\n",
     "      volumes:\n        - {name: etcdx, secret: {secretName: curvine-etcd-client}}\n",
     None),  # mounted in the worker below
])
def test_etcd_tls_checks_catch_a_broken_manifest(tmp_path, name, old, new, problem):
    text = open(os.path.join(K8S, name)).read()
    assert text.count(old) == 1, (name, old)
    docs = _manifests({name: text.replace(old, new)})
    if problem is None:
        pod = _one(docs, "DaemonSet", "curvine-node")["spec"]["template"]["spec"]
        _container(pod, "worker")["volumeMounts"].append({"name": "etcdx", "mountPath": "/x"})
        problem = "curvine-node/worker gets the masters' etcd certificate"
    found = _etcd_tls_problems(docs, _config_of(docs, tmp_path))
    assert any(problem in p for p in found), found


def _kustomize(directory) -> subprocess.CompletedProcess:
    # kubectl builds the kustomization offline (apply --dry-run needs an API server)
    return subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True,
                          text=True, timeout=120)


def test_kustomization_lists_the_cluster_manifests(tmp_path):
    yaml = pytest.importorskip("yaml")
    k = yaml.safe_load(open(os.path.join(K8S, "kustomization.yaml")))
    assert k["resources"] == [f for f in K8S_FILES if f != "example-inference-pod.yaml"]
    # three Secrets, each from its own file: the client, the worker and the master
    # token; two of etcd's certificates (etcd's own, the masters' client one), with the
    # etcd CA
    gens = {g["name"]: g for g in k["secretGenerator"]}
    assert len(gens) == len(k["secretGenerator"]) == 5
    assert {name: g["files"] for name, g in gens.items()} == {
        TOKEN_SECRET: ["token"], WORKER_TOKEN_SECRET: ["worker-token"],
        MASTER_TOKEN_SECRET: ["master-token"],
        **{name: [f"{key}=etcd-tls/{file}" for key, file in files.items()]
           for name, files in ETCD_TLS_FILES.items()}}
    for g in gens.values():
        assert g["options"]["disableNameSuffixHash"] is True  # the names the pods mount
    # the token files are never committed
    if shutil.which("git") and os.path.isdir(os.path.join(REPO, ".git")):
        for path in ("deploy/k8s/token", "deploy/k8s/worker-token", "deploy/k8s/master-token",
                     *{f"deploy/k8s/etcd-tls/{file}" for files in ETCD_TLS_FILES.values()
                       for file in files.values()}):
            ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, timeout=30)
            assert ignored.returncode == 0, f"{path} is not ignored by git"
            tracked = subprocess.run(["git", "ls-files", path], cwd=REPO,
                                     capture_output=True, text=True, timeout=30)
            assert tracked.stdout == "", f"a token file is committed: {path}"
    if shutil.which("kubectl") is None:
        return
    work = tmp_path / "k8s"
    shutil.copytree(K8S, work, ignore=shutil.ignore_patterns("token", "worker-token",
                                                             "master-token", "*.crt", "*.key"))
    # without either token file there is nothing to apply: no default token
    out = _kustomize(work)
    assert out.returncode != 0 and "token" in out.stderr
    token = auth.write_token_file(str(work / "token"))
    out = _kustomize(work)
    assert out.returncode != 0 and "worker-token" in out.stderr
    worker_token = auth.write_token_file(str(work / "worker-token"))
    out = _kustomize(work)
    assert out.returncode != 0 and "master-token" in out.stderr
    master_token = auth.write_token_file(str(work / "master-token"))
    # nor without etcd's certificates: etcd takes TLS with client certificates only
    out = _kustomize(work)
    assert out.returncode != 0 and "etcd-tls" in out.stderr
    _stand_in_etcd_tls(work)
    out = _kustomize(work)
    assert out.returncode == 0, out.stderr
    built = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(d["kind"] for d in built) == sorted(
        [d["kind"] for d in _manifests() if d["kind"] != "Pod"] + ["Secret"] * 5)
    for name, key, value in ((TOKEN_SECRET, "token", token),
                             (WORKER_TOKEN_SECRET, "worker-token", worker_token),
                             (MASTER_TOKEN_SECRET, "master-token", master_token)):
        secret = _one(built, "Secret", name)
        assert secret["metadata"]["namespace"] == _one(built, "Namespace")["metadata"]["name"]
        assert list(secret["data"]) == [key]
        assert base64.b64decode(secret["data"][key]).decode().strip() == value
        assert _schema_errors([secret]) == []
    # what the pods mount is what the kustomization makes, and as built the worker
    # token still goes where the manifests say
    for _, spec in _pod_specs(built):
        for v in spec.get("volumes", []):
            if "secret" in v:
                assert v["secret"]["secretName"] in (TOKEN_SECRET, WORKER_TOKEN_SECRET,
                                                     MASTER_TOKEN_SECRET,
                                                     *ETCD_TLS_FILES)
    for name in ETCD_TLS_FILES:
        secret = _one(built, "Secret", name)
        assert secret["type"] == "kubernetes.io/tls"
        assert sorted(secret["data"]) == ["ca.crt", "tls.crt", "tls.key"]
    cfg = _config_of(built, tmp_path)
    assert _worker_token_problems(built, cfg) == []
    assert _master_token_problems(built, cfg) == []
    assert _etcd_tls_problems(built, cfg) == []


# ------------------------------------------------------- Kubernetes: TLS (opt-in Component)

TLS_SECRET = "curvine-tls"  # made by the Component deploy/k8s/tls from its three files
TLS_COMPONENT = os.path.join(K8S, "tls")
STAND_IN_TOKEN = auth.new_token()  # one for every build here, so that builds compare
STAND_IN_WORKER_TOKEN = auth.new_token()  # and the worker token's stand-in
STAND_IN_MASTER_TOKEN = auth.new_token()  # and the master token's
needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None,
                                   reason="kubectl is not installed (kubectl kustomize)")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> str:
    """A directory with stand-ins for the files the TLS Secret is made from: a fresh CA
    and a certificate with its key (curvine local's, made by openssl), under the
    Secret's key names."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    from curvine.devtools.local import make_tls_files
    made = make_tls_files(str(tmp_path_factory.mktemp("pki")), days=1)
    d = tmp_path_factory.mktemp("tls")
    for key, name in TLS_KEYS.items():
        shutil.copy(made[key], d / name)
    return str(d)


def _tls_build(tmp_path, tls_files: str, edits: dict[str, tuple[str, str]] | None = None,
               missing: str | None = None) -> subprocess.CompletedProcess:
    """``kubectl kustomize`` of an overlay of deploy/k8s with the TLS Component, as
    docs/kubernetes.md says to write it (outside deploy/k8s), over a copy of deploy/k8s
    with stand-in tokens and the stand-in TLS files.  ``edits``: {file under
    deploy/k8s: (old, new)} to break the copy; ``missing``: a TLS file left out."""
    work = tmp_path / f"build{len(list(tmp_path.glob('build*')))}"
    shutil.copytree(K8S, work / "k8s", ignore=shutil.ignore_patterns(
        "token", "worker-token", "master-token", *TLS_KEYS.values()))
    _stand_in_etcd_tls(work / "k8s")
    auth.write_token_file(str(work / "k8s" / "token"), STAND_IN_TOKEN)
    auth.write_token_file(str(work / "k8s" / "worker-token"), STAND_IN_WORKER_TOKEN)
    auth.write_token_file(str(work / "k8s" / "master-token"), STAND_IN_MASTER_TOKEN)
    for name in TLS_KEYS.values():
        if name != missing:
            shutil.copy(os.path.join(tls_files, name), work / "k8s" / "tls" / name)
    for name, (old, new) in (edits or {}).items():
        f = work / "k8s" / name
        text = f.read_text()
        assert text.count(old) == 1, (name, old)
        f.write_text(text.replace(old, new))
    (work / "overlay").mkdir()
    (work / "overlay" / "kustomization.yaml").write_text(
        "resources: [../k8s]\ncomponents: [../k8s/tls]\n")
    return _kustomize(work / "overlay")


def _tls_docs(tmp_path, tls_files: str, **kw) -> list[dict]:
    yaml = pytest.importorskip("yaml")
    out = _tls_build(tmp_path, tls_files, **kw)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _tls_problems(docs, cfg: config.Config) -> list[str]:
    """What keeps the built manifests from running with mutual TLS ([] = nothing): the
    config's TLS keys, the Secret, and in every pod each container given the ConfigMap
    (a daemon) mounting the Secret read-only where the config's paths point, readable by
    its user and nobody else; no other container gets it."""
    sec = cfg.security
    problems = []
    paths = {key: getattr(sec, key) for key in TLS_KEYS}
    if not all(paths.values()):
        return [f"security: not all of {', '.join(TLS_KEYS)} set ({paths})"]
    tls_dir = {os.path.dirname(p) for p in paths.values()}
    if len(tls_dir) != 1:
        return [f"security: the TLS files are not in one directory (one Secret): {paths}"]
    [tls_dir] = tls_dir
    if sec.tls_client_auth is not True:
        problems.append("security.tls_client_auth is not true (mutual TLS)")
    # the name docs/kubernetes.md says the certificate carries: the master's Service
    service = [f"{d['metadata']['name']}.{d['metadata']['namespace']}.svc.cluster.local"
               for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "curvine-master"]
    if [sec.tls_server_name] != service:
        problems.append(f"security.tls_server_name {sec.tls_server_name!r} is not the "
                        f"master Service's name {service}")
    secrets = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == TLS_SECRET]
    if len(secrets) != 1:
        problems.append(f"{len(secrets)} Secrets {TLS_SECRET}")
    elif (secrets[0].get("type") != "kubernetes.io/tls"
          or set(secrets[0].get("data", {})) != set(TLS_KEYS.values())):
        problems.append(f"Secret {TLS_SECRET}: type {secrets[0].get('type')}, "
                        f"keys {sorted(secrets[0].get('data', {}))}")
    daemons = 0
    for pod_name, spec in _pod_specs(docs):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        config_vols = {n for n, v in volumes.items()
                       if v.get("configMap", {}).get("name") == "curvine-config"}
        tls_vols = {n for n, v in volumes.items()
                    if v.get("secret", {}).get("secretName") == TLS_SECRET}
        for c in spec["containers"]:
            where = f"{pod_name}/{c['name']}"
            mounts = [m for m in c.get("volumeMounts", []) if m["name"] in tls_vols]
            if not config_vols & {m["name"] for m in c.get("volumeMounts", [])}:
                if mounts:
                    problems.append(f"{where} is no daemon but gets the TLS Secret")
                continue
            daemons += 1
            if len(mounts) != 1:
                problems.append(f"{where}: {len(mounts)} mounts of the TLS Secret")
                continue
            [m] = mounts
            if m["mountPath"] != tls_dir or "subPath" in m:
                problems.append(f"{where}: the TLS Secret at {m['mountPath']} "
                                f"{m.get('subPath', '')}, the config names {tls_dir}")
            if m.get("readOnly") is not True:
                problems.append(f"{where}: the TLS Secret is not mounted read-only")
            secret = volumes[m["name"]]["secret"]
            # each path the config names is the Secret's key for it; items: a Secret
            # without one of them keeps the pod from starting
            items = {i["path"]: i["key"] for i in secret.get("items", [])}
            for key, want in TLS_KEYS.items():
                if items.get(os.path.basename(paths[key])) != want:
                    problems.append(f"{where}: security.{key} {paths[key]} is not the "
                                    f"Secret's {want} (items {items})")
            mode = secret.get("defaultMode", 0o644)
            if mode & 0o007:
                problems.append(f"{where}: TLS files readable by others ({mode:o})")
            user = (c.get("securityContext", {}).get("runAsUser")
                    or spec.get("securityContext", {}).get("runAsUser") or 0)
            if user != 0 and not (spec["securityContext"].get("fsGroup") and mode & 0o040):
                problems.append(f"{where}: uid {user} cannot read the TLS files ({mode:o})")
    if daemons != 3:  # master, worker, fuse
        problems.append(f"{daemons} daemon containers, not 3")
    return problems


@needs_kubectl
def test_tls_component_mounts_its_secret_where_the_config_points(tmp_path, tls_files):
    """The TLS variant, built as documented: the config (loaded by curvine's loader,
    which reads the stand-in certificate, key and CA and checks they fit) turns on
    mutual TLS, and the master, worker and FUSE containers mount the Secret read-only
    at the paths it names; the objects pass the schema."""
    docs = _tls_docs(tmp_path, tls_files)
    cfg = _config_of(docs, tmp_path, tls_files)
    assert cfg.security.tls_ca and cfg.security.tls_client_auth
    assert _tls_problems(docs, cfg) == []
    assert _worker_token_problems(docs, cfg) == []  # still the master's and workers' only
    assert _master_token_problems(docs, cfg) == []  # and the masters' alone
    secret = _one(docs, "Secret", TLS_SECRET)
    assert secret["metadata"]["namespace"] == _one(docs, "Namespace")["metadata"]["name"]
    for name in TLS_KEYS.values():  # what the pods get is what the files hold
        assert base64.b64decode(secret["data"][name]) == open(os.path.join(tls_files, name),
                                                              "rb").read()
    assert _schema_errors(docs) == []
    # without the Secret, its volumes and mounts and the config (checked against the
    # base's by test_tls_config_is_the_base_config_plus_tls_keys), it is the base: the
    # patches added to the pods, they did not replace or change anything
    base = _base_docs(tmp_path)
    assert _changed_from_base(docs, base) == []
    # the check sees a patch that changes something else
    docs = _tls_docs(tmp_path, tls_files, edits={"tls/master.yaml": (
        "      containers:\n", "      terminationGracePeriodSeconds: 5\n      containers:\n")})
    assert _changed_from_base(docs, base) == ["StatefulSet/curvine-master"]


def _changed_from_base(docs, base) -> list[str]:
    """The objects of ``docs`` that differ from ``base`` once the TLS Secret, its
    volumes and mounts, and the ConfigMap's data are taken out."""
    docs, base = copy.deepcopy(docs), copy.deepcopy(base)
    for d in docs + base:
        if d["kind"] == "ConfigMap":
            d["data"] = None
        for _, spec in _pod_specs([d]):
            tls_vols = {v["name"] for v in spec.get("volumes", [])
                        if v.get("secret", {}).get("secretName") == TLS_SECRET}
            spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] not in tls_vols]
            for c in spec["containers"]:
                c["volumeMounts"] = [m for m in c.get("volumeMounts", [])
                                     if m["name"] not in tls_vols]
    name = lambda d: f"{d['kind']}/{d['metadata']['name']}"  # noqa: E731
    theirs = {name(d): d for d in docs if d["metadata"]["name"] != TLS_SECRET}
    ours = {name(d): d for d in base}
    return sorted(n for n in theirs.keys() | ours.keys() if theirs.get(n) != ours.get(n))


def _base_docs(tmp_path) -> list[dict]:
    """``kubectl kustomize deploy/k8s`` (a copy, with stand-in tokens)."""
    yaml = pytest.importorskip("yaml")
    work = tmp_path / "base"
    shutil.copytree(K8S, work, ignore=shutil.ignore_patterns(
        "token", "worker-token", "master-token", *TLS_KEYS.values()))
    _stand_in_etcd_tls(work)
    auth.write_token_file(str(work / "token"), STAND_IN_TOKEN)
    auth.write_token_file(str(work / "worker-token"), STAND_IN_WORKER_TOKEN)
    auth.write_token_file(str(work / "master-token"), STAND_IN_MASTER_TOKEN)
    out = _kustomize(work)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@needs_kubectl
def test_base_without_the_component_sets_no_tls(tmp_path):
    docs = _base_docs(tmp_path)
    cfg = _config_of(docs, tmp_path)  # no TLS files given: it must need none
    sec = cfg.security
    assert (sec.tls_ca, sec.tls_cert, sec.tls_key, sec.tls_client_auth,
            sec.tls_server_name) == ("", "", "", False, "")
    assert not [d for d in docs if d["metadata"]["name"] == TLS_SECRET]
    assert TLS_SECRET not in repr(docs)
    assert _tls_problems(docs, cfg)  # the check sees that TLS is off


# deploy/k8s/tls broken one way each: (file, old, new, what catches it)
TLS_BROKEN = {
    "misspelled key": ("tls/configmap.yaml", "tls_client_auth = true",
                       "tls_client_authentication = true",
                       r"curvine\.toml:\d+: security\.tls_client_authentication: unknown key"),
    "path the Secret lacks": ("tls/configmap.yaml", '"/etc/curvine-tls/tls.key"',
                              '"/etc/curvine-tls/node.key"',
                              r"curvine\.toml:\d+: security\.tls_key: cannot read"),
    "client auth off": ("tls/configmap.yaml", "tls_client_auth = true",
                        "tls_client_auth = false", "tls_client_auth is not true"),
    "server name": ("tls/configmap.yaml", 'tls_server_name = "curvine-master.curvine.svc',
                    'tls_server_name = "curvine-node.curvine.svc', "tls_server_name"),
    "fuse not mounted": ("tls/daemonset.yaml",
                         "        - name: fuse\n          volumeMounts:\n"
                         "            - {name: tls, mountPath: /etc/curvine-tls, readOnly: true}\n",
                         "", "curvine-node/fuse: 0 mounts of the TLS Secret"),
    "worker elsewhere": ("tls/daemonset.yaml",
                         "        - name: worker\n          volumeMounts:\n"
                         "            - {name: tls, mountPath: /etc/curvine-tls,",
                         "        - name: worker\n          volumeMounts:\n"
                         "            - {name: tls, mountPath: /etc/tls,",
                         "curvine-node/worker: the TLS Secret at /etc/tls"),
    "writable": ("tls/master.yaml", "mountPath: /etc/curvine-tls, readOnly: true",
                 "mountPath: /etc/curvine-tls, readOnly: false",
                 "curvine-master/master: the TLS Secret is not mounted read-only"),
    "readable by others": ("tls/daemonset.yaml", "defaultMode: 0400", "defaultMode: 0404",
                           "TLS files readable by others"),
    "master cannot read": ("tls/master.yaml", "defaultMode: 0440", "defaultMode: 0400",
                           "uid 10001 cannot read"),
    "item renamed": ("tls/master.yaml", "{key: ca.crt, path: ca.crt}",
                     "{key: ca.crt, path: ca.pem}",
                     "curvine-master/master: security.tls_ca /etc/curvine-tls/ca.crt"),
}


@needs_kubectl
@pytest.mark.parametrize("case", sorted(TLS_BROKEN))
def test_tls_checks_catch_a_broken_component(tmp_path, tls_files, case):
    name, old, new, caught = TLS_BROKEN[case]
    docs = _tls_docs(tmp_path, tls_files, edits={name: (old, new)})
    if "curvine\\.toml" in caught:  # the loader refuses it
        with pytest.raises(ConfigError, match=caught):
            _config_of(docs, tmp_path, tls_files)
        return
    problems = _tls_problems(docs, _config_of(docs, tmp_path, tls_files))
    assert any(caught in p for p in problems), problems


@needs_kubectl
def test_tls_component_needs_its_files(tmp_path, tls_files):
    """Like the token: without the certificate files there is nothing to apply."""
    out = _tls_build(tmp_path, tls_files, missing="tls.key")
    assert out.returncode != 0 and "tls.key" in out.stderr


def test_tls_config_is_the_base_config_plus_tls_keys():
    """The Component replaces the whole curvine.toml (kustomize cannot add lines to a
    string): its copy must be the base's with TLS lines added, nothing else changed."""
    yaml = pytest.importorskip("yaml")
    toml_of = lambda f: yaml.safe_load(open(f))["data"]["curvine.toml"]  # noqa: E731
    base = toml_of(os.path.join(K8S, "configmap.yaml"))
    with_tls = toml_of(os.path.join(TLS_COMPONENT, "configmap.yaml"))
    assert _config_drift(base, with_tls) == []
    # the check sees a base that moved on without the copy
    assert _config_drift(base.replace("replicas = 1", "replicas = 2"), with_tls)
    assert _config_drift(base, with_tls.replace("[log]", "# [log]"))


def _config_drift(base: str, with_tls: str) -> list[str]:
    """Lines of ``base`` missing from ``with_tls``, and values of ``with_tls`` that are
    not base's or a [security] tls_* key."""
    import difflib
    drift = [d for d in difflib.ndiff(base.splitlines(), with_tls.splitlines())
             if d.startswith("- ")]
    a, b = tomllib.loads(base), tomllib.loads(with_tls)
    added = {k for k in b.get("security", {}) if k.startswith("tls_")}
    b["security"] = {k: v for k, v in b["security"].items() if k not in added}
    if a != b:
        drift.append(f"values differ: {a} != {b}")
    return drift


def test_tls_files_are_never_committed():
    if not (shutil.which("git") and os.path.isdir(os.path.join(REPO, ".git"))):
        pytest.skip("not a git checkout")
    for name in (*TLS_KEYS.values(), "ca.key", "node.pem"):
        path = f"deploy/k8s/tls/{name}"
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, timeout=30)
        assert ignored.returncode == 0, f"{path} is not ignored by git"
    tracked = subprocess.run(["git", "ls-files", "deploy/k8s/tls"], cwd=REPO,
                             capture_output=True, text=True, timeout=30).stdout.split()
    assert not [p for p in tracked if not p.endswith((".yaml", ".gitignore"))], tracked


@needs_kubectl
def test_tls_names_let_a_client_dial_a_server_by_ip(tmp_path):
    """The naming the Component relies on, run for real: a certificate whose only SAN is
    the master's Service name (as docs/kubernetes.md makes it) serves a master that a
    client dials at an IP, as every worker is dialed at its node's IP, with the
    rendered config's mutual TLS and tls_server_name; without tls_server_name the
    same client is refused.  The master and a worker run with stand-ins for both token
    Secrets, as their containers mount them; the worker registers at the master's
    worker port where cluster.master_worker_addr points (the Service's "worker" port,
    here an IP too); the client has no worker token file, as in the FUSE container."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    from curvine.devtools.local import free_ports
    pki = tmp_path / "pki"
    pki.mkdir()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    (pki / "ext").write_text("subjectAltName=DNS:curvine-master.curvine.svc.cluster.local\n"
                             "extendedKeyUsage=serverAuth,clientAuth\n")
    for argv in (["req", "-x509", *ec, "-days", "1", "-subj", "/CN=curvine CA",
                  "-keyout", "ca.key", "-out", "ca.crt"],
                 ["req", *ec, "-subj", "/CN=curvine", "-keyout", "tls.key", "-out", "tls.csr"],
                 ["x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                  "-CAcreateserial", "-days", "1", "-extfile", "ext", "-out", "tls.crt"]):
        subprocess.run(["openssl", *argv], cwd=pki, check=True, capture_output=True, timeout=60)
    docs = _tls_docs(tmp_path, str(pki))
    text = _one(docs, "ConfigMap", "curvine-config")["data"]["curvine.toml"]
    port, worker_port, http_port, wport, whttp_port = free_ports(5)
    auth.write_token_file(str(tmp_path / "token"), STAND_IN_TOKEN)
    auth.write_token_file(str(tmp_path / "worker-token"), STAND_IN_WORKER_TOKEN)
    auth.write_token_file(str(tmp_path / "master-token"), STAND_IN_MASTER_TOKEN)
    for old, new in [("/etc/curvine-tls/", f"{pki}/"),
                     ("/etc/curvine-token/token", str(tmp_path / "token")),
                     # the client's view: no such file (the FUSE container has none)
                     ("/etc/curvine-worker-token/", f"{tmp_path}/absent/"),
                     ("/etc/curvine-master-token/", f"{tmp_path}/absent/"),
                     ("worker_port = 8996", f"worker_port = {worker_port}"),
                     ("http_port = 9001", f"http_port = {http_port}"),
                     ("http_port = 9002", f"http_port = {whttp_port}")]:
        assert old in text
        text = text.replace(old, new)
    # one master of the group, and no etcd: the naming is the test here
    for key, value in (("master_addrs", [f"127.0.0.1:{port}"]),
                       ("master_worker_addrs", [f"127.0.0.1:{worker_port}"]),
                       ("etcd_endpoints", [])):
        text, n = re.subn(rf"\n{key} = \[[^\]]*\]", f"\n{key} = {value!r}".replace("'", '"'),
                          text)
        assert n == 1, key
    assert 'tls_server_name = "curvine-master.curvine.svc.cluster.local"' in text
    conf, conf_no_name = tmp_path / "c.toml", tmp_path / "c-no-name.toml"
    conf.write_text(text)
    conf_no_name.write_text("\n".join(l for l in text.splitlines()
                                      if not l.startswith("tls_server_name")))
    # the master's and the worker's view: the worker token Secret mounted
    daemon_conf = tmp_path / "daemon.toml"
    daemon_conf.write_text(text.replace(f"{tmp_path}/absent/worker-token",
                                        str(tmp_path / "worker-token")).replace(
        f"{tmp_path}/absent/master-token", str(tmp_path / "master-token")))
    assert not (tmp_path / "absent").exists()
    bin_ = lambda name: os.path.join(VENV_BIN, name)  # noqa: E731
    procs = {}

    def start(name, argv):
        procs[name] = subprocess.Popen([bin_(argv[0]), *argv[1:]], stdout=subprocess.DEVNULL,
                                       stderr=open(tmp_path / f"{name}.log", "w"),
                                       env=_daemon_env(), stdin=subprocess.DEVNULL)

    def logs():
        return {n: (tmp_path / f"{n}.log").read_text()[-2000:] for n in procs}

    def wait_healthy(name, http):
        # the CLI waits only 2 s for a master: wait for it to serve first; a worker's
        # /healthz answers 200 once the master has accepted its registration
        deadline = time.monotonic() + 60
        while True:
            assert procs[name].poll() is None, logs()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/healthz", timeout=5):
                    return
            except OSError:
                assert time.monotonic() < deadline, (f"{name} not healthy in 60 s", logs())
                time.sleep(0.1)

    start("master", ["curvine-master", "--conf", str(daemon_conf), "--host", "127.0.0.1",
                     "--port", str(port), "--meta-dir", str(tmp_path / "meta"),
                     "--journal-dir", str(tmp_path / "journal")])
    try:
        def ls(conf_file):
            return subprocess.run([bin_("curvine"), "fs", "ls", "/"], capture_output=True,
                                  text=True, timeout=120,
                                  env={**_daemon_env(), "CURVINE_CONF": str(conf_file)})
        wait_healthy("master", http_port)
        ok = ls(conf)
        assert ok.returncode == 0, (ok.stderr, logs())
        refused = ls(conf_no_name)
        assert refused.returncode != 0 and "Hostname Verification" in refused.stderr, refused.stderr
        (tmp_path / "data").mkdir(mode=0o700)
        start("worker", ["curvine-worker", "--conf", str(daemon_conf), "--host", "127.0.0.1",
                         "--port", str(wport), "--data-dir", str(tmp_path / "data")])
        wait_healthy("worker", whttp_port)
        assert f"127.0.0.1:{worker_port}" in logs()["worker"]  # cluster.master_worker_addr
    finally:
        for p in reversed(list(procs.values())):
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
