"""Mutations as steps, so that a caller need not keep a thread waiting for the journal.

A namespace mutation of the master (``@mutation``) is written once, as a generator:
it checks and prepares, yields a ``Submit`` (its plan, for the committer), receives
the plan's value once the record is durable and the leases it touched are revoked,
and returns its reply::

    @mutation
    def create(self, req):
        since = self.leases.snapshot()
        value = yield Submit(lambda t: self.ns.plan_create(t, req), req.request_id, req.session)
        return self._inode_reply(value, ...)

Called as a method it runs to the end on the caller's thread (``drive_sync``: the
unary RPCs, the Calls stream's pool, tests).  The call port drives it with
``StepRunner`` instead: the steps before and after the journal run in the port's
loop thread, and nothing waits in between.  Why (issue 16): with a pool thread
parked per mutation, the committer's wake-up of a batch's callers and their replies'
hand-off back to the loop cost about 25 futex calls and ~175 us of system time per
mutation (GIL hand-offs among a dozen threads), more than the mutation itself.
"""

from __future__ import annotations

import functools
from concurrent import futures
from typing import Any, Callable, Generator, NamedTuple

from curvine.common.errors import CurvineError
from curvine.common.loop_inbox import LoopInbox



class Submit(NamedTuple):
    """What a mutation yields: its plan for the committer (``committer.Plan``), its
    request id (the retry cache) and the caller's lease session (whose own leases the
    mutation does not revoke)."""

    plan: Callable
    request_id: bytes = b""
    session: int = 0


Steps = Generator[Submit, Any, Any]


def mutation(steps: Callable[..., Steps]) -> Callable:
    """Make the generator method ``steps`` a plain method that runs it to the end
    (``Master.submit`` for each Submit); ``method.steps`` is the generator function,
    for StepRunner."""

    @functools.wraps(steps)
    def run(self, *args, **kwargs):
        return drive_sync(steps(self, *args, **kwargs), self.submit)

    run.steps = steps
    return run


def drive_sync(gen: Steps, submit: Callable[..., Any]) -> Any:
    """Run ``gen`` on this thread: each Submit through ``submit(plan, request_id,
    session=)``, its value (or CurvineError) sent back in."""
    value: Any = None
    error: CurvineError | None = None
    try:
        while True:
            sub = gen.send(value) if error is None else gen.throw(error)
            value, error = None, None
            try:
                value = submit(sub.plan, sub.request_id, session=sub.session)
            except CurvineError as e:
                error = e
    except StopIteration as stop:
        return stop.value


class StepRunner:
    """Drives mutations from one event loop's thread without parking a thread per call.

    ``call_soon_threadsafe``: the loop's; the steps, and ``done``, run in the loop's
    thread.  A plan goes to the committer (``submit_async``: Committer.submit_async);
    when its batch is durable the committer hands the item back through one wake-up of
    the loop per batch (an inbox).  Then ``revoke_begin(names, inodes, exclude=,
    created=)`` (LeaseTable.revoke_begin) starts the revocation of other mounts' leases
    on what it changed; a mutation whose revocation must wait for their acks waits in
    ``pool``, then continues in the loop."""

    def __init__(self, submit_async: Callable, revoke_begin: Callable,
                 call_soon_threadsafe: Callable, pool: futures.Executor):
        self._submit_async = submit_async
        self._revoke_begin = revoke_begin
        self._pool = pool
        # what other threads hand back (a durable batch's items at once): one wake-up
        self._post = LoopInbox(call_soon_threadsafe, "a mutation's step").post

    def start(self, gen: Steps, done: Callable[[Any, BaseException | None], None]) -> None:
        """Run ``gen``; ``done(value, None)`` or ``done(None, error)`` in the loop."""
        self._step(gen, done, None, None)

    # -- in the loop thread --------------------------------------------------------------
    def _step(self, gen: Steps, done, value, error) -> None:
        try:
            sub = gen.send(value) if error is None else gen.throw(error)
        except StopIteration as stop:
            done(stop.value, None)
            return
        except BaseException as e:  # noqa: BLE001 - the call's error, reported to its caller
            done(None, e)
            return
        try:
            self._submit_async(
                sub.plan, sub.request_id,
                lambda item: self._post(self._committed, gen, done, item, sub.session))
        except CurvineError as e:  # the committer is down
            self._step(gen, done, None, e)

    def _committed(self, gen: Steps, done, item, session: int) -> None:
        if item.error is not None:
            self._step(gen, done, None, item.error)
            return
        fx = item.fx  # None: a retry cache hit, nothing was changed now
        wait = None if fx is None else self._revoke_begin(
            fx.names, fx.inodes, exclude=session, created=fx.created)
        if wait is not None:  # other mounts hold leases: wait for them off the loop
            self._pool.submit(self._wait_then_step, wait, gen, done, item.result)
            return
        self._step(gen, done, item.result, None)

    # -- other threads --------------------------------------------------------------------
    def _wait_then_step(self, wait: Callable[[], None], gen: Steps, done, value) -> None:
        try:
            wait()
        except BaseException as e:  # noqa: BLE001 - reported to the call
            self._post(self._step, gen, done, None, e)
            return
        self._post(self._step, gen, done, value, None)
