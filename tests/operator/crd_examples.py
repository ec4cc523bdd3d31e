"""StreamConsumer specs the CRD and spec.py must both accept (VALID) or both refuse (INVALID): checked
offline against the CRD's schema (test_crd) and by a real kube-apiserver (test_crd_server)."""

from __future__ import annotations

from typing import Any

TOPIC = {"kafka": {"topic": "events", "bootstrapServers": "kafka:9092"}}

VALID: list[dict[str, Any]] = [
    TOPIC,
    {"kafka": {"topic": "a.b_c-1"}},
    {**TOPIC, "handler": "ledger", "handlerConfig": {"delayMs": 5, "nested": {"x": [1, 2]}}},
    {**TOPIC, "handler": "my_pkg.handlers:on_event"},
    {**TOPIC, "dedup": {"ttlSeconds": 0.5}},
    {**TOPIC, "dedup": {"ttlSeconds": 86400}},
    {**TOPIC, "concurrency": 1, "maxPending": 1, "maxRetries": 0},
    {**TOPIC, "workers": {"min": 3, "max": 3}},
    {**TOPIC, "workers": {"min": 2, "max": 8, "replicas": 5}},
    {**TOPIC, "workers": {"max": 1}},
    {**TOPIC, "scaling": {"lagHighRecords": 10, "lagLowRecords": 9, "cooldownSeconds": 0}},
    {**TOPIC, "scaling": {"lagHighSeconds": 0.1}},
    {**TOPIC, "sink": {"topic": "out"}, "deadLetterTopic": "out.dlq", "image": "ghcr.io/x/keyrange:1"},
    {**TOPIC, "resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "512Mi"}}},
    {**TOPIC, "aggregation": {"enabled": True, "mode": "schedule", "schedule": "*/5 * * * *"}},
    {**TOPIC, "aggregation": {"enabled": True, "executors": 4, "executorMemory": "2g"}},
    {**TOPIC, "aggregation": {"enabled": True, "triggerSeconds": 0.5, "retentionMinutes": 0}},
    {**TOPIC, "kafka": {"topic": "t", "groupId": "g", "partitions": 10000}},
    {**TOPIC, "image": None, "sink": {"topic": None}},  # nulls mean "not set" on both sides
    {**TOPIC, "suspend": True},
    {**TOPIC, "env": [{"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
                      {"name": "MODE", "value": "fast"}],
     "envFrom": [{"secretRef": {"name": "handler-secrets"}}, {"prefix": "CFG_", "configMapRef": {"name": "c"}}]},
    {**TOPIC, "imagePullPolicy": "Always", "imagePullSecrets": [{"name": "regcred"}]},
    {**TOPIC, "nodeSelector": {"pool": "stream"}, "priorityClassName": "keyrange-workers",
     "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "stream", "effect": "NoSchedule"}],
     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
         {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["stream"]}]}]}}},
     "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                    "whenUnsatisfiable": "DoNotSchedule"}]},
]

INVALID: list[dict[str, Any]] = [
    {},
    {**TOPIC, "concurrency": "10"},  # a string is not a number, locally as in the cluster
    {**TOPIC, "dedup": {"ttlSeconds": "10"}},
    {**TOPIC, "aggregation": {"enabled": True, "executorMemory": "2Gi"}},  # Kubernetes units, not Spark's
    {**TOPIC, "aggregation": {"enabled": True, "driverMemory": "lots"}},
    {**TOPIC, "aggregation": {"enabled": True, "triggerSeconds": 0}},
    {**TOPIC, "aggregation": {"enabled": True, "triggerSeconds": 3601}},
    {**TOPIC, "aggregation": {"enabled": True, "retentionMinutes": -1}},
    {**TOPIC, "aggregation": {"enabled": True, "retentionMinutes": 1.5}},
    {"kafka": {}},
    {"kafka": {"topic": ""}},
    {"kafka": {"topic": "has space"}},
    {"kafka": {"topic": "x" * 250}},
    {"kafka": {"topic": "t", "partitions": 0}},
    {"kafka": {"topic": "t", "unknown": 1}},
    {**TOPIC, "surprise": True},
    {**TOPIC, "handler": "not a handler"},
    {**TOPIC, "handler": "module_without_function"},
    {**TOPIC, "dedup": {"ttlSeconds": 0}},
    {**TOPIC, "dedup": {"ttlSeconds": -1}},
    {**TOPIC, "dedup": {"ttlSeconds": 86401}},
    {**TOPIC, "concurrency": 0},
    {**TOPIC, "maxPending": 0},
    {**TOPIC, "maxRetries": 101},
    {**TOPIC, "workers": {"min": 0}},
    {**TOPIC, "workers": {"min": 4, "max": 3}},
    {**TOPIC, "workers": {"min": 7}},  # above the default max of 6
    {**TOPIC, "workers": {"min": 2, "max": 4, "replicas": 5}},
    {**TOPIC, "workers": {"min": 2, "max": 4, "replicas": 1}},
    {**TOPIC, "scaling": {"lagHighRecords": 0}},
    {**TOPIC, "scaling": {"lagLowRecords": 5000}},
    {**TOPIC, "scaling": {"lagHighSeconds": 0}},
    {**TOPIC, "scaling": {"cooldownSeconds": -1}},
    {**TOPIC, "sink": {"topic": "bad topic"}},
    {**TOPIC, "deadLetterTopic": "bad/topic"},
    {**TOPIC, "resources": {"requests": {"cpu": 1}}},
    {**TOPIC, "resources": {"claims": []}},
    {**TOPIC, "aggregation": {"mode": "schedule"}},
    {**TOPIC, "aggregation": {"mode": "batch"}},
    {**TOPIC, "aggregation": {"executors": 0}},
    {"kafka": {"topic": "t"}, "sink": {"topic": "t"}},  # outputs into the input: they would be consumed again
    {"kafka": {"topic": "t"}, "deadLetterTopic": "t"},  # dead letters would loop
    {"kafka": {"topic": "t"}, "sink": {"topic": "x"}, "deadLetterTopic": "x"},
    {"kafka": {"topic": "t"}, "deadLetterTopic": "t.processed"},  # the default sink
    {**TOPIC, "suspend": "yes"},
    {**TOPIC, "env": [{"value": "no name"}]},
    {**TOPIC, "env": [{"name": "1BAD"}]},
    {**TOPIC, "env": [{"name": "BOTH", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
    {**TOPIC, "envFrom": [{"prefix": "NOTHING_"}]},
    {**TOPIC, "envFrom": [{"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}}]},
    {**TOPIC, "envFrom": [{"secretRef": {}}]},
    {**TOPIC, "imagePullPolicy": "Sometimes"},
    {**TOPIC, "imagePullSecrets": [{}]},
    {**TOPIC, "nodeSelector": {"pool": 1}},
    {**TOPIC, "tolerations": [{"operator": "Maybe"}]},
    {**TOPIC, "tolerations": [{"key": "k", "surprise": 1}]},
    {**TOPIC, "priorityClassName": "Not_A_Name"},
    {**TOPIC, "affinity": "anywhere"},
]
