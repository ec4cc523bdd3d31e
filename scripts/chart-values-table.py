"""The values table of charts/keyrange/README.md, generated from values.yaml's `# --` comments.

    python scripts/chart-values-table.py          # print the table
    python scripts/chart-values-table.py --write  # replace the table in the chart README
    python scripts/chart-values-table.py --check  # exit 1 if the README's table is out of date

A key whose comment starts with `# --` is one row (its default shown whole, nested keys included);
a key without one is a heading for the keys below it. Continuation lines of a comment start
with `#` and more indentation, as in helm-docs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent.parent / "charts" / "keyrange"
START = "<!-- values-table:start (scripts/chart-values-table.py --write) -->"
END = "<!-- values-table:end -->"
PIPE = "\\|"
"""A `|` inside a table cell."""
KEY = re.compile(r"^(\s*)([A-Za-z][\w.-]*):")
DOC = re.compile(r"^# --(\s|$)")
"""A value's description starts so (a `# ----` divider does not)."""


def documented_keys(text: str) -> list[tuple[str, str]]:
    """(dotted path, description) of every key with a `# --` comment, in file order."""
    rows: list[tuple[str, str]] = []
    path: list[tuple[int, str]] = []
    comment: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if DOC.match(stripped):
            comment = [stripped.removeprefix("# --").strip()]
            continue
        if stripped.startswith("#") and comment:
            comment.append(stripped.lstrip("#").strip())
            continue
        match = KEY.match(line)
        if match:
            indent = len(match.group(1))
            path = [(i, k) for i, k in path if i < indent] + [(indent, match.group(2))]
            if comment:
                rows.append((".".join(k for _, k in path), " ".join(comment)))
        comment = []
    return rows


def _default(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        node = node[part]
    return node


def _type(value: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object"}.get(
        type(value), type(value).__name__)


def table(values_text: str) -> str:
    """The Markdown table: key, type, default, description."""
    values = yaml.safe_load(values_text)
    lines = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for dotted, description in documented_keys(values_text):
        default = _default(values, dotted)
        shown = json.dumps(default, separators=(", ", ": ")).replace("|", PIPE)
        lines.append(f"| `{dotted}` | {_type(default)} | `{shown}` | {_cell(description)} |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", PIPE).replace("<", "&lt;").replace(">", "&gt;")


def main() -> int:
    """Print, write or check the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="replace the table in charts/keyrange/README.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if the README's table is out of date")
    args = parser.parse_args()
    generated = table((CHART / "values.yaml").read_text())
    if not (args.write or args.check):
        print(generated)
        return 0
    readme_path = CHART / "README.md"
    readme = readme_path.read_text()
    if START not in readme or END not in readme:
        print(f"{readme_path}: the markers {START!r} and {END!r} are missing", file=sys.stderr)
        return 1
    before, rest = readme.split(START, 1)
    after = rest.split(END, 1)[1]
    wanted = f"{before}{START}\n{generated}\n{END}{after}"
    if args.write:
        readme_path.write_text(wanted)
        return 0
    if readme != wanted:
        print(f"{readme_path}: the values table is out of date with values.yaml; "
              "run `python scripts/chart-values-table.py --write`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
