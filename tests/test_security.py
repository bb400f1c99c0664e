"""A process's credentials as a value (common/security.py), in this process only.

``Security.load`` reads what a role needs (a mount never the worker token); the value
never shows a token in ``repr``, keys the client's channel pool (equal loads are equal,
also across a spawned process); a server made with it refuses calls without the token
of the roles it accepts, a channel made with it sends the client token or, after
``as_worker()``, the worker token, or after ``as_master()`` the master token (a
master's, when ``security.master_token_file`` is set; else the worker token); a value
that lacks a role's token refuses to check or send that role's calls instead of going
without; a server may take another role's token for some methods, and refuses a token
of its own of another role for them PERMISSION_DENIED, naming the credential.
"""

from __future__ import annotations

import pickle

import grpc
import pytest

from curvine.common import auth, rpc
from curvine.common.config import Config, SecurityConfig
from curvine.common.security import CLIENT, MASTER, NO_SECURITY, WORKER, Security


def _config(tmp_path, worker: bool = True, master: bool = False) -> Config:
    cfg = Config()
    client_file, worker_file = tmp_path / "token", tmp_path / "worker-token"
    master_file = tmp_path / "master-token"
    if not client_file.exists():
        auth.write_token_file(str(client_file))
        auth.write_token_file(str(worker_file))
        auth.write_token_file(str(master_file))
    cfg.security = SecurityConfig(token_file=str(client_file),
                                  worker_token_file=str(worker_file) if worker else "",
                                  master_token_file=str(master_file) if master else "")
    return cfg


def test_each_role_loads_what_it_needs(tmp_path):
    cfg = _config(tmp_path)
    client = Security.load(cfg)
    daemon = Security.load(cfg, role="worker")
    assert client.client_token == daemon.client_token == auth.read_token_file(
        cfg.security.token_file)
    assert client.worker_token == ""  # a mount never reads the worker token file
    assert daemon.worker_token == auth.read_token_file(cfg.security.worker_token_file)
    assert client.material is None and client.channel_credentials is None
    with pytest.raises(auth.TokenError, match="worker_token_file: required"):
        Security.load(_config(tmp_path, worker=False), role="master")
    with pytest.raises(ValueError):
        Security.load(cfg, role="fuse")


def test_the_value_hides_its_tokens_and_keys_the_pool(tmp_path):
    cfg = _config(tmp_path)
    daemon = Security.load(cfg, role="master")
    for shown in (repr(daemon), str(daemon), repr(daemon.as_worker())):
        assert daemon.client_token not in shown and daemon.worker_token not in shown
    again = Security.load(cfg, role="master")
    assert again == daemon and hash(again) == hash(daemon)
    assert daemon.as_worker() != daemon  # another channel: it sends another token
    assert pickle.loads(pickle.dumps(daemon.as_worker())) == daemon.as_worker()
    assert {NO_SECURITY: 1}[Security()] == 1


def test_a_value_without_a_role_token_refuses_that_role(tmp_path):
    client = Security.load(_config(tmp_path))
    with pytest.raises(ValueError):
        client.as_worker()  # it would send no token at all
    with pytest.raises(ValueError):
        rpc.make_server(1, security=client, accept=(WORKER,))  # it would check none
    assert NO_SECURITY.accepted((CLIENT, WORKER)) == ()  # open cluster: no checks
    assert NO_SECURITY.as_worker().token == ""


def _serve(security: Security, accept, accept_methods=None) -> tuple[grpc.Server, int]:
    def echo(request, context):
        return request

    server = rpc.make_server(2, security=security, accept=accept,
                             accept_methods=accept_methods)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "t.T", {"Echo": grpc.unary_unary_rpc_method_handler(echo),
                "Fetch": grpc.unary_unary_rpc_method_handler(echo)}),))
    port = rpc.bind(server, "127.0.0.1", 0, security)
    server.start()
    return server, port


def _code(address: str, security: Security, method: str = "Echo") -> grpc.StatusCode:
    return _answer(address, security, method)[0]


def _answer(address: str, security: Security, method: str = "Echo"):
    with rpc.make_channel(address, security) as channel:
        try:
            channel.unary_unary(f"/t.T/{method}")(b"x", timeout=10)
        except grpc.RpcError as e:
            return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def test_servers_accept_and_channels_send_by_role(tmp_path):
    daemon = Security.load(_config(tmp_path), role="worker")
    workers_only, wport = _serve(daemon, (WORKER,))
    both, bport = _serve(daemon, (CLIENT, WORKER))
    try:
        assert _code(f"127.0.0.1:{wport}", daemon) == grpc.StatusCode.UNAUTHENTICATED
        assert _code(f"127.0.0.1:{wport}", daemon.as_worker()) == grpc.StatusCode.OK
        assert _code(f"127.0.0.1:{wport}", NO_SECURITY) == grpc.StatusCode.UNAUTHENTICATED
        assert _code(f"127.0.0.1:{bport}", daemon) == grpc.StatusCode.OK
        assert _code(f"127.0.0.1:{bport}", daemon.as_worker()) == grpc.StatusCode.OK
        assert _code(f"127.0.0.1:{bport}", NO_SECURITY) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        workers_only.stop(0)
        both.stop(0)


def test_the_master_token_is_the_masters_alone(tmp_path):
    cfg = _config(tmp_path, master=True)
    master = Security.load(cfg, role="master")
    assert master.master_token == auth.read_token_file(cfg.security.master_token_file)
    # workers and clients never read it (a shared config may name it)
    assert Security.load(cfg, role="worker").master_token == ""
    assert Security.load(cfg).master_token == ""
    assert master.as_master().token == master.master_token
    assert master.as_worker().token == master.worker_token == master.as_master().as_worker().token
    assert master.as_master().as_worker() == master.as_worker()
    assert master.masters_role == MASTER
    for shown in (repr(master), repr(master.as_master())):
        assert master.master_token not in shown and master.client_token not in shown
    assert "sends=master" in repr(master.as_master())
    assert pickle.loads(pickle.dumps(master.as_master())) == master.as_master()
    # a group without one: the masters' calls go and are taken as a worker's
    plain = Security.load(_config(tmp_path), role="master")
    assert plain.masters_role == WORKER and plain.as_master() == plain.as_worker()
    with pytest.raises(ValueError, match="master_token_file"):
        plain.accepted((MASTER,))


@pytest.mark.parametrize("case", ["unreadable", "the worker token", "the client token",
                                  "without the others"])
def test_an_unusable_master_token_is_refused_naming_the_key(tmp_path, case):
    cfg = _config(tmp_path, master=True)
    sec = cfg.security
    if case == "unreadable":
        sec.master_token_file = str(tmp_path / "absent")
        match = "security.master_token_file: cannot read"
    elif case == "the worker token":
        sec.master_token_file = sec.worker_token_file
        match = "security.master_token_file: must hold another token than " \
                "security.worker_token_file"
    elif case == "the client token":
        sec.master_token_file = sec.token_file
        match = "security.master_token_file: must hold another token than security.token_file"
    else:
        sec.token_file = sec.worker_token_file = ""
        match = "required when security.master_token_file is set"
    with pytest.raises(auth.TokenError, match=match):
        Security.load(cfg, role="master")
    assert Security.load(cfg, role="worker").master_token == ""  # workers never read it


def test_a_method_may_take_another_roles_token_only(tmp_path):
    master = Security.load(_config(tmp_path, master=True), role="master")
    server, port = _serve(master, (WORKER,), {"/t.T/Fetch": (MASTER,)})
    addr = f"127.0.0.1:{port}"
    try:
        assert _code(addr, master.as_worker()) == grpc.StatusCode.OK
        assert _code(addr, master.as_master(), "Fetch") == grpc.StatusCode.OK
        code, details = _answer(addr, master.as_worker(), "Fetch")
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert details == ("Fetch takes the master credential (security.master_token_file) "
                           "only")
        code, details = _answer(addr, master.as_master())
        assert code == grpc.StatusCode.PERMISSION_DENIED and "Fetch only" in details
        for method in ("Echo", "Fetch"):  # tokens the server does not take at all
            assert _code(addr, master, method) == grpc.StatusCode.UNAUTHENTICATED
            assert _code(addr, NO_SECURITY, method) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(0)
