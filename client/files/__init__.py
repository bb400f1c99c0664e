"""curvine.client.files: files made of blocks.

Owns the file reader (which copy to read, checks, read-ahead), the file writer and the
buffers of the blocks it is writing (``block_buffers``, ``extents``, ``uploader``,
``write_behind``), and ``fs``, the path client (open/read/write by path) used by the CLI and
the connector.

May import: ``client.blocks``, ``client.master``, ``curvine.common``, ``curvine.proto``.
"""
