"""Generated protobuf and gRPC modules (see generate.py); do not edit the *_pb2 files."""
