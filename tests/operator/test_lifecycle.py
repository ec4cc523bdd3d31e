"""A StreamConsumer's life with real workers (the test node agent runs `keyrange worker` processes on
the embedded broker) and the real range controller: the planner's own decisions recorded as Events
and in status.lastScaling (the webhook's requests are not recorded twice), the last handoff's pause
in status, the Ready column, and `spec.suspend`: a clean release to zero workers, and back."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from keyrange.loadgen import LoadShape, generate, produce_all
from keyrange.local.load import Phase, produce_phases
from tests.checkers import check_all, first_occurrences
from tests.kafkatools import committed_offsets, read_counts, read_input_log, read_processed
from tests.operator.conftest import SC_PATH, Api, Release, create_namespace, eventually, running_operator
from tests.operator.crd_schema import admit_streamconsumer
from tests.operator.node_agent import TestNodeAgent

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

NS = "operator-lifecycle"
SC = SC_PATH.format(ns=NS)
STS = f"/apis/apps/v1/namespaces/{NS}/statefulsets"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def operator(release: Release) -> AsyncIterator[kopf.Memo]:
    create_namespace(release.plane, NS)
    async with running_operator(release, [NS]) as memo:
        yield memo


@pytest.fixture
def cluster(shared_cluster: Api, topic_name: str) -> Api:
    return shared_cluster.with_topic(topic_name).in_namespace(NS)


async def _status(api: Api, name: str, **expected: Any) -> dict[str, Any] | None:
    obj = await api.get(f"{SC}/{name}")
    status = (obj or {}).get("status") or {}
    return obj if all(status.get(k) == v for k, v in expected.items()) else None


async def _rescaled(api: Api, name: str) -> list[str]:
    return [e["message"] for e in await api.events(NS, name) if e["reason"] == "Rescaled"]


def _refreshes() -> float:
    return REGISTRY.get_sample_value("keyrange_operator_reconciles_total", {"handler": "refresh", "result": "ok"}) or 0


async def test_planner_decisions_become_events_and_status_with_the_handoffs_pause(
        cluster: Api, operator: kopf.Memo, tmp_path: Path) -> None:
    name = "planned"
    # A long cooldown: the planner takes no lag-driven decision of its own during the test.
    await cluster.create(SC, cluster.streamconsumer(name, handler="ledger", workers={"min": 1, "max": 3},
                                                    scaling={"cooldownSeconds": 3600}))
    stop = threading.Event()
    load = asyncio.create_task(asyncio.to_thread(produce_phases, cluster.bootstrap, cluster.topic,
                                                 LoadShape(rate=200, clients=40, ledger=True, seed=5),
                                                 [Phase(600, 200)], stop))
    try:
        async with TestNodeAgent(cluster, [NS], tmp_path, name="planned-node") as node:
            await eventually(lambda: _status(cluster, name, phase="Running", workers=1), "1 worker", timeout=120)
            table = cluster.plane.kubectl("get", "strc", name, "-n", NS).stdout.splitlines()
            assert table[0].split()[:3] == ["NAME", "READY", "WORKERS"] and table[1].split()[:3] == [name, "True", "1"]

            # As the alert webhook does: a requested split, which its requester records (not the planner).
            control = operator.controls.get(NS, name)
            assert control is not None
            outcome = await asyncio.to_thread(control.request_scale, "up", "TestAlert")
            assert outcome.applied, outcome
            two = await eventually(lambda: _status(cluster, name, phase="Running", workers=2), "2 workers",
                                   timeout=120)

            # `kubectl scale` pins workers.min = max = 3: the planner splits by itself.
            await cluster.patch(f"{SC}/{name}/scale", {"spec": {"replicas": 3}})

            async def recorded() -> dict[str, Any] | None:
                found = await _status(cluster, name, phase="Running", workers=3)
                last = (found or {}).get("status", {}).get("lastScaling") or {}
                return found if last.get("reason") == "Planner" else None

            three = await eventually(recorded, "the planner's split in status.lastScaling", timeout=120)
            last = three["status"]["lastScaling"]
            assert (last["fromWorkers"], last["toWorkers"]) == (2, 3)
            assert "below workers.min=3" in last["message"]
            messages = await eventually(lambda: _rescaled(cluster, name), "the planner's Rescaled Event")
            assert len(messages) == 1 and "(planner)" in messages[0] and "2 to 3 workers" in messages[0], messages

            async def paused() -> dict[str, Any] | None:
                found = await cluster.get(f"{SC}/{name}")
                handoff = (found or {}).get("status", {}).get("lastHandoff") or {}
                return found if handoff.get("epoch", 0) > two["status"]["epoch"] else None

            moved = await eventually(paused, "the split's handoff pause in status", timeout=60)
            handoff = moved["status"]["lastHandoff"]
            assert handoff["worker"] == 2 and 0 <= handoff["pauseSeconds"] < 60
            assert admit_streamconsumer(moved)[1] == []  # fits the CRD's status schema
            assert node.crashes == []
    finally:
        stop.set()
        await load


async def test_suspend_releases_cleanly_to_zero_workers_and_resume_brings_them_back(
        cluster: Api, operator: kopf.Memo, tmp_path: Path) -> None:
    name = "paused"
    group = f"{NS}.{name}"
    await cluster.create(SC, cluster.streamconsumer(name, handler="ledger", workers={"min": 2, "max": 2}))
    records = list(generate(LoadShape(rate=2000, clients=40, duplicate_ratio=0.05, ledger=True, seed=9), count=3000))
    async with TestNodeAgent(cluster, [NS], tmp_path, name="paused-node") as node:
        await eventually(lambda: _status(cluster, name, phase="Running", workers=2), "2 workers", timeout=120)
        await asyncio.to_thread(produce_all, cluster.bootstrap, cluster.topic, records[:2000])

        await cluster.patch(f"{SC}/{name}", {"spec": {"suspend": True}})
        suspended = await eventually(lambda: _status(cluster, name, phase="Suspended"), "phase Suspended",
                                     timeout=120)
        assert sorted(node.stopped_pods) == [f"{name}-worker-0", f"{name}-worker-1"] and node.crashes == []
        conditions = {c["type"]: c for c in suspended["status"]["conditions"]}
        assert conditions["Ready"]["reason"] == "Suspended" and suspended["status"]["workers"] == 0
        assert "lag" not in suspended["status"] and suspended["status"]["ranges"]  # the map they resume with
        # A clean release: the suspend may land while the workers are still busy with the 2000
        # events (it does under load), so what they committed is a prefix of each partition; the
        # outputs, totals and offsets committed together must account for exactly that prefix.
        log = await asyncio.to_thread(read_input_log, cluster.bootstrap, cluster.topic, 2000)
        committed = await asyncio.to_thread(committed_offsets, cluster.bootstrap, cluster.topic, group)
        released = [e for e in log if e.offset < committed[e.partition]]
        processed = await asyncio.to_thread(read_processed, cluster.bootstrap, f"{cluster.topic}.processed",
                                            len(first_occurrences(released)))
        counts = await asyncio.to_thread(read_counts, cluster.bootstrap, cluster.topic, group)
        check_all(released, processed, counts, ledger=True)

        # While suspended, new events wait: the operator keeps the StatefulSet at zero round after round.
        await asyncio.to_thread(produce_all, cluster.bootstrap, cluster.topic, records[2000:])
        before = _refreshes()
        await eventually(lambda: _more(before + 3), "three more refreshes")
        sts = await cluster.get(f"{STS}/{name}-worker")
        assert sts is not None and sts["spec"]["replicas"] == 0
        assert await _status(cluster, name, phase="Suspended") is not None
        assert len(node.started_pods) == 2

        await cluster.patch(f"{SC}/{name}", {"spec": {"suspend": False}})
        await eventually(lambda: _status(cluster, name, phase="Running", workers=2), "2 workers again", timeout=120)
        log = await asyncio.to_thread(read_input_log, cluster.bootstrap, cluster.topic, len(records))
        processed = await asyncio.to_thread(read_processed, cluster.bootstrap, f"{cluster.topic}.processed",
                                            len(first_occurrences(log)), 120)
        counts = await asyncio.to_thread(read_counts, cluster.bootstrap, cluster.topic, group, len(log))
        check_all(log, processed, counts, ledger=True)
        assert len(node.started_pods) == 4 and node.crashes == []


async def _more(target: float) -> bool:
    return _refreshes() >= target
