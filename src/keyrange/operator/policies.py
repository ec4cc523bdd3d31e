"""A consumer's PodDisruptionBudget and NetworkPolicy (pure), owned by the StreamConsumer.

- The PodDisruptionBudget lets a node drain evict `maxUnavailable` workers at a time (1 by
  default). An evicted worker releases its ranges on SIGTERM and they pause until its pod runs
  again elsewhere, so draining one at a time keeps the rest of the consumer flowing. A budget
  never blocks a drain for good: with one worker, that worker may go, and a pod that is not
  Ready may always be evicted (`unhealthyPodEvictionPolicy: AlwaysAllow`), so a crash-looping
  worker cannot hold a node.
- The NetworkPolicy (off unless the chart's `networkPolicy.enabled`) admits, on the workers'
  metrics port only, Prometheus and the operator (which scrapes the workers' lag), and lets the
  workers reach only DNS and Kafka: they never call the Kubernetes API. The kubelet's probes come
  from the node, which network plugins admit anyway.
"""

from __future__ import annotations

from typing import Any

from keyrange.operator.rendering import common_labels, owner_reference, selector_labels, worker_name
from keyrange.operator.settings import OperatorSettings

DNS_PORTS = [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]


def render_disruption_budget(name: str, namespace: str, owner: dict[str, Any],
                             settings: OperatorSettings) -> dict[str, Any] | None:
    """The workers' PodDisruptionBudget, or None when the chart turned it off."""
    budget = settings.worker_defaults.pod_disruption_budget
    if not budget.enabled:
        return None
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": worker_name(name), "namespace": namespace,
                     "labels": common_labels(name, "worker"), "ownerReferences": [owner_reference(owner)]},
        "spec": {"maxUnavailable": budget.max_unavailable, "selector": {"matchLabels": selector_labels(name)},
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }


def render_network_policy(name: str, namespace: str, owner: dict[str, Any],
                          settings: OperatorSettings) -> dict[str, Any] | None:
    """The workers' NetworkPolicy, or None unless the chart enabled network policies."""
    policy = settings.worker_defaults.network_policy
    if not policy.enabled:
        return None
    metrics_port = [{"port": settings.metrics_port, "protocol": "TCP"}]
    peers = [*policy.operator, *policy.metrics_from]
    kafka: dict[str, Any] = {"ports": [{"port": p, "protocol": "TCP"} for p in policy.kafka.ports]}
    if policy.kafka.to:
        kafka["to"] = policy.kafka.to
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": worker_name(name), "namespace": namespace,
                     "labels": common_labels(name, "worker"), "ownerReferences": [owner_reference(owner)]},
        "spec": {
            "podSelector": {"matchLabels": selector_labels(name)},
            "policyTypes": ["Ingress", "Egress"],
            # An empty `from` would admit everyone: with no peers configured, admit no one.
            "ingress": [{"from": peers, "ports": metrics_port}] if peers else [],
            "egress": [{"ports": DNS_PORTS}, kafka],
        },
    }
