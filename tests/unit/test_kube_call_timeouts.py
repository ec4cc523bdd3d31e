"""Every operator API call ends by the Lease's renew deadline while the operator leads (kube.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from keyrange.operator.kube import CALL_TIMEOUT_SECONDS, Kube, KubeDeadlinePassed


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
