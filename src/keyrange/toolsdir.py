"""Where keyrange's tools live (`tools_dir`): the Apache Kafka jars and Spark's Kafka connector.

`make tools` fills it; `local.kafka_setup` finds the broker's jars there and
`aggregation.connector` the connector's.
"""

from __future__ import annotations

import os
from pathlib import Path


def tools_dir() -> Path:
    """The project's tools folder: `$KEYRANGE_TOOLS`, else `.tools` at the root of this checkout."""
    configured = os.environ.get("KEYRANGE_TOOLS")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2] / ".tools"
