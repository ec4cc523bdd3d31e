"""When an acquire may finish a read-ahead instead of restoring in full (restorer._catch_up), and how
far a read-ahead reads."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

from keyrange.logend import Span
from keyrange.worker.commitwindow import Outcome
from keyrange.worker.dedup import TtlSet
from keyrange.worker.restore import Finished, InputEntry, OutputEntry, ParsedLogs, StateEntry, restore_with
from keyrange.worker.restorer import READ_AHEAD_PAST_COMMITTED, Prefetched, Restorer, _catch_up
from keyrange.worker.settings import WorkerSettings
from tests.logmodel import LiveRun, ModelReader, same_window

SETTINGS = WorkerSettings(bootstrap="unused:9092", topic="events", group_id="g", worker_id="w0")
INPUT = (SETTINGS.topic, 0)
T0_MS = 1_800_000_000_000


class NothingNewReader:
    """A reader for which nothing was appended since the read-ahead; records what was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[dict[Span, int], dict[Span, int]]] = []

    def read(self, starts: dict[Span, int], stops: dict[Span, int] | None = None) -> tuple[dict[Span, list[Any]], dict]:
        self.asked.append((dict(starts), dict(stops or {})))
        return {span: [] for span in starts}, dict(starts)


def read_ahead(committed: int = 10) -> Prefetched:
    logs = ParsedLogs()
    logs.inputs[0] = [InputEntry(o, 40_000 + o * 1000, f"u{o}", 40.0 + o) for o in range(4, 14)]
    logs.outputs = [OutputEntry(0, 11, "u11", 51.0, (7, {"n": 2}), Outcome.HANDLED)]
    logs.states[0] = [StateEntry(7, 9, {"n": 1}), StateEntry(7, 11, {"n": 2})]
    reached = {(SETTINGS.topic, 0): 14, (SETTINGS.sink, 0): 1, (SETTINGS.state, 0): 2}
    return Prefetched({0: committed}, logs, reached)


def test_a_read_ahead_is_finished_from_where_it_stopped() -> None:
    reader = NothingNewReader()
    restored = _catch_up(reader, SETTINGS, {0: 11}, read_ahead())  # type: ignore[arg-type]
    assert restored is not None
    r = restored[0]
    assert r.start_offset == 11
    # Its processed record is there: not run again.
    assert r.finished_offsets == {11: Finished(Outcome.HANDLED, "u11", 51.0)}
    assert r.state == {7: {"n": 2}}  # changelog < 11, then the state the processed record carries
    # The input below the committed offset; u11 joins the window when the fetch passes offset 11.
    assert [u for u, _ in r.seen] == [f"u{o}" for o in range(4, 11)]
    starts, stops = reader.asked[0]
    assert starts == {(SETTINGS.topic, 0): 14, (SETTINGS.sink, 0): 1, (SETTINGS.state, 0): 2}
    assert stops == {(SETTINGS.topic, 0): 14}  # the record at the committed offset was read ahead


def test_the_input_is_read_up_to_a_committed_offset_past_the_read_ahead() -> None:
    reader = NothingNewReader()
    assert _catch_up(reader, SETTINGS, {0: 20}, read_ahead()) is not None  # type: ignore[arg-type]
    assert reader.asked[0][1] == {(SETTINGS.topic, 0): 20}


def test_an_ancient_timestamp_at_the_committed_offset_still_finishes_the_read_ahead() -> None:
    # The window's stream time and the outputs' times cannot go back as the committed offset moves
    # on, whatever the record at it says: what was read ahead still covers the restore.
    pre = read_ahead()
    pre.logs.inputs[0][-3] = InputEntry(11, 1_000, "u11", 1.0)
    restored = _catch_up(NothingNewReader(), SETTINGS, {0: 11}, pre)  # type: ignore[arg-type]
    assert restored is not None and [u for u, _ in restored[0].seen] == [f"u{o}" for o in range(4, 11)]


def test_other_slots_or_a_committed_offset_that_went_back_mean_restoring_in_full() -> None:
    assert _catch_up(NothingNewReader(), SETTINGS, {0: 11, 1: 0}, read_ahead()) is None  # type: ignore[arg-type]
    assert _catch_up(NothingNewReader(), SETTINGS, {0: 9}, read_ahead(committed=10)) is None  # type: ignore[arg-type]


def test_a_lagging_slot_is_read_ahead_only_a_window_past_its_committed_offset() -> None:
    # 400 s of events at 100/s; the old owner lags: committed at offset 5,000 of 40,000.
    run = LiveRun(SETTINGS.ttl_seconds)
    for i in range(40_000):
        sent_ms = T0_MS + i * 10
        run.add(f"u{i}", sent_ms, sent_ms, (sent_ms + 50) / 1000)
    logs = {INPUT: run.records, (SETTINGS.sink, 0): [], (SETTINGS.dlq, 0): [], (SETTINGS.state, 0): []}
    reader = ModelReader(logs, committed={0: 5_000})
    counts = {SETTINGS.topic: 1, SETTINGS.sink: 1, SETTINGS.dlq: 1, SETTINGS.state: 1}
    now_s = T0_MS / 1000 + 401
    with patch("keyrange.worker.restorer.LogReader", lambda _settings, **_options: reader):
        restorer = Restorer(SETTINGS, counts)
        try:
            prefetched = restorer.prefetch([0], now_s=now_s)
            # The window before offset 5,000 (TTL and clock slack: about 2,000 records) and as much
            # again past it, not the 35,000 records of backlog: the new owner fetches those.
            window = 5_000 - prefetched.logs.inputs[0][0].offset
            assert 1_000 <= window <= 2_500
            assert prefetched.reached[INPUT] == 5_000 + max(window, READ_AHEAD_PAST_COMMITTED)
            # The old owner got further than that before its release: the acquire reads the rest.
            reader.committed = {0: 9_500}
            restored = restorer.restore_slots([0], prefetched, now_s=now_s + 5)[0]
        finally:
            restorer.close()
    full = restore_with(ModelReader(logs), SETTINGS, {0: 9_500}, counts, now_s + 5)[0]  # type: ignore[arg-type]
    assert restored.start_offset == 9_500
    # The same window as a full restore at the grant (the read-ahead's reaches further back: expired).
    windows = []
    for seen in (restored.seen, full.seen):
        window = TtlSet(SETTINGS.ttl_seconds, lambda: now_s + 5)
        for uuid, event_s in seen:
            window.replay(uuid, event_s)
        windows.append(window)
    assert same_window(windows[1], windows[0], run.uuids) == [] and len(windows[1]) > 500
