"""A flat directory of 25,000 files (LMCache keeps one) lists completely; ``-m slow``
runs the same with 100,000 (about 4 minutes here, most of it creating the files).

Creating 100,000 files through FUSE costs three master calls each (lookup, create,
CompleteFile at close) plus the kernel round trips, and the kernel serialises
creates in one directory per mount: measured on 2 cores, about 130-300 files/s,
i.e. 6-12 minutes.  So by default (CURVINE_BIGDIR_CREATE=mixed) a few thousand
files are created through both mounts (open(O_CREAT) + close) while client-library
processes create the rest at the same time (Create + CompleteFile, several calls in
flight).  The listing always goes through FUSE, on both mounts.
CURVINE_BIGDIR_CREATE=fuse creates all of them through the mounts (slow).
"""

from __future__ import annotations

import os
import time

import pytest

from fs_helpers import create_via_client, create_via_fuse, join_procs, read_json, start_procs

CREATE_VIA = os.environ.get("CURVINE_BIGDIR_CREATE", "mixed")


@pytest.mark.parametrize("n_files", [25_000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_flat_directory_lists_completely(make_cluster, tmp_path, n_files):
    N_FILES = n_files  # noqa: N806 - the figure the messages below report
    N_VIA_FUSE = {"mixed": 4_000, "fuse": N_FILES, "client": 0}[CREATE_VIA]  # noqa: N806
    c = make_cluster(workers=1, mounts=2)
    name = "l2cache"
    os.mkdir(os.path.join(c.mounts[0], name))
    dirs = [os.path.join(m, name) for m in c.mounts]
    names = [f"{i:08x}-vllm@model@1@0@{i * 2654435761 % (1 << 32):08x}.data"
             for i in range(N_FILES)]
    via_fuse, via_client = names[:N_VIA_FUSE], names[N_VIA_FUSE:]
    jobs = []
    # two processes per mount (the kernel serialises creates in one directory per mount)
    for i in range(4 if via_fuse else 0):
        jobs.append((create_via_fuse, (dirs[i % 2], via_fuse[i::4], str(tmp_path / f"f{i}.json"))))
    for i in range(4 if via_client else 0):
        jobs.append((create_via_client, (c.master_addr, c.security, name, via_client[i::4],
                                         8, str(tmp_path / f"c{i}.json"))))
    t0 = time.monotonic()
    procs = [start_procs(target, [args])[0] for target, args in jobs]
    join_procs(procs, timeout=270)
    t_create = time.monotonic() - t0
    errors = []
    for target, args in jobs:
        r = read_json(args[-1])
        errors.extend(r["errors"])
        print(f"  {target.__name__}: {r['n']} files in {r['seconds']:.1f}s "
              f"({r['n'] / max(r['seconds'], 1e-9):.0f}/s)")
    assert not errors, f"creating files failed: {errors[:10]}"
    print(f"created {N_FILES} files ({len(via_fuse)} through FUSE, {len(via_client)} with the "
          f"client library) in {t_create:.1f}s ({N_FILES / t_create:.0f} files/s)")
    want = set(names)
    for i, d in enumerate(dirs):
        t0 = time.monotonic()
        listed = os.listdir(d)
        t_list = time.monotonic() - t0
        print(f"os.listdir on mount {i}: {len(listed)} entries in {t_list:.2f}s")
        assert len(listed) == len(set(listed)), \
            f"mount {i}: listing has {len(listed) - len(set(listed))} duplicate entries"
        got = set(listed)
        missing, extra = want - got, got - want
        assert not missing and not extra, (
            f"mount {i}: {len(missing)} names missing (e.g. {sorted(missing)[:5]}), "
            f"{len(extra)} unexpected (e.g. {sorted(extra)[:5]})")
    # a few by name, and a scandir pass (readdir pages with attributes) on mount 1
    for n in names[:: N_FILES // 20]:
        assert os.stat(os.path.join(dirs[1], n)).st_size == 0
    t0 = time.monotonic()
    with os.scandir(dirs[1]) as it:
        count = sum(1 for e in it if e.is_file(follow_symlinks=False))
    print(f"os.scandir on mount 1: {count} files in {time.monotonic() - t0:.2f}s")
    assert count == N_FILES
