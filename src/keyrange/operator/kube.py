"""The operator's only Kubernetes API calls: get, create-or-patch, delete, discovery, Events.

Raw JSON over the `kubernetes` client's ApiClient, so any kind (built-in or a CRD such as
ServiceMonitor) goes through one path. Objects are written by server-side apply under the field
manager `keyrange-operator`: the API server merges by field ownership, so fields other writers set
(an annotation added by `kubectl rollout restart`, labels from a policy engine) are kept, and the
operator forces only the fields it renders. Unknown fields are refused (strict field validation),
so a rendering mistake is an error, not silently dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import kubernetes

from keyrange.errors import UserError

CALL_TIMEOUT_SECONDS = 30.0
"""The longest any one API call may take (connecting, sending and reading the answer)."""
FIELD_MANAGER = "keyrange-operator"
"""The field manager of every write the operator makes (see `kubectl get -o yaml --show-managed-fields`)."""

_PLURALS = {"ConfigMap": "configmaps", "Service": "services", "StatefulSet": "statefulsets",
            "NetworkPolicy": "networkpolicies", "PodDisruptionBudget": "poddisruptionbudgets",
            "Event": "events", "ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules"}


def plural_of(kind: str) -> str:
    """The resource plural of a kind (the few irregular ones are listed)."""
    return _PLURALS.get(kind) or kind.lower() + "s"


def api_prefix(api_version: str) -> str:
    """`/api/v1` for the core group, `/apis/<group>/<version>` otherwise."""
    return f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"


def object_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """The URL path of a namespaced object (or of its collection when `name` is None)."""
    path = f"{api_prefix(api_version)}/namespaces/{namespace}/{plural_of(kind)}"
    return f"{path}/{name}" if name else path


class KubeApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, method: str, path: str, body: bytes) -> None:
        self.status = status
        text = body.decode(errors="replace")
        with contextlib.suppress(ValueError, AttributeError):
            text = str(json.loads(text).get("message", text))
        super().__init__(f"{method} {path} failed with HTTP {status}: {text[:500]}")


class KubeDeadlinePassed(Exception):
    """A call was not made: it could not end before the Lease's renew deadline (leadership.py)."""


class KubeConfigError(UserError):
    """No Kubernetes credentials were found."""


def new_api_client() -> kubernetes.client.ApiClient:
    """A client from the in-cluster service account, else from $KUBECONFIG / ~/.kube/config."""
    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        try:
            kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
        except (kubernetes.config.ConfigException, OSError) as exc:
            raise KubeConfigError(
                f"no Kubernetes credentials ({exc}): run the operator in a pod with a ServiceAccount, "
                "or point $KUBECONFIG at a kubeconfig file") from None
    configuration = kubernetes.client.Configuration.get_default_copy()
    # No retries inside a call: each try gets the call's whole timeout, so a retried call outlives its
    # deadline (the Lease's). Callers retry in their own loops (the elector, kopf's handlers).
    configuration.retries = False
    return kubernetes.client.ApiClient(configuration)


class Kube:
    """Kubernetes API access for the operator (blocking; kopf runs sync handlers in threads)."""

    def __init__(self, client: kubernetes.client.ApiClient | None = None) -> None:
        self._client = client or new_api_client()
        self.deadline: Callable[[], float | None] | None = None
        """While leading: when (time.monotonic) every call must have ended (`LeaseElector.act_until`),
        so that no write of a leader that lost its Lease lands after a standby took over."""

    def _timeout(self, timeout_seconds: float | None) -> float:
        """The whole call's timeout: CALL_TIMEOUT_SECONDS, the caller's, and what is left of `deadline`."""
        timeout = CALL_TIMEOUT_SECONDS if timeout_seconds is None else min(CALL_TIMEOUT_SECONDS, timeout_seconds)
        until = self.deadline() if self.deadline is not None else None
        if until is not None:
            timeout = min(timeout, until - time.monotonic())
        if timeout <= 0:
            raise KubeDeadlinePassed("not calling the API server: the Lease's renew deadline has passed")
        return timeout

    def _call(self, method: str, path: str, body: Any = None, content_type: str | None = None,
              query: list[tuple[str, str]] | None = None, timeout_seconds: float | None = None) -> Any:
        timeout = self._timeout(timeout_seconds)
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        client = self._client
        method, url, headers, payload, _ = client.param_serialize(
            method, path, query_params=query, header_params=headers, body=body, auth_settings=["BearerToken"])
        response = client.call_api(method, url, header_params=headers, body=payload, _request_timeout=timeout)
        data = response.read()  # type: ignore[no-untyped-call]
        if response.status >= 400:
            raise KubeApiError(response.status, method, path, data or b"")
        return json.loads(data) if data else None

    def get(self, api_version: str, kind: str, namespace: str | None, name: str,
            timeout_seconds: float | None = None) -> dict[str, Any] | None:
        """The object (cluster-scoped when `namespace` is None), or None when it does not exist."""
        if namespace is None:
            path = f"{api_prefix(api_version)}/{plural_of(kind)}/{name}"
        else:
            path = object_path(api_version, kind, namespace, name)
        try:
            return dict(self._call("GET", path, timeout_seconds=timeout_seconds))
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply `obj` (creating it if absent); return the stored object.

        `force` takes over fields another manager set that the operator renders too (a controller
        owns what it renders); fields the operator does not render stay as others set them.
        """
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", FIELD_MANAGER), ("force", "true"), ("fieldValidation", "Strict")]
        return dict(self._call("PATCH", path, json.dumps(obj), "application/apply-patch+yaml", query))

    def create(self, obj: dict[str, Any], timeout_seconds: float | None = None) -> dict[str, Any]:
        """POST a new object (KubeApiError 409 when it exists)."""
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"])
        return dict(self._call("POST", path, obj, query=[("fieldManager", FIELD_MANAGER)],
                               timeout_seconds=timeout_seconds))

    def replace(self, obj: dict[str, Any], timeout_seconds: float | None = None) -> dict[str, Any]:
        """PUT an object; with metadata.resourceVersion set, KubeApiError 409 if it changed since."""
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        return dict(self._call("PUT", path, obj, query=[("fieldManager", FIELD_MANAGER)],
                               timeout_seconds=timeout_seconds))

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete an object; False when it did not exist."""
        try:
            self._call("DELETE", object_path(api_version, kind, namespace, name))
        except KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def patch(self, api_version: str, kind: str, namespace: str, name: str,
              changes: dict[str, Any], subresource: str | None = None) -> dict[str, Any]:
        """Merge-patch part of an object (e.g. `{"spec": {"replicas": 3}}`)."""
        path = object_path(api_version, kind, namespace, name)
        if subresource:
            path += f"/{subresource}"
        return dict(self._call("PATCH", path, changes, "application/merge-patch+json",
                               [("fieldManager", FIELD_MANAGER)]))

    def has_resource(self, api_version: str, plural: str) -> bool:
        """Whether the cluster serves this resource (e.g. is the ServiceMonitor CRD installed?)."""
        try:
            found = self._call("GET", api_prefix(api_version))
        except KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.get("name") == plural for r in (found or {}).get("resources", []))

    def event(self, involved: dict[str, Any], reason: str, message: str, now: datetime,
              event_type: str = "Normal") -> None:
        """Record a core/v1 Event on `involved` (shown by `kubectl describe`)."""
        meta = involved["metadata"]
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"],
                         "name": f"{meta['name']}.{now.strftime('%Y%m%d%H%M%S%f')}"},
            "involvedObject": {"apiVersion": involved["apiVersion"], "kind": involved["kind"],
                               "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta.get("uid")},
            "reason": reason, "message": message[:1024], "type": event_type,
            "source": {"component": "keyrange-operator"},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        self._call("POST", object_path("v1", "Event", meta["namespace"]), event,
                   query=[("fieldManager", FIELD_MANAGER)])
