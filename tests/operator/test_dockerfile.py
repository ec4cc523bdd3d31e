"""The Dockerfile, checked without a Docker engine: what it copies exists, what it runs starts."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.operator.crd_schema import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()
INSTRUCTIONS = [line.strip() for line in re.sub(r"\\\n", " ", DOCKERFILE).splitlines()
                if line.strip() and not line.strip().startswith("#")]


def _keyrange_script() -> str:
    return str(Path(sys.executable).with_name("keyrange"))


def _ignored(path: str) -> bool:
    ignored = False
    for pattern in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = pattern.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            ignored = not negate
    return ignored


def test_multi_stage_with_a_pinned_base_and_a_non_root_user() -> None:
    froms = [i for i in INSTRUCTIONS if i.startswith("FROM ")]
    assert len(froms) >= 2
    base = next(i for i in INSTRUCTIONS if i.startswith("ARG PYTHON_IMAGE=")).split("=", 1)[1]
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim-bookworm(@sha256:[0-9a-f]{64})?", base)
    user = [i for i in INSTRUCTIONS if i.startswith("USER ")][-1].split()[1]
    assert user.split(":")[0].isdigit() and user.split(":")[0] != "0"
    # The worker pods' runAsUser must be the image's user.
    from keyrange.operator import rendering
    from keyrange.operator.settings import OperatorSettings
    from keyrange.spec import parse_spec

    owner = {"metadata": {"name": "x", "uid": "u"}}
    spec = parse_spec({"kafka": {"topic": "t", "bootstrapServers": "k:9092"}})
    sts = rendering.render_statefulset("x", "ns", spec, 1, owner, OperatorSettings())
    assert str(sts["spec"]["template"]["spec"]["securityContext"]["runAsUser"]) == user.split(":")[0]


def test_copied_sources_exist_and_are_not_docker_ignored() -> None:
    for instruction in INSTRUCTIONS:
        if instruction.startswith("COPY ") and "--from=" not in instruction:
            *sources, _ = instruction.split()[1:]
            for source in sources:
                assert (ROOT / source).exists(), f"{instruction}: {source} does not exist"
                assert not _ignored(source.rstrip("/")), f"{source} is excluded by .dockerignore"
    assert _ignored(".venv") and _ignored("tests") and _ignored(".git")


def test_the_image_installs_the_extras_it_needs() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'keyrange = "keyrange.cli:main"' in pyproject
    assert '".[spark]"' in DOCKERFILE and "spark = [" in pyproject
    entrypoint = next(i for i in INSTRUCTIONS if i.startswith("ENTRYPOINT "))
    assert entrypoint.endswith('"keyrange"]')


def test_every_dependency_is_installed_at_its_pinned_version() -> None:
    """The image's pip installs keyrange with constraints.txt, which pins every package it needs,
    at versions pyproject.toml allows; and this venv (the tests') has exactly those."""
    installs = [i for i in INSTRUCTIONS if "pip install" in i and '".[spark]"' in i]
    assert installs and all(re.search(r"pip install (.* )?-c constraints\.txt ", i) for i in installs), installs
    copied = [i for i in INSTRUCTIONS if i.startswith("COPY ") and "constraints.txt" in i.split()[1:-1]]
    assert copied, "the Dockerfile does not copy constraints.txt into the build"
    lock = _lock_deps()
    locked = lock.read_lock()
    for requirement in lock.project_requirements():
        name = lock.canonicalize_name(requirement.name)
        assert name in locked, f"{name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(locked[name], prereleases=True), (name, locked[name])
    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "lock-deps.py"), "--check"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()  # `make install` follows the lock


def _lock_deps() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("lock_deps", ROOT / "scripts" / "lock-deps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("command", ["operator", "worker", "aggregate"])
def test_entrypoint_commands_start(command: str) -> None:
    result = subprocess.run([_keyrange_script(), command, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"keyrange {command}" in result.stdout


def test_worker_accepts_the_arguments_the_operator_gives_it() -> None:
    result = subprocess.run([_keyrange_script(), "worker", "--help"], capture_output=True, text=True, timeout=60)
    assert "--spec-file" in result.stdout and "--metrics-port" in result.stdout


def test_the_spark_job_entry_point_is_where_the_image_installs_it() -> None:
    from keyrange.operator.spark import MAIN_FILE

    assert "python -m venv /opt/keyrange" in DOCKERFILE and "python:3.11" in DOCKERFILE
    installed = MAIN_FILE.removeprefix("local://")
    assert installed.startswith("/opt/keyrange/lib/python3.11/site-packages/keyrange/")
    relative = installed.split("site-packages/", 1)[1]
    assert (ROOT / "src" / relative).exists(), f"{relative} is not in the package"
