"""Two learner pools sharing one rollout replica, every service real: two runs posted together run at
once, one on each pool, and a third posted meanwhile waits in the queue and starts when a pool frees.
Each run ends with every step recorded once, its own adapter versions (probed by the replica on each
load) and every episode sampled with its own step's version."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mmrl.bench.faults import SMALL, Api
from mmrl.bench.pools import ENDED, run_report
from mmrl.cli.run import load_config_dict
from mmrl.cli.stack import Stack, StackConfig

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_runs_on_two_pools_share_a_rollout_and_a_third_waits_in_the_queue(tmp_path: Path,
                                                                         tiny_model_dir: Path) -> None:
    config = load_config_dict(ROOT / "configs" / "maze-tiny-cpu.yaml",
                              {**SMALL, "steps": 3, "checkpoint_interval": 10_000, "model": str(tiny_model_dir)})
    with Stack(StackConfig(model=tiny_model_dir, state_dir=tmp_path, lora_rank=config["lora"]["rank"],
                           learner_pools=2)) as stack:
        stack.start(log=False)
        api, client = Api(stack), stack.client()
        first, second, third = (client.start(config)["id"] for _ in range(3))
        queued = api.get(f"/v1/runs/{third}")
        assert queued["state"] == "queued" and queued["queue_position"] == 1, queued
        listed = api.get("/v1/runs", state="queued")["runs"]
        assert [run["id"] for run in listed] == [third]

        together = False
        deadline = time.monotonic() + 1500
        while time.monotonic() < deadline:
            runs = {run_id: api.get(f"/v1/runs/{run_id}") for run_id in (first, second, third)}
            together = together or (runs[first]["state"] == runs[second]["state"] == "running")
            if all(run["state"] in ENDED for run in runs.values()):
                break
            time.sleep(0.5)
        reports = [run_report(stack, api, runs[run_id]) for run_id in (first, second, third)]

    assert together, ("the first two runs never ran at the same time", reports)
    assert {reports[0]["learner"], reports[1]["learner"]} == set(stack.environment()["MMRL_LEARNER_ADDRS"].split(","))
    for report in reports:
        assert report["state"] == "succeeded", report
        assert report["steps"] == 3 and report["steps_exact"], report
        assert report["adapters_valid"] and report["sampled_as_meant"], report
