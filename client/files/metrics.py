"""The client library's metrics: file bytes read from and written to blocks, by path
(updated where the bytes move: file_reader.py, uploader.py).  Defined once per
process that uses the client; the mount serves them (fuse_client/metrics.py), a
process that only loads the library (the LMCache connector) counts them unserved.
"""

from __future__ import annotations

from prometheus_client import Counter

# path="short_circuit": a block file on this host, read or written without the worker's
# data stream (reads straight from the file; writes adopted by the local worker);
# path="remote": bytes carried by a worker's ReadBlock/WriteBlock stream.
CLIENT_READ_BYTES = Counter(
    "curvine_client_read_bytes",
    "File bytes this client read from blocks, by path (short_circuit: from the block "
    "file on this host; remote: streamed from a worker)",
    ["path"], registry=None)
CLIENT_WRITTEN_BYTES = Counter(
    "curvine_client_written_bytes",
    "Block bytes this client stored, by path (short_circuit: a staging file adopted by "
    "the worker on this host; remote: streamed to a worker, once per replica)",
    ["path"], registry=None)
CLIENT_IO_METRICS = (CLIENT_READ_BYTES, CLIENT_WRITTEN_BYTES)
CLIENT_READ_SHORT_CIRCUIT = CLIENT_READ_BYTES.labels(path="short_circuit")
CLIENT_READ_REMOTE = CLIENT_READ_BYTES.labels(path="remote")
CLIENT_WRITTEN_SHORT_CIRCUIT = CLIENT_WRITTEN_BYTES.labels(path="short_circuit")
CLIENT_WRITTEN_REMOTE = CLIENT_WRITTEN_BYTES.labels(path="remote")
