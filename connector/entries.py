"""What a lookup found, kept briefly for the load that follows it (a prompt's
contains-then-retrieve, an L2 lookup-and-lock then load): the hit then costs no second
master round trip.  Chunk files are never rewritten in place; a stale entry whose blocks
are gone reads as a miss.  Shared by both LMCache adapters."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from .store import Entry

ENTRY_TTL = 10.0
ENTRY_CACHE = 65536


class EntryCache:
    """Recently looked-up entries by name (bounded, expiring); each is used once."""

    def __init__(self):
        self._d: OrderedDict[str, tuple[float, Entry]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, entries) -> None:
        now = time.monotonic()
        with self._lock:
            for e in entries:
                if e is not None:
                    self._d[e.name] = (now, e)
                    self._d.move_to_end(e.name)
            while len(self._d) > ENTRY_CACHE:
                self._d.popitem(last=False)

    def pop(self, name: str) -> Entry | None:
        with self._lock:
            item = self._d.pop(name, None)
        if item is None or time.monotonic() - item[0] > ENTRY_TTL:
            return None
        return item[1]
