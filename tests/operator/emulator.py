"""kmock's KubernetesEmulator with the API-server behaviour the operator relies on.

kmock stores objects but leaves out what a real API server does around them, so
this subclass stamps uid/namespace/resourceVersion/generation on create, bumps resourceVersion on
every merge patch and generation on spec changes, answers a failed JSON-patch `test` (kopf guards
finalizer changes with one on resourceVersion) with 422 as the API server does, serves a CRD's
resource once the CRD is created (with its status and scale subresources, mapping `/scale` patches
through specReplicasPath), and garbage-collects objects whose controller owner is gone (the
cascade Kubernetes' GC does).
"""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock import ResourceInfo

CRD_RESOURCE = "apiextensions.k8s.io/v1/customresourcedefinitions"
BUILTIN = {
    "v1/namespaces": ResourceInfo(kind="Namespace", namespaced=False),  # kopf waits to discover it
    "v1/configmaps": ResourceInfo(kind="ConfigMap", namespaced=True),
    "v1/services": ResourceInfo(kind="Service", namespaced=True),
    "v1/serviceaccounts": ResourceInfo(kind="ServiceAccount", namespaced=True),
    "v1/events": ResourceInfo(kind="Event", namespaced=True),
    "apps/v1/statefulsets": ResourceInfo(kind="StatefulSet", namespaced=True, subresources={"status", "scale"}),
    "apps/v1/deployments": ResourceInfo(kind="Deployment", namespaced=True, subresources={"status", "scale"}),
    "batch/v1/cronjobs": ResourceInfo(kind="CronJob", namespaced=True, subresources={"status"}),
    "v1/persistentvolumeclaims": ResourceInfo(kind="PersistentVolumeClaim", namespaced=True),
    "rbac.authorization.k8s.io/v1/roles": ResourceInfo(kind="Role", namespaced=True),
    "rbac.authorization.k8s.io/v1/rolebindings": ResourceInfo(kind="RoleBinding", namespaced=True),
    CRD_RESOURCE: ResourceInfo(kind="CustomResourceDefinition", namespaced=False),
}
VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator):
    """An in-memory Kubernetes API close enough to a real one for kopf and the keyrange operator."""

    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    _replica_paths: dict[str, list[str]] = attrs.field(factory=dict, init=False)
    calls: list[tuple[str, str]] = attrs.field(factory=list, init=False)
    """(METHOD, path) of every request served, for tests that count API calls."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, info in BUILTIN.items():
            info.verbs = set(VERBS)
            self.resources[key] = info

    def _register_crd(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        for version in spec["versions"]:
            key = f"{spec['group']}/{version['name']}/{spec['names']['plural']}"
            subresources = set(version.get("subresources", {}))
            self.resources[key] = ResourceInfo(
                kind=spec["names"]["kind"], singular=spec["names"]["singular"],
                namespaced=spec["scope"] == "Namespaced", verbs=set(VERBS), subresources=subresources,
                shortnames=set(spec["names"].get("shortNames", [])))
            scale = version.get("subresources", {}).get("scale")
            if scale:
                self._replica_paths[key] = scale["specReplicasPath"].strip(".").split(".")

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        self.calls.append((request.method.name if request.method else "", request.url.path))
        data = request.data if isinstance(request.data, dict) else None
        res = request.resource
        key = f"{res.group}/{res.version}/{res.plural}".lstrip("/") if res is not None else ""
        if data is not None and request.action == kmock.action.CREATE:
            meta = data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            if request.namespace:
                meta.setdefault("namespace", request.namespace)
            meta.update(uid=str(uuid.uuid4()), resourceVersion=str(next(self._versions)), generation=1,
                        creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            if key == CRD_RESOURCE:
                self._register_crd(data)
        elif data is not None and request.action == kmock.action.UPDATE:
            if request.subresource == "scale" and key in self._replica_paths:
                replicas = (data.get("spec") or {}).get("replicas")
                data.clear()
                node = data
                for part in self._replica_paths[key][:-1]:
                    node = node.setdefault(part, {})
                node[self._replica_paths[key][-1]] = replicas
            meta = data.setdefault("metadata", {})
            meta["resourceVersion"] = str(next(self._versions))
            if "spec" in data and request.subresource != "status":
                current = self._current(request)
                if current is not None:
                    meta["generation"] = int(current.get("metadata", {}).get("generation", 1)) + 1
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as exc:
            # kopf guards some patches with a `test` of resourceVersion; the API server answers a
            # failed test with 422, and kopf retries on the next watch event.
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from None
        finally:
            if request.action in (kmock.action.DELETE, kmock.action.UPDATE):
                await self._collect_garbage()

    def _current(self, request: kmock.Request) -> dict[str, Any] | None:
        for (resource, namespace, name), obj in self.objects.items():
            if resource == request.resource and namespace == request.namespace and name == request.name:
                return None if obj.deleted else dict(obj.raw)
        return None

    async def _collect_garbage(self) -> None:
        while True:
            async with self._lock:
                live = {o.raw["metadata"]["uid"] for o in self.objects.values()
                        if not o.deleted and "uid" in o.raw.get("metadata", {})}
                orphans = [(k, o) for k, o in self.objects.items() if not o.deleted and any(
                    ref.get("controller") and ref.get("uid") not in live
                    for ref in o.raw.get("metadata", {}).get("ownerReferences", []))]
                for (resource, _, _), obj in orphans:
                    raw = obj.raw
                    obj.delete()
                    await self._buses[resource].put({"type": "DELETED", "object": raw})
            if not orphans:
                return
