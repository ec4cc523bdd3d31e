"""`benchmarks.bench_ledger.steady_rate`: the paced hot counter's handled rate, without its edges
and without the tail of late duplicates that only the raw loop answers."""

import pytest
from benchmarks.bench_ledger import steady_rate


def test_the_tail_of_late_duplicates_does_not_lower_the_rate() -> None:
    paced = [100.0 + i / 1000 for i in range(10_000)]  # 1,000/s for 10 s
    tail = [110.0 + i / 100 for i in range(500)]  # then 100/s for 5 s: late duplicates answered
    assert steady_rate(paced, 10.0) == pytest.approx(1000, rel=0.01)
    assert steady_rate(paced + tail, 10.0) == pytest.approx(1000, rel=0.01)


def test_a_loop_that_falls_behind_shows_its_own_rate() -> None:
    behind = [100.0 + i / 600 for i in range(12_000)]  # 600/s while 1,000/s were offered
    assert steady_rate(behind, 10.0) == pytest.approx(600, rel=0.01)


def test_no_results_is_a_rate_of_zero_and_a_too_short_span_is_refused() -> None:
    assert steady_rate([], 10.0) == 0.0
    with pytest.raises(ValueError, match="too short"):
        steady_rate([1.0], 2.0)
