"""Everything the operator creates for one StreamConsumer, applied in one place.

The workers' ServiceAccount, ConfigMap, headless Service and StatefulSet, their
PodDisruptionBudget and NetworkPolicy (policies.py), a ServiceMonitor and PrometheusRule where
those CRDs exist, and the Spark job of `spec.aggregation`, whose objects are deleted again when it
is turned off or its mode changes (its data claim stays). All are owned by the StreamConsumer.
"""

from __future__ import annotations

import logging
from typing import Any

from keyrange.operator import rendering
from keyrange.operator.kube import Kube, plural_of
from keyrange.operator.policies import render_disruption_budget, render_network_policy
from keyrange.operator.settings import OperatorSettings
from keyrange.spec import StreamConsumerSpec

log = logging.getLogger(__name__)


def apply_children(kube: Kube, settings: OperatorSettings, body: Any, model: StreamConsumerSpec,
                   replicas: int) -> dict[str, Any]:
    """Server-side apply everything the consumer needs; return the StatefulSet as stored."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    owner = dict(body)
    kube.apply(rendering.render_service_account(name, namespace, owner))
    kube.apply(rendering.render_configmap(name, namespace, model, owner))
    kube.apply(rendering.render_service(name, namespace, owner, settings))
    sts = kube.apply(rendering.render_statefulset(name, namespace, model, replicas, owner, settings))
    for policy in (render_disruption_budget(name, namespace, owner, settings),
                   render_network_policy(name, namespace, owner, settings)):
        if policy is not None:
            kube.apply(policy)
    for obj in rendering.render_optional(name, namespace, model, owner, settings):
        if kube.has_resource(obj["apiVersion"], plural_of(obj["kind"])):
            kube.apply(obj)
    if not settings.spark_aggregation:
        return sts  # no Spark rights: nothing of Spark's was ever created here, nothing to prune
    wanted = aggregation_objects(kube, settings, name, namespace, model, owner)
    for obj in wanted:
        kube.apply(obj)
    prune_aggregation(kube, name, namespace, owner, {(o["apiVersion"], o["kind"]) for o in wanted})
    return sts


def prune_aggregation(kube: Kube, name: str, namespace: str, owner: dict[str, Any],
                       wanted: set[tuple[str, str]]) -> None:
    """Delete the Spark objects of this consumer that its spec no longer asks for: all of them when
    `aggregation.enabled` is turned off, the Deployment or CronJob left by a mode change. Only
    objects this consumer owns are touched; the data claim is kept."""
    from keyrange.operator import spark

    uid = owner["metadata"].get("uid")
    target = spark.aggregation_name(name)
    for api_version, kind in spark.AGGREGATION_KINDS:
        if (api_version, kind) in wanted:
            continue
        found = kube.get(api_version, kind, namespace, target)  # None too where the kind is not served
        owners = (found or {}).get("metadata", {}).get("ownerReferences") or []
        if found is not None and any(ref.get("uid") == uid for ref in owners):
            kube.delete(api_version, kind, namespace, target)
            log.info("%s/%s: deleted %s %s (no longer in spec.aggregation)", namespace, name, kind, target)


def aggregation_objects(kube: Kube, settings: OperatorSettings, name: str, namespace: str,
                         model: StreamConsumerSpec, owner: dict[str, Any]) -> list[dict[str, Any]]:
    """The Spark job of `spec.aggregation`: a SparkApplication where the Kubeflow Spark Operator is
    installed, else native Spark on Kubernetes (a client-mode driver the operator renders)."""
    if not model.aggregation.enabled:
        return []
    from keyrange.operator import spark

    job = spark.SparkJobSettings(image=model.image or settings.image,
                                 image_pull_policy=model.image_pull_policy or settings.image_pull_policy,
                                 driver_cluster_role=settings.spark_driver_cluster_role)
    if kube.has_resource(spark.SPARK_APPLICATION_API, "sparkapplications"):
        claim = spark.render_claim(name, namespace, model, owner, job)
        return [*spark.render_rbac(name, namespace, owner, job), *([claim] if claim else []),
                spark.render_spark_application(name, namespace, model, owner, job)]
    return spark.render_spark_objects(name, namespace, model, owner, job)
