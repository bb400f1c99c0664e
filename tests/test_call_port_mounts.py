"""Mounts on the master's call port, with real master, worker and FUSE processes: both
mounts connect to it at the defaults, their namespace calls are read there (the
master's counter moves with the files made and looked up), a master SIGKILLed and
restarted is reconnected to, and with the port off the mounts work on the stream."""

from __future__ import annotations

import os
import re
import signal
import urllib.request

import pytest

from fs_helpers import log_text, wait_until

CONNECTED = "namespace calls on the master's call port"


def _master_metric(c, name: str) -> float:
    url = next(r["metrics"] for r in c.status() if r["role"] == "master")
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else -1.0


def _connections(c, i: int) -> int:
    return log_text(c.log_path("fuse", i)).count(CONNECTED)


@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master is SIGKILLed on purpose
def test_mounts_use_the_call_port_and_reconnect_after_a_master_sigkill(make_cluster):
    c = make_cluster(workers=1, mounts=2)
    a, b = (os.path.join(m, "kv") for m in c.mounts)
    for i in range(2):
        wait_until(lambda i=i: _connections(c, i) >= 1, 20, f"mount {i} on the call port")
    wait_until(lambda: _master_metric(c, "curvine_call_port_connections") == 2, 20,
               "the master to count both mounts")
    before = _master_metric(c, "curvine_call_port_calls_total")
    os.mkdir(a)
    for k in range(20):  # LMCache's way: <key>.tmp, one write, rename to <key>.data
        with open(os.path.join(a, f"k{k}.tmp"), "wb") as f:
            f.write(os.urandom(4096) + bytes([k]))
        os.rename(os.path.join(a, f"k{k}.tmp"), os.path.join(a, f"k{k}.data"))
    for k in range(20):
        assert os.stat(os.path.join(b, f"k{k}.data")).st_size == 4097
        assert not os.path.exists(os.path.join(b, f"missing{k}.data"))
    # create, CompleteFile (the 4 KiB are inline: no AddBlock) and rename per file
    # on A, lookups on B
    assert _master_metric(c, "curvine_call_port_calls_total") - before >= 20 * 3 + 20 * 2

    c.kill("master", sig=signal.SIGKILL)
    c.start("master")
    # (a mount logs its reconnects at DEBUG, and the outage's end when a call is
    # answered on the port again: count the master's connections meanwhile)
    wait_until(lambda: _master_metric(c, "curvine_call_port_connections") == 2, 30,
               "both mounts back on the call port after the restart")
    with open(os.path.join(b, "after.data"), "wb") as f:
        f.write(b"after the restart")
    with open(os.path.join(a, "after.data"), "rb") as f:
        assert f.read() == b"after the restart"
    for i in range(2):
        wait_until(lambda i=i: _connections(c, i) >= 2, 30,
                   f"mount {i} answered on the call port again after the restart")
    for k in range(20):
        with open(os.path.join(a, f"k{k}.data"), "rb") as f:
            assert f.read()[-1] == k


def test_with_the_port_off_mounts_use_the_stream(make_cluster, tmp_path):
    conf = tmp_path / "no-port.toml"
    conf.write_text("[master]\ncall_port = 0\n")
    c = make_cluster(workers=1, mounts=2, conf=str(conf))
    a, b = (os.path.join(m, "d") for m in c.mounts)
    os.mkdir(a)
    with open(os.path.join(a, "f"), "wb") as f:
        f.write(b"on the stream")
    with open(os.path.join(b, "f"), "rb") as f:
        assert f.read() == b"on the stream"
    wait_until(lambda: "the master has no call port" in log_text(c.log_path("fuse", 0)), 20,
               "mount 0 to learn there is no call port")
    assert _connections(c, 0) == 0 and _connections(c, 1) == 0
    assert _master_metric(c, "curvine_call_port_connections") == -1.0  # not served
