"""Replicas and worker loss.

In-process (a real Master, workers played by the test through the same calls the
worker daemon makes): placement of ``replicas`` workers, a silent worker declared
lost, its locations dropped (a file without a replica left disappears), copies
planned from a surviving replica and admitted when confirmed, never more replicas
than wanted, a rejoining worker's blocks re-admitted or deleted, replay after a
restart.

Real processes (master, workers, FUSE mounts): reads through a mount while one of
two replicas' workers is SIGKILLed (no error, no wrong byte), re-replication after
a worker is lost for good, and files whose only replica was lost vanishing cleanly.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from curvine.common.config import Config
from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO, new_request_id
from curvine.common.security import NO_SECURITY
from curvine.master.master import Master
from curvine.proto import common_pb2, master_pb2

from fs_helpers import wait_until

MiB = 1 << 20
LOST_AFTER = 0.6  # seconds without heartbeats before the in-process master declares a worker lost
# the master's lines about a worker SIGKILLed or stopped on purpose
LOST = r"WARNING curvine\.master\.cluster\.replication: worker \d+ \(\S+\) missed heartbeats for \S+: declared lost"
DROPPED = r"WARNING curvine\.master\.cluster\.replication: worker \d+ \(\S+\) still lost after \S+ \(master\.lost_grace\)"


# ---------------------------------------------------------------------- in-process
def make_master(tmp_path, replicas: int = 2) -> Master:
    cfg = Config()
    cfg.master.meta_dir = str(tmp_path / "meta")
    cfg.journal.dir = str(tmp_path / "journal")
    cfg.cluster.block_size = 4 * MiB
    cfg.cluster.replicas = replicas
    cfg.master.worker_lost_after = LOST_AFTER
    # these tests are about what follows a loss (locations dropped at once); the grace
    # itself: test_a_rejoin_within_the_grace_keeps_every_location_and_trims_extra_copies
    cfg.master.lost_grace = 0.0
    cfg.master.orphan_block_grace = 0.0
    m = Master(cfg, security=NO_SECURITY)
    # its workers are addresses only: deletes go with the heartbeat replies, as to a
    # worker that DeleteBlocks cannot reach
    m.deleter.close()
    return m


def add_worker(m, name: str) -> int:
    wid = m.register_worker(common_pb2.WorkerInfo(
        uuid=name, host_id=f"host-{name}", address=f"127.0.0.1:{1000 + len(name)}",
        data_dirs=["/d"], capacity=1 << 40)).worker_id
    m.block_report(master_pb2.BlockReportRequest(worker_id=wid))
    return wid


def beat(m, wid, replicated=(), failed=()) -> master_pb2.HeartbeatReply:
    return m.heartbeat(master_pb2.HeartbeatRequest(
        worker_id=wid, capacity=1 << 40, used=0, replicated_block_ids=list(replicated),
        failed_block_ids=list(failed)))


def write_file(m, name: bytes, length: int = MiB, parent: int = ROOT_INO):
    """Create and publish a one-block file on the workers AddBlock picks."""
    node = m.create(master_pb2.CreateRequest(request_id=new_request_id(), parent=parent,
                                             name=name, mode=0o644)).inode
    r = m.add_block(master_pb2.AddBlockRequest(ino=node.ino, size_hint=length))
    block = common_pb2.Block(block_id=r.block_id, length=length, checksum=7,
                             worker_ids=[w.worker_id for w in r.workers])
    m.complete(master_pb2.CompleteFileRequest(request_id=new_request_id(), ino=node.ino,
                                              blocks=[block], size=length))
    return node.ino, r.block_id, list(block.worker_ids)


def locations(m, ino) -> list[int]:
    return list(m.get_blocks(ino).blocks[0].worker_ids)


def keep_alive(m, wids, until, collect=None):
    """Heartbeat ``wids`` until ``until()`` holds (bounded); replies go to ``collect``."""
    deadline = time.monotonic() + 15
    while True:
        for w in wids:
            reply = beat(m, w)
            if collect is not None:
                collect.setdefault(w, []).extend(reply.replicate)
        v = until()
        if v:
            return v
        assert time.monotonic() < deadline, "timed out (15 s)"
        time.sleep(0.05)


def test_add_block_places_replicas(tmp_path):
    m = make_master(tmp_path, replicas=2)
    try:
        ws = [add_worker(m, n) for n in ("a", "b", "c")]
        for w in ws:
            beat(m, w)
        _, _, locs = write_file(m, b"f")
        assert len(locs) == 2 and len(set(locs)) == 2
        # a directory's own count wins for files created in it afterwards
        d = m.mkdir(master_pb2.MkdirRequest(request_id=new_request_id(), parent=ROOT_INO,
                                            name=b"three", mode=0o755)).inode
        with m.store.env.begin(write=True) as txn:  # (the RPC that sets it is not ours)
            node = m.store.get_inode(txn, d.ino)
            node.replicas = 3
            m.store.put_inode(txn, node)
        _, _, locs3 = write_file(m, b"g", parent=d.ino)
        assert sorted(locs3) == sorted(ws)
    finally:
        m.close()


def test_lost_worker_copies_and_rejoin(tmp_path):
    m = make_master(tmp_path, replicas=2)
    try:
        a, b, c = (add_worker(m, n) for n in ("a", "b", "c"))
        for w in (a, b, c):
            beat(m, w)
        files = [write_file(m, f"f{i}".encode()) for i in range(6)]
        on_a = [(ino, bid, locs) for ino, bid, locs in files if a in locs]
        assert on_a, "placement never picked worker a"
        m.replication.run_round()
        assert m.replication.status().under_replicated_blocks == 0

        # a goes silent: lost, its locations dropped, copies planned onto the third worker
        commands: dict[int, list] = {}
        keep_alive(m, (b, c), lambda: a in m.replication.status().lost_workers, commands)
        for ino, bid, locs in on_a:
            assert a not in locations(m, ino)
        keep_alive(m, (b, c), lambda: sum(len(v) for v in commands.values()) >= len(on_a),
                   commands)
        by_block = {cmd.block_id: (w, cmd) for w, cmds in commands.items() for cmd in cmds}
        assert set(by_block) == {bid for _, bid, _ in on_a}
        for ino, bid, locs in on_a:
            target, cmd = by_block[bid]
            survivor = next(w for w in locs if w != a)
            assert target not in locs and [s.worker_id for s in cmd.sources] == [survivor]
            assert cmd.length == MiB and cmd.checksum == 7
        status = m.replication.status()
        assert status.under_replicated_blocks == len(on_a)
        assert status.copies_in_flight == len(on_a)

        # one copy fails, the rest are confirmed: admitted as locations (journaled)
        first = on_a[0][1]
        done = [bid for _, bid, _ in on_a[1:]]
        for w in (b, c):
            beat(m, w, replicated=[x for x in done if by_block[x][0] == w],
                 failed=[first] if by_block[first][0] == w else [])
        for ino, bid, _ in on_a[1:]:
            assert sorted(locations(m, ino)) == sorted(
                {by_block[bid][0]} | {w for w in files[[f[1] for f in files].index(bid)][2]
                                      if w != a})
        # the failed one is planned again after the back-off, and then confirmed
        commands.clear()
        keep_alive(m, (b, c), lambda: any(cmd.block_id == first
                                          for cmds in commands.values() for cmd in cmds),
                   commands)
        target = next(w for w, cmds in commands.items() if any(x.block_id == first for x in cmds))
        beat(m, target, replicated=[first])
        assert keep_alive(m, (b, c), lambda: m.replication.status().under_replicated_blocks == 0)

        # a comes back: told to register again; its stale copies are not wanted any more
        assert beat(m, a).reregister
        m.register_worker(common_pb2.WorkerInfo(uuid="a", host_id="host-a",
                                                address="127.0.0.1:1001", data_dirs=["/d"]))
        m.block_report(master_pb2.BlockReportRequest(
            worker_id=a, block_ids=[bid for _, bid, _ in on_a], block_lengths=[MiB] * len(on_a)))
        assert a not in m.replication.status().lost_workers
        reply = beat(m, a)
        assert not reply.reregister
        assert sorted(reply.delete_block_ids) == sorted(bid for _, bid, _ in on_a)
        for ino, _, _ in files:
            assert len(locations(m, ino)) == 2
    finally:
        m.close()


def test_rejoin_readmits_when_short_and_extra_copies_are_deleted(tmp_path):
    m = make_master(tmp_path, replicas=2)
    try:
        a, b = add_worker(m, "a"), add_worker(m, "b")
        for w in (a, b):
            beat(m, w)
        ino, bid, locs = write_file(m, b"f")
        assert sorted(locs) == sorted([a, b])
        keep_alive(m, (b,), lambda: a in m.replication.status().lost_workers)
        assert locations(m, ino) == [b]
        # no third worker: nothing to copy to; the block stays under-replicated
        assert m.replication.status().under_replicated_inos == [ino]
        # a rejoins with its copy (a short copy would not do): a location again
        m.register_worker(common_pb2.WorkerInfo(uuid="a", host_id="host-a",
                                                address="127.0.0.1:1001", data_dirs=["/d"]))
        m.block_report(master_pb2.BlockReportRequest(worker_id=a, block_ids=[bid],
                                                     block_lengths=[MiB]))
        assert sorted(locations(m, ino)) == sorted([a, b])
        assert m.replication.status().under_replicated_blocks == 0
        # a late confirmation of a copy nobody needs: deleted, not a third location
        c = add_worker(m, "c")
        beat(m, c, replicated=[bid])
        assert sorted(locations(m, ino)) == sorted([a, b])
        assert list(beat(m, c).delete_block_ids) == [bid]
    finally:
        m.close()
    # the admitted location survives a restart (journal replay)
    m = make_master(tmp_path, replicas=2)
    try:
        assert sorted(locations(m, ino)) == sorted([a, b])
    finally:
        m.close()


def test_a_rejoin_within_the_grace_keeps_every_location_and_trims_extra_copies(tmp_path):
    """A lost worker keeps its locations for master.lost_grace: nothing is removed, its
    blocks are copied from the other replicas meanwhile (its own location not counted),
    and when it comes back within the grace the copy that is now one too many is
    dropped from it (journaled) and deleted there."""
    m = make_master(tmp_path, replicas=2)
    m.replication.lost_grace = 3600.0
    try:
        a, b, c = (add_worker(m, n) for n in ("a", "b", "c"))
        for w in (a, b, c):
            beat(m, w)
        files = [write_file(m, f"f{i}".encode()) for i in range(6)]
        on_a = [(ino, bid) for ino, bid, locs in files if a in locs]
        assert on_a, "placement never picked worker a"
        commands: dict[int, list] = {}
        keep_alive(m, (b, c), lambda: a in m.replication.status().lost_workers, commands)
        for ino, bid, locs in files:
            assert sorted(locations(m, ino)) == sorted(locs)  # kept: a pause is no loss
        # copies from the survivors (a's location does not count), confirmed
        keep_alive(m, (b, c), lambda: sum(len(v) for v in commands.values()) >= len(on_a),
                   commands)
        by_block = {cmd.block_id: w for w, cmds in commands.items() for cmd in cmds}
        assert set(by_block) == {bid for _, bid in on_a}
        for w in (b, c):
            beat(m, w, replicated=[x for x, t in by_block.items() if t == w])
        for ino, bid in on_a:
            assert sorted(locations(m, ino)) == sorted({a, by_block[bid]} | {
                x for x in files[[f[1] for f in files].index(bid)][2] if x != a})
        # a is back within the grace: its copies are one too many now
        m.register_worker(common_pb2.WorkerInfo(uuid="a", host_id="host-a",
                                                address="127.0.0.1:1001", data_dirs=["/d"]))
        m.block_report(master_pb2.BlockReportRequest(
            worker_id=a, block_ids=[bid for _, bid in on_a], block_lengths=[MiB] * len(on_a)))
        for ino, bid in on_a:
            assert a not in locations(m, ino) and len(locations(m, ino)) == 2
        assert sorted(beat(m, a).delete_block_ids) == sorted(bid for _, bid in on_a)
        assert m.replication.status().under_replicated_blocks == 0
    finally:
        m.close()


def test_a_file_whose_only_copy_is_on_a_lost_worker_stays_for_the_grace(tmp_path):
    m = make_master(tmp_path, replicas=1)
    m.replication.lost_grace = 1.5
    try:
        a, b = add_worker(m, "a"), add_worker(m, "b")
        for w in (a, b):
            beat(m, w)
        files = [write_file(m, f"f{i}".encode()) for i in range(8)]
        on_a = [ino for ino, _, locs in files if locs == [a]]
        assert on_a
        keep_alive(m, (b,), lambda: a in m.replication.status().lost_workers)
        lost_at = time.monotonic()
        for ino in on_a:
            assert locations(m, ino) == [a]  # still there: reads of it go nowhere yet
        # past the grace: dropped, and the files removed (a clean ENOENT)
        keep_alive(m, (b,), lambda: all(_gone(m, ino) for ino in on_a))
        assert time.monotonic() - lost_at >= 1.5
    finally:
        m.close()


def _gone(m, ino) -> bool:
    try:
        m.get_blocks(ino)
    except CurvineError:
        return True
    return False


def test_lost_only_replica_removes_file(tmp_path):
    m = make_master(tmp_path, replicas=1)
    try:
        a, b = add_worker(m, "a"), add_worker(m, "b")
        for w in (a, b):
            beat(m, w)
        files = [write_file(m, f"f{i}".encode()) for i in range(8)]
        keep_alive(m, (b,), lambda: a in m.replication.status().lost_workers)
        names = {e.name for e in m.listdir(ROOT_INO, b"", 0).entries}
        for i, (ino, bid, locs) in enumerate(files):
            name = f"f{i}".encode()
            if locs == [a]:
                assert name not in names
                with pytest.raises(CurvineError) as e:
                    m.lookup(ROOT_INO, name)
                assert e.value.kind == ErrorKind.NOT_FOUND
            else:
                assert name in names and locations(m, ino) == [b]
        assert any(locs == [a] for _, _, locs in files)
    finally:
        m.close()


# ---------------------------------------------------------------------- real processes
READER = textwrap.dedent('''
    """Read every file of a directory in a loop, compare digests; stop when told.

    After every file, the counts so far replace the progress file (the test waits on
    them); at the end they go to the out file with the first errors."""
    import hashlib, json, os, sys
    directory, digests_path, stop_path, out_path, progress_path = sys.argv[1:6]
    digests = json.load(open(digests_path))
    loops = reads = errors = wrong = 0
    first_errors = []

    def report(path, **extra):
        with open(path + ".tmp", "w") as f:
            json.dump({"loops": loops, "reads": reads, "errors": errors, "wrong": wrong,
                       **extra}, f)
        os.replace(path + ".tmp", path)

    while not os.path.exists(stop_path):
        for name, digest in digests.items():
            try:
                with open(os.path.join(directory, name), "rb") as f:
                    got = hashlib.sha256(f.read()).hexdigest()
                    # drop the kernel's copy: every loop must read from the workers,
                    # or a fast machine serves later loops from the page cache
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError as e:
                errors += 1
                if len(first_errors) < 5:
                    first_errors.append(f"{name}: {e}")
                continue
            reads += 1
            if got != digest:
                wrong += 1
                if len(first_errors) < 5:
                    first_errors.append(f"{name}: wrong bytes")
            report(progress_path)
        loops += 1
    report(out_path, first_errors=first_errors)
''')


def _conf(tmp_path, lost_after: str = "3s", lost_grace: str = "0s") -> str:
    """Short timers: a loss is declared in seconds and (lost_grace 0) its locations are
    dropped at once.  At the defaults (30 s, then a 10 minute grace) the drop cannot run
    in the suite; test_a_worker_paused_past_lost_after_loses_nothing shows the defaults."""
    path = tmp_path / "replicas.toml"
    path.write_text(f'[master]\nworker_lost_after = "{lost_after}"\n'
                    f'lost_grace = "{lost_grace}"\n'
                    f'[worker]\nheartbeat_interval = "0.3s"\n')
    return str(path)


def _write_files(directory: str, n: int, seed: int, lo: int = MiB, hi: int = 2 * MiB) -> dict:
    """n files of lo..hi random bytes, the LMCache way (.tmp, rename); name -> sha256."""
    import random
    rnd = random.Random(seed)
    digests = {}
    for i in range(n):
        data = rnd.randbytes(rnd.randrange(lo, hi))
        name = f"k{seed}-{i:03d}.data"
        tmp = os.path.join(directory, name[:-5] + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.rename(tmp, os.path.join(directory, name))
        digests[name] = hashlib.sha256(data).hexdigest()
    return digests


def _read_back(directory: str, digests: dict, what: str) -> None:
    for name, digest in digests.items():
        with open(os.path.join(directory, name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, f"{what}: {name} differs"


class _Meta:
    """Block locations and replication status straight from the master."""

    def __init__(self, c):
        from curvine.client.master.master_client import MasterClient
        from curvine.common.rpc import RpcClient
        from curvine.proto import master_pb2_grpc
        self.mc = MasterClient(c.master_addr, timeout=10, wait=10, security=c.security)
        self.rpc = RpcClient(c.master_addr, master_pb2_grpc.MasterStub, security=c.security,
                             timeout=10, wait=10)
        self.worker_ids = {}  # worker index -> worker id, by address
        addresses = {s["address"]: s["index"] for s in c.status() if s["role"] == "worker"}
        registered = []

        def mapped() -> bool:  # a worker may still be (re)registering on a busy machine
            registered[:] = self.rpc.call("StatFs", master_pb2.StatFsRequest()).workers
            for w in registered:
                if w.address in addresses:
                    self.worker_ids[addresses[w.address]] = w.worker_id
            return len(self.worker_ids) == len(addresses)

        deadline = time.monotonic() + 20
        while not mapped():
            if time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"workers {addresses} not all registered with the "
                                     f"master: {[(w.worker_id, w.address) for w in registered]}")
            time.sleep(0.1)

    def close(self):
        self.mc.close()
        self.rpc.close()

    def status(self) -> master_pb2.ReplicationStatusReply:
        return self.rpc.call("ReplicationStatus", master_pb2.ReplicationStatusRequest())

    def locations(self, dir_name: bytes, names) -> dict[str, list[list[int]]]:
        """name -> each block's worker ids (a missing name is left out)."""
        parent = self.mc.lookup(ROOT_INO, dir_name).ino
        out = {}
        for name in names:
            try:
                ino = self.mc.lookup(parent, name.encode()).ino
            except CurvineError as e:
                if e.kind == ErrorKind.NOT_FOUND:
                    continue
                raise
            _, blocks, _ = self.mc.get_blocks(ino)
            out[name] = [sorted(b.worker_ids) for b in blocks]
        return out

    def fully_replicated(self, dir_name: bytes, names, wanted: int, without=()) -> bool:
        locs = self.locations(dir_name, names)
        return len(locs) == len(names) and all(
            len(ws) == wanted and not set(ws) & set(without) for bl in locs.values() for ws in bl)


class _Reader:
    """A READER subprocess looping over ``digests`` in ``directory``."""

    def __init__(self, tmp_path, directory: str, digests: dict, tag: str):
        import json
        self.tag = tag
        self.paths = {k: str(tmp_path / f"{tag}.{k}")
                      for k in ("py", "digests", "stop", "out", "progress")}
        with open(self.paths["py"], "w") as f:
            f.write(READER)
        with open(self.paths["digests"], "w") as f:
            json.dump(digests, f)
        self.proc = subprocess.Popen([sys.executable, self.paths["py"], directory,
                                      *(self.paths[k] for k in
                                        ("digests", "stop", "out", "progress"))])

    def reads(self) -> int:
        """Files read so far (right or wrong bytes); fails if the reader died."""
        import json
        assert self.proc.poll() is None, f"{self.tag} exited with {self.proc.returncode}"
        try:
            with open(self.paths["progress"]) as f:
                return json.load(f)["reads"]
        except FileNotFoundError:
            return 0

    def wait_reads(self, n: int, what: str) -> None:
        wait_until(lambda: self.reads() >= n, 120, f"{self.tag}: {n} reads ({what})")

    def stop(self) -> dict:
        import json
        open(self.paths["stop"], "w").close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.tag} did not stop within 60 s") from None
        assert self.proc.returncode == 0, f"{self.tag} exited with {self.proc.returncode}"
        with open(self.paths["out"]) as f:
            return json.load(f)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _http_ports(c) -> dict[tuple[str, int], int]:
    import json
    with open(c.state_path) as f:
        return {(p["role"], p["index"]): p["http_port"] for p in json.load(f)["procs"]}


def _metric(port: int, name: str, **labels) -> float:
    """One sample of a daemon's /metrics page (0 if absent)."""
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def _open_block_files(c, pid: int) -> set[int]:
    """Indexes of the workers whose block files process ``pid`` has open now."""
    data = {i: os.path.join(c.base, "worker", str(i), "data", "blocks") + os.sep
            for i in range(c.n_workers)}
    fd_dir = f"/proc/{pid}/fd"
    found = set()
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:  # closed meanwhile
            continue
        found.update(i for i, prefix in data.items() if target.startswith(prefix))
    return found


_FAILOVER = re.compile(r"reading block [0-9a-f]{16} from worker (\d+) \([^)]*\) failed")


def _failovers(log_path: str, offset: int) -> dict[int, int]:
    """worker id -> failed block reads the FUSE client logged after byte ``offset``."""
    out: dict[int, int] = {}
    with open(log_path, "rb") as f:
        f.seek(offset)
        for line in f.read().decode(errors="replace").splitlines():
            m = _FAILOVER.search(line)
            if m:
                out[int(m.group(1))] = out.get(int(m.group(1)), 0) + 1
    return out


@pytest.mark.expect_log(LOST, DROPPED)  # a worker SIGKILLed on purpose
def test_reads_survive_worker_sigkill_and_rejoin(make_cluster, tmp_path):
    """replicas=2 on 2 workers: SIGKILL the worker both mounts read from while readers
    on both mounts (mount 0 short-circuit, mount 1 streaming from the workers) read 100
    files in a loop: no error, no wrong byte.  The victim is declared lost meanwhile
    (its locations dropped); once it is back its block report makes every file fully
    replicated again.

    Which replica a mount reads is the client's choice (file_reader._candidates: the
    order of the block's locations when all workers are on this host), so the test
    finds out instead of assuming: the workers' ReadBlock byte counters say whom mount
    1 streams from (mount 0 reads nothing remotely), /proc/<pid>/fd of mount 0's
    daemon shows whose block files it reads.  That worker is killed; mount 1 must
    then log failed reads from it (its failover ran), and both readers must read a
    whole loop once it is declared lost, and go on reading after it rejoined."""
    c = make_cluster(workers=2, mounts=2, replicas=2, conf=_conf(tmp_path),
                     short_circuit=[True, False])
    a, b = (os.path.join(m, "kv") for m in c.mounts)
    os.mkdir(a)
    t0 = time.monotonic()
    n = 100
    digests = _write_files(a, n, 1)
    print(f"wrote {n} files in {time.monotonic() - t0:.1f}s")
    ports = _http_ports(c)
    fuse0_pid = next(s["pid"] for s in c.status() if (s["role"], s["index"]) == ("fuse", 0))
    meta = _Meta(c)
    readers = []
    try:
        assert meta.fully_replicated(b"kv", digests, 2), "a file was written with < 2 replicas"
        readers = [_Reader(tmp_path, d, digests, f"reader on mount {i}")
                   for i, d in enumerate((a, b))]
        for r in readers:
            r.wait_reads(n, "a whole loop before the kill")

        # whom mount 1 streams from: only its reads reach the workers' ReadBlock
        assert _metric(ports[("fuse", 0)], "curvine_client_read_bytes_total",
                       path="remote") == 0, "mount 0 read remotely: not short-circuit"
        served = {i: _metric(ports[("worker", i)], "curvine_worker_read_bytes_total",
                             path="remote") for i in range(2)}
        v = max(served, key=served.get)
        print(f"bytes the workers streamed to mount 1 before the kill: {served}")
        assert served[v] > 0, "mount 1 read nothing from the workers"
        victim = meta.worker_ids[v]
        # ... and whose block files mount 0 reads (held open while a file is read)
        wait_until(lambda: v in _open_block_files(c, fuse0_pid), 30,
                   f"mount 0 reading a block file of worker {v}", interval=0.005)

        log1 = c.log_path("fuse", 1)
        log1_at_kill = os.path.getsize(log1)
        at_kill = [r.reads() for r in readers]
        c.kill("worker", v, sig=signal.SIGKILL)
        t_kill = time.monotonic()
        wait_until(lambda: victim in meta.status().lost_workers, 30, f"worker {v} declared lost")
        print(f"worker {v} declared lost {time.monotonic() - t_kill:.1f}s after SIGKILL; "
              f"reads meanwhile: {[r.reads() - k for r, k in zip(readers, at_kill)]}")
        assert all(victim not in ws for bl in meta.locations(b"kv", digests).values()
                   for ws in bl)
        # the readers go on with one replica per block: a whole loop each
        at_lost = [r.reads() for r in readers]
        for r, k in zip(readers, at_lost):
            r.wait_reads(k + n, "a whole loop after the victim was declared lost")
        failed = _failovers(log1, log1_at_kill)
        print(f"mount 1 logged failed block reads (worker id: count): {failed}")
        assert failed.get(victim, 0) > 0, (
            f"mount 1 never failed to read from worker {v} (id {victim}) after its SIGKILL: "
            f"its failover was not exercised ({failed})")
        assert set(failed) == {victim}, f"mount 1 failed reads from a live worker: {failed}"

        c.start("worker", v)
        t_back = time.monotonic()
        wait_until(lambda: meta.fully_replicated(b"kv", digests, 2), 30,
                   f"every file fully replicated after worker {v} rejoined")
        print(f"fully replicated {time.monotonic() - t_back:.1f}s after the restart")
        assert meta.status().under_replicated_blocks == 0
        # reads go on with the victim back (a whole loop of mount 1 follows: _read_back)
        at_back = [r.reads() for r in readers]
        for r, k in zip(readers, at_back):
            r.wait_reads(k + 10, "reads after the rejoin")
        results = [r.stop() for r in readers]
    finally:
        for r in readers:
            r.kill()
        meta.close()
    for i, r in enumerate(results):
        print(f"reader on mount {i}: {r}")
        assert r["errors"] == 0 and r["wrong"] == 0, f"mount {i}: {r['first_errors']}"
        assert r["reads"] >= 2 * n + 10
    _read_back(b, digests, "after the rejoin (remote reads)")


@pytest.mark.expect_log(LOST, DROPPED)  # a worker SIGKILLed on purpose
def test_lost_worker_blocks_copied_elsewhere(make_cluster, tmp_path):
    """replicas=2 on 3 workers: SIGKILL one for good; once it is declared lost every
    block that had a copy on it gets one on another worker, and all files read back
    (mount 1 streams from the workers)."""
    c = make_cluster(workers=3, mounts=2, replicas=2, conf=_conf(tmp_path),
                     short_circuit=[True, False])
    a, b = (os.path.join(m, "kv") for m in c.mounts)
    os.mkdir(a)
    digests = _write_files(a, 30, 2)
    meta = _Meta(c)
    try:
        assert meta.fully_replicated(b"kv", digests, 2)
        victim = meta.worker_ids[1]
        on_victim = [n for n, bl in meta.locations(b"kv", digests).items()
                     if any(victim in ws for ws in bl)]
        assert on_victim, "no block was placed on worker 1"
        c.kill("worker", 1, sig=signal.SIGKILL)
        t_kill = time.monotonic()
        wait_until(lambda: victim in meta.status().lost_workers, 30, "worker 1 declared lost")
        t_lost = time.monotonic()
        wait_until(lambda: meta.fully_replicated(b"kv", digests, 2, without=[victim]), 60,
                   "every block copied to a live worker")
        print(f"{len(on_victim)} files had a block on worker 1; lost after "
              f"{t_lost - t_kill:.1f}s, re-replicated {time.monotonic() - t_lost:.1f}s later")
        assert meta.status().under_replicated_blocks == 0
    finally:
        meta.close()
    _read_back(b, digests, "after re-replication (remote reads)")
    _read_back(a, digests, "after re-replication (short-circuit reads)")


@pytest.mark.expect_log(LOST, DROPPED)  # a worker SIGKILLed on purpose
def test_single_replica_files_vanish_with_their_worker(make_cluster, tmp_path):
    """replicas=1: SIGKILL a worker for good; once it is declared lost, files whose
    block was only there are a clean ENOENT on every mount and gone from listings;
    every other name reads back intact (no EIO on a name that still exists)."""
    c = make_cluster(workers=2, mounts=2, replicas=1, conf=_conf(tmp_path),
                     short_circuit=[True, False])
    a, b = (os.path.join(m, "kv") for m in c.mounts)
    os.mkdir(a)
    digests = _write_files(a, 40, 3, lo=256 * 1024, hi=MiB)
    for name in digests:  # mount 1 has looked the names up (and may hold leases on them)
        os.stat(os.path.join(b, name))
    meta = _Meta(c)
    try:
        victim = meta.worker_ids[0]
        locs = meta.locations(b"kv", digests)
        gone = sorted(n for n, bl in locs.items() if all(ws == [victim] for ws in bl))
        assert gone and len(gone) < len(digests), f"placement: {locs}"
        c.kill("worker", 0, sig=signal.SIGKILL)
        wait_until(lambda: victim in meta.status().lost_workers, 30, "worker 0 declared lost")
    finally:
        meta.close()
    for m in (a, b):
        listing = set(os.listdir(m))
        assert not listing & set(gone), f"{m}: lost files still listed"
        assert listing == set(digests) - set(gone)
        for name in gone:
            with pytest.raises(FileNotFoundError):
                os.stat(os.path.join(m, name))
            with pytest.raises(FileNotFoundError):
                open(os.path.join(m, name), "rb")
        for name in listing:  # every name that exists reads back whole
            with open(os.path.join(m, name), "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == digests[name], name
    print(f"{len(gone)} of {len(digests)} files vanished with worker 0")


@pytest.mark.expect_log(LOST)  # a worker stopped on purpose
def test_a_worker_paused_past_lost_after_loses_nothing(make_cluster):
    """At the default settings (worker_lost_after 30 s, lost_grace 10 min, one
    replica): a worker SIGSTOPped for 40 s is declared lost (new blocks go elsewhere)
    but no file is removed, and when it continues every file reads back whole.
    Before: the 30 s loss removed every file whose only copy it held, and its blocks
    were deleted when it came back."""
    c = make_cluster(workers=2, mounts=1)
    d = os.path.join(c.mounts[0], "kv")
    os.mkdir(d)
    digests = _write_files(d, 30, 11, lo=256 * 1024, hi=MiB)
    meta = _Meta(c)
    try:
        victim = meta.worker_ids[1]
        on_victim = [n for n, bl in meta.locations(b"kv", digests).items()
                     if any(victim in ws for ws in bl)]
        assert on_victim, "placement never picked worker 1"
        pid = next(r["pid"] for r in c.status() if r["role"] == "worker" and r["index"] == 1)
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            wait_until(lambda: victim in meta.status().lost_workers, 60,
                       "worker 1 declared lost")
            # new files are placed on the live worker only, and every name stays
            more = _write_files(d, 5, 12, lo=256 * 1024, hi=MiB)
            assert all(ws == [meta.worker_ids[0]]
                       for bl in meta.locations(b"kv", more).values() for ws in bl)
            assert set(os.listdir(d)) == set(digests) | set(more)
            # the connector: a file only on the lost worker is a miss at once (no
            # read that waits for it), the others hits
            from curvine.connector.store import KVStore
            with KVStore.open(c.client_conf, "/kv") as kv:
                only = [n for n in on_victim
                        if all(ws == [victim] for ws in meta.locations(b"kv", [n])[n])]
                elsewhere = sorted(set(digests) - set(on_victim))[:3]
                got = kv.lookup_quietly(only + elsewhere)
                assert got[:len(only)] == [None] * len(only)
                assert all(e is not None for e in got[len(only):])
            time.sleep(max(0.0, 40 - (time.monotonic() - stopped)))
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: victim not in meta.status().lost_workers, 60,
                   "worker 1 back")
    finally:
        meta.close()
    digests.update(more)
    assert set(os.listdir(d)) == set(digests)
    for name, digest in digests.items():
        with open(os.path.join(d, name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, name
    print(f"{len(on_victim)} files had a block on the paused worker; none lost")
