"""Fault-test handles over a local `KafkaCluster`: who leads a partition, which replicas are in
sync, the address of an extra listener, and healing the nodes a test killed or froze."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient

from keyrange.local.embedded_broker import BrokerError
from keyrange.local.kafka_cluster import KafkaCluster, KafkaNode


@dataclass(frozen=True)
class PartitionReplicas:
    """One partition's leader and replicas (node ids), as the cluster's metadata describes them."""

    leader: int
    """-1 while the partition has no leader."""
    replicas: tuple[int, ...]
    in_sync: frozenset[int]


def _answering_admin(cluster: KafkaCluster) -> AdminClient:
    """An admin client of the nodes that run and are not frozen (a frozen node accepts connections,
    then never answers)."""
    answering = ",".join(n.bootstrap for n in cluster.members if n.is_running() and not n.paused)
    return AdminClient({"bootstrap.servers": answering, "log_level": 0})


def partition_replicas(cluster: KafkaCluster, topic: str,
                       timeout_seconds: float = 10.0) -> dict[int, PartitionReplicas]:
    """Each partition of `topic`: leader, replicas and in-sync replicas, as the metadata of the
    running, unfrozen nodes says now."""
    meta = _answering_admin(cluster).list_topics(topic, timeout=timeout_seconds).topics.get(topic)
    if meta is None or meta.error is not None:
        raise BrokerError(f"no metadata for topic {topic!r}: {meta.error if meta else 'unknown topic'}")
    return {p: PartitionReplicas(m.leader, tuple(m.replicas), frozenset(m.isrs)) for p, m in meta.partitions.items()}


def leader_of(cluster: KafkaCluster, topic: str, partition: int, timeout_seconds: float = 10.0) -> KafkaNode:
    """The node that leads `topic`'s `partition`, as the cluster's metadata says now (waits for one)."""
    admin = _answering_admin(cluster)
    deadline = time.monotonic() + timeout_seconds
    while True:
        meta = admin.list_topics(topic, timeout=timeout_seconds).topics.get(topic)
        leader = -1 if meta is None or partition not in meta.partitions else meta.partitions[partition].leader
        if leader >= 0:
            return cluster.node(leader)
        if time.monotonic() > deadline:
            raise BrokerError(f"{topic}[{partition}] has no leader after {timeout_seconds:g} s")
        time.sleep(0.1)


def bootstrap_for(cluster: KafkaCluster, listener: str) -> str:
    """Every node's address on an extra listener (`KafkaCluster.extra_listeners`)."""
    return ",".join(f"127.0.0.1:{n.address.extra_ports[listener]}" for n in cluster.members)


def heal(cluster: KafkaCluster, timeout_seconds: float | None = None) -> None:
    """Resume paused nodes and start stopped or killed ones; wait until all serve again."""
    for node in cluster.members:
        if node.paused:
            node.resume()
        if not node.is_running():
            node.terminate()  # reaps a node that died on its own
            node.launch()
    cluster.wait_until_ready(timeout_seconds or cluster.start_timeout_seconds)
