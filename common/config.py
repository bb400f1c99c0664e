"""Typed configuration, read from one TOML file.

Lookup order: ``--conf FILE``, then ``$CURVINE_CONF``, then ``/etc/curvine/curvine.toml``
if it exists, else the defaults below.  Sizes may be written ``"64MiB"`` and durations
``"2h"``.  An unknown section or key, or a bad value, is a ``ConfigError``
(common/errors.py) that names the key, the file and the line.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from . import auth, errors, tls

DEFAULT_PATH = "/etc/curvine/curvine.toml"


class Size(int):
    """A byte count; accepts ints and strings like '64MiB', '1.5GB', '512k'."""


class Duration(float):
    """Seconds; accepts numbers and strings like '500ms', '30s', '2h', '1d'."""


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20,
               "mb": 1000**2, "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30,
               "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40}
_DUR_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_size(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected a size")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("size must not be negative")
        return value
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"bad size {value!r} (use e.g. 64MiB, 10GiB, 4096)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_duration(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a duration")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("duration must not be negative")
        return float(value)
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _DUR_UNITS:
        raise ValueError(f"bad duration {value!r} (use e.g. 500ms, 30s, 2h)")
    return float(m.group(1)) * _DUR_UNITS[m.group(2).lower()]


@dataclass
class ClusterConfig:
    name: str = "curvine"
    master_addr: str = "127.0.0.1:8995"  # host:port of the master's gRPC service
    # host:port where workers reach the master (registration, heartbeats, block
    # reports); empty: the host of master_addr and port master.worker_port
    master_worker_addr: str = ""
    # a master group (docs/operations.md, "Master group"): every master's gRPC address;
    # clients and workers know them all and follow the leader.  Empty = [master_addr]
    master_addrs: list[str] = field(default_factory=list)
    # where workers reach each master of master_addrs (same order); empty = the host of
    # each master_addrs entry with port master.worker_port
    master_worker_addrs: list[str] = field(default_factory=list)
    block_size: Size = Size(64 << 20)
    replicas: int = 1
    rpc_timeout: Duration = Duration(30.0)  # deadline of one RPC
    master_wait: Duration = Duration(60.0)  # how long a client retries while the master is down


@dataclass
class MasterConfig:
    host: str = "127.0.0.1"
    port: int = 8995
    http_port: int = 9001
    meta_dir: str = "/var/lib/curvine/master"
    rpc_threads: int = 64
    # workers' calls (registration, heartbeats, block reports) are served on a port and
    # threads of their own, which client traffic cannot take (master/server.py)
    worker_port: int = 8996
    worker_rpc_threads: int = 8
    # mounts' and path clients' namespace calls on a lean framed TCP port
    # (master/ports/call_port_server.py), cheaper than gRPC; TLS as the gRPC ports when on; 0 = off
    call_port: int = 8994
    worker_lost_after: Duration = Duration(30.0)
    # more than this share of the registered workers lost within worker_lost_after is
    # held as a suspected master or network fault: their files are kept (and the loss
    # logged) for mass_loss_hold before their locations are dropped
    max_lost_share: float = 0.5
    mass_loss_hold: Duration = Duration(900.0)
    # a lost worker gets no placements and readers go elsewhere at once, but its block
    # locations (and the files whose only copy it holds) are kept this long: a worker
    # paused (GC, I/O stall, network blip) that comes back within it loses nothing
    lost_grace: Duration = Duration(600.0)
    # capacity (master/cluster/capacity.py): above evict_high (a fraction of the live workers'
    # capacity) the least recently used complete files that no mount has open are
    # evicted down to evict_low, and a block with no room evicts synchronously;
    # every evict_interval the master also removes expired (TTL) files and files whose
    # writer's mount has been gone for orphan_timeout.  evict_batch: files per record.
    evict_high: float = 0.90
    evict_low: float = 0.80
    evict_interval: Duration = Duration(1.0)
    evict_batch: int = 1000
    orphan_timeout: Duration = Duration(120.0)
    orphan_block_grace: Duration = Duration(300.0)  # unknown blocks younger than this are kept
    retry_cache_entries: int = 200_000
    # how long a mount may cache a name or a file's attributes without asking (its
    # lease; mutations by others revoke it first: master/cluster/leases.py); 0 = no leases
    lease_time: Duration = Duration(30.0)
    # how long a mount may cache a name's absence (a negative entry, fuse.negative_leases):
    # shorter, since a mount that dies holding one holds back the store of that name
    # until it runs out; 0 = misses are never leased.  Also the term of a leased
    # listing (a mount answers misses in a quiet directory itself: fuse_client/listings.py)
    negative_lease_time: Duration = Duration(5.0)
    max_sessions: int = 1024  # mounts with a lease session (each holds a server thread)
    # a Calls or Session stream whose client takes no reply this long is cancelled; a
    # call port connection that sends no call (or takes no reply) this long is closed
    stream_idle_timeout: Duration = Duration(60.0)
    # limits of what one client request may cost (docs/security.md, "Limits"): the
    # largest request a client may send (a call port frame, a gRPC message on
    # master.port; a PutFile of 65,536 blocks with their tokens is ~7 MiB)...
    client_message_max: Size = Size(16 << 20)
    # ...the time a call port frame (or hello) may take to arrive whole from its first
    # byte (a connection that trickles one is closed)...
    call_frame_timeout: Duration = Duration(10.0)
    # ...the call port connections one peer address may hold (of 4 x max_sessions)...
    call_port_per_peer: int = 64
    # ...the bytes all call port connections together may buffer of frames over 64 KiB
    # still arriving (past it such connections wait, unread, for room)...
    call_port_buffer: Size = Size(64 << 20)
    # ...and the bytes of one LookupMany reply: past it the reply answers the names
    # before the one that would not fit, and the client asks again for the rest
    lookup_reply_max: Size = Size(4 << 20)
    # re-replication (master/cluster/replication.py): copies in flight per target worker, and
    # how long one may take before it is given up and tried again
    replication_max_inflight: int = 4
    replication_timeout: Duration = Duration(120.0)
    # small files keep their bytes in the master's metadata (Block.data), published in
    # one journaled call with no worker involved: files up to inline_max bytes (0 = none,
    # at most block_size), all of them together up to inline_capacity
    inline_max: Size = Size(256 << 10)
    inline_capacity: Size = Size(1 << 30)
    # the master group (master/group/, docs/architecture.md "The master group"): the
    # etcd cluster ("host:port" of its client URLs) where the members elect a leader and
    # the leader keeps the journal; empty = one master with its local journal, as ever.
    # member_id names this master in the group (default: advertise_addr);
    # advertise_addr is the gRPC address the member gives for itself when it leads (a
    # standby's NOT_LEADER names it, GetGroup lists it): clients follow a named leader
    # only to an address of cluster.master_addrs, so set it to this master's entry
    # there when it binds another address (default: master.host:master.port);
    # ha_lease_ttl is the leader's etcd lease: a failover comes about this long after
    # the leader stops, and a leader that cannot renew it stops answering as leader
    etcd_endpoints: list[str] = field(default_factory=list)
    member_id: str = ""
    advertise_addr: str = ""
    ha_lease_ttl: Duration = Duration(3.0)
    # how the members reach etcd (master/group/etcd_access.py, docs/security.md "The
    # master group's etcd"); all empty = plaintext and no etcd user (loopback only).
    # TLS: the CA that etcd's server certificate chains to (etcd --trusted-ca-file's
    # peer: TLS is on when it is set), and this master's client certificate and key
    # for an etcd started with --client-cert-auth.  Authentication: the etcd user the
    # members act as (etcd auth enable) and a file holding its password (never the
    # password itself here).  The files are read when a master starts.
    etcd_ca_file: str = ""
    etcd_cert_file: str = ""
    etcd_key_file: str = ""
    etcd_user: str = ""
    etcd_password_file: str = ""


@dataclass
class JournalConfig:
    dir: str = "/var/lib/curvine/journal"
    segment_size: Size = Size(64 << 20)
    checkpoint_every: int = 1_000_000  # records between automatic checkpoints (0 = never)
    # journal bytes that make a checkpoint due too (small files' bytes are in the
    # records: master.inline_max); 0 = never
    checkpoint_bytes: Size = Size(4 << 30)
    fsync: bool = True


@dataclass
class WorkerConfig:
    host: str = "127.0.0.1"
    port: int = 8997
    http_port: int = 9002
    data_dirs: list[str] = field(default_factory=lambda: ["/var/lib/curvine/data"])
    capacity: Size = Size(0)  # 0 = free space of the data dirs' file systems
    heartbeat_interval: Duration = Duration(1.0)
    rpc_threads: int = 32
    # a block stream that neither sends nor takes a message this long is cancelled
    stream_idle_timeout: Duration = Duration(60.0)
    # Unix domain socket passing block file descriptors to local clients that may not
    # open the data dirs (worker/domain_socket.py); "" = off.  Must end in .sock
    # (clients find it by listing client.domain_socket_dir).
    domain_socket: str = "/run/curvine/worker.sock"
    # TCP port of the bulk read port (worker/data_port.py: block ranges with sendfile,
    # for remote readers such as the LMCache connector); 0 = off.  Not served when TLS
    # is on (it would bypass it): readers then use gRPC.
    data_port: int = 8998


@dataclass
class ClientConfig:
    short_circuit: bool = True  # read blocks on this host straight from their files
    # the data dirs of the workers on this host, the only places short-circuit I/O may
    # open (never paths learned over the network); empty: this file's worker.data_dirs
    short_circuit_dirs: list[str] = field(default_factory=list)
    rpc_threads: int = 16
    readahead_blocks: int = 4  # MiB in flight per remote read stream
    access_report_interval: Duration = Duration(1.0)  # opens reported for LRU eviction
    # where the local workers' domain sockets are (every *.sock: worker.domain_socket);
    # "" = no descriptor passing
    domain_socket_dir: str = "/run/curvine"
    # the path API's (and so the LMCache connector's) namespace calls on the master's
    # call port when it has one (client/master/call_port_blocking.py), else unary gRPC
    call_port: bool = True
    # the LMCache connector: every lookup, read and store returns within this (a
    # miss, a skipped store) whatever the master or a worker is doing; after a
    # failure, calls to that master or worker are misses at once for as long
    fail_open_timeout: Duration = Duration(2.0)
    # a master group: the member that answers this client's unleased reads (lookups,
    # getattr, listings, block locations, the connector's batched lookups; a standby
    # answers once it has applied what the leader had committed): "" = a standby chosen
    # at start (by process id), "leader" = none (every call to the leader), or host:port
    # of one of cluster.master_addrs
    read_member: str = ""


@dataclass
class FuseConfig:
    mountpoint: str = "/mnt/kv"
    http_port: int = 9003
    attr_timeout: Duration = Duration(1.0)
    entry_timeout: Duration = Duration(0.0)  # 0: a name made on another mount is seen at once
    leases: bool = True  # cache leased names and file attributes (master.lease_time)
    # with leases: also cache names the master said are absent, leased the same way
    # (revoked by a create, link or rename of the name on any client), and leased
    # listings of quiet directories (misses there answered by the mount: listings.py)
    negative_leases: bool = True
    call_stream: bool = True  # namespace calls on one gRPC stream (else one unary RPC each)
    # namespace calls on the master's call port when it has one (master.call_port),
    # ahead of the stream: no thread hand-offs (fuse_client/call_port_trio.py)
    call_port: bool = True
    writeback_cache: bool = False  # on, the kernel ignores file sizes from other mounts
    allow_other: bool = False
    readahead_kb: int = 1024
    debug: bool = False


@dataclass
class SecurityConfig:
    token_file: str = ""  # the client credential: namespace and data calls
    # the worker credential (registration, heartbeats, block reports, the block-token
    # key): only masters and workers hold it; required with token_file
    worker_token_file: str = ""
    # the master credential: FetchCheckpoint between the masters of a group (the whole
    # namespace); only the masters hold it; optional (without it, that call takes the
    # worker credential); needs token_file and worker_token_file
    master_token_file: str = ""
    # TLS on gRPC (common/tls.py): on when tls_ca is set
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    tls_client_auth: bool = False
    tls_server_name: str = ""


@dataclass
class LogConfig:
    level: str = "INFO"


@dataclass
class Config:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    master: MasterConfig = field(default_factory=MasterConfig)
    journal: JournalConfig = field(default_factory=JournalConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    fuse: FuseConfig = field(default_factory=FuseConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    log: LogConfig = field(default_factory=LogConfig)


def _line_of(text: str, section: str, key: str | None) -> int:
    """Best-effort line number of ``key`` in ``[section]`` (tomllib gives none)."""
    current = ""
    for no, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        m = re.match(r"\[\s*([A-Za-z0-9_.]+)\s*\]", s)
        if m:
            current = m.group(1)
            if key is None and current == section:
                return no
            continue
        if key is not None and current == section and re.match(rf"{re.escape(key)}\s*=", s):
            return no
    return 0


def _coerce(value: Any, typ: Any, where: str) -> Any:
    try:
        if typ is Size:
            return Size(parse_size(value))
        if typ is Duration:
            return Duration(parse_duration(value))
        if typ is bool:
            if not isinstance(value, bool):
                raise ValueError("expected true or false")
            return value
        if typ is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError("expected an integer")
            return value
        if typ is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError("expected a number")
            return float(value)
        if typ is str:
            if not isinstance(value, str):
                raise ValueError("expected a string")
            return value
        if typ == list[str]:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError("expected a list of strings")
            return list(value)
    except ValueError as e:
        raise errors.ConfigError(f"{where}: {e}") from None
    raise errors.ConfigError(f"{where}: unsupported type")


def load(path: str | None = None) -> Config:
    """Read the config: ``path``, else $CURVINE_CONF, else the default file if present."""
    path = path or os.environ.get("CURVINE_CONF") or (
        DEFAULT_PATH if os.path.exists(DEFAULT_PATH) else None)
    cfg = Config()
    if not path:
        return cfg
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise errors.ConfigError(f"{path}: cannot read config: {e.strerror}") from None
    text = raw.decode("utf-8", "replace")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise errors.ConfigError(_syntax_error(path, text, str(e))) from None
    return apply_dict(cfg, data, path, text)


def _syntax_error(path: str, text: str, message: str) -> str:
    """tomllib's message as ``file:line: ...`` like every other config error."""
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if m:
        return f"{path}:{m.group(1)}: TOML syntax: {message[:m.start()]} (column {m.group(2)})"
    m = re.search(r"\s*\(at end of document\)$", message)
    if m:
        return f"{path}:{len(text.splitlines())}: TOML syntax: {message[:m.start()]} at the end of the file"
    return f"{path}: TOML syntax: {message}"


def apply_dict(cfg: Config, data: dict, path: str = "<config>", text: str = "") -> Config:
    sections = {f.name: f for f in dataclasses.fields(cfg)}
    for sec_name, sec_val in data.items():
        if sec_name not in sections and not isinstance(sec_val, dict):
            raise errors.ConfigError(f"{path}:{_line_of(text, '', sec_name)}: {sec_name}: a key "
                              f"outside any section (sections: {', '.join(sections)})")
        if sec_name not in sections:
            line = _line_of(text, sec_name, None)
            raise errors.ConfigError(f"{path}:{line}: unknown section [{sec_name}]")
        if not isinstance(sec_val, dict):
            raise errors.ConfigError(f"{path}:{_line_of(text, '', sec_name)}: [{sec_name}] "
                                     "must be a table")
        section = getattr(cfg, sec_name)
        hints = get_type_hints(type(section))
        for key, value in sec_val.items():
            line = _line_of(text, sec_name, key)
            where = f"{path}:{line}: {sec_name}.{key}"
            if key not in hints:
                raise errors.ConfigError(f"{where}: unknown key")
            setattr(section, key, _coerce(value, hints[key], where))
    validate(cfg, path, text)
    return cfg


def validate(cfg: Config, path: str = "", text: str = "") -> None:
    """Check values that parse but cannot work; the error names the key and, when
    ``path`` (and its ``text``) are given, the file and the key's line in it."""
    for keys, message in _problems(cfg):
        raise errors.ConfigError(f"{_location(path, text, keys)}{' / '.join(keys)}: {message}")


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_PORTS = ("master.port", "master.worker_port", "master.call_port", "master.http_port", "worker.port", "worker.http_port", "fuse.http_port")
_THREADS = ("master.rpc_threads", "master.worker_rpc_threads", "worker.rpc_threads", "client.rpc_threads")


def _location(path: str, text: str, keys: tuple[str, ...]) -> str:
    """``file:line: `` of the first of ``keys`` written in the file (the section's line
    when none is; 0 when the value is a default or came from a command-line flag)."""
    if not path:
        return ""
    line = 0
    for key in keys:
        section, name = key.split(".", 1)
        line = _line_of(text, section, name) if text else 0
        if line:
            break
    if not line and text:
        line = _line_of(text, keys[0].split(".", 1)[0], None)
    return f"{path}:{line}: "


def _problems(cfg: Config):
    """Yield ``((key, ...), message)`` for every value that cannot work."""
    c, m, w = cfg.cluster, cfg.master, cfg.worker
    for sec in dataclasses.fields(cfg):
        section = getattr(cfg, sec.name)
        for f in dataclasses.fields(section):
            v = getattr(section, f.name)
            if type(v) is int and v < 0:
                yield (f"{sec.name}.{f.name}",), f"must not be negative, got {v}"
    if c.block_size < (1 << 20) or c.block_size % (1 << 20):
        yield ("cluster.block_size",), f"must be a positive multiple of 1MiB, got {int(c.block_size)}"
    if not 1 <= c.replicas <= 8:
        yield ("cluster.replicas",), f"must be between 1 and 8, got {c.replicas}"
    yield from _group_problems(c)
    if len(master_addrs_of(c)) > 1 and not m.etcd_endpoints:
        # each master would take itself for the only one: two truths
        yield (("cluster.master_addrs", "master.etcd_endpoints"),
               f"{len(master_addrs_of(c))} masters need master.etcd_endpoints (the group's "
               "etcd), in every process's config")
    if c.rpc_timeout <= 0:
        yield ("cluster.rpc_timeout",), "must be positive"
    if not 0 < m.evict_low < m.evict_high <= 1:
        yield (("master.evict_low", "master.evict_high"),
               f"need 0 < low < high <= 1, got low {m.evict_low} and high {m.evict_high}")
    if m.evict_batch < 1:
        yield ("master.evict_batch",), "must be at least 1"
    if m.evict_interval <= 0:
        yield ("master.evict_interval",), "must be positive"
    if m.worker_lost_after <= w.heartbeat_interval:
        yield (("master.worker_lost_after", "worker.heartbeat_interval"),
               f"a worker is declared lost after {m.worker_lost_after:g}s, which must be "
               f"longer than its heartbeat interval ({w.heartbeat_interval:g}s)")
    if m.inline_max > (1 << 20):
        yield ("master.inline_max",), f"must be at most 1MiB (0 = none), got {int(m.inline_max)}"
    if m.replication_max_inflight < 1:
        yield ("master.replication_max_inflight",), "must be at least 1"
    if not (1 << 20) <= m.client_message_max <= (64 << 20):
        yield ("master.client_message_max",), (f"must be between 1MiB and 64MiB, got "
                                               f"{int(m.client_message_max)}")
    if m.call_frame_timeout <= 0:
        yield ("master.call_frame_timeout",), "must be positive"
    if m.call_port_per_peer < 1:
        yield ("master.call_port_per_peer",), "must be at least 1"
    if m.call_port_buffer < m.client_message_max:
        yield (("master.call_port_buffer", "master.client_message_max"),
               "the call port's buffer must hold at least one frame of the largest size")
    for i, endpoint in enumerate(m.etcd_endpoints):
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            yield ("master.etcd_endpoints",), f"entry {i}: expected host:port, got {endpoint!r}"
    yield from _etcd_access_problems(m)
    if not 1 <= m.ha_lease_ttl <= 60:
        yield ("master.ha_lease_ttl",), f"must be between 1s and 60s, got {m.ha_lease_ttl:g}s"
    if len(m.member_id) > 128 or any(ch in m.member_id for ch in "/\0"):
        yield ("master.member_id",), "at most 128 characters, no '/'"
    if m.advertise_addr and not is_host_port(m.advertise_addr):
        yield ("master.advertise_addr",), f"expected host:port, got {m.advertise_addr!r}"
    if m.lookup_reply_max < (64 << 10):
        yield ("master.lookup_reply_max",), f"must be at least 64KiB, got {int(m.lookup_reply_max)}"
    for key in _PORTS:
        section, name = key.split(".")
        port_no = getattr(getattr(cfg, section), name)
        if not 0 <= port_no <= 65535:
            yield (key,), f"{port_no} is not a port number"
    for key in _THREADS:
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) < 1:
            yield (key,), "must be at least 1"
    for key, value in (("master.meta_dir", m.meta_dir), ("journal.dir", cfg.journal.dir),
                       ("fuse.mountpoint", cfg.fuse.mountpoint)):
        if not value:
            yield (key,), "must not be empty"
    if cfg.journal.segment_size < 4096:
        yield ("journal.segment_size",), "must be at least 4KiB"
    if not w.data_dirs or not all(w.data_dirs):
        yield ("worker.data_dirs",), "needs at least one directory, and no empty names"
    if w.heartbeat_interval <= 0:
        yield ("worker.heartbeat_interval",), "must be positive"
    if cfg.master.stream_idle_timeout < 0:
        yield ("master.stream_idle_timeout",), "must not be negative (0 = never)"
    if w.stream_idle_timeout < 0:
        yield ("worker.stream_idle_timeout",), "must not be negative (0 = never)"
    if not 0 <= w.data_port <= 65535:
        yield ("worker.data_port",), f"must be a TCP port (0 = off), got {w.data_port}"
    if w.domain_socket:
        if not os.path.isabs(w.domain_socket) or not w.domain_socket.endswith(".sock"):
            yield (("worker.domain_socket",), f"must be an absolute path ending in .sock "
                   f"(or \"\" for none), got {w.domain_socket!r}")
    if cfg.client.domain_socket_dir and not os.path.isabs(cfg.client.domain_socket_dir):
        yield (("client.domain_socket_dir",), f"must be an absolute path (or \"\" for none), "
               f"got {cfg.client.domain_socket_dir!r}")
    r = cfg.client.read_member
    if r and r != "leader" and r not in master_addrs_of(c):
        yield (("client.read_member",), f"{r!r} is not one of cluster.master_addrs "
               "(\"\" = one chosen at start, \"leader\" = none)")
    if cfg.client.readahead_blocks < 1:
        yield ("client.readahead_blocks",), "must be at least 1"
    if cfg.log.level.upper() not in _LOG_LEVELS:
        yield ("log.level",), f"{cfg.log.level!r} is not one of {', '.join(_LOG_LEVELS)}"
    if cfg.security.token_file:
        # Checked here so that every daemon refuses a bad file at start (exit 2).
        try:
            auth.read_token_file(cfg.security.token_file)
        except auth.TokenError as e:
            yield ("security.token_file",), str(e).removeprefix("security.token_file: ")
    # security.worker_token_file is read only by masters and workers (Security.load,
    # role "master"/"worker"): one config file may name it for a node's worker and
    # mount, and the mount, which never holds that file, still starts.  Likewise
    # security.master_token_file, read by masters only.
    if not 0 < cfg.master.max_lost_share <= 1:
        yield ("master.max_lost_share",), "must be in (0, 1]"
    if cfg.cluster.master_worker_addr and not is_host_port(cfg.cluster.master_worker_addr):
        yield ("cluster.master_worker_addr",), "must be host:port"
    # Checked here too, so that every daemon refuses bad TLS files or keys at start
    # (exit 2).  Nothing to check and nothing read when all are unset.
    for key, message in tls.problems(cfg.security):
        yield (key,), message


def _etcd_access_problems(m: MasterConfig):
    """The [master] keys of TLS and authentication to etcd that cannot go together
    (their files are read by the masters of a group only, at start:
    master/group/etcd_access.py; a worker sharing this config holds none of them, and a
    master without master.etcd_endpoints ignores them)."""
    if m.etcd_key_file and not m.etcd_cert_file:
        yield (("master.etcd_key_file",),
               "is set but master.etcd_cert_file is not (a key needs its certificate)")
    if m.etcd_cert_file and not m.etcd_key_file:
        yield (("master.etcd_cert_file",),
               "is set but master.etcd_key_file is not (a certificate needs its key)")
    if m.etcd_cert_file and not m.etcd_ca_file:
        yield (("master.etcd_ca_file",), "must be set when master.etcd_cert_file is (the CA "
               "that etcd's server certificate chains to: TLS to etcd is on with it)")
    if m.etcd_user and not m.etcd_password_file:
        yield (("master.etcd_password_file",), "must be set when master.etcd_user is (a "
               "file holding the etcd user's password)")
    if m.etcd_password_file and not m.etcd_user:
        yield (("master.etcd_user",), "must be set when master.etcd_password_file is")
    if m.etcd_user and not all(33 <= ord(ch) <= 126 for ch in m.etcd_user):
        yield ("master.etcd_user",), f"{m.etcd_user!r} is not a user name (printable ASCII)"


def is_host_port(address: str) -> bool:
    """``address`` is ``host:port`` (``[v6]:port`` too) with a port in 1..65535."""
    host, sep, port = address.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) <= 65535)


def _group_problems(c: ClusterConfig):
    """The masters' addresses: each host:port, none twice, the worker ports one per
    master; ``master_addr`` one of ``master_addrs`` when both are written."""
    if not is_host_port(c.master_addr):
        yield ("cluster.master_addr",), f"expected host:port, got {c.master_addr!r}"
    for key, addrs in (("cluster.master_addrs", c.master_addrs),
                       ("cluster.master_worker_addrs", c.master_worker_addrs)):
        for a in addrs:
            if not is_host_port(a):
                yield (key,), f"expected a list of host:port, got {a!r}"
        twice = sorted({a for a in addrs if addrs.count(a) > 1})
        if twice:
            yield (key,), f"{twice[0]} is listed twice"
    if c.master_worker_addrs and len(c.master_worker_addrs) != len(master_addrs_of(c)):
        yield (("cluster.master_worker_addrs", "cluster.master_addrs"),
               f"one worker address per master: {len(c.master_worker_addrs)} for "
               f"{len(master_addrs_of(c))} masters")
    if c.master_worker_addrs and c.master_worker_addr:
        yield (("cluster.master_worker_addr", "cluster.master_worker_addrs"),
               "set one of them: master_worker_addrs names each master's worker port")
    if (c.master_addrs and c.master_addr != ClusterConfig.master_addr
            and c.master_addr not in c.master_addrs):
        yield (("cluster.master_addr", "cluster.master_addrs"),
               f"{c.master_addr} is not one of master_addrs (leave master_addr out: "
               "master_addrs replaces it)")


def master_addrs_of(c: ClusterConfig) -> list[str]:
    """Every master's gRPC address: ``master_addrs``, else ``[master_addr]``."""
    return list(c.master_addrs) or [c.master_addr]


def master_addrs(cfg: Config) -> list[str]:
    """Every master's gRPC address (``cluster.master_addrs``, else the one
    ``cluster.master_addr``): what clients try, leader first once they know it."""
    return master_addrs_of(cfg.cluster)


def read_members(cfg: Config) -> list[str]:
    """The members of a master group this process may send its unleased reads to
    (``client.read_member``): the one it names, or for "" every member (the client
    picks a standby: client/master/master_client.py); none with one master or
    "leader"."""
    addrs = master_addrs(cfg)
    r = cfg.client.read_member
    if len(addrs) == 1 or r == "leader":
        return []
    return [r] if r else addrs


def advertise_addr(cfg: Config) -> str:
    """The gRPC address a member of a master group gives for itself (the leader
    record, a standby's NOT_LEADER, GetGroup): ``master.advertise_addr``, else
    ``master.host:master.port``."""
    return cfg.master.advertise_addr or f"{cfg.master.host}:{cfg.master.port}"


def master_worker_addrs(cfg: Config) -> list[str]:
    """Where workers reach each master of :func:`master_addrs`, in the same order:
    ``cluster.master_worker_addrs``, else each master's host with port
    ``master.worker_port`` (one master: :func:`master_worker_addr`)."""
    c = cfg.cluster
    if c.master_worker_addrs:
        return list(c.master_worker_addrs)
    if not c.master_addrs:
        return [master_worker_addr(cfg)]
    return [f"{a.rsplit(':', 1)[0]}:{cfg.master.worker_port}" for a in c.master_addrs]


def master_worker_addr(cfg: Config) -> str:
    """Where workers reach the master: ``cluster.master_worker_addr``, else the host of
    ``cluster.master_addr`` with port ``master.worker_port``."""
    if cfg.cluster.master_worker_addr:
        return cfg.cluster.master_worker_addr
    host = cfg.cluster.master_addr.rsplit(":", 1)[0]
    return f"{host}:{cfg.master.worker_port}"


def to_toml(cfg: Config) -> str:
    """Render a config back to TOML (used by `curvine local` to hand configs to daemons)."""
    out = []
    for sec in dataclasses.fields(cfg):
        out.append(f"[{sec.name}]")
        section = getattr(cfg, sec.name)
        for f in dataclasses.fields(section):
            v = getattr(section, f.name)
            if isinstance(v, bool):
                s = "true" if v else "false"
            elif isinstance(v, (int, float)):
                s = repr(int(v)) if isinstance(v, int) else repr(float(v))
            elif isinstance(v, list):
                s = "[" + ", ".join(_q(x) for x in v) + "]"
            else:
                s = _q(v)
            out.append(f"{f.name} = {s}")
        out.append("")
    return "\n".join(out)


def _q(s: str) -> str:
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'
