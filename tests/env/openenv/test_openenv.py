"""OpenEnv both ways, against openenv-core's own server and client: the maze served as an OpenEnv
environment plays with openenv-core's client; OpenEnv servers (the maze's, and a text-only one written
with openenv-core) played through EnvService pass every check of `mmrl env check`."""

from __future__ import annotations

import base64
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("openenv.core")

from openenv.core.env_server.http_server import create_fastapi_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402
from openenv.core.generic_client import GenericEnvClient  # noqa: E402
from pydantic import Field  # noqa: E402

from mmrl.envcheck.runner import CHECK_NAMES, run_checks, table  # noqa: E402
from services.common.procs import free_port  # noqa: E402
from services.common.task import TaskSpec  # noqa: E402
from services.env.config import EnvConfig  # noqa: E402
from services.env.maze.env import MazeEnv  # noqa: E402
from services.env.openenv.played import OpenEnvEnv, OpenEnvSource  # noqa: E402
from services.env.openenv.served import create_app  # noqa: E402
from services.env.servicer import EnvServicer  # noqa: E402
from tests.envcheck.test_env_check import serving  # noqa: E402


@contextmanager
def uvicorn_serving(app: Any) -> Iterator[str]:
    """`app` served by uvicorn in a thread on a free loopback port; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the OpenEnv server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def maze_openenv() -> Iterator[str]:
    with uvicorn_serving(create_app(lambda: MazeEnv(EnvConfig()))) as url:
        yield url


def test_the_maze_served_as_openenv_plays_to_the_goal_with_openenv_cores_client(maze_openenv: str) -> None:
    with GenericEnvClient(base_url=maze_openenv) as client:
        result = client.reset(seed=1_000_000)
        first = result.observation
        assert "Moves left: 20." in first["text"] and not result.done
        assert base64.b64decode(first["images"][0]).startswith(b"\x89PNG")
        rewards = []
        while not result.done:
            result = client.step({"message": result.observation["info"]["optimal_action"]})
            rewards.append(result.reward)
        assert result.observation["info"]["solved"] and not result.observation["truncated"] and sum(rewards) == 1.0
        again = client.reset(seed=1_000_000)  # a seed is a task: the same first frame
        assert again.observation["images"] == first["images"]


def test_the_maze_played_back_through_envservice_from_openenv_passes_every_check(maze_openenv: str) -> None:
    import asyncio

    source = OpenEnvSource(maze_openenv, "openenv", ("up", "down", "left", "right", "stop"))

    async def check() -> list[Any]:
        async with serving(EnvServicer(OpenEnvEnv(source))) as address:
            return await run_checks(address, timeout_s=30)

    results = asyncio.run(check())
    assert [r.name for r in results] == CHECK_NAMES
    assert all(r.passed for r in results), table(results)


class GuessAction(Action):
    message: str = Field(..., description="a number")


class GuessObservation(Observation):
    prompt: str = ""


class Guess(Environment):  # type: ignore[misc]
    """Text only: guess a number from 1 to 8 drawn from the seed; told higher or lower, 1.0 when right."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.target, self._state = 0, State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self.target, self._state = random.Random(seed).randint(1, 8), State(step_count=0)
        return GuessObservation(prompt="Guess a number from 1 to 8.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        guess = int(action.message) if action.message.strip().isdigit() else 0
        if guess == self.target:
            return GuessObservation(prompt="Right.", done=True, reward=1.0)
        return GuessObservation(prompt="Higher." if guess < self.target else "Lower.", reward=0.0)

    @property
    def state(self) -> State:
        return self._state


def test_a_text_only_openenv_environment_passes_every_check_through_envservice() -> None:
    import asyncio

    app = create_fastapi_app(Guess, GuessAction, GuessObservation, max_concurrent_envs=256)
    with uvicorn_serving(app) as url:
        source = OpenEnvSource(url, "guess", tuple(str(n) for n in range(1, 9)), max_moves=6)
        env = OpenEnvEnv(source)

        async def check() -> list[Any]:
            async with serving(EnvServicer(env)) as address:
                return await run_checks(address, timeout_s=30)

        results = asyncio.run(check())
        (state,) = env.create([TaskSpec(5)])
        assert state.frame_png == b"" and state.text == "Guess a number from 1 to 8."
        env.close([state.episode_id])
    assert all(r.passed for r in results), table(results)
    observations = next(r for r in results if r.name == "observations")
    assert "(0 images:" in observations.detail


def test_serving_openenv_without_action_words_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from mmrl.cli.main import main as mmrl

    assert mmrl(["serve", "env", "--openenv", "http://127.0.0.1:9", "--port", "0"]) == 2
    assert "--action-words" in capsys.readouterr().err



def test_mmrl_serve_openenv_serves_sokoban_to_openenv_cores_client(tmp_path: Any) -> None:
    import subprocess
    import sys

    from services.common.procs import stop_process

    port = free_port()
    with open(tmp_path / "server.log", "wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "mmrl.cli.main", "serve", "openenv", "--env", "sokoban",
                                   "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with GenericEnvClient(base_url=f"http://127.0.0.1:{port}") as client:
                    result = client.reset(seed=7)
                    moved = client.step({"message": result.observation["info"]["optimal_action"]})
                break
            except ConnectionError:
                assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
                time.sleep(0.5)
    finally:
        stop_process(server)
    assert result.observation["images"] and moved.observation["info"]["moves"] == 1
