from curvine.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WriteBlockHeader(_message.Message):
    __slots__ = ("block_id", "expected_length", "token")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    expected_length: int
    token: bytes
    def __init__(self, block_id: _Optional[int] = ..., expected_length: _Optional[int] = ..., token: _Optional[bytes] = ...) -> None: ...

class WriteBlockRequest(_message.Message):
    __slots__ = ("header", "data", "finish", "checksum")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FINISH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    header: WriteBlockHeader
    data: bytes
    finish: bool
    checksum: int
    def __init__(self, header: _Optional[_Union[WriteBlockHeader, _Mapping]] = ..., data: _Optional[bytes] = ..., finish: _Optional[bool] = ..., checksum: _Optional[int] = ...) -> None: ...

class WriteBlockReply(_message.Message):
    __slots__ = ("block_id", "length", "checksum")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    length: int
    checksum: int
    def __init__(self, block_id: _Optional[int] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ...) -> None: ...

class ReadBlockRequest(_message.Message):
    __slots__ = ("block_id", "offset", "length", "chunk_size", "token")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    offset: int
    length: int
    chunk_size: int
    token: bytes
    def __init__(self, block_id: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., chunk_size: _Optional[int] = ..., token: _Optional[bytes] = ...) -> None: ...

class ReadBlockReply(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class DeleteBlocksRequest(_message.Message):
    __slots__ = ("block_ids", "tokens")
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    tokens: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, block_ids: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Iterable[bytes]] = ...) -> None: ...

class GetBlockInfoRequest(_message.Message):
    __slots__ = ("block_id", "token")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    token: bytes
    def __init__(self, block_id: _Optional[int] = ..., token: _Optional[bytes] = ...) -> None: ...

class AdoptBlockRequest(_message.Message):
    __slots__ = ("block_id", "path", "length", "checksum", "token")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    path: str
    length: int
    checksum: int
    token: bytes
    def __init__(self, block_id: _Optional[int] = ..., path: _Optional[str] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ..., token: _Optional[bytes] = ...) -> None: ...

class BlockInfoReply(_message.Message):
    __slots__ = ("block_id", "length", "path")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    length: int
    path: str
    def __init__(self, block_id: _Optional[int] = ..., length: _Optional[int] = ..., path: _Optional[str] = ...) -> None: ...

class LocalRequest(_message.Message):
    __slots__ = ("hello", "open_read", "open_write", "finish_write", "abort_write", "adopt")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    OPEN_READ_FIELD_NUMBER: _ClassVar[int]
    OPEN_WRITE_FIELD_NUMBER: _ClassVar[int]
    FINISH_WRITE_FIELD_NUMBER: _ClassVar[int]
    ABORT_WRITE_FIELD_NUMBER: _ClassVar[int]
    ADOPT_FIELD_NUMBER: _ClassVar[int]
    hello: LocalHello
    open_read: LocalOpenRead
    open_write: LocalOpenWrite
    finish_write: LocalFinishWrite
    abort_write: LocalAbortWrite
    adopt: LocalAdopt
    def __init__(self, hello: _Optional[_Union[LocalHello, _Mapping]] = ..., open_read: _Optional[_Union[LocalOpenRead, _Mapping]] = ..., open_write: _Optional[_Union[LocalOpenWrite, _Mapping]] = ..., finish_write: _Optional[_Union[LocalFinishWrite, _Mapping]] = ..., abort_write: _Optional[_Union[LocalAbortWrite, _Mapping]] = ..., adopt: _Optional[_Union[LocalAdopt, _Mapping]] = ...) -> None: ...

class LocalHello(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LocalOpenRead(_message.Message):
    __slots__ = ("block_id", "token")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    token: bytes
    def __init__(self, block_id: _Optional[int] = ..., token: _Optional[bytes] = ...) -> None: ...

class LocalOpenWrite(_message.Message):
    __slots__ = ("block_id", "token", "expected_length")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    token: bytes
    expected_length: int
    def __init__(self, block_id: _Optional[int] = ..., token: _Optional[bytes] = ..., expected_length: _Optional[int] = ...) -> None: ...

class LocalFinishWrite(_message.Message):
    __slots__ = ("block_id", "token", "length", "checksum")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    token: bytes
    length: int
    checksum: int
    def __init__(self, block_id: _Optional[int] = ..., token: _Optional[bytes] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ...) -> None: ...

class LocalAdopt(_message.Message):
    __slots__ = ("block_id", "token", "path", "length", "checksum")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    token: bytes
    path: str
    length: int
    checksum: int
    def __init__(self, block_id: _Optional[int] = ..., token: _Optional[bytes] = ..., path: _Optional[str] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ...) -> None: ...

class LocalAbortWrite(_message.Message):
    __slots__ = ("block_id",)
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    def __init__(self, block_id: _Optional[int] = ...) -> None: ...

class LocalReply(_message.Message):
    __slots__ = ("error_kind", "error", "uuid", "worker_id", "length", "checksum")
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    error_kind: int
    error: str
    uuid: str
    worker_id: int
    length: int
    checksum: int
    def __init__(self, error_kind: _Optional[int] = ..., error: _Optional[str] = ..., uuid: _Optional[str] = ..., worker_id: _Optional[int] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ...) -> None: ...
