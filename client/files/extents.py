"""The extent map of one version of a file being written.

The version is a list of extents covering [0, size) without gaps: uploaded blocks
(immutable, reusable from the base version; or inline: block id 0 with its bytes in
``Block.data``), holes (block id 0 without data, never written) and
buffers (blocks being written: ``block_buffers``).  The map keeps the size and the
extents in step; which buffer is written and when one is uploaded is the writer's.
"""

from __future__ import annotations

import bisect
from concurrent.futures import Future
from typing import Iterable

from curvine.proto import common_pb2

from .block_buffers import BlockBuffer

Block = common_pb2.Block


class Extent:
    """[start, start+length) of the version: an uploaded block/hole, or a buffer."""

    __slots__ = ("start", "block", "buf", "upload")

    def __init__(self, start: int, block: Block | None = None, buf: BlockBuffer | None = None):
        self.start = start
        self.block = block  # set once uploaded (or a hole / base block)
        self.buf = buf  # the bytes while in memory
        self.upload: Future | None = None  # a background upload of buf in flight

    @property
    def length(self) -> int:
        return len(self.buf) if self.buf is not None else self.block.length

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def is_hole(self) -> bool:
        """Never written: reads as zeros (block id 0 without inline data)."""
        return self.buf is None and self.block.block_id == 0 and not self.block.HasField("data")

    def stored(self, block: Block) -> None:
        """The buffer is ``block`` on the workers now: let its bytes go."""
        self.block = block
        self.buf.release()
        self.buf = None


class ExtentMap(list):
    """The extents of a version in order, and its ``size`` (where the last one ends;
    read without the writer's lock, so kept as a number)."""

    def __init__(self, blocks: Iterable[Block] = ()):
        super().__init__()
        self.size = 0
        for b in blocks:
            if b.length:
                self.append(Extent(self.size, block=b))
                self.size += b.length

    def index(self, offset: int) -> int:
        """Index of the extent holding ``offset`` (< size)."""
        if self and self[-1].start <= offset:  # the common case: writing at the end
            return len(self) - 1
        starts = [e.start for e in self]
        return bisect.bisect_right(starts, offset) - 1

    def _position(self, ext: Extent) -> int:
        """Where ``ext`` is in the list (it may start where an empty one does)."""
        i = bisect.bisect_left([e.start for e in self], ext.start)
        while self[i] is not ext:
            i += 1
        return i

    def capacity_end(self, ext: Extent) -> int:
        """How far the extent's buffer may grow, to a block at most: the last one past
        the end of the version, another over the hole that follows it."""
        if ext is self[-1]:
            return ext.start + ext.buf.capacity
        nxt = self[self._position(ext) + 1]
        if nxt.is_hole:
            return min(ext.start + ext.buf.capacity, nxt.end)
        return ext.end

    def write(self, ext: Extent, rel: int, data) -> None:
        """Write ``data`` into the buffer of ``ext`` at ``rel`` (<= its length; up to
        ``capacity_end``)."""
        end = ext.end
        ext.buf = ext.buf.write(rel, data)
        self._grown(ext, end)

    def zero_fill(self, ext: Extent, to: int) -> None:
        """Grow the buffer of ``ext`` with zeros up to ``to`` (<= ``capacity_end``)."""
        end = ext.end
        ext.buf = ext.buf.zero_extend(to - ext.start)
        self._grown(ext, end)

    def _grown(self, ext: Extent, old_end: int) -> None:
        """``ext`` grew past ``old_end``: over the hole after it, or the version."""
        if ext.end <= old_end:
            return
        if ext is not self[-1]:
            i = self._position(ext) + 1
            hole = self[i]
            if ext.end >= hole.end:
                del self[i]
            else:
                hole.block = Block(block_id=0, length=hole.end - ext.end)
                hole.start = ext.end
        if ext.end > self.size:
            self.size = ext.end

    def split_hole(self, i: int, at: int, ext: Extent) -> None:
        """Put the empty buffer extent ``ext`` at ``at`` inside the hole ``self[i]``: the
        hole before it stays, the hole after it is what the buffer grows over."""
        hole = self[i]
        end = hole.end
        after = Extent(at, block=Block(block_id=0, length=end - at))
        if at > hole.start:
            hole.block = Block(block_id=0, length=at - hole.start)
            self[i + 1:i + 1] = [ext, after]
        else:
            self[i:i + 1] = [ext, after]

    def zero_extend(self, ext: Extent, size: int) -> None:
        """Grow the version to ``size`` with zeros in the buffer of the last extent."""
        ext.buf = ext.buf.zero_extend(size - ext.start)
        self.size = size

    def add_holes(self, size: int, block_size: int) -> None:
        """Grow the version to ``size`` with holes of at most a block each."""
        pos = self.size
        while pos < size:
            n = min(block_size, size - pos)
            self.append(Extent(pos, block=Block(block_id=0, length=n)))
            pos += n
        self.size = size

    def cut(self, size: int) -> tuple[Extent | None, list[Extent]]:
        """Shrink the version to ``size`` (< size): the extents from ``size`` on go, a
        hole across it is shortened.  Returns the extent with data across ``size``
        (None if none), for the caller to ``truncate`` once it is in memory, and the
        extents dropped."""
        i = self.index(size)
        ext = self[i]
        keep = i + 1 if ext.start < size else i
        dropped = self[keep:]
        del self[keep:]
        self.size = self[-1].end if self else 0
        if ext.start >= size:
            return None, dropped
        if ext.is_hole:
            ext.block = Block(block_id=0, length=size - ext.start)
            self.size = size
            return None, dropped
        return ext, dropped

    def truncate(self, ext: Extent, size: int) -> None:
        """End the version at ``size`` inside the buffer of ``ext`` (the last)."""
        ext.buf = ext.buf.truncate(size - ext.start)
        self.size = size
