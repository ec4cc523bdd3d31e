"""TEST CODE: a small node agent standing in for kube-scheduler and the kubelet, so that pods the
real controllers create (the StatefulSet's workers) run on this machine as local processes.

It registers a Node (and keeps its Lease in kube-node-lease fresh, so the node lifecycle controller
keeps it Ready), binds pending pods of the namespaces it serves to that Node, and for each bound
pod runs the first container's command and args, with its env and envFrom, as a process from the
project's venv (a container without a command runs the image's entrypoint, `keyrange`). What a container
would find in its filesystem is mapped to a folder per pod (ConfigMap, Secret and emptyDir volumes:
paths in args and env that start with a mountPath are rewritten), and every containerPort to a free
local port (an arg equal to the port, `--flag=PORT`, or `:PORT` in a URL is rewritten), since all
pods share 127.0.0.1. Instead of a projected service-account token, a pod whose ServiceAccount
token is mounted gets $KUBECONFIG pointing at a kubeconfig with a token from the TokenRequest API
for that ServiceAccount (what the kubelet would project). Pod DNS names of headless Services
(`<pod>.<service>.<namespace>.svc`) resolve, in the processes it runs, to 127.0.0.1 and the mapped
port (tests/operator/pod_dns/sitecustomize.py). The pod is reported Running, and Ready
once its readiness probe (httpGet) answers. On deletion it gets SIGTERM, SIGKILL after its grace
period, then the pod object is removed (deleted pods stop in parallel, as a kubelet's do); a
process that exits is restarted as restartPolicy says.
`processes=False` runs nothing and reports every bound pod Ready at once (for tests that need
ready pods, not what runs in them).

It acts as a real scheduler and kubelet would, never as admin, so every test that runs pods goes
through the Node authorizer and the NodeRestriction admission plugin: it binds pods as
`system:kube-scheduler`, and does everything else (its Node, Lease, pods' status, the Secrets and
ConfigMaps they reference, deletion) as `system:node:<name>`, with client certificates issued
through the certificates API. It lists only the pods bound to it (the Node authorizer allows no
other listing), and a pod whose Secret the authorizer does not yet relate to the node (403 right
after binding: its graph catches up from a watch) starts on a later tick, as a kubelet retries.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import re
import signal
import sys
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from keyrange.local.ports import free_port
from tests.operator.conftest import Api
from tests.operator.kubecluster import ClientCertificate

POD_DNS = Path(__file__).parent / "pod_dns"
CHECKOUT = Path(__file__).resolve().parents[2]
"""The project's checkout (the pods run from its venv)."""
"""Holds the sitecustomize.py that gives the agent's processes pod DNS."""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _NotYet(Exception):
    """The Node authorizer does not relate something a pod references to this node yet (403)."""


@dataclass
class PodProcess:
    """One pod's running container."""

    uid: str
    proc: asyncio.subprocess.Process | None
    ports: dict[int, int]
    """containerPort -> local port."""
    restarts: int = 0
    ready: bool = False
    started: float = field(default_factory=lambda: asyncio.get_running_loop().time())


class TestNodeAgent:
    """Scheduler + kubelet stand-in for the pods of `namespaces` (see the module docstring)."""

    __test__ = False  # not a pytest test class

    def __init__(self, api: Api, namespaces: list[str], workdir: Path, name: str = "test-node",
                 processes: bool = True, before_stop: Callable[[str], None] | None = None,
                 token_kubeconfig: Callable[[str, str, Path], Awaitable[Path]] | None = None) -> None:
        self.api, self.namespaces, self.workdir, self.name = api, namespaces, workdir, name
        """`api` is the admin's: only its cluster is used; the agent mints its own identities."""
        self.kubelet = self.scheduler = api  # until __aenter__ has the node's and the scheduler's
        self.processes = processes
        self.before_stop = before_stop
        """Called with a pod's name right before its process is stopped for deletion."""
        self.token_kubeconfig = token_kubeconfig
        """(namespace, ServiceAccount, pod folder) -> a kubeconfig with that account's token."""
        self.pods: dict[tuple[str, str], PodProcess] = {}
        self.started_pods: list[str] = []
        """Pod names in the order their process started (restarts included)."""
        self.stopped_pods: list[str] = []
        """Pod names in the order they were stopped for deletion."""
        self.crashes: list[str] = []
        """One line per process that exited on its own (restarted as restartPolicy says)."""
        self.errors: list[BaseException] = []
        self.dns_file = workdir / "pod-dns.json"
        """Pod DNS name -> {containerPort: local port}, read by pod_dns/sitecustomize.py."""
        self._tasks: list[asyncio.Task[None]] = []
        self._sessions: list[aiohttp.ClientSession] = []
        self._waiting: set[tuple[str, str]] = set()
        self._terminating: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def _register(self) -> None:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name,
                                                                 "labels": {"kubernetes.io/os": "linux"}}}
        if await self.kubelet.get(f"/api/v1/nodes/{self.name}") is None:
            await self.kubelet.create("/api/v1/nodes", node)
        await self.kubelet.patch(f"/api/v1/nodes/{self.name}/status", {"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test node agent",
                            "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}],
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "500"},
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "500"},
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}})

    async def _heartbeat(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        while True:
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            spec = {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": now}
            if await self.kubelet.get(path) is None:
                await self.kubelet.create(path.rsplit("/", 1)[0], {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": self.name},
                    "spec": spec})
            else:
                await self.kubelet.patch(path, {"spec": spec})
            await asyncio.sleep(5)

    @staticmethod
    async def _pods(api: Api, namespace: str, node: str) -> list[dict[str, Any]]:
        """The pods of `namespace` bound to `node` ("" for the pending ones)."""
        selector = urllib.parse.quote(f"spec.nodeName={node}")
        found = await api.get(f"/api/v1/namespaces/{namespace}/pods?fieldSelector={selector}")
        return list((found or {}).get("items") or [])

    async def _tick(self) -> None:
        for namespace in self.namespaces:
            for pod in await self._pods(self.scheduler, namespace, ""):
                await self._bind(namespace, pod["metadata"])
            # Deleted pods last, in the order they were deleted (their last change), as a kubelet's
            # watch delivers them: a listing is in name order, and one tick can see several deletions.
            pods = sorted(await self._pods(self.kubelet, namespace, self.name), key=lambda pod: (
                "deletionTimestamp" in pod["metadata"],
                int(pod["metadata"]["resourceVersion"]) if "deletionTimestamp" in pod["metadata"] else 0))
            for pod in pods:
                await self._handle(namespace, pod)

    async def _bind(self, namespace: str, meta: dict[str, Any]) -> None:
        status, body = await self.scheduler.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods/{meta['name']}/binding",
            {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"], "uid": meta["uid"]},
             "target": {"apiVersion": "v1", "kind": "Node", "name": self.name}}, "application/json")
        # 404/409: the pod went, or was bound, since the listing (a scheduler races the same way).
        assert status in (200, 201, 404, 409), body

    async def _read(self, path: str) -> dict[str, Any] | None:
        """A Secret or ConfigMap a pod of this node references, as the node (None if missing)."""
        status, body = await self.kubelet.request("GET", path)
        if status == 403:
            raise _NotYet(f"{path}: {(body or {}).get('message')}")
        assert status in (200, 404), body
        return dict(body) if status == 200 else None

    async def _handle(self, namespace: str, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        key = (namespace, meta["name"])
        running = self.pods.get(key)
        if running is not None and running.uid != meta["uid"]:  # a new pod under an old name
            await self._stop(key, 0)
            running = None
        if meta.get("deletionTimestamp"):
            if key not in self._terminating:
                self._terminating[key] = asyncio.create_task(self._terminate(namespace, meta))
            return
        try:
            if running is None:
                running = self.pods[key] = await self._start(namespace, pod, 0)
            elif running.proc is not None and running.proc.returncode is not None:
                if key not in self._waiting:
                    self.crashes.append(f"{meta['name']} exited {running.proc.returncode}")
                policy = spec.get("restartPolicy", "Always")
                if policy == "Always" or (policy == "OnFailure" and running.proc.returncode != 0):
                    running = self.pods[key] = await self._start(namespace, pod, running.restarts + 1)
        except _NotYet as waiting:
            if key not in self._waiting:  # once per pod: it is normal right after binding
                logging.getLogger(__name__).info("test node agent %s: %s waits: %s", self.name, key, waiting)
            self._waiting.add(key)
            return
        self._waiting.discard(key)
        await self._report(namespace, pod, running)

    async def _files(self, namespace: str, pod: dict[str, Any], root: Path) -> dict[str, str]:
        """Materialise ConfigMap, Secret and emptyDir volumes; mountPath -> local folder."""
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        mounts = {}
        for mount in pod["spec"]["containers"][0].get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            local = root / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                cm = await self._read(f"/api/v1/namespaces/{namespace}/configmaps/{volume['configMap']['name']}")
                for file, text in ((cm or {}).get("data") or {}).items():
                    (local / file).write_text(text)
            elif "secret" in volume:
                secret = await self._read(f"/api/v1/namespaces/{namespace}/secrets/{volume['secret']['secretName']}")
                for file, data in ((secret or {}).get("data") or {}).items():
                    (local / file).write_bytes(base64.b64decode(data))
            mounts[mount["mountPath"]] = str(local)
        return mounts

    async def _env(self, namespace: str, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        env = {"HOSTNAME": pod["metadata"]["name"]}
        fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": namespace,
                  "status.podIP": "127.0.0.1", "spec.nodeName": self.name}
        for source in container.get("envFrom") or []:  # first, so that `env` wins, as in a kubelet
            prefix = source.get("prefix", "")
            if "secretRef" in source:
                secret = await self._read(f"/api/v1/namespaces/{namespace}/secrets/{source['secretRef']['name']}")
                data = {k: base64.b64decode(v).decode() for k, v in ((secret or {}).get("data") or {}).items()}
            else:
                cm = await self._read(f"/api/v1/namespaces/{namespace}/configmaps/{source['configMapRef']['name']}")
                data = dict((cm or {}).get("data") or {})
            env.update({prefix + k: v for k, v in data.items()})
        for item in container.get("env") or []:
            source = item.get("valueFrom") or {}
            if "fieldRef" in source:
                env[item["name"]] = fields[source["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                secret = await self._read(f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}")
                env[item["name"]] = base64.b64decode(((secret or {}).get("data") or {})[ref["key"]]).decode()
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                cm = await self._read(f"/api/v1/namespaces/{namespace}/configmaps/{ref['name']}")
                env[item["name"]] = str(((cm or {}).get("data") or {})[ref["key"]])
            else:
                env[item["name"]] = str(item.get("value", ""))
        return env

    async def _start(self, namespace: str, pod: dict[str, Any], restarts: int) -> PodProcess:
        container = pod["spec"]["containers"][0]
        ports = {int(p["containerPort"]): free_port() for p in container.get("ports") or []}
        running = PodProcess(pod["metadata"]["uid"], None, ports, restarts)
        if not self.processes:
            return running
        root = self.workdir / namespace / pod["metadata"]["name"]
        mounts = await self._files(namespace, pod, root)
        env = await self._env(namespace, pod, container)

        def local(value: str) -> str:
            if value == str(CHECKOUT) or value.startswith(f"{CHECKOUT}/"):
                # The project's own checkout, where the pods' processes run from (a test's handler
                # module on PYTHONPATH): a host path, never a container path under a mount, even
                # when the checkout lies below one (a clone in /tmp under the pod's /tmp volume).
                return value
            for path, folder in mounts.items():
                if value == path or value.startswith(path.rstrip("/") + "/"):
                    return folder + value[len(path.rstrip("/")):]
            for port, host in ports.items():
                if value == str(port):
                    return str(host)
            for name, val in env.items():
                value = value.replace(f"$({name})", val)
            return value

        def mapped(arg: str) -> str:
            flag, sep, value = arg.partition("=")
            if sep and flag.startswith("--"):
                return f"{flag}={mapped(value)}"
            for port, host in ports.items():
                arg = re.sub(rf":{port}(?=/|$)", f":{host}", arg)
            return local(arg)

        command = container.get("command") or ["keyrange"]  # the image's entrypoint
        argv = [mapped(a) for a in [*command, *(container.get("args") or [])]]
        argv[0] = str(Path(sys.executable).with_name(argv[0]))
        self._publish_dns(namespace, pod, ports)
        # The agent's own additions, not the container's: never mapped through its mounts. The pod
        # DNS folder goes before the PYTHONPATH the process would have had (the pod's env wins).
        python_path = local(env["PYTHONPATH"]) if "PYTHONPATH" in env else os.environ.get("PYTHONPATH", "")
        dns = {"KEYRANGE_TEST_POD_DNS": str(self.dns_file),
               "PYTHONPATH": os.pathsep.join([str(POD_DNS), python_path]).rstrip(os.pathsep)}
        if pod["spec"].get("automountServiceAccountToken", True) and self.token_kubeconfig is not None:
            account = pod["spec"].get("serviceAccountName") or "default"
            dns["KUBECONFIG"] = str(await self.token_kubeconfig(namespace, account, root))
        log = open(root.with_suffix(".log"), "ab")  # noqa: SIM115 (lives with the process)
        running.proc = await asyncio.create_subprocess_exec(
            *argv, env={**os.environ, **{k: local(v) for k, v in env.items()}, **dns}, stdout=log, stderr=log,
            start_new_session=True)
        self.started_pods.append(pod["metadata"]["name"])
        return running

    def _publish_dns(self, namespace: str, pod: dict[str, Any], ports: dict[int, int]) -> None:
        spec = pod["spec"]
        if not spec.get("subdomain"):
            return
        name = f"{spec.get('hostname') or pod['metadata']['name']}.{spec['subdomain']}.{namespace}.svc"
        table = json.loads(self.dns_file.read_text()) if self.dns_file.exists() else {}
        table[name] = {str(k): v for k, v in ports.items()}
        tmp = self.dns_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(table))
        os.replace(tmp, self.dns_file)  # atomic: a process never reads half a table

    async def _probe(self, container: dict[str, Any], running: PodProcess) -> bool:
        if not self.processes:
            return True
        if running.proc is None or running.proc.returncode is not None:
            return False
        http = (container.get("readinessProbe") or {}).get("httpGet")
        if http is None:
            return True
        port = http["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in container["ports"] if p.get("name") == port)
        try:
            async with aiohttp.ClientSession() as session, session.get(
                    f"http://127.0.0.1:{running.ports[int(port)]}{http.get('path', '/')}",
                    timeout=aiohttp.ClientTimeout(total=2)) as response:
                return 200 <= response.status < 400
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def _report(self, namespace: str, pod: dict[str, Any], running: PodProcess) -> None:
        container = pod["spec"]["containers"][0]
        ready = await self._probe(container, running)
        status = pod.get("status") or {}
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        restarts = [c.get("restartCount") for c in status.get("containerStatuses") or []]
        unchanged = conditions.get("Ready") == str(ready) and restarts == [running.restarts]
        if status.get("phase") == "Running" and unchanged:
            return
        flag = "True" if ready else "False"
        status_path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/status"
        code, body = await self.kubelet.request("PATCH", status_path, {"status": {
            "phase": "Running", "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": status.get("startTime") or _now(),
            "conditions": [{"type": t, "status": s, "lastTransitionTime": _now()} for t, s in (
                ("PodScheduled", "True"), ("Initialized", "True"), ("ContainersReady", flag), ("Ready", flag))],
            "containerStatuses": [{"name": container["name"], "image": container["image"], "imageID": "",
                                   "ready": ready, "started": True, "restartCount": running.restarts,
                                   "state": {"running": {"startedAt": _now()}}}]}})
        assert code in (200, 404), body  # 404: deleted since the listing

    async def _terminate(self, namespace: str, meta: dict[str, Any]) -> None:
        """A deleted pod: stop its process, then remove the pod object. In a task of its own, as a
        kubelet's pod workers do, so one slow shutdown does not hold up the others."""
        key = (namespace, meta["name"])
        try:
            if key in self.pods:
                await self._stop(key, int(meta.get("deletionGracePeriodSeconds") or 30))
            await self.kubelet.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{meta['name']}",
                                       {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
                                       "application/json")
        except Exception as exc:  # surfaced by the test through `errors`
            logging.getLogger(__name__).exception("test node agent %s: stopping %s failed", self.name, key)
            self.errors.append(exc)
        finally:
            self._terminating.pop(key, None)

    async def _stop(self, key: tuple[str, str], grace_seconds: int) -> None:
        if self.before_stop is not None:
            self.before_stop(key[1])
        running = self.pods.pop(key)
        self.stopped_pods.append(key[1])
        proc = running.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout=max(grace_seconds, 1))
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    def report(self, lines: int = 20) -> str:
        """What the node did and the last lines of each pod's log: a timed-out wait's explanation
        (CI keeps the test's output, not its tmp_path)."""
        parts = [f"started {self.started_pods}, stopped {self.stopped_pods}, crashes {self.crashes}, "
                 f"errors {self.errors}"]
        for log in sorted(self.workdir.glob("*/*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.parent.name}/{log.name} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(parts)

    def local_port(self, namespace: str, pod: str, container_port: int) -> int:
        """Where a pod's containerPort listens on this machine."""
        return self.pods[(namespace, pod)].ports[container_port]

    async def _loop(self) -> None:
        while True:
            try:
                await self._tick()
            except Exception as exc:  # surfaced by the test through `errors`, and in its log
                logging.getLogger(__name__).exception("test node agent %s failed", self.name)
                self.errors.append(exc)
                raise
            await asyncio.sleep(0.2)

    def _client(self, credentials: ClientCertificate) -> Api:
        plane = self.api.plane
        session = aiohttp.ClientSession(base_url=plane.server,
                                        connector=aiohttp.TCPConnector(ssl=credentials.ssl_context(plane.ca)))
        self._sessions.append(session)
        return Api(session, plane, self.api.bootstrap, self.api.topic)

    async def __aenter__(self) -> TestNodeAgent:
        self.workdir.mkdir(parents=True, exist_ok=True)
        plane = self.api.plane
        # kubectl and openssl block: off the loop, where an operator under test may be running.
        self.kubelet = self._client(await asyncio.to_thread(plane.node_credentials, self.name))
        self.scheduler = self._client(await asyncio.to_thread(plane.scheduler_credentials))
        await self._register()
        self._tasks = [asyncio.create_task(self._heartbeat()), asyncio.create_task(self._loop())]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.before_stop = None
        await asyncio.gather(*self._terminating.values(), return_exceptions=True)
        for key in list(self.pods):
            await self._stop(key, 10)
        for session in self._sessions:
            await session.close()
