"""How `mmrl` ends on errors: a service that did not start or a failed service call is one line on
stderr and exit status 1, Ctrl-C is exit status 130, and any other error keeps its traceback. And
what `mmrl COMMAND --help` says first."""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path

import pytest

from mmrl.cli import main as cli
from mmrl.cli.stack import StackError
from services.common.messages import summary
from services.coordinator.clients import ServiceError


@pytest.fixture
def command(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("mmrl_test_command")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(cli.COMMANDS, ("boom",), (module.__name__, "raises what the test sets"))
    return module


def _raising(error: BaseException) -> object:
    def main(argv: list[str]) -> int:
        raise error

    return main


def test_a_service_that_did_not_start_is_one_line_and_exit_status_1(
        command: types.ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    command.main = _raising(StackError("rollout exited with code 1 while starting:\nOSError: no model"))
    assert cli.main(["boom"]) == 1
    assert capsys.readouterr().err.startswith("mmrl boom: rollout exited with code 1 while starting:")


def test_a_failed_service_call_is_one_line_and_exit_status_1(
        command: types.ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    command.main = _raising(ServiceError("env", "127.0.0.1:9", "GetEvalSet", "UNAVAILABLE", "connection refused"))
    assert cli.main(["boom"]) == 1
    assert "env service at 127.0.0.1:9: GetEvalSet failed with UNAVAILABLE" in capsys.readouterr().err


def test_ctrl_c_is_exit_status_130_and_other_errors_keep_their_traceback(
        command: types.ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    command.main = _raising(KeyboardInterrupt())
    assert cli.main(["boom"]) == 130
    assert capsys.readouterr().err == "mmrl boom: interrupted\n"
    command.main = _raising(ZeroDivisionError("a bug"))
    with pytest.raises(ZeroDivisionError):
        cli.main(["boom"])


def test_every_command_help_starts_with_a_whole_sentence() -> None:
    """`mmrl COMMAND --help` describes the command with its module docstring's first paragraph
    (a docstring's first line can stop mid-sentence), read here without importing the module."""
    for module, _ in cli.COMMANDS.values():
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        source = Path(spec.origin).read_text()
        assert "description=summary(__doc__)" in source or "description=__doc__" in source, module
        description = summary(ast.get_docstring(ast.parse(source), clean=False))
        assert description.startswith("`mmrl ") and description.endswith("."), (module, description)
    assert summary("`mmrl x`: does a\nthing.\n\nMore.") == "`mmrl x`: does a thing."
