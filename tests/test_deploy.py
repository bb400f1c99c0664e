"""Deployment files: the systemd units (systemd-analyze verify, and the settings the
daemons rely on) and the Kubernetes manifests (schema, and agreement with the
config they carry).  Neither is run on a real init system or cluster here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib

import pytest

from curvine.common import config

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
