"""Deployment files: the systemd units (systemd-analyze verify, and the settings the
daemons rely on) and the Kubernetes manifests (schema, and agreement with the
config they carry).  Neither is run on a real init system or cluster here."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import tomllib

import pytest

from curvine.common import auth, config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEMD = os.path.join(REPO, "systemd")
K8S = os.path.join(REPO, "deploy", "k8s")
VENV_BIN = os.path.dirname(sys.executable)
INSTALLED_BIN = "/opt/curvine/venv/bin"  # where the units expect the venv (docs/deploy-gpu-node.md)
UNITS = ["curvine-master.service", "curvine-worker.service", "curvine-fuse@.service"]
FUSE_INSTANCE = "curvine-fuse@mnt-kv.service"  # mounts /mnt/kv

# ----------------------------------------------------------------------------- systemd


def _unit(name: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values, in order]}} (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in open(os.path.join(SYSTEMD, name)):
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


TOKEN_FILE = "/etc/curvine/token"  # where docs/deploy-gpu-node.md puts the cluster token

# What each sandboxing setting hides from a service (systemd.exec(5)); ProtectSystem
# (any value) only makes /usr, /boot, /etc... read-only, which leaves them readable.
_HIDDEN_BY = {"ProtectHome": ("/home", "/root", "/run/user"),
              "PrivateTmp": ("/tmp", "/var/tmp")}


def _token_unreadable_because(unit: dict, path: str = TOKEN_FILE) -> list[str]:
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


def test_units_can_read_the_token_file():
    """Every daemon reads security.token_file at start (it exits 2 if it cannot): the
    documented /etc/curvine/token, 0640 root:curvine, must be readable by each unit's
    user under its sandboxing."""
    for name in UNITS:
        assert _token_unreadable_because(_unit(name)) == [], name
    for name in ("curvine-master.service", "curvine-worker.service"):
        assert _values(_unit(name), "Service", "Group") == ["curvine"], name
    # the check sees what would hide the file
    master = _unit("curvine-master.service")
    for change in [{"InaccessiblePaths": ["/etc/curvine"]},
                   {"TemporaryFileSystem": ["/etc:ro"]},
                   {"User": ["nobody"], "Group": ["nogroup"]}]:
        broken = {**master, "Service": {**master["Service"], **change}}
        assert _token_unreadable_because(broken), change
    assert _token_unreadable_because(master, "/root/token") == ["ProtectHome=true"]
    assert _token_unreadable_because(master, "/tmp/token") == ["PrivateTmp=true"]


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
K8S_FILES = ["namespace.yaml", "configmap.yaml", "master.yaml", "daemonset.yaml",
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


def _config_of(docs, tmp_path) -> config.Config:
    """The ConfigMap's curvine.toml through curvine's own loader.  The loader reads the
    token file it names, which only exists in the pods (the Secret): a stand-in token
    is put at a temporary path for the load; the result keeps the path the pods see."""
    cm = _one(docs, "ConfigMap", "curvine-config")
    text = cm["data"]["curvine.toml"]
    in_pod = tomllib.loads(text).get("security", {}).get("token_file", "")
    if in_pod:
        stand_in = tmp_path / "token"
        auth.write_token_file(str(stand_in))
        assert text.count(f'"{in_pod}"') == 1
        text = text.replace(f'"{in_pod}"', f'"{stand_in}"')
    path = tmp_path / "curvine.toml"
    path.write_text(text)
    cfg = config.load(str(path))  # ConfigError (file:line: key) if the ConfigMap is wrong
    cfg.security.token_file = in_pod
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

    # master: the Service named by cluster.master_addr, ports from the config
    host, port = cfg.cluster.master_addr.rsplit(":", 1)
    svc = _one(docs, "Service", "curvine-master")
    assert host == f"{svc['metadata']['name']}.{namespace}.svc.cluster.local"
    assert {p["port"] for p in svc["spec"]["ports"]} == {int(port), cfg.master.http_port}
    sts = _one(docs, "StatefulSet", "curvine-master")
    assert sts["spec"]["replicas"] == 1
    assert _one(docs, "Service", sts["spec"]["serviceName"])["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == sts["spec"]["template"]["metadata"]["labels"]
    master = _container(sts["spec"]["template"]["spec"], "master")
    assert {p["containerPort"] for p in master["ports"]} == {cfg.master.port, cfg.master.http_port}
    assert _http_probe_ports(master) == {cfg.master.http_port}
    assert cfg.master.host == "0.0.0.0"
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
    assert {p["containerPort"] for p in worker["ports"]} == {cfg.worker.port, cfg.worker.http_port}
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


def test_a_bad_configmap_is_caught(tmp_path):
    text = open(os.path.join(K8S, "configmap.yaml")).read()
    assert "    replicas = 1\n" in text
    docs = _manifests({"configmap.yaml": text.replace("    replicas = 1\n", "    replicas = 0\n")})
    with pytest.raises(config.ConfigError, match=r"curvine\.toml:\d+: cluster\.replicas"):
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


def _kustomize(directory) -> subprocess.CompletedProcess:
    # kubectl builds the kustomization offline (apply --dry-run needs an API server)
    return subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True,
                          text=True, timeout=120)


def test_kustomization_lists_the_cluster_manifests(tmp_path):
    yaml = pytest.importorskip("yaml")
    k = yaml.safe_load(open(os.path.join(K8S, "kustomization.yaml")))
    assert k["resources"] == [f for f in K8S_FILES if f != "example-inference-pod.yaml"]
    [gen] = k["secretGenerator"]
    assert gen["name"] == TOKEN_SECRET and gen["files"] == ["token"]
    assert gen["options"]["disableNameSuffixHash"] is True  # the name the pods mount
    # the token file is never committed
    if shutil.which("git") and os.path.isdir(os.path.join(REPO, ".git")):
        ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/k8s/token"], cwd=REPO,
                                 timeout=30)
        assert ignored.returncode == 0, "deploy/k8s/token is not ignored by git"
        tracked = subprocess.run(["git", "ls-files", "deploy/k8s/token"], cwd=REPO,
                                 capture_output=True, text=True, timeout=30)
        assert tracked.stdout == "", "a token file is committed"
    if shutil.which("kubectl") is None:
        return
    work = tmp_path / "k8s"
    shutil.copytree(K8S, work, ignore=shutil.ignore_patterns("token"))
    # without a token file there is nothing to apply: no default token
    out = _kustomize(work)
    assert out.returncode != 0 and "token" in out.stderr
    token = auth.write_token_file(str(work / "token"))
    out = _kustomize(work)
    assert out.returncode == 0, out.stderr
    built = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(d["kind"] for d in built) == sorted(
        [d["kind"] for d in _manifests() if d["kind"] != "Pod"] + ["Secret"])
    secret = _one(built, "Secret", TOKEN_SECRET)
    assert secret["metadata"]["namespace"] == _one(built, "Namespace")["metadata"]["name"]
    assert base64.b64decode(secret["data"]["token"]).decode().strip() == token
    assert _schema_errors([secret]) == []
    # what the pods mount is what the kustomization makes
    for _, spec in _pod_specs(built):
        for v in spec.get("volumes", []):
            if "secret" in v:
                assert v["secret"]["secretName"] == TOKEN_SECRET
