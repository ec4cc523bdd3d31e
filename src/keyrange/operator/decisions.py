"""Recording a scaling decision where users look: status.lastScaling and a Kubernetes Event.

Called by the alert webhook (and by anything else that asks a range control to rescale) after
`RangeControl.request_scale`, and by the refresh timer for the decisions the range controller's
planner took by itself (lag, cooldown, workers.min/max, `kubectl scale`), so
`kubectl describe streamconsumer` tells what happened and why.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import kopf

from keyrange.operator.kube import Kube
from keyrange.operator.rangecontrol import PlannedRescale
from keyrange.operator.status import scaling_record
from keyrange.ranges.planner import ScaleOutcome
from keyrange.spec import API_VERSION, KIND

SCALED_REASON = "Rescaled"
REFUSED_REASON = "RescaleRefused"
PLANNER_REASON = "Planner"
"""status.lastScaling.reason of a decision the planner took by itself."""


def record_scaling_decision(kube: Kube, namespace: str, name: str, outcome: ScaleOutcome, reason: str,
                            now: datetime) -> None:
    """Write status.lastScaling and post an Event on the StreamConsumer `namespace/name`. A request
    refused because a rescale is under way is an Event only: written to status, it would hide the
    rescale it waits for (the next alert notification can come within a second of a split)."""
    consumer = kube.get(API_VERSION, KIND, namespace, name)
    if consumer is None:
        return  # deleted meanwhile: nothing to record on
    verb = "scaling" if outcome.applied else "not scaling"
    message = f"{verb} from {outcome.from_workers} to {outcome.to_workers} workers ({reason})"
    if outcome.detail:
        message += f": {outcome.detail}"
    if not outcome.in_progress:
        record = scaling_record(outcome.from_workers, outcome.to_workers, reason, message, now)
        kube.patch(API_VERSION, KIND, namespace, name, {"status": {"lastScaling": record}}, subresource="status")
    kube.event(consumer, SCALED_REASON if outcome.applied else REFUSED_REASON, message, now,
               "Normal" if outcome.applied else "Warning")


def record_planner_decision(kube: Kube, consumer: dict[str, Any], patch: kopf.Patch, decision: PlannedRescale) -> None:
    """Put a planner decision in this round's status patch (lastScaling) and post it as an Event."""
    decided = datetime.fromtimestamp(decision.decided_ms / 1000, UTC)
    message = (f"scaling from {decision.from_workers} to {decision.to_workers} workers (planner): "
               f"{decision.reason}")
    patch.status["lastScaling"] = scaling_record(decision.from_workers, decision.to_workers, PLANNER_REASON,
                                                 message, decided)
    kube.event(consumer, SCALED_REASON, message, decided)
