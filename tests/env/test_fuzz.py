"""Property-based fuzzing: any action text parses without error; any step sequence keeps the invariants."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from services.common.task import TaskSpec
from services.env.config import EnvConfig
from services.env.kit.actions import WORDS as ACTIONS
from services.env.kit.actions import answer_span, parse_action
from services.env.kit.grid import Cell
from services.env.maze.episode import Episode
from services.env.maze.maze import generate_maze
from services.env.maze.render import AGENT, MazeRenderer
from services.env.maze.spec import EpisodeSettings, parse_spec

WORDS = st.sampled_from([*ACTIONS, "north", "UP", "Left.", "<answer>", "</answer>", "<think>", "</think>",
                         "go", "not", "xyz", " ", "\n", "🙂"])
ACTION_TEXT = st.one_of(st.text(max_size=200), st.lists(WORDS, max_size=12).map("".join),
                        st.lists(WORDS, max_size=12).map(" ".join))


def _fresh_frame(settings_: EpisodeSettings, position: Cell) -> bytes:
    """The frame of `position` from a maze generated and rendered anew, after checking that its
    pixels show the agent there."""
    maze = generate_maze(settings_.seed, settings_.size, settings_.start, settings_.goal)
    png = MazeRenderer(maze, settings_.unit_px, cache=False).render(position)
    pixels = np.asarray(Image.open(io.BytesIO(png)))
    u = settings_.unit_px
    assert pixels[(2 * position[0] + 1) * u + u // 2, (2 * position[1] + 1) * u + u // 2] == AGENT
    return png


@given(ACTION_TEXT)
@settings(max_examples=400, deadline=None)
def test_any_action_text_parses_to_an_action_or_none(text: str) -> None:
    assert parse_action(text) in (*ACTIONS, None)


THINK_TEXT = st.lists(st.sampled_from(["<think>", "</think>", "<THINK>", "</Think>", "up", "left", " ", "x"]),
                      max_size=30).map("".join)


@given(THINK_TEXT)
@settings(max_examples=400, deadline=None)
def test_think_blocks_are_dropped_as_one_pass_over_the_whole_text_would(text: str) -> None:
    """answer_span strips <think> blocks only up to the last </think> (linear time); the result is
    the same as stripping them from the whole text."""
    assert answer_span(text) == answer_span_reference(text)


def answer_span_reference(text: str) -> str:
    import re

    stripped = re.sub(r"<think>.*?</think>", " ", text, flags=re.IGNORECASE | re.DOTALL)
    return answer_span(stripped) if "<answer>" in stripped.lower() else stripped


def test_think_openings_after_the_last_close_are_never_searched(monkeypatch: pytest.MonkeyPatch) -> None:
    """`"<think>" * 1170` made the block search quadratic (8 s for one 256-action Step)."""
    from services.env.kit import actions

    searched: list[int] = []

    class Recording:
        def sub(self, repl: str, text: str) -> str:
            searched.append(len(text))
            return THINK.sub(repl, text)

    THINK = actions._THINK
    monkeypatch.setattr(actions, "_THINK", Recording())
    assert parse_action("<think>go left</think> up" + "<think>" * 1170) == "up"
    assert searched == [len("<think>go left</think>")]
    assert parse_action("<think>" * 1170 + "down") == "down" and searched == [len("<think>go left</think>")]


@given(
    seed=st.integers(0, 10**6),
    size=st.sampled_from(["5", "9", "11", "13"]),
    max_moves=st.integers(0, 40),
    require_stop=st.sampled_from(["true", "false"]),
    texts=st.lists(ACTION_TEXT, max_size=45),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_step_sequence_keeps_the_episode_invariants(
    seed: int, size: str, max_moves: int, require_stop: str, texts: list[str]
) -> None:
    spec = TaskSpec(seed=seed, max_moves=max_moves, options={"size": size, "require_stop": require_stop})
    config = EnvConfig()
    settings_ = parse_spec(spec, config)
    maze = generate_maze(settings_.seed, settings_.size, settings_.start, settings_.goal)
    renderer = MazeRenderer(maze, settings_.unit_px, cache=False)
    episode = Episode(settings_, maze, renderer)
    n = maze.num_cells_per_side
    for text in texts:
        if episode.done:
            break
        before = episode.position
        episode.step(text)
        info = episode.info()
        assert 0 <= episode.position[0] < n and 0 <= episode.position[1] < n
        assert abs(episode.position[0] - before[0]) + abs(episode.position[1] - before[1]) <= 1
        assert 1 <= episode.moves <= settings_.max_moves
        assert episode.reward == (1.0 if episode.solved else 0.0)
        assert not episode.solved or (episode.done and episode.position == maze.goal)
        assert episode.done or episode.moves < settings_.max_moves
        assert info["moves_to_goal"] == maze.distance[episode.position] >= 0
        assert info["invalid"] == (info["last_action"] == "")
        assert not (info["invalid"] and info["wall_bump"])
        assert episode.text() and episode.frame() == _fresh_frame(settings_, episode.position)
        if not episode.done:
            assert episode.text().endswith(f"Moves left: {settings_.max_moves - episode.moves}.")
