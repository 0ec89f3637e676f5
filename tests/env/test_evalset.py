"""The fixed eval sets are pinned by content hash and never share seeds or layouts with training."""

from __future__ import annotations

import dataclasses

import pytest

from services.env.kit.seeds import EVAL_SEED_MAX, EVAL_SEED_MIN, TRAIN_SEED_LIMIT, is_eval_seed
from services.env.maze.evalset import DEFAULT_EVAL_SET, RECIPES, content_hash, get_eval_set
from services.env.maze.maze import eval_seeds, is_eval_layout, is_training_seed, layout_key


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_eval_set_content_hash_matches_the_recorded_hash(name: str) -> None:
    """Fails when maze generation, the eval seeds or the specs change: that needs a new version."""
    eval_set = get_eval_set(name)
    assert eval_set.content_hash == RECIPES[name].recorded_hash
    assert eval_set.version == "v2"


def test_the_default_eval_set_is_64_easy_mazes_from_documented_seeds() -> None:
    eval_set = get_eval_set("")
    assert eval_set.name == DEFAULT_EVAL_SET == "maze-easy-64"
    seeds = [spec.seed for spec in eval_set.specs]
    assert seeds[:8] == [1_000_017, 1_000_021, 1_000_022, 1_000_023, 1_000_028, 1_000_037, 1_000_040, 1_000_054]
    assert len(seeds) == 64 and seeds[-1] == 1_000_504  # the full list is in docs/env.md
    assert all(spec.max_moves == 20 and dict(spec.options) == {"size": "9"} for spec in eval_set.specs)


def test_the_content_hash_changes_with_any_spec() -> None:
    specs = list(get_eval_set().specs)
    reference = content_hash(specs)
    assert content_hash(specs) == reference
    assert content_hash([dataclasses.replace(specs[0], seed=999_999), *specs[1:]]) != reference
    assert content_hash([dataclasses.replace(specs[5], max_moves=21), *specs[:5], *specs[6:]]) != reference
    assert content_hash(specs[:-1]) != reference


def test_eval_seeds_are_disjoint_from_training_seeds() -> None:
    assert TRAIN_SEED_LIMIT <= EVAL_SEED_MIN < EVAL_SEED_MAX
    for name in RECIPES:
        assert all(is_eval_seed(spec.seed) for spec in get_eval_set(name).specs)
    assert not is_eval_seed(0) and not is_eval_seed(TRAIN_SEED_LIMIT - 1)
    assert is_eval_seed(1_000_000) and not is_eval_seed(EVAL_SEED_MAX)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_eval_sets_hold_distinct_layouts_that_training_never_plays(name: str) -> None:
    """Disjoint seeds are not enough: the backtracker carves the same 4x4 layout from many seeds."""
    recipe = RECIPES[name]
    keys = [layout_key(spec.seed, int(recipe.options["size"])) for spec in get_eval_set(name).specs]
    assert len(set(keys)) == len(keys) == recipe.num_tasks
    assert all(is_eval_layout(key) for key in keys)
    # Every seed of the eval range the set passed over was rejected for its layout (its own, or one of the
    # set it keeps apart from).
    seeds = [spec.seed for spec in get_eval_set(name).specs]
    skipped = set(range(recipe.first_seed, seeds[-1])) - set(seeds)
    apart = {layout_key(spec.seed, int(recipe.options["size"]))
             for other in recipe.apart_from for spec in get_eval_set(other).specs}
    assert all(not is_eval_layout(layout_key(s, int(recipe.options["size"]))) or layout_key(s, int(recipe.options["size"])) in {*keys, *apart}
               for s in skipped)
    assert not apart & set(keys)
    # ... and training, which draws by seed, plays none of them: the training seeds that carve an
    # eval layout (there are many) are exactly the ones `is_training_seed` refuses.
    carving = [s for s in range(20_000) if layout_key(s, int(recipe.options["size"])) in set(keys)]
    if int(recipe.options["size"]) == 9:
        assert len(carving) > 100
    assert not any(is_training_seed(s, int(recipe.options["size"])) for s in carving)


def test_layouts_repeat_across_seeds_and_about_one_in_eight_is_reserved() -> None:
    keys = [layout_key(seed, 9) for seed in range(5_000)]
    distinct = set(keys)
    assert len(distinct) < 3_000  # seeds are not mazes
    assert 0.08 < sum(map(is_eval_layout, distinct)) / len(distinct) < 0.17
    assert layout_key(5, 9) == layout_key(5, 9) != layout_key(5, 11)


def test_eval_seeds_stay_in_the_eval_range() -> None:
    with pytest.raises(ValueError, match="eval seed range"):
        eval_seeds(EVAL_SEED_MAX - 100, 64, 9)
    first = eval_seeds(EVAL_SEED_MIN, 3, 9)
    assert eval_seeds(EVAL_SEED_MIN, 3, 9, exclude=frozenset([layout_key(first[0], 9)]))[:2] == first[1:]


def test_eval_sets_do_not_overlap() -> None:
    seeds = [spec.seed for name in RECIPES for spec in get_eval_set(name).specs]
    assert len(seeds) == len(set(seeds))


def test_unknown_eval_set_names_raise_key_error() -> None:
    with pytest.raises(KeyError, match="maze-easy-64"):
        get_eval_set("maze-impossible")
