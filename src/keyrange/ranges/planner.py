"""The pure planner: current range map + lag + limits + now -> the next range map, or why not.

No Kafka, no clock of its own: the controller passes `now` (seconds, any monotonic origin) and
the lag it measured, so every rule is unit-tested with plain values.

Rules, in order:
1. Limits first: fewer workers than `min` -> split the largest range; more than `max` -> merge.
2. Cooldown: at most one rescale per `cooldown_seconds` (a handoff must settle and its effect
   on lag must show before the next decision, or the map would flap).
3. Split the hottest range (lag above `lag_high_records`, or oldest unfinished event older than
   `lag_high_seconds`) into two, at the cut that balances its lag; the new worker (ordinal n,
   the next StatefulSet pod) takes the side with fewer slots, so the fewest slots move.
4. Merge the coldest adjacent pair once every range has stayed below `lag_low_records` for
   `cooldown_seconds`; the merged range keeps whichever owner moves the fewest slots, and the
   highest ordinal is the one freed (a StatefulSet scales down from the top).
A forced request ("up"/"down", from the alert webhook) skips the lag thresholds of rules 3-4 but
keeps limits and cooldown, and never goes against its direction ("down" with a hot range: refused).

Those are the `step` policy's rules (one split or merge per decision), kept for comparison. The
default `target` policy replaces rules 2-4 once the controller measured the load (`sizing.py`):
5. Size to the load: when a range needs more than a worker's capacity (its input rate plus its
   backlog drained within `lag_high_seconds`), go in one decision to the fewest workers whose
   balanced ranges each need at most `TARGET_UTILIZATION` of a worker; a next split may follow
   after `SETTLE_SECONDS`, not after the cooldown.
6. No split from a handoff's own pause: the backlog of the slots the last rescale moved is left
   out until `settle_seconds` after the handoff (the first decision after it), and a merge is
   undone only by its measured rates once they settled (`settle_seconds` after its handoff), not
   by lag or a lower capacity estimate: an input above the capacity it was sized on, or a merged
   worker falling behind for `cooldown_seconds` on end.
7. Merge only with headroom: to the largest smaller size whose ranges stayed within
   `MERGE_UTILIZATION` of a worker's capacity for the whole stabilization window (`cooldown_seconds`).
8. No sizing on a start-up: a worker's first seconds (`Load.warming`) give no capacity estimate, and
   while no capacity was ever measured and a worker warms up, the planner waits rather than step.
Forced requests and the workers.min/max limits keep the step rules in both policies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from keyrange.ranges.layout import SlotLayout
from keyrange.ranges.rangemap import Assignment, RangeMap, SlotRange
from keyrange.ranges.sizing import (
    Load,
    balanced_map,
    falling_behind,
    fewest_workers,
    fleet_capacity,
    slot_demand,
    worker_capacity,
)
from keyrange.ranges.slots import format_slot_list
from keyrange.spec import StreamConsumerSpec

Direction = Literal["up", "down"]
Policy = Literal["target", "step"]

TARGET_UTILIZATION = 0.8
"""A split sizes so that each range needs at most this fraction of a worker's capacity."""
MERGE_UTILIZATION = 0.7
"""A merge needs the smaller size to stay within this fraction for the stabilization window."""
SETTLE_SECONDS = 5.0
"""Least time between two target splits: the rates measured after the first must show its effect."""


@dataclass(frozen=True, slots=True)
class SlotLag:
    """Lag of one slot: records behind the high watermark, and age of its oldest unfinished event."""

    records: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class ScalingLimits:
    """The spec's `workers` and `scaling`, in planner units."""

    min_workers: int = 1
    """Never fewer workers."""
    max_workers: int = 6
    """Never more workers (nor more than there are slots)."""
    lag_high_records: int = 5_000
    """Split a range whose lag exceeds this many records ..."""
    lag_high_seconds: float = 5.0
    """... or whose oldest unfinished event is older than this."""
    lag_low_records: int = 100
    """Merge when every range stays below this ..."""
    cooldown_seconds: float = 60.0
    """... for this long; also the minimum time between two rescales (the `target` policy: between a
    rescale and a merge, its stabilization window)."""
    policy: Policy = "target"
    """`target`: size to the measured load in one decision; `step`: one split or merge per cooldown."""

    @property
    def settle_seconds(self) -> float:
        """How long after a handoff the moved slots' backlog is taken for its own pause."""
        return max(SETTLE_SECONDS, self.lag_high_seconds)

    @classmethod
    def from_spec(cls, spec: StreamConsumerSpec) -> ScalingLimits:
        """Limits from a StreamConsumer spec."""
        s = spec.scaling
        return cls(spec.workers.min, spec.workers.max, s.lag_high_records, s.lag_high_seconds,
                   s.lag_low_records, s.cooldown_seconds, s.policy)


@dataclass(frozen=True)
class Decision:
    """What the planner decided and why."""

    next_map: RangeMap | None
    """The map to publish, or None to keep the current one."""
    reason: str
    """One human line: why this map, or why no change."""
    action: Literal["split", "merge", "none"] = "none"
    moved_slots: frozenset[int] = field(default_factory=frozenset)
    """Slots whose owner changes (they pause briefly during the handoff; the others never do)."""


@dataclass(frozen=True)
class ScaleOutcome:
    """What a range controller did with a request to split (`up`) or merge (`down`): the one answer
    of `Controller.request_scale`, the operator's `RangeControl` and the alert webhook's targets."""

    applied: bool
    """True when a split or merge started (a new range map was decided)."""
    detail: str
    """One human line: the planner's reason, or why nothing happened (cooldown, limits, a rescale
    in progress); may be empty."""
    from_workers: int
    """Workers before the request."""
    to_workers: int
    """Workers the decided map uses (`from_workers` when nothing was applied)."""
    in_progress: bool = False
    """Refused only because a rescale is under way: that rescale's record stays the one shown."""


def range_lag(assignment: Assignment, lag: Mapping[int, SlotLag]) -> SlotLag:
    """A range's lag: records summed over its slots, seconds the maximum."""
    parts = [lag.get(s, SlotLag()) for s in assignment.range.slots]
    return SlotLag(sum(p.records for p in parts), max(p.seconds for p in parts))


def split(current: RangeMap, index: int, lag: Mapping[int, SlotLag]) -> RangeMap:
    """Split range `index` at the cut that best balances its lag; the new ordinal takes the
    smaller side (the upper one on a tie)."""
    a = current.assignments[index]
    r = a.range
    if r.size < 2:
        raise ValueError(f"range {r} has a single slot and cannot be split")
    records = [lag.get(s, SlotLag()).records for s in r.slots]
    total, middle = sum(records), r.size / 2

    def imbalance(cut: int) -> tuple[int, float]:
        left = sum(records[:cut])
        return abs(total - 2 * left), abs(cut - middle)

    cut = min(range(1, r.size), key=imbalance)
    low, high = SlotRange(r.first, r.first + cut - 1), SlotRange(r.first + cut, r.last)
    new_worker = current.workers
    if low.size < high.size:
        pair = (Assignment(low, new_worker), Assignment(high, a.worker))
    else:
        pair = (Assignment(low, a.worker), Assignment(high, new_worker))
    assignments = current.assignments[:index] + pair + current.assignments[index + 1:]
    return RangeMap(current.epoch + 1, current.slot_count, assignments)


def merge(current: RangeMap, index: int) -> RangeMap:
    """Merge ranges `index` and `index + 1`, freeing the highest ordinal, moving the fewest slots."""
    if not 0 <= index < current.workers - 1:
        raise ValueError(f"no adjacent pair at {index} in a map of {current.workers} ranges")
    left, right = current.assignments[index], current.assignments[index + 1]
    merged = SlotRange(left.range.first, right.range.last)
    top = current.workers - 1
    candidates = []
    for keep, freed in ((left.worker, right.worker), (right.worker, left.worker)):
        assignments = (*current.assignments[:index], Assignment(merged, keep), *current.assignments[index + 2:])
        if freed != top:
            # The top ordinal leaves (a StatefulSet shrinks from the top): its range goes to the freed one.
            assignments = tuple(Assignment(x.range, freed if x.worker == top else x.worker) for x in assignments)
        candidate = RangeMap(current.epoch + 1, current.slot_count, assignments)
        candidates.append((len(current.moved_slots(candidate)), candidate))
    return min(candidates, key=lambda c: c[0])[1]


class Planner:
    """Decides rescales for one consumer; remembers when it last rescaled, what that moved, since when
    lag has been low or a smaller size has had headroom, and the last capacity estimate (all in the
    caller's clock)."""

    def __init__(self, limits: ScalingLimits, last_rescale_at: float | None = None) -> None:
        self.limits = limits
        self.last_rescale_at = last_rescale_at
        self.low_since: float | None = None
        self.capacity: float | None = None
        """Events per second one worker handles (the newest estimate; None until one was measured)."""
        self.layout: SlotLayout | None = None
        """How the consumer's slots cut its partitions, to name ranges in the reasons as partitions
        and hash ranges (`0:0-1/4`); None names them by slot number."""
        self._last: Decision | None = None
        self._resumed_at: float | None = None
        """The first decision after the last rescale: its handoff had completed by then."""
        self._headroom: tuple[float, int] | None = None
        """(since when, the largest smaller size seen since) while a smaller size keeps headroom."""
        self._merged_on: float | None = None
        """The capacity estimate the last rescale was decided on (a merge's promise of headroom)."""
        self._short_since: float | None = None
        """Since when a worker has fallen behind after the last merge, on its measured rate."""

    def max_workers(self, current: RangeMap) -> int:
        """The effective maximum: the spec's, capped by the slot count."""
        return min(self.limits.max_workers, current.slot_count)

    def _at_maximum(self, current: RangeMap) -> str:
        high = self.max_workers(current)
        if high < self.limits.max_workers:
            # The layout is fixed per consumer: only a new one (a new groupId) has more slots.
            return (f"already at the maximum of {high} workers: the range map has {high} slots (laid out for a "
                    f"lower workers.max); a new groupId lays the consumer out for "
                    f"workers.max={self.limits.max_workers}")
        return f"already at the maximum of {high} workers"

    def _layout_fits(self, current: RangeMap) -> bool:
        return self.layout is not None and self.layout.slot_count == current.slot_count

    def _show(self, current: RangeMap, r: SlotRange) -> str:
        return current.describe_range(r, self.layout if self._layout_fits(current) else None)

    def decide(self, current: RangeMap, lag: Mapping[int, SlotLag], now: float,
               force: Direction | None = None, load: Load | None = None) -> Decision:
        """The next map (or None) and the reason. A returned change counts as a rescale at `now`.
        `load` (rates and busy fractions) lets the `target` policy size; without it, it steps."""
        if self.last_rescale_at is not None and self._resumed_at is None:
            self._resumed_at = now
        decision = self._decide(current, lag, now, force, load)
        unmeasured = [s for s in range(current.slot_count) if s not in lag]
        # Only the planner's own merges wait: a request (an alert, an operator) is the requester's call.
        if decision.action == "merge" and unmeasured and force is None and current.workers <= self.max_workers(current):
            # A slot nobody measures may be one nobody handles: its backlog is unknown, not zero.
            layout = self.layout if self._layout_fits(current) else None
            shown = layout.describe_slots(unmeasured) if layout is not None else format_slot_list(unmeasured)
            decision = Decision(None, f"not merging: no worker reports the lag of slot(s) {shown} (a handoff, a "
                                      f"restart or an outage); the merge waits until every slot is measured")
        if decision.next_map is not None:
            self.last_rescale_at = now
            self.low_since = None
            self._last, self._resumed_at, self._headroom = decision, None, None
            self._merged_on, self._short_since = self.capacity, None
        return decision

    def _decide(self, current: RangeMap, lag: Mapping[int, SlotLag], now: float,
                force: Direction | None, load: Load | None) -> Decision:
        lim = self.limits
        lags = [range_lag(a, lag) for a in current.assignments]
        all_low = all(x.records < lim.lag_low_records and x.seconds < lim.lag_high_seconds for x in lags)
        if not all_low:
            self.low_since = None
        elif self.low_since is None:
            self.low_since = now
        if current.workers < min(lim.min_workers, self.max_workers(current)):
            index = max(range(current.workers), key=lambda i: current.assignments[i].range.size)
            return self._split(current, index, lag, f"below workers.min={lim.min_workers}")
        if current.workers > self.max_workers(current):
            return self._merge(current, lags, f"above workers.max={lim.max_workers}")
        if lim.policy == "target" and force is None and load is not None:
            decision = self._target(current, lag, now, load)
            if decision is not None:
                return decision
        if self.last_rescale_at is not None and now - self.last_rescale_at < lim.cooldown_seconds:
            left = lim.cooldown_seconds - (now - self.last_rescale_at)
            return Decision(None, f"cooling down ({left:.0f} s left)")
        hot = [i for i, x in enumerate(lags)
               if x.records > lim.lag_high_records or x.seconds > lim.lag_high_seconds]
        if force == "down" and hot and current.workers > lim.min_workers:
            # A request names a direction: against it the answer is no, with the reason.
            index = max(hot, key=lambda i: (lags[i].records, lags[i].seconds))
            x, hottest = lags[index], self._show(current, current.assignments[index].range)
            return Decision(None, f"scale-down requested, but range {hottest} lags {x.records} records / "
                                  f"{x.seconds:.1f} s: not merging")
        if force == "up" or hot:
            if current.workers >= self.max_workers(current):
                return Decision(None, f"lag is high but {self._at_maximum(current)}")
            splittable = [i for i in (hot or range(current.workers)) if current.assignments[i].range.size > 1]
            if not splittable:
                return Decision(None, "lag is high but the hot ranges are single slots")
            index = max(splittable, key=lambda i: (lags[i].records, lags[i].seconds, current.assignments[i].range.size))
            x = lags[index]
            hottest = self._show(current, current.assignments[index].range)
            why = "scale-up requested" if force == "up" and not hot else (
                f"range {hottest} lags {x.records} records / {x.seconds:.1f} s")
            return self._split(current, index, lag, why)
        if current.workers <= lim.min_workers:
            return Decision(None, "lag is fine" if force != "down" else f"already at workers.min={lim.min_workers}")
        if force == "down":
            return self._merge(current, lags, "scale-down requested")
        if all_low and self.low_since is not None and now - self.low_since >= lim.cooldown_seconds:
            held = now - self.low_since
            return self._merge(current, lags, f"lag below {lim.lag_low_records} records for {held:.0f} s")
        return Decision(None, "lag is fine")

    def paused_slots(self, now: float) -> frozenset[int]:
        """The slots the last rescale moved, while their backlog is still its handoff's pause."""
        if self._last is None or self._resumed_at is None:
            return frozenset()
        if now - self._resumed_at >= self.limits.settle_seconds:
            return frozenset()
        return self._last.moved_slots

    def _target(self, current: RangeMap, lag: Mapping[int, SlotLag], now: float, load: Load) -> Decision | None:
        """The `target` policy's decision, or None when no capacity was ever measured (then it steps)."""
        lim = self.limits
        paused = self.paused_slots(now)
        rates = [max(0.0, load.slot_rates.get(s, 0.0)) for s in range(current.slot_count)]
        into = [sum(rates[s] for s in a.range.slots) for a in current.assignments]
        # The paused slots' owners are left out: their rate over the window is not their own yet.
        estimates = [worker_capacity(w, falling_behind(w, range_lag(a, lag).seconds, into[i]))
                     for i, a in enumerate(current.assignments)
                     if (w := load.workers.get(a.worker)) is not None and not paused & set(a.range.slots)]
        self.capacity = fleet_capacity(estimates) or self.capacity
        if self.capacity is None:
            if load.warming:
                # Stepping on lag meanwhile would size on the start-up's own backlog.
                who = ", ".join(str(w) for w in sorted(load.warming))
                many = len(load.warming) > 1
                return Decision(None, f"sizing waits for a measure of capacity: worker{'s' if many else ''} {who} "
                                      f"{'are' if many else 'is'} warming up")
            return None
        capacity = self.capacity
        backlog = [0 if s in paused else lag.get(s, SlotLag()).records for s in range(current.slot_count)]
        demand = [slot_demand(r, b, lim.lag_high_seconds) for r, b in zip(rates, backlog, strict=True)]
        high = self.max_workers(current)
        low = min(lim.min_workers, high)
        need = [sum(demand[s] for s in a.range.slots) for a in current.assignments]
        summary = (f"{sum(rates):.0f} ev/s in, {sum(backlog)} records behind, "
                   f"{capacity:.0f} ev/s per worker")
        if max(need) > capacity:
            self._headroom = None
            held = self._merge_holds(current, lag, now, load, into, summary)
            if held is not None:
                return held
            if self.last_rescale_at is not None and now - self.last_rescale_at < SETTLE_SECONDS:
                return Decision(None, f"settling after the last rescale ({summary})")
            target = fewest_workers(demand, capacity, TARGET_UTILIZATION, low, high)
            if current.workers >= high:
                return Decision(None, f"over capacity but {self._at_maximum(current)} ({summary})")
            if target <= current.workers:
                if max(demand) > capacity:
                    return Decision(None, f"a single slot needs more than a worker; more would not help ({summary})")
                # Moving slots between as many workers pauses them for a gain the noise of the rates may undo.
                return Decision(None, f"over capacity, but {current.workers} balanced ranges would do ({summary})")
            nxt = balanced_map(current, demand, target)
            return Decision(nxt, f"split to {target} workers: {summary}", "split", current.moved_slots(nxt))
        self._short_since = None  # a merged worker that keeps up starts its count again
        smaller = fewest_workers(demand, capacity, MERGE_UTILIZATION, low, high)
        if smaller >= current.workers:
            self._headroom = None
            return Decision(None, f"capacity is fine ({summary})")
        since, workers = self._headroom or (now, smaller)
        self._headroom = since, max(workers, smaller)
        wait = max(lim.cooldown_seconds - (now - since),
                   lim.cooldown_seconds - (now - self.last_rescale_at) if self.last_rescale_at is not None else 0)
        if wait > 0:
            return Decision(None, f"{self._headroom[1]} workers would keep headroom; merging in {wait:.0f} s "
                                  f"({summary})")
        nxt = balanced_map(current, demand, self._headroom[1])
        return Decision(nxt, f"merge to {nxt.workers} workers: headroom for {now - since:.0f} s ({summary})",
                        "merge", current.moved_slots(nxt))

    def _merge_holds(self, current: RangeMap, lag: Mapping[int, SlotLag], now: float, load: Load,
                     into: list[float], summary: str) -> Decision | None:
        """Why the last merge stands though the ranges need more than the capacity estimate, or None when a
        split may undo it: once its rates settled, the input outgrew the capacity the merge was sized on,
        or a merged worker fell behind on its measured rate for the whole stabilization window."""
        if self._last is None or self._last.action != "merge" or self.capacity is None:
            return None
        since_merge = now - (self.last_rescale_at or 0.0)
        paused = self.paused_slots(now)
        if paused:
            # The rate window still spans the handoff: the old owners' last counts, the pause, the new
            # owner's catch-up and a lag read on either side of it, which add up to more than came in.
            return Decision(None, f"{since_merge:.0f} s after a merge, its rates settle first ({summary})")
        if max(into) > max(self.capacity, self._merged_on or 0.0):
            return None
        behind = any(falling_behind(w, range_lag(a, lag).seconds, into[i])
                     for i, a in enumerate(current.assignments) if (w := load.workers.get(a.worker)) is not None)
        if not behind:
            self._short_since = None
            return Decision(None, f"lag {since_merge:.0f} s after a merge, but the rate fits ({summary})")
        # One window's shortfall on a busy machine is noise; one that lasts the window is not.
        self._short_since = self._short_since if self._short_since is not None else now
        short_for = now - self._short_since
        if short_for >= self.limits.cooldown_seconds:
            return None
        return Decision(None, f"the merged size falls behind for {short_for:.0f} s; it splits after "
                              f"{self.limits.cooldown_seconds:.0f} s of it ({summary})")

    def _split(self, current: RangeMap, index: int, lag: Mapping[int, SlotLag], why: str) -> Decision:
        nxt = split(current, index, lag)
        moved = current.moved_slots(nxt)
        return Decision(nxt, f"split {self._show(current, current.assignments[index].range)}: {why}", "split", moved)

    def _merge(self, current: RangeMap, lags: list[SlotLag], why: str) -> Decision:
        index = min(range(current.workers - 1),
                    key=lambda i: (lags[i].records + lags[i + 1].records,
                                   current.assignments[i].range.size + current.assignments[i + 1].range.size))
        nxt = merge(current, index)
        a, b = current.assignments[index].range, current.assignments[index + 1].range
        return Decision(nxt, f"merge {self._show(current, a)} and {self._show(current, b)}: {why}", "merge",
                        current.moved_slots(nxt))


def with_epoch(m: RangeMap, epoch: int) -> RangeMap:
    """The same map under another epoch number (the controller numbers what it publishes)."""
    return replace(m, epoch=epoch)
