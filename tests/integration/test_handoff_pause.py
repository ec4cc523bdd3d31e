"""The handoff pause (`keyrange_handoff_pause_seconds`, and the newest one in the worker's report):
measured by the real engine on a real split, and equal to what the processed records show. And the
chart's Grafana dashboard over the same kind of run: a real Prometheus scrapes the workers, and
every query of the dashboard about workers returns data."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from prometheus_client import REGISTRY, start_http_server

from keyrange.handlers import load_handler
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape
from keyrange.local.load import LoadTotals, Phase, produce_phases
from keyrange.local.ports import free_port
from keyrange.ranges.channel import ControlChannel
from keyrange.ranges.controller import Controller, Rescale
from keyrange.ranges.membership import run_controlled
from keyrange.ranges.planner import ScalingLimits, SlotLag
from keyrange.worker import Worker, WorkerSettings
from tests.integration.prometheus.stack import PrometheusStack
from tests.kafkatools import read_input_log, read_processed
from tests.stacks import describe_stuck_handoff

PARTITIONS = 4
DASHBOARD = Path(__file__).parents[2] / "charts" / "keyrange" / "files" / "grafana" / "keyrange-dashboard.json"


class NoLag:
    def slot_lag(self) -> Mapping[int, SlotLag]:
        return {}


class Fleet:
    def __init__(self) -> None:
        self.workers = 0

    def scale_to(self, workers: int) -> None:
        self.workers = workers


@dataclass
class SplitRun:
    """One worker handling a steady stream, split over two; the stream goes on."""

    controller: Controller
    group: str
    load: asyncio.Task[LoadTotals]
    load_stop: threading.Event


@contextlib.asynccontextmanager
async def split_under_load(bootstrap: str, topic: str, seconds: float,
                           after_split_seconds: float | None = None) -> AsyncIterator[SplitRun]:
    """Worker 0 holds every slot of a ledger stream of at most `seconds`; then one split gives worker
    1 half. Yields once the handoff is complete, while the stream still flows; with
    `after_split_seconds`, the stream stops that long after the handoff, however long it took."""
    group = f"{topic}-g"
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
    load = asyncio.create_task(asyncio.to_thread(produce_phases, bootstrap, topic, shape, [Phase(seconds, 400)],
                                                 load_stop))
    start(0)
    try:
        for _ in range(600):  # worker 0 holds every slot before the split
            await asyncio.to_thread(controller.channel.poll, 0.05)
            report = controller.channel.state.reports.get(0)
            if report is not None and len(report.held) == PARTITIONS:
                break
        result = await asyncio.to_thread(controller.request_scale, "up", "test")
        assert result.applied, result.detail
        for _ in range(1200):
            if fleet.workers > 1 and 1 not in running:
                start(1)
            pub = await asyncio.to_thread(controller.step)
            if controller.rescales and not pub.transit and not controller.status().starting:
                break
            await asyncio.sleep(0.05)
        assert not controller.publication.transit, describe_stuck_handoff(controller)
        if after_split_seconds is not None:
            asyncio.get_running_loop().call_later(after_split_seconds, load_stop.set)
        yield SplitRun(controller, group, load, load_stop)
    finally:
        load_stop.set()
        await load
        for task, stop in list(running.values()):
            stop.set()
            await task
        controller.channel.close()


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
    before = _histogram_count(f"{topic_name}-g", "1")
    # The new owner must see events on its moved slots: the stream goes on for a while after the split.
    async with split_under_load(bootstrap, topic_name, seconds=300, after_split_seconds=4) as run:
        controller = run.controller
        totals = await run.load
        log = await asyncio.to_thread(read_input_log, bootstrap, topic_name, totals.sent)
        processed = await asyncio.to_thread(read_processed, bootstrap, f"{topic_name}.processed",
                                            len({e.uuid for e in log}))
        rescale = controller.rescales[0]
        pause_ms, measured = expected_pause_ms(list(processed), rescale, "1")
        assert measured == len(rescale.moved_slots) >= 1

        pause = None
        for _ in range(200):  # the worker reports it with its next heartbeat
            await asyncio.to_thread(controller.channel.poll, 0.05)
            report = controller.channel.state.reports.get(1)
            pause = report.pause if report is not None else None
            if pause is not None and pause.pause_ms == pause_ms:
                break
        assert pause is not None and pause.pause_ms == pause_ms, (pause, pause_ms)
        assert pause.epoch == rescale.epoch + 1  # the grant
        assert _histogram_count(run.group, "1") - before == len(rescale.moved_slots)
        print(f"handoff pause of {len(rescale.moved_slots)} slots: {pause_ms} ms")


def _worker_queries(consumer: str) -> dict[str, str]:
    """The dashboard's queries about workers (the operator's series are not scraped here), for one
    consumer over a short rate window."""
    dash = json.loads(DASHBOARD.read_text())
    queries = {}
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            if "keyrange_operator_" in expr or "keyrange_scale_requests" in expr:
                continue
            expr = expr.replace("$__rate_interval", "30s").replace("$namespace", ".*").replace("$consumer", consumer)
            queries[f"{panel['title']} / {target['legendFormat']}"] = expr
    return queries


async def test_every_worker_query_of_the_dashboard_returns_data(bootstrap: str, topic_name: str,
                                                                tmp_path: Path) -> None:
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1")  # this process's workers' /metrics
    with PrometheusStack(tmp_path / "prometheus", {"groups": []}, "http://127.0.0.1:9/unused", "unused") as prom:
        prom.set_targets([(f"127.0.0.1:{port}", {"namespace": "dashboard-test"})])
        async with split_under_load(bootstrap, topic_name, seconds=120) as run:
            producer = Producer({"bootstrap.servers": bootstrap})
            producer.produce(topic_name, b"not json", b"1")  # one dead letter (bad input)
            producer.flush(10)
            queries = _worker_queries(run.group)
            empty = dict(queries)
            for _ in range(600):
                empty = {k: q for k, q in empty.items() if not await asyncio.to_thread(prom.query, q)}
                if not empty:
                    break
                await asyncio.sleep(0.2)
            assert not empty, f"dashboard queries without data: {empty}"
    server.shutdown()
    thread.join()
    assert len(queries) >= 12
