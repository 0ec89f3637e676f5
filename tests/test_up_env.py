"""`mmrl up --env`: a name the stack serves (registered or a Gymnasium preset) or the address of an env
server already running, which the stack then uses instead of starting one."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from mmrl.cli.stack import Stack, StackConfig
from mmrl.cli.up import env_choice


def test_an_address_is_an_env_already_running_and_a_name_one_the_stack_serves() -> None:
    parser = argparse.ArgumentParser(prog="mmrl up")
    assert env_choice(parser, "127.0.0.1:50061") == ("", "127.0.0.1:50061")
    assert env_choice(parser, "sokoban") == ("sokoban", "")
    assert env_choice(parser, "frozenlake-4x4") == ("frozenlake-4x4", "")
    with pytest.raises(SystemExit):
        env_choice(parser, "no-such-env")


def test_a_preset_is_served_with_gymnasium_and_an_external_env_is_the_stacks_env_address(tmp_path: Path) -> None:
    assert Stack(StackConfig(model=tmp_path, env_name="minigrid-empty-6x6")).command("env")[-2:] == [
        "--gymnasium", "minigrid-empty-6x6"]
    external = Stack(StackConfig(model=tmp_path, env_addr="127.0.0.1:50061"))
    assert external.address("env") == "127.0.0.1:50061"
    assert external.environment()["MMRL_ENV_ADDR"] == "127.0.0.1:50061"


def test_up_with_an_unknown_env_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from mmrl.cli.main import main as mmrl

    assert mmrl(["up", "--env", "no-such-env"]) == 2
    assert "neither host:port nor one of maze, sokoban" in capsys.readouterr().err


def test_up_with_tower_lora_starts_a_rollout_service_that_serves_tower_adapters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mmrl.cli import up

    commands: list[list[str]] = []

    def record(stack: Stack, *args: object, **kwargs: object) -> None:
        commands.append(stack.command("rollout"))
        raise KeyboardInterrupt

    monkeypatch.setattr(up, "ensure_tiny_model", lambda model: model)
    monkeypatch.setattr(Stack, "start", record)
    monkeypatch.setattr(Stack, "stop", lambda stack: None)
    for flags in ([], ["--tower-lora"]):
        assert up.main(["--model", str(tmp_path), "--state-dir", str(tmp_path / "state"), *flags]) == 0
    assert ["--tower-lora" in command for command in commands] == [False, True]
