r"""Shared fixtures: real local clusters (master, workers, FUSE mounts) in tmp_path.

``make_cluster(workers=2, mounts=2, **kw)`` builds and starts a ``LocalCluster``
(keyword arguments go to its constructor; ``up=False`` returns it unstarted) and
``cluster`` is one default cluster.  Whatever the test does, every cluster is torn
down afterwards (no process, no mount left).  Tests that need FUSE are skipped, with
the reason, on a machine without /dev/fuse or fusermount3.

The daemons' logs are part of every test: a test fails when a daemon it ran (any
LocalCluster, of any scope, and any daemon log under its tmp_path) logged a record at
WARNING, ERROR or CRITICAL, a gRPC core line at E or F, or a traceback, unless the test
declares it expected::

    # the killed worker's copies are read again from the other replica
    @pytest.mark.expect_log(r"WARNING curvine\.client\.files\.file_reader: .*Connection refused")

Each pattern is a regex searched (``re.search``) in the record: its line
(``<asctime> <role>[pid] LEVEL logger: message``) and the traceback that follows it.
Keep patterns narrow and say in a comment why the test provokes them.  A module's
``pytestmark`` declares for all its tests.  Lines of a module-scoped cluster are
checked with the test that was running when they were written (what is left, with
the module's last test).  ``CURVINE_LOG_REPORT=FILE`` appends every such record,
expected or not, to FILE as JSON lines.

Every test carries the marker of its module's layer (LAYERS below; the heaviest thing
any test of the module starts): ``unit`` (no servers), ``services`` (real master and
worker servicers in this process, on loopback), ``daemons`` (real curvine processes,
FUSE mounts, the CLI in a subprocess).  ``pytest -m unit`` runs in seconds; a new test
module must be placed in a layer or collection fails.
"""

from __future__ import annotations

import pytest

from cluster_util import DAEMON_LOGS, describe_problems, fuse_available
from curvine.devtools.local import ClusterError, LocalCluster


LAYERS = {
    "unit": {"test_apt_lock", "test_connector_naming", "test_fds", "test_kernel_cache", "test_journal", "test_layers", "test_layers_client",
             "test_listings", "test_master_addrs",
             "test_mounts", "test_pod_fork",
             "test_posix_workload", "test_proto", "test_read_index"},
    "services": {"test_calls", "test_call_port", "test_group_journal", "test_fuse_ops", "test_fuzz", "test_keepalive", "test_master",
                 "test_master_put", "test_master_posix", "test_security", "test_data_port",
                 "test_request_limits"},
    "daemons": {
        "test_auth", "test_bench", "test_group_etcd_security", "test_group_master_credential", "test_group_masters", "test_call_port_mounts", "test_bigdir", "test_block_garbage", "test_block_report", "test_block_tokens",
        "test_capacity", "test_capacity_defaults", "test_cli_admin", "test_cli_cluster", "test_client_trust",
        "test_concurrency_stress",
        "test_config", "test_connector", "test_crash", "test_deploy", "test_domain_socket", "test_fio", "test_fs_lmcache",
        "test_fs_posix", "test_fs_posix_types", "test_fs_stress", "test_inline_files", "test_install",
        "test_random_io",
        "test_journal_hardening", "test_kvstore", "test_leases", "test_lmcache",
        "test_local_cli", "test_master_group", "test_master_guards", "test_master_outage", "test_metrics",
        "test_permissions", "test_private_files", "test_put_many", "test_replicas", "test_roles", "test_shared_disk",
        "test_small_hardening", "test_starvation", "test_stream_limits", "test_tls", "test_port_limits",
        "test_worker", "test_worker_safety"},
}
_LAYER_OF = {module: layer for layer, modules in LAYERS.items() for module in modules}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "expect_log(*patterns): daemon log records (WARNING or worse, or a "
        "traceback) that this test provokes on purpose; each pattern is a regex searched in "
        "the record (see tests/conftest.py)")


# Every LocalCluster a test makes (make_cluster, a module's fixture, a test's own) has
# its logs checked: its base is recorded when it is made.
if not getattr(LocalCluster.__init__, "_logs_watched", False):
    _cluster_init = LocalCluster.__init__

    def _watched_init(self, base, *args, **kw):
        _cluster_init(self, base, *args, **kw)
        DAEMON_LOGS.register(self.base)

    _watched_init._logs_watched = True
    LocalCluster.__init__ = _watched_init


def _expected_logs(node) -> list[str]:
    patterns = []
    for m in node.iter_markers("expect_log"):
        for p in m.args:
            if not isinstance(p, str):
                raise pytest.UsageError(f"{node.nodeid}: expect_log takes regex strings, got {p!r}")
            patterns.append(p)
    return patterns


@pytest.fixture(autouse=True)
def _daemon_logs(request):
    """Fail the test on daemon log records it does not declare expected (module doc)."""
    tmp = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    patterns = _expected_logs(request.node)
    yield
    # after every other fixture of the test: its clusters are down, their logs complete
    bad = DAEMON_LOGS.check(request.node.nodeid, patterns, roots=[tmp] if tmp else [])
    if bad:
        pytest.fail(describe_problems(bad), pytrace=False)


@pytest.fixture(autouse=True, scope="module")
def _daemon_logs_left(request):
    """What a module's clusters logged after its last test's check (their teardown):
    checked with the patterns of the module's tests."""
    before = set(DAEMON_LOGS.bases)
    yield
    mine = [b for b in DAEMON_LOGS.bases if b not in before]
    patterns = set(_expected_logs(request.node))
    for b in mine:
        patterns |= DAEMON_LOGS.bases[b]
    bad = DAEMON_LOGS.check(request.node.nodeid, sorted(patterns), bases=mine, final=True)
    DAEMON_LOGS.forget(mine)
    if bad:
        pytest.fail(describe_problems(bad), pytrace=False)


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
    # their logs: checked after this teardown, by _daemon_logs
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture
def cluster(make_cluster) -> LocalCluster:
    """A started cluster: 2 workers, 2 mounts (``cluster.mounts``)."""
    return make_cluster()
