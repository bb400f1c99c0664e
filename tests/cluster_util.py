"""Helpers for tests that run a LocalCluster, and stand-in daemons for testing it.

Run as a script, this file is a fake daemon that follows the daemon contract
(READY=1 on $NOTIFY_SOCKET when serving, exit 0 on SIGTERM; the fuse role really
mounts an empty pyfuse3 file system and unmounts on SIGTERM or `fusermount3 -u`).
It lets the LocalCluster machinery be tested without the real master, worker and
FUSE client.  Behaviour is steered by environment variables:

    FAKE_FAIL=<role>   that role prints an error and exits 1 before READY=1
    FAKE_HANG=<role>   that role never sends READY=1
    FAKE_TRACEBACK=<role>  that role prints a traceback (to test log scanning)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import sys
import time

FAKE_DAEMON = os.path.abspath(__file__)


def fake_commands() -> dict[str, list[str]]:
    """LocalCluster.COMMANDS pointing at this file's fake daemons."""
    return {role: [sys.executable, FAKE_DAEMON, role] for role in ("master", "worker", "fuse")}


def fuse_available() -> str | None:
    """None if real FUSE mounts can be made here, else the reason they cannot."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not accessible to this user"
    if not shutil.which("fusermount3"):
        return "fusermount3 is not installed (apt-get install fuse3)"
    return None


def wait_for(cond, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def metric_samples(http_port: int, name: str) -> list:
    """The samples called ``name`` that the daemon serving /metrics on ``http_port``
    exposes now (prometheus_client Sample tuples: .labels, .value)."""
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name]


def daemon_metric(cluster, role: str, name: str, index: int = 0, **labels: str) -> float:
    """The sum of the samples called ``name`` (those with ``labels``) that daemon
    ``role`` number ``index`` of ``cluster`` exposes now."""
    import urllib.parse
    url = next(r["metrics"] for r in cluster.status()
               if r["role"] == role and r["index"] == index)
    return sum(s.value for s in metric_samples(urllib.parse.urlsplit(url).port, name)
               if all(s.labels.get(k) == v for k, v in labels.items()))


def master_calls(cluster, method: str) -> float:
    """How many ``method`` calls the master of ``cluster`` has answered (any status; the
    call port's are counted with the RPCs)."""
    return daemon_metric(cluster, "master", "curvine_rpc_server_handled_total", method=method)


def tracebacks_in_logs(cluster, tail_lines: int = 40) -> list[str]:
    """For each daemon log of ``cluster`` that contains a traceback: its name and tail."""
    from curvine.devtools.local import log_tail
    found = []
    for path in cluster.logs():
        try:
            with open(path, "rb") as f:
                text = f.read()
        except OSError:
            continue
        if b"Traceback" in text:
            found.append(f"{path}:\n{log_tail(path, tail_lines)}")
    return found


# --------------------------------------------------------------------------- fake daemon

def _fake_server(role: str, args: list[str]) -> int:
    import socket
    from curvine.common import daemon

    port = int(args[args.index("--port") + 1]) if "--port" in args else 0
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen()
    stop = daemon.stop_event()
    print(f"fake {role} listening on {srv.getsockname()[1]}", file=sys.stderr)
    daemon.notify("READY=1")
    stop.wait()
    print(f"fake {role} stopped", file=sys.stderr)
    return 0


def _fake_fuse(args: list[str]) -> int:
    import errno
    import signal
    import stat

    import pyfuse3
    import trio

    from curvine.common import daemon

    class Ops(pyfuse3.Operations):
        async def getattr(self, inode, ctx=None):
            if inode != pyfuse3.ROOT_INODE:
                raise pyfuse3.FUSEError(errno.ENOENT)
            e = pyfuse3.EntryAttributes()
            e.st_ino = inode
            e.st_mode = stat.S_IFDIR | 0o755
            e.st_nlink = 2
            e.st_uid, e.st_gid = os.getuid(), os.getgid()
            return e

        async def lookup(self, parent_inode, name, ctx=None):
            raise pyfuse3.FUSEError(errno.ENOENT)

        async def opendir(self, inode, ctx):
            return inode

        async def readdir(self, fh, start_id, token):
            return None

    mountpoint = args[0]

    async def run():
        async with trio.open_nursery() as nursery:
            async def on_signal():
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                    async for _ in sigs:
                        pyfuse3.terminate()
                        return
            nursery.start_soon(on_signal)
            daemon.notify("READY=1")
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    pyfuse3.init(Ops(), mountpoint, ["fsname=curvine-fake", "subtype=curvine"])
    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)
    print("fake fuse stopped", file=sys.stderr)
    return 0


def fake_main(argv: list[str]) -> int:
    role, args = argv[0], argv[1:]
    if os.environ.get("FAKE_FAIL") == role:
        print(f"fake {role}: error: simulated start-up failure", file=sys.stderr)
        return 1
    if os.environ.get("FAKE_TRACEBACK") == role:
        print("Traceback (most recent call last):\n  simulated", file=sys.stderr)
    if os.environ.get("FAKE_HANG") == role:
        time.sleep(3600)
        return 0
    return _fake_fuse(args) if role == "fuse" else _fake_server(role, args)


if __name__ == "__main__":
    sys.exit(fake_main(sys.argv[1:]))


def module_cluster(tmp_path_factory, name: str, block_mib: int):
    """A generator for a module-scoped fixture: one LocalCluster (2 workers, 2 mounts,
    ``block_mib`` MiB blocks) under a fresh tmp dir named ``name``, taken down after the
    module; fails if a daemon logged a traceback.  Skips without FUSE."""
    import pytest

    from curvine.devtools.local import LocalCluster

    reason = fuse_available()
    if reason:
        pytest.skip(f"needs FUSE mounts: {reason}")
    base = tmp_path_factory.mktemp(name)
    conf = base / "test.toml"
    conf.write_text(f'[cluster]\nblock_size = "{block_mib}MiB"\n')
    c = LocalCluster(str(base / "cluster"), workers=2, mounts=2, conf=str(conf))
    try:
        c.up()
        yield c
    finally:
        c.down()
    found = tracebacks_in_logs(c)
    assert not found, "a daemon logged a traceback:\n" + "\n\n".join(found)


# --------------------------------------------------------------------------- daemon logs
# "The daemons' logs are part of every test": a test fails when a daemon it ran logged a
# record at WARNING, ERROR or CRITICAL, a gRPC core line at E or F, or a traceback, unless
# the test declares the record expected (``@pytest.mark.expect_log(r"regex", ...)``,
# conftest.py).  Log line format: ``<asctime> <role>[pid] LEVEL logger: message``
# (common/log.py); gRPC core's own lines (through the stderr filter) look like
# ``E1202 12:00:00.000000 123 file.cc:42] message`` (or ``E0000 00:00:1733...``).


_HEADER = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<role>\S+)\[\d+\] "
                     r"(?P<level>[A-Z]+) \S+: ")
_NATIVE = re.compile(r"^(?P<sev>[IWEF])\d{4} \d\d:\d\d:\d+(?:\.\d+)? +\d+ \S+:\d+\] ")
_PY_WARNING = re.compile(r"^\S+:\d+: [A-Za-z]*Warning: ")  # the warnings module
# lines that start a record of their own (and are one problem on their own)
_OWN_RECORD = ("Exception in thread", "Exception ignored in", "Fatal Python error",
               "Current thread 0x", "Thread 0x")
_TRACEBACK = "Traceback (most recent call last):"
START_MARKER = "--- curvine local: starting "
DAEMON_ROLES = ("master", "curvine-worker", "curvine-fuse")
BAD_LEVELS = ("WARNING", "ERROR", "CRITICAL")
BAD_NATIVE = ("E", "F")


@dataclasses.dataclass
class LogRecord:
    """One record of a daemon log: its first line and the lines that belong to it (a
    traceback).  ``kind``: the logging level, ``native-X`` for a gRPC core line of
    severity X, ``traceback``/``fatal`` for text outside a record, else ``text``."""

    path: str
    lineno: int
    kind: str
    lines: list

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def problem(self) -> bool:
        if self.kind in BAD_LEVELS or self.kind in ("traceback", "fatal", "py-warning"):
            return True
        if self.kind.startswith("native-") and self.kind[-1] in BAD_NATIVE:
            return True
        return any(line.startswith(_TRACEBACK) or "Traceback (most recent call last)" in line
                   for line in self.lines)

    def show(self, max_lines: int = 14) -> str:
        head = f"{self.path}:{self.lineno}: {self.lines[0]}"
        rest = self.lines[1:max_lines]
        more = len(self.lines) - 1 - len(rest)
        out = [head] + ["        " + line for line in rest]
        if more > 0:
            out.append(f"        [... {more} more lines]")
        return "\n".join(out)


def parse_log(text: str, path: str = "?", first_lineno: int = 1) -> list[LogRecord]:
    """The records of a daemon log's text."""
    records: list[LogRecord] = []
    cur: LogRecord | None = None
    for n, line in enumerate(text.split("\n"), first_lineno):
        if not line and cur is None:
            continue
        kind = None
        m = _HEADER.match(line)
        if m:
            kind = m.group("level")
        elif line.startswith(START_MARKER):
            kind = "marker"
        else:
            m = _NATIVE.match(line)
            if m:
                kind = "native-" + m.group("sev")
            elif line.startswith(_OWN_RECORD):
                kind = "fatal"
            elif _PY_WARNING.match(line):
                kind = "py-warning"
            elif line.startswith(_TRACEBACK) and (
                    cur is None or cur.kind not in (*BAD_LEVELS, "fatal")
                    or any(x.startswith(_TRACEBACK) for x in cur.lines)):
                # not the exc_info of the record before it (one at WARNING or worse, or
                # "Exception in thread ...", without a traceback yet): one of its own
                kind = "traceback"
        if kind is None:
            if cur is None:
                cur = LogRecord(path, n, "text", [line])
                records.append(cur)
            elif line or cur.lines[-1]:
                cur.lines.append(line)
            continue
        cur = LogRecord(path, n, kind, [line])
        records.append(cur)
    for r in records:
        while r.lines and not r.lines[-1]:
            r.lines.pop()
    return records


def _daemon_log_file(path: str) -> bool:
    """A log written by curvine daemons: in a LocalCluster's logs/ dir, or a .log file
    with a line of a daemon role (a test that runs daemons itself)."""
    name = os.path.basename(path)
    if os.path.basename(os.path.dirname(path)) == "logs" and \
            re.fullmatch(r"(master|worker|fuse)-\d+\.log", name):
        return True
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            head = f.read(256 << 10)
    except OSError:
        return False
    for line in head.split("\n"):
        m = _HEADER.match(line)
        if m and m.group("role") in DAEMON_ROLES:
            return True
    return False


def find_daemon_logs(root: str, max_depth: int = 5) -> list[str]:
    """Daemon logs under ``root`` (never entering a mounted file system)."""
    from curvine.devtools.local import mounted_paths
    try:
        mounted = mounted_paths()
    except OSError:
        mounted = set()
    root = os.path.realpath(root)
    found = []
    depth0 = root.rstrip(os.sep).count(os.sep)
    for d, dirs, files in os.walk(root):
        if d.count(os.sep) - depth0 >= max_depth:
            dirs[:] = []
        dirs[:] = [x for x in dirs if os.path.join(d, x) not in mounted]
        found += [os.path.join(d, f) for f in files
                  if f.endswith(".log") and _daemon_log_file(os.path.join(d, f))]
    return sorted(found)


def expected(record: LogRecord, patterns) -> bool:
    """Whether one of ``patterns`` (regexes, ``re.search``) matches the record's text
    (its line and the traceback that follows it)."""
    return any(re.search(p, record.text) for p in patterns)


def log_problems(paths, patterns=(), offsets: dict | None = None,
                 final: bool = True) -> tuple[list[LogRecord], list[LogRecord]]:
    """(unexpected, expected) problem records in the logs ``paths``, from
    ``offsets[path]`` (bytes already checked; updated) on.  ``final=False``: a daemon
    may still be writing, so a last line without its newline is left for later."""
    offsets = {} if offsets is None else offsets
    bad, ok = [], []
    for path in paths:
        start = offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                if size < start:  # replaced or truncated: from its start again
                    start = 0
                f.seek(start)
                data = f.read(size - start)
        except OSError:
            continue
        if not final and not data.endswith(b"\n"):
            data = data[:data.rfind(b"\n") + 1]
        if not data:
            continue
        lineno = 1
        if start:
            with open(path, "rb") as f:
                lineno += f.read(start).count(b"\n")
        offsets[path] = start + len(data)
        for r in parse_log(data.decode("utf-8", "replace"), path, lineno):
            if r.problem:
                (ok if expected(r, patterns) else bad).append(r)
    return bad, ok


def cluster_log_problems(cluster, patterns=()) -> tuple[list[LogRecord], list[LogRecord]]:
    """(unexpected, expected) problem records in every log of ``cluster``, whole."""
    return log_problems(cluster.logs(), patterns)


def describe_problems(bad: list[LogRecord], limit: int = 40) -> str:
    shown = "\n".join(r.show() for r in bad[:limit])
    more = f"\n[... and {len(bad) - limit} more records]" if len(bad) > limit else ""
    return (f"daemon logs: {len(bad)} record(s) at WARNING or worse, or with a traceback, "
            f"that the test does not declare expected (@pytest.mark.expect_log(r\"regex\")"
            f", see tests/conftest.py):\n{shown}{more}")


class DaemonLogs:
    """What the suite checks: the log files of every LocalCluster a test made (any
    scope) plus daemon logs under the test's tmp_path, and how far each has been read
    (a module's cluster is checked test by test, each test for what was written while
    it ran, and what is left when the module ends)."""

    def __init__(self):
        self.bases: dict[str, set] = {}  # LocalCluster base -> patterns of the tests that read it
        self.offsets: dict[str, int] = {}
        self.report = os.environ.get("CURVINE_LOG_REPORT", "")  # every problem record, as JSON lines

    def register(self, base: str) -> None:
        self.bases.setdefault(os.path.realpath(base), set())

    def _paths(self, bases, roots) -> list[str]:
        paths = []
        for b in bases:
            d = os.path.join(b, "logs")
            with contextlib.suppress(OSError):
                paths += [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.endswith(".log")]
        for root in roots:
            if root and os.path.isdir(root):
                paths += find_daemon_logs(str(root))
        return sorted(set(paths))

    def check(self, who: str, patterns, roots=(), bases=None, final: bool = False):
        """The unexpected problem records written since the last check."""
        bases = list(self.bases) if bases is None else list(bases)
        for b in bases:
            self.bases.setdefault(b, set()).update(patterns)
        bad, ok = log_problems(self._paths(bases, roots), patterns, self.offsets, final)
        if self.report and (bad or ok):
            import json
            with open(self.report, "a") as f:
                for r, exp in [(r, False) for r in bad] + [(r, True) for r in ok]:
                    f.write(json.dumps({"test": who, "path": r.path, "line": r.lineno,
                                        "kind": r.kind, "expected": exp,
                                        "text": r.text[:4000]}) + "\n")
        return bad

    def forget(self, bases) -> None:
        for b in bases:
            self.bases.pop(b, None)
            prefix = os.path.join(b, "")
            for p in [p for p in self.offsets if p.startswith(prefix)]:
                del self.offsets[p]


DAEMON_LOGS = DaemonLogs()
