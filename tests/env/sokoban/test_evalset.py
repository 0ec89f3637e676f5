"""Sokoban's eval sets are pinned by content hash and kept apart from every training task."""

from __future__ import annotations

from collections.abc import Iterable

from services.common.task import TaskSpec
from services.env.kit.seeds import is_eval_seed
from services.env.sokoban.env import SokobanEnv
from services.env.sokoban.evalset import RECIPES, get_eval_set
from services.env.sokoban.level import generate_level, is_eval_level, level_key


def _keys(specs: Iterable[TaskSpec]) -> set[bytes]:
    return {level_key(generate_level(s.seed, int(s.options.get("size", 5)), int(s.options.get("pulls", 4))))
            for s in specs}


def test_every_eval_set_has_its_recorded_content_hash() -> None:
    for name, recipe in RECIPES.items():
        eval_set = get_eval_set(name)
        assert eval_set.content_hash == recipe.recorded_hash, name
        assert len(eval_set.specs) == recipe.num_tasks


def test_eval_levels_are_reserved_distinct_from_eval_seeds_and_the_held_out_sets_are_apart() -> None:
    fixed, held_out, large = (get_eval_set(name) for name in ("", "sokoban-held-out-128", "sokoban-held-out-512"))
    assert fixed.name == "sokoban-64"
    for eval_set in (fixed, held_out, large):
        assert all(is_eval_seed(spec.seed) for spec in eval_set.specs)
        keys = _keys(eval_set.specs)
        assert len(keys) == len(eval_set.specs) and all(is_eval_level(key) for key in keys)
    assert not _keys(fixed.specs) & _keys(held_out.specs)
    assert not _keys(large.specs) & (_keys(fixed.specs) | _keys(held_out.specs))


def test_training_tasks_are_deterministic_distinct_and_never_an_eval_level() -> None:
    env = SokobanEnv()
    tasks = env.training_tasks("mmrl:0:0:0", 256, 20, {})
    assert tasks == env.training_tasks("mmrl:0:0:0", 256, 20, {})
    assert tasks != env.training_tasks("mmrl:0:1:0", 256, 20, {})
    keys = _keys(tasks)
    assert len(keys) == 256 and not any(is_eval_level(key) for key in keys)
    assert all(spec.seed < 1_000_000 and spec.max_moves == 20 for spec in tasks)
    eval_keys = set().union(*(_keys(get_eval_set(name).specs) for name in RECIPES))
    assert not keys & eval_keys
