"""The worker pods on the real API server, from a release of the chart with worker values set: what
the chart says reaches the operator (its Deployment's own arguments and worker-defaults ConfigMap,
read back from the cluster), and from it the pods the real StatefulSet controller creates:
resources (not BestEffort, as the API server judges), PriorityClass, tolerations, spread, pull
policy and secrets; a PodDisruptionBudget the eviction API enforces; a NetworkPolicy; env and envFrom
reaching a running worker's handler; pod fields the API server refuses reported in status."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import pytest_asyncio

from keyrange.commands import operator as command
from keyrange.loadgen import LoadShape, generate, produce_all
from keyrange.operator.settings import OperatorSettings
from tests.kafkatools import read_processed
from tests.operator.conftest import (
    CHART,
    RELEASE_NS,
    SC_PATH,
    Api,
    Release,
    create_namespace,
    eventually,
    helm,
    running_operator,
)
from tests.operator.kubecluster import ROOT
from tests.operator.node_agent import TestNodeAgent

pytestmark = pytest.mark.asyncio(loop_scope="module")

NS = "worker-pods"
NS_RUN = "worker-pods-run"
RELEASE = "pods"
PRIORITY = "keyrange-test-workers"
CHART_VALUES = ["--set", "crds.install=false", "--set", f"operator.watchNamespaces={{{NS},{NS_RUN}}}",
                "--set", "image.pullPolicy=Always", "--set", "imagePullSecrets[0].name=chart-cred",
                "--set", f"workers.priorityClassName={PRIORITY}",
                "--set", "workers.tolerations[0].key=dedicated", "--set", "workers.tolerations[0].operator=Exists",
                "--set", "networkPolicy.enabled=true"]


def _settings_of_the_release(release: Release, tmp_path: Path) -> OperatorSettings:
    """OperatorSettings exactly as the release's operator pod would build them: its Deployment's
    arguments parsed by `keyrange operator`, its worker-defaults ConfigMap as the mounted file."""
    plane = release.plane
    deployment = json.loads(plane.kubectl("get", "deployment", f"{RELEASE}-keyrange", "-n", RELEASE_NS,
                                          "-o", "json").stdout)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    parser = argparse.ArgumentParser(exit_on_error=False)
    command.add_arguments(parser)
    parsed = parser.parse_args(args[1:])
    cm = json.loads(plane.kubectl("get", "configmap", f"{RELEASE}-keyrange-worker-defaults", "-n", RELEASE_NS,
                                  "-o", "json").stdout)
    defaults = tmp_path / "worker-defaults.yaml"
    defaults.write_text(cm["data"]["worker-defaults.yaml"])
    parsed.worker_defaults, parsed.refresh_seconds, parsed.image = str(defaults), 0.5, "keyrange:test"
    return command.settings_from_args(parsed)


@pytest.fixture(scope="module")
def pods_release(release: Release, tmp_path_factory: pytest.TempPathFactory) -> tuple[Release, OperatorSettings]:
    """A release with worker values set (crds from the session's), watching this module's namespaces."""
    plane = release.plane
    for namespace in (NS, NS_RUN):
        create_namespace(plane, namespace)
    plane.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": PRIORITY},
                 "value": 1000, "description": "keyrange's test workers"})
    home = tmp_path_factory.mktemp("helm-pods")
    helm(plane, home, "install", RELEASE, str(CHART), "-n", RELEASE_NS, *CHART_VALUES)
    token = plane.token(RELEASE_NS, f"{RELEASE}-keyrange")
    own = Release(plane, plane.token_kubeconfig(home / "pods.kubeconfig", token))
    return own, _settings_of_the_release(own, home)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def operator(pods_release: tuple[Release, OperatorSettings], shared_cluster: Api,
                   tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[kopf.Memo]:
    """The release's operator (its own ServiceAccount and settings), and a node agent that reports
    the pods of NS Ready without running them."""
    own, settings = pods_release
    async with running_operator(own, [NS, NS_RUN], settings=settings) as memo, \
            TestNodeAgent(shared_cluster, [NS], tmp_path_factory.mktemp("pods-node"), name="pods-node",
                          processes=False) as node:
        yield memo
        assert node.errors == []


@pytest.fixture
def cluster(shared_cluster: Api, topic_name: str) -> Api:
    return shared_cluster.with_topic(topic_name).in_namespace(NS)


async def _pods(api: Api, name: str, count: int) -> list[dict[str, Any]] | None:
    found = await api.get(f"/api/v1/namespaces/{api.namespace}/pods?labelSelector=keyrange.dev/streamconsumer={name}")
    items = [p for p in (found or {}).get("items", []) if not p["metadata"].get("deletionTimestamp")]
    ready = [p for p in items if any(c["type"] == "Ready" and c["status"] == "True"
                                     for c in (p.get("status") or {}).get("conditions", []))]
    return items if len(ready) == count == len(items) else None


async def _evict(api: Api, pod: str) -> int:
    status, _ = await api.request("POST", f"/api/v1/namespaces/{api.namespace}/pods/{pod}/eviction",
                                  {"apiVersion": "policy/v1", "kind": "Eviction",
                                   "metadata": {"name": pod, "namespace": api.namespace}}, "application/json")
    return status


async def test_the_charts_worker_values_reach_the_pods_and_a_budget_guards_them(
        cluster: Api, operator: kopf.Memo) -> None:
    await cluster.create(SC_PATH.format(ns=NS), cluster.streamconsumer(
        "sched", workers={"min": 2, "max": 2}, imagePullSecrets=[{"name": "own-cred"}],
        affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In",
                                                               "values": ["linux"]}]}}]}}))
    pods = await eventually(lambda: _pods(cluster, "sched", 2), "two ready worker pods", timeout=120)
    for pod in pods:
        spec, container = pod["spec"], pod["spec"]["containers"][0]
        # Judged by the API server: QoS from the resources, priority resolved from the PriorityClass.
        assert pod["status"]["qosClass"] == "Burstable"
        assert spec["priorityClassName"] == PRIORITY and spec["priority"] == 1000
        assert container["imagePullPolicy"] == "Always"
        assert spec["imagePullSecrets"] == [{"name": "chart-cred"}, {"name": "own-cred"}]
        assert {"key": "dedicated", "operator": "Exists"} in spec["tolerations"]
        assert spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 10
        keys = [c["topologyKey"] for c in spec["topologySpreadConstraints"]]
        assert keys == ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]

    budget = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/sched-worker"

    async def counted() -> dict[str, Any] | None:  # by the real disruption controller
        pdb = await cluster.get(budget)
        status = (pdb or {}).get("status") or {}
        return pdb if status.get("expectedPods") == 2 and status.get("disruptionsAllowed") == 1 else None

    await eventually(counted, "the budget to count two healthy workers, one disruption allowed")
    first, second = sorted(p["metadata"]["name"] for p in pods)
    assert await _evict(cluster, first) == 201  # a drain may take one worker ...
    assert await _evict(cluster, second) == 429  # ... not both at once

    policy = await cluster.get(f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/sched-worker")
    assert policy is not None
    ingress = policy["spec"]["ingress"][0]
    operator_peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": RELEASE_NS}},
                     "podSelector": {"matchLabels": {"app.kubernetes.io/name": "keyrange",
                                                     "app.kubernetes.io/instance": RELEASE,
                                                     "app.kubernetes.io/component": "operator"}}}
    assert operator_peer in ingress["from"] and ingress["ports"] == [{"port": 9100, "protocol": "TCP"}]
    assert policy["spec"]["podSelector"]["matchLabels"]["keyrange.dev/streamconsumer"] == "sched"

    table = cluster.plane.kubectl("get", "strc", "sched", "-n", NS).stdout.splitlines()
    assert table[0].split()[:2] == ["NAME", "READY"]


async def test_pod_fields_the_api_server_refuses_are_reported_without_a_retry_loop(
        cluster: Api, operator: kopf.Memo) -> None:
    # The CRD lets affinity through as Kubernetes' own type; the API server checks it on the StatefulSet.
    await cluster.create(SC_PATH.format(ns=NS), cluster.streamconsumer(
        "refused", affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": []}}}))

    async def degraded() -> dict[str, Any] | None:
        obj = await cluster.get(f"{SC_PATH.format(ns=NS)}/refused")
        status = (obj or {}).get("status") or {}
        return obj if status.get("phase") == "Degraded" else None

    found = await eventually(degraded, "phase Degraded")
    condition = {c["type"]: c for c in found["status"]["conditions"]}["Degraded"]
    assert condition["reason"] == "InvalidSpec"
    assert "nodeSelectorTerms" in condition["message"] and "worker pod fields" in condition["message"]
    annotations = found["metadata"].get("annotations", {})
    assert "keyrange.dev/reconcile" not in annotations  # kopf holds no retry for it (PermanentError)
    assert await cluster.get(f"/apis/apps/v1/namespaces/{NS}/statefulsets/refused-worker") is None


@pytest.mark.slow
async def test_env_and_env_from_reach_the_handler_of_a_running_worker(
        cluster: Api, operator: kopf.Memo, tmp_path: Path) -> None:
    cluster = cluster.in_namespace(NS_RUN)
    plane = cluster.plane
    plane.kubectl("create", "secret", "generic", "handler-secrets", "-n", NS_RUN, "--from-literal=HANDLER_TOKEN=s3cret")
    plane.kubectl("create", "configmap", "handler-config", "-n", NS_RUN, "--from-literal=MODE=strict")
    await cluster.create(SC_PATH.format(ns=NS_RUN), cluster.streamconsumer(
        "env", handler="tests.operator.env_handler:echo_env", workers={"min": 1, "max": 1},
        env=[{"name": "PYTHONPATH", "value": str(ROOT)},  # where the handler's module is: env reached the pod
             {"name": "GREETING", "value": "hello"},
             {"name": "TOKEN_COPY",
              "valueFrom": {"secretKeyRef": {"name": "handler-secrets", "key": "HANDLER_TOKEN"}}}],
        envFrom=[{"secretRef": {"name": "handler-secrets"}},
                 {"prefix": "CFG_", "configMapRef": {"name": "handler-config"}}]))
    records = list(generate(LoadShape(rate=1000, clients=5, seed=2), count=20))
    async with TestNodeAgent(cluster, [NS_RUN], tmp_path, name="env-node") as node:
        await eventually(lambda: _pods(cluster, "env", 1), "the worker to run", timeout=120)
        await asyncio.to_thread(produce_all, cluster.bootstrap, cluster.topic, records)
        processed = await asyncio.to_thread(read_processed, cluster.bootstrap, f"{cluster.topic}.processed",
                                            len(records), 120)
        assert node.crashes == [], "the worker crashed (see its log in the test's tmp_path)"
    assert len(processed) == len(records)
    assert {json.dumps(r["result"], sort_keys=True) for r in processed} == {json.dumps(
        {"HANDLER_TOKEN": "s3cret", "TOKEN_COPY": "s3cret", "CFG_MODE": "strict", "GREETING": "hello"},
        sort_keys=True)}
