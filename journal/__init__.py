"""Write-ahead journal of the master: segmented, checksummed, group-committed.

See ``journal.py`` for the durability rules and ``segment.py`` for the file format.
"""

from .checkpoint import latest_checkpoint, write_checkpoint
from .journal import Journal
from .segment import JournalCorruption, JournalError, JournalRecord

__all__ = [
    "Journal",
    "JournalCorruption",
    "JournalError",
    "JournalRecord",
    "latest_checkpoint",
    "write_checkpoint",
]
