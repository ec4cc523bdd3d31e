"""Prometheus alerting rules for one StreamConsumer, rendered from its spec (pure).

The operator applies the result as a PrometheusRule (when that CRD exists) and `keyrange run`
writes it as a plain rule file; both come from `render_rule_groups`. Thresholds are the spec's
`scaling` block, so changing the StreamConsumer changes its alerts.

Every alert carries the `streamconsumer` and `namespace` labels the webhook receiver
(`keyrange.autoscale.receiver`) uses to find the consumer, and the scaling alerts carry
`keyrange_scale: up|down`, the only label the receiver acts on: the alert names are for humans.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from keyrange import __version__
from keyrange.spec import StreamConsumerSpec

RUNBOOK = f"https://github.com/keyrange/keyrange/blob/v{__version__}/docs/autoscaling.md"
"""The alerts' runbook: docs/autoscaling.md of this release in the repository (each alert has a
heading there, which is its anchor). Absolute, since Alertmanager and its receivers (Slack, a
pager) show the link far from any checkout."""
SCALE_LABEL = "keyrange_scale"
"""Label on scaling alerts: `up` (split a range) or `down` (merge two ranges)."""
CONSUMER_LABEL = "streamconsumer"
NAMESPACE_LABEL = "namespace"

ALERT_LAG_HIGH_RECORDS = "KeyrangeLagHighRecords"
ALERT_LAG_HIGH_SECONDS = "KeyrangeLagHighSeconds"
ALERT_LAG_LOW = "KeyrangeLagLow"
ALERT_WORKER_DOWN = "KeyrangeWorkerDown"
ALERT_DEAD_LETTERS = "KeyrangeDeadLettersRising"


@dataclass(frozen=True)
class RuleOptions:
    """How the rules are evaluated, beyond the spec's thresholds."""

    lag_high_for_seconds: float = 2.0
    """How long lag must stay high before the split alert fires: short, since the controller's
    cooldown already damps rescales (a handoff's own lag falls inside it), and the scale reaction
    goal is 5 s end to end (docs/autoscaling.md "How fast")."""
    worker_down_for_seconds: float = 30.0
    """How long a worker target may be down before alerting (a restart takes a few seconds)."""
    dead_letters_window_seconds: float = 300.0
    """Window over which any new dead letter makes the dead-letters alert fire."""
    evaluation_interval_seconds: float | None = None
    """Rule-group evaluation interval; None keeps Prometheus's global one."""
    runbook_url: str = RUNBOOK
    """Where each alert's runbook lives (an anchor per alert is appended); point it at wherever
    your cluster's users read keyrange's docs (an absolute URL)."""
    match_namespace: bool = True
    """Select series by their `namespace` label too (in a cluster, the scrape adds it);
    off for local scraping, where series have no namespace label."""

    def __post_init__(self) -> None:
        for field in ("lag_high_for_seconds", "worker_down_for_seconds", "dead_letters_window_seconds"):
            if getattr(self, field) < 0:
                raise ValueError(f"RuleOptions.{field} must be >= 0, got {getattr(self, field)}")
        if not self.runbook_url.startswith(("https://", "http://")):
            raise ValueError(f"RuleOptions.runbook_url must be an absolute http(s) URL, got {self.runbook_url!r}")


def duration(seconds: float) -> str:
    """A Prometheus duration string (`90s`, `1500ms`) for a number of seconds."""
    if seconds < 0:
        raise ValueError(f"a duration must be >= 0, got {seconds}")
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def _quote(value: str) -> str:
    """A PromQL label-matcher string literal (label values here are DNS names, but be safe)."""
    return '"' + re.sub(r'(["\\])', r"\\\1", value) + '"'


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render_rule_groups(name: str, namespace: str, spec: StreamConsumerSpec,
                       options: RuleOptions | None = None) -> dict[str, Any]:
    """The rule file (`{"groups": [...]}`) with every keyrange alert for one StreamConsumer."""
    opts = options or RuleOptions()
    matchers = f"consumer={_quote(name)}"
    if opts.match_namespace:
        matchers += f", namespace={_quote(namespace)}"
    scaling = spec.scaling
    identity = {CONSUMER_LABEL: name, NAMESPACE_LABEL: namespace}
    workers = f"count(count by (worker) (keyrange_consumer_lag{{{matchers}}}))"
    where = f"StreamConsumer {namespace}/{name}"

    def rule(alert: str, expr: str, for_seconds: float, severity: str, summary: str,
             description: str, scale: str | None = None) -> dict[str, Any]:
        labels = {**identity, "severity": severity}
        if scale:
            labels[SCALE_LABEL] = scale
        return {
            "alert": alert,
            "expr": expr,
            "for": duration(for_seconds),
            "labels": labels,
            "annotations": {
                "summary": summary,
                "description": description,
                "runbook_url": f"{opts.runbook_url}#{alert.lower()}",
            },
        }

    rules = [
        rule(
            ALERT_LAG_HIGH_RECORDS,
            f"sum by (worker) (keyrange_consumer_lag{{{matchers}}}) > {scaling.lag_high_records}",
            opts.lag_high_for_seconds, "warning",
            f"{where}: worker {{{{ $labels.worker }}}} is {{{{ $value }}}} records behind",
            f"The range of worker {{{{ $labels.worker }}}} has more than {scaling.lag_high_records} "
            "unconsumed records (scaling.lagHighRecords). keyrange splits the hottest range over one "
            f"more worker, up to workers.max ({spec.workers.max}), at most once per cooldown.",
            scale="up",
        ),
        rule(
            ALERT_LAG_HIGH_SECONDS,
            f"max by (worker) (keyrange_consumer_lag_seconds{{{matchers}}}) > "
            f"{_number(scaling.lag_high_seconds)}",
            opts.lag_high_for_seconds, "warning",
            f"{where}: worker {{{{ $labels.worker }}}}'s oldest unfinished event is "
            "{{ $value | humanizeDuration }} old",
            f"An event in the range of worker {{{{ $labels.worker }}}} has waited more than "
            f"{_number(scaling.lag_high_seconds)} s (scaling.lagHighSeconds). keyrange splits the "
            f"range over one more worker, up to workers.max ({spec.workers.max}).",
            scale="up",
        ),
        rule(
            ALERT_LAG_LOW,
            f"(max(sum by (worker) (keyrange_consumer_lag{{{matchers}}})) < {scaling.lag_low_records}) "
            f"and on() ({workers} > {spec.workers.min})",
            scaling.cooldown_seconds, "info",
            f"{where}: every range is below {scaling.lag_low_records} records of lag",
            f"Every range has stayed below {scaling.lag_low_records} records of lag "
            f"(scaling.lagLowRecords) for {_number(scaling.cooldown_seconds)} s "
            f"(scaling.cooldownSeconds) with more than workers.min ({spec.workers.min}) workers. "
            "keyrange merges the coldest adjacent pair of ranges.",
            scale="down",
        ),
        rule(
            ALERT_DEAD_LETTERS,
            f"sum(increase(keyrange_dead_letters_total{{{matchers}}}"
            f"[{duration(opts.dead_letters_window_seconds)}])) > 0",
            0.0, "warning",
            f"{where}: {{{{ $value | humanize }}}} events dead-lettered recently",
            f"Events were sent to the dead-letter topic ({spec.dlq_topic}) in the last "
            f"{duration(opts.dead_letters_window_seconds)}: bad input or a handler failing after "
            "its retries. The record headers say why; the client's later events keep flowing.",
        ),
    ]
    if not spec.suspend:  # a suspended consumer runs no workers on purpose
        rules.insert(3, rule(
            ALERT_WORKER_DOWN,
            f"(up{{{matchers}}} == 0) or absent(up{{{matchers}}})",
            opts.worker_down_for_seconds, "critical",
            f"{where}: a worker's metrics endpoint is down",
            "Prometheus cannot scrape a worker of this consumer (or finds none). Its range is not "
            "being consumed: check the pod (kubectl describe/logs) or the `keyrange run` output. "
            "The scrape must label targets with `consumer` (the chart's ServiceMonitor does).",
        ))
    group: dict[str, Any] = {"name": f"keyrange.{namespace}.{name}", "rules": rules}
    if opts.evaluation_interval_seconds is not None:
        group["interval"] = duration(opts.evaluation_interval_seconds)
    return {"groups": [group]}


def render_prometheus_rule(name: str, namespace: str, spec: StreamConsumerSpec,
                           options: RuleOptions | None = None,
                           labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The `monitoring.coreos.com/v1` PrometheusRule object for one StreamConsumer.

    `labels` are added to the object's metadata (a Prometheus Operator `ruleSelector` usually
    selects on one, e.g. `release: prometheus`); the operator adds its owner reference itself.
    """
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": f"{name}-keyrange",
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "keyrange",
                "app.kubernetes.io/component": "alerts",
                "keyrange.dev/streamconsumer": name,
                **(labels or {}),
            },
        },
        "spec": render_rule_groups(name, namespace, spec, options),
    }
