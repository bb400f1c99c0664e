"""`curvine config`: validate a config file, or print the effective configuration.

    curvine config check FILE        # "ok: FILE" and a summary, or the error line (exit 1)
    curvine config show [--conf FILE | --base DIR]  # the effective configuration as TOML

``check`` applies the same loading and validation as the daemons, so a file it accepts
starts every daemon (ports, directories and the master's reachability are checked
when the daemons start, not here).  The sample with every key is conf/curvine.toml.
"""

from __future__ import annotations

import argparse
import dataclasses

from curvine.common import config as config_mod

from . import connect


HELP = "check a config file, show the effective configuration"
DESCRIPTION = ("Validate a curvine.toml the way the daemons do, or print the "
               "configuration that would be in effect.")


def register(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)

    c = sub.add_parser("check", help="validate FILE: 'ok' and a summary, or the error",
                       description="Parse and validate FILE. Prints 'ok: FILE' and a summary "
                                   "(exit 0), or one line naming the file, the line and the "
                                   "key at fault (exit 1).")
    c.add_argument("file", metavar="FILE")
    c.set_defaults(func=_cmd_check, _parser=c)

    s = sub.add_parser("show", help="print the effective configuration as TOML",
                       description="Print the configuration in effect (the file's values, "
                                   "defaults for the rest) as TOML. The file is the one every "
                                   "command reads: --base's client config, else --conf, "
                                   f"else $CURVINE_CONF, else {config_mod.DEFAULT_PATH} if it "
                                   "exists, else none (all defaults).")
    connect.add_options(s, master=False)
    s.set_defaults(func=_cmd_show, _parser=s)
    p.set_defaults(_parser=p)


def _cmd_check(args, _parser) -> int:
    cfg = config_mod.load(args.file)  # ConfigError: main() prints it, exit 1
    print(f"ok: {args.file}")
    for line in summary(cfg):
        print(f"  {line}")
    return 0


def _cmd_show(args, _parser) -> int:
    found = connect.find(args)
    path = found.path
    cfg = config_mod.load(path) if path else config_mod.Config()
    origin = (f"from {path} ({found.origin}), defaults for the rest" if path and found.origin != path
              else f"from {path}, defaults for the rest" if path
              else f"no config file ({found.origin}): all defaults")
    print(f"# effective curvine configuration ({origin})")
    print(config_mod.to_toml(cfg), end="")
    return 0


def summary(cfg: config_mod.Config) -> list[str]:
    """A few lines an operator checks at a glance, then the keys changed from defaults."""
    c, m, j, w, f = cfg.cluster, cfg.master, cfg.journal, cfg.worker, cfg.fuse
    capacity = human_size(w.capacity) if w.capacity else "free space of the data dirs"
    lines = [
        f"cluster  master at {c.master_addr}, block size {human_size(c.block_size)}, "
        f"{c.replicas} replica{'s' if c.replicas != 1 else ''}",
        f"master   listens on {m.host}:{m.port} (http {m.http_port}), meta {m.meta_dir}",
        f"journal  {j.dir}, fsync {'on' if j.fsync else 'OFF (acknowledged writes can be lost)'}",
        f"worker   listens on {w.host}:{w.port} (http {w.http_port}), data "
        f"{', '.join(w.data_dirs)}, capacity {capacity}",
        f"fuse     {f.mountpoint} (http {f.http_port}), short-circuit "
        f"{'on' if cfg.client.short_circuit else 'off'}",
    ]
    changed = changed_keys(cfg)
    lines.append("changed from defaults: " + (", ".join(changed) if changed else "none"))
    return lines


def changed_keys(cfg: config_mod.Config) -> list[str]:
    default = config_mod.Config()
    out = []
    for sec in dataclasses.fields(cfg):
        mine, theirs = getattr(cfg, sec.name), getattr(default, sec.name)
        out += [f"{sec.name}.{f.name}" for f in dataclasses.fields(mine)
                if getattr(mine, f.name) != getattr(theirs, f.name)]
    return out


def human_size(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{int(n)} bytes"
