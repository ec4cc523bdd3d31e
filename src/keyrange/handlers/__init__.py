"""Handlers: built-in ones by name (`sleep`, `ledger`, `noop`) and user ones as `module:function`.

A handler is `handler(event: dict, ctx: HandlerContext) -> JSON-able result`, a plain function
(run in the worker's thread pool) or a coroutine function (awaited on the worker's loop). A plain
function marked `@inline` runs on the worker's loop itself, right where its event is admitted:
for handlers that only compute (microseconds, no I/O), which the hop to a thread or a task would
cost several times over (docs/worker.md). A built-in name maps to a factory that validates
`handlerConfig` and returns the handler.
"""

from __future__ import annotations

import importlib
import inspect
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from keyrange.errors import UserError
from keyrange.handlers import builtin
from keyrange.handlers.marks import inline, marked_inline

__all__ = ["FACTORIES", "Handler", "HandlerError", "inline", "load_handler"]


class HandlerError(UserError, ValueError):
    """A handler name cannot be resolved or its config is invalid."""


@dataclass(frozen=True)
class Handler:
    """A resolved handler and how to call it."""

    name: str
    """As given: a built-in name or `module:function`."""
    function: Callable[..., Any]
    """The callable taking (event, ctx)."""
    is_async: bool
    """True: awaited on the loop; False: run in the thread pool."""
    inline: bool = False
    """A plain function marked `@inline`: its first attempt runs on the loop, with no deadline
    (retries run in the thread pool, with one)."""


FACTORIES: dict[str, Callable[[dict[str, Any]], Callable[..., Any]]] = {
    "sleep": builtin.sleep_handler,
    "ledger": builtin.ledger_handler,
    "noop": builtin.noop_handler,
}


def _is_async(function: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(function):
        return True
    call = getattr(function, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _resolved(name: str, function: Callable[..., Any]) -> Handler:
    is_async = _is_async(function)
    marked = marked_inline(function)
    if marked and is_async:
        raise HandlerError(f"handler {name!r} is async and marked @inline: inline is for plain functions that only "
                           "compute; remove the mark (an async handler already runs on the loop)")
    return Handler(name, function, is_async, marked)


def load_handler(name: str, config: dict[str, Any] | None = None) -> Handler:
    """Resolve `name` (built-in or `module:function`); raise HandlerError saying what to fix."""
    config = dict(config or {})
    factory = FACTORIES.get(name)
    if factory is not None:
        try:
            function = factory(config)
        except (TypeError, ValueError) as exc:
            raise HandlerError(f"bad handlerConfig for the {name!r} handler: {exc}") from None
        return _resolved(name, function)
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise HandlerError(
            f"unknown handler {name!r}: use one of {', '.join(sorted(FACTORIES))} or module:function"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise HandlerError(
            f"cannot import handler module {module_name!r} ({exc}); check the name and that it is on PYTHONPATH"
        ) from None
    except Exception as exc:  # noqa: BLE001 - the module's own code failed: the user's to fix
        raise HandlerError(
            f"handler module {module_name!r} raised {type(exc).__name__}: {_first_line(exc)} on import"
            f"{_import_site(exc)}; fix the module or the handler's name"
        ) from None
    found = getattr(module, attr, None)
    if found is None or not callable(found):
        raise HandlerError(f"module {module_name!r} has no callable {attr!r} to use as a handler")
    return _resolved(name, found)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0] if lines else ""


def _import_site(exc: BaseException) -> str:
    """' (file, line N)': where the imported module's own code raised (the first frame past the
    import machinery), or '' if there is none (a SyntaxError names its place itself)."""
    importing = False
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename.startswith("<frozen importlib"):
            importing = True
        elif importing:
            return f" ({frame.filename}, line {frame.lineno})"
    return ""
