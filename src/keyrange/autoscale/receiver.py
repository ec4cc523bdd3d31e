"""The Alertmanager webhook receiver: `POST /alertmanager/webhook`, bearer-token authenticated.

It runs inside the operator (one receiver for every StreamConsumer it manages, `serve` on kopf's
event loop) and inside `keyrange run` (one consumer, `keyrange.local.monitoring.ReceiverServer`).
Consumers are registered with a `ScaleTarget` (their range controller) and their cooldown, or found
by a resolver; each notification goes through `AlertTracker` (repeats, flapping, conflicts), then
every resulting request is passed to the target, which enforces workers.min/max and its own
cooldown. Every request and its outcome goes to `on_decision` (`keyrange run` keeps them; in the
operator the target itself records status and a Kubernetes Event, see `operator/scalewebhook.py`).

Responses: 200 with a JSON verdict per alert; 401 without the right token; 400 (one line saying why)
for a body that is not an Alertmanager v4 payload, nested too deeply included; 413 for a body over
4 MiB; 500 if a controller raised (Alertmanager retries, and the tracker makes the retry harmless
for the requests that were applied). `GET /healthz` answers `{"status": "ok"}` to anyone, and adds
the consumers it routes only for a request carrying the token.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import json
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from keyrange import metrics
from keyrange.autoscale.tracker import (
    Alert,
    AlertTracker,
    ConsumerRef,
    PayloadError,
    ScaleRequest,
    parse_payload,
)
from keyrange.errors import UserError
from keyrange.ranges.planner import Direction, ScaleOutcome

WEBHOOK_PATH = "/alertmanager/webhook"
TOKEN_ENV = "KEYRANGE_WEBHOOK_TOKEN"
TOKEN_FILE_ENV = "KEYRANGE_WEBHOOK_TOKEN_FILE"
MAX_BODY_BYTES = 4 * 1024 * 1024
"""A larger notification is answered with 413."""
log = logging.getLogger(__name__)


class WebhookTokenError(UserError):
    """No usable bearer token was configured for the receiver."""


class ScaleTarget(Protocol):
    """A consumer's range controller, as the receiver sees it (sync or async);
    `keyrange.ranges.controller.Controller` is one."""

    def request_scale(self, direction: Direction, reason: str) -> ScaleOutcome | Awaitable[ScaleOutcome]:
        """Split (`up`) or merge (`down`) once, within workers.min/max and the cooldown."""
        ...


@dataclass(frozen=True)
class ScaleDecision:
    """One scale request and its outcome: what status, Events and logs record."""

    consumer: ConsumerRef
    direction: Direction
    reason: str
    applied: bool
    detail: str
    at: float
    """Wall-clock time (epoch seconds)."""


DecisionSink = Callable[[ScaleDecision], Awaitable[None] | None]
Resolved = tuple[ScaleTarget, float] | None
TargetResolver = Callable[[ConsumerRef], Resolved | Awaitable[Resolved]]
"""Finds a consumer's target and cooldownSeconds on demand (the operator's live registry);
returns None for a consumer that is not managed here."""


def load_token(token: str | None = None) -> str:
    """The bearer token: `token` if given, else $KEYRANGE_WEBHOOK_TOKEN, else the file named by
    $KEYRANGE_WEBHOOK_TOKEN_FILE (a mounted Secret). Raises WebhookTokenError if none is set."""
    if not token:
        token = os.environ.get(TOKEN_ENV, "")
    if not token and os.environ.get(TOKEN_FILE_ENV):
        path = Path(os.environ[TOKEN_FILE_ENV])
        try:
            token = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise WebhookTokenError(f"cannot read the webhook token file {path}: {exc.strerror}") from None
    if not token:
        raise WebhookTokenError(
            f"the alert webhook needs a bearer token: pass --webhook-token, or set {TOKEN_ENV} "
            f"(or {TOKEN_FILE_ENV} to a file holding it); Alertmanager sends the same one"
        )
    return token


class AlertReceiver:
    """Turns authenticated Alertmanager notifications into scale requests to registered consumers."""

    def __init__(self, token: str, tracker: AlertTracker | None = None,
                 on_decision: DecisionSink | None = None, resolver: TargetResolver | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not token:
            raise WebhookTokenError("the alert webhook token must not be empty")
        self._token = f"Bearer {token}".encode()
        self._tracker = tracker or AlertTracker()
        self._on_decision = on_decision
        self._resolver = resolver
        self._clock = clock
        self._targets: dict[ConsumerRef, tuple[ScaleTarget, float]] = {}
        self._lock = asyncio.Lock()
        self.verdicts: Counter[str] = Counter()
        """How many alerts got each outcome (`scale`, `repeat`, `resolved`, ...) since start."""

    def register(self, consumer: ConsumerRef, target: ScaleTarget, cooldown_seconds: float) -> None:
        """Route alerts about `consumer` to `target` (again with new settings when its spec changes)."""
        self._targets[consumer] = (target, cooldown_seconds)

    def unregister(self, consumer: ConsumerRef) -> None:
        """Stop routing alerts about `consumer` (it was deleted); later alerts are `unknown-consumer`."""
        self._targets.pop(consumer, None)

    def app(self) -> web.Application:
        """The aiohttp application: POST the webhook path, GET /healthz."""
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(WEBHOOK_PATH, self._handle)
        app.router.add_get("/healthz", self._healthz)
        return app

    def _authorized(self, request: web.Request) -> bool:
        return hmac.compare_digest(request.headers.get("Authorization", "").encode(), self._token)

    async def _healthz(self, request: web.Request) -> web.Response:
        # Probes send no token; which consumers exist is for the token's holder only.
        body: dict[str, Any] = {"status": "ok"}
        if self._authorized(request):
            body["consumers"] = sorted(str(c) for c in self._targets)
        return web.json_response(body)

    async def _handle(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "missing or wrong bearer token"}, status=401,
                                     headers={"WWW-Authenticate": 'Bearer realm="keyrange"'})
        try:
            alerts = _parse_body(await request.read())
        except (ValueError, PayloadError) as exc:
            return web.json_response({"error": f"not an Alertmanager webhook payload: {exc}"}, status=400)
        async with self._lock:
            targets = {ref: await self._resolve(ref) for ref in {a.consumer for a in alerts} if ref}
            now = self._clock()
            plan = self._tracker.plan(alerts, now, lambda ref: _cooldown(targets.get(ref)))
            decisions, failed = [], False
            for req in plan.requests:
                decision = await self._apply(req, targets[req.consumer], now)
                failed = failed or decision is None
                if decision is not None:
                    decisions.append(decision)
        for verdict in plan.verdicts:
            self.verdicts[verdict.outcome] += 1
            metrics.ALERT_VERDICTS.labels(verdict.outcome).inc()
            level = logging.INFO if verdict.outcome in ("unknown-consumer", "flapping") else logging.DEBUG
            log.log(level, "alert %s for %s: %s (%s)", verdict.alert, verdict.consumer or "-",
                    verdict.outcome, verdict.detail)
        body = {
            "decisions": [{**asdict(d), "consumer": str(d.consumer)} for d in decisions],
            "verdicts": [{**asdict(v), "consumer": str(v.consumer) if v.consumer else None}
                         for v in plan.verdicts],
        }
        return web.json_response(body, status=500 if failed else 200)

    async def _resolve(self, ref: ConsumerRef) -> Resolved:
        if ref in self._targets:
            return self._targets[ref]
        if self._resolver is None:
            return None
        try:
            found = self._resolver(ref)
            return await found if inspect.isawaitable(found) else found
        except Exception:
            log.exception("looking up StreamConsumer %s failed; treating it as unknown", ref)
            return None

    async def _apply(self, req: ScaleRequest, resolved: Resolved, now: float) -> ScaleDecision | None:
        assert resolved is not None  # the tracker only requests scaling for resolved consumers
        target, cooldown = resolved
        try:
            result = target.request_scale(req.direction, req.reason)
            outcome = await result if inspect.isawaitable(result) else result
        except Exception:
            # A broken controller must not take the receiver (and every other consumer) down.
            log.exception("scale %s of %s failed", req.direction, req.consumer)
            return None
        if outcome.applied:
            self._tracker.applied(req, now, cooldown)
        metrics.SCALE_REQUESTS.labels(req.consumer.namespace, req.consumer.name, req.direction,
                                      str(outcome.applied).lower()).inc()
        decision = ScaleDecision(req.consumer, req.direction, req.reason, outcome.applied, outcome.detail,
                                 time.time())
        log.info("scale %s of %s (%s): %s - %s", req.direction, req.consumer, req.reason,
                 "applied" if outcome.applied else "not applied", outcome.detail)
        if self._on_decision is not None:
            try:
                recorded = self._on_decision(decision)
                if inspect.isawaitable(recorded):
                    await recorded
            except Exception:
                log.exception("recording the decision for %s failed", req.consumer)
        return decision


def _parse_body(raw: bytes) -> list[Alert]:
    """The alerts of a request body; PayloadError (one line) for anything that is not a payload."""
    try:
        return parse_payload(json.loads(raw))
    except RecursionError:
        # The body is at most client_max_size, but the decoder recurses once per nesting level.
        raise PayloadError("the JSON is nested too deeply") from None


def _cooldown(resolved: Resolved) -> float | None:
    return resolved[1] if resolved else None


async def serve(receiver: AlertReceiver, listener: socket.socket) -> web.AppRunner:
    """Serve the receiver on a listening socket in the running event loop (the operator's); `await
    runner.cleanup()` stops it and leaves `listener` open (it serves a copy) for whoever serves next."""
    runner = web.AppRunner(receiver.app(), access_log=None)
    await runner.setup()
    await web.SockSite(runner, listener.dup()).start()
    return runner


def describe(decision: ScaleDecision) -> dict[str, Any]:
    """A decision as the StreamConsumer status records it (`status.lastScaleDecision`)."""
    return {
        "direction": decision.direction,
        "reason": decision.reason,
        "applied": decision.applied,
        "detail": decision.detail,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(decision.at)),
    }
