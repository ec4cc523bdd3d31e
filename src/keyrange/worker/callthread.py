"""One daemon thread that runs a slot producer's calls in order.

Like `ThreadPoolExecutor(max_workers=1)`, except that the interpreter does not wait for the thread
at exit: it joins every ThreadPoolExecutor thread, so one left in a librdkafka call that ignores
its timeout (a producer the worker gave up, transactions.py) would keep a stopped worker from
exiting. Calls already queued when the thread is shut down still run; later ones are refused.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class CallThread(Executor):
    """Runs submitted calls one at a time, in order, on one daemon thread (module docstring)."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._shut_down = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Queue `fn(*args, **kwargs)`; its Future holds what it returns or raises."""
        future: Future[T] = Future()

        def call() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                future.set_exception(exc)
            else:
                future.set_result(result)

        with self._lock:
            if self._shut_down:
                raise RuntimeError("cannot submit a call after shutdown")
            self._calls.put(call)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse later calls; the thread ends after those queued (`cancel_futures` is not
        supported). `wait` waits for that: never when a call may not return."""
        with self._lock:
            if not self._shut_down:
                self._shut_down = True
                self._calls.put(None)
        if wait:
            self._thread.join()

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            call()
