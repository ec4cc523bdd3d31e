"""Settings of the keyrange operator process, from its command line (see commands/operator.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

WORKER_SPEC_PATH = "/etc/keyrange/streamconsumer.yaml"
"""Where the worker pods find their StreamConsumer document (a ConfigMap volume)."""


@dataclass(frozen=True)
class OperatorSettings:
    """How the operator renders worker pods and talks to the cluster."""

    image: str = "ghcr.io/keyrange/keyrange:0.1.0"
    """Worker image when a StreamConsumer sets none (the chart passes the operator's own image)."""
    image_pull_policy: str = "IfNotPresent"
    """imagePullPolicy of worker containers."""
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

    def __post_init__(self) -> None:
        if not 1 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be a TCP port, got {self.metrics_port}")
        if self.termination_grace_seconds < 1:
            raise ValueError("termination_grace_seconds must be >= 1")
        if self.reconcile_interval_seconds <= 0:
            raise ValueError("reconcile_interval_seconds must be > 0")
