"""`keyrange operator` as processes against the real API server, as the chart's ServiceAccount:
health and metrics, SIGTERM, and leader election by the chart's Lease (only the holder acts; a
killed leader is replaced; a leader cut off from the API server stops its controllers before a
standby starts its own)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from tests.operator.conftest import RELEASE, RELEASE_NS, SC_PATH, Api, Release, create_namespace, eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

NS = "operator-command"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NS}/leases/{RELEASE}"
FAST_LEASE = ("--lease-seconds=4", "--lease-renew-deadline-seconds=3", "--lease-retry-seconds=0.5")
WEBHOOK_TOKEN = "command-test"


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

    async def role(self) -> str:
        """"leader", "standby" or "" (not answering)."""
        status, text = await self.fetch(self.health)
        found = re.search(r'"role": "(\w+)"', text)
        return found.group(1) if status == 200 and found else ""

    async def reconciled_ok(self) -> bool:
        """Whether this operator has reconciled a StreamConsumer successfully."""
        _, text = await self.fetch(self.metrics)
        return 'keyrange_operator_reconciles_total{handler="reconcile",result="ok"}' in text

    def logged_at(self, pattern: str) -> datetime | None:
        """When the first log line matching `pattern` was written."""
        for line in self.log.read_text(errors="replace").splitlines():
            if re.search(pattern, line):
                return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        return None


@asynccontextmanager
async def operator_process(tmp_path: Path, tag: str, kubeconfig: Path, *args: str) -> AsyncIterator[OperatorProcess]:
    """Run `keyrange operator` for namespace NS with `kubeconfig`; SIGTERM it at the end."""
    health = _port()
    log = tmp_path / f"operator-{tag}.log"
    keyrange = str(Path(sys.executable).with_name("keyrange"))
    # The metrics socket is bound here and inherited: a port chosen free and bound by the operator
    # once started was taken in between in one run.
    with socket.create_server(("127.0.0.1", 0)) as metrics, log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            keyrange, "operator", f"--namespace={NS}", f"--liveness=http://127.0.0.1:{health}/healthz",
            f"--metrics-fd={metrics.fileno()}", "--refresh-seconds=0.5", "--image=keyrange:test",
            f"--lease={RELEASE}", f"--lease-namespace={RELEASE_NS}", f"--identity={tag}", *args,
            stdout=out, stderr=out, pass_fds=(metrics.fileno(),),
            env={**os.environ, "KUBECONFIG": str(kubeconfig), "KEYRANGE_WEBHOOK_TOKEN": WEBHOOK_TOKEN})
        metrics_port = metrics.getsockname()[1]
    op = OperatorProcess(proc, f"http://127.0.0.1:{health}/healthz", f"http://127.0.0.1:{metrics_port}/metrics", log)
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


class Partition:
    """A TCP relay to the API server that the test can cut, as a network partition would."""

    def __init__(self, target: str) -> None:
        self.host, port = target.removeprefix("https://").split(":")
        self.target_port = int(port)
        self.port = _port()
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        self._writers += [writer, up_writer]
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def __aenter__(self) -> Partition:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def cut(self) -> None:
        """Refuse new connections and drop the open ones."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()

    async def __aexit__(self, *exc: object) -> None:
        await self.cut()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(release: Release, shared_cluster: Api) -> Api:
    """The module's namespace; no Lease left over from an earlier test."""
    create_namespace(release.plane, NS)
    return shared_cluster.in_namespace(NS)


@pytest.fixture(autouse=True)
def no_holder(release: Release) -> None:
    """Each test starts with the chart's Lease free (a killed leader's would hold for its duration)."""
    free = {"spec": dict.fromkeys(("holderIdentity", "leaseDurationSeconds", "renewTime", "acquireTime"))}
    release.plane.kubectl("patch", "lease", RELEASE, "-n", RELEASE_NS, "--type=merge", "-p", json.dumps(free))


async def _holder(cluster: Api) -> str:
    lease = await cluster.get(LEASE)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


async def test_the_command_serves_health_and_metrics_and_releases_the_lease_on_sigterm(
        cluster: Api, release: Release, tmp_path: Path, topic_name: str) -> None:
    async with operator_process(tmp_path, "solo", release.operator_kubeconfig) as op:
        await eventually(lambda: _is(op, "leader"), "the operator to lead")
        await cluster.create(SC_PATH.format(ns=NS), cluster.with_topic(topic_name).streamconsumer("cli"))
        await eventually(lambda: cluster.get(f"/apis/apps/v1/namespaces/{NS}/statefulsets/cli-worker"),
                         "the StatefulSet")
        await eventually(op.reconciled_ok, "keyrange_operator_reconciles_total in /metrics")
        assert (await _holder(cluster)).startswith("solo_")
        op.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(op.proc.wait(), timeout=30) == 0, op.log.read_text()
        assert await _holder(cluster) == ""  # released: a standby need not wait out the lease


async def _webhook_status(port: int) -> int:
    """The status of an (empty) Alertmanager notification posted to a replica's webhook port."""
    body = {"version": "4", "status": "firing", "receiver": "keyrange", "alerts": []}
    try:
        async with aiohttp.ClientSession() as session, session.post(
                f"http://127.0.0.1:{port}/alertmanager/webhook", json=body,
                headers={"Authorization": f"Bearer {WEBHOOK_TOKEN}"}) as response:
            return response.status
    except aiohttp.ClientError:
        return 0


async def _webhook_answers(port: int, status: int) -> bool:
    return await _webhook_status(port) == status


async def _is(op: OperatorProcess, role: str) -> bool:
    return await op.role() == role


@pytest.mark.slow
async def test_only_the_lease_holder_acts_and_a_standby_takes_over_when_it_is_killed(
        cluster: Api, release: Release, tmp_path: Path, topic_name: str) -> None:
    kubeconfig = release.operator_kubeconfig
    webhooks = {"first": _port(), "second": _port()}
    async with operator_process(tmp_path, "first", kubeconfig, *FAST_LEASE,
                                f"--webhook-port={webhooks['first']}") as first:
        await eventually(lambda: _is(first, "leader"), "the first replica to lead")
        async with operator_process(tmp_path, "second", kubeconfig, *FAST_LEASE,
                                    f"--webhook-port={webhooks['second']}") as second:
            await eventually(lambda: _is(second, "standby"), "the second replica to stand by")
            # Only the leader handles alerts; a standby says so with a 503, which Alertmanager retries.
            assert await _webhook_status(webhooks["second"]) == 503
            assert await _webhook_status(webhooks["first"]) == 200
            await cluster.create(SC_PATH.format(ns=NS), cluster.with_topic(topic_name).streamconsumer("elected"))
            await eventually(first.reconciled_ok, "the leader to reconcile")
            await asyncio.sleep(3)  # the standby would act within its 0.5 s refresh if it ran controllers
            assert not await second.reconciled_ok(), second.log.read_text()[-2000:]
            assert await second.role() == "standby"

            first.proc.kill()  # no chance to release: the standby must wait out the lease
            await first.proc.wait()
            await eventually(lambda: _is(second, "leader"), "the standby to take the Lease", timeout=30)
            await eventually(second.reconciled_ok, "the new leader to reconcile")
            await eventually(lambda: _webhook_answers(webhooks["second"], 200), "the new leader's webhook")
            assert (await _holder(cluster)).startswith("second_")


@pytest.mark.slow
async def test_a_leader_cut_off_from_the_api_server_stops_before_a_standby_starts(
        cluster: Api, release: Release, tmp_path: Path, topic_name: str) -> None:
    token = release.plane.token(RELEASE_NS, "keyrange")
    async with Partition(release.plane.server) as partition:
        # The leader reaches the API server only through the relay (same token, same CA: the
        # serving certificate is valid for 127.0.0.1 on any port).
        cut_off = release.plane.token_kubeconfig(tmp_path / "relayed.kubeconfig", token)
        cut_off.write_text(cut_off.read_text().replace(release.plane.server, f"https://127.0.0.1:{partition.port}"))
        async with operator_process(tmp_path, "partitioned", cut_off, *FAST_LEASE) as leader:
            await eventually(lambda: _is(leader, "leader"), "the relayed replica to lead")
            await cluster.create(SC_PATH.format(ns=NS), cluster.with_topic(topic_name).streamconsumer("fenced"))
            await eventually(leader.reconciled_ok, "the leader to reconcile")
            async with operator_process(tmp_path, "standby", release.operator_kubeconfig, *FAST_LEASE) as standby:
                await eventually(lambda: _is(standby, "standby"), "the standby")
                await partition.cut()
                code = await asyncio.wait_for(leader.proc.wait(), timeout=30)
                output = leader.log.read_text()
                # kopf logs its broken watches; the process ends on one line that says what happened.
                last = output.strip().splitlines()[-1]
                assert code == 2 and last.startswith("keyrange operator: error: lost the Lease"), output[-3000:]
                await eventually(lambda: _is(standby, "leader"), "the standby to take the Lease", timeout=30)
                stopped = leader.logged_at("stopped every range control")
                started = standby.logged_at("acquired Lease")
                assert stopped is not None and started is not None
                assert stopped < started, (stopped, started)
                await eventually(standby.reconciled_ok, "the new leader to reconcile")

