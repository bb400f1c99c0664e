from curvine.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EvictReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVICT_REASON_UNSPECIFIED: _ClassVar[EvictReason]
    EVICT_LRU: _ClassVar[EvictReason]
    EVICT_TTL: _ClassVar[EvictReason]
    EVICT_ORPHAN: _ClassVar[EvictReason]
    EVICT_UNLINKED: _ClassVar[EvictReason]
EVICT_REASON_UNSPECIFIED: EvictReason
EVICT_LRU: EvictReason
EVICT_TTL: EvictReason
EVICT_ORPHAN: EvictReason
EVICT_UNLINKED: EvictReason

class MkdirRecord(_message.Message):
    __slots__ = ("request_id", "parent", "name", "inode")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    name: bytes
    inode: _common_pb2.Inode
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., inode: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ...) -> None: ...

class CreateRecord(_message.Message):
    __slots__ = ("request_id", "parent", "name", "inode", "writer_session")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    WRITER_SESSION_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    name: bytes
    inode: _common_pb2.Inode
    writer_session: int
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., inode: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ..., writer_session: _Optional[int] = ...) -> None: ...

class UnlinkRecord(_message.Message):
    __slots__ = ("request_id", "parent", "name", "time_ns", "hold_session", "held")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    HOLD_SESSION_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    name: bytes
    time_ns: int
    hold_session: int
    held: int
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., time_ns: _Optional[int] = ..., hold_session: _Optional[int] = ..., held: _Optional[int] = ...) -> None: ...

class RenameRecord(_message.Message):
    __slots__ = ("request_id", "parent", "name", "new_parent", "new_name", "time_ns", "hold_session", "exchange", "held")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NEW_PARENT_FIELD_NUMBER: _ClassVar[int]
    NEW_NAME_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    HOLD_SESSION_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    name: bytes
    new_parent: int
    new_name: bytes
    time_ns: int
    hold_session: int
    exchange: bool
    held: int
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., new_parent: _Optional[int] = ..., new_name: _Optional[bytes] = ..., time_ns: _Optional[int] = ..., hold_session: _Optional[int] = ..., exchange: _Optional[bool] = ..., held: _Optional[int] = ...) -> None: ...

class MakeNodeRecord(_message.Message):
    __slots__ = ("request_id", "parent", "name", "inode")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    name: bytes
    inode: _common_pb2.Inode
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., inode: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ...) -> None: ...

class LinkRecord(_message.Message):
    __slots__ = ("request_id", "ino", "new_parent", "new_name", "time_ns")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    NEW_PARENT_FIELD_NUMBER: _ClassVar[int]
    NEW_NAME_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    ino: int
    new_parent: int
    new_name: bytes
    time_ns: int
    def __init__(self, request_id: _Optional[bytes] = ..., ino: _Optional[int] = ..., new_parent: _Optional[int] = ..., new_name: _Optional[bytes] = ..., time_ns: _Optional[int] = ...) -> None: ...

class XattrRecord(_message.Message):
    __slots__ = ("request_id", "ino", "name", "value", "remove", "time_ns")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    ino: int
    name: bytes
    value: bytes
    remove: bool
    time_ns: int
    def __init__(self, request_id: _Optional[bytes] = ..., ino: _Optional[int] = ..., name: _Optional[bytes] = ..., value: _Optional[bytes] = ..., remove: _Optional[bool] = ..., time_ns: _Optional[int] = ...) -> None: ...

class SetAttrRecord(_message.Message):
    __slots__ = ("request_id", "ino", "mode", "uid", "gid", "size", "atime_ns", "mtime_ns", "time_ns")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    ATIME_NS_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    ino: int
    mode: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    time_ns: int
    def __init__(self, request_id: _Optional[bytes] = ..., ino: _Optional[int] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., size: _Optional[int] = ..., atime_ns: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., time_ns: _Optional[int] = ...) -> None: ...

class CompleteRecord(_message.Message):
    __slots__ = ("request_id", "ino", "blocks", "size", "mtime_ns")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    ino: int
    blocks: _containers.RepeatedCompositeFieldContainer[_common_pb2.Block]
    size: int
    mtime_ns: int
    def __init__(self, request_id: _Optional[bytes] = ..., ino: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[_common_pb2.Block, _Mapping]]] = ..., size: _Optional[int] = ..., mtime_ns: _Optional[int] = ...) -> None: ...

class PutRecord(_message.Message):
    __slots__ = ("request_id", "parent", "name", "inode", "blocks")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    parent: int
    name: bytes
    inode: _common_pb2.Inode
    blocks: _containers.RepeatedCompositeFieldContainer[_common_pb2.Block]
    def __init__(self, request_id: _Optional[bytes] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., inode: _Optional[_Union[_common_pb2.Inode, _Mapping]] = ..., blocks: _Optional[_Iterable[_Union[_common_pb2.Block, _Mapping]]] = ...) -> None: ...

class PutManyRecord(_message.Message):
    __slots__ = ("puts",)
    PUTS_FIELD_NUMBER: _ClassVar[int]
    puts: _containers.RepeatedCompositeFieldContainer[PutRecord]
    def __init__(self, puts: _Optional[_Iterable[_Union[PutRecord, _Mapping]]] = ...) -> None: ...

class ReserveBlockIdsRecord(_message.Message):
    __slots__ = ("upto",)
    UPTO_FIELD_NUMBER: _ClassVar[int]
    upto: int
    def __init__(self, upto: _Optional[int] = ...) -> None: ...

class RegisterWorkerRecord(_message.Message):
    __slots__ = ("worker",)
    WORKER_FIELD_NUMBER: _ClassVar[int]
    worker: _common_pb2.WorkerInfo
    def __init__(self, worker: _Optional[_Union[_common_pb2.WorkerInfo, _Mapping]] = ...) -> None: ...

class DropLocationsRecord(_message.Message):
    __slots__ = ("worker_id", "block_ids", "time_ns")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    time_ns: int
    def __init__(self, worker_id: _Optional[int] = ..., block_ids: _Optional[_Iterable[int]] = ..., time_ns: _Optional[int] = ...) -> None: ...

class AddLocationsRecord(_message.Message):
    __slots__ = ("worker_id", "block_ids")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, worker_id: _Optional[int] = ..., block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class JournalEntry(_message.Message):
    __slots__ = ("mkdir", "create", "unlink", "rename", "set_attr", "complete", "reserve_block_ids", "register_worker", "drop_locations", "add_locations", "put", "make_node", "link", "xattr", "evict", "set_policy", "put_many")
    MKDIR_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    UNLINK_FIELD_NUMBER: _ClassVar[int]
    RENAME_FIELD_NUMBER: _ClassVar[int]
    SET_ATTR_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    RESERVE_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    REGISTER_WORKER_FIELD_NUMBER: _ClassVar[int]
    DROP_LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    ADD_LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    MAKE_NODE_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    XATTR_FIELD_NUMBER: _ClassVar[int]
    EVICT_FIELD_NUMBER: _ClassVar[int]
    SET_POLICY_FIELD_NUMBER: _ClassVar[int]
    PUT_MANY_FIELD_NUMBER: _ClassVar[int]
    mkdir: MkdirRecord
    create: CreateRecord
    unlink: UnlinkRecord
    rename: RenameRecord
    set_attr: SetAttrRecord
    complete: CompleteRecord
    reserve_block_ids: ReserveBlockIdsRecord
    register_worker: RegisterWorkerRecord
    drop_locations: DropLocationsRecord
    add_locations: AddLocationsRecord
    put: PutRecord
    make_node: MakeNodeRecord
    link: LinkRecord
    xattr: XattrRecord
    evict: EvictRecord
    set_policy: SetPolicyRecord
    put_many: PutManyRecord
    def __init__(self, mkdir: _Optional[_Union[MkdirRecord, _Mapping]] = ..., create: _Optional[_Union[CreateRecord, _Mapping]] = ..., unlink: _Optional[_Union[UnlinkRecord, _Mapping]] = ..., rename: _Optional[_Union[RenameRecord, _Mapping]] = ..., set_attr: _Optional[_Union[SetAttrRecord, _Mapping]] = ..., complete: _Optional[_Union[CompleteRecord, _Mapping]] = ..., reserve_block_ids: _Optional[_Union[ReserveBlockIdsRecord, _Mapping]] = ..., register_worker: _Optional[_Union[RegisterWorkerRecord, _Mapping]] = ..., drop_locations: _Optional[_Union[DropLocationsRecord, _Mapping]] = ..., add_locations: _Optional[_Union[AddLocationsRecord, _Mapping]] = ..., put: _Optional[_Union[PutRecord, _Mapping]] = ..., make_node: _Optional[_Union[MakeNodeRecord, _Mapping]] = ..., link: _Optional[_Union[LinkRecord, _Mapping]] = ..., xattr: _Optional[_Union[XattrRecord, _Mapping]] = ..., evict: _Optional[_Union[EvictRecord, _Mapping]] = ..., set_policy: _Optional[_Union[SetPolicyRecord, _Mapping]] = ..., put_many: _Optional[_Union[PutManyRecord, _Mapping]] = ...) -> None: ...

class EvictRecord(_message.Message):
    __slots__ = ("reason", "inos", "time_ns")
    REASON_FIELD_NUMBER: _ClassVar[int]
    INOS_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    reason: EvictReason
    inos: _containers.RepeatedScalarFieldContainer[int]
    time_ns: int
    def __init__(self, reason: _Optional[_Union[EvictReason, str]] = ..., inos: _Optional[_Iterable[int]] = ..., time_ns: _Optional[int] = ...) -> None: ...

class SetPolicyRecord(_message.Message):
    __slots__ = ("request_id", "ino", "ttl_ms", "replicas", "time_ns")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    ino: int
    ttl_ms: int
    replicas: int
    time_ns: int
    def __init__(self, request_id: _Optional[bytes] = ..., ino: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., replicas: _Optional[int] = ..., time_ns: _Optional[int] = ...) -> None: ...
