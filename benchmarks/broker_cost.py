"""`python -m benchmarks.broker_cost [--rate R] [--seconds S] [--rounds N]`: what a keyrange
consumer costs its Apache Kafka node, by request kind, and whether the node's JIT matters.

The suite's largest CPU user after its own processes is Kafka (BENCHMARKS.md, "The test suite's
CPU"), and a user's brokers pay the same per request. Each round starts a node, runs
`keyrange run --bootstrap <node> --produce R --ledger` (examples/ledger.yaml: 12 slots, one
transactional producer each) for S seconds, and reads the node's CPU time from /proc. Rounds
alternate the tests' JVM option (`QUICK_START_JVM_OPTIONS`, the quick compiler only) and the full
JIT, so that both see the same machine. A last round, not timed (a log line per request costs the
node CPU), counts the requests from the node's request log (`kafka.request.logger` at DEBUG: one
line per request, with its API).
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import pid_cpu_seconds
from keyrange.local import kafka_cluster
from keyrange.local.kafka_cluster import QUICK_START_JVM_OPTIONS, KafkaCluster

REPO = Path(__file__).resolve().parent.parent
REQUEST_LOG = "logger.requests.name = kafka.request.logger\nlogger.requests.level = DEBUG\n"
API = re.compile(r'"requestApiKeyName":"(\w+)"')
VERIFY = '"verifyOnly":true'
"""The node's own AddPartitionsToTxn, verifying a transactional write's partition (KIP-890)."""


def one_round(jit: str, rate: float, seconds: float, log_requests: bool = False,
              ) -> tuple[float, float, collections.Counter[str]]:
    """(the node's CPU seconds to start, its CPU seconds per second under the load, requests by API
    when `log_requests`)."""
    quiet = kafka_cluster.LOG4J2_PROPERTIES.removesuffix(REQUEST_LOG)
    # The node's log config is written from this text when it starts.
    kafka_cluster.LOG4J2_PROPERTIES = quiet + REQUEST_LOG if log_requests else quiet
    options = QUICK_START_JVM_OPTIONS if jit == "quick" else ()
    with KafkaCluster(nodes=1, jvm_options=options) as cluster, tempfile.TemporaryDirectory() as run_dir:
        pid = cluster.members[0].pid
        assert pid is not None
        started = pid_cpu_seconds(pid)
        log = cluster.members[0].log_file
        skip = log.stat().st_size
        began = time.monotonic()
        subprocess.run([sys.executable, "-m", "keyrange.cli", "run", "-f", str(REPO / "examples" / "ledger.yaml"),
                        "--bootstrap", cluster.bootstrap, "--produce", str(rate), "--ledger",
                        "--duration", str(seconds), "--quiet", "--run-dir", run_dir],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        busy = (pid_cpu_seconds(pid) - started) / (time.monotonic() - began)
        requests: collections.Counter[str] = collections.Counter()
        with log.open(errors="replace") as lines:
            lines.seek(skip)
            for line in lines:
                if (api := API.search(line)) is not None:
                    requests[api.group(1) + (" (the node's own verification)" if VERIFY in line else "")] += 1
    return started, busy, requests


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.broker_cost", description=__doc__.split("\n\n")[1])
    parser.add_argument("--rate", type=float, default=800.0, help="events/s the load writes (default 800)")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of load per round (default 60)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per JIT setting (default 2)")
    args = parser.parse_args()
    print(f"{'JIT':6s} {'start CPU s':>11s} {'CPU s/s under load':>18s}")
    for _ in range(args.rounds):
        for jit in ("quick", "full"):
            started, busy, _ = one_round(jit, args.rate, args.seconds)
            print(f"{jit:6s} {started:11.1f} {busy:18.2f}", flush=True)
    _, _, requests = one_round("quick", args.rate, args.seconds, log_requests=True)
    transactions = max(1, requests["END_TXN"])
    print(f"\nRequests of a round with the request log ({sum(requests.values()) / args.seconds:.0f}/s), per second "
          f"and per transaction ({transactions / args.seconds:.0f} transactions/s):")
    for api, count in requests.most_common(12):
        print(f"  {api:55s} {count / args.seconds:8.1f}/s {count / transactions:6.2f}")


if __name__ == "__main__":
    main()
