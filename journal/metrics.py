"""The journal's metrics, updated where it syncs (journal.py) and served in the
registry of the process that writes it: the master's, assembled in
master/ports/metrics.py (``registry``)."""

from __future__ import annotations

from prometheus_client import Histogram

FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)

JOURNAL_FSYNC = Histogram(
    "curvine_journal_fsync_duration_seconds",
    "Duration of one fdatasync of the journal's active segment",
    buckets=FSYNC_BUCKETS, registry=None)
JOURNAL_BATCH = Histogram(
    "curvine_journal_batch_records",
    "Records made durable by one journal sync (group commit batch size)",
    buckets=BATCH_BUCKETS, registry=None)
JOURNAL_ETCD_WRITE = Histogram(
    "curvine_journal_etcd_write_duration_seconds",
    "Duration of one leader-guarded etcd Txn of journal records (a master group's "
    "durability point, in place of the fdatasync)",
    buckets=FSYNC_BUCKETS, registry=None)
JOURNAL_METRICS = (JOURNAL_FSYNC, JOURNAL_BATCH, JOURNAL_ETCD_WRITE)
