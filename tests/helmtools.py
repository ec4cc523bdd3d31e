"""The chart rendered by `helm template`, for the chart's tests in the unit and operator tiers."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).parents[1]
CHART = ROOT / "charts" / "keyrange"
HELM_FALLBACK = ROOT / ".tools" / "bin" / "helm"
"""Where `make tools` puts helm when $KEYRANGE_TOOLS is not set."""


def tool_path(name: str, fallback: Path | None = None) -> str:
    """The path of the command-line tool `name` (on PATH, else `fallback`); fails the test saying
    how to install it."""
    path = shutil.which(name) or (str(fallback) if fallback and fallback.exists() else None)
    assert path, f"{name} not found: run `make tools`"
    return path


def helm_template(tmp_path: Path, *sets: str) -> list[dict[str, Any]]:
    """The chart's manifests for `--set` values, as dicts."""
    env = {**os.environ, **{k: str(tmp_path / "helm" / k) for k in
                            ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")}}
    argv = [tool_path("helm", HELM_FALLBACK), "template", "kr", str(CHART), "-n", "streams"]
    for s in sets:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The manifests of `kind` among `docs`."""
    return [d for d in docs if d.get("kind") == kind]
