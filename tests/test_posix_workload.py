"""The random workload's judge: which errors a race explains (unit, a local directory)."""

import errno
import os
import random

import pytest

from curvine.devtools import posix_workload as pw


def _proc(root, names):
    p = pw._Proc(str(root), random.Random(0))
    p.files = p.names = list(names)  # link() picks src and dst from these, in order
    p.rng = random.Random(0)
    p.rng.choice = lambda seq, _it=iter(names): next(_it)
    p.rng.random = lambda: 0.0
    return p


def test_link_of_a_directory_is_expected_eperm(tmp_path):
    os.mkdir(tmp_path / "d")
    with pytest.raises(pw._Expected) as e:
        _proc(tmp_path, ["d", "x"]).link()
    assert e.value.name == "EPERM"


def test_link_eperm_of_a_stable_file_is_unexpected(tmp_path, monkeypatch):
    (tmp_path / "f").write_bytes(b"1")

    def refuse(*a, **k):
        raise PermissionError(errno.EPERM, "refused")
    monkeypatch.setattr(pw.os, "link", refuse)
    with pytest.raises(PermissionError):
        _proc(tmp_path, ["f", "x"]).link()


def test_link_eperm_while_the_name_changes_is_expected(tmp_path, monkeypatch):
    """The name was a directory when link() looked, a file again before and after."""
    (tmp_path / "f").write_bytes(b"1")

    def swap_then_refuse(*a, **k):
        (tmp_path / "g").write_bytes(b"2")
        os.rename(tmp_path / "g", tmp_path / "f")  # a new inode under the same name
        raise PermissionError(errno.EPERM, "was a directory")
    monkeypatch.setattr(pw.os, "link", swap_then_refuse)
    with pytest.raises(pw._Expected):
        _proc(tmp_path, ["f", "x"]).link()
