"""Helpers for tests that run a LocalCluster, and stand-in daemons for testing it.

Run as a script, this file is a fake daemon that follows the daemon contract
(READY=1 on $NOTIFY_SOCKET when serving, exit 0 on SIGTERM; the fuse role really
mounts an empty pyfuse3 file system and unmounts on SIGTERM or `fusermount3 -u`).
It lets the LocalCluster machinery be tested without the real master, worker and
FUSE client.  Behaviour is steered by environment variables:

    FAKE_FAIL=<role>   that role prints an error and exits 1 before READY=1
    FAKE_HANG=<role>   that role never sends READY=1
    FAKE_TRACEBACK=<role>  that role prints a traceback (to test log scanning)
"""

from __future__ import annotations

import os
import shutil
import sys
import time

FAKE_DAEMON = os.path.abspath(__file__)


def fake_commands() -> dict[str, list[str]]:
    """LocalCluster.COMMANDS pointing at this file's fake daemons."""
    return {role: [sys.executable, FAKE_DAEMON, role] for role in ("master", "worker", "fuse")}


def fuse_available() -> str | None:
    """None if real FUSE mounts can be made here, else the reason they cannot."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not accessible to this user"
    if not shutil.which("fusermount3"):
        return "fusermount3 is not installed (apt-get install fuse3)"
    return None


def wait_for(cond, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def metric_samples(http_port: int, name: str) -> list:
    """The samples called ``name`` that the daemon serving /metrics on ``http_port``
    exposes now (prometheus_client Sample tuples: .labels, .value)."""
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name]


def daemon_metric(cluster, role: str, name: str, index: int = 0, **labels: str) -> float:
    """The sum of the samples called ``name`` (those with ``labels``) that daemon
    ``role`` number ``index`` of ``cluster`` exposes now."""
    import urllib.parse
    url = next(r["metrics"] for r in cluster.status()
               if r["role"] == role and r["index"] == index)
    return sum(s.value for s in metric_samples(urllib.parse.urlsplit(url).port, name)
               if all(s.labels.get(k) == v for k, v in labels.items()))


def master_calls(cluster, method: str) -> float:
    """How many ``method`` calls the master of ``cluster`` has answered (any status; the
    call port's are counted with the RPCs)."""
    return daemon_metric(cluster, "master", "curvine_rpc_server_handled_total", method=method)


def tracebacks_in_logs(cluster, tail_lines: int = 40) -> list[str]:
    """For each daemon log of ``cluster`` that contains a traceback: its name and tail."""
    from curvine.devtools.local import log_tail
    found = []
    for path in cluster.logs():
        try:
            with open(path, "rb") as f:
                text = f.read()
        except OSError:
            continue
        if b"Traceback" in text:
            found.append(f"{path}:\n{log_tail(path, tail_lines)}")
    return found


# --------------------------------------------------------------------------- fake daemon

def _fake_server(role: str, args: list[str]) -> int:
    import socket
    from curvine.common import daemon

    port = int(args[args.index("--port") + 1]) if "--port" in args else 0
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen()
    stop = daemon.stop_event()
    print(f"fake {role} listening on {srv.getsockname()[1]}", file=sys.stderr)
    daemon.notify("READY=1")
    stop.wait()
    print(f"fake {role} stopped", file=sys.stderr)
    return 0


def _fake_fuse(args: list[str]) -> int:
    import errno
    import signal
    import stat

    import pyfuse3
    import trio

    from curvine.common import daemon

    class Ops(pyfuse3.Operations):
        async def getattr(self, inode, ctx=None):
            if inode != pyfuse3.ROOT_INODE:
                raise pyfuse3.FUSEError(errno.ENOENT)
            e = pyfuse3.EntryAttributes()
            e.st_ino = inode
            e.st_mode = stat.S_IFDIR | 0o755
            e.st_nlink = 2
            e.st_uid, e.st_gid = os.getuid(), os.getgid()
            return e

        async def lookup(self, parent_inode, name, ctx=None):
            raise pyfuse3.FUSEError(errno.ENOENT)

        async def opendir(self, inode, ctx):
            return inode

        async def readdir(self, fh, start_id, token):
            return None

    mountpoint = args[0]

    async def run():
        async with trio.open_nursery() as nursery:
            async def on_signal():
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                    async for _ in sigs:
                        pyfuse3.terminate()
                        return
            nursery.start_soon(on_signal)
            daemon.notify("READY=1")
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    pyfuse3.init(Ops(), mountpoint, ["fsname=curvine-fake", "subtype=curvine"])
    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)
    print("fake fuse stopped", file=sys.stderr)
    return 0


def fake_main(argv: list[str]) -> int:
    role, args = argv[0], argv[1:]
    if os.environ.get("FAKE_FAIL") == role:
        print(f"fake {role}: error: simulated start-up failure", file=sys.stderr)
        return 1
    if os.environ.get("FAKE_TRACEBACK") == role:
        print("Traceback (most recent call last):\n  simulated", file=sys.stderr)
    if os.environ.get("FAKE_HANG") == role:
        time.sleep(3600)
        return 0
    return _fake_fuse(args) if role == "fuse" else _fake_server(role, args)


if __name__ == "__main__":
    sys.exit(fake_main(sys.argv[1:]))


def module_cluster(tmp_path_factory, name: str, block_mib: int):
    """A generator for a module-scoped fixture: one LocalCluster (2 workers, 2 mounts,
    ``block_mib`` MiB blocks) under a fresh tmp dir named ``name``, taken down after the
    module; fails if a daemon logged a traceback.  Skips without FUSE."""
    import pytest

    from curvine.devtools.local import LocalCluster

    reason = fuse_available()
    if reason:
        pytest.skip(f"needs FUSE mounts: {reason}")
    base = tmp_path_factory.mktemp(name)
    conf = base / "test.toml"
    conf.write_text(f'[cluster]\nblock_size = "{block_mib}MiB"\n')
    c = LocalCluster(str(base / "cluster"), workers=2, mounts=2, conf=str(conf))
    try:
        c.up()
        yield c
    finally:
        c.down()
    found = tracebacks_in_logs(c)
    assert not found, "a daemon logged a traceback:\n" + "\n\n".join(found)
