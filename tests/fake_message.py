"""A stand-in for the confluent_kafka.Message methods a restore reads, for unit tests."""

from __future__ import annotations


class FakeMessage:
    """A fetched record: offset, key, value, headers and its (CreateTime) timestamp."""

    def __init__(self, offset: int, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes]] | None = None, timestamp_ms: int = 0) -> None:
        self._offset, self._key, self._value, self._headers, self._ts = offset, key, value, headers, timestamp_ms

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return 1, self._ts

    def error(self) -> None:
        return None
