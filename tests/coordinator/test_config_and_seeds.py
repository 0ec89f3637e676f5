from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from services.common.maze import TRAIN_SEED_LIMIT
from services.coordinator.config import EnvSettings, RunConfig, load_run_config
from services.coordinator.tasks import (
    ConfigRefused,
    require_action_budget,
    spec_layouts,
    step_seeds,
    training_options,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["maze-tiny-cpu.yaml", "qwen3-vl-8b-hyperpod.yaml"])
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
    require_action_budget(tokenizer, config.sampling.max_tokens)

    class SplitsRight:  # a tokenizer in which "right" is two tokens
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [1, 2] if text == "right" else [1]

        def convert_tokens_to_ids(self, token: str) -> int:
            return 0

    with pytest.raises(ConfigRefused, match="max_tokens 1 cannot hold the action 'right', 2 tokens"):
        require_action_budget(SplitsRight(), 1)
    require_action_budget(SplitsRight(), 2)


def test_the_production_config_has_the_published_eval_setup() -> None:
    config = load_run_config(ROOT / "configs" / "qwen3-vl-8b-hyperpod.yaml")
    assert "Qwen3-VL-8B" in config.model
    assert config.env.size == 9 and config.env.max_moves == 20 and config.colocated


def test_overrides_use_dotted_keys_and_are_validated() -> None:
    config = load_run_config(ROOT / "configs" / "maze-tiny-cpu.yaml", {"grpo.group_size": 4, "steps": 3})
    assert config.grpo.group_size == 4 and config.steps == 3
    with pytest.raises(ValidationError):
        load_run_config(ROOT / "configs" / "maze-tiny-cpu.yaml", {"env.size": 10})


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


def test_the_seeds_of_a_step_are_a_pure_function_of_run_seed_and_step() -> None:
    assert step_seeds(0, 5, 0, 8, 9) == step_seeds(0, 5, 0, 8, 9)
    assert step_seeds(0, 5, 0, 8, 9) != step_seeds(0, 6, 0, 8, 9)
    assert step_seeds(0, 5, 0, 8, 9) != step_seeds(1, 5, 0, 8, 9)
    assert len(set(step_seeds(3, 1, 0, 64, 9))) == 64


def test_training_mazes_never_have_an_eval_set_layout() -> None:
    """The issue's guarantee: no eval maze is trained on, by seed or by layout."""
    from services.common.maze import is_eval_layout, is_eval_seed, layout_key
    from services.env.evalset import RECIPES, get_eval_set

    for name, recipe in RECIPES.items():
        eval_set = get_eval_set(name)
        eval_seeds = {spec.seed for spec in eval_set.specs}
        eval_layouts = spec_layouts(eval_set.specs, recipe.size)
        assert TRAIN_SEED_LIMIT <= min(eval_seeds)
        for step in range(0, 150):
            for run_seed in (0, 2**31 - 1):
                for seed in step_seeds(run_seed, step, step % 3, 16, recipe.size):
                    key = layout_key(seed, recipe.size)
                    assert seed not in eval_seeds and not is_eval_seed(seed)
                    assert key not in eval_layouts and not is_eval_layout(key)


def test_step_seeds_skip_the_layouts_they_are_told_to() -> None:
    from services.common.maze import layout_key

    seeds = step_seeds(0, 1, 0, 8, 9)
    without_first = step_seeds(0, 1, 0, 8, 9, frozenset([layout_key(seeds[0], 9)]))
    assert seeds[0] not in without_first and without_first[:7] == seeds[1:]


def test_sampling_seeds_past_int64_fit_the_rollout_request_and_run_seeds_are_bounded() -> None:
    from services.coordinator.clients import _generation_request
    from services.coordinator.wire import Prompt, SamplingParams

    def wire_seed(seed: int) -> int:
        sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=4, stop_token_ids=[], seed=seed)
        return _generation_request(Prompt([1], [], sampling, "", 0)).sampling.seed

    # Seeds derived from a large run seed (run seed x 100,003 x 1,000,003 + ...) pass 2**63.
    assert wire_seed(2**70 + 5) == (2**70 + 5) % 2**63
    assert wire_seed(12345) == 12345
    assert RunConfig(model="m", seed=2**31 - 1).seed == 2**31 - 1
    with pytest.raises(ValidationError):
        RunConfig(model="m", seed=2**31)


def test_training_mazes_keep_the_default_start_without_random_start() -> None:
    env = EnvSettings(size=9)
    assert all(training_options(env, 0, step, 0, 123) == {"size": "9"} for step in range(50))


def test_random_start_draws_a_share_of_start_cells_other_than_the_goal() -> None:
    env = EnvSettings(size=9, random_start=0.5)
    options = [training_options(env, 0, step, 0, seed) for step in range(40) for seed in range(50)]
    starts = [o["start"] for o in options if "start" in o]
    assert 0.45 < len(starts) / len(options) < 0.55
    assert set(starts) == {f"{r},{c}" for r in range(4) for c in range(4)} - {"3,3"}
    assert all(o["size"] == "9" for o in options)
    # a pure function of its arguments: a replayed step plays the same episodes
    assert training_options(env, 0, 7, 1, 99) == training_options(env, 0, 7, 1, 99)
    every = EnvSettings(size=9, random_start=1.0)
    assert all("start" in training_options(every, 0, 1, 0, seed) for seed in range(100))


def test_random_start_avoids_a_goal_set_by_options() -> None:
    env = EnvSettings(size=7, random_start=1.0, options={"goal": "0,0"})
    starts = {training_options(env, 3, 1, 0, seed)["start"] for seed in range(300)}
    assert starts == {f"{r},{c}" for r in range(3) for c in range(3)} - {"0,0"}


def test_random_start_is_validated() -> None:
    with pytest.raises(ValidationError, match="env.options.start"):
        EnvSettings(random_start=0.5, options={"start": "1,1"})
    with pytest.raises(ValidationError):
        EnvSettings(random_start=1.5)
    with pytest.raises(ValidationError, match="row,col"):
        EnvSettings(random_start=0.5, options={"goal": "3;3"})


@pytest.mark.parametrize("name", ["café-run", "实验", "___x", "A b/c", "-"])
def test_run_ids_made_from_any_name_are_valid_on_shared_storage(name: str) -> None:
    from services.common.storage import validate_run_id
    from services.coordinator.store import new_run_id

    run_id = new_run_id(name)
    assert validate_run_id(run_id) == run_id


def test_the_maze_size_is_set_by_env_size_only() -> None:
    """Training seeds are checked against the eval layouts at env.size: options may not change it."""
    with pytest.raises(ValidationError, match="env.size"):
        EnvSettings(size=9, options={"size": "11"})


def test_hindsight_replays_are_refused_where_the_env_requires_stop() -> None:
    """A loop-erased replay ends on the goal without 'stop': under require_stop none would be solved."""
    with pytest.raises(ValidationError, match="require_stop"):
        RunConfig(model="m", grpo={"hindsight_advantage": 1.0}, env={"options": {"require_stop": " Yes"}})
    RunConfig(model="m", grpo={"hindsight_advantage": 1.0}, env={"options": {"require_stop": "false"}})
    RunConfig(model="m", env={"options": {"require_stop": "true"}})


def test_a_size_whose_layouts_are_all_kept_from_training_is_refused_not_looped_on() -> None:
    from services.common.maze import is_eval_layout, layout_key
    from services.coordinator.tasks import ConfigRefused

    training = frozenset(k for k in {layout_key(s, 5) for s in range(200)} if not is_eval_layout(k))
    assert len(training) == 2  # a 2x2-cell maze has 4 layouts; 2 are reserved for eval sets
    assert len(step_seeds(0, 1, 0, 8, 5)) == 8
    with pytest.raises(ConfigRefused, match="found 0 of 8 training mazes"):
        step_seeds(0, 1, 0, 8, 5, exclude_layouts=training)
