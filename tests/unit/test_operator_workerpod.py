"""The worker pod's resources, environment, image pulling, scheduling, disruption budget and network
policy, from the StreamConsumer and the chart's worker defaults (validated offline against Kubernetes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from keyrange.errors import UserError
from keyrange.operator import policies, rendering
from keyrange.operator.settings import OperatorSettings
from keyrange.operator.workerdefaults import DEFAULT_RESOURCES, WorkerDefaults, load_worker_defaults
from keyrange.spec import SpecError, parse_spec

OWNER = {"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
         "metadata": {"name": "payments", "namespace": "shop", "uid": "6f1c-uid"}}
KAFKA = {"topic": "events", "bootstrapServers": "kafka:9092"}
SELECTOR = {"matchLabels": rendering.selector_labels("payments")}


def _pod(spec: dict[str, Any], settings: OperatorSettings | None = None) -> dict[str, Any]:
    sts = rendering.render_statefulset("payments", "shop", parse_spec({"kafka": KAFKA, **spec}), 2, OWNER,
                                       settings or OperatorSettings())
    kubernetes_validate.validate(sts, "1.34", strict=True)
    return dict(sts["spec"]["template"]["spec"])


def test_workers_are_never_besteffort() -> None:
    container = _pod({})["containers"][0]
    assert container["resources"] == DEFAULT_RESOURCES
    assert "cpu" not in container["resources"]["limits"]  # a throttled worker looks lagging


def test_spec_resources_replace_the_defaults_as_a_whole() -> None:
    container = _pod({"resources": {"limits": {"memory": "2Gi", "cpu": "2"}}})["containers"][0]
    assert container["resources"] == {"limits": {"memory": "2Gi", "cpu": "2"}}


def test_chart_defaults_apply_and_the_spec_wins_field_by_field() -> None:
    defaults = WorkerDefaults.model_validate({
        "resources": {"requests": {"cpu": "1"}}, "nodeSelector": {"pool": "a"}, "priorityClassName": "high",
        "tolerations": [{"key": "k", "operator": "Exists"}], "imagePullSecrets": [{"name": "chart-cred"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [{"key": "ssd", "operator": "Exists"}]}}]}}})
    settings = OperatorSettings(image_pull_policy="Always", worker_defaults=defaults)
    pod = _pod({}, settings)
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "1"}}
    assert pod["containers"][0]["imagePullPolicy"] == "Always"
    assert (pod["nodeSelector"], pod["priorityClassName"]) == ({"pool": "a"}, "high")
    assert pod["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert pod["imagePullSecrets"] == [{"name": "chart-cred"}]
    assert "nodeAffinity" in pod["affinity"]

    pod = _pod({"nodeSelector": {"pool": "b"}, "priorityClassName": "low", "imagePullPolicy": "Never",
                "tolerations": [{"key": "x", "operator": "Equal", "value": "y", "effect": "NoExecute",
                                 "tolerationSeconds": 30}],
                "imagePullSecrets": [{"name": "mine"}, {"name": "chart-cred"}]}, settings)
    assert (pod["nodeSelector"], pod["priorityClassName"]) == ({"pool": "b"}, "low")
    assert pod["containers"][0]["imagePullPolicy"] == "Never"
    assert pod["tolerations"] == [{"key": "x", "operator": "Equal", "value": "y", "effect": "NoExecute",
                                   "tolerationSeconds": 30}]
    assert pod["imagePullSecrets"] == [{"name": "chart-cred"}, {"name": "mine"}]  # added, each once


def test_workers_spread_over_nodes_and_zones_by_default_and_constraints_select_the_consumer() -> None:
    spread = _pod({})["topologySpreadConstraints"]
    assert [(c["topologyKey"], c["whenUnsatisfiable"]) for c in spread] == [
        ("kubernetes.io/hostname", "ScheduleAnyway"), ("topology.kubernetes.io/zone", "ScheduleAnyway")]
    assert all(c["labelSelector"] == SELECTOR for c in spread)
    own = {"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
           "labelSelector": {"matchLabels": {"team": "x"}}}
    given = _pod({"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "rack", "whenUnsatisfiable": "DoNotSchedule"}, own]})
    assert given["topologySpreadConstraints"] == [
        {"maxSkew": 1, "topologyKey": "rack", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": SELECTOR}, own]


def test_env_and_env_from_reach_the_container() -> None:
    container = _pod({"env": [{"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "t"}}},
                              {"name": "MODE", "value": "fast"}],
                      "envFrom": [{"secretRef": {"name": "handler"}}, {"prefix": "C_", "configMapRef": {"name": "c"}}]
                      })["containers"][0]
    names = [e["name"] for e in container["env"]]
    assert names == ["POD_NAMESPACE", "API_TOKEN", "MODE"]
    assert container["envFrom"] == [{"secretRef": {"name": "handler"}}, {"prefix": "C_", "configMapRef": {"name": "c"}}]


@pytest.mark.parametrize("env", [
    [{"name": "POD_NAMESPACE", "value": "x"}],
    [{"name": "KEYRANGE_KAFKA_SASL_PASSWORD", "value": "x"}],
    [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}],
])
def test_env_that_would_hide_a_variable_is_refused_by_name(env: list[dict[str, Any]]) -> None:
    spec = parse_spec({"kafka": {**KAFKA, "clientPropertiesFrom": [
        {"name": "sasl.password", "secretKeyRef": {"name": "s", "key": "k"}}]}, "env": env})
    with pytest.raises(SpecError, match=rf"spec.env\[\d\] sets {env[-1]['name']}"):
        rendering.check_cluster_spec("payments", spec)


def test_a_disruption_budget_per_consumer_that_never_blocks_a_drain() -> None:
    pdb = policies.render_disruption_budget("payments", "shop", OWNER, OperatorSettings())
    assert pdb is not None
    kubernetes_validate.validate(pdb, "1.34", strict=True)
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": SELECTOR, "unhealthyPodEvictionPolicy": "AlwaysAllow"}
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == "6f1c-uid"
    off = WorkerDefaults.model_validate({"podDisruptionBudget": {"enabled": False}})
    assert policies.render_disruption_budget("payments", "shop", OWNER, OperatorSettings(worker_defaults=off)) is None


def test_the_network_policy_admits_only_metrics_scrapes_and_lets_workers_reach_only_dns_and_kafka() -> None:
    assert policies.render_network_policy("payments", "shop", OWNER, OperatorSettings()) is None  # off by default
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keyrange-system"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}}}
    kafka = [{"ipBlock": {"cidr": "10.1.0.0/16"}}]
    defaults = WorkerDefaults.model_validate({"networkPolicy": {
        "enabled": True, "metricsFrom": [prometheus], "operator": [operator], "kafka": {"ports": [9092], "to": kafka}}})
    policy = policies.render_network_policy("payments", "shop", OWNER, OperatorSettings(worker_defaults=defaults))
    assert policy is not None
    kubernetes_validate.validate(policy, "1.34", strict=True)
    spec = policy["spec"]
    assert spec["podSelector"] == SELECTOR and spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [{"from": [operator, prometheus], "ports": [{"port": 9100, "protocol": "TCP"}]}]
    assert spec["egress"] == [{"ports": policies.DNS_PORTS},
                              {"ports": [{"port": 9092, "protocol": "TCP"}], "to": kafka}]
    nobody = WorkerDefaults.model_validate({"networkPolicy": {"enabled": True}})
    closed = policies.render_network_policy("payments", "shop", OWNER, OperatorSettings(worker_defaults=nobody))
    assert closed is not None and closed["spec"]["ingress"] == []  # an empty `from` would admit everyone


def test_worker_defaults_file_errors_name_the_file_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "worker-defaults.yaml"
    path.write_text("podDisruptionBudget: {enabled: maybe}\nsurprise: 1\n")
    with pytest.raises(UserError, match=r"worker-defaults.yaml: .*podDisruptionBudget.enabled.*surprise"):
        load_worker_defaults(path)
    path.write_text("resources: {requests: {cpu: '2'}}\n")
    assert load_worker_defaults(path).resources == {"requests": {"cpu": "2"}}
