"""End to end with every real service: Redis, env, vLLM rollout (CPU), learner, coordinator.

A short GRPO run of the tiny config through the REST API, then a run whose coordinator is killed
mid-run and restarted: it finishes with each step recorded exactly once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mmrl.cli.run import ApiClient, load_config_dict
from mmrl.cli.stack import Stack, StackConfig
from mmrl_proto.v1 import rollout_pb2, rollout_pb2_grpc
from services.common import storage
from services.common.grpc_server import channel

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

SMALL = {
    "grpo.group_size": 2, "grpo.tasks_per_step": 2, "grpo.group_sampling": "plain", "grpo.max_sampling_rounds": None,
    "env.max_moves": 6, "eval.max_tasks": 4, "eval.sampled_samples": 1, "eval.interval": 100,
    "optim.micro_batch_size": 4, "sampling.max_tokens": 3,
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Stack]:
    state = tmp_path_factory.mktemp("stack")
    with Stack(StackConfig(model=tiny_model_dir, state_dir=state)) as running:
        running.start(log=False)
        yield running


def _config(model: Path, **overrides: Any) -> dict[str, Any]:
    return load_config_dict(ROOT / "configs" / "maze-tiny-cpu.yaml",
                            {**SMALL, "model": str(model), **overrides})


def _wait(api: ApiClient, run_id: str, done: Any, timeout_s: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = api.run(run_id)
        if done(run):
            return run
        assert run["state"] not in ("failed", "stopped"), run["failure_reason"]
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting on run {run_id}: {api.run(run_id)}")


async def _loaded_adapters(address: str) -> list[Any]:
    async with channel(address) as ch:
        reply = await rollout_pb2_grpc.RolloutServiceStub(ch).ListAdapters(rollout_pb2.ListAdaptersRequest())
    return list(reply.adapters)


def test_a_short_grpo_run_publishes_loads_and_records_everything(stack: Stack, tiny_model_dir: Path) -> None:
    api = stack.client()
    run_id = api.start(_config(tiny_model_dir, steps=3, checkpoint_interval=2,
                               **{"eval.held_out_set": "maze-held-out-256"}))["id"]
    run = _wait(api, run_id, lambda r: r["state"] == "succeeded")
    assert run["step"] == 3

    metrics = api.request("GET", f"/v1/runs/{run_id}/metrics")["metrics"]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    published = [m["adapter/published"] for m in metrics]
    assert published == sorted(published) and len(set(published)) == 3
    # Step s samples with the version published after step s-1 (the base model for step 1).
    assert [m["adapter/sampled_with"] for m in metrics] == [0, *published[:-1]]
    assert all("train/logprob_abs_diff_vs_rollout" in m for m in metrics)
    # Each turn's prompt extends the last: the engine's prefix cache serves part of it.
    assert all(0 < m["rollout/prefix_cached_fraction"] < 1 for m in metrics)

    versions = storage.list_adapter_versions(stack.config.shared_root, run_id)
    assert [v for v, _ in versions] == list(range(1, published[-1] + 1))
    for _, directory in versions:
        storage.verify_manifest(directory)
    # The run ended: the replica released its adapters, so they take no room from other runs' (its
    # final version was loaded to play the last eval: below).
    loaded = asyncio.run(_loaded_adapters(stack.address("rollout")))
    assert not [a for a in loaded if a.run_id == run_id], loaded

    episodes = api.request("GET", f"/v1/runs/{run_id}/episodes", params={"kind": "train"})["episodes"]
    assert len(episodes) == 3 * 2 * 2
    for episode in episodes:
        assert episode["adapter_version"] == metrics[episode["step"] - 1]["adapter/sampled_with"]

    evals = api.request("GET", f"/v1/runs/{run_id}/evals")["evals"]
    assert [e["step"] for e in evals] == [0, 3]
    assert [e["adapter_version"] for e in evals] == [0, published[-1]]  # the last eval played the final version
    # The held-out set is played by the start (with the step-0 eval) and by the final policy, its time
    # kept apart from the fixed set's eval_s, which the demo's time budget counts.
    for e in evals:
        assert e["held_out_set"] == "maze-held-out-256" and e["held_out_episodes"] == 256
        assert 0.0 <= e["held_out_solve_rate"] <= 1.0 and e["held_out_eval_s"] > 0 and e["eval_s"] > 0
        failed = sum(e[f"held_out_failed_{mode}"] for mode in ("stuck", "cycling", "other"))
        assert failed == pytest.approx(1.0 - e["held_out_solve_rate"])  # every failed episode failed one way
    # One sampled episode per maze: solved by at least one is solved.
    assert all(e["sampled_pass_rate"] == e["sampled_solve_rate"] for e in evals)
    for e in evals:  # the greedy solve rate is that of the greedy episodes recorded with the eval
        recorded = api.request("GET", f"/v1/runs/{run_id}/episodes", params={"kind": "eval", "step": e["step"]})
        assert len(recorded["episodes"]) == 4
        assert e["greedy_solve_rate"] == sum(r["solved"] for r in recorded["episodes"]) / 4
    eval_episode = api.request("GET", f"/v1/runs/{run_id}/episodes", params={"kind": "eval", "step": 3})
    first = eval_episode["episodes"][0]
    assert first["frames"] and all((stack.config.shared_root / "runs" / run_id / f).is_file() for f in first["frames"])
    image = httpx.get(f"{stack.api_url}/v1/runs/{run_id}/episodes/{first['id']}/frames/0", timeout=30)
    assert image.headers["content-type"] == "image/png" and image.content.startswith(b"\x89PNG")

    events = httpx.get(f"{stack.api_url}/v1/runs/{run_id}/events", timeout=30).text
    for kind in ("state", "step", "eval", "adapter"):
        assert f"event: {kind}\n" in events, kind
    assert '"succeeded"' in events


def _scrape(url: str) -> dict[str, list[Any]]:
    """family name -> samples of one /metrics endpoint."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url, timeout=30).text
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def _total(families: dict[str, list[Any]], family: str, sample: str | None = None, **labels: str) -> float:
    return sum(s.value for s in families.get(family, [])
               if s.name == (sample or family) and all(s.labels.get(k) == v for k, v in labels.items()))


def test_every_service_serves_its_metrics_during_a_run_and_tensorboard_holds_the_steps(
        stack: Stack, tiny_model_dir: Path, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mmrl.cli.run import main as run_cli

    api = stack.client()
    run_id = api.start(_config(tiny_model_dir, steps=3, checkpoint_interval=2))["id"]
    _wait(api, run_id, lambda r: r["step"] >= 1)
    during = {s: _scrape(stack.metrics_url(s)) for s in ("env", "rollout", "learner", "coordinator")}
    run = _wait(api, run_id, lambda r: r["state"] == "succeeded")
    after = {s: _scrape(stack.metrics_url(s)) for s in ("env", "rollout", "learner", "coordinator")}

    env, rollout, learner, coordinator = (after[s] for s in ("env", "rollout", "learner", "coordinator"))
    assert _total(during["env"], "mmrl_env_steps", "mmrl_env_steps_total") > 0
    assert _total(env, "mmrl_env_episodes_created", "mmrl_env_episodes_created_total") >= 3 * 4
    assert _total(env, "mmrl_env_step_seconds", "mmrl_env_step_seconds_count") > 0
    assert "mmrl_env_active_episodes" in env and "mmrl_env_errors" in env
    # Rollout: the service's own metrics and vLLM's, as vLLM names them.
    assert _total(rollout, "mmrl_rollout_generate_seconds", "mmrl_rollout_generate_seconds_count") > 0
    assert _total(rollout, "mmrl_rollout_adapter_loads", "mmrl_rollout_adapter_loads_total") >= 3
    assert _total(rollout, "mmrl_rollout_adapter_version", run_id=run_id) == run["adapter_version"] >= 3
    assert _total(rollout, "vllm:generation_tokens", "vllm:generation_tokens_total") > 0
    assert _total(rollout, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") > 0
    assert "vllm:kv_cache_usage_perc" in rollout and "vllm:num_requests_running" in rollout
    # Learner: train step, throughput, loss, grad norm, the log-prob gap, publish and checkpoint times, memory.
    assert _total(learner, "mmrl_learner_train_steps", "mmrl_learner_train_steps_total") >= 3
    assert _total(learner, "mmrl_learner_tokens_per_second") > 0
    assert _total(learner, "mmrl_learner_grad_norm") > 0
    assert 0 <= _total(learner, "mmrl_learner_logprob_abs_diff_vs_rollout") < 1e-3
    assert _total(learner, "mmrl_learner_publish_seconds", "mmrl_learner_publish_seconds_count") >= 3
    assert _total(learner, "mmrl_learner_checkpoint_seconds", "mmrl_learner_checkpoint_seconds_count") >= 2
    assert _total(learner, "mmrl_learner_memory_bytes") > 50 * 2**20
    # Coordinator: the run's step, reward, solve rates, phase histograms, states, its calls to the services.
    assert _total(during["coordinator"], "mmrl_run_step", run_id=run_id) >= 1
    assert _total(coordinator, "mmrl_run_step", run_id=run_id) == 3
    assert _total(coordinator, "mmrl_runs", state="succeeded") >= 1
    for phase in ("rollout", "env", "train", "sync", "eval"):
        assert _total(coordinator, "mmrl_run_phase_seconds", "mmrl_run_phase_seconds_count",
                      run_id=run_id, phase=phase) >= 1, phase
    assert _total(coordinator, "mmrl_grpc_client_calls", "mmrl_grpc_client_calls_total",
                  service="RolloutService", method="Generate", code="OK") > 0
    # Every metric the dashboard queries is among what the services served.
    from tests.promql import PROMETHEUS_OWN, dashboard_queries, metric_names

    # (A labelled counter nothing has incremented, e.g. errors by code, is served as a family without samples.)
    served = {s.name for families in after.values() for samples in families.values() for s in samples}
    families = {name for scraped in after.values() for name in scraped}
    used = {n for expr in dashboard_queries() for n in metric_names(expr)}
    missing = {n for n in used - served - PROMETHEUS_OWN if n.removesuffix("_total") not in families
               and not n.startswith(("mmrl_learner_gpu", "mmrl_run_eval_", "mmrl_run_reward", "mmrl_run_train"))}
    # (GPU memory needs a GPU; the newest-values gauges are read for running and paused runs only.)
    assert not missing, sorted(missing)

    # TensorBoard event files of the run, read back; and `mmrl run plot` draws its curve.
    events = EventAccumulator(str(stack.config.shared_root / "runs" / run_id / "tensorboard"))
    events.Reload()
    metrics = api.request("GET", f"/v1/runs/{run_id}/metrics")["metrics"]
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [
        (m["step"], pytest.approx(m["reward/mean"])) for m in metrics]
    assert {"train/loss", "train/grad_norm", "time/step_s", "eval/greedy_solve_rate"} <= set(events.Tags()["scalars"])
    assert events.Tags()["images"] == ["eval/episodes"]
    assert run_cli(["--api", stack.api_url, "--token", stack.config.api_token, "plot", run_id,
                    "--out", str(tmp_path / "curve.png")]) == 0
    assert (tmp_path / "curve.png").stat().st_size > 1000 and (tmp_path / "curve.json").is_file()


def test_async_rollout_samples_the_next_step_with_the_version_before(stack: Stack, tiny_model_dir: Path) -> None:
    api = stack.client()
    run_id = api.start(_config(tiny_model_dir, steps=4, **{
        "grpo.async_rollout": True, "loss.tis_cap": 2.0, "loss.old_logprobs": "learner"}))["id"]
    run = _wait(api, run_id, lambda r: r["state"] == "succeeded")
    assert run["step"] == 4
    metrics = api.request("GET", f"/v1/runs/{run_id}/metrics")["metrics"]
    published = [m["adapter/published"] for m in metrics]
    assert published == sorted(published) and len(set(published)) == 4
    # Step s+1 is played while the learner trains on step s, by the version step s started from.
    assert [m["adapter/sampled_with"] for m in metrics] == [0, 0, *published[:-2]]
    episodes = api.request("GET", f"/v1/runs/{run_id}/episodes", params={"kind": "train"})["episodes"]
    assert len(episodes) == 4 * 2 * 2
    for episode in episodes:
        assert episode["adapter_version"] == metrics[episode["step"] - 1]["adapter/sampled_with"]
    assert all(0.0 < m["train/tis_weight_mean"] <= 2.0 for m in metrics)
    assert [m["train/num_trajectories"] for m in metrics] == [4] * 4
    evals = api.request("GET", f"/v1/runs/{run_id}/evals")["evals"]
    assert [e["step"] for e in evals] == [0, 4]


def test_a_windowed_run_trains_one_trajectory_per_turn_on_what_the_engine_sampled(
        stack: Stack, tiny_model_dir: Path) -> None:
    api = stack.client()
    run_id = api.start(_config(tiny_model_dir, steps=2, history_window=1))["id"]
    run = _wait(api, run_id, lambda r: r["state"] == "succeeded")
    assert run["step"] == 2
    metrics = api.request("GET", f"/v1/runs/{run_id}/metrics")["metrics"]
    episodes = api.request("GET", f"/v1/runs/{run_id}/episodes", params={"kind": "train"})["episodes"]
    for step, m in enumerate(metrics, start=1):
        turns = [len(e["actions"]) for e in episodes if e["step"] == step]
        assert len(turns) == 4 and m["train/num_trajectories"] == sum(turns) > 4
        # The learner scores each turn's prompt (system, last turn, observation) as the engine did.
        assert m["train/logprob_abs_diff_vs_rollout"] < 1e-4
    assert all(len(e["logprobs"]) == len(e["actions"]) for e in episodes)


def test_a_coordinator_killed_mid_run_resumes_and_counts_each_step_once(stack: Stack, tiny_model_dir: Path) -> None:
    api = stack.client()
    run_id = api.start(_config(tiny_model_dir, steps=5, checkpoint_interval=2))["id"]
    _wait(api, run_id, lambda r: r["step"] >= 3)
    stack.kill("coordinator")
    stack.start(("coordinator",), log=False)
    api = stack.client()
    run = _wait(api, run_id, lambda r: r["state"] == "succeeded")
    assert run["step"] == 5
    metrics = api.request("GET", f"/v1/runs/{run_id}/metrics")["metrics"]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
    train = api.request("GET", f"/v1/runs/{run_id}/episodes", params={"kind": "train"})["episodes"]
    assert sorted(e["step"] for e in train) == sorted([s for s in range(1, 6) for _ in range(4)])
    evals = api.request("GET", f"/v1/runs/{run_id}/evals")["evals"]
    assert [e["step"] for e in evals] == [0, 5]


def test_a_paused_run_checkpoints_where_it_paused_and_resumes_there(stack: Stack, tiny_model_dir: Path) -> None:
    api = stack.client()
    run_id = api.start(_config(tiny_model_dir, steps=4, checkpoint_interval=10))["id"]
    _wait(api, run_id, lambda r: r["step"] >= 1)
    api.request("POST", f"/v1/runs/{run_id}/pause")
    paused = _wait(api, run_id, lambda r: r["state"] == "paused")
    assert paused["checkpoint_step"] == paused["step"] >= 1  # between interval checkpoints
    assert api.request("POST", f"/v1/runs/{run_id}/resume")["state"] == "pending"
    run = _wait(api, run_id, lambda r: r["state"] == "succeeded")
    assert run["step"] == 4
    steps = [data["step"] for kind, data in _events(stack, run_id) if kind == "step"]
    assert steps == [1, 2, 3, 4]  # each step played once: nothing replayed after the resume


def _events(stack: Stack, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    text = stack.client().http.get(f"/v1/runs/{run_id}/events", params={"follow": False}).text
    events = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            events.append((fields["event"], json.loads(fields["data"])))
    return events


def test_a_learner_killed_mid_run_comes_back_and_the_run_resumes_from_its_checkpoint(
    stack: Stack, tiny_model_dir: Path
) -> None:
    api = stack.client()
    run_id = api.start(_config(tiny_model_dir, steps=8, checkpoint_interval=2))["id"]
    _wait(api, run_id, lambda r: r["step"] >= 2)
    stack.kill("learner")
    stack.start(("learner",), log=False)  # same port; it holds no run until the coordinator configures it
    run = _wait(api, run_id, lambda r: r["state"] == "succeeded")
    assert run["step"] == 8
    metrics = api.request("GET", f"/v1/runs/{run_id}/metrics")["metrics"]
    assert [m["step"] for m in metrics] == list(range(1, 9))
    restarts = [data for kind, data in _events(stack, run_id) if kind == "restart"]
    assert len(restarts) == 1 and "learner service" in restarts[0]["reason"]
