"""gRPC clients of the env, rollout and learner services, as the coordinator uses them: each call
is a verb (`env.create_episodes`, `rollouts.generate`, `learner.train_step`, ...) that takes and
returns the plain dataclasses of wire.py; the protobuf types stay in this module.

Every call has a deadline and bounded retries (UNAVAILABLE only, with backoff); a failure raises
ServiceError naming the service and its address, so a run fails with a reason a user can act on.
ServiceError.lost says whether the failure means the service went away or restarted (the run waits
for it and redoes the step) rather than that the request was wrong. Channels carry keepalive and
the gRPC token (services/common/grpc_server.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.json_format import MessageToDict

from mmrl_proto.v1 import env_pb2, env_pb2_grpc, learner_pb2, learner_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from services.common.grpc_server import channel, check_health
from services.common.training import TrainSettings
from services.common.trajectory import Trajectory
from services.coordinator.ops.wire import (
    EnvInfo,
    EpisodeState,
    EvalSet,
    Generation,
    LearnerState,
    ModelInfo,
    Prompt,
    PublishedAdapter,
    TaskSpec,
    TrainResult,
)

log = logging.getLogger("mmrl.coordinator.clients")
T = TypeVar("T")

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE}
# Codes that mean the peer went away (UNAVAILABLE: refused, or dropped by keepalive; DEADLINE_EXCEEDED:
# it hung), or came back without the state the call refers to (env: an unknown episode; rollout: an
# adapter it never loaded). A redo from the newest checkpoint recreates that state; a genuine bug
# fails the run after CoordinatorSettings.run_restarts redos without progress.
_LOST = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "NOT_SERVING"}
_LOST_STATE = {("env", "NOT_FOUND"), ("rollout", "NOT_FOUND")}


class ServiceError(Exception):
    """A gRPC call to `service` at `address` failed (after retries)."""

    def __init__(self, service: str, address: str, method: str, code: str, details: str) -> None:
        super().__init__(f"{service} service at {address}: {method} failed with {code}: {details}")
        self.service = service
        self.address = address
        self.code = code

    @property
    def lost(self) -> bool:
        """The service went away or restarted (wait for it, redo the step), not a bad request."""
        return self.code in _LOST or (self.service, self.code) in _LOST_STATE


@dataclass
class CallPolicy:
    timeout_s: float = 600.0
    retries: int = 3
    backoff_s: float = 0.5


class _Client:
    service = "service"

    def __init__(self, address: str, policy: CallPolicy) -> None:
        self.address = address
        self.policy = policy
        self.channel = channel(address)

    async def call(self, method: str, rpc: Callable[..., Awaitable[T]], request: Any,
                   timeout_s: float | None = None) -> T:
        attempt = 0
        while True:
            try:
                return await rpc(request, timeout=timeout_s or self.policy.timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _RETRYABLE and attempt < self.policy.retries:
                    attempt += 1
                    log.warning("retrying", extra={"service": self.service, "method": method,
                                                   "attempt": attempt, "code": exc.code().name})
                    await asyncio.sleep(self.policy.backoff_s * 2 ** (attempt - 1))
                    continue
                raise ServiceError(self.service, self.address, method, exc.code().name,
                                   exc.details() or "") from exc

    async def healthy(self) -> bool:
        return await check_health(self.address)

    async def close(self) -> None:
        await self.channel.close()


def _state(message: env_pb2.EpisodeState) -> EpisodeState:
    return EpisodeState(episode_id=message.episode_id, text=message.observation.text,
                        images=[image.data for image in message.observation.images], reward=message.reward,
                        done=message.done, info=MessageToDict(message.info), state_key=message.state_key,
                        truncated=message.truncated)


def _spec(message: env_pb2.EpisodeSpec) -> TaskSpec:
    return TaskSpec(seed=int(message.seed), max_moves=int(message.max_moves), options=dict(message.options))


def _learner_state(message: learner_pb2.LearnerState) -> LearnerState:
    return LearnerState(run_id=message.run_id, step=int(message.step), train_steps=int(message.train_steps),
                        adapter_version=int(message.adapter_version), restored_from=message.restored_from)


class EnvClient(_Client):
    service = "env"

    def __init__(self, address: str, policy: CallPolicy) -> None:
        super().__init__(address, policy)
        self.stub = env_pb2_grpc.EnvServiceStub(self.channel)

    async def info(self) -> EnvInfo:
        reply = await self.call("GetEnvInfo", self.stub.GetEnvInfo, env_pb2.GetEnvInfoRequest())
        return EnvInfo(name=reply.name, actions=list(reply.actions), capabilities=list(reply.capabilities),
                       eval_sets=list(reply.eval_sets))

    async def training_tasks(self, seed: str, count: int, max_moves: int,
                             options: Mapping[str, str]) -> list[TaskSpec]:
        """`count` training tasks the env draws from `seed` (never a task of its eval sets)."""
        reply = await self.call("GetTrainingTasks", self.stub.GetTrainingTasks, env_pb2.GetTrainingTasksRequest(
            seed=seed, count=count, max_moves=max_moves, options=dict(options)))
        return [_spec(spec) for spec in reply.specs]

    async def create_episodes(self, specs: Sequence[TaskSpec]) -> list[EpisodeState]:
        request = env_pb2.CreateEpisodesRequest(specs=[
            env_pb2.EpisodeSpec(seed=s.seed, max_moves=s.max_moves, options=dict(s.options)) for s in specs])
        reply = await self.call("CreateEpisodes", self.stub.CreateEpisodes, request)
        return [_state(state) for state in reply.episodes]

    async def step(self, actions: Sequence[tuple[str, str]]) -> list[EpisodeState]:
        """One turn of these episodes: (episode id, action text) pairs; states in the same order."""
        request = env_pb2.StepRequest(actions=[env_pb2.EpisodeAction(episode_id=episode_id, action=action)
                                               for episode_id, action in actions])
        reply = await self.call("Step", self.stub.Step, request)
        return [_state(state) for state in reply.episodes]

    async def close_episodes(self, episode_ids: Sequence[str]) -> None:
        await self.call("CloseEpisodes", self.stub.CloseEpisodes,
                        env_pb2.CloseEpisodesRequest(episode_ids=list(episode_ids)))

    async def eval_set(self, name: str = "") -> EvalSet:
        """The named eval set ("" = the env's default)."""
        reply = await self.call("GetEvalSet", self.stub.GetEvalSet, env_pb2.GetEvalSetRequest(name=name))
        return EvalSet(name=reply.name, version=reply.version, content_hash=reply.content_hash,
                       specs=[_spec(spec) for spec in reply.specs])


def _generation_request(prompt: Prompt) -> rollout_pb2.GenerationRequest:
    sampling = prompt.sampling
    return rollout_pb2.GenerationRequest(
        prompt_token_ids=prompt.token_ids,
        images=[{"data": data, "mime_type": "image/png"} for data in prompt.images],
        sampling=rollout_pb2.SamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens,
            stop_token_ids=sampling.stop_token_ids, n=1, seed=sampling.seed % 2**63,  # int64 field
            allowed_sequences=[rollout_pb2.TokenSequence(token_ids=s) for s in sampling.allowed_sequences]),
        adapter_run_id=prompt.adapter_run_id, adapter_version=prompt.adapter_version,
    )


def _generation(result: rollout_pb2.GenerationResult) -> Generation:
    completion = result.completions[0]
    return Generation(prompt_token_ids=list(result.prompt_token_ids), token_ids=list(completion.token_ids),
                      logprobs=list(completion.logprobs), text=completion.text,
                      adapter_version=int(result.adapter_version), num_cached_tokens=int(result.num_cached_tokens))


class RolloutClient(_Client):
    service = "rollout"

    def __init__(self, address: str, policy: CallPolicy) -> None:
        super().__init__(address, policy)
        self.stub = rollout_pb2_grpc.RolloutServiceStub(self.channel)

    async def generate(self, prompts: Sequence[Prompt]) -> list[Generation]:
        """One completion per prompt, in order."""
        reply = await self.call("Generate", self.stub.Generate,
                                rollout_pb2.GenerateRequest(requests=[_generation_request(p) for p in prompts]))
        return [_generation(result) for result in reply.results]

    async def load_adapter(self, run_id: str, version: int, path: str, manifest_sha256: str = "") -> None:
        """Loads the adapter version and checks what the replica confirms: the version, and the
        manifest checksum the learner published when one is given."""
        reply = await self.call("LoadAdapter", self.stub.LoadAdapter,
                                rollout_pb2.LoadAdapterRequest(run_id=run_id, version=version, path=path))
        if reply.version != version:
            raise ServiceError(self.service, self.address, "LoadAdapter", "MISMATCH",
                               f"asked for version {version}, replica confirmed {reply.version}")
        if manifest_sha256 and reply.manifest_sha256 != manifest_sha256:
            raise ServiceError(self.service, self.address, "LoadAdapter", "MISMATCH",
                               f"version {version} was published with manifest sha256 {manifest_sha256}, "
                               f"the replica loaded {reply.manifest_sha256}")

    async def served_versions(self, run_id: str) -> set[int]:
        """The run's adapter versions this replica holds (it may reload any of them from storage)."""
        reply = await self.call("ListAdapters", self.stub.ListAdapters, rollout_pb2.ListAdaptersRequest())
        return {int(a.version) for a in reply.adapters if a.run_id == run_id}

    async def release_adapters(self, run_id: str) -> None:
        """Unloads every version of the run's adapter (it ended or paused): its room goes to other runs."""
        await self.call("ReleaseAdapters", self.stub.ReleaseAdapters, rollout_pb2.ReleaseAdaptersRequest(run_id=run_id))

    async def sleep(self, level: int = 1) -> None:
        await self.call("Sleep", self.stub.Sleep, rollout_pb2.SleepRequest(level=level))

    async def wake_up(self) -> None:
        await self.call("WakeUp", self.stub.WakeUp, rollout_pb2.WakeUpRequest())

    async def model_info(self) -> ModelInfo:
        reply = await self.call("GetModelInfo", self.stub.GetModelInfo, rollout_pb2.GetModelInfoRequest())
        return ModelInfo(model=reply.model, max_model_len=int(reply.max_model_len),
                         sleep_supported=bool(reply.sleep_supported), max_adapter_runs=int(reply.max_adapter_runs))


class LearnerClient(_Client):
    service = "learner"

    def __init__(self, address: str, policy: CallPolicy) -> None:
        super().__init__(address, policy)
        self.stub = learner_pb2_grpc.LearnerServiceStub(self.channel)

    async def configure_run(self, run_id: str, settings: TrainSettings) -> LearnerState:
        """Binds the learner to the run with these training settings (it resumes from the run's
        newest complete checkpoint when it has one)."""
        reply = await self.call("ConfigureRun", self.stub.ConfigureRun, learner_pb2.ConfigureRunRequest(
            run_id=run_id, config_json=settings.model_dump_json()))
        return _learner_state(reply)

    async def train_step(self, run_id: str, trajectories: Sequence[Trajectory]) -> TrainResult:
        reply = await self.call("TrainStep", self.stub.TrainStep, learner_pb2.TrainStepRequest(
            run_id=run_id, trajectories=[t.to_proto() for t in trajectories]))
        return TrainResult(step=int(reply.step), metrics=dict(reply.metrics), skipped=bool(reply.skipped))

    async def publish(self, run_id: str) -> PublishedAdapter:
        """Publishes the current adapter as the run's next version."""
        reply = await self.call("PublishAdapter", self.stub.PublishAdapter,
                                learner_pb2.PublishAdapterRequest(run_id=run_id))
        return PublishedAdapter(version=int(reply.version), path=reply.path, manifest_sha256=reply.manifest_sha256)

    async def save_checkpoint(self, run_id: str) -> None:
        await self.call("SaveCheckpoint", self.stub.SaveCheckpoint, learner_pb2.SaveCheckpointRequest(run_id=run_id))

    async def load_checkpoint(self, run_id: str) -> LearnerState:
        """Rolls the learner back to the run's newest complete checkpoint."""
        reply = await self.call("LoadCheckpoint", self.stub.LoadCheckpoint,
                                learner_pb2.LoadCheckpointRequest(run_id=run_id))
        return _learner_state(reply)

    async def state(self, run_id: str) -> LearnerState:
        return _learner_state(await self.call("GetState", self.stub.GetState,
                                              learner_pb2.GetStateRequest(run_id=run_id)))
