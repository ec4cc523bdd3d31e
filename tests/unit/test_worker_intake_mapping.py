"""The intake under an input mapping: misplaced events are counted for `field:` and `header:`
clientIds and never for `clientId: key`; `uuid: none` lets a re-sent record through; a bad
record's dead letter keeps the record's headers and timestamp."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson

from keyrange.events import DLQ_SOURCE_TIMESTAMP, totals_key
from keyrange.inputmapping import InputMapping, kept_headers
from keyrange.ranges.layout import SlotLayout
from keyrange.ranges.slots import partition_for_client
from keyrange.worker.intake import Intake
from keyrange.worker.restore import RestoredPartition
from keyrange.worker.slot import SlotState

PARTITIONS = 12
NOW_MS = 1_800_000_000_000


class Record:
    """The part of a confluent_kafka Message the intake reads."""

    def __init__(self, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]] | None) -> None:
        self._key, self._value, self._headers = key, value, headers

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return 1, NOW_MS


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def inc(self) -> None:
        self.count += 1


class DeadLetters:
    """Stands in for Outputs: records each dead letter's reason and kept record."""

    def __init__(self) -> None:
        self.letters: list[tuple[str, Any]] = []

    def dead_letter(self, partition: int, offset: int, key: Any, value: Any, reason: str, detail: str, attempts: int,
                    record: Any = None) -> None:
        self.letters.append((reason, record))


def held_slot_of(partition: int) -> Any:
    """A held slot of `partition` whose metrics are counters read back here."""
    counters = SimpleNamespace(misplaced=Counter(), skewed_ahead=Counter(), skewed_behind=Counter())
    return SlotState(partition, partition, RestoredPartition(0), 10.0, lambda: NOW_MS / 1000 + 60,
                     counters, None, partition)  # type: ignore[arg-type]


def admit_all(mapping: InputMapping, records: list[Record], partition: int) -> tuple[Any, list[Any], DeadLetters]:
    outputs = DeadLetters()
    intake = Intake(PARTITIONS, 10.0, outputs, mapping=mapping)  # type: ignore[arg-type]
    slot = held_slot_of(partition)
    jobs = [intake.admit(slot, r, offset) for offset, r in enumerate(records)]
    return slot, jobs, outputs


def test_misplaced_is_counted_for_header_ids_and_not_for_keys() -> None:
    home = partition_for_client("user-7", PARTITIONS)
    elsewhere = (home + 1) % PARTITIONS
    by_header = InputMapping(client_id="header:user", uuid="header:id", created="timestamp")
    records = [Record(b"k", b"{}", [("user", b"user-7"), ("id", f"e{i}".encode())]) for i in range(3)]
    slot, jobs, _ = admit_all(by_header, records, elsewhere)
    assert all(job is not None for job in jobs) and slot.metrics.misplaced.count == 3
    slot, _, _ = admit_all(by_header, records, home)
    assert slot.metrics.misplaced.count == 0
    by_key = InputMapping(client_id="key", uuid="header:id", created="timestamp")
    keyed = [Record(b"user-7", b"{}", [("id", f"e{i}".encode())]) for i in range(3)]
    slot, _, _ = admit_all(by_key, keyed, elsewhere)
    assert slot.metrics.misplaced.count == 0


def test_uuid_none_handles_a_resent_record_and_a_uuid_drops_it() -> None:
    record = Record(b"user-7", b"{}", [("id", b"e-1")])
    partition = partition_for_client("user-7", PARTITIONS)
    _, jobs, _ = admit_all(InputMapping(client_id="key", uuid="none", created="timestamp"), [record, record], partition)
    assert all(job is not None for job in jobs)
    _, jobs, _ = admit_all(InputMapping(client_id="key", uuid="header:id", created="timestamp"), [record, record],
                           partition)
    assert jobs[0] is not None and jobs[1] is None


def test_a_bad_records_dead_letter_keeps_its_headers_and_timestamp() -> None:
    mapping = InputMapping(client_id="key", uuid="header:id", created="timestamp")
    _, jobs, outputs = admit_all(mapping, [Record(b"user-7", b"{}", [("other", b"x")])], 0)
    assert jobs == [None]
    [(reason, record)] = outputs.letters
    assert reason == "missing-field"
    assert kept_headers(record) == [("other", b"x"), (DLQ_SOURCE_TIMESTAMP, str(NOW_MS).encode())]


class CountingRecord(Record):
    """A Record that counts how often its headers are asked for."""

    def __init__(self, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]] | None) -> None:
        super().__init__(key, value, headers)
        self.asked = 0

    def headers(self) -> list[tuple[str, bytes]] | None:
        self.asked += 1
        return super().headers()


def test_headers_are_read_only_by_a_mapping_that_reads_one_and_dead_letters_keep_them_anyway() -> None:
    body = b'{"uuid": "e-1"}'
    by_field = InputMapping(client_id="key", uuid="field:uuid", created="timestamp")
    good, bad = CountingRecord(b"user-7", body, [("trace", b"t")]), CountingRecord(b"", body, [("trace", b"t")])
    _, jobs, outputs = admit_all(by_field, [good, bad], partition_for_client("user-7", PARTITIONS))
    assert jobs[0] is not None and jobs[1] is None and good.asked == bad.asked == 0
    # Each dead letter (bad input now, a failing handler later) still keeps the record's headers.
    [(reason, record)] = outputs.letters
    assert reason == "bad-field" and kept_headers(record)[0] == ("trace", b"t")
    assert kept_headers(jobs[0].record)[0] == ("trace", b"t")
    by_header = InputMapping(client_id="key", uuid="header:trace", created="timestamp")
    good = CountingRecord(b"user-7", body, [("trace", b"t")])
    _, jobs, _ = admit_all(by_header, [good], partition_for_client("user-7", PARTITIONS))
    assert jobs[0] is not None and jobs[0].event.uuid == "t" and good.asked == 1


def test_a_hash_range_counts_a_client_keyed_otherwise_than_by_its_id_as_misplaced() -> None:
    # With partitions cut into hash ranges a record is routed by its key; a clientId whose own hash
    # falls in another range of the same partition would have its events split over two slots.
    layout = SlotLayout(1, 2)
    clients = [c for c in range(200) if partition_for_client(c, 1) == 0]
    here = [c for c in clients if layout.slot_for_key(0, str(c).encode()) == 1][:2]
    away = next(c for c in clients if layout.slot_for_key(0, str(c).encode()) == 0)
    intake = Intake(1, 10.0, DeadLetters(), mapping=InputMapping(client_id="field:clientId", uuid="field:uuid",
                                                                 created="timestamp"))  # type: ignore[arg-type]
    intake.layout = layout
    counters = SimpleNamespace(misplaced=Counter(), skewed_ahead=Counter(), skewed_behind=Counter())
    slot = SlotState(1, 0, RestoredPartition(0), 10.0, lambda: NOW_MS / 1000 + 60, counters, None, 0,  # type: ignore[arg-type]
                     totals_key(1, 2))
    records = [Record(str(c).encode(), orjson.dumps({"clientId": c, "uuid": f"u{c}"}), None) for c in [*here, away]]
    jobs = [intake.admit(slot, r, offset) for offset, r in enumerate(records)]
    assert all(job is not None for job in jobs)
    assert slot.metrics.misplaced.count == 1
