"""The alert webhook inside the operator: Alertmanager -> a consumer's range control -> status + Event.

`keyrange operator --webhook-port P` (or `--webhook-fd FD`) serves
`keyrange.autoscale.receiver.AlertReceiver` beside kopf, in kopf's event loop. Consumers are looked
up per notification in the operator's live registry (`memo.controls`), so a StreamConsumer created
a second ago is scalable and a deleted one is an `unknown-consumer`; its cooldown comes from its
current spec. Every request that reaches a range control is recorded with `record_scaling_decision`:
`status.lastScaling` and a Kubernetes Event (`Rescaled` or `RescaleRefused`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import replace
from typing import Any

from keyrange.autoscale.receiver import WEBHOOK_PATH, AlertReceiver, Resolved, serve
from keyrange.autoscale.tracker import AlertTracker, ConsumerRef
from keyrange.operator.decisions import record_scaling_decision
from keyrange.operator.rangecontrol import RangeControl
from keyrange.ranges.planner import Direction, ScaleOutcome
from keyrange.spec import API_VERSION, KIND, parse_spec

log = logging.getLogger(__name__)


class RangeControlTarget:
    """A consumer's RangeControl as a webhook ScaleTarget that records each decision."""

    def __init__(self, control: RangeControl, memo: Any, consumer: ConsumerRef) -> None:
        self._control, self._memo, self._consumer = control, memo, consumer

    async def request_scale(self, direction: Direction, reason: str) -> ScaleOutcome:
        """Ask the range control (in a thread: it may block on Kafka), then record the outcome."""
        outcome = await asyncio.to_thread(self._control.request_scale, direction, reason)
        ref = self._consumer
        await asyncio.to_thread(record_scaling_decision, self._memo.kube, ref.namespace, ref.name, outcome,
                                reason, self._memo.clock())
        detail = outcome.detail or f"{outcome.from_workers} -> {outcome.to_workers} workers"
        return replace(outcome, detail=detail)


def operator_resolver(memo: Any) -> Any:
    """A TargetResolver over the operator's registry of range controls and the API's specs."""

    async def resolve(ref: ConsumerRef) -> Resolved:
        control = memo.controls.get(ref.namespace, ref.name)
        if control is None:
            return None
        body = await asyncio.to_thread(memo.kube.get, API_VERSION, KIND, ref.namespace, ref.name)
        if body is None:
            return None
        spec = parse_spec(dict(body.get("spec") or {}), ref.name)
        return RangeControlTarget(control, memo, ref), spec.scaling.cooldown_seconds

    return resolve


def operator_receiver(memo: Any, token: str, tracker: AlertTracker | None = None) -> AlertReceiver:
    """The receiver the operator serves (exposed for tests)."""
    return AlertReceiver(token, tracker=tracker, resolver=operator_resolver(memo))


async def serve_alert_webhook(memo: Any, listener: socket.socket, token: str) -> None:
    """Serve the receiver on a listening socket until cancelled (one of `keyrange operator`'s side
    services)."""
    runner = await serve(operator_receiver(memo, token), listener)
    host, port = listener.getsockname()[:2]
    log.info("alert webhook listening on http://%s:%d%s", host, port, WEBHOOK_PATH)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
