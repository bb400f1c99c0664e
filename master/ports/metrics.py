"""The master's metrics and its health: the one place the master process's registry
is assembled (``registry``, served on master.http_port by server.py).

It holds the metrics every server updates where they happen (common/metrics.py: RPCs,
limits), the journal's (journal/metrics.py: fsyncs, group-commit batches), and the
collectors below.  Nothing of the collectors runs on a request path: every value is
read at scrape time from state the master keeps anyway (LMDB counters, the worker
registry, the stats of capacity, open files, leases, replication, committer and
journal).  Counters restart from 0 with the master.
"""

from __future__ import annotations

import threading
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from curvine.common import metrics
from curvine.journal.metrics import JOURNAL_METRICS
from curvine.proto import common_pb2

# Files and directories are counted by a scan of the inode table (LMDB keeps only the
# total).  A scan is repeated only when the inode count changed (or after
# RESCAN_INTERVAL), and no sooner than SCAN_COST_FACTOR times its own duration after
# the last one, so counting takes at most ~1% of a core: a namespace of a million
# inodes (a scan of ~2 s) is recounted every few minutes, a small one at every scrape.
RESCAN_INTERVAL = 300.0
SCAN_COST_FACTOR = 100
SCAN_CHUNK = 10_000  # inodes per read transaction: no long-lived reader

# capacity.stats keys per eviction reason: (files, bytes)
EVICTION_STATS = {"lru": ("evicted_files", "evicted_bytes"),
                  "ttl": ("expired_files", "expired_bytes"),
                  "orphan": ("orphans_removed", "orphan_bytes"),
                  # unlinked while open on a mount whose session then ended
                  "unlinked": ("unlinked_removed", "unlinked_bytes")}


class NamespaceCounts:
    """Files and directories in the namespace, from scans of the inode table."""

    def __init__(self, store):
        self.store = store
        self._lock = threading.Lock()
        self._at = 0.0  # monotonic end of the last scan (0: none yet)
        self._took = 0.0
        self._inodes = -1  # the inode count when it was scanned
        self._counts = (0, 0)

    def get(self, inodes: int) -> tuple[int, int]:
        """(files, directories); rescanned when due, else (or while another scrape is
        scanning) the last numbers."""
        if not self._due(inodes):
            return self._counts
        if not self._lock.acquire(blocking=not self._at):
            return self._counts
        try:
            if self._due(inodes):
                started = time.monotonic()
                self._counts = self._scan()
                self._at = time.monotonic()
                self._took = self._at - started
                self._inodes = inodes
            return self._counts
        finally:
            self._lock.release()

    def _due(self, inodes: int) -> bool:
        if not self._at:
            return True
        age = time.monotonic() - self._at
        if age < SCAN_COST_FACTOR * self._took:
            return False
        return inodes != self._inodes or age >= RESCAN_INTERVAL

    def _scan(self) -> tuple[int, int]:
        files = dirs = 0
        after = b""
        node = common_pb2.Inode()
        while True:
            n = 0
            with self.store.read() as txn:
                cur = txn.cursor(db=self.store.db["inode"])
                if not cur.set_range(after):
                    break
                for key, val in cur:
                    if key == after:
                        continue
                    node.ParseFromString(val)
                    if node.type == common_pb2.DIRECTORY:
                        dirs += 1
                    elif node.type == common_pb2.FILE:
                        files += 1
                    after = key
                    n += 1
                    if n >= SCAN_CHUNK:
                        break
            if n < SCAN_CHUNK:
                break
            time.sleep(0)  # let the serving threads have the GIL between chunks
        return files, dirs


def collectors(master) -> list[metrics.Collector]:
    ns_counts = NamespaceCounts(master.store)

    def namespace():
        with master.store.read() as txn:
            inodes = master.store.get_u64(txn, b"inode_count")
            inline = master.store.inline_bytes(txn)
        files, dirs = ns_counts.get(inodes)
        yield GaugeMetricFamily("curvine_namespace_inodes",
                                "Inodes in the namespace (files, directories, links)",
                                value=inodes)
        yield GaugeMetricFamily("curvine_namespace_files", "Files in the namespace (from "
                                "the last scan of the inodes; see docs/metrics.md)", value=files)
        yield GaugeMetricFamily("curvine_namespace_directories", "Directories in the "
                                "namespace (from the last scan of the inodes)", value=dirs)
        yield GaugeMetricFamily("curvine_namespace_inline_bytes", "Bytes of small files kept "
                                "inline by the master (at most master.inline_capacity)",
                                value=inline)

    def pool():
        snapshot = master.registry.snapshot()
        live = sum(1 for _, alive in snapshot if alive)
        lost = sum(1 for info, alive in snapshot if not alive and info.lost)
        capacity, used, estimated = master.capacity.usage()
        yield GaugeMetricFamily("curvine_pool_capacity_bytes",
                                "Capacity of the live workers", value=capacity)
        yield GaugeMetricFamily("curvine_pool_used_bytes",
                                "Bytes used on the live workers, as last reported", value=used)
        yield GaugeMetricFamily("curvine_pool_estimated_used_bytes",
                                "Used bytes plus blocks placed since and minus blocks the "
                                "workers confirmed deleted since the last reports (what "
                                "placement, eviction and statfs go by)", value=estimated)
        workers = GaugeMetricFamily("curvine_pool_workers", "Registered workers by state",
                                    labels=["state"])
        workers.add_metric(["live"], live)
        workers.add_metric(["lost"], lost)
        workers.add_metric(["silent"], len(snapshot) - live - lost)
        yield workers
        yield CounterMetricFamily("curvine_master_stalls", "Times the master itself was "
                                  "stalled for over a second (master/cluster/lag.py); workers' "
                                  "silence then is not counted against them",
                                  value=master.lag.stalls)
        yield GaugeMetricFamily("curvine_master_max_lag_seconds", "The longest the master "
                                "was late to wake up since it started", value=master.lag.max_lag)
        yield GaugeMetricFamily("curvine_pool_workers_held", "Silent workers of a mass loss "
                                "being held (master.max_lost_share): files kept",
                                value=master.replication.held_count())
        yield GaugeMetricFamily("curvine_pool_high_watermark_ratio",
                                "Eviction starts above this fraction of the capacity "
                                "(master.evict_high)", value=master.capacity.high)

    def capacity():
        st = dict(master.capacity.stats)
        files = CounterMetricFamily("curvine_evicted_files", "Files removed to free space, "
                                    "by reason (lru: eviction above the high watermark; ttl: "
                                    "expired; orphan: writer's mount gone)", labels=["reason"])
        size = CounterMetricFamily("curvine_evicted_bytes", "Bytes freed by removing files, "
                                   "by reason", labels=["reason"])
        for reason, (nfiles, nbytes) in EVICTION_STATS.items():
            files.add_metric([reason], st.get(nfiles, 0))
            size.add_metric([reason], st.get(nbytes, 0))
        yield files
        yield size
        yield CounterMetricFamily("curvine_eviction_failures", "Capacity rounds that failed",
                                  value=st.get("evict_failures", 0))
        yield CounterMetricFamily("curvine_access_reports", "Access batches reported by "
                                  "mounts (LRU order)", value=st.get("access_reports", 0))
        yield GaugeMetricFamily("curvine_lru_tracked_files", "Complete files in the LRU order",
                                value=len(master.capacity.lru))
        yield CounterMetricFamily("curvine_placement_room_made", "Placements that found no "
                                  "room and evicted synchronously", value=st.get("room_made", 0))
        yield CounterMetricFamily("curvine_placement_no_room", "Placements refused with "
                                  "ENOSPC (nothing evictable, or the block fits no worker)",
                                  value=st.get("no_room", 0))
        yield GaugeMetricFamily("curvine_open_files", "Files a mount has open for reading "
                                "(never evicted)", value=master.opens.open_files())
        ds = dict(master.deleter.stats)
        yield CounterMetricFamily("curvine_block_deletes_delivered", "Block deletes the "
                                  "workers confirmed (DeleteBlocks)", value=ds.get("blocks", 0))
        yield CounterMetricFamily("curvine_block_delete_failures", "DeleteBlocks calls that "
                                  "failed (those deletes go with a heartbeat reply)",
                                  value=ds.get("failures", 0))

    def leases():
        lt = master.leases
        st = dict(lt.stats)
        yield CounterMetricFamily("curvine_lease_grants", "Leases granted to mounts (a name "
                                  "or attributes they may cache)", value=st.get("granted", 0))
        yield CounterMetricFamily("curvine_lease_denials", "Leases refused (a revocation was "
                                  "in progress)", value=st.get("denied", 0))
        yield CounterMetricFamily("curvine_lease_revocations", "Mutations that revoked "
                                  "leases before they applied", value=st.get("revocations", 0))
        yield CounterMetricFamily("curvine_lease_invalidations", "Invalidations sent to "
                                  "mounts' sessions", value=st.get("invalidations", 0))
        yield GaugeMetricFamily("curvine_lease_sessions", "Mounts with an open lease session",
                                value=lt.open_sessions())

    def replication():
        st = master.replication.status(1)
        yield GaugeMetricFamily("curvine_under_replicated_blocks", "Blocks with fewer live "
                                "replicas than their file wants", value=st.under_replicated_blocks)
        yield GaugeMetricFamily("curvine_replication_copies_in_flight", "Block copies the "
                                "master has asked workers for and not yet seen",
                                value=st.copies_in_flight)

    def journal():
        jst = dict(master.journal.stats)
        yield GaugeMetricFamily("curvine_journal_applied_seq", "Sequence number of the last "
                                "journal record applied", value=master.committer.applied_seq)
        yield CounterMetricFamily("curvine_journal_records", "Journal records made durable",
                                  value=jst.get("records", 0))
        yield CounterMetricFamily("curvine_journal_written_bytes", "Bytes written to the "
                                  "journal", value=jst.get("bytes", 0))

    def call_port():
        port = master.call_port_server
        if port is None:
            return
        yield GaugeMetricFamily("curvine_call_port_connections", "Mounts connected to the "
                                "call port (master/ports/call_port_server.py)",
                                value=port.connections)
        yield CounterMetricFamily("curvine_call_port_calls", "Namespace calls read on the "
                                  "call port (also counted under their unary method in "
                                  "curvine_rpc_server_handled_total)", value=port.calls)
        yield GaugeMetricFamily("curvine_call_port_buffered_bytes", "Bytes of frames over "
                                "64 KiB still arriving on the call port, all connections "
                                "(at most master.call_port_buffer)", value=port.buffered)

    return [metrics.Collector(name, fn) for name, fn in (
        ("namespace", namespace), ("pool", pool), ("capacity", capacity),
        ("leases", leases), ("replication", replication), ("journal", journal),
        ("call_port", call_port))]


def registry(master, member=None):
    """``member``: a member of a master group (master/member.py), whose role's Master
    ``master`` stands for; its metrics are added."""
    extra = [metrics.Collector("group", group_collector(member))] if member is not None else []
    return metrics.registry(groups=(metrics.RPC_METRICS, JOURNAL_METRICS),
                            collectors=collectors(master) + extra)


def group_collector(member):
    def group():
        lead = member.leadership
        applied = member.applied_seq()
        yield GaugeMetricFamily("curvine_master_role", "1 while this master leads its group, "
                                "0 as a standby", value=1 if member.role() == "leader" else 0)
        yield GaugeMetricFamily("curvine_master_applied_seq", "The last journal record this "
                                "member applied", value=applied)
        yield GaugeMetricFamily("curvine_master_lag_records", "Records the group committed "
                                "that this member has not applied (as of its last look)",
                                value=max(0, member.master.journal.durable_seq - applied))
        yield CounterMetricFamily("curvine_master_failovers", "Times this member became "
                                  "leader", value=member.failovers)
        yield CounterMetricFamily("curvine_master_lease_renewals", "etcd lease keepalives "
                                  "answered", value=lead.stats["renewals"])
        yield CounterMetricFamily("curvine_master_lease_renew_failures", "etcd calls of the "
                                  "leadership thread that failed", value=lead.stats["renew_failures"])
        index = member.read_index
        yield CounterMetricFamily("curvine_master_read_index_reads", "Reads this member "
                                  "answered as a standby after its read index", value=index.reads)
        yield CounterMetricFamily("curvine_master_read_index_ranges", "Linearizable reads of "
                                  "the group's commit from etcd, each shared by the standby "
                                  "reads that arrived before it was sent", value=index.ranges)
    return group


def health(master, serving: threading.Event, member=None):
    """None when the master serves and can commit mutations (a standby of a group:
    serves reads), else why not."""
    if not serving.is_set():
        return "not serving (starting or shutting down)"
    if member is not None:
        return member.problem()
    return master.committer.problem()
