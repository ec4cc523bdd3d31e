"""What a worker's probes answer, and the HTTP server that serves them beside its metrics (and the
operator's metrics alone).

Liveness must reflect the worker itself, not the thread that answers HTTP: `/healthz` fails when
the event loop has not beaten for `stale_after_seconds` (a handler blocking the loop, a deadlock),
when the release of a slot waits for a handler call that timed out (a handoff the call holds up:
attempts.py), or when half the handler threads are stuck in calls that timed out (Python cannot
stop a thread); a restart is the only cure for all three. Fewer stuck calls leave it alive, and
its answer says how many. `/readyz` is ready once the worker started (connected, topics checked).
`/metrics` is Prometheus' exposition, as before.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

HEARTBEAT_SECONDS = 1.0
"""How often the event loop beats."""


class Health:
    """The worker's liveness and readiness (module docstring). Thread-safe reads."""

    def __init__(self, stale_after_seconds: float = 30.0, max_abandoned: int = 1,
                 abandoned: Callable[[], int] = lambda: 0, clock: Callable[[], float] = time.monotonic,
                 held_releases: Callable[[], str | None] = lambda: None) -> None:
        self.stale_after_seconds = stale_after_seconds
        self.max_abandoned = max(1, max_abandoned)
        """Stuck sync calls (timed out, thread still running) at which the worker is not alive."""
        self._abandoned = abandoned
        self._held_releases = held_releases
        self._clock = clock
        self._last_beat: float | None = None
        self._started = False

    @property
    def started(self) -> bool:
        """Whether the worker has started (readiness)."""
        return self._started

    def mark_started(self) -> None:
        """The worker has started: ready, while alive."""
        self._started = True

    def set_abandoned_source(self, abandoned: Callable[[], int],
                             held_releases: Callable[[], str | None] = lambda: None,
                             max_abandoned: int | None = None) -> None:
        """Where to read the count of stuck sync calls, and what keeps a release waiting for them
        (None: nothing): the worker's attempt runner; and, if given, how many make it not alive."""
        self._abandoned = abandoned
        self._held_releases = held_releases
        if max_abandoned is not None:
            self.max_abandoned = max(1, max_abandoned)

    def beat(self) -> None:
        """Called from the event loop."""
        self._last_beat = self._clock()

    async def beat_forever(self) -> None:
        """The loop's heartbeat: a coroutine that only gets to run when the loop is free."""
        while True:
            self.beat()
            await asyncio.sleep(HEARTBEAT_SECONDS)

    def liveness(self) -> tuple[bool, str]:
        """(alive, why)."""
        if self._last_beat is None:
            return True, "starting"
        silent = self._clock() - self._last_beat
        if silent > self.stale_after_seconds:
            return False, (f"the event loop has not run for {silent:.0f} s (a handler blocking it, or a deadlock)")
        held = self._held_releases()
        if held is not None:
            return False, held
        stuck = self._abandoned()
        if stuck >= self.max_abandoned:
            return False, (f"{stuck} handler calls timed out and still hold their threads (of "
                           f"{self.max_abandoned * 2}): restart to get the threads back")
        if stuck:
            return True, (f"ok ({stuck} handler call(s) timed out and still run: each holds its client and a "
                          "thread until it returns)")
        return True, "ok"

    def readiness(self) -> tuple[bool, str]:
        """(ready, why)."""
        if not self._started:
            return False, "starting"
        return self.liveness()


class _QuietOnHangUp(ThreadingHTTPServer):
    """An HTTP server that says nothing when a client hangs up before its answer is written."""

    def handle_error(self, request: object, client_address: object) -> None:
        # A scraper that gave up after its timeout is not the worker's error; anything else is shown.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def serve(listener: socket.socket, health: Health | None) -> ThreadingHTTPServer:
    """Serve /metrics, and /healthz and /readyz unless `health` is None, in a daemon thread on a
    socket already bound and listening (keyrange.commands.metricsargs)."""
    paths = b"/metrics" if health is None else b"/metrics, /healthz or /readyz"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif health is not None and path in ("/healthz", "/readyz"):
                ok, why = health.liveness() if path == "/healthz" else health.readiness()
                self._send(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._send(404, b"try " + paths + b"\n", "text/plain; charset=utf-8")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # a scrape every few seconds is not news

    server = _QuietOnHangUp(listener.getsockname()[:2], Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = listener
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="keyrange-http", daemon=True).start()
    return server
