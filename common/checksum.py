"""The crc32 of block data (zlib's polynomial: the checksums the master records).

Every byte a client reads is checked against it, so its speed bounds reads from the
page cache: zlib's crc32 runs at about 5 GB/s here, ISA-L's (python-isal, a dependency)
at about 35 GB/s (docs/measurements.md), with identical results.  zlib is the
fallback where isal cannot be imported.
"""

from __future__ import annotations

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives the same values
    from zlib import crc32

__all__ = ["crc32"]
