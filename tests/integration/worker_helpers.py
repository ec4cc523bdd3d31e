"""Helpers for the worker integration tests: run a Worker in-process until a condition holds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from keyrange.handlers import Handler, load_handler
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape, generate, produce_all
from keyrange.worker import Worker, WorkerSettings


def produce_stream(bootstrap: str, topic: str, count: int, partitions: int = 6, clients: int = 120,
                   duplicate_ratio: float = 0.05, ledger: bool = False, seed: int = 7) -> int:
    """Create `topic` and produce the kata's stream unpaced; return the records sent."""
    ensure_topics(bootstrap, [TopicSpec(topic, partitions)])
    shape = LoadShape(clients=clients, duplicate_ratio=duplicate_ratio, ledger=ledger, seed=seed)
    return produce_all(bootstrap, topic, list(generate(shape, count=count)))


def settings_for(bootstrap: str, topic: str, **overrides: Any) -> WorkerSettings:
    """Worker settings with test-friendly defaults."""
    values: dict[str, Any] = {"bootstrap": bootstrap, "topic": topic, "group_id": f"{topic}-g",
                              "worker_id": "w0", "commit_interval_ms": 50}
    values.update(overrides)
    return WorkerSettings(**values)


async def wait_for(condition: Callable[[], bool], timeout_seconds: float = 90.0, what: str = "condition") -> None:
    """Poll `condition` until true; fail with `what` after a generous deadline."""
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds:g} s waiting for {what}")
        await asyncio.sleep(0.05)


async def run_worker_until(settings: WorkerSettings, handler: Handler | str, slots: list[int],
                           done: Callable[[Worker], bool], timeout_seconds: float = 90.0) -> Worker:
    """Start a worker on `slots`, wait for `done(worker)`, stop it gracefully, and return it."""
    if isinstance(handler, str):
        handler = load_handler(handler, settings.handler_config)
    worker = Worker(settings, handler)
    await worker.start()
    try:
        await worker.acquire(slots)
        await wait_for(lambda: done(worker), timeout_seconds, "the worker to finish")
    finally:
        await worker.stop()
    return worker
