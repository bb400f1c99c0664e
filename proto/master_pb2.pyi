from curvine.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PutStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUT_STATUS_UNSPECIFIED: _ClassVar[PutStatus]
    PUT_STORED: _ClassVar[PutStatus]
    PUT_EXISTS: _ClassVar[PutStatus]
    PUT_INVALID: _ClassVar[PutStatus]
    PUT_BLOCKS_MISSING: _ClassVar[PutStatus]
PUT_STATUS_UNSPECIFIED: PutStatus
PUT_STORED: PutStatus
PUT_EXISTS: PutStatus
PUT_INVALID: PutStatus
PUT_BLOCKS_MISSING: PutStatus

class InodeReply(_message.Message):
    __slots__ = ("inode", "lease_ms", "parent", "listing_lease_ms", "block")
    INODE_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    LISTING_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    inode: _common_pb2.Inode
    lease_ms: int
    parent: _common_pb2.Inode
    listing_lease_ms: int
    block: AddBlockReply
    def __init__(self, inode: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ..., lease_ms: _Optional[int] = ..., parent: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ..., listing_lease_ms: _Optional[int] = ..., block: _Optional[_Union[AddBlockReply, _Mapping]] = ...) -> None: ...

class ParentReply(_message.Message):
    __slots__ = ("parent", "new_parent", "moved", "held")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NEW_PARENT_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    parent: _common_pb2.Inode
    new_parent: _common_pb2.Inode
    moved: _common_pb2.Inode
    held: int
    def __init__(self, parent: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ..., new_parent: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ..., moved: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ..., held: _Optional[int] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("parent", "name", "miss_ok", "session", "lease_miss")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MISS_OK_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    LEASE_MISS_FIELD_NUMBER: _ClassVar[int]
    parent: int
    name: bytes
    miss_ok: bool
    session: int
    lease_miss: bool
    def __init__(self, parent: _Optional[int] = ..., name: _Optional[bytes] = ..., miss_ok: _Optional[bool] = ..., session: _Optional[int] = ..., lease_miss: _Optional[bool] = ...) -> None: ...

class GetAttrRequest(_message.Message):
    __slots__ = ("ino", "session")
    INO_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ino: int
    session: int
    def __init__(self, ino: _Optional[int] = ..., session: _Optional[int] = ...) -> None: ...

class SetAttrRequest(_message.Message):
    __slots__ = ("request_id", "ino", "mode", "uid", "gid", "size", "atime_ns", "mtime_ns", "session")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    ATIME_NS_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    ino: int
    mode: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    session: int
    def __init__(self, request_id: _Optional[bytes] = ..., ino: _Optional[int] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., size: _Optional[int] = ..., atime_ns: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., session: _Optional[int] = ...) -> None: ...

class MkdirRequest(_message.Message):
    __slots__ = ("request_id", "parent", "name", "mode", "uid", "gid", "session")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    name: bytes
    mode: int
    uid: int
    gid: int
    session: int
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., session: _Optional[int] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("request_id", "parent", "name", "mode", "uid", "gid", "exclusive", "session", "block_host_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HOST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    name: bytes
    mode: int
    uid: int
    gid: int
    exclusive: bool
    session: int
    block_host_id: str
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., exclusive: _Optional[bool] = ..., session: _Optional[int] = ..., block_host_id: _Optional[str] = ...) -> None: ...

class UnlinkRequest(_message.Message):
    __slots__ = ("request_id", "parent", "name", "session", "open_inos")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    OPEN_INOS_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    name: bytes
    session: int
    open_inos: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., session: _Optional[int] = ..., open_inos: _Optional[_Iterable[int]] = ...) -> None: ...

class RmdirRequest(_message.Message):
    __slots__ = ("request_id", "parent", "name", "session")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    name: bytes
    session: int
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., session: _Optional[int] = ...) -> None: ...

class RenameRequest(_message.Message):
    __slots__ = ("request_id", "parent", "name", "new_parent", "new_name", "no_replace", "source_ino", "require_published", "session", "writer_inos", "open_inos", "exchange")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NEW_PARENT_FIELD_NUMBER: _ClassVar[int]
    NEW_NAME_FIELD_NUMBER: _ClassVar[int]
    NO_REPLACE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_INO_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    WRITER_INOS_FIELD_NUMBER: _ClassVar[int]
    OPEN_INOS_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    name: bytes
    new_parent: int
    new_name: bytes
    no_replace: bool
    source_ino: int
    require_published: bool
    session: int
    writer_inos: _containers.RepeatedScalarFieldContainer[int]
    open_inos: _containers.RepeatedScalarFieldContainer[int]
    exchange: bool
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., new_parent: _Optional[int] = ..., new_name: _Optional[bytes] = ..., no_replace: _Optional[bool] = ..., source_ino: _Optional[int] = ..., require_published: _Optional[bool] = ..., session: _Optional[int] = ..., writer_inos: _Optional[_Iterable[int]] = ..., open_inos: _Optional[_Iterable[int]] = ..., exchange: _Optional[bool] = ...) -> None: ...

class SymlinkRequest(_message.Message):
    __slots__ = ("request_id", "parent", "name", "target", "uid", "gid", "session")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    name: bytes
    target: bytes
    uid: int
    gid: int
    session: int
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., target: _Optional[bytes] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., session: _Optional[int] = ...) -> None: ...

class MakeNodeRequest(_message.Message):
    __slots__ = ("request_id", "parent", "name", "type", "mode", "rdev", "uid", "gid", "session")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RDEV_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    name: bytes
    type: _common_pb2.FileType
    mode: int
    rdev: int
    uid: int
    gid: int
    session: int
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., type: _Optional[_Union[_common_pb2.FileType, str]] = ..., mode: _Optional[int] = ..., rdev: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., session: _Optional[int] = ...) -> None: ...

class LinkRequest(_message.Message):
    __slots__ = ("request_id", "ino", "new_parent", "new_name", "session")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    NEW_PARENT_FIELD_NUMBER: _ClassVar[int]
    NEW_NAME_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    ino: int
    new_parent: int
    new_name: bytes
    session: int
    def __init__(self, request_id: _Optional[bytes] = ..., ino: _Optional[int] = ..., new_parent: _Optional[int] = ..., new_name: _Optional[bytes] = ..., session: _Optional[int] = ...) -> None: ...

class ReleaseInodeRequest(_message.Message):
    __slots__ = ("request_id", "ino", "session")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    ino: int
    session: int
    def __init__(self, request_id: _Optional[bytes] = ..., ino: _Optional[int] = ..., session: _Optional[int] = ...) -> None: ...

class SetXattrRequest(_message.Message):
    __slots__ = ("request_id", "ino", "name", "value", "flags", "session")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    ino: int
    name: bytes
    value: bytes
    flags: int
    session: int
    def __init__(self, request_id: _Optional[bytes] = ..., ino: _Optional[int] = ..., name: _Optional[bytes] = ..., value: _Optional[bytes] = ..., flags: _Optional[int] = ..., session: _Optional[int] = ...) -> None: ...

class GetXattrRequest(_message.Message):
    __slots__ = ("ino", "name")
    INO_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ino: int
    name: bytes
    def __init__(self, ino: _Optional[int] = ..., name: _Optional[bytes] = ...) -> None: ...

class GetXattrReply(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: bytes
    def __init__(self, value: _Optional[bytes] = ...) -> None: ...

class ListXattrRequest(_message.Message):
    __slots__ = ("ino",)
    INO_FIELD_NUMBER: _ClassVar[int]
    ino: int
    def __init__(self, ino: _Optional[int] = ...) -> None: ...

class ListXattrReply(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, names: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RemoveXattrRequest(_message.Message):
    __slots__ = ("request_id", "ino", "name", "session")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    ino: int
    name: bytes
    session: int
    def __init__(self, request_id: _Optional[bytes] = ..., ino: _Optional[int] = ..., name: _Optional[bytes] = ..., session: _Optional[int] = ...) -> None: ...

class ListDirRequest(_message.Message):
    __slots__ = ("ino", "start_after", "limit", "session", "names_only", "lease_listing")
    INO_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    NAMES_ONLY_FIELD_NUMBER: _ClassVar[int]
    LEASE_LISTING_FIELD_NUMBER: _ClassVar[int]
    ino: int
    start_after: bytes
    limit: int
    session: int
    names_only: bool
    lease_listing: bool
    def __init__(self, ino: _Optional[int] = ..., start_after: _Optional[bytes] = ..., limit: _Optional[int] = ..., session: _Optional[int] = ..., names_only: _Optional[bool] = ..., lease_listing: _Optional[bool] = ...) -> None: ...

class DirEntry(_message.Message):
    __slots__ = ("name", "inode")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    inode: _common_pb2.Inode
    def __init__(self, name: _Optional[bytes] = ..., inode: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ...) -> None: ...

class ListDirReply(_message.Message):
    __slots__ = ("entries", "has_more", "lease_ms", "listing_lease_ms")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    LISTING_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[DirEntry]
    has_more: bool
    lease_ms: int
    listing_lease_ms: int
    def __init__(self, entries: _Optional[_Iterable[_Union[DirEntry, _Mapping]]] = ..., has_more: _Optional[bool] = ..., lease_ms: _Optional[int] = ..., listing_lease_ms: _Optional[int] = ...) -> None: ...

class StatFsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatFsReply(_message.Message):
    __slots__ = ("capacity", "used", "files", "live_workers", "block_size", "workers", "call_port", "inline_max")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    LIVE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    CALL_PORT_FIELD_NUMBER: _ClassVar[int]
    INLINE_MAX_FIELD_NUMBER: _ClassVar[int]
    capacity: int
    used: int
    files: int
    live_workers: int
    block_size: int
    workers: _containers.RepeatedCompositeFieldContainer[_common_pb2.WorkerInfo]
    call_port: int
    inline_max: int
    def __init__(self, capacity: _Optional[int] = ..., used: _Optional[int] = ..., files: _Optional[int] = ..., live_workers: _Optional[int] = ..., block_size: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[_common_pb2.WorkerInfo, _Mapping]]] = ..., call_port: _Optional[int] = ..., inline_max: _Optional[int] = ...) -> None: ...

class GetBlocksRequest(_message.Message):
    __slots__ = ("ino", "session", "open_id", "write")
    INO_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    OPEN_ID_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    ino: int
    session: int
    open_id: int
    write: bool
    def __init__(self, ino: _Optional[int] = ..., session: _Optional[int] = ..., open_id: _Optional[int] = ..., write: _Optional[bool] = ...) -> None: ...

class GetBlocksReply(_message.Message):
    __slots__ = ("inode", "blocks", "workers")
    INODE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    inode: _common_pb2.Inode
    blocks: _containers.RepeatedCompositeFieldContainer[_common_pb2.Block]
    workers: _containers.RepeatedCompositeFieldContainer[_common_pb2.WorkerInfo]
    def __init__(self, inode: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ..., blocks: _Optional[_Iterable[_Union[_common_pb2.Block, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[_common_pb2.WorkerInfo, _Mapping]]] = ...) -> None: ...

class AddBlockRequest(_message.Message):
    __slots__ = ("ino", "client_host_id", "size_hint", "exclude_workers", "put_parent", "put_name")
    INO_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_HINT_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    PUT_PARENT_FIELD_NUMBER: _ClassVar[int]
    PUT_NAME_FIELD_NUMBER: _ClassVar[int]
    ino: int
    client_host_id: str
    size_hint: int
    exclude_workers: _containers.RepeatedScalarFieldContainer[int]
    put_parent: int
    put_name: bytes
    def __init__(self, ino: _Optional[int] = ..., client_host_id: _Optional[str] = ..., size_hint: _Optional[int] = ..., exclude_workers: _Optional[_Iterable[int]] = ..., put_parent: _Optional[int] = ..., put_name: _Optional[bytes] = ...) -> None: ...

class AddBlockReply(_message.Message):
    __slots__ = ("block_id", "workers", "block_token", "existing")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    workers: _containers.RepeatedCompositeFieldContainer[_common_pb2.WorkerInfo]
    block_token: bytes
    existing: _common_pb2.Inode
    def __init__(self, block_id: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[_common_pb2.WorkerInfo, _Mapping]]] = ..., block_token: _Optional[bytes] = ..., existing: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ...) -> None: ...

class LookupManyRequest(_message.Message):
    __slots__ = ("parent", "names", "with_blocks")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    WITH_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    parent: int
    names: _containers.RepeatedScalarFieldContainer[bytes]
    with_blocks: bool
    def __init__(self, parent: _Optional[int] = ..., names: _Optional[_Iterable[bytes]] = ..., with_blocks: _Optional[bool] = ...) -> None: ...

class LookupResult(_message.Message):
    __slots__ = ("inode", "blocks")
    INODE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    inode: _common_pb2.Inode
    blocks: _containers.RepeatedCompositeFieldContainer[_common_pb2.Block]
    def __init__(self, inode: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ..., blocks: _Optional[_Iterable[_Union[_common_pb2.Block, _Mapping]]] = ...) -> None: ...

class LookupManyReply(_message.Message):
    __slots__ = ("results", "workers")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[LookupResult]
    workers: _containers.RepeatedCompositeFieldContainer[_common_pb2.WorkerInfo]
    def __init__(self, results: _Optional[_Iterable[_Union[LookupResult, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[_common_pb2.WorkerInfo, _Mapping]]] = ...) -> None: ...

class PutFileRequest(_message.Message):
    __slots__ = ("request_id", "parent", "name", "mode", "uid", "gid", "blocks", "size", "mtime_ns", "session")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    name: bytes
    mode: int
    uid: int
    gid: int
    blocks: _containers.RepeatedCompositeFieldContainer[_common_pb2.Block]
    size: int
    mtime_ns: int
    session: int
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[_common_pb2.Block, _Mapping]]] = ..., size: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., session: _Optional[int] = ...) -> None: ...

class PutFileReply(_message.Message):
    __slots__ = ("inode", "existed")
    INODE_FIELD_NUMBER: _ClassVar[int]
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    inode: _common_pb2.Inode
    existed: bool
    def __init__(self, inode: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ..., existed: _Optional[bool] = ...) -> None: ...

class AddBlocksForPutRequest(_message.Message):
    __slots__ = ("parent", "names", "sizes", "client_host_id")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_ID_FIELD_NUMBER: _ClassVar[int]
    parent: int
    names: _containers.RepeatedScalarFieldContainer[bytes]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    client_host_id: str
    def __init__(self, parent: _Optional[int] = ..., names: _Optional[_Iterable[bytes]] = ..., sizes: _Optional[_Iterable[int]] = ..., client_host_id: _Optional[str] = ...) -> None: ...

class BlockGrant(_message.Message):
    __slots__ = ("block_id", "length", "worker_ids", "block_token")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    length: int
    worker_ids: _containers.RepeatedScalarFieldContainer[int]
    block_token: bytes
    def __init__(self, block_id: _Optional[int] = ..., length: _Optional[int] = ..., worker_ids: _Optional[_Iterable[int]] = ..., block_token: _Optional[bytes] = ...) -> None: ...

class PutReservation(_message.Message):
    __slots__ = ("existing", "blocks")
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    existing: _common_pb2.Inode
    blocks: _containers.RepeatedCompositeFieldContainer[BlockGrant]
    def __init__(self, existing: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ..., blocks: _Optional[_Iterable[_Union[BlockGrant, _Mapping]]] = ...) -> None: ...

class AddBlocksForPutReply(_message.Message):
    __slots__ = ("results", "workers")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutReservation]
    workers: _containers.RepeatedCompositeFieldContainer[_common_pb2.WorkerInfo]
    def __init__(self, results: _Optional[_Iterable[_Union[PutReservation, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[_common_pb2.WorkerInfo, _Mapping]]] = ...) -> None: ...

class PutFilesRequest(_message.Message):
    __slots__ = ("request_id", "parent", "files", "session", "abandoned")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    files: _containers.RepeatedCompositeFieldContainer[PutFileEntry]
    session: int
    abandoned: _containers.RepeatedCompositeFieldContainer[_common_pb2.Block]
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., files: _Optional[_Iterable[_Union[PutFileEntry, _Mapping]]] = ..., session: _Optional[int] = ..., abandoned: _Optional[_Iterable[_Union[_common_pb2.Block, _Mapping]]] = ...) -> None: ...

class PutFileEntry(_message.Message):
    __slots__ = ("name", "mode", "uid", "gid", "blocks", "size", "mtime_ns")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    mode: int
    uid: int
    gid: int
    blocks: _containers.RepeatedCompositeFieldContainer[_common_pb2.Block]
    size: int
    mtime_ns: int
    def __init__(self, name: _Optional[bytes] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[_common_pb2.Block, _Mapping]]] = ..., size: _Optional[int] = ..., mtime_ns: _Optional[int] = ...) -> None: ...

class PutFileResult(_message.Message):
    __slots__ = ("status", "inode", "error")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    status: PutStatus
    inode: _common_pb2.Inode
    error: str
    def __init__(self, status: _Optional[_Union[PutStatus, str]] = ..., inode: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class PutFilesReply(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutFileResult]
    def __init__(self, results: _Optional[_Iterable[_Union[PutFileResult, _Mapping]]] = ...) -> None: ...

class CompleteFileRequest(_message.Message):
    __slots__ = ("request_id", "ino", "blocks", "size", "mtime_ns", "if_unpublished", "session", "abandoned_block_ids", "open_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    IF_UNPUBLISHED_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    OPEN_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    ino: int
    blocks: _containers.RepeatedCompositeFieldContainer[_common_pb2.Block]
    size: int
    mtime_ns: int
    if_unpublished: bool
    session: int
    abandoned_block_ids: _containers.RepeatedScalarFieldContainer[int]
    open_id: int
    def __init__(self, request_id: _Optional[bytes] = ..., ino: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[_common_pb2.Block, _Mapping]]] = ..., size: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., if_unpublished: _Optional[bool] = ..., session: _Optional[int] = ..., abandoned_block_ids: _Optional[_Iterable[int]] = ..., open_id: _Optional[int] = ...) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("worker", "secret")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    worker: _common_pb2.WorkerInfo
    secret: bytes
    def __init__(self, worker: _Optional[_Union[_common_pb2.WorkerInfo, _Mapping]] = ..., secret: _Optional[bytes] = ...) -> None: ...

class RegisterWorkerReply(_message.Message):
    __slots__ = ("worker_id", "block_size", "block_key", "registration")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_KEY_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    block_size: int
    block_key: bytes
    registration: bytes
    def __init__(self, worker_id: _Optional[int] = ..., block_size: _Optional[int] = ..., block_key: _Optional[bytes] = ..., registration: _Optional[bytes] = ...) -> None: ...

class BlockReportRequest(_message.Message):
    __slots__ = ("worker_id", "block_ids", "block_mtimes_ns", "block_lengths", "registration")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_MTIMES_NS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    block_mtimes_ns: _containers.RepeatedScalarFieldContainer[int]
    block_lengths: _containers.RepeatedScalarFieldContainer[int]
    registration: bytes
    def __init__(self, worker_id: _Optional[int] = ..., block_ids: _Optional[_Iterable[int]] = ..., block_mtimes_ns: _Optional[_Iterable[int]] = ..., block_lengths: _Optional[_Iterable[int]] = ..., registration: _Optional[bytes] = ...) -> None: ...

class BlockReportReply(_message.Message):
    __slots__ = ("delete_block_ids",)
    DELETE_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    delete_block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, delete_block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "capacity", "used", "num_blocks", "replicated_block_ids", "failed_block_ids", "added_block_ids", "removed_block_ids", "changes_lost", "registration", "volumes", "bad_block_ids")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    FAILED_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    ADDED_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    CHANGES_LOST_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    VOLUMES_FIELD_NUMBER: _ClassVar[int]
    BAD_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    capacity: int
    used: int
    num_blocks: int
    replicated_block_ids: _containers.RepeatedScalarFieldContainer[int]
    failed_block_ids: _containers.RepeatedScalarFieldContainer[int]
    added_block_ids: _containers.RepeatedScalarFieldContainer[int]
    removed_block_ids: _containers.RepeatedScalarFieldContainer[int]
    changes_lost: bool
    registration: bytes
    volumes: _containers.RepeatedCompositeFieldContainer[_common_pb2.Volume]
    bad_block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, worker_id: _Optional[int] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., num_blocks: _Optional[int] = ..., replicated_block_ids: _Optional[_Iterable[int]] = ..., failed_block_ids: _Optional[_Iterable[int]] = ..., added_block_ids: _Optional[_Iterable[int]] = ..., removed_block_ids: _Optional[_Iterable[int]] = ..., changes_lost: _Optional[bool] = ..., registration: _Optional[bytes] = ..., volumes: _Optional[_Iterable[_Union[_common_pb2.Volume, _Mapping]]] = ..., bad_block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("delete_block_ids", "reregister", "replicate", "verify")
    DELETE_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    REPLICATE_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    delete_block_ids: _containers.RepeatedScalarFieldContainer[int]
    reregister: bool
    replicate: _containers.RepeatedCompositeFieldContainer[ReplicateCommand]
    verify: _containers.RepeatedCompositeFieldContainer[VerifyCommand]
    def __init__(self, delete_block_ids: _Optional[_Iterable[int]] = ..., reregister: _Optional[bool] = ..., replicate: _Optional[_Iterable[_Union[ReplicateCommand, _Mapping]]] = ..., verify: _Optional[_Iterable[_Union[VerifyCommand, _Mapping]]] = ...) -> None: ...

class VerifyCommand(_message.Message):
    __slots__ = ("block_id", "length", "checksum")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    length: int
    checksum: int
    def __init__(self, block_id: _Optional[int] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ...) -> None: ...

class ReplicateCommand(_message.Message):
    __slots__ = ("block_id", "length", "checksum", "sources")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    length: int
    checksum: int
    sources: _containers.RepeatedCompositeFieldContainer[_common_pb2.WorkerInfo]
    def __init__(self, block_id: _Optional[int] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ..., sources: _Optional[_Iterable[_Union[_common_pb2.WorkerInfo, _Mapping]]] = ...) -> None: ...

class ReplicationStatusRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class ReplicationStatusReply(_message.Message):
    __slots__ = ("under_replicated_blocks", "copies_in_flight", "lost_workers", "under_replicated_inos", "scanned")
    UNDER_REPLICATED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    COPIES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LOST_WORKERS_FIELD_NUMBER: _ClassVar[int]
    UNDER_REPLICATED_INOS_FIELD_NUMBER: _ClassVar[int]
    SCANNED_FIELD_NUMBER: _ClassVar[int]
    under_replicated_blocks: int
    copies_in_flight: int
    lost_workers: _containers.RepeatedScalarFieldContainer[int]
    under_replicated_inos: _containers.RepeatedScalarFieldContainer[int]
    scanned: bool
    def __init__(self, under_replicated_blocks: _Optional[int] = ..., copies_in_flight: _Optional[int] = ..., lost_workers: _Optional[_Iterable[int]] = ..., under_replicated_inos: _Optional[_Iterable[int]] = ..., scanned: _Optional[bool] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("dropped", "ack")
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    dropped: _containers.RepeatedScalarFieldContainer[int]
    ack: int
    def __init__(self, dropped: _Optional[_Iterable[int]] = ..., ack: _Optional[int] = ...) -> None: ...

class EndSessionsRequest(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sessions: _Optional[_Iterable[int]] = ...) -> None: ...

class NameKey(_message.Message):
    __slots__ = ("parent", "name")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    parent: int
    name: bytes
    def __init__(self, parent: _Optional[int] = ..., name: _Optional[bytes] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("session_id", "lease_ms", "invalidate_id", "names", "inodes")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    INVALIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    INODES_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    lease_ms: int
    invalidate_id: int
    names: _containers.RepeatedCompositeFieldContainer[NameKey]
    inodes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[int] = ..., lease_ms: _Optional[int] = ..., invalidate_id: _Optional[int] = ..., names: _Optional[_Iterable[_Union[NameKey, _Mapping]]] = ..., inodes: _Optional[_Iterable[int]] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("id", "lookup", "getattr", "create", "mkdir", "unlink", "rmdir", "rename", "complete", "setattr", "listdir", "statfs", "get_blocks", "add_block", "symlink", "make_node", "link", "release_inode", "set_xattr", "get_xattr", "list_xattr", "remove_xattr", "lookup_many", "put_file", "add_blocks_for_put", "put_files")
    ID_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_FIELD_NUMBER: _ClassVar[int]
    GETATTR_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    MKDIR_FIELD_NUMBER: _ClassVar[int]
    UNLINK_FIELD_NUMBER: _ClassVar[int]
    RMDIR_FIELD_NUMBER: _ClassVar[int]
    RENAME_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    SETATTR_FIELD_NUMBER: _ClassVar[int]
    LISTDIR_FIELD_NUMBER: _ClassVar[int]
    STATFS_FIELD_NUMBER: _ClassVar[int]
    GET_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ADD_BLOCK_FIELD_NUMBER: _ClassVar[int]
    SYMLINK_FIELD_NUMBER: _ClassVar[int]
    MAKE_NODE_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    RELEASE_INODE_FIELD_NUMBER: _ClassVar[int]
    SET_XATTR_FIELD_NUMBER: _ClassVar[int]
    GET_XATTR_FIELD_NUMBER: _ClassVar[int]
    LIST_XATTR_FIELD_NUMBER: _ClassVar[int]
    REMOVE_XATTR_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_MANY_FIELD_NUMBER: _ClassVar[int]
    PUT_FILE_FIELD_NUMBER: _ClassVar[int]
    ADD_BLOCKS_FOR_PUT_FIELD_NUMBER: _ClassVar[int]
    PUT_FILES_FIELD_NUMBER: _ClassVar[int]
    id: int
    lookup: LookupRequest
    getattr: GetAttrRequest
    create: CreateRequest
    mkdir: MkdirRequest
    unlink: UnlinkRequest
    rmdir: RmdirRequest
    rename: RenameRequest
    complete: CompleteFileRequest
    setattr: SetAttrRequest
    listdir: ListDirRequest
    statfs: StatFsRequest
    get_blocks: GetBlocksRequest
    add_block: AddBlockRequest
    symlink: SymlinkRequest
    make_node: MakeNodeRequest
    link: LinkRequest
    release_inode: ReleaseInodeRequest
    set_xattr: SetXattrRequest
    get_xattr: GetXattrRequest
    list_xattr: ListXattrRequest
    remove_xattr: RemoveXattrRequest
    lookup_many: LookupManyRequest
    put_file: PutFileRequest
    add_blocks_for_put: AddBlocksForPutRequest
    put_files: PutFilesRequest
    def __init__(self, id: _Optional[int] = ..., lookup: _Optional[_Union[LookupRequest, _Mapping]] = ..., getattr: _Optional[_Union[GetAttrRequest, _Mapping]] = ..., create: _Optional[_Union[CreateRequest, _Mapping]] = ..., mkdir: _Optional[_Union[MkdirRequest, _Mapping]] = ..., unlink: _Optional[_Union[UnlinkRequest, _Mapping]] = ..., rmdir: _Optional[_Union[RmdirRequest, _Mapping]] = ..., rename: _Optional[_Union[RenameRequest, _Mapping]] = ..., complete: _Optional[_Union[CompleteFileRequest, _Mapping]] = ..., setattr: _Optional[_Union[SetAttrRequest, _Mapping]] = ..., listdir: _Optional[_Union[ListDirRequest, _Mapping]] = ..., statfs: _Optional[_Union[StatFsRequest, _Mapping]] = ..., get_blocks: _Optional[_Union[GetBlocksRequest, _Mapping]] = ..., add_block: _Optional[_Union[AddBlockRequest, _Mapping]] = ..., symlink: _Optional[_Union[SymlinkRequest, _Mapping]] = ..., make_node: _Optional[_Union[MakeNodeRequest, _Mapping]] = ..., link: _Optional[_Union[LinkRequest, _Mapping]] = ..., release_inode: _Optional[_Union[ReleaseInodeRequest, _Mapping]] = ..., set_xattr: _Optional[_Union[SetXattrRequest, _Mapping]] = ..., get_xattr: _Optional[_Union[GetXattrRequest, _Mapping]] = ..., list_xattr: _Optional[_Union[ListXattrRequest, _Mapping]] = ..., remove_xattr: _Optional[_Union[RemoveXattrRequest, _Mapping]] = ..., lookup_many: _Optional[_Union[LookupManyRequest, _Mapping]] = ..., put_file: _Optional[_Union[PutFileRequest, _Mapping]] = ..., add_blocks_for_put: _Optional[_Union[AddBlocksForPutRequest, _Mapping]] = ..., put_files: _Optional[_Union[PutFilesRequest, _Mapping]] = ...) -> None: ...

class CallResult(_message.Message):
    __slots__ = ("id", "error_kind", "error", "inode", "parents", "listdir", "statfs", "blocks", "block", "empty", "xattr", "xattrs", "lookup_many", "put_file", "put_reservations", "put_files")
    ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    LISTDIR_FIELD_NUMBER: _ClassVar[int]
    STATFS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELD_NUMBER: _ClassVar[int]
    XATTR_FIELD_NUMBER: _ClassVar[int]
    XATTRS_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_MANY_FIELD_NUMBER: _ClassVar[int]
    PUT_FILE_FIELD_NUMBER: _ClassVar[int]
    PUT_RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    PUT_FILES_FIELD_NUMBER: _ClassVar[int]
    id: int
    error_kind: int
    error: str
    inode: InodeReply
    parents: ParentReply
    listdir: ListDirReply
    statfs: StatFsReply
    blocks: GetBlocksReply
    block: AddBlockReply
    empty: _common_pb2.Empty
    xattr: GetXattrReply
    xattrs: ListXattrReply
    lookup_many: LookupManyReply
    put_file: PutFileReply
    put_reservations: AddBlocksForPutReply
    put_files: PutFilesReply
    def __init__(self, id: _Optional[int] = ..., error_kind: _Optional[int] = ..., error: _Optional[str] = ..., inode: _Optional[_Union[InodeReply, _Mapping]] = ..., parents: _Optional[_Union[ParentReply, _Mapping]] = ..., listdir: _Optional[_Union[ListDirReply, _Mapping]] = ..., statfs: _Optional[_Union[StatFsReply, _Mapping]] = ..., blocks: _Optional[_Union[GetBlocksReply, _Mapping]] = ..., block: _Optional[_Union[AddBlockReply, _Mapping]] = ..., empty: _Optional[_Union[_common_pb2.Empty, _Mapping]] = ..., xattr: _Optional[_Union[GetXattrReply, _Mapping]] = ..., xattrs: _Optional[_Union[ListXattrReply, _Mapping]] = ..., lookup_many: _Optional[_Union[LookupManyReply, _Mapping]] = ..., put_file: _Optional[_Union[PutFileReply, _Mapping]] = ..., put_reservations: _Optional[_Union[AddBlocksForPutReply, _Mapping]] = ..., put_files: _Optional[_Union[PutFilesReply, _Mapping]] = ...) -> None: ...

class ReportAccessRequest(_message.Message):
    __slots__ = ("inos", "session", "closed_opens", "bad_copies")
    INOS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CLOSED_OPENS_FIELD_NUMBER: _ClassVar[int]
    BAD_COPIES_FIELD_NUMBER: _ClassVar[int]
    inos: _containers.RepeatedScalarFieldContainer[int]
    session: int
    closed_opens: _containers.RepeatedScalarFieldContainer[int]
    bad_copies: _containers.RepeatedCompositeFieldContainer[BadCopy]
    def __init__(self, inos: _Optional[_Iterable[int]] = ..., session: _Optional[int] = ..., closed_opens: _Optional[_Iterable[int]] = ..., bad_copies: _Optional[_Iterable[_Union[BadCopy, _Mapping]]] = ...) -> None: ...

class BadCopy(_message.Message):
    __slots__ = ("block_id", "worker_id")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    worker_id: int
    def __init__(self, block_id: _Optional[int] = ..., worker_id: _Optional[int] = ...) -> None: ...

class SetPolicyRequest(_message.Message):
    __slots__ = ("request_id", "ino", "ttl_ms", "replicas", "session")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    ino: int
    ttl_ms: int
    replicas: int
    session: int
    def __init__(self, request_id: _Optional[bytes] = ..., ino: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., replicas: _Optional[int] = ..., session: _Optional[int] = ...) -> None: ...

class CapacityStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CapacityStatusReply(_message.Message):
    __slots__ = ("capacity", "used", "estimated_used", "high", "low", "stats", "tracked_files")
    class StatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_USED_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    TRACKED_FILES_FIELD_NUMBER: _ClassVar[int]
    capacity: int
    used: int
    estimated_used: int
    high: float
    low: float
    stats: _containers.ScalarMap[str, int]
    tracked_files: int
    def __init__(self, capacity: _Optional[int] = ..., used: _Optional[int] = ..., estimated_used: _Optional[int] = ..., high: _Optional[float] = ..., low: _Optional[float] = ..., stats: _Optional[_Mapping[str, int]] = ..., tracked_files: _Optional[int] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerReport(_message.Message):
    __slots__ = ("worker_id", "address", "host_id", "state", "capacity", "used", "blocks", "heartbeat_age", "shares_disk_with")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_FIELD_NUMBER: _ClassVar[int]
    SHARES_DISK_WITH_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    address: str
    host_id: str
    state: str
    capacity: int
    used: int
    blocks: int
    heartbeat_age: float
    shares_disk_with: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, worker_id: _Optional[int] = ..., address: _Optional[str] = ..., host_id: _Optional[str] = ..., state: _Optional[str] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., blocks: _Optional[int] = ..., heartbeat_age: _Optional[float] = ..., shares_disk_with: _Optional[_Iterable[int]] = ...) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ("workers", "inodes", "files_with_data", "blocks", "block_locations", "under_replicated_blocks", "copies_in_flight", "replication_scanned", "capacity", "lookup_hits", "lookup_misses", "lease_stats", "lease_sessions", "applied_seq", "journal_first_seq", "checkpoint_seq", "uptime", "inline_bytes")
    class LeaseStatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    INODES_FIELD_NUMBER: _ClassVar[int]
    FILES_WITH_DATA_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    UNDER_REPLICATED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    COPIES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_SCANNED_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_HITS_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_MISSES_FIELD_NUMBER: _ClassVar[int]
    LEASE_STATS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_SEQ_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SEQ_FIELD_NUMBER: _ClassVar[int]
    UPTIME_FIELD_NUMBER: _ClassVar[int]
    INLINE_BYTES_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerReport]
    inodes: int
    files_with_data: int
    blocks: int
    block_locations: int
    under_replicated_blocks: int
    copies_in_flight: int
    replication_scanned: bool
    capacity: CapacityStatusReply
    lookup_hits: int
    lookup_misses: int
    lease_stats: _containers.ScalarMap[str, int]
    lease_sessions: int
    applied_seq: int
    journal_first_seq: int
    checkpoint_seq: int
    uptime: float
    inline_bytes: int
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerReport, _Mapping]]] = ..., inodes: _Optional[int] = ..., files_with_data: _Optional[int] = ..., blocks: _Optional[int] = ..., block_locations: _Optional[int] = ..., under_replicated_blocks: _Optional[int] = ..., copies_in_flight: _Optional[int] = ..., replication_scanned: _Optional[bool] = ..., capacity: _Optional[_Union[CapacityStatusReply, _Mapping]] = ..., lookup_hits: _Optional[int] = ..., lookup_misses: _Optional[int] = ..., lease_stats: _Optional[_Mapping[str, int]] = ..., lease_sessions: _Optional[int] = ..., applied_seq: _Optional[int] = ..., journal_first_seq: _Optional[int] = ..., checkpoint_seq: _Optional[int] = ..., uptime: _Optional[float] = ..., inline_bytes: _Optional[int] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetGroupRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StepDownRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FetchCheckpointRequest(_message.Message):
    __slots__ = ("min_seq",)
    MIN_SEQ_FIELD_NUMBER: _ClassVar[int]
    min_seq: int
    def __init__(self, min_seq: _Optional[int] = ...) -> None: ...

class CheckpointChunk(_message.Message):
    __slots__ = ("seq", "file", "data")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    seq: int
    file: str
    data: bytes
    def __init__(self, seq: _Optional[int] = ..., file: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class GroupMember(_message.Message):
    __slots__ = ("id", "grpc", "role", "applied_seq", "lag_records")
    ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAG_RECORDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    grpc: str
    role: str
    applied_seq: int
    lag_records: int
    def __init__(self, id: _Optional[str] = ..., grpc: _Optional[str] = ..., role: _Optional[str] = ..., applied_seq: _Optional[int] = ..., lag_records: _Optional[int] = ...) -> None: ...

class GetGroupReply(_message.Message):
    __slots__ = ("members", "commit_seq", "leader", "answered_by")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_SEQ_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[GroupMember]
    commit_seq: int
    leader: str
    answered_by: str
    def __init__(self, members: _Optional[_Iterable[_Union[GroupMember, _Mapping]]] = ..., commit_seq: _Optional[int] = ..., leader: _Optional[str] = ..., answered_by: _Optional[str] = ...) -> None: ...

class CheckpointReply(_message.Message):
    __slots__ = ("seq", "path", "retired_segments")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RETIRED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    path: str
    retired_segments: int
    def __init__(self, seq: _Optional[int] = ..., path: _Optional[str] = ..., retired_segments: _Optional[int] = ...) -> None: ...
