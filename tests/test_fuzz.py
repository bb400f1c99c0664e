"""Property-based fuzzing (hypothesis) of what reads untrusted bytes or fields.

1. The journal decoder, fed random bytes and mutated valid segments: opening either
   succeeds with a prefix of the records written (a torn tail is cut) or raises
   JournalCorruption; nothing else.  Record payloads that do not parse raise
   DecodeError only.
2. Every unary master RPC handler, in-process on a real Master, with requests built
   from the request descriptors out of hostile values (names with '/', NUL, empty,
   over 255 bytes; ino 0 and 2^64-1; huge offsets, lengths, sizes): a CurvineError or
   success, never another exception, and a rejected request changes neither LMDB nor
   the journal.
3. Every worker handler, in-process on a real BlockStore, the same way.

The default runs are bounded and derandomized (CI-stable, a few seconds each);
``-m slow`` runs many more examples.
"""

from __future__ import annotations

import os
import re
import tempfile
import zlib
from collections import Counter

import pytest
from google.protobuf import descriptor as pb_descriptor
from google.protobuf import message as pb_message
from google.protobuf import message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from curvine.common.errors import CurvineError, ErrorKind
from curvine.common.ids import ROOT_INO, new_request_id
from curvine.journal import Journal, JournalCorruption
from curvine.journal.segment import encode_frame, encode_header, segment_name
from curvine.master.ports.service import MasterServicer
from curvine.proto import common_pb2, journal_pb2, master_pb2, worker_pb2
from curvine.worker.blockstore import BlockStore
from curvine.worker.service import UNCHECKED, WorkerServicer

from test_master import add_worker, create, make_master, mkdir, publish

FAST = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
LONG = settings(max_examples=2000, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

# -------------------------------------------------------------- journal decoder

RECORDS = [(1 + i % 7, bytes([i]) * (i * 13 % 50)) for i in range(12)]


def _valid_segment() -> bytes:
    data = encode_header(1)
    for seq, (typ, payload) in enumerate(RECORDS, start=1):
        data += encode_frame(seq, typ, payload)
    return data


VALID = _valid_segment()


def _open_segment(data: bytes) -> list[tuple[int, int, bytes]] | None:
    """Write ``data`` as a journal's only segment and open it: the records it yields,
    or None when it raised JournalCorruption.  Any other exception fails the test."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, segment_name(1)), "wb") as f:
            f.write(data)
        try:
            j = Journal(d, fsync=False)
        except JournalCorruption:
            return None
        with j:
            return [(r.seq, r.type, r.payload) for r in j.records(0)]


def _check_prefix(got):
    if got is not None:
        want = [(s, t, p) for s, (t, p) in enumerate(RECORDS, start=1)]
        assert got == want[:len(got)], "a damaged segment yielded records never written"


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, len(VALID) - 1), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, len(VALID) - 1), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, len(VALID)), st.integers(0, 255)),
    st.tuples(st.just("zero"), st.integers(0, len(VALID) - 1), st.integers(1, 64)),
)


def _mutate(data: bytes, mutations) -> bytes:
    b = bytearray(data)
    for op, at, arg in mutations:
        at = min(at, max(len(b) - 1, 0))
        if not b:
            break
        if op == "flip":
            b[at] ^= arg
        elif op == "cut":
            del b[at:]
        elif op == "insert":
            b[at:at] = bytes([arg])
        else:
            b[at:at + arg] = bytes(len(b[at:at + arg]))
    return bytes(b)


def _journal_random_bytes(data):
    _check_prefix(_open_segment(data))
    _check_prefix(_open_segment(VALID[:20] + data))  # a valid header, garbage frames


def _journal_mutated(mutations):
    _check_prefix(_open_segment(_mutate(VALID, mutations)))


def _journal_payload(data):
    try:
        journal_pb2.JournalEntry.FromString(data)
    except pb_message.DecodeError:
        pass


@FAST
@given(st.binary(max_size=300))
def test_journal_random_bytes(data):
    _journal_random_bytes(data)


@FAST
@given(st.lists(mutation, min_size=1, max_size=4))
def test_journal_mutated_segment(mutations):
    _journal_mutated(mutations)


@FAST
@given(st.binary(max_size=200))
def test_journal_record_payload(data):
    _journal_payload(data)


def test_journal_unmutated_segment_reads_back():
    """The property above cannot pass vacuously: the valid segment yields every record."""
    assert len(_open_segment(VALID)) == len(RECORDS)


@pytest.mark.slow
@LONG
@given(st.binary(max_size=2000), st.lists(mutation, min_size=1, max_size=8))
def test_journal_fuzz_long(data, mutations):
    _journal_random_bytes(data)
    _journal_mutated(mutations)
    _journal_payload(data)


# ------------------------------------------------------------ request generation

U64 = [0, 1, 2, 3, ROOT_INO, 1000, (1 << 31), (1 << 32) + 1, (1 << 63) - 1, 1 << 63,
       (1 << 64) - 1]
I64 = [0, 1, -1, -(1 << 63), (1 << 63) - 1]
U32 = [0, 1, 0o777, 0o7777, 1 << 31, (1 << 32) - 1]
I32 = [0, 1, -1, -(1 << 31), (1 << 31) - 1]
NAMES = [b"", b"a", b"f", b"d", b".", b"..", b"a/b", b"/", b"a\0b", b"\0", b"x" * 255,
         b"x" * 256, b"\xff\xfe", "é".encode()]
STRINGS = ["", "a", "/etc/passwd", "../../x", "\x00", "x" * 300, "127.0.0.1:1", "h1"]
_T = pb_descriptor.FieldDescriptor
FIELD_FIRST = re.compile(r"[a-z_][a-z_0-9.\[\]]*: ")  # "parent: ...", "blocks[2].length: ..."


def _scalar(field) -> st.SearchStrategy:
    t = field.type
    if t in (_T.TYPE_UINT64, _T.TYPE_FIXED64):
        return st.one_of(st.sampled_from(U64), st.integers(0, (1 << 64) - 1))
    if t in (_T.TYPE_INT64, _T.TYPE_SINT64, _T.TYPE_SFIXED64):
        return st.one_of(st.sampled_from(I64), st.integers(-(1 << 63), (1 << 63) - 1))
    if t in (_T.TYPE_UINT32, _T.TYPE_FIXED32):
        return st.sampled_from(U32)
    if t in (_T.TYPE_INT32, _T.TYPE_SINT32, _T.TYPE_SFIXED32):
        return st.sampled_from(I32)
    if t == _T.TYPE_BOOL:
        return st.booleans()
    if t in (_T.TYPE_DOUBLE, _T.TYPE_FLOAT):
        return st.sampled_from([0.0, -1.0, 1e300, float("inf"), float("nan")])
    if t == _T.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values] + [99])
    if t == _T.TYPE_BYTES:
        if field.name == "request_id":
            return st.sampled_from([b"", b"r" * 16]).map(
                lambda b: new_request_id() if b else b)
        return st.one_of(st.sampled_from(NAMES), st.binary(max_size=20))
    if t == _T.TYPE_STRING:
        return st.one_of(st.sampled_from(STRINGS), st.text(max_size=10))
    raise AssertionError(f"no strategy for {field.full_name}")


def message_strategy(desc, depth: int = 0) -> st.SearchStrategy:
    """Messages of type ``desc`` with every field set to a hostile or plain value (or
    left unset)."""
    cls = message_factory.GetMessageClass(desc)
    fields = {}
    for f in desc.fields:
        if f.type == _T.TYPE_MESSAGE:
            if depth >= 2 or f.message_type.GetOptions().map_entry:
                continue
            one = message_strategy(f.message_type, depth + 1)
        else:
            one = _scalar(f)
        if f.is_repeated:
            fields[f.name] = st.lists(one, max_size=3)
        else:
            fields[f.name] = st.one_of(st.none(), one)

    def build(values):
        msg = cls()
        for name, v in values.items():
            if v is None:
                continue
            f = desc.fields_by_name[name]
            if f.is_repeated:
                if f.type == _T.TYPE_MESSAGE:
                    getattr(msg, name).extend(v)
                else:
                    getattr(msg, name)[:] = v
            elif f.type == _T.TYPE_MESSAGE:
                getattr(msg, name).CopyFrom(v)
            else:
                setattr(msg, name, v)
        return msg

    return st.fixed_dictionaries(fields).map(build)


# ------------------------------------------------------------------- master

MASTER_SERVICE = master_pb2.DESCRIPTOR.services_by_name["Master"]
MASTER_UNARY = [m for m in MASTER_SERVICE.methods
                if not m.client_streaming and not m.server_streaming]


def _snapshot(m) -> tuple:
    """Everything a request could change: the journal's end and every LMDB record."""
    with m.store.env.begin() as txn:
        rows = tuple((name, tuple(txn.cursor(db=db).iternext()))
                     for name, db in sorted(m.store.db.items()))
    return m.journal.last_seq, rows


@pytest.fixture(scope="module")
def fuzz_master(tmp_path_factory):
    m = make_master(tmp_path_factory.mktemp("fuzz-master"))
    # Nothing may change the namespace behind the handlers' back: the fuzzed worker
    # never heartbeats, so the capacity thread would remove its file once the worker
    # counts as lost, and a fuzzed SetPolicy may give a directory a TTL to expire.
    # Either between a refused request's two snapshots reads as a change it made.
    m.capacity.close()
    m.replication.close()
    # something to hit: a directory, a file with a published block, a worker
    add_worker(m)
    d = mkdir(m, ROOT_INO, b"d")
    f = create(m, d.ino, b"f")
    publish(m, f.ino, [100])
    create(m, ROOT_INO, b"a")
    yield m
    m.close()


def _call_master(m, servicer, method, req):
    body = getattr(type(servicer), method.name).__wrapped__
    before = _snapshot(m)
    try:
        body(servicer, req, None)
    except CurvineError as e:
        assert e.message, f"{method.name}: an error without a message"
        if e.kind in (ErrorKind.INVALID, ErrorKind.NAME_TOO_LONG):
            assert FIELD_FIRST.match(e.message), f"{method.name}: no field named: {e}"
        after = _snapshot(m)
        assert after == before, (f"{method.name} was refused ({e}) but changed the "
                                 f"namespace or the journal: {req}")
        return e.kind.name
    return "OK"


def _master_strategy():
    return st.sampled_from(MASTER_UNARY).flatmap(
        lambda meth: st.tuples(st.just(meth), message_strategy(meth.input_type)))


@pytest.fixture(scope="module")
def master_servicer(fuzz_master):
    s = MasterServicer(fuzz_master, call_threads=2)
    yield s
    s._call_pool.shutdown(wait=True)


@pytest.mark.parametrize("method", [m.name for m in MASTER_UNARY])
def test_master_handler_fuzz(fuzz_master, master_servicer, method):
    meth = MASTER_SERVICE.methods_by_name[method]
    outcomes = Counter()

    @settings(max_examples=80, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(message_strategy(meth.input_type))
    def run(req):
        outcomes[_call_master(fuzz_master, master_servicer, meth, req)] += 1

    run()
    print(f"{method}: {dict(outcomes)}")


def test_master_calls_stream_fuzz(fuzz_master, master_servicer):
    """The Calls stream's entries (Call messages) run through the same handlers; an
    unexpected exception there would be answered as "internal error" (EIO)."""
    outcomes = Counter()

    @settings(max_examples=80, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(message_strategy(master_pb2.Call.DESCRIPTOR))
    def run(call):
        before = _snapshot(fuzz_master)
        r = master_servicer._run_call(call)
        assert r.id == call.id
        if r.error_kind:
            assert not r.error.startswith("internal error"), r.error
            assert _snapshot(fuzz_master) == before, f"{call} was refused but changed state"
        outcomes[ErrorKind(r.error_kind).name] += 1

    run()
    print(f"Calls: {dict(outcomes)}")
    assert outcomes["INVALID"] and len(outcomes) > 2


@pytest.mark.slow
@LONG
@given(_master_strategy())
def test_master_handler_fuzz_long(fuzz_master, master_servicer, call):
    meth, req = call
    _call_master(fuzz_master, master_servicer, meth, req)


# ------------------------------------------------------------------- worker

WORKER_SERVICE = worker_pb2.DESCRIPTOR.services_by_name["Worker"]


@pytest.fixture(scope="module")
def fuzz_worker(tmp_path_factory):
    data = tmp_path_factory.mktemp("fuzz-worker")
    store = BlockStore([str(data)], capacity=1 << 30)
    # token checks off: the fuzzer reaches the validation and the store behind them
    # (tests/test_block_tokens.py covers the checks)
    servicer = WorkerServicer(store, block_size=4 << 20, block_key=UNCHECKED)
    # a block to hit
    with store.begin_write(5, 3) as w:
        w.append(b"abc")
        w.finish(zlib.crc32(b"abc"))
    yield servicer, str(data)


def _tree(root):
    return sorted((d, tuple(sorted(files))) for d, _dirs, files in os.walk(root))


def _call_worker(servicer, root, name, req):
    body = getattr(type(servicer), name).__wrapped__ if name != "ReadBlock" else None
    before = _tree(root)
    try:
        if name == "ReadBlock":
            # the stream handler's body: consume it (the wrapper would need a context)
            gen = type(servicer).ReadBlock.__wrapped__(servicer, req, None)
            for _ in gen:
                pass
            return "OK"
        if name == "WriteBlock":
            body(servicer, iter([req]), None)
        else:
            body(servicer, req, None)
    except CurvineError as e:
        assert e.message
        if e.kind in (ErrorKind.INVALID, ErrorKind.NAME_TOO_LONG):
            assert FIELD_FIRST.match(e.message), f"{name}: no field named: {e}"
        assert _tree(root) == before, f"{name} was refused ({e}) but changed the data dir"
        return e.kind.name
    return "OK"


@pytest.mark.parametrize("method", [m.name for m in WORKER_SERVICE.methods])
def test_worker_handler_fuzz(fuzz_worker, method):
    servicer, root = fuzz_worker
    meth = WORKER_SERVICE.methods_by_name[method]

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(message_strategy(meth.input_type))
    def run(req):
        if method in ("DeleteBlocks",):
            ids = [b for b in req.block_ids if b == 5]
            if ids:  # keep the block the other examples hit
                del req.block_ids[:]
        outcomes[_call_worker(servicer, root, method, req)] += 1

    outcomes = Counter()
    run()
    print(f"{method}: {dict(outcomes)}")
    assert 5 in servicer.store

