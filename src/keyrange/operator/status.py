"""Pure rendering of a StreamConsumer's `status`: phase, range map, lag and conditions.

The range map is shown in slots (`ranges[].slots`, the control topic's numbers) and as people read
it, in partitions and hash ranges of partitions (`ranges[].partitions`, and `rangeMap`, e.g.
`w0=0:0-1/4 w1=0:2/4-1:1/4`, which `kubectl get` prints in its Ranges column).

Conditions follow the Kubernetes convention (type, status, reason, message, lastTransitionTime,
observedGeneration); a condition keeps its lastTransitionTime while its status does not change,
so the clock is injected (`now`) and the previous conditions are passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from keyrange.operator.rangecontrol import HandoffSummary, RangeStatus


@dataclass(frozen=True)
class Observed:
    """What the operator saw this round."""

    generation: int
    """metadata.generation of the StreamConsumer."""
    desired_workers: int
    """Replicas the StatefulSet should have."""
    ready_workers: int
    """Ready pods of the StatefulSet."""
    selector: str
    """The worker pods' label selector."""
    error: str | None = None
    """Why the consumer cannot run (invalid spec, failed apply), else None."""
    error_reason: str = "InvalidSpec"
    """CamelCase reason for `error`."""
    suspended: bool = False
    """spec.suspend is true: the workers are scaled to zero."""
    pods: int = 0
    """Worker pods that still exist (the StatefulSet's status.replicas); a suspension waits for them."""
    deduplication: bool | None = None
    """False with spec.input.uuid none (nothing is deduplicated); None when the spec was not read."""


def _timestamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, true: bool, reason: str, message: str, generation: int, now: datetime,
              previous: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """One condition; lastTransitionTime moves only when the status flips."""
    status = "True" if true else "False"
    since = _timestamp(now)
    for old in previous:
        if old.get("type") == kind and old.get("status") == status and old.get("lastTransitionTime"):
            since = str(old["lastTransitionTime"])
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since, "observedGeneration": generation}


APPLY_REFUSALS = ("Forbidden", "InvalidSpec")
"""Reasons of the Degraded condition that reconcile writes when the API server refused an object
(RBAC, or pod fields it checks itself): only reconcile's next try can clear them."""


def apply_refusal(status: Mapping[str, Any] | None, generation: int) -> tuple[str, str] | None:
    """(message, reason) of the refusal reconcile reported in `status` for `generation`, if any."""
    for c in (status or {}).get("conditions") or []:
        if (c.get("type") == "Degraded" and c.get("status") == "True" and c.get("reason") in APPLY_REFUSALS
                and c.get("observedGeneration") == generation):
            return str(c.get("message") or ""), str(c["reason"])
    return None


def _phase_and_reasons(seen: Observed, ranges: RangeStatus | None) -> tuple[str, str, str, str]:
    if seen.error is not None:
        return "Degraded", seen.error_reason, "Unchanged", seen.error
    if seen.suspended:
        if seen.pods:
            return ("Scaling", "Suspended", "Suspending",
                    f"spec.suspend: {seen.pods} workers are releasing their ranges and stopping")
        return "Suspended", "Suspended", "Stable", "spec.suspend is true: no workers run; set it to false to resume"
    if ranges is not None and ranges.problem:
        return "Degraded", "ControllerUnavailable", "Unchanged", ranges.problem
    if ranges is not None and ranges.epoch == 0:
        return "Pending", "ControllerStarting", "Unchanged", "the range controller has not published a map yet"
    handoff = ranges is not None and ranges.handoff_in_progress
    if seen.ready_workers < seen.desired_workers:
        starting = f"{seen.ready_workers} of {seen.desired_workers} workers ready"
        return ("Scaling" if seen.ready_workers else "Pending"), "WorkersStarting", "ScalingUp", starting
    if ranges is not None and ranges.workers > seen.desired_workers:
        return "Scaling", "AllWorkersReady", "ScalingDown", "a merge is releasing ranges before pods stop"
    if handoff:
        return "Scaling", "AllWorkersReady", "Handoff", "ranges are moving between workers"
    return "Running", "AllWorkersReady", "Stable", f"{seen.ready_workers} workers ready"


def render_status(seen: Observed, ranges: RangeStatus | None, now: datetime,
                  previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The whole status block for one round of reconciliation."""
    previous_conditions = list((previous or {}).get("conditions") or [])
    phase, ready_reason, scaling_reason, message = _phase_and_reasons(seen, ranges)
    degraded = phase == "Degraded"
    g = seen.generation
    conditions = [
        condition("Ready", phase == "Running", ready_reason,
                  message if phase != "Running" else "all workers ready and the range map is settled",
                  g, now, previous_conditions),
        condition("Scaling", phase == "Scaling", scaling_reason,
                  message if phase == "Scaling" else "no rescale in progress", g, now, previous_conditions),
        condition("Degraded", degraded, ready_reason if degraded else "AsExpected",
                  message if degraded else "", g, now, previous_conditions),
    ]
    status: dict[str, Any] = {
        "phase": phase,
        "observedGeneration": g,
        "selector": seen.selector,
        "readyWorkers": seen.ready_workers,
        "conditions": conditions,
    }
    if seen.deduplication is not None:
        status["deduplication"] = "on" if seen.deduplication else "off"
    if seen.suspended:
        # The range map stays in status: it is what the workers resume with.
        status.update({"workers": 0, "lag": None})
    elif ranges is not None and not ranges.problem:
        status.update({
            "epoch": ranges.epoch,
            "workers": ranges.workers,
            "rangeCount": len(ranges.ranges),
            "ranges": _ranges(ranges),
        })
        if ranges.partition_ranges:
            status["rangeMap"] = " ".join(f"w{w}={text}" for w, text in ranges.partition_ranges)
        lag: dict[str, Any] = {}
        if ranges.lag_records is not None:
            lag["records"] = ranges.lag_records
        if ranges.lag_seconds is not None:
            lag["seconds"] = ranges.lag_seconds
        if lag:
            status["lag"] = lag
        if ranges.last_handoff is not None:
            status["lastHandoff"] = handoff_record(ranges.last_handoff)
    return status


def _ranges(ranges: RangeStatus) -> list[dict[str, Any]]:
    """status.ranges: each worker's slots, and (when known) the partitions and hash ranges they are."""
    shown = dict(ranges.partition_ranges)
    return [{"worker": w, "slots": s, **({"partitions": shown[w]} if w in shown else {})} for w, s in ranges.ranges]


def handoff_record(handoff: HandoffSummary) -> dict[str, Any]:
    """status.lastHandoff: the newest handoff and the pause its moved slots saw."""
    at = datetime.fromtimestamp(handoff.at_ms / 1000, UTC)
    return {"epoch": handoff.epoch, "pauseSeconds": round(handoff.pause_seconds, 3), "worker": handoff.worker,
            "time": _timestamp(at)}


def scaling_record(from_workers: int, to_workers: int, reason: str, message: str,
                   now: datetime) -> dict[str, Any]:
    """status.lastScaling for one scaling decision (also sent as a Kubernetes Event)."""
    return {"time": _timestamp(now), "fromWorkers": from_workers, "toWorkers": to_workers,
            "reason": reason, "message": message}


def changed_fields(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> dict[str, Any]:
    """The top-level status fields that differ, so an unchanged round patches nothing."""
    old = old or {}
    return {k: v for k, v in new.items() if old.get(k) != v}
