"""The operator tier: the real kopf operator in this event loop against ClusterEmulator (kmock)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import kmock
import kopf
import kubernetes
import pytest
import pytest_asyncio
import yaml

from keyrange.local.broker import EmbeddedBroker
from keyrange.operator.handlers import operator_memo, register_handlers
from keyrange.operator.kube import Kube, new_api_client
from keyrange.operator.settings import OperatorSettings
from tests.operator.crd_schema import load_crd
from tests.operator.emulator import ClusterEmulator
from tests.operator.kubecluster import ControlPlane
from tests.timeouts import tier_timeout

T = TypeVar("T")
SC_PATH = "/apis/keyrange.dev/v1alpha1/namespaces/{ns}/streamconsumers"
TIMEOUT_SECONDS = 300
"""The operator tier's tests take up to ~20 s alone; a rollout of real workers waits minutes at worst."""

pytest_collection_modifyitems = tier_timeout(Path(__file__).parent, TIMEOUT_SECONDS)


class Api:
    """A small HTTP client for tests to act as kubectl against the emulator."""

    def __init__(self, session: aiohttp.ClientSession, emulator: ClusterEmulator, bootstrap: str,
                 topic: str) -> None:
        self.session = session
        self.emulator = emulator
        self.bootstrap = bootstrap
        """The real (embedded) Kafka the StreamConsumers of the test point at."""
        self.topic = topic
        """An input topic no other test uses."""

    def with_topic(self, topic: str) -> Api:
        """The same cluster, with `topic` as the input topic of new StreamConsumers."""
        return Api(self.session, self.emulator, self.bootstrap, topic)

    def streamconsumer(self, name: str, namespace: str = "shop", **spec: Any) -> dict[str, Any]:
        """A StreamConsumer object on this test's broker and topic (valid unless `spec` says otherwise)."""
        body: dict[str, Any] = {"kafka": {"topic": self.topic, "bootstrapServers": self.bootstrap,
                                          "partitions": 8}, **spec}
        return {"apiVersion": "keyrange.dev/v1alpha1", "kind": "StreamConsumer",
                "metadata": {"name": name, "namespace": namespace}, "spec": body}

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
        assert status == 200, body

    def count(self, method: str, path_part: str) -> int:
        """How many requests of `method` hit a path containing `path_part` so far."""
        return sum(1 for m, path in self.emulator.calls if m == method and path_part in path)


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


@contextlib.asynccontextmanager
async def emulated_cluster(workdir: Path, bootstrap: str, topic: str) -> AsyncIterator[Api]:
    """An empty emulated cluster with the StreamConsumer CRD installed and $KUBECONFIG pointing at it."""
    async with ClusterEmulator() as emulator, kmock.Server(emulator) as server:
        url = str(server.url).rstrip("/")
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": url}}],
            "users": [{"name": "tester", "user": {"token": "test-token"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}],
        }))
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("KUBECONFIG", str(kubeconfig))
            # The kubernetes client reads $KUBECONFIG at import time; kopf's login uses that default.
            mp.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
            async with aiohttp.ClientSession(base_url=url) as session:
                api = Api(session, emulator, bootstrap, topic)
                await api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", load_crd())
                yield api


@contextlib.asynccontextmanager
async def running_operator() -> AsyncIterator[kopf.Memo]:
    """The real kopf operator with keyrange's handlers in this event loop, refreshing every 0.5 s."""
    settings = OperatorSettings(image="keyrange:test", reconcile_interval_seconds=0.5)
    registry = register_handlers(kopf.OperatorRegistry(), settings)
    memo = operator_memo(settings, kube=Kube(new_api_client()))
    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(kopf.operator(registry=registry, memo=memo, clusterwide=True,
                                             standalone=True, stop_flag=stop))
    try:
        yield memo
    finally:
        # kopf waits up to 5 s for every task in the loop (including the test's own) when it stops.
        stop.set_result(None)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=30)
        memo.controls.close_all()


@pytest_asyncio.fixture
async def cluster(tmp_path: Path, bootstrap: str, topic_name: str) -> AsyncIterator[Api]:
    """A fresh emulated cluster for one test."""
    async with emulated_cluster(tmp_path, bootstrap, topic_name) as api:
        yield api


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_cluster(tmp_path_factory: pytest.TempPathFactory, broker: EmbeddedBroker) -> AsyncIterator[Api]:
    """One emulated cluster for a whole module (tests use distinct StreamConsumer names)."""
    async with emulated_cluster(tmp_path_factory.mktemp("cluster"), broker.bootstrap, "unused") as api:
        yield api


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_operator(shared_cluster: Api) -> AsyncIterator[kopf.Memo]:
    """One operator for a whole module: kopf's 5 s shutdown is paid once."""
    async with running_operator() as memo:
        yield memo


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One real control plane (etcd, kube-apiserver, kube-controller-manager) for the whole session."""
    plane = ControlPlane.up(tmp_path_factory.mktemp("kube"))
    try:
        yield plane
    finally:
        plane.down()
