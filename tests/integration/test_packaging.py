"""The distribution's license metadata (PEP 639): the LICENSE file, a build backend that writes
License-Expression and License-File, and a wheel built by pip that carries both."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PEP_639_SETUPTOOLS = Version("77.0.3")
"""The first setuptools that writes License-Expression from an SPDX `license` and License-File."""


def test_the_license_file_is_the_apache_license() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]


def test_the_build_requires_a_setuptools_that_writes_pep_639_metadata() -> None:
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    requires = [Requirement(r) for r in build["requires"]]
    (setuptools,) = [r for r in requires if r.name == "setuptools"]
    assert not setuptools.specifier.contains("77.0.2") and setuptools.specifier.contains(PEP_639_SETUPTOOLS)


def test_pip_wheel_writes_the_license_expression_and_the_license_file(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("keyrange-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        info = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(archive.read(info).decode())
        license_text = archive.read(info.replace("METADATA", "licenses/LICENSE")).decode()
    assert Version(meta["Metadata-Version"]) >= Version("2.4")
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["License"] is None  # the expression replaces the free-text field
    assert license_text == (ROOT / "LICENSE").read_text()
