"""The operator's alert webhook end to end in the operator tier: the real kopf operator against the
real API server (as the chart's ServiceAccount), the receiver started by `keyrange operator`'s side
services (token from a mounted file), alerts posted over HTTP, and each decision landing in
status.lastScaling and an Event."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from keyrange.autoscale.receiver import TOKEN_FILE_ENV, WEBHOOK_PATH
from keyrange.commands.operator import side_services
from keyrange.operator.rangecontrol import PlannedRescale, RangeStatus
from keyrange.ranges.planner import Direction, ScaleOutcome
from keyrange.spec import StreamConsumerSpec
from tests.alertmanager import alert as shop_alert
from tests.alertmanager import payload
from tests.operator.conftest import SC_PATH, Api, Release, admin_api, create_namespace, eventually, running_operator

NS = "autoscale-webhook"


def alert(**kwargs: Any) -> dict[str, Any]:
    """An alert about a consumer in this module's namespace."""
    return shop_alert(namespace=NS, **kwargs)


def consumer(name: str, **spec: Any) -> dict[str, Any]:
    """A valid StreamConsumer (its Kafka is never contacted: the range control here is a stand-in)."""
    return {"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"kafka": {"topic": "events", "bootstrapServers": "kafka:9092"}, **spec}}


class SplittingControl:
    """A range control that splits up to workers.max (the real controller's contract, no Kafka)."""

    def __init__(self, spec: StreamConsumerSpec) -> None:
        self.spec, self.workers, self.requests = spec, spec.workers.min, list[tuple[Direction, str]]()

    def desired_workers(self) -> int:
        return self.workers

    def workers_available(self, ready: int) -> None:
        pass

    def request_scale(self, direction: Direction, reason: str) -> ScaleOutcome:
        self.requests.append((direction, reason))
        before = self.workers
        if direction == "up" and self.workers < self.spec.workers.max:
            self.workers += 1
            return ScaleOutcome(True, "", before, self.workers)
        return ScaleOutcome(False, f"workers.max ({self.spec.workers.max}) reached", before, before)

    def update_spec(self, spec: StreamConsumerSpec) -> None:
        self.spec = spec

    def status(self) -> RangeStatus:
        return RangeStatus(epoch=1, workers=self.workers)

    def take_decisions(self) -> list[PlannedRescale]:
        return []  # every rescale here is requested by the webhook, which records it itself

    def close(self) -> None:
        pass


@pytest_asyncio.fixture
async def cluster(release: Release, tmp_path: Path) -> AsyncIterator[Api]:
    """An admin client; the namespace is emptied of StreamConsumers after each test."""
    create_namespace(release.plane, NS)
    async with admin_api(release.plane, "kafka:9092", "events") as api:
        yield api.in_namespace(NS)


@pytest_asyncio.fixture
async def webhook(cluster: Api, release: Release, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """The operator with its webhook side service; yields the webhook URL."""
    (tmp_path / "token").write_text("from-secret\n")
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "token"))
    async with running_operator(release, [NS], range_control_factory=lambda ns, name, spec: SplittingControl(spec)
                                ) as memo:
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        services = side_services(memo, listener, None)
        tasks = [asyncio.create_task(s) for s in services]
        try:
            await eventually(lambda: _healthy(port), "the webhook to listen")
            yield f"http://127.0.0.1:{port}{WEBHOOK_PATH}"
        finally:
            for task in tasks:
                task.cancel()
            listener.close()
            # Leave nothing for the next test's operator (kopf's finalizer needs an operator).
            # In a thread: kopf, in this event loop, must handle the deletion meanwhile.
            await asyncio.to_thread(release.plane.kubectl, "delete", "streamconsumers", "--all", "-n", NS,
                                    "--wait=true", "--timeout=60s")


async def _healthy(port: int) -> bool:
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/healthz") as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False


async def post(url: str, body: Any, token: str = "from-secret") -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            url, json=body, headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status, await resp.json()


async def test_alerts_scale_and_every_decision_is_recorded(cluster: Api, webhook: str) -> None:
    await cluster.create(SC_PATH.format(ns=NS), consumer("payments", workers={"min": 1, "max": 2}))
    # The consumer is known once kopf has created its range control.
    body = await eventually(lambda: _scaled(webhook, alert()), "the consumer to be managed")
    assert body["decisions"][0]["applied"] is True

    async def recorded() -> dict[str, Any] | None:
        obj = await cluster.get(f"{SC_PATH.format(ns=NS)}/payments")
        return ((obj or {}).get("status") or {}).get("lastScaling")

    last = await eventually(recorded, "status.lastScaling")
    assert (last["fromWorkers"], last["toWorkers"]) == (1, 2) and "KeyrangeLagHighRecords" in last["reason"]
    assert len(await _decision_events(cluster, "payments")) >= 1

    # The same episode again: a repeat, nothing new recorded.
    events = len(await _decision_events(cluster, "payments"))
    status, body = await post(webhook, payload(alert()))
    assert status == 200 and [v["outcome"] for v in body["verdicts"]] == ["repeat"]
    # A new episode at workers.max: refused, and recorded as such.
    status, body = await post(webhook, payload(alert(starts_at="2026-11-21T23:59:00Z", worker="1")))
    assert status == 200 and body["decisions"][0]["applied"] is False
    last = await eventually(lambda: _refused(cluster), "the refusal in status")
    assert "workers.max (2) reached" in last["message"]
    await eventually(lambda: _events_are(cluster, "payments", events + 1), "one more Event")
    await asyncio.sleep(1)  # a second, duplicate Event would be posted right after the first
    assert len(await _decision_events(cluster, "payments")) == events + 1


async def test_wrong_token_and_unknown_consumers(cluster: Api, webhook: str) -> None:
    status, _ = await post(webhook, payload(alert()), token="guess")
    assert status == 401
    status, body = await post(webhook, payload(alert(consumer="ghost")))
    assert status == 200 and body["verdicts"][0]["outcome"] == "unknown-consumer"
    assert await _decision_events(cluster, "ghost") == []


async def _scaled(url: str, one_alert: dict[str, Any]) -> dict[str, Any] | None:
    status, body = await post(url, payload(one_alert))
    return body if status == 200 and body["decisions"] else None


async def _refused(cluster: Api) -> dict[str, Any] | None:
    obj = await cluster.get(f"{SC_PATH.format(ns=NS)}/payments")
    last = ((obj or {}).get("status") or {}).get("lastScaling") or {}
    return last if last.get("fromWorkers") == last.get("toWorkers") == 2 else None


async def _decision_events(cluster: Api, name: str) -> list[dict[str, Any]]:
    """The Events keyrange's operator recorded about StreamConsumer `name`."""
    events = await cluster.events(NS, name)
    return [e for e in events if (e.get("source") or {}).get("component") == "keyrange-operator"]


async def _events_are(cluster: Api, name: str, count: int) -> bool:
    return len(await _decision_events(cluster, name)) == count
