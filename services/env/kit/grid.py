"""Cells of a square grid and the four moves between them, shared by grid environments."""

from __future__ import annotations

from typing import Final, Literal

Cell = tuple[int, int]
Direction = Literal["up", "down", "left", "right"]

# Move name -> (d_row, d_col), in the order used for tie-breaking and for listing neighbours.
DIRECTIONS: dict[Direction, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
STOP: Final = "stop"


def step_cell(cell: Cell, direction: str) -> Cell:
    """The cell one move from `cell` in `direction` (no bounds or walls checked)."""
    d_row, d_col = DIRECTIONS[direction]  # type: ignore[index]
    return (cell[0] + d_row, cell[1] + d_col)
