"""What this mount's kernel may cache, for how long, and when it must forget it.

Leases (master/cluster/leases.py): names (and, with fuse.negative_leases, the absence of a
name) and file attributes the kernel may keep for the lease time; the master revokes
them, through the mount's :class:`LeaseSession`, before another client changes them.
A revocation expires every cached name at once, negative entries included (the
dentry :class:`~.kernel.Epoch`), and drops the attributes of the inodes named.
Notifications go to the kernel only while the mount is up: the kernel lock and the
unmounting flag keep them from racing ``pyfuse3.close``.

Two locks, never the other way round: ``_kernel_lock`` (notifications from other
threads vs unmount; a revocation holds it across page invalidations, which can wait
for a request the trio loop serves) and ``_state_lock`` (the tables below, held only
for dictionary work).  The trio loop never waits for ``_kernel_lock``: unmount comes
after the loop has ended, so the loop's own notifications need no lock, and a loop
blocked on it could deadlock with a revocation (or with a task the lock was handed
to).  A loop so blocked hung the mount under fsstress.

Directory attributes are kept here too (see :class:`KernelCache`), and the leased
attributes of a file this mount publishes are forgotten after the publish, which the
master does not revoke from the writer itself.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
import time
from collections import OrderedDict
from typing import Iterable

import pyfuse3

from curvine.client.master.master_client import LeaseSession, MasterClient
from curvine.common.config import Config
from curvine.common.errors import CurvineError
from curvine.proto import common_pb2

from .kernel import Epoch, fuse_device_fd
from .listings import LeasedListings

log = logging.getLogger(__name__)

Inode = common_pb2.Inode
DIRECTORY = common_pb2.DIRECTORY

# seconds a change by this mount is remembered: a publish that took longer is not kept
# for GETATTR (forget_published)
CHANGE_MEMORY = 30.0
LEASE_SAFETY = 0.2  # seconds the kernel's copy expires before the master's lease
DIR_CACHE = 100_000  # directories whose attributes this mount keeps (fuse.attr_timeout)


def _forget_before(table: dict, before: float) -> int:
    """Drop the entries of ``table`` (key -> a monotonic time) older than ``before``;
    returns the size at which to do it again."""
    for key, t in list(table.items()):
        if t < before:
            table.pop(key, None)
    return 2 * len(table) + 4096


class KernelCache:
    """The kernel's cached names and attributes of one mount, and their leases."""

    def __init__(self, cfg: Config, master: MasterClient):
        self.cfg = cfg
        self.master = master
        self._leases: LeaseSession | None = None
        self._epoch: Epoch | None = None
        self._leased_inodes: dict[int, float] = {}  # ino -> when the kernel's copy expires
        # ino -> (the version this mount published, when its lease expires, its blocks
        # if all inline): a GETATTR or a reader's open of it needs no master call
        # (forget_published, published, published_version)
        self._published: dict[int, tuple[Inode, float, list | None]] = {}
        self._published_names: dict[tuple[int, bytes], int] = {}  # its one name -> ino
        # inode or (parent, name) -> when this mount last began or ended changing it at
        # the master (changing): a publish sent before that may not reflect the change
        self._changed: dict = {}
        self._prune_changed_at = 4096
        self._kernel_lock = threading.Lock()  # notifications vs unmount (pyfuse3.close)
        self._state_lock = threading.Lock()  # the tables; never held across a notification
        # made in the thread that runs the trio loop (fuse_client/main.py)
        self._loop_thread = threading.get_ident()
        self._attached = False  # to a kernel mount (start): notifications can be sent
        self._unmounting = False
        self._prune_leased_at = 4096
        # Directory attributes as last seen from the master (a GETATTR, or the parent
        # attributes a create/unlink/rename here returned): the kernel drops its copy
        # after every change in the directory and needs it for each permission check
        # (default_permissions), so without this every create, stat and unlink in a
        # flat directory cost one more round trip.  Answered for at most
        # fuse.attr_timeout after they were fetched: the staleness the kernel's own
        # cache always had.
        self._dir_attrs: OrderedDict[int, tuple[Inode, float]] = OrderedDict()
        # whole listings leased to this mount: misses answered here (listings.py)
        self.listings = LeasedListings()

    # -- the lease session ----------------------------------------------------------

    def start(self) -> bool:
        """Open the lease session if leases are configured and the kernel can expire
        every cached name at once (fuse_client/kernel.py); True when leases are on.
        After pyfuse3.init (the epoch goes through its /dev/fuse descriptor)."""
        self._attached = True
        if not self.cfg.fuse.leases or self._leases is not None:
            return False
        self._epoch = Epoch(fuse_device_fd())
        if not self._epoch.supported:
            return False
        self._leases = LeaseSession(self.master, self._invalidate, self._drop_all)
        self._leases.start()
        return True

    def stop(self) -> None:
        """Before unmounting: no kernel notification may follow (pyfuse3.close frees
        the session they go through)."""
        with self._kernel_lock:
            self._unmounting = True
        if self._leases is not None:
            self._leases.stop()

    def close(self) -> None:
        """Unmounted: close the lease session and end every session this mount had."""
        if self._leases is not None:
            self._leases.close()
            self._end_sessions(self._leases.opened)

    def _end_sessions(self, sessions: list[int]) -> None:
        """Unmounted: this mount's kernel caches nothing now, so nobody need wait for
        its leases (nor a restarted master).  On a link of its own: the mount's own may
        be closed already (SIGTERM), and a master that is down must not hold the exit."""
        if not sessions:
            return
        link = MasterClient(self.master.address, timeout=1.0, wait=0,
                            security=self.master.security)
        try:
            link.end_sessions(sessions)
        except CurvineError as e:
            log.info("could not end lease sessions (the master waits for them to run out): %s", e)
        finally:
            link.close()

    def _invalidate(self, names, inodes, listed=None) -> None:
        """The master revokes leases (session thread): drop the kernel's copies before
        the ack.  Every cached name goes (one lock-free epoch bump; a lookup in flight
        is stale on arrival), plus the attributes of the inodes named, and the listings
        named (``(dir, b"")``, master/cluster/leases.py LISTING) before that, with the entries
        the kernel keeps of those directories (``listed``: already dropped, these)."""
        if listed is None:
            dirs = [p for p, n in names if not n]
            listed = self.listings.drop(dirs, [k for k in names if k[1]]) if names else ()
        with self._notifications() as may_notify:
            if not may_notify:
                return
            self._epoch.bump()
            for ino in listed:
                self._notify_inval(ino, attr_only=False)
            # A kept version of these names and inodes goes, and a publish of them on
            # its way is not kept either (forget_published): this mount may hold a new
            # lease on the inode by the time its reply arrives, granted after another
            # client's newer version.
            with self._state_lock:
                self._changed_now((*names, *inodes))
                for ino in inodes:
                    self._leased_inodes.pop(ino, None)
            for ino in inodes:
                self._notify_inval(ino, attr_only=True)

    def _drop_all(self) -> None:
        """The session is lost (session thread): drop every leased copy."""
        with self._state_lock:
            self._published.clear()
            self._published_names.clear()
            leased = list(self._leased_inodes)
        self._invalidate((), leased, self.listings.drop_all())

    @contextlib.contextmanager
    def _notifications(self):
        """Inside, kernel notifications may be sent when the value is True (False:
        unmounting).  Another thread holds ``_kernel_lock`` meanwhile; the trio loop
        does not (see the module docstring)."""
        if threading.get_ident() == self._loop_thread:
            yield not self._unmounting
            return
        with self._kernel_lock:
            yield not self._unmounting

    def drop_attributes(self, ino: int) -> None:
        """From the trio loop: make the kernel ask for ``ino``'s attributes again."""
        if not self._attached:
            return
        with self._notifications() as may_notify:
            if may_notify:
                self._notify_inval(ino, attr_only=True)

    @staticmethod
    def _notify_inval(ino: int, attr_only: bool) -> None:
        """Drop the kernel's attributes of ``ino`` (and, unless ``attr_only``, its
        cached pages: a directory's entries)."""
        try:
            pyfuse3.invalidate_inode(ino, attr_only=attr_only)
        except OSError as e:
            if e.errno != errno.ENOENT:  # ENOENT: the kernel has no such inode cached
                raise

    # -- leased answers ---------------------------------------------------------------

    @staticmethod
    def lease_ttl(lease_ms: int, sent: float) -> float:
        """Seconds the kernel may keep a leased answer: the lease counts from when the
        master granted it, which is after ``sent``."""
        if not lease_ms:
            return 0.0
        return max(0.0, lease_ms / 1000 - (time.monotonic() - sent) - LEASE_SAFETY)

    def timeouts(self, inode: Inode, lease: float, writing: bool) -> tuple[float, float]:
        """(entry_timeout, attr_timeout) of an answer about ``inode``; ``lease``: seconds
        the master leased the name (and a file's attributes) to this mount, else the
        configured timeouts apply; ``writing``: this mount writes the file."""
        entry_timeout, file_attr, dir_attr = self.leased_timeouts(lease)
        # a directory's attributes change with every entry: never leased; nor the
        # size of a file this mount writes (the file system layer computes it)
        if inode.type == DIRECTORY or writing:
            return entry_timeout, dir_attr
        if lease > 0:
            self.lease_inode(inode.ino, lease)
        return entry_timeout, file_attr

    def leased_timeouts(self, lease: float) -> tuple[float, float, float]:
        """(entry_timeout, a file's attr_timeout, a directory's attr_timeout) of answers
        leased for ``lease`` seconds (0: not leased, the configured timeouts).  The
        caller notes the files' leases (lease_inode, lease_inodes)."""
        entry_timeout = self.cfg.fuse.entry_timeout
        attr_timeout = self.cfg.fuse.attr_timeout
        if lease > 0:
            return max(lease, entry_timeout), max(lease, attr_timeout), attr_timeout
        return entry_timeout, attr_timeout, attr_timeout

    def lease_inode(self, ino: int, lease: float) -> None:
        """The kernel keeps the attributes of ``ino`` for ``lease`` seconds."""
        self.lease_inodes((ino,), lease)

    def lease_inodes(self, inos: Iterable[int], lease: float) -> None:
        """The kernel keeps the attributes of ``inos`` for ``lease`` seconds."""
        now = time.monotonic()
        leased = self._leased_inodes
        with self._state_lock:
            leased.update(dict.fromkeys(inos, now + lease))
            if len(leased) > self._prune_leased_at:  # forget expired ones now and then
                self._prune_leased_at = _forget_before(leased, now)

    def forget_published(self, ino: int, inode: Inode | None = None,
                         sent: float = 0.0, inline: list | None = None) -> None:
        """A handle here published ``ino`` (in its thread, or the loop): this mount's
        kernel may hold leased attributes of the old version, which the master does not
        revoke from the writer itself.

        ``inode``: the version just published, ``sent``: when the publish was sent,
        ``inline``: its blocks when all of them are inline (kept by the master, none on
        workers).  The kernel's GETATTRs of it are answered from that version
        (``published``), and a reader opens those blocks (``published_version``),
        instead of asking the master, while the lease lasts, unless this mount began or
        ended a change of the inode or of its name since (changing); another client's
        change revokes the lease.  Only for a file with one name (a change by another
        of its names could not be told)."""
        with self._notifications() as may_notify:
            with self._state_lock:
                expiry = self._leased_inodes.pop(ino, None)
                self._drop_published(ino)
            if expiry is None or not may_notify:
                return
            self._notify_inval(ino, attr_only=True)
            if (inode is None or inode.nlink != 1 or not inode.parent
                    or time.monotonic() - sent > CHANGE_MEMORY):
                return
            name = (inode.parent, inode.name)
            if inline is not None and sum(b.length for b in inline) != inode.size:
                inline = None
            with self._state_lock:
                changed = self._changed
                if changed.get(ino, 0.0) >= sent or changed.get(name, 0.0) >= sent:
                    return
                self._published[ino] = (inode, expiry, inline)
                self._published_names[name] = ino

    def _drop_published(self, ino: int) -> None:
        entry = self._published.pop(ino, None)
        if entry is not None:
            self._published_names.pop((entry[0].parent, entry[0].name), None)

    def published(self, ino: int) -> tuple[Inode, float] | None:
        """The version of ``ino`` this mount published last (forget_published), if the
        lease still holds: (inode, seconds left)."""
        entry = self._published.get(ino)
        if entry is None:
            return None
        left = entry[1] - time.monotonic()
        if left <= 0:
            with self._state_lock:
                if self._published.get(ino) is entry:
                    self._drop_published(ino)
            return None
        return entry[0], left

    def published_version(self, ino: int) -> tuple[Inode, list] | None:
        """That version and its blocks, when all of them are inline: (inode, blocks)."""
        entry = self._published.get(ino)
        if entry is None or entry[2] is None or entry[1] <= time.monotonic():
            return None
        return entry[0], entry[2]

    @contextlib.contextmanager
    def changing(self, *keys: int | tuple[int, bytes]):
        """This mount changes these inodes and names (parent, name) at the master: a kept
        published version of them is stale, and so is a publish on its way meanwhile."""
        self._note_changes(keys)
        try:
            yield
        finally:
            self._note_changes(keys)

    def _note_changes(self, keys) -> None:
        with self._state_lock:
            self._changed_now(keys)

    def _changed_now(self, keys) -> None:
        """Inodes and names (parent, name) changed now: a kept published version of them
        goes, and one published before now is not kept (forget_published).  Under
        _state_lock."""
        now = time.monotonic()
        changed = self._changed
        for key in keys:
            changed[key] = now
            ino = key if isinstance(key, int) else self._published_names.get(key)
            if ino is not None:
                self._drop_published(ino)
        if len(changed) > self._prune_changed_at:  # forget old ones now and then
            self._prune_changed_at = _forget_before(changed, now - CHANGE_MEMORY)

    # -- directory attributes ---------------------------------------------------------

    def note_dirs(self, *nodes: Inode | None) -> None:
        """Keep the attributes of the directories among ``nodes``."""
        now = time.monotonic()
        cache = self._dir_attrs
        for n in nodes:
            if n is not None and n.type == DIRECTORY:
                cache[n.ino] = (n, now)
                cache.move_to_end(n.ino)
        while len(cache) > DIR_CACHE:
            cache.popitem(last=False)

    def cached_dir(self, ino: int) -> tuple[Inode, float] | None:
        """The kept attributes of directory ``ino`` and the seconds they stay good."""
        entry = self._dir_attrs.get(ino)
        if entry is None:
            return None
        left = self.cfg.fuse.attr_timeout - (time.monotonic() - entry[1])
        if left <= 0:
            self._dir_attrs.pop(ino, None)
            return None
        return entry[0], left
