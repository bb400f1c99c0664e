"""The mount table of this process's mount namespace, read from /proc/self/mounts.

Reading the table never touches the file systems in it (a stat() of a FUSE mount from
its own daemon, or of a hung one, could wait forever).  The kernel escapes space, tab,
newline and backslash in paths as ``\\ooo`` (octal); paths are decoded with
surrogateescape, as Python decodes file names, so they compare equal to them.
"""

from __future__ import annotations

import re
from typing import NamedTuple

MOUNTS = "/proc/self/mounts"
_OCTAL = re.compile(r"\\([0-7]{3})")


class Mount(NamedTuple):
    device: str
    point: str
    fstype: str


def unescape(field: str) -> str:
    """A path field of the mount table as the path it names."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def mount_table(path: str = MOUNTS) -> list[Mount]:
    """Every mount (device, mount point, file system type); [] if the table cannot be
    read."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 3:
            out.append(Mount(unescape(fields[0]), unescape(fields[1]), fields[2]))
    return out
