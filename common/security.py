"""One process's credentials as a value: the cluster tokens and the TLS material.

A process loads its :class:`Security` once, right after its config
(``Security.load(cfg, role)``: the token files its role needs and the TLS files), and
passes it to every server and channel it makes (common/rpc.py); no module keeps it.
A value says

- what servers accept: the tokens of the roles they serve (:meth:`Security.accepted`:
  "client" calls carry the client token, "worker" calls the worker token, "master"
  calls the master token);
- what channels send: the client token, or, for a daemon's calls as a worker
  (registration, heartbeats, the master's block deletes), the worker token
  (:meth:`Security.as_worker`), or, for a master's calls to another master of its
  group (FetchCheckpoint), the master credential (:meth:`Security.as_master`);
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

Role = Literal["client", "worker", "master"]  # whose calls a server takes: the token they carry
CLIENT: Role = "client"
WORKER: Role = "worker"
MASTER: Role = "master"  # another master of the group (security.master_token_file)
_DAEMON_ROLES = ("master", "worker")  # the processes that hold the worker token
CREDENTIAL_KEYS = {CLIENT: auth.TOKEN_FILE_KEY, WORKER: auth.WORKER_TOKEN_FILE_KEY,
                   MASTER: auth.MASTER_TOKEN_FILE_KEY}  # where each role's token is named


@dataclass(frozen=True, repr=False)
class Security:
    """Tokens and TLS material of one process, and which token its channels send."""

    client_token: str = ""
    worker_token: str = ""  # masters and workers only
    material: tls.Material | None = None  # None: plaintext
    master_token: str = ""  # masters only, and only when security.master_token_file is set
    sends: Role = CLIENT  # whose token its channels send (as_worker(), as_master())
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
        also read the worker token, required whenever a client token is set; "master"
        also the master token, when ``security.master_token_file`` is set: it then
        needs the other two, and differs from both).

        auth.TokenError when a token file cannot be used or the tokens do not go
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
        master = ""
        if role == "master" and sec.master_token_file:
            master = auth.read_token_file(sec.master_token_file, auth.MASTER_TOKEN_FILE_KEY)
            if not token:
                raise auth.TokenError(f"{auth.TOKEN_FILE_KEY} and "
                                      f"{auth.WORKER_TOKEN_FILE_KEY}: required when "
                                      f"{auth.MASTER_TOKEN_FILE_KEY} is set")
            for other, key in ((token, auth.TOKEN_FILE_KEY),
                               (worker, auth.WORKER_TOKEN_FILE_KEY)):
                if hmac.compare_digest(master.encode(), other.encode()):
                    raise auth.TokenError(f"{auth.MASTER_TOKEN_FILE_KEY}: must hold another "
                                          f"token than {key} (the masters alone hold it)")
        return cls(client_token=token, worker_token=worker, material=tls.load(sec),
                   master_token=master)

    @property
    def token(self) -> str:
        """What this value's channels send ("" in an open cluster)."""
        return self._tokens()[self.sends]

    def _tokens(self) -> dict[Role, str]:
        return {CLIENT: self.client_token, WORKER: self.worker_token,
                MASTER: self.master_token}

    @property
    def masters_role(self) -> Role:
        """The role calls between the masters of a group are made and accepted as:
        MASTER with a master token, else WORKER (a group without
        ``security.master_token_file`` keeps the worker credential for them)."""
        return MASTER if self.master_token else WORKER

    def as_worker(self) -> "Security":
        """The same credentials, with channels that send the worker token (a daemon's
        calls as a worker).  ValueError for a client's value in a cluster with tokens:
        it holds no worker token to send."""
        if self.client_token and not self.worker_token:
            raise ValueError("no worker token: load the Security with role "
                             "'master' or 'worker'")
        return dataclasses.replace(self, sends=WORKER)

    def as_master(self) -> "Security":
        """The same credentials, with channels that send what another master of the
        group accepts from a master (``masters_role``): the master token, or the worker
        token when there is none.  ValueError where ``as_worker`` would raise it."""
        if not self.master_token:
            return self.as_worker()
        return dataclasses.replace(self, sends=MASTER)

    def accepted(self, roles: Iterable[Role]) -> tuple[str, ...]:
        """The tokens a server for the calls of ``roles`` accepts; () in an open cluster
        (no checks).  ValueError when one of the roles' tokens is missing: such a server
        would take calls without that credential."""
        tokens = self._tokens()
        roles = tuple(roles)
        unknown = [r for r in roles if r not in tokens]
        if unknown or not roles:
            raise ValueError(f"roles {roles!r}: expected one or more of client, worker, "
                             "master")
        if not (self.client_token or self.worker_token):
            return ()
        missing = [r for r in roles if not tokens[r]]
        if missing:
            role = missing[0]
            where = ("role 'master' and security.master_token_file" if role == MASTER
                     else "role 'master' or 'worker'")
            raise ValueError(f"no {role} token to check {role} calls with: load the "
                             f"Security with {where}")
        return tuple(tokens[r] for r in roles)

    def check_can_serve(self) -> None:
        """For daemons, right after loading: tls.TLSError (a ConfigError: exit 2) when
        TLS is on but this process has no certificate to serve with."""
        if self.material is not None:
            tls.server_credentials(self.material)

    def __repr__(self) -> str:
        held = [role for role, t in self._tokens().items() if t]
        return (f"Security(tokens={'+'.join(held) or 'none'}, "
                f"tls={'on' if self.material is not None else 'off'}, sends={self.sends})")

    def __reduce__(self):
        # for spawned processes: the credentials object is made again on the other side
        return (type(self), (self.client_token, self.worker_token, self.material,
                             self.master_token, self.sends))


NO_SECURITY = Security()
