"""Deterministic top-down frames of a maze as small palette PNGs.

Geometry. Grid unit (i, j) is the pixel square [i*u, (i+1)*u) x [j*u, (j+1)*u) with u = unit_px, from
the top-left corner with no offset. The grid (odd side) is padded at the bottom and right with one
unit of padding colour to an even number of units, so the image side is (size + 1) * u; for the easy
9x9 grid at u = 8 that is 80x80 px. Every 2u x 2u pixel block (r*2u.., c*2u..) then holds exactly
grid units (2r, 2c), (2r, 2c+1), (2r+1, 2c), (2r+1, 2c+1): cell (r, c) with its north and west walls
and the corner between them. With a vision encoder of patch u and 2x2 merge (patch 8 / merge 2 for
u = 8) each merged image token sees one cell; the 9x9 grid gives 5x5 = 25 tokens.

Colours: wall, floor, goal (the whole goal unit), agent (a square inset by max(1, u // 8) px so that
the cell colour under it, floor or goal, stays visible as a frame: the agent standing on the goal is
visible; for u < 3 there is no inset and the agent fills its unit), padding. Frames are palette PNGs
written directly (8-bit indices, filter 0, zlib level 1): the same state gives byte-identical PNG
bytes for a given zlib build, and identical pixels everywhere.

Speed: the static layer (walls, floor, goal) is built once per maze; a frame copies it, draws the
agent and encodes. A renderer can cache each frame by agent cell (the frame depends on nothing else).
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from services.env.kit.grid import Cell
from services.env.maze.maze import Maze

# Palette indices and their RGB colours.
FLOOR, WALL, GOAL, AGENT, PADDING = range(5)
COLOURS: dict[int, tuple[int, int, int]] = {
    FLOOR: (235, 235, 235),
    WALL: (40, 40, 40),
    GOAL: (40, 170, 70),
    AGENT: (220, 50, 50),
    PADDING: (130, 130, 130),
}
ZLIB_LEVEL = 1
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def frame_side(size: int, unit_px: int) -> int:
    """Image side in pixels for a grid of side `size` (odd) at `unit_px` pixels per grid unit."""
    return (size + size % 2) * unit_px


def agent_inset(unit_px: int) -> int:
    """Pixels of the cell colour left visible around the agent square."""
    return max(1, unit_px // 8) if unit_px >= 3 else 0


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def palette_bytes(colours: dict[int, tuple[int, int, int]]) -> bytes:
    """The PLTE chunk data of `colours` (indices 0..len-1)."""
    return b"".join(bytes(colours[index]) for index in range(len(colours)))


_PLTE = palette_bytes(COLOURS)


def encode_png(indices: np.ndarray, palette: bytes | None = None) -> bytes:
    """An 8-bit palette PNG of a (height, width) uint8 index array, with `palette` (`palette_bytes`;
    default: the maze's colours)."""
    height, width = indices.shape
    raw = np.zeros((height, width + 1), dtype=np.uint8)  # column 0: filter type 0 (None) per row
    raw[:, 1:] = indices
    header = struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0)
    return b"".join((
        _PNG_SIGNATURE,
        _chunk(b"IHDR", header),
        _chunk(b"PLTE", _PLTE if palette is None else palette),
        _chunk(b"IDAT", zlib.compress(raw.tobytes(), ZLIB_LEVEL)),
        _chunk(b"IEND", b""),
    ))


def static_layer(maze: Maze, unit_px: int) -> np.ndarray:
    """Palette indices of the frame without the agent: walls, floor, goal and padding."""
    side = frame_side(maze.size, unit_px)
    units = np.full((side // unit_px, side // unit_px), PADDING, dtype=np.uint8)
    units[: maze.size, : maze.size] = np.where(maze.walls, WALL, FLOOR)
    units[2 * maze.goal[0] + 1, 2 * maze.goal[1] + 1] = GOAL
    return np.repeat(np.repeat(units, unit_px, axis=0), unit_px, axis=1)


class MazeRenderer:
    """Renders one maze at one unit size; optionally caches the PNG of each agent cell, up to
    `cache_bytes` of PNG per maze (later frames are encoded each time: all 625 frames of a 988 px
    maze would keep 17 MB)."""

    def __init__(self, maze: Maze, unit_px: int, cache: bool = True, cache_bytes: int = 1 << 20) -> None:
        if unit_px < 1:
            raise ValueError(f"unit_px must be >= 1, got {unit_px}")
        self.maze = maze
        self.unit_px = unit_px
        self.cache = cache
        self.cache_bytes = cache_bytes
        self.cached_bytes = 0
        self.side = frame_side(maze.size, unit_px)
        self._static = static_layer(maze, unit_px)
        self._static.setflags(write=False)
        self._frames: dict[Cell, bytes] = {}

    def pixels(self, agent: Cell) -> np.ndarray:
        """Palette indices (side, side) of the frame with the agent on cell `agent`."""
        frame = self._static.copy()
        u, inset = self.unit_px, agent_inset(self.unit_px)
        top, left = (2 * agent[0] + 1) * u, (2 * agent[1] + 1) * u
        frame[top + inset: top + u - inset, left + inset: left + u - inset] = AGENT
        return frame

    def render(self, agent: Cell) -> bytes:
        """PNG bytes of the frame with the agent on cell `agent` (from the cache when enabled)."""
        png = self._frames.get(agent)
        if png is None:
            png = encode_png(self.pixels(agent))
            if self.cache and self.cached_bytes + len(png) <= self.cache_bytes:
                self._frames[agent] = png
                self.cached_bytes += len(png)
        return png


def rgb(indices: np.ndarray) -> np.ndarray:
    """The RGB image (height, width, 3) of palette indices, e.g. for upscaled copies or checks."""
    lut = np.array([COLOURS[index] for index in range(len(COLOURS))], dtype=np.uint8)
    return lut[indices]
