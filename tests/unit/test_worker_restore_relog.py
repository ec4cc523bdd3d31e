"""A state restored from a processed record at or past the committed offset goes to the changelog again.

On tansu a killed owner's open transaction is committed torn: a processed record can be visible
while its changelog record is not. The restore takes that client's state from the processed record
(restore.py); unless the new owner writes it to the changelog, a later restore from a committed
offset past that event folds only the changelog and loses the event's effect (a ledger result short
of the oracle's, with no loss and no duplicate)."""

from __future__ import annotations

from keyrange.events import SOURCE_OFFSET_HEADER, json_bytes
from keyrange.worker.commitwindow import Outcome
from keyrange.worker.restore import OutputEntry, ParsedLogs, RestoredPartition, StateEntry, fold_logs
from tests.slotstate import held_slot


def test_a_state_taken_from_a_processed_record_past_the_committed_offset_is_marked_for_the_changelog() -> None:
    logs = ParsedLogs()
    logs.states[0] = [StateEntry(7, 4, {"n": 1}), StateEntry(8, 5, {"n": 5})]
    # Offset 12 finished in a torn transaction: its processed record shows, its changelog record does not.
    logs.outputs = [OutputEntry(0, 12, "u12", 12.0, (7, {"n": 2}), Outcome.HANDLED, b"7"),
                    OutputEntry(0, 13, "u13", 13.0, (9, None), Outcome.HANDLED, b"9")]
    restored = fold_logs({0: 10}, logs)[0]
    assert restored.state == {7: {"n": 2}, 8: {"n": 5}}
    assert restored.from_outputs == {7: 12, 9: 13}


def test_the_first_transaction_after_the_acquire_writes_those_states_to_the_changelog() -> None:
    restored = RestoredPartition(10, state={7: {"n": 2}, 8: {"n": 5}}, state_offsets={7: 12, 8: 5},
                                 from_outputs={7: 12, 9: 13})
    slot = held_slot(restored=restored)
    batch = slot.take_batch("in", "g.state")
    assert batch is not None
    changelog = {r.key: (r.value, dict(r.headers or [])[SOURCE_OFFSET_HEADER])
                 for r in batch.records if r.topic == "g.state" and r.key in (b"7", b"8", b"9")}
    # Client 8's state came from the changelog: not written again. Client 9 was deleted: a tombstone.
    assert changelog == {b"7": (json_bytes({"n": 2}), b"12"), b"9": (None, b"13")}
