"""`mmrl serve rollout` as a process: NOT_SERVING while the engine starts, SERVING when it is up,
NOT_SERVING when the engine dies, and a clean exit on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mmrl.models.tiny_adapter import frame_png
from mmrl_proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from services.common.grpc_server import channel
from services.common.procs import free_port
from services.rollout.service import SERVICE_NAME

pytestmark = pytest.mark.slow


async def _health(stub: health_pb2_grpc.HealthStub) -> int | None:
    try:
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=2)
    except grpc.aio.AioRpcError:
        return None  # not listening yet
    return int(reply.status)


async def _wait_for(stub: health_pb2_grpc.HealthStub, status: int, timeout_s: float, seen: list[int | None]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen.append(await _health(stub))
        if seen[-1] == status:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"health never became {status}; saw {seen[-5:]}")


def _is_vllm(process: psutil.Process, role: str) -> bool:
    """Whether `process` is vLLM's `role` process (it names itself VLLM::<role>)."""
    return role in process.name() or any(role in part for part in process.cmdline())


async def test_the_served_process_reports_engine_state_and_stops_on_sigterm(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "rollout.yaml"
    config.write_text("max_model_len: 512\nlimit_images_per_prompt: 2\nhealth_interval_s: 0.5\n")
    port = free_port()
    log = open(tmp_path / "rollout.log", "wb")  # noqa: SIM115 - owned by the child process
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmrl.cli.main", "serve", "rollout", "--model", str(tiny_model_dir),
         "--host", "127.0.0.1", "--port", str(port), "--shared-root", str(tmp_path), "--config", str(config)],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        async with channel(f"127.0.0.1:{port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            seen: list[int | None] = []
            await _wait_for(health, health_pb2.HealthCheckResponse.SERVING, 300, seen)
            assert health_pb2.HealthCheckResponse.NOT_SERVING in seen  # listening while the engine started

            stub = rollout_pb2_grpc.RolloutServiceStub(ch)
            image_pad = 5  # <|image_pad|> of the tiny tokenizer
            request = rollout_pb2.GenerationRequest(
                prompt_token_ids=[1, 10, 11, image_pad, 12], images=[common_pb2.Image(data=frame_png(0))],
                sampling=rollout_pb2.SamplingParams(max_tokens=3))
            reply = await stub.Generate(rollout_pb2.GenerateRequest(requests=[request]))
            assert len(reply.results[0].completions[0].token_ids) >= 1

            children = psutil.Process(proc.pid).children(recursive=True)
            (engine_core,) = [c for c in psutil.Process(proc.pid).children() if _is_vllm(c, "EngineCore")]
            # the engine core runs the model itself on the CPU backend: no worker process below it
            assert not [c for c in children if _is_vllm(c, "Worker")], [c.cmdline() for c in children]
            engine_core.kill()  # the engine dies under the service
            await _wait_for(health, health_pb2.HealthCheckResponse.NOT_SERVING, 60, [])
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Generate(rollout_pb2.GenerateRequest(requests=[request]))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        _, alive = psutil.wait_procs(children, timeout=20)
        assert not alive, [(p.pid, p.cmdline()) for p in alive]
    finally:
        if proc.poll() is None:  # a failed check: the engine processes must not outlive the test either
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait()
        log.close()
