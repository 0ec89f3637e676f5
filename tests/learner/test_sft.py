"""SFT: expert data through a real env service, and the seed ranges it may use."""

from __future__ import annotations

import asyncio
import itertools
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


def _untrained_runs(config: SftConfig, tokenizer_dir: Path) -> tuple[list[int], list[tuple[int, ...]]]:
    """Expert data from a real env service: lengths of the runs of consecutive untrained (detour)
    turns, and every conversation's token ids."""
    from transformers import AutoTokenizer

    from mmrl.v1 import env_pb2_grpc
    from services.common.grpc_server import start_server
    from services.env.config import EnvConfig
    from services.env.environment import MazeEnv
    from services.env.servicer import SERVICE_NAME, EnvServicer
    from services.learner.sft import expert_conversations

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)

    async def play() -> list:
        servicer = EnvServicer(MazeEnv(EnvConfig()))
        running = await start_server(lambda s: env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, s),
                                     SERVICE_NAME, "127.0.0.1:0")
        try:
            return await asyncio.to_thread(expert_conversations, f"127.0.0.1:{running.port}", config, tokenizer,
                                           lambda _frame: 25)
        finally:
            await running.stop()

    runs = []
    trajectories = asyncio.run(play())
    for traj in trajectories:
        bounds = [*traj.turn_starts, len(traj.token_ids)]
        trained = [any(traj.loss_mask[a:b]) for a, b in itertools.pairwise(bounds)]
        run = 0
        for flag in [*trained, True]:
            if not flag:
                run += 1
            elif run:
                runs.append(run)
                run = 0
    return runs, [t.token_ids for t in trajectories]


def test_detours_of_several_moves_lead_the_expert_data_off_the_path(tiny_model_dir: Path) -> None:
    common = {"base_model": "m", "out": "o", "num_mazes": 48, "perturb_prob": 0.1}
    single, single_ids = _untrained_runs(SftConfig(**common), tiny_model_dir)
    _, explicit_ids = _untrained_runs(SftConfig(**common, detour_moves=1), tiny_model_dir)
    longer, _ = _untrained_runs(SftConfig(**common, detour_moves=4), tiny_model_dir)
    assert explicit_ids == single_ids  # the default plays exactly the data it played before the setting existed
    assert SftConfig(**common).fingerprint() == SftConfig(**common, detour_moves=1).fingerprint()
    assert SftConfig(**common).fingerprint() != SftConfig(**common, detour_moves=4).fingerprint()
    assert single and longer
    assert max(longer) >= 3 and sum(longer) / len(longer) > 1.5 > sum(single) / len(single)
