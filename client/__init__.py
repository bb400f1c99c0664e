"""curvine.client: the blocking client library that the mount, the connector and the CLI build on.

Three subpackages, one concern each, importing one way only (``files`` -> ``blocks``, ``master``):

- ``client.master``: calls to the master (the gRPC stub, the blocking call-port client);
- ``client.blocks``: one block's bytes to and from a worker (gRPC, data port, domain socket);
- ``client.files``: files made of blocks (readers, writers, their buffers, the path client ``fs``).

May import: ``curvine.common`` and ``curvine.proto``. Never imports the mount (``fuse_client``),
the connector, the CLI, the devtools, the master or the worker (tests/test_layers_client.py).
"""
