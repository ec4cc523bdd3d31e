"""A stand-in for the StatefulSet controller and kubelet: real `keyrange worker` processes per ordinal.

It reads the StatefulSet the operator rendered, writes the ConfigMap's StreamConsumer document to
a file (the volume mount), runs the container's command for ordinals 0..replicas-1 with
HOSTNAME=<statefulset>-<ordinal> (the worker takes its identity from it), SIGTERMs ordinals above
(highest first, as a StatefulSet does), restarts a crashed worker (restartPolicy Always), rolls
pods whose template changed one at a time from the highest ordinal, waiting for each to be ready
(RollingUpdate), and reports ready pods in the StatefulSet's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from keyrange.operator.settings import WORKER_SPEC_PATH

StopCheck = Callable[[int], None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WorkerPods:
    """Runs the pods of one StatefulSet as local processes (see the module docstring)."""

    def __init__(self, api: Any, namespace: str, statefulset: str, configmap: str, workdir: Path,
                 before_stop: StopCheck | None = None) -> None:
        self.api, self.namespace, self.statefulset, self.configmap = api, namespace, statefulset, configmap
        self.workdir = workdir
        self.before_stop = before_stop
        """Called with an ordinal right before it is scaled away (tests assert it owns nothing then)."""
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.ports: dict[int, int] = {}
        self.templates: dict[int, str] = {}
        """The pod template (as JSON) each running process was started from."""
        self.stopped: list[int] = []
        """Ordinals scaled away, in order."""
        self.rolled: list[int] = []
        """Ordinals replaced by a rolling update, in order."""
        self.crashes: list[str] = []
        """One line per worker process that exited on its own (it is restarted, as a kubelet would)."""
        self.errors: list[BaseException] = []
        self._task: asyncio.Task[None] | None = None

    def _path(self, kind: str, name: str) -> str:
        group = "/api/v1" if kind != "statefulsets" else "/apis/apps/v1"
        return f"{group}/namespaces/{self.namespace}/{kind}/{name}"

    async def _start(self, ordinal: int, template: dict[str, Any]) -> None:
        command = template["spec"]["containers"][0]["command"]
        args = [a if a != WORKER_SPEC_PATH else str(self.workdir / "streamconsumer.yaml") for a in command[1:]]
        port = _free_port()
        at = args.index("--metrics-port")
        args[at + 1] = str(port)
        log = open(self.workdir / f"worker-{ordinal}.log", "ab")  # noqa: SIM115 (lives with the process)
        keyrange = str(Path(sys.executable).with_name(command[0]))
        env = {**os.environ, "HOSTNAME": f"{self.statefulset}-{ordinal}"}
        self.procs[ordinal] = await asyncio.create_subprocess_exec(keyrange, *args, env=env, stdout=log,
                                                                   stderr=log)
        self.ports[ordinal] = port
        self.templates[ordinal] = json.dumps(template, sort_keys=True)

    async def _ready(self, ordinal: int) -> bool:
        """The readiness probe: /metrics answers."""
        try:
            async with aiohttp.ClientSession() as session, \
                    session.get(f"http://127.0.0.1:{self.ports[ordinal]}/metrics") as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    async def _terminate(self, ordinal: int) -> None:
        proc = self.procs.pop(ordinal)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout=60)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def _scale_away(self, ordinal: int) -> None:
        if self.before_stop is not None:
            self.before_stop(ordinal)
        await self._terminate(ordinal)
        self.stopped.append(ordinal)

    async def _roll(self, ordinal: int, template: dict[str, Any]) -> None:
        await self._terminate(ordinal)
        await self._start(ordinal, template)
        deadline = asyncio.get_running_loop().time() + 120
        while not await self._ready(ordinal):
            assert asyncio.get_running_loop().time() < deadline, f"worker {ordinal} never became ready"
            await asyncio.sleep(0.2)
        self.rolled.append(ordinal)

    async def _tick(self) -> None:
        sts = await self.api.get(self._path("statefulsets", self.statefulset))
        cm = await self.api.get(self._path("configmaps", self.configmap))
        if sts is None or cm is None:
            return
        (self.workdir / "streamconsumer.yaml").write_text(cm["data"]["streamconsumer.yaml"])
        template = sts["spec"]["template"]
        replicas = int(sts["spec"]["replicas"])
        for ordinal, proc in list(self.procs.items()):
            if proc.returncode is not None:  # crashed: restartPolicy Always
                tail = (self.workdir / f"worker-{ordinal}.log").read_text(errors="replace").strip()
                self.crashes.append(f"worker {ordinal} exited {proc.returncode}: {tail.splitlines()[-1:]}")
                del self.procs[ordinal]
        for ordinal in sorted((o for o in self.procs if o >= replicas), reverse=True):
            await self._scale_away(ordinal)
        for ordinal in range(replicas):
            if ordinal not in self.procs:
                await self._start(ordinal, template)
        outdated = [o for o in self.procs if self.templates[o] != json.dumps(template, sort_keys=True)]
        if outdated:
            await self._roll(max(outdated), template)  # one pod per round, highest ordinal first
        ready = [o for o, p in self.procs.items() if p.returncode is None and await self._ready(o)]
        await self.api.patch(self._path("statefulsets", self.statefulset) + "/status",
                             {"status": {"replicas": len(self.procs), "readyReplicas": len(ready)}})

    async def _loop(self) -> None:
        while True:
            try:
                await self._tick()
            except Exception as exc:  # surfaced by the test through `errors`
                self.errors.append(exc)
                raise
            await asyncio.sleep(0.2)

    async def __aenter__(self) -> WorkerPods:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        for ordinal in sorted(self.procs, reverse=True):
            await self._terminate(ordinal)
