"""The SFT's data through a real env service: tasks the env draws (never an eval-set task), validation
tasks apart from the trained ones, the expert's conversations with detours, on the maze and Sokoban."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from mmrl.sft.config import SftConfig
from mmrl.sft.data import draw_tasks, expert_conversations
from services.env.sokoban.env import SokobanEnv
from tests.env_service import with_env_service

MAZE = {"base_model": "m", "out": "o", "env": "maze", "options": {"size": "9"}}
SOKOBAN = {"base_model": "m", "out": "o", "env": "sokoban", "options": {"size": "5", "pulls": "4"}}


def play_expert(config: SftConfig, tokenizer: Any, env: Any = None) -> list[Any]:
    """The expert's conversations of `config`'s training tasks, played on a real env service."""
    def play(address: str) -> list[Any]:
        return expert_conversations(address, config, draw_tasks(address, config).training, tokenizer, lambda _f: 25)

    return with_env_service(play, env)


def test_training_and_validation_tasks_are_distinct_mazes_of_no_eval_set() -> None:
    from services.env.maze.evalset import RECIPES, get_eval_set
    from services.env.maze.maze import is_eval_layout, layout_key

    config = SftConfig(**MAZE, num_tasks=300, updates=500, band=(0.45, 0.6), check_tasks=100)
    tasks = with_env_service(lambda address: draw_tasks(address, config))
    assert (len(tasks.training), len(tasks.validation)) == (300, 100)
    layouts = [layout_key(spec.seed, 9) for spec in [*tasks.training, *tasks.validation]]
    assert len(set(layouts)) == 400 and not any(is_eval_layout(k) for k in layouts)
    eval_layouts = {layout_key(s.seed, int(RECIPES[n].options["size"])) for n in RECIPES for s in get_eval_set(n).specs}
    assert not eval_layouts & set(layouts)
    assert all(spec.max_moves == 20 and dict(spec.options) == {"size": "9"} for spec in tasks.training)
    again = with_env_service(lambda address: draw_tasks(address, config))
    assert [s.seed for s in again.training] == [s.seed for s in tasks.training]  # a pure function of the seed


def test_the_expert_solves_every_training_maze_and_trains_on_its_moves_only(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    played = play_expert(SftConfig(**MAZE, num_tasks=16), tokenizer)
    assert len(played) == 16 and all(t.reward == 1.0 for t in played)
    trained = {tokenizer.decode([i]) for t in played for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m}
    assert trained <= {"up", "down", "left", "right", "<|im_end|>"}


def test_a_windowed_expert_is_one_conversation_per_trained_move_with_its_frame_alone(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    whole = play_expert(SftConfig(**MAZE, num_tasks=8, perturb_prob=0.0), tokenizer)
    windowed = play_expert(SftConfig(**MAZE, num_tasks=8, perturb_prob=0.0, history_window=0), tokenizer)
    moves = [sum(t.loss_mask) // 2 for t in whole]  # a move and <|im_end|> a turn
    assert len(windowed) == sum(moves) > len(whole)
    assert all(len(t.images) == 1 and sum(t.loss_mask) == 2 for t in windowed)
    assert [t.trajectory_id for t in windowed[: moves[0]]] == [f"{whole[0].trajectory_id}-t{k}" for k in range(moves[0])]

    def trained(batch: list[Any]) -> list[int]:
        return [i for t in batch for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m]

    assert trained(windowed) == trained(whole)  # the same moves, in the same order


def _untrained_runs(config: SftConfig, tokenizer_dir: Path) -> list[int]:
    """Lengths of the runs of consecutive untrained (detour) turns in the expert's data."""
    from transformers import AutoTokenizer

    runs = []
    for traj in play_expert(config, AutoTokenizer.from_pretrained(tokenizer_dir)):
        bounds = [*traj.turn_starts, len(traj.token_ids)]
        trained = [any(traj.loss_mask[a:b]) for a, b in itertools.pairwise(bounds)]
        run = 0
        for flag in [*trained, True]:
            if not flag:
                run += 1
            elif run:
                runs.append(run)
                run = 0
    return runs


def test_detours_of_several_moves_lead_the_expert_data_off_the_path(tiny_model_dir: Path) -> None:
    single = _untrained_runs(SftConfig(**MAZE, num_tasks=48, perturb_prob=0.1), tiny_model_dir)
    longer = _untrained_runs(SftConfig(**MAZE, num_tasks=48, perturb_prob=0.1, detour_moves=4), tiny_model_dir)
    assert single and longer
    assert max(longer) >= 3 and sum(longer) / len(longer) > 1.5 > sum(single) / len(single)


def test_sokoban_expert_data_solves_training_levels_never_in_an_eval_set(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from services.env.sokoban.evalset import RECIPES, get_eval_set

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = play_expert(SftConfig(**SOKOBAN, num_tasks=24), tokenizer, SokobanEnv())
    assert len(data) == 24  # the oracle solves every level
    eval_seeds = {s.seed for name in RECIPES for s in get_eval_set(name).specs}
    seeds = {int(t.trajectory_id.removeprefix("sft-")) for t in data}
    assert len(seeds) == 24 and not seeds & eval_seeds and max(seeds) < 1_000_000
    trained = {tokenizer.decode([i]) for t in data for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m}
    assert trained <= {"up", "down", "left", "right", "<|im_end|>"}


def test_an_sft_config_for_sokoban_refuses_a_maze_env_service() -> None:
    with pytest.raises(ValueError, match="the env service is 'maze'"):
        with_env_service(lambda address: draw_tasks(address, SftConfig(**SOKOBAN)))


def test_an_env_without_an_oracle_has_no_expert(tmp_path: Path) -> None:
    from services.env.kit.batched import EnvInfo
    from services.env.maze.env import MazeEnv

    class NoOracle(MazeEnv):
        INFO = EnvInfo(name="maze", actions=MazeEnv.INFO.actions, capabilities=("state_keys",),
                       eval_sets=MazeEnv.INFO.eval_sets)

    with pytest.raises(ValueError, match="no 'oracle' capability"):
        with_env_service(lambda address: draw_tasks(address, SftConfig(**MAZE)), NoOracle())


def test_more_tasks_than_the_env_draws_in_one_call_is_a_usage_error() -> None:
    from services.common.user_errors import UsageError

    config = SftConfig(**MAZE, num_tasks=5000)
    with pytest.raises(UsageError, match=r"num_tasks \+ check_tasks = 5000, drawn in one request\): "
                       r"count: 5000 items, more than max_batch=4096; lower num_tasks or check_tasks"):
        with_env_service(lambda address: draw_tasks(address, config))
