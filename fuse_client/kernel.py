"""Notifications to the FUSE kernel module that pyfuse3 does not offer.

FUSE_NOTIFY_INC_EPOCH (protocol 7.44, Linux 6.16): every cached directory entry of
the mount becomes stale at once, so the next path walk asks the file system again.
It takes no lock in the kernel, unlike FUSE_NOTIFY_INVAL_ENTRY, which locks the
parent directory and so can wait on a request this daemon is itself waiting to
finish (a rename in that directory blocked on the master, which waits for this
mount to drop a lease: a deadlock until the lease runs out).  A lookup already in
flight when the epoch moves gets the old epoch, so its answer is stale on arrival.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading

log = logging.getLogger(__name__)

FUSE_NOTIFY_INC_EPOCH = 8
_OUT_HEADER = struct.Struct("<IiQ")  # struct fuse_out_header: len, error (notify code), unique 0


def fuse_device_fd() -> int | None:
    """This process's /dev/fuse descriptor (pyfuse3 keeps it to itself)."""
    found = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                found.append(int(name))
        except OSError:
            continue
    if len(found) != 1:
        log.info("found %d /dev/fuse descriptors, expected one", len(found))
        return None
    return found[0]


class Epoch:
    """Bumps the mount's dentry epoch; ``supported`` says whether the kernel can."""

    def __init__(self, fd: int | None):
        self.fd = fd
        self.supported = False
        self._lock = threading.Lock()
        if fd is not None:
            try:
                self.bump()
                self.supported = True
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EBADF):
                    raise
                log.info("this kernel cannot expire all directory entries at once "
                         "(FUSE_NOTIFY_INC_EPOCH: %s): names are not cached", e)

    def bump(self) -> None:
        with self._lock:
            try:
                os.write(self.fd, _OUT_HEADER.pack(_OUT_HEADER.size, FUSE_NOTIFY_INC_EPOCH, 0))
            except OSError as e:
                if self.supported and e.errno in (errno.ENODEV, errno.ENOTCONN):
                    return  # unmounted: the kernel caches nothing any more
                raise
