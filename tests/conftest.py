"""Shared fixtures: real local clusters (master, workers, FUSE mounts) in tmp_path.

``make_cluster(workers=2, mounts=2, **kw)`` builds and starts a ``LocalCluster``
(keyword arguments go to its constructor; ``up=False`` returns it unstarted) and
``cluster`` is one default cluster.  Whatever the test does, every cluster is torn
down afterwards (no process, no mount left), and the test fails if any daemon log
contains a traceback.  Tests that need FUSE are skipped, with the reason, on a
machine without /dev/fuse or fusermount3.
"""

from __future__ import annotations

import pytest

from cluster_util import fuse_available, tracebacks_in_logs
from curvine.cli.local import ClusterError, LocalCluster


@pytest.fixture
def make_cluster(tmp_path):
    clusters: list[LocalCluster] = []

    def make(workers: int = 2, mounts: int = 2, up: bool = True, timeout: float = 60.0,
             **kw) -> LocalCluster:
        if mounts:
            reason = fuse_available()
            if reason:
                pytest.skip(f"needs FUSE mounts: {reason}")
        base = tmp_path / ("cluster" if not clusters else f"cluster{len(clusters)}")
        c = LocalCluster(str(base), workers=workers, mounts=mounts, **kw)
        clusters.append(c)
        if up:
            c.up(timeout=timeout)
        return c

    yield make

    problems = []
    for c in clusters:
        try:
            c.down()
        except ClusterError as e:
            problems.append(f"teardown of {c.base} failed: {e}")
        problems.extend(f"a daemon logged a traceback: {t}" for t in tracebacks_in_logs(c))
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture
def cluster(make_cluster) -> LocalCluster:
    """A started cluster: 2 workers, 2 mounts (``cluster.mounts``)."""
    return make_cluster()
