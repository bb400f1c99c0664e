"""`curvine`: the admin command line.

One module per command group, each with ``register(subparsers)`` that adds its parser
and sets ``func(args, parser) -> exit code``.  Errors reach the user as one line,
``curvine: error: ...``, with exit code 1 (2 for usage errors, 3 when something named
does not exist, 4 for a damaged journal: docs/cli.md); never a traceback (set
CURVINE_DEBUG=1 to see one).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import traceback
from types import ModuleType
from typing import Callable

# Command groups, in help order: command name -> the function that imports its module.
# Each module has ``register(parser)``, ``HELP`` and ``DESCRIPTION``.  local, demo and
# bench are development tooling (curvine.devtools); the rest are the operator commands.
# This table is the program's composition root, the one place in cli that imports
# devtools (cli and devtools never import each other otherwise:
# tests/test_layers_client.py).  Each import is a plain statement, so grep and the
# import check find it, and runs only when the parser is built, not when this module
# is imported.


def _local():
    from curvine.devtools import local
    return local


def _demo():
    from curvine.devtools import demo
    return demo


def _bench():
    from curvine.devtools import bench
    return bench


def _fs():
    from curvine.cli import fs_cmd
    return fs_cmd


def _config():
    from curvine.cli import config_cmd
    return config_cmd


def _report():
    from curvine.cli import report
    return report


def _master():
    from curvine.cli import master_cmd
    return master_cmd


def _journal():
    from curvine.cli import journal_cmd
    return journal_cmd


def _doctor():
    from curvine.cli import doctor
    return doctor


COMMAND_GROUPS: dict[str, Callable[[], ModuleType]] = {
    "local": _local,
    "demo": _demo,
    "bench": _bench,
    "fs": _fs,
    "config": _config,
    "report": _report,
    "master": _master,
    "journal": _journal,
    "doctor": _doctor,
}

# Documented in docs/cli.md.
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_NOT_FOUND = 3  # a path, file or directory named on the command line does not exist
EXIT_DAMAGED = 4    # the journal is damaged (journal verify, journal dump)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="curvine", description="curvine-py: a distributed cache file system for KV caches.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, load in COMMAND_GROUPS.items():
        group = load()
        group.register(sub.add_parser(name, help=group.HELP, description=group.DESCRIPTION))
    return parser


def _known_errors() -> tuple[type[BaseException], ...]:
    from curvine.common.errors import ClusterError, ConfigError, CurvineError
    from curvine.journal import JournalError
    return (ClusterError, ConfigError, CurvineError, JournalError, OSError)


def _exit_code(exc: BaseException) -> int:
    from curvine.common.errors import CurvineError, ErrorKind
    from curvine.journal import JournalCorruption
    if isinstance(exc, JournalCorruption):
        return EXIT_DAMAGED
    if isinstance(exc, FileNotFoundError) or (
            isinstance(exc, CurvineError) and exc.kind == ErrorKind.NOT_FOUND):
        return EXIT_NOT_FOUND
    return EXIT_ERROR


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__


def _unreachable(args: argparse.Namespace, exc: BaseException) -> str:
    """"cannot reach the master at ADDRESS (where it came from): " when ``exc`` is a
    call that could not reach the master the command's config named (cli/connect.py)."""
    from curvine.common.errors import CurvineError, ErrorKind
    addr, origin = getattr(args, "master_addr", None), getattr(args, "master_origin", None)
    if (isinstance(exc, CurvineError) and exc.kind in (ErrorKind.UNAVAILABLE, ErrorKind.TIMEOUT)
            and origin and addr and any(a in str(exc) for a in addr.split(" or "))):
        return f"cannot reach the master at {origin}: "
    return ""


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors: message + exit 2, from argparse
    sub_parser = getattr(args, "_parser", parser)
    # SIGTERM unwinds like Ctrl-C, so a half-started `local up` or demo cleans up.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return int(args.func(args, sub_parser) or EXIT_OK)
    except KeyboardInterrupt:
        print("curvine: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout closed early (e.g. `| head`): not an error worth a message.
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), sys.stdout.fileno())
        return EXIT_OK
    except Exception as e:  # noqa: BLE001 - the CLI's one error exit
        if os.environ.get("CURVINE_DEBUG"):
            traceback.print_exc()
        if isinstance(e, _known_errors()):
            print(f"curvine: error: {_unreachable(args, e)}{_message(e)}", file=sys.stderr)
            return _exit_code(e)
        print(f"curvine: error: internal error: {type(e).__name__}: {_message(e)}",
              file=sys.stderr)
        return EXIT_ERROR


def run() -> None:
    """The ``curvine`` command: ``main`` then an immediate exit.  A gRPC stream object
    finalized at interpreter exit takes its call's lock, which a daemon thread of the
    stream (block readahead, grpc's own) may hold when finalization stops it: the
    process then never exits (seen as a ``curvine fs get`` that printed the file and
    hung).  Nothing is left to do once ``main`` has returned, so the output is flushed
    and the process ends without finalization."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach it
            pass
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    run()
