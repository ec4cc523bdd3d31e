"""Every operator API call ends by the Lease's renew deadline while the operator leads (kube.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyrange.operator.kube import CALL_TIMEOUT_SECONDS, Kube, KubeDeadlinePassed, new_api_client


class Response:
    status = 200

    def read(self) -> bytes:
        return b"{}"


class RecordingClient:
    """The parts of kubernetes.client.ApiClient that Kube uses, recording each call's timeout."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def param_serialize(self, method: str, path: str, **kwargs: Any) -> tuple[str, str, dict[str, str], Any, None]:
        return method, path, kwargs.get("header_params") or {}, kwargs.get("body"), None

    def call_api(self, method: str, url: str, **kwargs: Any) -> Response:
        self.timeouts.append(kwargs["_request_timeout"])
        return Response()


def _kube() -> tuple[Kube, RecordingClient]:
    client = RecordingClient()
    return Kube(client), client  # type: ignore[arg-type]


def test_without_a_deadline_a_call_takes_at_most_the_default_or_the_callers_timeout() -> None:
    kube, client = _kube()
    kube.get("v1", "ConfigMap", "ns", "a")
    kube.get("v1", "ConfigMap", "ns", "a", timeout_seconds=4.0)
    assert client.timeouts == [CALL_TIMEOUT_SECONDS, 4.0]


def test_a_leaders_calls_end_by_the_deadline_and_none_starts_after_it() -> None:
    kube, client = _kube()
    until = time.monotonic() + 5.0
    kube.deadline = lambda: until
    kube.patch("apps/v1", "StatefulSet", "ns", "w", {"spec": {"replicas": 2}})
    assert 0 < client.timeouts[-1] <= 5.0
    until = time.monotonic() - 0.1  # the renew deadline passed (a renew hung, or failed)
    with pytest.raises(KubeDeadlinePassed, match="renew deadline"):
        kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}})
    assert len(client.timeouts) == 1  # not sent


def test_a_deadline_of_none_means_not_leading_yet() -> None:
    kube, client = _kube()
    kube.deadline = lambda: None
    kube.delete("v1", "ConfigMap", "ns", "a")
    assert client.timeouts == [CALL_TIMEOUT_SECONDS]


def test_the_operators_client_does_not_retry_inside_a_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # urllib3's default retries give a call four tries, each with the whole timeout: a call bounded
    # by the Lease's deadline took four times as long on a network that dropped packets.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    client = new_api_client()
    assert client.configuration.retries is False
    assert client.rest_client.pool_manager.connection_pool_kw["retries"].total is False
