"""murmur2 must match Java's Utils.murmur2 exactly, or clients land on the wrong slot."""

import pytest

from keyrange.ranges.slots import format_slot_list, murmur2, parse_slot_list, partition_for_client

# Values from Apache Kafka's UtilsTest.testMurmur2.
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "expected"), JAVA_MURMUR2.items())
def test_murmur2_matches_java(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_partition_for_client_spreads_the_kata_clients() -> None:
    counts = [0] * 12
    for client in range(1000, 1100):
        counts[partition_for_client(client, 12)] += 1
    assert all(c > 0 for c in counts)


def test_slot_lists_round_trip() -> None:
    assert parse_slot_list("0-3,7, 9-11") == [0, 1, 2, 3, 7, 9, 10, 11]
    assert format_slot_list([0, 1, 2, 3, 7, 9, 10, 11]) == "0-3,7,9-11"


@pytest.mark.parametrize("text", ["", "a", "3-1", "-2", "1-x"])
def test_bad_slot_lists_say_what_is_wrong(text: str) -> None:
    with pytest.raises(ValueError, match="bad slot list"):
        parse_slot_list(text)
