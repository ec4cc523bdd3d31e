"""`@inline`: the mark of a plain handler cheap enough to run on the worker's event loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

INLINE_MARK = "keyrange_inline"


def inline(function: F) -> F:
    """Mark a plain (not async) handler that only computes to run on the worker's event loop.

    Its call then costs no thread hop and no task, but nothing else on the worker runs while it
    does and it cannot be timed out: only for handlers that take microseconds (docs/worker.md)."""
    setattr(function, INLINE_MARK, True)
    return function


def marked_inline(function: Callable[..., Any]) -> bool:
    """True when `function` carries the `@inline` mark."""
    return getattr(function, INLINE_MARK, False) is True
