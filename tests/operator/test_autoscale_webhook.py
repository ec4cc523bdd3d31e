"""The operator's alert webhook end to end in the operator tier: the real kopf operator against the
emulated API, the receiver started by `keyrange operator`'s side services (token from a mounted
file), alerts posted over HTTP, and each decision landing in status.lastScaling and an Event."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
import pytest_asyncio

from keyrange.commands.operator import side_services
from keyrange.operator.handlers import operator_memo, register_handlers
from keyrange.operator.kube import Kube, new_api_client
from keyrange.operator.rangecontrol import RangeStatus, ScaleOutcome, ScaleRequest
from keyrange.operator.settings import OperatorSettings
from keyrange.operator.webhook import TOKEN_FILE_ENV, WEBHOOK_PATH
from keyrange.spec import StreamConsumerSpec
from tests.integration.prometheus.stack import free_port
from tests.operator.conftest import SC_PATH, Api, eventually
from tests.unit.test_alerts import alert, payload

NS = "shop"


def consumer(name: str, **spec: Any) -> dict[str, Any]:
    """A valid StreamConsumer (its Kafka is never contacted: the range control here is a stand-in)."""
    return {"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"kafka": {"topic": "events", "bootstrapServers": "kafka:9092"}, **spec}}


class SplittingControl:
    """A range control that splits up to workers.max (the real controller's contract, no Kafka)."""

    def __init__(self, spec: StreamConsumerSpec) -> None:
        self.spec, self.workers, self.requests = spec, spec.workers.min, list[ScaleRequest]()

    def desired_workers(self) -> int:
        return self.workers

    def workers_available(self, ready: int) -> None:
        pass

    def request_scale(self, request: ScaleRequest) -> ScaleOutcome:
        self.requests.append(request)
        before = self.workers
        if request.direction == "up" and self.workers < self.spec.workers.max:
            self.workers += 1
            return ScaleOutcome(True, before, self.workers)
        return ScaleOutcome(False, before, before, f"workers.max ({self.spec.workers.max}) reached")

    def update_spec(self, spec: StreamConsumerSpec) -> None:
        self.spec = spec

    def status(self) -> RangeStatus:
        return RangeStatus(epoch=1, workers=self.workers)

    def close(self) -> None:
        pass


@pytest_asyncio.fixture
async def webhook(cluster: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """The operator with its webhook side service; yields the webhook URL."""
    (tmp_path / "token").write_text("from-secret\n")
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "token"))
    settings = OperatorSettings(image="keyrange:test", reconcile_interval_seconds=0.5)
    memo = operator_memo(settings, kube=Kube(new_api_client()),
                         range_control_factory=lambda ns, name, spec: SplittingControl(spec))
    port = free_port()
    services = side_services(argparse.Namespace(webhook_port=port, webhook_token=None), memo)
    tasks = [asyncio.create_task(s) for s in services]
    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    operator = asyncio.create_task(kopf.operator(registry=register_handlers(kopf.OperatorRegistry(), settings),
                                                 memo=memo, clusterwide=True, standalone=True, stop_flag=stop))
    try:
        await eventually(lambda: _healthy(port), "the webhook to listen")
        yield f"http://127.0.0.1:{port}{WEBHOOK_PATH}"
    finally:
        stop.set_result(None)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(operator, timeout=30)
        for task in tasks:
            task.cancel()
        memo.controls.close_all()


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
    assert cluster.count("POST", f"/namespaces/{NS}/events") >= 1

    # The same episode again: a repeat, nothing new recorded.
    events = cluster.count("POST", f"/namespaces/{NS}/events")
    status, body = await post(webhook, payload(alert()))
    assert status == 200 and [v["outcome"] for v in body["verdicts"]] == ["repeat"]
    # A new episode at workers.max: refused, and recorded as such.
    status, body = await post(webhook, payload(alert(starts_at="2026-11-21T23:59:00Z", worker="1")))
    assert status == 200 and body["decisions"][0]["applied"] is False
    last = await eventually(lambda: _refused(cluster), "the refusal in status")
    assert "workers.max (2) reached" in last["message"]
    assert cluster.count("POST", f"/namespaces/{NS}/events") == events + 1


async def test_wrong_token_and_unknown_consumers(cluster: Api, webhook: str) -> None:
    status, _ = await post(webhook, payload(alert()), token="guess")
    assert status == 401
    status, body = await post(webhook, payload(alert(consumer="ghost")))
    assert status == 200 and body["verdicts"][0]["outcome"] == "unknown-consumer"
    assert cluster.count("POST", "/events") == 0


async def _scaled(url: str, one_alert: dict[str, Any]) -> dict[str, Any] | None:
    status, body = await post(url, payload(one_alert))
    return body if status == 200 and body["decisions"] else None


async def _refused(cluster: Api) -> dict[str, Any] | None:
    obj = await cluster.get(f"{SC_PATH.format(ns=NS)}/payments")
    last = ((obj or {}).get("status") or {}).get("lastScaling") or {}
    return last if last.get("fromWorkers") == last.get("toWorkers") == 2 else None
