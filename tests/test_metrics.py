"""Prometheus metrics of the services: the /metrics HTTP endpoint of a process, the env and rollout
metrics recorded by real grpc.aio servers on loopback, the learner's from its train step records,
and tracing off costing no interceptor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mmrl_proto.v1 import env_pb2, env_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from services.common import tracing
from services.common.grpc_server import channel, start_server
from services.common.metrics import ClientMetricsInterceptor, ServerMetricsInterceptor, serve_metrics
from services.common.procs import free_port
from services.env.config import EnvConfig
from services.env.maze.env import MazeEnv
from services.env.servicer import SERVICE_NAME, EnvServicer
from services.rollout.config import RolloutConfig
from services.rollout.service import RolloutServer
from tests.rollout.fake_engine import IMAGE_TOKEN, FakeEngine

_PORT = free_port()
serve_metrics(_PORT, "127.0.0.1")


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of this process's /metrics endpoint, by (name, sorted labels)."""
    text = httpx.get(f"http://127.0.0.1:{_PORT}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_env_calls_are_counted_timed_and_refusals_counted_by_code() -> None:
    servicer = EnvServicer(MazeEnv(EnvConfig(max_batch=8)))
    running = await start_server(lambda s: env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, s),
                                 SERVICE_NAME, "127.0.0.1:0")
    before = scrape()
    async with channel(f"127.0.0.1:{running.port}") as ch:
        stub = env_pb2_grpc.EnvServiceStub(ch)
        created = await stub.CreateEpisodes(env_pb2.CreateEpisodesRequest(specs=[env_pb2.EpisodeSpec(seed=s)
                                                                                   for s in range(3)]))
        await stub.Step(env_pb2.StepRequest(actions=[env_pb2.EpisodeAction(episode_id=e.episode_id, action="up")
                                                     for e in created.episodes]))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Step(env_pb2.StepRequest(actions=[env_pb2.EpisodeAction(episode_id="nope", action="up")]))
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        after = scrape()
        assert value(after, "mmrl_env_active_episodes") == 3
    await running.stop(grace_s=0)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("mmrl_env_episodes_created_total") == 3
    assert grew("mmrl_env_steps_total") == 3
    assert grew("mmrl_env_step_seconds_count") == 1  # the refused Step is not timed
    assert grew("mmrl_env_errors_total", method="Step", code="NOT_FOUND") == 1
    assert grew("mmrl_grpc_server_calls_total", service="EnvService", method="Step", code="OK") == 1
    assert grew("mmrl_grpc_server_calls_total", service="EnvService", method="Step", code="NOT_FOUND") == 1
    assert grew("mmrl_grpc_client_calls_total", service="EnvService", method="Step", code="NOT_FOUND") == 1
    assert grew("mmrl_grpc_client_seconds_count", service="EnvService", method="CreateEpisodes") == 1


async def test_rollout_generate_latency_tokens_and_refusals_are_recorded(tmp_path: Path) -> None:
    server = await RolloutServer.start(RolloutConfig(model="fake", max_model_len=128), "127.0.0.1:0",
                                       shared_root=tmp_path, cache_dir=tmp_path)
    engine = FakeEngine()

    async def factory(config: RolloutConfig) -> Any:
        return engine

    await server.start_engine(factory)
    before = scrape()
    async with channel(f"127.0.0.1:{server.port}") as ch:
        stub = rollout_pb2_grpc.RolloutServiceStub(ch)
        request = rollout_pb2.GenerationRequest(prompt_token_ids=[1, 2, 3],
                                                sampling=rollout_pb2.SamplingParams(max_tokens=4))
        await stub.Generate(rollout_pb2.GenerateRequest(requests=[request, request]))
        with pytest.raises(grpc.aio.AioRpcError):  # a placeholder without its image
            await stub.Generate(rollout_pb2.GenerateRequest(requests=[rollout_pb2.GenerationRequest(
                prompt_token_ids=[IMAGE_TOKEN], sampling=rollout_pb2.SamplingParams(max_tokens=4))]))
    after = scrape()
    await server.close()
    await server.running.stop(grace_s=0)
    assert value(after, "mmrl_rollout_generate_seconds_count") - value(before, "mmrl_rollout_generate_seconds_count") == 1
    assert value(after, "mmrl_rollout_generate_requests_total") - value(before, "mmrl_rollout_generate_requests_total") == 2
    assert value(after, "mmrl_rollout_generated_tokens_total") - value(before, "mmrl_rollout_generated_tokens_total") == 8
    assert value(after, "mmrl_rollout_errors_total", method="Generate", code="INVALID_ARGUMENT") >= 1


def test_rollout_reports_the_newest_adapter_version_per_run() -> None:
    from services.rollout import metrics

    metrics.adapter_loaded("run-newest", 3, 120.0)
    metrics.adapter_loaded("run-newest", 2, 80.0)  # an older version loaded again
    samples = scrape()
    assert value(samples, "mmrl_rollout_adapter_version", run_id="run-newest") == 3
    assert value(samples, "mmrl_rollout_adapter_load_seconds_count") >= 2


def test_learner_gauges_follow_the_newest_train_step_and_memory_is_reported() -> None:
    from services.learner import metrics

    metrics.trained({"train/step_s": 2.5, "train/tokens_per_s": 400.0, "train/loss": 0.25, "train/grad_norm": 1.5,
                     "train/logprob_abs_diff_vs_rollout": 1e-6, "train/num_tokens": 1000.0})
    metrics.trained({"train/step_s": 1.0, "train/loss": float("nan")})  # a skipped step keeps the last loss
    metrics.published(250.0)
    metrics.checkpointed(1500.0)
    samples = scrape()
    assert value(samples, "mmrl_learner_loss") == 0.25
    assert value(samples, "mmrl_learner_grad_norm") == 1.5
    assert value(samples, "mmrl_learner_tokens_per_second") == 400.0
    assert value(samples, "mmrl_learner_logprob_abs_diff_vs_rollout") == 1e-6
    assert value(samples, "mmrl_learner_train_step_seconds_count") >= 2
    assert value(samples, "mmrl_learner_publish_seconds_sum") >= 0.25
    assert value(samples, "mmrl_learner_checkpoint_seconds_count") >= 1
    assert value(samples, "mmrl_learner_memory_bytes") > 10 * 2**20


def test_metrics_port_zero_serves_nothing() -> None:
    assert serve_metrics(0) is None


def test_with_tracing_off_only_the_metrics_interceptors_are_installed() -> None:
    assert not tracing.enabled()
    assert [type(i) for i in tracing.server_interceptors()] == [ServerMetricsInterceptor]
    assert [type(i) for i in tracing.client_interceptors()] == [ClientMetricsInterceptor]
    with tracing.span("anything") as current:
        assert current is None
