"""The plain-Python aggregation (the Spark job's oracle and benchmark baseline) on small, hand-made
inputs, and the small pure helpers around the job."""

from __future__ import annotations

import statistics

import orjson
import pytest

from keyrange.aggregation.job import AggregationSummary
from keyrange.aggregation.reference import Delivery, aggregate, percentile
from keyrange.aggregation.session import _local_cores


def _record(client: int, uuid: str, created: int, offset: int, value: int | None = None, worker: str = "w0",
            started: int | None = None, finished: int | None = None) -> dict:
    started = created + 5 if started is None else started
    return {"clientId": client, "uuid": uuid, "created": created, "partition": client % 2, "offset": offset,
            "worker": worker, "startedAt": started, "finishedAt": started + 10 if finished is None else finished,
            "result": {"value": value, "returned": value} if value is not None else "ok"}


def _d(partition: int, offset: int, record: dict | bytes) -> Delivery:
    return Delivery(partition, offset, record if isinstance(record, bytes) else orjson.dumps(record))


def test_percentile_interpolates_between_closest_ranks():
    values = [15.0, 20.0, 35.0, 40.0, 50.0]
    assert percentile(values, 0.5) == 35.0
    assert percentile(values, 0.0) == 15.0 and percentile(values, 1.0) == 50.0
    assert percentile(values, 0.95) == pytest.approx(48.0)  # 40 + 0.8 * (50 - 40)
    assert percentile([7.0], 0.99) == 7.0
    data = [float(x) for x in range(1, 101)]
    assert percentile(data, 0.25) == statistics.quantiles(data, n=4, method="inclusive")[0]


def test_a_uuid_counts_once_and_the_first_delivery_wins():
    first = _record(1000, "u1", 60_000, 1, worker="w0", started=60_010)
    rerun = _record(1000, "u1", 60_000, 1, worker="w1", started=60_900)  # re-run after a crash
    result = aggregate([_d(0, 5, rerun), _d(0, 2, first)])  # order of arrival in the list is irrelevant
    assert [c["events"] for c in result["clients"]] == [1]
    assert [w["worker"] for w in result["workers"]] == ["w0"]
    assert result["windows"][0]["latency_p50_ms"] == 10.0


def test_invalid_records_are_skipped():
    good = _record(1000, "u1", 0, 1)
    result = aggregate([_d(0, 0, b"not json"), _d(0, 1, b"[1]"), _d(0, 2, {"clientId": 1}), _d(0, 3, good)])
    assert sum(c["events"] for c in result["clients"]) == 1


def test_ledger_value_follows_input_log_order_not_arrival():
    a = _record(1000, "a", 1_000, offset=10, value=5)
    b = _record(1000, "b", 2_000, offset=11, value=0)  # a drain: later in the input log
    result = aggregate([_d(0, 0, b), _d(1, 0, a)])
    client = result["clients"][0]
    assert (client["ledger_value"], client["last_offset"]) == (0, 11)
    assert (client["first_seen_ms"], client["last_seen_ms"]) == (1_000, 2_000)
    other = aggregate([_d(0, 0, _record(7, "x", 0, 1))])["clients"][0]
    assert other["ledger_value"] is None  # not a ledger result


@pytest.mark.parametrize("result", [{"value": 1.5}, {"value": "7"}, {"value": True}, {"value": 2**63}, 5, [1]])
def test_a_ledger_value_is_a_64_bit_json_integer_or_none(result):
    record = {**_record(1000, "a", 1_000, offset=1), "result": result}
    assert aggregate([_d(0, 0, record)])["clients"][0]["ledger_value"] is None


def test_windows_are_minutes_of_created_with_latency_and_handler_percentiles():
    records = [_record(1000 + i, f"u{i}", 59_000 + i * 500, i, started=59_000 + i * 500 + i, finished=0)
               for i in range(4)]
    for r in records:
        r["finishedAt"] = r["startedAt"] + 3
    result = aggregate([_d(0, i, r) for i, r in enumerate(records)])
    assert [(w["window_start_ms"], w["events"]) for w in result["windows"]] == [(0, 2), (60_000, 2)]
    assert result["windows"][1]["latency_p50_ms"] == 2.5
    assert result["windows"][1]["handler_p99_ms"] == 3.0
    worker = result["workers"][0]
    assert (worker["events"], worker["handler_ms_total"], worker["handler_ms_mean"]) == (4, 12, 3.0)


@pytest.mark.parametrize(("master", "cores"), [("local[2]", 2), ("local[3,2]", 3), ("local", 1)])
def test_local_cores(master, cores):
    assert _local_cores(master) == cores
    assert _local_cores("local[*]") >= 1


def test_summary_line_mentions_table_sizes_only_once_counted():
    summary = AggregationSummary("/out", batches=2, records_read=10, aggregated=9, duplicates=1)
    assert "clients" not in summary.line()
    summary.clients, summary.windows, summary.workers = 3, 1, 2
    assert "3 clients, 1 minute windows, 2 workers -> /out" in summary.line()


def test_retention_horizon_trails_the_newest_created_and_expires_whole_minutes_only():
    from keyrange.aggregation.reference import MINUTE_MS
    from keyrange.aggregation.retention import Retention

    keep = Retention(minutes=2)
    assert keep.horizon_ms(None) is None  # nothing aggregated yet
    horizon = keep.horizon_ms(10 * MINUTE_MS + 5)
    # Two minutes behind, rounded down to a minute's start: the same for every high-water mark of
    # that minute (a new horizon is new code for Spark to compile).
    assert horizon == 8 * MINUTE_MS == keep.horizon_ms(10 * MINUTE_MS + MINUTE_MS - 1)
    assert keep.horizon_ms(11 * MINUTE_MS) == 9 * MINUTE_MS
    stored = [m * MINUTE_MS for m in range(10)]
    assert keep.expired(stored, horizon) == [m * MINUTE_MS for m in range(8)]
    assert Retention(minutes=0).horizon_ms(10 * MINUTE_MS) is None  # keep forever
    with pytest.raises(ValueError, match="0 \\(forever\\) or more"):
        Retention(minutes=-1)


def test_a_replayed_batch_takes_the_high_water_mark_from_before_it():
    from keyrange.aggregation.store import Manifest

    manifest = Manifest(batch=7, versions={}, high_water_ms=500, previous_batch=5, previous_high_water_ms=300)
    assert manifest.high_water_before(8) == 500
    assert manifest.high_water_before(7) == 300  # batch 7 published, then crashed before its commit
    assert Manifest().high_water_before(0) is None
