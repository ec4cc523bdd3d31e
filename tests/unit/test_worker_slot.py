"""SlotState's API: what each method does to a held slot, seen through its other methods (no Kafka)."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import REGISTRY

from keyrange.events import SOURCE_OFFSET_HEADER, TOTALS_KEY, totals_key
from keyrange.worker.commitwindow import Outcome, Totals
from keyrange.worker.restore import Finished, RestoredPartition
from keyrange.worker.slot import SlotMetrics, SlotState
from keyrange.worker.transactions import OutputRecord
from tests.slotstate import STATE_TOPIC, held_slot, take_staged

NOW_S = time.time()


def processed(offset: int) -> OutputRecord:
    return OutputRecord("events.processed", 0, str(offset).encode(), b"{}")


def test_admit_takes_each_new_offset_once_and_counts_it_as_consumed() -> None:
    slot = held_slot()
    assert slot.admit(0, 1_000, 10) and slot.admit(1, 1_001, 20)
    assert not slot.admit(1, 1_001, 20)  # delivered again (after a resume): already in the window
    assert (slot.next_offset, slot.pending, slot.pending_bytes) == (2, 2, 30)
    assert slot.take_consumed() == 2 and slot.take_consumed() == 0
    slot.revoke()
    assert not slot.admit(2, 1_002, 10) and slot.take_consumed() == 0  # fetched just before a release
    assert slot.next_offset == 2


def test_an_offset_an_earlier_owner_finished_is_finished_with_its_outcome_and_its_uuid_joins_the_window() -> None:
    slot = held_slot(restored=RestoredPartition(5, finished_offsets={
        6: Finished(Outcome.DEAD_LETTERED, "u6", NOW_S)}))
    assert slot.admit(5, 0, 1)
    assert not slot.admit(6, 0, 1)  # not run again, but consumed
    assert slot.take_consumed() == 2 and slot.finished_ahead == 1
    assert slot.admit(7, 0, 1)
    assert not slot.first_seen(7, "u6", NOW_S)  # its uuid is in the dedup window: 7 is a duplicate
    assert slot.committable == 5 and slot.finished_ahead == 2
    slot.finish_processed(5, processed(5), 1, None, False)
    assert slot.committable == 8 and slot.finished_ahead == 0


def test_a_duplicate_finishes_its_offset_and_is_counted_when_the_offset_commits() -> None:
    slot = held_slot()
    for offset in range(3):
        assert slot.admit(offset, 0, 0)
    assert slot.first_seen(0, "a", NOW_S) and slot.first_seen(1, "b", NOW_S)
    assert not slot.first_seen(2, "a", NOW_S)
    assert slot.committable == 0 and slot.dedup_entries == 2
    slot.finish_processed(0, processed(0), 7, None, False)
    slot.finish_dead_lettered(1, None, "handler-error")  # too large for the DLQ: counted, not written
    batch = slot.take_batch("events", STATE_TOPIC)
    assert batch is not None and batch.committable == 3
    assert batch.totals == Totals(handled=1, dead_lettered=1, duplicates_dropped=1) and batch.duplicates == 1
    assert (batch.processed, batch.dead_letters) == (1, ["handler-error"])
    assert [r.key for r in batch.records] == [b"0", TOTALS_KEY]
    assert slot.committed_offset == 0  # not committed until told
    slot.committed(batch)
    assert (slot.committed_offset, slot.committed_totals) == (3, batch.totals)
    assert slot.take_batch("events", STATE_TOPIC) is None  # nothing new


def test_a_handled_event_sets_or_deletes_its_clients_state_in_the_store_and_the_changelog() -> None:
    slot = held_slot()
    for offset in range(3):
        slot.admit(offset, 0, 0)
    slot.finish_processed(0, processed(0), 7, b"1", False)
    slot.finish_processed(1, processed(1), 8, b"2", False)
    assert slot.state_of(7) == b"1" and dict(slot.states) == {7: b"1", 8: b"2"}
    slot.finish_processed(2, processed(2), 7, None, True)
    assert slot.state_of(7) is None and dict(slot.state_offsets) == {8: 1}
    staged = take_staged(slot)
    assert staged is not None and [r.key for r in staged.outputs] == [b"0", b"1", b"2"]
    changes = [(r.key, r.value, r.headers) for r in staged.changelog if r.key != TOTALS_KEY]
    assert changes == [(b"7", None, [(SOURCE_OFFSET_HEADER, b"2")]), (b"8", b"2", [(SOURCE_OFFSET_HEADER, b"1")])]


def test_a_handler_call_holds_the_slots_release_until_it_ends_and_none_starts_once_revoked() -> None:
    async def scenario() -> None:
        slot = held_slot()
        assert slot.call_started() and slot.running == 1
        drained = asyncio.ensure_future(slot.drained())
        slot.revoke()
        assert not slot.call_started() and slot.running == 1  # a queued event of a revoked slot does not start
        await asyncio.sleep(0)
        assert not drained.done()
        slot.call_ended()
        await asyncio.wait_for(drained, 1)
        assert slot.revoked and slot.running == 0

    asyncio.run(scenario())


def test_a_slot_pauses_past_either_limit_and_resumes_at_half_of_both() -> None:
    slot = held_slot()
    for offset in range(5):
        slot.admit(offset, 0, 100)
    assert slot.wants_pause(4, 10_000) and slot.wants_pause(10, 400) and not slot.wants_pause(10, 10_000)
    slot.set_paused(True)
    assert slot.paused and not slot.wants_pause(4, 10_000)
    assert not slot.wants_resume(8, 10_000)  # 5 pending is over half of 8
    for offset in range(2):
        slot.finish_dead_lettered(offset, None, "bad")
    assert slot.wants_resume(8, 10_000) and not slot.wants_resume(8, 500)
    slot.set_paused(False)
    assert not slot.paused and not slot.wants_resume(8, 10_000)


def test_a_released_slot_drops_what_it_staged() -> None:
    slot = held_slot()
    slot.admit(0, 0, 0)
    slot.finish_processed(0, processed(0), 7, b"1", False)
    slot.discard()
    staged = take_staged(slot)  # only the committable offset's totals record is left
    assert staged is not None and staged.outputs == [] and [r.key for r in staged.changelog] == [TOTALS_KEY]


def test_the_gauges_report_lag_from_the_committable_offset_and_the_oldest_unfinished_event() -> None:
    slot = held_slot()
    slot.admit(0, 10_000, 0)
    slot.admit(1, 12_000, 0)
    slot.finish_dead_lettered(1, None, "bad")
    assert slot.report(10, 15_000) == (10, 5.0)  # offset 0 (10 s) is unfinished
    assert slot.report(-1, 15_000) == (0, 5.0)  # no high watermark known
    slot.finish_dead_lettered(0, None, "bad")
    assert slot.report(10, 15_000) == (8, 0.0)


def test_a_slots_lag_in_records_is_not_exported_while_its_partitions_end_is_unknown() -> None:
    """Unmeasured is not 0: a lag read as 0 while events wait would count its first measure as
    growth (an input rate it never had) and let a merge go ahead in an outage."""
    slot = held_slot(7)
    labels = {"consumer": "c", "worker": "w0", "partition": "7"}

    def exported() -> float | None:
        return REGISTRY.get_sample_value("keyrange_consumer_lag", labels)

    assert exported() is None  # acquired, not yet measured
    slot.admit(0, 10_000, 0)
    slot.report(-1, 15_000)
    assert exported() is None
    slot.report(10, 15_000)
    assert exported() == 10
    slot.report(-1, 15_000)  # its end could not be read (an outage): unmeasured again
    assert exported() is None
    slot.report(10, 15_000)
    assert exported() == 10


def test_a_slot_keeps_its_identity_apart_from_the_partition_it_reads() -> None:
    """Today a slot is one whole partition; a slot's Kafka calls must read `partition` all the same."""
    slot = SlotState(4, 1, RestoredPartition(0), 10.0, time.time, SlotMetrics("c", "w0", 1), None, 1)  # type: ignore[arg-type]
    slot.admit(0, 0, 0)
    slot.finish_processed(0, processed(0), 7, b"1", False)
    batch = slot.take_batch("events", STATE_TOPIC)
    assert batch is not None and [(tp.topic, tp.partition, tp.offset) for tp in batch.offsets] == [("events", 1, 1)]
    assert {r.partition for r in batch.records if r.topic == STATE_TOPIC} == {1}
    assert (slot.slot, slot.partition, slot.metrics.labels[2]) == (4, 1, "1")  # the metrics' label stays `partition`


def test_a_hash_range_commits_its_position_in_its_totals_record_after_its_outputs_and_its_share_of_lag() -> None:
    slot = SlotState(5, 1, RestoredPartition(0), 10.0, time.time, SlotMetrics("c", "w0", "1:1/4"), None, 1,  # type: ignore[arg-type]
                     totals_key(1, 4), 4)
    assert not slot.whole_partition
    slot.admit(0, 0, 0)
    slot.pass_offset(1)  # another hash range's record of partition 1
    slot.pass_offset(2)
    slot.finish_processed(0, processed(0), 7, b"1", False)
    batch = slot.take_batch("events", STATE_TOPIC)
    assert batch is not None
    # No group offset: the partition's other slots are elsewhere; the position is the totals record,
    # written last, once the outputs are acknowledged.
    assert batch.offsets == [] and batch.committable == 3
    assert [(r.topic, r.key) for r in batch.last] == [(STATE_TOPIC, b"keyrange.totals.1/4")]
    assert dict(batch.last[0].headers or [])[SOURCE_OFFSET_HEADER] == b"3"
    assert all(r.key != b"keyrange.totals.1/4" for r in batch.records)
    slot.committed(batch)
    assert slot.committed_offset == 3
    assert slot.report(43, 0)[0] == 10  # 40 records past it in the partition: about a quarter are its own


def test_a_batch_taken_while_the_last_one_is_in_flight_counts_from_that_one() -> None:
    """A release takes the slot's last batch while the transaction in flight still carries the one
    before, to join it: what the second counts (duplicates, the offset moved) starts where the first
    ends, so nothing is counted twice, and it carries no offset that did not move since."""
    slot = held_slot()
    for offset in range(4):
        assert slot.admit(offset, 0, 0)
    assert slot.first_seen(0, "a", NOW_S) and slot.first_seen(1, "b", NOW_S)
    assert not slot.first_seen(2, "a", NOW_S)
    slot.finish_processed(0, processed(0), 7, None, False)
    slot.finish_processed(1, processed(1), 7, None, False)
    first = slot.take_batch("events", STATE_TOPIC)
    assert first is not None and (first.committable, first.duplicates) == (3, 1)
    assert slot.take_batch("events", STATE_TOPIC) is None  # nothing since: the first carries offset 3

    assert not slot.first_seen(3, "b", NOW_S)
    second = slot.take_batch("events", STATE_TOPIC)
    assert second is not None and (second.committable, second.duplicates) == (4, 1)
    assert [(tp.partition, tp.offset) for tp in second.offsets] == [(0, 4)]
    slot.committed(first)
    slot.committed(second)
    assert slot.committed_offset == 4 and slot.committed_totals.duplicates_dropped == 2


def test_a_batch_taken_while_a_snapshot_is_in_flight_writes_no_second_one() -> None:
    slot = held_slot(restored=RestoredPartition(0, changelog_records=100_000))  # a snapshot is due
    slot.change_state(1000, b"1", 0)
    first = slot.take_batch("events", STATE_TOPIC)
    assert first is not None and first.snapshot is not None
    slot.change_state(1001, b"2", 1)
    second = slot.take_batch("events", STATE_TOPIC)
    assert second is not None and second.snapshot is None
    assert [r.key for r in second.records] == [b"1001"]
