"""The one error type that crosses the wire.

Every failure a caller should understand is a ``CurvineError`` carrying an
``ErrorKind``.  Kinds are stable numbers on the wire (never renumber them); a server
sends the kind as gRPC trailing metadata next to a matching status code, a client
turns it back into a ``CurvineError``, and the FUSE edge maps it to an errno in one
function (:func:`to_errno`).  Anything unknown becomes ``IO`` (EIO).

``ConfigError`` is the other error every process knows: a configuration that cannot
work, found at start (never on the wire; daemons exit 2 with its one line).
"""

from __future__ import annotations

import enum
import errno

import grpc


class ErrorKind(enum.IntEnum):
    OK = 0
    NOT_FOUND = 1
    EXISTS = 2
    NOT_DIR = 3
    IS_DIR = 4
    NOT_EMPTY = 5
    INVALID = 6  # bad input: the message names the field
    NAME_TOO_LONG = 7
    NO_SPACE = 8
    PERMISSION = 9
    UNAVAILABLE = 10  # master or worker not reachable; retry may help
    IO = 11  # anything unexpected
    STALE = 12  # a handle refers to something that no longer exists
    UNAUTHENTICATED = 13
    NOT_SUPPORTED = 14
    CHECKSUM = 15  # data did not match its checksum
    TIMEOUT = 16
    BUSY = 17
    NO_DATA = 18  # no such extended attribute (ENODATA)
    TOO_BIG = 19  # an extended attribute value or list beyond the limits (E2BIG)
    NOT_PERMITTED = 20  # EPERM: e.g. a hard link to a directory
    TOO_MANY_LINKS = 21  # EMLINK
    FILE_TOO_BIG = 22  # EFBIG: past the largest file (common/ids.max_file_size)
    # a standby master (or a leader that lost its lease) cannot serve this call: the
    # message is the leader's gRPC address ("host:port", "" if unknown), also sent as
    # the trailer LEADER_KEY; clients move there (master group, docs/architecture.md)
    NOT_LEADER = 23


_ERRNO = {
    ErrorKind.NOT_FOUND: errno.ENOENT,
    ErrorKind.EXISTS: errno.EEXIST,
    ErrorKind.NOT_DIR: errno.ENOTDIR,
    ErrorKind.IS_DIR: errno.EISDIR,
    ErrorKind.NOT_EMPTY: errno.ENOTEMPTY,
    ErrorKind.INVALID: errno.EINVAL,
    ErrorKind.NAME_TOO_LONG: errno.ENAMETOOLONG,
    ErrorKind.NO_SPACE: errno.ENOSPC,
    ErrorKind.PERMISSION: errno.EACCES,
    ErrorKind.UNAVAILABLE: errno.EIO,
    ErrorKind.IO: errno.EIO,
    ErrorKind.STALE: errno.ESTALE,
    ErrorKind.UNAUTHENTICATED: errno.EACCES,
    ErrorKind.NOT_SUPPORTED: errno.EOPNOTSUPP,
    ErrorKind.CHECKSUM: errno.EIO,
    ErrorKind.TIMEOUT: errno.ETIMEDOUT,
    ErrorKind.BUSY: errno.EBUSY,
    ErrorKind.NO_DATA: errno.ENODATA,
    ErrorKind.TOO_BIG: errno.E2BIG,
    ErrorKind.NOT_PERMITTED: errno.EPERM,
    ErrorKind.TOO_MANY_LINKS: errno.EMLINK,
    ErrorKind.FILE_TOO_BIG: errno.EFBIG,
    ErrorKind.NOT_LEADER: errno.EIO,
}

_STATUS = {
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorKind.NOT_DIR: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.IS_DIR: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.NOT_EMPTY: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NAME_TOO_LONG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NO_SPACE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.PERMISSION: grpc.StatusCode.PERMISSION_DENIED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.IO: grpc.StatusCode.INTERNAL,
    ErrorKind.STALE: grpc.StatusCode.NOT_FOUND,
    ErrorKind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorKind.NOT_SUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorKind.CHECKSUM: grpc.StatusCode.DATA_LOSS,
    ErrorKind.TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorKind.BUSY: grpc.StatusCode.ABORTED,
    ErrorKind.NO_DATA: grpc.StatusCode.NOT_FOUND,
    ErrorKind.TOO_BIG: grpc.StatusCode.OUT_OF_RANGE,
    ErrorKind.NOT_PERMITTED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorKind.TOO_MANY_LINKS: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.FILE_TOO_BIG: grpc.StatusCode.OUT_OF_RANGE,
    ErrorKind.NOT_LEADER: grpc.StatusCode.UNAVAILABLE,
}

# gRPC statuses that arrive without our trailer (raised by the transport itself).
_KIND_OF_STATUS = {
    grpc.StatusCode.UNAVAILABLE: ErrorKind.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorKind.TIMEOUT,
    grpc.StatusCode.UNAUTHENTICATED: ErrorKind.UNAUTHENTICATED,
    grpc.StatusCode.INVALID_ARGUMENT: ErrorKind.INVALID,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ErrorKind.NO_SPACE,
    grpc.StatusCode.NOT_FOUND: ErrorKind.NOT_FOUND,
    grpc.StatusCode.UNIMPLEMENTED: ErrorKind.NOT_SUPPORTED,
    grpc.StatusCode.PERMISSION_DENIED: ErrorKind.PERMISSION,
    grpc.StatusCode.CANCELLED: ErrorKind.UNAVAILABLE,
}

ERROR_KIND_KEY = "curvine-error-kind"
LEADER_KEY = "curvine-leader"  # trailer of a NOT_LEADER error: the leader's gRPC address


class ClusterError(Exception):
    """Starting, stopping or finding a local cluster failed; ``str()`` says why
    (devtools/local.py, common/cluster_config.py)."""


class ConfigError(Exception):
    """A config value, file or combination that cannot work: one line that names the
    key (and, when it came from a file, the file and line)."""


class CurvineError(Exception):
    """A failure with a stable kind; ``str()`` is a one-line human message."""

    def __init__(self, kind: ErrorKind, message: str = ""):
        self.kind = ErrorKind(kind)
        self.message = message or self.kind.name.lower().replace("_", " ")
        super().__init__(self.message)

    @property
    def errno(self) -> int:
        return to_errno(self.kind)

    def __repr__(self) -> str:
        return f"CurvineError({self.kind.name}, {self.message!r})"


def to_errno(kind: ErrorKind) -> int:
    return _ERRNO.get(kind, errno.EIO)


def status_code(kind: ErrorKind) -> grpc.StatusCode:
    return _STATUS.get(kind, grpc.StatusCode.INTERNAL)


def from_rpc_error(exc: grpc.RpcError) -> CurvineError:
    """Turn a client-side ``grpc.RpcError`` back into a ``CurvineError``."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == ERROR_KIND_KEY:
            try:
                return CurvineError(ErrorKind(int(value)), details or "")
            except ValueError:
                break
    kind = _KIND_OF_STATUS.get(code, ErrorKind.IO)
    return CurvineError(kind, f"{code.name if code else 'RPC'}: {details}")


def invalid(field: str, why: str) -> CurvineError:
    """Bad input: the message names the field."""
    return CurvineError(ErrorKind.INVALID, f"{field}: {why}")
