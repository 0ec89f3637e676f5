"""Deterministic top-down frames of a Sokoban level as small palette PNGs.

Geometry. Cell (r, c) of the room is the pixel square [r*u, (r+1)*u) x [c*u, (c+1)*u) with
u = unit_px, from the top-left corner; the frame shows the room only, so its side is size * u (80x80
px for the default 5x5 room at u = 16) and its edge is the outer wall. With a vision encoder of patch
8 and 2x2 merge (the tiny model's) at u = 16 each merged image token sees exactly one cell: 25
tokens, as many as the maze's 4x4-cell frames.

Colours: wall, floor, target (the whole cell), box and box on target (its own colour: the level is
solved), agent. Box and agent are squares inset by max(1, u // 8) px, so the cell colour under them
stays visible as a rim (the agent standing on the target shows a green rim).
Encoding is the maze's (services/env/maze/render.py `encode_png`, its own palette): the same state gives
byte-identical PNG bytes for a given zlib build, and identical pixels everywhere.
"""

from __future__ import annotations

import numpy as np

from services.env.maze.render import agent_inset, encode_png, palette_bytes
from services.env.sokoban.level import Level
from services.env.sokoban.solver import State

FLOOR, WALL, TARGET, BOX, BOX_ON_TARGET, AGENT = range(6)
COLOURS: dict[int, tuple[int, int, int]] = {
    FLOOR: (235, 235, 235),
    WALL: (40, 40, 40),
    TARGET: (40, 170, 70),
    BOX: (200, 140, 40),
    BOX_ON_TARGET: (50, 90, 220),
    AGENT: (220, 50, 50),
}
PALETTE = palette_bytes(COLOURS)


def frame_side(size: int, unit_px: int) -> int:
    """Image side in pixels of a room of `size` cells at `unit_px` pixels per cell."""
    return size * unit_px


def static_layer(level: Level, unit_px: int) -> np.ndarray:
    """Palette indices of the frame without agent and box: walls, floor and target."""
    units = np.full((level.size, level.size), FLOOR, dtype=np.uint8)
    for cell in level.walls:
        units[cell] = WALL
    units[level.target] = TARGET
    return np.repeat(np.repeat(units, unit_px, axis=0), unit_px, axis=1)


class SokobanRenderer:
    """Renders one level at one cell size; optionally caches each state's PNG, up to `cache_bytes`."""

    def __init__(self, level: Level, unit_px: int, cache: bool = True, cache_bytes: int = 1 << 20) -> None:
        if unit_px < 1:
            raise ValueError(f"unit_px must be >= 1, got {unit_px}")
        self.level = level
        self.unit_px = unit_px
        self.cache = cache
        self.cache_bytes = cache_bytes
        self.cached_bytes = 0
        self.side = frame_side(level.size, unit_px)
        self._static = static_layer(level, unit_px)
        self._static.setflags(write=False)
        self._frames: dict[State, bytes] = {}

    def pixels(self, state: State) -> np.ndarray:
        """Palette indices (side, side) of the frame of `state` = (agent, box)."""
        frame = self._static.copy()
        agent, box = state
        u, inset = self.unit_px, agent_inset(self.unit_px)
        for cell, colour in ((box, BOX_ON_TARGET if box == self.level.target else BOX), (agent, AGENT)):
            top, left = cell[0] * u, cell[1] * u
            frame[top + inset: top + u - inset, left + inset: left + u - inset] = colour
        return frame

    def render(self, state: State) -> bytes:
        """PNG bytes of the frame of `state` (from the cache when enabled)."""
        png = self._frames.get(state)
        if png is None:
            png = encode_png(self.pixels(state), PALETTE)
            if self.cache and self.cached_bytes + len(png) <= self.cache_bytes:
                self._frames[state] = png
                self.cached_bytes += len(png)
        return png


def rgb(indices: np.ndarray) -> np.ndarray:
    """The RGB image (height, width, 3) of palette indices."""
    lut = np.array([COLOURS[index] for index in range(len(COLOURS))], dtype=np.uint8)
    return lut[indices]
