"""SFT on Sokoban: expert data from the env service's training tasks and oracle; the maze's SFT unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from mmrl.sft.train import SftConfig, expert_conversations, train_sft
from services.env.sokoban.env import SokobanEnv
from services.env.sokoban.evalset import get_eval_set
from tests.learner.env_service import with_env_service

SOKOBAN = {"base_model": "m", "out": "o", "env": "sokoban", "options": {"size": "5", "pulls": "4"}}


def test_the_env_setting_leaves_the_maze_fingerprint_alone_and_is_checked() -> None:
    maze = {"base_model": "m", "out": "o", "num_mazes": 8}
    assert SftConfig(**maze).fingerprint() == SftConfig(**maze, env="maze", options={}).fingerprint()
    assert SftConfig(**SOKOBAN).fingerprint() != SftConfig(**{**SOKOBAN, "env": "maze", "options": {}}).fingerprint()
    with pytest.raises(ValidationError, match="maze only"):
        SftConfig(**SOKOBAN, stop_above=0.5)
    with pytest.raises(ValidationError, match="maze only"):
        SftConfig(**SOKOBAN, reading_updates=2)
    with pytest.raises(ValidationError, match="options"):
        SftConfig(**maze, options={"size": "5"})


def test_sokoban_expert_data_solves_training_levels_never_in_an_eval_set(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = SftConfig(**{**SOKOBAN, "num_mazes": 24})
    data = with_env_service(lambda address: expert_conversations(address, config, tokenizer, lambda _f: 25),
                            SokobanEnv())
    assert len(data) == 24  # the oracle solves every level
    eval_seeds = {s.seed for name in ("sokoban-64", "sokoban-held-out-128") for s in get_eval_set(name).specs}
    seeds = {int(t.trajectory_id.removeprefix("sft-")) for t in data}
    assert len(seeds) == 24 and not seeds & eval_seeds and max(seeds) < 1_000_000
    trained = {tokenizer.decode([i]) for t in data for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m}
    assert trained <= {"up", "down", "left", "right", "<|im_end|>"}


def test_an_sft_config_for_sokoban_refuses_a_maze_env_service(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError, match="the env service is 'maze'"):
        with_env_service(lambda address: expert_conversations(address, SftConfig(**SOKOBAN), tokenizer,
                                                              lambda _f: 25))


def test_a_short_sokoban_sft_learns_the_expert_moves(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = SftConfig(**{**SOKOBAN, "base_model": str(tiny_model_dir), "out": str(tmp_path / "sft")}, num_mazes=8,
                       updates=8, batch_size=4, micro_batch_size=4, warmup_steps=0, learning_rate=3e-3)
    report = with_env_service(lambda address: train_sft(config, address, lambda _m: None), SokobanEnv())
    losses = [h["loss"] for h in report["loss_history"]]
    assert report["num_conversations"] == 8 and losses[-1] < 0.5 * losses[0]
    assert (tmp_path / "sft" / "config.json").is_file()


def test_the_shipped_sokoban_sft_config_matches_its_run_config() -> None:
    from mmrl.cli.run import load_config_dict
    from mmrl.cli.sft import load_sft_config

    root = Path(__file__).resolve().parents[2]
    sft = load_sft_config(root / "configs" / "sft-sokoban-tiny.yaml", None, None)
    run = load_config_dict(root / "configs" / "sokoban-tiny-cpu.yaml", {})
    assert sft.env == run["env"]["name"] == "sokoban"
    assert sft.options == run["env"]["options"] and sft.max_moves == run["env"]["max_moves"]
    assert sft.system_prompt == run["system_prompt"]
