"""The SFT's settings: the band rule that keeps a start of a chosen strength, renamed settings refused
with their new names, and what the fingerprint (the demo's SFT cache key) depends on."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from mmrl.sft.config import SftConfig, kept_update

ROOT = Path(__file__).resolve().parents[2]


def _checks(rates: tuple[float, ...], first: int = 500) -> list[dict[str, float]]:
    return [{"updates": first + 100 * i, "validation_solve_rate": r} for i, r in enumerate(rates)]


def test_the_band_keeps_the_last_check_inside_it() -> None:
    # One machine's checks at 500..1200 (docs/experiments): 0.44 0.66 0.44 0.50 0.61 0.53 0.65 0.80.
    checks = _checks((0.44, 0.66, 0.44, 0.50, 0.61, 0.53, 0.65, 0.80))
    assert kept_update((0.45, 0.60), checks, ran=1200) == 1000
    assert kept_update((0.0, 0.55), checks, ran=1200) == 1000  # the old "last at or below 0.55"
    assert kept_update((0.60, 0.70), checks, ran=1200) == 1100


def test_without_a_check_inside_the_band_the_nearest_is_kept_and_without_checks_the_last_update() -> None:
    assert kept_update((0.45, 0.60), _checks((0.3, 0.4, 0.7, 0.9)), ran=800) == 600  # 0.05 below beats 0.1 above
    assert kept_update((0.5, 0.75), _checks((0.25, 1.0)), ran=600) == 600  # equally near: the later one
    assert kept_update((0.45, 0.60), [], ran=300) == 300
    assert kept_update(None, _checks((0.5,)), ran=700) == 700


def test_band_on_sampled_keeps_by_the_sampled_rate() -> None:
    # Greedy 0.50 0.58 0.66 0.70, sampled 0.40 0.52 0.59 0.64: the greedy band keeps 600, the sampled one 700.
    checks = [{**c, "validation_sampled_rate": s}
              for c, s in zip(_checks((0.50, 0.58, 0.66, 0.70)), (0.40, 0.52, 0.59, 0.64), strict=True)]
    assert kept_update((0.45, 0.60), checks, ran=800) == 600
    assert kept_update((0.45, 0.60), checks, ran=800, band_on="sampled") == 700
    assert kept_update((0.60, 0.70), checks, ran=800, band_on="sampled") == 800
    with pytest.raises(ValidationError, match="band_on: sampled needs check_samples"):
        SftConfig(base_model="m", out="o", updates=900, band=(0.45, 0.6), band_on="sampled")


def test_a_band_needs_a_check_after_the_last_update_and_an_order() -> None:
    with pytest.raises(ValidationError, match="needs a check after the last update: 950"):
        SftConfig(base_model="m", out="o", updates=950, band=(0.45, 0.6))
    with pytest.raises(ValidationError, match="0 <= low <= high <= 1"):
        SftConfig(base_model="m", out="o", updates=1200, band=(0.6, 0.45))
    config = SftConfig(base_model="m", out="o", updates=900, band=(0.45, 0.6), check_from=500, check_every=100)
    assert [u for u in range(1, 901) if config.is_check(u)] == [500, 600, 700, 800, 900]
    assert config.num_drawn() == config.num_tasks + config.check_tasks
    assert not SftConfig(base_model="m", out="o", updates=900).is_check(500)  # no band: no checks
    with pytest.raises(ValidationError, match="stop_above_band needs a band"):
        SftConfig(base_model="m", out="o", updates=900, stop_above_band=True)


def test_stop_above_band_stops_after_a_check_above_the_band_on_its_rate() -> None:
    config = SftConfig(base_model="m", out="o", updates=900, band=(0.45, 0.6), stop_above_band=True)
    assert not config.stops_after([]) and not config.stops_after(_checks((0.3, 0.6)))
    assert config.stops_after(_checks((0.3, 0.61)))
    assert not config.model_copy(update={"stop_above_band": False}).stops_after(_checks((0.3, 0.61)))
    sampled = config.model_copy(update={"band_on": "sampled", "check_samples": 1})
    assert not sampled.stops_after([{"updates": 500, "validation_solve_rate": 0.9, "validation_sampled_rate": 0.5}])


@pytest.mark.parametrize(("old", "new"), [("num_mazes", "num_tasks"), ("learning_rate", "optim.learning_rate"),
                                          ("stop_above", "band"), ("check_mazes", "check_tasks")])
def test_renamed_settings_are_refused_with_their_new_name(old: str, new: str) -> None:
    with pytest.raises(ValidationError, match=f"{old} is now {new}"):
        SftConfig.model_validate({"base_model": "m", "out": "o", old: 1})


def test_the_fingerprint_follows_what_the_sft_computes_not_where_it_writes() -> None:
    plain = {"base_model": "m", "out": "o", "updates": 900}
    assert SftConfig(**plain).fingerprint() == SftConfig(**{**plain, "out": "elsewhere", "save_at": [5]}).fingerprint()
    banded = SftConfig(**plain, band=(0.45, 0.6)).fingerprint()
    assert SftConfig(**plain).fingerprint() != banded != SftConfig(**plain, band=(0.4, 0.6)).fingerprint()
    assert banded != SftConfig(**plain, band=(0.45, 0.6), check_every=50).fingerprint()
    # Sampled checks that only measure keep the model, and its cache key; a band on them does not.
    assert banded == SftConfig(**plain, band=(0.45, 0.6), check_samples=2).fingerprint()
    assert banded != SftConfig(**plain, band=(0.45, 0.6), check_samples=2, band_on="sampled").fingerprint()


def test_the_shipped_sft_configs_load_and_match_their_run_configs() -> None:
    from mmrl.cli.run import load_config_dict
    from mmrl.cli.sft import load_sft_config

    for env in ("maze", "sokoban"):
        sft = load_sft_config(ROOT / "configs" / f"sft-{env}-tiny.yaml", None, None)
        run = load_config_dict(ROOT / "configs" / f"{env}-tiny-cpu.yaml", {})
        assert sft.env == run["env"]["name"] == env
        assert sft.options == run["env"]["options"] and sft.max_moves == run["env"]["max_moves"]
        assert sft.system_prompt == run["system_prompt"]
    maze = load_sft_config(ROOT / "configs" / "sft-maze-tiny.yaml", None, None)
    assert maze.band == (0.45, 0.6) and maze.is_check(maze.updates) and maze.check_from < maze.updates
