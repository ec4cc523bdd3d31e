"""Helpers for tests that drive `keyrange run`'s supervisor in-process."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], bool], timeout_seconds: float, what: str, interval: float = 0.01) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout_seconds`."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout_seconds:g} s waiting for {what}")
