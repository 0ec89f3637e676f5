"""`mmrl eval` refuses bad arguments before it starts any service."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmrl.cli import eval as eval_cli
from services.coordinator.grpo.tasks import action_token_budget


def test_a_model_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no config.json"):
        eval_cli.main(["--model", str(tmp_path)])


def test_a_negative_sample_count_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="--samples -1: must be 0 or more"):
        eval_cli.main(["--model", str(tmp_path), "--samples", "-1"])


def test_a_token_budget_below_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="--max-tokens 0: must be 1 or more"):
        eval_cli.main(["--model", str(tmp_path), "--max-tokens", "0"])


@pytest.fixture
def no_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting a service fails the test: these arguments must be refused before."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a service was started")

    monkeypatch.setattr(eval_cli.Stack, "start", refuse)


@pytest.mark.parametrize("seeds", ["5-3", "abc", "7"])
def test_a_bad_seed_range_is_refused_before_any_service_starts(tmp_path: Path, no_stack: None, seeds: str) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="--seeds expects A-B with A <= B"):
        eval_cli.main(["--model", str(tmp_path), "--seeds", seeds])


@pytest.mark.parametrize(("extra", "sampled"), [(["--seeds", "0-512", "--samples", "8"], 4104),
                                                (["--seeds", "0-63", "--samples", "65"], 4160)])
def test_more_episodes_than_the_env_creates_in_one_call_are_refused(
        tmp_path: Path, no_stack: None, extra: list[str], sampled: int) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match=f"is {sampled} sampled episodes at once; the env service creates at most 4096"):
        eval_cli.main(["--model", str(tmp_path), *extra])


def test_an_adapter_without_a_readable_rank_is_refused(tmp_path: Path, no_stack: None) -> None:
    (tmp_path / "config.json").write_text("{}")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"w")
    (adapter / "adapter_config.json").write_text('{"r": "big"}')
    with pytest.raises(SystemExit, match="must be a readable object with an integer 'r'"):
        eval_cli.main(["--model", str(tmp_path), "--adapter", str(adapter)])


def test_the_rollout_service_is_started_with_slots_for_the_adapters_rank(tmp_path: Path) -> None:
    from mmrl.cli.stack import Stack, StackConfig

    def rollout_flags(rank: int) -> list[str]:
        command = Stack(StackConfig(model=tmp_path, lora_rank=rank)).command("rollout")
        return command[command.index("--max-lora-rank"):][:2] if "--max-lora-rank" in command else []

    assert rollout_flags(0) == [] and rollout_flags(16) == []  # the service's default holds them
    assert rollout_flags(24) == ["--max-lora-rank", "32"] and rollout_flags(64) == ["--max-lora-rank", "64"]


def test_an_adapter_on_the_vision_tower_gets_a_rollout_service_that_serves_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from safetensors.torch import save_file

    started: list[list[str]] = []

    def record(stack: object, *args: object, **kwargs: object) -> None:
        started.append(stack.command("rollout"))  # type: ignore[attr-defined]
        raise SystemExit("recorded")

    monkeypatch.setattr(eval_cli.Stack, "start", record)
    (tmp_path / "config.json").write_text("{}")
    for name, tower in (("lm", False), ("tower", True)):
        adapter = tmp_path / name
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text('{"r": 8}')
        keys = ["base_model.model.model.language_model.layers.0.mlp.up_proj.lora_A.weight"]
        keys += ["base_model.model.model.visual.merger.linear_fc1.lora_A.weight"] if tower else []
        save_file({key: torch.zeros(8, 4) for key in keys}, str(adapter / "adapter_model.safetensors"))
        with pytest.raises(SystemExit, match="recorded"):
            eval_cli.main(["--model", str(tmp_path), "--adapter", str(adapter)])
    assert ["--tower-lora" in command for command in started] == [False, True]


def test_options_without_seeds_are_refused_before_any_service_starts(tmp_path: Path, no_stack: None) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="--option and --max-moves go with --seeds"):
        eval_cli.main(["--model", str(tmp_path), "--eval-set", "sokoban-64", "--option", "size=9"])
    with pytest.raises(SystemExit, match="--option expects KEY=VALUE"):
        eval_cli.main(["--model", str(tmp_path), "--seeds", "1-3", "--option", "size"])


def test_seeds_and_an_eval_set_are_refused_together(tmp_path: Path, no_stack: None) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit):
        eval_cli.main(["--model", str(tmp_path), "--eval-set", "maze-easy-64", "--seeds", "1-3"])


def test_the_stack_serves_the_environment_it_is_given(tmp_path: Path) -> None:
    maze = eval_cli.Stack(eval_cli.StackConfig(model=tmp_path)).command("env")
    sokoban = eval_cli.Stack(eval_cli.StackConfig(model=tmp_path, env_name="sokoban")).command("env")
    assert "--env" not in maze and sokoban[-2:] == ["--env", "sokoban"]


class _SyllableTokenizer:
    """One token per '-'-separated part of a word."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(range(len(text.split("-"))))


def test_the_token_budget_is_the_longest_action_word_unless_given() -> None:
    tokenizer = _SyllableTokenizer()
    assert action_token_budget(tokenizer, ["up", "down", "left"]) == 1  # type: ignore[arg-type]
    assert action_token_budget(tokenizer, ["left", "for-w-ard"]) == 3  # type: ignore[arg-type]
    assert action_token_budget(tokenizer, []) == 1  # type: ignore[arg-type]


# What a fake `evaluate` answers: an eval summary with every key `mmrl eval` prints.
_SUMMARY: dict[str, object] = {
    "greedy_solve_rate": 0.5, "episodes": 2, "mean_moves_over_optimal": None, "greedy_invalid_fraction": 0.0,
    "greedy_noop_fraction": 0.0, "greedy_failed_stuck": 0.0, "greedy_failed_cycling": 0.0,
    "greedy_failed_other": 0.5, "sampled_solve_rate": None, "sampled_pass_rate": None}


def test_the_system_prompt_is_the_one_the_model_trained_with_unless_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from services.common.conversation import DEFAULT_SYSTEM_PROMPT

    used: list[str] = []

    async def evaluate(*args: object, system_prompt: str, **kwargs: object) -> tuple[dict[str, object], list[object]]:
        used.append(system_prompt)
        return _SUMMARY, []

    monkeypatch.setattr(eval_cli, "evaluate", evaluate)
    services = ["--env", "127.0.0.1:1", "--rollout", "127.0.0.1:2", "--json"]
    (tmp_path / "config.json").write_text("{}")
    assert eval_cli.main(["--model", str(tmp_path), *services]) == 0  # no report: the maze's prompt
    (tmp_path / "sft_report.json").write_text(json.dumps({"config": {"system_prompt": "You push boxes."}}))
    assert eval_cli.main(["--model", str(tmp_path), *services]) == 0
    assert eval_cli.main(["--model", str(tmp_path), "--system-prompt", "Given.", *services]) == 0
    assert used == [DEFAULT_SYSTEM_PROMPT, "You push boxes.", "Given."]
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["system_prompt"] == "Given."


def test_the_history_window_is_the_one_the_model_trained_with_unless_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    used: list[int | None] = []

    async def evaluate(*args: object, history_window: int | None, **kwargs: object) -> tuple[dict[str, object], list[object]]:
        used.append(history_window)
        return _SUMMARY, []

    monkeypatch.setattr(eval_cli, "evaluate", evaluate)
    services = ["--env", "127.0.0.1:1", "--rollout", "127.0.0.1:2", "--json"]
    (tmp_path / "config.json").write_text("{}")
    assert eval_cli.main(["--model", str(tmp_path), *services]) == 0  # no report: the whole conversation
    (tmp_path / "sft_report.json").write_text(json.dumps({"config": {"history_window": 0}}))
    assert eval_cli.main(["--model", str(tmp_path), *services]) == 0
    assert eval_cli.main(["--model", str(tmp_path), "--history-window", "2", *services]) == 0
    assert used == [None, 0, 2]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["history_window"] == 2
    with pytest.raises(SystemExit, match="--history-window must be >= 0"):
        eval_cli.main(["--model", str(tmp_path), "--history-window", "-1", *services])


def test_a_run_whose_history_window_is_not_its_starts_is_refused(tmp_path: Path) -> None:
    import json

    eval_cli.check_history_window(tmp_path, 3)  # no SFT report: nothing to compare with
    (tmp_path / "sft_report.json").write_text(json.dumps({"config": {"history_window": 0}}))
    eval_cli.check_history_window(tmp_path, 0)
    with pytest.raises(SystemExit, match="keeping 0 answered turns .* keeps the whole conversation"):
        eval_cli.check_history_window(tmp_path, None)
    (tmp_path / "sft_report.json").write_text(json.dumps({"config": {"system_prompt": "x"}}))
    with pytest.raises(SystemExit, match="history_window: null"):
        eval_cli.check_history_window(tmp_path, 1)
