"""The worker process's metrics: the block bytes it serves and stores and the block
calls it refuses (updated where they happen: service.py, data_port.py), and the one
place its registry is assembled (``registry``, served on worker.http_port by
server.py) with the collectors that read its state at scrape time.

The machinery (registry, collectors, the HTTP endpoint) and the metrics every server
updates (RPCs, limits) are common/metrics.py's.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from curvine.common import metrics

# path="short_circuit": a staging file written by a client on this host, adopted
# without the worker's data stream; path="remote": bytes carried by a worker's
# ReadBlock/WriteBlock stream (or its data port).
WORKER_READ_BYTES = Counter(
    "curvine_worker_read_bytes",
    "Block bytes this worker sent to clients (ReadBlock streams)",
    ["path"], registry=None)
WORKER_WRITTEN_BYTES = Counter(
    "curvine_worker_written_bytes",
    "Block bytes this worker stored for clients: remote = received on WriteBlock "
    "streams, short_circuit = staging files written by a client on this host and adopted",
    ["path"], registry=None)
BLOCK_TOKEN_REFUSED = Counter(
    "curvine_block_token_refused",
    "Block calls this worker refused because the block token was missing, wrong, or "
    "granted less access (common/block_tokens.py)",
    registry=None)
WORKER_IO_METRICS = (WORKER_READ_BYTES, WORKER_WRITTEN_BYTES, BLOCK_TOKEN_REFUSED)
WORKER_READ_REMOTE = WORKER_READ_BYTES.labels(path="remote")
WORKER_WRITTEN_REMOTE = WORKER_WRITTEN_BYTES.labels(path="remote")
WORKER_WRITTEN_SHORT_CIRCUIT = WORKER_WRITTEN_BYTES.labels(path="short_circuit")


def registry(store, link, sockets=None) -> CollectorRegistry:
    """The worker process's registry: the RPC metrics of every server, the block I/O
    above, and collectors that read at scrape time the block store (``store``,
    blockstore.BlockStore), the link to the master (``link``, server.MasterLink) and
    the domain socket (``sockets``, domain_socket.DomainSocketServer, or None).  They
    come as arguments, not imports: service.py and data_port.py import this module."""
    def fd_state():
        yield GaugeMetricFamily("curvine_worker_domain_socket_up", "1 while the domain "
                                "socket (worker.domain_socket) serves descriptors",
                                value=int(sockets is not None and sockets.serving is None))
        if sockets is None:
            return
        yield GaugeMetricFamily("curvine_worker_domain_socket_connections",
                                "Open connections of local clients to the domain socket",
                                value=sockets.connections)
        blocks = CounterMetricFamily("curvine_worker_fd_blocks", "Blocks whose descriptor "
                                     "the domain socket passed to a local client (read: "
                                     "the block file; write: a staging file finalised)",
                                     labels=["op"])
        nbytes = CounterMetricFamily("curvine_worker_fd_bytes", "Bytes of those blocks "
                                     "(read: their sizes; write: the lengths finalised)",
                                     labels=["op"])
        for op, (n, size) in sockets.served.items():
            blocks.add_metric([op], n)
            nbytes.add_metric([op], size)
        refused = CounterMetricFamily("curvine_worker_fd_refused", "Domain socket requests "
                                      "and connections refused, by reason (busy: too many "
                                      "connections or writes; idle: dropped for silence; "
                                      "permission: a missing or wrong block token)",
                                      labels=["reason"])
        for reason, n in sockets.refused.items():
            refused.add_metric([reason], n)
        yield from (blocks, nbytes, refused)

    def state():
        capacity, used, blocks = store.stats()
        yield GaugeMetricFamily("curvine_worker_capacity_bytes",
                                "Bytes this worker may hold (worker.capacity or the free "
                                "space of its data dirs)", value=capacity)
        yield GaugeMetricFamily("curvine_worker_used_bytes", "Bytes of the blocks stored",
                                value=used)
        yield GaugeMetricFamily("curvine_worker_blocks", "Blocks stored", value=blocks)
        yield GaugeMetricFamily("curvine_worker_registered", "1 once registered with the "
                                "master (and its block report sent)", value=int(link.ready.is_set()))
        age = time.monotonic() - link.last_contact if link.last_contact else float("nan")
        yield GaugeMetricFamily("curvine_worker_master_contact_age_seconds", "Seconds since "
                                "the master last accepted a heartbeat or registration", value=age)
    return metrics.registry(groups=(metrics.RPC_METRICS, WORKER_IO_METRICS),
                            collectors=[metrics.Collector("worker", state),
                                        metrics.Collector("domain socket", fd_state)])
