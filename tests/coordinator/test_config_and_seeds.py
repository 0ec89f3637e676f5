from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from services.coordinator.config import RunConfig, load_run_config
from services.coordinator.grpo.tasks import (
    ConfigRefused,
    action_sequences,
    require_action_budget,
    require_env,
    task_seed,
)
from services.coordinator.ops.wire import EnvInfo
from services.env.maze.maze import ACTIONS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["maze-tiny-cpu.yaml", "qwen3-vl-8b-hyperpod.yaml", "frozenlake-4x4-tiny-cpu.yaml",
                                  "minigrid-empty-6x6-tiny-cpu.yaml"])
def test_shipped_run_configs_validate(name: str) -> None:
    config = load_run_config(ROOT / "configs" / name)
    assert config.steps > 0 and config.grpo.group_size >= 2


def test_the_tiny_configs_one_token_actions_fit_the_tiny_tokenizer_and_a_longer_word_is_refused(
    tiny_model_dir: Path,
) -> None:
    from transformers import AutoTokenizer

    config = load_run_config(ROOT / "configs" / "maze-tiny-cpu.yaml")
    assert config.sampling.max_tokens == 1
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    require_action_budget(tokenizer, config.sampling.max_tokens, ACTIONS)

    class SplitsRight:  # a tokenizer in which "right" is two tokens
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [1, 2] if text == "right" else [1]

        def convert_tokens_to_ids(self, token: str) -> int:
            return 0

    with pytest.raises(ConfigRefused, match="max_tokens 1 cannot hold the action 'right', 2 tokens"):
        require_action_budget(SplitsRight(), 1, ACTIONS)
    require_action_budget(SplitsRight(), 2, ACTIONS)


def test_the_production_config_has_the_published_eval_setup() -> None:
    config = load_run_config(ROOT / "configs" / "qwen3-vl-8b-hyperpod.yaml")
    assert "Qwen3-VL-8B" in config.model
    assert config.env.options["size"] == "9" and config.env.max_moves == 20 and config.colocated


def test_overrides_use_dotted_keys_and_are_validated() -> None:
    config = load_run_config(ROOT / "configs" / "maze-tiny-cpu.yaml", {"grpo.group_size": 4, "steps": 3})
    assert config.grpo.group_size == 4 and config.steps == 3
    with pytest.raises(ValidationError):
        load_run_config(ROOT / "configs" / "maze-tiny-cpu.yaml", {"env.max_moves": 0})


def test_temperatures_the_rollout_engine_would_refuse_are_refused_when_the_run_is_created() -> None:
    assert RunConfig.model_validate({"model": "m", "sampling": {"temperature": 2.0}}).sampling.temperature == 2.0
    with pytest.raises(ValidationError, match="sampling.temperature"):
        RunConfig.model_validate({"model": "m", "sampling": {"temperature": 3.0}})
    with pytest.raises(ValidationError, match="eval.sampled_temperature"):
        RunConfig.model_validate({"model": "m", "eval": {"sampled_temperature": 2.5}})


def test_an_override_below_a_plain_value_and_a_file_that_does_not_parse_are_value_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"override grpo.group_size.x: grpo.group_size is a value \(8\), not a section"):
        load_run_config(ROOT / "configs" / "maze-tiny-cpu.yaml", {"grpo.group_size.x": 1})
    broken = tmp_path / "run.yaml"
    broken.write_text("grpo: [1\n")
    with pytest.raises(ValueError, match=r"run.yaml: not valid YAML"):
        load_run_config(broken)


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        RunConfig.model_validate({"model": "m", "grpo": {"group_sise": 4}})


def test_async_rollout_is_refused_with_a_colocated_engine() -> None:
    with pytest.raises(ValidationError, match="async_rollout"):
        RunConfig.model_validate({"model": "m", "colocated": True, "grpo": {"async_rollout": True}})
    with pytest.raises(ValidationError, match="old_logprobs"):
        RunConfig.model_validate({"model": "m", "grpo": {"async_rollout": True}, "loss": {"old_logprobs": "rollout"}})
    assert RunConfig.model_validate({"model": "m", "grpo": {"async_rollout": True}}).grpo.async_rollout


def test_greedy_episodes_must_leave_sampled_ones_in_a_group() -> None:
    assert RunConfig.model_validate({"model": "m", "grpo": {"group_size": 8, "greedy_per_group": 7}})
    with pytest.raises(ValidationError, match="greedy_per_group"):
        RunConfig.model_validate({"model": "m", "grpo": {"group_size": 8, "greedy_per_group": 8}})


def test_a_cosine_schedule_decays_over_the_runs_optimiser_steps() -> None:
    from services.learner.optim import learning_rate_at

    run = load_run_config(ROOT / "configs" / "maze-tiny-cpu.yaml", {
        "steps": 10, "optim.num_minibatches": 4, "optim.warmup_steps": 2, "optim.learning_rate": 0.002,
        "optim.lr_schedule": "cosine", "optim.min_lr_ratio": 0.1})
    learner = run.train_settings()
    assert learner.total_steps == 40
    assert learning_rate_at(2, learner) == pytest.approx(0.002)
    assert 0.0002 < learning_rate_at(39, learner) < 0.00021  # the run's last optimiser step
    with pytest.raises(ValidationError, match="warmup_steps"):
        load_run_config(ROOT / "configs" / "maze-tiny-cpu.yaml", {
            "steps": 2, "optim.num_minibatches": 1, "optim.warmup_steps": 2, "optim.lr_schedule": "cosine"})

    # PPO epochs: every pass over the batch takes its own optimiser steps.
    run = load_run_config(ROOT / "configs" / "maze-tiny-cpu.yaml", {
        "steps": 10, "optim.num_minibatches": 4, "optim.epochs": 2, "optim.lr_schedule": "cosine"})
    learner = run.train_settings()
    assert (learner.optim.epochs, learner.total_steps) == (2, 80)
    assert load_run_config(ROOT / "configs" / "maze-tiny-cpu.yaml", {
        "steps": 1, "optim.num_minibatches": 1, "optim.epochs": 3, "optim.warmup_steps": 2,
        "optim.lr_schedule": "cosine"}).optim.steps_per_train_step == 3


def test_sampling_seeds_past_int64_fit_the_rollout_request_and_run_seeds_are_bounded() -> None:
    from services.coordinator.ops.clients import _generation_request
    from services.coordinator.ops.wire import Prompt, SamplingParams

    def wire_seed(seed: int) -> int:
        sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=4, stop_token_ids=[], seed=seed)
        return _generation_request(Prompt([1], [], sampling, "", 0)).sampling.seed

    # Seeds derived from a large run seed (run seed x 100,003 x 1,000,003 + ...) pass 2**63.
    assert wire_seed(2**70 + 5) == (2**70 + 5) % 2**63
    assert wire_seed(12345) == 12345
    assert RunConfig(model="m", seed=2**31 - 1).seed == 2**31 - 1
    with pytest.raises(ValidationError):
        RunConfig(model="m", seed=2**31)


@pytest.mark.parametrize("name", ["café-run", "实验", "___x", "A b/c", "-"])
def test_run_ids_made_from_any_name_are_valid_on_shared_storage(name: str) -> None:
    from services.common.storage import validate_run_id
    from services.coordinator.ops.store import new_run_id

    run_id = new_run_id(name)
    assert validate_run_id(run_id) == run_id


MAZE = EnvInfo(name="maze", actions=list(ACTIONS), capabilities=["state_keys"], eval_sets=["maze-easy-64"])


def test_a_run_is_refused_on_an_env_that_lacks_what_it_needs_naming_it() -> None:
    require_env(RunConfig(model="m", grpo={"credit": "gigpo"}), MAZE)
    bare = EnvInfo(name="boxes", actions=["push"], capabilities=[], eval_sets=["boxes-32"])
    with pytest.raises(ConfigRefused, match="needs the env capability 'state_keys'"):
        require_env(RunConfig(model="m", grpo={"credit": "gigpo"}), bare)
    with pytest.raises(ConfigRefused, match="expects env 'maze'; the env service is 'boxes'"):
        require_env(RunConfig(model="m", env={"name": "maze"}), bare)
    with pytest.raises(ConfigRefused, match="eval.eval_set 'maze-easy-64' is not one of env 'boxes'"):
        require_env(RunConfig(model="m", eval={"eval_set": "maze-easy-64"}), bare)
    require_env(RunConfig(model="m"), bare)  # GRPO needs nothing; any env


def test_the_task_seed_of_a_round_is_a_pure_function_of_run_seed_step_and_round() -> None:
    assert task_seed(0, 5, 0) == task_seed(0, 5, 0)
    assert len({task_seed(r, s, k) for r in (0, 1) for s in (5, 6) for k in (0, 1)}) == 8


def test_constrained_actions_send_each_words_tokens_then_the_end_of_turn_to_rollout_and_learner(
    tiny_model_dir: Path,
) -> None:
    from transformers import AutoTokenizer

    from services.common.conversation import ChatTokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    chat = ChatTokens.from_tokenizer(tokenizer)
    config = load_run_config(ROOT / "configs" / "minigrid-empty-6x6-tiny-cpu.yaml")
    sequences = action_sequences(config, tokenizer, chat, ("left", "right", "forward"))
    assert sequences == tuple((*tokenizer.encode(w, add_special_tokens=False), chat.im_end)
                              for w in ("left", "right", "forward"))
    assert config.train_settings(sequences).action_sequences == sequences
    require_action_budget(tokenizer, config.sampling.max_tokens, ("left", "right", "forward"))
    free = load_run_config(ROOT / "configs" / "maze-tiny-cpu.yaml")
    assert free.sampling.actions == "free" and action_sequences(free, tokenizer, chat, ACTIONS) == ()
    with pytest.raises(ConfigRefused, match="same tokens"):
        action_sequences(config, tokenizer, chat, ("left", "left"))
