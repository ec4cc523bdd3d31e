"""Who may hold which slot: the rules of the two-phase handoff, stated once (pure).

The controller (controller.py) writes publications as handoff.py sequences them, each worker's
member (member.py) follows them, and the control state (channel.py) folds what both read. All
three decide with these functions:

- **The newest epoch rules.** A publication replaces the one held only if its epoch is not older
  (`supersedes`); re-reading the same epoch is harmless, an older one is ignored.
- **What a worker may hold**: its slots in the newest publication minus the slots in transit
  (`allowed_slots`). A slot in transit may still be held by its old owner; its new owner waits.
- **Release before acquire.** A member first releases what it holds beyond what it may hold, then
  acquires what it may hold and does not (`to_release`, `to_acquire`), so no slot is ever held
  by two workers that both follow the newest publication.
- **A handoff** (`plan_handoff`) puts the slots whose owner changes in transit and awaits their
  old owners; it is complete once every awaited worker has reported the epoch, or a newer one,
  without any of them (`has_released`). The grant is then the same map under the next epoch,
  with nothing in transit (`grant`).
- **Read-ahead.** Before the handoff, each new owner reads ahead the slots it will be granted; it
  counts once it reported exactly that prepare's epoch with all of them read (`has_read_ahead`).
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, replace

from keyrange.ranges.rangemap import RangeMap


def supersedes(epoch: int, current: int | None) -> bool:
    """Whether a publication of `epoch` replaces the one of epoch `current` (None: none yet)."""
    return current is None or epoch >= current


def allowed_slots(ranges: RangeMap, transit: Set[int], worker: int) -> frozenset[int]:
    """The slots `worker` may hold under a publication of `ranges` with `transit` in transit."""
    return ranges.slots_of(worker) - transit


def to_release(held: Set[int], allowed: Set[int]) -> frozenset[int]:
    """The slots a worker must release first: those it holds and may not."""
    return frozenset(held) - allowed


def to_acquire(held: Set[int], allowed: Set[int]) -> frozenset[int]:
    """The slots a worker may acquire once it released `to_release`: those it may hold and does not."""
    return frozenset(allowed) - held


def in_transit_towards(ranges: RangeMap, transit: Set[int], worker: int) -> frozenset[int]:
    """The slots in transit whose new owner is `worker` (it acquires them at the grant)."""
    return frozenset(transit) & ranges.slots_of(worker)


@dataclass(frozen=True)
class HandoffPlan:
    """What a change of range map moves, and who must let go of it."""

    moved: frozenset[int]
    """Slots whose owner changes: in transit in the handoff's epoch."""
    awaiting: frozenset[int]
    """Their old owners: the workers whose release completes the handoff."""
    moves: Mapping[int, frozenset[int]]
    """New owner -> the slots it will be granted (what it reads ahead)."""


def plan_handoff(current: RangeMap, nxt: RangeMap) -> HandoffPlan:
    """The handoff from `current` to `nxt` (two maps of the same slots)."""
    moved = current.moved_slots(nxt)
    moves: dict[int, frozenset[int]] = {}
    for slot in sorted(moved):
        owner = nxt.owner_of(slot)
        moves[owner] = moves.get(owner, frozenset()) | {slot}
    return HandoffPlan(moved, frozenset(current.owner_of(s) for s in moved), moves)


def has_released(reported_epoch: int, reported_held: Set[int], epoch: int, slots: Set[int]) -> bool:
    """Whether a worker that reported `reported_epoch` holding `reported_held` has released `slots`
    for the handoff of `epoch`: it applied that epoch (or a newer one) and holds none of them."""
    return reported_epoch >= epoch and not (reported_held & slots)


def has_read_ahead(warm_epoch: int, warm: Set[int], epoch: int, slots: Set[int]) -> bool:
    """Whether a worker that reported `warm` read ahead for the prepare of `warm_epoch` has read
    `slots` ahead for the prepare of `epoch` (a read-ahead for another prepare does not count)."""
    return warm_epoch == epoch and slots <= warm


def grant(ranges: RangeMap) -> RangeMap:
    """The map that ends a handoff of `ranges`: the same owners under the next epoch."""
    return replace(ranges, epoch=ranges.epoch + 1)
