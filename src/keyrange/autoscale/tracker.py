"""Alertmanager notifications -> scale requests (pure; the receiver is `keyrange.autoscale.receiver`).

Alertmanager re-sends an alert while it fires (on every change in its group and each
`repeat_interval`), sends it again after a resolution if it comes back, and can retry a
notification. Rescaling once per notification would therefore split or merge again and again.
`AlertTracker` turns notifications into at most one request per consumer and direction, and:

- repeats: an alert is identified by its fingerprint and `startsAt` (one firing episode); once a
  request for it was applied, the same episode asks again only after the consumer's cooldown
  (still firing then means one step was not enough);
- flapping: an alert that started `flap_threshold` episodes within `flap_window_seconds` is
  ignored until it has stayed quiet for a window; and a merge is refused while the consumer had a
  lag-high alert firing within its cooldown, so split/merge never alternate;
- conflicts: if one notification carries both, scale up wins (never merge a consumer that is hot);
- unknown consumers and alerts without keyrange labels are answered with a verdict, never an error.

The controller still owns the limits (workers.min/max) and its own cooldown; this is the guard in
front of it. Time is a float of seconds passed in by the caller.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from keyrange.autoscale.rules import CONSUMER_LABEL, NAMESPACE_LABEL, SCALE_LABEL
from keyrange.ranges.planner import Direction

DEFAULT_NAMESPACE = "default"
"""The namespace of an alert without a namespace label (local `keyrange run` rules set one)."""


class PayloadError(ValueError):
    """The request body is not an Alertmanager webhook (version 4) payload."""


@dataclass(frozen=True, order=True)
class ConsumerRef:
    """Which StreamConsumer: namespace and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Alert:
    """One alert of a notification."""

    name: str
    status: Literal["firing", "resolved"]
    labels: Mapping[str, str]
    fingerprint: str
    starts_at: str
    """Alertmanager's `startsAt`: the same for every notification of one firing episode."""

    @property
    def consumer(self) -> ConsumerRef | None:
        """The StreamConsumer the alert is about, from its `streamconsumer`/`namespace` labels."""
        name = self.labels.get(CONSUMER_LABEL)
        if not name:
            return None
        return ConsumerRef(self.labels.get(NAMESPACE_LABEL) or DEFAULT_NAMESPACE, name)

    @property
    def direction(self) -> Direction | None:
        """`up`/`down` for scaling alerts (the `keyrange_scale` label), None for the others."""
        value = self.labels.get(SCALE_LABEL)
        return value if value in ("up", "down") else None  # type: ignore[return-value]


def _fingerprint(labels: Mapping[str, str]) -> str:
    # Alertmanager >= 0.19 sends one; older senders and hand-written payloads may not.
    text = "\0".join(f"{k}\0{v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_payload(doc: Any) -> list[Alert]:
    """The alerts of an Alertmanager webhook payload (version 4); PayloadError names what is wrong."""
    if not isinstance(doc, dict):
        raise PayloadError(f"expected a JSON object, got {type(doc).__name__}")
    if str(doc.get("version", "4")) != "4":
        raise PayloadError(f"unsupported webhook payload version {doc.get('version')!r}; expected '4'")
    raw = doc.get("alerts")
    if not isinstance(raw, list):
        raise PayloadError("the payload has no `alerts` list")
    alerts = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("labels"), dict):
            raise PayloadError(f"alerts[{i}] has no `labels` object")
        status = item.get("status", doc.get("status"))
        if status not in ("firing", "resolved"):
            raise PayloadError(f"alerts[{i}].status is {status!r}; expected 'firing' or 'resolved'")
        labels = {str(k): str(v) for k, v in item["labels"].items()}
        alerts.append(Alert(
            name=labels.get("alertname", ""),
            status=status,
            labels=labels,
            fingerprint=str(item.get("fingerprint") or _fingerprint(labels)),
            starts_at=str(item.get("startsAt", "")),
        ))
    return alerts


Outcome = Literal["scale", "repeat", "flapping", "recently-hot", "stale", "resolved", "noted",
                  "unknown-consumer"]


@dataclass(frozen=True)
class Verdict:
    """What the tracker made of one alert, for the response body, logs, status and Events."""

    alert: str
    fingerprint: str
    consumer: ConsumerRef | None
    outcome: Outcome
    detail: str


@dataclass(frozen=True)
class ScaleRequest:
    """Ask one consumer's controller to split (`up`) or merge (`down`) once."""

    consumer: ConsumerRef
    direction: Direction
    reason: str
    """Human line naming the alerts, for status, Events and logs."""
    episodes: tuple[tuple[str, str], ...]
    """(fingerprint, startsAt) of the alerts behind it; `AlertTracker.applied` needs them."""


@dataclass(frozen=True)
class Plan:
    """A notification's scale requests and a verdict for every alert in it."""

    requests: list[ScaleRequest]
    verdicts: list[Verdict]


@dataclass
class _Episodes:
    starts: deque[float] = field(default_factory=deque)
    """When each firing episode of this fingerprint was first seen (within the flap window)."""
    current: str | None = None
    """startsAt of the episode now firing, None when resolved."""
    resolved: deque[str] = field(default_factory=lambda: deque(maxlen=16))
    """startsAt of episodes already resolved (a late retry of their firing is stale)."""
    applied_at: float | None = None
    """When a request for the current episode was last applied."""
    last_seen: float = 0.0


class AlertTracker:
    """Remembers alert episodes across notifications and decides which ones rescale."""

    def __init__(self, flap_window_seconds: float = 300.0, flap_threshold: int = 3) -> None:
        if flap_window_seconds <= 0 or flap_threshold < 2:
            raise ValueError("flap_window_seconds must be > 0 and flap_threshold >= 2")
        self.flap_window_seconds = flap_window_seconds
        """Episodes of one alert are counted over this many seconds."""
        self.flap_threshold = flap_threshold
        """This many episodes within the window make an alert flapping."""
        self._alerts: dict[str, _Episodes] = {}
        self._hot_until: dict[ConsumerRef, float] = {}

    def plan(self, alerts: Iterable[Alert], now: float,
             cooldown_for: Callable[[ConsumerRef], float | None]) -> Plan:
        """Verdicts and requests for one notification; `cooldown_for` returns a consumer's
        cooldownSeconds, or None if this receiver does not manage that consumer."""
        self._forget(now)
        verdicts: list[Verdict] = []
        wanted: dict[tuple[ConsumerRef, Direction], list[int]] = {}
        listed = list(alerts)
        for i, alert in enumerate(listed):
            ref = alert.consumer
            cooldown = cooldown_for(ref) if ref else None
            verdicts.append(self._judge(alert, ref, cooldown, now))
            if verdicts[i].outcome == "scale" and ref and alert.direction:
                wanted.setdefault((ref, alert.direction), []).append(i)
        requests = []
        for (ref, direction), indices in sorted(wanted.items()):
            group = [listed[i] for i in indices]
            if direction == "down" and self._hot_until.get(ref, -1.0) > now:
                for i in indices:
                    verdicts[i] = Verdict(listed[i].name, listed[i].fingerprint, ref, "recently-hot",
                                          "not merging: a lag-high alert of this consumer fired "
                                          "within its cooldown")
                continue
            names = ", ".join(sorted({a.name + _worker(a) for a in group}))
            requests.append(ScaleRequest(ref, direction, f"alert {names} firing",
                                         tuple((a.fingerprint, a.starts_at) for a in group)))
        return Plan(requests, verdicts)

    def applied(self, request: ScaleRequest, now: float, cooldown_seconds: float) -> None:
        """Record that the controller applied `request`: its episodes are quiet for a cooldown,
        and a lag-high request keeps merges of that consumer off for one too."""
        for fingerprint, starts_at in request.episodes:
            state = self._alerts.get(fingerprint)
            if state is not None and state.current == starts_at:
                state.applied_at = now
        if request.direction == "up":
            self._hot_until[request.consumer] = now + cooldown_seconds

    def _judge(self, alert: Alert, ref: ConsumerRef | None, cooldown: float | None, now: float) -> Verdict:
        def verdict(outcome: Outcome, detail: str) -> Verdict:
            return Verdict(alert.name, alert.fingerprint, ref, outcome, detail)

        if ref is None:
            return verdict("noted", f"no `{CONSUMER_LABEL}` label: not a keyrange consumer alert")
        if cooldown is None:
            return verdict("unknown-consumer", f"no StreamConsumer {ref} is managed here")
        state = self._alerts.setdefault(alert.fingerprint, _Episodes())
        state.last_seen = now
        if alert.status == "resolved":
            if state.current == alert.starts_at:
                state.current, state.applied_at = None, None
            state.resolved.append(alert.starts_at)
            return verdict("resolved", "resolved")
        if alert.starts_at in state.resolved:
            return verdict("stale", "a late notification of an episode that already resolved")
        if alert.direction is None:
            return verdict("noted", "not a scaling alert")
        if state.current != alert.starts_at:
            state.current, state.applied_at = alert.starts_at, None
            state.starts.append(now)
        if alert.direction == "up":
            # Any firing lag-high alert, even a repeated or flapping one, keeps merges off.
            self._hot_until[ref] = max(self._hot_until.get(ref, -1.0), now + cooldown)
        if len(state.starts) >= self.flap_threshold:
            return verdict("flapping", f"started {len(state.starts)} times within "
                                       f"{self.flap_window_seconds:g} s; waiting for it to settle")
        if state.applied_at is not None and now - state.applied_at < cooldown:
            return verdict("repeat", f"already acted on this episode {now - state.applied_at:.0f} s ago "
                                     f"(cooldown {cooldown:g} s)")
        return verdict("scale", f"scale {alert.direction}")

    def _forget(self, now: float) -> None:
        horizon = now - self.flap_window_seconds
        for fingerprint, state in list(self._alerts.items()):
            while state.starts and state.starts[0] < horizon:
                state.starts.popleft()
            # A firing episode Alertmanager stopped sending (silenced, rule deleted) is forgotten too,
            # after a longer quiet: Alertmanager re-sends firing alerts at least every repeat_interval.
            quiet_since = horizon if state.current is None else horizon - self.flap_window_seconds
            if state.last_seen < quiet_since:
                del self._alerts[fingerprint]
        for ref, until in list(self._hot_until.items()):
            if until < now:
                del self._hot_until[ref]


def _worker(alert: Alert) -> str:
    worker = alert.labels.get("worker")
    return f"(worker {worker})" if worker else ""
