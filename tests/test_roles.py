"""Roles: workers and clients hold different credentials (docs/security.md, "Roles").

A real cluster (LocalCluster: master, 2 workers, a FUSE mount, on loopback) made with
both credentials, BASE/token (clients) and BASE/worker-token (master and workers
only).  Every inference pod holds the client token, so these are attacks by a pod:

- with the client token, RegisterWorker, WorkerHeartbeat and BlockReport are refused
  on the master's client port (PERMISSION_DENIED) and the worker port refuses the
  client token (UNAUTHENTICATED): no pod can register a worker or learn the block-token
  key;
- with the worker token (a compromised worker node), registering another worker's uuid
  is refused, and so are a heartbeat and an empty block report in its name: the real
  worker keeps its address and its blocks, every file stays readable;
- a master (or worker) with a client token but no worker token refuses to start, and
  so does one whose two tokens are the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import grpc
import pytest

from curvine.common import auth
from curvine.proto import common_pb2, master_pb2, master_pb2_grpc

WORKER_METHODS = ("RegisterWorker", "WorkerHeartbeat", "BlockReport")


def bearer(token: str):
    return [("authorization", "Bearer " + token)]


def tokens(cluster) -> tuple[str, str]:
    return (auth.read_token_file(os.path.join(cluster.base, auth.TOKEN_FILE_NAME)),
            auth.read_token_file(os.path.join(cluster.base, auth.WORKER_TOKEN_FILE_NAME)))


def worker_port_addr(cluster) -> str:
    return f"127.0.0.1:{cluster.master_worker_port}"


def _request(method: str, uuid: str = "x", wid: int = 1):
    if method == "RegisterWorker":
        return master_pb2.RegisterWorkerRequest(worker=common_pb2.WorkerInfo(
            uuid=uuid, host_id="attacker", address="127.0.0.1:1", data_dirs=["/"],
            capacity=1 << 50))
    if method == "WorkerHeartbeat":
        return master_pb2.HeartbeatRequest(worker_id=wid, capacity=1 << 50)
    return master_pb2.BlockReportRequest(worker_id=wid)


def call(addr: str, method: str, request, token: str):
    with grpc.insecure_channel(addr) as ch:
        stub = master_pb2_grpc.MasterStub(ch)
        return getattr(stub, method)(request, timeout=10, metadata=bearer(token))


def code_of(addr: str, method: str, request, token: str):
    try:
        call(addr, method, request, token)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def real_workers(cluster) -> list[common_pb2.WorkerInfo]:
    client_token, _ = tokens(cluster)
    with grpc.insecure_channel(cluster.master_addr) as ch:
        reply = master_pb2_grpc.MasterStub(ch).Report(master_pb2.ReportRequest(), timeout=10,
                                                      metadata=bearer(client_token))
    return sorted(reply.workers, key=lambda w: w.worker_id)


def write_files(mount: str, n: int = 6) -> dict[str, bytes]:
    files = {}
    for i in range(n):
        data = os.urandom(300_000 + i)
        path = os.path.join(mount, f"f{i}")
        with open(path, "wb") as f:
            f.write(data)
        files[path] = data
    return files


def test_client_credential_cannot_act_as_worker(make_cluster):
    cluster = make_cluster(workers=1, mounts=0)
    client_token, worker_token = tokens(cluster)
    assert client_token != worker_token
    for method in WORKER_METHODS:
        code, details = code_of(cluster.master_addr, method, _request(method), client_token)
        assert code == grpc.StatusCode.PERMISSION_DENIED, (method, code)
        assert "master.worker_port" in details
        # the worker port does not take the client token at all
        code, _ = code_of(worker_port_addr(cluster), method, _request(method), client_token)
        assert code == grpc.StatusCode.UNAUTHENTICATED, (method, code)
        code, _ = code_of(worker_port_addr(cluster), method, _request(method), "")
        assert code == grpc.StatusCode.UNAUTHENTICATED, (method, code)
    # nor does it serve the client methods (a worker token is no client credential)
    code, _ = code_of(worker_port_addr(cluster), "StatFs", master_pb2.StatFsRequest(),
                      worker_token)
    assert code == grpc.StatusCode.UNIMPLEMENTED
    # no process outside master and workers holds the worker token
    for name in os.listdir(os.path.join(cluster.base, "conf")):
        text = open(os.path.join(cluster.base, "conf", name)).read()
        assert ("worker-token" in text) == name.startswith(("master", "worker")), name
    assert real_workers(cluster) and all(w.host_id != "attacker"
                                         for w in real_workers(cluster))


@pytest.mark.expect_log(r"WARNING curvine\.master\.master: refused a registration as worker \d+ \(uuid \S+\) from \S+: wrong secret")  # a takeover attempt, on purpose
def test_worker_credential_cannot_take_over_another_worker(make_cluster):
    cluster = make_cluster(workers=2, mounts=1, replicas=1)
    files = write_files(cluster.mounts[0])
    _, worker_token = tokens(cluster)
    before = real_workers(cluster)
    # worker 0 of the cluster: its uuid is in its data dir, its id in the report
    uuid = open(os.path.join(cluster.base, "worker", "0", "data", "worker.uuid")).read().strip()
    victim = next(w for w in before if w.address == cluster._procs[("worker", 0)].address)
    addr = worker_port_addr(cluster)

    # registering the victim's uuid from elsewhere, without its secret
    code, details = code_of(addr, "RegisterWorker", _request("RegisterWorker", uuid),
                            worker_token)
    assert code == grpc.StatusCode.PERMISSION_DENIED, (code, details)
    # a made-up secret does not do either
    req = _request("RegisterWorker", uuid)
    req.secret = os.urandom(32)
    assert code_of(addr, "RegisterWorker", req, worker_token)[0] == \
        grpc.StatusCode.PERMISSION_DENIED
    # an empty block report in its name would drop all its locations: refused
    code, _ = code_of(addr, "BlockReport", _request("BlockReport", wid=victim.worker_id),
                      worker_token)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    # a heartbeat in its name is not believed: the impostor is told to register
    reply = call(addr, "WorkerHeartbeat", _request("WorkerHeartbeat", wid=victim.worker_id),
                 worker_token)
    assert reply.reregister and not reply.delete_block_ids

    time.sleep(1.5)  # a heartbeat or two of the real workers
    after = real_workers(cluster)
    assert [(w.worker_id, w.address, w.host_id) for w in after] == \
        [(w.worker_id, w.address, w.host_id) for w in before]
    assert all(w.capacity < 1 << 50 for w in after)  # not the impostor's 2^50
    for path, data in files.items():
        with open(path, "rb") as f:
            assert f.read() == data, path
    log = open(cluster.log_path("master")).read()
    assert "wrong secret" in log

    # the real worker, restarted, registers again with its own secret
    cluster.restart("worker", 0)
    assert [(w.worker_id, w.address) for w in real_workers(cluster)] == \
        [(w.worker_id, w.address) for w in before]
    for path, data in files.items():
        with open(path, "rb") as f:
            assert f.read() == data, path


@pytest.mark.parametrize("case", ["no worker token", "same token"])
def test_daemons_refuse_to_start_without_separate_credentials(tmp_path, case):
    token = tmp_path / "token"
    auth.write_token_file(str(token))
    lines = [f"token_file = '{token}'"]
    if case == "same token":
        lines.append(f"worker_token_file = '{token}'")
    conf = tmp_path / "c.toml"
    conf.write_text("[security]\n" + "\n".join(lines) + "\n")
    for module, extra in (("curvine.master.server", ["--meta-dir", str(tmp_path / "m"),
                                                     "--journal-dir", str(tmp_path / "j")]),
                          ("curvine.worker.server", ["--data-dir", str(tmp_path / "d")])):
        p = subprocess.run([sys.executable, "-m", module, "--conf", str(conf), *extra],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, (module, p.returncode, p.stderr)
        assert "security.worker_token_file" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr
        assert not (tmp_path / "m").exists() and not (tmp_path / "d").exists()
