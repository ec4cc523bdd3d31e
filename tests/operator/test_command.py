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


class OperatorProcess:
    """One `keyrange operator` subprocess and its HTTP endpoints."""

    def __init__(self, proc: asyncio.subprocess.Process, health: str, metrics: str, webhook: int | None,
                 log: Path) -> None:
        self.proc, self.health, self.metrics, self.webhook, self.log = proc, health, metrics, webhook, log

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


def _listener() -> socket.socket:
    return socket.create_server(("127.0.0.1", 0))


def _port(listener: socket.socket) -> int:
    return int(listener.getsockname()[1])


@asynccontextmanager
async def operator_process(tmp_path: Path, tag: str, kubeconfig: Path, *args: str,
                           webhook: bool = False) -> AsyncIterator[OperatorProcess]:
    """Run `keyrange operator` for namespace NS with `kubeconfig`, with an alert webhook if asked;
    SIGTERM it at the end."""
    log = tmp_path / f"operator-{tag}.log"
    keyrange = str(Path(sys.executable).with_name("keyrange"))
    # Every listening socket is bound here and inherited: a port chosen free and bound by the
    # operator once started was taken in between in one run.
    with contextlib.ExitStack() as stack:
        health, metrics = stack.enter_context(_listener()), stack.enter_context(_listener())
        hook = stack.enter_context(_listener()) if webhook else None
        fds = {"--liveness-fd": health, "--metrics-fd": metrics, **({"--webhook-fd": hook} if hook else {})}
        out = stack.enter_context(log.open("wb"))
        proc = await asyncio.create_subprocess_exec(
            keyrange, "operator", f"--namespace={NS}", *(f"{option}={s.fileno()}" for option, s in fds.items()),
            "--refresh-seconds=0.5", "--image=keyrange:test",
            f"--lease={RELEASE}", f"--lease-namespace={RELEASE_NS}", f"--identity={tag}", *args,
            stdout=out, stderr=out, pass_fds=[s.fileno() for s in fds.values()],
            env={**os.environ, "KUBECONFIG": str(kubeconfig), "KEYRANGE_WEBHOOK_TOKEN": WEBHOOK_TOKEN})
        op = OperatorProcess(proc, f"http://127.0.0.1:{_port(health)}/healthz",
                             f"http://127.0.0.1:{_port(metrics)}/metrics", _port(hook) if hook else None, log)
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
    """A TCP relay to the API server that the test can cut (connections reset, as when a host is
    down) or blackhole (packets dropped silently, connections left open: calls hang), as network
    partitions do."""

    def __init__(self, target: str) -> None:
        self.host, port = target.removeprefix("https://").split(":")
        self.target_port = int(port)
        self.port = 0  # bound on entry
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._blackholed = False

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if self._blackholed:
                    continue  # dropped: neither side hears anything, nor a reset
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        if self._blackholed:  # accepted, then silence: the TLS handshake never completes
            with contextlib.suppress(ConnectionError, OSError):
                while await reader.read(65536):
                    pass
            return
        up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        self._writers.append(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def __aenter__(self) -> Partition:
        # Port 0: a port chosen free here and bound only on entry could be taken in between.
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def cut(self) -> None:
        """Refuse new connections and drop the open ones."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()

    async def blackhole(self) -> None:
        """From now on drop every byte either way, on open connections and new ones alike."""
        self._blackholed = True

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
    async with operator_process(tmp_path, "first", kubeconfig, *FAST_LEASE, webhook=True) as first:
        await eventually(lambda: _is(first, "leader"), "the first replica to lead")
        async with operator_process(tmp_path, "second", kubeconfig, *FAST_LEASE, webhook=True) as second:
            assert first.webhook is not None and second.webhook is not None
            await eventually(lambda: _is(second, "standby"), "the second replica to stand by")
            # Only the leader handles alerts; a standby says so with a 503, which Alertmanager retries.
            assert await _webhook_status(second.webhook) == 503
            assert await _webhook_status(first.webhook) == 200
            await cluster.create(SC_PATH.format(ns=NS), cluster.with_topic(topic_name).streamconsumer("elected"))
            await eventually(first.reconciled_ok, "the leader to reconcile")
            await asyncio.sleep(3)  # the standby would act within its 0.5 s refresh if it ran controllers
            assert not await second.reconciled_ok(), second.log.read_text()[-2000:]
            assert await second.role() == "standby"

            first.proc.kill()  # no chance to release: the standby must wait out the lease
            await first.proc.wait()
            await eventually(lambda: _is(second, "leader"), "the standby to take the Lease", timeout=30)
            await eventually(second.reconciled_ok, "the new leader to reconcile")
            await eventually(lambda: _webhook_answers(second.webhook, 200), "the new leader's webhook")
            assert (await _holder(cluster)).startswith("second_")


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["cut", "blackhole"])
async def test_a_leader_cut_off_from_the_api_server_stops_before_a_standby_starts(
        cluster: Api, release: Release, tmp_path: Path, topic_name: str, fault: str) -> None:
    token = release.plane.token(RELEASE_NS, "keyrange")
    async with Partition(release.plane.server) as partition:
        # The leader reaches the API server only through the relay (same token, same CA: the
        # serving certificate is valid for 127.0.0.1 on any port).
        cut_off = release.plane.token_kubeconfig(tmp_path / "relayed.kubeconfig", token)
        cut_off.write_text(cut_off.read_text().replace(release.plane.server, f"https://127.0.0.1:{partition.port}"))
        async with operator_process(tmp_path, "partitioned", cut_off, *FAST_LEASE) as leader:
            await eventually(lambda: _is(leader, "leader"), "the relayed replica to lead")
            consumer = cluster.with_topic(topic_name).streamconsumer(f"fenced-{fault}")
            await cluster.create(SC_PATH.format(ns=NS), consumer)
            await eventually(leader.reconciled_ok, "the leader to reconcile")
            async with operator_process(tmp_path, "standby", release.operator_kubeconfig, *FAST_LEASE) as standby:
                await eventually(lambda: _is(standby, "standby"), "the standby")
                # A blackhole hangs every call in flight instead of failing it: the leader must
                # still stop by its renew deadline, before the standby's lease wait ends.
                await (partition.cut() if fault == "cut" else partition.blackhole())
                code = await asyncio.wait_for(leader.proc.wait(), timeout=30 if fault == "cut" else 60)
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

