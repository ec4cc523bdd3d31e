"""KRaft cluster ids for the test and CLI Kafka clusters."""

import base64

from keyrange.local.kafka_cluster import new_cluster_id


def test_cluster_ids_never_start_with_a_dash_and_are_uuids() -> None:
    # One random id in 64 starts with "-" unless rejected; 2,000 draws miss that with odds ~1e-14.
    ids = [new_cluster_id() for _ in range(2000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)
