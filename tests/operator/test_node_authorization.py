"""Node authorization and the NodeRestriction admission plugin are in force on the test control plane,
as a kubelet meets them: with a client certificate for `system:node:<name>` (group `system:nodes`)
from the certificates API, a node may register and update its own Node, read the Secrets and
ConfigMaps of pods bound to it and update their status, and nothing of another node's. Every denial
is the API's 403, and the same request as admin succeeds, so each denial is the identity's and not
a broken request."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.operator.conftest import Api, admin_api, eventually
from tests.operator.kubecluster import ControlPlane

pytestmark = pytest.mark.asyncio(loop_scope="module")

NS = "node-authz"
NODE, OTHER = "authz-node-a", "authz-node-b"


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def _pod(name: str, node: str, secret: str, config_map: str | None = None) -> dict[str, Any]:
    """A pod bound to `node` at creation whose env reads `secret` (and `config_map`)."""
    env: list[dict[str, Any]] = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}}]
    if config_map:
        env.append({"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": config_map, "key": "mode"}}})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": [{"name": "c", "image": "example.invalid/c:1", "env": env}]}}


def _forbidden(status: int, body: Any, *words: str) -> None:
    """The API's own 403 (a Status object with reason Forbidden), naming what it refused."""
    assert status == 403, (status, body)
    assert body["kind"] == "Status" and body["reason"] == "Forbidden", body
    for word in words:
        assert word in body["message"], body["message"]


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> ControlPlane:
    """The namespace of this module, its default ServiceAccount created (pods are admitted)."""
    control_plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    control_plane.kubectl("wait", "--for=create", "serviceaccount/default", "-n", NS, "--timeout=60s")
    return control_plane


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def admin(plane: ControlPlane) -> AsyncIterator[Api]:
    async with admin_api(plane, "unused", "unused") as api:
        yield api
    plane.kubectl("delete", "pods", "--all", "-n", NS, "--grace-period=0", "--force", check=False)
    plane.kubectl("delete", "namespace", NS, "--wait=false", check=False)
    plane.kubectl("delete", "node", NODE, OTHER, "--ignore-not-found", check=False)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Api]:
    """An HTTP client with node `authz-node-a`'s kubelet credentials."""
    credentials = plane.node_credentials(NODE, tmp_path_factory.mktemp("node-credentials"))
    who = json.loads(plane.kubectl("auth", "whoami", "-o", "json", kubeconfig=credentials.kubeconfig).stdout)
    assert who["status"]["userInfo"]["username"] == f"system:node:{NODE}"
    assert "system:nodes" in who["status"]["userInfo"]["groups"]
    connector = aiohttp.TCPConnector(ssl=credentials.ssl_context(plane.ca))
    async with aiohttp.ClientSession(base_url=plane.server, connector=connector) as session:
        yield Api(session, plane, "unused", "unused", NS)


async def test_a_node_registers_and_updates_only_its_own_node(node: Api, admin: Api) -> None:
    status, body = await node.request("POST", "/api/v1/nodes", _node(NODE), "application/json")
    assert status == 201, body
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}
    status, body = await node.request("PATCH", f"/api/v1/nodes/{NODE}/status", ready)
    assert status == 200 and body["status"]["conditions"][0]["reason"] == "KubeletReady", body

    status, body = await node.request("POST", "/api/v1/nodes", _node(OTHER), "application/json")
    _forbidden(status, body, f"node \"{NODE}\" is not allowed to modify node \"{OTHER}\"")
    await admin.create("/api/v1/nodes", _node(OTHER))  # the same request as admin
    label = {"metadata": {"labels": {"keyrange.dev/test": "changed"}}}
    status, body = await node.request("PATCH", f"/api/v1/nodes/{OTHER}", label)
    _forbidden(status, body, f"node \"{NODE}\" is not allowed to modify node \"{OTHER}\"")
    status, body = await node.request("PATCH", f"/api/v1/nodes/{OTHER}/status", ready)
    _forbidden(status, body, f"node \"{NODE}\" is not allowed to modify node \"{OTHER}\"")
    assert (await admin.patch(f"/api/v1/nodes/{OTHER}", label))["metadata"]["labels"]["keyrange.dev/test"] == "changed"
    assert (await admin.patch(f"/api/v1/nodes/{OTHER}/status", ready))["status"]["conditions"]


async def test_a_node_reads_and_updates_only_what_its_own_pods_reference(
        node: Api, admin: Api, plane: ControlPlane) -> None:
    for name in ("mine", "theirs"):
        plane.kubectl("create", "secret", "generic", f"{name}-secret", "-n", NS, f"--from-literal=token={name}")
    plane.kubectl("create", "configmap", "mine-config", "-n", NS, "--from-literal=mode=strict")
    # The other node's pod first: once the Node authorizer's graph has the later pod's edges, it
    # has this one's too, so the denial below is the authorizer's judgement, not a graph that lags.
    await admin.create(f"/api/v1/namespaces/{NS}/pods", _pod("theirs", OTHER, "theirs-secret"))
    await admin.create(f"/api/v1/namespaces/{NS}/pods", _pod("mine", NODE, "mine-secret", "mine-config"))

    async def readable(path: str) -> dict[str, Any] | None:
        status, body = await node.request("GET", path)
        assert status in (200, 403), body  # 403 until the graph has the pod (a kubelet retries too)
        return dict(body) if status == 200 else None

    secret = await eventually(lambda: readable(f"/api/v1/namespaces/{NS}/secrets/mine-secret"),
                              "the node to read its pod's Secret")
    assert secret["data"]["token"] == "bWluZQ=="  # "mine"
    config = await eventually(lambda: readable(f"/api/v1/namespaces/{NS}/configmaps/mine-config"),
                              "the node to read its pod's ConfigMap")
    assert config["data"] == {"mode": "strict"}
    running = {"status": {"phase": "Running", "message": "reported by its node"}}
    status, body = await node.request("PATCH", f"/api/v1/namespaces/{NS}/pods/mine/status", running)
    assert status == 200 and body["status"]["phase"] == "Running", body

    status, body = await node.request("GET", f"/api/v1/namespaces/{NS}/secrets/theirs-secret")
    _forbidden(status, body, f"no relationship found between node '{NODE}' and this object")
    status, body = await node.request("PATCH", f"/api/v1/namespaces/{NS}/pods/theirs/status", running)
    _forbidden(status, body, f"node \"{NODE}\" can only update pod status for pods with spec.nodeName set to itself")
    status, body = await node.request("GET", f"/api/v1/namespaces/{NS}/secrets")
    _forbidden(status, body, f"User \"system:node:{NODE}\" cannot list resource \"secrets\"")

    # The same requests as admin succeed.
    assert (await admin.get(f"/api/v1/namespaces/{NS}/secrets/theirs-secret") or {})["data"]["token"] == "dGhlaXJz"
    patched = await admin.patch(f"/api/v1/namespaces/{NS}/pods/theirs/status", running)
    assert patched["status"]["phase"] == "Running"
    listed = await admin.get(f"/api/v1/namespaces/{NS}/secrets")
    assert {"mine-secret", "theirs-secret"} <= {s["metadata"]["name"] for s in (listed or {})["items"]}
