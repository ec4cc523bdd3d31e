"""When `keyrange run` restarts a worker that exited: Kubernetes' CrashLoopBackOff, locally.

A worker that dies once (a SIGKILL, an OOM kill) is restarted at once, since the handoff protocol
lets it catch up and a handoff may be waiting for it. A worker that keeps exiting (a handler that
does not import, a bad setting, a broker it cannot reach) waits longer before each next start,
doubling up to a cap, instead of being restarted at every supervisor tick: restarting it faster
than it can fail spins a core and floods its log. A worker that stayed up long enough before it
exited starts a new count.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartBackoff:
    """The delay before restarting a worker, from how many times in a row it has exited."""

    first_delay_seconds: float = 1.0
    """The wait before the second restart in a row (the first one is immediate); it doubles after."""
    max_delay_seconds: float = 30.0
    """The longest wait between two starts of a worker that keeps exiting."""
    reset_after_seconds: float = 60.0
    """A worker that ran this long before it exited is restarted at once, as after a first exit."""

    def __post_init__(self) -> None:
        if not 0 < self.first_delay_seconds <= self.max_delay_seconds:
            raise ValueError("need 0 < first_delay_seconds <= max_delay_seconds")
        if self.reset_after_seconds <= 0:
            raise ValueError("reset_after_seconds must be positive")

    def exits_in_a_row(self, before: int, up_seconds: float) -> int:
        """The count after an exit: `before` (the exits in a row up to the start of the process that
        exited) plus one, or 1 if that process was up for `reset_after_seconds`."""
        return 1 if up_seconds >= self.reset_after_seconds else before + 1

    def delay_seconds(self, exits_in_a_row: int) -> float:
        """How long to wait before the next start: 0 after the first exit, then 1, 2, 4, ... s up to
        the cap (with the defaults)."""
        if exits_in_a_row <= 1:
            return 0.0
        # min() before the power too, so that a worker failing for days does not overflow a float.
        doublings = min(exits_in_a_row - 2, 64)
        return min(self.max_delay_seconds, self.first_delay_seconds * 2.0**doublings)
