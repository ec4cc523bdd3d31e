"""`helm install`, `upgrade` and `uninstall` of the chart against a real API server of its own
(the session's cluster keeps its release): several values files are accepted object by object, an
upgrade changes the CRD, and an uninstall leaves nothing of keyrange behind."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.operator.conftest import CHART, helm
from tests.operator.kubecluster import ControlPlane

VALUES = Path(__file__).parent / "chart_values"
NAMESPACED = ["get", "-A", "-l", "app.kubernetes.io/part-of=keyrange", "-o", "name",
              "deployments,services,serviceaccounts,secrets,configmaps,roles,rolebindings,leases"]
CLUSTER_WIDE = ["get", "-l", "app.kubernetes.io/part-of=keyrange", "-o", "name",
                "clusterroles,clusterrolebindings,customresourcedefinitions"]
# Both tests on one xdist worker (tests/parallel.py), which starts the module's control plane once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("helm-release")]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of this module's own: it installs and removes the CRD."""
    started = ControlPlane.up(tmp_path_factory.mktemp("helm-kube"))
    try:
        yield started
    finally:
        started.down()


def _manifest_objects(plane: ControlPlane, home: Path, release: str, namespace: str) -> list[str]:
    """`kind/name` of every object the release rendered, as the server has them (fails if one is missing)."""
    manifest = helm(plane, home, "get", "manifest", release, "-n", namespace).stdout
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    found = plane.kubectl("get", "-f", "-", "-o", "name", stdin=yaml.safe_dump_all(docs)).stdout.split()
    assert len(found) == len(docs), found
    return found


def _crd_fields(plane: ControlPlane) -> set[str]:
    crd = json.loads(plane.kubectl("get", "crd", "streamconsumers.keyrange.dev", "-o", "json").stdout)
    return set(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])


def test_install_upgrade_uninstall_leaves_nothing_behind(plane: ControlPlane, tmp_path: Path) -> None:
    home = tmp_path / "helm"
    plane.kubectl("create", "namespace", "team-a")
    plane.kubectl("create", "namespace", "team-b")
    # Only one release owns the CRD; the others run with crds.install=false (the chart README says so).
    # Nothing kept: neither the CRD nor the webhook token (both are kept by default).
    keep_nothing = ["--set", "webhook.keepSecret=false"]
    releases = [("owner", "keyrange-system", None, ["--set", "crds.keep=false", *keep_nothing]),
                ("nospark", "nospark-system", VALUES / "no-spark.yaml", ["--set", "crds.install=false", *keep_nothing]),
                ("teams", "teams-system", VALUES / "namespaced.yaml", ["--set", "crds.install=false", *keep_nothing])]
    for name, namespace, values, extra in releases:
        args = ["install", name, str(CHART), "-n", namespace, "--create-namespace", *extra]
        helm(plane, home, *args, *(["--values", str(values)] if values else []))
        objects = _manifest_objects(plane, home, name, namespace)
        assert any(o.startswith("deployment.apps/") for o in objects)
    teams = json.loads(plane.kubectl("get", "deployment", "teams-keyrange", "-n", "teams-system", "-o", "json").stdout)
    assert teams["spec"]["replicas"] == 2
    assert {"role.rbac.authorization.k8s.io/teams-keyrange"} <= set(
        plane.kubectl("get", "roles", "-n", "team-a", "-o", "name").stdout.split())

    # A new chart version whose CRD declares one more field: `helm upgrade` applies it.
    newer = tmp_path / "keyrange"
    shutil.copytree(CHART, newer)
    crd_file = newer / "files" / "streamconsumers.keyrange.dev.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["upgradeMarker"] = {"type": "string", "description": "added by the upgrade test"}
    crd_file.write_text(yaml.safe_dump(crd))
    assert "upgradeMarker" not in _crd_fields(plane)
    helm(plane, home, "upgrade", "owner", str(newer), "-n", "keyrange-system", "--set", "crds.keep=false",
         *keep_nothing)
    assert "upgradeMarker" in _crd_fields(plane)

    for name, namespace, _, _ in releases:
        helm(plane, home, "uninstall", name, "-n", namespace, "--wait", "--timeout", "120s")
    assert plane.kubectl(*NAMESPACED).stdout.split() == []
    assert plane.kubectl(*CLUSTER_WIDE).stdout.split() == []
    assert plane.kubectl("get", "crd", "-o", "name").stdout.split() == []


def test_by_default_uninstall_keeps_the_crd_the_consumers_and_the_webhook_token(plane: ControlPlane,
                                                                                tmp_path: Path) -> None:
    home = tmp_path / "helm"
    helm(plane, home, "install", "kept", str(CHART), "-n", "kept-system", "--create-namespace")
    plane.apply({"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
                 "metadata": {"name": "mine", "namespace": "default"}, "spec": {"kafka": {"topic": "t"}}})
    helm(plane, home, "uninstall", "kept", "-n", "kept-system", "--wait", "--timeout", "120s")
    assert plane.kubectl(*NAMESPACED).stdout.split() == ["secret/kept-keyrange-webhook"]
    assert plane.kubectl(*CLUSTER_WIDE).stdout.split() == ["customresourcedefinition.apiextensions.k8s.io/"
                                                           "streamconsumers.keyrange.dev"]
    assert plane.kubectl("get", "strc", "mine", "-n", "default", "-o", "name").stdout.strip()
