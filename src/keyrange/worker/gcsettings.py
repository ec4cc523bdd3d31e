"""The cyclic garbage collector's settings for a worker process.

A worker allocates a few container objects per event (the parsed body, its InputEvent and Job, the
handler's context and result, the staged output) and keeps thousands of them alive while their
events are pending or their outputs wait for the next commit. With CPython's default thresholds
(a young collection every 700 net allocations) those survivors are traversed again and again, and
every full collection also walks every module, function and class loaded at start: the collector
was a visible share of a worker's profile (BENCHMARKS.md, "The ledger and the hot counter again").

Two changes, made once the worker's code is loaded:
- `gc.freeze()` moves everything alive at start (imports, the handler, settings) out of the
  collector's reach: it is never garbage, and full collections no longer walk it.
- A young collection every YOUNG_THRESHOLD allocations instead of 700, and older generations
  collected less often: the same objects are traversed fewer times. Reference counting still
  frees almost everything at once; only objects in reference cycles wait longer, which costs at
  most a few MB.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Net container allocations between two young collections (CPython's default: 700)."""
OLDER_THRESHOLDS = (20, 20)
"""Young collections per middle one, and middle ones per full one (CPython's default: 10, 10)."""


def tune_garbage_collector() -> None:
    """Freeze what is alive now and raise the collection thresholds (module docstring)."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
