"""The master's metadata: what the journal makes durable and a replay rebuilds.

Owns the LMDB store and its key schema (``store.py``), the namespace's plans and the
journal's record kinds, each with the one function that applies it
(``namespace.py``, the table ``APPLY``), the committer thread and its group commit
(``committer.py``), opening and recovery (``metadata.py``), mutations written as steps
for any caller (``steps.py``), and ListDir pages framed from the stored records
(``listing.py``).

May import ``curvine.journal``, ``curvine.common`` and ``curvine.proto``; never
``cluster``, ``ports`` or the facade: what it needs from them (revoking leases,
hearing of a batch's effects) is passed in as functions.
"""
