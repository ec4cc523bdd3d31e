"""Reconcile and the refresh timer, which kopf runs side by side, both write the range controller's
worker count to the StatefulSet. A count reconcile read before a split (1) must not land after the
refresh already wrote the split's (2): the StatefulSet would go 1 -> 2 -> 1 -> 2, and the new
worker's pod be deleted and made again (seen as a pod stopped during `kubectl scale` 1 -> 3 on a
loaded machine)."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import kopf
import pytest

from keyrange.operator import handlers
from keyrange.operator.registry import ControlRegistry
from keyrange.operator.settings import OperatorSettings

SPEC = {"kafka": {"topic": "t", "bootstrapServers": "kafka:9092"}}


class Fleet:
    workers = 1


class Control:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def desired_workers(self) -> int:
        return self.fleet.workers

    def status(self) -> None:
        return None

    def workers_available(self, ready: int) -> None:
        pass

    def take_decisions(self) -> list[Any]:
        return []

    def update_spec(self, spec: Any) -> None:
        pass

    def close(self) -> None:
        pass


class StatefulSet:
    """The StatefulSet's replicas and every write to them, in order."""

    def __init__(self) -> None:
        self.replicas = 1
        self.writes: list[tuple[str, int]] = []

    def get(self, *args: Any) -> dict[str, Any]:
        return {"spec": {"replicas": self.replicas}, "status": {"readyReplicas": self.replicas,
                                                                 "replicas": self.replicas}}

    def patch(self, api_version: str, kind: str, namespace: str, name: str, changes: dict[str, Any]) -> None:
        self.replicas = changes["spec"]["replicas"]
        self.writes.append(("refresh", self.replicas))


def test_a_worker_count_reconcile_read_before_a_split_does_not_land_after_the_refresh_wrote_the_split(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fleet, sts = Fleet(), StatefulSet()
    registry = ControlRegistry(lambda namespace, name, spec: Control(fleet))  # type: ignore[arg-type, return-value]
    applying, go_on = threading.Event(), threading.Event()

    def apply_children(kube: Any, settings: Any, body: Any, model: Any, replicas: int) -> dict[str, Any]:
        applying.set()
        go_on.wait(5)  # reconcile's apply, slow on a loaded API server
        sts.replicas = replicas
        sts.writes.append(("reconcile", replicas))
        return sts.get()

    monkeypatch.setattr(handlers, "apply_children", apply_children)
    memo = SimpleNamespace(clock=lambda: datetime(2026, 11, 29, tzinfo=UTC), settings=OperatorSettings(),
                           controls=registry, kube=sts)
    body = kopf.Body({"metadata": {"name": "c", "namespace": "ns", "generation": 2, "uid": "u"}, "spec": SPEC})
    args = {"name": "c", "namespace": "ns", "body": body, "spec": body.spec, "meta": body.meta,
            "status": body.status, "logger": logging.getLogger("t")}

    reconcile = threading.Thread(target=lambda: handlers.reconcile(patch=kopf.Patch(), memo=memo, **args))
    reconcile.start()
    assert applying.wait(5)
    fleet.workers = 2  # the controller splits while reconcile applies what it read before
    refresh = threading.Thread(target=lambda: handlers.refresh(patch=kopf.Patch(), memo=memo, **args))
    refresh.start()
    refresh.join(0.3)  # a refresh that does not wait for reconcile writes 2 now
    go_on.set()
    reconcile.join(5)
    refresh.join(5)
    registry.close_all()
    assert sts.writes == [("reconcile", 1), ("refresh", 2)]
    assert sts.replicas == 2
