"""The worker of this host that a writer may stage a first block on (``LocalWorker``).

Its own module because both sides of a write use it: the buffers
(``block_buffers.unplaced_buffer``, ``placed_buffer``) read and update it through their
uploader, and the uploader (``uploader.Uploader``) holds it for the writers of one
mount or client.
"""

from __future__ import annotations

from typing import Iterable

from curvine.proto import common_pb2

from ..blocks import block_client

WorkerInfo = common_pb2.WorkerInfo


class LocalWorker:
    """The worker of this host that the master last named (statfs, AddBlock), shared by
    the writers of one mount or client: where a first block is written before it is
    placed (see the module docstring).  Only a worker with a data dir that ``dirs``
    (this process's configuration, ``block_client.LocalDirs``; None: the process's)
    names is taken: a dir reported over the network is never written to by itself."""

    def __init__(self, host_id: str,
                 dirs: "block_client.LocalDirs | Iterable[str] | None" = None):
        self.host_id = host_id
        self.dirs = block_client.local_dirs(dirs)
        self.info: WorkerInfo | None = None

    def note(self, workers: Iterable[WorkerInfo]) -> None:
        for w in workers:
            if w.host_id == self.host_id and not w.lost and self.dirs.of(w):
                self.info = w
