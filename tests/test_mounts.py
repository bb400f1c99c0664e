"""The one parser of the mount table (common/mounts.py), used by `curvine local`, the
mount's health, `curvine fs` and the benchmark.

The kernel's own format, written to a file: escaped space, tab, newline and backslash
come back as the path they name; and the live table of this process names "/".
"""

from __future__ import annotations

from curvine.common.mounts import Mount, mount_table


def test_escaped_paths_come_back_as_named(tmp_path):
    table = tmp_path / "mounts"
    table.write_text(
        "/dev/vda / ext4 rw,relatime 0 0\n"
        "curvine /mnt/kv\\040cache fuse.curvine rw,nosuid,nodev 0 0\n"
        "curvine /mnt/a\\011b\\012c\\134d fuse.curvine rw 0 0\n"
        "\n"
        "short line\n")
    assert mount_table(str(table)) == [
        Mount("/dev/vda", "/", "ext4"),
        Mount("curvine", "/mnt/kv cache", "fuse.curvine"),
        Mount("curvine", "/mnt/a\tb\nc\\d", "fuse.curvine"),
    ]
    assert mount_table(str(tmp_path / "missing")) == []


def test_the_live_table_has_the_root():
    assert "/" in {m.point for m in mount_table()}
