"""The mount process's metrics (curvine-fuse): the lookups and attribute requests it
answers (updated in filesystem.py and page_cache.py), and the one place its registry
is assembled (``registry``, served on fuse.http_port by main.py): these, the client
library's block I/O (client/files/metrics.py) and the limits of every port.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from curvine.client.files.metrics import CLIENT_IO_METRICS
from curvine.common import metrics

FUSE_LOOKUPS = Counter(
    "curvine_fuse_lookups",
    "Name lookups that reached this FUSE client, by result: hit = the name exists, "
    "miss = it does not (ENOENT; LMCache's miss path), error = anything else",
    ["result"], registry=None)
FUSE_LOOKUP_LOCAL = Counter(
    "curvine_fuse_lookups_answered_locally",
    "Misses (counted in curvine_fuse_lookups too) answered from a directory listing "
    "leased to this mount, without asking the master",
    registry=None)
FUSE_GETATTR_LOCAL = Counter(
    "curvine_fuse_getattrs_answered_locally",
    "Attribute requests answered from the version this mount had just published, under "
    "its lease, without asking the master",
    registry=None)
FUSE_OPEN_WAITS = Counter(
    "curvine_fuse_opens_waiting_for_readers",
    "O_TRUNC or O_RDWR opens that waited for other processes' page-cache readers of the "
    "file on this mount to close (consistency rule 1, docs/consistency.md), by outcome: closed = they all closed, "
    "timeout = the open went on after fuse_client/filesystem.py CACHED_READERS_WAIT",
    ["outcome"], registry=None)
FUSE_METRICS = (FUSE_LOOKUPS, FUSE_LOOKUP_LOCAL, FUSE_GETATTR_LOCAL, FUSE_OPEN_WAITS)
FUSE_LOOKUP_HIT = FUSE_LOOKUPS.labels(result="hit")
FUSE_LOOKUP_MISS = FUSE_LOOKUPS.labels(result="miss")
FUSE_LOOKUP_ERROR = FUSE_LOOKUPS.labels(result="error")


def registry() -> CollectorRegistry:
    """The mount's registry."""
    return metrics.registry(groups=(CLIENT_IO_METRICS, FUSE_METRICS))
