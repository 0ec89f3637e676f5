"""The fixed eval sets are pinned by content hash and never share seeds with training."""

from __future__ import annotations

import dataclasses

import pytest

from services.common.maze import EVAL_SEED_MAX, EVAL_SEED_MIN, TRAIN_SEED_LIMIT, is_eval_seed
from services.env.evalset import DEFAULT_EVAL_SET, RECIPES, content_hash, get_eval_set


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_eval_set_content_hash_matches_the_recorded_hash(name: str) -> None:
    """Fails when maze generation, the eval seeds or the specs change: that needs a new version."""
    eval_set = get_eval_set(name)
    assert eval_set.content_hash == RECIPES[name].recorded_hash
    assert eval_set.version == "v1"


def test_the_default_eval_set_is_64_easy_mazes_from_documented_seeds() -> None:
    eval_set = get_eval_set("")
    assert eval_set.name == DEFAULT_EVAL_SET == "maze-easy-64"
    assert [spec.seed for spec in eval_set.specs] == [1_000_000 + i for i in range(64)]
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


def test_eval_sets_do_not_overlap() -> None:
    seeds = [spec.seed for name in RECIPES for spec in get_eval_set(name).specs]
    assert len(seeds) == len(set(seeds))


def test_unknown_eval_set_names_raise_key_error() -> None:
    with pytest.raises(KeyError, match="maze-easy-64"):
        get_eval_set("maze-impossible")
