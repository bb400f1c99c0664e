"""The master's view of the other processes, and the background work over it.

Owns the workers (``workers.py``: registrations, liveness, placement, the one account
of usage, the delete queues; ``lag.py``: the master's own stalls, which silence must
not be blamed for), the mounts (``leases.py``: what they may cache; ``opens.py``:
their sessions' liveness, the files they have open, the blocks kept for those), the
blocks placed and not yet published (``pending.py``), and the rounds that act on all
that: eviction, TTL and orphans (``capacity.py``), worker loss and re-replication
(``replication.py``), delete delivery to workers (``deleter.py``).  In memory; a
restarted master rebuilds it from the store, heartbeats and block reports.

May import ``meta`` (the store and namespace it reads, the plans it submits),
``curvine.common`` and ``curvine.proto``; never ``ports`` or the facade.  A
collaborator gets the parts it uses in its constructor (store, namespace, registry, a
submit function, ...), never the Master.
"""
