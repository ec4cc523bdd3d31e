"""Rendering of the Spark-on-Kubernetes objects for `spec.aggregation`: valid built-in objects
(kubernetes-validate, strict), least-privilege RBAC, driver arguments the CLI accepts, and the
SparkApplication against the part of the Spark Operator's v1beta2 schema it uses."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from keyrange.commands import aggregate
from keyrange.operator.rendering import selector_labels
from keyrange.operator.spark import (
    DRIVER_RULES,
    KUBERNETES_MASTER,
    SparkJobSettings,
    SparkRenderError,
    driver_args,
    pod_labels,
    pod_memory_mib,
    render_spark_application,
    render_spark_objects,
)
from keyrange.spec import SpecError, parse_spec

OWNER = {"metadata": {"name": "payments", "uid": "0b6c3f7e-1111-2222-3333-444455556666"}}
SETTINGS = SparkJobSettings(image="ghcr.io/keyrange/keyrange:0.1.0")


def _spec(**aggregation: Any) -> Any:
    return parse_spec({"kafka": {"bootstrapServers": "kafka:9092", "topic": "events"},
                       "aggregation": {"enabled": True, **aggregation}})


def _by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


def _parse_cli(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    aggregate.add_arguments(parser)
    assert args[0] == "aggregate"
    return parser.parse_args(args[1:])


def _conf(args: argparse.Namespace) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in args.conf)


@pytest.mark.parametrize("aggregation", [
    {},
    {"mode": "schedule", "schedule": "*/15 * * * *", "executors": 3, "executorMemory": "2g"},
    {"output": "s3a://bucket/agg", "checkpoint": "s3a://bucket/ckpt", "driverMemory": "512m"},
])
def test_every_built_in_object_is_valid_kubernetes_1_30(aggregation):
    for obj in render_spark_objects("payments", "shop", _spec(**aggregation), OWNER, SETTINGS):
        kubernetes_validate.validate(obj, "1.30", strict=True)
        assert obj["metadata"]["namespace"] == "shop"
        assert obj["metadata"]["ownerReferences"][0]["uid"] == OWNER["metadata"]["uid"]


def test_disabled_aggregation_renders_nothing():
    spec = parse_spec({"kafka": {"bootstrapServers": "kafka:9092", "topic": "events"}})
    assert render_spark_objects("payments", "shop", spec, OWNER, SETTINGS) == []


def test_continuous_mode_is_a_single_driver_deployment_with_a_volume_for_a_local_output():
    objects = _by_kind(render_spark_objects("payments", "shop", _spec(), OWNER, SETTINGS))
    assert set(objects) == {"ServiceAccount", "RoleBinding", "PersistentVolumeClaim", "Service", "Deployment"}
    deployment = objects["Deployment"]["spec"]
    assert deployment["replicas"] == 1 and deployment["strategy"] == {"type": "Recreate"}
    pod = deployment["template"]["spec"]
    assert pod["serviceAccountName"] == "payments-aggregation"
    container = pod["containers"][0]
    args = _parse_cli(container["args"])
    assert (args.bootstrap, args.topic, args.continuous, args.master) == (
        "kafka:9092", "events.processed", True, KUBERNETES_MASTER)
    assert (args.output, args.checkpoint) == ("/data/keyrange-aggregates", "/data/keyrange-aggregates/_checkpoint")
    conf = _conf(args)
    claim = objects["PersistentVolumeClaim"]["metadata"]["name"]
    assert objects["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    # Executors mount the same claim at the output path: they write the Parquet files.
    assert conf["spark.kubernetes.executor.volumes.persistentVolumeClaim.data.options.claimName"] == claim
    assert conf["spark.kubernetes.executor.volumes.persistentVolumeClaim.data.mount.path"] == args.output
    assert {"name": "data", "mountPath": args.output} in container["volumeMounts"]
    assert conf["spark.kubernetes.driver.pod.name"] == "$(POD_NAME)"
    assert conf["spark.driver.host"] == "payments-aggregation.shop.svc"
    assert conf["spark.kubernetes.container.image"] == SETTINGS.image
    assert container["resources"]["limits"]["memory"] == f"{pod_memory_mib('1g')}Mi"


def test_the_headless_service_selects_the_driver_and_never_the_workers():
    objects = _by_kind(render_spark_objects("payments", "shop", _spec(), OWNER, SETTINGS))
    service = objects["Service"]["spec"]
    driver_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert service["clusterIP"] == "None"
    assert service["selector"].items() <= driver_labels.items()
    conf = _conf(_parse_cli(objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]))
    assert {p["port"] for p in service["ports"]} == {int(conf["spark.driver.port"]),
                                                     int(conf["spark.driver.blockManager.port"])}
    # The worker StatefulSet and Service select with these labels; Spark pods must not match.
    workers = selector_labels("payments")
    assert not workers.items() <= driver_labels.items()
    assert not workers.items() <= pod_labels("payments", "executor").items()


def test_the_driver_is_bound_to_the_drivers_cluster_role_in_its_namespace_only():
    objects = _by_kind(render_spark_objects("payments", "shop", _spec(), OWNER, SETTINGS))
    granted = {(r, v) for rule in DRIVER_RULES for r in rule["resources"] for v in rule["verbs"]}
    assert {r for r, _ in granted} == {"pods", "configmaps"}  # executors and their conf maps, no more
    assert all(rule["apiGroups"] == [""] for rule in DRIVER_RULES)
    assert ("pods", "create") in granted and ("pods", "delete") in granted and ("pods", "watch") in granted
    assert not any(v in ("*", "patch", "update", "escalate", "bind", "impersonate") for _, v in granted)
    binding = objects["RoleBinding"]
    assert binding["metadata"]["namespace"] == "shop"  # a RoleBinding: the ClusterRole's rules here only
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": SETTINGS.driver_cluster_role}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": objects["ServiceAccount"]["metadata"]["name"],
                                    "namespace": "shop"}]


def test_the_driver_runs_the_specs_trigger_and_retention():
    args = _parse_cli(driver_args("payments", "shop", _spec(triggerSeconds=1.5, retentionMinutes=90), SETTINGS))
    assert (args.trigger_seconds, args.retention_minutes) == (1.5, 90)
    defaults = _parse_cli(driver_args("payments", "shop", _spec(), SETTINGS))
    assert (defaults.trigger_seconds, defaults.retention_minutes) == (5.0, 1440)
    scheduled = driver_args("payments", "shop", _spec(mode="schedule", schedule="0 * * * *", retentionMinutes=0),
                            SETTINGS)
    assert "--trigger-seconds" not in scheduled and _parse_cli(scheduled).retention_minutes == 0


def test_schedule_mode_is_a_non_overlapping_cronjob_running_once():
    spec = _spec(mode="schedule", schedule="0 * * * *", executors=4, executorMemory="3g")
    objects = _by_kind(render_spark_objects("payments", "shop", spec, OWNER, SETTINGS))
    assert "Deployment" not in objects
    cron = objects["CronJob"]["spec"]
    assert cron["schedule"] == "0 * * * *" and cron["concurrencyPolicy"] == "Forbid"
    pod = cron["jobTemplate"]["spec"]["template"]["spec"]
    args = _parse_cli(pod["containers"][0]["args"])
    assert args.continuous is False
    conf = _conf(args)
    assert (conf["spark.executor.instances"], conf["spark.executor.memory"]) == ("4", "3g")
    assert objects["Service"]["spec"]["selector"].items() <= cron["jobTemplate"]["spec"]["template"][
        "metadata"]["labels"].items()


def test_object_store_output_needs_no_volume():
    spec = _spec(output="s3a://bucket/agg")
    objects = _by_kind(render_spark_objects("payments", "shop", spec, OWNER, SETTINGS))
    assert "PersistentVolumeClaim" not in objects
    args = _parse_cli(objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args.checkpoint == "s3a://bucket/agg/_checkpoint"
    assert not any("persistentVolumeClaim" in k for k in _conf(args))


@pytest.mark.parametrize(("aggregation", "message"), [
    ({"checkpoint": "/elsewhere/ckpt"}, "must be under aggregation.output"),
    ({"output": "s3a://bucket/agg", "checkpoint": "/tmp/ckpt"}, "object-store URL"),
])
def test_unrenderable_specs_say_what_to_change(aggregation, message):
    with pytest.raises(SparkRenderError, match=message):
        render_spark_objects("payments", "shop", _spec(**aggregation), OWNER, SETTINGS)


def test_kubernetes_memory_units_are_rejected_when_the_spec_is_parsed():
    with pytest.raises(SpecError, match=r"aggregation\.executorMemory"):
        parse_spec({"kafka": {"topic": "events"}, "aggregation": {"enabled": True, "executorMemory": "1Gi"}})


def test_a_cluster_needs_explicit_bootstrap_servers():
    spec = parse_spec({"kafka": {"topic": "events"}, "aggregation": {"enabled": True}})
    with pytest.raises(SparkRenderError, match="bootstrapServers"):
        driver_args("payments", "shop", spec, SETTINGS)


@pytest.mark.parametrize(("memory", "mib"), [("1g", 1434), ("512m", 896), ("4096M", 5735), ("2G", 2868)])
def test_pod_memory_is_heap_plus_spark_overhead(memory, mib):
    assert pod_memory_mib(memory) == mib


def _unknown_fields(model: type[Any], data: dict[str, Any], path: str = "") -> list[str]:
    """Keys of `data` that `model` (a kubeflow-spark-api model) does not declare, recursively.
    Its models ignore unknown keys when validating; the CRD's structural schema would prune them."""
    import typing

    from pydantic import BaseModel

    def models(annotation: Any) -> list[type[BaseModel]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for arg in typing.get_args(annotation) for m in models(arg)]

    fields = {f.alias or name: f for name, f in model.model_fields.items()}
    problems = []
    for key, value in data.items():
        if key not in fields:
            problems.append(f"{path}{key}")
            continue
        for sub in models(fields[key].annotation):
            items = value if isinstance(value, list) else [value]
            for item in items:
                if isinstance(item, dict):
                    problems += _unknown_fields(sub, item, f"{path}{key}.")
    return problems


def _validate_spark_operator_object(obj: dict[str, Any]) -> None:
    """Validate against the Kubeflow Spark Operator's own API models (PyPI kubeflow-spark-api,
    generated from the operator's API types): every key declared, every value of its type."""
    from kubeflow_spark_api.models import SparkV1beta2ScheduledSparkApplication, SparkV1beta2SparkApplication

    model = {"SparkApplication": SparkV1beta2SparkApplication,
             "ScheduledSparkApplication": SparkV1beta2ScheduledSparkApplication}[obj["kind"]]
    assert obj["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    assert _unknown_fields(model, obj) == []
    model.from_dict(obj)  # raises on a wrong type or a missing required field


def test_spark_application_for_the_spark_operator():
    app = render_spark_application("payments", "shop", _spec(executors=2), OWNER, SETTINGS)
    _validate_spark_operator_object(app)
    spec = app["spec"]
    assert spec["mainApplicationFile"].endswith("keyrange/aggregation/__main__.py")
    assert spec["restartPolicy"] == {"type": "Always"}
    assert spec["executor"]["instances"] == 2
    args = _parse_cli(["aggregate", *spec["arguments"]])
    assert args.master == "spark-submit"  # the operator's spark-submit decides the master
    assert args.continuous is True
    assert not any(k.startswith("spark.driver.") or "$(" in v for k, v in _conf(args).items())

    scheduled = render_spark_application("payments", "shop", _spec(mode="schedule", schedule="@hourly"),
                                         OWNER, SETTINGS)
    _validate_spark_operator_object(scheduled)
    assert _parse_cli(["aggregate", *scheduled["spec"]["template"]["arguments"]]).continuous is False


def test_the_spark_operator_runs_the_installed_spark_with_the_images_kafka_connector():
    from keyrange.aggregation.connector import IMAGE_TOOLS, pyspark_version

    app = render_spark_application("payments", "shop", _spec(), OWNER, SETTINGS)["spec"]
    assert app["sparkVersion"] == pyspark_version()
    classpath = f"{IMAGE_TOOLS}/spark-jars/{pyspark_version()}/*"
    assert app["sparkConf"] == {"spark.driver.extraClassPath": classpath, "spark.executor.extraClassPath": classpath}
    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    assert f"install-spark-connector.sh {IMAGE_TOOLS} " in dockerfile  # where the image puts the jars
    with pytest.raises(AssertionError):  # the check does catch a key the operator does not know
        _validate_spark_operator_object({**render_spark_application("p", "s", _spec(), OWNER, SETTINGS),
                                         "spec": {**app, "sparkConfig": {}}})
