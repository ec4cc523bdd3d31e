"""The operator's alert webhook: alerts reach the consumer's range control; each decision lands in
status.lastScaling and a Kubernetes Event (a recording stand-in for the API here; the operator
tier runs the operator itself against a real kube-apiserver)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest
from aiohttp.test_utils import TestClient, TestServer

from keyrange.autoscale.receiver import WEBHOOK_PATH
from keyrange.operator.rangecontrol import RangeStatus
from keyrange.operator.registry import ControlRegistry
from keyrange.operator.scalewebhook import operator_receiver
from keyrange.ranges.planner import Direction, ScaleOutcome
from keyrange.spec import parse_spec
from tests.alertmanager import alert, payload
from tests.static_range_control import StaticRangeControl

SPEC = {"kafka": {"topic": "events", "bootstrapServers": "kafka:9092"}, "workers": {"min": 1, "max": 4},
        "scaling": {"cooldownSeconds": 45}}
NOW = datetime(2026, 11, 21, 23, 50, tzinfo=UTC)


class ScalingControl:
    """A range control that accepts splits up to 4 workers."""

    def __init__(self) -> None:
        self.workers, self.requests = 1, list[tuple[Direction, str]]()
        self.busy = False
        """Refuse as a controller does while a handoff is in flight."""

    def request_scale(self, direction: Direction, reason: str) -> ScaleOutcome:
        self.requests.append((direction, reason))
        before = self.workers
        if self.busy:
            return ScaleOutcome(False, "a rescale is in progress (epoch 1: w0=0-5 w1=6-11)", before, before,
                                in_progress=True)
        self.workers = min(4, self.workers + (1 if direction == "up" else -1))
        return ScaleOutcome(self.workers != before, "", before, self.workers)

    def status(self) -> RangeStatus:
        return RangeStatus(epoch=1, workers=self.workers)


class RecordingKube:
    """Stores StreamConsumers; records status patches and Events."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.events: list[tuple[str, str, str]] = []

    def add(self, namespace: str, name: str) -> None:
        self.objects[(namespace, name)] = {
            "apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
            "metadata": {"name": name, "namespace": namespace, "uid": "u1"}, "spec": SPEC}

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((namespace, name))

    def patch(self, api_version: str, kind: str, namespace: str, name: str, changes: dict[str, Any],
              subresource: str | None = None) -> dict[str, Any]:
        assert subresource == "status"
        self.patches.append((f"{namespace}/{name}", changes))
        return changes

    def event(self, involved: dict[str, Any], reason: str, message: str, now: datetime,
              event_type: str = "Normal") -> None:
        self.events.append((reason, event_type, message))


@pytest.fixture
def kube() -> RecordingKube:
    k = RecordingKube()
    k.add("shop", "payments")
    k.add("shop", "static")
    return k


@pytest.fixture
def control() -> ScalingControl:
    return ScalingControl()


@pytest.fixture
async def client(kube: RecordingKube, control: ScalingControl) -> AsyncIterator[TestClient[Any, Any]]:
    registry = ControlRegistry(lambda ns, name, spec: control if name == "payments" else StaticRangeControl(spec))
    for name in ("payments", "static"):
        registry.ensure("shop", name, parse_spec(SPEC, name))
    memo = kopf.Memo(kube=kube, controls=registry, clock=lambda: NOW)
    async with TestClient(TestServer(operator_receiver(memo, "tok").app())) as c:
        yield c


async def notify(client: TestClient[Any, Any], *alerts: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(WEBHOOK_PATH, data=json.dumps(payload(*alerts)),
                             headers={"Authorization": "Bearer tok"})
    assert resp.status == 200, await resp.text()
    return dict(await resp.json())


async def test_a_split_is_recorded_in_status_and_as_an_event(client: TestClient[Any, Any], kube: RecordingKube,
                                                             control: ScalingControl) -> None:
    body = await notify(client, alert())
    assert [direction for direction, _ in control.requests] == ["up"]
    assert body["decisions"][0]["applied"] is True
    (where, changes), = kube.patches
    assert where == "shop/payments"
    last = changes["status"]["lastScaling"]
    assert (last["fromWorkers"], last["toWorkers"]) == (1, 2)
    assert "KeyrangeLagHighRecords" in last["reason"]
    assert kube.events == [("Rescaled", "Normal", last["message"])]
    # Alertmanager repeats the notification: no second split, nothing more recorded.
    body = await notify(client, alert())
    assert [v["outcome"] for v in body["verdicts"]] == ["repeat"]
    assert len(control.requests) == 1 and len(kube.events) == 1


async def test_a_refused_request_is_a_warning_event(client: TestClient[Any, Any], kube: RecordingKube) -> None:
    body = await notify(client, alert(consumer="static"))
    assert body["decisions"][0]["applied"] is False
    assert kube.events[0][:2] == ("RescaleRefused", "Warning")
    assert "workers.replicas" in kube.events[0][2]


async def test_a_request_refused_while_a_rescale_is_under_way_leaves_its_record(
        client: TestClient[Any, Any], kube: RecordingKube, control: ScalingControl) -> None:
    await notify(client, alert())
    (_, split), = kube.patches
    # The lag-seconds alert joins the episode a second later, while the split's handoff runs.
    control.busy = True
    body = await notify(client, alert(name="KeyrangeLagHighSeconds"))
    assert body["decisions"][0]["applied"] is False
    assert kube.patches == [("shop/payments", split)], "the refusal replaced the split in status.lastScaling"
    assert kube.events[-1][:2] == ("RescaleRefused", "Warning")
    assert "a rescale is in progress" in kube.events[-1][2]


async def test_consumers_the_operator_does_not_run_are_unknown(client: TestClient[Any, Any],
                                                               kube: RecordingKube) -> None:
    kube.add("shop", "orphan")  # exists in the API but has no range control here
    body = await notify(client, alert(consumer="orphan"), alert(consumer="ghost"), alert(namespace="other"))
    assert [v["outcome"] for v in body["verdicts"]] == ["unknown-consumer"] * 3
    assert kube.events == [] and kube.patches == []


async def test_the_operators_receiver_answers_a_deep_body_with_400_and_hides_consumers(
        client: TestClient[Any, Any], kube: RecordingKube, control: ScalingControl) -> None:
    resp = await client.post(WEBHOOK_PATH, data=b"[" * 100_000, headers={"Authorization": "Bearer tok"})
    assert resp.status == 400 and "nested too deeply" in (await resp.json())["error"]
    assert control.requests == [] and kube.events == []
    resp = await client.get("/healthz")
    assert resp.status == 200 and await resp.json() == {"status": "ok"}
