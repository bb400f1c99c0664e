"""Regenerate the committed gRPC/protobuf modules: ``python proto/generate.py``.

Run with the pinned grpcio-tools (see pyproject's test extra).  The .proto files live
under ``proto/src/curvine/proto`` so that generated modules import each other as
``curvine.proto.x_pb2``; the output is copied into ``proto/``.
``--check`` exits 1 when the committed files differ from a fresh generation.
"""

from __future__ import annotations

import filecmp
import glob
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "src")


def generate(out_dir: str) -> list[str]:
    from grpc_tools import protoc  # imported late: only needed by developers and CI
    import grpc_tools

    protos = sorted(glob.glob(os.path.join(SRC, "curvine", "proto", "*.proto")))
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{SRC}", f"-I{include}", f"--python_out={tmp}",
                f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", *protos]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        produced = sorted(glob.glob(os.path.join(tmp, "curvine", "proto", "*.py*")))
        names = []
        for path in produced:
            name = os.path.basename(path)
            shutil.copyfile(path, os.path.join(out_dir, name))
            names.append(name)
        return names


def main() -> int:
    if "--check" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            names = generate(tmp)
            stale = [n for n in names
                     if not os.path.exists(os.path.join(HERE, n))
                     or not filecmp.cmp(os.path.join(tmp, n), os.path.join(HERE, n), shallow=False)]
        if stale:
            print("generated modules are out of date: " + ", ".join(stale), file=sys.stderr)
            print("run: python proto/generate.py", file=sys.stderr)
            return 1
        return 0
    for name in generate(HERE):
        print("wrote proto/" + name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
