"""Where everything waits: the stacks of the running loop's tasks and of every thread, for the
message of a test that found something stuck (a handoff that never completes), so a failure that
shows up once in a full run says where the work stopped."""

from __future__ import annotations

import asyncio
import gc
import io
import sys
import threading
import traceback

from keyrange.ranges.channel import describe_reports, now_ms
from keyrange.ranges.controller import Controller


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


def describe_members() -> str:
    """Each live RangeMember (found through the garbage collector: run_controlled keeps them to
    itself): the epoch it applied, the newest it read, and how far its control reader has read."""
    from keyrange.ranges.member import RangeMember

    gc.collect()  # only the live ones: members of finished runs may wait in reference cycles
    lines = []
    for member in sorted((o for o in gc.get_objects() if isinstance(o, RangeMember)), key=lambda m: m.worker):
        pub = member.channel.state.publication
        try:
            position, end = member.channel.read_progress()
            progress = f"control read to {position} of {end}"
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not hide the failure it explains
            progress = f"control position unknown ({exc})"
        lines.append(f"w{member.worker}: applied epoch {member.applied_epoch}, read epoch "
                     f"{pub.epoch if pub is not None else None}, {progress}")
    return "\n".join(lines)


def describe_stuck_handoff(controller: Controller) -> str:
    """Everything a stuck handoff's failure message needs: the controller's status, each report
    with its age, each member's progress on the control topic, and where every task and thread waits."""
    reports = describe_reports(controller.channel.state.reports, now_ms())
    return f"handoff stuck: {controller.status()}\nreports: {reports}\n{describe_members()}\n{describe_stacks()}"
