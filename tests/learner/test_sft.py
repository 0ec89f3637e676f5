"""SFT: expert data through a real env service, and the seed ranges it may use."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.learner.sft import SftConfig, train_sft


def test_sft_data_can_never_reach_the_eval_seed_range() -> None:
    from services.env.evalset import is_eval_seed

    with pytest.raises(ValidationError, match="eval"):
        SftConfig(base_model="m", out="o", first_seed=999_990, num_mazes=20)
    config = SftConfig(base_model="m", out="o", first_seed=999_000, num_mazes=1000)
    assert not any(is_eval_seed(s) for s in range(config.first_seed, config.first_seed + config.num_mazes))


def test_a_short_sft_learns_the_expert_moves_and_saves_a_loadable_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText

    from mmrl.v1 import env_pb2_grpc
    from services.common.grpc_server import start_server
    from services.env.config import EnvConfig
    from services.env.environment import MazeEnv
    from services.env.servicer import SERVICE_NAME, EnvServicer

    async def serve_and_train() -> dict:
        servicer = EnvServicer(MazeEnv(EnvConfig()))
        running = await start_server(lambda s: env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, s),
                                     SERVICE_NAME, "127.0.0.1:0")
        try:
            config = SftConfig(base_model=str(tiny_model_dir), out=str(tmp_path / "sft"), num_mazes=8,
                               updates=8, batch_size=4, micro_batch_size=4, warmup_steps=0,
                               learning_rate=3e-3)
            return await asyncio.to_thread(train_sft, config, f"127.0.0.1:{running.port}", lambda _m: None)
        finally:
            await running.stop()

    report = asyncio.run(serve_and_train())
    losses = [h["loss"] for h in report["loss_history"]]
    assert report["num_conversations"] == 8  # every expert episode reaches the goal
    assert losses[-1] < 0.5 * losses[0]
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "sft")
    assert model.config.image_token_id
    assert (tmp_path / "sft" / "sft_report.json").is_file() and (tmp_path / "sft" / "tokenizer.json").is_file()
