"""Process-wide thread pools of the client, each made on first use (a process that never
reads remotely or writes starts none of their threads)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor


class LazyExecutor:
    """Call it to get the pool: ``upload_pool = LazyExecutor(16, "block-upload")``."""

    def __init__(self, max_workers: int, name: str):
        self.max_workers = max_workers
        self.name = name
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    def __call__(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self.max_workers,
                                                    thread_name_prefix=self.name)
            return self._executor
