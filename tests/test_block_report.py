"""A worker's full block report races the blocks finished around it (issue 35).

A worker registers (with a restarted master or a new leader), then lists its blocks and
sends that list; a client may finish a block on it and publish it between the listing
and the master reading the report.  The report does not name that block, yet the
master must not drop its location: only the blocks the master located there when it
answered the registration may be missing from the report.

A real master process on loopback; the test is the worker on the master's worker port
(with the worker credential) so that the report is in flight exactly while a block is
published.  The same report, answering a registration made after the publish, still
drops the location of the block it lacks.
"""

from __future__ import annotations

import os

import grpc
import pytest

from curvine.client.master.master_client import MasterClient
from curvine.common import auth
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO
from curvine.proto import common_pb2, master_pb2, master_pb2_grpc

HOST = "racer-host"


class WorkerPort:
    """The test's calls to the master as a worker (its own uuid and secret)."""

    def __init__(self, cluster):
        self.token = auth.read_token_file(os.path.join(cluster.base,
                                                       auth.WORKER_TOKEN_FILE_NAME))
        self.channel = grpc.insecure_channel(f"127.0.0.1:{cluster.master_worker_port}")
        self.stub = master_pb2_grpc.MasterStub(self.channel)
        self.secret = os.urandom(32)
        self.worker_id = 0
        self.registration = b""

    def call(self, method: str, request):
        return getattr(self.stub, method)(request, timeout=10,
                                          metadata=[("authorization", "Bearer " + self.token)])

    def register(self) -> None:
        reply = self.call("RegisterWorker", master_pb2.RegisterWorkerRequest(
            worker=common_pb2.WorkerInfo(uuid="racer", host_id=HOST, address="127.0.0.1:1",
                                         data_dirs=["/racer"], capacity=1 << 40),
            secret=self.secret))
        self.worker_id, self.registration = reply.worker_id, reply.registration

    def report(self, block_ids=()) -> None:
        self.call("BlockReport", master_pb2.BlockReportRequest(
            worker_id=self.worker_id, registration=self.registration,
            block_ids=list(block_ids), block_mtimes_ns=[0] * len(block_ids)))

    def close(self) -> None:
        self.channel.close()


def publish_on(mc: MasterClient, worker_id: int, name: bytes) -> tuple[int, int]:
    """A one-block file whose block the master placed on ``worker_id`` (the client's
    host): (ino, block id)."""
    f = mc.create(ROOT_INO, name)
    block_id, targets, _ = mc.add_block(f.ino, HOST, size_hint=4096)
    assert [w.worker_id for w in targets] == [worker_id]
    mc.complete_file(f.ino, [common_pb2.Block(block_id=block_id, length=4096,
                                              worker_ids=[worker_id])], 4096)
    return f.ino, block_id


def located(mc: MasterClient, ino: int) -> list[list[int]]:
    _, blocks, _ = mc.get_blocks(ino)
    return [list(b.worker_ids) for b in blocks]


@pytest.mark.expect_log(r"WARNING curvine\.master\.master: worker \d+ did not report 1 blocks the master expected there; dropping those locations")  # the second report, on purpose
def test_block_published_while_the_report_is_in_flight_keeps_its_location(make_cluster):
    cluster = make_cluster(workers=1, mounts=0, replicas=1)
    worker = WorkerPort(cluster)
    mc = MasterClient(cluster.master_addr, timeout=10, wait=10, security=cluster.security)
    try:
        worker.register()
        # the worker lists its blocks (none) ... a client finishes one there and publishes
        # it ... and the master reads the list
        ino, block_id = publish_on(mc, worker.worker_id, b"late")
        worker.report([])
        assert located(mc, ino) == [[worker.worker_id]]

        # a later registration (the worker restarted) whose report lacks the block: the
        # master located it there when it answered, so it is gone (a clean miss)
        worker.register()
        worker.report([])
        with pytest.raises(CurvineError) as e:
            mc.get_blocks(ino)
        assert e.value.kind == ErrorKind.NOT_FOUND
    finally:
        mc.close()
        worker.close()
