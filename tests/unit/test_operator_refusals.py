"""How reconcile answers the API server's 403s: an RBAC gap is waited out rarely and said in
status; an owner kind the API server does not know yet (a CRD created moments before) is retried
within seconds."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import kopf
import pytest

from keyrange.operator import handlers
from keyrange.operator.kube import KubeApiError
from keyrange.operator.settings import OperatorSettings

SPEC = {"kafka": {"topic": "t", "bootstrapServers": "kafka:9092"}}
PATH = "/apis/apps/v1/namespaces/ns/statefulsets/c-workers"
RBAC = (b'{"kind":"Status","message":"statefulsets.apps \\"c-workers\\" is forbidden: User '
        b'\\"system:serviceaccount:keyrange:keyrange-operator\\" cannot patch resource \\"statefulsets\\" '
        b'in API group \\"apps\\" in the namespace \\"ns\\"","reason":"Forbidden","code":403}')
UNKNOWN_KIND = (b'{"kind":"Status","message":"statefulsets.apps \\"c-workers\\" is forbidden: cannot set '
                b'blockOwnerDeletion if an ownerReference refers to a resource you can\'t set finalizers on: '
                b'no matches for kind \\"StreamConsumer\\" in version \\"keyrange.dev/v1alpha1\\", <nil>",'
                b'"reason":"Forbidden","code":403}')


class Controls:
    def ensure(self, namespace: str, name: str, model: Any) -> Any:
        return SimpleNamespace(desired_workers=lambda: 1, status=lambda: None)

    def worker_count_lock(self, namespace: str, name: str) -> threading.Lock:
        return threading.Lock()

    def close(self, namespace: str, name: str) -> None:
        pass


def reconcile_refused(monkeypatch: pytest.MonkeyPatch, answer: bytes,
                      memo: Any = None) -> tuple[kopf.TemporaryError, dict[str, Any]]:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise KubeApiError(403, "PATCH", PATH, answer)

    monkeypatch.setattr(handlers, "apply_children", refuse)
    memo = memo or SimpleNamespace(clock=lambda: datetime(2026, 11, 26, tzinfo=UTC), settings=OperatorSettings(),
                                   controls=Controls(), kube=None)
    patch = kopf.Patch()
    body = kopf.Body({"metadata": {"name": "c", "namespace": "ns", "generation": 1, "uid": "u"}, "spec": SPEC})
    with pytest.raises(kopf.TemporaryError) as raised:
        handlers.reconcile(name="c", namespace="ns", body=body, spec=body.spec, meta=body.meta, status=body.status,
                           patch=patch, memo=memo, logger=logging.getLogger("t"))
    return raised.value, dict(patch)


def test_an_rbac_refusal_is_said_in_status_and_retried_rarely(monkeypatch: pytest.MonkeyPatch) -> None:
    error, patch = reconcile_refused(monkeypatch, RBAC)
    assert error.delay == handlers.FORBIDDEN_RETRY_SECONDS
    assert "check the chart's rbac values" in str(error)
    assert "Forbidden" in str(patch)


def test_an_owner_kind_the_api_server_does_not_know_yet_is_retried_in_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    error, patch = reconcile_refused(monkeypatch, UNKNOWN_KIND)
    assert error.delay is not None and error.delay <= 10
    assert "rbac" not in str(error) and "does not know" in str(error)
    assert "Forbidden" not in str(patch)


class Kube:
    """The StatefulSet reconcile applied before the API server refused a later object."""

    def get(self, *args: Any) -> dict[str, Any]:
        return {"spec": {"replicas": 1}, "status": {"readyReplicas": 0, "replicas": 1}}


class RunningControls(Controls):
    def ensure(self, namespace: str, name: str, model: Any, revive: bool = True) -> Any:
        return SimpleNamespace(desired_workers=lambda: 1, status=lambda: None, workers_available=lambda n: None,
                               take_decisions=lambda: [])


def running_memo() -> SimpleNamespace:
    """One consumer's memo, as kopf hands the same one to its reconcile and to its refresh timer."""
    return SimpleNamespace(clock=lambda: datetime(2026, 11, 26, 0, 0, 5, tzinfo=UTC), settings=OperatorSettings(),
                           controls=RunningControls(), kube=Kube())


def refreshed(memo: Any, status: dict[str, Any], generation: int = 1) -> dict[str, Any]:
    """The status stored after one refresh that read `status`."""
    body = kopf.Body({"metadata": {"name": "c", "namespace": "ns", "generation": generation, "uid": "u"},
                      "spec": SPEC, "status": status})
    patch = kopf.Patch()
    handlers.refresh(name="c", namespace="ns", body=body, spec=body.spec, meta=body.meta, status=body.status,
                     patch=patch, memo=memo, logger=logging.getLogger("t"))
    return {**status, **dict(patch).get("status", {})}


def test_a_refresh_keeps_the_refusal_reconcile_reported_for_this_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    # The StatefulSet is applied before the objects RBAC may refuse (the Spark ones), so the refresh
    # timer finds it and rewrote status from it: Degraded showed for one refresh interval at most.
    _, refused = reconcile_refused(monkeypatch, RBAC)
    memo = running_memo()

    def refresh(generation: int) -> dict[str, Any]:
        return refreshed(memo, refused["status"], generation)

    kept = refresh(1)
    assert kept["phase"] == "Degraded"
    degraded = {c["type"]: c for c in kept["conditions"]}["Degraded"]
    assert degraded["reason"] == "Forbidden" and "check the chart's rbac values" in degraded["message"]
    # A new generation is reconciled afresh: until then, the refusal was of the spec before it.
    assert refresh(2)["phase"] != "Degraded"


def test_a_refresh_that_read_status_before_the_refusal_landed_does_not_erase_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # kopf runs the refresh timer beside reconcile: a refresh that read status before reconcile's
    # refusal was stored patches its older view after it (seen in a suite run: Degraded never showed).
    memo = running_memo()
    stale = refreshed(memo, {})  # read before the refusal, stored after it
    _, refused = reconcile_refused(monkeypatch, RBAC, memo)
    stored = {**refused["status"], **{k: v for k, v in stale.items() if v != refused["status"].get(k)}}
    assert stored["phase"] != "Degraded"  # the race itself: the refusal is overwritten for a moment
    again = refreshed(memo, stored)
    assert again["phase"] == "Degraded"
    degraded = {c["type"]: c for c in again["conditions"]}["Degraded"]
    assert degraded["reason"] == "Forbidden" and "check the chart's rbac values" in degraded["message"]


def test_a_refresh_that_read_the_refusal_before_reconcile_succeeded_does_not_bring_it_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The reverse race: reconcile's retry succeeded (RBAC fixed), but a refresh that read the old
    # refusal stored it again; the next refresh must clear it, not keep it for the generation.
    memo = running_memo()
    _, refused = reconcile_refused(monkeypatch, RBAC, memo)
    monkeypatch.setattr(handlers, "apply_children", lambda *args, **kwargs: Kube().get())
    body = kopf.Body({"metadata": {"name": "c", "namespace": "ns", "generation": 1, "uid": "u"}, "spec": SPEC,
                      "status": refused["status"]})
    handlers.reconcile(name="c", namespace="ns", body=body, spec=body.spec, meta=body.meta, status=body.status,
                       patch=kopf.Patch(), memo=memo, logger=logging.getLogger("t"))
    assert refreshed(memo, refused["status"])["phase"] != "Degraded"
