"""The Helm chart: lints strictly, renders valid Kubernetes for several values files, and matches the CRD."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from keyrange.operator import rendering
from keyrange.spec import parse_spec
from tests.helmtools import by_kind
from tests.operator.crd_schema import CRD_PATH, ROOT, admit, admit_streamconsumer
from tests.operator.kubecluster import helm_binary

CHART = ROOT / "charts" / "keyrange"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
"""The chart's own example values files (charts/keyrange/ci/, as chart-testing expects them)."""
VALUES = sorted((Path(__file__).parent / "chart_values").glob("*.yaml")) + CI_VALUES
VALUE_SETS = [None, *VALUES]


def _helm_binary() -> str:
    return helm_binary()


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Run helm offline with throwaway cache/config/data homes."""
    home = tmp_path_factory.mktemp("helm")
    env = {**os.environ, **{f"HELM_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}}
    binary = _helm_binary()

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([binary, *args], env=env, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result

    yield run


def _render(helm: Any, values: Path | None) -> list[dict[str, Any]]:
    args = ["template", "rel", str(CHART), "--namespace", "keyrange-system", "--include-crds"]
    if values is not None:
        args += ["--values", str(values)]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def _ids(values: Path | None) -> str:
    return "defaults" if values is None else values.stem


@pytest.mark.parametrize("values", VALUE_SETS, ids=_ids)
def test_lint_strict(helm: Any, values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["--values", str(values)] if values else [])
    helm(*args)


def _crd_schemas(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    schemas = {}
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            for version in doc["spec"]["versions"]:
                key = (f"{doc['spec']['group']}/{version['name']}", doc["spec"]["names"]["kind"])
                schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


@pytest.mark.parametrize("values", VALUE_SETS, ids=_ids)
def test_rendered_objects_are_valid(helm: Any, values: Path | None) -> None:
    docs = _render(helm, values)
    schemas = _crd_schemas(docs)
    kinds = set()
    for doc in docs:
        kinds.add(doc["kind"])
        key = (doc["apiVersion"], doc["kind"])
        if doc["apiVersion"] == "keyrange.dev/v1alpha1":
            _, errors = admit_streamconsumer(doc)
            assert errors == [], f"{doc['metadata']['name']}: {errors}"
        elif key in schemas:
            _, errors = admit(doc, schemas[key])
            assert errors == [], f"{key}: {errors}"
        elif doc["apiVersion"].startswith("monitoring.coreos.com/"):
            _check_prometheus_operator_object(doc)
        else:
            kubernetes_validate.validate(doc, "1.30", strict=True)
    assert {"Deployment", "Service"} <= kinds
    assert ("CustomResourceDefinition" in kinds) == (values is None or values.stem != "minimal")


def _check_prometheus_operator_object(doc: dict[str, Any]) -> None:
    """The Prometheus Operator's CRDs are not installed here: check the fields it needs by hand."""
    spec = doc["spec"]
    if doc["kind"] == "ServiceMonitor":
        assert spec["endpoints"] and spec["selector"]["matchLabels"]
    elif doc["kind"] == "PrometheusRule":  # the rules themselves are promtool-tested (test_rules_chart.py)
        assert spec["groups"] and all(r["alert"] and r["expr"] for g in spec["groups"] for r in g["rules"])
    elif doc["kind"] == "AlertmanagerConfig":
        receivers = {r["name"]: r for r in spec["receivers"]}
        webhook = receivers[spec["route"]["receiver"]]["webhookConfigs"][0]
        assert webhook["url"].endswith("/alertmanager/webhook")
        assert webhook["httpConfig"]["authorization"]["credentials"]["key"] == "token"
    else:
        raise AssertionError(f"no check for {doc['kind']}")


def test_defaults_run_one_cluster_wide_operator_with_least_privilege(helm: Any) -> None:
    docs = _render(helm, None)
    (deployment,) = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][0] == "operator"
    assert not any(a.startswith("--namespace") for a in container["args"])
    assert "--lease=rel-keyrange" in container["args"] and "--lease-namespace=keyrange-system" in container["args"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    (crd,) = by_kind(docs, "CustomResourceDefinition")
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    operator_roles = [r for r in by_kind(docs, "ClusterRole") if not r["metadata"]["name"].endswith("-spark-driver")]
    rules = [r for role in operator_roles for r in role["rules"]]
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert not {"escalate", "impersonate"} & set(rule["verbs"])
        if "bind" in rule["verbs"]:  # only the Spark drivers' ClusterRole, by name
            assert rule["resources"] == ["clusterroles"] and rule["resourceNames"] == ["rel-keyrange-spark-driver"]
    granted = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert ("", "secrets") not in granted and ("", "nodes") not in granted
    assert ("", "pods") not in granted  # no pod rights, not even for Spark
    assert ("keyrange.dev", "streamconsumers/status") in granted
    assert ("keyrange.dev", "streamconsumers/finalizers") in granted  # blockOwnerDeletion needs it
    assert ("rbac.authorization.k8s.io", "roles") not in granted  # drivers are bound to the chart's ClusterRole
    token_env = {e["name"]: e.get("value") for e in container["env"]}
    assert token_env["KEYRANGE_WEBHOOK_TOKEN_FILE"] == "/var/run/keyrange/webhook/token"
    assert any(a.startswith("--webhook-port=") for a in container["args"])


def test_without_spark_the_operator_cannot_touch_pods_delete_or_write_rbac(helm: Any) -> None:
    docs = _render(helm, Path(__file__).parent / "chart_values" / "no-spark.yaml")
    rules = [r for role in by_kind(docs, "ClusterRole") for r in role["rules"]]
    granted = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert ("", "pods") not in granted
    assert not any(g == "rbac.authorization.k8s.io" for g, _ in granted)
    assert not any({"delete", "deletecollection", "bind"} & set(rule["verbs"]) for rule in rules)
    assert not any(r["metadata"]["name"].endswith("-spark-driver") for r in by_kind(docs, "ClusterRole"))
    (deployment,) = by_kind(docs, "Deployment")
    assert "--no-spark-aggregation" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_operator_rules_cover_every_kind_it_applies(helm: Any) -> None:
    """Each kind the operator renders (built-in or optional) is creatable and patchable under the chart's RBAC."""
    from keyrange.operator import policies, spark
    from keyrange.operator.kube import plural_of
    from keyrange.operator.settings import OperatorSettings
    from keyrange.operator.workerdefaults import WorkerDefaults

    owner = {"metadata": {"name": "c", "uid": "u"}}
    model = parse_spec({"kafka": {"topic": "t", "bootstrapServers": "k:9092"},
                        "aggregation": {"enabled": True, "output": "/data/out"}})
    settings = OperatorSettings(worker_defaults=WorkerDefaults(networkPolicy={"enabled": True}))
    objects = [rendering.render_service_account("c", "ns", owner), rendering.render_configmap("c", "ns", model, owner),
               rendering.render_service("c", "ns", owner, settings),
               rendering.render_statefulset("c", "ns", model, 1, owner, settings),
               policies.render_disruption_budget("c", "ns", owner, settings),
               policies.render_network_policy("c", "ns", owner, settings),
               *rendering.render_optional("c", "ns", model, owner, settings),
               *spark.render_spark_objects("c", "ns", model, owner, spark.SparkJobSettings(image="i")),
               spark.render_spark_application("c", "ns", model, owner, spark.SparkJobSettings(image="i"))]
    production = CHART / "ci" / "production-values.yaml"  # network policies on
    rules = [r for role in by_kind(_render(helm, production), "ClusterRole") for r in role["rules"]]
    for obj in objects:
        assert obj is not None
        group = obj["apiVersion"].rpartition("/")[0]
        allowed = {v for r in rules if group in r["apiGroups"] and plural_of(obj["kind"]) in r["resources"]
                   for v in r["verbs"]}
        assert {"get", "create", "patch"} <= allowed, f"{obj['kind']}: the operator may only {sorted(allowed)}"


def test_operator_rules_let_it_delete_every_spark_kind_it_prunes(helm: Any) -> None:
    from keyrange.operator import spark
    from keyrange.operator.kube import plural_of

    rules = [r for role in by_kind(_render(helm, None), "ClusterRole") for r in role["rules"]]
    for api_version, kind in spark.AGGREGATION_KINDS:
        group = api_version.rpartition("/")[0]
        allowed = {v for r in rules if group in r["apiGroups"] and plural_of(kind) in r["resources"]
                   for v in r["verbs"]}
        assert {"get", "delete"} <= allowed, f"{kind}: the operator may only {sorted(allowed)}"


def test_namespaced_mode_uses_roles_per_namespace(helm: Any) -> None:
    docs = _render(helm, Path(__file__).parent / "chart_values" / "namespaced.yaml")
    (deployment,) = by_kind(docs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in by_kind(docs, "Role")}
    assert roles == {("team-a", "rel-keyrange"), ("team-b", "rel-keyrange"),
                     ("keyrange-system", "rel-keyrange-leader-election")}
    assert sorted(r["metadata"]["name"] for r in by_kind(docs, "ClusterRole")) == [
        "rel-keyrange-discovery", "rel-keyrange-spark-driver"]
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example/keyrange:1.2.3" and "--image=registry.example/keyrange:1.2.3" in args


def test_chart_crd_is_the_repository_crd() -> None:
    assert (CHART / "files" / CRD_PATH.name).read_bytes() == CRD_PATH.read_bytes(), \
        "copy crds/streamconsumers.keyrange.dev.yaml into charts/keyrange/files/"


def test_invalid_values_are_rejected_by_the_schema(helm: Any, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    for text in ("operator: {replicas: 0}", "image: {pullPolicy: Sometimes}", "unknownKey: 1",
                 "exampleConsumer: {name: Not_A_Name}"):
        bad.write_text(text)
        result = helm("template", "rel", str(CHART), "--values", str(bad), check=False)
        assert result.returncode != 0 and "schema" in result.stderr.lower(), text


def test_default_values_match_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator(schema).validate(yaml.safe_load((CHART / "values.yaml").read_text()))


def test_every_value_is_documented() -> None:
    key = re.compile(r"^(\s*)([A-Za-z][\w.-]*):(.*)$")
    lines = (CHART / "values.yaml").read_text().splitlines()
    documented_at: list[int] = []  # indentation levels of documented ancestors
    undocumented = []
    for i, line in enumerate(lines):
        match = key.match(line)
        if not match:
            continue
        indent = len(match.group(1))
        documented_at = [level for level in documented_at if level < indent]
        commented = i > 0 and lines[i - 1].strip().startswith("#")
        if commented:
            documented_at.append(indent)
        is_leaf = match.group(3).strip() != ""
        if is_leaf and not documented_at:
            undocumented.append(line.strip())
    assert undocumented == []


@pytest.mark.parametrize("values", VALUE_SETS, ids=_ids)
def test_the_operator_accepts_every_argument_the_chart_passes(helm: Any, values: Path | None,
                                                             tmp_path: Path) -> None:
    import argparse

    from keyrange.commands import operator as command

    docs = _render(helm, values)
    (deployment,) = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][0] == "operator"
    parser = argparse.ArgumentParser(exit_on_error=False)
    command.add_arguments(parser)
    args = parser.parse_args(container["args"][1:])  # raises on an unknown flag or a bad value
    args.worker_defaults = _mounted(docs, pod, container, args.worker_defaults, tmp_path)
    settings = command.settings_from_args(args)  # reads the worker defaults file as the pod would
    assert settings.image == container["image"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert args.metrics_port == ports["metrics"] and args.liveness.endswith(f":{ports['health']}/healthz")
    if "webhook" in ports:
        assert args.webhook_port == ports["webhook"]
    # What the chart says about workers reaches the StatefulSet the operator renders.
    values = yaml.safe_load(values.read_text()) if values else {}
    chart = _merged(yaml.safe_load((CHART / "values.yaml").read_text()), values)
    spec = parse_spec({"kafka": {"topic": "t", "bootstrapServers": "k:9092"}})
    owner = {"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
             "metadata": {"name": "c", "namespace": "ns", "uid": "u"}}
    worker = rendering.render_statefulset("c", "ns", spec, 1, owner, settings)["spec"]["template"]["spec"]
    assert worker["containers"][0]["imagePullPolicy"] == chart["image"]["pullPolicy"]
    assert worker.get("imagePullSecrets", []) == chart["imagePullSecrets"]
    assert worker["containers"][0]["resources"] == chart["workers"]["resources"]
    assert settings.runbook_url.startswith("https://")


def _mounted(docs: list[dict[str, Any]], pod: dict[str, Any], container: dict[str, Any], path: str,
             tmp_path: Path) -> str:
    """Where `path` inside the operator's container is on this machine: the mounted ConfigMap's file."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        if path.startswith(mount["mountPath"] + "/"):
            name = volumes[mount["name"]]["configMap"]["name"]
            (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == name]
            local = tmp_path / Path(path).name
            local.write_text(cm["data"][Path(path).name])
            return str(local)
    raise AssertionError(f"{path} is not on a volume of the operator's container")


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def test_the_readme_values_table_is_generated_from_values_yaml() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "chart-values-table.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_readme_lists_every_ci_values_file() -> None:
    readme = (CHART / "README.md").read_text()
    assert CI_VALUES and all(f"(ci/{path.name})" in readme for path in CI_VALUES)


def test_the_alertmanager_config_posts_to_the_operators_service(helm: Any) -> None:
    # docs/autoscaling.md gives this URL: the Service is named after the release.
    docs = _render(helm, CHART / "ci" / "prometheus-operator-values.yaml")
    (service,) = by_kind(docs, "Service")
    (config,) = by_kind(docs, "AlertmanagerConfig")
    port = {p["name"]: p["port"] for p in service["spec"]["ports"]}["webhook"]
    url = config["spec"]["receivers"][0]["webhookConfigs"][0]["url"]
    assert url == f"http://{service['metadata']['name']}.keyrange-system.svc:{port}/alertmanager/webhook"
    assert service["metadata"]["name"] == "rel-keyrange"


def test_the_operator_has_a_disruption_budget_that_never_blocks_a_drain(helm: Any) -> None:
    docs = _render(helm, None)
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    (deployment,) = by_kind(docs, "Deployment")
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert "minAvailable" not in pdb["spec"]  # with one replica, minAvailable 1 would block every drain


def test_the_operators_network_policy_says_what_reaches_what(helm: Any) -> None:
    assert by_kind(_render(helm, None), "NetworkPolicy") == []  # off by default
    docs = _render(helm, CHART / "ci" / "production-values.yaml")
    (policy,) = by_kind(docs, "NetworkPolicy")
    values = yaml.safe_load((CHART / "ci" / "production-values.yaml").read_text())["networkPolicy"]
    (deployment,) = by_kind(docs, "Deployment")
    ports = {p["name"]: p["containerPort"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    ingress = {rule["ports"][0]["port"]: rule["from"] for rule in spec["ingress"]}
    assert ingress == {ports["metrics"]: values["prometheus"], ports["webhook"]: values["alertmanager"]}
    egress = {tuple(p["port"] for p in rule["ports"]): rule.get("to") for rule in spec["egress"]}
    assert egress[(53, 53)] is None  # DNS anywhere
    assert egress[(443, 6443)] is None  # the API server (no `to` given: any address)
    assert egress[tuple(values["kafka"]["ports"])] == values["kafka"]["to"]
    (workers,) = egress[(9100,)]
    assert workers["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"
    assert workers["namespaceSelector"] == {}  # every namespace: the operator watches all
    namespaced = _render(helm, Path(__file__).parent / "chart_values" / "namespaced.yaml")
    assert by_kind(namespaced, "NetworkPolicy") == []


def test_a_namespaced_operator_reaches_only_its_namespaces_workers(helm: Any, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"networkPolicy": {"enabled": True},
                                      "operator": {"watchNamespaces": ["team-a", "team-b"]}}))
    (policy,) = by_kind(_render(helm, values), "NetworkPolicy")
    (workers,) = [r for r in policy["spec"]["egress"] if r["ports"] == [{"port": 9100, "protocol": "TCP"}]]
    assert workers["to"][0]["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]}
