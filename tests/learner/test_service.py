"""The LearnerService over a real grpc.aio server on port 0 (in-process single-rank learner)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mmrl_proto.v1 import learner_pb2, learner_pb2_grpc
from services.common import storage
from services.common.adapter_probe import Probe, model_logprobs
from services.common.grpc_server import channel, start_server
from services.common.trajectory import Trajectory
from services.learner.checkpoint import TRAINER_STATE, load_trainer_state
from services.learner.servicer import SERVICE_NAME, LearnerServicer
from tests.learner.settings import train_json

CONFIG = train_json(learning_rate=0.01, micro_batch_size=4)


class Learner:
    """A served learner and a client stub."""

    def __init__(self, make_driver: Callable[..., Any], shared_root: Path) -> None:
        self.servicer = LearnerServicer(make_driver(shared_root))
        self.running: Any = None
        self.channel: Any = None
        self.stub: Any = None

    async def start(self) -> Learner:
        servicer = self.servicer
        self.running = await start_server(
            lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, s),
            SERVICE_NAME,
            "127.0.0.1:0",
        )
        self.channel = channel(f"127.0.0.1:{self.running.port}")
        self.stub = learner_pb2_grpc.LearnerServiceStub(self.channel)
        return self

    async def stop(self) -> None:
        await self.channel.close()
        await self.running.stop(0)
        await self.servicer.close()


@pytest.fixture
async def learner(make_driver: Callable[..., Any], tmp_path: Path) -> AsyncIterator[Learner]:
    served = await Learner(make_driver, tmp_path / "shared").start()
    yield served
    await served.stop()


def _train(run_id: str, trajectories: list[Trajectory]) -> learner_pb2.TrainStepRequest:
    return learner_pb2.TrainStepRequest(run_id=run_id, trajectories=[t.to_proto() for t in trajectories])


async def _code(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


async def test_the_server_reports_serving_on_the_standard_health_service(learner: Learner) -> None:
    health = health_pb2_grpc.HealthStub(learner.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_calls_before_configure_run_or_for_another_run_are_failed_preconditions(
    learner: Learner, trajectories: list[Trajectory]
) -> None:
    code, message = await _code(learner.stub.TrainStep(_train("run", trajectories[:1])))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "ConfigureRun" in message
    code, _ = await _code(learner.stub.GetState(learner_pb2.GetStateRequest(run_id="run")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    await learner.stub.ConfigureRun(learner_pb2.ConfigureRunRequest(run_id="run", config_json=CONFIG))
    for call in (
        learner.stub.TrainStep(_train("other", trajectories[:1])),
        learner.stub.PublishAdapter(learner_pb2.PublishAdapterRequest(run_id="other")),
        learner.stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(run_id="other")),
    ):
        code, message = await _code(call)
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "'run'" in message
    changed = train_json(learning_rate=0.5)
    code, _ = await _code(
        learner.stub.ConfigureRun(learner_pb2.ConfigureRunRequest(run_id="run", config_json=changed))
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION


async def test_bad_configs_and_run_ids_are_invalid_arguments(learner: Learner) -> None:
    cases = {
        ("run", '{"lora": {"rank": 0}}'): "lora.rank",
        ("run", '{"nope": 1}'): "nope",
        ("run", "{"): "json",
        ("../x", "{}"): "run_id",
        ("run", '{"lora": {"target_modules": "("}}'): "not a regular expression",
        ("run", '{"lora": {"target_modules": "nothing"}}'): "matches no linear layer",
        ("run", '{"lora": {"target_modules": ".*patch_embed.proj"}}'): "a conv3d: adapters are served on linear",
    }
    for (run_id, config), expected in cases.items():
        code, message = await _code(
            learner.stub.ConfigureRun(learner_pb2.ConfigureRunRequest(run_id=run_id, config_json=config))
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (run_id, config)
        assert expected in message.lower(), (expected, message)
    # Still usable afterwards.
    await learner.stub.ConfigureRun(learner_pb2.ConfigureRunRequest(run_id="run", config_json="{}"))


async def test_invalid_trajectories_are_invalid_arguments_naming_them_and_change_no_state(
    learner: Learner, trajectories: list[Trajectory]
) -> None:
    await learner.stub.ConfigureRun(learner_pb2.ConfigureRunRequest(run_id="run", config_json=CONFIG))
    ragged = dataclasses.replace(trajectories[1], advantages=trajectories[1].advantages[:5])
    bad_vocab = dataclasses.replace(trajectories[1], token_ids=(*trajectories[1].token_ids[:-1], 99_999))
    bad_image = dataclasses.replace(trajectories[1], images=(b"\x89PNG broken", *trajectories[1].images[1:]))
    for bad, expected in (
        (ragged, "advantages has 5 entries"),
        (bad_vocab, "outside the vocabulary"),
        (bad_image, "image 0 does not decode"),
    ):
        code, message = await _code(learner.stub.TrainStep(_train("run", [trajectories[0], bad])))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "trajectory #1" in message and "'ep-0001'" in message and expected in message
    code, message = await _code(learner.stub.TrainStep(_train("run", [])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "no trajectories" in message
    state = await learner.stub.GetState(learner_pb2.GetStateRequest(run_id="run"))
    assert state.step == 0


def _check_probe(model_dir: Path, adapter_dir: Path) -> None:
    """The manifest's probe is what the published adapter, loaded by peft, and the base model answer."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    probe = Probe.from_manifest(storage.verify_manifest(adapter_dir))
    assert probe is not None
    base = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert model_logprobs(base, probe.token_ids) == pytest.approx(probe.base_logprobs, abs=1e-5)
    tuned = PeftModel.from_pretrained(base, adapter_dir).eval()
    assert model_logprobs(tuned, probe.token_ids) == pytest.approx(probe.logprobs, abs=1e-5)
    assert probe.logprobs != pytest.approx(probe.base_logprobs, abs=1e-5)  # one step moved it


async def test_train_publish_checkpoint_and_a_restarted_learner_continues_the_run(
    learner: Learner, make_driver: Callable[..., Any], tmp_path: Path, trajectories: list[Trajectory],
    tiny_model_dir: Path,
) -> None:
    shared = tmp_path / "shared"
    state = await learner.stub.ConfigureRun(learner_pb2.ConfigureRunRequest(run_id="run", config_json=CONFIG))
    assert (state.step, state.adapter_version, state.restored_from) == (0, 0, "")
    again = await learner.stub.ConfigureRun(learner_pb2.ConfigureRunRequest(run_id="run", config_json=CONFIG))
    assert again == state  # idempotent
    reply = await learner.stub.TrainStep(_train("run", trajectories[:3]))
    assert reply.step == 1 and not reply.skipped
    for key in (
        "train/loss",
        "train/pg_loss",
        "train/clip_fraction",
        "train/entropy",
        "train/grad_norm",
        "train/learning_rate",
        "train/tokens_per_s",
        "train/logprob_abs_diff_vs_rollout",
    ):
        assert key in reply.metrics, key

    published = await learner.stub.PublishAdapter(learner_pb2.PublishAdapterRequest(run_id="run"))
    assert published.version == 1 and Path(published.path) == storage.adapter_dir(shared, "run", 1)
    manifest = storage.verify_manifest(Path(published.path))
    assert set(manifest["files"]) == {"adapter_model.safetensors", "adapter_config.json"}
    assert storage.manifest_sha256(Path(published.path)) == published.manifest_sha256
    assert published.publish_ms > 0
    _check_probe(tiny_model_dir, Path(published.path))

    saved = await learner.stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(run_id="run"))
    assert saved.step == 1 and Path(saved.path) == storage.checkpoint_dir(shared, "run", 1)
    assert set(storage.verify_manifest(Path(saved.path))["files"]) == {
        "adapter_model.safetensors",
        "adapter_config.json",
        "optimizer.pt",
        "rng.pt",
        "trainer_state.json",
    }
    await learner.stub.TrainStep(_train("run", trajectories[:3]))
    second = await learner.stub.PublishAdapter(learner_pb2.PublishAdapterRequest(run_id="run"))
    assert second.version == 2
    state = await learner.stub.GetState(learner_pb2.GetStateRequest(run_id="run"))
    assert (state.step, state.adapter_version) == (2, 2)

    # Roll back explicitly, then check a bad path and a missing checkpoint.
    loaded = await learner.stub.LoadCheckpoint(learner_pb2.LoadCheckpointRequest(run_id="run"))
    assert (loaded.step, loaded.adapter_version, loaded.restored_from) == (1, 2, saved.path)
    code, _ = await _code(
        learner.stub.LoadCheckpoint(learner_pb2.LoadCheckpointRequest(run_id="run", path="/etc"))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    missing = str(storage.checkpoint_dir(shared, "run", 77))
    code, _ = await _code(
        learner.stub.LoadCheckpoint(learner_pb2.LoadCheckpointRequest(run_id="run", path=missing))
    )
    assert code == grpc.StatusCode.NOT_FOUND

    # A new learner process on the same storage: resumes from the newest checkpoint and keeps
    # counting adapter versions.
    restarted = await Learner(make_driver, shared).start()
    try:
        state = await restarted.stub.ConfigureRun(
            learner_pb2.ConfigureRunRequest(run_id="run", config_json=CONFIG)
        )
        assert (state.step, state.adapter_version, state.restored_from) == (1, 2, saved.path)
        third = await restarted.stub.PublishAdapter(learner_pb2.PublishAdapterRequest(run_id="run"))
        assert third.version == 3
        assert (
            json.loads((storage.run_dir(shared, "run") / "learner_config.json").read_text())["optim"]["learning_rate"]
            == 0.01
        )
    finally:
        await restarted.stop()


async def test_a_save_after_a_rollback_and_more_training_is_refused_rather_than_answered_with_the_old_state(
    learner: Learner, trajectories: list[Trajectory], tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    await learner.stub.ConfigureRun(learner_pb2.ConfigureRunRequest(run_id="run", config_json=CONFIG))
    paths = []
    for _ in range(2):
        await learner.stub.TrainStep(_train("run", trajectories[:3]))
        paths.append((await learner.stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(run_id="run"))).path)
    spelt_otherwise = str(Path(paths[0]).parent / ".." / "checkpoints" / Path(paths[0]).name)
    await learner.stub.LoadCheckpoint(learner_pb2.LoadCheckpointRequest(run_id="run", path=spelt_otherwise))
    again = await learner.stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(run_id="run"))
    assert (again.step, again.path, again.checkpoint_ms) == (1, paths[0], 0.0)  # the restored state itself

    await learner.stub.TrainStep(_train("run", trajectories[3:]))  # step 2 again, on other episodes
    code, message = await _code(learner.stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(run_id="run")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "another state of step 2" in message
    assert storage.verify_manifest(Path(paths[1]))  # the other branch's checkpoint is left as it was

    # Another run's checkpoint is not restored into this one; a version directory left without a
    # manifest is not overwritten.
    await learner.stub.ConfigureRun(learner_pb2.ConfigureRunRequest(run_id="other", config_json=CONFIG))
    code, message = await _code(
        learner.stub.LoadCheckpoint(learner_pb2.LoadCheckpointRequest(run_id="other", path=paths[0]))
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "belongs to run 'run'" in message
    storage.adapter_dir(shared, "other", 1).mkdir(parents=True)
    code, message = await _code(learner.stub.PublishAdapter(learner_pb2.PublishAdapterRequest(run_id="other")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "already exists" in message


async def test_a_checkpoint_counts_train_steps_apart_from_optimiser_steps(
    learner: Learner, trajectories: list[Trajectory]
) -> None:
    """With several mini-batches per TrainStep the optimiser step count runs ahead of the GRPO step
    count; a resumed run must restart from the GRPO step (found: a coordinator restarted at step 8
    of a 5-step run with `num_minibatches: 4`)."""
    config = train_json(learning_rate=0.01, micro_batch_size=4, num_minibatches=2)
    await learner.stub.ConfigureRun(learner_pb2.ConfigureRunRequest(run_id="run", config_json=config))
    for _ in range(2):
        await learner.stub.TrainStep(_train("run", trajectories[:4]))
    state = await learner.stub.GetState(learner_pb2.GetStateRequest(run_id="run"))
    assert (state.step, state.train_steps) == (4, 2)
    await learner.stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(run_id="run"))
    await learner.stub.TrainStep(_train("run", trajectories[:4]))
    loaded = await learner.stub.LoadCheckpoint(learner_pb2.LoadCheckpointRequest(run_id="run"))
    assert (loaded.step, loaded.train_steps) == (4, 2)


def test_a_checkpoint_written_before_train_steps_were_recorded_derives_them(tmp_path: Path) -> None:
    old = {"run_id": "run", "step": 12, "adapter_version": 3, "world_size": 1, "base_model": "m",
           "config": {"num_minibatches": 4}}
    (tmp_path / TRAINER_STATE).write_text(json.dumps(old))
    assert load_trainer_state(tmp_path).train_steps == 3
