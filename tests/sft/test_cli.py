"""`mmrl sft` with `band`: each check plays the validation tasks through real env and rollout services
(vLLM on the CPU) on the checkpoint just saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmrl.cli.sft import run_sft
from mmrl.sft.config import SftConfig

pytestmark = pytest.mark.slow


def test_a_check_evaluates_the_saved_checkpoint_on_the_validation_tasks(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft"
    config = SftConfig(base_model=str(tiny_model_dir), out=str(out), num_tasks=4, updates=2, batch_size=4,
                       optim={"micro_batch_size": 4, "warmup_steps": 0}, band=[0.0, 0.9], check_from=2,
                       check_tasks=4, check_samples=2)
    report = run_sft(config, tmp_path / "state", evaluate_after=False, quiet=True)
    [entry] = report["checks"]
    assert entry["updates"] == 2 and entry["episodes"] == 4
    assert entry["validation_solve_rate"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    assert entry["validation_loops"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    assert entry["validation_solve_rate"] + entry["validation_loops"] <= 1.0
    assert entry["sampled_episodes"] == 8 and entry["validation_sampled_rate"] in [i / 8 for i in range(9)]
    assert report["updates"] == 2 and json.loads((out / "sft_report.json").read_text())["checks"] == [entry]
    log = (tmp_path / "state" / "logs" / "rollout.log").read_text()
    assert str(out.resolve()) in log  # the rollout service served the checkpoint, not the base model


def test_the_eval_after_the_sft_sets_the_start_beside_chance(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft"
    config = SftConfig(base_model=str(tiny_model_dir), out=str(out), num_tasks=4, updates=1, batch_size=4,
                       optim={"micro_batch_size": 4, "warmup_steps": 0})
    report = run_sft(config, tmp_path / "state", evaluate_after=True, quiet=True)
    saved = json.loads((out / "sft_report.json").read_text())
    assert saved["eval"]["episodes"] == 64
    chance = saved["chance"]
    assert (chance["env"], chance["tasks"], chance["samples"]) == ("maze", 64, 16)
    assert 0.0 <= chance["chance_solve_rate"] <= chance["chance_pass_rate"] <= 1.0
    assert report["chance"] == chance
