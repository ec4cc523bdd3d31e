"""The integration tier: the embedded broker, worker processes, real Spark, Prometheus and Alertmanager."""

from __future__ import annotations

from pathlib import Path

from tests.timeouts import tier_timeout

TIMEOUT_SECONDS = 300
"""Rescale and SIGKILL tests take minutes on a busy 2-core machine; slower ones set their own."""

pytest_collection_modifyitems = tier_timeout(Path(__file__).parent, TIMEOUT_SECONDS)
