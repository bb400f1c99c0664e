"""Logging set-up for daemons: stderr, one line per record, never raw bytes of a peer.

Every daemon calls :func:`setup`.  Two things reach a daemon's stderr:

* Python logging records, formatted by :class:`SafeFormatter`: the message part
  (where names, peer addresses and error strings from the network end up) has every
  control or non-printable character escaped (``\\x1b``, ``\\n``, ``\\u202e``), so a
  name cannot forge a log line or colour a terminal.  Tracebacks keep their line breaks
  (our text), with every other control character escaped.
* gRPC core's own log lines (``I1202 12:00:00.000000 123 file.cc:42] ...``), written by
  C code straight to file descriptor 2, bypassing Python.  With grpcio 1.85 they appear
  at the default verbosity, at INFO, and include bytes chosen by any peer that can open
  a TCP connection: ``Got goaway [2] ... Debug Text: <GOAWAY debug data, verbatim,
  up to ~16 KB>``; the same INFO level carries ``Handshake failed ...`` (a refused TLS
  peer, docs/security.md), so lowering GRPC_VERBOSITY would drop both.  Instead fd 2
  becomes one end of a ``SOCK_SEQPACKET`` socket pair (one record per ``write``) read
  by a small filter process (this module, :func:`_native_filter_main`) that writes each
  record as one escaped line, cut at :data:`NATIVE_LINE_MAX` bytes, to the daemon's
  real stderr.  Python's own ``sys.stderr`` and the logging handler write to the real
  stderr directly.  The filter is a process, not a thread, so that the last words of a
  daemon that aborts (a gRPC ``F`` line, ``Fatal Python error``) still get out.  Set
  ``CURVINE_RAW_STDERR=1`` to leave fd 2 alone (debugging gRPC core itself).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import traceback

# A gRPC core (or any native) stderr record longer than this is cut (the rest is
# counted, not shown): a peer's GOAWAY debug data can be ~16 KB per connection.
NATIVE_LINE_MAX = 2048
# Largest record the filter receives whole (longer writes are cut by the kernel here)
# and the socket buffer that lets one write of that size through.
NATIVE_RECORD_MAX = 256 << 10
NATIVE_SNDBUF = 1 << 20
# A record not ended by a newline waits this long for its continuation (code that
# writes a line in pieces, e.g. faulthandler) before it is written as a line.
NATIVE_PARTIAL_WAIT = 0.2
NATIVE_FILTER_START = 10.0  # seconds the filter process may take to start
RAW_STDERR_ENV = "CURVINE_RAW_STDERR"

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape(text: str, backslash: bool = False) -> str:
    """``text`` with every non-printable character (controls, format characters such
    as U+202E, line and paragraph separators; ``str.isprintable``) written as an
    escape: ``\\n``, ``\\r``, ``\\t``, ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``.  A byte
    that was not UTF-8 (decoded with ``surrogateescape``) comes out as ``\\xNN`` of that
    byte.  ``backslash=True`` also doubles backslashes, so that the output is
    unambiguous (the CLI's names); log lines leave them as they are."""
    if text.isprintable() and not (backslash and "\\" in text):
        return text
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\" if backslash else ch)
        elif ch.isprintable():
            out.append(ch)
        elif ch in _SHORT:
            out.append(_SHORT[ch])
        else:
            o = ord(ch)
            if 0xDC80 <= o <= 0xDCFF:  # a raw byte carried by surrogateescape
                out.append(f"\\x{o - 0xDC00:02x}")
            elif o < 0x100:
                out.append(f"\\x{o:02x}")
            elif o < 0x10000:
                out.append(f"\\u{o:04x}")
            else:
                out.append(f"\\U{o:08x}")
    return "".join(out)


def escape_bytes(data: bytes, backslash: bool = False) -> str:
    """:func:`escape` of bytes: UTF-8 where valid, ``\\xNN`` for the other bytes."""
    return escape(data.decode("utf-8", "surrogateescape"), backslash)


def escape_lines(text: str) -> str:
    """Each line of ``text`` escaped; the line breaks themselves kept (tracebacks)."""
    return "\n".join(escape(line) for line in text.split("\n"))


# The parts of a formatted traceback that are our text and keep their line breaks:
# its headers, and each frame (file, line, function, source line).  The rest, the
# exception's own message (and notes), may come from a peer: escaped whole.
_TRACEBACK_HEADERS = frozenset((
    "Traceback (most recent call last):\n",
    "\nThe above exception was the direct cause of the following exception:\n\n",
    "\nDuring handling of the above exception, another exception occurred:\n\n",
))


def format_exception(exc: BaseException) -> str:
    """Like ``traceback.format_exception`` (without the last newline), with the
    exception messages escaped to one line each and the frames' line breaks kept."""
    te = traceback.TracebackException.from_exception(exc)
    _escape_notes(te)
    parts = []
    for chunk in te.format():
        if (chunk in _TRACEBACK_HEADERS or chunk.startswith('  File "')
                or chunk.startswith("  [Previous line repeated")):
            parts.append(escape_lines(chunk))
        else:
            parts.append(escape(chunk[:-1] if chunk.endswith("\n") else chunk) + "\n")
    return "".join(parts).rstrip("\n")


def _escape_notes(te: traceback.TracebackException) -> None:
    """Escape the notes (``add_note``) of every exception in ``te``'s chain in place:
    ``format`` would print each line of a note as a line of its own."""
    todo, seen = [te], set()
    while todo:
        t = todo.pop()
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        notes = getattr(t, "__notes__", None)
        if isinstance(notes, (list, tuple)):
            t.__notes__ = [escape(str(n)) for n in notes]
        todo += [t.__cause__, t.__context__, *(getattr(t, "exceptions", None) or ())]


class SafeFormatter(logging.Formatter):
    """A formatter whose message part never carries a control character, and whose
    tracebacks carry none but the line breaks between frames."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802
        record.message = escape(record.message)
        return super().formatMessage(record)

    def formatException(self, ei) -> str:  # noqa: N802
        if isinstance(ei, tuple) and isinstance(ei[1], BaseException):
            return format_exception(ei[1])
        return escape_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return escape_lines(super().formatStack(stack_info))


def formatter(role: str) -> SafeFormatter:
    return SafeFormatter(f"%(asctime)s {role}[%(process)d] %(levelname)s %(name)s: %(message)s")


_native_filter = None  # the filter process, once fd 2 goes through it


def setup(level: str = "INFO", role: str = "curvine") -> None:
    filter_error = _filter_native_stderr()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(role))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    try:
        root.setLevel(level.upper())
    except ValueError:
        root.setLevel(logging.INFO)
        logging.getLogger(__name__).warning("unknown log level %r, using INFO", level)
    if filter_error:
        logging.getLogger(__name__).warning(
            "gRPC core's log lines are not escaped (cannot start the stderr filter: %s)",
            filter_error)


def _filter_native_stderr() -> str:
    """Route fd 2 through the filter process; '' when done (or not wanted), else why
    it could not be.  Only when Python's stderr is fd 2 itself (a daemon started
    normally): a process whose stderr was redirected in Python (a test harness) is left
    alone.  Idempotent."""
    global _native_filter
    if _native_filter is not None or os.environ.get(RAW_STDERR_ENV) == "1":
        return ""
    try:
        if sys.stderr is None or sys.stderr.fileno() != 2:
            return ""
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is a ValueError
        return ""
    import subprocess

    real = -1
    ours = theirs = None
    try:
        sys.stderr.flush()
        real = os.dup(2)  # the daemon's real stderr (not inherited by children)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, NATIVE_SNDBUF)
        proc = subprocess.Popen(
            [sys.executable, "-c",
             "from curvine.common.log import _native_filter_main; _native_filter_main()"],
            stdin=theirs, stdout=real, stderr=real, close_fds=True)
        ours.settimeout(NATIVE_FILTER_START)
        try:
            ready = ours.recv(1) == b"R"  # the filter is running (its imports worked)
        except OSError:
            ready = False
        if not ready:
            proc.kill()
            proc.wait()
            raise OSError(f"the filter process did not start within {NATIVE_FILTER_START:g}s")
        ours.settimeout(None)
        os.dup2(ours.fileno(), 2)
    except OSError as e:
        if real >= 0:
            os.close(real)
        return str(e)
    finally:
        for s in (ours, theirs):
            if s is not None:
                s.close()
    _native_filter = proc
    sys.stderr = open(real, "w", encoding="utf-8", errors="backslashreplace",
                      buffering=1, closefd=True)
    return ""


def _native_filter_main() -> None:
    """The filter process: stdin is the socket whose other end is the daemon's fd 2,
    stdout the daemon's real stderr.  Runs until every writer is gone (the daemon
    exits); ignores SIGTERM/SIGINT/SIGHUP, which reach it with the daemon's process
    group, so that it drains whatever the daemon writes while stopping."""
    import select
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=0)
    sock.send(b"R")
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    pending = b""

    def emit(record: bytes) -> None:
        record = record[:-1] if record.endswith(b"\n") else record
        line = escape_bytes(record[:NATIVE_LINE_MAX])
        if len(record) > NATIVE_LINE_MAX:
            line += f" [... {len(record) - NATIVE_LINE_MAX} more bytes not shown]"
        data = (line + "\n").encode("utf-8", "surrogateescape")
        while data:
            try:
                data = data[os.write(1, data):]
            except InterruptedError:
                continue
            except OSError:  # the real stderr is gone: nothing left to do
                return

    while True:
        events = poller.poll(NATIVE_PARTIAL_WAIT * 1000 if pending else None)
        if not events:
            emit(pending)
            pending = b""
            continue
        try:
            data = sock.recv(NATIVE_RECORD_MAX)
        except InterruptedError:
            continue
        except OSError:
            break
        if not data:
            # end of stream, or an empty write: only the former hangs up
            if any(ev & select.POLLHUP for _, ev in poller.poll(0)):
                break
            continue
        pending += data
        if pending.endswith(b"\n") or len(pending) > NATIVE_LINE_MAX:
            emit(pending)
            pending = b""
    if pending:
        emit(pending)
