"""The connector's core, ``curvine.connector.store.KVStore``, on a real local cluster,
without LMCache: whole files by name published in one step, read into the caller's
buffers.

Blocks are 1 MiB here (``cluster.block_size`` in the cluster's config), so a few MiB
span several blocks and every read or write crosses block boundaries.  The checks:
byte-exact round trips through gather (put) and scatter (get) buffers, at offsets
that start and end inside and on block boundaries, by short-circuit (the worker's
socket) and over gRPC; a put of an existing name returns False and writes nothing; a
put that fails leaves neither a name nor a block file; a prompt's 4096 names cost
ONE LookupMany (the master's ``curvine_rpc_server_handled_total``); a master killed
with SIGKILL turns lookups into misses (no exception) until it is back.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time

import pytest

from cluster_util import master_calls, wait_for
from curvine.common.errors import CurvineError
from curvine.common.ids import MIB
from curvine.connector.store import KVStore

BLOCK = MIB
NS = "/kv"


def _conf(tmp_path, **extra) -> str:
    """A cluster config with 1 MiB blocks (and ``extra`` lines per section)."""
    path = tmp_path / "curvine.toml"
    text = '[cluster]\nblock_size = "1MiB"\n'
    for section, lines in extra.items():
        text += f"[{section}]\n" + "".join(f"{line}\n" for line in lines)
    path.write_text(text)
    return str(path)


def block_files(c) -> list[str]:
    """Every finalised block file of every worker of ``c``."""
    out = []
    for i in range(c.n_workers):
        root = os.path.join(c.base, "worker", str(i), "data", "blocks")
        for d, _, files in os.walk(root):
            out += [os.path.join(d, f) for f in files]
    return out


def staging_files(c) -> list[str]:
    out = []
    for i in range(c.n_workers):
        d = os.path.join(c.base, "worker", str(i), "data", "staging")
        if os.path.isdir(d):
            out += os.listdir(d)
    return out


def read_all(kv: KVStore, names: list[str]) -> list[bytes | None]:
    """Each name's bytes through ``kv`` (one lookup for all), None for a miss."""
    out = []
    for e in kv.lookup(names):
        if e is None:
            out.append(None)
            continue
        buf = bytearray(e.size)
        assert kv.get_into(e, [buf]) == e.size
        out.append(bytes(buf))
    return out


@pytest.fixture
def kv_cluster(make_cluster, tmp_path):
    return make_cluster(workers=2, mounts=0, conf=_conf(tmp_path))


def _split(data: bytes, cuts: list[int]) -> list:
    """``data`` as a gather list of mixed buffer types cut at ``cuts``."""
    view = memoryview(data)
    edges = [0, *cuts, len(data)]
    kinds = [bytes, bytearray, lambda v: v]
    return [kinds[i % 3](view[a:b]) for i, (a, b) in enumerate(zip(edges, edges[1:]))]


def test_put_and_get_are_byte_exact_across_blocks_buffers_and_offsets(kv_cluster):
    c = kv_cluster
    size = 3 * BLOCK + 12345  # 4 blocks, the last one partial
    data = os.urandom(size)
    with KVStore.open(c.client_conf, NS) as kv, \
            KVStore.open(c.client_conf, NS, short_circuit=False) as remote:
        assert kv.sockets is not None, "the cluster's client config names the workers' sockets"
        # gather: pieces that end inside blocks, on a block boundary, and an empty one
        pieces = _split(data, [100, BLOCK, BLOCK, 2 * BLOCK + 7, 3 * BLOCK - 1])
        assert sum(len(p) for p in pieces) == size
        assert kv.put("a.data", pieces) is True
        [entry] = kv.lookup(["a.data"])
        assert entry is not None and entry.size == size
        assert [b.length for b in entry.blocks] == [BLOCK, BLOCK, BLOCK, 12345]

        for store in (kv, remote):
            [e] = store.lookup(["a.data"])
            # scatter: the whole file into odd-sized buffers of two kinds
            bufs = [bytearray(1), bytearray(BLOCK - 1), memoryview(bytearray(BLOCK + 3)),
                    bytearray(size)]  # the last one larger than what is left
            assert store.get_into(e, bufs) == size
            assert b"".join(bytes(b) for b in bufs)[:size] == data
            # offsets and lengths inside blocks, on boundaries, across several blocks,
            # past the end
            for offset, length in [(0, 1), (1, BLOCK), (BLOCK - 1, 2), (BLOCK, BLOCK),
                                   (BLOCK + 7, 2 * BLOCK), (size - 3, 3), (size - 3, 100),
                                   (3 * BLOCK, 12345), (size, 10), (size + 10, 10)]:
                a, b = bytearray(length // 2), bytearray(length - length // 2)
                n = store.get_into(e, [a, b], offset=offset)
                want = data[offset:offset + length]
                assert n == len(want), (offset, length)
                assert (bytes(a) + bytes(b))[:n] == want, (offset, length)
        assert kv.stats["short_circuit_blocks"] > 0 and kv.stats["remote_blocks"] == 0
        assert remote.stats["remote_blocks"] > 0 and remote.stats["short_circuit_blocks"] == 0

        # a put over gRPC only (no socket) reads back the same through the socket
        data2 = os.urandom(2 * BLOCK)
        assert remote.put("b.data", [data2[:5], data2[5:]]) is True
        [e2] = kv.lookup(["b.data"])
        out = bytearray(len(data2))
        assert kv.get_into(e2, [out]) == len(data2) and bytes(out) == data2
        assert sorted(kv.list()) == ["a.data", "b.data"]
        assert kv.list(".none") == []


def test_put_of_an_existing_name_returns_false_and_writes_nothing(kv_cluster):
    c = kv_cluster
    first, second = os.urandom(2 * BLOCK + 1), os.urandom(2 * BLOCK + 1)
    with KVStore.open(c.client_conf, NS) as kv:
        assert kv.put("k.data", [first]) is True
        before = sorted(block_files(c))
        assert len(before) == 3
        blocks_added = master_calls(c, "AddBlock")
        assert kv.put("k.data", [second]) is False
        assert kv.put_quietly("k.data", [second]) is False
        # the master said "exists" on the first AddBlock: nothing allocated or written
        assert master_calls(c, "AddBlock") - blocks_added == 2
        assert sorted(block_files(c)) == before and staging_files(c) == []
        [e] = kv.lookup(["k.data"])
        out = bytearray(len(first))
        assert kv.get_into(e, [out]) == len(first) and bytes(out) == first
        assert kv.stats["put_existed"] == 2 and kv.stats["puts"] == 1
        assert kv.remove("k.data") is True and kv.remove("k.data") is False
        assert kv.lookup(["k.data"]) == [None]


@pytest.mark.expect_log(r"WARNING curvine\.master\.cluster\.capacity: pool above the high watermark \(\d+ of \d+ bytes\) but no file to evict")  # the pool is filled on purpose
def test_a_put_that_fails_when_the_pool_is_full_leaves_no_name_and_no_blocks(
        make_cluster, tmp_path):
    # 3 MiB per worker: the first blocks of an 8 MiB put are written, then none fits
    c = make_cluster(workers=2, mounts=0, conf=_conf(tmp_path), worker_capacity=3 * MIB)
    with KVStore.open(c.client_conf, NS) as kv:
        kv.directory()
        with pytest.raises(CurvineError):
            kv.put("big.data", [os.urandom(8 * MIB)])
        assert kv.lookup(["big.data"]) == [None]
        assert kv.list() == []
        # the blocks it wrote are deleted (bounded: the delete is immediate, the
        # workers' sweep of staging files is not needed)
        wait_for(lambda: not block_files(c) and not staging_files(c), timeout=30,
                 what=f"the failed put's blocks to go: {block_files(c)} {staging_files(c)}")
        assert kv.put_quietly("big.data", [os.urandom(8 * MIB)]) is None  # quietly: None
        wait_for(lambda: not block_files(c), timeout=30, what="the blocks to go again")
        # what fits is stored again once the master has seen the deletes (bounded:
        # the workers report them within seconds, not after PUT_BLOCK_TTL)
        small = os.urandom(BLOCK + 5)
        assert wait_for(lambda: kv.put_quietly("small.data", [small]), timeout=30,
                        interval=0.2, what="a put that fits after the failed ones") is True
        [e] = kv.lookup(["small.data"])
        out = bytearray(len(small))
        assert kv.get_quietly(e, [out]) == len(small) and bytes(out) == small


def test_a_put_with_every_worker_down_fails_and_leaves_no_name(kv_cluster):
    c = kv_cluster
    with KVStore.open(c.client_conf, NS) as kv:
        kv.directory()
        for i in range(c.n_workers):
            c.kill("worker", i, signal.SIGKILL)
        t0 = time.monotonic()
        assert kv.put_quietly("x.data", [os.urandom(2 * BLOCK)]) is None
        assert time.monotonic() - t0 < 120  # bounded, whatever the deadlines are
        assert kv.lookup(["x.data"]) == [None] and kv.list() == []
        for i in range(c.n_workers):
            c.start("worker", i)
        assert block_files(c) == [] and staging_files(c) == []
        data = os.urandom(2 * BLOCK)
        assert kv.put("x.data", [data]) is True
        [e] = kv.lookup(["x.data"])
        out = bytearray(len(data))
        assert kv.get_into(e, [out]) == len(data) and bytes(out) == data


def test_a_prompt_of_4096_names_is_one_lookup_many(kv_cluster):
    c = kv_cluster
    with KVStore.open(c.client_conf, NS) as kv:
        present = {7: b"seven", 100: b"hundred" * 1000, 4095: os.urandom(BLOCK + 1)}
        names = [f"model@1@0@{i:064x}@bfloat16.data" for i in range(4096)]
        for i, data in present.items():
            assert kv.put(names[i], [data]) is True
        many, single = master_calls(c, "LookupMany"), master_calls(c, "Lookup")
        entries = kv.lookup(names)
        assert master_calls(c, "LookupMany") - many == 1
        assert master_calls(c, "Lookup") - single == 0
        assert [i for i, e in enumerate(entries) if e is not None] == sorted(present)
        for i, data in present.items():
            out = bytearray(len(data))
            assert kv.get_into(entries[i], [out]) == len(data) and bytes(out) == data
        many = master_calls(c, "LookupMany")
        assert kv.exists_many(names) == [i in present for i in range(4096)]
        assert kv.prefix_hits(names) == 0
        assert kv.prefix_hits([names[7], names[100], names[0], names[4095]]) == 2
        assert master_calls(c, "LookupMany") - many == 3
        assert kv.lookup([]) == []


@pytest.mark.expect_log(r"curvine-worker\[\d+\] WARNING __main__: master \S+ unavailable \(UNAVAILABLE")  # the master is SIGKILLed on purpose
def test_lookups_are_misses_while_the_master_is_killed_and_work_after_its_restart(kv_cluster):
    c = kv_cluster
    data = os.urandom(2 * BLOCK + 3)
    digest = hashlib.sha256(data).hexdigest()
    with KVStore.open(c.client_conf, NS) as kv:
        assert kv.put("m.data", [data]) is True
        [entry] = kv.lookup(["m.data"])
        assert entry is not None
        c.kill("master", 0, signal.SIGKILL)
        t0 = time.monotonic()
        assert kv.lookup_quietly(["m.data", "n.data"]) == [None, None]
        assert kv.exists_many(["m.data"]) == [False]
        assert kv.prefix_hits(["m.data"]) == 0
        assert time.monotonic() - t0 < 60  # misses, not a wait for the master
        # an entry looked up before the outage still reads: the workers and the
        # block tokens do not need the master
        out = bytearray(len(data))
        assert kv.get_quietly(entry, [out]) == len(data)
        assert hashlib.sha256(out).hexdigest() == digest
        assert kv.put_quietly("n.data", [b"x"]) is None
        c.start("master", 0)
        # after the restart (and the workers' re-registration) the same store finds it
        found = wait_for(lambda: kv.lookup_quietly(["m.data"])[0], timeout=60,
                         what="a lookup after the master's restart")
        out = bytearray(len(data))
        assert kv.get_quietly(found, [out]) == len(data)
        assert hashlib.sha256(out).hexdigest() == digest
        assert wait_for(lambda: kv.put_quietly("n.data", [b"x"]), timeout=60,
                        what="a put after the restart") is True


def test_a_dead_worker_among_live_ones_is_logged_once(kv_cluster, caplog):
    c = kv_cluster
    with KVStore.open(c.client_conf, NS) as kv:
        # "good" only on worker 0, "bad" only on worker 1
        c.kill("worker", 1, signal.SIGKILL)
        assert kv.put("good.data", [b"g" * 1000]) is True
        c.start("worker", 1)
        c.kill("worker", 0, signal.SIGKILL)
        # worker 1 is registered again, but this client's channel to it may still be in
        # its reconnect backoff (up to 1 s, common/rpc.py): a put then fails as a whole
        # and leaves nothing, so it can simply be tried again
        assert wait_for(lambda: kv.put_quietly("bad.data", [b"b" * 1000]) is True,
                        timeout=30, what="bad.data stored on the restarted worker")
        c.start("worker", 0)
        good, bad = kv.lookup(["good.data", "bad.data"])
        assert {w.address for w in good.workers.values()} != \
            {w.address for w in bad.workers.values()}
        # both readable once the restarted workers serve again (a read during a
        # restart is a failure of its own, logged once)
        for e in (good, bad):
            assert wait_for(lambda: kv.get_quietly(e, [bytearray(1000)]) == 1000,
                            timeout=30, what=f"{e.name} readable")
        caplog.clear()
        c.kill("worker", 1, signal.SIGKILL)
        caplog.set_level("WARNING", logger="curvine.connector")
        for _ in range(3):
            assert kv.get_quietly(bad, [bytearray(1000)]) is None
            assert kv.get_quietly(good, [bytearray(1000)]) == 1000
        dead = {w.address for w in bad.workers.values()}.pop()
        # the dead worker's outage: one line, however many good reads of the other
        # come in between (a pooled connection of the restarted one may also fail once;
        # that is its own outage, not counted here)
        warned = [r for r in caplog.records
                  if "failing" in r.getMessage() and dead in r.getMessage()]
        assert len(warned) == 1, [r.getMessage()[:80] for r in warned]


def test_a_prompt_of_more_than_4096_names_is_looked_up_in_batches(kv_cluster):
    c = kv_cluster
    with KVStore.open(c.client_conf, NS) as kv:
        names = [f"m@1@0@{i:064x}@bfloat16.data" for i in range(5000)]
        for i in (0, 4096, 4999):
            assert kv.put(names[i], [b"x"]) is True
        entries = kv.lookup_quietly(names)
        assert [i for i, e in enumerate(entries) if e is not None] == [0, 4096, 4999]


# -- failing open, and every read checked (issue 32) ----------------------------------

FAIL_OPEN = 2.0  # client.fail_open_timeout's default
SLACK = 1.5  # a loaded 2-core machine: scheduling, not waiting


def _timed(fn):
    t0 = time.monotonic()
    out = fn()
    return out, time.monotonic() - t0


@pytest.mark.expect_log(r"the master stalled for")  # it was stopped, on purpose
def test_quiet_calls_return_within_the_fail_open_bound_while_the_master_is_stopped(
        kv_cluster):
    """A stopped master (SIGSTOP: connections are accepted by its kernel, never
    answered) costs each quiet call at most client.fail_open_timeout (default), and
    during the outage later calls are misses at once; a store opened during the stall
    answers within the bound too.  Before: 35 s for the second lookup, 50 s for a put,
    120 s for a new store's first lookup."""
    c = kv_cluster
    pid = next(r["pid"] for r in c.status() if r["role"] == "master")
    with KVStore.open(c.client_conf, NS) as kv:
        assert kv.put("here.data", [b"h" * 1000]) is True
        os.kill(pid, signal.SIGSTOP)
        try:
            for what, call, miss in [
                    ("lookup", lambda: kv.lookup_quietly(["here.data", "x.data"]), [None, None]),
                    ("lookup again", lambda: kv.lookup_quietly(["here.data"]), [None]),
                    ("put", lambda: kv.put_quietly("new.data", [b"n" * 1000]), None)]:
                got, took = _timed(call)
                assert got == miss, what
                assert took < FAIL_OPEN + SLACK, (what, took)
            time.sleep(FAIL_OPEN)  # the outage's probe is due: one call tries again
            got, took = _timed(lambda: kv.lookup_quietly(["here.data"]))
            assert got == [None] and took < FAIL_OPEN + SLACK, took
            with KVStore.open(c.client_conf, NS) as fresh:
                got, took = _timed(lambda: fresh.lookup_quietly(["here.data"]))
                assert got == [None] and took < FAIL_OPEN + SLACK, took
        finally:
            os.kill(pid, signal.SIGCONT)
        found = wait_for(lambda: kv.lookup_quietly(["here.data"])[0], timeout=30,
                         what="a lookup once the master runs again")
        assert found.size == 1000


def test_a_read_from_a_stopped_worker_is_a_miss_within_the_fail_open_bound(kv_cluster):
    c = kv_cluster
    with KVStore.open(c.client_conf, NS, short_circuit=False) as kv:
        assert kv.put("w.data", [os.urandom(1000)]) is True
        [entry] = kv.lookup(["w.data"])
        [wid] = entry.blocks[0].worker_ids
        index = next(r["index"] for r in c.status() if r["role"] == "worker"
                     and r["address"] == entry.workers[wid].address)
        pid = next(r["pid"] for r in c.status() if r["role"] == "worker"
                   and r["index"] == index)
        os.kill(pid, signal.SIGSTOP)
        try:
            for _ in range(2):
                got, took = _timed(lambda: kv.get_quietly(entry, [bytearray(1000)]))
                assert got is None and took < FAIL_OPEN + SLACK, took
            got, took = _timed(lambda: kv.put_quietly("w2.data", [b"x" * 1000]))
            assert took < FAIL_OPEN + SLACK, took
        finally:
            os.kill(pid, signal.SIGCONT)
        assert wait_for(lambda: kv.get_quietly(entry, [bytearray(1000)]) == 1000,
                        timeout=30, what="the worker read again")


@pytest.mark.parametrize("short_circuit", [True, False], ids=["short-circuit", "remote"])
@pytest.mark.expect_log(r"WARNING curvine\.worker\.blockstore: block [0-9a-f]+: the copy here is not intact", r"WARNING curvine\.master\.cluster\.replication: worker \d+ found \d+ copies not intact")  # planted on purpose: the worker finds and removes it
def test_partial_reads_of_a_planted_block_fail_like_whole_ones(make_cluster, tmp_path,
                                                                short_circuit):
    """A block file overwritten in place on the worker's disk: a read of any part of
    it (4 KiB, from an offset to the end, a header alone) is a miss, as a whole read
    is, never the planted bytes.  Before, only a read reaching the block's end from
    an offset of at most 64 KiB was checked."""
    c = make_cluster(workers=1, mounts=0, conf=_conf(tmp_path))
    data = os.urandom(BLOCK)
    with KVStore.open(c.client_conf, NS, short_circuit=short_circuit) as kv:
        assert kv.put("p.data", [data]) is True
        [entry] = kv.lookup(["p.data"])
        out = bytearray(4096)
        assert kv.get_into(entry, [out], 200_000) == 4096 and out == data[200_000:204_096]
        [path] = block_files(c)
        with open(path, "r+b") as f:
            f.seek(200_000)
            f.write(b"planted!")
        for offset, n in [(200_000, 4096), (100_000, BLOCK - 100_000), (0, 64),
                          (0, BLOCK)]:
            assert kv.get_quietly(entry, [bytearray(n)], offset) is None, (offset, n)
            with pytest.raises(CurvineError):
                kv.get_into(entry, [bytearray(n)], offset)


def test_names_no_file_can_have_and_bad_offsets_are_answered_not_raised(kv_cluster, caplog):
    c = kv_cluster
    with KVStore.open(c.client_conf, NS) as kv:
        assert kv.put("fine.data", [b"f"]) is True
        bad = ["lone\udc80surrogate.data", "a/b.data", "x" * 300, ""]
        caplog.set_level("INFO", logger="curvine.connector")
        # one bad name does not turn the batch into misses
        got = kv.lookup_quietly([*bad, "fine.data"])
        assert got[:4] == [None] * 4 and got[4] is not None
        for name in bad:
            assert kv.put_quietly(name, [b"x"]) is None
        assert not [r for r in caplog.records if "failing" in r.getMessage()]
        assert kv.lookup_quietly(["fine.data"])[0] is not None  # no outage
        [entry] = kv.lookup(["fine.data"])
        with pytest.raises(CurvineError) as e:
            kv.get_into(entry, [bytearray(10)], -5)
        assert e.value.kind.name == "INVALID"


def test_a_lookup_past_the_masters_reply_limit_asks_again_for_the_rest(kv_cluster):
    """The master answers a LookupMany's names in order within master.lookup_reply_max
    (4 MiB); a prompt of small files kept inline (200 KiB each, their bytes in the
    reply) needs more: the connector asks again from where the reply ended, and every
    name is found (before, the names past the cut were misses)."""
    from curvine.client.files.fs import CurvineFS
    from curvine.common import config as config_mod

    c = kv_cluster
    names = [f"small{i:03d}.data" for i in range(40)]
    with CurvineFS(cfg=config_mod.load(c.client_conf)) as fs:
        fs.mkdir(NS, parents=True)
        for n in names:
            fs.write_bytes(f"{NS}/{n}", n.encode() * (200 * 1024 // len(n)))
    many = master_calls(c, "LookupMany")
    with KVStore.open(c.client_conf, NS) as kv:
        entries = kv.lookup(names)
        assert all(e is not None for e in entries), [n for n, e in zip(names, entries) if e is None]
        assert master_calls(c, "LookupMany") - many >= 2  # 8 MB of bytes: two replies at least
        out = bytearray(entries[-1].size)
        assert kv.get_into(entries[-1], [out]) == len(out) and out.startswith(names[-1].encode())
