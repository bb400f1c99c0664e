"""Shared fixtures: real local clusters (master, workers, FUSE mounts) in tmp_path.

``make_cluster(workers=2, mounts=2, **kw)`` builds and starts a ``LocalCluster``
(keyword arguments go to its constructor; ``up=False`` returns it unstarted) and
``cluster`` is one default cluster.  Whatever the test does, every cluster is torn
down afterwards (no process, no mount left), and the test fails if any daemon log
contains a traceback.  Tests that need FUSE are skipped, with the reason, on a
machine without /dev/fuse or fusermount3.

Every test carries the marker of its module's layer (LAYERS below; the heaviest thing
any test of the module starts): ``unit`` (no servers), ``services`` (real master and
worker servicers in this process, on loopback), ``daemons`` (real curvine processes,
FUSE mounts, the CLI in a subprocess).  ``pytest -m unit`` runs in seconds; a new test
module must be placed in a layer or collection fails.
"""

from __future__ import annotations

import pytest

from cluster_util import fuse_available, tracebacks_in_logs
from curvine.devtools.local import ClusterError, LocalCluster


LAYERS = {
    "unit": {"test_apt_lock", "test_connector_naming", "test_journal", "test_listings", "test_mounts", "test_pod_fork",
             "test_posix_workload", "test_proto"},
    "services": {"test_calls", "test_call_port", "test_fuse_ops", "test_fuzz", "test_keepalive", "test_master",
                 "test_master_put", "test_master_posix", "test_security", "test_data_port"},
    "daemons": {
        "test_auth", "test_bench", "test_call_port_mounts", "test_bigdir", "test_block_garbage", "test_block_tokens",
        "test_capacity", "test_capacity_defaults", "test_cli_admin", "test_cli_cluster", "test_client_trust",
        "test_config", "test_connector", "test_crash", "test_deploy", "test_domain_socket", "test_fio", "test_fs_lmcache",
        "test_fs_posix", "test_fs_posix_types", "test_fs_stress", "test_inline_files", "test_install",
        "test_random_io",
        "test_journal_hardening", "test_kvstore", "test_leases", "test_lmcache",
        "test_local_cli", "test_master_guards", "test_master_outage", "test_metrics",
        "test_permissions", "test_private_files", "test_replicas", "test_roles", "test_shared_disk",
        "test_small_hardening", "test_starvation", "test_stream_limits", "test_tls",
        "test_worker", "test_worker_safety"},
}
_LAYER_OF = {module: layer for layer, modules in LAYERS.items() for module in modules}


def pytest_collection_modifyitems(config, items):
    unplaced = set()
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1]
        layer = _LAYER_OF.get(module)
        if layer is None:
            unplaced.add(module)
        else:
            item.add_marker(getattr(pytest.mark, layer))
    if unplaced:
        raise pytest.UsageError(f"tests/conftest.py LAYERS: place {', '.join(sorted(unplaced))} "
                                "in a layer (unit, services or daemons)")


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
