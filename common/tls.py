"""TLS for every gRPC connection of a curvine process (optional, off by default).

Keys of ``[security]``:

- ``tls_cert`` + ``tls_key``: this process's certificate chain and private key (PEM).
  Servers present them; clients present them as their client certificate.
- ``tls_ca``: CA bundle (PEM) used to verify peers: clients verify servers with it,
  and servers verify clients with it when ``tls_client_auth`` is on.
- ``tls_client_auth``: servers require a client certificate signed by ``tls_ca``.
- ``tls_server_name``: the name clients check in server certificates instead of the
  host of the address they dial.

TLS is on when ``tls_ca`` is set.  A process with ``tls_ca`` but no certificate is a
client of server-only TLS (it verifies servers, presents no certificate); it cannot
serve, and servers with ``tls_client_auth`` refuse it.  Inconsistent combinations are
refused by :func:`problems` at config time.

The material (:func:`load`) is part of a process's ``common.security.Security``: with it
``common.rpc.bind`` opens secure ports and ``common.rpc.make_channel`` makes secure
channels, through the credentials built here from the material they are given.
Files are read when the config is checked and when the process loads its Security,
both at start: rotating certificates means restarting the process.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field

import grpc

from .errors import ConfigError

MAX_PEM = 1 << 20  # a CA bundle of a whole distribution is ~200 KiB
_CERT_MARK = b"-----BEGIN CERTIFICATE-----"
_KEY_MARKS = (b"-----BEGIN PRIVATE KEY-----", b"-----BEGIN RSA PRIVATE KEY-----",
              b"-----BEGIN EC PRIVATE KEY-----")
_ENCRYPTED_KEY_MARKS = (b"-----BEGIN ENCRYPTED PRIVATE KEY-----", b"Proc-Type: 4,ENCRYPTED")


class TLSError(ConfigError):
    """A TLS file or combination of keys cannot be used; one line naming the key."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclass(frozen=True)
class Material:
    """What one process read from its TLS files."""
    cert: bytes | None       # chain, PEM
    key: bytes | None = field(repr=False)  # private key, PEM (never logged)
    ca: bytes                # CA bundle, PEM
    client_auth: bool
    server_name: str


def problems(sec):
    """Yield ``(key, message)`` for the first problem of ``sec``'s TLS keys (a
    SecurityConfig): an inconsistent combination, else a file that cannot be used."""
    try:
        load(sec)
    except TLSError as e:
        yield e.key, e.message


def _inconsistency(sec) -> tuple[str, str] | None:
    """``(key, message)`` for keys of ``sec`` that cannot go together, else None."""
    on = bool(sec.tls_cert or sec.tls_key or sec.tls_ca)
    if sec.tls_key and not sec.tls_cert:
        return ("security.tls_key",
                "is set but security.tls_cert is not (a key needs its certificate)")
    if sec.tls_cert and not sec.tls_key:
        return ("security.tls_cert",
                "is set but security.tls_key is not (a certificate needs its key)")
    if on and not sec.tls_ca:
        return ("security.tls_ca", "must be set when security.tls_cert is (the CA that peers' "
                "certificates chain to; every daemon is also a client of others)")
    if sec.tls_client_auth and not sec.tls_ca:
        return ("security.tls_client_auth", "needs security.tls_ca, tls_cert and tls_key "
                "(servers verify client certificates with the CA)")
    if sec.tls_client_auth and not sec.tls_cert:
        return ("security.tls_client_auth", "needs security.tls_cert and tls_key: with mutual "
                "TLS every process, clients too, must present a certificate")
    if sec.tls_server_name and not on:
        return "security.tls_server_name", "is set but TLS is off (set security.tls_ca)"
    if sec.tls_server_name and not _valid_name(sec.tls_server_name):
        return "security.tls_server_name", f"{sec.tls_server_name!r} is not a host name"
    return None


def _valid_name(name: str) -> bool:
    return len(name) <= 253 and all(33 <= ord(c) <= 126 for c in name) and "/" not in name


def load(sec) -> Material | None:
    """The TLS material named by ``sec``; None when TLS is off; TLSError naming the key
    (and file) when the keys do not go together, a file is unreadable, not PEM, or the
    key does not fit the cert."""
    found = _inconsistency(sec)
    if found:
        raise TLSError(*found)
    if not sec.tls_ca:
        return None
    ca = _read_pem("security.tls_ca", sec.tls_ca, (_CERT_MARK,), "certificates")
    _check_certs("security.tls_ca", sec.tls_ca, ca)
    cert = key = None
    if sec.tls_cert:
        cert = _read_pem("security.tls_cert", sec.tls_cert, (_CERT_MARK,), "a certificate")
        _check_certs("security.tls_cert", sec.tls_cert, cert)
        key = _read_pem("security.tls_key", sec.tls_key, _KEY_MARKS, "a private key")
        _check_pair(sec.tls_cert, sec.tls_key)
    return Material(cert, key, ca, client_auth=bool(sec.tls_client_auth),
                    server_name=sec.tls_server_name)


def load_client(ca: tuple[str, str], cert: tuple[str, str] | None = None,
                key: tuple[str, str] | None = None) -> Material:
    """The material of a client of some other TLS service (the master group's etcd:
    master/group/etcd_access.py), each file given as ``(config key, path)``: the CA
    that service's certificate chains to and, for a service that asks for client
    certificates, this process's certificate and key.  Checked like :func:`load`;
    TLSError naming the config key of the file at fault."""
    ca_pem = _read_pem(ca[0], ca[1], (_CERT_MARK,), "certificates")
    _check_certs(ca[0], ca[1], ca_pem)
    cert_pem = key_pem = None
    if cert is not None and key is not None:
        cert_pem = _read_pem(cert[0], cert[1], (_CERT_MARK,), "a certificate")
        _check_certs(cert[0], cert[1], cert_pem)
        key_pem = _read_pem(key[0], key[1], _KEY_MARKS, "a private key")
        _check_pair(cert[1], key[1], key[0])
    return Material(cert_pem, key_pem, ca_pem, client_auth=False, server_name="")


def _read_pem(key: str, path: str, marks: tuple[bytes, ...], what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PEM + 1)
    except OSError as e:
        raise TLSError(key, f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > MAX_PEM:
        raise TLSError(key, f"{path} is larger than {MAX_PEM} bytes")
    if marks is _KEY_MARKS and any(m in data for m in _ENCRYPTED_KEY_MARKS):
        raise TLSError(key, f"{path} is encrypted; gRPC needs an unencrypted key "
                            "(protect it with file mode 0600)")
    if not any(m in data for m in marks):
        raise TLSError(key, f"{path} is not PEM holding {what} "
                            f"(no '{marks[0].decode()}' line)")
    return data


def _check_certs(key: str, path: str, data: bytes) -> None:
    """Every certificate in ``data`` parses."""
    try:
        ssl.create_default_context(cadata=data.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as e:
        raise TLSError(key, f"{path}: cannot parse its certificates ({_reason(e)})") from None


def _check_pair(cert_path: str, key_path: str, name: str = "security.tls_key") -> None:
    """The key parses and is the certificate's key (``name``: the key's config key)."""
    def no_password():  # never prompt on a terminal for an encrypted key
        raise TLSError(name, f"{key_path} is encrypted; gRPC needs an unencrypted key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert_path, key_path, password=no_password)
    except ssl.SSLError as e:
        reason = _reason(e)
        if reason == "KEY_VALUES_MISMATCH":
            raise TLSError(name, f"{key_path} is not the key of the certificate in "
                                 f"{cert_path}") from None
        raise TLSError(name, f"{key_path}: cannot use the key with {cert_path} "
                             f"({reason})") from None
    except OSError as e:  # a file went away since it was read
        raise TLSError(name, f"cannot read {key_path}: {e.strerror or e}") from None


def _reason(e: Exception) -> str:
    return str(getattr(e, "reason", None) or e)


# -- credentials of a material --------------------------------------------------------
def server_credentials(m: Material) -> grpc.ServerCredentials:
    """Credentials for server ports with ``m``; TLSError when it has no certificate of
    its own (a client-only config cannot serve)."""
    if m.cert is None:
        raise TLSError("security.tls_cert", "a server needs security.tls_cert and "
                                            "security.tls_key when TLS is on")
    return grpc.ssl_server_credentials(
        [(m.key, m.cert)],
        root_certificates=m.ca if m.client_auth else None,
        require_client_auth=m.client_auth)


def channel_credentials(m: Material) -> grpc.ChannelCredentials:
    """Credentials of channels with ``m``: verify servers with its CA, present its
    certificate (if any)."""
    return grpc.ssl_channel_credentials(
        root_certificates=m.ca, private_key=m.key, certificate_chain=m.cert)


def channel_options(m: Material | None) -> list[tuple[str, str]]:
    """Extra channel options: the server-name override, when configured."""
    if m is not None and m.server_name:
        return [("grpc.ssl_target_name_override", m.server_name)]
    return []


# -- ssl contexts of a material (the master's call port: master/ports/call_port_server.py) ---------
def server_ssl_context(m: Material) -> ssl.SSLContext:
    """The call port's TLS: what server_credentials gives gRPC ports (this process's
    certificate; a client certificate signed by the CA required with client_auth)."""
    if m.cert is None:
        raise TLSError("security.tls_cert", "a server needs security.tls_cert and "
                                            "security.tls_key when TLS is on")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, m)
    if m.client_auth:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=m.ca.decode("ascii", "replace"))
    return ctx


def client_ssl_context(m: Material) -> ssl.SSLContext:
    """A call-port client's TLS: verify the master with the CA (and its name, as
    channel_name says), present this process's certificate if it has one."""
    ctx = ssl.create_default_context(cadata=m.ca.decode("ascii", "replace"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if m.cert is not None:
        _load_chain(ctx, m)
    return ctx


def client_side(m: Material | None, host: str) -> tuple[ssl.SSLContext | None, str]:
    """(client_ssl_context, the name to check in the server's certificate, as gRPC
    does) of a call-port client dialling ``host``; (None, "") when TLS is off."""
    if m is None:
        return None, ""
    return client_ssl_context(m), m.server_name or host


def _load_chain(ctx: ssl.SSLContext, m: Material) -> None:
    """ssl loads a certificate chain only from files: hand it the very bytes that were
    read and checked at start, through anonymous memory files (never on disk)."""
    fds = []
    try:
        for name, data in (("cert", m.cert), ("key", m.key)):
            fd = os.memfd_create(f"curvine-tls-{name}", os.MFD_CLOEXEC)
            fds.append(fd)
            os.write(fd, data)
        ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
    finally:
        for fd in fds:
            os.close(fd)
