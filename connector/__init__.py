"""curvine's LMCache connector: LMCache's L2 on a curvine cluster without the FUSE hop.

``store.KVStore`` is the core (batched lookups, reads into the caller's buffers, puts
published under their final name); ``lmcache_remote`` and ``lmcache_l2`` adapt it to
LMCache's two plug-in points.  Only the adapters import LMCache (docs/lmcache.md).
"""
