"""The CRD accepts exactly what spec.py accepts, with the same defaults, and is a well-formed CRD."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from keyrange.spec import SpecError, StreamConsumerSpec, parse_spec
from tests.operator.crd_examples import INVALID, TOPIC, VALID
from tests.operator.crd_schema import admit, admit_streamconsumer, load_crd, spec_schema, version_schema


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
