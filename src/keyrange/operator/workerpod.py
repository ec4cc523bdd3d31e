"""The worker pod's resources, environment, image pulling and scheduling (pure).

Each comes from the StreamConsumer's field of the same name, else from the operator's worker
defaults (the chart's `workers` values, workerdefaults.py). Topology spread constraints select the
consumer's own workers: a constraint without a labelSelector gets the consumer's selector, and
with none anywhere the workers spread softly over nodes and zones, so one node or zone going down
takes as few of a consumer's ranges as the cluster allows.
"""

from __future__ import annotations

from typing import Any

from keyrange.operator.workerdefaults import WorkerDefaults
from keyrange.spec import SpecError, StreamConsumerSpec

SPREAD_TOPOLOGY_KEYS = ("kubernetes.io/hostname", "topology.kubernetes.io/zone")
"""The soft default spread: nodes, then zones (a key no node carries constrains nothing)."""
RESERVED_ENV = ("POD_NAMESPACE",)
"""Variables the operator sets on every worker."""


def resources(spec: StreamConsumerSpec, defaults: WorkerDefaults) -> dict[str, Any]:
    """The spec's requests and limits when it sets any, else the defaults (never BestEffort)."""
    if spec.resources.requests or spec.resources.limits:
        chosen: dict[str, Any] = {"requests": dict(spec.resources.requests), "limits": dict(spec.resources.limits)}
    else:
        chosen = {k: dict(v) for k, v in defaults.resources.items()}
    return {k: v for k, v in chosen.items() if v}


def user_env(spec: StreamConsumerSpec, reserved: list[str]) -> list[dict[str, Any]]:
    """spec.env as container env entries; SpecError when one would hide a variable keyrange sets."""
    taken = set(reserved)
    for index, var in enumerate(spec.env):
        if var.name in taken:
            raise SpecError(f"spec.env[{index}] sets {var.name}, which keyrange sets itself (the pod's namespace, "
                            "or a spec.kafka.clientPropertiesFrom variable); choose another name")
        taken.add(var.name)
    return [var.model_dump(by_alias=True, exclude_none=True) for var in spec.env]


def env_from(spec: StreamConsumerSpec) -> list[dict[str, Any]]:
    """spec.envFrom as container envFrom entries."""
    return [source.model_dump(by_alias=True, exclude_none=True) for source in spec.env_from]


def pull_secrets(spec: StreamConsumerSpec, defaults: WorkerDefaults) -> list[dict[str, str]]:
    """The chart's pull secrets and the spec's, each once."""
    names = [s["name"] for s in defaults.image_pull_secrets] + [s.name for s in spec.image_pull_secrets]
    return [{"name": n} for n in dict.fromkeys(names)]


def spread_constraints(spec: StreamConsumerSpec, defaults: WorkerDefaults,
                       selector: dict[str, str]) -> list[dict[str, Any]]:
    """The spec's constraints, else the defaults', else a soft spread; each selects the consumer's workers
    unless it has a labelSelector of its own."""
    given = spec.topology_spread_constraints or defaults.topology_spread_constraints
    if not given:
        given = [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway"}
                 for key in SPREAD_TOPOLOGY_KEYS]
    return [{**c, "labelSelector": c.get("labelSelector") or {"matchLabels": dict(selector)}} for c in given]


def scheduling(spec: StreamConsumerSpec, defaults: WorkerDefaults, selector: dict[str, str]) -> dict[str, Any]:
    """nodeSelector, affinity, tolerations, topologySpreadConstraints and priorityClassName of the pod."""
    out: dict[str, Any] = {"topologySpreadConstraints": spread_constraints(spec, defaults, selector)}
    node_selector = spec.node_selector or defaults.node_selector
    if node_selector:
        out["nodeSelector"] = dict(node_selector)
    affinity = spec.affinity or defaults.affinity
    if affinity:
        out["affinity"] = affinity
    tolerations = ([t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
                   or list(defaults.tolerations))
    if tolerations:
        out["tolerations"] = tolerations
    priority = spec.priority_class_name or defaults.priority_class_name
    if priority:
        out["priorityClassName"] = priority
    return out
