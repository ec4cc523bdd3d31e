"""The webhook receiver over real HTTP (aiohttp on 127.0.0.1): auth, payloads, routing, idempotence."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from keyrange.autoscale.receiver import (
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    WEBHOOK_PATH,
    AlertReceiver,
    ScaleDecision,
    WebhookTokenError,
    describe,
    load_token,
)
from keyrange.autoscale.tracker import ConsumerRef
from keyrange.errors import UserError
from keyrange.local.monitoring import ReceiverServer
from keyrange.ranges.planner import Direction, ScaleOutcome
from tests.alertmanager import alert, payload

PAYMENTS = ConsumerRef("shop", "payments")
ORDERS = ConsumerRef("shop", "orders")
AUTH = {"Authorization": "Bearer s3cret"}


class Controller:
    """A stand-in range controller: counts requests, applies them unless told not to."""

    def __init__(self, applies: bool = True, fails: bool = False) -> None:
        self.calls: list[tuple[Direction, str]] = []
        self.applies, self.fails = applies, fails

    def request_scale(self, direction: Direction, reason: str) -> ScaleOutcome:
        if self.fails:
            raise RuntimeError("controller is broken")
        self.calls.append((direction, reason))
        return ScaleOutcome(self.applies, "split 0-11 into 0-5, 6-11" if self.applies else "cooldown",
                            1, 2 if self.applies else 1)


class AsyncController(Controller):
    async def request_scale(self, direction: Direction, reason: str) -> ScaleOutcome:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().request_scale(direction, reason)


@pytest.fixture
def decisions() -> list[ScaleDecision]:
    return []


@pytest.fixture
def receiver(decisions: list[ScaleDecision]) -> AlertReceiver:
    return AlertReceiver("s3cret", on_decision=decisions.append)


@pytest.fixture
async def client(receiver: AlertReceiver) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(receiver.app())) as c:
        yield c


async def post(client: TestClient[Any, Any], body: Any, headers: dict[str, str] = AUTH) -> tuple[int, Any]:
    resp = await client.post(WEBHOOK_PATH, data=json.dumps(body), headers=headers)
    return resp.status, await resp.json()


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                                     {"Authorization": "Basic czNjcmV0"}])
async def test_requests_without_the_token_are_refused(client: TestClient[Any, Any], receiver: AlertReceiver,
                                                      headers: dict[str, str]) -> None:
    controller = Controller()
    receiver.register(PAYMENTS, controller, 60)
    status, body = await post(client, payload(alert()), headers)
    assert status == 401 and "token" in body["error"]
    assert controller.calls == []


@pytest.mark.parametrize("raw", ["not json", "[]", '{"version": "4"}'])
async def test_bad_payloads_get_400(client: TestClient[Any, Any], raw: str) -> None:
    resp = await client.post(WEBHOOK_PATH, data=raw, headers=AUTH)
    assert resp.status == 400
    assert "not an Alertmanager webhook payload" in (await resp.json())["error"]


async def test_a_firing_alert_scales_once_and_is_recorded(client: TestClient[Any, Any], receiver: AlertReceiver,
                                                          decisions: list[ScaleDecision]) -> None:
    controller = Controller()
    receiver.register(PAYMENTS, controller, 60)
    status, body = await post(client, payload(alert()))
    assert status == 200
    assert controller.calls == [("up", "alert KeyrangeLagHighRecords(worker 0) firing")]
    assert body["decisions"][0]["applied"] is True and body["decisions"][0]["consumer"] == "shop/payments"
    assert [(d.consumer, d.direction, d.applied) for d in decisions] == [(PAYMENTS, "up", True)]
    assert describe(decisions[0])["detail"] == "split 0-11 into 0-5, 6-11"
    status, body = await post(client, payload(alert()))
    assert status == 200 and [v["outcome"] for v in body["verdicts"]] == ["repeat"]
    assert len(controller.calls) == 1


async def test_concurrent_repeats_of_one_alert_scale_once(client: TestClient[Any, Any],
                                                          receiver: AlertReceiver) -> None:
    controller = AsyncController()
    receiver.register(PAYMENTS, controller, 60)
    results = await asyncio.gather(*(post(client, payload(alert(), alert(worker="1"))) for _ in range(20)))
    assert all(status == 200 for status, _ in results)
    assert len(controller.calls) == 1


async def test_a_refused_request_is_recorded_and_retried_next_time(
        client: TestClient[Any, Any], receiver: AlertReceiver, decisions: list[ScaleDecision]) -> None:
    controller = Controller(applies=False)
    receiver.register(PAYMENTS, controller, 60)
    await post(client, payload(alert()))
    await post(client, payload(alert()))
    assert len(controller.calls) == 2
    assert [(d.applied, d.detail) for d in decisions] == [(False, "cooldown"), (False, "cooldown")]


async def test_unknown_consumers_are_answered_and_others_still_scale(client: TestClient[Any, Any],
                                                                     receiver: AlertReceiver) -> None:
    controller = Controller()
    receiver.register(PAYMENTS, controller, 60)
    status, body = await post(client, payload(alert(consumer="ghost"), alert()))
    assert status == 200
    assert [v["outcome"] for v in body["verdicts"]] == ["unknown-consumer", "scale"]
    assert len(controller.calls) == 1
    receiver.unregister(PAYMENTS)
    status, body = await post(client, payload(alert(starts_at="later")))
    assert status == 200 and body["verdicts"][0]["outcome"] == "unknown-consumer"


async def test_a_failing_controller_gives_500_without_hurting_the_others(
        client: TestClient[Any, Any], receiver: AlertReceiver) -> None:
    healthy = Controller()
    receiver.register(PAYMENTS, Controller(fails=True), 60)
    receiver.register(ORDERS, healthy, 60)
    status, _ = await post(client, payload(alert(), alert(consumer="orders")))
    assert status == 500
    assert len(healthy.calls) == 1
    # Alertmanager retries a 500: the applied request is not repeated.
    await post(client, payload(alert(), alert(consumer="orders")))
    assert len(healthy.calls) == 1


async def test_an_async_decision_sink_is_awaited(client: TestClient[Any, Any]) -> None:
    seen: list[ScaleDecision] = []

    async def record(decision: ScaleDecision) -> None:
        await asyncio.sleep(0)
        seen.append(decision)

    receiver = AlertReceiver("s3cret", on_decision=record)
    receiver.register(PAYMENTS, AsyncController(), 60)
    async with TestClient(TestServer(receiver.app())) as c:
        status, _ = await post(c, payload(alert("KeyrangeLagLow", scale="down", worker=None)))
    assert status == 200 and [d.direction for d in seen] == ["down"]


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"version": "4", "alerts": ' + b"[" * 100_000,
                                 b'{"alerts": [{"labels": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b"}]}"])
async def test_a_deeply_nested_body_is_a_400_with_one_line(client: TestClient[Any, Any], raw: bytes,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    resp = await client.post(WEBHOOK_PATH, data=raw, headers=AUTH)
    assert resp.status == 400, await resp.text()
    error = (await resp.json())["error"]
    assert "nested too deeply" in error and "\n" not in error
    assert not [r for r in caplog.records if r.exc_info], "a bad body must not log a traceback"


async def test_a_body_over_4_mib_is_refused_with_413(client: TestClient[Any, Any]) -> None:
    limit = 4 * 1024 * 1024
    at_limit = await client.post(WEBHOOK_PATH, data=b" " * limit, headers=AUTH)
    assert at_limit.status == 400  # read whole, then found not to be JSON
    over = await client.post(WEBHOOK_PATH, data=b" " * (limit + 1), headers=AUTH)
    assert over.status == 413


async def test_healthz_says_only_ok_without_the_token(client: TestClient[Any, Any], receiver: AlertReceiver) -> None:
    receiver.register(PAYMENTS, Controller(), 60)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        resp = await client.get("/healthz", headers=headers)
        assert resp.status == 200 and (await resp.json()) == {"status": "ok"}
    resp = await client.get("/healthz", headers=AUTH)
    assert resp.status == 200 and (await resp.json()) == {"status": "ok", "consumers": ["shop/payments"]}


def test_threaded_server_for_synchronous_callers() -> None:
    receiver = AlertReceiver("s3cret")
    controller = Controller()
    receiver.register(PAYMENTS, controller, 60)
    with ReceiverServer(receiver) as server:
        assert server.port > 0
        req = urllib.request.Request(server.url, data=json.dumps(payload(alert())).encode(),
                                     headers={**AUTH, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(server.url, data=b"{}"), timeout=10)
        assert err.value.code == 401
    assert len(controller.calls) == 1


def test_a_busy_port_is_a_user_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(UserError, match="--webhook-port"):
            ReceiverServer(AlertReceiver("t"), port=s.getsockname()[1]).start()


def test_token_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    assert load_token("flag") == "flag"
    with pytest.raises(WebhookTokenError, match="--webhook-token"):
        load_token(None)
    (tmp_path / "token").write_text("from-secret\n")
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "token"))
    assert load_token(None) == "from-secret"
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert load_token(None) == "from-env"
    monkeypatch.delenv(TOKEN_ENV)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(WebhookTokenError, match="cannot read"):
        load_token(None)
    with pytest.raises(WebhookTokenError):
        AlertReceiver("")


async def test_verdicts_and_requests_are_counted_in_metrics(client: TestClient[Any, Any],
                                                            receiver: AlertReceiver) -> None:
    from prometheus_client import REGISTRY

    def value(name: str, labels: dict[str, str]) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    requests = {"streamconsumer_namespace": "shop", "consumer": "payments", "direction": "up", "applied": "true"}
    before = (value("keyrange_scale_requests_total", requests),
              value("keyrange_alert_verdicts_total", {"outcome": "repeat"}))
    receiver.register(PAYMENTS, Controller(), 60)
    await post(client, payload(alert()))
    await post(client, payload(alert()))
    assert value("keyrange_scale_requests_total", requests) == before[0] + 1
    assert value("keyrange_alert_verdicts_total", {"outcome": "repeat"}) == before[1] + 1
