"""devtools/pod_fork.py: a forked pod behaves like ``python SCRIPT ARGS`` (argv,
__main__, cwd, environment, output, exit status, atexit, kill), and an environment
that changes an import-time variable gets a plain interpreter.  The server here
preloads ``json`` (the real one preloads torch and LMCache)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from curvine.devtools import pod_fork

SCRIPT = """\
import atexit, os, sys, threading, time
atexit.register(lambda: print("atexit ran", flush=True))
t = threading.Thread(target=lambda: (time.sleep(0.2), print("thread done", flush=True)))
t.start()
print("argv", sys.argv[1:], "name", __name__, "cwd", os.getcwd(), "env", os.environ.get("X"),
      "hash", hash("abc"), "modules", "json" in sys.modules, flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
if sys.argv[1] == "raise":
    raise ValueError("boom")
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def server():
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    s = pod_fork.ForkServer(env, preload=("json",))
    yield s, env
    s.close()


def _run(server, env, tmp_path, arg, **extra):
    script = tmp_path / "pod.py"
    script.write_text(SCRIPT)
    log = tmp_path / f"out-{arg}.log"
    with open(log, "wb") as f:
        p = server.spawn([str(script), arg], str(tmp_path), {**env, **extra}, f)
    return p, log


def test_a_pod_runs_like_python(server, tmp_path):
    s, env = server
    p, log = _run(s, env, tmp_path, "3", X="y")
    assert isinstance(p, pod_fork.ForkedProcess) and p.pid != os.getpid()
    assert p.wait(30) == 3 and p.poll() == 3
    out = log.read_text()
    plain = subprocess.run([sys.executable, "-c", "print(hash('abc'))"], capture_output=True,
                           text=True, env={**env}).stdout.strip()
    assert (f"argv ['3'] name __main__ cwd {tmp_path} env y hash {plain} modules True"
            in out), out
    assert "to stderr" in out and "thread done" in out and "atexit ran" in out, out
    assert out.index("thread done") < out.index("atexit ran")  # threads joined first


def test_exceptions_and_kills_give_python_exit_statuses(server, tmp_path):
    s, env = server
    p, log = _run(s, env, tmp_path, "raise")
    assert p.wait(30) == 1 and "ValueError: boom" in log.read_text()
    p, _ = _run(s, env, tmp_path, "sleep")
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(0.3)
    p.kill()
    assert p.wait(30) == -signal.SIGKILL


def test_import_time_variables_get_a_plain_interpreter(server, tmp_path):
    s, env = server
    assert s.can_run({**env, "X": "other"})
    assert not s.can_run({**env, "PYTHONHASHSEED": "1"})
    assert not s.can_run({**env, "LMCACHE_CHUNK_SIZE": "512"})


def test_a_status_sent_with_the_pid_is_not_lost():
    """A pod that exits before its caller read the pid line: the server's two lines
    come in one read, and the status in it is the pod's."""
    ours, theirs = socket.socketpair()
    try:
        p = pod_fork.ForkedProcess(ours, 12345, rest=b'{"status": 3}\n')
        assert p.poll() == 3 and p.wait(0) == 3
    finally:
        theirs.close()
        ours.close()


def test_the_server_ends_with_the_process_that_started_it(tmp_path):
    """A server whose starter exits without closing it (os._exit: no atexit functions,
    as a pytest-xdist worker may end) stops by itself instead of staying behind."""
    starter = (
        "import os, sys\n"
        "from curvine.devtools import pod_fork\n"
        "s = pod_fork.ForkServer(dict(os.environ), preload=('json',))\n"
        "print(s._proc.pid, flush=True)\n"
        "os._exit(0)\n")
    r = subprocess.run([sys.executable, "-c", starter], capture_output=True, timeout=60,
                       cwd=str(tmp_path))
    pid = int(r.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"the fork server {pid} outlived the process that started it")
