"""Frames are deterministic PNGs of the exact size, with each cell on its own 2-unit pixel block."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from services.env.maze.maze import generate_maze
from services.env.maze.render import (
    AGENT,
    COLOURS,
    FLOOR,
    GOAL,
    PADDING,
    WALL,
    MazeRenderer,
    agent_inset,
    encode_png,
    frame_side,
    rgb,
)


def _decode(png: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG" and image.mode == "P"
    return np.asarray(image)


@pytest.mark.parametrize(("size", "unit_px", "side"), [(9, 8, 80), (11, 8, 96), (5, 8, 48), (9, 4, 40), (11, 16, 192)])
def test_frame_side_pads_the_grid_to_an_even_number_of_units(size: int, unit_px: int, side: int) -> None:
    assert frame_side(size, unit_px) == side
    png = MazeRenderer(generate_maze(0, size), unit_px).render((0, 0))
    assert _decode(png).shape == (side, side)


@pytest.mark.parametrize("size", [9, 11])
def test_each_16px_block_is_one_cell_with_its_north_and_west_walls(size: int) -> None:
    maze = generate_maze(5, size)
    agent = (1, 0)
    pixels = _decode(MazeRenderer(maze, 8).render(agent))
    n = maze.num_cells_per_side
    for r in range(n + 1):
        for c in range(n + 1):
            block = pixels[r * 16: r * 16 + 16, c * 16: c * 16 + 16]
            corner, north, west, cell = block[:8, :8], block[:8, 8:], block[8:, :8], block[8:, 8:]
            if r == n or c == n:  # last block row/column: outer wall and padding only
                assert set(np.unique(block)) <= {WALL, PADDING}
                continue
            assert (corner == WALL).all()
            assert (north == (WALL if maze.walls[2 * r, 2 * c + 1] else FLOOR)).all()
            assert (west == (WALL if maze.walls[2 * r + 1, 2 * c] else FLOOR)).all()
            if (r, c) == agent:
                assert (cell[1:7, 1:7] == AGENT).all() and cell[0, 0] == FLOOR
            else:
                assert (cell == (GOAL if (r, c) == maze.goal else FLOOR)).all()
    # 9x9 grid: 72 px of maze, then 8 px of padding on the right and at the bottom.
    side = frame_side(size, 8)
    assert (pixels[size * 8:, :] == PADDING).all() and (pixels[:, size * 8:] == PADDING).all()
    assert pixels.shape == (side, side)


def test_the_same_state_gives_byte_identical_pngs() -> None:
    first = MazeRenderer(generate_maze(42, 9), 8, cache=False)
    second = MazeRenderer(generate_maze(42, 9), 8, cache=False)
    for cell in [(0, 0), (2, 3), (3, 3)]:
        assert first.render(cell) == first.render(cell) == second.render(cell)
    assert first.render((0, 0)) != first.render((0, 1))


def test_the_frame_cache_returns_the_same_bytes_as_rendering() -> None:
    maze = generate_maze(9, 11)
    cached, uncached = MazeRenderer(maze, 8, cache=True), MazeRenderer(maze, 8, cache=False)
    for cell in [(0, 0), (4, 4), (0, 0)]:
        assert cached.render(cell) == uncached.render(cell)


def test_the_frame_cache_keeps_at_most_its_byte_budget_per_maze() -> None:
    maze = generate_maze(3, 51)
    n = maze.num_cells_per_side
    renderer = MazeRenderer(maze, 19, cache=True, cache_bytes=1 << 20)
    reference = MazeRenderer(maze, 19, cache=False)
    cells = [(r, c) for r in range(0, n, 3) for c in range(0, n, 3)]
    for cell in [*cells, *cells[:5]]:
        assert renderer.render(cell) == reference.render(cell)
    assert 0 < renderer.cached_bytes <= 1 << 20
    assert sum(map(len, renderer._frames.values())) == renderer.cached_bytes
    assert len(renderer._frames) < len(cells)  # all of them would take about 2.4 MB


def test_the_agent_on_the_goal_shows_both_colours() -> None:
    maze = generate_maze(1, 9)
    pixels = _decode(MazeRenderer(maze, 8).render(maze.goal))
    top, left = (2 * maze.goal[0] + 1) * 8, (2 * maze.goal[1] + 1) * 8
    unit = pixels[top: top + 8, left: left + 8]
    assert set(np.unique(unit)) == {GOAL, AGENT}
    assert agent_inset(8) == 1


def test_palette_colours_are_distinct_and_decode_to_rgb() -> None:
    assert len(set(COLOURS.values())) == len(COLOURS)
    indices = np.array([[FLOOR, WALL, GOAL, AGENT, PADDING]], dtype=np.uint8)
    decoded = np.asarray(Image.open(io.BytesIO(encode_png(indices))).convert("RGB"))
    assert np.array_equal(decoded, rgb(indices))
