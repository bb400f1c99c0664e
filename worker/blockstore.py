"""Block files on a worker's local disks: the worker's only state, no database.

Layout under each data dir (the contract in docs/CONTRACTS.md)::

    <data_dir>/blocks/<block_id % 256 as 2 hex>/<block_id as 16 hex>.blk   finalised
    <data_dir>/staging/<block_id as 16 hex>.<random>.tmp                  being written
    <data_dir>/staging/<block_id as 16 hex>.c<random>.tmp                 written by a
                                                                          client (adopt)

A block is written to a staging file while its crc32 is computed, compared with the
client's checksum and renamed into place (os.replace), so a reader never sees a
partial block.  Staging files left by a crash are removed on start, and the finalised
files are scanned into an in-memory index that feeds the full block report.

Short-circuit writes: a client on this host writes a block's staging file itself
(flock'ed while it writes) and asks the worker to ``adopt`` it, which checks the name,
type, link count and length and puts it into place like a finished write (one
finalisation for both: ``BlockStore._put_in_place``).  Client
staging files whose writer is gone (the flock is free) are swept periodically.
A client without access to the data dirs writes through a descriptor instead: the
worker's own staging file (``begin_write``), passed over its domain socket
(worker/domain_socket.py) and finalised with ``BlockWriter.finish_external``; the
worker's read-only descriptor of a block (``open_block``) is passed the same way.

Private: every directory of a data dir is 0700 and every file the worker creates is
0600 (an adopted file is made 0600 too); at start the data dir and its staging and
block directories are checked (common/private_files.py): opened up to group or others
they are made 0700 with a warning, owned by another user they are refused
(NotOwnedError, exit 2).  Block files are not walked: the dirs keep others out.

Paths are built only from validated integer block ids, so no request can name a
file outside the data dirs.  fsync is off by default: this is a cache (LMCache never
fsyncs either) and a block lost in a crash is a cache miss, not data loss.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import secrets
import stat
import threading
import time
from dataclasses import dataclass
from typing import Iterable

from curvine.common.checksum import crc32
from curvine.common import private_files
from curvine.common.errors import CurvineError, ErrorKind, invalid
from curvine.common.fds import close_fd
from curvine.common.blocks import (CLIENT_STAGING_NAME, MAX_BLOCK_ID, block_path, block_relpath,
                                   check_block_id)
from curvine.common.ids import MIB

log = logging.getLogger(__name__)

READ_CHUNK = MIB  # the data unit: largest chunk a read yields
_BLOCK_NAME = re.compile(r"([0-9a-f]{16})\.blk")
_STAGING_SUFFIX = ".tmp"
_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
STALE_CLIENT_STAGING = 60.0  # seconds before an unlocked client staging file is swept
MAX_CHANGES = 100_000  # block set changes kept for the next heartbeat (then: "lost")
# every directory of a data dir (created 0700 and checked at start); files are 0600
_PRIVATE_SUBDIRS = ("staging", "blocks", *(os.path.join("blocks", f"{i:02x}") for i in range(256)))


@dataclass(frozen=True)
class BlockEntry:
    dir_index: int
    size: int
    mtime_ns: int


class BlockStore:
    """Finalised blocks plus in-progress writes over one or more data dirs; thread-safe.

    ``capacity`` is the byte limit (0 = what the data dirs' file systems could give:
    their free space plus what the blocks already use).  ``used`` counts finalised
    and staging bytes.  Opening the store removes staging leftovers and scans blocks.
    """

    def __init__(self, data_dirs: Iterable[str], capacity: int = 0, fsync: bool = False):
        dirs = [os.path.abspath(d) for d in data_dirs]
        if not dirs:
            raise invalid("data_dirs", "at least one data dir is needed")
        if len({os.path.realpath(d) for d in dirs}) != len(dirs):
            raise invalid("data_dirs", "a data dir is listed twice")
        if capacity < 0:
            raise invalid("capacity", "must not be negative")
        self.data_dirs: list[str] = dirs
        self.fsync = fsync
        self._configured_capacity = capacity
        self._lock = threading.Lock()
        self._blocks: dict[int, BlockEntry] = {}
        self._used = 0  # finalised + staging bytes
        self._reserved = 0  # announced but not yet written bytes of writes in progress
        self._pending_by_dir = [0] * len(dirs)  # the same, per data dir (for placement)
        # Changes of the block set since the last take_changes (the heartbeat tells the
        # master which of its placements and deletes ``used`` already includes).
        self._added: list[int] = []
        self._removed: list[int] = []
        self._changes_lost = False
        self._bad: list[int] = []  # copies found not intact and removed (take_bad)
        self._adopt_mode_warned = False
        for d in dirs:
            try:
                # 0700, owned by this user (common/private_files.py): the dirs, not the
                # millions of block files in them, are what keep other users out
                private_files.private_dir(d, "worker.data_dirs", _PRIVATE_SUBDIRS)
            except OSError as e:
                raise CurvineError(ErrorKind.IO, f"data dir {d}: {e.strerror}") from None
        self._clean_staging()
        self._scan()
        self.capacity = capacity or self._auto_capacity()
        log.info("block store: %d blocks, %d bytes used, capacity %d bytes, data dirs %s",
                 len(self._blocks), self._used, self.capacity, ", ".join(dirs))

    # -- start-up ---------------------------------------------------------------------

    def _clean_staging(self) -> None:
        removed = 0
        for d in self.data_dirs:
            staging = os.path.join(d, "staging")
            with os.scandir(staging) as it:
                for ent in it:
                    try:
                        os.unlink(ent.path)
                        removed += 1
                    except IsADirectoryError:
                        log.warning("ignoring directory %s in the staging area", ent.path)
                    except FileNotFoundError:
                        pass
        if removed:
            log.info("removed %d staging leftovers of interrupted writes", removed)

    def _scan(self) -> None:
        stray = 0
        for di, d in enumerate(self.data_dirs):
            blocks = os.path.join(d, "blocks")
            with os.scandir(blocks) as subdirs:
                for sub in subdirs:
                    if not sub.is_dir(follow_symlinks=False):
                        stray += 1
                        continue
                    with os.scandir(sub.path) as files:
                        for ent in files:
                            m = _BLOCK_NAME.fullmatch(ent.name)
                            block_id = int(m.group(1), 16) if m else 0
                            if (not m or not 1 <= block_id <= MAX_BLOCK_ID
                                    or sub.name != f"{block_id % 256:02x}"
                                    or not ent.is_file(follow_symlinks=False)):
                                stray += 1
                                continue
                            st = ent.stat(follow_symlinks=False)
                            old = self._blocks.get(block_id)
                            if old is not None:
                                # Only manual copying makes duplicates; the content of a
                                # block id never changes, so keep one and drop the other.
                                log.warning("block %016x is in two data dirs; removing %s",
                                            block_id, ent.path)
                                os.unlink(ent.path)
                                continue
                            self._blocks[block_id] = BlockEntry(di, st.st_size, st.st_mtime_ns)
                            self._used += st.st_size
        if stray:
            log.warning("ignored %d files in the block directories that are not block files",
                        stray)

    def volumes(self) -> dict[int, int]:
        """st_dev -> bytes free, of each distinct file system of the data dirs (the
        master counts a file system that several workers share once)."""
        free: dict[int, int] = {}
        for d in self.data_dirs:
            dev = os.stat(d).st_dev
            if dev not in free:
                st = os.statvfs(d)
                free[dev] = st.f_bavail * st.f_frsize
        return free

    def _auto_capacity(self) -> int:
        """Free space of the data dirs' distinct file systems plus what blocks use."""
        return sum(self.volumes().values()) + self._used

    # -- queries ------------------------------------------------------------------------

    @property
    def used(self) -> int:
        return self._used

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._blocks

    def stats(self) -> tuple[int, int, int]:
        """(capacity, used, number of blocks); refreshes an automatic capacity."""
        if not self._configured_capacity:
            try:
                self.capacity = self._auto_capacity()
            except OSError as e:
                log.warning("cannot stat data dirs: %s", e)
        with self._lock:
            return self.capacity, self._used, len(self._blocks)

    def take_changes(self) -> tuple[int, int, int, list[int], list[int], bool]:
        """(capacity, used, blocks, added ids, removed ids, lost) in one snapshot: the
        block ids finalised and deleted since the last call, which ``used`` includes;
        ``lost`` when more than MAX_CHANGES happened (the lists are then incomplete)."""
        capacity = self.stats()[0]
        with self._lock:
            changes = (capacity, self._used, len(self._blocks), self._added, self._removed,
                       self._changes_lost)
            self._added, self._removed, self._changes_lost = [], [], False
        return changes

    def give_back_changes(self, added: list[int], removed: list[int], lost: bool) -> None:
        """Changes taken for a heartbeat that did not reach the master: sent again."""
        with self._lock:
            self._added[:0] = added
            self._removed[:0] = removed
            self._changes_lost = self._changes_lost or lost
            self._trim_changes()

    def _trim_changes(self) -> None:
        """(under _lock) keep the change lists bounded while the master is away."""
        if len(self._added) + len(self._removed) > MAX_CHANGES:
            self._added, self._removed, self._changes_lost = [], [], True

    def _note_added(self, block_id: int) -> None:
        """(under _lock)"""
        self._added.append(block_id)
        self._trim_changes()

    def report(self) -> list[tuple[int, int]]:
        """(block id, mtime ns) of every finalised block, for the full block report."""
        with self._lock:
            return [(b, e.mtime_ns) for b, e in self._blocks.items()]

    def report_sizes(self) -> list[tuple[int, int, int]]:
        """(block id, mtime ns, length) of every finalised block: the block report with
        lengths, so the master can tell whether a copy covers a block it re-admits."""
        with self._lock:
            return [(b, e.mtime_ns, e.size) for b, e in self._blocks.items()]

    def size_of(self, block_id: int) -> int | None:
        """Length of a finalised block here, None if absent."""
        with self._lock:
            entry = self._blocks.get(block_id)
        return entry.size if entry is not None else None

    def info(self, block_id: int) -> tuple[int, str]:
        """(length, absolute path) of a finalised block; NOT_FOUND if absent."""
        block_id = check_block_id(block_id)
        with self._lock:
            entry = self._blocks.get(block_id)
        if entry is None:
            raise CurvineError(ErrorKind.NOT_FOUND, f"block {block_id:016x} not on this worker")
        return entry.size, block_path(self.data_dirs[entry.dir_index], block_id)

    # -- write --------------------------------------------------------------------------

    def begin_write(self, block_id: int, expected_length: int = 0) -> "BlockWriter":
        """Start writing a block into a staging file (NO_SPACE if it cannot fit)."""
        block_id = check_block_id(block_id)
        if expected_length < 0:
            raise invalid("expected_length", "must not be negative")
        with self._lock:
            if self._used + self._reserved + expected_length > self.capacity:
                raise CurvineError(
                    ErrorKind.NO_SPACE,
                    f"worker full: {self._used} of {self.capacity} bytes used, "
                    f"{expected_length} more requested")
            di = self._pick_dir(max(expected_length, 1))
            self._reserved += expected_length
            self._pending_by_dir[di] += expected_length
        path = os.path.join(self.data_dirs[di], "staging",
                            f"{block_id:016x}.{secrets.token_hex(8)}{_STAGING_SUFFIX}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                         private_files.FILE_MODE)
        except OSError as e:
            with self._lock:
                self._reserved -= expected_length
                self._pending_by_dir[di] -= expected_length
            raise _disk_error(e, path) from None
        return BlockWriter(self, block_id, di, path, fd, expected_length)

    def _pick_dir(self, need: int) -> int:
        """The data dir with the most free space that has room for ``need`` bytes."""
        best, best_free = -1, -1
        for di, d in enumerate(self.data_dirs):
            try:
                st = os.statvfs(d)
            except OSError as e:
                log.warning("data dir %s unusable: %s", d, e)
                continue
            free = st.f_bavail * st.f_frsize - self._pending_by_dir[di]
            if free >= need and free > best_free:
                best, best_free = di, free
        if best < 0:
            raise CurvineError(ErrorKind.NO_SPACE, f"no data dir has {need} bytes free")
        return best

    def _grow(self, writer: "BlockWriter", n: int) -> None:
        covered = min(n, writer._reserved_left)
        extra = n - covered
        with self._lock:
            if extra and self._used + self._reserved + extra > self.capacity:
                raise CurvineError(
                    ErrorKind.NO_SPACE,
                    f"worker full: {self._used} of {self.capacity} bytes used")
            self._used += n
            self._reserved -= covered
            self._pending_by_dir[writer.dir_index] -= covered
        writer._reserved_left -= covered

    def _release(self, writer: "BlockWriter", drop_written: bool) -> None:
        with self._lock:
            self._reserved -= writer._reserved_left
            self._pending_by_dir[writer.dir_index] -= writer._reserved_left
            if drop_written:
                self._used -= writer.length
        writer._reserved_left = 0

    # -- finalisation: a staging file becomes a block ------------------------------------

    def _put_in_place(self, block_id: int, di: int, staging: str, fd: int, length: int,
                      checked: os.stat_result | None = None) -> None:
        """The one finalisation, of the worker's own writes (``BlockWriter.finish``) and
        of a client's (``adopt``): fsync the staging file (if configured), rename it to
        its block path in data dir ``di``, fsync that dir, index the block (replacing
        an older copy).  ``used`` counts ``length`` already; on failure nothing is
        indexed and the caller gives it back.  ``checked``: the identity adopt checked
        through ``fd``, which the file renamed must still have (else INVALID, and what
        was swapped in is removed).  Disk errors are raised as OSError."""
        final = block_path(self.data_dirs[di], block_id)
        if self.fsync:
            os.fsync(fd)
        mtime_ns = os.fstat(fd).st_mtime_ns
        try:
            os.replace(staging, final)
        except FileNotFoundError:
            if not os.path.exists(staging):
                raise
            # The block subdir vanished (someone cleaned up by hand): recreate it.
            private_files.make_dir(os.path.dirname(final))
            os.replace(staging, final)
        if self.fsync:
            private_files.fsync_dir(os.path.dirname(final))
        if checked is not None:
            try:
                _check_same_file(final, checked, staging)
            except CurvineError:
                # the rename replaced an older copy in this dir: that one is gone too
                with self._lock:
                    old = self._blocks.get(block_id)
                    if old is not None and old.dir_index == di:
                        del self._blocks[block_id]
                        self._used -= old.size
                raise
        stale = None
        with self._lock:
            old = self._blocks.get(block_id)
            if old is not None:
                self._used -= old.size
                if old.dir_index != di:
                    stale = block_path(self.data_dirs[old.dir_index], block_id)
            self._blocks[block_id] = BlockEntry(di, length, mtime_ns)
            self._note_added(block_id)
        if stale:
            _unlink(stale)

    # -- short-circuit writes -------------------------------------------------------------

    def adopt(self, block_id: int, path: str, length: int, checksum: int) -> tuple[int, int]:
        """Finalise a block a client on this host wrote into a staging file here.

        ``path`` must name ``<data dir>/staging/<block id>.c<random>.tmp`` of one of this
        store's data dirs: a regular file (not a symlink) with one link and ``length``
        bytes.  Anything else is INVALID (a path elsewhere is never touched); a missing
        file is NOT_FOUND.  The client's ``checksum`` is recorded, not recomputed.
        Returns (length, checksum)."""
        block_id = check_block_id(block_id)
        di = self._client_staging_dir(block_id, path)
        if length < 0:
            raise invalid("length", "must not be negative")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise CurvineError(ErrorKind.NOT_FOUND, f"staging file {path} not found "
                                                    f"(the worker restarted?)") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise invalid("path", f"{path} is a symbolic link") from None
            raise _disk_error(e, path) from None
        try:
            st = self._check_client_file(fd, path, length)
            with self._lock:
                full = self._used + self._reserved + length > self.capacity
                if not full:
                    self._used += length
            if full:
                _unlink(path)
                raise CurvineError(ErrorKind.NO_SPACE,
                                   f"worker full: {self._used} of {self.capacity} bytes "
                                   f"used, {length} more requested")
            try:
                self._put_in_place(block_id, di, path, fd, length, checked=st)
            except CurvineError:  # the staging file was swapped: final is gone
                with self._lock:
                    self._used -= length
                raise
            except OSError as e:
                with self._lock:
                    self._used -= length
                if e.errno == errno.ENOENT:
                    raise CurvineError(ErrorKind.NOT_FOUND,
                                       f"staging file {path} vanished") from None
                raise _disk_error(e, block_path(self.data_dirs[di], block_id)) from None
        finally:
            os.close(fd)
        return length, checksum

    def _client_staging_dir(self, block_id: int, path) -> int:
        """The data dir whose staging area holds ``path``, a client staging file of
        ``block_id`` by its name (INVALID otherwise)."""
        if not isinstance(path, str) or not os.path.isabs(path):
            raise invalid("path", f"{path!r} is not an absolute path")
        parent, name = os.path.split(path)
        m = CLIENT_STAGING_NAME.fullmatch(name)
        if m is None or int(m.group(1), 16) != block_id:
            raise invalid("path", f"{path} is not a client staging file of block "
                                  f"{block_id:016x}")
        parent = os.path.normpath(parent)
        for di, d in enumerate(self.data_dirs):
            if parent == os.path.join(d, "staging"):
                return di
        raise invalid("path", f"{path} is not in the staging area of this worker's "
                              f"data dirs")

    def _check_client_file(self, fd: int, path: str, length: int) -> os.stat_result:
        """What adopt checks of the file it opened (INVALID if it fails): a regular
        file with one link and ``length`` bytes; it is made private like a block."""
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise invalid("path", f"{path} is not a regular file")
        if st.st_nlink != 1:
            raise invalid("path", f"{path} has {st.st_nlink} links")
        if st.st_size != length:
            raise invalid("length", f"{path} holds {st.st_size} bytes, not {length}")
        self._make_private(fd, st, path)
        return st

    def _make_private(self, fd: int, st: os.stat_result, path: str) -> None:
        """An adopted file becomes 0600 like the worker's own blocks, whatever mode
        its writer gave it (the client makes it this worker's user's file)."""
        if stat.S_IMODE(st.st_mode) == private_files.FILE_MODE:
            return
        try:
            os.fchmod(fd, private_files.FILE_MODE)
        except OSError as e:
            # not this user's file (a client that did not chown it): the 0700 data
            # dir still keeps other users away from it
            if not self._adopt_mode_warned:
                self._adopt_mode_warned = True
                log.warning("cannot make adopted block files 0600 (%s is owned by uid %d, "
                            "mode %o: %s); the data dir's mode 0700 still keeps other "
                            "users out (said once)", path, st.st_uid,
                            stat.S_IMODE(st.st_mode), e.strerror)

    def sweep_client_staging(self, min_age: float = STALE_CLIENT_STAGING) -> int:
        """Remove client staging files older than ``min_age`` seconds whose writer is
        gone (nobody holds their flock).  Returns how many were removed."""
        removed = 0
        now = time.time()
        for d in self.data_dirs:
            try:
                with os.scandir(os.path.join(d, "staging")) as it:
                    entries = [e for e in it if CLIENT_STAGING_NAME.fullmatch(e.name)]
            except OSError as e:
                log.warning("cannot list the staging area of %s: %s", d, e)
                continue
            for ent in entries:
                try:
                    st = ent.stat(follow_symlinks=False)
                    if now - st.st_mtime < min_age:
                        continue
                    fd = os.open(ent.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                                 | os.O_NONBLOCK)
                except OSError:
                    continue  # adopted or removed meanwhile, or not a plain file
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    continue  # its writer is still at work
                try:
                    # Still the same file at that name (not adopted meanwhile)?
                    same = os.path.samestat(os.fstat(fd), os.stat(ent.path,
                                                                  follow_symlinks=False))
                except OSError:
                    same = False
                if same:
                    _unlink(ent.path)
                    removed += 1
                os.close(fd)
        if removed:
            log.info("removed %d client staging files whose writers are gone", removed)
        return removed

    # -- read and delete ----------------------------------------------------------------

    def read(self, block_id: int, offset: int = 0, length: int = 0,
             chunk: int = READ_CHUNK) -> "BlockChunks":
        """Chunks (<= ``chunk`` bytes) of [offset, offset+length) of a finalised block.

        ``length`` 0 means to the end.  Errors (NOT_FOUND, INVALID) are raised here,
        before iteration; the open file keeps the data readable even if the block is
        deleted meanwhile.
        """
        block_id = check_block_id(block_id)
        if not 1 <= chunk <= READ_CHUNK:
            raise invalid("chunk_size", f"must be 1..{READ_CHUNK}")
        if offset < 0:
            raise invalid("offset", "must not be negative")
        if length < 0:
            raise invalid("length", "must not be negative")
        fd, size = self.open_block(block_id)
        try:
            if offset > size:
                raise invalid("offset", f"{offset} is beyond the end of the block ({size} bytes)")
            if length == 0:
                length = size - offset
            elif offset + length > size:
                raise invalid("length", f"{offset}+{length} is beyond the end of the block "
                                        f"({size} bytes)")
        except BaseException:
            os.close(fd)
            raise
        return BlockChunks(fd, block_id, offset, length, chunk)

    def open_block(self, block_id: int) -> tuple[int, int]:
        """(read-only descriptor, size) of a finalised block; the caller closes it.
        NOT_FOUND if absent.  The open file keeps the data readable even if the block
        is deleted meanwhile (reads here, and descriptors passed to local clients)."""
        block_id = check_block_id(block_id)
        with self._lock:
            entry = self._blocks.get(block_id)
        if entry is None:
            raise CurvineError(ErrorKind.NOT_FOUND, f"block {block_id:016x} not on this worker")
        path = block_path(self.data_dirs[entry.dir_index], block_id)
        try:
            # never a symlink: block files are made only by rename of checked files
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise CurvineError(ErrorKind.NOT_FOUND,
                               f"block {block_id:016x} not on this worker") from None
        except OSError as e:
            if e.errno == errno.ELOOP:  # a symlink where the block file was: tampering
                self.remove_bad(block_id, "a symlink in place of its file")
                raise CurvineError(ErrorKind.CHECKSUM, f"block {block_id:016x}: the copy "
                                   f"on this worker was not intact (removed)") from None
            raise _disk_error(e, path) from None
        try:
            st = os.fstat(fd)
        except OSError as e:
            os.close(fd)
            raise _disk_error(e, path) from None
        if st.st_size != entry.size or st.st_mtime_ns != entry.mtime_ns:
            # Written after it was finished (a descriptor a local client kept, or a hand
            # on the disk): not the block the master recorded.
            os.close(fd)
            self.remove_bad(block_id, f"its file changed after it was finished ({st.st_size} "
                                      f"bytes, {entry.size} recorded)")
            raise CurvineError(ErrorKind.CHECKSUM, f"block {block_id:016x}: the copy on "
                                                   f"this worker was not intact (removed)")
        return fd, st.st_size

    def verify(self, block_id: int, length: int, checksum: int) -> bool:
        """Check the copy of ``block_id`` against what the master recorded (its first
        ``length`` bytes, crc32 ``checksum``); one that does not match is removed
        (``remove_bad``).  True if intact (or not here)."""
        try:
            fd, size = self.open_block(block_id)
        except CurvineError as e:
            # not here (any more): nothing to check; or found changed (and removed)
            return e.kind != ErrorKind.CHECKSUM
        try:
            crc, pos = 0, 0
            while pos < length:
                data = os.pread(fd, min(1 << 20, length - pos), pos)
                if not data:
                    break
                crc = crc32(data, crc)
                pos += len(data)
        except OSError as e:
            problem = f"reading it failed: {e.strerror}"
        else:
            problem = (None if pos == length and crc == checksum
                       else f"{pos} of {length} bytes, crc32 {crc:08x}, recorded {checksum:08x}")
        finally:
            os.close(fd)
        if problem is None:
            log.info("block %016x: a reader reported its copy here; it is intact", block_id)
            return True
        self.remove_bad(block_id, problem)
        return False

    def remove_bad(self, block_id: int, why: str) -> None:
        """Remove a copy that is not intact; the next heartbeat reports it
        (``take_bad``) so that the master copies the block again from a sound one."""
        log.warning("block %016x: the copy here is not intact (%s); removing it",
                    block_id, why)
        self.delete([block_id])
        with self._lock:
            if len(self._bad) < MAX_CHANGES:
                self._bad.append(block_id)

    def take_bad(self) -> list[int]:
        with self._lock:
            bad, self._bad = self._bad, []
        return bad

    def give_back_bad(self, bad: list[int]) -> None:
        with self._lock:
            self._bad[:0] = bad

    def delete(self, block_ids: Iterable[int]) -> int:
        """Unlink blocks; ids that are not here are fine.  Returns how many were removed."""
        ids = [check_block_id(b, "block_ids") for b in block_ids]
        gone = []
        with self._lock:
            for b in ids:
                entry = self._blocks.pop(b, None)
                if entry is not None:
                    self._used -= entry.size
                    gone.append((self.data_dirs[entry.dir_index], b))
            self._removed.extend(ids)
            self._trim_changes()
        for data_dir, b in gone:
            _unlink_block(data_dir, b)
        return len(gone)


class BlockWriter:
    """One block being written: ``append`` data, then ``finish(crc)`` or ``abort()``.

    Used by one thread at a time.  As a context manager it aborts on any exception
    (and if the block was not finished), so a failed write leaves no staging file.
    """

    def __init__(self, store: BlockStore, block_id: int, dir_index: int, path: str, fd: int,
                 reserved: int):
        self.store = store
        self.block_id = block_id
        self.dir_index = dir_index
        self.staging_path = path
        self.length = 0
        self.crc = 0
        self._fd: int | None = fd
        self._reserved_left = reserved
        self._done = False

    def append(self, data: bytes | bytearray | memoryview) -> None:
        if self._done:
            raise CurvineError(ErrorKind.INVALID, "data: block already finished")
        n = len(data)
        if not n:
            return
        try:
            self.store._grow(self, n)
        except CurvineError:
            self.abort()
            raise
        self.length += n  # counted in used from here on, released by abort
        view = memoryview(data)
        try:
            written = 0
            while written < n:
                written += os.write(self._fd, view[written:])
        except OSError as e:
            self.abort()
            raise _disk_error(e, self.staging_path) from None
        self.crc = crc32(view, self.crc)

    def finish(self, checksum: int) -> tuple[int, int]:
        """Compare the client's crc32, rename into place; returns (length, crc32)."""
        if self._done:
            raise CurvineError(ErrorKind.INVALID, "finish: block already finished")
        if checksum != self.crc:
            self.abort()
            raise CurvineError(
                ErrorKind.CHECKSUM,
                f"checksum: block {self.block_id:016x} arrived with crc32 {self.crc:08x}, "
                f"the client sent {checksum:08x}")
        return self._finalise()

    def fileno(self) -> int:
        """The staging file's descriptor (write-only), e.g. to pass to a local client."""
        if self._fd is None:
            raise CurvineError(ErrorKind.INVALID, "block already finished")
        return self._fd

    def finish_external(self, length: int, checksum: int) -> tuple[int, int]:
        """Finalise a staging file that a client on this host wrote through its
        descriptor (worker/domain_socket.py) instead of ``append``: its size must be
        ``length``; the bytes are accounted like adopt's (the reservation covers what it
        can, the rest must fit the capacity: else NO_SPACE), and the client's
        ``checksum`` is recorded, not recomputed.  Any failure aborts."""
        if self._done:
            raise CurvineError(ErrorKind.INVALID, "finish: block already finished")
        try:
            if self.length:
                raise invalid("length", "the block was written through append")
            try:
                size = os.fstat(self._fd).st_size
            except OSError as e:
                raise _disk_error(e, self.staging_path) from None
            if size != length:
                raise invalid("length", f"the staging file of block {self.block_id:016x} "
                                        f"holds {size} bytes, not {length}")
            self.store._grow(self, length)
        except CurvineError:
            self.abort()
            raise
        self.length = length  # counted in used from here on, released by abort
        self.crc = checksum
        return self._finalise()

    def _finalise(self) -> tuple[int, int]:
        """The staging file becomes the block (``BlockStore._put_in_place``)."""
        store = self.store
        try:
            store._put_in_place(self.block_id, self.dir_index, self.staging_path, self._fd,
                                self.length)
        except OSError as e:
            self.abort()
            raise _disk_error(e, block_path(store.data_dirs[self.dir_index],
                                            self.block_id)) from None
        self._done = True
        self._close_fd()
        store._release(self, drop_written=False)
        return self.length, self.crc

    def abort(self) -> None:
        """Drop the staging file (idempotent)."""
        if self._done:
            return
        self._done = True
        self._close_fd()
        _unlink(self.staging_path)
        self.store._release(self, drop_written=True)

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            close_fd(fd, f"the staging file of block {self.block_id:016x}")

    def __enter__(self) -> "BlockWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.abort()


class BlockChunks:
    """Iterator over a byte range of an open block file; owns (and closes) the fd.

    A class, not a generator: a generator that is never started would not run its
    ``finally`` and would leak the descriptor."""

    def __init__(self, fd: int, block_id: int, offset: int, length: int, chunk: int):
        self._fd: int | None = fd
        self._block_id = block_id
        self._pos = offset
        self._end = offset + length
        self._chunk = chunk

    def __iter__(self) -> "BlockChunks":
        return self

    def __next__(self) -> bytes:
        if self._fd is None or self._pos >= self._end:
            self.close()
            raise StopIteration
        try:
            data = os.pread(self._fd, min(self._chunk, self._end - self._pos), self._pos)
        except OSError as e:
            self.close()
            raise _disk_error(e, f"block {self._block_id:016x}") from None
        if not data:
            self.close()
            raise CurvineError(ErrorKind.IO, f"block {self._block_id:016x} shrank while being read")
        self._pos += len(data)
        return data

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            close_fd(fd, f"a reader of block {self._block_id:016x}")

    def __del__(self) -> None:
        self.close()


def _disk_error(e: OSError, path: str) -> CurvineError:
    if e.errno in _NO_SPACE_ERRNOS:
        return CurvineError(ErrorKind.NO_SPACE, f"disk full: {path}: {e.strerror}")
    return CurvineError(ErrorKind.IO, f"{path}: {e.strerror or e}")


def _check_same_file(final: str, checked: os.stat_result, staging: str) -> None:
    """After adopt renamed ``staging`` to ``final``: the file now at ``final`` must be
    the one whose type, links and length were checked through the open descriptor.
    A client that swapped the staging name meanwhile (for a symlink or a link to a
    file outside the data dir) gets INVALID, and what it swapped in is removed."""
    st = os.lstat(final)
    if (st.st_dev, st.st_ino) != (checked.st_dev, checked.st_ino):
        _unlink(final)
        raise invalid("path", f"{staging} was replaced while being adopted")


def _unlink_block(data_dir: str, block_id: int) -> None:
    """Remove a block's file, walking from its data dir with O_NOFOLLOW: a directory
    on the way that was swapped for a symlink is not followed out of the data dir."""
    *dirs, name = block_relpath(block_id).split(os.sep)
    try:
        fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        log.warning("cannot remove block %016x: %s: %s", block_id, data_dir, e.strerror)
        return
    try:
        for d in dirs:
            nxt = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass
    except OSError as e:  # a symlink in the way (ELOOP, ENOTDIR): nothing outside goes
        log.warning("cannot remove block %016x under %s: %s", block_id, data_dir, e.strerror)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot remove %s: %s", path, e)
