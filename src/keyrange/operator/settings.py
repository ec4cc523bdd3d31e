"""Settings of the keyrange operator process, from its command line (see commands/operator.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from keyrange.autoscale.rules import RUNBOOK
from keyrange.operator.workerdefaults import WorkerDefaults

WORKER_SPEC_PATH = "/etc/keyrange/streamconsumer.yaml"
"""Where the worker pods find their StreamConsumer document (a ConfigMap volume)."""
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


@dataclass(frozen=True)
class OperatorSettings:
    """How the operator renders worker pods and talks to the cluster."""

    image: str = "ghcr.io/keyrange/keyrange:0.1.0"
    """Worker image when a StreamConsumer sets none (the chart passes the operator's own image)."""
    image_pull_policy: str = "IfNotPresent"
    """imagePullPolicy of worker containers (and Spark's) unless a StreamConsumer sets its own."""
    metrics_port: int = 9100
    """Port of the workers' Prometheus `/metrics` endpoint."""
    termination_grace_seconds: int = 60
    """Time a worker gets after SIGTERM to release its ranges: finish in-flight events, flush
    processed records and state, commit. Longer than the slowest handler plus a flush."""
    reconcile_interval_seconds: float = 5.0
    """How often each consumer's range control is polled and its status refreshed."""
    monitoring_labels: dict[str, str] = field(default_factory=dict)
    """Extra labels on ServiceMonitors and PrometheusRules (a Prometheus Operator selector)."""
    spark_aggregation: bool = True
    """Whether this installation runs Spark jobs (`spec.aggregation`); off when the chart grants the
    operator no Spark rights (rbac.sparkAggregation: false), so it never touches those kinds."""
    spark_driver_cluster_role: str = "keyrange-spark-driver"
    """The ClusterRole Spark drivers' ServiceAccounts are bound to (installed by the chart)."""
    runbook_url: str = RUNBOOK
    """Absolute URL of docs/autoscaling.md for the alerts' runbook_url annotations."""
    worker_defaults: WorkerDefaults = field(default_factory=WorkerDefaults)
    """Resources, scheduling, pull secrets, disruption budget and network policy of every worker pod
    unless its StreamConsumer says otherwise (the chart's `workers` values)."""

    def __post_init__(self) -> None:
        if not 1 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be a TCP port, got {self.metrics_port}")
        if self.termination_grace_seconds < 1:
            raise ValueError("termination_grace_seconds must be >= 1")
        if self.reconcile_interval_seconds <= 0:
            raise ValueError("reconcile_interval_seconds must be > 0")
        if not self.runbook_url.startswith(("https://", "http://")):
            raise ValueError(f"runbook_url must be an absolute http(s) URL, got {self.runbook_url!r}")
        if self.image_pull_policy not in PULL_POLICIES:
            raise ValueError(f"image_pull_policy must be one of {', '.join(PULL_POLICIES)}, "
                             f"got {self.image_pull_policy!r}")
