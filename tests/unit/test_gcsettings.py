"""The worker process's garbage-collector settings (gcsettings.py)."""

from __future__ import annotations

import gc

from keyrange.worker.gcsettings import OLDER_THRESHOLDS, YOUNG_THRESHOLD, tune_garbage_collector


def test_tuning_freezes_what_is_alive_and_raises_the_thresholds() -> None:
    before = gc.get_threshold()
    alive = object.__new__(type("Alive", (), {}))  # a container object alive at the call
    try:
        tune_garbage_collector()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
        assert before[0] < YOUNG_THRESHOLD
        assert gc.get_freeze_count() > 0
        assert not any(o is alive for o in gc.get_objects())  # frozen: out of the collector's reach
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    assert any(o is alive for o in gc.get_objects())
