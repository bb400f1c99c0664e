from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FileType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_TYPE_UNSPECIFIED: _ClassVar[FileType]
    FILE: _ClassVar[FileType]
    DIRECTORY: _ClassVar[FileType]
    SYMLINK: _ClassVar[FileType]
    FIFO: _ClassVar[FileType]
    SOCKET: _ClassVar[FileType]
    CHAR_DEVICE: _ClassVar[FileType]
    BLOCK_DEVICE: _ClassVar[FileType]

class FileState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_STATE_UNSPECIFIED: _ClassVar[FileState]
    WRITING: _ClassVar[FileState]
    COMPLETE: _ClassVar[FileState]
FILE_TYPE_UNSPECIFIED: FileType
FILE: FileType
DIRECTORY: FileType
SYMLINK: FileType
FIFO: FileType
SOCKET: FileType
CHAR_DEVICE: FileType
BLOCK_DEVICE: FileType
FILE_STATE_UNSPECIFIED: FileState
WRITING: FileState
COMPLETE: FileState

class Inode(_message.Message):
    __slots__ = ("ino", "type", "mode", "uid", "gid", "size", "atime_ns", "mtime_ns", "ctime_ns", "nlink", "state", "ttl_ms", "version", "parent", "replicas", "name", "symlink_target", "rdev", "stored")
    INO_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    ATIME_NS_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    CTIME_NS_FIELD_NUMBER: _ClassVar[int]
    NLINK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SYMLINK_TARGET_FIELD_NUMBER: _ClassVar[int]
    RDEV_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    ino: int
    type: FileType
    mode: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    nlink: int
    state: FileState
    ttl_ms: int
    version: int
    parent: int
    replicas: int
    name: bytes
    symlink_target: bytes
    rdev: int
    stored: int
    def __init__(self, ino: _Optional[int] = ..., type: _Optional[_Union[FileType, str]] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., size: _Optional[int] = ..., atime_ns: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., ctime_ns: _Optional[int] = ..., nlink: _Optional[int] = ..., state: _Optional[_Union[FileState, str]] = ..., ttl_ms: _Optional[int] = ..., version: _Optional[int] = ..., parent: _Optional[int] = ..., replicas: _Optional[int] = ..., name: _Optional[bytes] = ..., symlink_target: _Optional[bytes] = ..., rdev: _Optional[int] = ..., stored: _Optional[int] = ...) -> None: ...

class Block(_message.Message):
    __slots__ = ("block_id", "length", "checksum", "worker_ids", "token", "data")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    length: int
    checksum: int
    worker_ids: _containers.RepeatedScalarFieldContainer[int]
    token: bytes
    data: bytes
    def __init__(self, block_id: _Optional[int] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ..., worker_ids: _Optional[_Iterable[int]] = ..., token: _Optional[bytes] = ..., data: _Optional[bytes] = ...) -> None: ...

class BlockList(_message.Message):
    __slots__ = ("blocks",)
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[Block]
    def __init__(self, blocks: _Optional[_Iterable[_Union[Block, _Mapping]]] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "uuid", "host_id", "address", "data_dirs", "capacity", "used", "lost", "secret_digest", "data_address", "volumes")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_DIRS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    SECRET_DIGEST_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    VOLUMES_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    uuid: str
    host_id: str
    address: str
    data_dirs: _containers.RepeatedScalarFieldContainer[str]
    capacity: int
    used: int
    lost: bool
    secret_digest: bytes
    data_address: str
    volumes: _containers.RepeatedCompositeFieldContainer[Volume]
    def __init__(self, worker_id: _Optional[int] = ..., uuid: _Optional[str] = ..., host_id: _Optional[str] = ..., address: _Optional[str] = ..., data_dirs: _Optional[_Iterable[str]] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., lost: _Optional[bool] = ..., secret_digest: _Optional[bytes] = ..., data_address: _Optional[str] = ..., volumes: _Optional[_Iterable[_Union[Volume, _Mapping]]] = ...) -> None: ...

class Volume(_message.Message):
    __slots__ = ("fs_id", "free")
    FS_ID_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    fs_id: str
    free: int
    def __init__(self, fs_id: _Optional[str] = ..., free: _Optional[int] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
