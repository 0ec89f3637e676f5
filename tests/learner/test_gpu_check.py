"""scripts/gpu-check.sh: it refuses at once without CUDA, and its whole code path runs on the CPU
with a tiny model in an environment like the GPU machine's (no pydantic, protobuf, gRPC, vLLM or
torchvision)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What the GPU machine lacks: importing any of them there fails, so here they are made to fail too.
ABSENT = ("pydantic", "pydantic_settings", "grpc", "google.protobuf", "vllm", "fastapi", "redis", "torchvision")
BLOCKED = (
    "import runpy, sys\n"
    f"for name in {ABSENT!r}:\n"
    "    sys.modules[name] = None\n"
    "sys.argv = ['gpu-check', *sys.argv[1:]]\n"
    "runpy.run_module('mmrl.bench.gpu', run_name='__main__')\n"
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}


def test_without_cuda_the_check_stops_at_once_with_one_line_naming_cuda() -> None:
    start = time.monotonic()
    done = subprocess.run([str(REPO / "scripts" / "gpu-check.sh")], env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "CUDA is not available" in lines[0], done.stderr
    assert done.stdout == ""
    assert time.monotonic() - start < 60


@pytest.mark.slow
def test_the_whole_check_runs_on_a_tiny_model_on_the_cpu_without_the_services_dependencies() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, "--device", "cpu", "--tiny", "--groups", "2", "--group-size", "2",
         "--turns", "2", "--steps", "1", "--time-limit-s", "300"],
        env=_env(), capture_output=True, text=True, timeout=400, cwd=REPO,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0 and report["ok"], (report, done.stderr[-3000:])
    assert report["backend"] == "gloo" and report["device"] == "cpu"
    assert [phase["activation_checkpointing"] for phase in report["learner"]] == [False, True]
    for phase in report["learner"]:
        assert phase["finite"] and phase["grad_norm"] > 0 and phase["train_tokens_per_s"] > 0
    # bfloat16 costs log-prob precision, and by a bounded amount
    assert 0 < report["logprob_abs_diff_bf16_vs_fp32"] < 0.1
    assert report["loader"] == {**report["loader"], "ok": True, "max_abs_diff": 0.0}
    assert report["vllm"]["skipped"] and "vllm is not installed" in report["vllm"]["reason"]


def test_the_check_runs_with_the_learners_run_defaults() -> None:
    from mmrl.bench.gpu import RUN_DEFAULTS
    from services.common.training import TrainSettings

    assert RUN_DEFAULTS == TrainSettings().model_dump()


def test_the_time_limit_interrupts_a_check_that_overruns_it() -> None:
    from mmrl.bench import gpu as gpu_check

    with pytest.raises(gpu_check.CheckTimeout, match="time limit of 0 s"), gpu_check.time_limit(0.05):
        time.sleep(1)


@pytest.mark.slow
def test_the_vllm_part_runs_the_rollout_engine_and_registry_on_the_cpu_backend() -> None:
    pytest.importorskip("vllm")
    done = subprocess.run(
        [sys.executable, "-m", "mmrl.bench.gpu", "--device", "cpu", "--tiny", "--groups", "2",
         "--group-size", "2", "--turns", "2", "--steps", "1", "--vllm-prompts", "8", "--time-limit-s", "400"],
        env=_env(), capture_output=True, text=True, timeout=500, cwd=REPO,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0 and report["ok"], (report, done.stderr[-3000:])
    vllm = report["vllm"]
    assert vllm["dtype"] == "float32" and vllm["engine_start_s"] > 0 and vllm["adapter_load_ms"] > 0
    # The published version's probe, scored by the engine: the learner's values, and the adapter shows.
    assert vllm["probe"]["gap"] < 1e-4 and vllm["probe"]["served_effect"] > 10 * vllm["probe"]["tolerance"]
    assert vllm["generate"]["generated_tokens"] > 0 and vllm["generate"]["generated_tokens_per_s"] > 0
    assert vllm["sleep"]["skipped"] and "GPU" in vllm["sleep"]["reason"]
    agreement = vllm["logprob_abs_diff_vs_learner"]
    assert agreement["tokens"] > 0 and agreement["mean"] < 1e-4, agreement
