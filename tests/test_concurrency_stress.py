"""Concurrency stress on a real cluster (issue 31): tests/concurrency_stress.py's workload.

Several processes on the two mounts of a default cluster (2 workers, 2 mounts) work in
one directory tree: own files written, read back byte for byte, truncated, renamed,
linked, unlinked; directories made and removed; LMCache-style chunks stored under one
name by several processes and read from the other mount; many short-lived readers of
multi-block files (the background check of the next block racing the handle's close,
which closed descriptors the mount no longer owned).  Any mismatch, unexpected errno or
hang fails, and so does any WARNING, ERROR or traceback in the daemons' logs (no
``not intact``, no ``no intact replica``, no EBADF).

The default test works for CURVINE_STRESS_SECONDS (default 60) seconds; the ``slow``
ones longer, and with two replicas of each block.  The log checker itself (conftest's
``expect_log``, cluster_util.parse_log) is tested here too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import cluster_util
from cluster_util import cluster_log_problems, describe_problems

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "concurrency_stress.py")
SECONDS = float(os.environ.get("CURVINE_STRESS_SECONDS", "60"))

# the lines issue 31 left in the mounts' logs
ISSUE_31 = {
    "EBADF": r"Bad file descriptor|EBADF|Errno 9\b",
    "not intact": r"is not intact",
    "no intact replica": r"no intact replica",
}


def run_workload(cluster, tmp_path, seconds: float, procs: int, big_procs: int) -> dict:
    argv = [sys.executable, SCRIPT, "--mounts", *cluster.mounts, "--seconds", str(seconds),
            "--procs", str(procs), "--big-procs", str(big_procs),
            "--outdir", str(tmp_path / "stress-reports")]
    os.makedirs(tmp_path / "stress-reports", exist_ok=True)
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=seconds + 600)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the workload printed no result (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    result["stderr"] = r.stderr[-5000:]
    return result


def issue_31_counts(cluster) -> dict[str, int]:
    """How many problem records of each of issue 31's kinds the cluster's logs hold."""
    bad, _ = cluster_log_problems(cluster)
    return {kind: sum(1 for r in bad if re.search(p, r.text)) for kind, p in ISSUE_31.items()}


def check(cluster, tmp_path, seconds: float, procs: int = 4, big_procs: int = 1) -> None:
    import concurrency_stress
    result = run_workload(cluster, tmp_path, seconds, procs, big_procs)
    print(concurrency_stress.summary(result))
    bad, _ = cluster_log_problems(cluster)
    counts = issue_31_counts(cluster)
    print(f"daemon log problems: {len(bad)}; issue 31's: {counts}")
    problems = []
    if result["failures"] or result["hung"]:
        problems.append("the workload failed:\n" + concurrency_stress.summary(result)
                        + ("\nits stderr:\n" + result["stderr"] if result["hung"] else ""))
    if bad:
        problems.append(f"issue 31's lines: {counts}\n" + describe_problems(bad, limit=15))
    assert not problems, "\n\n".join(problems)
    ops = result["ops"]
    assert ops.get("big_read", 0) > 50 and ops.get("create", 0) > 10, ops  # it did work


def test_concurrency_stress(make_cluster, tmp_path):
    c = make_cluster(workers=2, mounts=2)
    check(c, tmp_path, SECONDS, procs=4, big_procs=1)


@pytest.mark.slow
def test_concurrency_stress_long(make_cluster, tmp_path):
    c = make_cluster(workers=2, mounts=2)
    check(c, tmp_path, max(SECONDS, 300.0), procs=6, big_procs=2)


@pytest.mark.slow
def test_concurrency_stress_two_replicas(make_cluster, tmp_path):
    # cluster.replicas is 1 by default: here every block has a copy on each worker
    c = make_cluster(workers=2, mounts=2, replicas=2)
    check(c, tmp_path, SECONDS, procs=4, big_procs=1)


# --------------------------------------------------------------------------- the log check

LOG = """\
--- curvine local: starting fuse 0 at 2026-12-07 04:07:49: python -m curvine.fuse_client.main
2026-12-07 04:07:50,477 curvine-fuse[7049] INFO curvine.fuse_client: mounted
2026-12-07 04:07:51,000 curvine-fuse[7049] WARNING curvine.client.files.file_reader: block 00000000000000ab: \
the local block file of worker 1 ('127.0.0.1:1') is not intact (reading it failed: Bad file \
descriptor); not reading that copy again
2026-12-07 04:07:52,000 curvine-fuse[7049] ERROR curvine.fuse_client.operations: release failed
Traceback (most recent call last):
  File "x.py", line 1, in release
OSError: [Errno 9] Bad file descriptor
2026-12-07 04:07:53,000 curvine-fuse[7049] INFO curvine.fuse_client: fine
Exception in thread readahead_0:
Traceback (most recent call last):
  File "y.py", line 2, in run
ValueError: boom
E0000 00:00:1733140000.123456   12345 chttp2_transport.cc:42] an error
W0000 00:00:1733140000.123456   12345 chttp2_transport.cc:42] a warning
I1202 12:00:00.000000 123 file.cc:42] Got goaway
2026-12-07 04:07:54,000 curvine-fuse[7049] INFO curvine.fuse_client: unmounted
"""


def test_log_check_finds_warnings_errors_tracebacks_and_native_errors(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("logcheck")  # not this test's own tmp_path, which is checked
    records = [r for r in cluster_util.parse_log(LOG, "fuse-0.log") if r.problem]
    assert [(r.kind, r.lineno) for r in records] == [
        ("WARNING", 3), ("ERROR", 4), ("fatal", 9), ("native-E", 13)]
    assert records[1].lines[-1] == "OSError: [Errno 9] Bad file descriptor"  # its traceback
    assert "ValueError: boom" in records[2].text
    log = tmp_path / "logs" / "fuse-0.log"
    log.parent.mkdir()
    log.write_text(LOG)
    bad, ok = cluster_util.log_problems([str(log)], [r"ERROR curvine\.fuse_client\.operations: release"])
    assert [r.kind for r in bad] == ["WARNING", "fatal", "native-E"] and len(ok) == 1
    assert f"{log}:3: " in describe_problems(bad)
    # checked incrementally: only what was written since the last check
    offsets: dict = {}
    assert len(cluster_util.log_problems([str(log)], offsets=offsets)[0]) == 4
    with open(log, "a") as f:
        f.write("2026-12-07 04:07:55,000 master[1] CRITICAL curvine.master: gone\n")
    assert [r.lineno for r in cluster_util.log_problems([str(log)], offsets=offsets)[0]] == [17]
    assert cluster_util.find_daemon_logs(str(tmp_path)) == [str(log)]
