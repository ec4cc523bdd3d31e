"""The handoff pause (`keyrange_handoff_pause_seconds`, and the newest one in the worker's report):
measured by the real engine on a real split, and equal to what the processed records show."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from prometheus_client import REGISTRY

from keyrange.handlers import load_handler
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape
from keyrange.local.load import Phase, produce_phases
from keyrange.ranges.control import ControlChannel
from keyrange.ranges.controlled import run_controlled
from keyrange.ranges.controller import Controller, Rescale
from keyrange.ranges.planner import ScalingLimits, SlotLag
from keyrange.worker import Worker, WorkerSettings
from tests.kafkatools import read_input_log, read_processed

PARTITIONS = 4


class NoLag:
    def slot_lag(self) -> Mapping[int, SlotLag]:
        return {}


class Fleet:
    def __init__(self) -> None:
        self.workers = 0

    def scale_to(self, workers: int) -> None:
        self.workers = workers


def expected_pause_ms(processed: list[Mapping[str, Any]], rescale: Rescale, new_owner: str) -> tuple[int, int]:
    """(largest pause over the moved slots, slots measured), from the processed records alone: the
    new owner's first start on each moved slot, minus the later of the transit's publication and
    that event's creation."""
    pauses = []
    for slot in rescale.moved_slots:
        firsts = sorted((r["startedAt"], r["created"]) for r in processed
                        if r["partition"] == slot and r["worker"] == new_owner)
        if firsts:
            started, created = firsts[0]
            pauses.append(max(0, started - max(rescale.published_ms, created)))
    return max(pauses), len(pauses)


def _histogram_count(consumer: str, worker: str) -> float:
    labels = {"consumer": consumer, "worker": worker}
    return REGISTRY.get_sample_value("keyrange_handoff_pause_seconds_count", labels) or 0.0


async def test_a_split_reports_the_pause_its_moved_slots_saw(bootstrap: str, topic_name: str) -> None:
    topic, group = topic_name, f"{topic_name}-g"
    await asyncio.to_thread(ensure_topics, bootstrap, [TopicSpec(topic, PARTITIONS)])
    await asyncio.to_thread(ControlChannel.ensure_topic, bootstrap, group)
    limits = ScalingLimits(min_workers=1, max_workers=2, lag_high_records=10**9, lag_low_records=0,
                           cooldown_seconds=0)
    fleet = Fleet()
    controller = Controller(ControlChannel(bootstrap, group, "controller"), PARTITIONS, limits, NoLag(), fleet)
    await asyncio.to_thread(controller.start)
    handler = load_handler("ledger", {"delayMs": 1})
    running: dict[int, tuple[asyncio.Task[None], asyncio.Event]] = {}

    def start(ordinal: int) -> None:
        settings = WorkerSettings(bootstrap=bootstrap, topic=topic, group_id=group, worker_id=str(ordinal),
                                  concurrency=16, commit_interval_ms=50)
        stop = asyncio.Event()
        running[ordinal] = (asyncio.create_task(run_controlled(Worker(settings, handler), bootstrap, group, ordinal,
                                                               stop, heartbeat_seconds=0.2)), stop)

    load_stop = threading.Event()
    shape = LoadShape(rate=400, clients=50, ledger=True, seed=3)
    load = asyncio.create_task(asyncio.to_thread(produce_phases, bootstrap, topic, shape, [Phase(8, 400)], load_stop))
    start(0)
    before = _histogram_count(group, "1")
    try:
        await asyncio.sleep(2)  # worker 0 holds every slot and handles the stream
        result = await asyncio.to_thread(controller.request_scale, "up", "test")
        assert result.applied, result.detail
        for _ in range(1200):
            if fleet.workers > 1 and 1 not in running:
                start(1)
            pub = await asyncio.to_thread(controller.step)
            if controller.rescales and not pub.transit and not controller.status().starting:
                break
            await asyncio.sleep(0.05)
        assert not controller.publication.transit, f"handoff stuck: {controller.status()}"
        totals = await load
        log = await asyncio.to_thread(read_input_log, bootstrap, topic, totals.sent)
        processed = await asyncio.to_thread(read_processed, bootstrap, f"{topic}.processed",
                                            len({e.uuid for e in log}))
        rescale = controller.rescales[0]
        pause_ms, measured = expected_pause_ms(list(processed), rescale, "1")
        assert measured == len(rescale.moved_slots) >= 1

        async def reported() -> Any:
            for _ in range(200):
                await asyncio.to_thread(controller.channel.poll, 0.05)
                report = controller.channel.state.reports.get(1)
                if report is not None and report.pause is not None and report.pause.pause_ms == pause_ms:
                    return report.pause
            return controller.channel.state.reports.get(1)

        pause = await reported()
        assert pause is not None and getattr(pause, "pause_ms", None) == pause_ms, (pause, pause_ms)
        assert pause.epoch == rescale.epoch + 1  # the grant
        assert _histogram_count(group, "1") - before == len(rescale.moved_slots)
        print(f"handoff pause of {len(rescale.moved_slots)} slots: {pause_ms} ms")
    finally:
        load_stop.set()
        for task, stop in list(running.values()):
            stop.set()
            await task
        controller.channel.close()
