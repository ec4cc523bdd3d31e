"""`keyrange demo`: the kata's load with a burst and a quiet spell, rescaled live, then a report.

An embedded broker (Apache Kafka where Java is installed, else tansu: `broker_choice`), one
StreamConsumer (the `sleep` handler, 10 ms per event as in the kata, and a small concurrency so one
worker tops out near 400 events/s) on a topic of 2 partitions cut into 4 hash ranges of clientIds
(one per worker at workers.max), the supervisor of `keyrange run`, and three load phases: steady,
a burst that needs four workers (lag rises, ranges split inside the partitions), and a quiet spell
(lag stays low, ranges merge back). At the end the processed topic is read back to compute exact
latency percentiles and to check the guarantees, the Spark aggregation runs once over the processed
topic (see `demo_aggregation`; skipped without pyspark or Java), and a PNG plot of rate, lag,
latency and worker count is written next to the report.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import orjson
from confluent_kafka import Consumer, TopicPartition

from keyrange.kafkaclients import KafkaClients
from keyrange.loadgen import LoadShape
from keyrange.local.broker_choice import LocalBroker
from keyrange.local.demo_aggregation import AggregationSection, aggregate, render_section
from keyrange.local.load import LoadTotals, Phase, produce_phases
from keyrange.local.scaling_report import (
    ScalingSummary,
    SizeChange,
    describe_pauses,
    first_starts,
    flaps,
    handoff_pauses,
    needed_workers,
    summary_lines,
    time_to_size,
)
from keyrange.local.supervisor import HistoryPoint, Supervisor
from keyrange.logend import spans_behind
from keyrange.ranges.controller import Rescale
from keyrange.ranges.layout import SlotLayout
from keyrange.ranges.planner import TARGET_UTILIZATION
from keyrange.ranges.rangemap import RangeMap
from keyrange.spec import StreamConsumer, load_file

DEMO_SPEC = """\
# Written by `keyrange demo`; run it yourself with `keyrange run -f {path} --produce 1000 --clients 1000`.
apiVersion: keyrange.dev/v1alpha1
kind: StreamConsumer
metadata:
  name: demo
spec:
  kafka: {{topic: demo-events, partitions: 2}}   # fewer than workers.max: partitions are cut into hash ranges
  handler: sleep
  handlerConfig: {{meanMs: 10, stddevMs: 1}}
  dedup: {{ttlSeconds: 10}}
  concurrency: 4            # ~400 events/s per worker: the burst needs four at 80 % busy
  maxPending: 2000
  workers: {{min: 1, max: 4}}
  scaling: {{lagHighRecords: 2000, lagHighSeconds: 3, lagLowRecords: 200, cooldownSeconds: {cooldown}}}
"""

FULL_PHASES = (Phase(25, 250), Phase(50, 1000), Phase(70, 120))
QUICK_PHASES = (Phase(10, 250), Phase(25, 1000), Phase(40, 120))
DEMO_CLIENTS = 1000
"""Distinct clientIds of the demo's load. Hash ranges carry whole clients: with the kata's 100, one of the
four ranges carries a third of the burst, more than a worker handles, and its backlog outlasts the burst."""


@dataclass(frozen=True)
class KeySpace:
    """How the demo topic's partitions were cut into hash ranges of clientIds, and which worker held
    each range when the most workers ran."""

    partitions: int
    per_partition: int
    """Hash ranges per partition (SlotLayout.for_workers of workers.max)."""
    workers: int
    """The most workers at once (a settled range map)."""
    owners: dict[str, int]
    """Range (`describe_slot`: "0:1/2", or "0" for a whole partition) -> its worker then."""

    def partition_lines(self) -> list[str]:
        """Per partition: its hash ranges and the workers they were spread over."""
        lines = []
        for p in range(self.partitions):
            held = {label: w for label, w in self.owners.items() if label.split(":")[0] == str(p)}
            ranges = "hash range" if self.per_partition == 1 else "hash ranges"
            spread = ", ".join(f"{label} -> worker {w}" for label, w in held.items())
            lines.append(f"partition {p}: {self.per_partition} {ranges} over {len(set(held.values()))} "
                         f"worker(s) ({spread})")
        return lines


def key_space(layout: SlotLayout, widest: RangeMap) -> KeySpace:
    """The KeySpace of `layout` with the owners of `widest` (the map with the most workers)."""
    owners = {layout.describe_slot(s): a.worker for a in widest for s in a.range.slots}
    return KeySpace(layout.partitions, layout.per_partition, widest.workers, owners)


@dataclass(frozen=True)
class DemoReport:
    """The figures of one demo run."""

    produced: int
    duplicates_sent: int
    handled: int
    duplicates_dropped: int
    lost: int
    handled_twice: int
    """Handled twice within the dedup TTL (a broken guarantee)."""
    handled_twice_beyond_ttl: int
    """Handled twice more than ttlSeconds apart (outside what TTL dedup promises)."""
    latency_ms: dict[str, float]
    rescales: list[dict[str, Any]]
    max_workers: int
    seconds: float
    aggregation: AggregationSection | None = None
    """The Spark aggregation's figures and cross-check; None when it did not run."""
    aggregation_skipped: str = ""
    """Why the aggregation did not run (--no-aggregate, or pyspark/Java missing)."""
    key_space: KeySpace | None = None
    """How the partitions' key space was split; None when no range map was seen."""
    scaling: ScalingSummary | None = None
    """Time to size, decisions, flaps, pauses and the quiet phase's latency; None without a burst."""

    @property
    def aggregation_mismatch(self) -> bool:
        """The aggregation ran and failed, or counted other than the distinct processed uuids."""
        return self.aggregation is not None and not self.aggregation.matches


def read_values(bootstrap: str, topic: str, timeout_seconds: float = 60.0) -> list[dict[str, Any]]:
    """Every JSON value of `topic` (read_committed) from the beginning to its end (logend.py); what
    was read so far once `timeout_seconds` pass (a transaction still open holds the end back)."""
    consumer = Consumer(KafkaClients(bootstrap).consumer(f"demo-report-{time.time_ns()}"))
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        next_offsets = {(topic, p): 0 for p in parts}
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            for m in consumer.consume(5000, 0.2):
                if m.error() is None:
                    out.append(orjson.loads(m.value() or b"{}"))
                    # A fetched record always has a partition and an offset (the stubs say Optional).
                    next_offsets[(topic, m.partition())] = m.offset() + 1  # type: ignore[index, operator]
            if not spans_behind(consumer, next_offsets):
                break
        return out
    finally:
        consumer.close()


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    pick = {"p50": 0.50, "p90": 0.90, "p99": 0.99, "p999": 0.999}
    out = {name: ordered[min(len(ordered) - 1, int(q * len(ordered)))] for name, q in pick.items()}
    out["max"] = ordered[-1]
    return out


def plot(history: list[HistoryPoint], path: Path) -> None:
    """Rate, lag, p99 latency and worker count over time, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = history[0].at_ms
    t = [(p.at_ms - t0) / 1000 for p in history]
    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    series = [
        ("handled events/s", [p.rate for p in history]),
        ("lag (records)", [p.lag_records for p in history]),
        ("p99 latency (ms)", [(p.p99_latency_seconds or 0) * 1000 for p in history]),
        ("workers", [p.workers for p in history]),
    ]
    for ax, (label, values) in zip(axes, series, strict=True):
        ax.plot(t, values, drawstyle="steps-post" if label == "workers" else "default")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("seconds")
    fig.suptitle("keyrange demo: burst -> split, quiet -> merge")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_demo(out_dir: Path, quick: bool, out: TextIO, aggregate_results: bool = True,
             phase_seconds: float | None = None, broker: LocalBroker | None = None) -> DemoReport:
    """Run the whole demo; write streamconsumer.yaml, report.json, report.md and demo.png to `out_dir`,
    and with `aggregate_results` the Spark aggregates to `out_dir/aggregates/`.

    `phase_seconds` makes every load phase that long (for tests; the rescales may not happen then).
    `broker` is the embedded broker to run on (default: `broker_choice.choose_broker`'s).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_path = out_dir / "streamconsumer.yaml"
    spec_path.write_text(DEMO_SPEC.format(path=spec_path, cooldown=8 if quick else 10))
    consumer = load_file(spec_path)
    phases: tuple[Phase, ...] = QUICK_PHASES if quick else FULL_PHASES
    if phase_seconds is not None:
        phases = tuple(Phase(phase_seconds, p.rate) for p in phases)
    section: AggregationSection | None = None
    skipped = "" if aggregate_results else "`--no-aggregate` was given"
    supervisor = Supervisor(consumer, spec_path.resolve(), None, out_dir / "run", broker=broker)
    stop = threading.Event()
    totals = LoadTotals()
    started = time.monotonic()
    supervisor.start()
    try:
        assert supervisor.bootstrap is not None and supervisor.controller is not None
        bootstrap = supervisor.bootstrap
        print(f"keyrange demo: embedded broker {bootstrap}; load: "
              + ", ".join(f"{p.rate:,.0f}/s for {p.seconds:.0f} s" for p in phases), file=out, flush=True)
        shape = LoadShape(rate=phases[0].rate, clients=DEMO_CLIENTS, duplicate_ratio=0.01, seed=42)
        load = threading.Thread(target=produce_phases,
                                args=(bootstrap, consumer.spec.kafka.topic, shape, phases, stop, totals), daemon=True)
        load.start()
        last_print = 0.0
        controller = supervisor.controller
        widest = controller.publication.map
        while load.is_alive():
            time.sleep(supervisor.tick_seconds)
            supervisor.tick()
            if not controller.publication.transit and controller.publication.map.workers > widest.workers:
                widest = controller.publication.map
            if time.monotonic() - last_print >= 5.0:
                last_print = time.monotonic()
                print(supervisor.table() + f"\n  produced {totals.sent:,} (phase {totals.phase + 1} of "
                      f"{len(phases)})\n", file=out, flush=True)
        # Let the last events drain before reading the results back.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and supervisor.tick().lag_records > 0:
            time.sleep(supervisor.tick_seconds)
        sent_uuids = {r["uuid"] for r in read_values(bootstrap, consumer.spec.kafka.topic)}
        processed = read_values(bootstrap, consumer.spec.sink_topic)
        while time.monotonic() < deadline and not sent_uuids <= {r["uuid"] for r in processed}:
            time.sleep(2.0)
            supervisor.tick()
            processed = read_values(bootstrap, consumer.spec.sink_topic)
        layout = controller.layout
        done = list(controller.rescales)
        by_slot = first_starts(processed, lambda r: layout.slot_for_key(r["partition"], str(r["clientId"]).encode()))
        pauses = [handoff_pauses(by_slot, r, done[i + 1].published_ms if i + 1 < len(done) else None)
                  for i, r in enumerate(done)]
        rescales = [dict(asdict(r), moved_slots=sorted(r.moved_slots), pauses=p,
                         moved_ranges=[layout.describe_slot(s) for s in sorted(r.moved_slots)])
                    for r, p in zip(done, pauses, strict=True)]
        history = list(supervisor.history)
        if aggregate_results:
            # Before stopping: the embedded broker goes away with the supervisor.
            distinct = len({r["uuid"] for r in processed})
            section, skipped = aggregate(bootstrap, consumer.spec.sink_topic, out_dir / "aggregates", distinct, out)
    finally:
        stop.set()
        supervisor.stop()
    counts = Counter(r["uuid"] for r in processed)
    latencies = [float(r["startedAt"] - r["created"]) for r in processed]
    scaling = scaling_summary(consumer, phases, totals.phase_started_ms, done, pauses, processed)
    starts: dict[str, list[int]] = {}
    for r in processed:
        starts.setdefault(r["uuid"], []).append(r["startedAt"])
    ttl_ms = consumer.spec.dedup.ttl_seconds * 1000
    # TTL dedup drops a duplicate while its original is remembered (ttlSeconds); a second handling
    # further apart than that is outside the guarantee, and counted separately.
    twice_within_ttl = sum(1 for t in starts.values() if len(t) > 1 and max(t) - min(t) <= ttl_ms)
    report = DemoReport(
        produced=totals.sent, duplicates_sent=totals.duplicates, handled=len(counts),
        duplicates_dropped=history[-1].duplicates if history else 0,
        lost=len(sent_uuids - counts.keys()), handled_twice=twice_within_ttl,
        handled_twice_beyond_ttl=sum(1 for n in counts.values() if n > 1) - twice_within_ttl,
        latency_ms=_percentiles(latencies), rescales=rescales,
        max_workers=max((p.workers for p in history), default=0), seconds=time.monotonic() - started,
        aggregation=section, aggregation_skipped=skipped, key_space=key_space(layout, widest), scaling=scaling,
    )
    (out_dir / "report.json").write_text(json.dumps(asdict(report), indent=2))
    (out_dir / "history.json").write_text(json.dumps([asdict(p) for p in history]))
    if history:
        plot(history, out_dir / "demo.png")
    (out_dir / "report.md").write_text(render_report(report, out_dir))
    print(render_report(report, out_dir), file=out, flush=True)
    return report


def scaling_summary(consumer: StreamConsumer, phases: tuple[Phase, ...], phase_started_ms: list[int],
                    rescales: list[Rescale], pauses: list[list[float]],
                    processed: list[dict[str, Any]]) -> ScalingSummary | None:
    """The demo's ScalingSummary: the burst is its fastest phase, the quiet phase the one after it."""
    burst = max(range(len(phases)), key=lambda i: phases[i].rate)
    if burst + 1 >= len(phase_started_ms):
        return None  # the load stopped before the burst ended
    spec = consumer.spec
    handler_ms = float(spec.handler_config.get("meanMs", 10))
    needed = needed_workers(phases[burst].rate, spec.concurrency, handler_ms, spec.workers.max, TARGET_UTILIZATION)
    burst_ms, quiet_ms = phase_started_ms[burst], phase_started_ms[burst + 1]
    changes = [SizeChange(r.decided_ms, r.workers_after) for r in rescales]
    sizes = [rescales[0].workers_before] + [r.workers_after for r in rescales] if rescales else []
    offered = [offered_rate(phases, phase_started_ms, at_ms)
               for at_ms in ([phase_started_ms[0]] + [r.decided_ms for r in rescales] if rescales else [])]
    quiet = [float(r["startedAt"] - r["created"]) for r in processed if r["created"] >= quiet_ms]
    return ScalingSummary(
        phases[burst].rate, (burst_ms - phase_started_ms[0]) / 1000, needed, time_to_size(changes, burst_ms, needed),
        sum(1 for r in rescales if r.action == "split"), sum(1 for r in rescales if r.action == "merge"),
        flaps(sizes, offered), sum(1 for r in rescales if r.not_read_ahead), tuple(p for ps in pauses for p in ps),
        _percentiles(quiet))


def offered_rate(phases: Sequence[Phase], phase_started_ms: Sequence[int], at_ms: int) -> float:
    """The events/s the load offered at `at_ms`: the rate of the last phase started by then."""
    started = [i for i, ms in enumerate(phase_started_ms[:len(phases)]) if ms <= at_ms]
    return phases[started[-1] if started else 0].rate


def render_report(r: DemoReport, out_dir: Path) -> str:
    """The final report as Markdown."""
    lat = "  ".join(f"{k} {v:,.0f} ms" for k, v in r.latency_ms.items())
    lines = [
        "# keyrange demo report",
        "",
        f"- events produced: {r.produced:,} (of which {r.duplicates_sent:,} duplicate sends)",
        f"- events handled: {r.handled:,}; lost: {r.lost:,}; handled twice within the dedup TTL: "
        f"{r.handled_twice:,} (and {r.handled_twice_beyond_ttl:,} more than the TTL apart)",
        f"- duplicates dropped by the workers: {r.duplicates_dropped:,}",
        f"- latency created -> handler start: {lat}",
        f"- rescales: {len(r.rescales)}; most workers at once: {r.max_workers}; run time {r.seconds:,.0f} s",
        *(summary_lines(r.scaling) if r.scaling is not None else []),
        "",
    ]
    if r.key_space is not None:
        k = r.key_space
        lines += ["## Key space", "",
                  f"The topic's {k.partitions} partitions are each cut into {k.per_partition} hash range(s) of "
                  f"clientIds, {k.partitions * k.per_partition} in all (one per worker at workers.max). "
                  f"At the most workers ({k.workers}):", "", *(f"- {line}" for line in k.partition_lines()), ""]
    lines += [
        "## Ranges over time",
        "",
    ]
    t0 = r.rescales[0]["decided_ms"] if r.rescales else 0
    for x in r.rescales:
        settled = (x["settled_ms"] - x["decided_ms"]) / 1000 if x["settled_ms"] else float("nan")
        waited = ", waited out the read-ahead timeout" if x.get("not_read_ahead") else ""
        lines.append(f"- +{(x['decided_ms'] - t0) / 1000:6.1f} s  {x['action']:5}  {x['workers_before']} -> "
                     f"{x['workers_after']} workers, epoch {x['epoch']}, moved {' '.join(x.get('moved_ranges', []))}, "
                     f"handoff done in {settled:.1f} s{waited}, {describe_pauses(x.get('pauses', []))}: "
                     f"{x['reason']}")
    lines += ["", *render_section(r.aggregation, r.aggregation_skipped)]
    lines += [f"Plot: {out_dir / 'demo.png'}  (rate, lag, p99 latency and workers over time)", ""]
    return "\n".join(lines)
