"""Fakes at the worker's seams for unit tests: a clock set by hand, a producer that records calls."""

from __future__ import annotations

from typing import Any


class FakeClock:
    """A monotonic clock the test moves by hand (`now`), starting at 100."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class RecordingProducer:
    """Stands in for confluent's Producer: records the calls a transaction makes."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, topic: str, **kwargs: Any) -> None:
        self.calls.append(f"produce {topic}")

    def flush(self, timeout: float) -> int:
        self.calls.append("flush")
        return 0

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self.calls.append("send_offsets")

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")

    def list_topics(self, topic: str, timeout: float) -> None:
        self.calls.append(f"metadata {topic}")

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init")
