"""How the master is reached: its ports and what they answer with.

Owns the gRPC servicer (``service.py``: the client port and the worker port, the
Calls stream, the one table of call methods), the call port's server
(``call_port_server.py``: master.Call frames on plain TCP in one asyncio thread), the
admin report and checkpoint (``report.py``), and the metrics registry and health of
the process (``metrics.py``, served on the HTTP port).

May import the facade (``curvine.master.master``), ``meta`` and ``cluster`` (below
it), ``curvine.common`` and ``curvine.proto``; never ``server.py``, which assembles
the ports.  A port parses, calls the Master, and converts the result.
"""
