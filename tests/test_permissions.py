"""POSIX permissions on a real mount, seen by a user who is not root.

The mount is made with ``default_permissions``, so the kernel checks mode bits and
ownership (stored by the master, taken from the FUSE request context on create and
mkdir) before a request reaches the FUSE client.  ``fuse.allow_other`` lets other
users reach the mount at all; without it the kernel refuses them everything.

The non-root user is uid/gid 65534 (``nobody``): a forked child that drops to it,
with no supplementary groups.  pytest's tmp dir is not traversable by that user, so
the child inherits a descriptor of the mount's root, opened by root, and does every
call relative to it (``dir_fd``): only the mount's own permissions are tested, not
those of the directories above it.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

NOBODY = 65534

def _run_ops(fd: int, ops: list[tuple[str, str, str]]) -> dict[str, str]:
    """Each op is (name, kind, path relative to ``fd``); {name: "ok:<detail>" | errno name}."""
    out = {}
    for name, kind, path in ops:
        try:
            detail = ""
            if kind == "read":
                f = os.open(path, os.O_RDONLY, dir_fd=fd)
                try:
                    detail = os.read(f, 100).decode()
                finally:
                    os.close(f)
            elif kind == "write":
                os.close(os.open(path, os.O_WRONLY, dir_fd=fd))
            elif kind == "create":
                f = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666, dir_fd=fd)
                try:
                    os.write(f, b"from nobody")
                finally:
                    os.close(f)
            elif kind == "mkdir":
                os.mkdir(path, 0o777, dir_fd=fd)
            elif kind == "unlink":
                os.unlink(path, dir_fd=fd)
            elif kind == "chmod":
                os.chmod(path, 0o666, dir_fd=fd)
            elif kind == "stat":
                detail = oct(os.stat(path, dir_fd=fd).st_mode)
            elif kind == "uid":
                detail = f"{os.getuid()}:{os.getgid()}:{os.getgroups()}"
            out[name] = "ok:" + detail
        except OSError as e:
            out[name] = errno.errorcode.get(e.errno, str(e.errno))
    return out


def as_nobody(root_fd: int, ops: list[tuple[str, str, str]]) -> dict[str, str]:
    """Run ``ops`` in a forked child that has dropped to uid/gid NOBODY (no groups).

    A fork rather than a new interpreter: this one may live where NOBODY cannot read."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.umask(0o022)
            os.write(w, json.dumps(_run_ops(root_fd, ops)).encode())
            code = 0
        except BaseException as e:  # noqa: BLE001 - report, then exit the child
            os.write(w, json.dumps({"child error": repr(e)}).encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()  # EOF when the child exits (it does only bounded calls)
    _, status = os.waitpid(pid, 0)
    result = json.loads(data or b"{}")
    assert os.waitstatus_to_exitcode(status) == 0, f"child failed: {result}"
    return result


@pytest.fixture
def root_only():
    if os.geteuid() != 0:
        pytest.skip("needs root: the test switches to another user and mounts with "
                    "allow_other")


def _write(path: str, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path, mode)  # whatever the umask


def _conf(tmp_path, allow_other: bool) -> str:
    conf = tmp_path / f"allow_other_{allow_other}.toml"
    conf.write_text(f"[fuse]\nallow_other = {'true' if allow_other else 'false'}\n")
    return str(conf)


def _open_root(mount: str) -> int:
    return os.open(mount, os.O_RDONLY | os.O_DIRECTORY)


def test_other_user_is_held_to_mode_bits(make_cluster, tmp_path, root_only):
    c = make_cluster(workers=1, mounts=1, conf=_conf(tmp_path, allow_other=True))
    mnt = c.mounts[0]
    _write(os.path.join(mnt, "secret"), b"root only", 0o600)
    _write(os.path.join(mnt, "public"), b"everyone", 0o644)
    os.mkdir(os.path.join(mnt, "rootdir"))
    os.chmod(os.path.join(mnt, "rootdir"), 0o755)
    os.mkdir(os.path.join(mnt, "shared"))
    os.chmod(os.path.join(mnt, "shared"), 0o777)
    os.mkdir(os.path.join(mnt, "private"))
    os.chmod(os.path.join(mnt, "private"), 0o700)
    _write(os.path.join(mnt, "private", "inner"), b"hidden", 0o644)
    os.mkdir(os.path.join(mnt, "sticky"))
    os.chmod(os.path.join(mnt, "sticky"), 0o1777)  # like /tmp
    _write(os.path.join(mnt, "sticky", "roots"), b"kept", 0o666)

    root_fd = _open_root(mnt)
    try:
        got = as_nobody(root_fd, [
            ("whoami", "uid", "."),
            ("read secret 0600", "read", "secret"),
            ("read public 0644", "read", "public"),
            ("write public 0644", "write", "public"),
            ("chmod public", "chmod", "public"),
            ("create in 0755 root dir", "create", "rootdir/mine"),
            ("mkdir in 0755 root dir", "mkdir", "rootdir/sub"),
            ("create in 0777 dir", "create", "shared/mine"),
            ("mkdir in 0777 dir", "mkdir", "shared/sub"),
            ("read own file", "read", "shared/mine"),
            ("read through 0700 dir", "read", "private/inner"),
            ("unlink root's file in 1777 dir", "unlink", "sticky/roots"),
            ("create in 1777 dir", "create", "sticky/mine"),
            ("unlink own file in 1777 dir", "unlink", "sticky/mine"),
        ])
    finally:
        os.close(root_fd)
    print("as nobody:", json.dumps(got, indent=1))

    assert got == {
        "whoami": f"ok:{NOBODY}:{NOBODY}:[]",
        "read secret 0600": "EACCES",
        "read public 0644": "ok:everyone",
        "write public 0644": "EACCES",
        "chmod public": "EPERM",
        "create in 0755 root dir": "EACCES",
        "mkdir in 0755 root dir": "EACCES",
        "create in 0777 dir": "ok:",
        "mkdir in 0777 dir": "ok:",
        "read own file": "ok:from nobody",
        "read through 0700 dir": "EACCES",
        "unlink root's file in 1777 dir": "EPERM",
        "create in 1777 dir": "ok:",
        "unlink own file in 1777 dir": "ok:",
    }
    # What the other user made is theirs: the master stored the caller's uid and gid.
    # ... with the mode it asked for less its umask (0o022): 0o666 -> 0o644, 0o777 -> 0o755.
    for name, kind, mode in (("mine", "file", 0o644), ("sub", "dir", 0o755)):
        st = os.stat(os.path.join(mnt, "shared", name))
        assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY), f"owner of the {kind} {name}"
        assert st.st_mode & 0o7777 == mode, f"mode of the {kind} {name}"
    # Refused requests changed nothing.
    assert os.listdir(os.path.join(mnt, "rootdir")) == []
    assert os.listdir(os.path.join(mnt, "sticky")) == ["roots"]
    assert os.stat(os.path.join(mnt, "public")).st_mode & 0o7777 == 0o644
    with open(os.path.join(mnt, "public"), "rb") as f:
        assert f.read() == b"everyone"


def test_without_allow_other_other_users_cannot_use_the_mount(make_cluster, tmp_path,
                                                               root_only):
    c = make_cluster(workers=1, mounts=1, conf=_conf(tmp_path, allow_other=False))
    mnt = c.mounts[0]
    _write(os.path.join(mnt, "public"), b"everyone", 0o644)
    os.mkdir(os.path.join(mnt, "shared"))
    os.chmod(os.path.join(mnt, "shared"), 0o777)

    root_fd = _open_root(mnt)
    try:
        got = as_nobody(root_fd, [
            ("stat root", "stat", "."),
            ("read public 0644", "read", "public"),
            ("create in 0777 dir", "create", "shared/mine"),
        ])
    finally:
        os.close(root_fd)
    print("as nobody, no allow_other:", json.dumps(got, indent=1))

    assert got == {
        "stat root": "EACCES",
        "read public 0644": "EACCES",
        "create in 0777 dir": "EACCES",
    }
    assert os.listdir(os.path.join(mnt, "shared")) == []


def test_mount_options_and_the_allow_other_hint(tmp_path, monkeypatch):
    """default_permissions is always on; allow_other only when configured.  A non-root
    mount with allow_other but without user_allow_other in fuse.conf fails, and the
    error says why."""
    from curvine.common import config
    from curvine.fuse_client import main as fuse_main

    cfg = config.Config()
    assert "default_permissions" in fuse_main.mount_options(cfg)
    assert "allow_other" not in fuse_main.mount_options(cfg)
    cfg.fuse.allow_other = True
    assert {"default_permissions", "allow_other"} <= fuse_main.mount_options(cfg)

    fuse_conf = tmp_path / "fuse.conf"
    fuse_conf.write_text("# mount_max = 1000\n#user_allow_other\n")
    monkeypatch.setattr(fuse_main, "FUSE_CONF", str(fuse_conf))
    monkeypatch.setattr(fuse_main.os, "geteuid", lambda: 1000)
    hint = fuse_main.allow_other_hint(cfg)
    assert "user_allow_other" in hint and str(fuse_conf) in hint, hint
    fuse_conf.write_text("user_allow_other\n")
    assert fuse_main.allow_other_hint(cfg) == ""
    monkeypatch.setattr(fuse_main.os, "geteuid", lambda: 0)  # root needs no fuse.conf
    fuse_conf.write_text("")
    assert fuse_main.allow_other_hint(cfg) == ""
    cfg.fuse.allow_other = False
    monkeypatch.setattr(fuse_main.os, "geteuid", lambda: 1000)
    assert fuse_main.allow_other_hint(cfg) == ""
