"""librdkafka's log lines, summarised: the first of a kind, then a count every minute.

With a broker away, librdkafka logs a line per connection attempt per client (hundreds a minute
for one worker), which buries the one line that says what is wrong. Every client keyrange
makes sends its log here (the `logger` client property), where a line is shown the first time, and
repeats of it (same facility and text, digits aside: timestamps and ports differ) are counted and
summarised once a minute.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

SUMMARY_SECONDS = 60.0
"""How long repeats of a line are counted before one summary line."""

_DIGITS = re.compile(r"\d+")


class RepeatSummary(logging.Filter):
    """Lets the first record of a kind through, then one summary per `SUMMARY_SECONDS` (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, int]] = {}
        """kind -> (when its last line was shown, repeats since)."""

    def filter(self, record: logging.LogRecord) -> bool:
        kind = _DIGITS.sub("#", record.getMessage())
        now = self._clock()
        with self._lock:
            shown_at, repeats = self._seen.get(kind, (None, 0))
            if shown_at is not None and now - shown_at < SUMMARY_SECONDS:
                self._seen[kind] = (shown_at, repeats + 1)
                return False
            self._seen[kind] = (now, 0)
        if repeats:
            record.msg = f"{record.msg} (and {repeats} more like it in the last {now - (shown_at or now):.0f} s)"
        return True


def librdkafka_logger() -> logging.Logger:
    """The logger every keyrange Kafka client hands librdkafka (`logger` client property)."""
    logger = logging.getLogger("keyrange.librdkafka")
    if not any(isinstance(f, RepeatSummary) for f in logger.filters):
        logger.addFilter(RepeatSummary())
    return logger
