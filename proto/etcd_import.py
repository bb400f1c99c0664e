"""Bring etcd 3.4's own .proto files into proto/src: ``python proto/etcd_import.py ETCD_SRC``.

The master group talks to etcd through sync gRPC stubs generated from etcd's protos
(master/group/etcd.py), since grpcio is already here and the only Python etcd v3
client kept up to date (aetcd) is asyncio-only.  ``ETCD_SRC`` is the root of etcd's
Go sources at v3.4 (``go.etcd.io/etcd``), e.g. from Debian's golang-etcd-server-dev::

    apt-get download golang-etcd-server-dev && dpkg -x golang-etcd-server-dev_*.deb x
    python proto/etcd_import.py x/usr/share/gocode/src/go.etcd.io/etcd

The files are copied unchanged except for what only Go and the HTTP gateway use: the
gogoproto options and imports and the ``google.api.http`` annotations.  Imports are
renamed to the flat names under ``proto/src/curvine/proto`` (``etcd_rpc.proto``,
``etcd_kv.proto``, ``etcd_auth.proto``); the proto packages (``etcdserverpb``,
``mvccpb``, ``authpb``) stay, since they are part of the gRPC method names etcd
serves.  Then ``python proto/generate.py`` makes the modules, as for our own protos.
"""

from __future__ import annotations

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "src", "curvine", "proto")

# etcd's path -> our flat name
FILES = {
    "etcdserver/etcdserverpb/rpc.proto": "etcd_rpc.proto",
    "mvcc/mvccpb/kv.proto": "etcd_kv.proto",
    "auth/authpb/auth.proto": "etcd_auth.proto",
}
IMPORTS = {f"etcd/{path}": f"curvine/proto/{name}" for path, name in FILES.items()}

_GO_ONLY_IMPORT = re.compile(r'^import "(gogoproto/gogo|google/api/annotations)\.proto";\n',
                             re.M)
_GO_ONLY_OPTION = re.compile(r"^option \(gogoproto\.[a-z_]+\) = \w+;\n", re.M)
_HTTP_ANNOTATION = re.compile(r"option \(google\.api\.http\) = \{")
_IMPORT = re.compile(r'^import "([^"]+)";', re.M)
HEADER = ("// Imported from etcd v3.4 by proto/etcd_import.py (gogoproto and google.api\n"
          "// annotations removed, imports renamed); do not edit.\n")


def _without_http_annotations(text: str) -> str:
    """Drop every ``option (google.api.http) = {...};`` (its braces nest:
    additional_bindings), leaving the rpc's empty body."""
    while (m := _HTTP_ANNOTATION.search(text)) is not None:
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        end = text.index(";", i) + 1
        text = text[:m.start()] + text[end:]
    return re.sub(r"\{\s*\}", "{}", text)


def strip(text: str) -> str:
    text = _GO_ONLY_IMPORT.sub("", text)
    text = _GO_ONLY_OPTION.sub("", text)
    text = _without_http_annotations(text)
    text = _IMPORT.sub(lambda m: f'import "{IMPORTS[m.group(1)]}";', text)
    if "gogoproto" in text or "google.api" in text:
        raise SystemExit("an annotation this script does not know is left: update it")
    return HEADER + text


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    for path, name in FILES.items():
        with open(os.path.join(argv[0], path), encoding="utf-8") as f:
            text = strip(f.read())
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            f.write(text)
        print("wrote proto/src/curvine/proto/" + name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
