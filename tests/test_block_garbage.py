"""Blocks a writer drops before publishing are freed at once, not left on the workers.

A writer that moves back and forth between two parts of a file uploads a part each
time it leaves it and reads it back when it returns: every round trip used to leave one
block on the worker that no file uses (deleted only by a block report after
``master.orphan_block_grace``).  A slow fio job of 128 MiB random writes left 48 GB.
"""

from __future__ import annotations

import os

from cluster_util import wait_for

MiB = 1 << 20


def _block_files(c) -> list[str]:
    out = []
    for root, _dirs, files in os.walk(os.path.join(c.base, "worker")):
        if os.sep + "blocks" in root:
            out += [f for f in files if f.endswith(".blk")]
    return out


def test_blocks_dropped_by_a_writer_are_freed_at_publish(make_cluster, tmp_path):
    conf = tmp_path / "small-blocks.toml"
    conf.write_text('[cluster]\nblock_size = "1MiB"\n[worker]\nheartbeat_interval = "0.2s"\n')
    c = make_cluster(workers=1, mounts=2, conf=str(conf))
    path = os.path.join(c.mounts[0], "pingpong.data")
    piece = 64 * 1024
    rounds = 30
    want = bytearray(3 * MiB)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        for i in range(rounds):  # block 0, then block 2, and back: one upload per switch
            for off in (i * piece % MiB, 2 * MiB + i * piece % MiB):
                data = bytes([i + 1]) * piece
                os.pwrite(fd, data, off)
                want[off:off + piece] = data
        os.pwrite(fd, b"\0", 3 * MiB - 1)  # the file's size: 3 blocks
        want[-1] = 0
    finally:
        os.close(fd)
    with open(os.path.join(c.mounts[1], "pingpong.data"), "rb") as f:
        assert f.read() == bytes(want)
    # the published version has 3 blocks (one may be a hole, not stored); everything
    # else the writer uploaded on the way must be deleted by the next heartbeats
    left = wait_for(lambda: (lambda n: n if len(n) <= 3 else None)(_block_files(c)),
                    timeout=15, interval=0.2,
                    what=f"dropped blocks to be deleted (now {len(_block_files(c))} files)")
    print(f"\n{rounds} round trips between two blocks: {len(left)} block files left")
    with open(os.path.join(c.mounts[1], "pingpong.data"), "rb") as f:
        assert f.read() == bytes(want)
