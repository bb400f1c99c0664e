"""How a master reaches the group's etcd: the [master] keys of TLS and authentication.

``etcd_from_config(cfg)`` is the one way to make the group's Etcd client from a Config
(the member, devtools): the endpoints, and

- TLS when ``master.etcd_ca_file`` is set: etcd's server certificate must chain to
  that CA (and name the endpoint dialled); ``etcd_cert_file`` + ``etcd_key_file`` are
  this master's client certificate, for an etcd started with --client-cert-auth;
- an etcd user when ``master.etcd_user`` is set, with the password read from
  ``master.etcd_password_file`` (one line; the password is never in the config, never
  logged).

Which keys go together is checked with the rest of the config (common/config.py); the
files are read here, by the masters only, at start (a worker sharing the config file
holds none of them): ``load`` raises ConfigError naming the key of the file at fault.
Rotating a certificate or the password means restarting the master.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from curvine.common import auth, tls
from curvine.common.config import Config, MasterConfig
from curvine.common.errors import ConfigError

from .etcd import CALL_TIMEOUT, Etcd


@dataclass(frozen=True)
class EtcdAccess:
    """What a master read of its etcd keys."""
    credentials: grpc.ChannelCredentials | None = None  # None: plaintext
    user: str = ""
    password: str = field(default="", repr=False)  # never logged


def load(m: MasterConfig) -> EtcdAccess:
    """The TLS material and password named by ``m``; ConfigError naming the key when a
    file cannot be used."""
    credentials = None
    if m.etcd_ca_file:
        material = tls.load_client(
            ("master.etcd_ca_file", m.etcd_ca_file),
            ("master.etcd_cert_file", m.etcd_cert_file) if m.etcd_cert_file else None,
            ("master.etcd_key_file", m.etcd_key_file) if m.etcd_key_file else None)
        credentials = tls.channel_credentials(material)
    password = ""
    if m.etcd_user:
        try:
            password = auth.read_token_file(m.etcd_password_file, "master.etcd_password_file")
        except auth.TokenError as e:
            raise ConfigError(str(e)) from None
    return EtcdAccess(credentials, m.etcd_user, password)


def etcd_from_config(cfg: Config, timeout: float = CALL_TIMEOUT) -> Etcd:
    """An Etcd on ``cfg.master.etcd_endpoints`` with the TLS and user ``cfg`` names."""
    access = load(cfg.master)
    return Etcd(list(cfg.master.etcd_endpoints), timeout, credentials=access.credentials,
                user=access.user, password=access.password)
