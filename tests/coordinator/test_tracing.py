"""One GRPO step traced across the four services: the coordinator's run loop (real, with a real Redis)
calls a real env service, a rollout service over an in-process engine that lays out tokens as the
tiny model does, and a real learner training the tiny model, each on its own grpc.aio server on
loopback. Spans go to an in-memory exporter; the step's trace must hold every service's spans, the
servers' spans parented by the caller's (context carried in gRPC metadata)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from mmrl.bench import synthetic
from mmrl_proto.v1 import env_pb2_grpc, learner_pb2_grpc
from services.common import tracing
from services.common.conversation import ChatTokens
from services.common.grpc_server import start_server
from services.coordinator.config import RunConfig
from services.coordinator.grpo.runloop import RunContext, execute_run
from services.coordinator.ops.clients import CallPolicy
from services.coordinator.ops.replicas import Services
from services.coordinator.ops.store import RunState
from services.env.config import EnvConfig
from services.env.maze.env import MazeEnv
from services.env.servicer import SERVICE_NAME as ENV_SERVICE
from services.env.servicer import EnvServicer
from services.learner.config import LearnerSettings
from services.learner.distributed import init_distributed
from services.learner.driver import LearnerDriver
from services.learner.engine import LearnerEngine
from services.learner.servicer import SERVICE_NAME as LEARNER_SERVICE
from services.learner.servicer import LearnerServicer
from services.rollout.config import RolloutConfig
from services.rollout.engine import Completion, EngineRequest, EngineResult, ModelInfo
from services.rollout.service import RolloutServer
from tests.rollout.fake_engine import FakeEngine

pytestmark = pytest.mark.slow


class TinyLayoutEngine(FakeEngine):
    """Expands each image placeholder to the tiny model's 25 image tokens and 'generates' an action
    word and <|im_end|> (mmrl/bench/synthetic.py), so the real learner accepts the layout."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(vocab_size=len(tokenizer), max_model_len=4096)
        chat = ChatTokens.from_tokenizer(tokenizer)
        self._info = ModelInfo("tiny", 4096, len(tokenizer), chat.image_pad, sleep_supported=False,
                               lora_supported=True)
        self._tokenizer = tokenizer
        self._generate = synthetic.fake_generator(chat, tokenizer, tokens_per_image=25)

    async def generate(self, requests: Sequence[EngineRequest]) -> list[EngineResult]:
        outputs = self._generate([(list(r.prompt_token_ids), [b""] * len(r.images)) for r in requests])
        return [EngineResult(expanded, [Completion(generated, logprobs, self._tokenizer.decode(generated[:-1]),
                                                   "stop")])
                for expanded, generated, logprobs in outputs]


@pytest.fixture
def spans() -> Any:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracing.configure("test", "off", exporter=exporter)
    yield exporter
    tracing.shutdown()


@pytest.fixture
async def services(spans: Any, tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[Services]:
    from transformers import AutoTokenizer

    env_servicer = EnvServicer(MazeEnv(EnvConfig()))
    env = await start_server(lambda s: env_pb2_grpc.add_EnvServiceServicer_to_server(env_servicer, s),
                             ENV_SERVICE, "127.0.0.1:0")
    shared = tmp_path / "shared"
    (tmp_path / "cache").mkdir()
    # The stand-in engine's log-probs are arithmetic, not the model's: the adapter probe could only refuse.
    rollout = await RolloutServer.start(RolloutConfig(model=str(tiny_model_dir), adapter_probe="off"), "127.0.0.1:0",
                                        shared_root=shared, cache_dir=tmp_path / "cache")
    engine = TinyLayoutEngine(AutoTokenizer.from_pretrained(tiny_model_dir))

    async def factory(config: RolloutConfig) -> Any:
        return engine

    await rollout.start_engine(factory)
    settings = LearnerSettings(model=tiny_model_dir, shared_root=shared, num_threads=1)
    learner_servicer = LearnerServicer(LearnerDriver(LearnerEngine(settings, init_distributed("cpu"))))
    learner = await start_server(
        lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(learner_servicer, s),
        LEARNER_SERVICE, "127.0.0.1:0")
    clients = Services.connect([f"127.0.0.1:{env.port}"], [f"127.0.0.1:{rollout.port}"], f"127.0.0.1:{learner.port}",
                               CallPolicy(timeout_s=300, retries=0))
    yield clients
    await clients.close()
    await learner_servicer.close()
    for server in (env, learner, rollout.running):
        await server.stop(grace_s=0)
    await rollout.close()


async def test_one_steps_trace_crosses_all_four_services(services: Services, spans: Any, store: Any,
                                                         tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    config = RunConfig.model_validate({
        "name": "traced", "model": str(tiny_model_dir), "steps": 1, "loggers": [],
        "grpo": {"group_size": 2, "tasks_per_step": 1}, "env": {"max_moves": 2},
        "eval": {"max_tasks": 1, "sampled_samples": 0, "save_frames": False},
        "optim": {"micro_batch_size": 2}, "sampling": {"max_tokens": 3}})
    run = await store.create_run("traced-run", "traced", config.model_dump(mode="json"), config.steps)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ctx = RunContext(run_id=run["id"], config=config, services=services, store=store,
                     shared_root=tmp_path / "shared", tokenizer=tokenizer, chat=ChatTokens.from_tokenizer(tokenizer))
    assert await execute_run(ctx) == RunState.SUCCEEDED
    tracing.end_step()

    finished = spans.get_finished_spans()
    roots = [s for s in finished if s.name == "grpo.step"]
    assert len(roots) == 1 and roots[0].attributes["mmrl.step"] == 1
    trace_id = roots[0].context.trace_id
    step_spans = [s for s in finished if s.context.trace_id == trace_id]
    by_id = {s.context.span_id: s for s in step_spans}
    names = [s.name for s in step_spans]
    for name in ("sample", "EnvService/CreateEpisodes", "EnvService/Step", "RolloutService/Generate",
                 "LearnerService/TrainStep", "sync", "LearnerService/PublishAdapter",
                 "RolloutService/LoadAdapter", "eval", "checkpoint", "LearnerService/SaveCheckpoint"):
        assert name in names, (name, sorted(set(names)))
    servers = {s.attributes["rpc.service"] for s in step_spans if s.kind.name == "SERVER"}
    assert servers == {"EnvService", "RolloutService", "LearnerService"}
    # Every server span hangs under the coordinator's client span of the same call, and every span
    # of the trace leads up to the step's root.
    for server_span in (s for s in step_spans if s.kind.name == "SERVER"):
        parent = by_id[server_span.parent.span_id]
        assert parent.kind.name == "CLIENT" and parent.name == f"{server_span.name} call"
    for span in step_spans:
        while span.parent is not None:
            span = by_id[span.parent.span_id]
        assert span is roots[0]
    # Sampling: one Generate and one env Step per turn, at most max_moves turns.
    sample = next(s for s in step_spans if s.name == "sample")

    def in_sample(span: Any) -> bool:
        while span.parent is not None:
            span = by_id[span.parent.span_id]
            if span is sample:
                return True
        return False

    generates = [s for s in step_spans if s.name == "RolloutService/Generate" and in_sample(s)]
    env_steps = [s for s in step_spans if s.name == "EnvService/Step" and in_sample(s)]
    assert 1 <= len(generates) == len(env_steps) <= config.env.max_moves
