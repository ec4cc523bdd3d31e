"""The real kopf operator against a real kube-apiserver, as the chart's ServiceAccount: create, update,
scale, delete, invalid specs. Pods run on the test node agent (tests/operator/node_agent.py): in
`NS` it only reports pods Ready, in `NS_RUN` it runs the real `keyrange worker` processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar

import kopf
import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from keyrange.loadgen import LoadShape, generate, produce_all
from keyrange.operator.kube import FIELD_MANAGER
from keyrange.operator.rendering import SPEC_HASH_ANNOTATION
from tests.checkers import check_all, first_occurrences
from tests.kafkatools import read_counts, read_input_log, read_processed
from tests.operator.conftest import SC_PATH, Api, Release, create_namespace, eventually, running_operator
from tests.operator.crd_schema import admit_streamconsumer
from tests.operator.node_agent import TestNodeAgent

pytestmark = pytest.mark.asyncio(loop_scope="module")
T = TypeVar("T")

NS = "operator-flows"
NS_RUN = "operator-workers"
STS = f"/apis/apps/v1/namespaces/{NS}/statefulsets"
SVC = f"/api/v1/namespaces/{NS}/services"
CM = f"/api/v1/namespaces/{NS}/configmaps"
SA = f"/api/v1/namespaces/{NS}/serviceaccounts"
SC = SC_PATH.format(ns=NS)
SC_RUN = SC_PATH.format(ns=NS_RUN)
STS_RUN = f"/apis/apps/v1/namespaces/{NS_RUN}/statefulsets"
LAST_HANDLED = "keyrange.dev/last-handled-configuration"
"""kopf's record of the spec it finished handling (handlers.configure sets the prefix)."""
RECONCILE_PROGRESS = "keyrange.dev/reconcile"
"""kopf's progress record of the reconcile handler while it is unfinished (e.g. a retry is due)."""
GC_NEW_KIND_SECONDS = 150
"""Bound on Kubernetes' garbage collector deleting dependents of a kind created moments before
(its 30 s discovery resync, then its backoff for the owner it could not map)."""


@pytest.fixture
def cluster(shared_cluster: Api, topic_name: str) -> Api:
    """The module's cluster, with an input topic of this test's own."""
    return shared_cluster.with_topic(topic_name).in_namespace(NS)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def operator(release: Release, shared_cluster: Api, tmp_path_factory: pytest.TempPathFactory
                   ) -> AsyncIterator[kopf.Memo]:
    """The module's operator (the chart's ServiceAccount), and a node agent that reports the pods
    of `NS` Ready without running them."""
    for namespace in (NS, NS_RUN):
        create_namespace(release.plane, namespace)
    async with running_operator(release, [NS, NS_RUN]) as memo, \
            TestNodeAgent(shared_cluster, [NS], tmp_path_factory.mktemp("ready-node"), name="ready-node",
                          processes=False) as node:
        yield memo
        assert node.errors == []


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}


def _reconciles(result: str) -> float:
    """keyrange_operator_reconciles_total of the reconcile handler with `result`, in this process."""
    labels = {"handler": "reconcile", "result": result}
    return REGISTRY.get_sample_value("keyrange_operator_reconciles_total", labels) or 0.0


async def _status(api: Api, name: str, **expected: Any) -> dict[str, Any] | None:
    obj = await api.get(f"{SC_PATH.format(ns=api.namespace)}/{name}")
    status = (obj or {}).get("status") or {}
    return obj if all(status.get(k) == v for k, v in expected.items()) else None


async def _explained(wait: Awaitable[T], api: Api, name: str, node: TestNodeAgent) -> T:
    """`wait`, or its timeout with the consumer's status and what the node's workers logged."""
    try:
        return await wait
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{await _story(api, name, node)}") from None


async def _story(api: Api, name: str, node: TestNodeAgent) -> str:
    """The consumer's status, its and its StatefulSet's Events in order (the operator's rescales, the
    StatefulSet controller's pod creations and deletions), and what the node's workers logged."""
    obj = await api.get(f"{SC_PATH.format(ns=api.namespace)}/{name}")
    events = [*await api.events(api.namespace, name), *await api.events(api.namespace, f"{name}-worker")]
    events.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    lines = [f"{e.get('lastTimestamp') or e.get('eventTime')} {e['involvedObject']['kind']} {e.get('reason')}: "
             f"{e.get('message')}" for e in events]
    return "status: {}\nevents:\n{}\n{}".format((obj or {}).get("status"), "\n".join(lines), node.report())


async def test_create_renders_children_and_status(cluster: Api, operator: kopf.Memo) -> None:
    await cluster.create(SC, cluster.streamconsumer("payments", workers={"min": 2, "max": 4}))
    sts = await eventually(lambda: cluster.get(f"{STS}/payments-worker"), "the StatefulSet")
    svc = await eventually(lambda: cluster.get(f"{SVC}/payments-worker"), "the Service")
    cm = await eventually(lambda: cluster.get(f"{CM}/payments-spec"), "the ConfigMap")
    sa = await eventually(lambda: cluster.get(f"{SA}/payments-worker"), "the workers' ServiceAccount")
    assert sts["spec"]["replicas"] == 2
    owner = await cluster.get(f"{SC}/payments")
    assert owner is not None
    for child in (sts, svc, cm, sa):
        assert child["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        # Written by server-side apply under the operator's own field manager (the server validated
        # the object strictly: unknown fields would have been refused).
        managers = {(m["manager"], m["operation"]) for m in child["metadata"]["managedFields"]}
        assert (FIELD_MANAGER, "Apply") in managers

    running = await eventually(lambda: _status(cluster, "payments", phase="Running"), "phase Running")
    status = running["status"]
    assert status["workers"] == 2 and status["readyWorkers"] == 2 and status["epoch"] >= 1
    assert [r["worker"] for r in status["ranges"]] == [0, 1]
    assert status["observedGeneration"] == running["metadata"]["generation"]
    assert _conditions(running)["Ready"]["status"] == "True"
    assert _conditions(running)["Degraded"]["status"] == "False"
    _, errors = admit_streamconsumer(running)
    assert errors == [], "the status the operator writes must fit the CRD's status schema"


async def test_spec_update_rolls_out_and_updates_status(cluster: Api, operator: kopf.Memo) -> None:
    await cluster.create(SC, cluster.streamconsumer("orders"))
    before = await eventually(lambda: cluster.get(f"{STS}/orders-worker"), "the StatefulSet")
    await eventually(lambda: _status(cluster, "orders", phase="Running"), "phase Running")
    old_hash = before["spec"]["template"]["metadata"]["annotations"][SPEC_HASH_ANNOTATION]

    await cluster.patch(f"{SC}/orders", {"spec": {"concurrency": 8, "image": "keyrange:2"}})

    async def rolled() -> dict[str, Any] | None:
        sts = await cluster.get(f"{STS}/orders-worker")
        template = (sts or {})["spec"]["template"]
        changed = template["metadata"]["annotations"][SPEC_HASH_ANNOTATION] != old_hash
        return sts if changed and template["spec"]["containers"][0]["image"] == "keyrange:2" else None

    sts = await eventually(rolled, "the pod template to change")
    assert sts["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    cm = await cluster.get(f"{CM}/orders-spec")
    assert cm is not None and "concurrency: 8" in cm["data"]["streamconsumer.yaml"]
    await eventually(lambda: _status(cluster, "orders", observedGeneration=2), "observedGeneration 2")


@pytest.mark.slow
async def test_scale_subresource_splits_and_merges_through_real_workers(
        cluster: Api, operator: kopf.Memo, tmp_path: Path) -> None:
    """`kubectl scale` up then down: pods exist before their epoch, and leave only after handing off."""
    cluster = cluster.in_namespace(NS_RUN)
    await cluster.create(SC_RUN, cluster.streamconsumer("ledger", handler="ledger", workers={"min": 1, "max": 6}))
    await eventually(lambda: cluster.get(f"{STS_RUN}/ledger-worker"), "the StatefulSet")

    def owns_nothing_when_stopped(pod: str) -> None:
        ordinal = int(pod.rsplit("-", 1)[1])
        control = operator.controls.get(NS_RUN, "ledger")
        assert control is not None
        owners = [w for w, _ in control.status().ranges]
        assert ordinal not in owners, f"worker {ordinal} was stopped while it still owned slots: {owners}"

    async with TestNodeAgent(cluster, [NS_RUN], tmp_path, name="scale-node",
                             before_stop=owns_nothing_when_stopped) as node:
        await eventually(lambda: _status(cluster, "ledger", phase="Running", workers=1), "1 worker running",
                         timeout=120)

        await cluster.patch(f"{SC_RUN}/ledger/scale", {"spec": {"replicas": 3}})  # what `kubectl scale` sends
        up = await _explained(eventually(lambda: _status(cluster, "ledger", phase="Running", workers=3),
                                         "3 workers", timeout=120), cluster, "ledger", node)
        assert sorted(r["worker"] for r in up["status"]["ranges"]) == [0, 1, 2]
        # Scaling up stops no pod (a loaded run here saw worker 1 deleted and made again meanwhile).
        if node.stopped_pods:
            raise AssertionError(f"scaling 1 -> 3 stopped {node.stopped_pods}\n{await _story(cluster, 'ledger', node)}")
        assert up["status"]["epoch"] >= 5  # two splits, each an epoch with slots in transit and a grant
        assert up["status"]["selector"]  # the scale subresource's labelSelectorPath

        await cluster.patch(f"{SC_RUN}/ledger/scale", {"spec": {"replicas": 1}})
        down = await _explained(eventually(lambda: _status(cluster, "ledger", phase="Running", workers=1),
                                           "1 worker", timeout=120), cluster, "ledger", node)
        assert down["status"]["ranges"] == [{"worker": 0, "slots": "0-7", "partitions": "0-7"}]
        assert down["status"]["rangeMap"] == "w0=0-7"
        await eventually(lambda: _sts_replicas(cluster, "ledger", 1), "the StatefulSet back at 1 replica")

        async def both_stopped() -> bool:
            return node.stopped_pods == ["ledger-worker-2", "ledger-worker-1"]

        await _explained(eventually(both_stopped, "workers 2 then 1 to stop"), cluster, "ledger", node)
        assert node.errors == []
        assert node.crashes == [], "a worker crashed (see its log in the test's tmp_path)"


@pytest.mark.slow
async def test_a_spec_change_rolls_the_workers_without_breaking_a_guarantee(
        cluster: Api, operator: kopf.Memo, tmp_path: Path) -> None:
    """Ledger events with duplicates flow while a spec change rolls both workers (SIGTERM, restart)."""
    name = "rollout"
    cluster = cluster.in_namespace(NS_RUN)
    await cluster.create(SC_RUN, cluster.streamconsumer(name, handler="ledger", workers={"min": 2, "max": 2}))
    async with TestNodeAgent(cluster, [NS_RUN], tmp_path, name="rollout-node") as node:
        await eventually(lambda: _status(cluster, name, phase="Running", workers=2), "2 ready workers",
                         timeout=120)
        shape = LoadShape(rate=2000, clients=40, duplicate_ratio=0.05, ledger=True, seed=7)
        records = list(generate(shape, count=3000))
        await asyncio.to_thread(produce_all, cluster.bootstrap, cluster.topic, records[:1000])

        await cluster.patch(f"{SC_RUN}/{name}", {"spec": {"concurrency": 8}})
        for start in range(1000, len(records), 200):  # keep producing while the pods roll
            await asyncio.to_thread(produce_all, cluster.bootstrap, cluster.topic, records[start:start + 200])
            await asyncio.sleep(0.5)

        async def rolled() -> bool:
            # The real StatefulSet controller replaces the highest ordinal first, then the next
            # once the replacement is Ready (RollingUpdate).
            started = node.started_pods.count(f"{name}-worker-0") + node.started_pods.count(f"{name}-worker-1")
            return sorted(node.stopped_pods) == [f"{name}-worker-0", f"{name}-worker-1"] and started == 4

        await eventually(rolled, "both workers to be replaced", timeout=180)
        log = await asyncio.to_thread(read_input_log, cluster.bootstrap, cluster.topic)
        expected = len(first_occurrences(log))
        processed = await asyncio.to_thread(read_processed, cluster.bootstrap, f"{cluster.topic}.processed",
                                            expected, 180)
        counts = await asyncio.to_thread(read_counts, cluster.bootstrap, cluster.topic, f"{NS_RUN}.{name}", len(log))
        check_all(log, processed, counts, ledger=True)
        assert len(log) > expected  # the stream did carry duplicates
        assert node.stopped_pods == [f"{name}-worker-1", f"{name}-worker-0"] and node.crashes == []


async def _sts_replicas(cluster: Api, name: str, replicas: int) -> bool:
    sts = await cluster.get(f"/apis/apps/v1/namespaces/{cluster.namespace}/statefulsets/{name}-worker")
    return bool(sts and sts["spec"]["replicas"] == replicas)


async def test_delete_cleans_up(cluster: Api, operator: kopf.Memo) -> None:
    await cluster.create(SC, cluster.streamconsumer("gone"))
    await eventually(lambda: cluster.get(f"{STS}/gone-worker"), "the StatefulSet")
    async def control() -> Any:
        return operator.controls.get(NS, "gone")

    await eventually(control, "a range control")
    await cluster.delete(f"{SC}/gone")

    async def gone() -> bool:
        return await cluster.get(f"{SC}/gone") is None

    await eventually(gone, "the StreamConsumer to be deleted")

    async def forgotten() -> bool:
        return operator.controls.get(NS, "gone") is None

    await eventually(forgotten, "the operator to forget its range control")

    async def children_gone() -> bool:
        paths = [f"{STS}/gone-worker", f"{SVC}/gone-worker", f"{CM}/gone-spec", f"{SA}/gone-worker"]
        return all([await cluster.get(p) is None for p in paths])

    # The children go through their ownerReferences, by Kubernetes' garbage collector, which
    # learns a new kind only on its 30 s discovery resync and meanwhile retries a dependent's
    # unknown owner with exponential backoff. In a session whose CRD is seconds old that was
    # measured at 41 s after the delete (GC log: "unable to get REST mapping for StreamConsumer"
    # until its resync, next retry 20 s later); the worst case is about twice that.
    await eventually(children_gone, "the garbage collector to delete the children", timeout=GC_NEW_KIND_SECONDS)


async def test_invalid_spec_is_degraded_without_a_crash_loop(cluster: Api, operator: kopf.Memo) -> None:
    # The CRD cannot tell: bootstrapServers is optional for `keyrange run`, required in a cluster.
    bad = cluster.streamconsumer("broken")
    del bad["spec"]["kafka"]["bootstrapServers"]
    invalid_before, errors_before = _reconciles("invalid"), _reconciles("error")
    await cluster.create(SC, bad)
    degraded = await eventually(lambda: _status(cluster, "broken", phase="Degraded"), "phase Degraded")
    condition = _conditions(degraded)["Degraded"]
    assert condition["status"] == "True" and condition["reason"] == "InvalidSpec"
    assert "spec.kafka.bootstrapServers is required in a cluster" in condition["message"]
    assert await cluster.get(f"{STS}/broken-worker") is None

    # No crash loop: the handler raised kopf.PermanentError (counted as "invalid", any other
    # exception as "error"), so kopf is done with this spec: it stored it as the last handled one
    # instead of keeping a retry due (kopf's default delay is 60 s, so waiting would prove nothing).
    # kopf writes these annotations in the same patch as the status.
    annotations = degraded["metadata"].get("annotations", {})
    assert LAST_HANDLED in annotations and RECONCILE_PROGRESS not in annotations, annotations
    assert (_reconciles("invalid") - invalid_before, _reconciles("error") - errors_before) == (1, 0)

    await cluster.patch(f"{SC}/broken", {"spec": {"kafka": {"bootstrapServers": cluster.bootstrap}}})
    await eventually(lambda: cluster.get(f"{STS}/broken-worker"), "the StatefulSet after the fix")
    fixed = await eventually(lambda: _status(cluster, "broken", phase="Running"), "phase Running")
    assert _conditions(fixed)["Degraded"]["status"] == "False"


@pytest.mark.parametrize(("name", "spec"), [("odd-bounds", {"workers": {"min": 5, "max": 2}}),
                                            ("odd-handler", {"handler": "not a handler"})])
async def test_specs_the_crd_rejects_never_reach_the_operator(cluster: Api, operator: kopf.Memo, name: str,
                                                              spec: dict[str, Any]) -> None:
    # The server refuses them (422); had one been stored under an older CRD, the operator's own
    # check reports it (tests/unit/test_operator_parse.py).
    status, body = await cluster.request("POST", SC, cluster.streamconsumer(name, **spec), "application/json")
    assert status == 422, body
    assert await cluster.get(f"{SC}/{name}") is None


async def test_aggregation_starts_a_spark_driver_with_its_own_rbac(cluster: Api, operator: kopf.Memo) -> None:
    await cluster.create(SC, cluster.streamconsumer(
        "sums", aggregation={"enabled": True, "output": "s3a://bucket/sums", "executors": 2}))
    driver = await eventually(lambda: cluster.get(f"/apis/apps/v1/namespaces/{NS}/deployments/sums-aggregation"),
                              "the Spark driver Deployment")
    binding = await eventually(
        lambda: cluster.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings/sums-aggregation"),
        "the driver's RoleBinding")
    owner = await cluster.get(f"{SC}/sums")
    assert owner is not None
    for obj in (driver, binding):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    # The real authorizer: the driver's token may run executors here, and nothing more.
    driver_sa = f"--as=system:serviceaccount:{NS}:sums-aggregation"
    can_i = cluster.plane.kubectl
    assert can_i("auth", "can-i", "create", "pods", "-n", NS, driver_sa).stdout.strip() == "yes"
    assert can_i("auth", "can-i", "delete", "configmaps", "-n", NS, driver_sa).stdout.strip() == "yes"
    for denied in (["patch", "pods", "-n", NS], ["create", "pods", "-n", "default"], ["get", "secrets", "-n", NS],
                   ["create", "services", "-n", NS]):
        assert can_i("auth", "can-i", *denied, driver_sa, check=False).stdout.strip() == "no", denied
    assert "aggregate" in driver["spec"]["template"]["spec"]["containers"][0]["args"]


async def test_turning_aggregation_off_or_changing_its_mode_deletes_what_is_no_longer_wanted(
        cluster: Api, operator: kopf.Memo) -> None:
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}"
    deployment = f"/apis/apps/v1/namespaces/{NS}/deployments/tally-aggregation"
    cronjob = f"/apis/batch/v1/namespaces/{NS}/cronjobs/tally-aggregation"
    spark_objects = [deployment, cronjob, f"{rbac}/rolebindings/tally-aggregation",
                     f"/api/v1/namespaces/{NS}/serviceaccounts/tally-aggregation",
                     f"/api/v1/namespaces/{NS}/services/tally-aggregation"]
    await cluster.create(SC, cluster.streamconsumer(
        "tally", aggregation={"enabled": True, "output": "s3a://bucket/tally"}))
    await eventually(lambda: cluster.get(deployment), "the continuous driver Deployment")

    await cluster.patch(f"{SC}/tally", {"spec": {"aggregation": {"mode": "schedule", "schedule": "*/5 * * * *"}}})
    await eventually(lambda: cluster.get(cronjob), "the scheduled driver CronJob")
    await eventually(lambda: _absent(cluster, deployment), "the continuous driver deleted")

    await cluster.patch(f"{SC}/tally", {"spec": {"aggregation": {"enabled": False}}})
    for path in spark_objects:
        await eventually(lambda path=path: _absent(cluster, path), f"{path} deleted")  # type: ignore[misc]
    # The workers are untouched.
    assert await cluster.get(f"/apis/apps/v1/namespaces/{NS}/statefulsets/tally-worker") is not None


async def _absent(cluster: Api, path: str) -> bool | None:
    return True if await cluster.get(path) is None else None
