"""Sokoban frames: deterministic PNGs, one colour per kind of cell, 80x80 px for the default room."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from services.env.sokoban.level import Level, generate_level
from services.env.sokoban.render import (
    AGENT,
    BOX,
    BOX_ON_TARGET,
    COLOURS,
    FLOOR,
    TARGET,
    WALL,
    SokobanRenderer,
    rgb,
)

LEVEL = Level(seed=0, size=5, pulls=1, walls=frozenset({(4, 4)}), target=(0, 0), box=(2, 2), agent=(3, 1))


def _decoded(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_the_colours_are_distinct() -> None:
    assert len(set(COLOURS.values())) == len(COLOURS) == 6


def test_the_default_frame_is_80_px_and_the_same_state_gives_the_same_bytes() -> None:
    level = generate_level(3)
    first = SokobanRenderer(level, 16, cache=False).render((level.agent, level.box))
    again = SokobanRenderer(level, 16).render((level.agent, level.box))
    assert first == again and first.startswith(b"\x89PNG")
    assert Image.open(io.BytesIO(first)).size == (80, 80)


def test_every_cell_shows_what_is_on_it() -> None:
    renderer = SokobanRenderer(LEVEL, 16)
    image = _decoded(renderer.render((LEVEL.agent, LEVEL.box)))
    assert np.array_equal(image, rgb(renderer.pixels((LEVEL.agent, LEVEL.box))))

    def centre(cell: tuple[int, int]) -> tuple[int, ...]:
        return tuple(int(v) for v in image[cell[0] * 16 + 8, cell[1] * 16 + 8])

    assert centre((0, 0)) == COLOURS[TARGET]
    assert centre((4, 4)) == COLOURS[WALL]
    assert centre((1, 1)) == COLOURS[FLOOR]
    assert centre((2, 2)) == COLOURS[BOX]
    assert centre((3, 1)) == COLOURS[AGENT]
    assert tuple(image[3 * 16, 1 * 16]) == COLOURS[FLOOR]  # the rim around the agent: its cell's colour


def test_a_box_on_the_target_has_its_own_colour_and_the_agent_on_the_target_a_target_rim() -> None:
    renderer = SokobanRenderer(LEVEL, 16)
    solved = _decoded(renderer.render(((1, 0), (0, 0))))
    assert tuple(solved[8, 8]) == COLOURS[BOX_ON_TARGET]
    on_target = _decoded(renderer.render(((0, 0), (2, 2))))
    assert tuple(on_target[8, 8]) == COLOURS[AGENT] and tuple(on_target[0, 0]) == COLOURS[TARGET]
