"""TEST CODE: a user handler (`tests.operator.env_handler:echo_env`) that returns the environment
variables a StreamConsumer's `env` and `envFrom` should have given its worker."""

from __future__ import annotations

import os
from typing import Any

NAMES = ("HANDLER_TOKEN", "TOKEN_COPY", "CFG_MODE", "GREETING")


def echo_env(event: dict[str, Any], ctx: Any) -> dict[str, str | None]:
    """The variables of NAMES as the worker process sees them."""
    return {name: os.environ.get(name) for name in NAMES}
