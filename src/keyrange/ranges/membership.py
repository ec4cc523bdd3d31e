"""Controlled mode of `keyrange worker`: the worker takes its slots from the control topic.

`keyrange worker` without `--partitions` runs `run_controlled`: start the engine, follow the
control topic with a RangeMember until stopped, then stop the engine (it finishes in-flight
events and commits) and report holding nothing, so a pending handoff completes at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping
from typing import Protocol

from keyrange.kafkaio import until_reachable
from keyrange.ranges.channel import CONTROL_SETUP_TIMEOUT_SECONDS, ControlChannel
from keyrange.ranges.member import RangeMember, SlotOwner, ordinal_from_hostname
from keyrange.ranges.pauses import HandoffPauses

log = logging.getLogger(__name__)


class Engine(SlotOwner, Protocol):
    """What controlled mode needs from the worker engine besides acquire/release."""

    handoff_pauses: HandoffPauses
    """Where the engine reports each event's start, for the member's handoff pauses."""

    async def start(self, stop: asyncio.Event | None = None) -> None:
        """Connect and get ready to acquire."""

    async def wait(self) -> None:
        """Return when the engine stopped; raise what killed it."""

    async def stop(self) -> None:
        """Release everything (committing) and close."""


def default_worker_ordinal(explicit: str | None) -> int:
    """`--worker-id` if given, else the StatefulSet ordinal from the host's name (`payments-3` -> 3):
    $HOSTNAME, which a pod has, else the kernel's (a shell does not export $HOSTNAME)."""
    if explicit is not None:
        if not explicit.isdigit():
            raise ValueError(f"--worker-id must be a worker ordinal (0, 1, ...) in controlled mode, got {explicit!r}")
        return int(explicit)
    return ordinal_from_hostname(os.environ.get("HOSTNAME") or socket.gethostname())


async def run_controlled(engine: Engine, bootstrap: str, group_id: str, ordinal: int,
                         stop: asyncio.Event, heartbeat_seconds: float = 1.0,
                         client_properties: Mapping[str, str] | None = None,
                         replication_factor: int | None = None) -> None:
    """Run `engine` under the control topic of `group_id` as worker `ordinal` until `stop` is set
    or the engine fails (its error is raised after the final report)."""
    await until_reachable(lambda timeout: ControlChannel.ensure_topic(bootstrap, group_id, client_properties,
                                                                      replication_factor, timeout), stop,
                          CONTROL_SETUP_TIMEOUT_SECONDS)
    channel = await asyncio.to_thread(ControlChannel, bootstrap, group_id, f"worker-{ordinal}", client_properties)
    member = RangeMember(engine, channel, ordinal, heartbeat_seconds=heartbeat_seconds, pauses=engine.handoff_pauses)
    try:
        await engine.start(stop)
    except BaseException:
        await asyncio.to_thread(channel.close)
        raise
    # Named for whoever reads the stacks of a stuck process (several workers share one in tests).
    member_task = asyncio.create_task(member.run(stop), name=f"worker-{ordinal}-member")
    engine_task = asyncio.create_task(engine.wait(), name=f"worker-{ordinal}-engine")
    stop_task = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait({member_task, engine_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stop_task:
                task.result()  # raise what ended the member or the engine
    finally:
        stop.set()
        for task in (member_task, stop_task):
            task.cancel()
        await asyncio.gather(member_task, stop_task, return_exceptions=True)
        await engine.stop()
        await member.report_final()
        engine_task.cancel()
        await asyncio.gather(engine_task, return_exceptions=True)
        await asyncio.to_thread(channel.close)
        log.info("worker %d stopped", ordinal)
