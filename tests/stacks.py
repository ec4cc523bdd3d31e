"""Where everything waits: the stacks of the running loop's tasks and of every thread, for the
message of a test that found something stuck (a handoff that never completes), so a failure that
shows up once in a full run says where the work stopped."""

from __future__ import annotations

import asyncio
import io
import sys
import threading
import traceback


def describe_stacks(limit: int = 12) -> str:
    """Each task of the running loop (if any) and each thread, with its innermost `limit` frames."""
    out = io.StringIO()
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:  # no running loop
        tasks = set()
    for task in sorted(tasks, key=lambda t: t.get_name()):
        out.write(f"--- task {task.get_name()}\n")
        out.write("".join(f"  {line}\n" for line in _awaiting(task.get_coro())[-limit:]))
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        out.write(f"--- thread {names.get(ident, ident)}\n")
        out.write("".join(traceback.format_stack(frame, limit=limit)))
    return out.getvalue()


def _awaiting(awaitable: object) -> list[str]:
    """The chain of coroutines a task's coroutine awaits, outermost first, each at its line
    (Task.print_stack shows only the outermost: "await self.sync_once()" says nothing of where
    sync_once waits)."""
    chain = []
    while awaitable is not None:
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
        if frame is None:
            chain.append(f"{awaitable!r}")
            break
        code = frame.f_code
        chain.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_qualname}")
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None)
    return chain
