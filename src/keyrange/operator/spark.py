"""Pure rendering of the Spark-on-Kubernetes objects behind `spec.aggregation`.

Native Spark on Kubernetes in client mode: a driver pod runs `keyrange aggregate --master
k8s://https://kubernetes.default.svc` and Spark's scheduler creates executor pods itself. The
driver runs as a Deployment of one (`mode: continuous`, Recreate: never two drivers on one
checkpoint) or as a CronJob (`mode: schedule`, `--once`, Forbid: runs never overlap). Around it:
a ServiceAccount bound (by a RoleBinding in the consumer's namespace) to the ClusterRole the chart
installs for Spark drivers, which allows exactly what a driver does (its executor pods and their
configmaps), and a headless Service so executors reach the driver by name. The operator itself
holds no pod rights: it may bind that one ClusterRole (RBAC's `bind` verb), nothing else. A local
`output` path becomes a ReadWriteMany PersistentVolumeClaim mounted at that path on the driver and
every executor (executors write the Parquet files). `render_spark_application`
renders the same job for the Kubeflow Spark Operator instead, when its CRD is installed.

Plain values in, plain dicts out; the operator's reconcile applies them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from keyrange.aggregation.connector import image_classpath, pyspark_version
from keyrange.errors import UserError
from keyrange.operator.rendering import CONSUMER_LABEL, kafka_secret_env, owner_reference
from keyrange.spec import StreamConsumerSpec

KUBERNETES_MASTER = "k8s://https://kubernetes.default.svc"
DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079
MAIN_FILE = "local:///opt/keyrange/lib/python3.11/site-packages/keyrange/aggregation/__main__.py"
"""The job's entry point inside the keyrange image (see Dockerfile: the venv is /opt/keyrange)."""
SPARK_APPLICATION_API = "sparkoperator.k8s.io/v1beta2"
_MEMORY = re.compile(r"^(\d+)([kmgt]?)b?$", re.IGNORECASE)
_MIB_PER_UNIT = {"": 1 / (1024 * 1024), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


class SparkRenderError(UserError, ValueError):
    """`spec.aggregation` cannot be turned into a Spark job; the message says what to change."""


@dataclass(frozen=True)
class SparkJobSettings:
    """What the operator knows beyond the spec: the image and the volume size."""

    image: str
    """Image for the driver and the executors (the keyrange image, with Java and the spark extra)."""
    image_pull_policy: str = "IfNotPresent"
    """imagePullPolicy of the driver and the executors."""
    storage_size: str = "10Gi"
    """Size of the ReadWriteMany claim created when `aggregation.output` is a local path."""
    storage_class: str | None = None
    """StorageClass of that claim (one that supports ReadWriteMany); None: the cluster's default."""
    driver_cluster_role: str = "keyrange-spark-driver"
    """The ClusterRole (installed by the chart) that drivers' ServiceAccounts are bound to."""


def aggregation_name(name: str) -> str:
    """Name of the driver Deployment/CronJob, its ServiceAccount, RoleBinding and Service."""
    return f"{name}-aggregation"


AGGREGATION_KINDS = (
    ("v1", "ServiceAccount"), ("rbac.authorization.k8s.io/v1", "RoleBinding"), ("v1", "Service"),
    ("apps/v1", "Deployment"), ("batch/v1", "CronJob"), (SPARK_APPLICATION_API, "SparkApplication"),
    (SPARK_APPLICATION_API, "ScheduledSparkApplication"),
)
"""(apiVersion, kind) of every object named `aggregation_name` the operator may render. The data
claim is not among them: turning aggregation off or changing its mode must not delete its output."""


def pod_labels(name: str, role: str) -> dict[str, str]:
    """Labels of the driver and executor pods. Distinct from the workers' selector labels
    (`app.kubernetes.io/name: keyrange`) so the worker Service never routes to Spark pods."""
    return {"app.kubernetes.io/name": "keyrange-aggregation", "app.kubernetes.io/instance": name,
            CONSUMER_LABEL: name, "app.kubernetes.io/component": f"aggregation-{role}"}


def pod_memory_mib(spark_memory: str, overhead_factor: float = 0.4) -> int:
    """Pod memory for a Spark heap like `1g`: heap plus Spark's non-JVM overhead (40 %, at least
    384 MiB, Spark's defaults for Python jobs, whose Python workers live outside the heap)."""
    match = _MEMORY.match(spark_memory.strip())
    if not match:
        raise SparkRenderError(f"Spark memory must look like 512m or 2g, got {spark_memory!r}")
    heap = int(match.group(1)) * _MIB_PER_UNIT[match.group(2).lower()]
    return int(heap + max(384.0, heap * overhead_factor) + 0.999)


def _is_url(path: str) -> bool:
    return bool(urlparse(path).scheme)


def _metadata(name: str, namespace: str, owner: dict[str, Any], role: str = "driver") -> dict[str, Any]:
    return {"name": aggregation_name(name), "namespace": namespace,
            "labels": {**pod_labels(name, role), "app.kubernetes.io/managed-by": "keyrange-operator"},
            "ownerReferences": [owner_reference(owner)]}


def _paths(name: str, spec: StreamConsumerSpec) -> tuple[str, str, str | None]:
    """(output, checkpoint, claim name or None); a local checkpoint must sit on the output volume."""
    agg = spec.aggregation
    output = agg.output.rstrip("/") or "/"
    checkpoint = agg.checkpoint or f"{output}/_checkpoint"
    if _is_url(output):
        if not _is_url(checkpoint):
            raise SparkRenderError(
                f"aggregation.checkpoint {checkpoint!r} is a local path but aggregation.output is a URL; "
                "give the checkpoint an object-store URL too (the driver pod's disk does not survive it)")
        return output, checkpoint, None
    if not _is_url(checkpoint) and not (checkpoint + "/").startswith(output + "/"):
        raise SparkRenderError(
            f"aggregation.checkpoint {checkpoint!r} must be under aggregation.output {output!r} "
            "(the only volume mounted) or an object-store URL")
    return output, checkpoint, f"{aggregation_name(name)}-data"


def driver_args(name: str, namespace: str, spec: StreamConsumerSpec, settings: SparkJobSettings,
                client_mode: bool = True) -> list[str]:
    """`keyrange aggregate` arguments for the driver (Kubernetes expands `$(POD_NAME)`).

    `client_mode=False` leaves the master, image, driver address and resources to whoever runs
    spark-submit (the Spark Operator), and starts with `--master spark-submit`.
    """
    if not spec.kafka.bootstrap_servers:
        raise SparkRenderError("spec.kafka.bootstrapServers is required in a cluster (the aggregation reads it)")
    agg = spec.aggregation
    for memory in (agg.driver_memory, agg.executor_memory):
        pod_memory_mib(memory)  # Spark rejects Kubernetes quantities like 1Gi; say so now
    output, checkpoint, claim = _paths(name, spec)
    conf = {"spark.sql.shuffle.partitions": str(max(2, 2 * agg.executors))}
    if client_mode:
        conf.update({
            "spark.kubernetes.namespace": namespace,
            "spark.kubernetes.container.image": settings.image,
            "spark.kubernetes.container.image.pullPolicy": settings.image_pull_policy,
            # Executors are owned by the driver pod, so they go when it goes.
            "spark.kubernetes.driver.pod.name": "$(POD_NAME)",
            "spark.kubernetes.executor.podNamePrefix": aggregation_name(name),
            "spark.driver.host": f"{aggregation_name(name)}.{namespace}.svc",
            "spark.driver.bindAddress": "0.0.0.0",
            "spark.driver.port": str(DRIVER_PORT),
            "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
            "spark.driver.memory": agg.driver_memory,
            "spark.executor.instances": str(agg.executors),
            "spark.executor.memory": agg.executor_memory,
            **{f"spark.kubernetes.executor.label.{k}": v for k, v in pod_labels(name, "executor").items()},
        })
        if claim:
            volume = "spark.kubernetes.executor.volumes.persistentVolumeClaim.data"
            conf[f"{volume}.options.claimName"] = claim
            conf[f"{volume}.mount.path"] = output
    args = ["aggregate", "--bootstrap", spec.kafka.bootstrap_servers, "--topic", spec.sink_topic,
            "--output", output, "--checkpoint", checkpoint,
            "--master", KUBERNETES_MASTER if client_mode else "spark-submit",
            "--continuous" if agg.mode == "continuous" else "--once",
            "--retention-minutes", str(agg.retention_minutes)]
    if agg.mode == "continuous":
        args += ["--trigger-seconds", f"{agg.trigger_seconds:g}"]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    # Secret values reach the driver as environment variables (`kafka_secret_env`), never as
    # arguments; the driver passes them to its executors' Kafka readers.
    for key, value in spec.kafka.client_properties.items():
        args += ["--kafka-property", f"{key}={value}"]
    for item in spec.kafka.client_properties_from:
        args += ["--kafka-property-env", f"{item.name}={item.env_name}"]
    return args


def _driver_pod_spec(name: str, namespace: str, spec: StreamConsumerSpec, settings: SparkJobSettings,
                     restart_policy: str) -> dict[str, Any]:
    _, _, claim = _paths(name, spec)
    memory = f"{pod_memory_mib(spec.aggregation.driver_memory)}Mi"
    mounts = [{"name": "tmp", "mountPath": "/tmp"}]
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    if claim:
        mounts.append({"name": "data", "mountPath": _paths(name, spec)[0]})
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": claim}})
    return {
        "serviceAccountName": aggregation_name(name),
        "restartPolicy": restart_policy,
        "terminationGracePeriodSeconds": 60,  # time to stop the query and Spark cleanly on SIGTERM
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                            "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "driver",
            "image": settings.image,
            "imagePullPolicy": settings.image_pull_policy,
            "command": ["keyrange"],
            "args": driver_args(name, namespace, spec, settings),
            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "HOME", "value": "/tmp"}, *kafka_secret_env(spec)],
            "ports": [{"name": "driver", "containerPort": DRIVER_PORT, "protocol": "TCP"},
                      {"name": "blockmanager", "containerPort": BLOCK_MANAGER_PORT, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": "500m", "memory": memory}, "limits": {"memory": memory}},
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
    }


def render_driver(name: str, namespace: str, spec: StreamConsumerSpec, owner: dict[str, Any],
                  settings: SparkJobSettings) -> dict[str, Any]:
    """The driver: a one-replica Deployment (continuous) or a CronJob (schedule)."""
    labels = pod_labels(name, "driver")
    metadata = _metadata(name, namespace, owner)
    if spec.aggregation.mode == "continuous":
        return {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},  # never two drivers writing one checkpoint
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels},
                             "spec": _driver_pod_spec(name, namespace, spec, settings, "Always")},
            },
        }
    return {
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": metadata,
        "spec": {
            "schedule": spec.aggregation.schedule,
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {"spec": {
                "backoffLimit": 2,
                "template": {"metadata": {"labels": labels},
                             "spec": _driver_pod_spec(name, namespace, spec, settings, "Never")},
            }},
        },
    }


def render_driver_service(name: str, namespace: str, owner: dict[str, Any]) -> dict[str, Any]:
    """Headless Service: the stable name executors use to reach the client-mode driver."""
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": _metadata(name, namespace, owner),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # the driver has no readiness probe to pass first
            "selector": pod_labels(name, "driver"),
            "ports": [{"name": "driver", "port": DRIVER_PORT, "targetPort": DRIVER_PORT, "protocol": "TCP"},
                      {"name": "blockmanager", "port": BLOCK_MANAGER_PORT, "targetPort": BLOCK_MANAGER_PORT,
                       "protocol": "TCP"}],
        },
    }


DRIVER_RULES = [
    {"apiGroups": [""], "resources": ["pods", "configmaps"],
     "verbs": ["create", "get", "list", "watch", "delete", "deletecollection"]},
]
"""What a client-mode Spark driver does with its token: create, watch and remove its executor pods
and their configuration maps (the chart's driver ClusterRole grants exactly this)."""


def render_rbac(name: str, namespace: str, owner: dict[str, Any], settings: SparkJobSettings) -> list[dict[str, Any]]:
    """The driver's ServiceAccount, and a RoleBinding of it to the drivers' ClusterRole in this
    namespace only (a RoleBinding to a ClusterRole grants its rules in the binding's namespace)."""
    metadata = _metadata(name, namespace, owner)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": metadata,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": settings.driver_cluster_role},
         "subjects": [{"kind": "ServiceAccount", "name": aggregation_name(name), "namespace": namespace}]},
    ]


def render_claim(name: str, namespace: str, spec: StreamConsumerSpec, owner: dict[str, Any],
                 settings: SparkJobSettings) -> dict[str, Any] | None:
    """The ReadWriteMany claim for a local `output` path (None for object-store URLs)."""
    _, _, claim = _paths(name, spec)
    if claim is None:
        return None
    body: dict[str, Any] = {"accessModes": ["ReadWriteMany"],
                            "resources": {"requests": {"storage": settings.storage_size}}}
    if settings.storage_class:
        body["storageClassName"] = settings.storage_class
    metadata = {**_metadata(name, namespace, owner), "name": claim}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": body}


def render_spark_objects(name: str, namespace: str, spec: StreamConsumerSpec, owner: dict[str, Any],
                         settings: SparkJobSettings) -> list[dict[str, Any]]:
    """Every built-in object of the aggregation job, in apply order; [] when it is not enabled."""
    if not spec.aggregation.enabled:
        return []
    claim = render_claim(name, namespace, spec, owner, settings)
    return [*render_rbac(name, namespace, owner, settings), *([claim] if claim else []),
            render_driver_service(name, namespace, owner), render_driver(name, namespace, spec, owner, settings)]


def render_spark_application(name: str, namespace: str, spec: StreamConsumerSpec, owner: dict[str, Any],
                             settings: SparkJobSettings) -> dict[str, Any]:
    """The same job for the Kubeflow Spark Operator: a SparkApplication (continuous) or a
    ScheduledSparkApplication (schedule), in cluster mode; use with `render_rbac` and, for a
    local output path, `render_claim`."""
    agg = spec.aggregation
    output, _, claim = _paths(name, spec)
    # spark-submit runs keyrange.aggregation's __main__, which takes `keyrange aggregate`'s arguments.
    args = driver_args(name, namespace, spec, settings, client_mode=False)[1:]
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}] if claim else []
    mounts = [{"name": "data", "mountPath": output}] if claim else []
    app: dict[str, Any] = {
        "type": "Python",
        "pythonVersion": "3",
        "mode": "cluster",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "mainApplicationFile": MAIN_FILE,
        "arguments": args,
        "sparkVersion": pyspark_version(),
        # Spark's Kafka connector, which the image carries (see Dockerfile), on the classpath of
        # the driver and the executors that spark-submit starts from the image.
        "sparkConf": {"spark.driver.extraClassPath": image_classpath(),
                      "spark.executor.extraClassPath": image_classpath()},
        "restartPolicy": ({"type": "Always"} if agg.mode == "continuous"
                          else {"type": "OnFailure", "onFailureRetries": 2}),
        "driver": {"cores": 1, "memory": agg.driver_memory, "serviceAccount": aggregation_name(name),
                   "labels": pod_labels(name, "driver"), "volumeMounts": mounts},
        "executor": {"instances": agg.executors, "cores": 1, "memory": agg.executor_memory,
                     "labels": pod_labels(name, "executor"), "volumeMounts": mounts},
        "volumes": volumes,
    }
    if spec.kafka.client_properties_from:
        app["driver"]["env"] = kafka_secret_env(spec)
    metadata = _metadata(name, namespace, owner)
    if agg.mode == "continuous":
        return {"apiVersion": SPARK_APPLICATION_API, "kind": "SparkApplication", "metadata": metadata, "spec": app}
    return {"apiVersion": SPARK_APPLICATION_API, "kind": "ScheduledSparkApplication", "metadata": metadata,
            "spec": {"schedule": agg.schedule, "concurrencyPolicy": "Forbid", "template": app}}
