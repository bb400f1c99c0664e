"""The master credential (``security.master_token_file``): FetchCheckpoint, which hands
out the whole namespace, for the masters of a group only (docs/security.md, "Roles").

Real etcd and real ``curvine-master`` processes (test_group_masters' MasterProc), all
three tokens on:

- a member gone past the compacted journal takes the leader's checkpoint with the
  master credential, and finds every name;
- on the leader's worker port, FetchCheckpoint refuses the worker credential (what
  every GPU node's worker holds) PERMISSION_DENIED naming the key, and the client
  credential UNAUTHENTICATED; the client port refuses it PERMISSION_DENIED; the master
  credential is taken for FetchCheckpoint and for nothing else;
- a group without a master credential keeps today's behaviour (the worker credential
  fetches) and says so once at start, at INFO;
- a master whose master token file cannot be used, is the worker's or the clients'
  token, or comes without the other two, exits 2 naming security.master_token_file.
"""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest

from curvine.common import auth
from curvine.proto import common_pb2, master_pb2, master_pb2_grpc

from etcd_util import etcd  # noqa: F401 - the fixture
from test_group_masters import (TAKES_THE_CHECKPOINT, create, group,  # noqa: F401
                                restart_behind_the_journal)  # group: the fixture


def tokens(tmp_path, master: bool = True) -> dict[str, str]:
    """Token files under ``tmp_path`` (written once): key -> path, and their tokens."""
    names = {"token_file": "token", "worker_token_file": "worker-token"}
    if master:
        names["master_token_file"] = "master-token"
    files = {}
    for key, name in names.items():
        path = str(tmp_path / name)
        if not os.path.exists(path):
            auth.write_token_file(path)
        files[key] = path
    return files


def security_section(files: dict[str, str]) -> str:
    return "[security]\n" + "".join(f'{k} = "{v}"\n' for k, v in files.items())


def secured(tmp_path, master: bool = True) -> dict:
    """MasterProc's arguments for a group with these tokens."""
    files = tokens(tmp_path, master)
    return {"extra": security_section(files),
            "token": auth.read_token_file(files["token_file"])}


def fetch(addr: str, token: str) -> tuple[grpc.StatusCode, str, int]:
    """FetchCheckpoint at ``addr`` with ``token``: its status, details and the chunks
    received."""
    chunks = 0
    with grpc.insecure_channel(addr) as ch:
        stream = master_pb2_grpc.MasterStub(ch).FetchCheckpoint(
            master_pb2.FetchCheckpointRequest(min_seq=0), timeout=30,
            metadata=[("authorization", "Bearer " + token)] if token else None)
        try:
            for _ in stream:
                chunks += 1
        except grpc.RpcError as e:
            return e.code(), e.details() or "", chunks
    return grpc.StatusCode.OK, "", chunks


def read(path: str) -> str:
    return auth.read_token_file(path)


@pytest.mark.expect_log(*TAKES_THE_CHECKPOINT)
def test_a_member_behind_the_journal_takes_the_checkpoint_with_the_master_credential(
        group, tmp_path):  # noqa: F811
    leader, standby = group(2, **secured(tmp_path))
    restart_behind_the_journal(leader, standby)  # its fetch sends the master token
    log = open(standby.log_path).read()
    assert "took the checkpoint at seq" in log
    for m in (leader, standby):  # each said once which credential the fetch takes
        text = open(m.log_path).read()
        assert text.count("takes the master credential (security.master_token_file) "
                          "only") >= 1, m.id
        assert "takes the worker credential" not in text, m.id


def test_fetch_checkpoint_takes_the_master_credential_only(group, tmp_path):  # noqa: F811
    files = tokens(tmp_path)
    (leader,) = group(1, **secured(tmp_path))
    client, worker, master = (read(files[k]) for k in
                              ("token_file", "worker_token_file", "master_token_file"))
    create(leader, b"secret-name")
    # a worker node's credential: refused, naming the key that fetches
    code, details, chunks = fetch(leader.worker_addr, worker)
    assert (code, chunks) == (grpc.StatusCode.PERMISSION_DENIED, 0), (code, details)
    assert "FetchCheckpoint takes the master credential (security.master_token_file)" \
        in details, details
    # the client credential: not taken on the worker port at all
    assert fetch(leader.worker_addr, client)[:3:2] == (grpc.StatusCode.UNAUTHENTICATED, 0)
    assert fetch(leader.worker_addr, "")[:3:2] == (grpc.StatusCode.UNAUTHENTICATED, 0)
    # nor is FetchCheckpoint served on the client port
    code, details, chunks = fetch(leader.addr, client)
    assert (code, chunks) == (grpc.StatusCode.PERMISSION_DENIED, 0), (code, details)
    assert "master.worker_port" in details and "security.master_token_file" in details
    # the master credential fetches
    code, details, chunks = fetch(leader.worker_addr, master)
    assert code == grpc.StatusCode.OK and chunks > 0, (code, details)
    # and is good for nothing else there: no worker registers with it
    with grpc.insecure_channel(leader.worker_addr) as ch:
        with pytest.raises(grpc.RpcError) as e:
            master_pb2_grpc.MasterStub(ch).RegisterWorker(
                master_pb2.RegisterWorkerRequest(worker=common_pb2.WorkerInfo(
                    uuid="x", host_id="attacker", address="127.0.0.1:1", data_dirs=["/"],
                    capacity=1 << 30)),
                timeout=10, metadata=[("authorization", "Bearer " + master)])
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value
    assert "FetchCheckpoint only" in e.value.details()
    # nor on the client port
    with pytest.raises(grpc.RpcError) as e:
        with grpc.insecure_channel(leader.addr) as ch:
            master_pb2_grpc.MasterStub(ch).StatFs(
                master_pb2.StatFsRequest(), timeout=10,
                metadata=[("authorization", "Bearer " + master)])
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_without_a_master_credential_the_worker_credential_fetches(group, tmp_path):  # noqa: F811
    files = tokens(tmp_path, master=False)
    (leader,) = group(1, **secured(tmp_path, master=False))
    create(leader, b"n")
    code, details, chunks = fetch(leader.worker_addr, read(files["worker_token_file"]))
    assert code == grpc.StatusCode.OK and chunks > 0, (code, details)
    log = open(leader.log_path).read()
    assert log.count("takes the worker credential, which every worker holds: set "
                     "security.master_token_file") == 1, log[-2000:]


@pytest.mark.parametrize("case", ["unreadable", "the worker token", "the client token",
                                  "without the others"])
def test_a_master_refuses_an_unusable_master_credential(tmp_path, case):
    files = tokens(tmp_path)
    if case == "unreadable":
        files["master_token_file"] = str(tmp_path / "absent")
        expected = f"security.master_token_file: cannot read {tmp_path / 'absent'}"
    elif case == "the worker token":
        files["master_token_file"] = files["worker_token_file"]
        expected = ("security.master_token_file: must hold another token than "
                    "security.worker_token_file")
    elif case == "the client token":
        files["master_token_file"] = files["token_file"]
        expected = ("security.master_token_file: must hold another token than "
                    "security.token_file")
    else:
        files = {"master_token_file": files["master_token_file"]}
        expected = "required when security.master_token_file is set"
    conf = tmp_path / "c.toml"
    conf.write_text(security_section(files))
    p = subprocess.run([sys.executable, "-m", "curvine.master.server", "--conf", str(conf),
                        "--meta-dir", str(tmp_path / "m"), "--journal-dir", str(tmp_path / "j")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert expected in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "m").exists()
