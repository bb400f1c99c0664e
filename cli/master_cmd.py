"""`curvine master`: the master group's operations.

    curvine master step-down [--timeout SECONDS] [--master H:P] [--conf FILE | --base DIR]

``step-down`` is the planned switchover (docs/operations.md, "Master group"): the
leader gives up its etcd lease and sits out the next campaign, a standby that has
applied everything takes over, and the command returns once another member leads,
printing the old and the new leader.  A single master (no group) refuses it.
"""

from __future__ import annotations

import argparse
import contextlib
import time

from curvine.common.errors import CurvineError, ErrorKind
from curvine.proto import master_pb2

from . import connect

HELP = "the master group: planned switchover"
DESCRIPTION = ("Operate the master group (docs/operations.md, \"Master group\"): "
               "step-down hands the lead to a standby.")
STEP_DOWN_WAIT = 30.0  # seconds for another member to lead (lease TTL plus an election)


def register(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="master_cmd", metavar="{step-down}", required=True)
    sd = sub.add_parser("step-down", help="the leader hands the lead to a standby (planned "
                                          "switchover); returns once another member leads")
    sd.add_argument("--timeout", type=float, default=STEP_DOWN_WAIT, metavar="SECONDS",
                    help=f"how long to wait for a new leader (default {STEP_DOWN_WAIT:g})")
    connect.add_options(sd)
    sd.set_defaults(func=_cmd_step_down, _parser=sd)


def _leader(rpc) -> tuple[str, str]:
    """(member id, gRPC address) of the leader as the group has it ("" while none)."""
    reply = rpc.call("GetGroup", master_pb2.GetGroupRequest())
    for m in reply.members:
        if m.role == "leader":
            return m.id, m.grpc
    return "", reply.leader


def _cmd_step_down(args, parser) -> int:
    with contextlib.closing(connect.admin_rpc(args)) as rpc:
        old_id, old = _leader(rpc)
        # not retried after a lost reply: a retry would reach the next leader and make
        # it step down too; a standby's NOT_LEADER is followed (it changed nothing)
        try:
            rpc.call("StepDown", master_pb2.StepDownRequest(), idempotent=False)
        except CurvineError as e:
            if e.kind == ErrorKind.NOT_SUPPORTED:
                raise CurvineError(e.kind, f"step-down: {e.message}") from None
            raise
        deadline = time.monotonic() + args.timeout
        while True:
            try:
                new_id, new = _leader(rpc)
            except CurvineError as e:
                if e.kind not in (ErrorKind.UNAVAILABLE, ErrorKind.TIMEOUT):
                    raise
                new_id, new = "", ""
            if new and new != old:
                print(f"leader {old_id or old} ({old}) stepped down; {new_id or new} ({new}) "
                      "leads now")
                return 0
            if time.monotonic() > deadline:
                raise CurvineError(ErrorKind.TIMEOUT, f"{old_id or old} stepped down, but no "
                                   f"other member leads after {args.timeout:g}s (see "
                                   "`curvine report`)")
            time.sleep(0.1)
