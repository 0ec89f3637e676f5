"""Sokoban over real gRPC: an in-process grpc.aio server, and `mmrl serve env --env sokoban`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import grpc

from mmrl.bench.env import wait_for_port
from mmrl_proto.v1 import env_pb2, env_pb2_grpc
from services.common.grpc_server import channel, start_server
from services.env.servicer import SERVICE_NAME, EnvServicer
from services.env.sokoban.env import SokobanEnv

ROOT = Path(__file__).resolve().parents[3]


async def _play(stub: env_pb2_grpc.EnvServiceStub) -> None:
    info = await stub.GetEnvInfo(env_pb2.GetEnvInfoRequest())
    assert info.name == "sokoban" and list(info.actions) == ["up", "down", "left", "right"]
    assert set(info.capabilities) == {"state_keys", "oracle"}
    assert list(info.eval_sets) == ["sokoban-64", "sokoban-held-out-128", "sokoban-held-out-512"]
    eval_set = await stub.GetEvalSet(env_pb2.GetEvalSetRequest())
    tasks = await stub.GetTrainingTasks(env_pb2.GetTrainingTasksRequest(seed="s", count=64, max_moves=20))
    assert len(tasks.specs) == 64
    assert not {s.seed for s in tasks.specs} & {s.seed for s in eval_set.specs}
    created = await stub.CreateEpisodes(env_pb2.CreateEpisodesRequest(specs=list(eval_set.specs[:8])))
    states = {e.episode_id: e for e in created.episodes}
    assert all(e.observation.images[0].mime_type == "image/png" and e.state_key for e in states.values())
    while states:
        actions = [env_pb2.EpisodeAction(episode_id=i, action=e.info["optimal_action"]) for i, e in states.items()]
        stepped = await stub.Step(env_pb2.StepRequest(actions=actions))
        for state in stepped.episodes:
            if state.done:
                assert state.reward == 1.0 and state.info["solved"] and not state.truncated
                del states[state.episode_id]
            else:
                states[state.episode_id] = state
    try:
        await stub.GetTrainingTasks(env_pb2.GetTrainingTasksRequest(seed="s", count=1, options={"size": "99"}))
        raise AssertionError("size 99 was accepted")
    except grpc.aio.AioRpcError as error:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "options.size" in (error.details() or "")


async def test_the_servicer_serves_sokoban_over_grpc() -> None:
    servicer = EnvServicer(SokobanEnv())
    running = await start_server(
        lambda server: env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, server), SERVICE_NAME, "127.0.0.1:0")
    try:
        async with channel(f"127.0.0.1:{running.port}") as ch:
            await _play(env_pb2_grpc.EnvServiceStub(ch))
    finally:
        await running.stop(grace_s=0)


def test_serve_env_with_env_sokoban_serves_sokoban(tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "mmrl.cli.main", "serve", "env", "--env", "sokoban", "--host", "127.0.0.1",
             "--port", "0"], cwd=ROOT, stderr=log_file, stdout=subprocess.DEVNULL)
        try:
            port = wait_for_port(log_path, process)

            async def check() -> None:
                async with channel(f"127.0.0.1:{port}") as ch:
                    await _play(env_pb2_grpc.EnvServiceStub(ch))

            asyncio.run(check())
        finally:
            process.terminate()
            process.wait(timeout=20)


def test_the_sokoban_modules_import_no_torch_or_vllm() -> None:
    code = ("import sys, services.env.sokoban.env, services.env.main\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'transformers'))\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
