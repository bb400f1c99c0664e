"""Where a daemon is stuck: ``kill -USR1 <pid>`` logs, at WARNING and without
stopping anything, one line per thread (and, in curvine-fuse, per trio task) with
where it waits, innermost call first.

A hung request shows up as a thread blocked in a call or a task waiting on an event;
this is what an operator (or a test that saw a hang) attaches to a bug report.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

log = logging.getLogger(__name__)

DUMP_SIGNAL = signal.SIGUSR1


def _where(frames) -> str:
    """``file:line function <- caller ...`` for (frame, lineno) pairs, innermost first."""
    return " <- ".join(f"{os.path.basename(f.f_code.co_filename)}:{lineno} {f.f_code.co_name}"
                       for f, lineno in frames)


def _frames(frame):
    while frame is not None:
        yield frame, frame.f_lineno
        frame = frame.f_back


def thread_stacks() -> list[str]:
    names = {t.ident: t.name for t in threading.enumerate()}
    return [f"thread {names.get(ident, ident)}: {_where(_frames(frame))}"
            for ident, frame in sys._current_frames().items()]  # noqa: SLF001


def task_stacks() -> list[str]:
    """Every task of the running trio loop and where it awaits (call from the loop)."""
    import trio

    lines = []

    def walk(task):
        frames = list(task.iter_await_frames())[::-1]
        lines.append(f"task {task.name}: {_where(frames)}")
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child)

    walk(trio.lowlevel.current_root_task())
    return lines


def _log(lines: list[str]) -> None:
    log.warning("SIGUSR1: %d stacks follow", len(lines))
    for line in lines:
        log.warning("  %s", line)


def install_thread_dump() -> None:
    """SIGUSR1 logs every thread's stack (call from the main thread; in curvine-fuse,
    :func:`dump_on_signal` takes the signal over while its trio loop runs)."""
    signal.signal(DUMP_SIGNAL, lambda _signum, _frame: _log(thread_stacks()))


async def dump_on_signal() -> None:
    """A trio task: SIGUSR1 logs every task's and every thread's stack."""
    import trio

    with trio.open_signal_receiver(DUMP_SIGNAL) as signals:
        async for _ in signals:
            _log(task_stacks() + thread_stacks())
