"""Each of a worker's Kafka clients says which worker and which role it is (client.id), so broker
logs, quotas and librdkafka's log lines tell them apart; a client.id the user gives wins."""

from __future__ import annotations

import asyncio
from typing import Any

from keyrange.worker.consumer import consumer_config
from keyrange.worker.settings import WorkerSettings
from keyrange.worker.transactions import SlotTransactions
from tests.unit.worker_fakes import RecordingProducer

SETTINGS = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="2")


def test_the_fetch_and_restore_consumers_name_the_worker_and_their_role() -> None:
    assert consumer_config(SETTINGS)["client.id"] == "keyrange-worker-2-fetch"
    assert consumer_config(SETTINGS, "restore")["client.id"] == "keyrange-worker-2-restore"


def test_a_slot_producer_names_its_slot() -> None:
    configs: list[dict[str, Any]] = []

    def make_producer(config: dict[str, Any]) -> RecordingProducer:
        configs.append(config)
        return RecordingProducer()

    slot = SlotTransactions(SETTINGS, 7, group_metadata=None, make_producer=make_producer)  # type: ignore[arg-type]
    asyncio.run(slot.open())  # after the producer is created
    assert configs[0]["client.id"] == "keyrange-worker-2-slot-7"
    assert configs[0]["transactional.id"] != configs[0]["client.id"]


def test_the_users_client_id_wins() -> None:
    settings = WorkerSettings(bootstrap="127.0.0.1:1", topic="events", group_id="g", worker_id="2",
                              client_properties={"client.id": "payments"})
    assert consumer_config(settings)["client.id"] == "payments"
