"""`python -m benchmarks.scrape_cost [--rounds N]`: what reading one worker's /metrics costs the
local supervisor, which reads every worker once a second (`autoscale/scrape.py`).

A `keyrange worker` (12 partitions, `sleep`) on the embedded broker handles 2,000 events, its
/metrics is fetched once, and the text is then parsed `--rounds` times by `parse_metrics` and by
prometheus_client's own parser (what `parse_metrics` used before), side by side in one process.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from keyrange.autoscale.scrape import parse_metrics
from keyrange.kafkaio import TopicSpec, ensure_topics
from keyrange.loadgen import LoadShape, generate, produce_all
from keyrange.local.embedded_broker import EmbeddedBroker
from keyrange.local.ports import free_port

PARTITIONS = 12


def exposition(bootstrap: str) -> str:
    """A worker's /metrics text after it handled 2,000 events."""
    topic = "scrape-cost"
    ensure_topics(bootstrap, [TopicSpec(topic, PARTITIONS)], timeout_seconds=60)
    produce_all(bootstrap, topic, list(generate(LoadShape(rate=5000.0, clients=100, seed=1), count=2000)))
    port = free_port()
    worker = subprocess.Popen([sys.executable, "-m", "keyrange.cli", "worker", "--bootstrap", bootstrap,
                               "--topic", topic, "--group", topic, "--partitions", f"0-{PARTITIONS - 1}",
                               "--handler", "sleep", "--metrics-port", str(port), "--summary-seconds", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    text: str = response.read().decode()
                if parse_metrics(text, 0).processed >= 2000 or time.monotonic() > deadline:
                    return text
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.5)
    finally:
        worker.terminate()
        worker.wait(30)


def cpu_ms_per_parse(parse: Callable[[str], object], text: str, rounds: int) -> float:
    """CPU milliseconds per call of `parse(text)`."""
    start = time.process_time()
    for _ in range(rounds):
        parse(text)
    return (time.process_time() - start) / rounds * 1000


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scrape_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    with EmbeddedBroker() as broker:
        text = exposition(broker.bootstrap)
    lines = text.count("\n")
    now = cpu_ms_per_parse(lambda t: parse_metrics(t, 0), text, args.rounds)
    before = cpu_ms_per_parse(lambda t: list(text_string_to_metric_families(t)), text, args.rounds)
    print(f"load average {os.getloadavg()[0]:.1f}; one worker's /metrics: {lines} lines, {len(text):,} bytes")
    print(f"parse_metrics {now:.3f} ms CPU; prometheus_client's parser alone {before:.3f} ms; ratio {now / before:.3f}")


if __name__ == "__main__":
    main()
