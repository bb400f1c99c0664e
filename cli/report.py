"""`curvine report`: the cluster at a glance, from the master's Report RPC.

    curvine report [--json] [--master H:P] [--conf FILE | --base DIR]

The masters (a group: each member's id, address, role, applied sequence and lag in
records, and the leader's commit sequence), workers (id, address, host, state,
capacity, used, blocks, last heartbeat), the
namespace (inodes, files with data, blocks, replicas), under-replicated blocks,
pool usage and evictions, lookup hits and misses, lease sessions, and where the
journal stands.  ``--json`` prints one object with the same content (integers as
numbers, fields as in docs/cli.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json

from curvine.common.master_group import GroupRpc
from curvine.proto import master_pb2

from . import connect
from .show import human_size


HELP = "workers, capacity, files, replication, evictions, lookups"
DESCRIPTION = ("Show the cluster as the master sees it: every worker with its state "
               "and usage, the namespace, under-replicated blocks, evictions, lookup "
               "hits and misses, lease sessions and the journal position.")


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object")
    connect.add_options(p)
    p.set_defaults(func=_cmd_report, _parser=p)


def group_dict(g: master_pb2.GetGroupReply) -> dict:
    """The master group as GetGroup answered it: its members, leader and commit seq."""
    return {"leader": g.leader, "commit_seq": g.commit_seq, "answered_by": g.answered_by,
            "members": [{"id": m.id, "address": m.grpc, "role": m.role,
                         "applied_seq": m.applied_seq, "lag_records": m.lag_records}
                        for m in g.members]}


def report_dict(r: master_pb2.ReportReply, master: str, group: dict | None = None) -> dict:
    """The report as plain JSON-ready values (what ``--json`` prints); ``group``:
    group_dict's, when the master is one of a group."""
    cap = r.capacity
    return {
        "master": master,
        "group": group,
        "uptime_seconds": round(r.uptime, 3),
        "workers": [{
            "id": w.worker_id, "address": w.address, "host": w.host_id, "state": w.state,
            "capacity": w.capacity, "used": w.used, "blocks": w.blocks,
            "heartbeat_age_seconds": round(w.heartbeat_age, 3) if w.heartbeat_age >= 0 else None,
            "shares_disk_with": list(w.shares_disk_with),
        } for w in r.workers],
        "workers_live": sum(1 for w in r.workers if w.state == "live"),
        "workers_lost": sum(1 for w in r.workers if w.state == "lost"),
        "inodes": r.inodes,
        "files_with_data": r.files_with_data,
        "blocks": r.blocks,
        "block_replicas": r.block_locations,
        "inline_bytes": r.inline_bytes,
        "under_replicated_blocks": r.under_replicated_blocks,
        "copies_in_flight": r.copies_in_flight,
        "replication_scan_done": r.replication_scanned,
        "capacity": cap.capacity,
        "used": cap.used,
        "estimated_used": cap.estimated_used,
        "evict_high": cap.high,
        "evict_low": cap.low,
        "lru_tracked_files": cap.tracked_files,
        "evictions": dict(sorted(cap.stats.items())),
        "lookup_hits": r.lookup_hits,
        "lookup_misses": r.lookup_misses,
        "lease_sessions": r.lease_sessions,
        "leases": dict(sorted(r.lease_stats.items())),
        "journal": {"applied_seq": r.applied_seq, "first_seq": r.journal_first_seq,
                    "checkpoint_seq": r.checkpoint_seq},
    }


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _age(seconds: float) -> str:
    if seconds < 0:
        return "never"
    if seconds < 120:
        return f"{seconds:.1f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def _duration(seconds: float) -> str:
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}d" if d else "") + (f"{h}h" if d or h else "") + f"{m}m{s:02d}s"


def print_report(d: dict) -> None:
    j = d["journal"]
    print(f"Master {d['master']}  up {_duration(d['uptime_seconds'])}  journal seq "
          f"{j['applied_seq']} (oldest kept {j['first_seq']}, checkpoint "
          f"{j['checkpoint_seq'] or 'none'})")
    g = d.get("group")
    if g:
        print(f"Master group: {len(g['members'])} members, leader {g['leader'] or 'none'}, "
              f"commit seq {g['commit_seq']}")
        print(f"  {'ID':<24} {'ADDRESS':<21} {'ROLE':<8} {'APPLIED':>10} {'LAG':>8}")
        for m in g["members"]:
            print(f"  {m['id']:<24} {m['address']:<21} {m['role']:<8} "
                  f"{m['applied_seq']:>10} {m['lag_records']:>8}")
    print()
    print(f"Workers: {d['workers_live']} live, {d['workers_lost']} lost, "
          f"{len(d['workers'])} registered")
    if d["workers"]:
        print(f"  {'ID':>4}  {'ADDRESS':<21} {'HOST':<12} {'STATE':<7} {'CAPACITY':>10} "
              f"{'USED':>10} {'USE%':>6} {'BLOCKS':>8}  HEARTBEAT")
        for w in d["workers"]:
            age = w["heartbeat_age_seconds"]
            print(f"  {w['id']:>4}  {w['address']:<21} {w['host'][:12]:<12} {w['state']:<7} "
                  f"{human_size(w['capacity']):>10} {human_size(w['used']):>10} "
                  f"{_pct(w['used'], w['capacity']):>6} {w['blocks']:>8}  "
                  f"{_age(age if age is not None else -1)}"
                  + (f"  (shares its disk with worker {', '.join(map(str, w['shares_disk_with']))}: "
                     "capacity is its share)" if w["shares_disk_with"] else ""))
    print()
    print(f"Namespace: {d['inodes']} inodes (files and directories), {d['files_with_data']} "
          f"files with data, {d['blocks']} blocks, {d['block_replicas']} block replicas, "
          f"{human_size(d['inline_bytes'])}B of small files inline at the master")
    scan = "" if d["replication_scan_done"] else " (start-up scan not done yet: incomplete)"
    print(f"Replication: {d['under_replicated_blocks']} under-replicated blocks, "
          f"{d['copies_in_flight']} copies in flight{scan}")
    print(f"Capacity: {human_size(d['capacity'])}B on live workers, used "
          f"{human_size(d['used'])}B ({_pct(d['used'], d['capacity'])}), estimated "
          f"{human_size(d['estimated_used'])}B; evict above {100 * d['evict_high']:.0f}% "
          f"down to {100 * d['evict_low']:.0f}%")
    ev = d["evictions"]
    print(f"Evictions: LRU {ev.get('evicted_files', 0)} files "
          f"({human_size(ev.get('evicted_bytes', 0))}B), TTL {ev.get('expired_files', 0)} files "
          f"({human_size(ev.get('expired_bytes', 0))}B), orphans {ev.get('orphans_removed', 0)} "
          f"files ({human_size(ev.get('orphan_bytes', 0))}B), failed rounds "
          f"{ev.get('evict_failures', 0)}; {d['lru_tracked_files']} files tracked")
    hits, misses = d["lookup_hits"], d["lookup_misses"]
    print(f"Lookups: {hits} hits, {misses} misses (hit ratio {_pct(hits, hits + misses)})")
    leases = ", ".join(f"{k} {v}" for k, v in d["leases"].items())
    print(f"Leases: {d['lease_sessions']} sessions open; {leases}")


def _cmd_report(args, parser) -> int:
    # the leader's report (workers, capacity and leases live there): GroupRpc finds it
    with contextlib.closing(connect.admin_rpc(args)) as rpc:
        group = rpc.call("GetGroup", master_pb2.GetGroupRequest())
        if isinstance(rpc, GroupRpc):  # any member answers Report: ask the leader
            rpc.masters.move_to(group.leader)
        reply = rpc.call("Report", master_pb2.ReportRequest())
        address = rpc.address
    # a single master answers a group of one without an id: no group to show
    in_group = len(group.members) > 1 or any(m.id for m in group.members)
    d = report_dict(reply, address, group_dict(group) if in_group else None)
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        print_report(d)
    return 0
