"""A restore rebuilds the dedup window its partition's owner had at the committed offset, reading a
bounded stretch of the logs (rebuild.plan_reads), on Apache Kafka's and tansu's offset lookups."""

from __future__ import annotations

import random
from unittest.mock import patch

import pytest

from keyrange.worker.dedup import BUCKETS_PER_TTL, TtlSet
from keyrange.worker.restore import plan_reads
from keyrange.worker.restorer import Restorer
from keyrange.worker.settings import WorkerSettings
from tests.logmodel import LiveRun, ModelReader, Record, restored_window, same_window

SETTINGS = WorkerSettings(bootstrap="unused:9092", topic="events", group_id="g", worker_id="w0")
T0_MS = 1_800_000_000_000
INPUT = (SETTINGS.topic, 0)
SINK = (SETTINGS.sink, 0)
DLQ = (SETTINGS.dlq, 0)


def model_logs(run: LiveRun, upto: int | None = None, sink: list[Record] | None = None) -> dict:
    return {INPUT: run.records[:upto], SINK: sink or [], DLQ: [], (SETTINGS.state, 0): []}


def steady_run(count: int, per_second: int = 10) -> LiveRun:
    """`count` events on time, `per_second` of them a second, each handled 50 ms after it was sent."""
    run = LiveRun(SETTINGS.ttl_seconds)
    for i in range(count):
        sent_ms = T0_MS + i * 1000 // per_second
        run.add(f"u{i}", sent_ms, sent_ms, (sent_ms + 50) / 1000)
    return run


@pytest.mark.parametrize("broker", ["kafka", "tansu"])
def test_an_idle_partition_restores_the_window_its_last_events_left(broker: str) -> None:
    run = steady_run(100)  # 10 s of events, then nothing
    end = len(run.records)
    now_s = (T0_MS + 40_000) / 1000  # handed over 30 s after the last event
    live, live_wall = run.window(end)
    restored, _, restored_wall = restored_window(SETTINGS, ModelReader(model_logs(run), broker), 0, end, now_s)
    assert same_window(live, restored, run.uuids) == []
    # A late duplicate carrying its original's `created`: the owner drops it, and so does the next.
    live_wall(now_s)
    restored_wall(now_s)
    late = (run.uuids[95], run.records[95].timestamp_ms / 1000)
    assert not live.add_if_new(*late)
    assert not restored.add_if_new(*late)


@pytest.mark.parametrize("at", ["at the committed offset", "just before it"])
def test_one_ancient_created_neither_reads_the_whole_logs_nor_changes_the_window(at: str) -> None:
    run = steady_run(1000)  # 100 s of events
    committed = 900
    odd = committed if at == "at the committed offset" else committed - 1
    sent_ms = run.records[odd].appended_ms
    run.records[odd] = Record(odd, 1_000, sent_ms, run.records[odd].value.replace(  # type: ignore[union-attr]
        str(sent_ms).encode(), b"1000"), run.records[odd].key)
    # Outputs, stamped when written: those of offsets >= 900 came after it was sent.
    sink = [Record(o, T0_MS + o * 100 + 80, T0_MS + o * 100 + 80) for o in range(950)]
    reader = ModelReader(model_logs(run, sink=sink), "kafka")
    now_s = (T0_MS + 100_000) / 1000
    plan = plan_reads(reader, SETTINGS, {0: committed}, {t: 1 for t, _ in (INPUT, SINK, DLQ)}, now_s)  # type: ignore[arg-type]
    window_records = (SETTINGS.ttl_seconds * (1 + 1 / BUCKETS_PER_TTL) + SETTINGS.restore_clock_slack_seconds) * 10
    assert committed - window_records - 2 <= plan.starts[INPUT] < committed - window_records + 2
    # From the clock slack before offset 900 (899 when the odd one is at 900) was sent.
    assert committed - 1 - SETTINGS.restore_clock_slack_seconds * 10 <= plan.starts[SINK] <= committed
    assert plan.starts[DLQ] == 0  # empty
    live, _ = run.window(committed)
    restored, _, _ = restored_window(SETTINGS, reader, 0, committed, now_s)
    assert same_window(live, restored, run.uuids) == []


@pytest.mark.parametrize("broker", ["kafka", "tansu"])
def test_one_created_far_in_the_future_before_an_idle_committed_offset_keeps_the_window(broker: str) -> None:
    run = steady_run(100)
    # The last event before the offset says it was created a year from now (its owner bounded it
    # by its own clock, which the log does not keep); the partition then idles for a minute.
    run.add("from-the-future", T0_MS + 365 * 86_400_000, T0_MS + 10_000, run.handled_at_s[-1] + 0.05)
    end = len(run.records)
    now_s = (T0_MS + 70_000) / 1000
    live, _ = run.window(end)
    restored, _, _ = restored_window(SETTINGS, ModelReader(model_logs(run), broker), 0, end, now_s)
    # The restore cannot know when that event was seen: not before the stream time then, which is
    # where it puts it, so the restored window is the live one but for that one step of its clock.
    assert live.stream_time - 0.1 <= restored.stream_time <= live.stream_time
    assert all((u in live) == (u in restored) for u in run.uuids)


def test_one_created_far_in_the_future_before_the_committed_offset_does_not_hide_its_outputs() -> None:
    run = steady_run(1000)
    committed = 900
    future_ms = T0_MS + 365 * 86_400_000
    odd = run.records[committed - 1]
    run.records[committed - 1] = Record(odd.offset, future_ms, odd.appended_ms, odd.value, odd.key)
    sink = [Record(o, T0_MS + o * 100 + 80, T0_MS + o * 100 + 80) for o in range(950)]
    reader = ModelReader(model_logs(run, sink=sink), "kafka")
    now_s = (T0_MS + 3_600_000) / 1000  # an hour later
    plan = plan_reads(reader, SETTINGS, {0: committed}, {t: 1 for t, _ in (INPUT, SINK, DLQ)}, now_s)  # type: ignore[arg-type]
    assert plan.starts[SINK] <= committed  # the output of offset 900 was written right after it


def test_a_partition_whose_tail_is_bad_input_reads_its_window_from_the_start() -> None:
    run = steady_run(200)
    for o in range(136, 200):  # the 64 records before offset 200 are not events
        run.records[o] = Record(o, run.records[o].timestamp_ms, run.records[o].appended_ms, b"not json")
    reader = ModelReader(model_logs(run), "kafka")
    plan = plan_reads(reader, SETTINGS, {0: 200}, {t: 1 for t, _ in (INPUT, SINK, DLQ)}, T0_MS / 1000 + 30)  # type: ignore[arg-type]
    assert plan.starts[INPUT] == 0


# Property tests: random streams, a restore at any offset, on both brokers' offset lookups.

SEEDS = [*range(150), 585, 632, 750, 1097, 1247, 1367]
"""The first 150, and seeds whose uuids repeated three times or more rebuilt a different window
while a dropped copy did not renew its uuid's entry."""


def random_run(rng: random.Random, ttl_seconds: float) -> LiveRun:
    """Events from producers on time, behind (by up to minutes, some ancient) and slightly ahead of
    the broker, with idle gaps, duplicates carrying their original's `created` or their own, and an
    owner handling each at or after its `created` (its clock is never behind an event's)."""
    run = LiveRun(ttl_seconds)
    ttl_ms = int(ttl_seconds * 1000)
    sent_ms, handled_s = T0_MS, T0_MS / 1000
    originals: list[tuple[str, int]] = []
    for i in range(rng.randint(1, 400)):
        sent_ms += int(rng.expovariate(20 / ttl_ms)) if rng.random() > 0.02 else rng.randint(1, 5) * ttl_ms
        kind = rng.random()
        if kind < 0.7:
            created_ms = sent_ms - rng.randint(0, 50)
        elif kind < 0.85:
            created_ms = sent_ms - rng.randint(0, 30 * ttl_ms)
        elif kind < 0.9:
            created_ms = rng.randint(1, 10**9)  # ancient
        else:
            created_ms = sent_ms + rng.randint(0, 200)
        uuid = f"u{i}"
        if originals and rng.random() < 0.2:
            # A copy of a recent uuid, of which there may be any number (the window keeps a uuid
            # from its latest copy, so a restore that replays them all rebuilds it).
            uuid, original_created_ms = originals[rng.randrange(max(0, len(originals) - 50), len(originals))]
            if rng.random() < 0.5:
                created_ms = original_created_ms
        else:
            originals.append((uuid, created_ms))
        lag_s = rng.choice([0.001, 0.05, ttl_seconds / 2, 3 * ttl_seconds]) * rng.random()
        handled_s = max(handled_s, sent_ms / 1000 + lag_s, created_ms / 1000)
        run.add(uuid, created_ms, sent_ms, handled_s)
    return run


def random_case(seed: int) -> tuple[random.Random, WorkerSettings, LiveRun]:
    """A random TTL (the clock slack as long) and stream, from `seed`."""
    rng = random.Random(seed)
    ttl_seconds = rng.choice([1.0, 2.0, 10.0])
    settings = WorkerSettings(bootstrap="unused:9092", topic=SETTINGS.topic, group_id=SETTINGS.group_id,
                              worker_id="w0", ttl_seconds=ttl_seconds, restore_clock_slack_seconds=ttl_seconds)
    return rng, settings, random_run(rng, ttl_seconds)


@pytest.mark.parametrize("broker", ["kafka", "tansu"])
def test_the_restored_window_is_the_live_one_at_any_committed_offset(broker: str) -> None:
    for seed in SEEDS:
        rng, settings, run = random_case(seed)
        ttl_seconds, n = settings.ttl_seconds, len(run.records)
        committed = rng.choice([n, rng.randint(0, n)])  # idle partitions often
        upto = rng.randint(committed, n)  # the log as the restore found it
        last_ms = max(r.appended_ms for r in run.records[:upto]) if upto else T0_MS
        now_s = max(last_ms / 1000, max(run.handled_at_s[:committed], default=0.0)) + rng.random() * 5 * ttl_seconds
        reader = ModelReader(model_logs(run, upto), broker)
        live, live_wall = run.window(committed)
        restored, _, restored_wall = restored_window(settings, reader, 0, committed, now_s)
        assert same_window(live, restored, run.uuids) == [], f"seed {seed}, committed {committed} of {n}"
        # The same judgements from here on: the rest of the log, then late copies of earlier uuids.
        later = [(run.uuids[o], run.records[o].timestamp_ms / 1000) for o in range(committed, n)]
        later += [(u, t / 1000) for u, t in rng.sample(
            [(run.uuids[o], run.records[o].timestamp_ms) for o in range(committed)], min(committed, 30))]
        for uuid, event_s in later:
            wall = max(now_s, event_s)
            live_wall(wall)
            restored_wall(wall)
            assert live.add_if_new(uuid, event_s) == restored.add_if_new(uuid, event_s), f"seed {seed}, {uuid}"


@pytest.mark.parametrize("broker", ["kafka", "tansu"])
def test_a_read_ahead_always_covers_the_final_restore_and_rebuilds_the_live_window(broker: str) -> None:
    for seed in SEEDS[:80]:
        read_ahead_then_grant(seed, broker)


def read_ahead_then_grant(seed: int, broker: str) -> None:
    rng, settings, run = random_case(seed)
    ttl_seconds, n = settings.ttl_seconds, len(run.records)
    ahead_at = rng.randint(0, n)  # committed when the new owner reads ahead
    committed = rng.choice([ahead_at, rng.randint(ahead_at, n)])  # committed at the grant
    seen_ahead = rng.randint(ahead_at, n)  # the input's end when it reads ahead
    seen_at_grant = rng.randint(max(seen_ahead, committed), n)
    ahead_s = max([r.appended_ms / 1000 for r in run.records[:seen_ahead]] + run.handled_at_s[:ahead_at]
                  + [T0_MS / 1000])
    grant_s = max([r.appended_ms / 1000 for r in run.records[:seen_at_grant]] + run.handled_at_s[:committed]
                  + [ahead_s]) + rng.random() * ttl_seconds
    logs = model_logs(run, seen_ahead)
    reader = ModelReader(logs, broker, committed={0: ahead_at})
    counts = {settings.topic: 1, settings.sink: 1, settings.dlq: 1, settings.state: 1}
    with (patch("keyrange.worker.restorer.LogReader", lambda _settings, **_options: reader),
          patch("keyrange.worker.restorer.restore_with", side_effect=AssertionError("read it all"))):
        restorer = Restorer(settings, counts)
        try:
            prefetched = restorer.prefetch([0], now_s=ahead_s)
            logs[(settings.topic, 0)] = run.records[:seen_at_grant]
            reader.committed = {0: committed}
            restored = restorer.restore_slots([0], prefetched, now_s=grant_s)[0]
        finally:
            restorer.close()
    window = TtlSet(ttl_seconds, lambda: grant_s)
    for uuid, event_s in restored.seen:
        window.replay(uuid, event_s)
    live, _ = run.window(committed)
    assert same_window(live, window, run.uuids) == [], f"seed {seed}: {ahead_at} -> {committed} of {n}"


def test_memory_stays_within_rate_times_ttl_whatever_the_producers_clocks() -> None:
    for seed in SEEDS[:50]:  # up to 20,000 events each
        steady_rate_from_skewed_producers(seed)


def steady_rate_from_skewed_producers(seed: int) -> None:
    rng = random.Random(seed)
    ttl_seconds, rate = rng.choice([1.0, 10.0]), rng.choice([50, 500])
    now = [1000.0]
    window = TtlSet(ttl_seconds, lambda: now[0])
    stalled, stream_time = 0, window.stream_time  # events since the stream time last moved
    for i in range(int(rate * ttl_seconds * 4)):
        now[0] = 1000.0 + i / rate
        skew = rng.random()
        if skew < 0.5:
            created = now[0]
        elif skew < 0.75:
            created = now[0] + rng.random() * 1000  # ahead, by up to 1000 s
        else:
            created = now[0] - rng.random() * 1000  # behind
        window.add_if_new(f"u{i}" if rng.random() > 0.1 else f"u{rng.randint(0, i)}", created)
        assert window.stream_time <= now[0], f"seed {seed}"
        stalled = stalled + 1 if window.stream_time == stream_time else 0
        stream_time = window.stream_time
        # Entries live TTL to TTL + a bucket of stream time (an event on a bucket's edge may round
        # into the next); events behind the stream time do not move it, so they add to that.
        bound = rate * ttl_seconds * (1 + 2 / BUCKETS_PER_TTL) + stalled + 1
        assert len(window) <= bound, f"seed {seed}"
