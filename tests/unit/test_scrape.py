"""Reading worker /metrics for the supervisor: lag per slot, counters, histogram quantiles."""

import socket
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from keyrange.autoscale.scrape import bucket_delta, histogram_quantile, merged_lag, parse_metrics, samples, scrape
from keyrange.ranges.member import ordinal_from_hostname
from keyrange.ranges.membership import default_worker_ordinal
from keyrange.ranges.planner import SlotLag

EXPOSITION = """\
# TYPE keyrange_events_processed counter
keyrange_events_processed_total{consumer="c",worker="0",partition="0"} 10.0
keyrange_events_processed_total{consumer="c",worker="0",partition="1"} 5.0
# TYPE keyrange_duplicates_dropped counter
keyrange_duplicates_dropped_total{consumer="c",worker="0",partition="1"} 2.0
# TYPE keyrange_consumer_lag gauge
keyrange_consumer_lag{consumer="c",worker="0",partition="0"} 7.0
keyrange_consumer_lag{consumer="c",worker="0",partition="1"} 0.0
# TYPE keyrange_consumer_lag_seconds gauge
keyrange_consumer_lag_seconds{consumer="c",worker="0",partition="0"} 1.5
# TYPE keyrange_event_latency_seconds histogram
keyrange_event_latency_seconds_bucket{consumer="c",worker="0",le="0.01"} 50.0
keyrange_event_latency_seconds_bucket{consumer="c",worker="0",le="0.1"} 90.0
keyrange_event_latency_seconds_bucket{consumer="c",worker="0",le="+Inf"} 100.0
keyrange_event_latency_seconds_count{consumer="c",worker="0"} 100.0
keyrange_event_latency_seconds_sum{consumer="c",worker="0"} 3.0
"""


def test_parse_metrics_sums_counters_and_keeps_lag_per_slot() -> None:
    sample = parse_metrics(EXPOSITION, at=1.0)
    assert sample.processed == 15 and sample.duplicates == 2
    assert sample.slot_lag == {0: SlotLag(7, 1.5), 1: SlotLag(0, 0.0)}
    assert sample.latency_buckets == {0.01: 50, 0.1: 90, float("inf"): 100}


def test_a_slot_without_a_lag_in_records_is_unmeasured_whatever_its_age() -> None:
    """The worker exports no lag while its slot's end is unknown; the slot is then missing, not 0."""
    text = EXPOSITION.replace('keyrange_consumer_lag{consumer="c",worker="0",partition="0"} 7.0\n', "")
    assert parse_metrics(text, at=1.0).slot_lag == {1: SlotLag(0, 0.0)}


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = {0.01: 50.0, 0.1: 90.0, float("inf"): 100.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.01)
    assert histogram_quantile(0.7, buckets) == pytest.approx(0.055)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.1)  # in +Inf: the last finite bound
    assert histogram_quantile(0.99, {0.1: 0.0, float("inf"): 0.0}) is None


def test_bucket_delta_treats_a_decrease_as_a_restart() -> None:
    assert bucket_delta({0.1: 30.0}, {0.1: 10.0}) == {0.1: 20.0}
    assert bucket_delta({0.1: 5.0}, {0.1: 10.0}) == {0.1: 5.0}


def test_merged_lag_keeps_the_larger_report_of_a_slot() -> None:
    a = parse_metrics(EXPOSITION, at=1.0)
    b = parse_metrics(EXPOSITION.replace('partition="0"} 7.0', 'partition="0"} 9.0'), at=1.0)
    assert merged_lag([a, b])[0] == SlotLag(9, 1.5)


@pytest.mark.parametrize(("hostname", "ordinal"), [("payments-3", 3), ("a-b-c-12", 12), ("x-0", 0)])
def test_ordinal_from_statefulset_hostname(hostname: str, ordinal: int) -> None:
    assert ordinal_from_hostname(hostname) == ordinal


def test_hostname_without_ordinal_says_what_it_expected() -> None:
    with pytest.raises(ValueError, match="hostname 'laptop': expected <name>-<ordinal>, as a StatefulSet's pods"):
        ordinal_from_hostname("laptop")


def test_without_hostname_in_the_environment_the_ordinal_comes_from_the_kernels_host_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOSTNAME", raising=False)
    monkeypatch.setattr(socket, "gethostname", lambda: "payments-4")
    assert default_worker_ordinal(None) == 4


def test_a_worker_killed_mid_response_reads_as_not_answering() -> None:
    """A worker SIGKILLed while it answers /metrics cuts the body short (IncompleteRead, an
    HTTPException, not an OSError); the supervisor's tick must see "not answering", not crash."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer_half() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 30423\r\n\r\n# TYPE keyrange_events")

    server = threading.Thread(target=answer_half, daemon=True)
    server.start()
    try:
        assert scrape(f"http://127.0.0.1:{listener.getsockname()[1]}/metrics", 0.0) is None
    finally:
        server.join(5)
        listener.close()


def test_samples_reads_an_exposition_as_prometheus_clients_own_parser_does() -> None:
    # The supervisor's line parser against the reference one, on every kind of sample and on label
    # values the text format escapes (quote, backslash, newline) or that look like its syntax.
    registry = CollectorRegistry()
    odd = ['plain', 'a "quoted" id', 'back\\slash', 'two\nlines', 'comma, {brace} = x', '0:2/3', '']
    counter = Counter("keyrange_events_processed", "processed", ["consumer", "partition"], registry=registry)
    gauge = Gauge("keyrange_consumer_lag", "lag", ["partition"], registry=registry)
    histogram = Histogram("keyrange_event_latency_seconds", "latency", ["worker"], registry=registry)
    Gauge("process_cpu_seconds_total_like", "no labels", registry=registry).set(2.5)
    for i, value in enumerate(odd):
        counter.labels(value, str(i)).inc(i + 0.5)
        gauge.labels(value).set(-i)
        histogram.labels(value).observe(i / 10)
    text = generate_latest(registry).decode()
    expected = [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]
    assert list(samples(text, frozenset(name for name, _, _ in expected))) == expected
    assert list(samples(text, frozenset({"keyrange_consumer_lag"}))) == [
        e for e in expected if e[0] == "keyrange_consumer_lag"]


@pytest.mark.parametrize("line", ['keyrange_consumer_lag{partition="3"}', 'keyrange_consumer_lag{partition="3" 1.0',
                                  "keyrange_consumer_lag", "keyrange_consumer_lag x"])
def test_a_sample_line_cut_short_is_a_value_error_which_scrape_reads_as_not_answering(line: str) -> None:
    with pytest.raises(ValueError, match="not a sample line"):
        parse_metrics(f"# TYPE keyrange_consumer_lag gauge\n{line}\n", at=0.0)
