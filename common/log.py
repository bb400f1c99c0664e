"""Logging set-up for daemons: stderr, one line per record."""

from __future__ import annotations

import logging
import sys


def setup(level: str = "INFO", role: str = "curvine") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s {role}[%(process)d] %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    try:
        root.setLevel(level.upper())
    except ValueError:
        root.setLevel(logging.INFO)
        logging.getLogger(__name__).warning("unknown log level %r, using INFO", level)
