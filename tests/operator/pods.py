"""A stand-in for the StatefulSet controller and kubelet: real `keyrange worker` processes per ordinal.

It reads the StatefulSet the operator rendered, writes the ConfigMap's StreamConsumer document to
a file (the volume mount), runs the container's command for ordinals 0..replicas-1 with
HOSTNAME=<statefulset>-<ordinal> (the worker takes its identity from it), SIGTERMs ordinals above
(highest first, as a StatefulSet does), and reports ready pods in the StatefulSet's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
        """Called with an ordinal right before it is stopped (tests assert it owns nothing then)."""
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.stopped: list[int] = []
        self.crashes: list[str] = []
        """One line per worker process that exited on its own (it is restarted, as a kubelet would)."""
        self._task: asyncio.Task[None] | None = None
        self.errors: list[BaseException] = []

    def _path(self, kind: str, name: str) -> str:
        group = "/api/v1" if kind != "statefulsets" else "/apis/apps/v1"
        return f"{group}/namespaces/{self.namespace}/{kind}/{name}"

    async def _start(self, ordinal: int, command: list[str]) -> None:
        args = [a if a != WORKER_SPEC_PATH else str(self.workdir / "streamconsumer.yaml") for a in command[1:]]
        port = _free_port()
        args = [*args[: args.index("--metrics-port") + 1], str(port), *args[args.index("--metrics-port") + 2:]]
        log = open(self.workdir / f"worker-{ordinal}.log", "ab")  # noqa: SIM115 (lives with the process)
        keyrange = str(Path(sys.executable).with_name(command[0]))
        env = {**os.environ, "HOSTNAME": f"{self.statefulset}-{ordinal}"}
        self.procs[ordinal] = await asyncio.create_subprocess_exec(keyrange, *args, env=env, stdout=log,
                                                                   stderr=log)

    async def _stop(self, ordinal: int) -> None:
        if self.before_stop is not None:
            self.before_stop(ordinal)
        proc = self.procs.pop(ordinal)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout=60)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        self.stopped.append(ordinal)

    async def _tick(self) -> None:
        sts = await self.api.get(self._path("statefulsets", self.statefulset))
        cm = await self.api.get(self._path("configmaps", self.configmap))
        if sts is None or cm is None:
            return
        (self.workdir / "streamconsumer.yaml").write_text(cm["data"]["streamconsumer.yaml"])
        command = sts["spec"]["template"]["spec"]["containers"][0]["command"]
        replicas = int(sts["spec"]["replicas"])
        for ordinal, proc in list(self.procs.items()):
            if proc.returncode is not None:  # crashed: restartPolicy Always
                tail = (self.workdir / f"worker-{ordinal}.log").read_text(errors="replace").strip()
                self.crashes.append(f"worker {ordinal} exited {proc.returncode}: {tail.splitlines()[-1:]}")
                del self.procs[ordinal]
        for ordinal in sorted((o for o in self.procs if o >= replicas), reverse=True):
            await self._stop(ordinal)
        for ordinal in range(replicas):
            if ordinal not in self.procs:
                await self._start(ordinal, command)
        running = sum(1 for p in self.procs.values() if p.returncode is None)
        await self.api.patch(self._path("statefulsets", self.statefulset) + "/status",
                             {"status": {"replicas": len(self.procs), "readyReplicas": running}})

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
            self.before_stop = None
            await self._stop(ordinal)
