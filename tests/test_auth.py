"""The cluster token (common/auth.py) on every RPC of every service.

A real cluster started by LocalCluster, which generates BASE/token and hands it to
every daemon.  Every method of every service, enumerated from the generated
descriptors (so a method added later is covered without editing this test), is called
over a raw channel with no token and with a wrong one, in its own shape (unary,
client-stream, server-stream, bidi): all must be UNAUTHENTICATED, and each daemon's
``curvine_rpc_unauthenticated_total`` must count them.  With the right token a cheap
call works, and work through a FUSE mount (master, worker streams, heartbeats) runs.
The token must appear in no log and no daemon config.
"""

from __future__ import annotations

import json
import os
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from curvine.common import auth
from curvine.master import server as master_server
from curvine.proto import master_pb2, master_pb2_grpc, worker_pb2

SERVICES = [(master_pb2, "Master"), (worker_pb2, "Worker")]


def methods(module) -> list:
    found = []
    for service in module.DESCRIPTOR.services_by_name.values():
        found.extend(service.methods)
    return found


def call_raw(channel: grpc.Channel, method, metadata) -> grpc.StatusCode:
    """Call ``method`` (a MethodDescriptor) with an empty request in its own shape;
    the status the server ended it with."""
    name = f"/{method.containing_service.full_name}/{method.name}"
    kwargs = dict(timeout=10, metadata=metadata)
    try:
        if method.client_streaming and method.server_streaming:
            for _ in channel.stream_stream(name)(iter([b""]), **kwargs):
                pass
        elif method.client_streaming:
            channel.stream_unary(name)(iter([b""]), **kwargs)
        elif method.server_streaming:
            for _ in channel.unary_stream(name)(b"", **kwargs):
                pass
        else:
            channel.unary_unary(name)(b"", **kwargs)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def refusals(http_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "curvine_rpc_unauthenticated_total":
                total += s.value
    return total


def daemons(cluster) -> dict[str, tuple[str, int]]:
    """{"Master" | "Worker": (gRPC address, HTTP port)} of the master and worker 0."""
    with open(cluster.state_path) as f:
        procs = {(p["role"], p["index"]): p for p in json.load(f)["procs"]}
    return {"Master": (procs[("master", 0)]["address"], procs[("master", 0)]["http_port"]),
            "Worker": (procs[("worker", 0)]["address"], procs[("worker", 0)]["http_port"])}


@pytest.mark.fuse
def test_every_method_refuses_calls_without_the_token(make_cluster):
    c = make_cluster(workers=1, mounts=1)
    assert c.token_file == os.path.join(c.base, "token")
    assert os.stat(c.token_file).st_mode & 0o777 == 0o600
    token = auth.read_token_file(c.token_file)
    where = daemons(c)

    checked = 0
    for module, service in SERVICES:
        address, http_port = where[service]
        before = refusals(http_port)
        calls = methods(module)
        assert calls, f"no methods found in {module.__name__}"
        with grpc.insecure_channel(address) as channel:
            for method in calls:
                for label, metadata in (("no token", None),
                                        ("wrong token", [("authorization", "Bearer " + "x" * len(token))]),
                                        ("not bearer", [("authorization", token)])):
                    code = call_raw(channel, method, metadata)
                    assert code == grpc.StatusCode.UNAUTHENTICATED, (
                        f"{service}.{method.name} with {label}: {code}")
                    checked += 1
        after = refusals(http_port)
        assert after - before == 3 * len(calls), (service, before, after)
    print(f"refused {checked} unauthenticated calls over "
          f"{sum(len(methods(m)) for m, _ in SERVICES)} methods")

    # The right token opens the door: a cheap unary call through a raw channel.
    with grpc.insecure_channel(where["Master"][0]) as channel:
        reply = master_pb2_grpc.MasterStub(channel).StatFs(
            master_pb2.StatFsRequest(), timeout=10,
            metadata=[("authorization", "Bearer " + token)])
        assert reply.ByteSize() >= 0

    # The whole data path is authenticated: FUSE -> master (calls, lease session),
    # FUSE -> worker streams, worker -> master heartbeats.
    path = os.path.join(c.mounts[0], "kv.data")
    data = os.urandom(3 << 20)
    with open(path, "wb") as f:
        f.write(data)
    with open(path, "rb") as f:
        assert f.read() == data

    # The token is in no log and no daemon config (they name the file only).
    files = list(c.logs())
    conf_dir = os.path.join(c.base, "conf")
    files += [os.path.join(conf_dir, n) for n in os.listdir(conf_dir)]
    for name in files:
        with open(name, "rb") as f:
            assert token.encode() not in f.read(), f"the token appears in {name}"


def test_an_open_cluster_needs_no_token(make_cluster):
    c = make_cluster(workers=1, mounts=0, token=False)
    assert c.token_file == ""
    assert not os.path.exists(os.path.join(c.base, "token"))
    with grpc.insecure_channel(daemons(c)["Master"][0]) as channel:
        master_pb2_grpc.MasterStub(channel).StatFs(master_pb2.StatFsRequest(), timeout=10)


@pytest.mark.parametrize("content, says", [
    (None, "cannot read"),
    (b"", "is empty"),
    (b"  \n\t\n", "is empty"),
    (b"two words\n", "one word"),
])
def test_a_bad_token_file_stops_the_daemon_at_start(tmp_path, capsys, content, says):
    token_file = tmp_path / "token"
    if content is not None:
        token_file.write_bytes(content)
    conf = tmp_path / "curvine.toml"
    conf.write_text(f"[security]\ntoken_file = '{token_file}'\n")
    assert master_server.main(["--conf", str(conf), "--meta-dir", str(tmp_path / "m"),
                               "--journal-dir", str(tmp_path / "j")]) == 2
    err = capsys.readouterr().err.strip()
    assert "security.token_file" in err and str(token_file) in err and says in err, err
    assert len(err.splitlines()) == 1, err
    assert not (tmp_path / "m").exists()  # refused before touching anything
