"""The EnvService over a real grpc.aio server on port 0: results, every error code, health, reflection."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from PIL import Image

from mmrl_proto.v1 import env_pb2, env_pb2_grpc
from services.common.grpc_server import RunningServer, channel, start_server
from services.env.config import EnvConfig
from services.env.maze.env import MazeEnv
from services.env.maze.evalset import RECIPES, get_eval_set
from services.env.maze.maze import generate_maze, solve
from services.env.maze.render import MazeRenderer
from services.env.servicer import SERVICE_NAME, EnvServicer


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Service:
    stub: env_pb2_grpc.EnvServiceStub
    channel: grpc.aio.Channel
    clock: FakeClock
    server: RunningServer


@pytest.fixture
async def service() -> AsyncIterator[Service]:
    clock = FakeClock()
    env = MazeEnv(EnvConfig(max_live_episodes=8, max_batch=6, max_action_chars=64, idle_ttl_s=30), clock=clock)
    servicer = EnvServicer(env)
    running = await start_server(
        lambda server: env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, server), SERVICE_NAME, "127.0.0.1:0"
    )
    async with channel(f"127.0.0.1:{running.port}") as ch:
        yield Service(env_pb2_grpc.EnvServiceStub(ch), ch, clock, running)
    await running.stop(grace_s=0)


def _spec(seed: int = 0, max_moves: int = 0, **options: str) -> env_pb2.EpisodeSpec:
    return env_pb2.EpisodeSpec(seed=seed, max_moves=max_moves, options=options)


async def _create(service: Service, *specs: env_pb2.EpisodeSpec) -> list[env_pb2.EpisodeState]:
    reply = await service.stub.CreateEpisodes(env_pb2.CreateEpisodesRequest(specs=list(specs)))
    return list(reply.episodes)


async def _step(service: Service, *actions: tuple[str, str]) -> list[env_pb2.EpisodeState]:
    request = env_pb2.StepRequest(actions=[env_pb2.EpisodeAction(episode_id=i, action=a) for i, a in actions])
    return list((await service.stub.Step(request)).episodes)


async def _expect(code: grpc.StatusCode, call: object) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call  # type: ignore[misc]
    assert raised.value.code() == code, raised.value.details()
    return raised.value.details() or ""


async def _still_serving(service: Service) -> None:
    (episode,) = await _create(service, _spec(seed=99))
    (state,) = await _step(service, (episode.episode_id, "down"))
    assert state.info["moves"] == 1
    await service.stub.CloseEpisodes(env_pb2.CloseEpisodesRequest(episode_ids=[episode.episode_id]))


async def test_create_returns_the_first_frame_and_text_of_every_episode(service: Service) -> None:
    episodes = await _create(service, _spec(seed=1), _spec(seed=2, size="11"))
    assert len(episodes) == 2 and len({e.episode_id for e in episodes}) == 2
    for episode, size in zip(episodes, (80, 96), strict=True):
        (image,) = episode.observation.images
        assert image.mime_type == "image/png"
        assert Image.open(io.BytesIO(image.data)).size == (size, size)
        assert episode.observation.text.startswith("Reach the goal.")
        assert not episode.done and episode.reward == 0.0
        assert episode.info["moves"] == 0 and episode.info["solved"] is False
    assert episodes[0].observation.images[0].data == MazeRenderer(generate_maze(1, 9), 8).render((0, 0))
    assert episodes[1].info["size"] == 11 and episodes[1].info["seed"] == 2


async def test_an_optimal_episode_is_solved_over_grpc(service: Service) -> None:
    (episode,) = await _create(service, _spec(seed=3))
    for action in solve(generate_maze(3, 9)):
        (state,) = await _step(service, (episode.episode_id, f"<answer>{action}</answer>"))
    assert state.done and state.reward == 1.0
    assert state.observation.text == "You reached the goal."
    assert state.info["solved"] is True and state.info["moves"] == state.info["optimal_moves"]
    assert state.info["last_action"] == solve(generate_maze(3, 9))[-1]


async def test_garbage_action_text_is_an_invalid_move_not_an_error(service: Service) -> None:
    (episode,) = await _create(service, _spec())
    (state,) = await _step(service, (episode.episode_id, "¯\\_(ツ)_/¯"))
    assert state.info["invalid"] is True and state.observation.text == "Invalid action. Moves left: 19."
    assert state.observation.images[0].data == episode.observation.images[0].data


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ([_spec(), _spec(size="8")], "specs[1].options.size: must be odd, got 8"),
        ([_spec(size="3")], "specs[0].options.size: must be in [5, 51], got 3"),
        ([_spec(size="101")], "specs[0].options.size: must be in [5, 51], got 101"),
        ([_spec(size="big")], "specs[0].options.size: must be an integer, got 'big'"),
        ([_spec(max_moves=-1)], "specs[0].max_moves: must be >= 0"),
        ([_spec(seed=-1)], "specs[0].seed: must be in [0, 2**53)"),
        ([_spec(unit_px="100")], "specs[0].options.unit_px: must be in [1, 32], got 100"),
        ([_spec(size="51", unit_px="32")], "specs[0].options.unit_px: size 51 at unit_px 32 makes 1664x1664 px"),
        ([_spec(start="1" * 5000 + ",0")], "specs[0].options.start: must be a cell 'row,col'"),
        ([_spec(speed="fast")], "specs[0].options: unknown option 'speed'"),
        ([_spec()] * 7, "specs: 7 items, more than max_batch=6"),
    ],
)
async def test_invalid_specs_are_invalid_argument_naming_the_field(
    service: Service, specs: list[env_pb2.EpisodeSpec], message: str
) -> None:
    call = service.stub.CreateEpisodes(env_pb2.CreateEpisodesRequest(specs=specs))
    assert (await _expect(grpc.StatusCode.INVALID_ARGUMENT, call)).startswith(message)
    await _still_serving(service)


async def test_oversized_action_batch_and_text_are_invalid_argument(service: Service) -> None:
    (episode,) = await _create(service, _spec())
    too_long = service.stub.Step(env_pb2.StepRequest(
        actions=[env_pb2.EpisodeAction(episode_id=episode.episode_id, action="left " * 13)]
    ))
    details = await _expect(grpc.StatusCode.INVALID_ARGUMENT, too_long)
    assert details == "actions[0].action: 65 characters, more than max_action_chars=64"
    too_many = service.stub.Step(env_pb2.StepRequest(
        actions=[env_pb2.EpisodeAction(episode_id=str(i), action="up") for i in range(7)]
    ))
    assert (await _expect(grpc.StatusCode.INVALID_ARGUMENT, too_many)).startswith("actions: 7 items")
    close_many = service.stub.CloseEpisodes(env_pb2.CloseEpisodesRequest(episode_ids=["x"] * 7))
    assert (await _expect(grpc.StatusCode.INVALID_ARGUMENT, close_many)).startswith("episode_ids: 7 items")
    (state,) = await _step(service, (episode.episode_id, "up"))
    assert state.info["moves"] == 1, "the refused requests cost no move"


async def test_unknown_closed_and_expired_episodes_are_not_found(service: Service) -> None:
    closed, expired, kept = await _create(service, _spec(), _spec(), _spec())
    details = await _expect(grpc.StatusCode.NOT_FOUND, service.stub.Step(env_pb2.StepRequest(
        actions=[env_pb2.EpisodeAction(episode_id="f" * 32, action="up")]
    )))
    assert details == f"actions[0].episode_id: unknown episode {'f' * 32!r}"

    reply = await service.stub.CloseEpisodes(env_pb2.CloseEpisodesRequest(episode_ids=[closed.episode_id, "nope"]))
    assert reply.num_closed == 1
    details = await _expect(grpc.StatusCode.NOT_FOUND, _step(service, (closed.episode_id, "up")))
    assert details.endswith("was closed")

    service.clock.now += 20
    await _step(service, (kept.episode_id, "down"))
    service.clock.now += 20  # `expired` idle 40 s > 30 s; `kept` idle 20 s
    details = await _expect(grpc.StatusCode.NOT_FOUND, _step(service, (expired.episode_id, "up")))
    assert "expired" in details
    await _step(service, (kept.episode_id, "down"))
    await _still_serving(service)


async def test_stepping_a_finished_episode_is_failed_precondition(service: Service) -> None:
    (episode,) = await _create(service, _spec())
    (state,) = await _step(service, (episode.episode_id, "stop"))
    assert state.done and state.reward == 0.0
    details = await _expect(grpc.StatusCode.FAILED_PRECONDITION, _step(service, (episode.episode_id, "up")))
    assert "is done" in details
    await _still_serving(service)


async def test_the_live_episode_limit_is_resource_exhausted(service: Service) -> None:
    episodes = await _create(service, *[_spec()] * 6)
    episodes += await _create(service, _spec(), _spec())
    details = await _expect(grpc.StatusCode.RESOURCE_EXHAUSTED, _create(service, _spec()))
    assert "max_live_episodes=8" in details
    ids = [e.episode_id for e in episodes]
    reply = await service.stub.CloseEpisodes(env_pb2.CloseEpisodesRequest(episode_ids=ids[:6]))
    assert reply.num_closed == 6
    await _still_serving(service)


async def test_get_eval_set_returns_the_default_and_named_sets(service: Service) -> None:
    default = await service.stub.GetEvalSet(env_pb2.GetEvalSetRequest())
    assert (default.name, default.version) == ("maze-easy-64", "v2")
    assert default.content_hash == RECIPES["maze-easy-64"].recorded_hash
    assert [s.seed for s in default.specs] == [s.seed for s in get_eval_set("maze-easy-64").specs]
    assert all(s.max_moves == 20 and dict(s.options) == {"size": "9"} for s in default.specs)
    hard = await service.stub.GetEvalSet(env_pb2.GetEvalSetRequest(name="maze-hard-64"))
    assert hard.specs[0].options["size"] == "11"
    details = await _expect(grpc.StatusCode.NOT_FOUND, service.stub.GetEvalSet(env_pb2.GetEvalSetRequest(name="x")))
    assert "unknown eval set 'x'" in details
    # A long name is quoted short: echoed whole, it passed gRPC's metadata limit and the status
    # became RESOURCE_EXHAUSTED.
    details = await _expect(grpc.StatusCode.NOT_FOUND,
                            service.stub.GetEvalSet(env_pb2.GetEvalSetRequest(name="y" * 20_000)))
    assert "(20000 characters)" in details
    # Eval specs are directly playable.
    episodes = await _create(service, *default.specs[:4])
    assert [e.info["seed"] for e in episodes] == [s.seed for s in default.specs[:4]]


async def test_health_reports_serving(service: Service) -> None:
    stub = health_pb2_grpc.HealthStub(service.channel)
    for name in ("", SERVICE_NAME):
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=name))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_reflection_lists_the_env_service(service: Service) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(service.channel)

    async def one_request() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")

    names = []
    async for reply in stub.ServerReflectionInfo(one_request()):
        names += [s.name for s in reply.list_services_response.service]
    assert SERVICE_NAME == "mmrl.v1.EnvService" and SERVICE_NAME in names
    assert "grpc.health.v1.Health" in names
