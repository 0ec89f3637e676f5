"""Checks of bad input: each is refused with the status code the contract names, and the server
keeps serving. Each takes the Context and returns a one-line detail, or raises CheckFailed."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mmrl.envcheck.probe import CHECK_SEED, CheckFailed, Context, expect_status, status_of
from mmrl_proto.v1 import env_pb2

OVERSIZED_BATCH = 10_000
UNKNOWN_OPTION = "mmrl-env-check-unknown-option"
INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND


async def unknown_episode(ctx: Context) -> str:
    """Step on an unknown or closed episode is NOT_FOUND; CloseEpisodes ignores unknown ids and
    counts the live ones it closed."""
    info, probe = await ctx.info(), ctx.probe
    said = [expect_status("Step(unknown id)", await status_of(
        probe.step([("mmrl-env-check-no-such-episode", info.actions[0])])), NOT_FOUND)]
    state = (await probe.create([await ctx.task()]))[0]
    closed = await probe.close([state.episode_id, "mmrl-env-check-no-such-episode"])
    if closed != 1:
        raise CheckFailed(f"CloseEpisodes of one live and one unknown episode answered num_closed={closed}, "
                          "expected 1")
    said.append(expect_status("Step(closed id)", await status_of(
        probe.step([(state.episode_id, info.actions[0])])), NOT_FOUND))
    again = await probe.close([state.episode_id])
    if again != 0:
        raise CheckFailed(f"closing a closed episode again answered num_closed={again}, expected 0")
    return "; ".join(said) + "; CloseEpisodes counts live episodes, ignores unknown ones"


async def bad_spec(ctx: Context) -> str:
    """Specs and requests no task can have are INVALID_ARGUMENT (negative max_moves, an unknown
    option, a negative count); an unknown eval set is NOT_FOUND."""
    task, probe = await ctx.task(), ctx.probe
    unknown = {**task.options, UNKNOWN_OPTION: "1"}
    cases = [  # (what, call, expected status), each call made only when its turn comes
        ("CreateEpisodes(max_moves=-1)", lambda: probe.create([env_pb2.EpisodeSpec(
            seed=task.seed, max_moves=-1, options=task.options)]), INVALID),
        ("CreateEpisodes(unknown option)", lambda: probe.create([env_pb2.EpisodeSpec(
            seed=task.seed, max_moves=task.max_moves, options=unknown)]), INVALID),
        ("GetTrainingTasks(count=-1)", lambda: probe.training_tasks(CHECK_SEED, -1), INVALID),
        ("GetTrainingTasks(max_moves=-1)", lambda: probe.training_tasks(CHECK_SEED, 1, max_moves=-1), INVALID),
        ("GetTrainingTasks(unknown option)", lambda: probe.training_tasks(CHECK_SEED, 1, options=unknown), INVALID),
        ("GetEvalSet(unknown name)", lambda: probe.eval_set("mmrl-env-check-no-such-set"), NOT_FOUND),
    ]
    return "; ".join([expect_status(what, await status_of(call()), code) for what, call, code in cases])


async def malformed_request(ctx: Context) -> str:
    """Bytes that are no request message are answered with an error status, and the server serves on."""
    method = ctx.probe.channel.unary_unary("/mmrl.v1.EnvService/CreateEpisodes")
    code = await status_of(method(b"\xff\xff\xff\xff\xff", timeout=ctx.probe.timeout_s))
    if code == grpc.StatusCode.OK:
        raise CheckFailed("CreateEpisodes answered OK to bytes that are no CreateEpisodesRequest")
    await _still_serving(ctx)
    return f"unparseable CreateEpisodes -> {code.name}; still serving"


async def oversized_batch(ctx: Context) -> str:
    """CreateEpisodes with 10,000 specs is refused (INVALID_ARGUMENT or RESOURCE_EXHAUSTED), and the
    server serves on."""
    task = await ctx.task()
    code = await status_of(ctx.probe.create([task] * OVERSIZED_BATCH))
    detail = expect_status(f"CreateEpisodes({OVERSIZED_BATCH:,} specs)", code,
                           INVALID, grpc.StatusCode.RESOURCE_EXHAUSTED)
    await _still_serving(ctx)
    return detail + "; still serving"


async def still_serving(ctx: Context) -> str:
    """After every other check: health SERVING and GetEnvInfo answers as at the start."""
    before = await ctx.info()
    await _still_serving(ctx)
    if await ctx.probe.info() != before:
        raise CheckFailed("GetEnvInfo answers differently than at the start")
    return "SERVING, GetEnvInfo unchanged"


async def _still_serving(ctx: Context) -> None:
    stub = health_pb2_grpc.HealthStub(ctx.probe.channel)
    try:
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=ctx.probe.timeout_s)
    except grpc.aio.AioRpcError as error:
        raise CheckFailed(f"the server stopped answering health checks ({error.code().name})") from None
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        raise CheckFailed("the server is no longer SERVING")
