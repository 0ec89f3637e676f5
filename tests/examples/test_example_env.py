"""The example env (examples/brighter/server.py) as a real process: it passes `mmrl env check`, and
a short GRPO run trains on it through the real coordinator, rollout (vLLM CPU) and learner, its
episodes mixing text-only turns and two-image turns."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmrl.cli.run import ApiClient, load_config_dict
from mmrl.cli.stack import Stack, StackConfig
from services.common.grpc_server import check_health
from services.common.procs import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "brighter"


@pytest.fixture(scope="module")
def example_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The example server started as its README says, on a free port; yields its address."""
    address = f"127.0.0.1:{free_port()}"
    log = tmp_path_factory.mktemp("example-env") / "server.log"
    with open(log, "wb") as handle:
        proc = subprocess.Popen([sys.executable, str(EXAMPLE / "server.py"), "--port", address.split(":")[1]],
                                stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not asyncio.run(check_health(address)):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the example server did not become healthy in 60 s"
            time.sleep(0.2)
        yield address
    finally:
        stop_process(proc)


def test_the_example_env_passes_mmrl_env_check(example_env: str) -> None:
    done = subprocess.run([sys.executable, "-m", "mmrl.cli.main", "env", "check", example_env, "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["passed"] is True and len(report["checks"]) == 18
    observations = next(c for c in report["checks"] if c["name"] == "observations")
    assert observations["detail"] == "5 observations (0 images: 3, 2 images: 2); sizes 32x32"


def test_the_example_run_config_is_valid_and_expects_the_example_env() -> None:
    config = load_config_dict(EXAMPLE / "run.yaml", {})
    assert config["env"]["name"] == "brighter" and config["endpoints"]["env"] == []  # the stack's: mmrl up --env


def _wait(api: ApiClient, run_id: str, timeout_s: float = 900) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = api.run(run_id)
        if run["state"] in ("succeeded", "failed", "stopped"):
            return run
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting on run {run_id}: {api.run(run_id)}")


@pytest.mark.slow
def test_a_grpo_run_trains_on_the_example_env_through_the_real_coordinator(
    example_env: str, tiny_model_dir: Path, tmp_path: Path,
) -> None:
    config = load_config_dict(EXAMPLE / "run.yaml", {
        "model": str(tiny_model_dir), "steps": 2, "checkpoint_interval": 2,
        "grpo.group_size": 2, "grpo.tasks_per_step": 2, "eval.max_tasks": 4, "eval.sampled_samples": 1,
        "eval.interval": 100, "optim.micro_batch_size": 4, "frames.train": "all",
    })
    with Stack(StackConfig(model=tiny_model_dir, state_dir=tmp_path, env_addr=example_env)) as stack:
        stack.start(log=False)  # the example env, started apart, instead of the maze
        api = stack.client()
        run = _wait(api, api.start(config)["id"])
        assert run["state"] == "succeeded", run["failure_reason"]
        run_id = run["id"]
        metrics = api.request("GET", f"/v1/runs/{run_id}/metrics")["metrics"]
        train = api.request("GET", f"/v1/runs/{run_id}/episodes", params={"kind": "train"})["episodes"]
        evals = api.request("GET", f"/v1/runs/{run_id}/evals")["evals"]

    assert [m["step"] for m in metrics] == [1, 2]
    assert [m["train/num_trajectories"] for m in metrics] == [4, 4]
    # The learner's log-probs of the sampled tokens, over text-only and two-image turns, match vLLM's.
    assert all(m["train/logprob_abs_diff_vs_rollout"] < 1e-3 for m in metrics), metrics
    assert len(train) == 2 * 2 * 2
    for episode in train:
        # 4 questions, one per turn: turns 0 and 2 text-only, turns 1 and 3 two images each.
        assert len(episode["actions"]) == 4 and episode["moves"] == 4
        assert len(episode["frames"]) == 4
    assert [e["step"] for e in evals] == [0, 2]
    assert all(0.0 <= e["greedy_solve_rate"] <= 1.0 and e["episodes"] == 4 for e in evals)


@pytest.mark.slow
def test_a_stack_on_the_example_env_accepts_the_example_run_config_as_shipped(
    example_env: str, tiny_model_dir: Path, tmp_path: Path,
) -> None:
    """The quickstart's 422, mended: with the stack's env the example server (`mmrl up --env ADDR`), the
    shipped run.yaml, which names no endpoint, is admitted (the coordinator alone: no run is driven)."""
    config = load_config_dict(EXAMPLE / "run.yaml", {"model": str(tiny_model_dir)})
    with Stack(StackConfig(model=tiny_model_dir, state_dir=tmp_path, env_addr=example_env)) as stack:
        stack.start(("env", "coordinator"), log=False)  # the env is the example's: only the coordinator starts
        assert set(stack.procs) == {"redis", "coordinator"}
        run = stack.client().start(config)
    assert run["id"].startswith("brighter-tiny-cpu-")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_quickstart_as_typed_trains_on_the_example_through_mmrl_up_env(
    example_env: str, tiny_model_dir: Path, tmp_path: Path,
) -> None:
    """docs/environments.md as a user types it: the example server, `mmrl up --env ADDR`, then
    `mmrl run start --config examples/brighter/run.yaml` (refused with 422 while the stack knew no such
    env): the run is accepted and trains a step on the example env."""
    (tmp_path / ".mmrl" / "models").mkdir(parents=True)
    (tmp_path / ".mmrl" / "models" / "tiny").symlink_to(tiny_model_dir)  # what `mmrl up` would build there
    api_url = f"http://127.0.0.1:{free_port()}"
    mmrl = [sys.executable, "-m", "mmrl.cli.main"]
    with open(tmp_path / "up.log", "wb") as log:
        up = subprocess.Popen([*mmrl, "up", "--env", example_env, "--port", api_url.rsplit(":", 1)[1]],
                              cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 1200
        while "MMRL is up" not in (tmp_path / "up.log").read_text():
            assert up.poll() is None and time.monotonic() < deadline, (tmp_path / "up.log").read_text()
            time.sleep(1)
        started = subprocess.run([*mmrl, "run", "--api", api_url, "start", "--config", str(EXAMPLE / "run.yaml")],
                                 cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert started.returncode == 0, started.stdout + started.stderr
        run_id = started.stdout.strip().splitlines()[-1]
        api = ApiClient(api_url)
        while api.run(run_id)["step"] < 1:
            run = api.run(run_id)
            assert run["state"] in ("pending", "running") and time.monotonic() < deadline, run
            time.sleep(1)
        metrics = api.request("GET", f"/v1/runs/{run_id}/metrics")["metrics"]
        assert metrics[0]["train/num_trajectories"] == 4 * 8  # the example's group_size x tasks_per_step
        api.request("POST", f"/v1/runs/{run_id}/stop")
    finally:
        stop_process(up, timeout_s=60)
    assert f"env at {example_env} is healthy (not started here)" in (tmp_path / "up.log").read_text()
