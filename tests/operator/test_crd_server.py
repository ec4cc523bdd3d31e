"""The StreamConsumer CRD in a real kube-apiserver: structural schema, defaults, CEL rules, printer
columns, the scale and status subresources, and a server-side dry run of every example."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from keyrange.spec import parse_spec
from tests.operator.conftest import Release
from tests.operator.crd_examples import INVALID, VALID
from tests.operator.crd_schema import CRD_PATH, ROOT
from tests.operator.kubecluster import ControlPlane

NS = "crd-checks"
GROUP, VERSION, PLURAL = "keyrange.dev", "v1alpha1", "streamconsumers"


@pytest.fixture(scope="module")
def crds(release: Release) -> ControlPlane:
    """`kubectl apply -f crds/` (over the chart's copy: the session's cluster has the chart installed,
    and users without Helm apply the same file) and a namespace for this module's objects."""
    control_plane = release.plane
    control_plane.kubectl("apply", "-f", str(CRD_PATH.parent))
    control_plane.wait_established("streamconsumers.keyrange.dev")
    control_plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    return control_plane


@pytest.fixture(scope="module")
def objects(crds: ControlPlane) -> Iterator[kubernetes.client.CustomObjectsApi]:
    """The kubernetes client's custom-objects API, as admin."""
    client = kubernetes.config.new_client_from_config(config_file=str(crds.admin_kubeconfig))
    try:
        yield kubernetes.client.CustomObjectsApi(client)
    finally:
        client.close()


def _consumer(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "StreamConsumer", "metadata": {"name": name}, "spec": spec}


def _dry_run(objects: kubernetes.client.CustomObjectsApi, body: dict[str, Any]) -> dict[str, Any]:
    return dict(objects.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body, dry_run="All",
                                                        field_validation="Strict"))


@pytest.mark.parametrize("spec", VALID, ids=range(len(VALID)))
def test_the_server_accepts_valid_specs_with_the_defaults_spec_py_applies(
        objects: kubernetes.client.CustomObjectsApi, spec: dict[str, Any]) -> None:
    stored = _dry_run(objects, _consumer("valid", spec))
    assert stored["spec"] == parse_spec(spec).model_dump(by_alias=True, exclude_none=True)


@pytest.mark.parametrize("spec", INVALID, ids=range(len(INVALID)))
def test_the_server_rejects_what_spec_py_rejects(objects: kubernetes.client.CustomObjectsApi,
                                                 spec: dict[str, Any]) -> None:
    with pytest.raises(kubernetes.client.ApiException) as caught:
        _dry_run(objects, _consumer("invalid", spec))
    # 422 Invalid (schema or CEL), or 400 for a field the structural schema does not know
    # (the client asks for strict field validation, as kubectl does).
    assert caught.value.status in (400, 422), caught.value.body


@pytest.mark.parametrize(("spec", "message"), [
    ({"workers": {"min": 5, "max": 2}}, "workers.min must not exceed workers.max"),
    ({"scaling": {"lagHighRecords": 10, "lagLowRecords": 10}}, "scaling.lagLowRecords must be below"),
    ({"dedup": {"ttlSeconds": 0}}, "spec.dedup.ttlSeconds"),
    ({"dedup": {"ttlSeconds": -3}}, "spec.dedup.ttlSeconds"),
])
def test_cel_rules_and_bounds_are_enforced_with_422(objects: kubernetes.client.CustomObjectsApi,
                                                    spec: dict[str, Any], message: str) -> None:
    body = _consumer("bounds", {"kafka": {"topic": "t"}, **spec})
    with pytest.raises(kubernetes.client.ApiException) as caught:
        _dry_run(objects, body)
    assert caught.value.status == 422
    assert message in json.loads(caught.value.body)["message"]


def test_a_long_name_is_rejected_by_the_root_cel_rule(objects: kubernetes.client.CustomObjectsApi) -> None:
    with pytest.raises(kubernetes.client.ApiException) as caught:
        _dry_run(objects, _consumer("a" * 46, {"kafka": {"topic": "t"}}))
    assert caught.value.status == 422 and "at most 45 characters" in caught.value.body


def test_printer_columns_status_and_scale_subresources(crds: ControlPlane) -> None:
    kubectl = crds.kubectl
    crds.apply(_consumer("columns", {"kafka": {"topic": "t"}, "workers": {"min": 1, "max": 4}}), "-n", NS)
    # The status subresource: a write to the main resource does not touch status ...
    kubectl("patch", "strc", "columns", "-n", NS, "--type=merge", "-p", '{"status": {"phase": "Nope"}}')
    assert "status" not in json.loads(kubectl("get", "strc", "columns", "-n", NS, "-o", "json").stdout)
    # ... and one to /status does not touch spec.
    status = {"phase": "Running", "workers": 2, "rangeCount": 2, "rangeMap": "w0=0:0/2 w1=0:1/2",
              "lag": {"records": 42}, "selector": "keyrange.dev/streamconsumer=columns",
              "conditions": [{"type": "Scaling", "status": "False"}, {"type": "Ready", "status": "True"}]}
    kubectl("patch", "strc", "columns", "-n", NS, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status, "spec": {"concurrency": 1}}))
    stored = json.loads(kubectl("get", "strc", "columns", "-n", NS, "-o", "json").stdout)
    assert stored["status"]["phase"] == "Running" and stored["spec"]["concurrency"] == 64

    table = kubectl("get", "strc", "-n", NS).stdout.splitlines()
    assert table[0].split() == ["NAME", "READY", "WORKERS", "RANGES", "LAG", "PHASE", "AGE"]
    # The Ranges column: which part of which partition each worker owns (here halves of partition 0).
    assert table[1].split()[:7] == ["columns", "True", "2", "w0=0:0/2", "w1=0:1/2", "42", "Running"]

    kubectl("scale", "strc", "columns", "-n", NS, "--replicas=3")
    scale = json.loads(kubectl("get", "strc", "columns", "-n", NS, "--subresource=scale", "-o", "json").stdout)
    assert scale["spec"]["replicas"] == 3
    assert scale["status"] == {"replicas": 2, "selector": "keyrange.dev/streamconsumer=columns"}
    refused = kubectl("scale", "strc", "columns", "-n", NS, "--replicas=9", check=False)
    assert refused.returncode != 0 and "workers.replicas must be between" in refused.stderr


def test_every_example_passes_a_server_side_dry_run(crds: ControlPlane) -> None:
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples
    for example in examples:
        out = crds.kubectl("apply", "--dry-run=server", "-n", NS, "-f", str(example)).stdout
        assert "(server dry run)" in out, out
