"""The Kubernetes types of a StreamConsumer's worker pod fields (spec.py declares the fields).

The fields mirror the Pod and Container fields of the same names, so they can be copied from any
Deployment: `env`, `envFrom`, `imagePullPolicy`, `imagePullSecrets`, `nodeSelector`, `affinity`,
`tolerations`, `topologySpreadConstraints`, `priorityClassName`. Only a cluster uses them
(`keyrange run` ignores them). The small types are checked here and by the CRD alike; `affinity`
and the topology spread constraints are Kubernetes' own large types, checked by the API server
when the operator applies the workers' StatefulSet (a refusal is reported in the
StreamConsumer's status).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True, strict=True)


class EnvVar(_Model):
    """One environment variable of the worker container (Kubernetes' EnvVar)."""

    name: str = Field(min_length=1, pattern=ENV_NAME_PATTERN)
    value: str | None = None
    value_from: dict[str, Any] | None = Field(default=None, alias="valueFrom")
    """secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef, as in a Pod."""

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: set value or valueFrom, not both")
        return self


class LocalObjectRef(_Model):
    """A ConfigMap or Secret in the StreamConsumer's namespace."""

    name: str = Field(min_length=1, max_length=253)
    optional: bool | None = None


class EnvFromSource(_Model):
    """Every key of a ConfigMap or Secret as environment variables (Kubernetes' EnvFromSource)."""

    prefix: str | None = None
    config_map_ref: LocalObjectRef | None = Field(default=None, alias="configMapRef")
    secret_ref: LocalObjectRef | None = Field(default=None, alias="secretRef")

    @model_validator(mode="after")
    def _one_source(self) -> EnvFromSource:
        if (self.config_map_ref is None) == (self.secret_ref is None):
            raise ValueError("each envFrom item needs exactly one of configMapRef and secretRef")
        return self


class PullSecretRef(_Model):
    """A Secret of type kubernetes.io/dockerconfigjson in the StreamConsumer's namespace."""

    name: str = Field(min_length=1, max_length=253)


class Toleration(_Model):
    """Lets the workers run on nodes with a matching taint (Kubernetes' Toleration)."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")
