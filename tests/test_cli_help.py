"""`mmrl` explains itself: `--version`, the help of every command group, `mmrl run --help` with
every action and its options, and a description for every option of every `serve` command."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from mmrl.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What `mmrl ARGV` prints, checking it ends with exit status 0."""
    try:
        status = cli.main(argv)
    except SystemExit as stop:  # argparse's --help
        status = stop.code  # type: ignore[assignment]
    captured = capsys.readouterr()
    assert status == 0 and not captured.err, (argv, captured.err)
    return captured.out


def test_the_version_is_the_installed_packages() -> None:
    result = subprocess.run([sys.executable, "-m", "mmrl.cli.main", "--version"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == f"mmrl {cli.version()}\n"
    assert cli.version()[0].isdigit()


@pytest.mark.parametrize("group", ["serve", "bench"])
def test_a_command_group_lists_its_commands_and_exits_0(group: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _help([group, "--help"], capsys)
    names = [words[1] for words in cli.COMMANDS if words[0] == group]
    assert len(names) >= 4 and all(f"{group} {name} " in out for name in names)
    assert "mmrl run" not in out


def test_a_group_without_its_command_is_one_line_and_exit_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve"]) == 2
    assert capsys.readouterr().err == ("mmrl serve: a command is needed: one of env, openenv, rollout, learner, coordinator "
                                       "(`mmrl serve --help`)\n")
    assert cli.main(["bench", "envv"]) == 2
    assert capsys.readouterr().err.startswith("mmrl bench: unknown command 'envv': one of env, rollout")


def test_run_help_lists_every_action_with_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help(["run", "--help"], capsys)
    actions = out[out.index("actions:"):]
    for action in ("start", "list", "status", "watch", "stop", "pause", "resume"):
        assert f"mmrl run {action} " in actions or f"mmrl run {action}\n" in actions, action
    for option in ("--config", "--watch", "--set KEY=VALUE", "KEY=VALUE", "run_id"):
        assert option in actions, option
    assert "the run's id" in actions and "then watch it" in actions


def test_config_help_lists_show_validate_and_docs(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help(["config", "--help"], capsys)
    for usage in ("mmrl config show", "mmrl config validate", "mmrl config docs", "--kind", "--json", "--out"):
        assert usage in out, usage


@pytest.mark.parametrize("service", ["env", "rollout", "learner", "coordinator"])
def test_every_option_of_a_serve_command_is_described(service: str) -> None:
    module, _ = cli.COMMANDS[("serve", service)]
    parser: argparse.ArgumentParser = importlib.import_module(module).parser()
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert len(options) >= 8
    for option in options:
        assert option.help and option.help.endswith("."), option.option_strings
    help_text = parser.format_help()
    assert "--port" in help_text and "--log-level" in help_text


def test_the_flags_deployments_pass_are_still_accepted() -> None:
    """The flags of docker-compose.yml and deploy/k8s (`mmrl serve ...` args) parse as before."""
    deployed = {
        "env": ["--host", "0.0.0.0", "--port", "50051", "--config", "env.yaml"],
        "coordinator": ["--host", "0.0.0.0", "--port", "8000"],
        "rollout": ["--model", "/m", "--host", "0.0.0.0", "--port", "50052", "--shared-root", "/shared",
                    "--max-lora-rank", "32", "--max-model-len", "512", "--config", "r.yaml"],
        "learner": ["--model", "/m", "--host", "0.0.0.0", "--port", "50053", "--shared-root", "/shared",
                    "--nproc", "2", "--nnodes", "2", "--rdzv-endpoint", "learner-0:29400", "--rdzv-id", "mmrl-learner",
                    "--node-rank", "0", "--num-threads", "1", "--image-cache-mb", "0", "--port-file", "p",
                    "--device", "cpu", "--dtype", "float32", "--log-level", "INFO"],
    }
    for service, argv in deployed.items():
        module, _ = cli.COMMANDS[("serve", service)]
        args = vars(importlib.import_module(module).parser().parse_args(argv))
        assert args.get("port") == argv[argv.index("--port") + 1], service


def test_every_option_of_every_command_has_help(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each command's parser, caught as its `main` parses: every option and argument (of every action
    too) says what it is for."""
    undescribed: list[str] = []
    seen: list[str] = []

    class Parsed(Exception):
        pass

    def walk(parser: argparse.ArgumentParser) -> None:
        seen.append(parser.prog)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
            elif action.dest != "help" and not action.help:
                undescribed.append(f"{parser.prog} {'/'.join(action.option_strings) or action.dest}")

    def check(parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        walk(parser)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", check)
    for entry, _ in cli.COMMANDS.values():
        with pytest.raises(Parsed):
            cli.entry_point(entry)([])
    assert {"mmrl run start", "mmrl run stop", "mmrl config docs"} <= set(seen)
    assert len(seen) > len(cli.COMMANDS) and not undescribed, undescribed
