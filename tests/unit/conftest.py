"""The unit tier: pure logic with injected clocks; no broker, no processes."""

from __future__ import annotations

from pathlib import Path

from tests.timeouts import tier_timeout

TIMEOUT_SECONDS = 30
"""The slowest unit test takes under a second alone; 30 s leaves room for a loaded machine."""

pytest_collection_modifyitems = tier_timeout(Path(__file__).parent, TIMEOUT_SECONDS)
