"""`mmrl env check` against real gRPC servers on loopback: the shipped maze env and the example pass
every check; each deliberately broken env fails the check it breaks, by name, and only that one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from mmrl.cli.main import main as mmrl
from mmrl.envcheck.runner import CHECK_NAMES, CheckResult, run_checks, table
from mmrl_proto.v1 import env_pb2_grpc
from services.common.grpc_server import start_server
from services.env import registry
from services.env.config import EnvConfig
from services.env.maze.env import MazeEnv
from services.env.servicer import SERVICE_NAME, EnvServicer
from tests.envcheck.broken_env import VARIANTS, EndsAtItsBudget, Servicer


@asynccontextmanager
async def serving(servicer: Any) -> AsyncIterator[str]:
    """`servicer` served with health and reflection on a free loopback port; yields its address."""
    running = await start_server(lambda s: env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, s),
                                 SERVICE_NAME, "127.0.0.1:0")
    try:
        yield f"127.0.0.1:{running.port}"
    finally:
        await running.stop(grace_s=0.5)


def _verdicts(results: list[CheckResult]) -> dict[str, bool]:
    return {r.name: r.passed for r in results}


SHIPPED: dict[str, Callable[[], Any]] = {
    **{name: (lambda name=name: EnvServicer(registry.create(name, EnvConfig()))) for name in registry.names()},
    "brighter-example": Servicer,
    "brighter-ending-at-its-budget": EndsAtItsBudget,  # the task ends by itself on the budget's last move
}


@pytest.mark.parametrize("env", sorted(SHIPPED))
async def test_a_shipped_env_passes_every_check(env: str) -> None:
    async with serving(SHIPPED[env]()) as address:
        results = await run_checks(address)
    assert [r.name for r in results] == CHECK_NAMES
    assert all(r.passed for r in results), table(results)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
async def test_a_broken_env_fails_the_check_it_breaks_and_passes_the_others(variant: str) -> None:
    servicer, broken_check = VARIANTS[variant]
    async with serving(servicer()) as address:
        results = await run_checks(address)
    failed = [r.name for r in results if not r.passed]
    assert failed == [broken_check], table(results)
    assert next(r for r in results if r.name == broken_check).detail


async def test_a_task_ending_by_itself_on_the_budgets_last_move_is_terminated_and_a_truncated_one_is_named() -> None:
    async with serving(EndsAtItsBudget()) as address:
        (result,) = await run_checks(address, only=["turn-limit"])
    assert result.passed and result.detail == "max_moves 3: done after 3 moves (terminated)"
    servicer, _ = VARIANTS["truncates-an-ended-task"]
    async with serving(servicer()) as address:
        (result,) = await run_checks(address, only=["turn-limit"])
    assert not result.passed and "the task ended by itself then" in result.detail


async def test_the_checks_report_the_maze_envs_figures() -> None:
    async with serving(EnvServicer(MazeEnv())) as address:
        results = {r.name: r for r in await run_checks(address)}
    assert "maze-easy-64 v2: 64 tasks; maze-hard-64 v2: 64 tasks" in results["eval-sets"].detail
    assert results["turn-limit"].detail == "max_moves 3: done after 3 moves (truncated)"
    assert "CreateEpisodes(10,000 specs) -> INVALID_ARGUMENT" in results["oversized-batch"].detail
    assert results["observations"].detail.endswith("sizes 80x80")


async def test_the_cli_prints_each_check_and_a_json_last_line_and_exits_1_on_a_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    servicer, broken_check = VARIANTS["noisy-frames"]
    async with serving(servicer()) as address:
        status = await asyncio.to_thread(mmrl, ["env", "check", address, "--json"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert status == 1
    report = json.loads(lines[-1])
    assert report["passed"] is False and report["failed"] == [broken_check]
    assert [c["name"] for c in report["checks"]] == CHECK_NAMES
    assert lines[-2] == f"{len(CHECK_NAMES) - 1} of {len(CHECK_NAMES)} checks passed; failed: {broken_check}"
    assert any(line.startswith(f"{broken_check} ") and " FAIL " in line for line in lines)


async def test_the_cli_runs_only_the_checks_named(capsys: pytest.CaptureFixture[str]) -> None:
    async with serving(Servicer()) as address:
        status = await asyncio.to_thread(mmrl, ["env", "check", address, "--only", "health",
                                                "--only", "turn-limit", "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status == 0 and [c["name"] for c in report["checks"]] == ["health", "turn-limit"]


def test_an_address_where_nothing_answers_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from services.common.procs import free_port

    status = mmrl(["env", "check", f"127.0.0.1:{free_port()}", "--timeout-s", "1"])
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert err.startswith("mmrl env check: no gRPC server answers at 127.0.0.1:") and "\n" not in err


def test_an_address_that_is_no_host_and_port_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert mmrl(["env", "check", "localhost"]) == 2
    assert "expected host:port" in capsys.readouterr().err
