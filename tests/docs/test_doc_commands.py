"""Every `mmrl ...` command line in a code block of README.md and docs/*.md parses with the real
CLI, and every `make` target the docs name exists.

A command is run through `mmrl.cli.main.main` as far as its argument parser: `parse_args` (and a
`parse_known_args` of its own) parses for real and then raises a private exception, so nothing
executes. A parse error ends the command as the CLI ends any usage error (exit status 2)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmrl.cli import main as cli
from tests.docs.doc_commands import (
    ROOT,
    DocCommand,
    make_targets_named,
    makefile_targets,
    markdown_files,
    mmrl_commands,
)


class _Parsed(Exception):
    """Raised once a command's arguments parsed: the command stops before doing anything."""


@contextlib.contextmanager
def parse_only() -> Iterator[None]:
    parse_args, parse_known_args = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    inside = [False]

    def parsed(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        inside[0] = True
        try:
            parse_args(self, *args, **kwargs)
        finally:
            inside[0] = False
        raise _Parsed

    def known(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        result = parse_known_args(self, *args, **kwargs)
        if inside[0]:  # parse_args' own call: it checks what is left over
            return result
        raise _Parsed

    argparse.ArgumentParser.parse_args = parsed  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = known  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = parse_args  # type: ignore[method-assign]
        argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def parse_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str | None:
    """None when `mmrl ARGV` parses; else what the CLI said."""
    capsys.readouterr()
    try:
        with parse_only():
            status = cli.main(argv)
    except _Parsed:
        return None
    except SystemExit as stop:  # --help
        status = stop.code  # type: ignore[assignment]
    said = capsys.readouterr()
    return None if status == 0 else f"exit {status}: {said.err.strip() or said.out.strip()[-300:]}"


def _all_commands() -> list[DocCommand]:
    return [c for path in markdown_files() for c in mmrl_commands(path)]


def test_the_docs_show_many_commands() -> None:
    commands = _all_commands()
    assert len(commands) >= 20
    assert {c.where.split(":")[0] for c in commands} >= {"README.md", "docs/learner.md"}


@pytest.mark.parametrize("command", _all_commands(), ids=lambda c: c.where)
def test_every_mmrl_command_in_the_docs_parses(command: DocCommand, capsys: pytest.CaptureFixture[str]) -> None:
    failures = {" ".join(argv): error for argv in command.variants()
                if (error := parse_error(argv, capsys)) is not None}
    assert not failures, f"{command.where}: `mmrl {command.text}`: {failures}"


@pytest.mark.parametrize("line", ["mmrl bench gpu --jsn", "mmrl run start --config FILE --wach",
                                  "mmrl sft --confg FILE"])
def test_a_command_that_no_longer_parses_fails_the_check(
        line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "README.md"
    doc.write_text(f"Run it:\n\n```bash\n{line}   # the docs say so\n```\n")
    (command,) = mmrl_commands(doc)
    errors = [parse_error(argv, capsys) for argv in command.variants()]
    assert errors and all(e and e.startswith("exit 2") for e in errors), errors


def test_every_make_target_the_docs_name_exists() -> None:
    targets = makefile_targets()
    assert {"demo", "test", "unit", "compose-check", "config-docs"} <= targets
    docs = [*markdown_files(), *sorted(ROOT.glob("deploy/**/README.md"))]
    missing = {str(p.relative_to(ROOT)): sorted(make_targets_named(p.read_text()) - targets) for p in docs}
    assert not {p: m for p, m in missing.items() if m}


def test_a_missing_make_target_fails_the_check() -> None:
    text = "Then `make compose-chek` builds it.\n\n```bash\nmake demo && make tset\n```\n"
    assert make_targets_named(text) - makefile_targets() == {"compose-chek", "tset"}
