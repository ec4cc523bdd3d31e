"""What the Kubernetes API server does with a custom resource, offline: prune, default, validate.

The API server drops nulls of non-nullable fields, applies the schema's defaults (recursing into
defaulted objects), validates against the openAPIV3Schema and evaluates the x-kubernetes-validations
CEL rules. Tests use this to check rendered custom resources and the CRD against spec.py without a
cluster (there is no kube-apiserver on these machines).
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "streamconsumers.keyrange.dev.yaml"


@cache
def load_crd(path: Path = CRD_PATH) -> dict[str, Any]:
    """The CRD document."""
    return dict(yaml.safe_load(path.read_text()))


def version_schema(crd: dict[str, Any] | None = None, version: str = "v1alpha1") -> dict[str, Any]:
    """The openAPIV3Schema of one served version."""
    crd = crd or load_crd()
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return dict(v["schema"]["openAPIV3Schema"])
    raise KeyError(version)


def spec_schema() -> dict[str, Any]:
    """The schema of `.spec` of a StreamConsumer."""
    return dict(version_schema()["properties"]["spec"])


def prune_nulls(value: Any, schema: dict[str, Any]) -> Any:
    """Drop null fields the schema does not declare nullable, as the API server does."""
    if isinstance(value, dict) and schema.get("type") == "object":
        props = schema.get("properties", {})
        out = {}
        for key, item in value.items():
            sub = props.get(key, schema.get("additionalProperties") or {})
            if item is None and not sub.get("nullable"):
                continue
            out[key] = prune_nulls(item, sub) if isinstance(sub, dict) else item
        return out
    if isinstance(value, list) and "items" in schema:
        return [prune_nulls(v, schema["items"]) for v in value]
    return value


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Fill in `default`s of missing fields, then default inside them (structural defaulting)."""
    value = copy.deepcopy(value)
    if isinstance(value, dict) and schema.get("type") == "object":
        for key, sub in schema.get("properties", {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(value[key], sub)
    elif isinstance(value, list) and "items" in schema:
        value = [apply_defaults(v, schema["items"]) for v in value]
    return value


def _cel_errors(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    errors: list[str] = []
    env = celpy.Environment()
    for rule in schema.get("x-kubernetes-validations", []):
        program = env.program(env.compile(rule["rule"]))
        result = program.evaluate({"self": celpy.json_to_cel(value)})
        if result is not True and not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            errors.append(f"{path or '.'}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                errors += _cel_errors(value[key], sub, f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += _cel_errors(item, schema["items"], f"{path}[{i}]")
    return errors


def unknown_fields(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the schema does not declare: kubectl's default `--validate=strict` rejects them."""
    errors: list[str] = []
    if isinstance(value, dict) and "properties" in schema:
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return errors
        for key, item in value.items():
            sub = schema["properties"].get(key)
            if sub is None and not path and key in ("apiVersion", "kind", "metadata"):
                continue  # every object has these, declared in its schema or not
            if sub is None:
                errors.append(f"{path}.{key}: unknown field")
            else:
                errors += unknown_fields(item, sub, f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return errors


def admit(value: Any, schema: dict[str, Any]) -> tuple[Any, list[str]]:
    """Prune, default and validate `value`; return the stored value and the list of errors."""
    value = apply_defaults(prune_nulls(value, schema), schema)
    validator = jsonschema.Draft4Validator(schema)
    errors = unknown_fields(value, schema)
    errors += [f".{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(value)]
    if not errors:  # the API server evaluates CEL only on schema-valid objects
        errors = _cel_errors(value, schema, "")
    return value, errors


def admit_streamconsumer(obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Admit a whole StreamConsumer object as the API server would."""
    stored, errors = admit(obj, version_schema())
    return dict(stored), errors
