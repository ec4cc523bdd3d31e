"""Pure rendering of the Kubernetes objects behind one StreamConsumer.

Plain values in, plain dicts out: no API calls, no clock, so every object can be checked offline
(kubernetes-validate) and the kopf handlers stay thin. Children carry a controller owner reference
to the StreamConsumer, so deleting it deletes them (no finalizer needed).
"""

from __future__ import annotations

import hashlib
from typing import Any

import yaml

from keyrange.operator import workerpod
from keyrange.operator.settings import WORKER_SPEC_PATH, OperatorSettings
from keyrange.spec import API_VERSION, KIND, SpecError, StreamConsumerSpec

MAX_NAME_LENGTH = 45
"""Pod `<name>-worker-<ordinal>` and its controller-revision-hash label must fit in 63 chars."""
SPEC_HASH_ANNOTATION = "keyrange.dev/spec-hash"
"""On the pod template: changes with what workers read of the StreamConsumer document, so a spec
change rolls the pods. `spec.workers` is left out: it bounds the planner, which rescales by
handoffs (`kubectl scale` must not restart every pod too). `spec.suspend` too: it only scales to zero."""
CONSUMER_LABEL = "keyrange.dev/streamconsumer"
SPEC_FILE_KEY = "streamconsumer.yaml"


def worker_name(name: str) -> str:
    """Name of the StatefulSet and of its headless Service."""
    return f"{name}-worker"


def config_name(name: str) -> str:
    """Name of the ConfigMap holding the StreamConsumer document."""
    return f"{name}-spec"


def selector_labels(name: str) -> dict[str, str]:
    """Stable labels that select one consumer's worker pods (never change them: selectors are immutable)."""
    return {"app.kubernetes.io/name": "keyrange", "app.kubernetes.io/instance": name, CONSUMER_LABEL: name}


def common_labels(name: str, component: str) -> dict[str, str]:
    """Labels on every object rendered for a consumer."""
    return {**selector_labels(name), "app.kubernetes.io/component": component,
            "app.kubernetes.io/managed-by": "keyrange-operator"}


def selector_string(name: str) -> str:
    """The pods' label selector as a string (status.selector, for the scale subresource)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    """A controller owner reference to the StreamConsumer `owner` (needs metadata.name and uid)."""
    meta = owner["metadata"]
    return {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def check_cluster_spec(name: str, spec: StreamConsumerSpec) -> None:
    """Raise SpecError for what spec.py allows locally but a cluster cannot run."""
    if len(name) > MAX_NAME_LENGTH:
        raise SpecError(f"StreamConsumer {name!r}: metadata.name must be at most {MAX_NAME_LENGTH} "
                        "characters (worker pod names derive from it); choose a shorter name")
    if not spec.kafka.bootstrap_servers:
        raise SpecError(f"StreamConsumer {name!r}: spec.kafka.bootstrapServers is required in a cluster "
                        "(there is no embedded broker); set it to your Kafka bootstrap address")
    for index, item in enumerate(spec.kafka.client_properties_from):
        if item.secret_key_ref is None:
            raise SpecError(f"StreamConsumer {name!r}: spec.kafka.clientPropertiesFrom[{index}] ({item.name}) "
                            "needs secretKeyRef in a cluster: name the Secret and key that hold its value")
    try:
        workerpod.user_env(spec, [*workerpod.RESERVED_ENV, *(i.env_name for i in spec.kafka.client_properties_from)])
    except SpecError as exc:
        raise SpecError(f"StreamConsumer {name!r}: {exc}") from None


def kafka_secret_env(spec: StreamConsumerSpec) -> list[dict[str, Any]]:
    """Container env entries that fill each `clientPropertiesFrom` variable from its Secret key."""
    return [{"name": item.env_name,
             "valueFrom": {"secretKeyRef": {"name": item.secret_key_ref.name, "key": item.secret_key_ref.key}}}
            for item in spec.kafka.client_properties_from if item.secret_key_ref is not None]


def spec_document(name: str, namespace: str, spec: StreamConsumerSpec) -> str:
    """The StreamConsumer YAML the workers read (`keyrange worker --spec-file`), after defaults."""
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": namespace},
           "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True)}
    return yaml.safe_dump(doc, sort_keys=True)


def render_configmap(name: str, namespace: str, spec: StreamConsumerSpec, owner: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap mounted into every worker at /etc/keyrange."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": config_name(name), "namespace": namespace,
                     "labels": common_labels(name, "config"), "ownerReferences": [owner_reference(owner)]},
        "data": {SPEC_FILE_KEY: spec_document(name, namespace, spec)},
    }


def render_service(name: str, namespace: str, owner: dict[str, Any], settings: OperatorSettings) -> dict[str, Any]:
    """The headless Service: stable pod DNS for the StatefulSet and a target for metrics scraping."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": worker_name(name), "namespace": namespace,
                     "labels": common_labels(name, "worker"), "ownerReferences": [owner_reference(owner)]},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # scrape workers that are still restoring state
            "selector": selector_labels(name),
            "ports": [{"name": "metrics", "port": settings.metrics_port, "targetPort": "metrics",
                       "protocol": "TCP"}],
        },
    }


def render_service_account(name: str, namespace: str, owner: dict[str, Any]) -> dict[str, Any]:
    """The workers' own ServiceAccount: bound to no Role, and its token is never mounted."""
    return {
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": worker_name(name), "namespace": namespace,
                     "labels": common_labels(name, "worker"), "ownerReferences": [owner_reference(owner)]},
        "automountServiceAccountToken": False,
    }


def _container(spec: StreamConsumerSpec, settings: OperatorSettings) -> dict[str, Any]:
    def probe(path: str) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "metrics"}, "periodSeconds": 10, "timeoutSeconds": 5}

    env = [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
           *kafka_secret_env(spec)]
    env += workerpod.user_env(spec, [e["name"] for e in env])
    container: dict[str, Any] = {
        "name": "worker",
        "image": spec.image or settings.image,
        "imagePullPolicy": spec.image_pull_policy or settings.image_pull_policy,
        "command": ["keyrange", "worker", "--spec-file", WORKER_SPEC_PATH,
                    "--metrics-port", str(settings.metrics_port)],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": settings.metrics_port, "protocol": "TCP"}],
        # Ready once the worker started; restoring a range's state happens after, under the handoff
        # protocol. Alive while its event loop runs and its handler threads are not stuck (health.py).
        "readinessProbe": {**probe("/readyz"), "initialDelaySeconds": 2, "failureThreshold": 3},
        "livenessProbe": {**probe("/healthz"), "initialDelaySeconds": 30, "failureThreshold": 6},
        "resources": workerpod.resources(spec, settings.worker_defaults),
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "spec", "mountPath": "/etc/keyrange", "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    if spec.env_from:
        container["envFrom"] = workerpod.env_from(spec)
    return container


def _pod_spec(name: str, spec: StreamConsumerSpec, settings: OperatorSettings) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "serviceAccountName": worker_name(name),
        "automountServiceAccountToken": False,  # workers never call the Kubernetes API
        "terminationGracePeriodSeconds": settings.termination_grace_seconds,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                            "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(spec, settings)],
        "volumes": [{"name": "spec", "configMap": {"name": config_name(name)}},
                    {"name": "tmp", "emptyDir": {}}],
        **workerpod.scheduling(spec, settings.worker_defaults, selector_labels(name)),
    }
    secrets = workerpod.pull_secrets(spec, settings.worker_defaults)
    if secrets:
        pod["imagePullSecrets"] = secrets
    return pod


def render_statefulset(name: str, namespace: str, spec: StreamConsumerSpec, replicas: int,
                       owner: dict[str, Any], settings: OperatorSettings) -> dict[str, Any]:
    """The workers: ordinal = worker id in the range map; a rolling update replaces one pod at a time."""
    unscaled = spec.model_copy(update={"workers": type(spec.workers)(), "suspend": False})
    spec_hash = hashlib.sha256(spec_document(name, namespace, unscaled).encode()).hexdigest()[:16]
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": worker_name(name), "namespace": namespace,
                     "labels": common_labels(name, "worker"), "ownerReferences": [owner_reference(owner)]},
        "spec": {
            "replicas": replicas,
            "serviceName": worker_name(name),
            # Parallel: a split's new pod need not wait for its siblings; the range controller, not
            # pod order, decides when a worker gets slots.
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "selector": {"matchLabels": selector_labels(name)},
            "template": {
                "metadata": {"labels": common_labels(name, "worker"),
                             "annotations": {SPEC_HASH_ANNOTATION: spec_hash}},
                "spec": _pod_spec(name, spec, settings),
            },
        },
    }


def render_service_monitor(name: str, namespace: str, owner: dict[str, Any],
                           settings: OperatorSettings) -> dict[str, Any]:
    """A Prometheus Operator ServiceMonitor for the workers' metrics (only if that CRD exists)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": {"name": worker_name(name), "namespace": namespace,
                     "labels": {**common_labels(name, "metrics"), **settings.monitoring_labels},
                     "ownerReferences": [owner_reference(owner)]},
        "spec": {
            "selector": {"matchLabels": selector_labels(name)},
            "namespaceSelector": {"matchNames": [namespace]},
            # `consumer` on the target too, so the worker-down alert's `up{consumer=...}` matches.
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "5s", "relabelings": [
                {"sourceLabels": ["__meta_kubernetes_pod_label_keyrange_dev_streamconsumer"],
                 "targetLabel": "consumer"}]}],
        },
    }


def desired_replicas(spec: StreamConsumerSpec, planned: int | None) -> int:
    """Worker pods to run: the range controller's count when it has one, else the spec's.

    The controller's count is never clamped to workers.min/max: after the bounds change it still
    needs the pods that own ranges until the merges that free them have completed.
    """
    if planned is not None:
        return planned
    return max(spec.workers.min, min(spec.workers.max, spec.workers.replicas or spec.workers.min))


def render_optional(name: str, namespace: str, spec: StreamConsumerSpec, owner: dict[str, Any],
                    settings: OperatorSettings) -> list[dict[str, Any]]:
    """Objects of optional CRDs (ServiceMonitor, PrometheusRule): applied only where the CRD exists."""
    from keyrange.autoscale.rules import RuleOptions, render_prometheus_rule

    rule = render_prometheus_rule(name, namespace, spec, RuleOptions(runbook_url=settings.runbook_url),
                                  labels=dict(settings.monitoring_labels))
    rule["metadata"]["ownerReferences"] = [owner_reference(owner)]
    return [render_service_monitor(name, namespace, owner, settings), rule]
