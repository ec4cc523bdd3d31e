"""What a handler sees besides the event: the client's keyed state, its config, where it runs.

State writes are staged on the context and applied only when the handler returns, so a failed
attempt (retried or dead-lettered) leaves no trace, and an unfinished event's write never reaches
a transaction before its offset does. The committed state is kept encoded, exactly as the
changelog holds it, and every `get` decodes a fresh copy: a handler that mutates what it read and
then fails (or never calls `set`) cannot change the state its retry, the next event, or a restore
sees.
"""

from __future__ import annotations

from typing import Any

import orjson

from keyrange.events import ClientId

_UNSET: Any = object()


class ClientState:
    """The current client's keyed state: one JSON value, changelogged to Kafka."""

    __slots__ = ("_committed", "_staged")

    def __init__(self, committed: bytes | None) -> None:
        self._committed = committed
        """The committed value as JSON (what the changelog holds), None when there is none."""
        self._staged: Any = _UNSET

    def get(self, default: Any = None) -> Any:
        """A copy of the client's value (this handler call's own write if it made one), or `default`."""
        if self._staged is not _UNSET:
            value = self._staged
        else:
            value = None if self._committed is None else orjson.loads(self._committed)
        return default if value is None else value

    def set(self, value: Any) -> None:
        """Replace the client's value (JSON-able); None deletes it."""
        self._staged = value

    @property
    def changed(self) -> bool:
        """True when the handler called `set`."""
        return self._staged is not _UNSET

    @property
    def staged(self) -> Any:
        """The value written by `set` (only meaningful when `changed`)."""
        return self._staged


class HandlerContext:
    """Passed to every handler call as `ctx`."""

    __slots__ = ("attempt", "client_id", "config", "offset", "partition", "state", "worker")

    def __init__(
        self,
        *,
        client_id: ClientId,
        partition: int,
        offset: int,
        attempt: int,
        worker: str,
        config: dict[str, Any],
        state: ClientState,
    ) -> None:
        self.client_id = client_id
        """The event's clientId: an integer or text, as the input mapping found it."""
        self.partition = partition
        """Input partition (= slot) of the event."""
        self.offset = offset
        """Input offset of the event."""
        self.attempt = attempt
        """1 for the first call, 2 for the first retry, ..."""
        self.worker = worker
        """The worker id handling the event."""
        self.config = config
        """The consumer's handlerConfig."""
        self.state = state
        """This client's keyed state (`get(default)`, `set(value)`)."""
