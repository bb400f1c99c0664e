"""`curvine fs`: the namespace and its data, talking to the master directly (no mount).

    curvine fs ls [-l] [-d] [-h] [--json] [PATH...]
    curvine fs stat [--json] PATH...
    curvine fs mkdir [-p] [-m MODE] PATH...
    curvine fs put LOCAL REMOTE      # LOCAL may be - (stdin)
    curvine fs get REMOTE LOCAL      # LOCAL may be - (stdout)
    curvine fs rm [-r] [-f] PATH...
    curvine fs mv SRC DST
    curvine fs du [-s] [-h] [PATH...]
    curvine fs df [-h] [--json]
    curvine fs ttl PATH DURATION     # files created in PATH afterwards expire (0 clears)
    curvine fs replicas PATH N       # replicas of files created in PATH (0 = default)
    curvine fs status                # pool usage, watermarks, eviction counters

PATH is a path in the cluster's namespace (``/l2cache``), resolved at the master
name by name from the root (``CurvineFS.resolve``); a path on a local curvine mount
(``/mnt/kv/l2cache``) works too and is translated.  The cluster is found as every
command finds it (``--master``, ``--conf``, ``--base``, ``$CURVINE_CONF``:
cli/connect.py).  Errors name the path; docs/cli.md lists the exit codes.

Every name, path or peer-supplied string printed (listings, messages, errors) goes
through :func:`shown`: control and non-printable characters and undecodable bytes as
escapes (``\\x1b``, ``\\n``, ``\\xff``), backslashes doubled, so that a name cannot move
the cursor, colour the terminal or forge a line.  ``--json`` output is JSON-escaped
instead and keeps names exact.  Walks of a tree (``rm -r``, ``du``) are loops with
their own stack, not recursion: any depth works.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import grp
import json
import os
import posixpath
import pwd
import stat as stat_mod
import sys
import tempfile
import time

from curvine.client.files.fs import CurvineFS
from curvine.client.master.master_client import MasterClient
from curvine.common import config as config_mod
from curvine.common.log import escape
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import MIB
from curvine.common.mounts import mount_table
from curvine.proto import common_pb2

from . import connect
from .show import human_size

MOUNT_FS_TYPE = "fuse.curvine"
CHUNK = MIB  # put/get copy in 1 MiB pieces: memory stays constant whatever the size
PROGRESS_EVERY = 0.2  # seconds between progress bar redraws
Inode = common_pb2.Inode


HELP = "files and directories in the cluster, TTL, replicas, capacity"
DESCRIPTION = ("Work with the cluster's namespace through the master (no mount "
               "needed): list, inspect, copy in and out, remove, move, sizes; set the "
               "TTL or replica count of a directory; show pool usage.")


def register(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="fs_command", metavar="SUBCOMMAND", required=True)

    def add(name, func, help, description=None, human=False):
        # -h is "human-readable sizes" where sizes are printed (like du and df),
        # otherwise help; --help always is
        sp = sub.add_parser(name, help=help, description=description or help, add_help=False)
        sp.add_argument("--help", *([] if human else ["-h"]), action="help",
                        help="show this help and exit")
        if human:
            sp.add_argument("-h", "--human", action="store_true", help="sizes as Ki, Mi, Gi")
        connect.add_options(sp)
        sp.set_defaults(func=_escaped_errors(func), _parser=sp)
        return sp

    ls = add("ls", _cmd_ls, "list directories",
             "List the entries of each directory PATH (a file lists itself), in name order.",
             human=True)
    ls.add_argument("paths", metavar="PATH", nargs="*", default=["/"])
    ls.add_argument("-l", dest="long", action="store_true",
                    help="long format: mode, links, owner, group, size, mtime, name")
    ls.add_argument("-d", dest="directory", action="store_true",
                    help="list directories themselves, not their entries")
    ls.add_argument("--json", action="store_true", help="one JSON object per entry and line")

    st = add("stat", _cmd_stat, "attributes and blocks of files and directories")
    st.add_argument("paths", metavar="PATH", nargs="+")
    st.add_argument("--json", action="store_true", help="one JSON object per PATH and line")

    mk = add("mkdir", _cmd_mkdir, "create directories")
    mk.add_argument("paths", metavar="PATH", nargs="+")
    mk.add_argument("-p", dest="parents", action="store_true",
                    help="create missing parents; an existing directory is no error")
    mk.add_argument("-m", dest="mode", type=_mode, default=0o755,
                    help="permission bits, octal (default 755)")

    put = add("put", _cmd_put, "copy a local file into the cluster",
              "Copy LOCAL (- for stdin) to REMOTE (into it when REMOTE is a directory). "
              "Readers see the new contents all at once when the copy completes. A progress "
              "bar is drawn on stderr when it is a terminal.")
    put.add_argument("local", metavar="LOCAL")
    put.add_argument("remote", metavar="REMOTE")
    put.add_argument("-m", dest="mode", type=_mode, default=None,
                     help="permission bits, octal (default: LOCAL's, 644 for stdin)")
    put.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    get = add("get", _cmd_get, "copy a file out of the cluster",
              "Copy REMOTE to LOCAL (- for stdout; into it when LOCAL is a directory). "
              "LOCAL is replaced only once the whole file has been read.")
    get.add_argument("remote", metavar="REMOTE")
    get.add_argument("local", metavar="LOCAL")
    get.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    rm = add("rm", _cmd_rm, "remove files (and directories with -r)")
    rm.add_argument("paths", metavar="PATH", nargs="+")
    rm.add_argument("-r", dest="recursive", action="store_true",
                    help="remove directories and everything in them")
    rm.add_argument("-f", dest="force", action="store_true", help="a missing PATH is no error")

    mv = add("mv", _cmd_mv, "rename or move a file or directory",
             "Atomically rename SRC to DST (into DST when it is a directory), replacing "
             "an existing file DST.")
    mv.add_argument("src", metavar="SRC")
    mv.add_argument("dst", metavar="DST")

    du = add("du", _cmd_du, "sizes of directory trees",
             "Sum the sizes of the files under each PATH (apparent sizes: replicas are "
             "not counted). Without -s each directory is listed, children first.",
             human=True)
    du.add_argument("paths", metavar="PATH", nargs="*", default=["/"])
    du.add_argument("-s", dest="summarize", action="store_true", help="only a total per PATH")

    df = add("df", _cmd_df, "pool capacity, used, free and number of files", human=True)
    df.add_argument("--json", action="store_true")

    t = add("ttl", _cmd_ttl, "set the TTL of a directory (or file)",
            "Files created in PATH afterwards are removed once DURATION has passed since "
            "they were last written. DURATION: e.g. 30s, 2h, 7d; 0 clears it.")
    t.add_argument("path", metavar="PATH")
    t.add_argument("duration", metavar="DURATION", type=_duration)

    r = add("replicas", _cmd_replicas, "set the replica count of a directory",
            "Files created in PATH afterwards get N replicas (0 = the cluster default).")
    r.add_argument("path", metavar="PATH")
    r.add_argument("replicas", metavar="N", type=_replicas)

    add("status", _cmd_status, "pool usage, watermarks and eviction counters")
    p.set_defaults(_parser=p)


# ---------------------------------------------------------------- printing names

def shown(text: bytes | str) -> str:
    r"""A name, path or any string from the cluster, fit to print on one line: every
    control or non-printable character as an escape (``\n``, ``\x1b``, ``\u202e``), a
    byte that is not UTF-8 as ``\xNN``, a backslash as ``\\`` (so the output tells
    ``a\x1b`` the name from ``a<ESC>`` the name).  The one way fs commands print names."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "surrogateescape")
    return escape(text, backslash=True)


def _escaped_errors(func):
    """``func`` with the messages of its errors escaped by :func:`shown` (they name
    paths; cli/main.py prints them as they are)."""
    @functools.wraps(func)
    def wrapper(args, parser):
        try:
            return func(args, parser)
        except CurvineError as e:
            raise CurvineError(e.kind, shown(e.message)) from None
        except OSError as e:
            if e.filename is None or e.errno is None:
                raise
            raise type(e)(e.errno, e.strerror, shown(os.fsdecode(e.filename))) from None
    return wrapper


def _text(name: bytes) -> str:
    r"""A name from the master as text, exact (undecodable bytes kept as surrogates,
    which :func:`shown` prints as ``\xNN``)."""
    return name.decode("utf-8", "surrogateescape")


# ---------------------------------------------------------------- argument types

def _duration(text: str) -> float:
    try:
        return config_mod.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _replicas(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= n <= 8:
        raise argparse.ArgumentTypeError("must be between 0 and 8 (0 = the cluster default)")
    return n


def _mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal mode") from None
    if not 0 <= mode <= 0o7777:
        raise argparse.ArgumentTypeError(f"{text!r} is outside 0..7777")
    return mode


# ---------------------------------------------------------------- paths

def namespace_path(path: str) -> str:
    """``path`` as a normalised path in the namespace: a path on a local curvine mount
    is taken relative to its mount point; anything else must be absolute in the
    namespace."""
    if os.path.exists(path):
        real = os.path.realpath(path)
        best = ""
        for mnt in _curvine_mounts():
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                best = mnt
        if best:
            return "/" + os.path.relpath(real, best).lstrip(".")
    if not path.startswith("/"):
        raise CurvineError(ErrorKind.INVALID, f"PATH: '{path}' is neither on a curvine mount "
                                              "nor absolute in the namespace")
    return posixpath.normpath(path).replace("//", "/")


def _curvine_mounts() -> list[str]:
    return [m.point for m in mount_table() if m.fstype == MOUNT_FS_TYPE]


def stat_or_none(fs: CurvineFS, path: str) -> Inode | None:
    try:
        return fs.resolve(path)
    except CurvineError as e:
        if e.kind == ErrorKind.NOT_FOUND:
            return None
        raise


@contextlib.contextmanager
def _about(path: str):
    """Prefix the path to errors of the calls inside (the master names no paths)."""
    try:
        yield
    except CurvineError as e:
        if e.message.startswith("/"):  # names its path already
            raise
        raise CurvineError(e.kind, f"{path}: {e.message}") from None


def _is_dir(node: Inode) -> bool:
    return node.type == common_pb2.DIRECTORY


# each inode type: its S_IF* bits and its name in `stat` (and `--json`)
_TYPES = {common_pb2.FILE: (stat_mod.S_IFREG, "regular file"),
          common_pb2.DIRECTORY: (stat_mod.S_IFDIR, "directory"),
          common_pb2.SYMLINK: (stat_mod.S_IFLNK, "symbolic link"),
          common_pb2.FIFO: (stat_mod.S_IFIFO, "fifo"),
          common_pb2.SOCKET: (stat_mod.S_IFSOCK, "socket"),
          common_pb2.CHAR_DEVICE: (stat_mod.S_IFCHR, "character special file"),
          common_pb2.BLOCK_DEVICE: (stat_mod.S_IFBLK, "block special file")}


def _kind(node: Inode) -> str:
    return _TYPES.get(node.type, (0, "unknown"))[1]


# ---------------------------------------------------------------- formatting

def _size(n: int, human: bool) -> str:
    return human_size(n) if human else str(n)


def _display(name: bytes | str) -> str:
    """A name for the terminal: undecodable bytes shown as escapes, never an error."""
    if isinstance(name, str):
        return name
    return name.decode("utf-8", "backslashreplace")


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _filemode(node: Inode) -> str:
    return stat_mod.filemode(_TYPES.get(node.type, (stat_mod.S_IFREG,))[0] | node.mode)


def _time(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M")


def _iso(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9).astimezone().isoformat(timespec="milliseconds")


def _inode_dict(node: Inode, path: str | None = None, name: bytes | None = None) -> dict:
    d = {}
    if path is not None:
        d["path"] = path
    if name is not None:
        d["name"] = _display(name)
    d.update(ino=node.ino, type={common_pb2.FILE: "file"}.get(node.type, _kind(node)),
             mode=f"{node.mode:04o}", uid=node.uid, gid=node.gid, size=node.size,
             nlink=node.nlink, mtime_ns=node.mtime_ns, atime_ns=node.atime_ns,
             ctime_ns=node.ctime_ns, ttl_ms=node.ttl_ms, replicas=node.replicas,
             version=node.version)
    if node.type == common_pb2.FILE:
        d["state"] = "complete" if node.state == common_pb2.COMPLETE else "writing"
    if node.type == common_pb2.SYMLINK:
        d["target"] = _display(node.symlink_target)
    if node.type in (common_pb2.CHAR_DEVICE, common_pb2.BLOCK_DEVICE):
        d["rdev"] = node.rdev
    return d


def _fmt_ttl(ms: int) -> str:
    if not ms:
        return "none"
    for unit, n in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % n == 0:
            return f"{ms // n}{unit}"
    return f"{ms}ms"


class Progress:
    """A one-line progress bar on stderr, redrawn with ``\\r`` at most every
    PROGRESS_EVERY seconds; drawn only when stderr is a terminal (a pipe or a log
    file gets nothing)."""

    def __init__(self, label: str, total: int | None, enabled: bool = True):
        self.label = label
        self.total = total
        self.done = 0
        self.enabled = enabled and sys.stderr.isatty()
        self.started = time.monotonic()
        self._drawn = 0.0

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self._drawn >= PROGRESS_EVERY:
            self._draw(now)

    def _draw(self, now: float) -> None:
        self._drawn = now
        rate = self.done / max(now - self.started, 1e-6)
        if self.total:
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            text = (f"{self.label} [{bar:<30}] {100 * frac:5.1f}% {human_size(self.done)}B"
                    f" / {human_size(self.total)}B  {human_size(int(rate))}B/s")
        else:
            text = f"{self.label} {human_size(self.done)}B  {human_size(int(rate))}B/s"
        sys.stderr.write("\r" + text[:120] + "\x1b[K")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            sys.stderr.write("\n")
            sys.stderr.flush()


# ---------------------------------------------------------------- ls, stat

def _cmd_ls(args, parser) -> int:
    with connect.curvine_fs(args) as fs:
        for i, arg in enumerate(args.paths):
            path = namespace_path(arg)
            node = fs.resolve(path)
            if _is_dir(node) and not args.directory:
                if len(args.paths) > 1 and not args.json:
                    if i:
                        print()
                    print(f"{shown(path)}:")
                with _about(path):
                    for e in fs.master.iterdir(node.ino):
                        _ls_line(args, e.name, e.inode, posixpath.join(path, _display(e.name)))
            else:
                _ls_line(args, posixpath.basename(path) or "/", node, path)
    return 0


def _ls_line(args, name: bytes | str, node: Inode, path: str) -> None:
    if args.json:
        print(json.dumps(_inode_dict(node, path=path)))
    elif args.long:
        suffix = "/" if _is_dir(node) else ""
        if node.type == common_pb2.SYMLINK:
            suffix = " -> " + _display(node.symlink_target)
        state = "  (writing)" if (node.type == common_pb2.FILE
                                  and node.state == common_pb2.WRITING) else ""
        print(f"{_filemode(node)} {node.nlink:>3} {_user(node.uid):<8} {_group(node.gid):<8} "
              f"{_size(node.size, args.human):>12} {_time(node.mtime_ns)} "
              f"{shown(name)}{suffix}{state}")
    else:
        print(shown(name) + ("/" if _is_dir(node) else ""))


def _cmd_stat(args, parser) -> int:
    with connect.curvine_fs(args) as fs:
        for arg in args.paths:
            path = namespace_path(arg)
            node = fs.resolve(path)
            blocks, workers = [], {}
            if node.type == common_pb2.FILE:
                with _about(path):
                    _, blocks, workers = fs.master.get_blocks(node.ino)
            if args.json:
                d = _inode_dict(node, path=path)
                d["blocks"] = [{"block_id": b.block_id, "length": b.length,
                                "checksum": b.checksum, "inline": b.HasField("data"),
                                "workers": [workers[w].address if w in workers else str(w)
                                            for w in b.worker_ids]} for b in blocks]
                print(json.dumps(d))
                continue
            kind = _kind(node)
            if node.type == common_pb2.SYMLINK:
                kind += " -> " + _display(node.symlink_target)
            state = "" if node.type != common_pb2.FILE else (
                "  State: complete" if node.state == common_pb2.COMPLETE else
                "  State: writing (no version published yet)")
            print(f"  File: {shown(path)}")
            print(f"  Type: {kind}  Inode: {node.ino}{state}")
            print(f"  Size: {node.size}  Blocks: {len(blocks)}  Links: {node.nlink}  "
                  f"Version: {node.version}")
            print(f"  Mode: {node.mode:04o} ({_filemode(node)})  Uid: {node.uid} "
                  f"({_user(node.uid)})  Gid: {node.gid} ({_group(node.gid)})")
            print(f"   TTL: {_fmt_ttl(node.ttl_ms)}  Replicas: {node.replicas or 'default'}")
            print(f"Access: {_iso(node.atime_ns)}")
            print(f"Modify: {_iso(node.mtime_ns)}")
            print(f"Change: {_iso(node.ctime_ns)}")
            for i, b in enumerate(blocks):
                where = ", ".join(f"{w}@{shown(workers[w].address)}" if w in workers else str(w)
                                  for w in b.worker_ids)
                none = "the master (inline)" if b.HasField("data") else "no worker (hole)"
                print(f" Block {i}: id {b.block_id}  length {b.length}  "
                      f"crc32 {b.checksum:08x}  on {where or none}")
    return 0


# ---------------------------------------------------------------- mkdir, rm, mv

def _cmd_mkdir(args, parser) -> int:
    with connect.curvine_fs(args) as fs:
        for path in map(namespace_path, args.paths):
            if path == "/":
                if args.parents:
                    continue
                raise CurvineError(ErrorKind.EXISTS, "/: file exists")
            with _about(path):
                fs.mkdir(path, args.mode, parents=args.parents)
    return 0


def _cmd_rm(args, parser) -> int:
    with connect.curvine_fs(args) as fs:
        for path in map(namespace_path, args.paths):
            if path == "/":
                raise CurvineError(ErrorKind.INVALID, "/: refusing to remove the root")
            node = stat_or_none(fs, path)
            if node is None:
                if args.force:
                    continue
                raise CurvineError(ErrorKind.NOT_FOUND, f"{path}: no such file or directory")
            parent, name = fs.parent(path)
            with _about(path):
                if not _is_dir(node):
                    fs.master.unlink(parent.ino, name)
                elif not args.recursive:
                    raise CurvineError(ErrorKind.IS_DIR, "is a directory (use -r)")
                else:
                    _remove_tree(fs.master, parent.ino, name, node.ino)
    return 0


def _remove_tree(client: MasterClient, parent: int, name: bytes, ino: int) -> None:
    """Remove a directory and everything below it, files before their directory.
    Iterative (any depth): a stack of directories still to empty, each followed by the
    step that removes it once everything pushed after it is gone."""
    stack: list[tuple[bool, int, bytes, int]] = [(False, parent, name, ino)]
    while stack:
        emptied, parent, name, ino = stack.pop()
        if emptied:
            client.rmdir(parent, name)
            continue
        stack.append((True, parent, name, ino))
        for e in client.iterdir(ino):
            # iterdir pages resume after the last name seen, so removing entries already
            # listed does not disturb it
            if _is_dir(e.inode):
                stack.append((False, ino, e.name, e.inode.ino))
            else:
                client.unlink(ino, e.name)


def _cmd_mv(args, parser) -> int:
    with connect.curvine_fs(args) as fs:
        src, dst = namespace_path(args.src), namespace_path(args.dst)
        if src == "/":
            raise CurvineError(ErrorKind.INVALID, "/: cannot move the root")
        node = fs.resolve(src)
        src_dir, src_name = fs.parent(src)
        target = stat_or_none(fs, dst)
        if target is not None and _is_dir(target) and target.ino != node.ino:
            dst_dir, name = target, src_name  # into the directory, like mv(1)
        elif dst == "/":
            raise CurvineError(ErrorKind.EXISTS, "/: file exists")
        else:
            dst_dir, name = fs.parent(dst)
        with _about(f"{src} -> {dst}"):
            fs.master.rename(src_dir.ino, src_name, dst_dir.ino, name)
    return 0


# ---------------------------------------------------------------- du, df

def _cmd_du(args, parser) -> int:
    with connect.curvine_fs(args) as fs:
        for arg in args.paths:
            path = namespace_path(arg)
            node = fs.resolve(path)
            with _about(path):
                total = _du(fs.master, node, path, args)
            print(f"{_size(total, args.human)}\t{shown(path)}")
    return 0


def _du(client: MasterClient, node: Inode, path: str, args) -> int:
    """Bytes of the files under ``node``; prints each subdirectory (after the ones
    below it) unless -s.  Iterative (any depth): one frame per directory being read,
    [path, its entries, bytes so far]."""
    if not _is_dir(node):
        return node.size
    stack: list[list] = [[path, iter(client.iterdir(node.ino)), 0]]
    while True:
        frame = stack[-1]
        e = next(frame[1], None)
        if e is None:
            stack.pop()
            if not stack:
                return frame[2]
            if not args.summarize:
                print(f"{_size(frame[2], args.human)}\t{shown(frame[0])}")
            stack[-1][2] += frame[2]
        elif _is_dir(e.inode):
            stack.append([posixpath.join(frame[0], _text(e.name)),
                          iter(client.iterdir(e.inode.ino)), 0])
        elif e.inode.type == common_pb2.FILE:
            frame[2] += e.inode.size


def _cmd_df(args, parser) -> int:
    client = connect.master_client(args)
    try:
        st = client.statfs()
        cap = client.capacity_status()
    finally:
        client.close()
    free = max(st.capacity - st.used, 0)
    pct = 100.0 * st.used / st.capacity if st.capacity else 0.0
    if args.json:
        print(json.dumps({"master": client.address, "capacity": st.capacity, "used": st.used,
                          "free": free, "use_percent": round(pct, 1),
                          "estimated_used": cap.estimated_used, "files": st.files,
                          "live_workers": st.live_workers, "workers": len(st.workers),
                          "block_size": st.block_size}))
        return 0
    h = args.human
    print(f"{'Master':<22} {'Size':>14} {'Used':>14} {'Avail':>14} {'Use%':>5} "
          f"{'Files':>10} {'Workers':>8}")
    print(f"{shown(client.address):<22} {_size(st.capacity, h):>14} {_size(st.used, h):>14} "
          f"{_size(free, h):>14} {pct:4.0f}% {st.files:>10} "
          f"{st.live_workers:>4}/{len(st.workers):<3}")
    return 0


# ---------------------------------------------------------------- put, get

def _cmd_put(args, parser) -> int:
    with connect.curvine_fs(args) as fs:
        dst = namespace_path(args.remote)
        existing = stat_or_none(fs, dst)
        if args.remote.endswith("/") or (existing is not None and _is_dir(existing)):
            if args.local == "-":
                raise CurvineError(ErrorKind.IS_DIR, f"{dst}: is a directory (name the file "
                                                     "to write stdin to)")
            dst = posixpath.join(dst, os.path.basename(args.local))
            existing = stat_or_none(fs, dst)
        if args.local == "-":
            src, total, mode = sys.stdin.buffer, None, 0o644
        else:
            src = open(args.local, "rb")
            st = os.fstat(src.fileno())
            if stat_mod.S_ISDIR(st.st_mode):
                src.close()
                raise CurvineError(ErrorKind.IS_DIR, f"{args.local}: is a directory")
            total = st.st_size if stat_mod.S_ISREG(st.st_mode) else None
            mode = st.st_mode & 0o7777
        if args.mode is not None:
            mode = args.mode
        try:
            with _about(dst):
                _upload(fs, src, dst, mode, Progress(f"put {shown(dst)}", total, not args.quiet),
                        created=existing is None, size=total or 0)
        finally:
            if src is not sys.stdin.buffer:
                src.close()
    return 0


def _upload(fs: CurvineFS, src, dst: str, mode: int, progress: Progress, created: bool,
            size: int = 0) -> None:
    """Stream ``src`` (``size`` bytes, 0 = not known) into a new version of ``dst``,
    published only when complete."""
    writer = fs.open_writer(dst, mode, size_hint=size)
    ok = False
    try:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        off = 0
        while True:
            n = src.readinto(buf)
            if not n:
                break
            writer.write(off, view[:n])
            off += n
            progress.update(n)
        writer.publish()
        ok = True
    finally:
        writer.close()
        progress.close()
        if not ok and created:
            # do not leave an empty, never-published file behind that we created
            with contextlib.suppress(CurvineError):
                fs.unlink(dst)


def _cmd_get(args, parser) -> int:
    with connect.curvine_fs(args) as fs:
        src = namespace_path(args.remote)
        node = fs.resolve(src)
        if _is_dir(node):
            raise CurvineError(ErrorKind.IS_DIR, f"{src}: is a directory")
        progress = Progress(f"get {shown(src)}", node.size, not args.quiet)
        if args.local == "-":
            with _about(src):
                _download(fs, src, sys.stdout.buffer, progress)
            sys.stdout.buffer.flush()
            return 0
        dest = args.local
        if os.path.isdir(dest):
            dest = os.path.join(dest, posixpath.basename(src))
        # a temporary name next to the destination: LOCAL is replaced only when the
        # whole file has been read
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dest)}.",
                                   dir=os.path.dirname(os.path.abspath(dest)))
        try:
            with os.fdopen(fd, "wb") as out, _about(src):
                _download(fs, src, out, progress)
            os.chmod(tmp, node.mode & 0o777)
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return 0


def _download(fs: CurvineFS, src: str, out, progress: Progress) -> None:
    try:
        for data in fs.iter_read(src, CHUNK):
            out.write(data)
            progress.update(len(data))
    finally:
        progress.close()


# ---------------------------------------------------------------- ttl, replicas, status

def _cmd_ttl(args, parser) -> int:
    with connect.curvine_fs(args) as fs:
        path = namespace_path(args.path)
        with _about(path):
            node = fs.master.set_policy(fs.resolve(path).ino,
                                        ttl_ms=int(round(args.duration * 1000)))
    print(f"{shown(path)}: ttl {_fmt_ttl(node.ttl_ms)}")
    return 0


def _cmd_replicas(args, parser) -> int:
    with connect.curvine_fs(args) as fs:
        path = namespace_path(args.path)
        with _about(path):
            node = fs.master.set_policy(fs.resolve(path).ino, replicas=args.replicas)
    print(f"{shown(path)}: replicas {node.replicas or 'cluster default'}")
    return 0


def _cmd_status(args, parser) -> int:
    client = connect.master_client(args)
    try:
        st = client.capacity_status()
    finally:
        client.close()
    cap = st.capacity or 1
    print(f"capacity  {st.capacity} bytes (live workers)")
    print(f"used      {st.used} bytes ({100 * st.used / cap:.1f}%), estimated "
          f"{st.estimated_used} ({100 * st.estimated_used / cap:.1f}%)")
    print(f"evict     above {st.high:.2f} down to {st.low:.2f}; {st.tracked_files} files tracked")
    for k in sorted(st.stats):
        print(f"{shown(k):16s}{st.stats[k]}")
    return 0
