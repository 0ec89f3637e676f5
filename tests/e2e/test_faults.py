"""Fault injection on every real service (`mmrl bench faults`): one tiny run, each of env, rollout,
learner, coordinator and Redis SIGKILLed mid-step in turn and started again on its address. The run
finishes by itself, each step recorded and announced once, adapter versions consecutive with valid
manifests, every episode sampled with its step's adapter. Several minutes on two CPU cores."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmrl.bench.faults import KILL_ORDER, SMALL, passed, run_faults, table
from mmrl.cli.run import load_config_dict
from mmrl.cli.stack import Stack, StackConfig

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_a_run_survives_each_service_killed_mid_step(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = load_config_dict(ROOT / "configs" / "maze-tiny-cpu.yaml",
                              {**SMALL, "steps": 2 * len(KILL_ORDER) + 4, "model": str(tiny_model_dir)})
    with Stack(StackConfig(model=tiny_model_dir, state_dir=tmp_path, lora_rank=config["lora"]["rank"])) as stack:
        stack.start(log=False)
        result = run_faults(stack, config, KILL_ORDER, mid_step_s=1.0, log=False)
    print(table(result))
    assert passed(result, KILL_ORDER), result
