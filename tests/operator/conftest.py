"""The operator tier: the real kopf operator against a real kube-apiserver (scripts/kube-control-plane.sh).

One control plane per session. The chart is installed once (`helm install`, cluster-wide RBAC), and
every operator under test authenticates with a token of the chart's ServiceAccount, never as admin:
the real authorizer decides what it may do. Tests act as `kubectl` with the admin's certificate;
pods run on the test node agent (node_agent.py), which acts as the scheduler and as its own node.
Each test module works in namespaces of its own, and its operator watches only those.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import kopf
import kubernetes
import pytest
import pytest_asyncio
import yaml

from keyrange.local.embedded_broker import EmbeddedBroker
from keyrange.operator.handlers import operator_memo, register_handlers
from keyrange.operator.kube import Kube
from keyrange.operator.registry import RangeControlFactory, default_range_control
from keyrange.operator.settings import OperatorSettings
from tests.operator.kubecluster import ROOT, ControlPlane, helm_binary
from tests.timeouts import tier_timeout

T = TypeVar("T")
SC_PATH = "/apis/keyrange.dev/v1alpha1/namespaces/{ns}/streamconsumers"
CHART = ROOT / "charts" / "keyrange"
RELEASE, RELEASE_NS = "keyrange", "keyrange-system"
OPERATOR_SA = "keyrange"
"""The chart's operator ServiceAccount for release `keyrange` (the full name)."""
TIMEOUT_SECONDS = 300
"""The operator tier's tests take up to ~20 s alone; a rollout of real workers waits minutes at worst."""

pytest_collection_modifyitems = tier_timeout(Path(__file__).parent, TIMEOUT_SECONDS)


class Api:
    """A small HTTP client for tests to act as kubectl (cluster admin) against the real server."""

    def __init__(self, session: aiohttp.ClientSession, plane: ControlPlane, bootstrap: str, topic: str,
                 namespace: str = "default") -> None:
        self.session = session
        self.plane = plane
        self.bootstrap = bootstrap
        """The real (embedded) Kafka the StreamConsumers of the test point at."""
        self.topic = topic
        """An input topic no other test uses."""
        self.namespace = namespace
        """Where `streamconsumer` puts new StreamConsumers."""

    def with_topic(self, topic: str) -> Api:
        """The same cluster, with `topic` as the input topic of new StreamConsumers."""
        return Api(self.session, self.plane, self.bootstrap, topic, self.namespace)

    def in_namespace(self, namespace: str) -> Api:
        """The same cluster, with new StreamConsumers in `namespace`."""
        return Api(self.session, self.plane, self.bootstrap, self.topic, namespace)

    def streamconsumer(self, name: str, namespace: str | None = None, **spec: Any) -> dict[str, Any]:
        """A StreamConsumer object on this test's broker and topic (valid unless `spec` says otherwise)."""
        body: dict[str, Any] = {"kafka": {"topic": self.topic, "bootstrapServers": self.bootstrap,
                                          "partitions": 8}, **spec}
        return {"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
                "metadata": {"name": name, "namespace": namespace or self.namespace}, "spec": body}

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str = "application/merge-patch+json") -> tuple[int, Any]:
        """One request; returns (status, parsed JSON body)."""
        headers = {"Content-Type": content_type} if body is not None else {}
        async with self.session.request(method, path, json=body, headers=headers) as response:
            text = await response.text()
            return response.status, (yaml.safe_load(text) if text else None)

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object at `path`, or None on 404."""
        status, body = await self.request("GET", path)
        assert status in (200, 404), body
        return body if status == 200 else None

    async def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """POST and return the stored object."""
        status, body = await self.request("POST", path, obj, "application/json")
        assert status in (200, 201), body
        return dict(body)

    async def patch(self, path: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch and return the stored object."""
        status, body = await self.request("PATCH", path, changes)
        assert status == 200, body
        return dict(body)

    async def delete(self, path: str) -> None:
        """DELETE (finalizers may delay the removal)."""
        status, body = await self.request("DELETE", path)
        assert status in (200, 202), body

    async def events(self, namespace: str, involved: str) -> list[dict[str, Any]]:
        """core/v1 Events about the object named `involved` in `namespace`."""
        found = await self.get(f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name={involved}")
        return list((found or {}).get("items") or [])


async def eventually(probe: Callable[[], Awaitable[T | None]], what: str, timeout: float = 60) -> T:
    """Poll `probe` until it returns something truthy; generous deadline for a busy 2-core machine."""
    deadline = asyncio.get_running_loop().time() + timeout
    last: Any = None
    while asyncio.get_running_loop().time() < deadline:
        with contextlib.suppress(AssertionError, KeyError, TypeError):
            last = await probe()
            if last:
                return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One real control plane (etcd, kube-apiserver, kube-controller-manager) for the whole session."""
    plane = ControlPlane.up(tmp_path_factory.mktemp("kube"))
    try:
        yield plane
    finally:
        plane.down()


def helm(plane: ControlPlane, home: Path, *args: str, check: bool = True) -> Any:
    """Run helm against `plane` as admin, with throwaway cache/config/data homes."""
    env = {**os.environ, "KUBECONFIG": str(plane.admin_kubeconfig),
           **{f"HELM_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}}
    result = subprocess.run([helm_binary(), *args], env=env, capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


@dataclass(frozen=True)
class Release:
    """The chart installed in the session's cluster, and a kubeconfig for its operator ServiceAccount."""

    plane: ControlPlane
    operator_kubeconfig: Path


@pytest.fixture(scope="session")
def release(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Release:
    """`helm install` of the chart with its defaults (cluster-wide RBAC, the CRD)."""
    home = tmp_path_factory.mktemp("helm")
    helm(control_plane, home, "install", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--create-namespace")
    control_plane.wait_established("streamconsumers.keyrange.dev")
    token = control_plane.token(RELEASE_NS, OPERATOR_SA, seconds=24 * 3600)
    return Release(control_plane, control_plane.token_kubeconfig(home / "operator.kubeconfig", token))


def create_namespace(plane: ControlPlane, name: str) -> None:
    """A namespace for one test module (idempotent)."""
    plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


@contextlib.asynccontextmanager
async def admin_api(plane: ControlPlane, bootstrap: str, topic: str) -> AsyncIterator[Api]:
    """An admin HTTP client for the test's own requests."""
    connector = aiohttp.TCPConnector(ssl=plane.admin_ssl())
    async with aiohttp.ClientSession(base_url=plane.server, connector=connector) as session:
        yield Api(session, plane, bootstrap, topic)


@contextlib.asynccontextmanager
async def as_operator(release: Release) -> AsyncIterator[None]:
    """$KUBECONFIG -> the operator ServiceAccount's token, for kopf's login and keyrange's Kube client."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", str(release.operator_kubeconfig))
        # The kubernetes client reads $KUBECONFIG at import time; kopf's login uses that default.
        mp.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(release.operator_kubeconfig))
        yield


def operator_kube(release: Release) -> Kube:
    """keyrange's Kube client with the operator ServiceAccount's token."""
    return Kube(kubernetes.config.new_client_from_config(config_file=str(release.operator_kubeconfig)))


@contextlib.asynccontextmanager
async def running_operator(release: Release, namespaces: list[str],
                           range_control_factory: RangeControlFactory = default_range_control,
                           settings: OperatorSettings | None = None) -> AsyncIterator[kopf.Memo]:
    """The real kopf operator with keyrange's handlers in this event loop, as the chart's
    ServiceAccount, watching `namespaces`, refreshing every 0.5 s."""
    settings = settings or OperatorSettings(image="keyrange:test", reconcile_interval_seconds=0.5)
    registry = register_handlers(kopf.OperatorRegistry(), settings, namespaces)
    async with as_operator(release):
        memo = operator_memo(settings, kube=operator_kube(release), range_control_factory=range_control_factory)
        stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(kopf.operator(registry=registry, memo=memo, clusterwide=False,
                                                 namespaces=namespaces, standalone=True, stop_flag=stop))
        try:
            yield memo
        finally:
            # kopf waits up to 5 s for every task in the loop (including the test's own) when it stops.
            stop.set_result(None)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=30)
            memo.controls.close_all()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_cluster(release: Release, broker: EmbeddedBroker) -> AsyncIterator[Api]:
    """An admin client for a whole module (tests use distinct StreamConsumer names)."""
    async with admin_api(release.plane, broker.bootstrap, "unused") as api:
        yield api
