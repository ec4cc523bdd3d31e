"""Pure rendering of a StreamConsumer's Kubernetes objects, validated offline against Kubernetes 1.30."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from keyrange.operator import rendering
from keyrange.operator.settings import WORKER_SPEC_PATH, OperatorSettings
from keyrange.spec import SpecError, parse_document, parse_spec

OWNER = {"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
         "metadata": {"name": "payments", "namespace": "shop", "uid": "6f1c-uid"}}
SETTINGS = OperatorSettings(image="registry.example/keyrange:1.2.3", termination_grace_seconds=90)
SPEC = parse_spec({"kafka": {"topic": "events", "bootstrapServers": "kafka:9092"}, "handler": "ledger",
                   "workers": {"min": 2, "max": 5},
                   "resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "512Mi"}}})


def _all(spec: Any = SPEC, replicas: int = 3) -> list[dict[str, Any]]:
    return [
        rendering.render_service_account("payments", "shop", OWNER),
        rendering.render_configmap("payments", "shop", spec, OWNER),
        rendering.render_service("payments", "shop", OWNER, SETTINGS),
        rendering.render_statefulset("payments", "shop", spec, replicas, OWNER, SETTINGS),
    ]


@pytest.mark.parametrize("version", ["1.30", "1.34"])
def test_every_builtin_object_is_valid_kubernetes(version: str) -> None:
    for obj in _all():
        kubernetes_validate.validate(obj, version, strict=True)


def test_statefulset_runs_the_worker_contract() -> None:
    sts = rendering.render_statefulset("payments", "shop", SPEC, 3, OWNER, SETTINGS)
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["keyrange", "worker", "--spec-file", WORKER_SPEC_PATH,
                                    "--metrics-port", "9100"]
    assert container["image"] == "registry.example/keyrange:1.2.3"
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == "payments-worker"
    assert pod["terminationGracePeriodSeconds"] == 90
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["readinessProbe"]["httpGet"]["port"] == "metrics"
    assert container["livenessProbe"]["httpGet"]["port"] == "metrics"
    assert container["resources"] == {"requests": {"cpu": "250m"}, "limits": {"memory": "512Mi"}}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "spec")
    assert WORKER_SPEC_PATH.startswith(mount["mountPath"] + "/")
    assert sts["spec"]["selector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    sa = rendering.render_service_account("payments", "shop", OWNER)
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False and sa["automountServiceAccountToken"] is False


def test_spec_image_overrides_the_default() -> None:
    spec = parse_spec({"kafka": {"topic": "t", "bootstrapServers": "k:9092"}, "image": "mine:2"})
    sts = rendering.render_statefulset("payments", "shop", spec, 1, OWNER, SETTINGS)
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "mine:2"


def test_configmap_holds_a_document_the_worker_can_load() -> None:
    cm = rendering.render_configmap("payments", "shop", SPEC, OWNER)
    doc = yaml.safe_load(cm["data"][rendering.SPEC_FILE_KEY])
    consumer = parse_document(doc, "configmap")
    assert consumer.name == "payments"
    assert consumer.spec == SPEC


def test_a_spec_change_changes_the_pod_template_and_nothing_else_does() -> None:
    before = rendering.render_statefulset("payments", "shop", SPEC, 3, OWNER, SETTINGS)
    same = rendering.render_statefulset("payments", "shop", SPEC, 5, OWNER, SETTINGS)
    changed = SPEC.model_copy(update={"concurrency": 8})
    after = rendering.render_statefulset("payments", "shop", changed, 3, OWNER, SETTINGS)
    assert before["spec"]["template"] == same["spec"]["template"]  # scaling does not roll pods
    annotation = rendering.SPEC_HASH_ANNOTATION
    assert before["spec"]["template"]["metadata"]["annotations"][annotation] != \
        after["spec"]["template"]["metadata"]["annotations"][annotation]


def test_kubectl_scale_does_not_roll_the_workers() -> None:
    """`kubectl scale strc` writes spec.workers.replicas: the planner reacts by handoffs; restarting
    every pod as well would turn one rescale into a rollout (seen against the real StatefulSet
    controller)."""
    before = rendering.render_statefulset("payments", "shop", SPEC, 1, OWNER, SETTINGS)
    for workers in ({"min": 1, "max": 6, "replicas": 3}, {"min": 2, "max": 4}):
        scaled = SPEC.model_copy(update={"workers": SPEC.workers.model_copy(update=workers)})
        after = rendering.render_statefulset("payments", "shop", scaled, 1, OWNER, SETTINGS)
        assert after["spec"]["template"] == before["spec"]["template"], workers


def test_children_are_owned_by_the_streamconsumer() -> None:
    for obj in [*_all(), *rendering.render_optional("payments", "shop", SPEC, OWNER, SETTINGS)]:
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == "6f1c-uid" and ref["controller"] is True and ref["kind"] == "StreamConsumer"
        assert obj["metadata"]["namespace"] == "shop"
        assert obj["metadata"]["labels"][rendering.CONSUMER_LABEL] == "payments"


def test_service_is_headless_and_selects_the_workers() -> None:
    svc = rendering.render_service("payments", "shop", OWNER, SETTINGS)
    sts = rendering.render_statefulset("payments", "shop", SPEC, 1, OWNER, SETTINGS)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["name"] == "metrics"


def test_optional_monitoring_objects() -> None:
    monitor, rule = rendering.render_optional("payments", "shop", SPEC, OWNER,
                                              OperatorSettings(monitoring_labels={"release": "prom"}))
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["spec"]["selector"]["matchLabels"] == rendering.selector_labels("payments")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert rule["kind"] == "PrometheusRule" and rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"]["groups"][0]["rules"]


@pytest.mark.parametrize(("planned", "replicas", "expected"), [
    (None, None, 2), (None, 3, 3), (4, None, 4), (4, 3, 4),
    (9, None, 9),  # above workers.max after the bounds shrank: pods that own ranges stay until merged
    (1, None, 1),
])
def test_desired_replicas(planned: int | None, replicas: int | None, expected: int) -> None:
    spec = SPEC.model_copy(update={"workers": SPEC.workers.model_copy(update={"replicas": replicas})})
    assert rendering.desired_replicas(spec, planned) == expected


def test_cluster_only_rules_name_the_fix() -> None:
    local = parse_spec({"kafka": {"topic": "events"}})
    with pytest.raises(SpecError, match="bootstrapServers is required in a cluster"):
        rendering.check_cluster_spec("payments", local)
    with pytest.raises(SpecError, match="at most 45 characters"):
        rendering.check_cluster_spec("p" * 46, SPEC)
    rendering.check_cluster_spec("p" * 45, SPEC)
