"""What every worker pod gets unless its StreamConsumer says otherwise: the chart's `workers` and
`networkPolicy` values, read by the operator from a YAML file (`--worker-defaults`).

A StreamConsumer field of the same name replaces the default as a whole (its `resources` when it
sets requests or limits, its `tolerations` list, ...); `imagePullSecrets` add up. Without a file,
the operator uses the defaults below, which are also the chart's: workers are never BestEffort
pods (the first a node evicts under memory pressure), and have no CPU limit (a throttled worker
answers late and its ranges look lagging).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from keyrange.errors import UserError

DEFAULT_RESOURCES: dict[str, dict[str, str]] = {"requests": {"cpu": "250m", "memory": "256Mi"},
                                                "limits": {"memory": "1Gi"}}
"""A worker's footprint at the kata's rate, measured (BENCHMARKS.md, "Why the code does X"); the
limit leaves room for maxPending events per held partition and the state of many clients."""


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)


class DisruptionBudget(_Model):
    """The PodDisruptionBudget the operator renders for each consumer's workers."""

    enabled: bool = True
    max_unavailable: int | str = Field(default=1, alias="maxUnavailable")
    """Workers a voluntary disruption (a node drain) may take at once; each one's ranges pause until
    its pod runs again elsewhere. A count or a percentage ("25%")."""


class KafkaEgress(_Model):
    """Where the Kafka brokers are, for egress rules."""

    ports: list[int] = Field(default_factory=lambda: [9092, 9093, 9094])
    to: list[dict[str, Any]] = Field(default_factory=list)
    """NetworkPolicy peers of the brokers; empty: any destination on those ports."""


class WorkerNetworkPolicy(_Model):
    """A NetworkPolicy per consumer: who may reach the workers, and what they may reach."""

    enabled: bool = False
    metrics_from: list[dict[str, Any]] = Field(default_factory=list, alias="metricsFrom")
    """Peers that scrape the workers' /metrics (Prometheus), besides the operator."""
    operator: list[dict[str, Any]] = Field(default_factory=list)
    """Peers that select the operator's pods (it scrapes the workers' lag); the chart fills this in."""
    kafka: KafkaEgress = Field(default_factory=KafkaEgress)


class WorkerDefaults(_Model):
    """Defaults of every worker pod (see the module docstring)."""

    resources: dict[str, dict[str, str]] = Field(default_factory=lambda: dict(DEFAULT_RESOURCES))
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    affinity: dict[str, Any] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    topology_spread_constraints: list[dict[str, Any]] = Field(default_factory=list,
                                                              alias="topologySpreadConstraints")
    """Empty: a soft spread of each consumer's workers over nodes and zones."""
    priority_class_name: str | None = Field(default=None, alias="priorityClassName")
    image_pull_secrets: list[dict[str, str]] = Field(default_factory=list, alias="imagePullSecrets")
    pod_disruption_budget: DisruptionBudget = Field(default_factory=DisruptionBudget, alias="podDisruptionBudget")
    network_policy: WorkerNetworkPolicy = Field(default_factory=WorkerNetworkPolicy, alias="networkPolicy")


def load_worker_defaults(path: str | Path) -> WorkerDefaults:
    """Read the defaults file; UserError names the file and every problem."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise UserError(f"cannot read the worker defaults {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"the worker defaults {path} are not valid YAML: {exc}") from None
    try:
        return WorkerDefaults.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise UserError(f"invalid worker defaults in {path}: {problems} (the chart's `workers` values)") from None
