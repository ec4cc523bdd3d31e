"""Test program: one consumer's range controller in a process of its own, so a test can SIGKILL it.

It runs the real `Controller` (the one the operator and `keyrange run` run) against the control
topic. Its fleet is a file holding the wanted worker count (the test reconciles worker processes
from it, as the StatefulSet controller does from `replicas`); its lag source scrapes the workers
listed in another file (ordinal -> metrics URL), so the planner's lag triggers work as in
production. Lines on stdin force a split ("up") or a merge ("down"), as the alert webhook does.

    python -m tests.integration.chaos_controller SPEC_FILE BOOTSTRAP REPLICAS_FILE TARGETS_FILE
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from keyrange.autoscale.scrape import merged_lag, scrape
from keyrange.kafkaio import partition_counts
from keyrange.ranges.channel import ControlChannel
from keyrange.ranges.controller import Controller
from keyrange.ranges.planner import ScalingLimits, SlotLag
from keyrange.spec import load_file


class FileFleet:
    """The wanted worker count, written atomically to a file the test reconciles from."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def scale_to(self, workers: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(str(workers))
        os.replace(tmp, self.path)


class ScrapedLag:
    """Per-slot lag from the workers' /metrics, as `keyrange run` measures it."""

    def __init__(self, targets: Path) -> None:
        self.targets = targets

    def slot_lag(self) -> Mapping[int, SlotLag]:
        try:
            urls = json.loads(self.targets.read_text())
        except (OSError, ValueError):
            return {}
        now = time.monotonic()
        samples = [s for url in urls.values() if (s := scrape(url, now, timeout_seconds=0.5)) is not None]
        return merged_lag(samples)


def main() -> None:
    spec_file, bootstrap, replicas, targets = sys.argv[1:5]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s controller %(message)s", stream=sys.stderr)
    consumer = load_file(spec_file)
    group = consumer.group_id
    slots = partition_counts(bootstrap)[consumer.spec.kafka.topic]
    controller = Controller(ControlChannel(bootstrap, group, "chaos-controller"), slots,
                            ScalingLimits.from_spec(consumer.spec), ScrapedLag(Path(targets)),
                            FileFleet(Path(replicas)))
    controller.start()
    stop = threading.Event()
    threading.Thread(target=controller.run, args=(stop,), daemon=True).start()
    print("ready", flush=True)
    for line in sys.stdin:
        direction = line.strip()
        if direction in ("up", "down"):
            result = controller.request_scale(direction, "chaos test")
            print(json.dumps({"direction": direction, "applied": result.applied, "detail": result.detail}),
                  flush=True)
    stop.set()


if __name__ == "__main__":
    main()
