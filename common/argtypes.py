"""argparse ``type=`` converters shared by the command groups: each turns the text into
a value or raises ArgumentTypeError, which argparse prints as a one-line usage error."""

from __future__ import annotations

import argparse

from curvine.common.config import is_host_port, parse_size


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def non_negative(text: str) -> int:
    n = _int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} is negative")
    return n


def positive(text: str) -> int:
    n = _int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def size(text: str) -> int:
    """A byte count like 64MiB or 4096, at least 1."""
    try:
        n = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1 byte")
    return n


def replicas(text: str) -> int:
    n = _int(text)
    if not 1 <= n <= 8:
        raise argparse.ArgumentTypeError(f"{n} is not between 1 and 8")
    return n


def host_port(text: str) -> str:
    """``host:port`` (``[v6]:port`` too), as the config's addresses are checked."""
    if not is_host_port(text):
        raise argparse.ArgumentTypeError(f"expected host:port, got {text!r}")
    return text
