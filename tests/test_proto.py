"""The committed generated modules match the .proto sources."""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_check(proto_dir: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(proto_dir, "generate.py"), "--check"],
                          capture_output=True, text=True, timeout=120)


def test_generated_modules_are_up_to_date():
    r = run_check(os.path.join(ROOT, "proto"))
    assert r.returncode == 0, r.stderr


def test_check_detects_a_stale_module(tmp_path):
    # The check must be able to fail: run it on a copy with one module changed.
    copy = tmp_path / "proto"
    shutil.copytree(os.path.join(ROOT, "proto"), copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "master_pb2.py", "a") as f:
        f.write("# drift\n")
    r = run_check(str(copy))
    assert r.returncode == 1 and "master_pb2.py" in r.stderr
