"""Training tasks the maze env draws (GetTrainingTasks): a pure function of the caller's seed,
distinct, and never a maze an eval set holds, by seed or by layout."""

from __future__ import annotations

import pytest

from services.env.errors import EnvError
from services.env.kit.seeds import TRAIN_SEED_LIMIT, is_eval_seed
from services.env.maze.env import MazeEnv
from services.env.maze.evalset import RECIPES, get_eval_set
from services.env.maze.maze import is_eval_layout, layout_key
from services.env.maze.tasks import draw_training_seeds


def test_the_tasks_of_a_seed_are_a_pure_function_of_it() -> None:
    assert draw_training_seeds("mmrl:0:5:0", 8, 9) == draw_training_seeds("mmrl:0:5:0", 8, 9)
    assert draw_training_seeds("mmrl:0:5:0", 8, 9) != draw_training_seeds("mmrl:0:6:0", 8, 9)
    assert len(set(draw_training_seeds("mmrl:3:1:0", 64, 9))) == 64


def test_training_mazes_never_have_an_eval_set_layout() -> None:
    for name, recipe in RECIPES.items():
        eval_set = get_eval_set(name)
        eval_seeds = {spec.seed for spec in eval_set.specs}
        eval_layouts = {layout_key(seed, int(recipe.options["size"])) for seed in eval_seeds}
        assert TRAIN_SEED_LIMIT <= min(eval_seeds)
        for step in range(150):
            for run_seed in (0, 2**31 - 1):
                for seed in draw_training_seeds(f"mmrl:{run_seed}:{step}:{step % 3}", 16, int(recipe.options["size"])):
                    key = layout_key(seed, int(recipe.options["size"]))
                    assert seed not in eval_seeds and not is_eval_seed(seed)
                    assert key not in eval_layouts and not is_eval_layout(key)


def test_the_env_answers_tasks_with_the_requested_budget_and_options_and_checks_them() -> None:
    env = MazeEnv()
    specs = env.training_tasks("s", 4, 20, {"size": "9"})
    assert [s.seed for s in specs] == draw_training_seeds("s", 4, 9)
    assert all(s.max_moves == 20 and dict(s.options) == {"size": "9"} for s in specs)
    with pytest.raises(EnvError, match="options.size"):
        env.training_tasks("s", 4, 20, {"size": "10"})
    with pytest.raises(EnvError, match="count"):
        env.training_tasks("s", -1, 20, {})


def test_the_env_says_what_it_is() -> None:
    info = MazeEnv().info()
    assert info.name == "maze" and "stop" in info.actions and "state_keys" in info.capabilities
    assert info.eval_sets[0] == "maze-easy-64"
