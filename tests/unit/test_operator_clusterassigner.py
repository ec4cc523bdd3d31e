"""Pure parts of the cluster range control: planner limits from the spec, and pod-scraped lag."""

from __future__ import annotations

import threading
import time

from keyrange.autoscale.scrape import WorkerSample
from keyrange.operator.clusterassigner import KafkaRangeControl, PodMetricsLag, StatefulSetFleet, planner_limits
from keyrange.ranges.planner import SlotLag
from keyrange.spec import parse_spec


def test_fixed_replicas_pin_both_bounds() -> None:
    spec = parse_spec({"kafka": {"topic": "t"}, "workers": {"min": 1, "max": 6},
                       "scaling": {"lagHighRecords": 50, "lagLowRecords": 5, "cooldownSeconds": 7}})
    free = planner_limits(spec)
    assert (free.min_workers, free.max_workers, free.lag_high_records, free.cooldown_seconds) == (1, 6, 50, 7)
    pinned = planner_limits(spec.model_copy(update={"workers": spec.workers.model_copy(update={"replicas": 3})}))
    assert (pinned.min_workers, pinned.max_workers, pinned.lag_high_records) == (3, 3, 50)


def test_lag_is_scraped_from_every_pod_the_fleet_runs_and_merged() -> None:
    fleet = StatefulSetFleet(2)
    asked: list[str] = []

    def fetch(url: str, at: float) -> WorkerSample | None:
        asked.append(url)
        if url.endswith("/1"):
            return None  # a pod that does not answer (restarting) is skipped
        sample = WorkerSample(at)
        sample.slot_lag = {0: SlotLag(10, 0.5), 1: SlotLag(3, 0.1)}
        return sample

    lag = PodMetricsLag(lambda i: f"http://pod/{i}", fleet, every_seconds=3600, fetch=fetch)
    assert lag.slot_lag() == {0: SlotLag(10, 0.5), 1: SlotLag(3, 0.1)}
    assert asked == ["http://pod/0", "http://pod/1"]
    fleet.scale_to(3)
    lag.slot_lag()  # within every_seconds: served from the last scrape
    assert len(asked) == 2


def test_the_pod_scraper_measures_the_load_for_the_target_planner() -> None:
    fleet = StatefulSetFleet(1)
    times = iter([0.0, 2.0, 12.0, 14.0])

    def fetch(url: str, at: float) -> WorkerSample | None:
        sample = WorkerSample(at, processed=400 * at, handler_seconds=4 * at)
        sample.slot_processed = {0: 400 * at}
        return sample

    pods = PodMetricsLag(lambda i: f"http://pod/{i}", fleet, every_seconds=1, fetch=fetch, concurrency=8,
                         clock=lambda: next(times))
    pods.slot_lag()
    assert pods.load() is None  # one scrape: no rate yet
    pods.slot_lag()
    warming = pods.load()
    assert warming is not None and warming.workers == {} and warming.warming == {0}  # its first 10 s
    pods.slot_lag()
    pods.slot_lag()
    load = pods.load()
    assert load is not None
    assert load.workers[0].processed_per_second == 400 and load.workers[0].permits_busy == 0.5


def test_the_newest_handoff_is_the_newest_grant_and_its_largest_pause() -> None:
    from keyrange.operator.clusterassigner import newest_handoff
    from keyrange.ranges.channel import WorkerReport
    from keyrange.ranges.pauses import HandoffPause

    assert newest_handoff([WorkerReport(0, 3, frozenset(), 1)]) is None
    reports = [WorkerReport(0, 9, frozenset(), 1, pause=HandoffPause(5, 900, 100)),
               WorkerReport(1, 9, frozenset(), 1, pause=HandoffPause(9, 40, 200)),
               WorkerReport(2, 9, frozenset(), 1, pause=HandoffPause(9, 70, 150)),
               WorkerReport(3, 9, frozenset(), 1)]
    newest = newest_handoff(reports)
    assert newest is not None
    assert (newest.epoch, newest.pause_seconds, newest.worker, newest.at_ms) == (9, 0.07, 2, 150)


class SlowToCloseController:
    """A Controller stand-in whose steps are counted and whose close hangs until released, as a
    Kafka client's close can on a busy machine or an unreachable broker."""

    def __init__(self) -> None:
        self.steps = 0
        self.closing = threading.Event()
        self.release = threading.Event()

    def step_and_wait(self, stop: threading.Event, interval_seconds: float) -> None:
        self.steps += 1
        stop.wait(interval_seconds)

    def close(self) -> None:
        self.closing.set()
        self.release.wait(10)


def test_a_control_stops_acting_before_its_kafka_clients_are_closed() -> None:
    """`close` (and so a leader's stop on losing its Lease) waits for the step in flight, not for the
    controller's clients to close: a standby may take the Lease a second after the deadline."""
    controller = SlowToCloseController()
    spec = parse_spec({"kafka": {"topic": "t", "bootstrapServers": "k:9092"}})
    control = KafkaRangeControl("ns", "c", spec, step_seconds=0.01, connect=lambda: controller)  # type: ignore[arg-type,return-value]
    try:
        while controller.steps == 0:
            time.sleep(0.01)
        began = time.monotonic()
        control.close()
        # Waiting for the clients would take close()'s whole 2 s bound (this close hangs 10 s).
        assert time.monotonic() - began < 1.5
        steps = controller.steps
        assert controller.closing.wait(5)  # the clients close after close() returned ...
        assert not controller.release.is_set() and controller.steps == steps  # ... and nothing steps again
    finally:
        controller.release.set()
