"""curvine.master: the metadata master (``curvine-master``).

Three subpackages by concern, and the two modules that join them:

- ``meta/``: the metadata: the LMDB store, the namespace's plans and the journal
  record kinds with their apply functions, the committer, opening and recovery,
  mutations as steps, ListDir pages.  Durable; the one truth a replay rebuilds.
- ``cluster/``: the master's view of the other processes: workers (registry, usage,
  liveness, the master's own lag), mounts (leases, sessions, open files), the blocks
  placed and not yet published, and the background work over them (capacity,
  re-replication, delete delivery).  In memory, rebuilt after a restart.
- ``ports/``: how the master is reached: the gRPC servicer, the call port's server,
  the admin report, the metrics registry and health.
- ``group/``: the master group's consensus parts on etcd: the client, leadership
  (election, lease, fence), the journal kept in etcd (below ``meta``, which opens it
  as it opens the local journal).
- ``member.py``: one member of a master group (``master.etcd_endpoints``): its role,
  and the Master that plays it (above ``ports``, which reach it through the servicer).
- ``master.py``: the facade, ``Master``: builds the parts, hands each collaborator the
  parts it uses (never the master), and answers every call with them.
- ``server.py``: the process (``curvine-master`` = ``curvine.master.server:main``):
  binds the ports around a Master.

Imports go one way only (tests/test_layers.py checks it): ``server -> member -> ports
-> master (the facade) -> cluster -> meta -> group -> journal``, and each of them may also use
``common`` and ``proto``.  A package may import any package below it, never one above.
"""
