"""Least privilege, judged by the real authorizer: docs/kubernetes.md's `kubectl auth can-i --list`
tables, the finalizers permission that blockOwnerDeletion needs, and an installation without Spark
rights that still reconciles (it used to retry 403s forever)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from keyrange.operator import spark
from keyrange.operator.settings import OperatorSettings
from tests.operator.conftest import (
    CHART,
    RELEASE,
    RELEASE_NS,
    SC_PATH,
    Api,
    Release,
    create_namespace,
    eventually,
    helm,
    running_operator,
)
from tests.operator.kubecluster import ROOT, ControlPlane

ASYNC = pytest.mark.asyncio(loop_scope="module")

DOCS = ROOT / "docs" / "kubernetes.md"
SHOP = "rbac-shop"
NOSPARK_NS = "rbac-nospark"
Row = tuple[str, str, frozenset[str]]


def _rows(text: str) -> set[Row]:
    """(resource, resource names, verbs) of `kubectl auth can-i --list` output (resources only)."""
    rows = set()
    for line in text.splitlines()[1:]:
        cells = re.findall(r"\[[^\]]*\]|\S+", line)
        if len(cells) == 4 and not line.startswith(" "):
            names = cells[2].strip("[]")
            rows.add((cells[0], names, frozenset(cells[3].strip("[]").split())))
    return rows


def _documented(key: str) -> set[Row]:
    """The table after `<!-- can-i: KEY -->` in docs/kubernetes.md."""
    text = DOCS.read_text()
    start = text.index(f"<!-- can-i: {key} -->")
    rows = set()
    for line in text[start:].splitlines()[3:]:
        if not line.startswith("|"):
            break
        resource, names, verbs = (c.strip() for c in line.strip("|").split("|"))
        rows.add((resource, names, frozenset(verbs.split())))
    return rows


def _can_i(plane: ControlPlane, namespace: str, account: str) -> set[Row]:
    out = plane.kubectl("auth", "can-i", "--list", "-n", namespace, f"--as=system:serviceaccount:{account}").stdout
    return _rows(out)


@pytest.fixture(scope="module")
def nospark(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Release:
    """A second release with `rbac.sparkAggregation: false`, watching NOSPARK_NS only."""
    plane = release.plane
    create_namespace(plane, NOSPARK_NS)
    home = tmp_path_factory.mktemp("helm-nospark")
    helm(plane, home, "install", "nospark", str(CHART), "-n", "nospark-system", "--create-namespace",
         "--set", "crds.install=false", "--set", "rbac.sparkAggregation=false",
         "--set", f"operator.watchNamespaces={{{NOSPARK_NS}}}")
    token = plane.token("nospark-system", "nospark-keyrange")
    return Release(plane, plane.token_kubeconfig(home / "nospark.kubeconfig", token))


def test_docs_tables_are_what_the_authorizer_grants(release: Release, nospark: Release) -> None:
    plane = release.plane
    create_namespace(plane, SHOP)
    baseline = _can_i(plane, SHOP, f"{SHOP}:nobody")  # what every ServiceAccount may do
    operator = _can_i(plane, SHOP, f"{RELEASE_NS}:{RELEASE}") - baseline
    assert operator == _documented("operator")
    own = _can_i(plane, RELEASE_NS, f"{RELEASE_NS}:{RELEASE}") - baseline
    assert own - operator == _documented("operator-own-namespace-extra")
    without_spark = _can_i(plane, NOSPARK_NS, "nospark-system:nospark-keyrange") - baseline
    assert without_spark == {r for r in _documented("operator-without-spark")}
    assert _can_i(plane, SHOP, f"{SHOP}:payments-worker") - baseline == _documented("workers") == set()

    # The driver's ServiceAccount and RoleBinding as the operator renders them, applied in SHOP
    # (without the owner reference: there is no StreamConsumer behind them here).
    settings = spark.SparkJobSettings(image="i", driver_cluster_role=f"{RELEASE}-spark-driver")
    for obj in spark.render_rbac("payments", SHOP, {"metadata": {"name": "payments", "uid": "u"}}, settings):
        meta = {k: v for k, v in obj["metadata"].items() if k != "ownerReferences"}
        plane.apply({**obj, "metadata": meta})
    driver = _can_i(plane, SHOP, f"{SHOP}:payments-aggregation") - baseline
    assert driver == _documented("spark-driver")
    assert _can_i(plane, "default", f"{SHOP}:payments-aggregation") - baseline == set()


def test_block_owner_deletion_needs_update_on_the_owners_finalizers(release: Release, tmp_path: Path) -> None:
    """OwnerReferencesPermissionEnforcement (on in the test cluster, as on OpenShift) refuses an
    ownerReference with blockOwnerDeletion from a user who may not update the owner's finalizers."""
    plane = release.plane
    create_namespace(plane, SHOP)
    plane.apply({"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
                 "metadata": {"name": "owner", "namespace": SHOP}, "spec": {"kafka": {"topic": "t"}}})
    uid = json.loads(plane.kubectl("get", "strc", "owner", "-n", SHOP, "-o", "json").stdout)["metadata"]["uid"]
    plane.kubectl("create", "role", "configmaps-only", "-n", SHOP, "--verb=create,get",
                  "--resource=configmaps,streamconsumers.keyrange.dev")
    plane.kubectl("create", "rolebinding", "configmaps-only", "-n", SHOP, "--role=configmaps-only",
                  f"--serviceaccount={SHOP}:without-finalizers")

    def child(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": SHOP,
                "ownerReferences": [{"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
                                     "name": "owner", "uid": uid, "controller": True,
                                     "blockOwnerDeletion": True}]}}

    # The plugin maps the owner's kind with a discovery cache the API server renews every 30 s: until
    # then it refuses every such reference ("cannot find RESTMapping"), allowed or not.
    deadline = time.monotonic() + 90
    while True:
        allowed = plane.kubectl("create", "-f", "-", f"--as=system:serviceaccount:{RELEASE_NS}:{RELEASE}",
                                stdin=json.dumps(child("allowed")), check=False)
        if allowed.returncode == 0 or "cannot find RESTMapping" not in allowed.stderr or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert allowed.returncode == 0, allowed.stderr
    refused = plane.kubectl("create", "-f", "-", f"--as=system:serviceaccount:{SHOP}:without-finalizers",
                            stdin=json.dumps(child("refused")), check=False)
    assert refused.returncode != 0 and ("cannot set blockOwnerDeletion if an ownerReference refers to a resource "
                                        "you can't set finalizers on") in refused.stderr, refused.stderr


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def nospark_cluster(nospark: Release, shared_cluster: Api) -> AsyncIterator[Api]:
    """The admin client, in NOSPARK_NS."""
    yield shared_cluster.in_namespace(NOSPARK_NS)


async def _phase(api: Api, name: str, phase: str) -> dict[str, Any] | None:
    found = await api.get(f"{SC_PATH.format(ns=NOSPARK_NS)}/{name}")
    return found if ((found or {}).get("status") or {}).get("phase") == phase else None


async def _operator(nospark: Release, spark_aggregation: bool) -> Any:
    settings = OperatorSettings(image="keyrange:test", reconcile_interval_seconds=0.5,
                                spark_aggregation=spark_aggregation)
    return running_operator(nospark, [NOSPARK_NS], settings=settings)


@ASYNC
async def test_without_spark_rights_consumers_run_and_aggregation_is_reported(
        nospark: Release, nospark_cluster: Api, topic_name: str) -> None:
    cluster = nospark_cluster.with_topic(topic_name)
    path = SC_PATH.format(ns=NOSPARK_NS)
    async with await _operator(nospark, spark_aggregation=False) as memo:
        assert isinstance(memo, kopf.Memo)
        await cluster.create(path, cluster.streamconsumer("plain"))
        await eventually(lambda: cluster.get(f"/apis/apps/v1/namespaces/{NOSPARK_NS}/statefulsets/plain-worker"),
                         "the StatefulSet")
        await cluster.create(path, cluster.streamconsumer("sums", aggregation={"enabled": True, "output": "s3a://b/o"}))
        degraded = await eventually(lambda: _phase(cluster, "sums", "Degraded"), "sums Degraded")
        message = {c["type"]: c for c in degraded["status"]["conditions"]}["Degraded"]["message"]
        assert "rbac.sparkAggregation: false" in message
        await cluster.delete(f"{path}/sums")
        await cluster.delete(f"{path}/plain")
        await eventually(lambda: _gone(cluster, f"{path}/plain"), "plain deleted")


@ASYNC
async def test_an_operator_refused_by_rbac_says_so_in_status_and_does_not_spin(
        nospark: Release, nospark_cluster: Api, topic_name: str) -> None:
    """The same installation, but an operator not told that Spark is off (the defect: every
    reconcile read Spark kinds, got 403, and kopf retried at once, forever)."""
    cluster = nospark_cluster.with_topic(topic_name)
    path = SC_PATH.format(ns=NOSPARK_NS)
    labels = {"handler": "reconcile", "result": "error"}
    async with await _operator(nospark, spark_aggregation=True):
        await cluster.create(path, cluster.streamconsumer("refused"))
        degraded = await eventually(lambda: _phase(cluster, "refused", "Degraded"), "refused Degraded")
        condition = {c["type"]: c for c in degraded["status"]["conditions"]}["Degraded"]
        assert condition["reason"] == "Forbidden" and "check the chart's rbac values" in condition["message"]
        errors = REGISTRY.get_sample_value("keyrange_operator_reconciles_total", labels) or 0.0
        await asyncio.sleep(3)  # a retry loop would fail again within this window; the retry waits 300 s
        assert (REGISTRY.get_sample_value("keyrange_operator_reconciles_total", labels) or 0.0) == errors
        await cluster.delete(f"{path}/refused")
        await eventually(lambda: _gone(cluster, f"{path}/refused"), "refused deleted")


async def _gone(cluster: Api, path: str) -> bool:
    return await cluster.get(path) is None

