"""Client keepalive and the servers' ping policy agree (common/rpc.py).

Mounts got GOAWAY ``too_many_pings`` from the master and lost their lease session
twice in 5 minutes of normal use: clients pinged every 30 s, gRPC servers by default
accept a ping without data only every 5 minutes and hang up after two more.

A quiet stream (open, no data either way) between a client made with our channel
options and a server made with our server options stays up for many keepalive
periods; the control, the same client against a server with gRPC's default ping
policy, is cut with GOAWAY.  The periods are scaled down 30x (keepalive 1 s, the
server's minimum 0.5 s) so that the test takes seconds, by replacing the two numbers
in the option lists, and so exercises the same option names as the daemons.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc

from curvine.common import rpc

SCALE = 30
QUIET = 6.0  # seconds of silence on the stream: six client pings


def scaled(options, names):
    return [(k, v // SCALE if k in names else v) for k, v in options]


def serve(options) -> tuple[grpc.Server, int, threading.Event]:
    release = threading.Event()

    def wait(request_iterator, context):
        release.wait(QUIET + 30)
        return iter(())

    server = grpc.server(futures.ThreadPoolExecutor(4), options=options)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "t.T", {"Wait": grpc.stream_stream_rpc_method_handler(wait)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port, release


def quiet_stream_survives(server_options) -> tuple[bool, str]:
    server, port, release = serve(server_options)
    client_options = scaled(rpc.CHANNEL_OPTIONS, {"grpc.keepalive_time_ms"})
    stop = threading.Event()

    def nothing():
        stop.wait(QUIET + 30)
        return
        yield

    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=client_options) as ch:
            call = ch.stream_stream("/t.T/Wait")(nothing())
            deadline = time.monotonic() + QUIET
            while time.monotonic() < deadline and call.is_active():
                time.sleep(0.2)
            alive = call.is_active()
            detail = ""
            if not alive:
                try:
                    for _ in call:
                        pass
                except grpc.RpcError as e:
                    detail = f"{e.code()}: {e.details()}"
            stop.set()
            release.set()
            call.cancel()
            return alive, detail
    finally:
        stop.set()
        release.set()
        server.stop(0)


def test_the_keepalive_numbers_agree():
    client = dict(rpc.CHANNEL_OPTIONS)
    server = dict(rpc.SERVER_OPTIONS)
    assert client["grpc.keepalive_time_ms"] >= \
        server["grpc.http2.min_recv_ping_interval_without_data_ms"]
    assert server["grpc.keepalive_permit_without_calls"] == 1


def test_a_quiet_stream_survives_keepalive_pings():
    ours = scaled(rpc.SERVER_OPTIONS, {"grpc.http2.min_recv_ping_interval_without_data_ms",
                                       "grpc.http2.min_ping_interval_without_data_ms"})
    alive, detail = quiet_stream_survives(ours)
    assert alive, detail
    # the control: gRPC's default server ping policy cuts the same client off
    defaults = [(k, v) for k, v in rpc.SERVER_OPTIONS
                if k not in ("grpc.keepalive_permit_without_calls",
                             "grpc.http2.min_recv_ping_interval_without_data_ms",
                             "grpc.http2.min_ping_interval_without_data_ms")]
    alive, detail = quiet_stream_survives(defaults)
    assert not alive, "the control stream was not cut: the test cannot tell"
    print(f"\ncontrol: {detail}")
