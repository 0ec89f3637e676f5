"""One maze episode as a state machine: text action in, frame + text + reward + done + info out.

Rules (docs/env.md, "Semantics"; docs/architecture.md, "Environments"):
- Every step costs one move: a move, a wall bump, an unparseable action and "stop" alike.
- A wall bump or an invalid action leaves the agent (and so the frame) unchanged, with feedback.
- Default mode: the episode ends solved, reward 1.0, when a move reaches the goal. With
  `require_stop` (VisGym-compatible) reaching the goal is not enough: "stop" on the goal solves it.
- "stop" anywhere else ends the episode unsolved; so does spending the last move. Reward is 1.0
  only on the solving step, 0.0 on every other step; with the `reward: progress` option every move
  also earns the share of the way to the goal it covered (services/env/kit/reward.py).

Observation texts use a small fixed vocabulary (a tiny tokenizer is trained on them); the agent's
own text is never echoed back.
"""

from __future__ import annotations

from typing import Any

from services.env.kit.actions import parse_action
from services.env.kit.grid import STOP, Cell
from services.env.kit.reward import shaping
from services.env.maze.maze import Maze, optimal_action
from services.env.maze.render import MazeRenderer
from services.env.maze.spec import EpisodeSettings

TASK = "Reach the goal. Reply with up, down, left, right or stop."
TASK_REQUIRE_STOP = "Reach the goal, then stop on it. Reply with up, down, left, right or stop."
WALL_BUMP = "You hit a wall."
INVALID = "Invalid action."
SOLVED = "You reached the goal."
ON_GOAL = "You are on the goal."  # require_stop mode, goal reached, waiting for "stop"
STOPPED_EARLY = "You stopped before the goal."
OUT_OF_MOVES = "No moves left."


class EpisodeFinishedError(RuntimeError):
    """Step on an episode that is already done."""


class Episode:
    """The state of one episode. Not thread-safe; the store serialises access."""

    def __init__(self, settings: EpisodeSettings, maze: Maze, renderer: MazeRenderer) -> None:
        assert renderer.maze is maze and (maze.start, maze.goal) == (settings.start, settings.goal)
        self.settings = settings
        self.maze = maze
        self.renderer = renderer
        self.position: Cell = maze.start
        self.moves = 0
        self.done = False
        self.truncated = False  # done because the move budget ran out
        self.solved = False
        self.reward = 0.0
        self.feedback = ""
        self.last_action = ""
        self.invalid = False
        self.wall_bump = False
        # Info fields fixed for the whole episode, hashable so that serialised forms can be cached.
        self.static_info: tuple[tuple[str, Any], ...] = (
            ("optimal_moves", maze.optimal_moves),
            ("max_moves", settings.max_moves),
            ("seed", settings.seed),
            ("size", settings.size),
            ("require_stop", settings.require_stop),
            ("goal", maze.goal),
        )

    @property
    def moves_left(self) -> int:
        return self.settings.max_moves - self.moves

    def step(self, text: str) -> None:
        """Applies one action text; see the module docstring for the rules."""
        if self.done:
            raise EpisodeFinishedError("episode is done")
        action = parse_action(text)
        before = int(self.maze.distance[self.position])
        self.moves += 1
        self.last_action = action or ""
        self.invalid = action is None
        self.wall_bump = False
        self.reward = 0.0
        self.feedback = ""
        if action is None:
            self.feedback = INVALID
        elif action == STOP:
            self.done = True
            self.solved = self.position == self.maze.goal
            self.feedback = SOLVED if self.solved else STOPPED_EARLY
        else:
            nxt = self.maze.neighbour(self.position, action)
            if nxt is None:
                self.wall_bump = True
                self.feedback = WALL_BUMP
            else:
                self.position = nxt
                if nxt == self.maze.goal:
                    if self.settings.require_stop:
                        self.feedback = ON_GOAL
                    else:
                        self.done = self.solved = True
                        self.feedback = SOLVED
        if self.solved:
            self.reward = 1.0
        self.reward += shaping(self.settings.reward, before, int(self.maze.distance[self.position]),
                               self.maze.optimal_moves)
        if not self.solved and self.moves >= self.settings.max_moves and not self.done:
            self.done = self.truncated = True
            self.feedback = f"{self.feedback} {OUT_OF_MOVES}".lstrip()

    def text(self) -> str:
        """The observation text: task (first turn only), feedback, and the moves left while running."""
        parts = []
        if self.moves == 0:
            parts.append(TASK_REQUIRE_STOP if self.settings.require_stop else TASK)
        if self.feedback:
            parts.append(self.feedback)
        if not self.done:
            parts.append(f"Moves left: {self.moves_left}.")
        return " ".join(parts)

    def state_key(self) -> str:
        """The state this observation shows: the maze (seed, size, start, goal) and the agent's cell."""
        s = self.settings
        return f"{s.seed}/{s.size}/{s.start[0]},{s.start[1]}/{s.goal[0]},{s.goal[1]}/{self.position[0]},{self.position[1]}"

    def frame(self) -> bytes:
        """PNG bytes of the current frame."""
        return self.renderer.render(self.position)

    def dynamic_info(self) -> dict[str, Any]:
        """The info fields that change with each step."""
        return {
            "solved": self.solved,
            "moves": self.moves,
            "feedback": self.feedback,
            "last_action": self.last_action,
            "invalid": self.invalid,
            "wall_bump": self.wall_bump,
            "position": self.position,
            "moves_to_goal": int(self.maze.distance[self.position]),
            # The BFS oracle's next move from here ("stop" on the goal): the expert for SFT data.
            "optimal_action": optimal_action(self.maze, self.position),
        }

    def info(self) -> dict[str, Any]:
        """The whole info map (cells as (row, col) tuples; lists once in a proto Struct)."""
        return {**self.dynamic_info(), **dict(self.static_info)}
