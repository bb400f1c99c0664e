"""`curvine doctor`: is this install able to mount, and can it reach its cluster?

    curvine doctor [--install-only] [--master H:P] [--conf FILE | --base DIR]

One line per check: curvine-py and Python; pyfuse3 and the patched features it has or
lacks (fuse_client/features.py; with a stock pyfuse3 the same WARNING line the mount
logs at start-up, with the command that fixes it); fusermount3 and /dev/fuse; the
master the other commands would use, where its address came from (cli/connect.py),
and whether it answers.  Exit 0 when everything is fine, 1 otherwise.
``--install-only`` checks the package and pyfuse3 alone (scripts/install.sh runs it,
also where there is no /dev/fuse, as in an image build).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import sys

from . import connect

HELP = "check this install (pyfuse3's patches, FUSE) and the cluster's master"
DESCRIPTION = ("Check that this install can mount (pyfuse3 and the patched features it "
               "has, fusermount3, /dev/fuse) and that the master the other commands would "
               "use answers. Exit 0 when everything is fine, 1 otherwise.")


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--install-only", action="store_true",
                   help="check the package and pyfuse3 only (no FUSE device, no cluster)")
    connect.add_options(p)
    p.set_defaults(func=_cmd_doctor, _parser=p)


def _cmd_doctor(args, parser) -> int:
    ok = True
    try:
        own = importlib.metadata.version("curvine-py")
    except importlib.metadata.PackageNotFoundError:
        own = "? (not installed as a package)"
    print(f"curvine-py {own}, Python {platform.python_version()} ({sys.prefix})")

    try:
        from curvine.fuse_client import features
        found = features.detect()
    except ImportError as e:
        print(f"pyfuse3: cannot import it: {e}; fix: {_fix()}")
        return 1
    print(found.summary())
    warning = found.warning()
    if warning:
        print(f"WARNING: {warning}")
        ok = False
    if args.install_only:
        return 0 if ok else 1

    fusermount = shutil.which("fusermount3")
    print(f"fusermount3: {fusermount or 'not found (Debian: apt-get install fuse3)'}")
    has_dev = os.path.exists("/dev/fuse")
    print("/dev/fuse: " + ("present" if has_dev else
                           "missing (in a container: --device /dev/fuse --cap-add SYS_ADMIN)"))
    ok = ok and bool(fusermount) and has_dev

    try:
        client = connect.master_client(args)
    except Exception as e:  # noqa: BLE001 - a bad config is one of the findings
        print(f"cluster: cannot use its config: {e}")
        return 1
    try:
        reply = client.statfs()
        print(f"master {args.master_origin}: answers; {reply.live_workers} live workers, "
              f"{reply.capacity} bytes of capacity")
    except Exception as e:  # noqa: BLE001 - reported, not raised
        print(f"master {args.master_origin}: unreachable: {e}")
        ok = False
    finally:
        client.close()
    return 0 if ok else 1


def _fix() -> str:
    return f"bash scripts/install.sh {sys.prefix} (from a curvine-py checkout)"
