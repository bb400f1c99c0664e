"""The master group's consensus parts: etcd, leadership, the journal kept in etcd.

- ``etcd.py``: the etcd v3 client (sync gRPC stubs generated from etcd's own protos,
  proto/etcd_import.py), with a deadline on every call and failover between endpoints.
- ``etcd_access.py``: the Etcd client of a Config: TLS to etcd and the etcd user
  (``master.etcd_*``), read at a master's start.
- ``leadership.py``: the election (one leader key held with a lease), the lease's
  keepalive and the leader's own fence timer, the members' records.
- ``etcd_journal.py``: the journal as etcd keys, appended by the leader in one
  leader-guarded Txn per group-commit batch: what ``meta``'s committer writes to when
  the master runs in a group, and what a standby applies and a takeover replays.

Below ``meta`` (which opens an EtcdJournal as it would a local Journal) and above
``journal`` (its record framing); no consensus code of our own: etcd decides who leads
and orders the journal's writes.
"""
