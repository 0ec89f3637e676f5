"""Several ranks: `mmrl serve learner --nproc 2` (torchrun, FSDP2 on gloo) against an in-process
single rank, and checkpoints that resume across world sizes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from mmrl.bench.learner import start_learner_process, stop_learner_process
from mmrl.cli import main as cli
from mmrl_proto.v1 import learner_pb2, learner_pb2_grpc
from services.common.grpc_server import channel
from services.common.settings_cli import given_values, settings_from
from services.common.trajectory import Trajectory
from services.learner.config import LearnerSettings
from services.learner.launch import launch_from, torchrun_command
from services.learner.main import parser
from services.learner.publish import ADAPTER_WEIGHTS, peft_key
from tests.learner.conftest import adapter_weights
from tests.learner.settings import train_json

# A large Adam epsilon keeps updates proportional to the gradients (see test_trainer).
# Two mini-batches per TrainStep (2 + 3 trajectories) exercise sharding, padding and off-policy steps.
CONFIG = {
    "learning_rate": 0.01,
    "micro_batch_size": 2,
    "adam_eps": 1e-3,
    "weight_decay": 0.01,
    "num_minibatches": 2,
}
COMPARED = (
    "train/loss",
    "train/pg_loss",
    "train/grad_norm",
    "train/clip_fraction",
    "train/entropy",
    "train/logprob_abs_diff_vs_rollout",
    "train/num_tokens",
    "train/num_generated_tokens",
)


def test_a_model_that_is_not_a_local_checkpoint_directory_is_one_error_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for model in ("Qwen/Qwen3-VL-8B-Instruct", str(tmp_path)):  # a hub id; a directory without config.json
        # --nproc 2: refused before torchrun starts any rank
        argv = ["serve", "learner", "--model", model, "--shared-root", str(tmp_path / "shared"), "--nproc", "2"]
        assert cli.main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "not a local checkpoint directory" in lines[0] and model in lines[0]


def _launch(argv: list[str]) -> list[str]:
    args = parser().parse_args(argv)
    return torchrun_command(settings_from(LearnerSettings, given_values(args, LearnerSettings)), launch_from(args))


def test_the_torchrun_command_passes_the_worker_flags_through_unchanged(tmp_path: Path) -> None:
    from torch.distributed.run import get_args_parser

    command = _launch(["--nproc", "2", "--model", "m", "--port", "0", "--port-file", str(tmp_path / "p"),
                       "--num-threads", "1"])
    parsed = get_args_parser().parse_args(command[3:])
    assert (parsed.nproc_per_node, parsed.standalone, parsed.module) == ("2", True, True)
    assert parsed.training_script == "services.learner.main"
    assert "--model=m" in parsed.training_script_args and "--port=0" in parsed.training_script_args
    assert f"--port-file={tmp_path / 'p'}" in parsed.training_script_args
    assert not any(a.startswith(("--nproc", "--nnodes")) for a in parsed.training_script_args)
    # every rank resolves the same settings as the launcher did
    worker = parser().parse_args(parsed.training_script_args)
    assert settings_from(LearnerSettings, given_values(worker, LearnerSettings)).model_dump() == \
        settings_from(LearnerSettings, {"model": "m", "port": 0, "num_threads": 1}).model_dump()
    multi = _launch(["--nproc", "8", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "head:29500"])
    parsed = get_args_parser().parse_args(multi[3:])
    assert (parsed.nnodes, parsed.node_rank, parsed.master_addr, parsed.master_port) == ("2", 1, "head", 29500)


def test_several_nodes_without_a_rendezvous_endpoint_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "learner", "--nnodes", "2"]) == 2
    assert capsys.readouterr().err == "mmrl serve learner: --nnodes > 1 needs --rdzv-endpoint HOST:PORT\n"


@pytest.mark.slow
async def test_two_fsdp_ranks_give_the_steps_of_one_rank_and_their_checkpoint_resumes_on_one_rank(
    tiny_model_dir: Path, tmp_path: Path, trajectories: list[Trajectory], make_driver: Callable[..., Any]
) -> None:
    batch = trajectories[:5]  # 3 + 2 trajectories: the second rank also runs a zero-weight padding copy
    two_root = tmp_path / "two-ranks"
    process, port = start_learner_process(tiny_model_dir, two_root, tmp_path, nproc=2, num_threads=1)
    try:
        async with channel(f"127.0.0.1:{port}") as ch:
            stub = learner_pb2_grpc.LearnerServiceStub(ch)
            await stub.ConfigureRun(
                # Activation checkpointing under FSDP2 (recomputed blocks gather their shards again)
                # changes nothing in the steps: the single rank below runs without it.
                learner_pb2.ConfigureRunRequest(
                    run_id="run", config_json=train_json(**CONFIG, activation_checkpointing=True))
            )
            request = learner_pb2.TrainStepRequest(run_id="run", trajectories=[t.to_proto() for t in batch])
            two_rank = [dict((await stub.TrainStep(request)).metrics) for _ in range(2)]
            checkpoint = await stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(run_id="run"))
            published = await stub.PublishAdapter(learner_pb2.PublishAdapterRequest(run_id="run"))
        assert {m["train/ranks"] for m in two_rank} == {2.0}
    finally:
        stop_learner_process(process)  # SIGTERM to torchrun and its ranks

    one = make_driver(tmp_path / "one-rank")
    one.configure("run", train_json(**CONFIG))
    one_rank = [one.train_step("run", batch).metrics for _ in range(2)]
    for step_two, step_one in zip(two_rank, one_rank, strict=True):
        for key in COMPARED:
            assert step_two[key] == pytest.approx(step_one[key], rel=1e-5, abs=1e-7), key
    two_adapter = load_file(str(Path(published.path) / ADAPTER_WEIGHTS))
    one_adapter = {peft_key(k): v for k, v in adapter_weights(one).items()}
    assert two_adapter.keys() == one_adapter.keys()
    for name, tensor in one_adapter.items():
        torch.testing.assert_close(two_adapter[name], tensor, rtol=1e-4, atol=1e-6)

    # The two-rank checkpoint, restored by a single rank, continues like the uninterrupted run.
    expected = one.train_step("run", batch).metrics
    resumed = make_driver(two_root)
    state = resumed.configure("run", train_json(**CONFIG))
    assert (state.step, state.restored_from, state.adapter_version) == (4, checkpoint.path, 1)
    got = resumed.train_step("run", batch).metrics
    for key in COMPARED:
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
