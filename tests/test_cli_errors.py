"""How `mmrl` ends on errors, the same way for every command: a user's mistake (a bad setting or
config, a missing file, a misspelt option) is one line on stderr and exit status 2; a service that
did not start, cannot be reached or failed a call is one line and exit status 1; Ctrl-C is exit
status 130; any other error keeps its traceback. And what `mmrl COMMAND --help` says first."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from mmrl.cli import main as cli
from mmrl.cli.stack import StackError
from services.common.messages import summary
from services.common.procs import free_port
from services.common.user_errors import UsageError
from services.coordinator.ops.clients import ServiceError

ROOT = Path(__file__).resolve().parents[1]


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
    for entry, _ in cli.COMMANDS.values():
        module = entry.partition(":")[0]  # "module" or "module:function"
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        source = Path(spec.origin).read_text()
        assert "description=summary(__doc__)" in source or "description=__doc__" in source, module
        description = summary(ast.get_docstring(ast.parse(source), clean=False))
        assert description.startswith("`mmrl ") and description.endswith("."), (module, description)
    assert summary("`mmrl x`: does a\nthing.\n\nMore.") == "`mmrl x`: does a thing."


def test_a_users_mistake_is_one_line_and_exit_status_2(
        command: types.ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    class Section(BaseModel):
        group_size: int = Field(8, ge=2)

    class Config(BaseModel):
        grpo: Section

    try:
        Config.model_validate({"grpo": {"group_size": 1}})
    except ValueError as error:
        invalid = error
    for error, line in ((UsageError("--steps 0: must be 1 or more"), "--steps 0: must be 1 or more"),
                        (invalid, "grpo.group_size: Input should be greater than or equal to 2 (got 1)"),
                        (FileNotFoundError(2, "No such file or directory", str(tmp_path / "x.yaml")),
                         f"{tmp_path / 'x.yaml'}: No such file or directory"),
                        (SystemExit("--seeds expects A-B"), "--seeds expects A-B")):
        command.main = _raising(error)
        assert cli.main(["boom"]) == 2
        assert capsys.readouterr().err == f"mmrl boom: {line}\n"


def test_a_misspelt_option_is_one_line_naming_the_command_and_exit_status_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "start", "--confg", "x.yaml"]) == 2
    assert capsys.readouterr().err == ("mmrl run: the following arguments are required: --config "
                                       "(`mmrl run start --help` lists the options)\n")
    assert cli.main(["serve", "env", "--prot", "1"]) == 2
    assert capsys.readouterr().err == "mmrl serve env: unrecognized arguments: --prot 1 (`mmrl serve env --help` " \
                                      "lists the options)\n"


def test_run_status_against_an_unreachable_api_is_one_line_and_exit_status_1(
        capsys: pytest.CaptureFixture[str]) -> None:
    api = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["run", "status", "r1", "--api", api]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"mmrl run: cannot reach the coordinator at {api}: ") and err.count("\n") == 1


@pytest.mark.parametrize(("service", "variable"), [("env", "MMRL_ENV_PORT"), ("rollout", "MMRL_ROLLOUT_PORT"),
                                                   ("learner", "MMRL_LEARNER_PORT"),
                                                   ("coordinator", "MMRL_COORDINATOR_PORT")])
def test_every_serve_command_tells_a_bad_setting_in_the_same_one_line_form(
        service: str, variable: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    expected = (f"mmrl serve {service}: port (--port, {variable}): Input should be less than or equal to 65535 "
                "(got '70000')\n")
    assert cli.main(["serve", service, "--port", "70000"]) == 2
    assert capsys.readouterr().err == expected
    monkeypatch.setenv(variable, "70000")  # the same setting from the environment
    assert cli.main(["serve", service]) == 2
    assert capsys.readouterr().err == expected


@pytest.mark.parametrize("service", ["env", "rollout"])
def test_a_bad_config_file_of_a_serve_command_is_one_line_naming_file_and_field(
        service: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / f"{service}.yaml"
    config.write_text("max_batch: 0\n" if service == "env" else "max_model_len: 8\n")
    field = "max_batch: Input should be greater than or equal to 1 (got 0)" if service == "env" else \
        "max_model_len: Input should be greater than or equal to 16 (got 8)"
    model = ["--model", "m"] if service == "rollout" else []
    assert cli.main(["serve", service, "--config", str(config), *model]) == 2
    assert capsys.readouterr().err == f"mmrl serve {service}: {config}: {field}\n"
    assert cli.main(["serve", service, "--config", str(tmp_path / "missing.yaml")]) == 2
    assert capsys.readouterr().err == (f"mmrl serve {service}: cannot read the config file {tmp_path / 'missing.yaml'}: "
                                       "No such file or directory\n")


def test_the_installed_command_prints_no_traceback_for_a_bad_setting() -> None:
    """The same line from a real `mmrl` process, whose exit status is the one `main` returns."""
    result = subprocess.run([sys.executable, "-m", "mmrl.cli.main", "serve", "env", "--max-batch", "0"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "mmrl serve env: max_batch: Input should be greater than or equal to 1 (got '0')\n"
