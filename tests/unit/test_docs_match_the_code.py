"""The commands and StreamConsumers the README and docs/ show are ones the code takes, and every
metric the code exports is documented.

A user copies these lines first; a renamed option or a removed make target must fail here, not on
their machine. Code blocks hold whole commands, parsed by the subcommand's own parser; prose names
options of a command in backticks (`keyrange aggregate --source keyrange-kafka`), each checked
against that command's options. A documented StreamConsumer must load with `keyrange run -f` and be
admitted by the CRD's schema, as `kubectl apply` would. Dashboards and alerts are written from the
docs' metric names.
"""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path

import pytest
import yaml

from keyrange import metrics
from keyrange.cli import COMMANDS, command_parser
from keyrange.spec import parse_document, parse_spec
from tests.operator.crd_schema import admit, admit_streamconsumer, spec_schema

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]

CODE_BLOCK = re.compile(r"```[a-z]*\n(.*?)```", re.S)
YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)
BLOCK_COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(?:\.venv/bin/)?keyrange\s+(?P<args>[^#]*)")
"""A `keyrange ...` line of a code block (after env assignments), up to its shell comment."""
NAMED_COMMAND = re.compile(rf"keyrange (?P<command>{'|'.join(COMMANDS)})"
                           r"(?P<options>(?: +-[-\w]+(?:[ =](?!-)[^\s`'\"]+)?)*)")
"""`keyrange <command>` followed by options (each with at most one value), anywhere in a text."""
OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][-\w]*)")
MAKE_TARGET = re.compile(r"^make ([a-z][-a-z ]*?)\s*(?:#|$)")


def block_commands(text: str) -> list[str]:
    """Every `keyrange` command line of the text's code blocks, continuations joined."""
    found = []
    for block in CODE_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            match = BLOCK_COMMAND.match(line.strip())
            if match:
                found.append(match["args"].strip())
    return found


def named_options(text: str) -> list[tuple[str, str]]:
    """(command, option) for every option written after `keyrange <command>` in the text."""
    return [(m["command"], option) for m in NAMED_COMMAND.finditer(text) for option in OPTION.findall(m["options"])]


@cache  # one parser per command, not one per option named in the docs
def known_options(command: str) -> frozenset[str]:
    parser, _ = command_parser(command)
    return frozenset(option for action in parser._actions for option in action.option_strings)


def documented(doc: Path) -> str:
    return doc.read_text(encoding="utf-8")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_in_a_code_block_parses(doc: Path) -> None:
    for line in block_commands(documented(doc)):
        argv = shlex.split(line)
        assert argv and argv[0] in COMMANDS, f"{doc.name}: `keyrange {line}`: no such command"
        parser, _ = command_parser(argv[0])
        try:
            parser.parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"{doc.name}: `keyrange {line}` does not parse (see the usage above)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_option_named_in_the_text_exists(doc: Path) -> None:
    unknown = [(command, option) for command, option in named_options(documented(doc))
               if option not in known_options(command)]
    assert not unknown, f"{doc.name} names options its commands do not take: {unknown}"


def test_every_make_target_the_readme_runs_exists() -> None:
    targets = set(re.findall(r"^([a-z][-a-z]*):", (REPO / "Makefile").read_text(), re.M))
    shown = [name for block in CODE_BLOCK.findall(documented(REPO / "README.md"))
             for line in block.splitlines() if (m := MAKE_TARGET.match(line.strip()))
             for name in m[1].split()]
    assert {"demo", "test"} <= set(shown), "the README's two set-up commands are `make demo` and `make test`"
    assert set(shown) <= targets, f"the README runs make targets the Makefile lacks: {set(shown) - targets}"


def test_the_checks_find_what_they_look_for() -> None:
    text = "```sh\nX=1 keyrange worker --topic t --no-such  # note\n```\nthen `keyrange run -f a.yaml --produce 5`"
    assert block_commands(text) == ["worker --topic t --no-such"]
    assert named_options(text) == [("worker", "--topic"), ("worker", "--no-such"), ("run", "-f"),
                                   ("run", "--produce")]
    assert "--no-such" not in known_options("worker")


def test_every_exported_metric_is_documented() -> None:
    declared = {family.name for value in vars(metrics).values()
                if hasattr(value, "describe") and not isinstance(value, type)
                for family in value.describe()}
    assert len(declared) > 20, f"found only {sorted(declared)}: did metrics.py change how it declares them?"
    text = "".join(documented(doc) for doc in DOCS)
    undocumented = sorted(name for name in declared if name not in text)
    assert not undocumented, f"metrics no doc names (docs/worker.md lists the worker's): {undocumented}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_documented_streamconsumer_loads_and_is_admitted_by_the_crd(doc: Path) -> None:
    for block in YAML_BLOCK.findall(documented(doc)):
        document = yaml.safe_load(block)
        if document.get("kind") == "StreamConsumer":
            parse_document(document, doc.name)  # raises SpecError naming the field
            _, errors = admit_streamconsumer(document)
        elif set(document) == {"spec"}:  # a part of a spec, shown on its own
            parse_spec(document["spec"], doc.name)
            _, errors = admit(document["spec"], spec_schema())
        else:
            continue
        assert not errors, f"{doc.name}: the CRD refuses the StreamConsumer shown: {errors}"
