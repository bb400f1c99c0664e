"""`curvine journal`: read, check and checkpoint the master's write-ahead journal.

    curvine journal dump [--journal-dir DIR] [--from SEQ] [--limit N] [--json]
    curvine journal verify [--journal-dir DIR]
    curvine journal checkpoint [--master H:P]                  # the running master
    curvine journal checkpoint --offline [--meta-dir D] [--journal-dir D]  # a stopped one

dump and verify only read the segment files (no lock, nothing changed), so they are
safe next to a running master; a record the master is appending at that moment may
show as an incomplete last record.  The formats are in journal/segment.py.  The
directories default to the config's ``journal.dir`` and ``master.meta_dir``.  A member
of a master group (``master.etcd_endpoints`` in the config) keeps its journal in
etcd: without ``--journal-dir`` dump and verify read it there (cli/journal_etcd.py),
and ``checkpoint --offline`` refuses (the group's leader checkpoints, online).

verify decodes every record the way the master's replay does, refuses segment files
that are not regular files (never opening a FIFO or device, never following a
symlink) and reads in bounded memory whatever a segment's size.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from google.protobuf.message import DecodeError

from curvine.common import config as config_mod
from curvine.common.errors import CurvineError, ErrorKind
from curvine.journal.journal import list_segments, segment_damage
from curvine.journal.segment import SegmentReader
from curvine.proto import journal_pb2

from curvine.common import argtypes
from . import connect
from .journal_walk import walk
from .show import human_size

EXIT_DAMAGED = 4  # verify found damage before the tail (docs/cli.md)
_TYPE_NAMES = {f.number: f.name
               for f in journal_pb2.JournalEntry.DESCRIPTOR.oneofs_by_name["op"].fields}


HELP = "dump, verify or checkpoint the master's journal"
DESCRIPTION = ("Read the master's write-ahead journal record by record, check every "
               "segment's checksums, or have the master checkpoint its metadata now.")


def register(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="journal_command", metavar="SUBCOMMAND", required=True)

    def dirs(sp, meta: bool = False, conf: bool = True):
        sp.add_argument("--journal-dir", metavar="DIR",
                        help="journal directory (default: journal.dir of the config)")
        if meta:
            sp.add_argument("--meta-dir", metavar="DIR",
                            help="metadata directory (default: master.meta_dir of the config)")
        if conf:
            sp.add_argument("--conf", help="config file (default $CURVINE_CONF or "
                            f"{config_mod.DEFAULT_PATH})")

    d = sub.add_parser("dump", help="print records, one per line",
                       description="Print the journal's records in order, one per line: "
                                   "seq, type and fields (or one JSON object per line).")
    dirs(d)
    d.add_argument("--from", dest="from_seq", metavar="SEQ", type=argtypes.non_negative, default=0,
                   help="first seq to print (default: the oldest kept)")
    d.add_argument("--limit", metavar="N", type=argtypes.non_negative, default=0,
                   help="print at most N records (0 = all)")
    d.add_argument("--json", action="store_true",
                   help="JSON lines: seq, type, type_id, bytes, record")
    d.set_defaults(func=_cmd_dump, _parser=d)

    v = sub.add_parser("verify", help="check every segment's records and checksums",
                       description="Walk every segment and check its header, each record's "
                                   "checksum, that it decodes as a record the master can "
                                   "replay, and the sequence numbers. Exit 0 when intact "
                                   f"(an incomplete last record is reported but is no "
                                   f"damage: the master cuts it at start), {EXIT_DAMAGED} "
                                   "with the segment and byte offset of the damage.")
    dirs(v)
    v.set_defaults(func=_cmd_verify, _parser=v)

    c = sub.add_parser("checkpoint", help="checkpoint the master's metadata now",
                       description="Ask the running master to copy its metadata (LMDB) into "
                                   "a checkpoint and retire the journal segments it covers; "
                                   "with --offline, do it here for a stopped master.")
    connect.add_options(c)  # --master, and --conf or --base
    c.add_argument("--offline", action="store_true",
                   help="the master is stopped: replay and checkpoint its directories here")
    dirs(c, meta=True, conf=False)
    c.set_defaults(func=_cmd_checkpoint, _parser=c)
    p.set_defaults(_parser=p)


def _group_config(args) -> config_mod.Config | None:
    """The config, when it makes this a member of a master group whose journal is in
    etcd (and no --journal-dir names a directory to read instead), else None."""
    if args.journal_dir:
        return None
    cfg = config_mod.load(args.conf)
    return cfg if cfg.master.etcd_endpoints else None


def _journal_dir(args) -> str:
    d = args.journal_dir or config_mod.load(args.conf).journal.dir
    if not os.path.isdir(d):
        raise CurvineError(ErrorKind.NOT_FOUND, f"journal directory {d}: no such directory")
    return os.path.abspath(d)


# ---------------------------------------------------------------- verify

def _cmd_verify(args, parser) -> int:
    cfg = _group_config(args)
    if cfg is not None:
        from .journal_etcd import GroupJournal, walk as walk_etcd
        with GroupJournal(cfg) as group:
            w = walk_etcd(group)
            where, unit, part = group.where, "batches", "batch"
    else:
        directory = _journal_dir(args)
        w = walk(directory)
        where, unit, part = f"journal {directory}", "segments", "segment"
    if w.segments == 0:
        print(f"{where}: no {unit} (an empty journal)")
        return 0
    summary = (f"{where}: {w.segments} {unit}, {w.records} records "
               f"(seq {w.first_seq}..{w.last_seq}), {human_size(w.bytes)}B")
    if w.damage is not None and not w.damage.torn_tail:
        print(summary + " before the damage")
        print(f"curvine: error: journal damaged: {part} {w.damage.segment} at byte offset "
              f"{w.damage.offset}: {w.damage.reason}", file=sys.stderr)
        return EXIT_DAMAGED
    print(summary + ": OK")
    if w.damage is not None:
        print(f"note: the last record is incomplete (segment {w.damage.segment} at byte "
              f"offset {w.damage.offset}: {w.damage.reason}): a record being appended now, or "
              f"a torn write the master cuts off when it starts")
    return 0


# ---------------------------------------------------------------- dump

def _cmd_dump(args, parser) -> int:
    cfg = _group_config(args)
    if cfg is not None:
        from .journal_etcd import GroupJournal
        with GroupJournal(cfg) as group:
            for printed, rec in enumerate(group.records(args.from_seq), 1):
                print(_format(rec, args.json))
                if args.limit and printed >= args.limit:
                    break
        return 0
    directory = _journal_dir(args)
    segs = list_segments(directory)
    printed = 0
    for i, (first, path) in enumerate(segs):
        if i + 1 < len(segs) and segs[i + 1][0] <= args.from_seq:
            continue  # every record of this segment is before --from
        reader = SegmentReader(path, first)
        last = first - 1
        for rec in reader:
            last = rec.seq
            if rec.seq < args.from_seq:
                continue
            print(_format(rec, args.json))
            printed += 1
            if args.limit and printed >= args.limit:
                return 0
        damage = segment_damage(reader, last, is_last=i == len(segs) - 1)
        if damage is not None:
            if damage.torn_tail:
                break  # an incomplete last record: being written, or torn (see verify)
            sys.stdout.flush()
            raise damage.error()
    return 0


def _format(rec, as_json: bool) -> str:
    """One record as a line: ``SEQ TYPE field=value ...`` (values as JSON), or a JSON
    object with seq, type, type_id, bytes and record."""
    name = _TYPE_NAMES.get(rec.type, f"type{rec.type}")
    entry = journal_pb2.JournalEntry()
    try:
        entry.ParseFromString(rec.payload)
        op = entry.WhichOneof("op")
        fields = _fields(getattr(entry, op)) if op else None
    except DecodeError:  # a payload this version cannot parse: say so, go on
        fields = None
    if as_json:
        return json.dumps({"seq": rec.seq, "type": name, "type_id": rec.type,
                           "bytes": len(rec.payload), "record": fields})
    if fields is None:
        return f"{rec.seq} {name} <{len(rec.payload)} bytes not understood>"
    parts = " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in fields.items())
    return f"{rec.seq} {name} {parts}"


def _fields(msg) -> dict:
    """The fields set in ``msg`` as JSON values: integers as numbers, enums by name,
    request ids as hex, names as text (bytes that are not UTF-8 as \\xNN escapes),
    inline file data as its size."""
    out = {}
    for fd, value in msg.ListFields():
        out[fd.name] = ([_value(fd, v) for v in value] if _repeated(fd)
                        else _value(fd, value))
    return out


def _repeated(fd) -> bool:
    return fd.is_repeated


def _value(fd, v):
    if fd.type == fd.TYPE_MESSAGE:
        return _fields(v)
    if fd.type == fd.TYPE_ENUM:
        ev = fd.enum_type.values_by_number.get(v)
        return ev.name if ev is not None else v
    if fd.type == fd.TYPE_BYTES:
        if fd.name == "data":  # a small file's bytes (inline): their size, not them
            return f"<{len(v)} bytes>"
        return v.hex() if fd.name == "request_id" else v.decode("utf-8", "backslashreplace")
    return v


# ---------------------------------------------------------------- checkpoint

def _cmd_checkpoint(args, parser) -> int:
    if args.offline:
        return _checkpoint_offline(args)
    if args.meta_dir or args.journal_dir:
        parser.error("--meta-dir and --journal-dir only go with --offline")
    client = connect.master_client(args)
    try:
        reply = client.checkpoint()
    finally:
        client.close()
    print(f"checkpoint at seq {reply.seq}: {reply.path} ({reply.retired_segments} journal "
          f"segments retired)")
    return 0


def _checkpoint_offline(args) -> int:
    """Open the metadata as the master does at start (recovery and replay,
    master/meta/metadata.py), then checkpoint.

    The journal's directory lock makes this refuse to run next to a live master."""
    from curvine.master.meta.metadata import Metadata, lmdb_dir

    if args.master:
        raise CurvineError(ErrorKind.INVALID, "--master: not used with --offline")
    if args.base:  # its client config names no directories; a master's config does
        raise CurvineError(ErrorKind.INVALID, "--base: not used with --offline (use --conf "
                           "with the master's config, or --meta-dir and --journal-dir)")
    cfg = config_mod.load(args.conf)
    if cfg.master.etcd_endpoints:
        raise CurvineError(ErrorKind.INVALID, (
            "--offline: this master is a member of a group (master.etcd_endpoints): its "
            "journal is in etcd, not in journal.dir, and the group's leader takes the "
            "checkpoints: run `curvine journal checkpoint` (online) against the group"))
    journal_dir = _journal_dir(args)
    meta_dir = os.path.abspath(args.meta_dir or cfg.master.meta_dir)
    lmdb = lmdb_dir(meta_dir)
    if not os.path.isdir(lmdb):
        raise CurvineError(ErrorKind.NOT_FOUND, f"{lmdb}: no master metadata here "
                                                "(is --meta-dir right?)")
    # a record that does not decode or apply is damage (exit 4), named
    md = Metadata.open(cfg, meta_dir, journal_dir)
    try:
        retired = md.journal.stats["segments_retired"]
        path = md.committer.checkpoint()
        retired = md.journal.stats["segments_retired"] - retired
    finally:
        md.close()
    if path is None:
        print("nothing to checkpoint: the journal holds no records")
        return 0
    print(f"checkpoint at seq {md.committer.applied_seq}: {path} ({md.replayed} records "
          f"replayed, {retired} journal segments retired)")
    return 0
