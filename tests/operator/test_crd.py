"""The CRD accepts exactly what spec.py accepts, with the same defaults, and is a well-formed CRD."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from keyrange.spec import SpecError, StreamConsumerSpec, parse_spec
from tests.operator.crd_schema import admit, admit_streamconsumer, load_crd, spec_schema, version_schema

TOPIC = {"kafka": {"topic": "events", "bootstrapServers": "kafka:9092"}}

VALID: list[dict[str, Any]] = [
    TOPIC,
    {"kafka": {"topic": "a.b_c-1"}},
    {**TOPIC, "handler": "ledger", "handlerConfig": {"delayMs": 5, "nested": {"x": [1, 2]}}},
    {**TOPIC, "handler": "my_pkg.handlers:on_event"},
    {**TOPIC, "dedup": {"ttlSeconds": 0.5}},
    {**TOPIC, "dedup": {"ttlSeconds": 86400}},
    {**TOPIC, "concurrency": 1, "maxPending": 1, "maxRetries": 0},
    {**TOPIC, "workers": {"min": 3, "max": 3}},
    {**TOPIC, "workers": {"min": 2, "max": 8, "replicas": 5}},
    {**TOPIC, "workers": {"max": 1}},
    {**TOPIC, "scaling": {"lagHighRecords": 10, "lagLowRecords": 9, "cooldownSeconds": 0}},
    {**TOPIC, "scaling": {"lagHighSeconds": 0.1}},
    {**TOPIC, "sink": {"topic": "out"}, "deadLetterTopic": "out.dlq", "image": "ghcr.io/x/keyrange:1"},
    {**TOPIC, "resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "512Mi"}}},
    {**TOPIC, "aggregation": {"enabled": True, "mode": "schedule", "schedule": "*/5 * * * *"}},
    {**TOPIC, "aggregation": {"enabled": True, "executors": 4, "executorMemory": "2g"}},
    {**TOPIC, "aggregation": {"enabled": True, "triggerSeconds": 0.5, "retentionMinutes": 0}},
    {**TOPIC, "kafka": {"topic": "t", "groupId": "g", "partitions": 10000}},
    {**TOPIC, "image": None, "sink": {"topic": None}},  # nulls mean "not set" on both sides
    {**TOPIC, "suspend": True},
    {**TOPIC, "env": [{"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
                      {"name": "MODE", "value": "fast"}],
     "envFrom": [{"secretRef": {"name": "handler-secrets"}}, {"prefix": "CFG_", "configMapRef": {"name": "c"}}]},
    {**TOPIC, "imagePullPolicy": "Always", "imagePullSecrets": [{"name": "regcred"}]},
    {**TOPIC, "nodeSelector": {"pool": "stream"}, "priorityClassName": "keyrange-workers",
     "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "stream", "effect": "NoSchedule"}],
     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
         {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["stream"]}]}]}}},
     "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                    "whenUnsatisfiable": "DoNotSchedule"}]},
]

INVALID: list[dict[str, Any]] = [
    {},
    {**TOPIC, "concurrency": "10"},  # a string is not a number, locally as in the cluster
    {**TOPIC, "dedup": {"ttlSeconds": "10"}},
    {**TOPIC, "aggregation": {"enabled": True, "executorMemory": "2Gi"}},  # Kubernetes units, not Spark's
    {**TOPIC, "aggregation": {"enabled": True, "driverMemory": "lots"}},
    {**TOPIC, "aggregation": {"enabled": True, "triggerSeconds": 0}},
    {**TOPIC, "aggregation": {"enabled": True, "triggerSeconds": 3601}},
    {**TOPIC, "aggregation": {"enabled": True, "retentionMinutes": -1}},
    {**TOPIC, "aggregation": {"enabled": True, "retentionMinutes": 1.5}},
    {"kafka": {}},
    {"kafka": {"topic": ""}},
    {"kafka": {"topic": "has space"}},
    {"kafka": {"topic": "x" * 250}},
    {"kafka": {"topic": "t", "partitions": 0}},
    {"kafka": {"topic": "t", "unknown": 1}},
    {**TOPIC, "surprise": True},
    {**TOPIC, "handler": "not a handler"},
    {**TOPIC, "handler": "module_without_function"},
    {**TOPIC, "dedup": {"ttlSeconds": 0}},
    {**TOPIC, "dedup": {"ttlSeconds": -1}},
    {**TOPIC, "dedup": {"ttlSeconds": 86401}},
    {**TOPIC, "concurrency": 0},
    {**TOPIC, "maxPending": 0},
    {**TOPIC, "maxRetries": 101},
    {**TOPIC, "workers": {"min": 0}},
    {**TOPIC, "workers": {"min": 4, "max": 3}},
    {**TOPIC, "workers": {"min": 7}},  # above the default max of 6
    {**TOPIC, "workers": {"min": 2, "max": 4, "replicas": 5}},
    {**TOPIC, "workers": {"min": 2, "max": 4, "replicas": 1}},
    {**TOPIC, "scaling": {"lagHighRecords": 0}},
    {**TOPIC, "scaling": {"lagLowRecords": 5000}},
    {**TOPIC, "scaling": {"lagHighSeconds": 0}},
    {**TOPIC, "scaling": {"cooldownSeconds": -1}},
    {**TOPIC, "sink": {"topic": "bad topic"}},
    {**TOPIC, "deadLetterTopic": "bad/topic"},
    {**TOPIC, "resources": {"requests": {"cpu": 1}}},
    {**TOPIC, "resources": {"claims": []}},
    {**TOPIC, "aggregation": {"mode": "schedule"}},
    {**TOPIC, "aggregation": {"mode": "batch"}},
    {**TOPIC, "aggregation": {"executors": 0}},
    {"kafka": {"topic": "t"}, "sink": {"topic": "t"}},  # outputs into the input: they would be consumed again
    {"kafka": {"topic": "t"}, "deadLetterTopic": "t"},  # dead letters would loop
    {"kafka": {"topic": "t"}, "sink": {"topic": "x"}, "deadLetterTopic": "x"},
    {"kafka": {"topic": "t"}, "deadLetterTopic": "t.processed"},  # the default sink
    {**TOPIC, "suspend": "yes"},
    {**TOPIC, "env": [{"value": "no name"}]},
    {**TOPIC, "env": [{"name": "1BAD"}]},
    {**TOPIC, "env": [{"name": "BOTH", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
    {**TOPIC, "envFrom": [{"prefix": "NOTHING_"}]},
    {**TOPIC, "envFrom": [{"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}}]},
    {**TOPIC, "envFrom": [{"secretRef": {}}]},
    {**TOPIC, "imagePullPolicy": "Sometimes"},
    {**TOPIC, "imagePullSecrets": [{}]},
    {**TOPIC, "nodeSelector": {"pool": 1}},
    {**TOPIC, "tolerations": [{"operator": "Maybe"}]},
    {**TOPIC, "tolerations": [{"key": "k", "surprise": 1}]},
    {**TOPIC, "priorityClassName": "Not_A_Name"},
    {**TOPIC, "affinity": "anywhere"},
]


def _pydantic_accepts(spec: dict[str, Any]) -> bool:
    try:
        parse_spec(spec)
    except SpecError:
        return False
    return True


@pytest.mark.parametrize("spec", VALID, ids=range(len(VALID)))
def test_valid_specs_pass_both_with_the_same_defaults(spec: dict[str, Any]) -> None:
    stored, errors = admit(spec, spec_schema())
    assert errors == []
    model = parse_spec(spec)
    assert stored == model.model_dump(by_alias=True, exclude_none=True)


@pytest.mark.parametrize("spec", INVALID, ids=range(len(INVALID)))
def test_invalid_specs_fail_both(spec: dict[str, Any]) -> None:
    _, errors = admit(spec, spec_schema())
    assert errors, "the CRD accepted a spec that spec.py rejects"
    assert not _pydantic_accepts(spec), "spec.py accepted a spec that the CRD rejects"


def _crd_fields(schema: dict[str, Any]) -> set[str]:
    out = set()
    for key, sub in schema.get("properties", {}).items():
        out.add(key)
        out |= {f"{key}.{k}" for k in _crd_fields(sub)}
    return out


def _model_fields(model: type[BaseModel]) -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        key = field.alias or name
        out.add(key)
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            out |= {f"{key}.{k}" for k in _model_fields(sub)}
    return out


def test_crd_and_model_declare_the_same_fields() -> None:
    assert _crd_fields(spec_schema()) == _model_fields(StreamConsumerSpec)


def test_every_spec_field_is_described_or_obvious() -> None:
    undocumented = [
        k for k, sub in spec_schema()["properties"].items() if "description" not in sub
    ]
    assert undocumented == []


def test_long_names_are_rejected_with_a_reason() -> None:
    obj = {"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer", "spec": TOPIC}
    _, ok = admit_streamconsumer({**obj, "metadata": {"name": "a" * 45}})
    assert ok == []
    _, errors = admit_streamconsumer({**obj, "metadata": {"name": "a" * 46}})
    assert any("45 characters" in e for e in errors)


# `kubectl api-resources` short names of the built-in kinds (Kubernetes 1.30-1.34).
BUILTIN_SHORT_NAMES = {
    "cs", "cm", "ep", "ev", "limits", "ns", "no", "pvc", "pv", "po", "rc", "quota", "sa", "svc",
    "crd", "crds", "ds", "deploy", "rs", "sts", "hpa", "cj", "csr", "ing", "netpol", "pdb", "pc",
    "sc", "ingclass", "vac", "ipaddr", "sp",
}


def test_crd_shape() -> None:
    crd = load_crd()
    names = crd["spec"]["names"]
    assert crd["metadata"]["name"] == f"{names['plural']}.{crd['spec']['group']}"
    assert not set(names["shortNames"]) & BUILTIN_SHORT_NAMES
    assert not set(names["shortNames"]) & {names["plural"], names["singular"], names["kind"].lower()}
    version = crd["spec"]["versions"][0]
    assert version["subresources"]["status"] == {}
    scale = version["subresources"]["scale"]
    assert scale["specReplicasPath"] == ".spec.workers.replicas"
    assert "replicas" in spec_schema()["properties"]["workers"]["properties"]
    status_props = version_schema()["properties"]["status"]["properties"]
    assert scale["statusReplicasPath"].removeprefix(".status.") in status_props
    assert scale["labelSelectorPath"].removeprefix(".status.") in status_props
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert set(columns) == {"Ready", "Workers", "Ranges", "Lag", "Phase", "Age"}
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    for column in columns.values():
        if column["jsonPath"].startswith(".status."):
            head = column["jsonPath"].removeprefix(".status.").split(".")[0].split("[")[0]
            assert head in status_props


@pytest.mark.parametrize("version", ["1.25", "1.30", "1.34"])
def test_the_crd_is_a_valid_customresourcedefinition(version: str) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(load_crd(), version, strict=True)
