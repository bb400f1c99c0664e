"""curvine.client.master: the client's side of master calls.

Owns the blocking master client (``master_client``: the gRPC stub with retries, request ids,
the route of a call) and the blocking client of the master's call port
(``call_port_blocking``; the mount's trio one is ``fuse_client/call_port_trio.py``, the
master's side ``master/ports/call_port_server.py``).

May import: ``curvine.common``, ``curvine.proto``. Not ``client.blocks`` or ``client.files``.
"""
