"""What the installed pyfuse3 can do: the patched build (scripts/pyfuse3/*.patch) or a
stock one (PyPI's 3.5.0, which a plain ``pip install`` of curvine-py brings).

A mount works on both.  Each patched feature is detected once, from the compiled
module itself (not from the version string: a build from a stale ``__init__.c`` has
the version and none of the code), and used only where present:

- ``fallocate``: the FUSE fallocate handler.  Without it the kernel answers every
  fallocate(2) with EOPNOTSUPP (glibc's posix_fallocate then writes zeros itself).
- ``cache_readdir``: ``opendir`` may return a FileInfo with ``cache_readdir``, so the
  kernel keeps a leased directory's entries.  Without it opendir returns a plain handle
  (a FileInfo would fail every listing) and the kernel asks for each listing again.
- ``cache_symlinks``: the kernel keeps symlink targets; without it, a READLINK each
  time a path goes through a link.
- ``read_queued``: the session loop reads a queued request without first waiting for
  readability; without it, a pass of trio's scheduler per request.

``curvine-fuse`` logs :meth:`Pyfuse3Features.warning` (one line) at start-up when
something is off; ``curvine-fuse --version`` and ``curvine doctor`` print the same.
"""

from __future__ import annotations

import functools
import importlib.metadata
import sys
from dataclasses import dataclass

import pyfuse3

# (attribute, what is off without it)
FEATURES = (
    ("fallocate", "fallocate (fallocate(2) fails with EOPNOTSUPP)"),
    ("cache_readdir", "directory cache (the kernel asks for every listing again)"),
    ("cache_symlinks", "symlink cache (a READLINK per path through a link)"),
    ("read_queued", "queued read (a scheduler pass per request)"),
)


def fix_command(prefix: str | None = None) -> str:
    """The command that installs the patched pyfuse3 into this Python's prefix."""
    return f"bash scripts/install.sh {prefix or sys.prefix}"


@dataclass(frozen=True)
class Pyfuse3Features:
    version: str
    fallocate: bool
    cache_readdir: bool
    cache_symlinks: bool
    read_queued: bool

    def missing(self) -> list[str]:
        """What is off, one phrase each (empty with the patched build)."""
        return [what for name, what in FEATURES if not getattr(self, name)]

    def summary(self) -> str:
        """One line: the version and what it has."""
        if not self.missing():
            return f"pyfuse3 {self.version}: patched (fallocate, directory and symlink caches, queued read)"
        have = [name for name, _ in FEATURES if getattr(self, name)]
        return (f"pyfuse3 {self.version}: " + ("has " + ", ".join(have) + "; " if have else "")
                + "lacks " + ", ".join(n for n, _ in FEATURES if not getattr(self, n)))

    def warning(self, prefix: str | None = None) -> str | None:
        """The one start-up WARNING line, or None when every feature is there."""
        missing = self.missing()
        if not missing:
            return None
        return (f"pyfuse3 {self.version} lacks curvine's patches, so these are off: "
                f"{'; '.join(missing)}. To fix, run from a curvine-py checkout: "
                f"{fix_command(prefix)}")


@functools.lru_cache(maxsize=1)
def detect() -> Pyfuse3Features:
    try:
        version = importlib.metadata.version("pyfuse3")
    except importlib.metadata.PackageNotFoundError:
        version = getattr(pyfuse3, "__version__", "?")
    try:
        pyfuse3.FileInfo(cache_readdir=False)
        cache_readdir = True
    except TypeError:
        cache_readdir = False
    return Pyfuse3Features(
        version=version,
        # the handler's coroutine exists only in a module compiled with the patch
        fallocate=hasattr(pyfuse3, "fuse_fallocate_async"),
        cache_readdir=cache_readdir,
        # the patch adds this attribute and the INIT code that reads it together
        # (scripts/pyfuse3/build.sh compiles the patched .pyx, never a shipped .c)
        cache_symlinks=hasattr(pyfuse3.Operations, "enable_cache_symlinks"),
        read_queued=hasattr(pyfuse3, "_curvine_read_queued"))

