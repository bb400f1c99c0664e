"""The committed generated modules match the .proto sources."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_generated_modules_are_up_to_date():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "proto", "generate.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_check_detects_a_stale_module(tmp_path, monkeypatch):
    # The check itself must be able to fail: compare against a doctored copy.
    sys.path.insert(0, os.path.join(ROOT, "proto"))
    try:
        import generate
    finally:
        sys.path.pop(0)
    names = generate.generate(str(tmp_path))
    assert "master_pb2.py" in names and "worker_pb2_grpc.py" in names
    fresh = (tmp_path / "master_pb2.py").read_bytes()
    committed = open(os.path.join(ROOT, "proto", "master_pb2.py"), "rb").read()
    assert fresh == committed
    assert fresh + b"# drift\n" != committed
