"""`mmrl env chance`: a uniform random policy on an eval set of a real env server on loopback, against
the same policy played on the Sokoban rules in this process."""

from __future__ import annotations

import asyncio
import functools
import json
import random

import pytest

from mmrl.cli.main import main as mmrl
from mmrl.envcheck.chance import chance_rate
from services.env import registry
from services.env.config import EnvConfig
from services.env.servicer import EnvServicer
from services.env.sokoban.evalset import get_eval_set
from services.env.sokoban.level import generate_level
from services.env.sokoban.solver import Solution, move
from tests.envcheck.test_env_check import serving

MOVES = ("up", "down", "left", "right")


@functools.cache
def _sokoban_chance_here(samples: int, seed: int) -> float:
    """The uniform random policy on sokoban-64 by the env's rules (solved on the target, ended by a stuck
    box or the move budget), without the service."""
    rng = random.Random(seed)
    solved = episodes = 0
    for spec in get_eval_set("sokoban-64").specs:
        level = generate_level(spec.seed, int(spec.options["size"]), int(spec.options["pulls"]))
        solution = Solution.of(level)
        for _ in range(samples):
            state, episodes = (level.agent, level.box), episodes + 1
            for _ in range(spec.max_moves):
                state, outcome = move(level, state, rng.choice(MOVES))
                if state[1] == level.target:
                    solved += 1
                    break
                if outcome == "push" and solution.moves_to_solve(state) is None:
                    break
    return solved / episodes


def _sokoban() -> EnvServicer:
    return EnvServicer(registry.create("sokoban", EnvConfig()))


async def test_the_sokoban_servers_chance_is_the_random_policys_rate_here() -> None:
    async with serving(_sokoban()) as address:
        result = await chance_rate(address, samples=32, seed=0)
        again = await chance_rate(address, samples=32, seed=0)
        one = await chance_rate(address, samples=1, seed=1)
    here = _sokoban_chance_here(samples=64, seed=1)
    assert (result.env, result.eval_set, result.tasks, result.samples) == ("sokoban", "sokoban-64", 64, 32)
    assert result.actions == MOVES
    # 2,048 episodes against 4,096: standard errors of about 0.006 and 0.004 at a rate near 0.08.
    assert abs(result.solve_rate - here) < 0.035, (result.solve_rate, here)
    assert 0 < result.solve_rate < result.pass_rate <= 1
    assert again == result  # one seed, one sequence of actions
    assert one.pass_rate == one.solve_rate  # one episode per task: solved tasks are solved episodes
    assert 0 < result.mean_turns <= 20


async def test_the_cli_prints_the_rate_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    async with serving(_sokoban()) as address:
        status = await asyncio.to_thread(mmrl, ["env", "chance", address, "--samples", "2", "--json"])
        unknown = await asyncio.to_thread(mmrl, ["env", "chance", address, "--eval-set", "nope"])
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    report = json.loads(lines[-1])
    assert status == 0 and report["samples"] == 2 and report["eval_set"] == "sokoban-64"
    assert lines[0].startswith("sokoban sokoban-64: a uniform random policy over up, down, left, right solves ")
    assert unknown == 2 and "unknown eval set 'nope'" in err


@pytest.mark.parametrize("argv, message", [
    (["localhost"], "expected host:port"),
    (["127.0.0.1:1", "--samples", "0"], "--samples 0: must be at least 1"),
])
def test_bad_arguments_are_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert mmrl(["env", "chance", *argv]) == 2
    assert message in capsys.readouterr().err


def test_an_address_where_nothing_answers_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from services.common.procs import free_port

    status = mmrl(["env", "chance", f"127.0.0.1:{free_port()}", "--timeout-s", "2"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.startswith("mmrl env chance: no gRPC server answers at 127.0.0.1:") and "\n" not in err


async def test_more_episodes_than_one_call_creates_are_played_in_batches() -> None:
    async with serving(_sokoban()) as address:
        batched = await chance_rate(address, samples=32, seed=0, max_batch=500)  # 2,048 episodes: 5 calls
    here = _sokoban_chance_here(samples=64, seed=1)
    assert batched.tasks == 64 and batched.samples == 32
    assert abs(batched.solve_rate - here) < 0.035, (batched.solve_rate, here)
