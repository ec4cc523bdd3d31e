"""Alertmanager webhook notifications (version 4) as tests build them: one alert, and a payload
carrying several. Used by the autoscale tracker's, the webhooks' and the operator's tests."""

from __future__ import annotations

from typing import Any


def alert(name: str = "KeyrangeLagHighRecords", status: str = "firing", consumer: str = "payments",
          namespace: str = "shop", scale: str | None = "up", worker: str | None = "0",
          starts_at: str = "2026-11-21T23:00:00Z", fingerprint: str | None = None) -> dict[str, Any]:
    """One alert as Alertmanager puts it in a notification."""
    labels = {"alertname": name, "streamconsumer": consumer, "namespace": namespace, "severity": "warning"}
    if scale:
        labels["keyrange_scale"] = scale
    if worker:
        labels["worker"] = worker
    return {"status": status, "labels": labels, "annotations": {"summary": "s"},
            "startsAt": starts_at, "endsAt": "0001-01-01T00:00:00Z",
            "fingerprint": fingerprint or f"fp-{consumer}-{name}-{worker}"}


def payload(*alerts: dict[str, Any]) -> dict[str, Any]:
    """A webhook notification carrying `alerts`."""
    firing = any(a["status"] == "firing" for a in alerts)
    return {"version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0, "receiver": "keyrange",
            "status": "firing" if firing else "resolved", "groupLabels": {}, "commonLabels": {},
            "commonAnnotations": {}, "externalURL": "http://am", "alerts": list(alerts)}
