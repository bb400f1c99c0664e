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
