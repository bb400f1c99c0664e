"""LMCache's fs connector on two real mounts of one local cluster.

LMCache writes ``<key>.tmp`` with one large write, closes it, renames it to
``<key>.data``; other pods find the chunk with ``stat`` and read it.  Several pods
may store the same key at once (all writing the same ``<key>.tmp`` with O_TRUNC).
"""

from __future__ import annotations

import errno
import glob
import os
import time

import pytest

from fs_helpers import (MIB, describe_exc, identify, join_procs, pattern, read_all, read_json,
                        sha256, spawn_ctx, start_procs, write_json)


@pytest.mark.parametrize("b_short_circuit", [True, False], ids=["b-short-circuit", "b-remote-read"])
def test_lmcache_store_and_lookup_across_mounts(make_cluster, b_short_circuit):
    """A chunk stored on mount A is found by stat on mount B at once, reads back
    identical on B, is listed by glob, and a remove on B makes it vanish on A."""
    c = make_cluster(workers=2, mounts=2, short_circuit=[True, b_short_circuit])
    a_dir = os.path.join(c.mounts[0], "l2cache")
    b_dir = os.path.join(c.mounts[1], "l2cache")
    os.mkdir(a_dir)
    assert os.path.isdir(b_dir)
    for size_mib, key in ((14, "k14-3f2a9c"), (32, "k32-77b0e1")):
        size = size_mib * MIB
        data = pattern(1, size_mib, size)
        a_tmp, a_data = os.path.join(a_dir, key + ".tmp"), os.path.join(a_dir, key + ".data")
        b_data = os.path.join(b_dir, key + ".data")
        # B looks the key up first and misses: a negative answer must not be cached.
        with pytest.raises(FileNotFoundError):
            os.stat(b_data)
        t0 = time.monotonic()
        with open(a_tmp, "wb") as f:
            assert f.write(data) == size  # one write call of one bytes object
        t_write = time.monotonic() - t0
        os.rename(a_tmp, a_data)
        st = os.stat(b_data)  # at once, no sleep
        assert st.st_size == size
        with pytest.raises(FileNotFoundError):
            os.stat(os.path.join(b_dir, key + ".tmp"))
        t0 = time.monotonic()
        got = read_all(b_data)
        t_read = time.monotonic() - t0
        assert len(got) == size
        assert sha256(got) == sha256(data), "mount B read other bytes than mount A wrote"
        assert glob.glob(os.path.join(b_dir, "*.data")).count(b_data) == 1
        assert os.path.basename(b_data) in os.listdir(b_dir)
        print(f"{size_mib} MiB: write+close {t_write:.3f}s ({size / t_write / MIB:.0f} MiB/s), "
              f"read on B ({'short-circuit' if b_short_circuit else 'remote'}) {t_read:.3f}s "
              f"({size / t_read / MIB:.0f} MiB/s)")
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(b_dir, "*.data"))) == \
        ["k14-3f2a9c.data", "k32-77b0e1.data"]
    # A reads its own chunk too (after B's read), then B removes it.
    a_data = os.path.join(a_dir, "k14-3f2a9c.data")
    assert sha256(read_all(a_data)) == sha256(pattern(1, 14, 14 * MIB))
    os.remove(os.path.join(b_dir, "k14-3f2a9c.data"))
    assert not os.path.exists(a_data)
    with pytest.raises(FileNotFoundError):
        os.stat(a_data)
    with pytest.raises(FileNotFoundError):
        open(a_data, "rb")
    assert [os.path.basename(p) for p in glob.glob(os.path.join(a_dir, "*.data"))] == \
        ["k32-77b0e1.data"]


# --------------------------------------------------------------------------- concurrency

ROUNDS = 200
WRITERS = 4
CHUNK = 14 * MIB


def _key(rnd: int) -> str:
    return f"chunk{rnd:04d}"


def _writer(w: int, directory: str, rounds: int, size: int, barrier, current, out: str) -> None:
    """One LMCache pod storing the same keys as the others: open(tmp, 'wb'), one
    write, close, rename to .data; every round starts together (a barrier)."""
    enoent = ok = 0
    errors: list[str] = []
    t_write = 0.0
    try:
        for r in range(rounds):
            data = pattern(w, r, size)
            barrier.wait(120)
            if w == 0:
                current.value = r
            tmp = os.path.join(directory, _key(r) + ".tmp")
            t0 = time.monotonic()
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
            except OSError as e:
                errors.append(f"round {r}: write {tmp}: {describe_exc(e)}")
                continue
            t_write += time.monotonic() - t0
            try:
                os.rename(tmp, os.path.join(directory, _key(r) + ".data"))
                ok += 1
            except FileNotFoundError:
                enoent += 1  # another writer already moved <key>.tmp (a local fs does the same)
            except OSError as e:
                errors.append(f"round {r}: rename: {describe_exc(e)}")
    except BaseException as e:  # a broken barrier or anything unexpected
        errors.append(f"writer {w} aborted: {describe_exc(e)}")
    write_json(out, {"writer": w, "renamed": ok, "enoent": enoent, "errors": errors,
                     "write_seconds": t_write})


def _after_bad_read(path: str, master_addr: str, security) -> str:
    """What the name shows right after a bad read (diagnostics for the report)."""
    from curvine.client.master.master_client import MasterClient
    from curvine.common.ids import ROOT_INO
    try:
        mc = MasterClient(master_addr, timeout=5, wait=5, security=security)
        d = mc.lookup(ROOT_INO, os.path.basename(os.path.dirname(path)).encode())
        node = mc.lookup(d.ino, os.path.basename(path).encode())
        master = f"master: ino {node.ino} size {node.size} state {node.state}; "
        mc.close()
    except Exception as e:  # noqa: BLE001 - diagnostics only
        master = f"master: {describe_exc(e)}; "
    try:
        st = os.stat(path)
        again = read_all(path)
        try:
            who = "writer %d round %d" % identify(again)
        except AssertionError as e:
            who = str(e)
        return master + f"then: stat ino {st.st_ino} size {st.st_size}, re-read {len(again)} bytes: {who}"
    except OSError as e:
        return master + f"then: {describe_exc(e)}"


def _reader(directory: str, size: int, current, stop, out: str, master_addr: str,
            security) -> None:
    """Reads the current round's <key>.data while the writers store it: every
    complete read must be exactly one writer's bytes of that round."""
    reads = misses = stale = 0
    bad: list[str] = []
    errors: list[str] = []
    while not stop.is_set():
        r = current.value
        path = os.path.join(directory, _key(r) + ".data")
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            misses += 1
            time.sleep(0.005)
            continue
        except OSError as e:
            errors.append(f"round {r}: open {path}: {describe_exc(e)}")
            continue
        try:
            with open(fd, "rb") as f:
                data = f.read()
        except OSError as e:
            # The version this reader opened was replaced (its blocks freed) while it
            # read: a clean error is allowed (consistency rule 4, docs/consistency.md), other bytes not.
            if e.errno in (errno.ESTALE, errno.ENOENT):
                stale += 1
            else:
                errors.append(f"round {r}: read {path}: {describe_exc(e)}")
            continue
        reads += 1
        try:
            w, rr = identify(data, size)
            if rr != r:
                bad.append(f"{path}: holds round {rr} of writer {w}")
        except AssertionError as e:
            bad.append(f"{path}: {e}; {_after_bad_read(path, master_addr, security)}")
    write_json(out, {"reads": reads, "misses": misses, "stale": stale, "bad": bad[:20],
                     "n_bad": len(bad),
                     "errors": errors[:20], "n_errors": len(errors)})


def test_lmcache_concurrent_writers_same_key(make_cluster, tmp_path):
    """Four writers (two per mount) store the same keys 200 rounds long; every
    <key>.data is one writer's complete bytes, on both mounts, during and after."""
    c = make_cluster(workers=2, mounts=2)
    dirs = [os.path.join(m, "l2cache") for m in c.mounts]
    os.mkdir(dirs[0])
    ctx_procs = spawn_ctx()
    barrier = ctx_procs.Barrier(WRITERS)
    current = ctx_procs.Value("i", 0)
    stop = ctx_procs.Event()
    outs = [str(tmp_path / f"writer{w}.json") for w in range(WRITERS)]
    routs = [str(tmp_path / f"reader{i}.json") for i in range(2)]
    t0 = time.monotonic()
    writers = start_procs(_writer, [(w, dirs[w % 2], ROUNDS, CHUNK, barrier, current, outs[w])
                                    for w in range(WRITERS)])
    # each mount also has a reader, reading what the other mount's writers store
    readers = start_procs(_reader, [(dirs[i], CHUNK, current, stop, routs[i], c.master_addr,
                                     c.security) for i in range(2)])
    try:
        join_procs(writers, timeout=240)
    finally:
        stop.set()
        join_procs(readers, timeout=60)
    t_write = time.monotonic() - t0
    results = [read_json(p) for p in outs]
    rres = [read_json(p) for p in routs]
    renamed = sum(r["renamed"] for r in results)
    enoent = sum(r["enoent"] for r in results)
    print(f"{ROUNDS} rounds x {WRITERS} writers x {CHUNK // MIB} MiB in {t_write:.1f}s "
          f"({ROUNDS * WRITERS * CHUNK / t_write / MIB:.0f} MiB/s written); renames that "
          f"succeeded: {renamed}, failed with ENOENT (source already moved): {enoent}; per "
          f"writer: " + ", ".join(f"w{r['writer']} ok={r['renamed']} enoent={r['enoent']} "
                                 f"write={r['write_seconds']:.1f}s" for r in results))
    print("concurrent readers: " + "; ".join(
        f"mount {i}: {r['reads']} full reads checked, {r['misses']} misses (not there yet), "
        f"{r['stale']} clean ESTALE/ENOENT while reading a replaced version, {r['n_bad']} bad, "
        f"{r['n_errors']} other errors" for i, r in enumerate(rres)))
    problems = []
    errors = [e for r in results for e in r["errors"]]
    if errors:
        problems.append(f"writers failed other than by ENOENT on rename: {errors[:10]}")
    if renamed + enoent != ROUNDS * WRITERS:
        problems.append(f"{renamed} renames + {enoent} ENOENT != {ROUNDS * WRITERS} attempts")
    if renamed < ROUNDS:
        problems.append(f"only {renamed} successful renames in {ROUNDS} rounds")
    for i, r in enumerate(rres):
        if r["n_bad"]:
            problems.append(f"the reader on mount {i} saw {r['n_bad']} mixed/short/foreign "
                            f"files while the writers ran, e.g.: {r['bad'][:5]}")
        if r["n_errors"]:
            problems.append(f"the reader on mount {i} got {r['n_errors']} errors: {r['errors']}")
    if not sum(r["reads"] for r in rres):
        problems.append("the concurrent readers never read a chunk")

    # After the writers: every key is complete and exactly one writer's bytes of its
    # round, on both mounts, and no <key>.tmp is left (every open is followed by
    # its writer's rename, as on a local file system).
    t0 = time.monotonic()
    winners = [0] * WRITERS
    want_names = {_key(r) + ".data" for r in range(ROUNDS)}
    for d in dirs:
        names = set(os.listdir(d))
        if names != want_names:
            problems.append(f"{d}: unexpected listing (leftover .tmp or missing .data): "
                            f"{sorted(names ^ want_names)[:10]}")
    for r in range(ROUNDS):
        seen = []
        for d in dirs:
            path = os.path.join(d, _key(r) + ".data")
            try:
                size = os.stat(path).st_size
                w, rr = identify(read_all(path), CHUNK)
            except (OSError, AssertionError) as e:
                problems.append(f"after the writers: {path}: {e}")
                continue
            if size != CHUNK:
                problems.append(f"after the writers: {path}: stat says {size} bytes")
            if rr != r:
                problems.append(f"after the writers: {path} holds round {rr}")
            seen.append(w)
        if len(seen) == 2 and seen[0] != seen[1]:
            problems.append(f"round {r}: mount 0 reads writer {seen[0]}, mount 1 writer {seen[1]}")
        if seen:
            winners[seen[0]] += 1
    print(f"final check of {ROUNDS} files on both mounts: {time.monotonic() - t0:.1f}s; "
          f"rounds won per writer: {winners}")
    assert not problems, "\n".join(problems[:30])
