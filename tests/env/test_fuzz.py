"""Property-based fuzzing: any action text parses without error; any step sequence keeps the invariants."""

from __future__ import annotations

import io

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from services.common.maze import Cell, generate_maze
from services.env.actions import ACTIONS, parse_action
from services.env.config import EnvConfig
from services.env.episode import Episode
from services.env.render import AGENT, MazeRenderer
from services.env.spec import EpisodeSettings, EpisodeSpec, parse_spec

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
    spec = EpisodeSpec(seed=seed, max_moves=max_moves, options={"size": size, "require_stop": require_stop})
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
