"""Runs the contract's checks in order against one env server, each bounded in time, and reports
each by name: passed or not, and a one-line detail. A check that fails does not stop the others."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

import grpc

from mmrl.envcheck import checks_episodes, checks_errors, checks_service
from mmrl.envcheck.probe import CheckFailed, Context, EnvProbe

CheckFn = Callable[[Context], Awaitable[str]]

# (name, check), in the order they run: what the server offers, then episodes, then bad input.
CHECKS: list[tuple[str, CheckFn]] = [
    ("health", checks_service.serving),
    ("reflection", checks_service.reflection),
    ("env-info", checks_service.env_info),
    ("eval-sets", checks_service.eval_sets),
    ("training-tasks", checks_service.training_tasks),
    ("training-not-eval", checks_service.training_not_eval),
    ("observations", checks_episodes.observations),
    ("determinism", checks_episodes.determinism),
    ("bad-actions", checks_episodes.bad_actions),
    ("turn-limit", checks_episodes.turn_limit),
    ("state-keys", checks_episodes.state_keys),
    ("oracle", checks_episodes.oracle),
    ("concurrency", checks_episodes.concurrency),
    ("unknown-episode", checks_errors.unknown_episode),
    ("bad-spec", checks_errors.bad_spec),
    ("malformed-request", checks_errors.malformed_request),
    ("oversized-batch", checks_errors.oversized_batch),
    ("still-serving", checks_errors.still_serving),
]
CHECK_NAMES = [name for name, _ in CHECKS]
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "seconds": round(self.seconds, 3)}


class Unreachable(ConnectionError):
    """No gRPC server answered at the address."""


async def wait_reachable(address: str, timeout_s: float) -> None:
    """Returns once a connection to `address` is up; Unreachable after `timeout_s`."""
    probe = EnvProbe(address, timeout_s)
    try:
        await asyncio.wait_for(probe.channel.channel_ready(), timeout_s)
    except TimeoutError:
        raise Unreachable(f"no gRPC server answers at {address} (waited {timeout_s:g} s)") from None
    finally:
        await probe.channel.close()


async def run_one(ctx: Context, name: str, check: CheckFn, timeout_s: float) -> CheckResult:
    started = time.perf_counter()
    try:
        detail = await asyncio.wait_for(check(ctx), timeout_s)
        passed = True
    except CheckFailed as failure:
        passed, detail = False, str(failure)
    except grpc.aio.AioRpcError as error:
        passed, detail = False, f"a call failed unexpectedly: {error.code().name}: {error.details() or ''}"
    except TimeoutError:
        passed, detail = False, f"no result within {timeout_s:g} s"
    try:  # the check's episodes, finished or not
        await asyncio.wait_for(ctx.probe.close_all(), timeout_s)
    except (grpc.aio.AioRpcError, TimeoutError, CheckFailed) as error:
        if passed:
            passed, detail = False, f"closing its episodes failed: {error}"
    return CheckResult(name, passed, " ".join(detail.split()), time.perf_counter() - started)


async def run_checks(address: str, timeout_s: float = 5.0, only: list[str] | None = None,
                     on_result: Callable[[CheckResult], None] | None = None) -> list[CheckResult]:
    """Every check (or those named in `only`, in the standard order) against the server at `address`;
    each call and each check gets `timeout_s`. `on_result` sees each result as it comes."""
    await wait_reachable(address, min(timeout_s, CONNECT_TIMEOUT_S))
    ctx = Context(EnvProbe(address, timeout_s))
    results = []
    try:
        for name, check in CHECKS:
            if only and name not in only:
                continue
            result = await run_one(ctx, name, check, timeout_s)
            results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        await ctx.probe.channel.close()
    return results


def table(results: list[CheckResult]) -> str:
    """The results as aligned text: name, PASS/FAIL, seconds, detail."""
    width = max((len(r.name) for r in results), default=0)
    return "\n".join(row(r, width) for r in results)


NAME_WIDTH = max(len(name) for name in CHECK_NAMES)


def row(result: CheckResult, width: int = NAME_WIDTH) -> str:
    verdict = "PASS" if result.passed else "FAIL"
    return f"{result.name:<{width}}  {verdict}  {result.seconds:6.2f}s  {result.detail}"
