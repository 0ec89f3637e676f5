"""One Gymnasium environment as an episode of the env service: `reset(seed=spec.seed)`, one env step
per readable action word, a PNG frame and a text per turn.

- reward: the env's reward of the step (0 for an unreadable action, which costs a move and does not
  reach the env);
- done when the env terminates (the task ended: `truncated` false, even on the budget's last move),
  when the env truncates (its own time limit) or when the budget is spent; `truncated` = done and not
  terminated (docs/environments.md);
- solved: terminated with a positive reward (FrozenLake's goal, MiniGrid's goal; a hole ends the
  episode unsolved);
- text: what the observation says in words (MiniGrid's mission, integer entries such as its
  direction, a Discrete observation's value; a string only when it changed since the last turn, so a
  mission is told once) and the moves left;
- state key: a digest of the task and of the env's state as rendered and observed.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image


def frame_size(height: int, width: int, longest: int) -> tuple[int, int]:
    """(width, height) of a frame whose longer side is `longest` px and whose sides are multiples of 16."""
    scale = longest / max(height, width)
    return (max(16, round(width * scale / 16) * 16), max(16, round(height * scale / 16) * 16))


def encode_frame(pixels: np.ndarray, longest: int) -> bytes:
    """An RGB render as a PNG of the served size (box-filtered when it shrinks)."""
    image = Image.fromarray(np.ascontiguousarray(pixels[..., :3]).astype(np.uint8), "RGB")
    size = frame_size(image.height, image.width, longest)
    if image.size != size:
        image = image.resize(size, Image.Resampling.BOX)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=False)
    return out.getvalue()


def observation_text(obs: Any, told: frozenset[str] = frozenset()) -> str:
    """The observation's words: strings as they are (those in `told` left out), integers as `name value.`;
    arrays are left to the frame."""
    if isinstance(obs, str):
        return "" if obs in told else obs.rstrip(".") + "."
    if isinstance(obs, (int, np.integer)):
        return f"Observation {int(obs)}."
    if isinstance(obs, dict):
        words = [observation_text(v) for v in obs.values() if isinstance(v, str) and v not in told]
        numbers = [f"{k} {int(v)}." for k, v in obs.items() if isinstance(v, (int, np.integer))]
        return " ".join(words + numbers)
    return ""


def _digest_obs(digest: Any, obs: Any) -> None:
    if isinstance(obs, dict):
        for key in sorted(obs):
            digest.update(str(key).encode())
            _digest_obs(digest, obs[key])
    elif isinstance(obs, np.ndarray):
        digest.update(obs.tobytes())
    else:
        digest.update(repr(obs).encode())


class GymEpisode:
    """An episode over one Gymnasium env (made for it, closed when the episode ends)."""

    def __init__(self, env: Any, seed: int, budget: int, words: tuple[str, ...],
                 parse: Callable[[str], str | None], frame_px: int, task: str) -> None:
        self.env, self.budget, self.words, self.parse, self.frame_px = env, budget, words, parse, frame_px
        self.task = task
        self.moves = 0
        self.done = self.truncated = self.terminated = self.invalid = self.stepped = False
        self.reward = 0.0
        self.solved = False
        self.static_info: tuple[tuple[str, Any], ...] = (("env_id", env.spec.id if env.spec else ""),)
        self.obs, _ = env.reset(seed=seed)
        self.said: frozenset[str] = frozenset()  # the strings the last observation told
        self._observe()

    def _observe(self) -> None:
        pixels = self.env.render()
        self._frame = encode_frame(pixels, self.frame_px)
        digest = hashlib.blake2b(self.task.encode(), digest_size=16)
        digest.update(np.ascontiguousarray(pixels).tobytes())
        _digest_obs(digest, self.obs)
        self._state_key = digest.hexdigest()

    def step(self, text: str) -> None:
        word = self.parse(text)
        self.moves += 1
        self.stepped, self.invalid, self.reward = True, word is None, 0.0
        self.said = frozenset(v for v in (self.obs.values() if isinstance(self.obs, dict) else [self.obs])
                              if isinstance(v, str))
        env_truncated = False
        if word is not None:
            self.obs, reward, terminated, env_truncated, _ = self.env.step(self.words.index(word))
            self.reward, self.terminated = float(reward), bool(terminated)
            self.solved = self.terminated and self.reward > 0
        self.done = self.terminated or bool(env_truncated) or self.moves >= self.budget
        self.truncated = self.done and not self.terminated
        self._observe()
        if self.done:
            self.env.close()

    def text(self) -> str:
        said = observation_text(self.obs, self.said)
        lead = "Invalid action. " if self.invalid else ""
        return f"{lead}{said + ' ' if said else ''}Moves left: {self.budget - self.moves}."

    def frame(self) -> bytes:
        return self._frame

    def state_key(self) -> str:
        return self._state_key

    def dynamic_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"solved": self.solved, "moves": self.moves}
        if self.stepped:
            info["invalid"] = self.invalid
        return info
