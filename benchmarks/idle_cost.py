"""`python -m benchmarks.idle_cost [--broker kafka|tansu|both] [--seconds S] [--rounds N] [--before-src DIR]`:
what one idle worker costs in CPU, its own and its broker's.

Most workers of a test run, and of a consumer between bursts, wait for records. A waiting worker
still fetches: the broker answers each fetch after `fetch.wait.max.ms` when it has nothing, and
the worker's loop goes round each time its fetch returns empty. Each variant's `keyrange worker`
(12 partitions, `noop`) drains 100 records on its own topic, settles, and then the broker's and
the worker's CPU time are read from /proc over `--seconds`; the broker alone is measured over
the same span first, and its idle cost is subtracted from the "broker, for the worker" column.
Variants, in turn on one broker, in each round: this code; this code with librdkafka's fetch wait
the worker used before (20 ms); and, with `--before-src`, another checkout's src (the code
before, e.g. `git worktree add /tmp/before <commit>` then `--before-src /tmp/before/src`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.harness import pid_cpu_seconds
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape, generate, produce_all
from keyrange.local.embedded_broker import EmbeddedBroker
from keyrange.local.kafka_cluster import KafkaCluster

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 12
SETTLE_SECONDS = 10.0


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU time of the processes `pids` (all their threads) so far."""
    return sum(pid_cpu_seconds(pid) for pid in pids)


@contextlib.contextmanager
def broker(engine: str) -> Iterator[tuple[str, list[int]]]:
    """A broker for the run: its bootstrap and its process ids."""
    if engine == "kafka":
        with KafkaCluster(nodes=1) as cluster:
            yield cluster.bootstrap, [pid for node in cluster.members if (pid := node.pid) is not None]
    else:
        with EmbeddedBroker() as embedded:
            assert embedded.pid is not None
            yield embedded.bootstrap, [embedded.pid]


def idle_worker_cost(bootstrap: str, broker_pids: list[int], name: str, src: Path, extra: list[str],
                     seconds: float, broker_alone: float) -> tuple[float, float]:
    """(the worker's CPU seconds per second, the broker's for the worker) while it waits for records."""
    topic = f"idle-{time.monotonic_ns()}"
    ensure_topics(bootstrap, [TopicSpec(topic, PARTITIONS)], timeout_seconds=60)
    produce_all(bootstrap, topic, list(generate(LoadShape(rate=1000.0, clients=20, seed=1), count=100)))
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{REPO}"}
    worker = subprocess.Popen([sys.executable, "-m", "keyrange.cli", "worker", "--bootstrap", bootstrap,
                               "--topic", topic, "--group", topic, "--partitions", f"0-{PARTITIONS - 1}",
                               "--handler", "noop", "--summary-seconds", "0", *extra],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(SETTLE_SECONDS)
        if worker.poll() is not None:
            raise RuntimeError(f"the {name} worker exited ({worker.returncode}) before it was measured")
        b0, w0 = cpu_seconds(broker_pids), cpu_seconds([worker.pid])
        time.sleep(seconds)
        b1, w1 = cpu_seconds(broker_pids), cpu_seconds([worker.pid])
    finally:
        worker.terminate()
        worker.wait(30)
    return (w1 - w0) / seconds, (b1 - b0) / seconds - broker_alone


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.idle_cost", description=__doc__.split("\n\n")[1])
    parser.add_argument("--broker", choices=("kafka", "tansu", "both"), default="both")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured span per worker (default 30)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every variant (default 2)")
    parser.add_argument("--before-src", type=Path, help="another checkout's src dir, measured beside this one")
    args = parser.parse_args()
    variants = [("this code", REPO / "src", []),
                ("this code, fetch.wait.max.ms=20", REPO / "src", ["--kafka-property", "fetch.wait.max.ms=20"])]
    if args.before_src is not None:
        variants.append(("before", args.before_src.resolve(), []))
    print(f"load average {os.getloadavg()[0]:.1f}; CPU seconds per wall second (100 % of a core = 1.0)")
    for engine in (("kafka", "tansu") if args.broker == "both" else (args.broker,)):
        with broker(engine) as (bootstrap, pids):
            time.sleep(SETTLE_SECONDS)
            b0 = cpu_seconds(pids)
            time.sleep(args.seconds)
            alone = (cpu_seconds(pids) - b0) / args.seconds
            print(f"{engine}: the broker alone {alone:.3f}")
            results: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in variants}
            for _ in range(args.rounds):
                for name, src, extra in variants:
                    results[name].append(idle_worker_cost(bootstrap, pids, name, src, extra, args.seconds, alone))
            for name, runs in results.items():
                worker = statistics.median(w for w, _ in runs)
                broker_part = statistics.median(b for _, b in runs)
                print(f"{engine}: {name:34} worker {worker:.3f}  broker, for the worker {broker_part:.3f}  "
                      f"together {worker + broker_part:.3f}  (runs: "
                      + ", ".join(f"{w:.3f}+{b:.3f}" for w, b in runs) + ")")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
