"""Crash recovery with real processes: SIGKILL the master under load (mounts' writers,
and connector-style stores on the call port), damaged journals (torn tail, flipped
byte), SIGKILL a worker.

The master's durable truth is its journal: whatever a client saw acknowledged
(close and rename returned) survives a SIGKILL.  A torn last record is cut off
with a log line; damage before the tail stops the master with an error naming
segment and offset.  A worker removes staging leftovers on start, and its block
report makes the master drop what is gone and delete what nobody owns.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import time

import pytest

from curvine.journal.segment import encode_frame
from curvine.worker.blockstore import block_path
from fs_helpers import (MIB, acknowledged_problems, chunk_writer, join_procs, journal_frames,
                        log_text, read_all, read_results, run_master_once, sha256, spawn_ctx,
                        start_procs, wait_until)

KILLS = 10


def _journal_dir(c) -> str:
    return os.path.join(c.base, "master", "journal")


def _last_run(text: str) -> str:
    from curvine.devtools.local import START_MARKER
    i = text.rfind(START_MARKER)
    return text[i:] if i >= 0 else text


def _store(path_tmp: str, path_final: str, data: bytes) -> None:
    with open(path_tmp, "wb") as f:
        f.write(data)
    os.rename(path_tmp, path_final)


def _store_files(directory: str, n: int, seed: int, lo: int = 64 * 1024,
                 hi: int = 2 * MIB) -> dict[str, bytes]:
    rnd = random.Random(seed)
    files = {}
    for i in range(n):
        data = rnd.randbytes(rnd.randrange(lo, hi))
        name = f"f{seed}-{i:03d}.data"
        _store(os.path.join(directory, name[:-5] + ".tmp"), os.path.join(directory, name), data)
        files[name] = data
    return files


def _check_files(directory: str, files: dict[str, bytes], what: str) -> None:
    for name, data in files.items():
        p = os.path.join(directory, name)
        try:
            got = read_all(p)
        except OSError as e:
            raise AssertionError(f"{what}: {p}: {e}") from None
        assert len(got) == len(data) and sha256(got) == sha256(data), \
            f"{what}: {p}: {len(got)} bytes, other content than was stored"


def _start_master(c) -> None:
    """Start the master; if it will not start, kill the mounts before failing (a mount
    stalls each call up to cluster.master_wait while the master is down, which makes
    the teardown's unmount take minutes)."""
    from curvine.devtools.local import ClusterError
    try:
        c.start("master")
    except ClusterError:
        for i in range(len(c.mounts)):
            with contextlib.suppress(ClusterError):
                c.kill("fuse", i, sig=signal.SIGKILL)
        raise


# --------------------------------------------------------------------------- (a)

@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master is SIGKILLed on purpose
def test_master_sigkill_under_writers(make_cluster, tmp_path):
    """Four writers (two per mount) store chunks while the master is SIGKILLed and
    restarted 10 times; every chunk whose close and rename returned is there,
    with its bytes, and no writer ever sees an error (operations only stall)."""
    c = make_cluster(workers=2, mounts=2)
    dirs = [os.path.join(m, "kv") for m in c.mounts]
    os.mkdir(dirs[0])
    ctx = spawn_ctx()
    stop = ctx.Event()
    results = [str(tmp_path / f"w{w}.txt") for w in range(4)]
    rnd = random.Random()
    seed = rnd.randrange(1 << 30)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    procs = start_procs(chunk_writer, [(w, dirs[w % 2], results[w], stop, seed + w)
                                       for w in range(4)])

    def stored() -> int:
        return sum(len(read_results(r)[0]) for r in results if os.path.exists(r))

    outages = []
    try:
        wait_until(lambda: stored() >= 4, 60, "the writers' first chunks")
        for i in range(KILLS):
            time.sleep(rnd.uniform(0.2, 2.0))
            before = stored()
            t0 = time.monotonic()
            c.kill("master", sig=signal.SIGKILL)
            time.sleep(rnd.uniform(0.0, 0.5))
            c.start("master")
            t_up = time.monotonic() - t0
            # the writers go on after the restart (their calls stalled, not failed)
            wait_until(lambda: stored() >= before + 4, 90,
                       f"writers to make progress after master restart {i + 1}")
            outages.append((t_up, time.monotonic() - t0))
    finally:
        stop.set()
        join_procs(procs, timeout=120)
    print("master down->ready / down->4 more chunks stored (s): " +
          ", ".join(f"{a:.1f}/{b:.1f}" for a, b in outages))
    done, errors = [], []
    for w, r in enumerate(results):
        d, e = read_results(r)
        done.extend((w, *x) for x in d)
        errors.extend(f"writer {w}: {x}" for x in e)
    slowest = max(x[4] for x in done)
    print(f"{len(done)} chunks stored by 4 writers across {KILLS} master kills; slowest "
          f"store (tmp write + close + rename) {slowest:.1f}s; writer errors: {len(errors)}")
    problems = [f"a writer got an error: {e}" for e in errors[:10]]
    # every acknowledged chunk, read through the mount that did not write it
    problems += acknowledged_problems(done, dirs)
    assert not problems, "\n".join(problems[:30])


# --------------------------------------------------------------------------- (b)

@pytest.mark.parametrize("damage", ["cut-last-record", "partial-append"])
@pytest.mark.expect_log(r"WARNING curvine\.journal\.journal: journal: torn tail in segment", r"ERROR curvine\.master\.meta\.metadata: metadata in \S+ is at seq \d+ but the journal ends at seq \d+: records [\d.]+ are lost; rebuilding", r"WARNING curvine\.master\.meta\.metadata: previous metadata moved to", r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the journal's tail is damaged on purpose (and the master restarted)
def test_master_recovers_from_torn_journal_tail(make_cluster, damage):
    """SIGKILL the master, tear the journal's tail, restart: the master cuts the
    torn record (and says so in its log) and serves; every file from before the
    last record is intact, mounts work, and new mutations are durable.

    cut-last-record: the last record is cut at a random byte inside it.
    partial-append: a record that was being written is half on disk after the
    last good one (what a crash in the middle of a journal write leaves)."""
    c = make_cluster(workers=1, mounts=2)
    rnd = random.Random()
    seed = rnd.randrange(1 << 30)
    rnd = random.Random(seed)
    a, b = (os.path.join(m, "kv") for m in c.mounts)
    os.mkdir(a)
    files = _store_files(a, 12, seed % 1000)
    os.mkdir(os.path.join(a, "last-mutation"))  # the record to tear (or the last good one)
    c.kill("master", sig=signal.SIGKILL)
    segments = journal_frames(_journal_dir(c))
    seg_path, frames = segments[-1]
    assert frames, "the last segment holds no record"
    start, end, seq, typ = frames[-1]
    if damage == "cut-last-record":
        new_size = rnd.randrange(start + 1, end)
        with open(seg_path, "r+b") as f:
            f.truncate(new_size)
        cut_at = start
        print(f"seed {seed}: {os.path.basename(seg_path)}: last record seq {seq} (type {typ}) "
              f"at [{start}, {end}) cut to {new_size} bytes")
    else:
        frame = encode_frame(seq + 1, typ, rnd.randbytes(rnd.randrange(40, 400)))
        part = frame[:rnd.randrange(1, len(frame))]
        with open(seg_path, "ab") as f:
            f.write(part)
        cut_at = end
        print(f"seed {seed}: {os.path.basename(seg_path)}: {len(part)} of {len(frame)} bytes "
              f"of record seq {seq + 1} appended at offset {end}")
    _start_master(c)
    log = _last_run(log_text(c.log_path("master")))
    assert re.search(rf"torn tail in segment \S*{re.escape(os.path.basename(seg_path))} at "
                     rf"offset {cut_at}\b", log), \
        f"the master log does not name the cut (segment and offset {cut_at}):\n{log[-3000:]}"
    # every file from before the last record, through both mounts
    _check_files(b, files, "after the torn-tail restart (mount 1)")
    _check_files(a, files, "after the torn-tail restart (mount 0)")
    if damage == "partial-append":
        assert os.path.isdir(os.path.join(b, "last-mutation"))
    # the mounts work: new files, renames, listings
    more = _store_files(b, 3, seed % 1000 + 1)
    _check_files(a, more, "stored after the restart")
    assert set(os.listdir(a)) >= set(files) | set(more)
    # and what was acknowledged after recovery survives the next crash
    c.kill("master", sig=signal.SIGKILL)
    c.start("master")
    _check_files(a, {**files, **more}, "after a second restart")
    assert "Traceback" not in log_text(c.log_path("master"))


# --------------------------------------------------------------------------- (c)

@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master refuses the damaged journal on purpose: the worker waits for it
def test_master_refuses_journal_damaged_before_tail(make_cluster):
    """A flipped byte in a record that is not the last: curvine-master exits
    non-zero and its stderr names the segment file and the offset."""
    c = make_cluster(workers=1, mounts=1)
    rnd = random.Random()
    seed = rnd.randrange(1 << 30)
    rnd = random.Random(seed)
    d = os.path.join(c.mounts[0], "kv")
    os.mkdir(d)
    files = _store_files(d, 8, 5, 1000, 5000)
    c.kill("master", sig=signal.SIGKILL)
    segments = journal_frames(_journal_dir(c))
    candidates = [(p, f) for p, frames in segments for f in
                  (frames[:-1] if p == segments[-1][0] else frames)]
    assert len(candidates) >= 5
    seg_path, (start, end, seq, _typ) = rnd.choice(candidates)
    pos = rnd.randrange(start, end)
    with open(seg_path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([byte ^ (1 << rnd.randrange(8))]))
    print(f"seed {seed}: flipped a bit at offset {pos} of {os.path.basename(seg_path)}, "
          f"inside record seq {seq} at [{start}, {end})")
    t0 = time.monotonic()
    r = run_master_once(c.base, timeout=30)
    print(f"curvine-master exited with {r.returncode} after {time.monotonic() - t0:.1f}s; "
          f"stderr tail:\n{r.stderr[-1500:]}")
    assert r.returncode is not None, "curvine-master started (and served) on a damaged journal"
    assert r.returncode != 0
    assert os.path.basename(seg_path) in r.stderr, "stderr does not name the segment file"
    assert re.search(rf"\boffset {start}\b", r.stderr), \
        f"stderr does not name the offset {start} of the damaged record"
    assert "Traceback" not in r.stderr
    # and it did not "repair" the journal by cutting it: with the bit flipped back
    # the master starts and serves what was stored
    assert os.path.getsize(seg_path) >= end
    with open(seg_path, "r+b") as f:
        f.seek(pos)
        f.write(bytes([byte]))
    _start_master(c)
    _check_files(d, files, "after repairing the flipped bit")


# --------------------------------------------------------------------------- (d)

@pytest.mark.expect_log(r"WARNING curvine\.master\.master: worker \d+ did not report 1 blocks the master expected there; dropping those locations")  # a block removed while its worker is down, on purpose
def test_worker_sigkill_restart_reconciles(make_cluster, tmp_path):
    """SIGKILL a worker; while it is down, leave a staging leftover, an unknown
    block file, and lose one block of a file.  After the restart: the leftover
    is gone, the unknown block is deleted after the block report, the file that
    lost its only replica is a clean ENOENT, every other file reads back."""
    conf = tmp_path / "grace.toml"
    conf.write_text('[master]\norphan_block_grace = "0s"\n')
    c = make_cluster(workers=2, mounts=2, conf=str(conf), short_circuit=[True, False])
    a, b = (os.path.join(m, "kv") for m in c.mounts)
    os.mkdir(a)
    files = _store_files(a, 10, 7, 256 * 1024, 3 * MIB)
    data_dirs = [os.path.join(c.base, "worker", str(i), "data") for i in range(2)]

    from curvine.client.master.master_client import MasterClient
    from curvine.common.ids import ROOT_INO
    mc = MasterClient(c.master_addr, timeout=10, wait=10, security=c.security)
    try:
        parent = mc.lookup(ROOT_INO, b"kv").ino
        where: dict[str, list[tuple[int, int]]] = {}  # name -> [(block id, worker index)]
        for name in files:
            _node, blocks, _ = mc.get_blocks(mc.lookup(parent, name.encode()).ino)
            where[name] = [(blk.block_id, next((i for i, d in enumerate(data_dirs)
                                                if os.path.exists(block_path(d, blk.block_id))),
                                               -1))
                           for blk in blocks]
            assert all(i >= 0 for _, i in where[name]), f"{name}: a block file is on no worker"
    finally:
        mc.close()
    per_worker = [sum(1 for bl in where.values() for _, i in bl if i == w) for w in range(2)]
    victim = per_worker.index(max(per_worker))
    vdir = data_dirs[victim]
    on_victim = sorted(n for n, bl in where.items() if all(i == victim for _, i in bl))
    print(f"blocks per worker: {per_worker}; killing worker {victim}")
    assert len(on_victim) >= 2, f"too few files with all blocks on worker {victim}: {where}"

    c.kill("worker", victim, sig=signal.SIGKILL)
    staging = os.path.join(vdir, "staging", f"{0xdeadbeef:016x}.{os.urandom(4).hex()}.tmp")
    with open(staging, "wb") as f:
        f.write(os.urandom(100_000))
    used = max(bid for bl in where.values() for bid, _ in bl)
    orphans = [used + 5000, (1 << 40) + 0x1234]  # never allocated / far beyond the allocation
    for bid in orphans:
        p = block_path(vdir, bid)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(os.urandom(64 * 1024))
    lost = on_victim[0]
    for bid, _ in where[lost]:
        os.unlink(block_path(vdir, bid))
    del files[lost]

    c.start("worker", victim)
    assert not os.path.exists(staging), "the staging leftover survived the restart"
    wait_until(lambda: not any(os.path.exists(block_path(vdir, o)) for o in orphans), 15,
               "the unknown block files to be deleted after the block report")

    def lost_is_gone() -> bool:
        try:
            os.stat(os.path.join(b, lost))
        except FileNotFoundError:
            return True
        return False

    wait_until(lost_is_gone, 15, f"{lost} (its only block is gone) to be removed")
    assert lost not in os.listdir(a)
    with pytest.raises(FileNotFoundError):
        open(os.path.join(a, lost), "rb")
    # the rest reads back (some of it from the restarted worker): mount 1 through the
    # workers' gRPC, mount 0 short-circuit
    assert set(on_victim[1:]) <= set(files)
    _check_files(b, files, "after the worker restart (remote reads)")
    _check_files(a, files, "after the worker restart (short-circuit reads)")
    more = _store_files(b, 4, 8)
    _check_files(a, more, "stored after the worker restart")


def put_loop(conf: str, parent: int, results: str, stop, seed: int) -> None:
    """A pod's connector storing empty chunks as curvine's connector does (one PutFile
    each, on the master's call port): every name whose call returned is written to
    ``results`` (flushed), an error as ``ERR ...``."""
    from curvine.client.master.master_client import MasterClient
    from curvine.common import config as config_mod
    from curvine.common.security import Security

    cfg = config_mod.load(conf)
    mc = MasterClient(cfg.cluster.master_addr, timeout=10, wait=60,
                      security=Security.load(cfg), call_port=True)
    n = 0
    with open(results, "w") as out:
        try:
            while not stop.is_set():
                name = b"p%d-%d.data" % (seed, n)
                try:
                    mc.put_file(parent, name, [], 0)
                except Exception as e:  # noqa: BLE001 - reported, the test fails on it
                    out.write(f"ERR {name.decode()}: {e}\n")
                    out.flush()
                    return
                out.write(name.decode() + "\n")
                out.flush()
                n += 1
        finally:
            mc.close()


@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master is SIGKILLed on purpose
def test_master_sigkill_under_connector_stores(make_cluster, tmp_path):
    """Eight processes store chunks the way curvine's connector does (one PutFile each,
    answered by the master's call port as steps, with no thread waiting for the
    journal) while the master is SIGKILLed and restarted 5 times: every store whose
    call returned is there after the last restart, and no store failed (each only
    stalled, then went on through the unary fallback or the port once it was back)."""
    from curvine.client.master.master_client import MasterClient

    c = make_cluster(workers=1, mounts=0)
    mc = MasterClient(c.master_addr, security=c.security)
    try:
        parent = mc.mkdir(1, b"kv").ino
    finally:
        mc.close()
    stop = spawn_ctx().Event()
    results = [str(tmp_path / f"p{i}.txt") for i in range(8)]
    rnd = random.Random()
    seed = rnd.randrange(1 << 30)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    procs = start_procs(put_loop, [(c.client_conf, parent, results[i], stop, i)
                                   for i in range(8)])

    def acknowledged() -> list[str]:
        names = []
        for r in results:
            if os.path.exists(r):
                with open(r) as f:
                    names += [ln.strip() for ln in f if ln.endswith("\n")]
        return names

    try:
        wait_until(lambda: len(acknowledged()) >= 50, 60, "the first stores")
        for i in range(5):
            time.sleep(rnd.uniform(0.2, 1.0))  # kill with stores in flight
            before = len(acknowledged())
            c.kill("master", sig=signal.SIGKILL)
            c.start("master")
            wait_until(lambda: len(acknowledged()) >= before + 50, 90,
                       f"stores to go on after master restart {i + 1}")
    finally:
        stop.set()
        join_procs(procs, timeout=120)
    names = acknowledged()
    errors = [n for n in names if n.startswith("ERR")]
    assert not errors, errors[:10]
    mc = MasterClient(c.master_addr, security=c.security)
    try:
        listed, after = set(), b""
        while True:
            entries, more = mc.listdir(parent, after)
            listed.update(e.name.decode() for e in entries)
            if not more or not entries:
                break
            after = entries[-1].name
    finally:
        mc.close()
    missing = [n for n in names if n not in listed]
    print(f"{len(names)} connector stores acknowledged across 5 master kills")
    assert not missing, f"{len(missing)} acknowledged stores lost: {missing[:10]}"
