"""Built-in handlers, handler loading, staged keyed state, settings bounds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from keyrange.handlers import HandlerError, inline, load_handler
from keyrange.worker.context import ClientState, HandlerContext
from keyrange.worker.settings import WorkerSettings


def ctx_for(state: ClientState) -> HandlerContext:
    return HandlerContext(client_id=1, partition=0, offset=0, attempt=1, worker="w", config={}, state=state)


@pytest.mark.parametrize("config", [{}, {"delayMs": 1}], ids=["inline", "delayed"])
def test_ledger_follows_the_design_semantics(config: dict[str, int]) -> None:
    ledger = load_handler("ledger", config)
    # Without a delay it only computes: inline on the loop; with one it sleeps, so it is async.
    assert (ledger.inline, ledger.is_async) == ((False, True) if config else (True, False))
    stored = None
    results = []
    for event in ({"op": "increment", "amount": 5}, {"op": "increment", "amount": 2}, {"op": "drain"},
                  {"op": "increment", "amount": 1}):
        state = ClientState(stored)
        call = ledger.function(event, ctx_for(state))
        results.append(asyncio.run(call) if ledger.is_async else call)
        stored = orjson.dumps(state.staged)
    assert results == [{"value": 5, "returned": 5}, {"value": 7, "returned": 7}, {"value": 0, "returned": 7},
                       {"value": 1, "returned": 1}]


def test_ledger_rejects_unknown_ops_without_touching_state() -> None:
    state = ClientState(b"3")
    with pytest.raises(ValueError, match="ledger op"):
        load_handler("ledger").function({"op": "steal"}, ctx_for(state))
    assert not state.changed and state.get() == 3


def test_state_writes_are_staged() -> None:
    state = ClientState(b'{"n": 1}')
    assert state.get() == {"n": 1} and not state.changed
    state.set({"n": 2})
    assert state.get() == {"n": 2} and state.changed and state.staged == {"n": 2}
    assert ClientState(None).get(0) == 0


def test_mutating_what_get_returned_changes_nothing_stored() -> None:
    state = ClientState(b'{"n": 1}')
    state.get()["n"] = 99
    assert state.get() == {"n": 1} and not state.changed


@pytest.mark.parametrize(("name", "config", "message"), [
    ("sleep", {"meanMs": -1}, "meanMs must be a non-negative number"),
    ("sleep", {"meanMS": 3}, "unknown keys"),
    ("ledger", {"delayMs": "5"}, "delayMs must be a non-negative number"),
    ("noop", {"x": 1}, "unknown keys"),
])
def test_bad_handler_config_names_the_problem(name: str, config: dict[str, object], message: str) -> None:
    with pytest.raises(HandlerError, match=message):
        load_handler(name, config)


def test_user_handlers_resolve_sync_async_and_inline() -> None:
    sync, asynchronous, marked = (load_handler(f"tests.integration.worker_handlers:{name}")
                                  for name in ("sync_counter", "async_counter", "inline_counter"))
    assert (sync.is_async, sync.inline) == (False, False)
    assert (asynchronous.is_async, asynchronous.inline) == (True, False)
    assert (marked.is_async, marked.inline) == (False, True)
    with pytest.raises(HandlerError, match="cannot import handler module"):
        load_handler("no_such_module_here:f")
    with pytest.raises(HandlerError, match="has no callable 'nope'"):
        load_handler("tests.integration.worker_handlers:nope")
    with pytest.raises(HandlerError, match="unknown handler"):
        load_handler("sleepy")


def test_a_handler_module_that_raises_on_import_is_a_handler_error(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "raising_handler_module.py").write_text("import os\nSETTING = os.environ['NOT_SET_ANYWHERE']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(HandlerError) as err:
        load_handler("raising_handler_module:handle")
    assert str(err.value) == (
        "handler module 'raising_handler_module' raised KeyError: 'NOT_SET_ANYWHERE' on import "
        f"({tmp_path / 'raising_handler_module.py'}, line 2); fix the module or the handler's name")


def test_sleep_handler_sleeps_about_its_mean() -> None:
    handler = load_handler("sleep", {"meanMs": 1, "stddevMs": 0})
    assert asyncio.run(handler.function({}, None)) is None


def test_settings_check_bounds_and_defaults() -> None:
    s = WorkerSettings(bootstrap="b", topic="events", group_id="payments", worker_id="3")
    assert (s.sink, s.dlq, s.state, s.slot_transactional_id(5)) == (
        "events.processed", "events.dlq", "payments.state", "keyrange-payments-slot-5")
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        WorkerSettings(bootstrap="b", topic="t", group_id="g", concurrency=0)
    with pytest.raises(ValueError, match="ttl_seconds must be positive"):
        WorkerSettings(bootstrap="b", topic="t", group_id="g", ttl_seconds=0)


def test_an_async_handler_marked_inline_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import tests.integration.worker_handlers as module

    async def marked(event: dict[str, object], ctx: object) -> None:
        return None

    monkeypatch.setattr(module, "marked_async", inline(marked), raising=False)
    with pytest.raises(HandlerError, match=r"is async and marked @inline: .* remove the mark"):
        load_handler("tests.integration.worker_handlers:marked_async")
