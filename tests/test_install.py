"""Installs other than the development venv give a working mount.

- A plain ``pip install`` of curvine-py into a fresh venv takes PyPI's stock pyfuse3
  (none of scripts/pyfuse3/*.patch).  Its mount must still list directories, follow
  symlinks and carry an LMCache-style store and read between two mounts; fallocate(2)
  gives a clean EOPNOTSUPP; the mount logs one WARNING naming what is off and the fix,
  and ``curvine-fuse --version`` / ``curvine doctor`` print the same line.
- The image: deploy/k8s/Dockerfile's own RUN steps (parsed from the file, run with
  the build arguments PREFIX and SRC pointing into this test's directory, as
  ``docker build --build-arg`` would) into a fresh venv; its mount has everything,
  fallocate included.  No container engine runs here, so FROM is a fresh venv of this
  Python and COPY copies the build context less .dockerignore.

Each starts a cluster (1 worker, 2 mounts) with that venv's own ``curvine local up``.
"""

from __future__ import annotations

import ctypes
import errno
import fnmatch
import os
import random
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from cluster_util import fuse_available

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKERFILE = os.path.join(REPO, "deploy", "k8s", "Dockerfile")
MIB = 1 << 20

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


@pytest.fixture(autouse=True)
def _needs_fuse():
    reason = fuse_available()
    if reason:
        pytest.skip(f"needs FUSE mounts: {reason}")


# ----------------------------------------------------------------------------- helpers

def dockerignore_patterns(context: str) -> list[str]:
    try:
        with open(os.path.join(context, ".dockerignore")) as f:
            lines = [ln.strip() for ln in f]
    except FileNotFoundError:
        return []
    patterns = [ln for ln in lines if ln and not ln.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "exceptions (!) are not emulated here"
    return patterns


def ignored(rel: str, patterns: list[str]) -> bool:
    """Whether .dockerignore's ``patterns`` exclude ``rel`` (a path in the context):
    a pattern excludes what it matches and everything under it; ``**/`` matches any
    number of directories."""
    parts = rel.split("/")
    for p in patterns:
        p = p.strip("/")
        if p.startswith("**/"):
            tail = p[3:]
            if any(fnmatch.fnmatchcase("/".join(parts[i:j]), tail)
                   for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)):
                return True
        elif any(fnmatch.fnmatchcase("/".join(parts[:j]), p) for j in range(1, len(parts) + 1)):
            return True
    return False


def copy_context(context: str, dest: str) -> None:
    """COPY . DEST of a docker build: the context less what .dockerignore excludes."""
    patterns = dockerignore_patterns(context)
    for root, dirs, files in os.walk(context):
        rel_root = os.path.relpath(root, context)
        rel_root = "" if rel_root == "." else rel_root + "/"
        dirs[:] = [d for d in dirs if not ignored(rel_root + d, patterns)]
        os.makedirs(os.path.join(dest, rel_root), exist_ok=True)
        for name in files:
            if not ignored(rel_root + name, patterns):
                shutil.copy2(os.path.join(root, name), os.path.join(dest, rel_root, name),
                             follow_symlinks=False)


def dockerfile_instructions(path: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of each line of a Dockerfile, continuations joined."""
    out, pending = [], ""
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            line, pending = pending + line, ""
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    assert not pending, "a continuation at the end of the Dockerfile"
    return out


def expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), text)


def run_dockerfile(path: str, context: str, build_args: dict[str, str], env: dict[str, str],
                   log, inside: str) -> list[str]:
    """Run the Dockerfile's steps here: ARG (``build_args`` override defaults), ENV,
    COPY (of the context), RUN (``/bin/sh -c``, as docker does, with the ARG and ENV
    values in its environment; a cache mount's target is this machine's own
    persistent directory, so the flag is dropped).  FROM is the caller's (a fresh
    venv at PREFIX).  Returns the RUN commands, as run.

    Refused, since they would change this machine: a COPY outside ``inside``, and a RUN
    that calls apt-get or dpkg itself (the image's packages come from
    scripts/install.sh, which removes only what it installed)."""
    values: dict[str, str] = {}
    ran = []
    for word, rest in dockerfile_instructions(path):
        if word == "FROM":
            assert rest.startswith("python:3.11"), f"FROM {rest}: the test emulates a Python 3.11 image"
        elif word == "ARG":
            name, _, default = rest.partition("=")
            values[name] = build_args.get(name, default)
        elif word == "ENV":
            for item in shlex.split(rest):
                k, _, v = item.partition("=")
                values[k] = expand(v, values)
        elif word == "COPY":
            src, dest = shlex.split(expand(rest, values))
            assert src == ".", f"COPY {rest}: only the whole context is emulated"
            assert os.path.abspath(dest).startswith(inside + os.sep), (
                f"COPY {rest}: to {dest}, outside this test's directory (build arguments?)")
            copy_context(context, dest)
        elif word == "RUN":
            cmd = rest
            while cmd.startswith("--mount="):
                flag, _, cmd = cmd.partition(" ")
                assert "type=cache" in flag, f"RUN {flag}: only cache mounts are emulated"
                cmd = cmd.lstrip()
            assert not re.search(r"\b(apt-get|apt|dpkg)\b", expand(cmd, values)), (
                f"RUN {cmd}: calls apt itself; the image's packages come from scripts/install.sh")
            log.write(f"$ {cmd}\n")
            log.flush()
            subprocess.run(["/bin/sh", "-c", cmd], env={**env, **values}, stdout=log,
                           stderr=subprocess.STDOUT, check=True, timeout=1500)
            ran.append(cmd)
        else:
            pytest.fail(f"{word} in {path}: not emulated by this test (add it here)")
    return ran


def fresh_venv(path: str) -> str:
    subprocess.run([sys.executable, "-m", "venv", path], check=True, timeout=300)
    return os.path.join(path, "bin")


def features_of(bin_dir: str) -> str:
    """fuse_client/features.py's detection in that venv, as a repr."""
    return subprocess.run(
        [os.path.join(bin_dir, "python"), "-c",
         "from curvine.fuse_client import features; print(features.detect())"],
        capture_output=True, text=True, check=True, timeout=60).stdout.strip()


PROBLEM = re.compile(r"\] (WARNING|ERROR|CRITICAL) ")


def problems_in_logs(base: str) -> dict[str, list[str]]:
    out = {}
    logs = os.path.join(base, "logs")
    for name in sorted(os.listdir(logs)):
        with open(os.path.join(logs, name), errors="replace") as f:
            lines = [ln.rstrip("\n") for ln in f if PROBLEM.search(ln) or "Traceback" in ln]
        if lines:
            out[name] = lines
    return out


def fallocate(fd: int, mode: int, offset: int, length: int) -> int:
    """0, or the errno of fallocate(2) (not glibc's posix_fallocate, which emulates)."""
    if _libc.fallocate(fd, mode, offset, length) == 0:
        return 0
    return ctypes.get_errno()


def exercise_mounts(bin_dir: str, base: str, patched: bool) -> None:
    """A cluster from this venv's `curvine local up`, and what an LMCache pod and a
    person at a shell do with its two mounts."""
    curvine = os.path.join(bin_dir, "curvine")
    env = {k: v for k, v in os.environ.items() if k != "CURVINE_CONF"}
    up = subprocess.run([curvine, "local", "up", "--base", base, "--workers", "1",
                         "--mounts", "2", "--timeout", "120"],
                        capture_output=True, text=True, env=env, timeout=300)
    try:
        assert up.returncode == 0, f"curvine local up failed:\n{up.stdout}\n{up.stderr}"
        m0, m1 = up.stdout.split()
        d0, d1 = os.path.join(m0, "l2cache"), os.path.join(m1, "l2cache")
        os.mkdir(d0)

        # LMCache's fs connector: <key>.tmp written at once, renamed to <key>.data
        rnd = random.Random(33)
        chunks = {f"key{i}": rnd.randbytes(3 * MIB + i) for i in range(3)}
        for key, data in chunks.items():
            tmp = os.path.join(d0, f"{key}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.rename(tmp, os.path.join(d0, f"{key}.data"))
        for key, data in chunks.items():
            path = os.path.join(d1, f"{key}.data")
            assert os.stat(path).st_size == len(data)
            with open(path, "rb") as f:
                assert f.read() == data, f"{key}.data read through the other mount differs"

        # symbolic links, made on one mount, followed on the other
        os.symlink("key0.data", os.path.join(d0, "latest"))
        assert os.readlink(os.path.join(d1, "latest")) == "key0.data"
        with open(os.path.join(d1, "latest"), "rb") as f:
            assert f.read() == chunks["key0"]

        # listings: os.listdir and ls -l, on both mounts, twice
        want = sorted([f"{k}.data" for k in chunks] + ["latest"])
        for d in (d0, d1, d0, d1):
            assert sorted(os.listdir(d)) == want
            ls = subprocess.run(["ls", "-l", d], capture_output=True, text=True, timeout=60)
            assert ls.returncode == 0, ls.stderr
            assert "latest -> key0.data" in ls.stdout and "key2.data" in ls.stdout
        assert sorted(os.listdir(m1)) == ["l2cache"]

        # fallocate(2): allocated with the patched pyfuse3, a clean EOPNOTSUPP without
        path = os.path.join(d0, "falloc")
        with open(path, "wb") as f:
            f.write(b"0123456789")
        fd = os.open(path, os.O_RDWR)
        try:
            got = fallocate(fd, 0, 0, MIB)
            if patched:
                assert got == 0, f"fallocate: {errno.errorcode.get(got, got)}"
                assert os.fstat(fd).st_size == MIB
            else:
                assert got == errno.EOPNOTSUPP, f"fallocate: {errno.errorcode.get(got, got)}"
                assert os.fstat(fd).st_size == 10  # nothing changed
            # glibc's posix_fallocate writes zeros itself where fallocate(2) is missing
            os.posix_fallocate(fd, 0, 2 * MIB)
            assert os.fstat(fd).st_size == 2 * MIB
        finally:
            os.close(fd)
        with open(os.path.join(d1, "falloc"), "rb") as f:
            data = f.read()
        assert data[:10] == b"0123456789" and data[10:] == bytes(2 * MIB - 10)
        tool = subprocess.run(["fallocate", "-l", "1M", os.path.join(d0, "by-tool")],
                              capture_output=True, text=True, timeout=60)
        if patched:
            assert tool.returncode == 0, tool.stderr
            assert os.stat(os.path.join(d1, "by-tool")).st_size == MIB
        else:
            assert tool.returncode != 0 and "not supported" in tool.stderr, tool.stderr
    finally:
        down = subprocess.run([curvine, "local", "down", "--base", base], capture_output=True,
                              text=True, env=env, timeout=120)
    assert down.returncode == 0, f"curvine local down failed:\n{down.stderr}"


# ------------------------------------------------------------------------------- tests

@pytest.mark.timeout(900)
@pytest.mark.expect_log(r"WARNING curvine\.fuse_client: pyfuse3 \S+ lacks curvine's patches")  # stock pyfuse3 on purpose: the one start-up line (asserted below)
def test_a_plain_pip_install_with_stock_pyfuse3_mounts_lists_and_stores(tmp_path):
    src = str(tmp_path / "src")
    copy_context(REPO, src)
    bin_dir = fresh_venv(str(tmp_path / "venv"))
    pip = subprocess.run([os.path.join(bin_dir, "python"), "-m", "pip", "install", "-q", src],
                         capture_output=True, text=True, timeout=900)
    if pip.returncode != 0:
        tail = "\n".join(pip.stderr.strip().splitlines()[-3:])
        if re.search(r"No matching distribution|Could not find a version|connection|"
                     r"Temporary failure|Network is unreachable", pip.stderr, re.I):
            pytest.skip(f"cannot fetch curvine-py's dependencies (pyfuse3) from PyPI: {tail}")
        pytest.fail(f"pip install of curvine-py failed:\n{pip.stderr}")
    found = features_of(bin_dir)
    assert "fallocate=False" in found and "cache_readdir=False" in found, (
        f"this venv was meant to have PyPI's stock pyfuse3: {found}")

    base = str(tmp_path / "cluster")
    exercise_mounts(bin_dir, base, patched=False)

    # one WARNING at start-up per mount, naming what is off and the fix; nothing else
    fix = f"bash scripts/install.sh {tmp_path / 'venv'}"
    problems = problems_in_logs(base)
    assert sorted(problems) == ["fuse-0.log", "fuse-1.log"], problems
    for name, lines in problems.items():
        assert len(lines) == 1, f"{name}: {lines}"
        assert "WARNING" in lines[0] and "pyfuse3 3.5.0 lacks" in lines[0] and fix in lines[0]
        for off in ("fallocate", "directory cache", "symlink cache", "queued read"):
            assert off in lines[0]
    warning = problems["fuse-0.log"][0].split(": ", 1)[1]

    version = subprocess.run([os.path.join(bin_dir, "curvine-fuse"), "--version"],
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and f"WARNING: {warning}" in version.stdout.splitlines()
    doctor = subprocess.run([os.path.join(bin_dir, "curvine"), "doctor", "--install-only"],
                            capture_output=True, text=True, timeout=60)
    assert doctor.returncode == 1 and f"WARNING: {warning}" in doctor.stdout.splitlines()


@pytest.mark.timeout(1500)
def test_the_images_install_steps_give_a_complete_mount(tmp_path):
    prefix, src = str(tmp_path / "image"), str(tmp_path / "src")
    bin_dir = fresh_venv(prefix)  # FROM python:3.11-slim-bookworm: a Python at PREFIX
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    with open(tmp_path / "build.log", "w") as log:
        try:
            ran = run_dockerfile(DOCKERFILE, REPO, {"PREFIX": prefix, "SRC": src}, env, log,
                                 inside=str(tmp_path))
        except subprocess.CalledProcessError:
            log.close()
            pytest.fail(f"a RUN step failed:\n{(tmp_path / 'build.log').read_text()[-4000:]}")
    assert any("scripts/install.sh" in cmd for cmd in ran), ran
    assert not os.path.exists(src)  # the image keeps no source tree
    found = features_of(bin_dir)
    assert "fallocate=True" in found and "cache_readdir=True" in found and \
        "cache_symlinks=True" in found and "read_queued=True" in found, found
    doctor = subprocess.run([os.path.join(bin_dir, "curvine"), "doctor", "--install-only"],
                            capture_output=True, text=True, timeout=60)
    assert doctor.returncode == 0 and "WARNING" not in doctor.stdout, doctor.stdout

    base = str(tmp_path / "cluster")
    exercise_mounts(bin_dir, base, patched=True)
    assert problems_in_logs(base) == {}


def test_dockerignore_keeps_the_venv_and_the_git_dir_out_of_the_image():
    patterns = dockerignore_patterns(REPO)
    assert ignored(".venv/bin/python", patterns) and ignored(".git/HEAD", patterns)
    assert ignored("master/__pycache__/x.pyc", patterns)
    assert not ignored("scripts/install.sh", patterns)
    assert not ignored("scripts/pyfuse3/fallocate.patch", patterns)
    assert not ignored("pyproject.toml", patterns)
