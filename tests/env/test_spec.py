"""Episode specs are validated field by field, with messages that name the field."""

from __future__ import annotations

import pytest

from services.common.task import TaskSpec
from services.env.config import EnvConfig
from services.env.errors import EnvError, ErrorCode
from services.env.maze.spec import EpisodeSettings, parse_spec

CONFIG = EnvConfig()


def _parse(seed: int = 0, max_moves: int = 0, **options: str) -> EpisodeSettings:
    return parse_spec(TaskSpec(seed=seed, max_moves=max_moves, options=options), CONFIG, "specs[3]")


def test_defaults_are_the_easy_maze() -> None:
    settings = _parse()
    assert (settings.size, settings.max_moves, settings.unit_px) == (9, 20, 8)
    assert (settings.start, settings.goal, settings.require_stop) == ((0, 0), (3, 3), False)


def test_options_are_read() -> None:
    settings = _parse(seed=5, max_moves=7, size="11", unit_px="4", require_stop="True", start="4,0", goal=" (0, 4) ")
    assert (settings.seed, settings.size, settings.max_moves, settings.unit_px) == (5, 11, 7, 4)
    assert (settings.start, settings.goal, settings.require_stop) == ((4, 0), (0, 4), True)


def test_the_default_move_budget_scales_with_the_number_of_cells() -> None:
    assert _parse(size="11").max_moves == 32  # ceil(1.25 * 25)
    assert parse_spec(TaskSpec(seed=0), EnvConfig(default_max_moves=50)).max_moves == 50


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"size": "8"}, "specs[3].options.size: must be odd, got 8"),
        ({"size": "3"}, "specs[3].options.size: must be in [5, 51], got 3"),
        ({"size": "53"}, "specs[3].options.size: must be in [5, 51], got 53"),
        ({"size": "nine"}, "specs[3].options.size: must be an integer, got 'nine'"),
        ({"size": "9.0"}, "specs[3].options.size: must be an integer, got '9.0'"),
        ({"unit_px": "0"}, "specs[3].options.unit_px: must be in [1, 32], got 0"),
        ({"require_stop": "maybe"}, "specs[3].options.require_stop: must be true or false, got 'maybe'"),
        ({"start": "1;1"}, "specs[3].options.start: must be a cell 'row,col', got '1;1'"),
        ({"start": "1" * 5000 + ",0"}, "specs[3].options.start: must be a cell 'row,col', got '111"),
        ({"goal": "4,0"}, "specs[3].options.goal: cell '4,0' is outside the 4x4 cells"),
        ({"size": "51", "unit_px": "20"},
         "specs[3].options.unit_px: size 51 at unit_px 20 makes 1040x1040 px frames, more than max_frame_px=1024"),
        ({"goal": "0,0"}, "specs[3].options.goal: must differ from start, both are (0, 0)"),
        ({"colour": "red"}, "specs[3].options: unknown option 'colour'"),
    ],
)
def test_invalid_options_name_the_field(spec: dict[str, str], message: str) -> None:
    with pytest.raises(EnvError) as raised:
        _parse(**spec)
    assert raised.value.code is ErrorCode.INVALID_ARGUMENT
    assert raised.value.message.startswith(message)


@pytest.mark.parametrize(
    ("seed", "max_moves", "message"),
    [
        (0, -1, "specs[3].max_moves: must be >= 0 (0: default), got -1"),
        (0, 10_001, "specs[3].max_moves: must be <= 10000, got 10001"),
        (-5, 0, "specs[3].seed: must be in [0, 2**53), got -5"),
        (2**53, 0, "specs[3].seed: must be in [0, 2**53)"),
    ],
)
def test_invalid_seed_or_move_budget_name_the_field(seed: int, max_moves: int, message: str) -> None:
    with pytest.raises(EnvError) as raised:
        _parse(seed=seed, max_moves=max_moves)
    assert raised.value.message.startswith(message)


def test_config_rejects_unknown_fields_and_inconsistent_sizes() -> None:
    with pytest.raises(ValueError):
        EnvConfig(max_live=3)
    with pytest.raises(ValueError):
        EnvConfig(default_size=10)
    with pytest.raises(ValueError):
        EnvConfig(max_size=7)
    with pytest.raises(ValueError, match="max_frame_px"):
        EnvConfig(max_frame_px=64)  # the default 9x9 grid at 8 px is 80x80


def test_the_largest_grid_fits_max_frame_px_at_19_px_per_unit() -> None:
    assert _parse(size="51", unit_px="19").unit_px == 19


@pytest.mark.parametrize("option", ["size", "start", "require_stop", "x" * 10_000])
def test_an_oversized_option_is_quoted_short_in_the_error(option: str) -> None:
    value = "9" * 10_000 + "x"
    with pytest.raises(EnvError) as raised:
        _parse(**{option: value})
    assert raised.value.code is ErrorCode.INVALID_ARGUMENT
    assert len(raised.value.message) < 300 and "characters)" in raised.value.message
