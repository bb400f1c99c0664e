"""curvine.client.blocks: one block's bytes between this process and a worker.

Owns the worker transports as seen from a client: ``block_client`` (gRPC reads and writes,
direct block files on this host), ``data_port`` (the raw TCP read port), ``domain_socket``
(descriptors passed by the local worker), and ``pools`` (the lazily started thread pools
the file layer runs block I/O on).

May import: ``curvine.common``, ``curvine.proto``. Not ``client.master`` or ``client.files``.
"""
