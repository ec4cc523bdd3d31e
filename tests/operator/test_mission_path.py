"""The mission's path end to end, in one test (slow), on a control plane of its own:

1. `helm install` the chart; its operator Deployment's pod runs (on the test node agent, as the
   chart's ServiceAccount) and takes the Lease; `kubectl apply` a ledger StreamConsumer;
2. the real StatefulSet controller creates the worker pods, the agent runs them, they consume
   Apache Kafka;
3. real Prometheus scrapes the pods (its targets are the pods the agent runs, labelled as the
   chart's ServiceMonitor would), the lag alert fires and Alertmanager posts it to the operator's
   webhook;
4. the operator splits onto a new pod, hands off, and merges back when the lag-low alert fires;
5. `kubectl delete`, and the garbage collector removes the StatefulSet and its pods.

It runs on a topic of 8 partitions (whole partitions move) and on a topic of one partition, where the
split cuts the partition's clients into hash ranges: two workers share one partition, status and
`kubectl get` show which part of its hash range each owns.

The oracle checkers hold over everything produced. It prints the two latencies it measures
(`kubectl apply` -> first event handled, lag-high alert firing -> the new pod's first event), which
BENCHMARKS.md records (`pytest tests/operator/test_mission_path.py -s`); nothing asserts on them.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import re
import threading
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from keyrange.autoscale.rules import RuleOptions, render_rule_groups
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape
from keyrange.local.load import LoadTotals, Phase, produce_phases
from keyrange.ranges.layout import SlotLayout
from keyrange.ranges.slots import parse_slot_list
from keyrange.spec import parse_spec
from tests.checkers import check_all
from tests.integration.prometheus.stack import PrometheusStack
from tests.kafkatools import read_counts, read_input_log, read_processed, read_topic
from tests.operator.conftest import CHART, RELEASE, RELEASE_NS, admin_api, eventually, helm
from tests.operator.kubecluster import ControlPlane
from tests.operator.node_agent import TestNodeAgent

T = TypeVar("T")
APPLIED_BY_ALERT = re.compile(r"scaling from (?P<from>\d+) to (?P<to>\d+) workers \(alert ")

NS = "mission"
NAME = "ledger"
WEBHOOK_PORT, METRICS_PORT = 8081, 9100
ALERT_SCALING = {"lagHighRecords": 800, "lagHighSeconds": 4, "lagLowRecords": 50, "cooldownSeconds": 8}
"""The alerts' thresholds (as the chart's static PrometheusRule values set them)."""
SPEC_SCALING = {**ALERT_SCALING, "lagHighRecords": 10_000_000, "lagHighSeconds": 3600, "policy": "step"}
"""The consumer's own: its planner never splits by itself (the step policy, on lag thresholds out of
reach), so the split is the alert's doing."""


@dataclass
class Timings:
    """What the test measured (epoch seconds)."""

    applied: float = 0.0
    alerts: list[float] = field(default_factory=list)

    def report(self, processed: list[Any]) -> dict[str, float]:
        """apply -> first event handled, and first split alert -> the new pod's first event."""
        first = min(r["startedAt"] for r in processed) / 1000
        new_pod = [r["startedAt"] / 1000 for r in processed if str(r["worker"]) != "0"]  # worker ids are strings
        alert = self.alerts[0] if self.alerts else float("nan")
        return {"apply_to_first_event_s": round(first - self.applied, 2),
                "alert_to_new_pod_first_event_s": round(min(new_pod) - alert, 2) if new_pod else float("nan")}


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    """A control plane of this test's own: the chart's operator acts on every namespace."""
    started = ControlPlane.up(tmp_path / "kube")
    try:
        yield started
    finally:
        started.down()


def _consumer(bootstrap: str, topic: str, scaling: dict[str, Any], partitions: int) -> dict[str, Any]:
    return {"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
            "metadata": {"name": NAME, "namespace": NS},
            # A group of its own per topic: each parametrization's changelog has its topic's partitions.
            "spec": {"kafka": {"bootstrapServers": bootstrap, "topic": topic, "partitions": partitions,
                               "groupId": f"{topic}-g"},
                     "handler": "ledger", "handlerConfig": {"delayMs": 5}, "concurrency": 2,
                     "maxPending": 5000, "workers": {"min": 1, "max": 3}, "scaling": scaling}}


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [8, 1], ids=["8-partitions", "1-partition-hash-ranges"])
async def test_helm_install_apply_alerts_rescale_and_delete(plane: ControlPlane, tmp_path: Path, kafka_broker: Any,
                                                            topic_name: str, partitions: int) -> None:
    bootstrap = kafka_broker.bootstrap
    helm(plane, tmp_path / "helm", "install", RELEASE, str(CHART), "-n", RELEASE_NS, "--create-namespace",
         "--set", "operator.refreshSeconds=1")
    plane.kubectl("create", "namespace", NS)
    token = base64.b64decode(json.loads(plane.kubectl(
        "get", "secret", f"{RELEASE}-webhook", "-n", RELEASE_NS, "-o", "json").stdout)["data"]["token"]).decode()

    async def pod_kubeconfig(namespace: str, account: str, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        issued = await asyncio.to_thread(plane.token, namespace, account)
        return plane.token_kubeconfig(folder / "kubeconfig", issued)

    timings = Timings()
    async with admin_api(plane, bootstrap, topic_name) as api, \
            TestNodeAgent(api, [RELEASE_NS, NS], tmp_path / "node", token_kubeconfig=pod_kubeconfig) as node:
        operator_pod = await eventually(lambda: _ready_pod(api, RELEASE_NS, "app.kubernetes.io/component=operator"),
                                        "the operator pod to run and be ready", timeout=120)
        webhook = f"http://127.0.0.1:{node.local_port(RELEASE_NS, operator_pod, WEBHOOK_PORT)}/alertmanager/webhook"
        spec = parse_spec(_consumer(bootstrap, topic_name, SPEC_SCALING, partitions)["spec"])
        alert_spec = parse_spec(_consumer(bootstrap, topic_name, ALERT_SCALING, partitions)["spec"])
        rules = render_rule_groups(NAME, NS, alert_spec, RuleOptions(lag_high_for_seconds=2))
        with PrometheusStack(tmp_path / "prom", rules, webhook, token, repeat_interval="5s") as stack:
            scraping = asyncio.create_task(_follow_pods(api, node, stack, timings))
            # The topic as the operator creates it, so the load can start with the apply: the first
            # events wait for the first worker, which measures apply -> first event handled.
            await asyncio.to_thread(ensure_topics, bootstrap, [TopicSpec(topic_name, partitions)])
            stop, scraped, totals = threading.Event(), threading.Event(), LoadTotals()
            shape = LoadShape(rate=700, clients=100, ledger=True, duplicate_ratio=0.02, seed=11)
            # Quiet until worker 0 is scraped (Prometheus must see the burst's lag), then a burst and quiet again.
            quiet = threading.Thread(target=produce_phases,
                                     args=(bootstrap, topic_name, shape, [Phase(180, 30)], scraped, totals))
            phases = [Phase(12, 700), Phase(50, 30)]
            load = threading.Thread(target=produce_phases, args=(
                bootstrap, topic_name, dataclasses.replace(shape, seed=12), phases, stop, totals))
            timings.applied = time.time()
            plane.apply(_consumer(bootstrap, topic_name, SPEC_SCALING, partitions))
            quiet.start()
            try:
                try:
                    await eventually(lambda: _scraped(stack, 1), "worker 0 running and scraped", timeout=180)
                finally:
                    scraped.set()
                    await asyncio.to_thread(quiet.join, 60)
                load.start()
                await _explained(eventually(lambda: _scaled_by_alert(api, "up"), "a split caused by an alert",
                                            timeout=150), api, stack, node)
                split, table = await _explained(eventually(lambda: _split_shown(api, plane),
                                                           "two or more workers after the handoff", timeout=150),
                                                api, stack, node)
                _check_ranges_shown(split, table, partitions)
                # The merge: the lag-low alert's or the planner's own (both use lagLowRecords), whichever
                # comes first after the cooldown.
                await _explained(eventually(lambda: _workers(api, 1), "back to one worker", timeout=180),
                                 api, stack, node)
            finally:
                stop.set()
                if load.is_alive():
                    await asyncio.to_thread(load.join, 60)
                scraping.cancel()

        log = await asyncio.to_thread(read_input_log, bootstrap, topic_name, totals.sent)
        distinct = len({e.uuid for e in log})
        processed = await asyncio.to_thread(read_processed, bootstrap, spec.sink_topic, distinct, 180)
        print(f"\nmission path timings: {json.dumps(timings.report(processed))}")
        counts = await asyncio.to_thread(read_counts, bootstrap, topic_name, f"{topic_name}-g", len(log))
        try:
            check_all(log, processed, counts, ledger=True)
        except AssertionError:
            print(_describe_duplicates(log, processed))
            print(await asyncio.to_thread(_describe_lost, bootstrap, f"{topic_name}-g", log, processed))
            raise
        assert any(str(r["worker"]) != "0" for r in processed), "no event was handled by the split's new worker"
        assert {r["partition"] for r in processed} == set(range(partitions))

        plane.kubectl("delete", "strc", NAME, "-n", NS, "--wait=true", "--timeout=120s")
        await eventually(lambda: _gone(api, f"/apis/apps/v1/namespaces/{NS}/statefulsets/{NAME}-worker"),
                         "the garbage collector to delete the StatefulSet", timeout=120)
        await eventually(lambda: _no_pods(api), "the worker pods to go", timeout=120)
        assert node.errors == []


async def _explained(wait: Awaitable[T], api: Any, stack: PrometheusStack, node: TestNodeAgent) -> T:
    """`wait`, or its timeout with what the alert path shows at that moment: its first line (all CI's
    summary keeps) the consumer's last scaling record, the alerts and the lag Prometheus sees; then
    the consumer's Events and the pods' logs."""
    try:
        return await wait
    except AssertionError as exc:
        try:
            status = await _status(api)
            last = (status.get("lastScaling") or {}).get("message")
            alerts = [f"{a['labels'].get('alertname')}[{a['labels'].get('worker', '')}] {a['state']}"
                      for a in await asyncio.to_thread(stack.alerts)]
            lag = {r["metric"].get("worker"): r["value"][1] for r in await asyncio.to_thread(
                stack.query, f'sum by (worker) (keyrange_consumer_lag{{consumer="{NAME}"}})')}
            events = [f"{e.get('reason')}: {e.get('message')}" for e in await api.events(NS, NAME)][-10:]
            shown = (f"workers {status.get('workers')} ({status.get('phase')}), last scaling: {last!r}, "
                     f"alerts: {alerts}, lag by worker: {lag}\nevents:\n" + "\n".join(events))
        except Exception as unreadable:  # noqa: BLE001 - the wait's own failure must still be raised
            shown = f"(the alert path could not be read: {unreadable!r})"
        raise AssertionError(f"{exc}; {shown}\n{node.report(40)}") from None


async def _ready_pod(api: Any, namespace: str, selector: str) -> str | None:
    pods = await api.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
    for pod in (pods or {}).get("items") or []:
        conditions = {c["type"]: c["status"] for c in (pod.get("status") or {}).get("conditions") or []}
        if conditions.get("Ready") == "True":
            return str(pod["metadata"]["name"])
    return None


async def _follow_pods(api: Any, node: TestNodeAgent, stack: PrometheusStack, timings: Timings) -> None:
    """Keep Prometheus's targets equal to the consumer's running worker pods, labelled as the
    chart's ServiceMonitor labels them (`consumer`, and the pod's `namespace`); note when a
    lag-high alert is first seen firing."""
    while True:
        if not timings.alerts:
            firing = [a for a in await asyncio.to_thread(stack.alerts)
                      if a["state"] == "firing" and a["labels"].get("keyrange_scale") == "up"]
            if firing:
                timings.alerts.append(time.time())
        found = await api.get(f"/api/v1/namespaces/{NS}/pods?labelSelector=keyrange.dev/streamconsumer={NAME}")
        targets = []
        for pod in (found or {}).get("items") or []:
            pod_name = pod["metadata"]["name"]
            if (NS, pod_name) in node.pods:
                address = f"127.0.0.1:{node.local_port(NS, pod_name, METRICS_PORT)}"
                targets.append((address, {"consumer": NAME, "namespace": NS, "pod": pod_name}))
        stack.set_targets(targets)
        await asyncio.sleep(0.5)


async def _scraped(stack: PrometheusStack, count: int) -> bool:
    found = await asyncio.to_thread(stack.query, f'up{{consumer="{NAME}"}} == 1')
    return len(found) >= count


async def _status(api: Any) -> dict[str, Any]:
    found = await api.get(f"/apis/keyrange.dev/v1alpha1/namespaces/{NS}/streamconsumers/{NAME}")
    return dict((found or {}).get("status") or {})


async def _scaled_by_alert(api: Any, direction: str) -> str | None:
    """The message of an applied rescale in `direction` that an alert asked for, from the consumer's
    Events: status.lastScaling holds only the newest decision, and a later alert's refusal by the
    cooldown replaces the split's seconds later, too soon for a busy poller."""
    for event in await api.events(NS, NAME):
        found = APPLIED_BY_ALERT.match(str(event.get("message") or ""))
        if event.get("reason") == "Rescaled" and found:
            moved = int(found["to"]) - int(found["from"])
            if moved > 0 if direction == "up" else moved < 0:
                return str(event["message"])
    return None


async def _workers(api: Any, count: int) -> bool:
    status = await _status(api)
    return status.get("workers") == count and status.get("phase") == "Running"


async def _split_shown(api: Any, plane: ControlPlane) -> tuple[dict[str, Any], list[str]] | None:
    """The status at two or more running workers, and `kubectl get`'s table of the consumer once its
    row shows that status's range map; with the same status read after the table (the planner may
    start another rescale between the two reads, which the table then shows). Two or three: the
    lag-seconds alert may split again right after the first split, and the merges follow within
    seconds of each other, so on a loaded machine two workers may never be seen running."""
    status = await _status(api)
    if not (int(status.get("workers") or 0) >= 2 and status.get("phase") == "Running"):
        return None
    table = (await asyncio.to_thread(plane.kubectl, "get", "strc", NAME, "-n", NS)).stdout.splitlines()
    after = await _status(api)
    if any(after.get(key) != status.get(key) for key in ("workers", "phase", "rangeMap")):
        return None
    return (status, table) if status["rangeMap"] in table[-1] else None


def _check_ranges_shown(status: dict[str, Any], table: list[str], partitions: int) -> None:
    """The workers' ranges, as status and `kubectl get` show them: whole partitions on 8, hash
    ranges of the one partition's clients on 1 (cut in thirds for workers.max 3), each third once."""
    shown = [r["partitions"] for r in status["ranges"]]
    assert len(shown) == status["workers"], shown
    if partitions == 1:
        slots = [parse_slot_list(r["slots"]) for r in status["ranges"]]
        assert sorted(s for held in slots for s in held) == [0, 1, 2], slots
        assert shown == [SlotLayout(1, 3).describe_slots(held) for held in slots], (shown, slots)
    else:
        assert all(":" not in text for text in shown), shown
    assert status["rangeMap"] == " ".join(f"w{r['worker']}={r['partitions']}" for r in status["ranges"])
    assert table[0].split()[:4] == ["NAME", "READY", "WORKERS", "RANGES"]
    assert table[1].split()[:3 + len(shown)] == [NAME, "True", str(status["workers"]), *status["rangeMap"].split()]


async def _gone(api: Any, path: str) -> bool:
    return await api.get(path) is None


async def _no_pods(api: Any) -> bool:
    found = await api.get(f"/api/v1/namespaces/{NS}/pods")
    return not (found or {}).get("items")



def _describe_duplicates(log: list[Any], processed: list[Any]) -> str:
    """Where each twice-handled uuid sits in the input and who handled it when (for diagnosis)."""
    where: dict[str, list[tuple[int, int]]] = {}
    for e in log:
        where.setdefault(e.uuid, []).append((e.partition, e.offset))
    handled: dict[str, list[Any]] = {}
    for r in processed:
        handled.setdefault(r["uuid"], []).append(r)
    lines = [f"{uuid} input at {where.get(uuid)}: " + "; ".join(
        f"worker {r['worker']} p{r['partition']}@{r['offset']} started {r['startedAt']}" for r in records)
        for uuid, records in handled.items() if len(records) > 1]
    return "\n".join(lines[:30])


def _describe_lost(bootstrap: str, group: str, log: list[Any], processed: list[Any]) -> str:
    """Where each lost uuid sits, its slot, the published maps, and the slot's positions (totals
    records) and handled events around it (for diagnosis)."""
    from keyrange.events import SOURCE_OFFSET_HEADER, is_totals_key
    from keyrange.ranges.channel import ASSIGNMENT_KEY, Publication, control_topic
    from keyrange.ranges.layout import SlotLayout

    handled = {r["uuid"] for r in processed}
    lost = [e for e in log if e.uuid not in handled]
    if not lost:
        return ""
    pubs = [Publication.decode(m.value()) for m in read_topic(bootstrap, control_topic(group))
            if m.key() == ASSIGNMENT_KEY and m.value() is not None]
    parts = max(e.partition for e in log) + 1
    layout = SlotLayout.of_slot_count(parts, pubs[-1].map.slot_count)
    lines = [f"published: {p.map.describe(layout)} transit {sorted(p.transit)} at {p.published_ms}" for p in pubs]
    totals = [(m.key(), m.offset(), int(dict(m.headers() or [])[SOURCE_OFFSET_HEADER]), m.timestamp()[1])
              for m in read_topic(bootstrap, f"{group}.state") if is_totals_key(m.key())]
    for e in lost[:5]:
        slot = layout.slot_for_key(e.partition, str(e.client_id).encode())
        lines.append(f"lost {e.uuid} client {e.client_id} p{e.partition}@{e.offset} slot {layout.describe_slot(slot)}")
        copies = [(x.partition, x.offset) for x in log if x.uuid == e.uuid]
        lines.append(f"  copies in the input: {copies}")
        positions = [(k.decode(), at, to, ts) for k, at, to, ts in totals if abs(to - e.offset) < 400]
        lines.append(f"  totals records near it (key, changelog offset, counts to, time): {positions}")
        near = sorted((r["offset"], r["worker"], r["startedAt"]) for r in processed
                      if r["partition"] == e.partition and abs(r["offset"] - e.offset) < 15
                      and layout.slot_for_key(e.partition, str(r["clientId"]).encode()) == slot)
        lines.append(f"  handled events of its slot near it (offset, worker, startedAt): {near}")
    return "\n".join(lines)
