"""Validating an episode spec (seed, max_moves, string options) into typed episode settings.

Options of the maze environment (all values are strings, as in the proto's map):
  size          grid side including the outer wall, odd, within the config's bounds (default "9")
  unit_px       pixels per grid unit of the frames (default "8": 80x80 px for size 9); the frame side
                (size + 1) * unit_px must not exceed the config's max_frame_px
  require_stop  "true"/"false" (also 1/0, yes/no): VisGym-compatible mode, where reaching the goal
                only counts when the agent then answers "stop" on it (default "false")
  start, goal   cell "row,col" (0-based cell coordinates, not grid units; default top-left and
                bottom-right cell)
  reward        "sparse" (default: 1.0 on the solving step), "progress" (plus the share of the way
                to the goal each move covers) or "paced" (progress less one move's share a turn;
                services/env/kit/reward.py)
Seeds and unknown options are checked as every environment does (services/env/kit/spec.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.common.messages import shown
from services.env.errors import invalid
from services.env.kit.grid import Cell
from services.env.kit.reward import RewardMode, reward_option
from services.env.kit.spec import SpecLike, check_options_and_seed, int_option
from services.env.maze.maze import num_cells_per_side, option_flag, parse_cell
from services.env.maze.render import frame_side

if TYPE_CHECKING:  # the env kit imports without pydantic: the tiny model's tokenizer reads env words
    from services.env.config import EnvConfig

OPTIONS = ("goal", "require_stop", "reward", "size", "start", "unit_px")


@dataclass(frozen=True)
class EpisodeSettings:
    """A validated spec: everything an episode needs, defaults filled in."""

    seed: int
    size: int
    max_moves: int
    unit_px: int
    require_stop: bool
    start: Cell
    goal: Cell
    reward: RewardMode = "sparse"

    @property
    def maze_key(self) -> tuple[int, int, Cell, Cell, int]:
        """What the maze and its frames depend on (the cache key)."""
        return (self.seed, self.size, self.start, self.goal, self.unit_px)


def cell_option(options: Mapping[str, str], name: str, default: Cell, n: int, where: str) -> Cell:
    """The cell option `name` ("row,col", within the n x n cells), or `default` if absent."""
    text = options.get(name)
    if text is None:
        return default
    try:
        return parse_cell(text, n)
    except ValueError as error:
        raise invalid(f"{where}.options.{name}", str(error)) from None


def parse_spec(spec: SpecLike, config: EnvConfig, where: str = "spec") -> EpisodeSettings:
    """Validates `spec`; raises EnvError(INVALID_ARGUMENT) naming the field, e.g. `specs[3].options.size`."""
    options = spec.options
    check_options_and_seed(spec, OPTIONS, where)

    size = int_option(options, "size", config.default_size, where)
    if size % 2 == 0:
        raise invalid(f"{where}.options.size", f"must be odd, got {size}")
    if not config.min_size <= size <= config.max_size:
        raise invalid(f"{where}.options.size", f"must be in [{config.min_size}, {config.max_size}], got {size}")

    if spec.max_moves < 0:
        raise invalid(f"{where}.max_moves", f"must be >= 0 (0: default), got {spec.max_moves}")
    if spec.max_moves > config.max_max_moves:
        raise invalid(f"{where}.max_moves", f"must be <= {config.max_max_moves}, got {spec.max_moves}")
    max_moves = spec.max_moves or config.max_moves_for(size)

    unit_px = int_option(options, "unit_px", config.default_unit_px, where)
    if not 1 <= unit_px <= config.max_unit_px:
        raise invalid(f"{where}.options.unit_px", f"must be in [1, {config.max_unit_px}], got {unit_px}")
    side = frame_side(size, unit_px)
    if side > config.max_frame_px:
        raise invalid(f"{where}.options.unit_px", f"size {size} at unit_px {unit_px} makes {side}x{side} px frames, "
                                                  f"more than max_frame_px={config.max_frame_px}")

    require_stop_text = options.get("require_stop", "false")
    require_stop = option_flag(require_stop_text)
    if require_stop is None:
        raise invalid(f"{where}.options.require_stop",
                      f"must be true or false, got {shown(require_stop_text.strip().lower())}")

    n = num_cells_per_side(size)
    start = cell_option(options, "start", (0, 0), n, where)
    goal = cell_option(options, "goal", (n - 1, n - 1), n, where)
    if start == goal:
        raise invalid(f"{where}.options.goal", f"must differ from start, both are {start}")
    return EpisodeSettings(
        seed=spec.seed, size=size, max_moves=max_moves, unit_px=unit_px,
        require_stop=require_stop, start=start, goal=goal, reward=reward_option(options, where),
    )
