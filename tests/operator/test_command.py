"""`keyrange operator` as a process: liveness, metrics, SIGTERM, and peering (one operator acts)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.operator.conftest import SC_PATH, Api, eventually
from tests.operator.crd_schema import ROOT

NS = "shop"
PEERING = "keyrange-test"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OperatorProcess:
    """One `keyrange operator` subprocess and its two HTTP endpoints."""

    def __init__(self, proc: asyncio.subprocess.Process, health: str, metrics: str, log: Path) -> None:
        self.proc, self.health, self.metrics, self.log = proc, health, metrics, log

    async def fetch(self, url: str) -> tuple[int, str]:
        """GET a URL; (0, "") while nothing listens yet."""
        try:
            async with aiohttp.ClientSession() as session, session.get(url) as response:
                return response.status, await response.text()
        except aiohttp.ClientError:
            return 0, ""

    async def reconciled_ok(self) -> bool:
        """Whether this operator has reconciled a StreamConsumer successfully."""
        _, text = await self.fetch(self.metrics)
        return 'keyrange_operator_reconciles_total{handler="reconcile",result="ok"}' in text


@asynccontextmanager
async def operator_process(tmp_path: Path, tag: str, *args: str) -> AsyncIterator[OperatorProcess]:
    """Run `keyrange operator` against the emulator named by $KUBECONFIG; SIGTERM it at the end."""
    health, metrics = _port(), _port()
    log = tmp_path / f"operator-{tag}.log"
    keyrange = str(Path(sys.executable).with_name("keyrange"))
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            keyrange, "operator", f"--liveness=http://127.0.0.1:{health}/healthz", f"--metrics-port={metrics}",
            "--refresh-seconds=0.5", "--image=keyrange:test", *args, stdout=out, stderr=out, env=dict(os.environ))
    op = OperatorProcess(proc, f"http://127.0.0.1:{health}/healthz", f"http://127.0.0.1:{metrics}/metrics", log)
    try:
        yield op
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout=30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _ok(op: OperatorProcess) -> Callable[[], Any]:
    async def probe() -> bool:
        status, _ = await op.fetch(op.health)
        return status == 200
    return probe


async def _install_peering(cluster: Api) -> None:
    for crd in yaml.safe_load_all((ROOT / "charts" / "keyrange" / "crds" / "kopfpeerings.yaml").read_text()):
        await cluster.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    await cluster.create("/apis/kopf.dev/v1/clusterkopfpeerings",
                         {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": PEERING}})


async def test_the_command_serves_liveness_and_metrics_and_stops_on_sigterm(cluster: Api, tmp_path: Path) -> None:
    async with operator_process(tmp_path, "solo", "--standalone") as op:
        await eventually(_ok(op), "the liveness endpoint")
        await cluster.create(SC_PATH.format(ns=NS), cluster.streamconsumer("cli"))
        await eventually(lambda: cluster.get(f"/apis/apps/v1/namespaces/{NS}/statefulsets/cli-worker"),
                         "the StatefulSet")
        await eventually(op.reconciled_ok, "keyrange_operator_reconciles_total in /metrics")
        op.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(op.proc.wait(), timeout=30) == 0, op.log.read_text()


@pytest.mark.slow
async def test_peering_lets_only_the_highest_priority_operator_act_until_it_leaves(
        cluster: Api, tmp_path: Path) -> None:
    await _install_peering(cluster)
    async with operator_process(tmp_path, "low", f"--peering={PEERING}", "--priority=10") as low, \
            operator_process(tmp_path, "high", f"--peering={PEERING}", "--priority=20") as high:
        await eventually(_ok(low), "the low-priority operator's liveness")
        await eventually(_ok(high), "the high-priority operator's liveness")

        async def both_peered() -> bool:
            peering = await cluster.get(f"/apis/kopf.dev/v1/clusterkopfpeerings/{PEERING}")
            return len((peering or {}).get("status") or {}) == 2

        await eventually(both_peered, "both operators in the peering object")
        await cluster.create(SC_PATH.format(ns=NS), cluster.streamconsumer("peered"))
        await eventually(high.reconciled_ok, "the high-priority operator to reconcile")
        await asyncio.sleep(3)  # the paused one would act within its 0.5 s refresh if it were not paused
        assert not await low.reconciled_ok(), low.log.read_text()[-2000:]

        high.proc.send_signal(signal.SIGTERM)  # failover: leaving removes it from the peering object
        assert await asyncio.wait_for(high.proc.wait(), timeout=30) == 0
        await eventually(low.reconciled_ok, "the remaining operator to take over")


async def test_without_peering_objects_the_command_says_what_to_install(cluster: Api, tmp_path: Path) -> None:
    async with operator_process(tmp_path, "nopeering", f"--peering={PEERING}") as op:
        code = await asyncio.wait_for(op.proc.wait(), timeout=60)
        output = op.log.read_text()
        assert code == 2, output
        assert f"ClusterKopfPeering {PEERING} not found" in output and "--standalone" in output
        assert "Traceback" not in output
