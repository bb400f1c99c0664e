"""Start LMCache "pods" without paying for torch's and LMCache's imports each time.

A pod (devtools/lmcache_pod.py, tests/lmcache_pods.py) is a fresh process, as an
inference pod is; importing torch and LMCache costs it ~7.5 s of CPU, more than most
of what it then does.  :class:`ForkServer` starts one process that imports them
(``PRELOAD``) and nothing else, then forks it for each pod: the child sets its
environment, working directory and output, and runs the pod's script or module as
``python`` would (``__main__``, ``sys.argv``, normal interpreter exit).  Everything
of ours -- the connector, the curvine client, LMCache's engine -- is imported and
built after the fork, in the pod alone.

Only what ``python`` fixes at start is shared: the hash seed (``PYTHONHASHSEED``,
which pods need equal anyway) and the preloaded modules' import-time state.  A spawn
whose environment sets an import-time variable (``PYTHON*``, ``LMCACHE_*``, ``TORCH*``,
``OMP_*``) differently from the server's runs as a plain subprocess instead.

Protocol on the server's Unix socket, one connection per pod: the request (JSON
``{"argv", "cwd", "env"}``, the output file's descriptor passed with SCM_RIGHTS);
the server answers ``{"pid": N}`` and, when the pod exits, ``{"status": S}`` (S as
``Popen.returncode``: negative for a signal).

    python -m curvine.devtools.pod_fork SOCKET [MODULE...]   # the server (ForkServer
                                                             # starts it; PRELOAD)
"""

from __future__ import annotations

import array
import atexit
import contextlib
import gc
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

PRELOAD = ("torch", "lmcache.v1.cache_engine", "lmcache.v1.storage_backend.connector.fs_connector")
IMPORT_TIME_ENV = ("PYTHON", "LMCACHE_", "TORCH", "OMP_", "MKL_")
START_TIMEOUT = 180.0
REQUEST_LIMIT = 1 << 20


# --------------------------------------------------------------------------- client

class ForkedProcess:
    """What :class:`subprocess.Popen` offers the pods' callers: ``pid``, ``poll``,
    ``wait``, ``kill``, ``returncode``."""

    def __init__(self, conn: socket.socket, pid: int, rest: bytes = b""):
        """``rest``: what the server sent after the pid line (its status, if the pod
        exited that fast)."""
        self._conn = conn
        self.pid = pid
        self.returncode: int | None = None
        self._buf = b""
        self._take(rest)

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"pod {self.pid}", timeout)
            self._read(left)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _read(self, timeout: float | None) -> None:
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return
        data = self._conn.recv(4096)
        if not data:  # the server went away (and killed its pods)
            self.returncode = -signal.SIGKILL
            self._conn.close()
            return
        self._take(data)

    def _take(self, data: bytes) -> None:
        self._buf += data
        if b"\n" in self._buf:
            self.returncode = int(json.loads(self._buf.split(b"\n", 1)[0])["status"])
            self._conn.close()


class ForkServer:
    """One preloaded server per process that uses it (:meth:`shared`)."""

    _shared: ForkServer | None = None
    _shared_lock = threading.Lock()

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] = PRELOAD):
        self.env = dict(env)
        self._dir = tempfile.mkdtemp(prefix="curvine-pod-fork-")
        self.path = os.path.join(self._dir, "sock")
        self._log = open(os.path.join(self._dir, "server.log"), "wb")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "curvine.devtools.pod_fork", self.path, *preload],
            env=self.env,
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while not os.path.exists(self.path):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the pod fork server did not start; its log: "
                                   f"{self._dir}/server.log")
            time.sleep(0.05)

    @classmethod
    def shared(cls, env: dict[str, str]) -> ForkServer:
        """This process's server, started at the first call with ``env``."""
        with cls._shared_lock:
            if cls._shared is None or cls._shared._proc.poll() is not None:
                cls._shared = cls(env)
                atexit.register(cls._shared.close)
            return cls._shared

    def can_run(self, env: dict[str, str]) -> bool:
        """False when ``env`` changes something ``python`` reads only at start."""
        keys = {k for k in (*env, *self.env) if k.startswith(IMPORT_TIME_ENV)}
        return all(env.get(k) == self.env.get(k) for k in keys)

    def spawn(self, argv: list[str], cwd: str, env: dict[str, str], stdout) -> ForkedProcess:
        """Run ``argv`` (a script path and its arguments, or ``-m module ...``) like
        ``python argv...`` with stdin from /dev/null and stdout and stderr into the
        file ``stdout``."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            request = json.dumps({"argv": argv, "cwd": cwd, "env": env}).encode()
            conn.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                      array.array("i", [stdout.fileno()]))])
            conn.shutdown(socket.SHUT_WR)
            got = b""
            while b"\n" not in got:
                data = conn.recv(4096)
                if not data:
                    raise RuntimeError("the pod fork server refused the pod")
                got += data
            line, rest = got.split(b"\n", 1)
            return ForkedProcess(conn, int(json.loads(line)["pid"]), rest)
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(10)
        self._log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        if self._proc.returncode in (0, -signal.SIGTERM):  # else its log tells why
            shutil.rmtree(self._dir, ignore_errors=True)


def popen(argv: list[str], cwd: str, env: dict[str, str], stdout, base_env: dict[str, str]):
    """A pod: forked from this process's server (started with ``base_env``) when
    ``env`` allows it, else ``python argv...`` as a plain subprocess."""
    try:
        server = ForkServer.shared(base_env)
    except RuntimeError:  # e.g. torch does not import: the pod's own log will say why
        server = None
    if server is not None and server.can_run(env):
        return server.spawn(argv, cwd, env, stdout)
    return subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=stdout, stderr=subprocess.STDOUT)


# --------------------------------------------------------------------------- server

def serve(path: str, preload) -> dict | None:
    """Import ``preload``, then accept pods until SIGTERM or until the process that
    started the server exits; returns (in a forked child
    only) the pod's request, with its output descriptor as ``"fd"``.  One thread:
    children are reaped between accepts, and their statuses sent back on their
    connections."""
    for name in preload:
        __import__(name)
    gc.freeze()  # the preloaded objects stay out of the pods' collections (no copies)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path + ".tmp"
    listener.bind(tmp)
    listener.listen(64)
    os.rename(tmp, path)  # the path appears once the server accepts
    children: dict[int, socket.socket] = {}
    parent = os.getppid()
    try:
        # until SIGTERM, or until the process that started this server is gone (a
        # pytest-xdist worker may end without its atexit functions, which close it)
        while not stop and os.getppid() == parent:
            with contextlib.suppress(InterruptedError):
                ready, _, _ = select.select([listener], [], [], 0.05)
            if ready:
                conn, _ = listener.accept()
                job = _receive(conn)
                if job is None:
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:  # the pod: leave the server's loop with its request
                    listener.close()
                    for c in children.values():
                        c.close()
                    children.clear()  # (so the finally below leaves its siblings alone)
                    conn.close()
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    return job
                os.close(job["fd"])
                children[pid] = conn
                _send(conn, {"pid": pid})
            _reap(children, block=False)
    finally:
        if children:  # stopping: no pod outlives the server
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _reap(children, block=True)
    return None


def _receive(conn: socket.socket) -> dict | None:
    fds = array.array("i")
    data = b""
    conn.settimeout(10)
    try:
        while True:
            msg, ancdata, _flags, _addr = conn.recvmsg(REQUEST_LIMIT,
                                                       socket.CMSG_LEN(fds.itemsize))
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
            if not msg:
                break
            data += msg
    except OSError:
        for fd in fds:
            os.close(fd)
        return None
    conn.settimeout(None)
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return None
    job = json.loads(data)
    job["fd"] = fds[0]
    return job


def _send(conn: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(message).encode() + b"\n")


def _reap(children: dict[int, socket.socket], block: bool) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            _send(conn, {"status": os.waitstatus_to_exitcode(status)})
            conn.close()


def run_pod(job: dict) -> None:
    """In the forked child: become ``python argv...`` and run it."""
    import runpy

    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    os.setsid()  # its own session, as a pod started on its own would be
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(job["fd"], 1)
    os.dup2(job["fd"], 2)
    os.close(job["fd"])
    argv = job["argv"]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = job["cwd"]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def main(argv: list[str]) -> None:
    job = serve(argv[0], argv[1:])
    if job is None:
        return
    # The pod exits as ``python`` would (its non-daemon threads joined, atexit
    # functions run, exit status from SystemExit or 1 after a traceback), but without
    # the interpreter's teardown: freeing every preloaded object would copy each page
    # the fork shares (~2 s).
    try:
        run_pod(job)
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:  # noqa: BLE001 - reported as python reports it
        sys.excepthook(*sys.exc_info())
        code = 1
    with contextlib.suppress(Exception):
        threading._shutdown()  # noqa: SLF001 - what the interpreter does at exit
    atexit._run_exitfuncs()  # noqa: SLF001
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main(sys.argv[1:])
