"""Slots: the unit of ownership, and the hash that places a client.

Producers place a clientId on partition `murmur2(key) % partitions`, exactly as Java clients do
(librdkafka needs `partitioner=murmur2_random` for that), so keyrange can compute where any
client lives without asking Kafka. A slot is a whole partition or a hash range of clientIds
inside one, by the same murmur2 (layout.py); slot lists (`0-3,7`) are written and read here.
"""

from __future__ import annotations

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as a signed 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    full = length - (length & 3)
    for i in range(0, full, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[full + 2] << 16
    if rest >= 2:
        h ^= data[full + 1] << 8
    if rest >= 1:
        h ^= data[full]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition a Java producer (and librdkafka's murmur2_random) picks for a non-null key."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def partition_for_client(client_id: int | str, partitions: int) -> int:
    """The partition of a clientId: murmur2 of its key, the UTF-8 of its text (an integer's decimal), which
    are the bytes of the record key a producer keyed by clientId hashed."""
    return partition_for_key(str(client_id).encode(), partitions)


def parse_slot_list(text: str) -> list[int]:
    """Parse `0-3,7,9-11` into a sorted list of distinct slots; raise ValueError on bad syntax."""
    slots: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise ValueError(f"bad slot list {text!r}: {part!r} is not N or N-M") from None
        if first < 0 or last < first:
            raise ValueError(f"bad slot list {text!r}: {part!r} is not an increasing, non-negative range")
        slots.update(range(first, last + 1))
    if not slots:
        raise ValueError(f"bad slot list {text!r}: no slots")
    return sorted(slots)


def format_slot_list(slots: list[int] | set[int] | tuple[int, ...]) -> str:
    """Format slots compactly, e.g. [0,1,2,3,7] -> '0-3,7'."""
    ordered = sorted(set(slots))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)
