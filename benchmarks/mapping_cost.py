"""What the input mapping costs per record, in instructions (BENCHMARKS.md, "Input mapping"):
counted by callgrind, so the figures hold on a machine whose load makes timings vary by 2x.

Three topics of the same ledger commands (1,000 clients, 1 % duplicates), 12 partitions, written
alike but for each record's key and headers (`bench_ledger.produce_as`: same producer, partitions
and batches):
- `default`: keyrange's own format (key = decimal clientId);
- `headers`: the same records, each with the `event-id` header the mapped topic carries;
- `mapped`: as another team writes them (key `user-<clientId>`, the uuid in `event-id`, `created`
  as the record timestamp).

Each is produced twice, with `--small` and `--large` records. A child process consumes a whole
topic under `valgrind --tool=callgrind` (all threads: librdkafka's fetch and the main thread) and
does one of the stages below with each record; the per-record cost of a stage on a topic is the
large run's instructions minus the small run's, over the difference in records (start-up, imports
and connecting cancel out):
- `consume`: nothing (the Message is made and freed: librdkafka's fetch and, for a record with
  headers, confluent-kafka's `rd_kafka_message_detach_headers`, which parses them);
- `headers`: `Message.headers()` (the headers as a Python list);
- `admit`: `Intake.admit` of a held slot (parse, placement, skew, dedup, the job) under the default
  mapping, or under `clientId: key, uuid: header:event-id, created: timestamp` for `mapped`.

`python -m benchmarks.mapping_cost [--broker tansu|kafka] [--small N] [--large N]`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from benchmarks.bench_ledger import MAPPED_FLAGS, MAPPING_KINDS, PARTITIONS, produce_as
from benchmarks.harness import load_average, running_broker
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape, generate

REPO = Path(__file__).resolve().parents[1]
KINDS = MAPPING_KINDS
STAGES = ("consume", "headers", "admit")
MAPPING = dict(zip(("client_id", "uuid", "created"), MAPPED_FLAGS[1::2], strict=True))
"""The benchmark's mapping (bench_ledger.MAPPED_FLAGS) as InputMapping fields."""


def produce_topics(bootstrap: str, prefix: str, count: int) -> dict[str, str]:
    """The three topics of `count` records; kind -> topic."""
    topics = {kind: f"{prefix}-{kind}-{count}" for kind in KINDS}
    ensure_topics(bootstrap, [TopicSpec(t, PARTITIONS) for t in topics.values()], timeout_seconds=60)
    records = list(generate(LoadShape(clients=1000, duplicate_ratio=0.01, ledger=True, seed=21), count=count))
    for kind, topic in topics.items():
        produce_as(kind, bootstrap, topic, records)
    return topics


def consume_all(bootstrap: str, topic: str, count: int, stage: str, mapped: bool) -> None:
    """The child's work: consume the `count` records of `topic`, doing `stage` with each."""
    from keyrange.inputmapping import DEFAULT_MAPPING, InputMapping
    from keyrange.worker.gcsettings import tune_garbage_collector
    from keyrange.worker.intake import Intake
    from keyrange.worker.outputs import Outputs
    from keyrange.worker.restore import RestoredPartition
    from keyrange.worker.settings import WorkerSettings
    from keyrange.worker.slot import SlotMetrics, SlotState

    mapping = InputMapping(**MAPPING) if mapped else DEFAULT_MAPPING
    settings = WorkerSettings(bootstrap=bootstrap, topic=topic, group_id="cost", input_mapping=mapping)
    layout = {t: PARTITIONS for t in (topic, settings.sink, settings.dlq, settings.state)}
    intake = Intake(PARTITIONS, 10.0, Outputs(settings, layout, {}), mapping=mapping)
    slots = [SlotState(p, p, RestoredPartition(0), 10.0, time.time, SlotMetrics("cost", "w0", p),
                       None, p) for p in range(PARTITIONS)]  # type: ignore[arg-type]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cost", "enable.auto.commit": False,
                         "log_level": 3})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    tune_garbage_collector()  # as a worker does
    seen = 0
    while seen < count:
        for m in consumer.consume(1000, 1.0):
            if m.error() is not None:
                raise KafkaException(m.error())
            seen += 1
            if stage == "headers":
                m.headers()
            elif stage == "admit":
                intake.admit(slots[m.partition()], m, m.offset())  # type: ignore[arg-type]
    consumer.close()


def instructions(bootstrap: str, topic: str, count: int, stage: str, mapped: bool, src: Path) -> int:
    """Instructions callgrind counts for one child (all threads), running keyrange from `src`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{REPO}", "PYTHONHASHSEED": "0",
               "PYTHONMALLOC": "malloc"}
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-m",
                        "benchmarks.mapping_cost", "--child", bootstrap, topic, str(count), stage,
                        "mapped" if mapped else "default"],
                       env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
        found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
        if found is None:
            raise RuntimeError("callgrind wrote no summary")
        return int(found.group(1))


def main() -> None:
    """Produce the topics, count each (kind, stage), print instructions per record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="tansu", choices=("tansu", "kafka"))
    parser.add_argument("--small", type=int, default=5_000)
    parser.add_argument("--large", type=int, default=25_000)
    parser.add_argument("--runs", default=",".join(f"{stage}:{kind}" for stage in STAGES for kind in KINDS),
                        help="stage:kind pairs to count, comma-separated (default: all)")
    parser.add_argument("--src", type=Path, default=REPO / "src", help="the keyrange sources counted (a src dir)")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        bootstrap, topic, count, stage, kind = args.child
        consume_all(bootstrap, topic, int(count), stage, kind == "mapped")
        return
    with running_broker(args.broker) as bootstrap:
        prefix = f"mapping-cost-{time.monotonic_ns()}"
        small, large = produce_topics(bootstrap, prefix, args.small), produce_topics(bootstrap, prefix, args.large)
        for run in args.runs.split(","):
            stage, kind = run.split(":")
            counts = [instructions(bootstrap, topics[kind], n, stage, kind == "mapped", args.src)
                      for topics, n in ((small, args.small), (large, args.large))]
            per_record = (counts[1] - counts[0]) / (args.large - args.small)
            print(f"{stage:8} {kind:8} {per_record:10,.0f} instructions/record "
                  f"({counts[0]:,} / {counts[1]:,}; {load_average()})", flush=True)


if __name__ == "__main__":
    main()
