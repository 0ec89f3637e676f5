"""One Sokoban episode as a state machine: text action in, frame + text + reward + done + info out.

Rules:
- Actions are up, down, left, right, read by the maze's tolerant parser (services/env/kit/actions.py);
  "stop" and text without a direction are invalid actions. Every step costs one move.
- A move into a wall or the room's edge, or a push of the box into one, is a bump ("You hit a
  wall."): nothing moves. An invalid action changes nothing either ("Invalid action.").
- The episode ends solved, reward 1.0, when a push puts the box on the target (within the budget).
- It ends unsolved (terminated, not truncated; reward 0.0) when a push leaves the box where it can
  never reach the target (the oracle's BFS finds no way: a corner, or along a wall without the
  target): "The box is stuck." Playing on could never solve it.
- Spending the last move ends it unsolved and truncated ("No moves left.").
- Reward: 1.0 on the solving push, 0.0 otherwise; with the `reward: progress` option every move also
  earns the share of the way to the solution it covered (a stuck box: -1 in all; kit/reward.py).

Observation texts reuse the maze's phrasing where they mean the same ("You hit a wall.",
"Invalid action.", "Moves left: N.", "No moves left."); the agent's own text is never echoed back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.env.kit.actions import parse_action
from services.env.kit.reward import RewardMode, shaping
from services.env.sokoban.level import Level
from services.env.sokoban.render import SokobanRenderer
from services.env.sokoban.solver import Solution, State, move

TASK = "Push the box onto the target. Reply with up, down, left or right."
WALL_BUMP = "You hit a wall."
INVALID = "Invalid action."
SOLVED = "The box is on the target."
STUCK = "The box is stuck."
OUT_OF_MOVES = "No moves left."


@dataclass(frozen=True)
class Task:
    """A level with its oracle and renderer, shared by every episode playing it."""

    level: Level
    solution: Solution
    renderer: SokobanRenderer


class SokobanEpisode:
    """The state of one episode. Not thread-safe; the store serialises access."""

    def __init__(self, task: Task, max_moves: int, reward: RewardMode = "sparse") -> None:
        self.task = task
        self.reward_mode = reward
        self.level = task.level
        self.max_moves = max_moves
        self.state: State = (self.level.agent, self.level.box)
        self.moves = 0
        self.done = False
        self.truncated = False
        self.solved = False
        self.stuck = False
        self.reward = 0.0
        self.feedback = ""
        self.last_action = ""
        self.invalid = False
        self.wall_bump = False
        self.pushed = False
        self.static_info: tuple[tuple[str, Any], ...] = (
            ("optimal_moves", task.solution.optimal_moves),
            ("max_moves", max_moves),
            ("seed", self.level.seed),
            ("size", self.level.size),
            ("target", self.level.target),
        )

    def step(self, text: str) -> None:
        """Applies one action text; see the module docstring for the rules."""
        if self.done:
            raise RuntimeError("episode is done")
        action = parse_action(text)
        if action == "stop":
            action = None
        before = self.task.solution.moves_to_solve(self.state)
        assert before is not None, "a running episode's box can still reach the target"
        self.moves += 1
        self.last_action = action or ""
        self.invalid = action is None
        self.wall_bump = self.pushed = False
        self.feedback = ""
        if action is None:
            self.feedback = INVALID
        else:
            self.state, outcome = move(self.level, self.state, action)
            self.wall_bump = outcome == "bump"
            self.pushed = outcome == "push"
            if self.wall_bump:
                self.feedback = WALL_BUMP
            elif self.state[1] == self.level.target:
                self.done = self.solved = True
                self.feedback = SOLVED
            elif self.pushed and self.task.solution.moves_to_solve(self.state) is None:
                self.done = self.stuck = True
                self.feedback = STUCK
        self.reward = 1.0 if self.solved else 0.0
        if self.reward_mode != "sparse":
            after = 0 if self.solved else self.task.solution.moves_to_solve(self.state)
            self.reward += shaping(self.reward_mode, before, after, self.task.solution.optimal_moves)
        if self.moves >= self.max_moves and not self.done:
            self.done = self.truncated = True
            self.feedback = f"{self.feedback} {OUT_OF_MOVES}".lstrip()

    def text(self) -> str:
        """The observation text: task (first turn only), feedback, and the moves left while running."""
        parts = []
        if self.moves == 0:
            parts.append(TASK)
        if self.feedback:
            parts.append(self.feedback)
        if not self.done:
            parts.append(f"Moves left: {self.max_moves - self.moves}.")
        return " ".join(parts)

    def state_key(self) -> str:
        """The state this observation shows: the level (seed, size, pulls), agent and box cells."""
        (agent, box), level = self.state, self.level
        return f"sokoban/{level.seed}/{level.size}/{level.pulls}/{agent[0]},{agent[1]}/{box[0]},{box[1]}"

    def frame(self) -> bytes:
        """PNG bytes of the current frame."""
        return self.task.renderer.render(self.state)

    def dynamic_info(self) -> dict[str, Any]:
        """The info fields that change with each step."""
        to_solve = self.task.solution.moves_to_solve(self.state)
        return {
            "solved": self.solved,
            "stuck": self.stuck,
            "moves": self.moves,
            "feedback": self.feedback,
            "last_action": self.last_action,
            "invalid": self.invalid,
            "wall_bump": self.wall_bump,
            "pushed": self.pushed,
            "position": self.state[0],
            "box": self.state[1],
            "moves_to_solve": -1 if to_solve is None else to_solve,
            # The BFS oracle's next move ("" when solved or stuck): the expert for SFT data.
            "optimal_action": self.task.solution.optimal_action(self.state) or "",
        }
