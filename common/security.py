"""One process's credentials as a value: the cluster tokens and the TLS material.

A process loads its :class:`Security` once, right after its config
(``Security.load(cfg, role)``: the token files its role needs and the TLS files), and
passes it to every server and channel it makes (common/rpc.py); no module keeps it.
A value says

- what servers accept: the tokens of the roles they serve (:meth:`Security.accepted`:
  "client" calls carry the client token, "worker" calls the worker token);
- what channels send: the client token, or, for a daemon's calls as a worker
  (registration, heartbeats, the master's block deletes), the worker token
  (:meth:`Security.as_worker`);
- whether ports and channels use TLS (``material``, common/tls.py).

:data:`NO_SECURITY` is an open cluster over plaintext: no token sent or checked.
The tokens never appear in ``repr()`` (nor in logs).
"""

from __future__ import annotations

import dataclasses
import hmac
from dataclasses import dataclass, field
from typing import Iterable, Literal

import grpc

from . import auth, tls

Role = Literal["client", "worker"]  # whose calls a server takes: the token they carry
CLIENT: Role = "client"
WORKER: Role = "worker"
_DAEMON_ROLES = ("master", "worker")  # the processes that hold the worker token


@dataclass(frozen=True, repr=False)
class Security:
    """Tokens and TLS material of one process, and which token its channels send."""

    client_token: str = ""
    worker_token: str = ""  # masters and workers only
    material: tls.Material | None = None  # None: plaintext
    sends_worker_token: bool = False  # set by as_worker()
    # Built once per value (and kept by as_worker()): channels with the same
    # credentials object share their connections to a server.
    channel_credentials: grpc.ChannelCredentials | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.material is not None and self.channel_credentials is None:
            object.__setattr__(self, "channel_credentials",
                               tls.channel_credentials(self.material))

    @classmethod
    def load(cls, cfg, role: str = "client") -> "Security":
        """The credentials ``cfg.security`` names for a process of ``role`` ("client":
        mounts, the CLI, the client library; "master" or "worker": the daemons, which
        also read the worker token, required whenever a client token is set).

        auth.TokenError when a token file cannot be used or the two tokens do not go
        together; tls.TLSError (a ConfigError) when the TLS keys or files cannot."""
        if role not in ("client", *_DAEMON_ROLES):
            raise ValueError(f"role {role!r} is not client, master or worker")
        sec = cfg.security
        token = auth.read_token_file(sec.token_file) if sec.token_file else ""
        worker = ""
        if role in _DAEMON_ROLES:
            wpath = sec.worker_token_file
            worker = auth.read_token_file(wpath, auth.WORKER_TOKEN_FILE_KEY) if wpath else ""
            if token and not worker:
                raise auth.TokenError(
                    f"{auth.WORKER_TOKEN_FILE_KEY}: required when {auth.TOKEN_FILE_KEY} is "
                    "set (workers and clients hold different credentials; "
                    "`curvine local up` writes both)")
            if worker and not token:
                raise auth.TokenError(f"{auth.TOKEN_FILE_KEY}: required when "
                                      f"{auth.WORKER_TOKEN_FILE_KEY} is set")
            if worker and hmac.compare_digest(worker.encode(), token.encode()):
                raise auth.TokenError(f"{auth.WORKER_TOKEN_FILE_KEY}: must hold another "
                                      f"token than {auth.TOKEN_FILE_KEY} (every client "
                                      "holds that one)")
        return cls(client_token=token, worker_token=worker, material=tls.load(sec))

    @property
    def token(self) -> str:
        """What this value's channels send ("" in an open cluster)."""
        return self.worker_token if self.sends_worker_token else self.client_token

    def as_worker(self) -> "Security":
        """The same credentials, with channels that send the worker token (a daemon's
        calls as a worker).  ValueError for a client's value in a cluster with tokens:
        it holds no worker token to send."""
        if self.client_token and not self.worker_token:
            raise ValueError("no worker token: load the Security with role "
                             "'master' or 'worker'")
        return dataclasses.replace(self, sends_worker_token=True)

    def accepted(self, roles: Iterable[Role]) -> tuple[str, ...]:
        """The tokens a server for the calls of ``roles`` accepts; () in an open cluster
        (no checks).  ValueError when one of the roles' tokens is missing: such a server
        would take calls without that credential."""
        tokens = {CLIENT: self.client_token, WORKER: self.worker_token}
        roles = tuple(roles)
        unknown = [r for r in roles if r not in tokens]
        if unknown or not roles:
            raise ValueError(f"roles {roles!r}: expected one or more of client, worker")
        if not (self.client_token or self.worker_token):
            return ()
        missing = [r for r in roles if not tokens[r]]
        if missing:
            raise ValueError(f"no {missing[0]} token to check {missing[0]} calls with: load "
                             "the Security with role 'master' or 'worker'")
        return tuple(tokens[r] for r in roles)

    def check_can_serve(self) -> None:
        """For daemons, right after loading: tls.TLSError (a ConfigError: exit 2) when
        TLS is on but this process has no certificate to serve with."""
        if self.material is not None:
            tls.server_credentials(self.material)

    def __repr__(self) -> str:
        held = [name for name, t in (("client", self.client_token),
                                     ("worker", self.worker_token)) if t]
        return (f"Security(tokens={'+'.join(held) or 'none'}, "
                f"tls={'on' if self.material is not None else 'off'}, "
                f"sends={'worker' if self.sends_worker_token else 'client'})")

    def __reduce__(self):
        # for spawned processes: the credentials object is made again on the other side
        return (type(self), (self.client_token, self.worker_token, self.material,
                             self.sends_worker_token))


NO_SECURITY = Security()
